"""GPU devices: the cupy side of dcf (paper sections 4.3 and 5.3).

One `GpuDevice` per visible GPU holds three cupy streams -- compute, host-to-device
(h2d) and device-to-host (d2h) -- a pooled pinned staging area, the memory budget and
the swapper of saved loop values. One `GpuActor` per "/gpu:K" device of a session runs
that device's partition with the same kernel bodies as the CPU (xp = cupy).

Where values live on a GPU actor:
- float arrays live on the device; host integer/bool values and 0-d scalars stay on
  the host (as TF keeps int32 "host memory" tensors), so a loop counter and its
  predicate never make the host wait for the GPU;
- a kernel runs with cupy when any input is a device array, else with numpy on the
  host, and float array results of a host run go to the device (an op that is pure
  runs with cupy from then on);
- a kernel is "done" for the executor when it is enqueued on the compute stream.

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
`swap_memory=True` loops swap values (>= 64 KiB, each buffer once) to pinned host
memory on the d2h stream once pool use passes `swap_threshold` of the limit: the loop
ticks the GPU's swapper every few iterations, which moves out the bytes over the
threshold as the oldest saved values still on the device (the backward pass wants them
last), unless moving them would free nothing (held elsewhere, or memory other arrays
hold); the backward loop's ticks and pops bring swapped entries back on the h2d stream
ahead of use (stack order is known), and a value still on the device is popped as is.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dcf import gpu_devices
from dcf.actors.device_actor import DeviceActor
from dcf.device import DeviceSpec
from dcf.errors import OutOfRangeError, ResourceExhaustedError
from dcf.ops import concat_slots
from dcf.ops.data_ops import StackStore
from dcf.ops.gpu_raw import c_contiguous, row_stride
from dcf.ops.registry import OPS, Kind
from dcf.resources import DeviceResources
from dcf.token import DEAD

__all__ = ["GpuDevice", "GpuActor", "GpuResources", "GpuStackStore", "make_gpu_actor"]

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
LANDING_MIN_BYTES = 8 << 20   # peer copies this large land on the h2d stream (see _land)
LANDING_KEEP = 4              # idle landing buffers kept per shape and dtype
PEER_KEEP_N = 8               # peer copies whose sources share one keep-alive event
PEER_KEEP_BYTES = 64 << 20    # ... or this many of their bytes
RELIEF_BYTES = 256 << 20      # what one throttling step moves out beyond what is owed
USAGE_EVERY = 16              # swapper decisions re-read pool use this often
PINNED_STEP_MIN = 4 << 10     # pinned blocks come in sizes of at least this step
SWAP_BLOCKS_IDLE_MAX = 4 << 30  # idle pinned swap blocks kept per GPU at most (bytes)
KEEP_SHARED = True            # saved values whose memory other arrays hold are not moved
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
        self.tracing = False
        self.trace_events: list = []
        self._trace_ref: tuple | None = None
        self._watch: list = []            # [(event, callback)] run when the event is done
        self._deferred: collections.deque = collections.deque()  # (event, keep-alive)
        self._poller: asyncio.Task | None = None
        self._events: collections.deque = collections.deque()   # for reuse (record)
        self._steps: collections.Counter = collections.Counter()  # the memory settings of
        #                                     the steps running here (begin_step), counted
        self.last_compute: Any = None         # the last event recorded on the compute
        self.compute_marks = 0                # stream, and how many were
        self.swapper = _Swapper(self)
        self._swap_blocks: dict = {}          # size -> [(pinned memory, address)] idle
        self._swap_idle_bytes = 0
        self.stats = collections.Counter()
        self._peers: set[int] = {index}       # devices whose memory copies here read
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
        wrapper of _kernel_fn, run for almost every op, makes the same test inline.)"""
        if _ACTIVE[0] is not self or _ACTIVE[1] != _ident():
            self.activate()

    def relieve(self, attempt: int) -> bool:
        """Make room after a failed allocation; False when nothing more can be done.
        0: drop the pool's cached blocks (the pool's limit counts them) and garbage;
        then, each further attempt: move out the oldest saved values and wait for them
        (throttling), and once none is left, give back values brought in ahead of their
        pops. Buffers freed so are dropped from the pool too: the limit counts cached
        blocks, and a freed block smaller than the request is no room."""
        if attempt == 0:
            gc.collect()
            self.drop_landing()
            self.collect()
            self.pool.free_all_blocks()
            return True
        freed = self.swapper.make_room() or self.swapper.evict_prefetched()
        if freed:
            self.collect()
            self.pool.free_all_blocks()
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
            still = []
            for ev, cb in self._watch:
                if ev.done:
                    cb()
                else:
                    still.append((ev, cb))
            self._watch = still

    def when_done(self, event: Any, callback: Callable[[], None]) -> None:
        """Call `callback()` from the event loop once `event` has completed."""
        self._watch.append((event, callback))
        p = self._poller
        if p is None or p.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        # event polling from the loop: a launch_host_func callback would need a driver
        # thread to take the GIL; polling costs one query per pending copy per tick
        while self._watch:
            try:
                self.collect()
            except Exception:     # a failing callback must not strand the others
                import traceback

                traceback.print_exc()
            if self._watch:
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
        12")."""
        size = pinned_size(nbytes)
        idle = self._swap_blocks.get(size)
        if idle:
            mem, ptr = idle.pop()
            self._swap_idle_bytes -= size
        else:
            mem = self.cp.cuda.alloc_pinned_memory(size)
            self.stats["pinned_allocs"] += 1
            ptr = getattr(mem, "ptr", None)
            if ptr is None:                  # the test stand-in's buffer
                mem = np.frombuffer(mem, np.uint8)
                ptr = mem.ctypes.data
        return _GiveBack(self._swap_block_done, size, mem, ptr), ptr

    def _swap_block_done(self, size: int, mem: Any, ptr: int) -> None:
        if self._swap_idle_bytes + size <= SWAP_BLOCKS_IDLE_MAX:
            self._swap_blocks.setdefault(size, []).append((mem, ptr))
            self._swap_idle_bytes += size

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
        if not arr.flags.c_contiguous:
            arr = self.cp.ascontiguousarray(arr)   # (it makes 0-d arrays 1-d: keep shape)
        host = self.pinned_empty(shape, arr.dtype)
        s = self.d2h
        s.wait_event(self.record(self.compute))
        t0 = self.record(s) if self.tracing else None
        if arr.nbytes:
            self._memcpy(host.ctypes.data, arr.data.ptr, arr.nbytes, _D2H, s.ptr)
        ev = self.record(s)
        self.defer(ev, arr)
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
        PEER_KEEP_N copies or PEER_KEEP_BYTES, and at the end of the step."""
        self.make_current()
        src = gv.array
        if not self._peer_copyable(src):
            raise ValueError(f"peer copy of a non-contiguous array ({what})")
        if gv.device not in self._peers:
            self._enable_peer(gv.device)
        n = src.nbytes
        if n >= LANDING_MIN_BYTES and self._landing is not None:
            return self._land(gv, what, where)
        dst = self.alloc(src.shape, src.dtype, what)
        s = self.compute
        s.wait_event(gv.event)
        t0 = self.record(s) if self.tracing else None
        if n:
            self._copy_peer(dst.data.ptr, src, gv.device, n, s.ptr)
        if t0 is not None:
            self.trace_events.append((f"P2P {what}", "MemcpyPtoP", t0, self.record(s),
                                      "compute") + where)
        held = self._peer_sources
        held.append(gv)
        self._peer_held += n
        if len(held) >= PEER_KEEP_N or self._peer_held >= PEER_KEEP_BYTES:
            self._release_peer_sources()
        self.stats["peer_bytes"] += n
        return dst

    def _land(self, gv: _PeerValue, what: str, where: tuple) -> Any:
        """A large peer copy, on the h2d stream into a landing buffer, so that it runs
        while this GPU still computes earlier iterations. A buffer comes back (to a short
        idle list per shape and dtype) when the array copied into it and every view of
        it are gone, with an event recorded on the compute stream at that moment: its
        readers were all enqueued before, so the next copy into it waits for that event
        only, not for everything enqueued since. A new buffer waits for the compute
        stream as it is (the pool may have handed out a block earlier kernels read)."""
        cp = self.cp
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
        owner = _GiveBack(self._landed, key, mem)
        dst = cp.ndarray(src.shape, src.dtype, cp.cuda.MemoryPointer(
            cp.cuda.UnownedMemory(mem.ptr, n, owner, self.index), 0))
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

    def _peer_copyable(self, src: Any) -> bool:
        """C-contiguous, or (with strided copies) a column block of a wider matrix."""
        return c_contiguous(src) or (self._memcpy2d is not None and row_stride(src) is not None)

    def _copy_peer(self, dst: int, src: Any, dev: int, n: int, stream: int) -> None:
        """n bytes of GPU `dev`'s array `src` into this GPU's contiguous memory at `dst`:
        a peer copy; for a column block (rows apart, see `_peer_copyable`) one strided
        copy between the devices' unified addresses."""
        if c_contiguous(src):
            self._memcpy_peer(dst, self.index, src.data.ptr, dev, n, stream)
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

        class Hook(memory_hook.MemoryHook):
            name = "dcf_peak"

            def malloc_postprocess(self, **kw: Any) -> None:
                if kw.get("device_id") == t.gpu.index and kw.get("mem_ptr"):
                    t.cur += kw["mem_size"]
                    t.peak = max(t.peak, t.cur)

            def free_postprocess(self, **kw: Any) -> None:
                if kw.get("device_id") == t.gpu.index:
                    t.cur -= kw["mem_size"]

        t.cur = t.peak = self.used_bytes()
        with Hook():
            yield t

    # --------------------------------------------------------------- trace
    def begin_trace(self) -> None:
        self.tracing = True
        self.trace_events = []
        self.make_current()
        ref = self.cp.cuda.Event()
        ref.record(self.compute)
        ref.synchronize()
        self._trace_ref = (ref, time.perf_counter())

    def end_trace(self) -> list:
        """Device-timed events (name, type, frame, iteration, t0, t1, track, t_host)
        of this step: kernels on the compute stream (t_host: when the host enqueued
        them), copies on the h2d and d2h streams."""
        self.tracing = False
        if self._trace_ref is None:
            return []
        ref, t_ref = self._trace_ref
        self._trace_ref = None
        with self._device:
            self.cp.cuda.runtime.deviceSynchronize()
        el = self.cp.cuda.get_elapsed_time
        out = []
        for ev in self.trace_events:
            name, typ, e0, e1, track, frame, it = ev[:7]
            out.append((name, typ, frame, it, t_ref + el(ref, e0) / 1e3,
                        t_ref + el(ref, e1) / 1e3, track, ev[7] if len(ev) > 7 else None))
        self.trace_events = []
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


