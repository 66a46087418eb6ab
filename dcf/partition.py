"""Split a placed graph into one subgraph per device (paper section 4.4).

Every cut edge becomes a Send/Recv pair keyed by (edge, tag) at run time; one Recv
per (tensor, destination device), so a dead signal crosses once per device and fans
out there. A device that holds Recvs inside a loop frame gets a control-loop state
machine for that frame: Enter -> Merge -> Switch(pred) -> NextIteration, fed by the
loop predicate's value each iteration, whose Merge triggers the Recvs of every
iteration and whose Switch ends the frame -- unless the device holds a loop variable's
own machinery for that frame, whose Merge then triggers them, or receives a loop
variable's body value (its pivot: dead in the last iteration only), which then drives
the control loop instead of the predicate: Enter -> Merge -> the Recvs,
NextIteration(that Recv), no predicate message and no Switch. A control edge from a
loop variable's body pivot to another device, where the predicate reads that variable,
is re-tied to the pivot of that device's control loop instead of becoming a message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dcf.graph import Operation, Tensor
from dcf.ops.registry import OPS, Kind
from dcf.plan import PNode, nodes_from_ops

__all__ = ["Partition", "partition"]


@dataclass
class Partition:
    device: str
    nodes: list[PNode] = field(default_factory=list)
    fetches: list[tuple[PNode, int, int]] = field(default_factory=list)  # (node, out, fetch k)
    feeds: list[tuple[PNode, int]] = field(default_factory=list)         # (feed node, feed k)
    frame_parents: dict[str, tuple[str, int]] = field(default_factory=dict)

    @property
    def has_comm(self) -> bool:
        return any(p.kind in (Kind.SEND, Kind.RECV) for p in self.nodes)


def _value_frame(p: PNode) -> str:
    """The frame a node's outputs live in (Enter: the child; Exit: the parent)."""
    if p.kind == Kind.ENTER:
        return p.attrs["frame_name"]
    if p.kind == Kind.EXIT:
        assert p.op is not None  # the partitioner's own Exits never send
        fctx = p.op.frame_ctx
        return fctx.outer_frame.frame_name if fctx.outer_frame is not None else ""
    return p.frame


