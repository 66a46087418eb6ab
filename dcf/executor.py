"""The pure tagged-token executor (paper section 4, Figure "evaluation rules").

A token is (value, is_dead, tag): the value sits in an iteration's input slot, dead
values are the DEAD sentinel, and the tag is the iteration (frame path + iteration
number) the slot belongs to. Nothing here imports asyncio, zmq or cupy: the device
actor feeds tokens in (`deliver_recv`, `resume`), calls `run(budget)` and drains
`outbox` (Sends, Recv registrations, waits).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

import numpy as np

from dcf.errors import InvalidArgumentError, op_error
from dcf.ops.registry import Kind
from dcf.plan import ExecPlan, FrameInfo, NodeInfo
from dcf.token import DEAD, WouldBlock

__all__ = ["Executor", "DEAD", "WouldBlock", "CONTROL_RULES"]

KERNEL = int(Kind.KERNEL)
SEND = int(Kind.SEND)
EXIT = int(Kind.EXIT)
MACRO = 99  # a compiled frame running as one resumable node (see frame_compiler.py)
ROOT_MACRO = 100  # a compiled root frame: the whole partition


class IterState:
    """One iteration of one frame: input slots and pending counts for its nodes."""

    __slots__ = ("frame", "it", "slots", "pending", "outstanding", "dead", "_tag")

    def __init__(self, frame: Frame, it: int) -> None:
        info = frame.info
        self.frame = frame
        self.it = it
        self.slots: list = [None] * info.n_slots
        self.pending: list = info.pending.copy()
        self.outstanding = 0   # nodes ready/running/waiting + live child frames
        self.dead: set | None = None   # local ids of nodes that received a dead input
        self._tag: tuple | None = None

    @property
    def tag(self) -> tuple:
        """Frame path with iteration numbers: stable across processes."""
        t = self._tag
        if t is None:
            t = self._tag = self.frame.path + (self.it,)
        return t


class Frame:
    """A running instance of a loop frame (or the root)."""

    __slots__ = ("info", "parent", "parent_ist", "iters", "start_iter", "next_iter",
                 "enters_pending", "invariants", "parked", "exit_live", "children", "st_iter",
                 "st_done", "st_parked", "path", "macro")

    def __init__(self, info: FrameInfo, parent_ist: IterState | None) -> None:
        self.info = info
        self.parent_ist = parent_ist
        self.parent = parent_ist.frame if parent_ist is not None else None
        self.iters: dict[int, IterState] = {}
        self.start_iter = 0
        self.next_iter = 0
        self.enters_pending = info.num_enters
        self.invariants: list = []
        self.parked: list = []
        self.exit_live: set = set()
        self.children: dict = {}
        self.st_iter = 0
        self.st_done: dict[int, int] = {}
        self.st_parked: dict[int, list] = {}
        self.path: tuple = (parent_ist.tag + (info.name,)) if parent_ist is not None else ()
        self.macro: Any = None

    @property
    def name(self) -> str:
        return self.info.name


class _Macro:
    """Ready-queue stand-in for a compiled frame instance (kind MACRO)."""

    __slots__ = ("kind", "gen", "info", "frame", "enter_values", "waiting", "name", "local",
                 "ordered", "fetch", "op", "type")

    def __init__(self, info: FrameInfo) -> None:
        self.kind = MACRO
        self.info = info
        self.gen = None
        self.enter_values: dict = {}
        self.waiting = info.num_enters
        self.name = info.name
        self.local = -1
        self.ordered = info.ordered   # a nested loop with state: in its parent's order
        self.fetch = ()
        self.op = None
        self.type = "Frame"


class Executor:
    """Runs one partition's plan for one step."""

    def __init__(self, plan: ExecPlan, *, trace: bool = False, step_id: Any = 0,
                 clock: Callable[[], float] = time.perf_counter,
                 compiled: bool = True) -> None:
        self.plan = plan
        self.ready: deque = deque()
        self.outbox: list = []
        self.results: list = [None] * plan.n_fetch
        self.trace_on = trace
        self.trace: list = []
        self.step_id = step_id
        self.clock = clock
        self.compiled = compiled and not trace
        self.fired_total = 0
        self.root = Frame(plan.root, None)
        self.root_ist = self._new_iter(self.root, 0)
        self.started = False
        self.yield_now = False
        # Return from `run` right after a Send of a frame's oldest live iteration (or of
        # the root) fires, so that the actor hands it to the transport before firing more
        # nodes: in a loop whose iterations wait on replies, that value is what a peer
        # waits for.
        self.break_on_send = False

    # ----------------------------------------------------------------- start
    def start(self, feed_values: list) -> None:
        """Deliver fed values and enqueue the root frame's sources."""
        ist = self.root_ist
        cr = self.plan.compiled_root
        if cr is not None and self.compiled:
            # the whole partition is one generated function: run it as one node
            m = _Macro(self.plan.root)
            m.kind = ROOT_MACRO
            m.gen = cr.start(list(feed_values))
            ist.outstanding += 1
            self.ready.append((m, ist))
            self.started = True
            return
        for edges, v in zip(self.plan.feeds, feed_values):
            self._deliver_edges(edges, v, ist)
        for node in self.plan.sources:
            self._ready(node, ist)
        self.started = True

    @property
    def done(self) -> bool:
        return self.started and self.root_ist.outstanding == 0

    # ------------------------------------------------------------- hot loop
    def run(self, budget: int = 1024) -> int:
        """Fire up to `budget` ready nodes; return how many fired."""
        ready = self.ready
        popleft = ready.popleft
        propagate = self._propagate
        done_node = self._done_node
        rules = CONTROL_RULES
        trace = self.trace_on
        fired = 0
        urgent = False   # a Send of the oldest live iteration fired (break_on_send)
        while ready and fired < budget:
            node, ist = popleft()
            fired += 1
            if trace:
                t0 = self.clock()
            if node.kind == KERNEL:                   # fast path: almost every node
                dead = ist.dead
                if dead is not None and node.local in dead:
                    propagate(node, node.dead_outs, ist, True)
                else:
                    b = node.in_base
                    slots = ist.slots
                    try:
                        r = node.fn(*slots[b:b + node.n_in])
                    except Exception as e:
                        raise self._error(node, ist, e) from e
                    if node.simple and not trace:
                        # fastest path: one output, plain consumers, nothing else to do
                        pending = ist.pending
                        for dst, slot, _ in node.outs[0]:
                            slots[slot] = r
                            loc = dst.local
                            p = pending[loc] - 1
                            pending[loc] = p
                            if p == 0:
                                if dst.ordered:
                                    self._ready(dst, ist)
                                else:
                                    ist.outstanding += 1
                                    ready.append((dst, ist))
                        ist.outstanding -= 1
                        if ist.outstanding == 0:
                            self._maybe_retire(ist.frame)
                        continue
                    propagate(node, (r,) if node.n_out == 1 else r, ist, False)
                if trace:
                    self._trace(node, ist, t0)
                done_node(node, ist)
            elif rules[node.kind](self, node, ist):
                if trace:
                    self._trace(node, ist, t0)
                done_node(node, ist)
                if node.kind == SEND:
                    if self.break_on_send and (
                            ist.frame.parent_ist is None or ist.it <= ist.frame.start_iter):
                        urgent = True
                    if ready and ready[0][0].kind == SEND:
                        # Sends ready one after another fire together (a value for several
                        # peers is handed to the transport in one go), budget or not
                        budget += 1
                    elif urgent:
                        break
            elif self.yield_now:
                self.yield_now = False  # a compiled frame asked to let the event loop run
                break
        self.fired_total += fired
        return fired

    def _propagate(self, node: Any, outs: tuple, ist: IterState, dead: bool) -> None:
        """Hand each output to its consumers in iteration `ist`."""
        if node.fetch:
            self._record_fetch(node, outs)
        slots = ist.slots
        pending = ist.pending
        k = 0
        for edges in node.outs:
            v = outs[k]
            k += 1
            for dst, slot, is_merge in edges:
                if is_merge:
                    self._merge_input(dst, slot, v, ist)
                    continue
                slots[slot] = v
                if v is DEAD:
                    if dst.kind == EXIT and not self.trace_on:
                        # A dead Exit (a loop Switch's false branch in every iteration
                        # but the last) fires to no effect: skip it (traces keep it).
                        continue
                    self._mark_dead(ist, dst)
                loc = dst.local
                p = pending[loc] - 1
                pending[loc] = p
                if p == 0:
                    self._ready(dst, ist)
        for dst in node.ctrl_outs:
            if dead:
                self._mark_dead(ist, dst)
            loc = dst.local
            p = ist.pending[loc] - 1
            ist.pending[loc] = p
            if p == 0:
                self._ready(dst, ist)

    def _deliver_edges(self, edges: tuple, v: Any, ist: IterState) -> None:
        for dst, slot, is_merge in edges:
            if is_merge:
                self._merge_input(dst, slot, v, ist)
                continue
            ist.slots[slot] = v
            if v is DEAD:
                self._mark_dead(ist, dst)
            p = ist.pending[dst.local] - 1
            ist.pending[dst.local] = p
            if p == 0:
                self._ready(dst, ist)

    @staticmethod
    def _mark_dead(ist: IterState, dst: NodeInfo) -> None:
        if ist.dead is None:
            ist.dead = {dst.local}
        else:
            ist.dead.add(dst.local)

    def _merge_input(self, dst: NodeInfo, slot: int, v: Any, ist: IterState) -> None:
        # Merge fires on its first live input; it is dead only if every input is dead.
        pend = ist.pending
        p = pend[dst.local]
        if p < 0:
            return  # already fired on a live input
        chosen = dst.in_base + dst.n_in
        if v is not DEAD:
            pend[dst.local] = -1
            ist.slots[chosen] = v
            ist.slots[chosen + 1] = np.int32(slot - dst.in_base)
            self._ready(dst, ist)
        else:
            p -= 1
            pend[dst.local] = p
            if p == 0:
                ist.slots[chosen] = DEAD
                self._ready(dst, ist)

    def _ready(self, node: Any, ist: IterState) -> None:
        ist.outstanding += 1
        if node.ordered:
            self._gate(node, ist)
            return
        self.ready.append((node, ist))

    def _gate(self, node: Any, ist: IterState) -> None:
        """Queue a stateful node, or park it until earlier iterations' stateful nodes
        have finished: of its own frame, and of each enclosing loop (a nested loop
        instance is one stateful node of its parent's iteration)."""
        fr, it = ist.frame, ist.it
        while fr.parent_ist is not None:
            if it > fr.st_iter:
                fr.st_parked.setdefault(it, []).append((node, ist))
                return
            it, fr = fr.parent_ist.it, fr.parent
        self.ready.append((node, ist))

    def _ordered_done(self, fr: Frame, it: int) -> None:
        """One stateful node of iteration `it` of `fr` finished."""
        fr.st_done[it] = fr.st_done.get(it, 0) + 1
        need = fr.info.n_ordered
        while fr.st_done.get(fr.st_iter, 0) == need:
            del fr.st_done[fr.st_iter]
            fr.st_iter += 1
            for node, ist in fr.st_parked.pop(fr.st_iter, ()):
                self._gate(node, ist)

    def _done_node(self, node: Any, ist: IterState) -> None:
        if node.ordered:
            self._ordered_done(ist.frame, ist.it)
        ist.outstanding -= 1
        if ist.outstanding == 0:
            self._maybe_retire(ist.frame)

    def _record_fetch(self, node: NodeInfo, outs: tuple) -> None:
        for idx, k in node.fetch:
            self.results[k] = outs[idx]

    # -------------------------------------------------------- frames/iters
    def _new_iter(self, frame: Frame, it: int) -> IterState:
        ist = IterState(frame, it)
        frame.iters[it] = ist
        frame.next_iter = it + 1
        for node, v in frame.invariants:  # loop constants are visible in every iteration
            self._propagate(node, (v,), ist, v is DEAD)
        return ist

    def _child_frame(self, info: FrameInfo, ist: IterState) -> Frame:
        key = (info.name, ist.it)
        fr = ist.frame.children.get(key)
        if fr is None:
            fr = Frame(info, ist)
            ist.frame.children[key] = fr
            ist.outstanding += 1   # a live child frame keeps its parent iteration alive
            self._new_iter(fr, 0)
        return fr

    def _maybe_retire(self, frame: Frame) -> None:
        if frame.parent_ist is None:
            return  # the root frame ends with the run
        pi = frame.info.parallel_iterations
        iters = frame.iters
        while True:
            ist = iters.get(frame.start_iter)
            if ist is None or ist.outstanding > 0:
                break
            if ist.it == 0 and frame.enters_pending > 0:
                break
            del iters[frame.start_iter]
            frame.start_iter += 1
            if frame.parked and frame.next_iter - frame.start_iter < pi:
                nxt = self._new_iter(frame, frame.next_iter)
                parked, frame.parked = frame.parked, []
                for node, v in parked:
                    self._propagate(node, (v,), nxt, False)
        if not iters and not frame.parked and frame.enters_pending == 0:
            self._finish_frame(frame)

    def _finish_frame(self, frame: Frame) -> None:
        pist = frame.parent_ist
        for ex in frame.info.exits:
            if ex.id not in frame.exit_live:
                # a loop that never produced a live value here (it ran dead) exits dead
                self._propagate(ex, (DEAD,), pist, True)
        del frame.parent.children[(frame.info.name, pist.it)]
        if frame.info.ordered:
            self._ordered_done(pist.frame, pist.it)
        pist.outstanding -= 1
        if pist.outstanding == 0:
            self._maybe_retire(pist.frame)

    # --------------------------------------------------------- async edges
    def deliver_recv(self, node: NodeInfo, ist: IterState, value: Any) -> None:
        """A Recv's value (or DEAD) arrived from the rendezvous."""
        if self.trace_on:       # (it fires now, outside `run`: traced here)
            t0 = self.clock()
            self._propagate(node, (value,), ist, value is DEAD)
            self._trace(node, ist, t0)
        else:
            self._propagate(node, (value,), ist, value is DEAD)
        self._done_node(node, ist)

    def resume(self, node: Any, ist: IterState) -> None:
        """Re-run a node that waited (ASYNC kernel, compiled frame) ahead of others."""
        self.ready.appendleft((node, ist))

    # ------------------------------------------------------------- helpers
    def _error(self, node: Any, ist: IterState, e: BaseException) -> Exception:
        frame = ist.frame.info.name if ist.frame.parent_ist is not None else None
        outer = []
        p = ist.frame.parent_ist
        while p is not None and p.frame.parent_ist is not None:   # enclosing loops
            outer.append((p.frame.info.name, p.it))
            p = p.frame.parent_ist
        return op_error(node.op if node.op is not None else node, frame,
                        ist.it if frame is not None else None, e, tuple(outer))

    def _trace(self, node: Any, ist: IterState, t0: float) -> None:
        self.trace.append((node.name, node.type, ist.frame.info.name, ist.it, t0, self.clock()))