# ----------------------------------------------------------------- swapping
class _Rec:
    """One saved value moved off the device (shared by the stack entries that hold the
    same array), made when its swap-out starts."""

    __slots__ = ("dev", "host", "host_ptr", "ev_in", "state", "refs", "shape", "dtype",
                 "nbytes", "ahead", "__weakref__")

    OUT, HOST, IN, GONE = range(4)      # OUT: its copy to the host is running

    def __init__(self, value: Any) -> None:
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

    def tick(self, pushing: bool) -> None:
        """Finish copies that are done; then, in a loop that pushes, owe the bytes pool
        use is over the threshold (less those already on their way out) and start paying
        them; in one that pops, bring swapped entries back ahead of their pops."""
        if self.out:
            self.collect()
        if pushing:
            if self.stacks:
                used = self._used = self.gpu.used_bytes()
                self._countdown = USAGE_EVERY
                over = used - self._limit - self.out_bytes
                self.owed = over if over > 0 else 0
                if over > 0:
                    self.pump()
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
                dups = self._dups(st, i, v)
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

    def _dups(self, st: Any, i: int, v: Any) -> tuple:
        """The other stack entries holding array v (pushed again: next to index i in
        another stack, or in this one)."""
        found = []
        for ref in self.stacks:
            s2 = ref()
            if s2 is None:
                continue
            items = s2.items
            for j in (i - 1, i, i + 1):
                if 0 <= j < len(items) and items[j] is v and (s2 is not st or j != i):
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
        rec = _Rec(v)
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
            ev = gpu.copy_parts(parts, s, "swap out", _D2H)
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
                                       "swap in", _H2D)
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
                                "swap in", _H2D)
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


