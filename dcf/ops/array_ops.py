"""Array ops: shapes, reshaping, joining and splitting, indexing, gathers and scatters, fills.

Shape-valued arguments (a reshape's shape, a fill's dims, a slice's begin and size...)
become static attrs when they are known at build time (Python values or Const
tensors) and extra op inputs otherwise; inference uses the static value where known.
In such ops an attr of None means "the next dynamic input holds it".
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dcf import dtypes
from dcf.errors import InvalidArgumentError
from dcf.graph import Tensor, TensorType
from dcf.ops.gpu_kernels import concat_gpu, split_gpu
from dcf.ops.registry import (
    OpDef,
    RegisterGradient,
    _holds_tensor,
    apply,
    as_value,
    binary_infer,
    broadcast_shape,
    constant_value,
    convert_to_tensor,
    not_differentiable,
    register,
)

__all__ = [
    "broadcast_gradient_args",
    "broadcast_to",
    "concat",
    "expand_dims",
    "eye",
    "fill",
    "gather",
    "gather_nd",
    "invert_permutation",
    "one_hot",
    "ones",
    "ones_like",
    "pad",
    "rank",
    "reshape",
    "scatter_nd",
    "select",
    "shape",
    "size",
    "slice",
    "split",
    "squeeze",
    "stack",
    "strided_slice",
    "tile",
    "transpose",
    "unsorted_segment_sum",
    "unstack",
    "where",
    "zeros",
    "zeros_like",
]

_pyslice = builtins.slice  # `slice` below is the dcf op
_pyrange = builtins.range


# ------------------------------------------------------------------ helpers
def _s(out: Any) -> Any:
    """0-d results travel as numpy scalars."""
    return out[()] if out.ndim == 0 else out


def _binds(kernel: Any) -> Any:
    """Decorator: `binder(xp, **attrs)` specialises `kernel` for one node's attrs (see
    DeviceResources.bind_kernel); it returns None where it has no special case."""

    def deco(binder: Any) -> Any:
        kernel.bind = binder
        return binder

    return deco


def _has_dyn(key: tuple) -> bool:
    return any(type(k) is Dyn or (type(k) is _pyslice and Dyn in (type(k.start), type(k.stop),
                                                                   type(k.step)))
               for k in key)


def _is_tensorlike(x: Any) -> bool:
    return isinstance(x, Tensor) or hasattr(x, "_as_tensor")


def _known(shape: tuple | None) -> bool:
    return shape is not None and all(d is not None for d in shape)


def _prod(dims: Any) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _norm_axis(axis: int, rank: int | None, extra: int = 0) -> int:
    """`axis` in [0, rank + extra); negative counts from the end. Unknown rank: unchanged."""
    if rank is None:
        return axis
    n = rank + extra
    if not -n <= axis < n:
        raise InvalidArgumentError(f"axis {axis} is out of range for a tensor of rank {rank}")
    return axis % n


def _check_int(t: TensorType, what: str) -> None:
    if not t.dtype.is_integer:
        raise TypeError(f"{what} must be int32 or int64, got {t}")


def _vec_len(t: TensorType, what: str) -> int | None:
    _check_int(t, what)
    if t.shape is None:
        return None
    if len(t.shape) != 1:
        raise InvalidArgumentError(f"{what} must be a vector, got {t}")
    return t.shape[0]


def _dyn_shape(t: TensorType, hint: tuple | None, what: str = "shape") -> tuple | None:
    """The static shape an op gets from a dynamic shape input: the build-time hint, else
    one unknown dimension per entry of the vector."""
    n = _vec_len(t, what)
    if hint is not None:
        return tuple(hint)
    return None if n is None else (None,) * n


def _check_sizes(sizes: Any, what: str) -> None:
    """Static sizes (dimensions, multiples, a depth) must not be negative."""
    if any(d < 0 for d in sizes):
        raise InvalidArgumentError(f"negative {what} in {list(sizes)}")


def _check_rank(x: Any, n: int, what: str) -> None:
    """A run-time check that a value has one entry of `what` per axis (numpy would
    broadcast or ignore the extra ones, giving a value of another rank than inferred)."""
    if n != x.ndim:
        raise InvalidArgumentError(
            f"{what} has {n} entries for a value of rank {x.ndim} (shape {list(x.shape)})")


def _check_scalar_int(t: TensorType, what: str) -> None:
    _check_int(t, what)
    if t.shape not in (None, ()):
        raise InvalidArgumentError(f"{what} must be a scalar, got {t}")


def _fill_dyn(dyn: tuple, *statics: Any) -> list:
    """Static attr values, each None replaced by the next dynamic input."""
    it = iter(dyn)
    return [next(it) if s is None else s for s in statics]


def _ints(v: Any) -> tuple:
    """Host tuple of ints from a shape-like runtime value."""
    return tuple(v.tolist()) if hasattr(v, "tolist") else tuple(v)


def _const(value: Any, dtype: dtypes.DType, graph: Any = None,
           name: str | None = None) -> Tensor:
    return apply("Const", [], name, graph=graph, value=as_value(value, dtype), dtype=dtype)


def _graph_of(*xs: Any) -> Any:
    """The graph of the first tensor among xs (None: the default graph)."""
    return next((x.graph for x in xs if isinstance(x, Tensor)), None)


def _static_axis(axis: Any, what: str = "axis") -> int:
    v = _int_value(axis)
    if v is None:
        raise TypeError(f"{what} must be known when the graph is built, got {axis!r}")
    return v


def _static_axes(axes: Any, what: str = "axis") -> tuple:
    """A build-time int or list of ints (axes, a permutation) as a tuple of ints. A float
    or bool is a TypeError, as in TF: int() made axis=1.7 axis 1 and True axis 1."""
    arr = np.asarray(axes)
    items = axes if isinstance(axes, (list, tuple)) else [axes]    # ([0, True] is ints)
    if arr.size and (arr.dtype.kind not in "iu" or
                     any(isinstance(a, (bool, np.bool_)) for a in items)):
        raise TypeError(f"{what} must be an int or a list of ints, got {axes!r}")
    return tuple(int(a) for a in arr.reshape(-1))


# integer scalar arithmetic _known_value folds (shape(x)[1] * shape(x)[2], as TF's shape
# inference does)
_FOLDED = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


def _known_value(t: Any) -> Any:
    """constant_value, also seeing through ``shape(x)[k]`` where x's dim k is static (and
    through any int vector _shape_hint knows entry k of), and folding +, -, * of two
    such int scalars."""
    v = constant_value(t)
    if v is not None or not isinstance(t, Tensor):
        return v
    op = t.op
    if op.type == "StridedSlice" and len(op.inputs) == 1:
        key = op.attrs["key"]
        if len(key) == 1 and type(key[0]) is int and op.inputs[0].dtype.is_integer:
            src = _shape_hint(op.inputs[0])
            if src is not None and -len(src) <= key[0] < len(src):
                d = src[key[0]]
                return None if d is None else np.asarray(d, dtype=t.dtype.np)
    elif op.type in _FOLDED and t.dtype.is_integer and t.shape == ():
        a, b = (_known_value(i) for i in op.inputs)
        if a is not None and b is not None:
            return _FOLDED[op.type](a, b, dtype=t.dtype.np)
    return None


def _shape_hint(t: Tensor) -> tuple | None:
    """What is known at build time of int vector `t` (a shape, multiples, begin...): a
    tuple of its entries, None for those known only at run time; None when its length is
    unknown. Sees through Shape (x's static dims), Pack, ConcatV2, Cast, Identity and
    slices ``v[a:b:c]`` of such vectors, as TF's constant_value_as_shape."""
    v = _known_value(t)
    if v is not None:
        v = np.asarray(v)
        return tuple(int(x) for x in v) if v.ndim == 1 else None
    op = t.op
    if op.type == "Shape":
        return op.inputs[0].shape
    if op.type in ("Cast", "Identity") and op.inputs[0].dtype.is_integer:
        return _shape_hint(op.inputs[0])
    if op.type == "Pack" and t.shape is not None and len(t.shape) == 1:
        vals = [_known_value(i) for i in op.inputs]
        return tuple(None if x is None else int(x) for x in vals)
    if op.type == "ConcatV2" and t.shape is not None and len(t.shape) == 1:
        parts = [_shape_hint(i) for i in op.inputs]
        if all(p is not None for p in parts):
            return tuple(d for p in parts for d in p)
    if op.type == "StridedSlice" and len(op.inputs) == 1:
        key = op.attrs["key"]
        if len(key) == 1 and type(key[0]) is _pyslice:
            src = _shape_hint(op.inputs[0])
            if src is not None:
                return src[key[0]]
    if t.shape is not None and len(t.shape) == 1 and t.shape[0] is not None:
        return (None,) * t.shape[0]
    return None


def _int_value(v: Any) -> int | None:
    """A build-time int, or None when `v` is a tensor of unknown value."""
    if _is_tensorlike(v):
        v = _known_value(v)
        if v is None:
            return None
    arr = np.asarray(v)
    if arr.ndim != 0 or arr.dtype.kind not in "iu":
        raise TypeError(f"expected an integer scalar, got {v!r}")
    return int(arr)


def _int_arg(v: Any, what: str) -> tuple[int | None, Tensor | None]:
    """(static int, None) when known at build time, else (None, scalar int tensor)."""
    s = _int_value(v)
    if s is not None:
        return s, None
    t = convert_to_tensor(v)
    if not t.dtype.is_integer or t.shape not in (None, ()):
        raise TypeError(f"{what} must be an integer scalar, got {t}")
    return None, t


def _shape_arg(value: Any) -> tuple[tuple | None, tuple | None, Tensor | None]:
    """(static dims, None, None) when `value` is known at build time, else
    (None, partial dims for inference, int vector tensor). A scalar n means [n]."""
    if _is_tensorlike(value):
        v = _known_value(value)
        if v is None:
            t = convert_to_tensor(value)
            if t.shape == ():
                return None, (None,), stack([t])
            hint = _shape_hint(t) if t.dtype.is_integer else None
            if hint is not None:
                hint = tuple(None if d is None or d < 0 else d for d in hint)
            return None, hint, t
        value = v
    elif isinstance(value, (list, tuple)) and any(_is_tensorlike(e) for e in value):
        vals = [_int_value(e) for e in value]
        if any(v is None for v in vals):
            hint = tuple(None if v is None or v < 0 else v for v in vals)
            parts = [convert_to_tensor(e) if v is None else v for e, v in zip(value, vals)]
            parts = [_cast_int32(p) if isinstance(p, Tensor) else p for p in parts]
            return None, hint, stack(parts)
        value = vals
    arr = np.asarray(value)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TypeError(f"a shape must be a list of ints, got {value!r}")
    return tuple(int(d) for d in arr), None, None


def _cast_int32(t: Tensor) -> Tensor:
    if t.dtype is dtypes.int32:
        return t
    return apply("Cast", [t], dtype=dtypes.int32)


def _shape_of(x: Tensor) -> Any:
    """x's shape: a static tuple when fully known, else a Shape tensor."""
    return x.shape if _known(x.shape) else shape(x)


def _merge_dims(a: int | None, b: int | None, what: str) -> int | None:
    if a is None:
        return b
    if b is not None and a != b:
        raise InvalidArgumentError(f"{what}: {a} vs {b}")
    return a


def _gradient(op_type: str):
    """RegisterGradient for single-output ops: no incoming gradient gives none, and the
    trailing inputs the function leaves out (shape/axis/index inputs) get None."""

    def deco(fn):
        def grad(op, g):
            if g is None:
                return [None] * len(op.inputs)
            out = list(fn(op, g))
            return out + [None] * (len(op.inputs) - len(out))

        grad.__name__, grad.__doc__ = fn.__name__, fn.__doc__
        RegisterGradient(op_type)(grad)
        return fn

    return deco


# ----------------------------------------------------------- shape, size, rank
def _shape_infer(x: TensorType, *, out_type: dtypes.DType) -> TensorType:
    return TensorType(out_type, (x.rank,))


def _size_infer(x: TensorType, *, out_type: dtypes.DType) -> TensorType:
    return TensorType(out_type, ())


register(
    OpDef(
        "Shape",
        infer=_shape_infer,
        kernel=lambda xp, x, *, out_type: xp.asarray(x.shape, dtype=out_type.np),
    )
)
register(
    OpDef("Size", infer=_size_infer, kernel=lambda xp, x, *, out_type: out_type.np.type(x.size))
)
register(
    OpDef("Rank", infer=_size_infer, kernel=lambda xp, x, *, out_type: out_type.np.type(x.ndim))
)
not_differentiable("Shape", "Size", "Rank")


def shape(input: Any, name: str | None = None, out_type: Any = dtypes.int32) -> Tensor:
    """``np.array(input.shape)``: the runtime shape as an int vector.

    A Const when the static shape is fully known (as TensorFlow does).
    """
    x, dt = convert_to_tensor(input), dtypes.as_dtype(out_type)
    if _known(x.shape):
        return _const(np.array(x.shape, dtype=dt.np).reshape(-1), dt, x.graph, name)
    return apply("Shape", [x], name, out_type=dt)


def size(input: Any, name: str | None = None, out_type: Any = dtypes.int32) -> Tensor:
    """``input.size``: the number of elements, a scalar (a Const when statically known)."""
    x, dt = convert_to_tensor(input), dtypes.as_dtype(out_type)
    if _known(x.shape):
        return _const(_prod(x.shape), dt, x.graph, name)
    return apply("Size", [x], name, out_type=dt)


def rank(input: Any, name: str | None = None) -> Tensor:
    """``input.ndim``: the number of dimensions, a scalar int32 (a Const when known)."""
    x = convert_to_tensor(input)
    if x.shape is not None:
        return _const(len(x.shape), dtypes.int32, x.graph, name)
    return apply("Rank", [x], name, out_type=dtypes.int32)


# --------------------------------------------------------------------- reshape
def _reshape_infer(
    x: TensorType, *dyn: TensorType, shape: tuple | None, hint: tuple | None = None
) -> TensorType:
    if shape is None:
        return TensorType(x.dtype, _dyn_shape(dyn[0], hint))
    if builtins.sum(d == -1 for d in shape) > 1 or any(d < -1 for d in shape):
        raise InvalidArgumentError(
            f"bad target shape {list(shape)}: at most one -1 and no other negative sizes"
        )
    total = _prod(x.shape) if _known(x.shape) else None
    known = _prod(d for d in shape if d != -1)
    if -1 in shape and total == 0 and known == 0:
        return TensorType(x.dtype, _empty_target(x.shape, shape))
    if -1 in shape:
        if total is not None and (known == 0 or total % known):
            raise InvalidArgumentError(
                f"cannot reshape {x} ({total} elements) into "
                f"{list(shape)}: {total} is not a multiple of {known}"
            )
        fill_ = None if total is None else total // known
        return TensorType(x.dtype, tuple(fill_ if d == -1 else d for d in shape))
    if total is not None and total != known:
        raise InvalidArgumentError(
            f"cannot reshape {x} ({total} elements) into {list(shape)} ({known} elements)"
        )
    return TensorType(x.dtype, tuple(shape))


def _empty_target(in_shape: tuple, shape: tuple) -> tuple:
    """TF's -1 of a reshape of no elements into a shape with a 0 in it, where numpy's
    "0 is not a multiple of 0" raises: the product of the input's nonzero dimensions
    divided by that of the target's (a [0, 3, 4] batch into [0, -1] is [0, 12])."""
    nonzero = _prod(d for d in in_shape if d)
    known = _prod(d for d in shape if d > 0)
    return tuple(nonzero // known if d == -1 else d for d in shape)


def _reshape_to(x, shape):
    try:
        return x.reshape(shape)
    except ValueError:
        if x.size or 0 not in shape or -1 not in shape:
            raise
        return x.reshape(_empty_target(x.shape, tuple(shape)))


def _reshape(xp, x, *dyn, shape, hint=None):
    # the method skips np.reshape's Python-level dispatch (~1 us of a ~1.4 us call)
    out = _reshape_to(x, shape if shape is not None else _ints(dyn[0]))
    return out[()] if out.ndim == 0 else out


@_binds(_reshape)
def _bind_reshape(xp, *, shape, hint=None):
    if shape is None:
        return None
    shape = tuple(shape)
    if not shape:
        generic = np.generic

        def reshape_to_scalar(x):
            if isinstance(x, generic):
                return x  # already a scalar
            return x.reshape(())[()]

        return reshape_to_scalar

    def reshape(x):
        try:
            return x.reshape(shape)
        except ValueError:   # no elements into a shape with a 0 and a -1
            return _reshape_to(x, shape)

    return reshape


register(OpDef("Reshape", infer=_reshape_infer, kernel=_reshape))


@_gradient("Reshape")
def _reshape_grad(op, g):
    return [reshape(g, _shape_of(op.inputs[0]))]


def reshape(tensor: Any, shape: Any, name: str | None = None) -> Tensor:
    """``np.reshape(tensor, shape)``; one entry of `shape` may be -1 (inferred).

    `shape` is a list of ints, an int vector tensor, or a list mixing ints and scalar
    int tensors. Raises InvalidArgumentError when the element counts differ.
    """
    static, hint, dyn = _shape_arg(shape)
    if dyn is None:
        return apply("Reshape", [tensor], name, shape=static)
    return apply("Reshape", [tensor, dyn], name, shape=None, hint=hint)


# ------------------------------------------------------------------- transpose
def _transpose_infer(x: TensorType, *dyn: TensorType, perm: tuple | None) -> TensorType:
    if dyn:
        n = _vec_len(dyn[0], "perm")
        r = x.rank if x.rank is not None else n
        return TensorType(x.dtype, None if r is None else (None,) * r)
    if x.shape is None:
        return TensorType(x.dtype, None if perm is None else (None,) * len(perm))
    if perm is None:
        return TensorType(x.dtype, tuple(reversed(x.shape)))
    if sorted(perm) != list(_pyrange(len(x.shape))):
        raise InvalidArgumentError(
            f"perm {list(perm)} is not a permutation of the {x.rank} axes of {x}"
        )
    return TensorType(x.dtype, tuple(x.shape[p] for p in perm))


def _transpose(xp, x, *dyn, perm):
    return _s(x.transpose(_ints(dyn[0]) if dyn else perm))  # the method: no dispatch cost


register(OpDef("Transpose", infer=_transpose_infer, kernel=_transpose))


def _invert_perm_infer(p: TensorType) -> TensorType:
    _vec_len(p, "perm")
    return p


def _invert_perm(xp, p):
    out = xp.empty_like(p)
    out[p] = xp.arange(len(p), dtype=p.dtype)
    return out


register(OpDef("InvertPermutation", infer=_invert_perm_infer, kernel=_invert_perm))
not_differentiable("InvertPermutation")


@_gradient("Transpose")
def _transpose_grad(op, g):
    if len(op.inputs) > 1:
        return [transpose(g, invert_permutation(op.inputs[1]))]
    perm = op.attrs["perm"]
    return [transpose(g, None if perm is None else [int(i) for i in np.argsort(perm)])]


def transpose(a: Any, perm: Any = None, name: str | None = None) -> Tensor:
    """``np.transpose(a, perm)``; perm=None reverses the axes."""
    if perm is not None and _is_tensorlike(perm) and constant_value(perm) is None:
        return apply("Transpose", [a, perm], name, perm=None)
    if perm is not None:
        perm = _static_axes(constant_value(perm) if _is_tensorlike(perm) else perm, "perm")
    return apply("Transpose", [a], name, perm=perm)


def invert_permutation(x: Any, name: str | None = None) -> Tensor:
    """``np.argsort(x)`` for a permutation vector x."""
    return apply("InvertPermutation", [x], name)


# ------------------------------------------------------- expand_dims, squeeze
def _expand_dims_infer(x: TensorType, *, axis: int) -> TensorType:
    if x.shape is None:
        return x
    a = _norm_axis(axis, x.rank, extra=1)
    return TensorType(x.dtype, x.shape[:a] + (1,) + x.shape[a:])


register(
    OpDef(
        "ExpandDims",
        infer=_expand_dims_infer,
        kernel=lambda xp, x, *, axis: xp.expand_dims(x, axis),
    )
)


def _squeeze_infer(x: TensorType, *, axis: tuple | None) -> TensorType:
    if x.shape is None:
        return x
    if axis is None:
        if None in x.shape:
            return TensorType(x.dtype, None)
        return TensorType(x.dtype, tuple(d for d in x.shape if d != 1))
    axes = {_norm_axis(a, x.rank) for a in axis}
    for a in sorted(axes):
        if x.shape[a] not in (1, None):
            raise InvalidArgumentError(f"cannot squeeze axis {a} of {x}: its size is not 1")
    return TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))


