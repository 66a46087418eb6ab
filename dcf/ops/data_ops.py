"""Ops over runtime objects: TensorArrays, stacks (for loop gradients), py_func, print_."""

from __future__ import annotations

import contextvars
import sys
import warnings
from typing import Any, Callable

import numpy as np

from dcf import dtypes
from dcf.errors import InvalidArgumentError, OutOfRangeError
from dcf.graph import Tensor, TensorType
from dcf.ops.registry import OpDef, apply, changed_by_cast, not_differentiable, register

__all__ = ["py_func", "print_"]

_RESOURCE = TensorType(dtypes.resource, ())
_FLOW = TensorType(dtypes.variant, ())
_FLOW_VALUE = np.float32(0.0)


# The stacks and TensorArrays made by the run under way in this context (the session
# sets a list around each run of a plan that makes any, dcf/session.py): a run that fails
# drops them, as TensorFlow's are resources of their step -- a failed run's saved values
# would otherwise live as long as its traceback (a notebook keeps the last one), device
# memory included.
STEP_STORES: contextvars.ContextVar = contextvars.ContextVar("dcf_step_stores",
                                                            default=None)


# ------------------------------------------------------------------ TensorArray
class TensorArrayStore:
    """The runtime storage behind one TensorArray handle."""

    __slots__ = ("name", "dtype", "size", "dynamic_size", "clear_after_read", "element_shape",
                 "infer_shape", "elements", "read_once", "grads", "zeros", "shapes")

    def __init__(self, name: str, dtype: dtypes.DType, size: int, dynamic_size: bool,
                 clear_after_read: bool, element_shape: tuple | None, infer_shape: bool) -> None:
        self.name = name
        self.dtype = dtype
        self.size = int(size)
        self.dynamic_size = dynamic_size
        self.clear_after_read = clear_after_read
        self.element_shape = element_shape
        self.infer_shape = infer_shape
        self.elements: list[Any] = [None] * self.size
        self.read_once: list[bool] = [False] * self.size
        self.grads: dict[str, TensorArrayStore] = {}
        self.zeros: dict | None = None    # (device, shape) -> the zeros unwritten elements read as
        # index -> the shape written there, kept where elements may differ (infer_shape
        # False): a gradient array's unwritten element reads as zeros of that shape
        self.shapes: dict[int, tuple] = {}
        made = STEP_STORES.get()
        if made is not None:
            made.append(self)

    def drop(self) -> None:
        """Let go of every element: the run that made the TensorArray failed."""
        self.elements = [None] * len(self.elements)
        self.zeros = None

    def _describe(self) -> str:
        return (f"TensorArray '{self.name}' (size {len(self.elements)}, "
                f"dynamic_size={self.dynamic_size})")

    def _index(self, index: Any, what: str) -> int:
        i = int(index)
        if i < 0:
            raise OutOfRangeError(f"{what} of negative index {i} in {self._describe()}")
        if i >= len(self.elements):
            if what == "write" and self.dynamic_size:
                grow = i + 1 - len(self.elements)
                self.elements.extend([None] * grow)
                self.read_once.extend([False] * grow)
            else:
                prep = "to" if what == "write" else "from"
                raise OutOfRangeError(f"{what} of index {i} {prep} {self._describe()}")
        return i

    def write(self, index: Any, value: Any, accumulate: bool = False) -> None:
        i = self._index(index, "write")
        if getattr(value, "dtype", None) != self.dtype.np:
            raise InvalidArgumentError(
                f"write of a {getattr(value, 'dtype', type(value))} value to index {i} of "
                f"{self._describe()} which holds {self.dtype}")
        shape = tuple(getattr(value, "shape", ()))
        if shape != self.element_shape:     # equal: known and alike
            # a given element shape holds for every write (infer_shape only merges them)
            if self.element_shape is not None and not _compatible(self.element_shape, shape):
                raise InvalidArgumentError(
                    f"write of shape {list(shape)} to index {i} of {self._describe()} whose "
                    f"elements have shape {list(self.element_shape)}")
            if not self.infer_shape:
                self.shapes[i] = shape
            elif self.element_shape is None or any(d is None for d in self.element_shape):
                self.element_shape = shape
        old = self.elements[i]
        if old is not None:
            if not accumulate:
                raise InvalidArgumentError(
                    f"index {i} of {self._describe()} was already written; a TensorArray "
                    "index can be written only once")
            value = old + value
        self.elements[i] = value

    def read(self, index: Any, xp: Any = np) -> Any:
        i = self._index(index, "read")
        v = self.elements[i]
        if v is None:
            if self.read_once[i]:
                raise InvalidArgumentError(
                    f"read of index {i} from {self._describe()} which was already read and "
                    "cleared (clear_after_read=True)")
            # TF semantics for gradient arrays: an unwritten element of a known shape (the
            # one the forward array's element there had) is 0.
            shape = self._known_shape(None)
            if shape is None:
                shape = self.shapes.get(i)
            if shape is not None and self.name.endswith("@grad"):
                z = np.zeros(shape, self.dtype.np) if xp is np else self._device_zeros(xp, shape)
                return z if z.ndim else z[()]
            raise InvalidArgumentError(
                f"read of index {i} from {self._describe()} which was never written")
        if self.clear_after_read:
            self.elements[i] = None
            self.read_once[i] = True
        return v

    def _device_zeros(self, xp: Any, shape: tuple) -> Any:
        """One zeros array per device for every unwritten element read (a backward loop
        reads one each iteration when the loss does not use the forward's outputs): a new
        one each read cost an allocation and a fill launch per iteration. Shared like a
        loop constant: no kernel writes into an input the graph does not prove its own."""
        key = (xp.cuda.runtime.getDevice(), shape)
        zs = self.zeros
        if zs is None:
            zs = self.zeros = {}
        z = zs.get(key)
        if z is None:
            z = zs[key] = xp.zeros(shape, self.dtype.np)
        return z

    def _known_shape(self, static: tuple | None, skip: int = 0) -> tuple | None:
        """The element shape past its first `skip` dimensions, fully known: from the
        elements written, else the one the graph knows at build time (`static`); None if
        neither is."""
        for shape in (self.element_shape, static):
            if shape is not None and all(d is not None for d in shape[skip:]):
                return tuple(shape[skip:])
        return None

    def _empty_shape(self, static: tuple | None, skip: int = 0) -> tuple:
        """The element shape past its first `skip` dimensions for an empty stack or concat:
        the known one; where only its rank is known, 0 for each unknown dimension (a value
        of the rank the graph gives it); else none."""
        known = self._known_shape(static, skip)
        if known is not None:
            return known
        for shape in (self.element_shape, static):
            if shape is not None:
                return tuple(0 if d is None else d for d in shape[skip:])
        return ()

    def stack(self, indices: Any = None, static: tuple | None = None) -> Any:
        """The elements at `indices` (all by default) stacked; with none, an empty array of
        the known element shape (`static`: the build-time one)."""
        els = self.elements
        if els and (indices is None or _is_range(indices, len(els))) and \
                all(v is not None for v in els):
            t = type(els[0])       # every element written, all arrays of one kind: as they are
            if (t is np.ndarray or hasattr(t, "__cuda_array_interface__")) and \
                    all(type(v) is t for v in els):
                out = self._stacked(_module_of(els[:1]), els, range(len(els)))
                if self.clear_after_read:      # what reading each would have done
                    n = len(els)
                    self.elements, self.read_once = [None] * n, [True] * n
                return out
        idx = range(len(els)) if indices is None else [int(i) for i in indices]
        vals = [self.read(i) for i in idx]
        if not vals:
            shape = self._empty_shape(static)
            return np.zeros((0,) + tuple(shape), self.dtype.np)
        xp = _module_of(vals)
        return self._stacked(xp, [xp.asarray(v) for v in vals], idx)

    def _stacked(self, xp: Any, vals: list, indices: Any) -> Any:
        try:
            return xp.stack(vals)
        except ValueError:
            raise InvalidArgumentError(
                f"stack of elements of different shapes ({_shapes_of(vals, indices)}) in "
                f"{self._describe()}; concat() joins elements that differ in their first "
                "dimension") from None

    def concat(self, static: tuple | None = None) -> tuple[Any, Any]:
        vals = [self.read(i) for i in range(len(self.elements))]
        xp = _module_of(vals)
        vals = [xp.asarray(v) for v in vals]
        lengths = np.asarray([v.shape[0] if v.ndim else 1 for v in vals], np.int64)
        if not vals:
            # an element's rows (their number need not be known), else none
            rows = self._empty_shape(static, skip=1)
            return np.zeros((0,) + rows, self.dtype.np), lengths
        rows = [v if v.ndim else v[None] for v in vals]
        try:
            return xp.concatenate(rows), lengths
        except ValueError:
            raise InvalidArgumentError(
                f"concat of elements whose shapes differ past their first dimension "
                f"({_shapes_of(rows, range(len(rows)), skip=1)}) in {self._describe()}"
            ) from None

    def scatter(self, indices: Any, value: Any, accumulate: bool = False) -> None:
        """value[k] to index indices[k] (added to what is there, with `accumulate`)."""
        value = _as_array(value)
        idx = [int(i) for i in _host(indices).reshape(-1)]
        if not value.ndim or len(idx) != value.shape[0]:
            rows = f"{value.shape[0]} rows" if value.ndim else "a scalar (no rows)"
            raise InvalidArgumentError(
                f"scatter of {rows} to {len(idx)} indices of {self._describe()}")
        for k, i in enumerate(idx):
            self.write(i, value[k][()] if value.ndim == 1 else value[k], accumulate)

    def unstack(self, value: Any, indices: Any = None, accumulate: bool = False) -> None:
        """value[k] to index k for every row k (scatter to 0..n-1): where that fills an
        empty array of n elements, the first row is written with a write's checks and
        the others, alike, are placed as they are (one check for all rows)."""
        value = _as_array(value)
        n = value.shape[0] if value.ndim else -1
        if n == 0 and self.infer_shape and self.element_shape is None:
            self.element_shape = tuple(value.shape[1:])   # as TF's: the rows' shape
        if n > 0 and value.ndim > 1 and n == len(self.elements) and \
                all(e is None for e in self.elements) and not any(self.read_once) and \
                (indices is None or _is_range(indices, n)):
            rows = _rows(value)
            self.write(0, rows[0], accumulate)
            self.elements[1:] = rows[1:]
            if not self.infer_shape:
                self.shapes.update(dict.fromkeys(range(1, n), tuple(value.shape[1:])))
            return
        if indices is None:
            indices = np.arange(max(n, 0))
        self.scatter(indices, value, accumulate)

    def split(self, value: Any, lengths: Any, accumulate: bool = False) -> None:
        """value[start:start + lengths[i]] to index i (the inverse of concat; a scalar
        element, which concat joins as one row, gets its row back as a scalar)."""
        value = _as_array(value)
        lens = _host(lengths).reshape(-1)
        if (lens < 0).any():
            raise InvalidArgumentError(
                f"split into negative lengths {lens.tolist()} in {self._describe()}")
        if not value.ndim or int(lens.sum()) != value.shape[0]:
            rows = f"{value.shape[0]} rows" if value.ndim else "a scalar (no rows)"
            raise InvalidArgumentError(
                f"split of {rows} into lengths summing to {int(lens.sum())} in "
                f"{self._describe()}")
        scalar = self.element_shape is not None and len(self.element_shape) == 0
        start = 0
        for i, n in enumerate(lens):
            n = int(n)
            # (with infer_shape=False each index has its own shape: a gradient array
            # gives a scalar element's row back as a scalar)
            part = value[start] if n == 1 and (scalar or self.shapes.get(i) == ()) else \
                value[start:start + n]
            self.write(i, part, accumulate)
            start += n


