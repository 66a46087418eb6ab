"""A stand-in for cupy on machines without a GPU, for testing the GPU actor's logic.

Set ``DCF_FAKE_GPUS=N`` and `dcf.gpu_devices` reports N GPUs backed by this module:
arrays live in host memory but behave like cupy's where it matters for dcf --

- a device array refuses implicit conversion to numpy (``np.asarray(x)`` raises
  TypeError, as cupy does), so a kernel that calls numpy on a device value fails here
  as it would on a GPU; numpy ufuncs and functions on device arrays dispatch back to
  this module (as cupy's ``__array_ufunc__`` / ``__array_function__`` do), and mixing a
  device array with a numpy array raises TypeError;
- reductions and indexing return 0-d device arrays, never numpy scalars (indexing
  every axis with an integer gives a 0-d view of the element, as cupy does);
- each device has a memory pool with ``used_bytes``/``set_limit``; an allocation past
  the limit raises ``OutOfMemoryError`` (a MemoryError), as cupy's pool does, unless
  the pool's cached blocks can serve it (cupy's limit bounds the bytes the pool holds);
- streams and events exist (``record``, ``wait_event``, ``query``); copies complete at
  once, so events are always done.

Nothing here is fast, and nothing here is cupy: it exists so that `tests/gpu` can run
on CPU machines (CI) and on the GPU machine with the same assertions.
"""

from __future__ import annotations

import itertools
import sys
import time
import types
import weakref
from typing import Any

import numpy as _np

__all__ = ["ndarray", "cuda", "get_default_memory_pool", "asarray", "is_fake"]

is_fake = True
_N_DEVICES = [1]
_current_device = [0]


class OutOfMemoryError(MemoryError):
    def __init__(self, size: int, total: int, limit: int = 0) -> None:
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so far: "
                         f"{total:,} bytes, limit set to: {limit:,} bytes).")


class _Pool:
    def __init__(self) -> None:
        self.used = 0
        self.limit = 0
        self.peak = 0

    def used_bytes(self) -> int:
        return self.used

    def total_bytes(self) -> int:
        return self.peak

    def free_bytes(self) -> int:
        return self.peak - self.used

    def free_all_blocks(self, stream: Any = None) -> None:
        self.peak = self.used

    def set_limit(self, size: int | None = None, fraction: float | None = None) -> None:
        self.limit = int(size or 0)

    def get_limit(self) -> int:
        return self.limit

    def alloc(self, nbytes: int) -> None:
        # as cupy's pool: the limit bounds what the pool holds (in use and cached), and a
        # request its cached blocks can serve is served whatever the limit
        if self.limit and self.used + nbytes > max(self.limit, self.peak):
            raise OutOfMemoryError(nbytes, self.used, self.limit)
        self.used += nbytes
        self.peak = max(self.peak, self.used)

    def release(self, nbytes: int) -> None:
        self.used -= nbytes


_pools: dict[int, _Pool] = {}


def _pool(dev: int) -> _Pool:
    p = _pools.get(dev)
    if p is None:
        p = _pools[dev] = _Pool()
    return p