# --------------------------------------------------------------- control rules
def _switch(ex: Executor, node: NodeInfo, ist: IterState) -> bool:
    b = node.in_base
    data, pred = ist.slots[b], ist.slots[b + 1]
    if data is DEAD or pred is DEAD or (ist.dead is not None and node.local in ist.dead):
        ex._propagate(node, (DEAD, DEAD), ist, True)
        return True
    if type(pred) is not _BOOL and getattr(pred, "ndim", 0):
        try:
            check_pred(pred)
        except InvalidArgumentError as e:
            raise ex._error(node, ist, e) from None
    if pred:
        ex._propagate(node, (DEAD, data), ist, False)
    else:
        ex._propagate(node, (data, DEAD), ist, False)
    return True


_BOOL = np.bool_


def check_pred(pred: Any) -> None:
    """A Switch's predicate must be a scalar (as in TF): the truth of [True, False], of
    [] or of [True] is no choice of branch (nor numpy's ValueError an op error)."""
    if getattr(pred, "ndim", 0):
        raise InvalidArgumentError(
            f"the predicate must be a scalar bool, but it has shape {list(pred.shape)} "
            "(reduce it: all is dcf.reduce_min(dcf.cast(p, dcf.int32)) > 0, any is "
            "dcf.reduce_max(dcf.cast(p, dcf.int32)) > 0; or index one element)")