def partition(ops: list[Operation], device_of: dict[Operation, str],
              fetches: list[tuple[Operation, int]], feeds: list[Tensor],
              extra_devices: tuple[str, ...] = ()) -> dict[str, Partition]:
    """One Partition per device that holds ops (or fetches)."""
    pn = nodes_from_ops(ops)
    for op, p in pn.items():
        p.device = device_of[op]
    # Fed tensors become per-partition feed nodes (never sent between devices).
    feed_nodes: dict[Tensor, PNode] = {}
    for k, t in enumerate(feeds):
        feed_nodes[t] = PNode(f"_feed/{t.name}", "_Feed", Kind.KERNEL, "", n_out=1,
                              attrs={"feed": k})
    for op, p in pn.items():
        for k, t in enumerate(op.inputs):
            if t in feed_nodes:
                p.inputs[k] = (feed_nodes[t], 0)
    _enters_with_their_readers(pn, {id(pn[op]) for op, _ in fetches})
    parts: dict[str, Partition] = {}

    def part(dev: str) -> Partition:
        if dev not in parts:
            parts[dev] = Partition(dev)
        return parts[dev]

    for p in pn.values():
        part(p.device).nodes.append(p)
    for d in extra_devices:
        part(d)

    recvs: dict[tuple, PNode] = {}
    # (device, frame) -> a Recv there of a loop variable's body pivot of that frame
    pivot_recvs: dict[tuple[str, str], PNode] = {}

    def cut(src: PNode, idx: int, dst_dev: str, control: bool = False) -> PNode:
        key = (id(src), idx, dst_dev, control)
        r = recvs.get(key)
        if r is not None:
            return r
        frame = _value_frame(src)
        edge = f"{src.name}:{'ctrl' if control else idx}->{dst_dev}"
        send = PNode(f"_send/{edge}", "_Send", Kind.SEND, frame,
                     inputs=[] if control else [(src, idx)], control=[src] if control else [],
                     attrs={"edge": edge, "dst": dst_dev, "ctrl": control}, n_out=0,
                     device=src.device)
        r = PNode(f"_recv/{edge}", "_Recv", Kind.RECV, frame,
                  attrs={"edge": edge, "src": src.device, "ctrl": control}, n_out=1,
                  device=dst_dev)
        part(src.device).nodes.append(send)
        part(dst_dev).nodes.append(r)
        recvs[key] = r
        if not control and idx == 0 and _iteration_trigger(src) == 1 and src.frame == frame:
            pivot_recvs.setdefault((dst_dev, frame), r)
        return r

    # A control edge from a loop variable's body pivot to an op of the same frame on
    # another device needs no message where the predicate reads that variable: that
    # device's control loop fires its own pivot no earlier (see below). An edge from a
    # Merge does: another device's Merge may fire before this one has its value.
    retied: list[tuple[PNode, str, int]] = []    # (op, frame, 1 = pivot)
    for p in list(pn.values()):
        for k, inp in enumerate(p.inputs):
            if inp is None or inp[0].type == "_Feed":
                continue
            src, idx = inp
            if src.device != p.device:
                p.inputs[k] = (cut(src, idx, p.device), 0)
        if any(c.device != p.device for c in p.control):
            kept = []
            for c in p.control:
                if c.device == p.device:
                    kept.append(c)
                    continue
                trig = _iteration_trigger(c)
                if trig == 1 and c.frame == p.frame and p.frame and _pred_waits_for(c.op):
                    retied.append((p, p.frame, trig))
                else:
                    kept.append(cut(c, 0, p.device, control=True))
            p.control = kept

    # Control loops for frames whose Recvs sit on a device. A device that holds a loop
    # variable's own machinery (its Merge and body pivot) needs none for that frame: that
    # Merge fires in every iteration, so the Recvs (and re-tied control edges) hang off
    # it, and nested control loops start from its pivot.
    frames = _frame_table(ops)
    real = _real_triggers(ops, pn)
    cl_nodes: dict[tuple[str, str], tuple[PNode, PNode]] = {}   # (dev, frame) -> merge, pivot
    for dev, prt in parts.items():
        need: set[str] = set()
        starts = [p.frame for p in prt.nodes if p.kind == Kind.RECV and p.frame]
        starts += [f for q, f, _ in retied if q.device == dev]
        cls: dict[str, PNode] = {}
        for f in starts:
            while f and (dev, f) not in real:
                need.add(f)
                f = frames[f][0]
            if f:
                cl_nodes[(dev, f)] = real[(dev, f)]
                cls[f] = real[(dev, f)][1]
        for f in sorted(need, key=lambda n: _depth(n, frames)):
            parent, pi, loop_cond = frames[f]
            if parent:
                trigger = (cls[parent], 0)
            else:
                start = PNode(f"_cl/{f}/{dev}/start", "Const", Kind.KERNEL, "",
                              attrs={"value": np.float32(0), "dtype": None}, device=dev,
                              kernel=OPS["Const"].kernel)
                prt.nodes.append(start)
                trigger = (start, 0)
            base = f"_cl/{f}/{dev}"
            driver = pivot_recvs.get((dev, f))
            if driver is not None:
                # The device receives a loop variable's body value in every iteration,
                # dead in the last one only: that Recv drives the control loop instead
                # of the predicate (Enter -> Merge -> its Recvs; NextIteration(driver)).
                # A dead value ends the frame as the Switch's false branch would, and
                # the driver stands in for the body pivot (nested loops, re-tied edges).
                enter = PNode(f"{base}/Enter", "Enter", Kind.ENTER, parent, inputs=[trigger],
                              attrs={"frame_name": f, "is_constant": False,
                                     "parallel_iterations": pi}, device=dev)
                merge = PNode(f"{base}/Merge", "Merge", Kind.MERGE, f, n_out=2, device=dev)
                nxt = PNode(f"{base}/NextIteration", "NextIteration", Kind.NEXT_ITERATION, f,
                            inputs=[(driver, 0)], device=dev)
                merge.inputs = [(enter, 0), (nxt, 0)]
                prt.nodes.extend([enter, merge, nxt])
                cls[f] = driver
                cl_nodes[(dev, f)] = (merge, driver)
                prt.frame_parents[f] = (parent, pi)
                continue
            pred = (pn[loop_cond], 0) if pn[loop_cond].device == dev else \
                (cut(pn[loop_cond], 0, dev), 0)
            enter = PNode(f"{base}/Enter", "Enter", Kind.ENTER, parent, inputs=[trigger],
                          attrs={"frame_name": f, "is_constant": False,
                                 "parallel_iterations": pi}, device=dev)
            merge = PNode(f"{base}/Merge", "Merge", Kind.MERGE, f, n_out=2, device=dev)
            switch = PNode(f"{base}/Switch", "Switch", Kind.SWITCH, f,
                           inputs=[(merge, 0), pred], n_out=2, device=dev)
            exit_ = PNode(f"{base}/Exit", "Exit", Kind.EXIT, f, inputs=[(switch, 0)],
                          device=dev)
            pivot = PNode(f"{base}/Pivot", "Identity", Kind.KERNEL, f, inputs=[(switch, 1)],
                          device=dev, kernel=OPS["Identity"].kernel)
            nxt = PNode(f"{base}/NextIteration", "NextIteration", Kind.NEXT_ITERATION, f,
                        inputs=[(pivot, 0)], device=dev)
            merge.inputs = [(enter, 0), (nxt, 0)]
            exit_.op = None
            prt.nodes.extend([enter, merge, switch, exit_, pivot, nxt])
            cls[f] = pivot
            cl_nodes[(dev, f)] = (merge, pivot)
            prt.frame_parents[f] = (parent, pi)
        for q in prt.nodes:
            if q.kind == Kind.RECV and q.frame:
                trig = cl_nodes.get((dev, q.frame))
                if trig is not None:
                    q.control.append(trig[0])
    for q, f, trig in retied:
        q.control.append(cl_nodes[(q.device, f)][trig])
    for prt in parts.values():
        for f, (par, pi, _) in frames.items():
            prt.frame_parents.setdefault(f, (par, pi))
    for k, (op, idx) in enumerate(fetches):
        parts[device_of[op]].fetches.append((pn[op], idx, k))
    for prt in parts.values():
        used = {id(i[0]) for q in prt.nodes for i in q.inputs if i is not None}
        prt.feeds = [(fn, k) for k, (t, fn) in enumerate(feed_nodes.items()) if id(fn) in used]
    return parts


