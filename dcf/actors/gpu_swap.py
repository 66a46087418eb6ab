"""The swapper of saved loop values: a GPU's side of `swap_memory=True` loops.

Stacks of `swap_memory=True` loops (`GpuStackStore`) swap values (>= 64 KiB, each buffer
once) to pinned host memory on the d2h stream once pool use passes `swap_threshold` of the
limit: the loop ticks the GPU's swapper (`_Swapper`, one per `GpuDevice` of
dcf/actors/gpu.py) every few iterations, which moves out the bytes over the threshold as
the oldest saved values still on the device (the backward pass wants them last), unless
moving them would free nothing (held elsewhere, or memory other arrays hold); the backward
loop's ticks and pops bring swapped entries back on the h2d stream ahead of use (stack
order is known), and a value still on the device is popped as is. A failed allocation
first moves saved values out and waits for their device buffers to be free (throttling:
`GpuDevice.relieve`, `_Swapper.make_room`).
"""

from __future__ import annotations

import collections
import sys
import weakref
from typing import TYPE_CHECKING, Any

from dcf.errors import OutOfRangeError
from dcf.ops.data_ops import StackStore

if TYPE_CHECKING:
    from dcf.actors.gpu import GpuDevice

__all__ = ["GpuStackStore"]

SWAP_MIN_BYTES = 64 << 10     # smaller values stay on the device
TICK_EVERY = 4                # compiled loops with swapping stacks tick the swapper this often
KEEP_NEWEST = 2               # a stack's newest entries held elsewhere are looked at again later
HELD_RUN = 8                  # after this many entries in a row held elsewhere, a stack's
#                               later entries are passed over without a look
PREFETCH_ITEMS = 8            # swapped entries always allowed back ahead of their pops
PREFETCH_BATCH = 16           # entries brought back per pop at most (one h2d event)
PREFETCH_MIN = 4              # smallest prefetch batch while others are on their way
D2H_IN_FLIGHT = 16            # swap-out copies queued on the d2h stream at once
PUMP_BATCH = 8                # swap-outs started together (one pair of events per batch)
LARGE_SHARE = 0.375           # values this share of the largest one pushed move out first
PREFETCH_MAX_USE = 0.95       # the first PREFETCH_ITEMS come back while use is under this
RELIEF_BYTES = 256 << 20      # what one throttling step moves out beyond what is owed
USAGE_EVERY = 16              # swapper decisions re-read pool use this often
KEEP_SHARED = True            # saved values whose memory other arrays hold are not moved


# ----------------------------------------------------------------- swapping
class _Rec:
    """One saved value moved off the device (shared by the stack entries that hold the
    same array), made when its swap-out starts."""

    __slots__ = ("dev", "host", "host_ptr", "ev_in", "state", "refs", "shape", "dtype",
                 "nbytes", "ahead", "gpu", "__weakref__")

    OUT, HOST, IN, GONE = range(4)      # OUT: its copy to the host is running

    def __init__(self, value: Any, gpu: Any) -> None:
        self.gpu = gpu
        self.dev = value
        self.host = None          # the pinned buffer's owner (keeps it alive)
        self.host_ptr = 0
        self.ev_in = None
        self.state = _Rec.OUT
        self.refs = 1
        self.shape = value.shape
        self.dtype = value.dtype
        self.nbytes = value.nbytes
        self.ahead = False        # brought back ahead of its pop, not popped yet

    def __del__(self) -> None:
        # Dropped while brought back ahead of its pop (its stack gone: a run that failed
        # in its backward loop): nothing on the compute stream has waited for the copy
        # into its buffer, which may still be running, so the buffer stays out of the
        # pool -- where the next array would get it and the copy write over that -- until
        # the copy is done.
        if self.state == _Rec.IN and self.dev is not None and self.ev_in is not None:
            try:
                if not self.ev_in.done:
                    self.gpu.defer(self.ev_in, self.dev)
            except Exception:   # noqa: BLE001 - interpreter shutdown, device gone
                pass


def _live(ref: Any, state: int) -> Any:
    """The record behind a weak reference if it is still in `state`, else None."""
    rec = ref()
    return rec if rec is not None and rec.state == state else None


