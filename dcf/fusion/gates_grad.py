"""Fuse the sum that makes an LSTM layer's output gradient into its gates' gradient (GPU).

In the backward pass of a stacked or output-reading LSTM, the gradient reaching a
layer's h at step t has two parts: from the step after it (the recurrence) and from
what read h at step t (the layer above, or the loss). The graph adds them with an
AddN whose only reader is the layer's LSTMGatesGrad, so on a GPU every layer and step
pays a launch and an allocation for a sum that the gates' kernel can make itself while
it reads dh. The frame compiler emits one call instead -- where the graph proves the
sum is seen by nothing else:

- the AddN (or Add/AddV2) has two inputs, no control edges, and the gates' gradient as
  its only consumer, through its dh input;
- both run on the same GPU, in the same frame.

The fused call adds the two inputs inside the kernel in AddN's order with AddN's single
rounding, so its results are the ops' own bits; each addend may be a column block of a
wider matrix (a SplitV output), read in place. Anything the raw kernel does not take
(layouts, dtypes, host values, the test stand-in) and a call that runs out of device
memory run the two ops one by one through their own kernels, which know how to make
room. (Traced runs take the executor's op-by-op path, where each op is its own slice.)
"""

from __future__ import annotations

from typing import Any

from dcf.errors import node_error
from dcf.fusion.patterns import candidates, feeds_only, known_inputs
from dcf.ops.rnn_ops import gates_grad_sum

__all__ = ["gates_grad_groups", "FusedGatesGrad"]

_SUMS = ("AddN", "Add", "AddV2")
_DH = 4          # LSTMGatesGrad's inputs: c, acts, c_new, dc, dh


def gates_grad_groups(frame_nodes: list, gpu_of: dict, inputs_of: Any,
                      taken: set) -> dict:
    """LSTMGatesGrad node id -> (sum node, leaves [c, acts, c_new, dc, a, b]) for the
    gates' gradients of one frame whose dh sum may run inside their kernel; nodes in
    `taken` (already fused elsewhere) are left alone."""
    in_frame = {n.id for n in frame_nodes}
    groups: dict = {}
    for g in candidates(frame_nodes, ("LSTMGatesGrad",), gpu_of, taken):
        ins = known_inputs(inputs_of, g, (5,))
        if ins is None:
            continue
        s, k = ins[_DH]
        if k != 0 or s.id not in in_frame or s.type not in _SUMS or \
                not feeds_only(s, g, gpu_of, taken):
            continue
        s_ins = known_inputs(inputs_of, s, (2,))
        if s_ins is None:
            continue
        groups[g.id] = (s, list(ins[:_DH]) + list(s_ins))
    return groups


class FusedGatesGrad:
    """The callable of one fused gates' gradient: fn(c, acts, c_new, dc, a, b,
    iteration) -> (dz, dc_prev) with dh = a + b. An error in the sum names the sum's
    op (its frame and iteration); the gates' own errors name the gates' op."""

    def __init__(self, gpu: Any, grad: Any, total: Any) -> None:
        self.gpu = gpu
        self.cp = gpu.cp
        self.grad, self.total = grad, total
        self.fused = 0                  # calls that took the one kernel (tests read it)

    def __call__(self, c: Any, acts: Any, c_new: Any, dc: Any, a: Any, b: Any,
                 it: Any) -> Any:
        self.gpu.make_current()
        try:
            got = gates_grad_sum(self.cp, c, acts, c_new, dc, (a, b))
        except MemoryError:
            got = None
        if got is not None:
            self.fused += 1
            return got
        try:
            dh = self.total.fn(a, b)
        except Exception as e:
            raise node_error(self.total, it, e) from e
        return self.grad.fn(c, acts, c_new, dc, dh)
