"""Let an LSTM step's gates write their activations over the product they read (GPU).

An LSTM layer's step is `z = [x, h] @ W` (a MatMul) and then LSTMGates(z, c, b), whose
third output -- the gate activations, as wide as z -- is what the backward pass keeps.
Nothing reads z but the gates, so on a GPU the step allocates a [batch, 4u] array per
layer and iteration that it could do without: the gates' kernel can write each
activation over the pre-activation it was computed from (each element is read and then
written by one thread). In a multi-GPU loop the forward pass is paced by the host, and
an allocation is a few microseconds of it per layer and step. The frame compiler emits
one call for the product and the gates instead of two -- where the graph proves that z
is seen by nothing else:

- the LSTMGates' z input is output 0 of a MatMul in the same frame, on the same GPU;
- the MatMul has no control edges, is not fetched, and the gates are its only consumer.

The fused call runs the product as one GEMM (the MatMul's GPU body; its kernel where
that declines) and then the in-place gates kernel
(`rnn_ops.gates_into`: the same formulas as the gates' raw kernel, so the same bits);
the activations output *is* the product's array. Anything that kernel does not take
(layouts, dtypes, host values, the test stand-in) runs the gates' own kernel on the
product. (Traced runs take the executor's op-by-op path, where each op is its own
slice.)

The same kernel also writes h where it is read next (dcf/ops/concat_slots.py): into the
last columns of a new buffer for the next step's concatenation `[x, h]`, offered to it
(h is the view of those columns), and into the first columns of the buffer the layer
above has offered, where h is that layer's x in this step. Where both happen (a stack
of layers on one GPU) the concatenation copies nothing.
"""

from __future__ import annotations

from typing import Any

from dcf.errors import node_error
from dcf.fusion.patterns import candidates, feeds_only, known_inputs
from dcf.ops.concat_slots import offer, open_offer, withdraw
from dcf.ops.gpu_kernels import gemm
from dcf.ops.registry import Kind
from dcf.ops.rnn_ops import gates_into

__all__ = ["matmul_gates_groups", "FusedMatMulGates"]


def matmul_gates_groups(frame_nodes: list, gpu_of: dict, inputs_of: Any, taken: set) -> dict:
    """LSTMGates node id -> (MatMul node, leaves [a, W, c(, b)], h_lead, h_concat,
    x_concat) for the gates of one frame whose product may be overwritten by their
    activations; h_lead > 0 where the concatenation h_concat that next reads h may take
    a buffer the gates write h into (see h_concat_lead); x_concat >= 0 where h is also
    the x of the layer above's concatenation (see x_concat)."""
    in_frame = {n.id for n in frame_nodes}
    groups: dict = {}
    for g in candidates(frame_nodes, ("LSTMGates",), gpu_of, taken):
        ins = known_inputs(inputs_of, g, (2, 3))
        if ins is None:
            continue
        m, k = ins[0]
        if k != 0 or m.id not in in_frame or m.type != "MatMul" or \
                not feeds_only(m, g, gpu_of, taken):
            continue
        m_ins = known_inputs(inputs_of, m, (2,))
        if m_ins is None:
            continue
        groups[g.id] = (m, list(m_ins) + list(ins[1:])) + h_concat_lead(g, gpu_of) + \
            (x_concat(g, gpu_of),)
    return groups


# h written into the concatenation that reads it next (off: the gates allocate h alone;
# `python -m bench.probes.switch_ab dcf.fusion.matmul_gates:H_INTO_CONCAT KINDS N plan`
# compares the two in one process)
H_INTO_CONCAT = True

# nodes a value passes through unchanged on its way to its next reader (in a loop: the
# NextIteration, the loop's Merge and Switch, the body's Identity)
_PASS_KINDS = (Kind.NEXT_ITERATION, Kind.MERGE, Kind.SWITCH)


def _h_readers(g: Any, loop: bool, out: int = 1) -> Any:
    """(ConcatV2 node, input index) of the concatenations in g's frame that read g's h
    (output `out`: 1 for the gates) directly or through Identity -- and with `loop`,
    through the loop's NextIteration, Merge and Switch as well (the next step's
    reader)."""
    seen = {g.id}
    todo = [(g, out)]
    while todo:
        n, k = todo.pop()
        for dst, slot, _ in (n.outs[k] if k < len(n.outs) else ()):
            if dst.id in seen or dst.frame is not g.frame:
                continue
            seen.add(dst.id)
            if (loop and dst.kind in _PASS_KINDS) or \
                    (dst.kind == Kind.KERNEL and dst.type == "Identity"):
                outs = 1 if dst.kind == Kind.MERGE else min(dst.n_out, 2)   # not value_index
                todo.extend((dst, j) for j in range(outs))
            elif dst.kind == Kind.KERNEL and dst.type == "ConcatV2":
                yield dst, slot - dst.in_base


def _last_axis_2d(c: Any, gpu: Any, gpu_of: dict) -> list | None:
    """The static widths of concatenation c's parts, if it joins 2-D values along their
    last axis on `gpu` and every part's width is known; else None."""
    if gpu_of.get(c.id) is not gpu or c.pnode.attrs.get("axis") not in (1, -1) or \
            c.op is None or len(c.op.inputs) < 2:
        return None
    widths = []
    for t in c.op.inputs:
        shp = t.shape
        if shp is None or len(shp) != 2 or shp[1] is None:
            return None
        widths.append(shp[1])
    return widths


# readers that take h as a column block of a wider array at no extra cost (the
# concatenation copies rows with a pitch, a TensorArray keeps the view, a stack gathers
# it in one kernel); any other reader on h's GPU (a MatMul, an elementwise op) would take
# a slower path for it, so h then stays an array of its own
_VIEW_READERS = ("ConcatV2", "TensorArrayWriteV3", "Pack")