class _Swapper:
    """Moves saved loop values to pinned host memory and back (one per GPU): a pager.

    Pushes and pops of a swapping stack cost what a plain stack's do (a list's append
    and pop, inline in compiled loops): the swapper keeps no record per push. It acts
    when a compiled loop holding such stacks calls `tick()` (every TICK_EVERY
    iterations; pushes outside compiled loops tick themselves): past the threshold, the
    bytes over it are owed and paid with the *oldest* entries of the step's swapping
    stacks (each stack scanned from a cursor) -- the large ones (at least LARGE_SHARE of
    the largest seen) first, the others only when no large one is left -- in batches of
    copies on the d2h stream: the backward loop pops the newest values first, so those
    stay and are popped without waiting, while the oldest have the whole backward pass to
    come back; and a copy, like anything else put on another stream, costs the host about
    the same whatever its size (bench/NOTES.md, "GPU, session 12"), so the same bytes
    move in fewer, larger copies. Looking at an entry only when it comes up replaced a
    record per push, whose bookkeeping was most of the swapper's host time
    (bench/NOTES.md, "GPU, session 14").

    An entry moves only if moving frees its memory: nothing else holds the array (its
    reference count, save other stack entries of the same array, which move with it:
    an LSTM's c(t) is saved twice), and no other array holds its memory (a view, or a
    buffer a live view points into, as an LSTM's concatenation [x, h] whose h the outputs'
    TensorArray keeps); saved views of one buffer move together once all of them are up.
    The newest KEEP_NEWEST entries of a stack may still be in use by the loop: one held
    elsewhere is looked at again later instead of passed over. Values come back newest-
    swapped first, ahead of their pops, as far as memory under the threshold allows (at
    least PREFETCH_ITEMS entries). Stacks and records are held weakly: the stacks own
    them, so a run that fails leaves nothing behind here."""

    def __init__(self, gpu: GpuDevice) -> None:
        self.gpu = gpu
        self.stacks: list = []      # weak references of the swapping stacks, oldest first
        self.ready: collections.deque = collections.deque()   # views whose whole group
        #                             is saved: (stack ref, index, id), moved before others
        self.shared: dict = {}      # memory key -> saved views of it waiting for the rest
        self.largest = 0            # the largest saved value seen this step or the last
        self._step_largest = 0      # ... this step
        self.owed = 0               # bytes to move out (over the threshold)
        self.out: collections.deque = collections.deque()   # (rec, event) in flight
        self.out_bytes = 0          # their bytes, still on the device until collected
        self.host: list = []        # swapped out, oldest push first (pops want the last)
        self.ahead = 0              # records brought back ahead of their pops
        self.ahead_refs: list = []  # (weakly) those records, in the order they came back
        self._used = 0          # pool use, sampled: cupy's used_bytes() walks every chunk
        self._countdown = 0
        self._waited_in = None  # the h2d event the compute stream last waited for
        self._no_room = None    # (swapped entries, entries ahead, pool use) of the last
        #                         prefetch that found too little room
        self._limit = gpu.swap_threshold * gpu.capacity   # use past it is owed
        self._lone = self._refs([object()], 0)            # an array only its entry holds

    @staticmethod
    def _refs(items: list, i: int) -> int:
        """References to items[i] held by the list and one local, as _head counts them."""
        v = items[i]
        return sys.getrefcount(v)

    def reset(self) -> None:
        """Before a step: sample pool use afresh, take the device's threshold, forget
        stacks and records that are gone."""
        if self._step_largest:
            self.largest = self._step_largest
        self._step_largest = 0
        self._countdown = 0
        self._limit = self.gpu.swap_threshold * self.gpu.capacity
        self.stacks = [r for r in self.stacks if r() is not None]
        self._forget_heads()
        self.ready = collections.deque(e for e in self.ready if self._value(e) is not None)
        self.host = [r for r in self.host if _live(r, _Rec.HOST)]
        self.ahead_refs = [r for r in self.ahead_refs if r() is not None and r().ahead]
        self.ahead = len(self.ahead_refs)
        self.owed = 0
        self.shared = {}
        self._no_room = None

    def register(self, stack: Any) -> None:
        """A swapping stack made for this step (GpuStackStore)."""
        self.stacks.append(stack.ref)

    def usage(self) -> int:
        """Device pool bytes in use, re-read every USAGE_EVERY calls."""
        self._countdown -= 1
        if self._countdown < 0:
            self._used = self.gpu.used_bytes()
            self._countdown = USAGE_EVERY
        return self._used

    def push(self, stack: Any, value: Any) -> None:
        """Append `value` to `stack`'s items (outside compiled loops, which append
        inline and tick every TICK_EVERY iterations), then tick."""
        stack.items.append(value)
        self.tick(True)

    def tick(self, pushing: bool, end: bool = False) -> None:
        """Finish copies that are done; then, in a loop that pushes, owe the bytes pool
        use is over the threshold (less those already on their way out) and start paying
        them -- all of them at the loop's `end`, where no later tick would (a debt under
        a batch's worth waits for more otherwise); in one that pops, bring swapped
        entries back ahead of their pops."""
        if self.out:
            self.collect()
        if pushing:
            if self.stacks:
                # copies to the host that are done let go of their sources, which would
                # look held elsewhere (a loop's value sent to the host each iteration).
                # Only those done by now: on a GPU behind the host they are not yet, and
                # such a loop's stack can still be given up on (bench/NOTES.md, session 35)
                self.gpu.collect()
                used = self._used = self.gpu.used_bytes()
                self._countdown = USAGE_EVERY
                over = used - self._limit - self.out_bytes
                self.owed = over if over > 0 else 0
                if over > 0:
                    self.pump(force=end)
        else:
            if self.stacks:
                self._forget_heads()           # pops may have changed the entries
            if self.host:
                self.owed = 0                  # the backward pass gives memory back
                self._prefetch()

    def _forget_heads(self) -> None:
        for ref in self.stacks:
            st = ref()
            if st is not None:
                st.head = None

    @staticmethod
    def _value(e: tuple) -> Any:
        """A ready entry's array, if its stack entry still holds it, else None."""
        stack = e[0]()
        if stack is not None:
            items = stack.items
            if e[1] < len(items):
                v = items[e[1]]
                if id(v) == e[2] and type(v) is not _Rec:
                    return v
        return None

    def _next(self) -> tuple:
        """(stack, index, array, other entries holding it) of the next swap-out without
        taking it: a ready group's view first, else the oldest movable entry of the
        stacks, large ones first; (None, None, None, None) where none is left. Entries
        that cannot move are passed over (counted as kept), except among a stack's
        newest KEEP_NEWEST, which the loop may still hold."""
        ready = self.ready
        while ready:
            e = ready[0]
            v = self._value(e)
            if v is not None:
                return e[0](), e[1], v, ()
            ready.popleft()
        best = small = None
        lim = LARGE_SHARE * self.largest
        for ref in self.stacks:
            st = ref()
            if st is None:
                continue
            got = self._head(st)
            if got is None:
                continue
            if got[2].nbytes >= lim:
                if best is None or got[1] < best[1]:
                    best = got
            elif small is None or got[1] < small[1]:
                small = got
        if ready:                      # a group completed while the stacks were scanned
            return self._next()
        return best or small or (None, None, None, None)

    def _head(self, st: Any) -> tuple | None:
        """`st`'s oldest entry that may move: (st, index, array, other entries holding
        it); its cursor moves past entries that may not."""
        items = st.items
        nd = self.gpu.ndarray
        i = st.scan
        h = st.head
        if h is not None and h[0] == i and i < len(items) and id(items[i]) == h[1] and \
                type(items[i]) is nd:
            return st, i, items[i], h[2]      # found movable before, untouched since
        if st.held:                           # its values are held elsewhere: pass over
            end = len(items) - KEEP_NEWEST
            if end > i:
                self.gpu.stats["swap_kept"] += end - i
                st.scan = end
            return None
        while i < len(items):
            v = items[i]
            if type(v) is not nd or v.nbytes < SWAP_MIN_BYTES:
                i += 1
                st.scan = i
                continue
            n = v.nbytes
            if n > self._step_largest:
                self._step_largest = n
                if n > self.largest:
                    self.largest = n
            newest = i >= len(items) - KEEP_NEWEST
            extra = sys.getrefcount(v) - self._lone     # (v: the list's and this local)
            dups: tuple = ()
            if extra > 0:
                dups = self._dups(st, i, v, extra)
                if len(dups) != extra:          # something else holds it
                    if newest:
                        return None             # (the loop, maybe): look again later
                    self.gpu.stats["swap_kept"] += 1
                    i += 1
                    st.scan = i
                    st.held_run += 1
                    if st.held_run >= HELD_RUN:  # (a variable's value, pushed each
                        st.held = True           # iteration; a TensorArray's elements)
                        return self._head(st)
                    continue
            if KEEP_SHARED:
                others, key = self.gpu.memory_holders(v)
                if others > 0:
                    if newest:
                        return None
                    i += 1
                    st.scan = i
                    self._group(key, others, (st.ref, i - 1, id(v)))
                    continue
            st.head = (i, id(v), dups)
            st.held_run = 0
            return st, i, v, dups
        return None

    def _dups(self, st: Any, i: int, v: Any, extra: int) -> tuple:
        """The other stack entries holding array v (pushed again: next to index i in
        another stack, or in this one; or, where those are not all of its `extra`
        holders, first or last in another stack: a value entering an inner loop, saved by
        the outer loop and by the inner loop's first iteration, in a stack of its own)."""
        found = []
        for ref in self.stacks:
            s2 = ref()
            if s2 is None:
                continue
            items = s2.items
            for j in (i - 1, i, i + 1):
                if 0 <= j < len(items) and items[j] is v and (s2 is not st or j != i):
                    found.append((s2, j))
        if len(found) < extra:
            near = {(id(s2), j) for s2, j in found}
            near.add((id(st), i))
            for ref in self.stacks:
                s2 = ref()
                if s2 is None or not s2.items:
                    continue
                items = s2.items
                for j in (0, len(items) - 1):
                    if items[j] is v and (id(s2), j) not in near:
                        near.add((id(s2), j))
                        found.append((s2, j))
        return tuple(found)

    def _group(self, key: int, others: int, e: tuple) -> None:
        """A saved value whose memory other arrays hold: kept, unless with the saved
        values of the same memory seen before it the group holds it all, when the group
        moves (to the ready queue)."""
        group = self.shared.setdefault(key, [])
        group.append(e)
        live = [g for g in group if self._value(g) is not None]
        if len(live) <= others:
            self.shared[key] = live
            self.gpu.stats["swap_kept"] += 1
            return
        del self.shared[key]
        self.ready.extend(live)

    def _take(self, st: Any, i: int, v: Any, dups: tuple) -> _Rec:
        """The record of entry i of `st` (array v), put in place of v there and in the
        other entries holding it."""
        rec = _Rec(v, self.gpu)
        st.items[i] = rec
        st.head = None
        rec.refs = 1
        for s2, j in dups:
            if j < len(s2.items) and s2.items[j] is v:
                s2.items[j] = rec
                rec.refs += 1
        ready = self.ready
        if ready and ready[0][0]() is st and ready[0][1] == i:
            ready.popleft()
        elif st.scan == i:
            st.scan = i + 1
        return rec

    def pump(self, force: bool = False) -> None:
        """Pay owed bytes with the oldest entries (large ones first) while fewer than
        D2H_IN_FLIGHT copies are running: once PUMP_BATCH of the next value's size are
        owed (what is owed, when forced), after one event on the compute stream (the
        values' producers) and before one on the d2h stream that the whole batch shares
        (an event costs the host about as much as a copy); each value into a pinned
        block of its size class, recycled (GpuDevice.pinned_buffer)."""
        out = self.out
        if self.owed <= 0 or len(out) >= D2H_IN_FLIGHT:
            return
        st, i, v, dups = self._next()
        if st is None:
            self.owed = 0             # nothing left on the device to move
            return
        if not force and self.owed < PUMP_BATCH * v.nbytes:
            return
        recs: list = []
        paid = 0
        while st is not None and self.owed > paid and len(out) + len(recs) < D2H_IN_FLIGHT:
            rec = self._take(st, i, v, dups)
            recs.append(rec)
            paid += rec.nbytes
            v = None
            st, i, v, dups = self._next()
        v = None
        if recs:
            gpu = self.gpu
            s = gpu.d2h
            s.wait_event(gpu.record(gpu.compute))
            parts = []
            for rec in recs:
                arr = rec.dev
                if not arr.flags.c_contiguous:
                    arr = rec.dev = gpu.cp.ascontiguousarray(arr).reshape(rec.shape)
                rec.host, rec.host_ptr = gpu.pinned_buffer(rec.nbytes)
                parts.append((rec.host_ptr, arr.data.ptr, rec.nbytes))
                gpu.stats["swap_out_bytes"] += rec.nbytes
            gpu.stats["swap_outs"] += len(recs)
            ev = gpu.copy_parts(parts, s, "swap out", gpu.D2H)
            self.owed -= paid         # (a large value may pay ahead)
            self.out_bytes += paid
            for rec in recs:
                out.append((rec, ev))
        if st is None:
            self.owed = 0             # nothing left on the device to move

    def collect(self) -> None:
        """Finish the swap-outs whose copies are done (their device buffers go back to
        the pool), then start more if bytes are owed."""
        out = self.out
        if not out or not out[0][1].done:
            return
        done_ev = None
        while out and (out[0][1] is done_ev or out[0][1].done):
            rec, done_ev = out.popleft()
            self.out_bytes -= rec.nbytes
            if rec.state == _Rec.OUT:
                rec.state = _Rec.HOST
                rec.dev = None                 # the device buffer goes back to the pool
                self.host.append(weakref.ref(rec))
            elif rec.state == _Rec.GONE:
                rec.dev = None
                rec.host = None
        self.gpu.collect()
        self.pump()

    def settle(self) -> None:
        """After a step on this GPU, whatever its end: nothing is owed any more, and the
        swap-outs in flight let go of their device buffers -- those of a step that failed
        or was cancelled in its forward loop stayed in use (up to D2H_IN_FLIGHT values)
        until a later step's swapping loop collected them, and an inference-only step
        never does. Where no other step runs here, the copies still running are waited
        for (a handful of copies); else the other steps' ticks collect them."""
        self.owed = 0
        if self.out:
            if not self.gpu.running_steps():
                self.out[-1][1].synchronize()
            self.collect()

    def pop(self, rec: _Rec) -> Any:
        gpu = self.gpu
        gpu.make_current()
        st = rec.state
        if st == _Rec.HOST:
            self._fetch(rec)
            st = rec.state
        v = rec.dev
        if st == _Rec.IN and rec.ev_in is not self._waited_in:
            gpu.compute.wait_event(rec.ev_in)    # entries fetched together share one
            self._waited_in = rec.ev_in
        if rec.ahead:
            rec.ahead = False
            self.ahead -= 1
        if st == _Rec.OUT:                     # popped while its copy out still ran
            gpu.stats["swap_popped_in_flight"] += 1
        rec.refs -= 1
        if rec.refs == 0:
            if st == _Rec.OUT:
                rec.state = _Rec.GONE          # collect() drops it when the copy is done
            else:
                if rec.host is not None and rec.ev_in is not None:
                    gpu.defer(rec.ev_in, rec.host)
                rec.state = _Rec.GONE
                rec.dev = None
                rec.host = None
        self.passed()
        return v

    def passed(self) -> None:
        """After a pop: stop owing once memory comes back, prefetch, collect."""
        if self.owed > 0 and self.usage() < self._limit:
            self.owed = 0                      # the backward pass is giving memory back
        if self.host:
            self._prefetch()
        if self.out:
            self.collect()

    def _fetch(self, rec: _Rec, batch: list | None = None) -> bool:
        """Copy a swapped entry back on the h2d stream. With `batch` (a prefetch), the
        entry joins it: its buffer is allocated, the caller copies the batch's entries
        together (GpuDevice.copy_parts) after one wait for the compute stream, and a full
        pool ends the prefetch (False) instead of making room."""
        gpu = self.gpu
        if batch is None:
            dst = gpu.alloc(rec.shape, rec.dtype, "a swapped-in stack value")
        else:
            try:
                dst = gpu.cp.empty(rec.shape, rec.dtype)
            except MemoryError:
                return False
        rec.dev = dst
        rec.state = _Rec.IN
        if batch is None:
            s = gpu.h2d
            gpu._copy_stream_after_compute(s)
            rec.ev_in = gpu.copy_parts([(dst.data.ptr, rec.host_ptr, rec.nbytes)], s,
                                       "swap in", gpu.H2D)
        else:
            batch.append(rec)
            rec.ahead = True
            self.ahead += 1
            self.ahead_refs.append(weakref.ref(rec))
        gpu.stats["swap_in_bytes"] += rec.nbytes
        gpu.stats["swap_ins"] += 1
        return True

    def _prefetch(self) -> None:
        """Bring back the next swapped entries the pops will want (the newest swapped):
        up to PREFETCH_BATCH per call, while pool use stays under the swap threshold,
        or, for the first PREFETCH_ITEMS ahead, under PREFETCH_MAX_USE of the budget.
        While PREFETCH_MIN entries are already on their way, fewer than that wait for
        more room (a batch costs two events whatever its size)."""
        h = self.host
        gpu = self.gpu
        used = self.usage()
        cap = gpu.capacity
        if self.ahead >= PREFETCH_ITEMS and used >= cap * gpu.swap_threshold:
            return           # only room under the threshold would do (as last sampled)
        state = (len(h), self.ahead, self._used)
        if state == self._no_room:
            return           # as at the last try, which found too little room
        if gpu.limit and used > 0.8 * gpu.limit:   # near the budget: a fresh reading
            used = self._used = gpu.used_bytes()
        hard = cap * PREFETCH_MAX_USE - used
        soft = cap * gpu.swap_threshold - used
        cands: list = []
        k = len(h) - 1
        while k >= 0 and len(cands) < PREFETCH_BATCH:
            rec = _live(h[k], _Rec.HOST)
            if rec is not None:
                n = rec.nbytes
                if n > hard or (n > soft and self.ahead + len(cands) >= PREFETCH_ITEMS):
                    break        # near the budget: the pop itself fetches
                cands.append(rec)
                hard -= n
                soft -= n
            k -= 1
        if not cands or (len(cands) < PREFETCH_MIN and self.ahead >= PREFETCH_MIN and k >= 0):
            self._no_room = state
            return
        del h[k + 1:]            # the candidates and the dead references above them
        batch: list = []
        done = 0
        for rec in cands:
            if not self._fetch(rec, batch):
                break
            self._used += rec.nbytes
            done += 1
        for rec in reversed(cands[done:]):          # not fetched: back, in stack order
            h.append(weakref.ref(rec))
        if batch:
            s = gpu.h2d
            gpu._copy_stream_after_compute(s)
            ev = gpu.copy_parts([(r.dev.data.ptr, r.host_ptr, r.nbytes) for r in batch], s,
                                "swap in", gpu.H2D)
            for rec in batch:
                rec.ev_in = ev

    def evict_prefetched(self) -> bool:
        """Give back the device copies of values brought in ahead of their pop (their
        host copies stay; a later prefetch or the pop fetches them again)."""
        recs = [r for r in (ref() for ref in self.ahead_refs)
                if r is not None and r.ahead and r.state == _Rec.IN and r.host is not None]
        self.ahead_refs = []
        self.ahead = 0
        if not recs:
            return False
        self.gpu.h2d.synchronize()         # no copy may still write the buffers
        for rec in reversed(recs):         # the first brought back is wanted first: last
            rec.dev = None
            rec.ev_in = None
            rec.ahead = False
            rec.state = _Rec.HOST
            self.host.append(weakref.ref(rec))
        self.gpu.stats["evicted"] += 1
        return True

    def make_room(self) -> bool:
        """Throttle: move out what is owed and up to RELIEF_BYTES more of the oldest
        entries still on the device (large ones first), and wait until their device
        buffers are free."""
        if self._next()[0] is None and not self.out:
            return False
        gpu = self.gpu
        t0 = gpu.record(gpu.d2h) if gpu.tracing else None
        self.owed = max(self.owed, 0) + RELIEF_BYTES
        while (self.owed > 0 and self._next()[0] is not None) or self.out:
            self.pump(force=True)
            if self.out:
                self.out[-1][1].synchronize()
            self.collect()
        self.owed = 0
        gpu.stats["throttled"] += 1
        if t0 is not None:       # the time the step stood still, on the d2h track
            gpu.trace_events.append(("throttle: waiting for swap-outs", "Throttle", t0,
                                     gpu.record(gpu.d2h), "d2h", "", gpu.stats["throttled"]))
        return True