register(
    OpDef("Squeeze", infer=_squeeze_infer, kernel=lambda xp, x, *, axis: _s(x.squeeze(axis=axis)))
)


@_gradient("ExpandDims")
def _expand_dims_grad(op, g):
    return [reshape(g, _shape_of(op.inputs[0]))]


_gradient("Squeeze")(_expand_dims_grad)


def expand_dims(input: Any, axis: int, name: str | None = None) -> Tensor:
    """``np.expand_dims(input, axis)``: insert a size-1 axis at `axis` (-1: at the end)."""
    return apply("ExpandDims", [input], name, axis=_static_axis(axis))


def squeeze(input: Any, axis: Any = None, name: str | None = None) -> Tensor:
    """``np.squeeze(input, axis)``: drop size-1 axes (all of them when axis is None)."""
    if axis is not None:
        axis = _static_axes(axis)
    return apply("Squeeze", [input], name, axis=axis)


# ------------------------------------------------------------ concat and stack
def _same_dtype(types: tuple, what: str) -> dtypes.DType:
    if not types:
        raise InvalidArgumentError(f"{what} needs at least one input")
    dt = types[0].dtype
    for i, t in enumerate(types):
        if t.dtype is not dt:
            raise TypeError(f"inputs differ in dtype: input 0 is {types[0]}, input {i} is {t}")
    return dt