def _h_views_ok(g: Any, gpu_of: dict) -> bool:
    """Whether every reader of the gates' h on their GPU -- through Identity and the
    loop's NextIteration, Merge and Switch, up to the loop's Exit -- takes a view."""
    gpu = gpu_of.get(g.id)
    seen = {g.id}
    todo = [(g, 1)]
    while todo:
        n, k = todo.pop()
        for dst, _, _ in (n.outs[k] if k < len(n.outs) else ()):
            if dst.id in seen:
                continue
            seen.add(dst.id)
            if dst.kind == Kind.EXIT or dst.frame is not g.frame:
                continue                    # past the loop: read once per run, not per step
            if dst.kind in _PASS_KINDS or (dst.kind == Kind.KERNEL and dst.type == "Identity"):
                outs = 1 if dst.kind == Kind.MERGE else min(dst.n_out, 2)
                todo.extend((dst, j) for j in range(outs))
            elif dst.fetch or (dst.kind == Kind.KERNEL and gpu_of.get(dst.id) is gpu and
                               dst.type not in _VIEW_READERS):
                return False
    return not g.fetch


def h_concat_lead(g: Any, gpu_of: dict) -> tuple[int, int]:
    """(lead, key) of the concatenation that reads the gates' h as its last part --
    directly, or through the loop's NextIteration, Merge, Switch and Identity: the next
    step's `[x, h]` -- in the same frame on the same GPU, along the last axis of 2-D
    values of static widths, where every reader of h takes a view (`_h_views_ok`); lead
    is the width in front of h, key the id() of the concatenation's node (unique among
    the plans alive, which hold their nodes). (0, -1) where there is none."""
    if H_INTO_CONCAT and _h_views_ok(g, gpu_of):
        gpu = gpu_of.get(g.id)
        for c, k in _h_readers(g, loop=True):
            widths = _last_axis_2d(c, gpu, gpu_of)
            if widths and k == len(widths) - 1:
                return sum(widths[:-1]), id(c)
    return 0, -1


def x_concat(g: Any, gpu_of: dict, out: int = 1) -> int:
    """The key (as h_concat_lead's) of a concatenation `[h, y]` of two parts that reads
    the gates' h (output `out` of node g: also a transfer from another GPU, whose value
    is then written into the buffer by the transfer) first in the same step (the layer
    above's `[x, h]`), on the same GPU: its buffer, offered by the layer above's gates,
    gets this h written in place. -1 where there is none."""
    if H_INTO_CONCAT:
        gpu = gpu_of.get(g.id)
        for c, k in _h_readers(g, loop=False, out=out):
            widths = _last_axis_2d(c, gpu, gpu_of)
            if widths and len(widths) == 2 and k == 0:
                return id(c)
    return -1


class FusedMatMulGates:
    """The callable of one fused product and gates: fn(a, W, c(, b), iteration) ->
    (c_new, h_new, acts) with z = a @ W (the MatMul's attributes) and acts written over
    z. An error in the product names the MatMul's op, frame and iteration; the gates'
    own errors name the gates' op."""

    def __init__(self, gpu: Any, gates: Any, matmul: Any, h_lead: int = 0,
                 h_concat: int = -1, x_concat: int = -1) -> None:
        self.gpu = gpu
        self.cp = gpu.cp
        self.gates, self.matmul = gates, matmul
        self.h_lead = h_lead            # > 0: h goes into a concatenation's buffer,
        self.h_concat = h_concat        # offered to this concatenation node
        self.x_concat = x_concat        # >= 0: h is this concatenation's x (fill its offer)
        self._offer = None              # the key of the last buffer offered
        self.forget_bias = float(gates.pnode.attrs.get("forget_bias", 1.0))
        ma = matmul.pnode.attrs
        self.transpose_a = bool(ma.get("transpose_a", False))
        self.transpose_b = bool(ma.get("transpose_b", False))
        self.calls = 0                  # calls (tests read these two)
        self.into = 0                   # calls whose gates wrote over z
        self.offers = 0                 # calls that offered h's concatenation buffer
        self.fills = 0                  # calls that wrote h into the layer above's offer

    def __call__(self, a: Any, w: Any, c: Any, *rest: Any) -> Any:
        self.calls += 1
        *b, it = rest                   # the gates' bias, where they have one
        self.gpu.make_current()
        try:                # the GEMM directly; anything else through the MatMul's kernel
            z = gemm(self.cp, a, w, self.transpose_a, self.transpose_b)
        except MemoryError:
            z = None
        if z is None:
            try:
                z = self.matmul.fn(a, w)
            except Exception as e:
                raise node_error(self.matmul, it, e) from e
            self.gpu.make_current()
        lead = self.h_lead
        if lead and self._offer is not None:
            withdraw(self._offer)       # not taken by the step it was made for
            self._offer = None
        xo = open_offer(self.x_concat) if self.x_concat >= 0 else None
        try:
            got = gates_into(self.cp, z, c, b[0] if b else None, self.forget_bias, lead, xo)
        except MemoryError:
            got = None
        if got is not None:
            self.into += 1
            if len(got) == 4:
                c_new, h_new, acts, buf = got
                if buf is not None:
                    self._offer = offer(self.gpu.index, h_new, buf, lead, self.h_concat)
                    self.offers += 1
                if xo is not None and xo.filled is h_new:
                    self.fills += 1
                return c_new, h_new, acts
            return got
        return self.gates.fn(z, c, *b)