# ------------------------------------------------------------- kernel binding
@dataclass
class GpuResources(DeviceResources):
    """Resources of a GPU actor; binds each kernel to run on its GPU (plan.py calls
    `bind_kernel` for every kernel node of this device's partitions)."""

    gpu: Any = None

    def bind_kernel(self, p: Any, kw: dict) -> Any:
        return _bind(self.gpu, p, kw)


_FALLBACK = (TypeError, NotImplementedError, AttributeError)
# Ops whose outputs are shapes: host memory, whatever their input (TF's HostMemory), so
# loop bounds and predicates built from them never wait for the GPU.
_HOST_OPS = frozenset({"Shape", "Size", "Rank", "ShapeN", "BroadcastGradientArgs",
                       "ReducedShape", "TensorArraySizeV3"})
# Ops that may create arrays from nothing (a TensorArray's unwritten gradient element
# reads as zeros): run with cupy so those zeros are made on the device.
_DEVICE_OPS = frozenset({"TensorArrayReadV3", "TensorArrayGatherV3", "TensorArrayStack",
                         "TensorArrayConcatV3"})
# TensorArray bookkeeping: host objects in, host objects out, no device work (a write
# stores the value it is given, wherever it lives): the kernel itself, no wrapper
_TENSOR_ARRAY_HOST_OPS = frozenset({"TensorArrayV3", "TensorArrayGradV3",
                                    "TensorArrayWriteV3"})