def _enters_with_their_readers(pn: dict, fetched: set[int]) -> None:
    """Give every device that reads an Enter's value its own Enter, fed across devices
    in the parent frame. A value that left an Enter belongs to the loop's frame: cut
    there, it would travel once, tagged iteration 0, while the reader's Recv waits in
    every iteration (a loop constant entered under one device scope and read under
    another hung the partitioned executor). An Enter left with no reader on its own
    device, and not fetched, moves to a reading device instead of being copied."""
    enters = {id(p): p for p in pn.values() if p.kind == Kind.ENTER}
    if not enters:
        return
    readers: dict[int, dict[str, list]] = {}
    order = {id(p): n for n, p in enumerate(pn.values())}
    kept = set(fetched)        # stay where they are: fetched, or another op's control input
    for q in pn.values():
        for k, inp in enumerate(q.inputs):
            if inp is not None and id(inp[0]) in enters:
                readers.setdefault(id(inp[0]), {}).setdefault(q.device, []).append((q, k))
        kept.update(id(c) for c in q.control)
    # Inner Enters first (a nested loop's Enter reads its parent's, after it in `pn`):
    # their twins and moves are readers of the outer Enter, counted before it is placed.
    for eid in sorted(readers, key=lambda i: -order[i]):
        by_dev, e = readers[eid], enters[eid]
        others = [d for d in by_dev if d != e.device]
        if not others:
            continue
        if e.device not in by_dev and eid not in kept:
            _reader_moved(readers, e, e.device, others[0])
            e.device = others.pop(0)
        for dev in others:
            twin = PNode(f"{e.name}@{dev}", e.type, e.kind, e.frame, inputs=list(e.inputs),
                         control=list(e.control), attrs=dict(e.attrs), n_out=e.n_out,
                         op=e.op, device=dev, stateful=e.stateful, kernel=e.kernel,
                         resource=e.resource)
            pn[twin] = twin            # (keyed by itself: it has no op of its own)
            for q, k in by_dev[dev]:
                q.inputs[k] = (twin, q.inputs[k][1])
            src = twin.inputs[0][0] if twin.inputs and twin.inputs[0] else None
            if src is not None and id(src) in readers:
                readers[id(src)].setdefault(dev, []).append((twin, 0))