class GpuStackStore(StackStore):
    """A stack of saved forward values whose entries may live in host memory."""

    __slots__ = ("gpu", "ref", "scan", "head", "held", "held_run", "__weakref__")

    def __init__(self, name: str, swap_memory: bool, gpu: GpuDevice) -> None:
        super().__init__(name, swap_memory)
        self.gpu = gpu
        self.ref = weakref.ref(self)     # how the swapper holds it
        self.scan = 0                    # the swapper's cursor: entries below stay
        self.head = None                 # (index, id, other entries) of the entry at the
        #                                  cursor found movable, while nothing popped
        self.held = False                # HELD_RUN entries in a row held elsewhere: its
        self.held_run = 0                # values are not looked at any more
        gpu.swapper.register(self)

    def push(self, value: Any) -> Any:
        self.gpu.swapper.push(self, value)
        return value

    def drop(self) -> None:
        """Let go of every entry, as the stack's own end would: a record whose copy is
        still running keeps its buffers until the copy is done (_Rec, the swapper's
        copies in flight)."""
        super().drop()
        self.scan, self.head, self.held, self.held_run = 0, None, False, 0

    def pop(self) -> Any:
        items = self.items
        if not items:
            raise OutOfRangeError(f"pop from empty stack '{self.name}'")
        v = items.pop()
        self.head = None
        sw = self.gpu.swapper
        if type(v) is _Rec:
            return sw.pop(v)
        if sw.host:              # values that stayed bring the swapped ones back ahead
            sw.passed()
        return v