def _module_of(vals: list) -> Any:
    """numpy, or the GPU array module when any element lives on a GPU."""
    for v in vals:
        if hasattr(v, "__cuda_array_interface__"):
            from dcf.gpu_devices import array_module

            return array_module(v)
    return np


def _rows(v: Any) -> list:
    """[v[0], v[1], ...] as views: numpy's iteration, or, for a GPU array, views made
    directly (a pointer into v, its strides; cupy's indexing costs more host time)."""
    if type(v) is np.ndarray:
        return list(v)
    mem, st = getattr(v, "data", None), v.strides
    if st[0] > 0 and hasattr(mem, "ptr") and hasattr(type(mem), "__add__"):
        mk, shape, dt, step, inner = type(v), v.shape[1:], v.dtype, st[0], st[1:]
        return [mk(shape, dt, mem + k * step, inner) for k in range(v.shape[0])]
    return [v[k] for k in range(v.shape[0])]


def _is_range(indices: Any, n: int) -> bool:
    h = _host(indices).reshape(-1)
    return h.shape[0] == n and bool((h == np.arange(n)).all())


def _as_array(v: Any) -> Any:
    return v if hasattr(v, "__cuda_array_interface__") else np.asarray(v)


def _host(v: Any) -> np.ndarray:
    """A host copy of an index-like value (GPU arrays are copied back)."""
    return v.get() if hasattr(v, "__cuda_array_interface__") else np.asarray(v)