class _MemoryPoolFacade:
    """cupy.get_default_memory_pool(): methods act on the current device's pool."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_pool(_current_device[0]), name)


_default_pool = _MemoryPoolFacade()


def get_default_memory_pool() -> _MemoryPoolFacade:
    return _default_pool


# ---------------------------------------------------------------------- arrays
def _strict(x: Any) -> Any:
    """Unwrap device arrays; reject host arrays the way cupy does."""
    t = type(x)
    if t is ndarray:
        return x._a
    if t is _np.ndarray:
        raise TypeError(f"Unsupported type {t}")
    if t in (list, tuple):
        return t(_strict(e) for e in x)
    if t is dict:
        return {k: _strict(v) for k, v in x.items()}
    return x


def _loose(x: Any) -> Any:
    """Unwrap device arrays; host values pass (explicit transfers and indices)."""
    t = type(x)
    if t is ndarray:
        return x._a
    if t in (list, tuple):
        return t(_loose(e) for e in x)
    if t is slice:
        return slice(_loose(x.start), _loose(x.stop), _loose(x.step))
    return x


def _wrap(r: Any, dev: int | None = None) -> Any:
    t = type(r)
    if t is _np.ndarray:
        return ndarray(r, dev)
    if isinstance(r, _np.generic):
        return ndarray(_np.asarray(r), dev)
    if t in (list, tuple):
        return t(_wrap(e, dev) for e in r)
    return r


class _Data:
    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr: int, dev: int) -> None:
        self.ptr = ptr
        self.device_id = dev


class ndarray:
    """A device array (host memory underneath; see the module docstring)."""

    __slots__ = ("_a", "_dev", "__weakref__")
    __array_priority__ = 1000
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, a: Any, dev: int | None = None) -> None:
        self._a = a
        self._dev = _current_device[0] if dev is None else dev
        if a.base is None and a.nbytes:
            pool = _pool(self._dev)
            pool.alloc(a.nbytes)
            weakref.finalize(a, pool.release, a.nbytes)

    # conversions: explicit only
    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    def get(self, stream: Any = None, order: str = "C", out: Any = None,
            blocking: bool = True) -> Any:
        if out is not None:
            out[...] = self._a
            return out
        return _np.array(self._a, order=order)

    def set(self, arr: Any, stream: Any = None) -> None:
        self._a[...] = arr

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out")
        r = getattr(ufunc, method)(*_strict(inputs), **_strict(kwargs))
        if out is not None:     # written into the given arrays, as cupy does: no allocation
            return out[0] if type(out) is tuple and len(out) == 1 else out
        return _wrap(r, self._dev)

    def __array_function__(self, func: Any, types_: Any, args: Any, kwargs: Any) -> Any:
        return _wrap(func(*_strict(args), **_strict(kwargs)), self._dev)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self._a.shape, "typestr": self._a.dtype.str,
                "data": (self._a.ctypes.data, False), "version": 3}

    @property
    def data(self) -> _Data:
        return _Data(self._a.ctypes.data, self._dev)

    @property
    def device(self) -> Any:
        return cuda.Device(self._dev)

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: ndarray(self._a.T, self._dev))
    real = property(lambda self: ndarray(self._a.real, self._dev))
    imag = property(lambda self: ndarray(self._a.imag, self._dev))

    @property
    def base(self) -> Any:
        return None if self._a.base is None else self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)  # no __array_interface__ & co: no implicit numpy
        attr = getattr(self._a, name)
        if not callable(attr):
            return attr
        dev = self._dev

        def method(*args: Any, **kwargs: Any) -> Any:
            return _wrap(attr(*_strict(args), **_strict(kwargs)), dev)
        return method

    def tolist(self) -> Any:
        return self._a.tolist()

    def item(self) -> Any:
        return self._a.item()

    def __getitem__(self, key: Any) -> Any:
        key = _loose(key)
        r = self._a[key]
        if isinstance(r, _np.generic):
            # integers on every axis: cupy gives a 0-d view of the element (writes through
            # it reach the array), where numpy gives a scalar; numpy's view is a[key, ...]
            r = self._a[(key if type(key) is tuple else (key,)) + (Ellipsis,)]
        return _wrap(r, self._dev)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._a[_loose(key)] = _strict(value)

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self) -> Any:
        return (_wrap(r, self._dev) for r in self._a)

    def __bool__(self) -> bool:
        return bool(self._a)

    def __int__(self) -> int:
        return int(self._a)

    def __float__(self) -> float:
        return float(self._a)

    def __complex__(self) -> complex:
        return complex(self._a)

    def __repr__(self) -> str:
        return f"fakecupy.{self._a!r}"

    __str__ = __repr__


def _binop(name: str) -> None:
    f = getattr(_np.ndarray, name)

    def op(self: ndarray, other: Any) -> Any:
        return _wrap(f(self._a, _strict(other)), self._dev)
    op.__name__ = name
    setattr(ndarray, name, op)


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
              "or", "xor", "lshift", "rshift"):
    _binop(f"__{_name}__")
    _binop(f"__r{_name}__")
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    _binop(f"__{_name}__")
for _name in ("__neg__", "__pos__", "__abs__", "__invert__"):
    def _un(self: ndarray, _f: Any = getattr(_np.ndarray, _name)) -> Any:
        return _wrap(_f(self._a), self._dev)
    setattr(ndarray, _name, _un)


# -------------------------------------------------------------------- module API
def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    if type(a) is ndarray:
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return ndarray(_np.array(_loose(a), dtype=dtype, order=order or "K", copy=True))


def array(a: Any, dtype: Any = None, copy: bool = True, order: Any = "K", ndmin: int = 0) -> Any:
    if type(a) is ndarray:
        return ndarray(_np.array(a._a, dtype=dtype, copy=True, order=order, ndmin=ndmin))
    return ndarray(_np.array(_loose(a), dtype=dtype, copy=True, order=order, ndmin=ndmin))


def ascontiguousarray(a: Any, dtype: Any = None) -> Any:
    if type(a) is not ndarray:
        raise TypeError(f"Unsupported type {type(a)}")
    if a._a.ndim and a._a.flags.c_contiguous and (dtype is None or a.dtype == dtype):
        return a
    return ndarray(_np.ascontiguousarray(a._a, dtype=dtype))   # (ndim >= 1, as cupy's)


def get_array_module(*args: Any) -> Any:
    import sys
    return sys.modules[__name__] if any(type(a) is ndarray for a in args) else _np


def holders(arr: ndarray) -> tuple[int, int, int]:
    """Not cupy's: what dcf's GpuDevice.memory_holders reads off cupy's reference counts
    (dcf/actors/gpu.py, _cupy_holders), for the stand-in's arrays, which wrap numpy
    arrays -- (a count, the id of the owning numpy array, whether arr is a view): an
    owner's references from its views' numpy bases, a view's references to its owner."""
    a = arr._a
    o = a.base
    if o is None:
        return sys.getrefcount(a), id(a), 0
    return sys.getrefcount(o), id(o), 1


def asnumpy(a: Any, stream: Any = None) -> Any:
    return a.get() if type(a) is ndarray else _np.asarray(a)