def _merge(ex: Executor, node: NodeInfo, ist: IterState) -> bool:
    c = node.in_base + node.n_in
    v = ist.slots[c]
    if v is DEAD:
        ex._propagate(node, (DEAD, DEAD), ist, True)
    else:
        ex._propagate(node, (v, ist.slots[c + 1]), ist, False)
    return True


def _input(node: NodeInfo, ist: IterState) -> Any:
    if ist.dead is not None and node.local in ist.dead:
        return DEAD
    return ist.slots[node.in_base]


def _enter(ex: Executor, node: NodeInfo, ist: IterState) -> bool:
    v = _input(node, ist)
    info = node.child
    if info.compiled is not None and ex.compiled:
        return _enter_compiled(ex, node, ist, v)
    fr = ex._child_frame(info, ist)
    if node.is_constant:
        fr.invariants.append((node, v))
        for it_state in list(fr.iters.values()):
            ex._propagate(node, (v,), it_state, v is DEAD)
    else:
        ex._propagate(node, (v,), fr.iters[0], v is DEAD)
    fr.enters_pending -= 1
    if fr.enters_pending == 0:
        ex._maybe_retire(fr)
    return True


def _enter_compiled(ex: Executor, node: NodeInfo, ist: IterState, v: Any) -> bool:
    key = (node.child.name, ist.it)
    m = ist.frame.children.get(key)
    if m is None:
        m = ist.frame.children[key] = _Macro(node.child)
        ist.outstanding += 1
    m.enter_values[node.id] = v
    m.waiting -= 1
    if m.waiting == 0:
        del ist.frame.children[key]
        m.gen = node.child.compiled.start(m.enter_values, ist, ex)
        if m.ordered:
            ex._gate(m, ist)
        else:
            ex.ready.append((m, ist))
    return True