def _reader_moved(readers: dict, e: PNode, old: str, new: str) -> None:
    """Enter `e`, a reader of another Enter, moved from device `old` to `new`."""
    src = e.inputs[0][0] if e.inputs and e.inputs[0] else None
    by_dev = readers.get(id(src)) if src is not None else None
    if not by_dev:
        return
    by_dev[old] = [(q, k) for q, k in by_dev.get(old, []) if q is not e]
    if not by_dev[old]:
        del by_dev[old]
    by_dev.setdefault(new, []).append((e, 0))


def _iteration_trigger(c: PNode) -> int | None:
    """0 when `c` is a loop variable's Merge (fires in every iteration), 1 when it is a
    body pivot Identity(Switch:1) (fires in every iteration that runs the body), else
    None. A device's control loop has a node of each kind for the frame."""
    op = c.op
    ctx = op.frame_ctx if op is not None else None
    if op is None or ctx is None:
        return None
    if op.type == "Merge" and op in getattr(ctx, "merges", ()):
        return 0
    if op.type == "Identity" and op in getattr(ctx, "body_inputs", ()):
        return 1
    return None


def _pred_waits_for(pivot: Operation) -> bool:
    """Whether the loop's predicate reads the Merge of the loop variable whose body pivot
    is `pivot`: then every device's control loop fires its own pivot only after that
    Merge, as `pivot` does, and a control edge from `pivot` may hang off it. Otherwise
    the edge orders its op after the variable's value (after the side effects that made
    it, TF1's control_dependencies), which another device learns only from a message."""
    ctx = pivot.frame_ctx
    merge = ctx.merges[ctx.body_inputs.index(pivot)]
    seen: set[int] = set()
    todo = [ctx.loop_cond]
    while todo:
        op = todo.pop()
        if op is merge:
            return True
        if id(op) in seen or op.frame_ctx is not ctx or op in ctx.merges:
            continue
        seen.add(id(op))
        todo += [t.op for t in op.inputs] + list(op.control_inputs)
    return False


def _real_triggers(ops: list[Operation], pn: dict) -> dict[tuple[str, str], tuple]:
    """(device, frame) -> (Merge, body pivot) of a loop variable whose machinery sits on
    that device (the first such variable)."""
    out: dict[tuple[str, str], tuple] = {}
    seen: set[int] = set()
    for op in ops:
        ctx = op.frame_ctx
        while ctx is not None and id(ctx) not in seen:
            seen.add(id(ctx))
            for m, piv in zip(getattr(ctx, "merges", ()), getattr(ctx, "body_inputs", ())):
                pm, pp = pn.get(m), pn.get(piv)
                if pm is not None and pp is not None and pm.device == pp.device \
                        and pm.frame == pp.frame == ctx.frame_name:
                    out.setdefault((pm.device, ctx.frame_name), (pm, pp))
            ctx = ctx.outer_frame
    return out


def _frame_table(ops: list[Operation]) -> dict[str, tuple[str, int, Operation]]:
    """frame name -> (parent frame name, parallel_iterations, LoopCond op)."""
    out: dict[str, tuple[str, int, Operation]] = {}
    for op in ops:
        ctx = op.frame_ctx
        while ctx is not None and ctx.frame_name not in out:
            parent = ctx.outer_frame.frame_name if ctx.outer_frame is not None else ""
            out[ctx.frame_name] = (parent, ctx.parallel_iterations, ctx.loop_cond)
            ctx = ctx.outer_frame
    return out


def _depth(name: str, frames: dict) -> int:
    d = 0
    while name:
        name = frames[name][0]
        d += 1
    return d