def _concat_infer(*xs: TensorType, axis: int) -> TensorType:
    dt = _same_dtype(xs, "concat")
    known = [x for x in xs if x.shape is not None]
    if not known:
        return TensorType(dt, None)
    r = known[0].rank
    if r == 0:
        raise InvalidArgumentError("cannot concatenate scalars; use dcf.stack")
    a = _norm_axis(axis, r)
    out: list = list(known[0].shape or ())
    out[a] = 0
    for x in xs:
        if x.shape is None:
            out[a] = None
            continue
        if x.rank != r:
            raise InvalidArgumentError(f"inputs differ in rank: {known[0]} vs {x}")
        for i, d in enumerate(x.shape):
            if i == a:
                out[a] = None if out[a] is None or d is None else out[a] + d
            else:
                out[i] = _merge_dims(
                    out[i], d, f"inputs differ in dimension {i} (other than axis {a})"
                )
    return TensorType(dt, tuple(out))


def _concat(xp, *xs, axis):
    return xp.concatenate(xs, axis=axis)


@_binds(_concat)
def _bind_concat(xp, *, axis):
    concatenate = xp.concatenate

    def concat(*xs):
        return concatenate(xs, axis=axis)

    return concat


register(OpDef("ConcatV2", infer=_concat_infer, kernel=_concat, gpu_kernel=concat_gpu(_concat)))


@_gradient("ConcatV2")
def _concat_grad(op, g):
    if len(op.inputs) == 1:
        return [g]
    axis = op.attrs["axis"]
    sizes = [
        x.shape[axis] if x.shape is not None and x.shape[axis] is not None else shape(x)[axis]
        for x in op.inputs
    ]
    return list(split(g, sizes, axis=axis))


def concat(values: Any, axis: int, name: str | None = None) -> Tensor:
    """``np.concatenate(values, axis)``: join tensors along an existing axis."""
    values = list(values)
    first = next((convert_to_tensor(v) for v in values if _is_tensorlike(v)), None)
    if first is not None:
        values = [v if _is_tensorlike(v) else _const(v, first.dtype, first.graph) for v in values]
    return apply("ConcatV2", values, name, axis=_static_axis(axis))


def _pack_infer(*xs: TensorType, axis: int) -> TensorType:
    dt = _same_dtype(xs, "stack")
    shp: tuple | None = None
    for x in xs:
        if x.shape is None:
            continue
        if shp is None:
            shp = x.shape
        elif len(shp) != x.rank:
            raise InvalidArgumentError(f"inputs differ in shape: {xs[0]} vs {x}")
        else:
            shp = tuple(_merge_dims(a, b, "inputs differ in shape") for a, b in zip(shp, x.shape))
    if shp is None:
        return TensorType(dt, None)
    a = _norm_axis(axis, len(shp), extra=1)
    return TensorType(dt, shp[:a] + (len(xs),) + shp[a:])


register(OpDef("Pack", infer=_pack_infer, kernel=lambda xp, *xs, axis: xp.stack(xs, axis=axis)))


@_gradient("Pack")
def _pack_grad(op, g):
    return list(unstack(g, num=len(op.inputs), axis=op.attrs["axis"]))


def stack(values: Any, axis: int = 0, name: str | None = None) -> Tensor:
    """``np.stack(values, axis)``: join same-shaped tensors along a new axis."""
    # a list holding tensors, as TF1: packed first (stack([[n, 0], [1, 1]]))
    values = [convert_to_tensor(v) if isinstance(v, (list, tuple)) and _holds_tensor(v)
              else v for v in values]
    if not any(_is_tensorlike(v) for v in values):
        packed = np.stack([np.asarray(v) for v in values], axis=axis)
        if not any(isinstance(v, (np.ndarray, np.generic)) for v in values):
            # Python numbers: int32 / float32 as dcf.constant gives them (numpy: 64 bits)
            packed = packed.astype(dtypes.infer_dtype(values).np)
        return convert_to_tensor(packed)
    first = next(v for v in values if _is_tensorlike(v))
    dt = convert_to_tensor(first).dtype
    values = [
        v if _is_tensorlike(v) else _const(v, dt, convert_to_tensor(first).graph) for v in values
    ]
    return apply("Pack", values, name, axis=_static_axis(axis))


def _unpack_infer(x: TensorType, *, num: int, axis: int) -> list[TensorType]:
    if x.shape is None:
        return [TensorType(x.dtype, None)] * num
    a = _norm_axis(axis, x.rank)
    if x.shape[a] is not None and x.shape[a] != num:
        raise InvalidArgumentError(f"num={num} but axis {a} of {x} has size {x.shape[a]}")
    return [TensorType(x.dtype, x.shape[:a] + x.shape[a + 1 :])] * num


def _unpack(xp, x, *, num, axis):
    if x.shape[axis] != num:
        raise InvalidArgumentError(
            f"expected {num} slices along axis {axis}, the value has shape {list(x.shape)}"
        )
    out = tuple(x) if axis == 0 else tuple(xp.moveaxis(x, axis, 0))
    return out[0] if num == 1 else out  # the executor wraps single outputs itself


register(OpDef("Unpack", infer=_unpack_infer, kernel=_unpack))


def _zeros_for_none(grads: tuple, outputs: list) -> list:
    return [zeros_like(o) if gi is None else gi for gi, o in zip(grads, outputs)]


@RegisterGradient("Unpack")
def _unpack_grad(op, *grads):
    if all(gi is None for gi in grads):
        return [None]
    return [stack(_zeros_for_none(grads, op.outputs), axis=op.attrs["axis"])]


def unstack(value: Any, num: int | None = None, axis: int = 0, name: str | None = None) -> list:
    """``list(np.moveaxis(value, axis, 0))``: split along `axis` into a list of `num` tensors
    (a list, as TF's, so `unstack(x) + [y]` works).

    `num` defaults to the static size of that axis; ValueError when it is unknown.
    """
    x = convert_to_tensor(value)
    axis = _static_axis(axis)
    if num is None:
        if x.shape is None or x.shape[_norm_axis(axis, x.type.rank)] is None:
            raise ValueError(f"unstack: cannot infer num from the shape of {x!r}; pass num=")
        num = x.shape[_norm_axis(axis, x.type.rank)]
    return list(apply("Unpack", [x], name, num=int(num), axis=int(axis)))