def _shapes_of(vals: list, indices: Any, skip: int = 0) -> str:
    """'index 0: [2], index 3: [3]': the first element's shape, then the first few that
    differ from it (past their first `skip` dimensions)."""
    shapes = [(i, v.shape) for i, v in zip(indices, vals)]
    differ = [f"index {i}: {list(sh)}" for i, sh in shapes if sh[skip:] != shapes[0][1][skip:]]
    first = f"index {shapes[0][0]}: {list(shapes[0][1])}"
    return ", ".join([first] + differ[:3]) + (", ..." if len(differ) > 3 else "")


def _vector(indices: Any, what: str, handle: TensorArrayStore) -> np.ndarray:
    h = _host(indices)
    if h.ndim != 1:
        raise InvalidArgumentError(f"{what} with indices of shape {list(h.shape)} in "
                                   f"{handle._describe()}: indices must be a vector")
    return h


def _compatible(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is None or x == y for x, y in zip(a, b))


def _ta_create(xp, size, *, dtype, dynamic_size, clear_after_read, element_shape,
               infer_shape, ta_name):
    if int(size) < 0:       # (TF's "Size should be >= 0"; [None] * -1 is an empty list)
        raise InvalidArgumentError(f"TensorArray '{ta_name}': size must be >= 0, got "
                                   f"{int(size)}")
    store = TensorArrayStore(ta_name, dtype, size, dynamic_size, clear_after_read,
                             element_shape, infer_shape)
    return store, _FLOW_VALUE


