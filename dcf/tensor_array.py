"""TensorArray: a list of tensors written once per index, usable as a loop variable."""

from __future__ import annotations

from typing import Any

from dcf import dtypes
from dcf.errors import InvalidArgumentError
from dcf.graph import Operation, Tensor, as_shape, shape_str
from dcf.ops.control_ops import no_op
from dcf.ops.registry import apply, constant_value, convert_in, graph_of

__all__ = ["TensorArray"]


class _ShapeCell:
    """Element shape known at build time, shared by every TensorArray object of one handle,
    and the array's size where it is a build-time constant and cannot grow."""

    __slots__ = ("shape", "size")

    def __init__(self, shape: tuple | None, size: int | None = None) -> None:
        self.shape = shape
        self.size = size


class TensorArray:
    """An array of tensors of one dtype, each index written at most once.

    `write(i, v)` returns a new TensorArray object (use the returned one): the
    returned object carries the "flow" that orders reads after writes, also across
    loop iterations when the TensorArray is a while_loop variable.
    """

    _is_tensor_array = True

    def __init__(self, dtype: Any, size: Any = 0, dynamic_size: bool = False,
                 clear_after_read: bool = True, element_shape: Any = None,
                 infer_shape: bool = True, name: str | None = None, *,
                 handle: Tensor | None = None, flow: Tensor | None = None,
                 _cell: _ShapeCell | None = None, _ta_name: str | None = None) -> None:
        self.dtype = dtypes.as_dtype(dtype)
        self.dynamic_size = dynamic_size
        self.clear_after_read = clear_after_read
        self.infer_shape = infer_shape
        if handle is not None:
            self.handle, self.flow = handle, flow
            self._cell = _cell or _ShapeCell(None)
            self.name = _ta_name or handle.op.name
            return
        if size is None:        # (as TensorFlow's None with dynamic_size: start empty)
            if not dynamic_size:
                raise ValueError("TensorArray: size=None needs dynamic_size=True")
            size = 0
        eshape = as_shape(element_shape, f"TensorArray '{name or 'TensorArray'}'")
        g = graph_of([size])
        with g.as_default(), g.name_scope(name or "TensorArray") as scope:
            self.name = scope.rstrip("/")
            size_t = convert_in(size, g, dtypes.int32)
            self.handle, self.flow = apply(
                "TensorArrayV3", [size_t], name="TensorArray", dtype=self.dtype,
                dynamic_size=dynamic_size, clear_after_read=clear_after_read,
                element_shape=eshape, infer_shape=infer_shape, ta_name=self.name)
        known = constant_value(size_t)
        if known is not None and int(known) < 0:
            raise ValueError(f"TensorArray '{self.name}': size must be >= 0, got {int(known)}")
        known = None if dynamic_size else known
        self._cell = _ShapeCell(eshape, None if known is None else int(known))

    # ------------------------------------------------------------ plumbing
    def _with_flow(self, flow: Tensor) -> TensorArray:
        return TensorArray(self.dtype, dynamic_size=self.dynamic_size,
                           clear_after_read=self.clear_after_read, infer_shape=self.infer_shape,
                           handle=self.handle, flow=flow, _cell=self._cell, _ta_name=self.name)

    def _as_control_op(self) -> Operation:
        return self.flow.op

    @property
    def element_shape(self) -> tuple | None:
        return self._cell.shape

    def _merge_shape(self, shape: tuple | None, what: str) -> None:
        """Check `shape` against the element shape (a given one holds for every write, as
        TF's); with infer_shape, merge it in."""
        cur = self._cell.shape
        if shape is None or (cur is None and not self.infer_shape):
            return
        if cur is None:
            self._cell.shape = shape
            return
        if len(cur) != len(shape) or any(a is not None and b is not None and a != b
                                         for a, b in zip(cur, shape)):
            raise InvalidArgumentError(
                f"TensorArray '{self.name}': {what} of shape {shape_str(shape)} does not match "
                f"its element shape {shape_str(cur)}")
        if self.infer_shape:
            self._cell.shape = tuple(a if a is not None else b for a, b in zip(cur, shape))

    def _attrs(self) -> dict:
        return {"dtype": self.dtype, "element_shape": self._cell.shape}

    def _value(self, value: Any, what: str = "write", index: Any = None) -> Tensor:
        at = "" if index is None else f" at index {_describe_index(index)}"
        if isinstance(value, Tensor):
            v = value
        else:
            try:
                v = convert_in(value, self.handle.graph, self.dtype)
            except TypeError as e:
                raise TypeError(f"TensorArray '{self.name}' ({what}{at}): {e}") from None
        if v.dtype is not self.dtype:
            raise TypeError(f"TensorArray '{self.name}' holds {self.dtype}, cannot write "
                            f"{v.dtype} ({what}{at})")
        return v

    def _index(self, index: Any) -> Tensor:
        return _index(index, self.handle.graph)

    def _indices(self, indices: Any, what: str) -> Tensor:
        """A vector of indices (as TF's: not a scalar, not a matrix)."""
        t = _index(indices, self.handle.graph)
        if t.shape is not None and len(t.shape) != 1:
            raise ValueError(f"TensorArray '{self.name}' ({what}): indices must be a vector, "
                             f"got shape {shape_str(t.shape)}")
        return t

    # ------------------------------------------------------------- methods
    def write(self, index: Any, value: Any, name: str | None = None) -> TensorArray:
        """A TensorArray like this one with `value` at `index`."""
        v = self._value(value, "write", index)
        self._merge_shape(v.shape, "write")
        flow = apply("TensorArrayWriteV3", [self.handle, self._index(index), v, self.flow],
                     name=name or "TensorArrayWrite")
        return self._with_flow(flow)

    def read(self, index: Any, name: str | None = None) -> Tensor:
        """The value at `index` (an error if it was never written)."""
        return apply("TensorArrayReadV3", [self.handle, self._index(index), self.flow],
                     name=name or "TensorArrayRead", **self._attrs())

    def stack(self, name: str | None = None) -> Tensor:
        """All elements stacked along a new first dimension."""
        out = apply("TensorArrayStack", [self.handle, self.flow], name=name or
                    "TensorArrayStack", **self._attrs())
        if self._cell.size is not None and out.shape is not None:
            # a fixed size known at build time is the stack's first dimension (as TF's)
            out._refine_shape((self._cell.size,) + tuple(out.shape[1:]))
        return out

    def gather(self, indices: Any, name: str | None = None) -> Tensor:
        """The elements at `indices`, stacked."""
        return apply("TensorArrayGatherV3", [self.handle, self._indices(indices, "gather"),
                                             self.flow],
                     name=name or "TensorArrayGather", **self._attrs())

    def unstack(self, value: Any, name: str | None = None) -> TensorArray:
        """Write `value[i]` to index i for every i."""
        v = self._value(value, "unstack")
        if v.shape is not None:
            self._merge_shape(tuple(v.shape[1:]), "unstack")
        flow = apply("TensorArrayUnstack", [self.handle, v, self.flow],
                     name=name or "TensorArrayUnstack")
        return self._with_flow(flow)

    def scatter(self, indices: Any, value: Any, name: str | None = None) -> TensorArray:
        """Write `value[k]` to index `indices[k]`."""
        v = self._value(value, "scatter")
        if v.shape is not None:
            self._merge_shape(tuple(v.shape[1:]), "scatter")
        flow = apply("TensorArrayScatterV3",
                     [self.handle, self._indices(indices, "scatter"), v, self.flow],
                     name=name or "TensorArrayScatter")
        return self._with_flow(flow)

    def split(self, value: Any, lengths: Any, name: str | None = None) -> TensorArray:
        """Write `value[sum(lengths[:i]):sum(lengths[:i + 1])]` to index i for every i
        (the inverse of concat); the lengths must add up to value's first dimension."""
        v = self._value(value, "split")
        lens = _index(lengths, self.handle.graph, dtypes.int64, "split lengths")
        known = constant_value(lens)
        if v.shape is not None and known is not None and known.size and \
                (known == known.flat[0]).all():     # (as TF's: alike lengths, alike shapes)
            self._merge_shape((int(known.flat[0]),) + tuple(v.shape[1:]), "split")
        flow = apply("TensorArraySplitV3", [self.handle, v, lens, self.flow],
                     name=name or "TensorArraySplit")
        return self._with_flow(flow)

    def identity(self, name: str | None = None) -> TensorArray:
        """This TensorArray with a new flow: with `dcf.control_dependencies`, reads of
        the returned one wait for those ops."""
        return self._with_flow(apply("Identity", [self.flow], name=name or "TensorArrayIdentity"))

    def concat(self, name: str | None = None) -> Tensor:
        """All elements joined along their first dimension."""
        out = apply("TensorArrayConcatV3", [self.handle, self.flow],
                    name=name or "TensorArrayConcat", **self._attrs())[0]
        es = self._cell.shape
        if self._cell.size is not None and es and es[0] is not None and out.shape is not None:
            # every element has the element shape: a fixed size known at build time times
            # its first dimension is the result's (as TF's)
            out._refine_shape((self._cell.size * es[0],) + tuple(out.shape[1:]))
        return out

    def size(self, name: str | None = None) -> Tensor:
        """The number of elements (int32 scalar)."""
        return apply("TensorArraySizeV3", [self.handle, self.flow], name=name or "TensorArraySize")

    def grad(self, source: str, flow: Tensor | None = None, name: str | None = None
             ) -> TensorArray:
        """The gradient TensorArray of this one for gradient source `source`."""
        handle, gflow = apply("TensorArrayGradV3", [self.handle, flow or self.flow],
                              name=name or "TensorArrayGrad", source=source)
        ta = TensorArray(self.dtype, dynamic_size=self.dynamic_size, clear_after_read=False,
                         handle=handle, flow=gflow,
                         _cell=_ShapeCell(self._cell.shape, self._cell.size),
                         _ta_name=f"{self.name}@grad")
        return ta

    def close(self, name: str | None = None) -> Operation:
        """An op that does nothing (the array lives as long as its run), as TF's close op
        for fetches and control dependencies."""
        return no_op(name=name or "TensorArrayClose")

    def __repr__(self) -> str:
        return f"<dcf.TensorArray '{self.name}' {self.dtype}>"


def _describe_index(i: Any) -> str:
    if isinstance(i, Tensor):
        from dcf.ops.registry import constant_value

        c = constant_value(i)
        return str(int(c)) if c is not None else f"'{i.name}'"
    return str(i)


def _index(i: Any, graph: Any, dtype: Any = dtypes.int32, what: str = "index") -> Tensor:
    t = convert_in(i, graph, dtype) if not isinstance(i, Tensor) else i
    if not t.dtype.is_integer:
        raise TypeError(f"TensorArray {what} must be an integer tensor, got {t.type}")
    return t