def _bind(gpu: GpuDevice, p: Any, kw: dict) -> Any:
    t = p.type
    if t == "Const":
        return _bind_const(gpu, kw["value"], p.name)
    if t == "StackV2":
        def stack_v2(*, stack_name: str, swap_memory: bool, **_: Any) -> Any:
            return GpuStackStore(stack_name, swap_memory, gpu) if swap_memory else \
                StackStore(stack_name, swap_memory)
        return functools.partial(stack_v2, **kw)
    if t == "StackPushV2":
        def stack_push(handle: Any, value: Any) -> Any:
            return handle.push(value)
        return stack_push
    if t == "StackPopV2":      # what the kernel wrapper would do, without its checks
        name = p.name

        def stack_pop(handle: Any) -> Any:
            v = handle.pop()
            if type(v) is np.ndarray:
                gpu.make_current()
                return gpu.upload(v, name)
            return v
        return stack_pop
    if t == "ReadVariableOp":  # likewise: the variable's array (uploaded if on the host)
        name, read = p.name, functools.partial(p.kernel, np, **kw)

        def read_variable(handle: Any) -> Any:
            v = handle.value
            if v is None or type(v) is np.ndarray:
                v = read(handle)          # the kernel's error for an unset variable
                gpu.make_current()
                return gpu.upload(v, name)
            return v
        return read_variable
    if t in _HOST_OPS or t in _TENSOR_ARRAY_HOST_OPS:
        return functools.partial(p.kernel, np, **kw)
    if t == "TensorArrayReadV3":   # an element as stored; an unwritten gradient one: zeros
        name, cp = p.name, gpu.cp

        def ta_read(handle: Any, index: Any, flow: Any) -> Any:
            gpu.make_current()
            try:
                return handle.read(index, cp)
            except MemoryError as e:
                raise ResourceExhaustedError(gpu._oom_text(f"{t} '{name}'", e)) from None
        return ta_read
    opdef = OPS.get(t)
    dev_kernel = (opdef.gpu_kernel if opdef is not None and opdef.gpu_kernel is not None
                  else p.kernel)
    return _kernel_fn(gpu, p.name, t, p.frame,
                      functools.partial(dev_kernel, gpu.cp, **kw),
                      functools.partial(p.kernel, np, **kw),
                      pure=not (p.stateful or p.resource), on_device=t in _DEVICE_OPS)


def _bind_const(gpu: GpuDevice, value: Any, name: str) -> Any:
    if type(value) is np.ndarray and value.ndim and value.dtype.kind in "fc":
        cache: list = [None]

        def const() -> Any:
            v = cache[0]
            if v is None:
                v = cache[0] = gpu.to_device(value, name)
            return v
        return const
    return lambda: value