# ------------------------------------------------------------------------ split
def _split_infer(
    x: TensorType, *dyn: TensorType, sizes: tuple | None, num: int, axis: int
) -> list[TensorType]:
    if sizes is None and not dyn and num < 1:
        raise InvalidArgumentError(f"cannot split into {num} parts; pass a number >= 1")
    if sizes is not None and any(s < -1 for s in sizes):
        raise InvalidArgumentError(
            f"size_splits {list(sizes)} hold a negative size (only one -1, for the rest)")
    if x.shape is None:
        return [TensorType(x.dtype, None)] * num
    a = _norm_axis(axis, x.rank)
    d = x.shape[a]
    if sizes is None:
        if dyn:
            _vec_len(dyn[0], "size_splits")
            outs: list = [None] * num
        else:
            if d is not None and d % num:
                raise InvalidArgumentError(
                    f"axis {a} of {x} (size {d}) does not split into {num} equal parts"
                )
            outs = [None if d is None else d // num] * num
    else:
        known = builtins.sum(s for s in sizes if s != -1)
        if sizes.count(-1) > 1 or (d is not None and (known > d if -1 in sizes else known != d)):
            raise InvalidArgumentError(
                f"size_splits {list(sizes)} do not add up to {d}, the size of axis {a} of {x}"
            )
        outs = [(None if d is None else d - known) if s == -1 else s for s in sizes]
    return [TensorType(x.dtype, x.shape[:a] + (s,) + x.shape[a + 1 :]) for s in outs]


def _split(xp, x, *dyn, sizes, num, axis):
    if sizes is None and not dyn:
        out = tuple(xp.split(x, num, axis=axis))
        return out[0] if num == 1 else out  # the executor wraps single outputs itself
    given = list(sizes if sizes is not None else _ints(dyn[0]))
    sizes = list(given)
    if -1 in sizes:
        sizes[sizes.index(-1)] = x.shape[axis] - (builtins.sum(sizes) + 1)
    if len(sizes) != num or builtins.sum(sizes) != x.shape[axis] or min(sizes) < 0:
        raise InvalidArgumentError(     # (the sizes as given: [-1, -1] is not [5, -1])
            f"size_splits {given} do not add up to {x.shape[axis]}, "
            f"the size of axis {axis} of a value of shape "
            f"{list(x.shape)}"
        )
    cuts, acc = [], 0
    for s in sizes[:-1]:
        acc += s
        cuts.append(acc)
    out = tuple(xp.split(x, cuts, axis=axis))
    return out[0] if num == 1 else out


@_binds(_split)
def _bind_split(xp, *, sizes, num, axis):
    if sizes is None or -1 in sizes or len(sizes) != num or min(sizes) < 0:
        return None  # the generic kernel resolves or reports these
    total, keys, at = builtins.sum(sizes), [], 0
    for n in sizes:
        keys.append((_pyslice(None),) * axis + (_pyslice(at, at + n),) if axis >= 0 else
                    (Ellipsis, _pyslice(at, at + n)) + (_pyslice(None),) * (-axis - 1))
        at += n
    keys = tuple(keys)  # np.split's pieces are these same views

    def split(x):
        if x.shape[axis] != total:
            return _split(xp, x, sizes=sizes, num=num, axis=axis)  # raises
        if num == 1:
            return x[keys[0]]
        return tuple([x[k] for k in keys])

    return split


register(OpDef("SplitV", infer=_split_infer, kernel=_split, gpu_kernel=split_gpu(_split)))


@RegisterGradient("SplitV")
def _split_grad(op, *grads):
    if all(gi is None for gi in grads):
        return [None] * len(op.inputs)
    return [concat(_zeros_for_none(grads, op.outputs), axis=op.attrs["axis"])] + [None] * (
        len(op.inputs) - 1
    )


def split(
    value: Any,
    num_or_size_splits: Any,
    axis: int = 0,
    num: int | None = None,
    name: str | None = None,
) -> list:
    """``np.split(value, n, axis)`` for an int n (equal parts), or cut `value` along `axis`
    into pieces of the given sizes (one size may be -1). Returns a list of tensors (as TF
    and numpy do)."""
    axis = _static_axis(axis)
    if _is_tensorlike(num_or_size_splits):
        v = constant_value(num_or_size_splits)
        if v is not None and np.ndim(v) == 0:
            num_or_size_splits = int(v)
    if isinstance(num_or_size_splits, (int, np.integer)):
        return list(apply("SplitV", [value], name, sizes=None, num=int(num_or_size_splits),
                          axis=axis))
    static, _, dyn = _shape_arg(num_or_size_splits)
    if dyn is None:
        assert static is not None
        return list(apply("SplitV", [value], name, sizes=static, num=len(static), axis=axis))
    n = num if num is not None else dyn.shape[0] if dyn.shape else None
    if n is None:
        raise ValueError("split: cannot infer the number of pieces from size_splits; pass num=")
    return list(apply("SplitV", [value, dyn], name, sizes=None, num=int(n), axis=axis))


# ------------------------------------------------------------------ slice, pad
def _slice_infer(
    x: TensorType, *dyn: TensorType, begin: tuple | None, size: tuple | None,
    size_hint: tuple | None = None, begin_hint: tuple | None = None
) -> TensorType:
    b, s = _fill_dyn(dyn, begin, size)
    n = [
        len(v) if isinstance(v, tuple) else _vec_len(v, what)
        for v, what in ((b, "begin"), (s, "size"))
    ]
    r = x.rank if x.rank is not None else n[0] if n[0] is not None else n[1]
    for m, what in zip(n, ("begin", "size")):
        if m is not None and r is not None and m != r:
            raise InvalidArgumentError(f"{what} has {m} entries for a tensor of rank {r}")
    if r is None:
        return TensorType(x.dtype, None)
    if not isinstance(s, tuple):
        # the sizes known at build time, as TF1 (slice(g, begin, shape(x)): x's dims)
        if size_hint is not None and len(size_hint) == r:
            return TensorType(x.dtype, tuple(size_hint))
        return TensorType(x.dtype, (None,) * r)
    dims = x.shape or (None,) * r
    out = []
    if not isinstance(b, tuple) and begin_hint is not None and len(begin_hint) == r:
        b = tuple(begin_hint)   # the begins known at build time (x[:, t] keeps x's others)
    for i in _pyrange(r):
        bi = b[i] if isinstance(b, tuple) else None
        d, si = dims[i], s[i]
        bad = si < -1 or (bi is not None and bi < 0)
        if bi is not None and d is not None:
            bad = bad or bi > d or (si != -1 and bi + si > d)
        if bad:
            shown = "?" if bi is None else bi
            raise InvalidArgumentError(
                f"slice begin {shown} size {si} is out of range for dimension {i} of {x}"
            )
        if si == -1:
            out.append(None if bi is None or d is None else d - bi)
        else:
            out.append(si)
    return TensorType(x.dtype, tuple(out))


def _slice(xp, x, *dyn, begin, size, size_hint=None, begin_hint=None):
    begin, size = (_ints(v) for v in _fill_dyn(dyn, begin, size))
    _check_rank(x, len(begin), "begin")
    _check_rank(x, len(size), "size")
    key = []
    for i, (b, s, d) in enumerate(zip(begin, size, x.shape)):
        e = d if s == -1 else b + s
        if b < 0 or s < -1 or e > d:
            raise InvalidArgumentError(
                f"slice begin {b} size {s} is out of range for "
                f"dimension {i} of a value of shape {list(x.shape)}"
            )
        key.append(_pyslice(b, e))
    return _s(x[tuple(key)])


register(OpDef("Slice", infer=_slice_infer, kernel=_slice))


@_gradient("Slice")
def _slice_grad(op, g):
    x, y = op.inputs[0], op.outputs[0]
    begin = op.attrs["begin"] if op.attrs["begin"] is not None else op.inputs[1]
    if isinstance(begin, tuple) and _known(x.shape) and _known(y.shape):
        pads = [[b, d - b - s] for b, d, s in zip(begin, x.shape, y.shape)]
        return [pad(g, pads)]
    size = op.attrs["size"]
    if isinstance(begin, tuple) and size is not None:
        # x's dims known at build time stay in the gradient's static shape, as in TF1
        key = tuple(_pyslice(b, None if s == -1 else b + s) for b, s in zip(begin, size))
        return [apply("StridedSliceGrad", [g, shape(x)], key=key, shape=None, hint=x.shape)]
    b = _cast_int32(begin) if isinstance(begin, Tensor) else _const(begin, dtypes.int32, x.graph)
    after = shape(x) - b - shape(y)
    return [pad(g, stack([b, after], axis=1))]


def slice(input_: Any, begin: Any, size: Any, name: str | None = None) -> Tensor:
    """``input_[b0:b0+s0, b1:b1+s1, ...]``; a size of -1 takes the rest of that axis."""
    b_static, b_hint, b_dyn = _shape_arg(begin)
    s_static, s_hint, s_dyn = _shape_arg(size)
    dyn = [t for t in (b_dyn, s_dyn) if t is not None]
    hints = {k: v for k, v in (("begin_hint", b_hint), ("size_hint", s_hint)) if v is not None}
    return apply("Slice", [input_, *dyn], name, begin=b_static, size=s_static, **hints)


def _hinted_shape(x: TensorType, r: int | None, hint: tuple | None,
                  combine: Callable[[int, Any], int | None]) -> TensorType:
    """The result of an op on `x` whose per-axis argument is a tensor, of rank `r` (None:
    unknown): where `hint` gives that argument's build-time entries, one per axis, each
    axis is `combine(x's dim, entry)` (None where x's dim is unknown); else unknown dims."""
    if r is None:
        return TensorType(x.dtype, None)
    if hint is None or len(hint) != r:
        return TensorType(x.dtype, (None,) * r)
    dims = x.shape or (None,) * r
    return TensorType(x.dtype, tuple(None if d is None else combine(d, h)
                                     for d, h in zip(dims, hint)))


def _pad_infer(
    x: TensorType, *dyn: TensorType, paddings: tuple | None, constant_values: Any,
    hint: tuple | None = None
) -> TensorType:
    if paddings is None:
        p = dyn[0]
        _check_int(p, "paddings")
        if p.shape is not None and (len(p.shape) != 2 or p.shape[1] not in (2, None)):
            raise InvalidArgumentError(f"paddings must have shape [rank, 2], got {p}")
        r = x.rank if x.rank is not None else p.shape[0] if p.shape else None
        # the rows known at build time (hint), as TF1: pad(x, [[0, n], [0, 0]]) of a
        # [?, 5] is [?, 5]
        return _hinted_shape(x, r, hint,
                             lambda d, ab: None if None in ab else d + ab[0] + ab[1])
    if x.shape is not None and len(paddings) != x.rank:
        raise InvalidArgumentError(f"paddings has {len(paddings)} rows for {x}")
    if any(a < 0 or b < 0 for a, b in paddings):
        raise InvalidArgumentError(f"negative paddings {[list(p) for p in paddings]}")
    dims = x.shape if x.shape is not None else (None,) * len(paddings)
    return TensorType(
        x.dtype, tuple(None if d is None else d + a + b for d, (a, b) in zip(dims, paddings))
    )


def _pad(xp, x, *dyn, paddings, constant_values, hint=None):
    if paddings is None:
        paddings = [tuple(row) for row in dyn[0].tolist()]
    _check_rank(x, len(paddings), "paddings")
    shp = tuple(d + a + b for d, (a, b) in zip(x.shape, paddings))
    out = xp.full(shp, constant_values, dtype=x.dtype)
    out[tuple(_pyslice(a, a + d) for d, (a, _) in zip(x.shape, paddings))] = x
    return _s(out)


register(OpDef("Pad", infer=_pad_infer, kernel=_pad))


@_gradient("Pad")
def _pad_grad(op, g):
    x = op.inputs[0]
    p = op.attrs["paddings"]
    if p is not None and not _known(x.shape):
        # g[a0:-b0, a1:-b1, ...]: x's known dims stay in its static shape, as in TF1
        return [strided_slice(g, tuple(_pyslice(a, -b or None) for a, b in p))]
    begin = [a for a, _ in p] if p is not None else op.inputs[1][:, 0]
    return [slice(g, begin, _shape_of(x))]


def pad(
    tensor: Any,
    paddings: Any,
    mode: str = "CONSTANT",
    constant_values: Any = 0,
    name: str | None = None,
) -> Tensor:
    """``np.pad(tensor, paddings, constant_values=constant_values)``; paddings is [rank, 2]."""
    if mode.upper() != "CONSTANT":
        raise ValueError(f"pad: only mode='CONSTANT' is supported, got {mode!r}")
    if _is_tensorlike(constant_values):
        cv = constant_value(constant_values)
        if cv is None:
            raise TypeError("pad: constant_values must be known when the graph is built")
        constant_values = cv
    cv = np.asarray(constant_values)
    t_dtype = tensor.dtype if _is_tensorlike(tensor) else dtypes.infer_dtype(tensor)
    if t_dtype.np.kind in "iub" and cv.dtype.kind in "fc" and \
            (cv.imag != 0 or cv.real != np.trunc(cv.real)):
        raise TypeError(f"pad: constant_values={cv.item()!r} is not a {t_dtype} value "
                        "(it would be truncated)")
    constant_values = cv.item()  # a plain number in the attrs
    if isinstance(paddings, (list, tuple)) and _holds_tensor(paddings):
        paddings = convert_to_tensor(paddings)   # [[0, n], [0, 0]] with a tensor n, as TF1
    if _is_tensorlike(paddings) and constant_value(paddings) is None:
        p = convert_to_tensor(paddings)
        rows = [_shape_hint(r) for r in p.op.inputs] if p.op.type == "Pack" and \
            p.op.attrs["axis"] == 0 and p.dtype.is_integer else None
        hint = tuple(rows) if rows and all(r is not None and len(r) == 2 for r in rows) \
            else None
        return apply(
            "Pad", [tensor, p], name, paddings=None, constant_values=constant_values, hint=hint
        )
    arr = np.asarray(constant_value(paddings) if _is_tensorlike(paddings) else paddings)
    if arr.size == 0:
        arr = arr.reshape(0, 2)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"pad: paddings must have shape [rank, 2], got {arr.tolist()}")
    return apply(
        "Pad",
        [tensor],
        name,
        paddings=tuple(tuple(int(v) for v in r) for r in arr),
        constant_values=constant_values,
    )