def _module_function(fn: Any) -> Any:
    def f(*args: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out")
        r = fn(*_strict(args), **_strict(kwargs))
        if out is not None and type(out) is ndarray:   # written in place: no allocation
            return out
        return _wrap(r)
    f.__name__ = getattr(fn, "__name__", "f")
    if isinstance(fn, _np.ufunc):
        f.at = _ufunc_at(fn)    # (cupy's ufuncs have `at`: xp.add.at(a, indices, b))
    return f


def _ufunc_at(fn: Any) -> Any:
    def at(a: Any, indices: Any, b: Any = None) -> None:
        # in place on the device array's own buffer, as cupy's; host arrays refused
        fn.at(_strict(a), _strict(indices), *(() if b is None else (_strict(b),)))
    return at


class _Namespace(types.ModuleType):
    def __init__(self, name: str, base: Any) -> None:
        super().__init__(name)
        self._base = base

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._base, name)
        if isinstance(attr, type) or not callable(attr):
            if isinstance(attr, types.ModuleType):
                sub = _Namespace(f"{self.__name__}.{name}", attr)
                setattr(self, name, sub)
                return sub
            return attr
        f = _module_function(attr)
        setattr(self, name, f)
        return f


def __getattr__(name: str) -> Any:
    attr = getattr(_np, name)
    if isinstance(attr, types.ModuleType):
        sub = _Namespace(f"{__name__}.{name}", attr)
        globals()[name] = sub
        return sub
    if isinstance(attr, type) or not callable(attr):
        return attr
    f = _module_function(attr)
    globals()[name] = f
    return f


# ------------------------------------------------------------------------- cuda
_ptrs = itertools.count(0x1000, 0x100)


class _Event:
    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False) -> None:
        self.t = None
        self.ptr = next(_ptrs)

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    @property
    def done(self) -> bool:   # cupy's Event has `done` (cudaEventQuery), no query()
        return True


class _Stream:
    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False,
                 priority: int = 0) -> None:
        self.ptr = 0 if null else next(_ptrs)
        self.device_id = _current_device[0]

    def record(self, event: Any = None) -> _Event:
        e = event or _Event()
        e.record(self)
        return e

    def wait_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    @property
    def done(self) -> bool:
        return True

    def use(self) -> _Stream:
        _current_stream[self.device_id] = self
        return self

    def __enter__(self) -> _Stream:
        self._prev = _current_stream.get(self.device_id)
        return self.use()

    def __exit__(self, *exc: Any) -> None:
        if self._prev is not None:
            self._prev.use()

    def launch_host_func(self, callback: Any, arg: Any) -> None:
        callback(arg)


_current_stream: dict[int, _Stream] = {}


class _Device:
    def __init__(self, device: int | None = None) -> None:
        self.id = _current_device[0] if device is None else int(device)
        if not 0 <= self.id < _N_DEVICES[0]:
            raise RuntimeError(f"fake cuda: no device {self.id}")

    def use(self) -> None:
        _current_device[0] = self.id

    def __enter__(self) -> _Device:
        self._prev = _current_device[0]
        _current_device[0] = self.id
        return self

    def __exit__(self, *exc: Any) -> None:
        _current_device[0] = self._prev

    def synchronize(self) -> None:
        pass

    @property
    def mem_info(self) -> tuple[int, int]:
        return (16 << 30) - _pool(self.id).used, 16 << 30


def _alloc_pinned_memory(size: int) -> Any:
    # numpy.frombuffer takes any buffer: a bytearray is the pinned buffer here
    return bytearray(max(size, 1))


def _memcpy_async(dst: int, src: int, size: int, kind: int, stream: int) -> None:
    import ctypes

    ctypes.memmove(dst, src, size)


def _memcpy_peer_async(dst: int, dst_dev: int, src: int, src_dev: int, size: int,
                       stream: int) -> None:
    import ctypes

    ctypes.memmove(dst, src, size)


def _elapsed(start: _Event, end: _Event) -> float:
    return ((end.t or 0.0) - (start.t or 0.0)) * 1e3


_runtime = types.SimpleNamespace(
    getDeviceCount=lambda: _N_DEVICES[0],
    getDevice=lambda: _current_device[0],
    setDevice=lambda k: _Device(k).use(),
    memGetInfo=lambda: _Device().mem_info,
    memcpyAsync=_memcpy_async,
    memcpyPeerAsync=_memcpy_peer_async,
    memcpyHostToDevice=1, memcpyDeviceToHost=2, memcpyDeviceToDevice=3, memcpyDefault=4,
    deviceSynchronize=lambda: None,
    CUDARuntimeError=RuntimeError,
)

cuda = types.SimpleNamespace(
    Device=_Device,
    Stream=_Stream,
    Event=_Event,
    runtime=_runtime,
    get_elapsed_time=_elapsed,
    alloc_pinned_memory=_alloc_pinned_memory,
    get_current_stream=lambda: _current_stream.get(_current_device[0]) or _Stream(null=True),
    memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
    is_available=lambda: True,
)


def set_device_count(n: int) -> None:
    _N_DEVICES[0] = int(n)