def _kernel_fn(gpu: GpuDevice, name: str, typ: str, frame: str, dev: Any, host: Any,
               pure: bool, on_device: bool = False) -> Any:
    """The executor's callable for one kernel node on `gpu` (see the module docstring)."""
    nd = gpu.ndarray
    active = _ACTIVE
    ident = _ident
    mode = [1 if on_device else 0]   # 0: by inputs; 1: always on the device
    convert = [False]   # host inputs go to the device first (learned in slow())

    def run_dev(args: tuple) -> Any:
        if gpu.tracing:
            th = time.perf_counter()
            e0 = gpu.record(gpu.compute)
            out = dev(*args)
            gpu.trace_events.append((name, typ, e0, gpu.record(gpu.compute), "compute", frame,
                                     None, th))
            return out
        return dev(*args)

    def to_dev(args: tuple) -> tuple:
        return tuple(gpu.to_device(a, name) if type(a) is np.ndarray or
                     isinstance(a, np.generic) else a for a in args)

    def slow(args: tuple, first: BaseException) -> Any:
        # mixed host/device inputs a kernel body can't take: host values to the device
        # first (remembered for this node), else everything to the host (blocking) and
        # float results back
        if any(type(a) is np.ndarray or isinstance(a, np.generic) for a in args):
            try:
                out = run_dev(to_dev(args))
                convert[0] = True
                return out
            except _FALLBACK:
                pass
        hargs = tuple(a.get() if type(a) is nd else a for a in args)
        try:
            return gpu.upload(host(*hargs), name)
        except _FALLBACK:
            raise first from None

    retry = pure and not typ.startswith(("TensorArray", "Stack"))  # state: never rerun

    def oom(args: tuple, e: BaseException) -> Any:
        attempt = 0
        while retry and gpu.relieve(attempt):
            attempt += 1
            try:
                return run_dev(args)
            except MemoryError as e2:
                e = e2
        raise ResourceExhaustedError(gpu._oom_text(f"{typ} '{name}'", e)) from None

    def fn(*args: Any) -> Any:
        if active[0] is not gpu or active[1] != ident():
            gpu.activate()
        if not mode[0]:
            for a in args:
                if type(a) is nd:
                    break
            else:
                out = host(*args)
                t = type(out)
                if t is np.ndarray or t is tuple:
                    up = gpu.upload(out, name)
                    if pure and up is not out:
                        mode[0] = 1
                    return up
                return out
        if convert[0]:
            args = to_dev(args)
        try:
            if gpu.tracing:
                return run_dev(args)
            return dev(*args)
        except MemoryError as e:
            return oom(args, e)
        except _FALLBACK as e:
            return slow(args, e)
        except ValueError as e:
            if not any(type(a) is np.ndarray for a in args):
                raise
            return slow(args, e)

    fn.__name__ = f"gpu_{typ}"
    return fn


