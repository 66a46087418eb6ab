"""Compute only the used part of a matrix product that a split cuts up (GPU).

The gradient of `concat([x, h], 1) @ W` with respect to the concatenation is
`dz @ W^T`, which the concatenation's gradient then splits into the parts for x and h.
Where nothing reads x's part -- the first layer of an LSTM, whose input is data, or any
input no gradient is wanted for -- the GEMM still computes it: for an LSTM layer whose
input is as wide as its state that is half of that GEMM, a sixth of the layer's matrix
work. Each output column j of `g @ W^T` is `g @ W[j]^T`, so the part a split output
keeps is `g @ W[r0:r1]^T`, a GEMM on a block of W's rows (a C-contiguous view). The
frame compiler emits that one GEMM instead of the product and the split -- where the
graph proves it may:

- a MatMul(g, W, transpose_b=True, transpose_a=False) whose only consumer is a SplitV
  along the last axis of its 2-D result (static sizes, no control edges, the same GPU);
- exactly one of the split's outputs is read (the others have no consumer and are not
  fetched).

The used output is then the GEMM's own (C-contiguous) result; its values are the same
sums of the same products as the full GEMM's columns, up to the rounding order cuBLAS
picks for the narrower problem. Anything else (host values, other layouts, a W whose
rows are not the split's sizes added up -- known only when it runs where W's shape is
partly unknown: the split's own error, not a block of a product of another width) runs
the two ops one by one. (Traced runs take the executor's op-by-op path.)
"""

from __future__ import annotations

from typing import Any

from dcf.errors import node_error
from dcf.fusion.patterns import candidates, feeds_only, known_inputs
from dcf.ops.gpu_raw import c_contiguous

__all__ = ["split_matmul_groups", "FusedSplitMatMul"]


def split_matmul_groups(frame_nodes: list, gpu_of: dict, inputs_of: Any, taken: set) -> dict:
    """SplitV node id -> (MatMul node, leaves [g, W], used output, row start, row end)
    for the splits of one frame whose used part may be computed alone."""
    groups: dict = {}
    for s in candidates(frame_nodes, ("SplitV",), gpu_of, taken):
        if s.fetch or s.ctrl_outs:
            continue
        attrs = s.pnode.attrs
        sizes, axis = attrs.get("sizes"), attrs.get("axis")
        ins = known_inputs(inputs_of, s, (1,))
        if sizes is None or -1 in sizes or ins is None or ins[0][1] != 0:
            continue
        used = [k for k in range(s.n_out) if s.outs[k]]
        if len(used) != 1 or s.n_out < 2 or len(sizes) != s.n_out:
            continue
        m = ins[0][0]
        if getattr(m, "type", None) != "MatMul" or not feeds_only(m, s, gpu_of, taken):
            continue                  # a feed, any other producer, or other readers
        ma = m.pnode.attrs
        if ma.get("transpose_a", False) or not ma.get("transpose_b", False):
            continue
        if axis not in (-1, 1):     # the last axis of a 2-D product (checked when it runs)
            continue
        m_ins = known_inputs(inputs_of, m, (2,))
        if m_ins is None:
            continue
        k = used[0]
        r0 = sum(sizes[:k])
        groups[s.id] = (m, list(m_ins), k, r0, r0 + sizes[k])
    return groups


class FusedSplitMatMul:
    """The callable of one fused product-and-split: fn(g, W, iteration) -> the split's
    outputs, the used one computed as g @ W[r0:r1]^T (the others None: nothing reads
    them). An error in the product names the MatMul's op, frame and iteration."""

    def __init__(self, gpu: Any, split: Any, matmul: Any, used: int, r0: int, r1: int) -> None:
        self.gpu = gpu
        self.cp = gpu.cp
        self.split, self.matmul = split, matmul
        self.used, self.r0, self.r1 = used, r0, r1
        self.n_out = split.n_out
        # the split's sizes add up to W's rows (the product's columns) in a valid run;
        # where W's rows are known only when it runs, another count is the split's error
        self.rows = sum(split.pnode.attrs["sizes"])
        self.narrowed = 0               # calls that took the narrow GEMM (tests read it)

    def _product(self, g: Any, w: Any, it: Any) -> Any:
        try:
            return self.matmul.fn(g, w)
        except Exception as e:
            raise node_error(self.matmul, it, e) from e

    def __call__(self, g: Any, w: Any, it: Any) -> Any:
        nd = self.cp.ndarray
        if type(w) is nd and type(g) is nd and w.ndim == 2 and g.ndim == 2 and \
                c_contiguous(w) and w.shape[0] == self.rows and g.shape[1] == w.shape[1]:
            part = self._product(g, w[self.r0:self.r1], it)
            self.narrowed += 1
            out: list = [None] * self.n_out
            out[self.used] = part
            return tuple(out)
        return self.split.fn(self._product(g, w, it))
