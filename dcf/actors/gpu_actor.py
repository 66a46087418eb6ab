"""GPU actors: a session's partitions on a GPU, and their kernels bound to it.

One `GpuActor` per "/gpu:K" device of a session runs that device's partition with the same
kernel bodies as the CPU (xp = cupy); `GpuResources.bind_kernel` binds each kernel to run
on its GPU (`_bind`, `_kernel_fn`). Values cross the partition's edges (feeds, Send/Recv,
fetches) with the transfers of its `GpuDevice` (dcf/actors/gpu.py).

Where values live on a GPU actor:
- float arrays live on the device; host integer/bool values and 0-d scalars stay on
  the host (as TF keeps int32 "host memory" tensors), so a loop counter and its
  predicate never make the host wait for the GPU;
- a kernel runs with cupy when any input is a device array, else with numpy on the
  host, and float array results of a host run go to the device (an op that is pure
  runs with cupy from then on);
- a kernel is "done" for the executor when it is enqueued on the compute stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from dcf.actors.device_actor import DeviceActor
from dcf.actors.gpu import _ACTIVE, GpuDevice, _PeerValue, _ident, merge_trace
from dcf.actors.gpu_swap import GpuStackStore
from dcf.device import DeviceSpec
from dcf.errors import ResourceExhaustedError
from dcf.ops.data_ops import StackStore
from dcf.ops.registry import OPS, Kind
from dcf.resources import DeviceResources
from dcf.token import DEAD

__all__ = ["GpuActor", "GpuResources", "make_gpu_actor", "EarlyFetch", "early_fetch"]


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
# ResourceScatter (and a sliced assignment) writes rows into the variable's buffer, which
# its inputs do not show:
# on the device, where host rows are uploaded first (mode 0 would run it on the host
# whenever its rows come from the host, and the host kernel cannot write them into a
# device buffer).
_DEVICE_OPS = frozenset({"TensorArrayReadV3", "TensorArrayGatherV3", "TensorArrayStack",
                         "TensorArrayConcatV3", "ResourceScatter",
                         "ResourceStridedSliceAssign"})
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
                v = cache[0] = gpu.to_device(value, f"Const '{name}'")
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
                # (its message only: its traceback holds this frame, which would hold it,
                # and through the frames' callers the compiled loop's values and stacks,
                # in a cycle kept until the collector ran -- device memory in use after
                # a run that throttled)
                e = e2.with_traceback(None)
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
    imported on Recv (see the transfers in dcf/actors/gpu.py's docstring)."""

    def __init__(self, inner: Any, gpu: GpuDevice, dst_of: dict, scope: Any) -> None:
        self._inner = inner
        self._gpu = gpu
        self._dst_of = dst_of
        self._scope = scope             # the step's TraceScope on this GPU
        self.pending = 0
        self._idle: asyncio.Future | None = None

    def send(self, key: tuple, value: Any) -> None:
        gpu = self._gpu
        if value is DEAD or type(value) is not gpu.ndarray:
            self._inner.send(key, value)
            return
        with self._scope:               # (a held value may leave from a timer's callback)
            self._send(gpu, key, value)

    def _send(self, gpu: GpuDevice, key: tuple, value: Any) -> None:
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

        scope = self._scope

        def cb(value: Any) -> None:     # (in the sender's code: another step's, maybe)
            with scope:
                value = gpu.import_value(value, f"recv {key[1]}", _where(key))
            callback(value)
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
        gpu = self.gpu
        gpu.end_step(self._memory)
        if gpu.swapper.out:
            gpu.swapper.settle()

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
        # this step's device events (none where it is not traced), entered while its own
        # code runs here: the feeds, each pump, its transfers, the fetches' copies
        scope = gpu.trace_scope(trace)
        with scope:
            feeds = [gpu.import_value(v, _feed_label(plan, k)) for k, v in enumerate(feeds)]
        view = _GpuRendezvous(rendezvous, gpu, self._peer_edges(plan), scope)
        with transfer_oom(lambda e: gpu._oom_text("a transfer", e)):
            ex = await super().run_step(plan, feeds, step, view, scope=scope, **kw)
        await view.drain()
        await fetch_results(ex.results, scope)
        gpu.collect()
        gpu.drop_landing()
        if trace:
            ex.trace = merge_trace(ex.trace, scope.timed_events())
        return ex


class EarlyFetch(NamedTuple):
    """A fetched device value whose copy to the host started where it was made."""

    host: np.ndarray
    event: Any
    owner: GpuDevice


def early_fetch(v: Any, k: int) -> EarlyFetch | None:
    """Start copying fetch k to pinned host memory now, on its GPU's d2h stream after an
    event recorded on its compute stream here (the compiled root calls this right after
    the op that made it, dcf/fused.py; start_fetches at the run's end); None where v is
    not a device array."""
    if type(v) is _PeerValue:
        v = v.array
    dev = getattr(v, "device", None)
    if dev is None or not hasattr(v, "__cuda_array_interface__"):
        return None
    owner = GpuDevice.get(dev.id)
    host, ev = owner.to_host_async(v, f"fetch {k}")
    return EarlyFetch(host, ev, owner)


def start_fetches(results: list) -> list:
    """Start copying every device array among a run's `results` to pinned host memory,
    each on its own GPU's d2h stream; results[k] becomes the (not yet filled) host
    array. Returns [(k, host array, copy event, GpuDevice)] for end_fetches. A copy
    started early (an EarlyFetch) is only waited for."""
    pending = []
    for k, v in enumerate(results):
        got = v if type(v) is EarlyFetch else early_fetch(v, k)
        if got is not None:
            results[k] = got.host
            pending.append((k, got.host, got.event, got.owner))
    return pending


def end_fetches(results: list, pending: list) -> None:
    """After every copy of `pending` has completed: 0-d values as numpy scalars."""
    for k, host, _, _ in pending:
        if not host.ndim:
            results[k] = host[()]


@contextlib.contextmanager
def transfer_oom(text: Callable[[MemoryError], str]) -> Iterator[None]:
    """Around a step: a MemoryError from outside any kernel (an allocation for a copy;
    kernels map their own) becomes ResourceExhaustedError(text(e))."""
    try:
        yield
    except MemoryError as e:
        if isinstance(e, ResourceExhaustedError):
            raise
        raise ResourceExhaustedError(text(e)) from None


async def fetch_results(results: list, scope: Any = contextlib.nullcontext()) -> None:
    """A run's device `results` replaced by host values, waiting for their copies
    without blocking the event loop (start_fetches, then end_fetches); the copies are
    made inside `scope` (a step's TraceScope), which is left before any wait."""
    with scope:
        pending = start_fetches(results)
    for _, _, ev, owner in pending:
        await owner.wait(ev)
    end_fetches(results, pending)


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


def _feed_label(plan: Any, k: int) -> str:
    """What a feed's errors call it: the tensor it feeds (its _Feed node is named
    `_feed/<tensor>`, see partition.py)."""
    pnodes = plan.feed_pnodes
    if k >= len(pnodes):
        return f"feed {k}"
    return f"the feed of tensor '{pnodes[k].name.removeprefix('_feed/')}'"