def _ta_write(xp, handle, index, value, flow):
    handle.write(index, value)
    return _FLOW_VALUE


def _ta_read(xp, handle, index, flow, *, dtype, element_shape):
    return handle.read(index, xp)


def _ta_gather(xp, handle, indices, flow, *, dtype, element_shape):
    return handle.stack(_vector(indices, "gather", handle), element_shape)


def _ta_stack(xp, handle, flow, *, dtype, element_shape):
    return handle.stack(None, element_shape)


def _ta_scatter(xp, handle, indices, value, flow):
    handle.scatter(_vector(indices, "scatter", handle), value)
    return _FLOW_VALUE


def _ta_unstack(xp, handle, value, flow):
    if not getattr(value, "ndim", 0):
        raise InvalidArgumentError(f"unstack of a scalar into {handle._describe()}")
    handle.unstack(value)
    return _FLOW_VALUE


def _ta_split(xp, handle, value, lengths, flow):
    handle.split(value, lengths)
    return _FLOW_VALUE


def _ta_concat(xp, handle, flow, *, dtype, element_shape):
    return handle.concat(element_shape)


def _ta_size(xp, handle, flow):
    return np.int32(len(handle.elements))


def _ta_grad(xp, handle, flow, *, source):
    """The gradient array of `handle` (one per source), created on first use."""
    g = handle.grads.get(source)
    if g is None:
        g = TensorArrayStore(f"{handle.name}@grad", handle.dtype, len(handle.elements),
                             handle.dynamic_size, False, handle.element_shape,
                             handle.infer_shape)   # ragged elements: ragged gradients
        g.shapes = dict(handle.shapes)
        handle.grads[source] = g
    return g, _FLOW_VALUE


def _ta_write_accumulate(xp, handle, index, value, flow):
    handle.write(index, value, accumulate=True)
    return _FLOW_VALUE


def _ta_scatter_accumulate(xp, handle, indices, value, flow):
    handle.unstack(value, indices, accumulate=True)
    return _FLOW_VALUE


def _ta_split_accumulate(xp, handle, value, lengths, flow):
    handle.split(value, lengths, accumulate=True)
    return _FLOW_VALUE


def _elem_type(*, dtype, element_shape, **_: Any) -> TensorType:
    return TensorType(dtype, element_shape)


def _stacked_type(*, dtype, element_shape, **_: Any) -> TensorType:
    return TensorType(dtype, None if element_shape is None else (None,) + tuple(element_shape))


register(OpDef("TensorArrayV3", kernel=_ta_create,
               infer=lambda size, **kw: [_RESOURCE, _FLOW]))