# ------------------------------------------------------------- strided slices
@dataclass(frozen=True, slots=True)
class Dyn:
    """An entry of a StridedSlice key whose value is the op's dynamic input `slot` + 1."""

    slot: int

    def __repr__(self) -> str:
        return f"${self.slot}"


def _resolve_key(key: tuple, dyn: tuple) -> tuple:
    """The key with each Dyn replaced by the value of its index input."""
    out = []
    for k in key:
        if type(k) is Dyn:
            k = int(dyn[k.slot])
        elif type(k) is _pyslice and Dyn in (type(k.start), type(k.stop), type(k.step)):
            k = _pyslice(
                *(int(dyn[v.slot]) if type(v) is Dyn else v for v in (k.start, k.stop, k.step))
            )
        out.append(k)
    return tuple(out)


def _slice_len(k: Any, d: int | None) -> int | None:
    if k.start is None and k.stop is None and k.step in (None, 1):
        return d
    if d is None or any(isinstance(v, Dyn) for v in (k.start, k.stop, k.step)):
        return None
    return len(_pyrange(*k.indices(d)))


def _key_shape(key: tuple, x: TensorType) -> tuple | None:
    """Static shape of x[key] (numpy basic indexing)."""
    if key.count(Ellipsis) > 1:
        raise InvalidArgumentError("an index can only have a single ellipsis ('...')")
    used = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
    if x.shape is None:
        return None
    r = len(x.shape)
    if used > r:
        raise InvalidArgumentError(f"too many indices ({used}) for {x}")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (_pyslice(None),) * (r - used) + key[i + 1 :]
    else:
        key = key + (_pyslice(None),) * (r - used)
    out: list = []
    axis = 0
    for k in key:
        if k is None:
            out.append(1)
            continue
        d = x.shape[axis]
        if isinstance(k, _pyslice):
            out.append(_slice_len(k, d))
        elif isinstance(k, int) and d is not None and not -d <= k < d:
            raise IndexError(f"index {k} is out of range for axis {axis} of {x}")
        axis += 1
    return tuple(out)


def _strided_slice_infer(x: TensorType, *dyn: TensorType, key: tuple) -> TensorType:
    for i, t in enumerate(dyn):
        _check_scalar_int(t, f"index tensor ${i}")
    return TensorType(x.dtype, _key_shape(key, x))


def _strided_slice(xp, x, *dyn, key):
    if not dyn:
        out = x[key]
    elif len(key) == 1 and type(key[0]) is Dyn:  # fast path: x[i] inside a loop
        out = x[int(dyn[0])]
    else:
        out = x[_resolve_key(key, dyn)]
    return out[()] if out.ndim == 0 else out


@_binds(_strided_slice)
def _bind_strided_slice(xp, *, key):
    if _has_dyn(key):
        return None

    def strided_slice(x):
        out = x[key]
        return out[()] if out.ndim == 0 else out

    return strided_slice


register(OpDef("StridedSlice", infer=_strided_slice_infer, kernel=_strided_slice))


def _ssg_infer(
    dy: TensorType, *dyn: TensorType, key: tuple, shape: tuple | None, hint: tuple | None = None
) -> TensorType:
    if shape is None:
        return TensorType(dy.dtype, _dyn_shape(dyn[-1], hint))
    return TensorType(dy.dtype, tuple(shape))


def _strided_slice_grad_kernel(xp, dy, *dyn, key, shape, hint=None):
    if shape is None:
        shape, dyn = _ints(dyn[-1]), dyn[:-1]
    out = xp.zeros(shape, dtype=dy.dtype)
    out[_resolve_key(key, dyn) if dyn else key] = dy
    return _s(out)


@_binds(_strided_slice_grad_kernel)
def _bind_strided_slice_grad(xp, *, key, shape, hint=None):
    if shape is None or _has_dyn(key):
        return None
    shape = tuple(shape)
    zeros = xp.zeros

    def strided_slice_grad(dy):
        out = zeros(shape, dtype=dy.dtype)
        out[key] = dy
        return out if shape else out[()]

    return strided_slice_grad


register(OpDef("StridedSliceGrad", infer=_ssg_infer, kernel=_strided_slice_grad_kernel))


@_gradient("StridedSlice")
def _strided_slice_grad(op, g):
    x, dyn = op.inputs[0], op.inputs[1:]
    if _known(x.shape):
        return [apply("StridedSliceGrad", [g, *dyn], key=op.attrs["key"], shape=x.shape)]
    return [
        apply(
            "StridedSliceGrad", [g, *dyn, shape(x)], key=op.attrs["key"], shape=None, hint=x.shape
        )
    ]


@_gradient("StridedSliceGrad")
def _strided_slice_grad_grad(op, g):
    n = len(op.inputs) - (2 if op.attrs["shape"] is None else 1)
    return [apply("StridedSlice", [g, *op.inputs[1 : 1 + n]], key=op.attrs["key"])]


def _index_entry(k: Any, dyn: list) -> Any:
    if isinstance(k, (bool, np.bool_)):
        raise TypeError("boolean indices are not supported; use dcf.where / dcf.gather")
    if isinstance(k, (int, np.integer)) or k is None:
        return None if k is None else int(k)
    if isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype.kind in "iu":
        return int(k)  # (np.array(3): TF1 takes it, numpy too)
    if _is_tensorlike(k):
        v = constant_value(k)
        if v is not None and np.ndim(v) == 0 and np.asarray(v).dtype.kind in "iu":
            return int(v)
        t = convert_to_tensor(k)
        if not t.dtype.is_integer or t.shape not in ((), None):
            raise TypeError(
                f"a tensor index must be a scalar int, got {t!r}; "
                "use dcf.gather / dcf.gather_nd to index with a tensor of indices"
            )
        dyn.append(t)
        return Dyn(len(dyn) - 1)
    raise TypeError(
        f"unsupported index {k!r}: use ints, slices, None, ..., or scalar int "
        "tensors (dcf.gather for lists of indices)"
    )


