"""The one registration point of ops: OpDef, the OPS table, apply() and RegisterGradient."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from dcf import dtypes
from dcf.errors import InvalidArgumentError
from dcf.graph import Graph, Operation, Tensor, TensorType, _creation_site, get_default_graph


class Kind(enum.IntEnum):
    """How the executor runs a node. Almost every op is a KERNEL."""

    KERNEL = 0
    SWITCH = 1
    MERGE = 2
    ENTER = 3
    EXIT = 4
    NEXT_ITERATION = 5
    SEND = 6
    RECV = 7
    ASYNC = 8  # a kernel that may have to wait (queue dequeue): returns WouldBlock
    TRIGGER = 9  # runs once its inputs are there, dead or not, and is never dead


@dataclass(frozen=True)
class OpDef:
    """Everything about one op type.

    kernel(xp, *inputs, **attrs) -> output or tuple of outputs; xp is numpy or cupy.
    infer(*input_types, **attrs) -> TensorType or list of TensorTypes.
    """

    type: str
    infer: Callable[..., Any]
    kernel: Callable[..., Any] | None = None
    gpu_kernel: Callable[..., Any] | None = None
    stateful: bool = False
    host_only: bool = False
    kind: Kind = Kind.KERNEL
    resource: bool = False  # the kernel takes the device's resources as `res=`
    attrs_doc: dict = field(default_factory=dict)


OPS: dict[str, OpDef] = {}
SHAPE_ONLY_OPS = frozenset({"Shape", "Size", "Rank", "ZerosLike", "OnesLike"})
GRADIENTS: dict[str, Callable[..., Any] | None] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.type in OPS:
        raise ValueError(f"op type {opdef.type!r} is registered twice")
    OPS[opdef.type] = opdef
    return opdef


class RegisterGradient:
    """Decorator that registers the gradient function of an op type.

    The function takes `(op, *grads)` (one incoming gradient per output, None where
    no gradient flows) and returns one gradient per input (None where none flows).
    Built-in gradients are registered the same way; registering again overrides.
    """

    def __init__(self, op_type: str) -> None:
        if not isinstance(op_type, str):
            raise TypeError("RegisterGradient takes the op type name as a string")
        self.op_type = op_type

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        GRADIENTS[self.op_type] = fn
        return fn


def not_differentiable(*op_types: str) -> None:
    """Declare op types whose outputs carry no gradient (gradients() yields None)."""
    for t in op_types:
        GRADIENTS[t] = None


# ------------------------------------------------------------------ constants
def _const_infer(*, value: Any, dtype: Any) -> TensorType:
    return TensorType(dtype, tuple(np.shape(value)))


def _const_kernel(xp, *, value, dtype):
    return value if xp is np else xp.asarray(value)


register(OpDef("Const", infer=_const_infer, kernel=_const_kernel))
not_differentiable("Const")


def as_value(value: Any, dtype: dtypes.DType) -> Any:
    """A numpy value of `dtype`: an ndarray, or a numpy scalar for 0-d values.

    0-d values travel as numpy scalars because their arithmetic is ~10x faster
    than 0-d arrays'.
    """
    arr = np.asarray(value, dtype=dtype.np)
    if arr.ndim == 0:
        return arr[()]
    if arr is value and arr.flags.writeable:
        # the caller's own array: copied, so that it stays theirs to write (a reused
        # observation buffer) and nothing kept from a run (a Variable it was assigned to,
        # a queue's element, a constant) changes when they do
        arr = arr.copy()
    arr.setflags(write=False)
    return arr


def changed_by_cast(value: Any, arr: Any, dt: dtypes.DType) -> bool:
    """Whether converting `value` to `arr` (of `dt`) changed a value: a fractional or
    non-finite float made an int, an int out of the dtype's range (wrapped around), a
    number other than 0/1 made a bool, a complex number's imaginary part dropped.
    Widening and float rounding (as TensorFlow allows) are not changes."""
    src = value if isinstance(value, (np.ndarray, np.generic)) else np.asarray(value)
    if src.dtype.kind == "c":
        if np.any(src.imag != 0):
            return True
        src = src.real
    if not (dt.is_integer or dt.is_bool):
        return False
    kind = src.dtype.kind
    if kind not in "iuf" or src.dtype == arr.dtype:
        return False
    if dt.is_bool:
        return bool(np.any((src != 0) & (src != 1)))
    if kind in "iu":
        # (a round trip misses a wrap between a signed and an unsigned type of one width)
        info = np.iinfo(dt.np)
        return src.size > 0 and (int(src.min()) < info.min or int(src.max()) > info.max)
    with np.errstate(invalid="ignore", over="ignore"):
        return not np.array_equal(np.asarray(arr).astype(src.dtype), src)


def constant(value: Any, dtype: Any = None, name: str | None = None,
             shape: Any = None) -> Tensor:
    """A tensor holding `value` (a Python scalar, nested list or numpy array).

    Python ints become int32, or int64 where a value does not fit int32. A conversion
    to an explicit `dtype` that would change a value (2.5 to an int, 300 to a bool, an
    int out of the dtype's range) is a TypeError, as in TensorFlow; use dcf.cast.
    """
    if isinstance(value, Tensor):
        raise TypeError(f"constant() takes a Python or numpy value, got tensor {value.name}")
    what = f"Const '{get_default_graph()._scope}{name or 'Const'}'"
    try:
        if dtype is None:
            dt = dtypes.infer_dtype(value)
            v = as_value(value, dt)
        else:
            dt = dtypes.as_dtype(dtype)
            with np.errstate(invalid="ignore", over="ignore"):  # checked just below
                v = as_value(value, dt)
    except (TypeError, ValueError, OverflowError) as e:
        to = "" if dtype is None else f" to {dtypes.as_dtype(dtype)}"
        raise TypeError(f"{what}: cannot convert {_short(value)}{to}: {e}") from None
    if changed_by_cast(value, v, dt):
        raise TypeError(f"{what}: converting {_short(value)} to {dt} would change its value; "
                        "pass values of that dtype, or convert explicitly with dcf.cast")
    if shape is not None:
        v = as_value(np.broadcast_to(np.asarray(v), tuple(shape)), dt)
    return apply("Const", [], name=name or "Const", value=v, dtype=dt)


def _short(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 80 else r[:77] + "..."


def graph_of(values: Any) -> Graph:
    """The graph of the first tensor-like value among `values` (a Tensor, a Variable or a
    TensorArray), else the default graph: the graph an op or construct built from them
    belongs in, as TensorFlow's name_scope(name, default, values) chooses it."""
    for x in values:
        if isinstance(x, Tensor):
            return x.graph
        if getattr(x, "_is_tensor_array", False):
            return x.handle.graph
        if getattr(x, "_as_tensor", None) is not None:
            g = getattr(x, "graph", None)
            if isinstance(g, Graph):
                return g
    return get_default_graph()


def convert_in(value: Any, graph: Graph, dtype: Any = None) -> Tensor:
    """convert_to_tensor, with a Python or numpy value made a Const of `graph`."""
    if isinstance(value, Tensor):
        return convert_to_tensor(value, dtype)
    if graph is get_default_graph():
        return convert_to_tensor(value, dtype)
    with graph.as_default():
        return convert_to_tensor(value, dtype)


def convert_to_tensor(value: Any, dtype: Any = None, name: str | None = None) -> Tensor:
    """Tensors pass through; Variables give their value; anything else becomes a Const."""
    if isinstance(value, Tensor):
        if dtype is not None and dtypes.as_dtype(dtype) is not value.dtype:
            raise TypeError(f"expected a {dtypes.as_dtype(dtype)} tensor, got {value!r}")
        return value
    conv = getattr(value, "_as_tensor", None)
    if conv is not None:
        return conv()
    if isinstance(value, (list, tuple)) and _holds_tensor(value):
        return _autopack(value, dtype, name)
    return constant(value, dtype=dtype, name=name)


def _is_tensorlike(v: Any) -> bool:
    return isinstance(v, Tensor) or getattr(v, "_as_tensor", None) is not None


def _holds_tensor(value: Any) -> bool:
    """Whether a (nested) list or tuple holds a tensor (or a Variable) somewhere."""
    return any(_is_tensorlike(v) or isinstance(v, (list, tuple)) and _holds_tensor(v)
               for v in value)


def _first_tensor(value: Any) -> Any:
    for v in value:
        if _is_tensorlike(v):
            return v
        if isinstance(v, (list, tuple)) and _holds_tensor(v):
            return _first_tensor(v)
    return None


def _autopack(value: Any, dtype: Any, name: str | None) -> Tensor:
    """A (nested) list holding tensors as one tensor, a Pack per level, as TF's
    convert_to_tensor packs them (tf.pad(x, [[0, n], [0, 0]]) with a tensor n): the
    Python numbers in it take the tensors' dtype."""
    first = _first_tensor(value)
    if dtype is None:
        dtype = first.dtype
    g = graph_of([first])
    parts = [_autopack(v, dtype, None) if isinstance(v, (list, tuple)) and _holds_tensor(v)
             else convert_in(v, g, dtype) for v in value]
    return apply("Pack", parts, name=name or "packed", axis=0)


def constant_value(t: Any) -> Any:
    """The numpy value of `t` when it is known at build time (a Const), else None."""
    if not isinstance(t, Tensor):
        conv = getattr(t, "_as_tensor", None)
        return None if conv is not None else np.asarray(t)
    op = t.op
    if op.type == "Const":
        return op.attrs["value"]
    if op.type == "Identity":
        return constant_value(op.inputs[0])
    if op.type == "Shape" and op.inputs[0].shape is not None \
            and all(d is not None for d in op.inputs[0].shape):
        return np.asarray(op.inputs[0].shape, dtype=op.outputs[0].dtype.np)
    return None


# -------------------------------------------------------------------- apply
def apply(op_type: str, inputs: list, name: str | None = None, *,
          control_inputs: list[Operation] | None = None, graph: Graph | None = None,
          **attrs: Any) -> Any:
    """Add one op to the graph: the only way an op enters a graph.

    Converts inputs to tensors, captures external tensors into the current control
    flow context, infers output types (errors name the op and the user's line), and
    places the op under the current name, device, frame and control scopes.
    Returns a Tensor, a tuple of Tensors for multi-output ops, or the Operation
    when the op has no outputs.
    """
    opdef = OPS.get(op_type)
    if opdef is None:
        raise KeyError(f"no op type {op_type!r} is registered")
    g = graph if graph is not None else graph_of(inputs)
    tensors = [x if isinstance(x, Tensor) else convert_in(x, g) for x in inputs]
    for t in tensors:
        if t.graph is not g:
            first = next((u.name for u in tensors if u.graph is g), None)
            other = f"its input '{first}'" if first else "the op's other inputs"
            raise ValueError(
                f"{op_type} '{g._scope}{name or op_type}': input '{t.name}' is from another "
                f"graph than {other}; build all of an op's inputs in one graph")
    ctx = g._ctx
    if ctx is not None:
        if op_type in SHAPE_ONLY_OPS and tensors:
            # inside a gradient loop: reduce a saved value to its shape in the forward
            # loop instead of saving the whole value
            hook = getattr(ctx, "shape_only_hook", None)
            if hook is not None:
                r = hook(op_type, tensors, name, attrs)
                if r is not None:
                    return r
        tensors = [ctx.capture(t) for t in tensors]
    else:
        for t in tensors:
            if t.op.ctx is not None:
                raise ValueError(
                    f"{op_type} '{name or op_type}': input '{t.name}' was created inside "
                    f"{t.op.ctx.describe()} and cannot be used outside it; use the outputs "
                    "of the cond/while_loop instead")
    try:
        out = opdef.infer(*[t.type for t in tensors], **attrs)
    except (ValueError, TypeError, InvalidArgumentError, IndexError) as e:
        site = _creation_site()
        shown = ", ".join(str(t.type) for t in tensors)
        nm = g.unique_name(name or op_type) if False else f"{g._scope}{name or op_type}"
        msg = f"{op_type} '{nm}': {e}"
        if tensors:
            msg += f"\n  inputs: {shown}"
        if site:
            msg += f"\n  op created at {site}"
        raise type(e)(msg) from e
    types = out if isinstance(out, list) else [out]
    op = g.create_op(op_type, tensors, types, name=name, attrs=attrs, opdef=opdef,
                     control_inputs=control_inputs)
    if isinstance(out, list):
        return tuple(op.outputs) if op.outputs else op
    return op.outputs[0]


# ------------------------------------------------------------- infer helpers
def unary_infer(x: TensorType) -> TensorType:
    return x


def float_unary_infer(x: TensorType) -> TensorType:
    if not x.dtype.is_floating:
        raise TypeError(f"expects a floating-point tensor, got {x}")
    return x


def broadcast_shape(a: tuple | None, b: tuple | None) -> tuple | None:
    """numpy broadcasting over static shapes with None for unknown dimensions."""
    if a is None or b is None:
        return None
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif x is None or y is None:
            out.append(x if y is None else y)
        else:
            raise InvalidArgumentError(
                f"shapes {list(a)} and {list(b)} cannot be broadcast (dimension -{i}: {x} vs {y})")
    return tuple(reversed(out))


def binary_infer(a: TensorType, b: TensorType) -> TensorType:
    if a.dtype is not b.dtype:
        raise TypeError(f"dtypes differ: {a.dtype} vs {b.dtype}; cast one with dcf.cast")
    return TensorType(a.dtype, broadcast_shape(a.shape, b.shape))


def compare_infer(a: TensorType, b: TensorType) -> TensorType:
    return TensorType(dtypes.bool_, binary_infer(a, b).shape)