register(OpDef("TensorArrayWriteV3", kernel=_ta_write, infer=lambda h, i, v, f: _FLOW))
register(OpDef("TensorArrayReadV3", kernel=_ta_read,
               infer=lambda h, i, f, **kw: _elem_type(**kw)))


def _gathered_type(indices: TensorType, *, dtype, element_shape, **_: Any) -> TensorType:
    # a vector of indices of known length is the first dimension (as TF's)
    ish = indices.shape
    n = ish[0] if ish is not None and len(ish) == 1 else None
    return TensorType(dtype, None if element_shape is None else (n,) + tuple(element_shape))


register(OpDef("TensorArrayGatherV3", kernel=_ta_gather,
               infer=lambda h, i, f, **kw: _gathered_type(i, **kw)))
register(OpDef("TensorArrayStack", kernel=_ta_stack,
               infer=lambda h, f, **kw: _stacked_type(**kw)))
register(OpDef("TensorArrayScatterV3", kernel=_ta_scatter, infer=lambda h, i, v, f: _FLOW))
register(OpDef("TensorArrayUnstack", kernel=_ta_unstack, infer=lambda h, v, f: _FLOW))
register(OpDef("TensorArraySplitV3", kernel=_ta_split, infer=lambda h, v, n, f: _FLOW))
register(OpDef("TensorArrayConcatV3", kernel=_ta_concat, infer=lambda h, f, *, dtype,
               element_shape: [TensorType(dtype, None if element_shape is None else
                                          (None,) + tuple(element_shape[1:])),
                               TensorType(dtypes.int64, (None,))]))
register(OpDef("TensorArraySizeV3", kernel=_ta_size,
               infer=lambda h, f: TensorType(dtypes.int32, ())))
register(OpDef("TensorArrayGradV3", kernel=_ta_grad, infer=lambda h, f, **kw: [_RESOURCE, _FLOW]))
register(OpDef("TensorArrayWriteAccumulate", kernel=_ta_write_accumulate,
               infer=lambda h, i, v, f: _FLOW))
register(OpDef("TensorArrayScatterAccumulate", kernel=_ta_scatter_accumulate,
               infer=lambda h, i, v, f: _FLOW))
register(OpDef("TensorArraySplitAccumulate", kernel=_ta_split_accumulate,
               infer=lambda h, v, n, f: _FLOW))


def _ta_flow_join(xp, *flows):
    return _FLOW_VALUE


# Joins the flows of several TensorArray operations (the gradients reaching one flow
# from several reads, say) into one that follows all of them. Unlike an Identity with
# control dependencies, every flow is a data input, so a second-order gradient reaches
# each of them (its gradient passes the incoming gradient on to every input).
register(OpDef("TensorArrayFlowJoin", kernel=_ta_flow_join, infer=lambda *fs: _FLOW))
not_differentiable("TensorArraySizeV3", "TensorArrayV3")  # GradV3: autodiff/tensor_array_grad


# ------------------------------------------------------------------- py_func
# Whether a KeyboardInterrupt raised in a py_func reaches the caller as it is (in the
# client's process: Ctrl-C during a py_func stops the run, as Python's Ctrl-C does). A
# worker process sets it False: there a KeyboardInterrupt can only be the function's own
# (the worker takes SIGINT itself), and, raised as it is, it would end the worker.
KEEP_KEYBOARD_INTERRUPT = True


def _call_py_func(fn: Callable[..., Any], args: tuple, fn_name: str) -> Any:
    """fn(*args), its StopIteration an OutOfRangeError (as TF's py_func: an exhausted
    iterator ends the input). Raised as it is, StopIteration would end the generator
    a compiled frame runs in (a bare RuntimeError naming no op). Any other exception that
    is not an Exception (SystemExit, GeneratorExit, a library's own BaseException) becomes
    an InvalidArgumentError, which the executor locates (op, frame, iteration), as TF
    turns every Python error of a py_func into an op error: raised as it is, it would
    pass every `except Exception` on its way and end the worker or the event loop that
    runs the step. asyncio's CancelledError too: fn is plain synchronous code, so one
    raised inside it is fn's own, never the cancellation of the step (that lands at the
    step's awaits), and passed on it made a worker's step end without a reply (the run
    hung). Only KeyboardInterrupt in the client's process passes
    (KEEP_KEYBOARD_INTERRUPT)."""
    try:
        return fn(*args)
    except StopIteration as e:
        raise OutOfRangeError(f"py_func {fn_name} raised StopIteration"
                              f"{': ' + str(e) if str(e) else ''}") from None
    except Exception:
        raise
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt) and KEEP_KEYBOARD_INTERRUPT:
            raise
        detail = str(e)
        raise InvalidArgumentError(f"py_func {fn_name} raised {type(e).__name__}"
                                   f"{': ' + detail if detail else ''}") from e


