"""One asyncio actor per device: owns the device's resources and runs its partition's
executor for each step in bounded bursts, yielding to the event loop between them.

Sends to other processes leave through `rendezvous.remote_send` (one value) or
`remote_send_batch` (several for one peer). When to hand them over is the one policy
here that matters for distributed loops (see `_StepRun.hold`): a partition that waits
for answers sends a value of its oldest live iteration at once, since its peer's reply
is on the loop's critical path, while values for iterations that run ahead (a loop
predicate's producer racing ahead within parallel_iterations) are held for a moment and
share a message with the next ones.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from dcf.executor import Executor
from dcf.gil import share_if_due
from dcf.plan import ExecPlan
from dcf.resources import DeviceResources
from dcf.token import DEAD

__all__ = ["DeviceActor"]

_BURST = 512            # nodes fired between checks of the clock (at most)
_BURST_FIRST = 32       # ... at a step's start: bursts double while they stay short and
                        # shrink when one overruns the pump's budget (slow kernels, py_funcs)
_BURST_REMOTE = 32      # ... in a partition that sends to other processes
_BURST_WAITING = 8      # ... while it also waits for values (answers are latency-bound)
_YIELD_EVERY_S = 0.002  # hand the event loop back at least this often (frame_compiler._YIELD_S)
_INLINE_S = 0.0005      # longest run inside a transport callback
_FLUSH_S = 0.0002       # longest a run-ahead send is held while nodes are ready
_HOLD_S = 0.001         # ... or while the partition waits for an answer to piggyback on
_FLUSH_N = 256          # ... or until this many are held


class DeviceActor:
    """The actor of one device of one session."""

    def __init__(self, device: str, resources: DeviceResources | None = None) -> None:
        self.device = device
        self.resources = resources or DeviceResources(device)
        self._remote_plans: dict[int, tuple[ExecPlan, bool]] = {}

    async def run_step(self, plan: ExecPlan, feeds: list, step: Any, rendezvous: Any, *,
                       trace: bool = False, compiled: bool = True,
                       scope: Any = None, deadline: float | None = None) -> Executor:
        """Run one step of `plan`; return the finished executor (results, trace).
        `scope`: entered around each pump of the step (a GPU's TraceScope), else None.
        `deadline` (time.monotonic()): past it, no burst starts; the step raises
        asyncio.TimeoutError instead."""
        ex = Executor(plan, trace=trace, step_id=step, compiled=compiled)
        run = _StepRun(ex, step, rendezvous, self._talks_remote(plan), scope)
        return await run.run(feeds, deadline)

    def _talks_remote(self, plan: ExecPlan) -> bool:
        key = id(plan)
        hit = self._remote_plans.get(key)
        if hit is None or hit[0] is not plan:
            hit = self._remote_plans[key] = (plan, any(
                n.pnode is not None and "peer" in n.pnode.attrs for n in plan.nodes))
        return hit[1]


class _StepRun:
    """One step of one partition: the executor, its wake-ups and its outgoing messages."""

    def __init__(self, ex: Executor, step: Any, rendezvous: Any, remote: bool,
                 scope: Any = None) -> None:
        self.ex = ex
        self.scope = scope
        self.step = step
        self.rendezvous = rendezvous
        self.remote = remote
        self.loop = asyncio.get_running_loop()
        self.wake: asyncio.Future | None = None
        self.pumping = False
        self.failed: BaseException | None = None     # raised by an inline pump
        self.waiting = 0                              # Recvs registered, not yet served
        self.waits: set[asyncio.Task] = set()       # async kernels' waits not yet over
        self.held: dict[str, list] = {}               # peer -> [(key, value)] not yet sent
        self.held_n = 0
        self.held_at = 0.0
        self.urgent = False                           # a held value should leave now
        self.oldest_held = False   # a value of the oldest iteration, held while not waiting
        self.timer: asyncio.TimerHandle | None = None
        self.deferred = False                         # in the rendezvous's deferred batch
        self.burst = _BURST_FIRST                     # nodes per burst (local partitions)

    # ------------------------------------------------------------------ loop
    async def run(self, feeds: list, deadline: float | None = None) -> Executor:
        ex = self.ex
        ex.start(feeds)
        last_yield = time.perf_counter()
        try:
            while True:
                if self.failed is not None:
                    raise self.failed
                if deadline is not None and time.monotonic() > deadline:
                    # (the loop came back late, before the run's timeout cancelled it:
                    # no kernel starts now, such as a woken dequeue taking its element)
                    raise asyncio.TimeoutError
                self.pump(_YIELD_EVERY_S)
                if ex.done:
                    if self.held_n:
                        self.flush()
                    return ex
                if ex.ready:
                    now = time.perf_counter()
                    if now - last_yield > _YIELD_EVERY_S:
                        await asyncio.sleep(0)
                        last_yield = time.perf_counter()
                    continue
                fut = self.wake = self.loop.create_future()
                await fut
                self.wake = None
                last_yield = time.perf_counter()
        finally:
            if self.timer is not None:
                self.timer.cancel()
            for t in list(self.waits):
                if not t.done():
                    t.cancel()

    def poke(self) -> None:
        f = self.wake
        if f is not None and not f.done():
            f.set_result(None)

    def pump(self, budget_s: float) -> None:
        """Fire ready nodes and dispatch their messages for up to `budget_s`, inside
        the step's scope where it has one."""
        scope = self.scope
        if scope is None:
            self._pump(budget_s)
            return
        with scope:
            self._pump(budget_s)

    def _pump(self, budget_s: float) -> None:
        ex = self.ex
        self.pumping = True
        try:
            # (other threads get the GIL now and then: dcf/gil.py; its sleep is not
            # counted in the first burst's time)
            now = share_if_due(time.perf_counter())
            deadline = now + budget_s
            while True:
                if not self.remote:
                    burst = self.burst
                else:  # a Send reaches the transport soon after it fires
                    burst = _BURST_WAITING if self.waiting else _BURST_REMOTE
                    # ... at once while this partition waits for answers
                    ex.break_on_send = self.waiting > 0
                fired = ex.run(burst)
                if ex.outbox:
                    self.dispatch()
                if self.held_n and (self.urgent or self._held_too_long()):
                    self.flush()
                then, now = now, time.perf_counter()
                if not self.remote:
                    # the clock is read once a burst: a burst of slow nodes (a py_func
                    # that steps an environment) must not keep the loop -- other runs,
                    # a cancel, Ctrl-C -- waiting for long
                    took = now - then
                    if took > budget_s:
                        self.burst = max(1, int(burst * budget_s / took))
                    elif fired == burst and burst < _BURST and took < budget_s / 4:
                        self.burst = burst * 2
                if ex.done or not ex.ready or now > deadline:
                    return
        finally:
            self.pumping = False
            if self.held_n:
                if self.urgent or self.oldest_held or not self.waiting or ex.done:
                    self.flush()
                elif self.timer is None:
                    self.timer = self.loop.call_later(_HOLD_S, self._flush_later)

    # ------------------------------------------------------------ messages
    def dispatch(self) -> None:
        ex = self.ex
        rendezvous, step = self.rendezvous, self.step
        out, ex.outbox = ex.outbox, []
        for item in out:
            kind = item[0]
            if kind == "send":
                _, node, ist, v = item
                attrs = node.pnode.attrs
                if attrs.get("ctrl") and v is not DEAD:
                    v = True
                peer = attrs.get("peer")
                if peer is None:
                    rendezvous.send((step, attrs["edge"], ist.tag), v)
                else:  # its Recv lives in another process
                    self.hold(peer, (step, attrs["edge"], ist.tag), v, ist)
            elif kind == "recv":
                _, node, ist = item
                self.waiting += 1
                rendezvous.recv((step, node.pnode.attrs["edge"], ist.tag),
                                self.on_value(node, ist))
            else:
                _, node, ist, waitable = item
                self.waits.add(self.loop.create_task(self.wait_then_resume(
                    node, ist, waitable)))

    def hold(self, peer: str, key: tuple, value: Any, ist: Any) -> None:
        """Queue a value for another process. It is urgent (sent at the end of this
        burst) when this partition is waiting for values and the value belongs to its
        oldest live iteration (or to no loop): then the peer's answer is likely what
        this partition waits for. Values of iterations running ahead wait for the next
        urgent one, or _HOLD_S, to share its message. A value of the oldest iteration
        held while the partition is not yet waiting leaves at the end of the pump if it is
        waiting by then (its next Recv may register after this Send fired)."""
        if not self.held_n:
            self.held_at = time.perf_counter()
        self.held_n += 1
        lst = self.held.get(peer)
        if lst is None:
            lst = self.held[peer] = []
        lst.append((key, value))
        if not self.urgent:
            fr = ist.frame
            oldest = fr.parent_ist is None or ist.it <= fr.start_iter
            if self.waiting:
                self.urgent = oldest
            elif oldest:
                self.oldest_held = True

    def _held_too_long(self) -> bool:
        # A partition that waits for answers keeps run-ahead values for its next urgent
        # message (or the _HOLD_S timer); one that only produces flushes every _FLUSH_S.
        return self.held_n > _FLUSH_N or (
            not self.waiting and time.perf_counter() - self.held_at > _FLUSH_S)

    def flush(self) -> None:
        """Hand held values to the transport: one message per peer."""
        rendezvous = self.rendezvous
        batch = rendezvous.remote_send_batch
        held = self.held
        self.held = {}
        self.held_n = 0
        self.urgent = False
        self.oldest_held = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for peer, items in held.items():
            if len(items) == 1 or batch is None:
                for key, v in items:
                    rendezvous.remote_send(peer, key, v)
            else:
                # oldest iteration first: the receiver acts on items in order, and a value
                # its current iteration waits for should not queue behind predicates of
                # iterations far ahead
                items.sort(key=_iteration_of)
                batch(peer, items)

    def _flush_later(self) -> None:
        self.timer = None
        if self.held_n:
            try:
                self.flush()
            except BaseException as e:  # noqa: BLE001 - re-raised by the step
                self.failed = e
                self.poke()

    def on_value(self, node: Any, ist: Any) -> Any:
        def cb(value: Any) -> None:
            self.waiting -= 1
            self.ex.deliver_recv(node, ist, value)
            batch = self.rendezvous.deferred
            if batch is not None:
                # more values of the same message follow: act once they are all in
                if not self.deferred:
                    self.deferred = True
                    batch.append(self)
                return
            self.on_values()
        return cb

    def on_values(self) -> None:
        """Values were delivered: run what they enable."""
        self.deferred = False
        if self.remote and not self.pumping and self.failed is None and \
                self.wake is not None:
            # A value from another process while this actor waits: run what it enables
            # now, in the transport's callback, instead of one loop hop later (it is on
            # the critical path of every loop iteration).
            try:
                self.pump(_INLINE_S)
            except BaseException as e:  # noqa: BLE001 - re-raised by the step
                self.failed = e
            if not self.ex.ready and not self.ex.done and self.failed is None:
                return  # nothing left to do until the next value
        self.poke()

    async def wait_then_resume(self, node: Any, ist: Any, waitable: Any) -> None:
        try:
            await waitable
        finally:
            # (over: a loop that dequeues for as long as it runs keeps none of them)
            self.waits.discard(asyncio.current_task())
        self.ex.resume(node, ist)
        self.poke()


def _iteration_of(item: tuple) -> int:
    tag = item[0][2]
    it = tag[-1] if tag else 0
    return it if type(it) is int else 0