def strided_slice(input_: Any, key: Any, name: str | None = None) -> Tensor:
    """``input_[key]`` with numpy basic indexing: ints (also scalar int tensors),
    slices with steps, None (new axis) and Ellipsis. ``t[...]`` syntax calls this."""
    if not isinstance(key, tuple):
        key = (key,)
    dyn: list = []
    spec: list = []
    for k in key:
        if k is Ellipsis:
            spec.append(k)
        elif isinstance(k, _pyslice):
            parts = [None if v is None else _index_entry(v, dyn) for v in (k.start, k.stop, k.step)]
            if parts[2] == 0:
                raise ValueError("slice step cannot be zero")
            spec.append(_pyslice(*parts))
        else:
            spec.append(_index_entry(k, dyn))
    # fold integer constants (shape arithmetic, e.g. shape(x)[0]); a slice of a float
    # constant stays an op, so that gradients reach the constant (TF's gradients of a
    # constant are taken through its slices too)
    value = constant_value(input_) if not dyn and isinstance(input_, Tensor) and \
        input_.dtype.np.kind in "iu" else None
    if value is not None and _key_is_valid(value, spec):
        return _const(value[tuple(spec)], input_.dtype, input_.graph, name)
    return apply("StridedSlice", [input_, *dyn], name, key=tuple(spec))


def _key_is_valid(value: Any, spec: list) -> bool:
    try:
        value[tuple(spec)]
    except IndexError:
        return False  # let inference report it
    return True


# setattr: Tensor (graph.py) declares no __getitem__, so mypy rejects a plain assignment
setattr(Tensor, "__getitem__", lambda self, key: strided_slice(self, key))  # noqa: B010


# ------------------------------------------------------------ gather / scatter
def _gather_infer(params: TensorType, indices: TensorType, *, axis: int) -> TensorType:
    _check_int(indices, "indices")
    if params.shape is None or indices.shape is None:
        return TensorType(params.dtype, None)
    a = _norm_axis(axis, params.rank)
    return TensorType(params.dtype, params.shape[:a] + indices.shape + params.shape[a + 1 :])


def _gather(xp, p, i, *, axis):
    return _s(xp.take(p, i, axis=axis))


@_binds(_gather)
def _bind_gather(xp, *, axis):
    take = xp.take

    def gather(p, i):
        out = take(p, i, axis=axis)
        return out[()] if out.ndim == 0 else out

    return gather


register(OpDef("GatherV2", infer=_gather_infer, kernel=_gather))


@_gradient("GatherV2")
def _gather_grad(op, g):
    params, indices = op.inputs
    axis = op.attrs["axis"]
    n = (
        params.shape[axis]
        if params.shape is not None and params.shape[axis] is not None
        else shape(params)[axis]
    )
    if axis == 0:
        return [unsorted_segment_sum(g, indices, n)]
    rp, ri = params.type.rank, indices.type.rank
    if rp is None or ri is None:
        return [_gather_grad_dynamic(g, params, indices, axis, n)]
    a = axis % rp
    # move the index axes to the front, sum the segments, move the result back to `a`
    gt = transpose(
        g, list(_pyrange(a, a + ri)) + list(_pyrange(a)) + list(_pyrange(a + ri, rp - 1 + ri))
    )
    summed = unsorted_segment_sum(gt, indices, n)
    return [transpose(summed, list(_pyrange(1, a + 1)) + [0] + list(_pyrange(a + 1, rp)))]


def _gather_grad_dynamic(g: Tensor, params: Tensor, indices: Tensor, axis: int,
                         n: Any) -> Tensor:
    """The gradient of a gather along `axis` != 0 where a rank is known only at run time:
    g as [outer..., indices, inner...] with the indices flattened to one axis, that axis
    moved to the front, the segments summed, and the result moved back (as TF)."""
    ps = shape(params)
    outer, inner = ps[:axis], ps[axis:][1:]   # (negative axes slice the same way)
    values = reshape(g, concat([outer, expand_dims(size(indices), 0), inner], 0))
    na = size(outer)
    nv = na + 1 + size(inner)
    to_front = concat([expand_dims(na, 0), _math.range(0, na), _math.range(na + 1, nv)], 0)
    summed = unsorted_segment_sum(transpose(values, to_front), reshape(indices, [-1]), n)
    return transpose(summed, concat([_math.range(1, na + 1), _const([0], dtypes.int32, g.graph),
                                     _math.range(na + 1, nv)], 0))


def gather(params: Any, indices: Any, axis: int = 0, name: str | None = None) -> Tensor:
    """``np.take(params, indices, axis)``: out[..., i, ...] = params[..., indices[i], ...]."""
    return apply("GatherV2", [params, indices], name, axis=_static_axis(axis))


def _uss_infer(
    data: TensorType, ids: TensorType, *dyn: TensorType, num_segments: int | None
) -> TensorType:
    _check_int(ids, "segment_ids")
    if num_segments is not None and num_segments < 0:
        raise InvalidArgumentError(f"num_segments must not be negative, got {num_segments}")
    if data.shape is None or ids.shape is None:
        return TensorType(data.dtype, None)
    if len(ids.shape) > len(data.shape) or any(
        a is not None and b is not None and a != b for a, b in zip(ids.shape, data.shape)
    ):
        raise InvalidArgumentError(f"segment_ids {ids} must be a prefix of data {data}")
    return TensorType(data.dtype, (num_segments,) + data.shape[len(ids.shape) :])


def _uss(xp, data, ids, *dyn, num_segments):
    if data.shape[:ids.ndim] != ids.shape:
        # (np.add.at would broadcast data over the ids: a gradient of another shape)
        raise InvalidArgumentError(
            f"segment_ids of shape {list(ids.shape)} must be a prefix of the data's "
            f"shape, {list(data.shape)}")
    n = num_segments if num_segments is not None else int(dyn[0])
    out = xp.zeros((n,) + data.shape[ids.ndim :], dtype=data.dtype)
    xp.add.at(out, ids, data)
    return out


register(OpDef("UnsortedSegmentSum", infer=_uss_infer, kernel=_uss))


@_gradient("UnsortedSegmentSum")
def _uss_grad(op, g):
    return [gather(g, op.inputs[1])]


def unsorted_segment_sum(
    data: Any, segment_ids: Any, num_segments: Any, name: str | None = None
) -> Tensor:
    """``out = zeros([num_segments, *rest]); np.add.at(out, segment_ids, data)``."""
    static, dyn = _int_arg(num_segments, "num_segments")
    return apply(
        "UnsortedSegmentSum",
        [data, segment_ids] + ([dyn] if dyn is not None else []),
        name,
        num_segments=static,
    )


def _gather_nd_infer(params: TensorType, indices: TensorType) -> TensorType:
    _check_int(indices, "indices")
    if params.shape is None or indices.shape is None or indices.shape[-1] is None:
        return TensorType(params.dtype, None)
    k = indices.shape[-1]
    if k > params.rank:
        raise InvalidArgumentError(f"indices {indices} index {k} axes of {params}")
    return TensorType(params.dtype, indices.shape[:-1] + params.shape[k:])


register(
    OpDef(
        "GatherNd",
        infer=_gather_nd_infer,
        kernel=lambda xp, p, i: _gather_nd(xp, p, i),
    )
)


def _gather_nd(xp, p, i):
    if i.shape[-1] == 0:
        # empty index tuples each select all of params (numpy's p[()] would give it once)
        return xp.broadcast_to(p, i.shape[:-1] + p.shape).copy()
    return _s(p[tuple(xp.moveaxis(i, -1, 0))])


@_gradient("GatherNd")
def _gather_nd_grad(op, g):
    params, indices = op.inputs
    return [scatter_nd(indices, g, _shape_of(params)), None]


def gather_nd(params: Any, indices: Any, name: str | None = None) -> Tensor:
    """``params[tuple(np.moveaxis(indices, -1, 0))]``: gather slices by index tuples."""
    return apply("GatherNd", [params, indices], name)


def _scatter_nd_infer(
    indices: TensorType,
    updates: TensorType,
    *dyn: TensorType,
    shape: tuple | None,
    hint: tuple | None = None,
) -> TensorType:
    _check_int(indices, "indices")
    if shape is None:
        return TensorType(updates.dtype, _dyn_shape(dyn[0], hint))
    _check_sizes(shape, "dimension")
    if indices.shape is not None and updates.shape is not None and indices.shape[-1] is not None:
        want = indices.shape[:-1] + tuple(shape[indices.shape[-1] :])
        if len(want) != updates.rank or any(
            a is not None and b is not None and a != b for a, b in zip(want, updates.shape)
        ):
            raise InvalidArgumentError(
                f"updates must have shape {list(want)} for indices "
                f"{indices} and shape {list(shape)}, got {updates}"
            )
    return TensorType(updates.dtype, tuple(shape))


def _scatter_nd(xp, indices, updates, *dyn, shape, hint=None):
    out = xp.zeros(shape if shape is not None else _ints(dyn[0]), dtype=updates.dtype)
    if indices.ndim == 0:
        raise InvalidArgumentError("indices must have rank >= 1, got a scalar")
    want = indices.shape[:-1] + out.shape[indices.shape[-1]:]
    if updates.shape != want:
        # (np.add.at would broadcast them: a gradient of another shape than the updates)
        raise InvalidArgumentError(
            f"updates must have shape {list(want)} for indices of shape "
            f"{list(indices.shape)} and shape {list(out.shape)}, got {list(updates.shape)}")
    if indices.shape[-1] == 0:
        # empty index tuples each address all of the output: every update adds to it
        out += updates.reshape((-1,) + out.shape).sum(axis=0, dtype=updates.dtype)
        return out
    xp.add.at(out, tuple(xp.moveaxis(indices, -1, 0)), updates)
    return _s(out)


register(OpDef("ScatterNd", infer=_scatter_nd_infer, kernel=_scatter_nd))


@_gradient("ScatterNd")
def _scatter_nd_grad(op, g):
    return [None, gather_nd(g, op.inputs[0])]


def scatter_nd(indices: Any, updates: Any, shape: Any, name: str | None = None) -> Tensor:
    """``out = zeros(shape); np.add.at(out, tuple(np.moveaxis(indices, -1, 0)), updates)``
    (duplicate indices add up)."""
    static, hint, dyn = _shape_arg(shape)
    if dyn is None:
        return apply("ScatterNd", [indices, updates], name, shape=static)
    return apply("ScatterNd", [indices, updates, dyn], name, shape=None, hint=hint)