# ------------------------------------------------------------------ the actor
class _GpuRendezvous:
    """The rendezvous as a GPU actor sees it: values are exported on Send and
    imported on Recv (see the module docstring)."""

    def __init__(self, inner: Any, gpu: GpuDevice, dst_of: dict) -> None:
        self._inner = inner
        self._gpu = gpu
        self._dst_of = dst_of
        self.pending = 0
        self._idle: asyncio.Future | None = None

    def send(self, key: tuple, value: Any) -> None:
        gpu = self._gpu
        if value is DEAD or type(value) is not gpu.ndarray:
            self._inner.send(key, value)
            return
        peer = self._dst_of.get(key[1])
        if peer is not None:
            gpu.make_current()
            if not gpu._peer_copyable(value):   # a view (e.g. a transpose): copy it compact
                value = gpu.cp.ascontiguousarray(value).reshape(value.shape)
            self._inner.send(key, _PeerValue(value, gpu.record(gpu.compute), gpu.index))
            return
        host, ev = gpu.to_host_async(value, f"send {key[1]}", _where(key))
        self.pending += 1

        def deliver() -> None:
            self._inner.send(key, host if host.ndim else host[()])
            self.pending -= 1
            if self.pending == 0 and self._idle is not None and not self._idle.done():
                self._idle.set_result(None)
        gpu.when_done(ev, deliver)

    def recv(self, key: tuple, callback: Callable[[Any], None]) -> None:
        gpu = self._gpu

        def cb(value: Any) -> None:
            callback(gpu.import_value(value, f"recv {key[1]}", _where(key)))
        self._inner.recv(key, cb)

    async def drain(self) -> None:
        """Wait until every value sent to another device has been delivered."""
        if self.pending:
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class GpuActor(DeviceActor):
    """The actor of one "/gpu:K" device: DeviceActor's loop with cupy kernels, plus
    transfers at the partition's edges (feeds, Send/Recv, fetches)."""

    def __init__(self, device: str, gpu: GpuDevice, limit: int | None = None,
                 swap_threshold: float = 0.7) -> None:
        self.gpu = gpu
        super().__init__(device, GpuResources(device, xp=gpu.cp, gpu=gpu))
        self.xp = gpu.cp
        self._dst: dict[int, dict] = {}
        self._memory = (int(limit) if limit else None, float(swap_threshold))

    def _peer_edges(self, plan: Any) -> dict:
        d = self._dst.get(id(plan))
        if d is None:
            d = {}
            for n in plan.nodes:
                if n.kind == Kind.SEND:
                    a = n.pnode.attrs
                    if _is_local_gpu(a.get("dst", "")):
                        d[a["edge"]] = a["dst"]
            self._dst[id(plan)] = d
        return d

    def prepare(self) -> None:
        """Before a step: this GPU current, this session's memory settings (the
        strictest of those of the steps running on it: GpuDevice.begin_step), the
        swapper's sampling restarted. finish() after the step, whatever its end."""
        gpu = self.gpu
        gpu.activate()
        if gpu.begin_step(self._memory):
            return                          # new settings: configure() reset the swapper
        try:
            gpu.swapper.reset()
        except BaseException:
            gpu.end_step(self._memory)
            raise

    def finish(self) -> None:
        self.gpu.end_step(self._memory)

    async def run_step(self, plan: Any, feeds: list, step: Any, rendezvous: Any,
                       **kw: Any) -> Any:
        self.prepare()
        try:
            return await self._run_step(plan, feeds, step, rendezvous, **kw)
        finally:
            self.finish()

    async def _run_step(self, plan: Any, feeds: list, step: Any, rendezvous: Any,
                        **kw: Any) -> Any:
        gpu = self.gpu
        trace = kw.get("trace", False)
        if trace:
            gpu.begin_trace()
        feeds = [gpu.import_value(v, f"feed {k}") for k, v in enumerate(feeds)]
        view = _GpuRendezvous(rendezvous, gpu, self._peer_edges(plan))
        try:
            try:
                ex = await super().run_step(plan, feeds, step, view, **kw)
            except MemoryError as e:        # an allocation outside any kernel (a copy)
                if isinstance(e, ResourceExhaustedError):
                    raise
                raise ResourceExhaustedError(gpu._oom_text("a transfer", e)) from None
            await view.drain()
            pending = start_fetches(ex.results)
            for _, _, ev, owner in pending:
                await owner.wait(ev)
            end_fetches(ex.results, pending)
            gpu.collect()
            gpu.drop_landing()
        finally:
            if trace:
                dev_events = gpu.end_trace()
        if trace:
            ex.trace = merge_trace(ex.trace, dev_events)
        return ex


def start_fetches(results: list) -> list:
    """Start copying every device array among a run's `results` to pinned host memory,
    each on its own GPU's d2h stream; results[k] becomes the (not yet filled) host
    array. Returns [(k, host array, copy event, GpuDevice)] for end_fetches."""
    pending = []
    for k, v in enumerate(results):
        if type(v) is _PeerValue:
            v = v.array
        dev = getattr(v, "device", None)
        if dev is not None and hasattr(v, "__cuda_array_interface__"):
            owner = GpuDevice.get(dev.id)
            host, ev = owner.to_host_async(v, f"fetch {k}")
            results[k] = host
            pending.append((k, host, ev, owner))
    return pending


def end_fetches(results: list, pending: list) -> None:
    """After every copy of `pending` has completed: 0-d values as numpy scalars."""
    for k, host, _, _ in pending:
        if not host.ndim:
            results[k] = host[()]


def _where(key: tuple) -> tuple:
    """(frame, iteration) of a rendezvous key (step, edge, tag); the tag is the frame
    path with iteration numbers, ending (..., frame name, iteration)."""
    tag = key[2] if len(key) > 2 else ()
    if not isinstance(tag, tuple) or not tag:
        return ("", -1)
    return (tag[-2] if len(tag) > 1 else "", tag[-1])


def _is_local_gpu(dev: str) -> bool:
    spec = DeviceSpec.parse(dev)
    return spec.device_type == "gpu" and spec.job in (None, "localhost")


def make_gpu_actor(device: str, config: Any = None) -> GpuActor:
    """The actor of `device` ("/gpu:K"), with the session's memory settings applied."""
    spec = DeviceSpec.parse(device)
    gpu = GpuDevice.get(spec.index or 0)
    limit = getattr(config, "gpu_memory_limit", None)
    threshold = getattr(config, "swap_threshold", 0.7)
    gpu.configure(limit, threshold)
    return GpuActor(device, gpu, limit, threshold)
