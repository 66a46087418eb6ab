"""Add a slice's gradient into the other addend's slice, not into a padded copy (GPU).

The gradient of `x[key]` is StridedSliceGrad: an array of x's shape, zero but for the
slice, which holds dy. Where x has another reader, an AddN (or Add/AddV2) then adds it to
that reader's gradient: on a GPU a fill, a copy into the slice and a sum over the whole of
x, three launches and two allocations, to change the elements of one slice. The frame
compiler emits one call instead, `out = other; out[key] += dy` (one launch) -- where the graph proves
the padded array is seen by the sum alone:

- the sum has two inputs and no control edges; one is output 0 of a StridedSliceGrad of a
  static key and shape (no index tensors), whose only reader is the sum, through that
  input; both run on the same GPU, in the same frame (patterns.feeds_only);
- the other addend is written over only where it is a new array nothing else reads: the
  output of a kernel whose results are arrays of their own (`_FRESH`), in the same frame,
  read by the sum alone; and, when it runs, a C-contiguous device array that only the
  compiled code's variable holds (its reference count, as in in_place.py). Otherwise the
  call copies it first: two launches instead of three.

Outside the slice the result is the other addend itself, where AddN adds 0.0 (a -0.0
there stays -0.0; every other value is the same); inside, other + dy in one rounding, as
AddN makes it. Anything else -- a broadcasting Add, host values, other dtypes -- runs the
two ops one by one. (Traced runs take the executor's op-by-op path.)
"""

from __future__ import annotations

import sys
from typing import Any

from dcf.errors import node_error
from dcf.fusion.in_place import _LONE
from dcf.fusion.patterns import candidates, feeds_only, known_inputs, output_read_by_only
from dcf.ops.array_ops import _has_dyn
from dcf.ops.gpu_elementwise import SINGLE
from dcf.ops.gpu_raw import c_contiguous
from dcf.plan import TRANSFER

__all__ = ["slice_add_groups", "FusedSliceAdd"]

_SUMS = ("AddN", "Add", "AddV2")
# kernels whose GPU results are new arrays of their own (never a view, never an input
# handed on); a transfer hands on an array already on this GPU, which the run-time
# reference count sees held by its sender
_FRESH = ("MatMul", "BatchMatMulV2", "LSTMGatesGrad", "WavefrontInputsGrad",
          "StridedSliceGrad", TRANSFER) + tuple(SINGLE)


def _fresh_and_read_by_only(src: Any, k: int, dst: Any, gpu_of: dict, taken: Any) -> bool:
    """Whether output k of `src` is a new array of a kernel's own call (`_FRESH`), made
    in dst's frame, that only `dst` reads."""
    return getattr(src, "type", None) in _FRESH and src.frame is dst.frame and \
        output_read_by_only(src, k, dst, gpu_of, taken)


def slice_add_groups(frame_nodes: list, gpu_of: dict, inputs_of: Any, taken: set) -> dict:
    """Sum node id -> (StridedSliceGrad node, leaves [a, b] in the sum's order with the
    slice's dy for its gradient, that leaf's position, whether the other addend may be
    written over) for the sums of one frame that may add a slice in place."""
    in_frame = {n.id for n in frame_nodes}
    groups: dict = {}
    for s in candidates(frame_nodes, _SUMS, gpu_of, taken):
        ins = known_inputs(inputs_of, s, (2,))
        if ins is None:
            continue
        for j, (g, k) in enumerate(ins):
            if k != 0 or getattr(g, "type", None) != "StridedSliceGrad" or \
                    g.id not in in_frame or not feeds_only(g, s, gpu_of, taken):
                continue
            attrs = g.pnode.attrs
            g_ins = known_inputs(inputs_of, g, (1,))
            if attrs.get("shape") is None or _has_dyn(attrs["key"]) or g_ins is None:
                continue
            o, ok = ins[1 - j]
            if o is g:
                continue
            leaves = list(ins)
            leaves[j] = g_ins[0]
            groups[s.id] = (g, leaves, j, _fresh_and_read_by_only(o, ok, s, gpu_of, taken))
            break
    return groups


class FusedSliceAdd:
    """The callable of one fused slice-gradient sum: fn(a, b, iteration), the addend at
    position j being the slice's dy: the other addend with dy added into its slice. An
    error in the sum names the sum's op (its frame and iteration); the slice's gradient's
    own errors name that op."""

    def __init__(self, gpu: Any, total: Any, slice_grad: Any, j: int, fresh: bool) -> None:
        self.gpu = gpu
        self.cp = gpu.cp
        self.nd = gpu.cp.ndarray
        self.total, self.slice_grad = total, slice_grad
        self.j, self.fresh = j, fresh
        attrs = slice_grad.pnode.attrs
        self.key, self.shape = attrs["key"], tuple(attrs["shape"])
        self.in_place = 0               # calls that wrote over the other addend
        self.copied = 0                 # calls that added into a copy of it (tests read both)

    def __call__(self, *args: Any) -> Any:
        it = args[2]
        other = args[1 - self.j]
        dy = args[self.j]
        if type(other) is self.nd and type(dy) is self.nd and other.shape == self.shape \
                and other.dtype == dy.dtype and other.dtype.kind in "fciu":
            self.gpu.make_current()
            if self.fresh and sys.getrefcount(other) <= _LONE and \
                    c_contiguous(other):
                out = other
                self.in_place += 1
            else:
                out = other.copy()
                self.copied += 1
            try:
                view = out[self.key]
                if view.shape != dy.shape:
                    raise ValueError(f"the slice {self.key} of {list(self.shape)} is "
                                     f"{list(view.shape)}, the gradient {list(dy.shape)}")
                self.cp.add(view, dy, out=view)
            except Exception as e:
                raise node_error(self.total, it, e) from e
            return out
        try:
            padded = self.slice_grad.fn(dy)
        except Exception as e:
            raise node_error(self.slice_grad, it, e) from e
        pair = (other, padded) if self.j == 1 else (padded, other)
        try:
            return self.total.fn(*pair)
        except Exception as e:
            raise node_error(self.total, it, e) from e