# ---------------------------------------------------------------------- one_hot
def _one_hot_infer(
    indices: TensorType,
    on: TensorType,
    off: TensorType,
    *dyn: TensorType,
    depth: int | None,
    axis: int,
) -> TensorType:
    _check_int(indices, "indices")
    if on.dtype is not off.dtype or on.shape not in ((), None) or off.shape not in ((), None):
        raise TypeError(f"on_value and off_value must be scalars of one dtype, got {on}, {off}")
    if depth is not None and depth < 0:
        raise InvalidArgumentError(f"depth must not be negative, got {depth}")
    if indices.shape is None:
        return TensorType(on.dtype, None)
    a = _norm_axis(axis, indices.rank, extra=1)
    return TensorType(on.dtype, indices.shape[:a] + (depth,) + indices.shape[a:])


def _check_on_off(on, off):
    # (where(hot, on, off) would broadcast a vector along the classes)
    if on.ndim or off.ndim:
        raise InvalidArgumentError(
            f"on_value and off_value must be scalars, got shapes {list(on.shape)} and "
            f"{list(off.shape)}")


def _one_hot(xp, indices, on, off, *dyn, depth, axis):
    _check_on_off(on, off)
    n = depth if depth is not None else int(dyn[0])
    if n < 0:
        raise InvalidArgumentError(f"depth must not be negative, got {n}")
    hot = xp.expand_dims(indices, -1) == xp.arange(n)
    if axis not in (-1, hot.ndim - 1):
        hot = xp.moveaxis(hot, -1, axis)
    return xp.where(hot, on, off)


@_binds(_one_hot)
def _bind_one_hot(xp, *, depth, axis):
    if depth is None or xp is not np:
        return None
    ar = np.arange(depth)
    where, moveaxis, copysign = np.where, np.moveaxis, math.copysign
    # Indices of <= 32 bits along the last axis: rows of a (depth+1, depth) table of
    # on/off values, taken with mode="clip" on the indices viewed as unsigned (negative
    # or >= depth -> the last, all-off row): the values where(hot, on, off) gives, in one
    # take (~0.6 us instead of ~2.5 us for 64 indices, depth 2). The table is kept for
    # the last on/off objects seen (the hoisted Consts of a compiled run).
    eye = np.eye(depth + 1, depth, dtype=bool) if 0 < depth <= 1024 else None
    last: list = [(None, None, None)]
    unsigned = {"b": np.uint8, "h": np.uint16, "i": np.uint32, "B": None, "H": None,
                "I": None}
    if np.dtype(np.intc).itemsize == 4 and np.dtype("l").itemsize == 4:
        unsigned.update(l=np.uint32, L=None)

    def by_table(indices, on, off):
        c_on, c_off, table = last[0]
        if on is not c_on or off is not c_off:
            table = where(eye, on, off)
            last[0] = (on, off, table)
        u = unsigned[indices.dtype.char]
        return table.take(indices if u is None else indices.view(u), axis=0, mode="clip")

    def one_hot(indices, on, off):
        if on.ndim or off.ndim:
            _check_on_off(on, off)
        if eye is not None and type(indices) is np.ndarray and indices.ndim and \
                indices.dtype.char in unsigned and axis in (-1, indices.ndim):
            return by_table(indices, on, off)
        hot = np.expand_dims(indices, -1) == ar if type(indices) is not np.ndarray else \
            indices[..., None] == ar
        if axis != -1 and axis != hot.ndim - 1:
            hot = moveaxis(hot, -1, axis)
        # the usual 1/0 one-hot: a cast of the mask, ~3x faster than where (exactly the
        # same values: 1 and +0, never -0)
        if on == 1 and off == 0 and on.dtype == off.dtype and on.dtype.kind in "biuf" and \
                copysign(1.0, off) > 0:
            return hot.astype(on.dtype)
        return where(hot, on, off)

    return one_hot


register(OpDef("OneHot", infer=_one_hot_infer, kernel=_one_hot))
not_differentiable("OneHot")


def one_hot(
    indices: Any,
    depth: Any,
    on_value: Any = None,
    off_value: Any = None,
    axis: int = -1,
    dtype: Any = None,
    name: str | None = None,
) -> Tensor:
    """``np.where(indices[..., None] == np.arange(depth), on_value, off_value)`` with the
    new axis moved to `axis`. dtype defaults to on/off_value's dtype, else float32."""
    if dtype is None:
        # (as TF: on_value's dtype, else off_value's, else float32)
        given = [v for v in (on_value, off_value) if v is not None]
        dtype = (given[0].dtype if _is_tensorlike(given[0]) else
                 dtypes.infer_dtype(given[0])) if given else dtypes.float32
    dt = dtypes.as_dtype(dtype)
    vals = [
        convert_to_tensor(v) if _is_tensorlike(v) else
        _const(d if v is None else v, dt, _graph_of(indices))
        for v, d in ((on_value, 1), (off_value, 0))
    ]
    static, dyn = _int_arg(depth, "depth")
    return apply(
        "OneHot",
        [indices, *vals] + ([dyn] if dyn is not None else []),
        name,
        depth=static,
        axis=_static_axis(axis),
    )


# --------------------------------------------------------------- where / select
def _select_infer(c: TensorType, x: TensorType, y: TensorType) -> TensorType:
    if not c.dtype.is_bool:
        raise TypeError(f"condition must be bool, got {c}")
    out = binary_infer(x, y)
    return TensorType(out.dtype, broadcast_shape(c.shape, out.shape))


register(OpDef("Select", infer=_select_infer, kernel=lambda xp, c, x, y: _s(xp.where(c, x, y))))


@_gradient("Select")
def _select_grad(op, g):
    c, x, y = op.inputs
    z = zeros_like(g)
    return [None, _math._sum_to(select(c, g, z), x, c, y), _math._sum_to(select(c, z, g), y, c, x)]


def _where_infer(c: TensorType) -> TensorType:
    return TensorType(dtypes.int64, (None, c.rank))


register(
    OpDef(
        "Where",
        infer=_where_infer,
        kernel=lambda xp, c: xp.argwhere(c).astype(dtypes.int64.np, copy=False),
    )
)
not_differentiable("Where")


def select(condition: Any, x: Any, y: Any, name: str | None = None) -> Tensor:
    """``np.where(condition, x, y)`` with numpy broadcasting; condition is bool."""
    x, y = _math._pair(x, y)
    return apply("Select", [condition, x, y], name)


def where(condition: Any, x: Any = None, y: Any = None, name: str | None = None) -> Tensor:
    """``np.where(condition, x, y)`` (select); with x and y both None,
    ``np.argwhere(condition)`` as int64 coordinates."""
    if x is None and y is None:
        return apply("Where", [condition], name)
    if x is None or y is None:
        raise ValueError("where: pass both x and y, or neither")
    return select(condition, x, y, name=name)


# ------------------------------------------------------------------------ fills
def _fill_infer(*ins: TensorType, dims: tuple | None, hint: tuple | None = None) -> TensorType:
    value = ins[-1]
    if value.shape not in ((), None):
        raise InvalidArgumentError(f"value must be a scalar, got {value}")
    if dims is None:
        return TensorType(value.dtype, _dyn_shape(ins[0], hint, "dims"))
    _check_sizes(dims, "dimension")
    return TensorType(value.dtype, tuple(dims))


def _fill(xp, *ins, dims, hint=None):
    if ins[-1].ndim:
        # (np.full would broadcast it: a value of another shape than its gradient's)
        raise InvalidArgumentError(f"value must be a scalar, got shape {list(ins[-1].shape)}")
    return _s(xp.full(dims if dims is not None else _ints(ins[0]), ins[-1], dtype=ins[-1].dtype))


register(OpDef("Fill", infer=_fill_infer, kernel=_fill))


@_gradient("Fill")
def _fill_grad(op, g):
    grad = _math.reduce_sum(g)
    return [grad] if op.attrs["dims"] is not None else [None, grad]


def fill(dims: Any, value: Any, name: str | None = None) -> Tensor:
    """``np.full(dims, value)``: a tensor of shape `dims` filled with the scalar `value`."""
    static, hint, dyn = _shape_arg(dims)
    if dyn is None:
        return apply("Fill", [value], name, dims=static)
    return apply("Fill", [dyn, value], name, dims=None, hint=hint)


def zeros(shape: Any, dtype: Any = dtypes.float32, name: str | None = None) -> Tensor:
    """``np.zeros(shape, dtype)``."""
    dt = dtypes.as_dtype(dtype)
    return fill(shape, _const(False if dt.is_bool else 0, dt, _graph_of(shape)), name=name)


def ones(shape: Any, dtype: Any = dtypes.float32, name: str | None = None) -> Tensor:
    """``np.ones(shape, dtype)``."""
    dt = dtypes.as_dtype(dtype)
    return fill(shape, _const(True if dt.is_bool else 1, dt, _graph_of(shape)), name=name)


def _filled_like(fill: int, like: Any) -> Any:
    def kernel(xp, x):
        if xp is not np:
            return _s(like(xp, x))
        if type(x) is np.ndarray:
            out = np.zeros(x.shape, x.dtype) if fill == 0 else np.ones(x.shape, x.dtype)
            return out if out.ndim else out[()]
        if isinstance(x, np.generic) and x.dtype.kind in "biufc":
            return x.dtype.type(fill)  # a 0-d value stays a numpy scalar
        return _s(like(xp, x))

    return kernel


register(OpDef("ZerosLike", infer=lambda x: x,
               kernel=_filled_like(0, lambda xp, x: xp.zeros_like(x))))
register(OpDef("OnesLike", infer=lambda x: x,
               kernel=_filled_like(1, lambda xp, x: xp.ones_like(x))))
not_differentiable("ZerosLike", "OnesLike")