def _py_func_kernel(xp, *args, fn, tout, stateful, fn_name):
    return _py_func_outputs(_call_py_func(fn, args, fn_name), tout, fn_name)


def _py_func_outputs(result: Any, tout: list, fn_name: str) -> Any:
    """fn's result as the op's outputs: None is no outputs (Tout=[]), and an error
    where Tout declares some (a missing return, not a NaN).

    Each output is a copy, as TF's: fn may return its own buffer (an environment's
    state) and change it on its next call, and what the op produced must not change
    with it (nor fn's state when a consumer or the caller writes to a fetched value).
    A conversion to Tout that would change a value (2.7 to an int32, 2**40 to an
    int32, 2 to a bool) is an error; exact ones (2.0 to an int32) and float rounding
    (float64 to float32) are not."""
    if result is None:
        if not tout:
            return ()
        raise InvalidArgumentError(
            f"py_func {fn_name} returned None, Tout declares {len(tout)} "
            f"value{'s' if len(tout) != 1 else ''} (a missing return?)")
    outs = list(result) if isinstance(result, (list, tuple)) else [result]
    if len(outs) != len(tout):
        raise InvalidArgumentError(
            f"py_func {fn_name} returned {len(outs)} values, Tout declares {len(tout)}")
    conv = []
    for k, (v, dt) in enumerate(zip(outs, tout)):
        try:
            src = v if isinstance(v, (np.ndarray, np.generic)) else np.asarray(v)
            what = _NOT_NUMBERS.get(src.dtype.kind)
            if what is not None:
                # numpy would parse "12" or b"12" as a number, or take a date's count
                raise TypeError(f"{what} is not a number ({src.dtype})")
            with np.errstate(invalid="ignore", over="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
                arr = np.array(src, dtype=dt.np)      # (a copy, always; checked below)
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidArgumentError(
                f"py_func {fn_name} output {k} ({type(v).__name__}) cannot be converted to "
                f"{dt}: {e}") from e
        if changed_by_cast(src, arr, dt):
            raise InvalidArgumentError(
                f"py_func {fn_name} output {k} is {src.dtype}, but Tout declares {dt}, and "
                f"converting it would change its value ({_short(src)}); return values of "
                f"that dtype")
        conv.append(arr[()] if arr.ndim == 0 else arr)
    return conv[0] if len(conv) == 1 else tuple(conv)


_NOT_NUMBERS = {"U": "a str", "S": "a bytes value", "V": "a record", "M": "a datetime64",
                "m": "a timedelta64"}


def _short(v: Any) -> str:
    r = np.array2string(np.asarray(v), threshold=6)
    return r if len(r) <= 60 else r[:57] + "..."


def _bind_py_func(xp, *, fn, tout, stateful, fn_name):
    """The kernel with a fast path for results that already are what np.asarray would
    make of them (an ndarray of the declared dtype, or a numpy scalar of it): an array is
    copied (see _py_func_outputs), a numpy scalar is immutable."""
    nps = tuple(dt.np for dt in tout)
    scalar_types = tuple(npd.type for npd in nps)
    n = len(tout)
    ndarray = np.ndarray
    npd0 = nps[0] if n == 1 else None
    st0 = scalar_types[0] if n == 1 else None

    def py_func(*args):
        result = _call_py_func(fn, args, fn_name)
        t = type(result)
        if n == 1:
            # fast path: one output, returned bare
            if t is st0:
                return result
            if t is ndarray and result.dtype == npd0 and result.ndim:
                return result.copy()
        if t is tuple and len(result) == n:
            conv = []
            for v, npd, st in zip(result, nps, scalar_types):
                t = type(v)
                if t is st:
                    conv.append(v)
                elif t is ndarray and v.dtype == npd and v.ndim:
                    conv.append(v.copy())
                else:
                    break
            else:
                return conv[0] if n == 1 else tuple(conv)
        return _py_func_outputs(result, tout, fn_name)

    return py_func


_py_func_kernel.bind = _bind_py_func  # type: ignore[attr-defined]


def _py_func_infer(*inputs: TensorType, fn, tout, stateful, fn_name) -> list[TensorType]:
    return [TensorType(dt, None) for dt in tout]


register(OpDef("PyFunc", infer=_py_func_infer, kernel=_py_func_kernel, stateful=True,
               host_only=True))
register(OpDef("PyFuncStateless", infer=_py_func_infer, kernel=_py_func_kernel,
               host_only=True))


def py_func(fn: Callable[..., Any], inputs: list, Tout: Any, stateful: bool = True,
            name: str | None = None) -> Any:
    """Run the Python function `fn(*numpy_inputs)` inside the graph.

    Its results are converted to the dtypes in `Tout` (a dtype, or a list of them);
    their static shapes are unknown. It runs in the process that holds its device.
    Returns a tensor when Tout is a single dtype, else a list of tensors; with Tout=[],
    the op (for `control_dependencies`, as TF's).
    """
    single = not isinstance(Tout, (list, tuple))
    tout = [dtypes.as_dtype(t) for t in ([Tout] if single else Tout)]
    fn_name = getattr(fn, "__name__", type(fn).__name__)
    out = apply("PyFunc" if stateful else "PyFuncStateless", list(inputs), name=name or "PyFunc",
                fn=fn, tout=tout, stateful=stateful, fn_name=fn_name)
    if not isinstance(out, (tuple, Tensor)):
        return out          # no outputs: apply gave the Operation
    outs = list(out) if isinstance(out, tuple) else [out]
    return outs[0] if single else outs


# --------------------------------------------------------------------- print_
def _print_kernel(xp, x, *data, message, summarize, stream):
    parts = [message] if message else []
    for d in (data or (x,)):
        parts.append(np.array2string(np.asarray(d), threshold=summarize * 2, edgeitems=summarize)
                     if np.ndim(d) else str(d))
    print(" ".join(parts), file=sys.stderr if stream == "stderr" else sys.stdout, flush=True)
    return x


register(OpDef("Print", infer=lambda x, *d, **kw: x, kernel=_print_kernel, stateful=True,
               host_only=True))


def print_(input_: Any, data: list | None = None, message: str = "", summarize: int = 3,
           output_stream: str = "stdout", name: str | None = None) -> Tensor:
    """Print `message` and the values of `data` (default: `input_`) when this op runs,
    then pass `input_` through unchanged. Inside loops, prints follow iteration order."""
    return apply("Print", [input_] + list(data or []), name=name or "Print", message=message,
                 summarize=summarize, stream=output_stream)


# ------------------------------------------------------------------- stacks


class StackStore:
    """A LIFO of saved forward values (one per loop value the gradient needs)."""

    __slots__ = ("name", "items", "swap_memory")

    def __init__(self, name: str, swap_memory: bool) -> None:
        self.name = name
        self.items: list[Any] = []
        self.swap_memory = swap_memory
        made = STEP_STORES.get()
        if made is not None:
            made.append(self)

    def drop(self) -> None:
        """Let go of every entry: the run that made the stack failed."""
        self.items.clear()

    def push(self, value: Any) -> Any:
        # (compiled frames push and pop a StackStore's items inline: _Codegen.stack_op)
        self.items.append(value)
        return value

    def pop(self) -> Any:
        if not self.items:
            raise OutOfRangeError(f"pop from empty stack '{self.name}'")
        return self.items.pop()


def _stack_create(xp, *, elem_type, stack_name, swap_memory):
    return StackStore(stack_name, swap_memory)


def _stack_push(xp, handle, value, *, swap_memory):
    return handle.push(value)


def _stack_pop(xp, handle, *, elem_type, shape):
    return handle.pop()


register(OpDef("StackV2", kernel=_stack_create, infer=lambda **kw: _RESOURCE))
register(OpDef("StackPushV2", kernel=_stack_push, infer=lambda h, v, **kw: v, stateful=True))
register(OpDef("StackPopV2", kernel=_stack_pop, stateful=True,
               infer=lambda h, *, elem_type, shape: TensorType(elem_type, shape)))
not_differentiable("StackV2", "StackPushV2", "StackPopV2")
# As in TF 1: no gradient flows through arbitrary Python (None, not an error).
not_differentiable("PyFunc", "PyFuncStateless")
