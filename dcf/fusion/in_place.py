"""Let a single elementwise GPU op write its result over an input nobody else reads.

Every op's result is a new device array, and on a GPU the allocation is a good part of
a small op's host cost (cupy's pool: ~4 us on the lent H200 hosts, as much as the
launch itself; bench/NOTES.md, "GPU, session 15"). Where the graph shows that an
elementwise op's input is a new array nothing else will read -- the result of a MatMul
or of another elementwise op, whose only reader is this op -- the op can write its
result over it, as `tanh(x @ w)` and `s + prev` (prev copied from the GPU before) do in
a layer of the parallel_iterations chain (XLA's buffer reuse, in its simplest form). The
frame compiler emits an InPlaceElementwise call for such an op, where:

- the op is one of the single raw-kernel ops (dcf/ops/gpu_elementwise.py, SINGLE) on a
  GPU, not fused into another call, with no control inputs;
- the input is output 0 of a MatMul, of such an op, or of a transfer to this GPU (a
  `_ToDevice` of a fused multi-GPU plan, dcf/fused.py: a peer copy or an upload, a new
  array), on the same GPU, a kernel with no control inputs or outputs, not fetched, not
  fused elsewhere, whose one reader is this op, through this input alone
  (patterns.feeds_only);
- and, when it runs, the input is a C-contiguous device array of the result's shape and
  dtype that only the compiled code's variable holds (its reference count: a view of it,
  or anything else keeping it, makes the op allocate as before). This check is what makes
  it safe: a transfer hands on an array it did not make where the value was on this GPU
  already (then its sender still holds it), and a peer copy's landing buffer goes back
  for the next copy only once its array is gone, after an event on the compute stream
  that follows the in-place kernel.

The kernel reads the element from the output itself before writing it (layout ``o`` in
RawElementwise), so no pointer aliases another, and computes what the op's own raw kernel
computes: the same bits. Anything else -- host values, other layouts, the test stand-in
without raw kernels -- runs the op's own kernel.
"""

from __future__ import annotations

import sys
from typing import Any

from dcf.fusion.patterns import candidates, feeds_only, known_inputs
from dcf.ops.gpu_elementwise import SINGLE, raw_elementwise
from dcf.plan import TRANSFER

__all__ = ["in_place_groups", "InPlaceElementwise"]

# SigmoidGrad's generic body rounds differently unless its inputs have one shape
_OPS = tuple(t for t in SINGLE if t != "SigmoidGrad")
# ops whose GPU result is a new array of its own (never a view; a transfer passes on an
# array already on this GPU, which the runtime check sees held by its sender)
_FRESH = ("MatMul", TRANSFER) + tuple(SINGLE)


def in_place_groups(frame_nodes: list, gpu_of: dict, inputs_of: Any, taken: Any) -> dict:
    """Node id -> the input position its result may overwrite, for the frame's single
    elementwise GPU ops that may write in place (see the module docstring)."""
    out: dict[int, int] = {}
    for n in candidates(frame_nodes, _OPS, gpu_of, taken):
        ins = known_inputs(inputs_of, n, (1, 2))
        if ins is None:
            continue
        for j, (src, k) in enumerate(ins):
            if k == 0 and getattr(src, "type", None) in _FRESH and src.frame is n.frame and \
                    feeds_only(src, n, gpu_of, taken):
                out[n.id] = j
                break
    return out


def _refs_of_a_lone_argument() -> int:
    """References to an argument inside InPlaceElementwise.__call__ when the caller's
    variable is its only other holder (as the compiled code calls it)."""
    class Probe:
        def __call__(self, *args: Any) -> int:
            a = args[0]
            return sys.getrefcount(a)
    v = object()
    return Probe()(v)


_LONE = _refs_of_a_lone_argument()


class InPlaceElementwise:
    """The callable of one op that may write over input j: fn(*args)."""

    def __init__(self, gpu: Any, node: Any, j: int) -> None:
        self.gpu = gpu
        self.fn = node.fn
        self.j = j
        self.raw = raw_elementwise(gpu.cp, node.type)
        self.nd = gpu.cp.ndarray
        self.in_place = 0               # results written over their input (tests read it)

    def __call__(self, *args: Any) -> Any:
        a = args[self.j]
        if type(a) is self.nd and sys.getrefcount(a) <= _LONE and self.raw.available:
            self.gpu.make_current()
            out = self.raw.into(args, self.j)
            if out is not None:
                self.in_place += 1
                return out
        return self.fn(*args)