def zeros_like(tensor: Any, dtype: Any = None, name: str | None = None) -> Tensor:
    """``np.zeros_like(tensor, dtype)``."""
    x = convert_to_tensor(tensor)
    if dtype is not None and dtypes.as_dtype(dtype) is not x.dtype:
        return zeros(_shape_of(x), dtype, name=name)
    return apply("ZerosLike", [x], name)


def ones_like(tensor: Any, dtype: Any = None, name: str | None = None) -> Tensor:
    """``np.ones_like(tensor, dtype)``."""
    x = convert_to_tensor(tensor)
    if dtype is not None and dtypes.as_dtype(dtype) is not x.dtype:
        return ones(_shape_of(x), dtype, name=name)
    return apply("OnesLike", [x], name)


def _eye_infer(
    *dyn: TensorType,
    num_rows: int | None,
    num_columns: int | None,
    batch_shape: tuple,
    dtype: dtypes.DType,
) -> TensorType:
    for t in dyn:
        _check_scalar_int(t, "num_rows/num_columns")
    return TensorType(dtype, tuple(batch_shape) + (num_rows, num_columns))


def _eye(xp, *dyn, num_rows, num_columns, batch_shape, dtype):
    n, m = _fill_dyn(dyn, num_rows, num_columns)
    out = xp.eye(int(n), int(m), dtype=dtype.np)
    return xp.broadcast_to(out, tuple(batch_shape) + out.shape) if batch_shape else out


register(OpDef("Eye", infer=_eye_infer, kernel=_eye))
not_differentiable("Eye")


def eye(
    num_rows: Any,
    num_columns: Any = None,
    batch_shape: Any = None,
    dtype: Any = dtypes.float32,
    name: str | None = None,
) -> Tensor:
    """``np.eye(num_rows, num_columns, dtype)``, broadcast over `batch_shape` if given."""
    n, n_dyn = _int_arg(num_rows, "num_rows")
    m, m_dyn = (n, n_dyn) if num_columns is None else _int_arg(num_columns, "num_columns")
    dyn = [t for t in (n_dyn, m_dyn) if t is not None]
    batch = () if batch_shape is None else tuple(int(b) for b in batch_shape)
    for what, k in (("num_rows", n), ("num_columns", m)) + tuple(("batch_shape", b)
                                                               for b in batch):
        if k is not None and k < 0:
            raise ValueError(f"Eye '{name or 'Eye'}': {what} must be >= 0, got {k}")
    return apply(
        "Eye", dyn, name, num_rows=n, num_columns=m, batch_shape=batch, dtype=dtypes.as_dtype(dtype)
    )


# ------------------------------------------------------------ tile, broadcast
def _tile_infer(
    x: TensorType, *dyn: TensorType, multiples: tuple | None, hint: tuple | None = None
) -> TensorType:
    if multiples is None:
        n = _vec_len(dyn[0], "multiples")
        r = x.rank if x.rank is not None else n
        # the multiples known at build time (hint), as TF1: tile(x, [1, n, 2]) of a
        # [?, 3, 4] is [?, ?, 8]
        return _hinted_shape(x, r, hint, lambda d, m: None if m is None else d * m)
    _check_sizes(multiples, "multiple")
    if x.shape is None:
        return TensorType(x.dtype, (None,) * len(multiples))
    if len(multiples) != x.rank:
        raise InvalidArgumentError(
            f"multiples {list(multiples)} must have one entry per axis of {x}"
        )
    return TensorType(
        x.dtype, tuple(None if d is None else d * m for d, m in zip(x.shape, multiples))
    )


def _tile(xp, x, *dyn, multiples, hint=None):
    m = multiples if multiples is not None else _ints(dyn[0])
    _check_rank(x, len(m), "multiples")
    return _s(xp.tile(x, m))


register(OpDef("Tile", infer=_tile_infer, kernel=_tile))


@_gradient("Tile")
def _tile_grad(op, g):
    x = op.inputs[0]
    r = x.type.rank
    m = op.attrs["multiples"]
    if m is not None and _known(x.shape):
        split_shape: Any = [v for pair in zip(m, x.shape) for v in pair]
    else:
        mt = _cast_int32(op.inputs[1]) if m is None else _const(list(m), dtypes.int32, x.graph)
        split_shape = reshape(transpose(stack([mt, shape(x)])), [-1])
    # (the rank known only at run time: the same axes, as a tensor)
    axes: Any = list(_pyrange(0, 2 * r, 2)) if r is not None else \
        _math.range(0, 2 * rank(x), 2)
    if isinstance(split_shape, Tensor):
        # x's known dims stay in the gradient's static shape, as in TF1
        mh = m if m is not None else op.attrs.get("hint")
        if r is not None and (mh is None or len(mh) != r):
            mh = (None,) * r
        hint = None if r is None else tuple(v for pair in zip(mh, x.shape) for v in pair)
        return [_math.reduce_sum(apply("Reshape", [g, split_shape], shape=None, hint=hint),
                                 axis=axes)]
    return [_math.reduce_sum(reshape(g, split_shape), axis=axes)]


def tile(input: Any, multiples: Any, name: str | None = None) -> Tensor:
    """``np.tile(input, multiples)`` with one multiple per axis."""
    static, hint, dyn = _shape_arg(multiples)
    if dyn is None:
        return apply("Tile", [input], name, multiples=static)
    return apply("Tile", [input, dyn], name, multiples=None, hint=hint)


def _broadcast_to_infer(
    x: TensorType, *dyn: TensorType, shape: tuple | None, hint: tuple | None = None
) -> TensorType:
    if shape is None:
        return TensorType(x.dtype, _dyn_shape(dyn[0], hint))
    _check_sizes(shape, "dimension")
    try:
        out = broadcast_shape(x.shape, tuple(shape))
    except InvalidArgumentError:
        out = ()  # reported below
    if out is not None and (
        len(out) != len(shape) or any(a != b for a, b in zip(out, shape) if a is not None)
    ):
        raise InvalidArgumentError(f"cannot broadcast {x} to {list(shape)}")
    return TensorType(x.dtype, tuple(shape))


def _broadcast_to(xp, x, *dyn, shape, hint=None):
    return _s(xp.broadcast_to(x, shape if shape is not None else _ints(dyn[0])))


# Up to this many elements, BroadcastTo writes its result into a new array (~0.5 us)
# instead of making np.broadcast_to's read-only view (~2.5 us of Python); the values
# are the same.
_BROADCAST_COPY_MAX = 8192


@_binds(_broadcast_to)
def _bind_broadcast_to(xp, *, shape, hint=None):
    if shape is None or xp is not np:
        return None
    shape = tuple(shape)
    if _prod(shape) > _BROADCAST_COPY_MAX:
        return None
    empty, rank = np.empty, len(shape)

    def broadcast_to(x):
        if x.ndim > rank:
            return _broadcast_to(xp, x, shape=shape)  # raises as np.broadcast_to does
        out = empty(shape, x.dtype)
        out[...] = x  # raises where x does not broadcast to shape
        return out if rank else out[()]

    return broadcast_to


register(OpDef("BroadcastTo", infer=_broadcast_to_infer, kernel=_broadcast_to))


@_gradient("BroadcastTo")
def _broadcast_to_grad(op, g):
    return [_math._sum_to(g, op.inputs[0], op.outputs[0])]


def broadcast_to(input: Any, shape: Any, name: str | None = None) -> Tensor:
    """``np.broadcast_to(input, shape)``."""
    static, hint, dyn = _shape_arg(shape)
    if dyn is None:
        return apply("BroadcastTo", [input], name, shape=static)
    return apply("BroadcastTo", [input, dyn], name, shape=None, hint=hint)


def _bga_infer(s0: TensorType, s1: TensorType) -> list[TensorType]:
    _vec_len(s0, "s0")
    _vec_len(s1, "s1")
    return [TensorType(dtypes.int32, (None,))] * 2


def _bga(xp, s0, s1):
    a, b = _ints(s0), _ints(s1)
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    for i, (da, db) in enumerate(zip(a, b)):
        if da != db and da != 1 and db != 1:
            raise InvalidArgumentError(
                f"shapes {list(a)} and {list(b)} cannot be broadcast (axis {i}: {da} vs {db})"
            )
    r0 = [i for i in _pyrange(n) if a[i] == 1 and b[i] != 1]
    r1 = [i for i in _pyrange(n) if b[i] == 1 and a[i] != 1]
    return xp.asarray(r0, dtype=dtypes.int32.np), xp.asarray(r1, dtype=dtypes.int32.np)


register(OpDef("BroadcastGradientArgs", infer=_bga_infer, kernel=_bga))
not_differentiable("BroadcastGradientArgs")


def broadcast_gradient_args(s0: Any, s1: Any, name: str | None = None) -> tuple:
    """For shapes s0 and s1, the axes of their broadcast shape that each must be summed
    over to undo the broadcasting: ``(r0, r1)`` int32 vectors."""
    return apply("BroadcastGradientArgs", [s0, s1], name)


def _reduced_shape_infer(s: TensorType, axes: TensorType) -> TensorType:
    _check_int(axes, "axes")
    return TensorType(dtypes.int32, (_vec_len(s, "shape"),))


def _reduced_shape(xp, s, axes):
    out = xp.array(s, dtype=dtypes.int32.np)
    out[axes] = 1
    return out


register(OpDef("ReducedShape", infer=_reduced_shape_infer, kernel=_reduced_shape))
not_differentiable("ReducedShape")


def reduced_shape(input_shape: Any, axes: Any, name: str | None = None) -> Tensor:
    """input_shape with the entries at `axes` set to 1 (the shape a reduction over `axes`
    has with keepdims=True)."""
    return apply("ReducedShape", [input_shape, axes], name)


# Gradient functions above use math ops; math_ops imports this module first, so the
# import goes last (any import order then resolves: attributes are read at call time).
from dcf.ops import math_ops as _math
