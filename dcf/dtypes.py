"""Element types of tensors and their numpy mapping."""

from __future__ import annotations

from typing import Any

import numpy as np


class DType:
    """An element type: a thin, hashable wrapper over a numpy dtype."""

    __slots__ = ("name", "np")

    def __init__(self, name: str, np_dtype: np.dtype) -> None:
        self.name = name
        self.np = np_dtype

    @property
    def is_floating(self) -> bool:
        return self.np.kind == "f"

    @property
    def is_integer(self) -> bool:
        return self.np.kind in "iu"

    @property
    def is_bool(self) -> bool:
        return self.np.kind == "b"

    def __eq__(self, other: Any) -> bool:
        # as TF's: a dtype equals what names it (np.float32, np.dtype("int64"), "bool");
        # anything that names no dtype is unequal, not an error
        if isinstance(other, DType) or other is None:
            return self is other
        try:
            return self is as_dtype(other)
        except (TypeError, ValueError):
            return False

    __hash__ = object.__hash__      # (one object per dtype: as_dtype returns it)

    def __repr__(self) -> str:
        return f"dcf.{self.name}"

    def __str__(self) -> str:
        return self.name

    def __reduce__(self) -> tuple:
        return (as_dtype, (self.name,))


float16 = DType("float16", np.dtype(np.float16))
float32 = DType("float32", np.dtype(np.float32))
float64 = DType("float64", np.dtype(np.float64))
int32 = DType("int32", np.dtype(np.int32))
int64 = DType("int64", np.dtype(np.int64))
bool_ = DType("bool", np.dtype(np.bool_))
# Opaque values that flow between ops but are not arrays: TensorArray, stack, queue handles.
resource = DType("resource", np.dtype(object))
# The "flow" scalar that orders TensorArray and stack operations.
variant = DType("variant", np.dtype(np.float32))

ALL = (float16, float32, float64, int32, int64, bool_)
# numpy's real scalar types (what indexing or reducing a numpy array gives)
NUMPY_SCALARS = frozenset({np.float16, np.float32, np.float64, np.int8, np.int16, np.int32,
                           np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_})
# TF1's names too: its "float" is float32 (numpy's "float" is float64), as Python's
# `float` is here (see as_dtype)
_BY_NAME = {d.name: d for d in ALL + (resource, variant)} | {
    "float": float32, "double": float64, "half": float16}
_BY_NP = {d.np: d for d in ALL}


def as_dtype(x: Any) -> DType:
    """Convert a DType, numpy dtype, numpy type, Python type or name to a DType."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    if x is bool:
        return bool_
    if x is int:
        return int32
    if x is float:
        return float32
    try:
        npd = np.dtype(x)
    except TypeError as e:
        raise TypeError(f"cannot interpret {x!r} as a dcf dtype") from e
    if npd in _BY_NP:
        return _BY_NP[npd]
    raise TypeError(f"unsupported dtype {npd}; dcf supports {', '.join(d.name for d in ALL)}")


def infer_dtype(value: Any) -> DType:
    """The dtype dcf gives a Python or numpy value when it becomes a constant.

    Python ints become int32, or int64 where one does not fit int32, and floats
    float32 (as in TensorFlow); numpy values keep their own dtype.
    """
    if isinstance(value, (np.ndarray, np.generic)):
        return as_dtype(value.dtype)
    arr = np.asarray(value)
    if arr.dtype.kind == "b":
        return bool_
    if arr.dtype.kind in "iu":
        if arr.size == 0 or (_I32.min <= arr.min() and arr.max() <= _I32.max):
            return int32
        if arr.dtype.kind == "i" or arr.max() <= _I64.max:
            return int64
        raise TypeError(f"the int {arr.max()} does not fit int64, the widest dcf int type")
    if arr.dtype.kind == "O" and _has_python_int(value):
        raise TypeError("it holds an int that does not fit int64, the widest dcf int type")
    if arr.dtype.kind == "f":
        return float32
    raise TypeError(f"cannot convert {type(value).__name__} {value!r} to a tensor")


_I32, _I64 = np.iinfo(np.int32), np.iinfo(np.int64)


def _has_python_int(value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return True
    return isinstance(value, (list, tuple)) and any(_has_python_int(v) for v in value)