def _macro(ex: Executor, m: _Macro, ist: IterState) -> bool:
    try:
        next(m.gen)
    except StopIteration as stop:
        for exit_node, v in stop.value:
            ex._propagate(exit_node, (v,), ist, v is DEAD)
        return True
    ex.ready.append((m, ist))  # yielded to stay responsive: continue after the others
    ex.yield_now = True
    return False


def _root_macro(ex: Executor, m: _Macro, ist: IterState) -> bool:
    try:
        next(m.gen)
    except StopIteration as stop:
        ex.results = list(stop.value)
        return True
    ex.ready.append((m, ist))
    ex.yield_now = True
    return False


def _exit(ex: Executor, node: NodeInfo, ist: IterState) -> bool:
    v = _input(node, ist)
    if v is not DEAD:
        fr = ist.frame
        fr.exit_live.add(node.id)
        ex._propagate(node, (v,), fr.parent_ist, False)
    return True


def _next_iteration(ex: Executor, node: NodeInfo, ist: IterState) -> bool:
    v = _input(node, ist)
    if v is DEAD:
        return True  # deadness stops here: a finished loop starts no new iteration
    fr = ist.frame
    nit = ist.it + 1
    target = fr.iters.get(nit)
    if target is None:
        if fr.next_iter - fr.start_iter >= fr.info.parallel_iterations:
            fr.parked.append((node, v))  # at most parallel_iterations in flight
            return True
        target = ex._new_iter(fr, nit)
    ex._propagate(node, (v,), target, False)
    return True


