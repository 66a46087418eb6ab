"""GPU devices: the cupy side of dcf (paper sections 4.3 and 5.3).

One `GpuDevice` per visible GPU holds three cupy streams -- compute, host-to-device
(h2d) and device-to-host (d2h) -- a pooled pinned staging area, the memory budget and
the swapper of saved loop values (dcf/actors/gpu_swap.py). One `GpuActor` per "/gpu:K"
device of a session runs that device's partition with the same kernel bodies as the CPU
(xp = cupy): dcf/actors/gpu_actor.py.

Transfers: a host value arriving on a GPU (feed, Recv, constant) is staged in pinned
memory and copied on the h2d stream, and the compute stream waits on that copy's
event; a device value leaving for a CPU device or a fetch is copied on the d2h stream
into pinned memory, and the receiver gets it when the copy's event has completed (the
actor polls events from the event loop; nothing blocks it). A device value going to
another GPU of this process travels as (array, event) and is copied peer-to-peer on
the receiver's compute stream after that event (a large one on its h2d stream, into a
recycled landing buffer: `GpuDevice._land`). Values the host must look at inside a GPU
partition (a predicate computed from device data) are read with a blocking copy: that
is the one place this version blocks the event loop.

Events: `GpuDevice.record` re-records an event it made before once nothing else holds
it (making one costs the host more than recording it).

Memory: `SessionConfig(gpu_memory_limit=...)` sets the cupy pool's limit (the pool is
one per GPU and process: while steps of sessions with different settings overlap, the
strictest applies, `GpuDevice.begin_step`); a failed
allocation first moves saved values out and waits for their device buffers to be free
(throttling), then raises ResourceExhaustedError naming the op. Stacks of
`swap_memory=True` loops swap saved values to pinned host memory and back: see
dcf/actors/gpu_swap.py.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dcf import gpu_devices
from dcf.actors.gpu_swap import _Swapper
from dcf.errors import ResourceExhaustedError
from dcf.ops import concat_slots
from dcf.ops.gpu_kernels import launch_peer_rows, peer_rows_kernel
from dcf.ops.gpu_raw import c_contiguous, row_stride

__all__ = ["GpuDevice"]

LANDING_MIN_BYTES = 8 << 20   # peer copies this large land on the h2d stream (see _land)
LANDING_BUSY_BYTES = 512 << 10  # ... and from this size where the compute stream is busy
LANDING_KEEP = 4              # idle landing buffers kept per shape and dtype
PEER_KEEP_N = 8               # peer copies whose sources share one keep-alive event
PEER_KEEP_BYTES = 64 << 20    # ... or this many of their bytes
PINNED_STEP_MIN = 4 << 10     # pinned blocks come in sizes of at least this step
SWAP_BLOCKS_IDLE_MAX = 4 << 30  # idle pinned swap blocks kept per GPU at most (bytes)
# a column block of another GPU's matrix comes here by a raw kernel reading its memory
# (where peer access is on) instead of a strided copy between devices (False: the copy)
PEER_KERNEL = True
# ... and where it is the first part of a concatenation whose buffer is on offer, written
# into the buffer by that kernel (import_into_offer; False: a copy the concatenation copies)
PEER_INTO_CONCAT = True
EVENT_POOL = 256              # events kept per GPU for reuse by record() (0: a new one each)

_H2D, _D2H, _DEFAULT = 1, 2, 4    # cudaMemcpyKind (Default: by the pointers, unified addressing)
_ACTIVE: list = [None, None]  # the GpuDevice whose device and stream are current, and
_ident = threading.get_ident   # the thread it was made current in (cupy's state is per thread)


def _pool_refs() -> int:
    pool = collections.deque([object()])
    return sys.getrefcount(pool[0])


_IDLE_EVENT_REFS = _pool_refs()   # the references of an event only record()'s pool holds


# ------------------------------------------------------------------ the device
class GpuDevice:
    """Streams, memory and the transfer machinery of one GPU (one per process)."""

    H2D, D2H = _H2D, _D2H         # the kinds of copy_parts
    _instances: dict[int, GpuDevice] = {}

    @classmethod
    def get(cls, index: int) -> GpuDevice:
        d = cls._instances.get(index)
        if d is None:
            d = cls._instances[index] = cls(index)
        return d

    def __init__(self, index: int) -> None:
        cp = gpu_devices.backend()
        self.cp = cp
        self.ndarray = cp.ndarray
        self.index = index
        self.name = f"/gpu:{index}"
        self._device = cp.cuda.Device(index)
        rt = cp.cuda.runtime
        self._memcpy = rt.memcpyAsync
        self._memcpy_peer = rt.memcpyPeerAsync
        self._memcpy2d = getattr(rt, "memcpy2DAsync", None)   # (not in the test stand-in)
        with self._device:
            self.compute = cp.cuda.Stream(non_blocking=True)
            self.h2d = cp.cuda.Stream(non_blocking=True)
            self.d2h = cp.cuda.Stream(non_blocking=True)
            self.total_memory = int(self._device.mem_info[1])
        self.pool = cp.get_default_memory_pool()
        self.oom_error = cp.cuda.memory.OutOfMemoryError
        self.limit: int | None = None
        self.swap_threshold = 0.7
        # recording into the entered TraceScope's events (none entered: not recording)
        self.tracing = False
        self.trace_events: list = _NO_EVENTS
        # loop -> [(event, callback)] to run on that loop once the event is done, and
        # loop -> the task polling them: a device outlives event loops (each Session
        # drives its own), and a callback belongs to the loop that registered it
        self._watch: dict = {}
        self._pollers: dict = {}
        self._deferred: collections.deque = collections.deque()  # (event, keep-alive)
        self._events: collections.deque = collections.deque()   # for reuse (record)
        self._steps: collections.Counter = collections.Counter()  # the memory settings of
        #                                     the steps running here (begin_step), counted
        self.last_compute: Any = None         # the last event recorded on the compute
        self.compute_marks = 0                # stream, and how many were
        self.swapper = _Swapper(self)
        self._swap_blocks: dict = {}          # size -> [address] idle
        self._swap_idle_bytes = 0
        self._swap_mem: dict = {}             # address -> its pinned block (pinned_buffer)
        self.stats = collections.Counter()
        self._peers: set[int] = {index}       # devices whose memory copies here read
        self._peer_direct: set[int] = set()   # ... and whose memory kernels here may read
        self._fake = gpu_devices.is_fake()    # the test stand-in (no kernels of its own)
        self._peer_sources: list = []         # sources of peer copies, no event yet
        self._peer_held = 0
        # idle landing buffers of large peer copies: (shape, dtype) -> [(memory, event)];
        # None where cupy can't wrap memory with an owner (the test stand-in)
        self._landing: dict | None = {} if hasattr(cp.cuda, "UnownedMemory") else None
        # who else holds an array's device memory (memory_holders), counted against a
        # lone owner's and a lone view's counts
        self._holders = cp.holders if gpu_devices.is_fake() else _cupy_holders
        with self._device:
            a = cp.empty(256, np.float32)
            owner = self._holders(a)[0]
            v = a[128:]
            del a
            self._holders_base = (owner, self._holders(v)[0])   # a lone owner, a lone view
            del v

    # ------------------------------------------------------------ context
    def activate(self) -> None:
        """Make this device and its compute stream current (for this thread)."""
        self._device.use()
        self.compute.use()
        _ACTIVE[0] = self
        _ACTIVE[1] = _ident()

    def make_current(self) -> None:
        """activate() unless this device is current in this thread already. (The kernel
        wrapper of gpu_actor._kernel_fn, run for almost every op, makes the same test
        inline.)"""
        if _ACTIVE[0] is not self or _ACTIVE[1] != _ident():
            self.activate()

    def relieve(self, attempt: int) -> bool:
        """Make room after a failed allocation; False when nothing more can be done.
        0: drop the pool's cached blocks (the pool's limit counts them), garbage, and
        the sources of done copies from here to other GPUs, which those GPUs keep;
        then, each further attempt: move out the oldest saved values and wait for them
        (throttling), and once none is left, give back values brought in ahead of their
        pops, and then wait for the other GPUs' copies from here. Buffers freed so are
        dropped from the pool too: the limit counts cached blocks, and a freed block
        smaller than the request is no room."""
        if attempt == 0:
            gc.collect()
            self._peer_readers_let_go(wait=False)
            self.drop_landing()
            self.collect()
            self.pool.free_all_blocks()
            return True
        freed = self.swapper.make_room() or self.swapper.evict_prefetched() or \
            self._peer_readers_let_go(wait=True)
        if freed:
            self.collect()
            self.pool.free_all_blocks()
        return freed

    def _peer_readers_let_go(self, wait: bool) -> bool:
        """The other GPUs that copy from this one keep each copy's source alive until an
        event after it (_release_peer_sources), and let go of it when they collect: make
        them collect, after waiting for their work with `wait`. True where one let go of
        something."""
        freed = False
        for d in GpuDevice._instances.values():
            if d is self or self.index not in d._peers:
                continue
            before = len(d._peer_sources) + len(d._deferred)
            if not before:
                continue
            if wait:
                if d._peer_sources:
                    d._release_peer_sources()
                d._device.synchronize()
            d.collect()
            freed = freed or len(d._peer_sources) + len(d._deferred) < before
        self.make_current()
        return freed

    def begin_step(self, settings: tuple) -> bool:
        """A session's step starts on this GPU with its memory settings (limit,
        swap threshold). The pool is one per GPU and process, shared by every session:
        while steps of sessions with different settings overlap, the strictest of theirs
        applies -- the smallest limit and the smallest threshold -- so that no session runs
        over its own budget; a step alone runs under its own settings. True where that
        changed the settings (configure() has reset the swapper then)."""
        self._steps[settings] += 1
        try:
            return self._apply_settings()
        except BaseException:
            self._uncount(settings)     # not begun; the next step applies its own settings
            raise

    def end_step(self, settings: tuple) -> None:
        """A step begun with `settings` has ended: the steps still running get the
        strictest of their own settings back (a budget they overlapped with is lifted)."""
        self._uncount(settings)
        self._apply_settings()

    def running_steps(self) -> int:
        """How many steps are running on this GPU (begin_step to end_step)."""
        return sum(self._steps.values())

    def _uncount(self, settings: tuple) -> None:
        n = self._steps.get(settings, 0) - 1
        if n > 0:
            self._steps[settings] = n
        else:
            self._steps.pop(settings, None)

    def _apply_settings(self) -> bool:
        steps = self._steps
        if not steps:
            return False
        limits = [lim for lim, _ in steps if lim]
        want = (min(limits) if limits else None, min(thr for _, thr in steps))
        if (self.limit, self.swap_threshold) != want:
            self.configure(*want)
            return True
        return False

    def configure(self, limit: int | None, threshold: float) -> None:
        self.limit = int(limit) if limit else None
        self.swap_threshold = float(threshold)
        with self._device:
            self.pool.set_limit(size=self.limit or 0)
            if self.limit and self.pool.total_bytes() > self.limit:
                # cupy's pool serves requests from its cached blocks whatever its limit
                # (which bounds the bytes it holds): those of an earlier, larger budget
                # go, with the arrays of sessions that are garbage (collected now, not in
                # the middle of this budget's first step, where their blocks would serve
                # it past its limit)
                gc.collect()
                self.pool.free_all_blocks()
        self.swapper.reset()

    @property
    def capacity(self) -> int:
        return self.limit or self.total_memory

    def used_bytes(self) -> int:
        self.make_current()
        return int(self.pool.used_bytes())

    # ------------------------------------------------------------- events
    def record(self, stream: Any) -> Any:
        """An event recorded on `stream` now. Outside traces, one this device made before
        that nothing else holds any more, recorded again (waits already enqueued on it keep
        its earlier record; nobody can query it), else a new one, kept for reuse (up to
        EVENT_POOL): making and destroying an event per record cost the host more than the
        record itself (bench/NOTES.md, "GPU, session 15")."""
        if self.tracing:
            ev = self.cp.cuda.Event(disable_timing=False)
        else:
            pool = self._events
            ev = None
            if pool and EVENT_POOL:
                if sys.getrefcount(pool[0]) <= _IDLE_EVENT_REFS:
                    ev = pool[0]
                pool.rotate(-1)
            if ev is None:
                ev = self.cp.cuda.Event(disable_timing=True)
                if len(pool) < EVENT_POOL:
                    pool.append(ev)
        ev.record(stream)
        if stream is self.compute:     # (the swapper's copies may wait for it)
            self.last_compute = ev
            self.compute_marks += 1
        return ev

    def defer(self, event: Any, keep: Any) -> None:
        """Keep `keep` alive until `event` is done (a buffer a copy still uses)."""
        d = self._deferred
        d.append((event, keep))
        if len(d) > 64:               # copies finish in order per stream: trim the head
            while d and d[0][0].done:
                d.popleft()

    def collect(self) -> None:
        """Release what finished copies no longer need; run their callbacks."""
        if self._peer_sources:
            self._release_peer_sources()
        d = self._deferred
        while d and d[0][0].done:
            d.popleft()
        if self._watch:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:      # outside any loop: no callback of ours to run
                return
            watch = self._watch.get(loop)
            if watch:
                still = []
                for ev, cb in watch:  # (a callback may register more: seen here too)
                    if ev.done:
                        cb()
                    else:
                        still.append((ev, cb))
                if still:
                    self._watch[loop] = still
                else:
                    del self._watch[loop]

    def when_done(self, event: Any, callback: Callable[[], None]) -> None:
        """Call `callback()` from the running event loop once `event` has completed."""
        loop = asyncio.get_running_loop()
        for old in [lp for lp in self._pollers if lp.is_closed()]:
            # a loop that stopped with copies in flight: nobody waits for their callbacks
            del self._pollers[old]
            self._watch.pop(old, None)
        self._watch.setdefault(loop, []).append((event, callback))
        p = self._pollers.get(loop)
        if p is None or p.done():
            self._pollers[loop] = loop.create_task(self._poll(loop))

    async def _poll(self, loop: asyncio.AbstractEventLoop) -> None:
        # event polling from the loop: a launch_host_func callback would need a driver
        # thread to take the GIL; polling costs one query per pending copy per tick
        while self._watch.get(loop):
            try:
                self.collect()
            except Exception:     # a failing callback must not strand the others
                import traceback

                traceback.print_exc()
            if self._watch.get(loop):
                await asyncio.sleep(0)

    async def wait(self, event: Any) -> None:
        if event.done:
            return
        fut = asyncio.get_running_loop().create_future()
        self.when_done(event, lambda: fut.done() or fut.set_result(None))
        await fut

    # ---------------------------------------------------------- transfers
    def alloc(self, shape: tuple, dtype: Any, what: str) -> Any:
        """An uninitialised device array, making room if the budget is reached."""
        attempt = 0
        while True:
            try:
                return self.cp.empty(shape, dtype)
            except MemoryError as e:
                if not self.relieve(attempt):
                    raise ResourceExhaustedError(self._oom_text(what, e)) from None
                attempt += 1

    def memory_holders(self, arr: Any) -> tuple[int, int]:
        """(how many other arrays keep `arr`'s device memory alive, a key of that
        memory): 0 where dropping `arr` frees the memory. For an array that owns its
        memory, the views into it; for a view, the other views and whatever else holds
        the owner. Read off reference counts, so exact only where no temporary holds
        them -- for a saved value long after its push."""
        n, key, view = self._holders(arr)
        return n - self._holders_base[view], key

    def pinned_buffer(self, nbytes: int) -> tuple[Any, int]:
        """(owner, address) of `nbytes` of pinned host memory for swapped stack entries
        (no numpy view: only copies read and write it). The owner is a _GiveBack: when
        the last entry using it lets go, the block goes back to this device's idle
        blocks of its size (pinned_size), for the next swap-out of that size: a new
        block is a cudaHostAlloc of ~1.1-1.3 ms, which cupy's pinned pool made step after
        step for swap-out batches that varied in size (bench/NOTES.md, "GPU, session
        12").

        The blocks themselves are held here (`_swap_mem`), never by the owners: cupy's
        pooled pinned block frees itself from a Python `__del__`, and when entries die
        in cyclic garbage (a failed run's traceback) the collector runs every finalizer
        of the cycle, so a block the owner's finalizer put back among the idle ones was
        at the same moment freed to cupy's pool as well, and two swap-outs later wrote
        the same memory (bench/NOTES.md, "GPU, session 25")."""
        size = pinned_size(nbytes)
        idle = self._swap_blocks.get(size)
        if idle:
            ptr = idle.pop()
            self._swap_idle_bytes -= size
        else:
            mem = self.cp.cuda.alloc_pinned_memory(size)
            self.stats["pinned_allocs"] += 1
            ptr = getattr(mem, "ptr", None)
            if ptr is None:                  # the test stand-in's buffer
                mem = np.frombuffer(mem, np.uint8)
                ptr = mem.ctypes.data
            self._swap_mem[ptr] = mem
        return _GiveBack(self._swap_block_done, size, ptr), ptr

    def _swap_block_done(self, size: int, ptr: int) -> None:
        if self._swap_idle_bytes + size <= SWAP_BLOCKS_IDLE_MAX:
            self._swap_blocks.setdefault(size, []).append(ptr)
            self._swap_idle_bytes += size
        else:
            del self._swap_mem[ptr]          # back to cupy's pool

    def copy_parts(self, parts: list, stream: Any, what: str, kind: int) -> Any:
        """Copy `parts` [(dst, src, bytes)] on `stream` (cudaMemcpyKind `kind`) and
        return one event recorded after them all; traced as one slice named `what`
        ("swap out", "swap in"). (One kernel launch for a batch's parts was tried:
        bench/NOTES.md, "GPU, session 13".)"""
        t0 = self.record(stream) if self.tracing else None
        memcpy, sp = self._memcpy, stream.ptr
        for dst, src, n in parts:
            memcpy(dst, src, n, kind, sp)
        ev = self.record(stream)
        if t0 is not None:
            name = "MemcpyDtoH" if kind == _D2H else "MemcpyHtoD"
            track = "d2h" if kind == _D2H else "h2d"
            self.trace_events.append((what, name, t0, ev, track, "", self.stats["swap_batches"]))
        self.stats["swap_batches"] += 1
        return ev

    def pinned_empty(self, shape: tuple, dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        mem = self.cp.cuda.alloc_pinned_memory(pinned_size(n * dtype.itemsize))
        return np.frombuffer(mem, dtype, n).reshape(shape)

    def _copy_stream_after_compute(self, stream: Any) -> None:
        # a buffer just taken from the pool may still be read by earlier compute work
        # (the pool reuses blocks in compute-stream order): copies into it wait for that
        stream.wait_event(self.record(self.compute))

    def to_device(self, host: Any, what: str = "value", where: tuple = ("", -1)) -> Any:
        """Asynchronous host-to-device copy of a numpy array (pinned staging, h2d)."""
        self.make_current()
        host = np.asarray(host)
        dst = self.alloc(host.shape, host.dtype, what)
        n = host.nbytes
        if n == 0:
            return dst
        stage = self.pinned_empty(host.shape, host.dtype)
        np.copyto(stage, host)
        s = self.h2d
        self._copy_stream_after_compute(s)
        t0 = self.record(s) if self.tracing else None
        self._memcpy(dst.data.ptr, stage.ctypes.data, n, _H2D, s.ptr)
        ev = self.record(s)
        self.compute.wait_event(ev)
        self.defer(ev, stage)
        self.stats["h2d_bytes"] += n
        if t0 is not None:
            self.trace_events.append((f"H2D {what}", "MemcpyHtoD", t0, ev, "h2d") + where)
        return dst

    def to_host_async(self, arr: Any, what: str = "value",
                      where: tuple = ("", -1)) -> tuple[np.ndarray, Any]:
        """Start a device-to-host copy into pinned memory; returns (host array, event)."""
        self.make_current()
        shape = arr.shape
        if not arr.flags.c_contiguous:    # compacted first, making room for it if need be
            c = self.alloc(shape, arr.dtype, f"a compact copy of {what}")
            c[...] = arr
            arr = c
        host = self.pinned_empty(shape, arr.dtype)
        s = self.d2h
        s.wait_event(self.record(self.compute))
        t0 = self.record(s) if self.tracing else None
        if arr.nbytes:
            self._memcpy(host.ctypes.data, arr.data.ptr, arr.nbytes, _D2H, s.ptr)
        ev = self.record(s)
        # the source, and the pinned buffer the copy writes: a caller may drop it before
        # the copy is done (a run that failed), and cupy's pinned pool would hand it out
        # again while the copy still writes it
        self.defer(ev, (arr, host))
        self.stats["d2h_bytes"] += arr.nbytes
        if t0 is not None:
            self.trace_events.append((f"D2H {what}", "MemcpyDtoH", t0, ev, "d2h") + where)
        return host, ev

    def from_peer(self, gv: _PeerValue, what: str = "value", where: tuple = ("", -1)) -> Any:
        """Copy a value of another GPU of this process here, on this GPU's compute stream
        once the producer's event is done. The destination comes from the pool in
        compute-stream order, so no earlier kernel can still be reading it and its
        consumers need no event of their own (a copy stream would have to wait for the
        compute stream first and make it wait in turn: two more events, no overlap). The
        source buffer stays alive until an event after the copy is done: one event per
        PEER_KEEP_N copies or PEER_KEEP_BYTES, and at the end of the step.

        A copy of LANDING_MIN_BYTES or more, or of LANDING_BUSY_BYTES or more while the
        compute stream still has work queued (the GPU is behind the host), lands on the
        h2d stream instead (`_land`): it then runs beside that work rather than after
        it, for two more events of host time -- which an idle GPU, waiting for the host,
        would only wait for longer."""
        self.make_current()
        src = gv.array
        if not self._peer_copyable(src):
            raise ValueError(f"peer copy of a non-contiguous array ({what})")
        if gv.device not in self._peers:
            self._enable_peer(gv.device)
        n = src.nbytes
        seed = False
        if self._landing is not None and n >= LANDING_BUSY_BYTES:
            if n >= LANDING_MIN_BYTES:
                return self._land(gv, what, where)
            if not self.compute.done:
                if self._landing.get((src.shape, src.dtype.str)):
                    return self._land(gv, what, where)
                # none idle: a new buffer's copy would wait for the compute stream as it
                # is (no overlap), so it runs there, into a buffer that then comes back
                # as a landing buffer for the copies after it
                seed = True
        dst = self.alloc(src.shape, src.dtype, what)
        self._copy_after(gv, n, what, where, lambda: self._copy_peer(
            dst.data.ptr, src, gv.device, n, self.compute.ptr, on_compute=True))
        if seed:
            self.stats["landing_seeded"] += 1
            return self._landing_array(src, dst.data)
        return dst

    def _copy_after(self, gv: _PeerValue, n: int, what: str, where: tuple,
                    copy: Callable[[], None]) -> None:
        """`copy()` enqueues the copy of gv's array (n bytes; nothing where 0) on this
        GPU's compute stream, current: run it once gv's event is done (one P2P slice in
        a trace), and keep gv's array alive until the copy is done."""
        s = self.compute
        s.wait_event(gv.event)
        t0 = self.record(s) if self.tracing else None
        if n:
            copy()
        if t0 is not None:
            self.trace_events.append((f"P2P {what}", "MemcpyPtoP", t0, self.record(s),
                                      "compute") + where)
        held = self._peer_sources
        held.append(gv)
        self._peer_held += n
        if len(held) >= PEER_KEEP_N or self._peer_held >= PEER_KEEP_BYTES:
            self._release_peer_sources()
        self.stats["peer_bytes"] += n

    def import_into_offer(self, v: Any, concat: int, what: str = "value") -> Any:
        """`v`, another GPU's array, as the first part of the concatenation keyed
        `concat` (dcf/ops/concat_slots.py) here: where the concatenation's buffer is on
        offer with its first columns free and shaped for v, v is copied into them (one
        kernel reading the peer's memory on the compute stream, after v's event) and
        the view of those columns comes back, filling the offer -- the concatenation
        then copies nothing. Otherwise `import_value`'s copy."""
        o = concat_slots.open_offer(concat)
        if o is None or o.filled is not None or not (PEER_KERNEL and PEER_INTO_CONCAT) or \
                type(v) is not self.ndarray:
            return self.import_value(v, what)
        buf, lead = o.buf, o.lead
        dev = v.data.device_id
        if dev == self.index or v.ndim != 2 or v.shape != (buf.shape[0], lead) or \
                v.dtype != buf.dtype or row_stride(v) is None or not v.size or \
                buf.data.device_id != self.index:
            return self.import_value(v, what)
        if dev not in self._peers:
            self._enable_peer(dev)
        if self._fake:                    # the test stand-in: its arrays copy by assignment
            k = None
        else:
            k = peer_rows_kernel(self.cp, v, buf.shape[1])
            if k is None or dev not in self._peer_direct:
                return self.import_value(v, what)
        gv = _PeerValue(v, self._record_on(dev), dev)
        self.make_current()
        x = buf[:, :lead]

        def copy() -> None:
            if k is None:
                x[...] = v
            else:
                launch_peer_rows(k, buf.data.ptr, v)
        self._copy_after(gv, v.nbytes, what, ("", -1), copy)
        self.stats["peer_into_concat"] += 1
        o.filled = x
        return x

    def _land(self, gv: _PeerValue, what: str, where: tuple) -> Any:
        """A large peer copy, on the h2d stream into a landing buffer, so that it runs
        while this GPU still computes earlier iterations. A buffer comes back (to a short
        idle list per shape and dtype) when the array copied into it and every view of
        it are gone, with an event recorded on the compute stream at that moment: its
        readers were all enqueued before, so the next copy into it waits for that event
        only, not for everything enqueued since. A new buffer waits for the compute
        stream as it is (the pool may have handed out a block earlier kernels read)."""
        src = gv.array
        n = src.nbytes
        key = (src.shape, src.dtype.str)
        idle = self._landing.get(key)
        s = self.h2d
        if idle:
            mem, free_ev = idle.pop()
            s.wait_event(free_ev)
            self.stats["landing_reused"] += 1
        else:
            mem = self.alloc(src.shape, src.dtype, what).data
            self._copy_stream_after_compute(s)
        dst = self._landing_array(src, mem)
        s.wait_event(gv.event)
        t0 = self.record(s) if self.tracing else None
        self._copy_peer(mem.ptr, src, gv.device, n, s.ptr)
        ev = self.record(s)
        self.compute.wait_event(ev)
        self.defer(ev, gv)          # the source stays alive until the copy is done
        self.stats["peer_bytes"] += n
        if t0 is not None:
            self.trace_events.append((f"P2P {what}", "MemcpyPtoP", t0, ev, "h2d") + where)
        return dst

    def _landing_array(self, src: Any, mem: Any) -> Any:
        """An array shaped as `src` over the landing buffer `mem`, which comes back to
        the idle list (`_landed`) once it and its views are gone."""
        cp = self.cp
        owner = _GiveBack(self._landed, (src.shape, src.dtype.str), mem)
        return cp.ndarray(src.shape, src.dtype, cp.cuda.MemoryPointer(
            cp.cuda.UnownedMemory(mem.ptr, src.nbytes, owner, self.index), 0))

    def _peer_copyable(self, src: Any) -> bool:
        """C-contiguous, or (with strided copies) a column block of a wider matrix."""
        return c_contiguous(src) or (self._memcpy2d is not None and row_stride(src) is not None)

    def _copy_peer(self, dst: int, src: Any, dev: int, n: int, stream: int,
                   on_compute: bool = False) -> None:
        """n bytes of GPU `dev`'s array `src` into this GPU's contiguous memory at `dst`:
        a peer copy; for a column block (rows apart, see `_peer_copyable`) one raw
        kernel reading `dev`'s memory where it may (`on_compute`: `stream` is the
        compute stream, current; peer access on; PEER_KERNEL), else one strided copy
        between the devices' unified addresses."""
        if c_contiguous(src):
            self._memcpy_peer(dst, self.index, src.data.ptr, dev, n, stream)
            return
        if on_compute and PEER_KERNEL and dev in self._peer_direct:
            k = peer_rows_kernel(self.cp, src)
            if k is not None:
                self.make_current()
                launch_peer_rows(k, dst, src)
                return
        rows, w = src.shape[0], src.shape[1] * src.itemsize
        self._memcpy2d(dst, w, src.data.ptr, row_stride(src) * src.itemsize, w, rows,
                       _DEFAULT, stream)

    def _landed(self, key: tuple, mem: Any) -> None:
        """A landing buffer's array is gone: keep the buffer for the next copy."""
        idle = self._landing
        if idle is None:
            return
        lst = idle.setdefault(key, [])
        if len(lst) >= LANDING_KEEP:
            return                      # back to the pool
        with self._device:              # (an array may die with another device current)
            ev = self.record(self.compute)
        lst.append((mem, ev))

    def drop_landing(self) -> None:
        """Give the idle landing buffers and the concatenation buffers still on offer
        (dcf/ops/concat_slots.py) back to the pool (end of a step, or no room)."""
        if self._landing:
            self._landing.clear()
        concat_slots.clear(self.index)

    def _release_peer_sources(self) -> None:
        """Keep the sources of the peer copies issued so far alive until they are done."""
        self.make_current()
        self.defer(self.record(self.compute), self._peer_sources)
        self._peer_sources = []
        self._peer_held = 0

    def _enable_peer(self, other: int) -> None:
        """Let this GPU's copies read `other`'s memory directly (NVLink/PCIe peer
        access); without it a peer copy is staged through host memory."""
        rt = self.cp.cuda.runtime
        self._peers.add(other)
        can = getattr(rt, "deviceCanAccessPeer", None)
        if can is None or not can(self.index, other):
            return
        try:
            with self._device:
                rt.deviceEnablePeerAccess(other)
        except Exception as e:   # already enabled (by this process or a library)
            if "AlreadyEnabled" not in type(e).__name__ + str(e):
                raise
        self._peer_direct.add(other)

    def import_value(self, v: Any, what: str = "value", where: tuple = ("", -1)) -> Any:
        """A value arriving on this GPU (feed or Recv), in the form kernels here take."""
        t = type(v)
        if t is np.ndarray:
            if v.ndim and v.dtype.kind in "fc":
                return self.to_device(v, what, where)
            return v
        if t is self.ndarray:
            dev = v.data.device_id
            if dev == self.index:
                return v
            if not self._peer_copyable(v):
                with self.cp.cuda.Device(dev):
                    v = self.cp.ascontiguousarray(v).reshape(v.shape)
            return self.from_peer(_PeerValue(v, self._record_on(dev), dev), what, where)
        if t is _PeerValue:
            if v.device == self.index:
                self.make_current()
                self.compute.wait_event(v.event)
                return v.array
            return self.from_peer(v, what, where)
        return v

    def _record_on(self, dev: int) -> Any:
        other = GpuDevice.get(dev)
        other.make_current()
        return other.record(other.compute)

    def upload(self, out: Any, what: str) -> Any:
        """Float arrays a host-run kernel produced go to the device (the same object
        comes back when nothing moved)."""
        t = type(out)
        if t is np.ndarray:
            return self.to_device(out, what) if out.ndim and out.dtype.kind in "fc" else out
        if t is tuple:
            for o in out:
                if type(o) is tuple or (type(o) is np.ndarray and o.ndim and
                                        o.dtype.kind in "fc"):
                    up = tuple(self.upload(o, what) for o in out)
                    return out if all(a is b for a, b in zip(up, out)) else up
        return out

    def _oom_text(self, what: str, e: BaseException) -> str:
        lim = f"gpu_memory_limit={self.limit:,} bytes" if self.limit else \
            f"device memory {self.total_memory:,} bytes"
        return (f"out of memory on {self.name} ({lim}, {self.pool.used_bytes():,} bytes in "
                f"use) computing {what}: {e}")

    @contextlib.contextmanager
    def peak_tracker(self) -> Any:
        """`with gpu.peak_tracker() as t:` ... `t.peak`: the high-water mark of live
        pool bytes on this device inside the block (cupy memory hooks: slow, for
        calibration and tests). The pool's total_bytes() counts cached blocks too."""
        t = _PeakTracker(self)
        if getattr(self.cp, "is_fake", False):
            self.pool.free_all_blocks()
            yield t
            t.peak = int(self.pool.total_bytes())
            return
        from cupy.cuda import memory_hook

        where = self.cp.cuda.runtime.pointerGetAttributes

        class Hook(memory_hook.MemoryHook):
            # A block's device comes from its pointer, not from the hook's device_id:
            # cupy 14 makes every device's pool at the first allocation in the process,
            # each with the id of the device then current, so with several GPUs the
            # hooks name one device for all of them (bench/NOTES.md, "GPU, session 23")
            name = "dcf_peak"

            def malloc_postprocess(self, **kw: Any) -> None:
                ptr = kw.get("mem_ptr")
                if ptr and where(ptr).device == t.gpu.index:
                    t.cur += kw["mem_size"]
                    t.peak = max(t.peak, t.cur)

            def free_postprocess(self, **kw: Any) -> None:
                ptr = kw.get("mem_ptr")     # (a pool's block: still mapped when it is freed)
                if ptr and where(ptr).device == t.gpu.index:
                    t.cur -= kw["mem_size"]

        t.cur = t.peak = self.used_bytes()
        with Hook():
            yield t

    # --------------------------------------------------------------- trace
    def trace_scope(self, traced: bool) -> TraceScope:
        """Where the device events of one step go (see TraceScope)."""
        return TraceScope(self, traced)

    def begin_trace(self) -> TraceScope:
        """A traced scope, entered until end_trace(scope): what this device records
        meanwhile, whatever step it is for (tests, probes)."""
        scope = TraceScope(self, True)
        scope.__enter__()
        return scope

    def end_trace(self, scope: TraceScope) -> list:
        scope.__exit__(None, None, None)
        return scope.timed_events()


_NO_EVENTS: list = []          # the events list of an untraced scope (never appended to)


class TraceScope:
    """The device events of one step on one GPU. The device records its kernels' and
    copies' events (GpuDevice.tracing, trace_events) into the scope that is entered:
    the step's actor enters its scope while the step's own code runs on the device (its
    pumps, its feeds and fetches, the transfers of its rendezvous) and leaves it before
    it awaits, so concurrent runs of one session keep their own events, and a run that
    is not traced (a scope without events) records none while a traced one is in flight.
    `with scope:` enters it (again inside itself too: a Recv delivered within its own
    pump)."""

    __slots__ = ("gpu", "events", "ref", "_outers")

    def __init__(self, gpu: GpuDevice, traced: bool) -> None:
        self.gpu = gpu
        self.events: list | None = [] if traced else None
        self.ref: tuple | None = None
        self._outers: list = []         # what each `with` restores, innermost last
        if traced:
            gpu.make_current()
            ref = gpu.cp.cuda.Event()
            ref.record(gpu.compute)
            ref.synchronize()
            self.ref = (ref, time.perf_counter())

    def __enter__(self) -> TraceScope:
        """Record into this scope from now until the matching exit."""
        g = self.gpu
        self._outers.append((g.tracing, g.trace_events))
        ev = self.events
        if ev is None:
            g.tracing, g.trace_events = False, _NO_EVENTS
        else:
            g.tracing, g.trace_events = True, ev
        return self

    def __exit__(self, *exc: Any) -> None:
        self.gpu.tracing, self.gpu.trace_events = self._outers.pop()

    def timed_events(self) -> list:
        """Device-timed events (name, type, frame, iteration, t0, t1, track, t_host)
        of this step: kernels on the compute stream (t_host: when the host enqueued
        them), copies on the h2d and d2h streams."""
        if self.ref is None:
            return []
        gpu = self.gpu
        ref, t_ref = self.ref
        self.ref = None
        with gpu._device:
            gpu.cp.cuda.runtime.deviceSynchronize()
        el = gpu.cp.cuda.get_elapsed_time
        out = []
        for ev in self.events or ():
            name, typ, e0, e1, track, frame, it = ev[:7]
            out.append((name, typ, frame, it, t_ref + el(ref, e0) / 1e3,
                        t_ref + el(ref, e1) / 1e3, track, ev[7] if len(ev) > 7 else None))
        self.events = []
        return out


def merge_trace(host_events: list, dev_events: list) -> list:
    """One event per op execution: a kernel the GPU ran gets its device times on the
    "compute" track; ops that ran on the host (control flow, host-memory integers) stay
    on the "host" track; copies are on "h2d" and "d2h"."""
    out = [e + ("host",) if len(e) == 6 else e for e in host_events]
    by_name: dict[str, list] = {}
    for k, e in enumerate(out):
        by_name.setdefault(e[0], []).append(k)
    pos: dict[str, int] = {}
    extra = []
    for name, typ, frame, it, t0, t1, track, th in dev_events:
        if track == "compute" and th is not None:
            ks = by_name.get(name, ())
            j = pos.get(name, 0)
            while j < len(ks) and out[ks[j]][5] < th:
                j += 1
            if j < len(ks) and out[ks[j]][4] <= th:
                h = out[ks[j]]
                out[ks[j]] = (h[0], h[1], h[2], h[3], t0, t1, "compute")
                pos[name] = j + 1
                continue
        extra.append((name, typ, frame or "", -1 if it is None else it, t0, t1, track))
    return out + extra


def _cupy_holders(arr: Any) -> tuple[int, int, int]:
    # (a count, the id of the array owning the memory, whether arr is a view), counted
    # against a lone owner's and a lone view's counts (GpuDevice.__init__) so that the
    # interpreter's temporaries cancel out. An owner: the views into it -- each holds a
    # MemoryPointer to its memory (its own, or the owner's at offset 0) -- not the
    # references to the array itself (the executor's, while it is young). A view: the
    # references to its owner, which each view holds as its `base`.
    o = arr.base
    if o is None:
        d = arr.data
        return sys.getrefcount(d) + sys.getrefcount(d.mem), id(arr), 0
    return sys.getrefcount(o), id(o), 1


class _PeakTracker:
    def __init__(self, gpu: GpuDevice) -> None:
        self.gpu = gpu
        self.cur = 0
        self.peak = 0


class _GiveBack:
    """Owns a buffer while an array (a landing buffer's, and its views) or swapped stack
    entries use it; when they are gone, calls `give_back(*args)` -- the GPU's way of
    keeping the buffer for the next copy of its kind."""

    __slots__ = ("give_back", "args")

    def __init__(self, give_back: Callable[..., None], *args: Any) -> None:
        self.give_back, self.args = give_back, args

    def __del__(self) -> None:
        try:
            self.give_back(*self.args)
        except Exception:   # noqa: BLE001 - interpreter shutdown, device gone: the pool frees it
            pass


@dataclass(eq=False, slots=True)
class _PeerValue:
    """A device array on its way to another GPU: the array and its ready event."""

    array: Any
    event: Any
    device: int

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # a remote transport needs bytes: a blocking copy (only outside one process)
        self.event.synchronize()
        a = self.array.get()
        return a if dtype is None else a.astype(dtype)


def pinned_size(nbytes: int) -> int:
    """The size of the pinned block that holds `nbytes`: rounded up to one of four
    sizes per power of two (at most 25 % more, in steps of at least 4 KiB), so that
    blocks freed by one step's swap-outs (or staging copies) fit the next step's
    requests, which vary a little in size, and are reused instead of allocated anew (a
    cudaHostAlloc of 16 MB costs the host ~1.1-1.3 ms; bench/NOTES.md, "GPU, session 12")."""
    n = max(int(nbytes), 1)
    step = max(PINNED_STEP_MIN, 1 << max(n.bit_length() - 3, 0))
    return -(-n // step) * step