def _trigger(ex: Executor, node: NodeInfo, ist: IterState) -> bool:
    ex._propagate(node, (), ist, False)  # never dead: it only orders what depends on it
    return True


def _send(ex: Executor, node: NodeInfo, ist: IterState) -> bool:
    ex.outbox.append(("send", node, ist, _input(node, ist)))
    return True


def _recv(ex: Executor, node: NodeInfo, ist: IterState) -> bool:
    if ist.dead is not None and node.local in ist.dead:
        ex._propagate(node, (DEAD,), ist, True)   # its iteration was cancelled upstream
        return True
    ex.outbox.append(("recv", node, ist))
    return False


def _async(ex: Executor, node: NodeInfo, ist: IterState) -> bool:
    if ist.dead is not None and node.local in ist.dead:
        ex._propagate(node, node.dead_outs, ist, True)
        return True
    b = node.in_base
    try:
        r = node.fn(*ist.slots[b:b + node.n_in])
    except WouldBlock as wb:
        ex.outbox.append(("wait", node, ist, wb.waitable))
        return False
    except Exception as e:
        raise ex._error(node, ist, e) from e
    ex._propagate(node, (r,) if node.n_out == 1 else r, ist, False)
    return True


CONTROL_RULES: dict[int, Callable[..., bool]] = {
    int(Kind.SWITCH): _switch,
    int(Kind.MERGE): _merge,
    int(Kind.ENTER): _enter,
    int(Kind.EXIT): _exit,
    int(Kind.NEXT_ITERATION): _next_iteration,
    int(Kind.SEND): _send,
    int(Kind.RECV): _recv,
    int(Kind.ASYNC): _async,
    int(Kind.TRIGGER): _trigger,
    MACRO: _macro,
    ROOT_MACRO: _root_macro,
}


def check_fetches(ex: Executor, fetch_nodes: list) -> None:
    for k, v in enumerate(ex.results):
        if v is DEAD:
            raise InvalidArgumentError(
                f"fetch {fetch_nodes[k]} is dead: it lies on a branch that was not taken")
