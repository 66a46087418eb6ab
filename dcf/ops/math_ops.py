"""Math ops: elementwise arithmetic, comparisons and logic, reductions, matmul, cast, range.

Binary ops follow numpy broadcasting and need equal dtypes; a Python or numpy operand
takes the dtype of the tensor it meets (``x * 2`` with float32 x multiplies by a float32
2). Importing this module installs the Python operators on Tensor.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import operator
from typing import Any

import numpy as np

from dcf import dtypes
from dcf.errors import InvalidArgumentError
from dcf.graph import Tensor, TensorType
from dcf.ops.array_ops import (
    _binds,
    _check_int,
    _check_scalar_int,
    _const,
    _fill_dyn,
    _gradient,
    _ints,
    _is_tensorlike,
    _known,
    _norm_axis,
    _prod,
    _shape_of,
    _static_axes,
    _static_axis,
    broadcast_gradient_args,
    broadcast_to,
    ones_like,
    reduced_shape,
    reshape,
    select,
    shape,
    size,
    squeeze,
    strided_slice,
    zeros_like,
)
from dcf.ops.gpu_elementwise import SINGLE as RAW_SINGLE, add_n_gpu, raw_gpu
from dcf.ops.gpu_kernels import batch_matmul_gpu, matmul_gpu, sum_gpu
from dcf.ops.registry import (
    OpDef,
    RegisterGradient,
    _holds_tensor,
    apply,
    as_value,
    binary_infer,
    broadcast_shape,
    changed_by_cast,
    constant_value,
    convert_to_tensor,
    not_differentiable,
    register,
)

__all__ = [
    "abs",
    "add",
    "add_n",
    "argmax",
    "argmin",
    "cast",
    "clip_by_value",
    "cos",
    "divide",
    "equal",
    "exp",
    "floordiv",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "log",
    "log1p",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "matmul",
    "maximum",
    "minimum",
    "mod",
    "multiply",
    "negative",
    "not_equal",
    "pow",
    "range",
    "reduce_max",
    "reduce_mean",
    "reduce_min",
    "reduce_prod",
    "reduce_sum",
    "relu",
    "rsqrt",
    "sigmoid",
    "sign",
    "sin",
    "softplus",
    "sqrt",
    "square",
    "subtract",
    "tanh",
]

_pyrange = builtins.range  # `range` and `abs` below are dcf ops
_pyabs = builtins.abs


# --------------------------------------------------------------- conversion
def _const_like(value: Any, dtype: dtypes.DType, graph: Any) -> Tensor:
    """A Python/numpy operand as a Const of the dtype of the tensor it meets."""
    kind = np.asarray(value).dtype.kind
    ok = kind in "iu" if dtype.is_integer else kind in "iuf" if dtype.is_floating else kind == "b"
    if not ok:
        raise TypeError(
            f"cannot use {value!r} ({np.asarray(value).dtype}) with a {dtype} "
            "tensor; convert it with dcf.cast or dcf.constant(..., dtype=)"
        )
    try:
        with np.errstate(over="ignore", invalid="ignore"):   # (checked just below)
            v = as_value(value, dtype)
    except OverflowError:
        v = None
    if v is None or changed_by_cast(value, v, dtype):       # (a float may round)
        raise TypeError(f"cannot use {value!r} with a {dtype} tensor: it does not fit {dtype}; "
                        "cast the tensor to a wider dtype with dcf.cast")
    return _const(v, dtype, graph)


def _pair(x: Any, y: Any) -> tuple[Tensor, Tensor]:
    """Both operands as tensors; a non-tensor takes the other operand's dtype."""
    # a list holding tensors is packed into one, as TF1 (x + [n, 1.0])
    if isinstance(x, (list, tuple)) and _holds_tensor(x):
        x = convert_to_tensor(x)
    if isinstance(y, (list, tuple)) and _holds_tensor(y):
        y = convert_to_tensor(y)
    xt, yt = _is_tensorlike(x), _is_tensorlike(y)
    if xt:
        x = convert_to_tensor(x)
    if yt:
        y = convert_to_tensor(y)
    if xt and not yt:
        y = _const_like(y, x.dtype, x.graph)
    elif yt and not xt:
        x = _const_like(x, y.dtype, y.graph)
    elif not xt and not yt:
        dx, dy = dtypes.infer_dtype(x), dtypes.infer_dtype(y)
        dt = dx if dx is dy or dx.is_floating else dy
        x, y = _const_like(x, dt, None), _const_like(y, dt, None)
    return x, y


_KINDS = {
    "numeric": ("int or float", lambda d: d.is_integer or d.is_floating),
    "float": ("float", lambda d: d.is_floating),
    "bool": ("bool", lambda d: d.is_bool),
    "any": ("any", lambda d: True),
}


def _check_kind(t: TensorType, kind: str) -> None:
    desc, ok = _KINDS[kind]
    if not ok(t.dtype):
        raise TypeError(f"does not support {t.dtype} tensors (needs {desc}), got {t}")


def _binary_infer(kind: str, bool_out: bool):
    def infer(a: TensorType, b: TensorType) -> TensorType:
        out = binary_infer(a, b)
        _check_kind(a, kind)
        return TensorType(dtypes.bool_, out.shape) if bool_out else out

    return infer


def _unary_infer(kind: str):
    def infer(x: TensorType) -> TensorType:
        _check_kind(x, kind)
        return x

    return infer


# ------------------------------------------------- broadcasting in gradients
def _reduction_plan(xs: tuple | None, others: list) -> tuple[int, list[int]] | None:
    """How to sum a gradient shaped like broadcast(x, *others) down to x's shape:
    (number of leading axes to drop, x's axes to sum keeping them), or None when
    some axis may or may not have been broadcast (decided at run time then)."""
    if xs is None or any(o is None for o in others):
        return None
    n = builtins.max([len(xs)] + [len(o) for o in others])
    lead = n - len(xs)
    keep = []
    for i, d in enumerate(xs):
        j = i + lead
        ods = [o[j - n + len(o)] for o in others if j - n + len(o) >= 0]
        if d == 1:
            if any(od != 1 for od in ods):
                keep.append(i)  # summing a size-1 output axis with keepdims is harmless
        elif d is None and any(od != 1 for od in ods):
            return None
    return lead, keep


def _sum_to(g: Tensor | None, x: Tensor, *others: Any) -> Tensor | None:
    """Sum `g` (shaped like the broadcast of x with `others`, tensors or static shapes)
    down to x's shape: statically when the shapes say which axes were broadcast, else with
    BroadcastGradientArgs at run time."""
    if g is None:
        return None
    shapes = [o.shape if isinstance(o, Tensor) else o for o in others]
    plan = _reduction_plan(x.shape, shapes)
    if plan is None and g.shape is not None:
        plan = _reduction_plan(x.shape, [g.shape])
    if plan is None:
        sx = shape(x)
        r, _ = broadcast_gradient_args(sx, shape(g))
        return reshape(reduce_sum(g, r), sx)
    lead, keep = plan
    if not lead and not keep:
        return g
    axes = list(_pyrange(lead)) + [lead + k for k in keep]
    if not keep:
        return reduce_sum(g, axes)
    out = reduce_sum(g, axes, keepdims=True)
    return squeeze(out, list(_pyrange(lead))) if lead else out


# ------------------------------------------------------------ binary ops
def _tanh_grad(xp, y, dy):
    if y.ndim == 0 or y.shape != dy.shape:  # in place only when no broadcasting
        return dy * (1 - y * y)
    out = y * y
    xp.subtract(1, out, out=out)
    out *= dy
    return out


def _sigmoid_grad(xp, y, dy):
    if y.ndim == 0 or y.shape != dy.shape:
        return dy * y * (1 - y)
    out = 1 - y
    out *= y
    out *= dy
    return out


# Zero arrays shaped like a kernel's input (read-only, shared). numpy's fast (SIMD) loop
# for maximum runs only when both operands are arrays of one shape: np.maximum(x, 0) on a
# 64x64 float32 x takes ~2.3 us, np.maximum(x, zeros) ~0.9 us, with the same result bit
# for bit (tests/ops/test_fused_kernels.py). (ReluGrad's dy * (y > 0) gains nothing
# from it: comparing with a scalar is already fast, the float * bool product is not.)
_ZEROS: dict = {}


def _zeros_for(x: np.ndarray) -> np.ndarray:
    key = (x.shape, x.dtype.char)
    z = _ZEROS.get(key)
    if z is None:
        if len(_ZEROS) >= 256:   # many shapes (dynamic batch sizes): start over
            _ZEROS.clear()
        z = np.zeros(x.shape, x.dtype)
        z.flags.writeable = False
        _ZEROS[key] = z
    return z


def _relu(xp, x):
    return xp.maximum(x, 0)


@_binds(_relu)
def _bind_relu(xp):
    if xp is not np:
        return None
    maximum, ndarray, zeros_for = np.maximum, np.ndarray, _zeros_for

    def relu(x):
        if type(x) is not ndarray or not x.ndim:
            return maximum(x, 0)
        return maximum(x, zeros_for(x))

    return relu


# numpy scalar types whose Python comparisons are numpy's own
_REAL_SCALARS = dtypes.NUMPY_SCALARS


# float16's minimum/maximum loops order signed zeros differently: ufunc for those
_MINMAX_SCALARS = _REAL_SCALARS - {np.float16}


def _minimum(xp, a, b):
    if type(a) is type(b) and type(a) in _MINMAX_SCALARS and xp is np:
        # numpy's own rule, without a ufunc call on two scalars (~0.9 us): a NaN wins,
        # and on a tie (0.0 vs -0.0) the second operand
        return a if a < b or a != a else b
    return xp.minimum(a, b)


def _maximum(xp, a, b):
    if type(a) is type(b) and type(a) in _MINMAX_SCALARS and xp is np:
        return a if a > b or a != a else b
    return xp.maximum(a, b)


def _int_zero(b) -> bool:
    """Whether integer divisor b holds a zero (False for floats)."""
    dt = getattr(b, "dtype", None)
    if dt is None:
        return type(b) is int and b == 0
    return dt.kind in "iu" and not b.all()


def _floordiv(xp, a, b):
    # integer division by zero is an error on the host, as in TensorFlow's CPU kernels
    # (numpy would give 0 with a warning); on a GPU it is not checked (a check would wait
    # for the device)
    if xp is np and _int_zero(b):
        raise ZeroDivisionError("integer division by zero")
    if getattr(a, "dtype", None) is not None and a.dtype.kind == "f":
        # floats: floor(a / b), as TensorFlow (1.0 // 0.1 is 10, inf // 2 is inf); numpy's
        # a // b floors the exact quotient of the two binary values (9, and nan for inf)
        q = a / b
        return xp.floor(q, out=q) if type(q) is xp.ndarray else xp.floor(q)
    return a // b


def _floormod(xp, a, b):
    if xp is np and _int_zero(b):
        raise ZeroDivisionError("integer modulo by zero")
    return a % b


# fmt: off
#   type          kernel (xp = numpy or cupy)           dtypes     bool out
_BINARY = [
    ("Add",        lambda xp, a, b: a + b,               "numeric", False),
    ("Sub",        lambda xp, a, b: a - b,               "numeric", False),
    ("Mul",        lambda xp, a, b: a * b,               "numeric", False),
    ("RealDiv",    lambda xp, a, b: a / b,               "float",   False),
    ("FloorDiv",   _floordiv,                            "numeric", False),
    ("FloorMod",   _floormod,                            "numeric", False),
    ("Pow",        lambda xp, a, b: a ** b,              "numeric", False),
    ("Maximum",    _maximum,                             "numeric", False),
    ("Minimum",    _minimum,                             "numeric", False),
    ("Equal",      lambda xp, a, b: a == b,              "any",     True),
    ("NotEqual",   lambda xp, a, b: a != b,              "any",     True),
    ("Less",       lambda xp, a, b: a < b,               "numeric", True),
    ("LessEqual",  lambda xp, a, b: a <= b,              "numeric", True),
    ("Greater",    lambda xp, a, b: a > b,               "numeric", True),
    ("GreaterEqual", lambda xp, a, b: a >= b,            "numeric", True),
    ("LogicalAnd", lambda xp, a, b: a & b,               "bool",    True),
    ("LogicalOr",  lambda xp, a, b: a | b,               "bool",    True),
    # fused backward ops of tanh/sigmoid/relu: (y, dy) and (dy, y)
    ("TanhGrad",   _tanh_grad,                           "float",   False),
    ("SigmoidGrad", _sigmoid_grad,                       "float",   False),
    ("ReluGrad",   lambda xp, dy, y: dy * (y > 0),       "numeric", False),
]
# fmt: on
for _type, _kernel, _kind, _bool_out in _BINARY:
    register(OpDef(_type, infer=_binary_infer(_kind, _bool_out), kernel=_kernel,
                   gpu_kernel=raw_gpu(_type, _kernel) if _type in RAW_SINGLE else None))
not_differentiable(
    "FloorDiv",
    "Equal",
    "NotEqual",
    "Less",
    "LessEqual",
    "Greater",
    "GreaterEqual",
    "LogicalAnd",
    "LogicalOr",
)


def _binary_grad(type_: str):
    def deco(fn):
        def grad(op, g):
            x, y = op.inputs
            gx, gy = fn(op, g, x, y)
            return [_sum_to(gx, x, y), _sum_to(gy, y, x)]

        return _gradient(type_)(grad)

    return deco


@_binary_grad("Add")
def _add_grad(op, g, x, y):
    return g, g


@_binary_grad("Sub")
def _sub_grad(op, g, x, y):
    return g, -g


@_binary_grad("Mul")
def _mul_grad(op, g, x, y):
    return g * y, x * g


@_binary_grad("RealDiv")
def _div_grad(op, g, x, y):
    return g / y, -g * op.outputs[0] / y


@_binary_grad("FloorMod")
def _floor_mod_grad(op, g, x, y):
    return g, -g * floordiv(x, y)


@_binary_grad("Pow")
def _pow_grad(op, g, x, y):
    z = op.outputs[0]
    log_x = select(x > 0, log(select(x > 0, x, ones_like(x))), zeros_like(x))
    return g * y * pow(x, y - 1), g * z * log_x


@_binary_grad("Maximum")
def _maximum_grad(op, g, x, y):
    mask, z = greater_equal(x, y), zeros_like(g)
    return select(mask, g, z), select(mask, z, g)


@_binary_grad("Minimum")
def _minimum_grad(op, g, x, y):
    mask, z = less_equal(x, y), zeros_like(g)
    return select(mask, g, z), select(mask, z, g)


@_gradient("TanhGrad")
def _tanh_grad_grad(op, g):
    y, dy = op.inputs
    return [g * dy * (y * -2), apply("TanhGrad", [y, g])]


@_gradient("SigmoidGrad")
def _sigmoid_grad_grad(op, g):
    y, dy = op.inputs
    return [g * dy * (1 - y * 2), apply("SigmoidGrad", [y, g])]


@_gradient("ReluGrad")
def _relu_grad_grad(op, g):
    # relu's output has a path to its gradient: zeros, not None (as TF)
    return [apply("ReluGrad", [g, op.inputs[1]]), zeros_like(op.inputs[1])]


# ------------------------------------------------------------- unary ops
def _quiet_overflow(xp):
    """numpy warns when exp overflows to inf, the right limit in sigmoid; cupy never warns."""
    es = getattr(xp, "errstate", None)
    return es(over="ignore") if es is not None else contextlib.nullcontext()


def _sigmoid(xp, x):
    # 1/(1+exp(-x)) in place: as fast as 0.5*tanh(0.5x)+0.5 (4 ufunc calls on 64x64) and,
    # unlike it, accurate relative to tiny results for very negative x
    if x.dtype == np.float16:
        # in float16 exp(-x) overflows for x < -11.1, where sigmoid is still 1.5e-5 (and
        # representable down to x = -17.3): computed in float32 and rounded, as TF's
        return _sigmoid(xp, x.astype(np.float32)).astype(np.float16)
    with _quiet_overflow(xp):
        if x.ndim == 0:
            return 1 / (1 + xp.exp(-x))
        y = xp.negative(x)
        xp.exp(y, out=y)
        y += 1
        xp.reciprocal(y, out=y)
        return y


# fmt: off
#   type          kernel                                dtypes     gradient (op, g, x, y) -> dx
_UNARY = [
    ("Neg",        lambda xp, x: -x,                     "numeric", lambda op, g, x, y: -g),
    ("Abs",        lambda xp, x: xp.abs(x),              "numeric", lambda op, g, x, y: g * sign(x)),
    ("Sign",       lambda xp, x: xp.sign(x),             "numeric", lambda op, g, x, y: zeros_like(g)),
    ("Square",     lambda xp, x: x * x,                  "numeric", lambda op, g, x, y: g * (x * 2)),
    ("Sqrt",       lambda xp, x: xp.sqrt(x),             "float",   lambda op, g, x, y: g * 0.5 / y),
    ("Rsqrt",      lambda xp, x: 1 / xp.sqrt(x),         "float",
     lambda op, g, x, y: g * (y * y * y) * -0.5),
    ("Exp",        lambda xp, x: xp.exp(x),              "float",   lambda op, g, x, y: g * y),
    ("Log",        lambda xp, x: xp.log(x),              "float",   lambda op, g, x, y: g / x),
    ("Log1p",      lambda xp, x: xp.log1p(x),            "float",   lambda op, g, x, y: g / (x + 1)),
    ("Tanh",       lambda xp, x: xp.tanh(x),             "float",
     lambda op, g, x, y: apply("TanhGrad", [y, g])),
    ("Sigmoid",    _sigmoid,                             "float",
     lambda op, g, x, y: apply("SigmoidGrad", [y, g])),
    ("Relu",       _relu,                                "numeric",
     lambda op, g, x, y: apply("ReluGrad", [g, y])),
    ("Softplus",   lambda xp, x: xp.logaddexp(x, 0),     "float",   lambda op, g, x, y: g * sigmoid(x)),
    ("Sin",        lambda xp, x: xp.sin(x),              "float",   lambda op, g, x, y: g * cos(x)),
    ("Cos",        lambda xp, x: xp.cos(x),              "float",   lambda op, g, x, y: -g * sin(x)),
    ("LogicalNot", lambda xp, x: ~x,                     "bool",    None),
]
# fmt: on


def _unary_grad(fn):
    return lambda op, g: [fn(op, g, op.inputs[0], op.outputs[0])]


for _type, _ukernel, _kind, _grad in _UNARY:
    register(OpDef(_type, infer=_unary_infer(_kind), kernel=_ukernel,
                   gpu_kernel=raw_gpu(_type, _ukernel) if _type in RAW_SINGLE else None))
    if _grad is None:
        not_differentiable(_type)
    else:
        _gradient(_type)(_unary_grad(_grad))


# --------------------------------------------------------------- wrappers
def add(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x + y`` elementwise, with numpy broadcasting."""
    return apply("Add", list(_pair(x, y)), name)


def subtract(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x - y`` elementwise."""
    return apply("Sub", list(_pair(x, y)), name)


def multiply(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x * y`` elementwise."""
    return apply("Mul", list(_pair(x, y)), name)


def divide(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x / y`` (true division); integer inputs are divided as float64 (as TF and numpy)."""
    x, y = _pair(x, y)
    if x.dtype.is_integer and y.dtype is x.dtype:
        x, y = cast(x, dtypes.float64), cast(y, dtypes.float64)
    return apply("RealDiv", [x, y], name)


def floordiv(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x // y`` (rounds toward -inf); for floats ``floor(x / y)``, as TensorFlow (so
    ``1.0 // 0.1`` is 10.0, where numpy gives 9.0). Not differentiable."""
    return apply("FloorDiv", list(_pair(x, y)), name)


def mod(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x % y`` (the result has the sign of y, as in Python and numpy)."""
    return apply("FloorMod", list(_pair(x, y)), name)


def pow(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x ** y`` elementwise."""
    return apply("Pow", list(_pair(x, y)), name)


def maximum(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``np.maximum(x, y)``; on ties the gradient goes to x."""
    return apply("Maximum", list(_pair(x, y)), name)


def minimum(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``np.minimum(x, y)``; on ties the gradient goes to x."""
    return apply("Minimum", list(_pair(x, y)), name)


def equal(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x == y`` elementwise, a bool tensor (``Tensor.__eq__`` stays identity)."""
    return apply("Equal", list(_pair(x, y)), name)


def not_equal(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x != y`` elementwise, a bool tensor."""
    return apply("NotEqual", list(_pair(x, y)), name)


def less(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x < y`` elementwise, a bool tensor."""
    return apply("Less", list(_pair(x, y)), name)


def less_equal(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x <= y`` elementwise, a bool tensor."""
    return apply("LessEqual", list(_pair(x, y)), name)


def greater(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x > y`` elementwise, a bool tensor."""
    return apply("Greater", list(_pair(x, y)), name)


def greater_equal(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x >= y`` elementwise, a bool tensor."""
    return apply("GreaterEqual", list(_pair(x, y)), name)


def logical_and(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x & y`` on bool tensors."""
    return apply("LogicalAnd", list(_pair(x, y)), name)


def logical_or(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x | y`` on bool tensors."""
    return apply("LogicalOr", list(_pair(x, y)), name)


def logical_xor(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x ^ y`` on bool tensors: ``(x | y) & ~(x & y)``, as TF builds it."""
    return logical_and(logical_or(x, y), logical_not(logical_and(x, y)), name)


def logical_not(x: Any, name: str | None = None) -> Tensor:
    """``~x`` on a bool tensor."""
    return apply("LogicalNot", [x], name)


def negative(x: Any, name: str | None = None) -> Tensor:
    """``-x``."""
    return apply("Neg", [x], name)


def abs(x: Any, name: str | None = None) -> Tensor:
    """``np.abs(x)``."""
    return apply("Abs", [x], name)


def sign(x: Any, name: str | None = None) -> Tensor:
    """``np.sign(x)`` (-1, 0 or 1). Its gradient is zero everywhere (as TF's)."""
    return apply("Sign", [x], name)


def square(x: Any, name: str | None = None) -> Tensor:
    """``x * x``."""
    return apply("Square", [x], name)


def sqrt(x: Any, name: str | None = None) -> Tensor:
    """``np.sqrt(x)``."""
    return apply("Sqrt", [x], name)


def rsqrt(x: Any, name: str | None = None) -> Tensor:
    """``1 / np.sqrt(x)``."""
    return apply("Rsqrt", [x], name)


def exp(x: Any, name: str | None = None) -> Tensor:
    """``np.exp(x)``."""
    return apply("Exp", [x], name)


def log(x: Any, name: str | None = None) -> Tensor:
    """``np.log(x)`` (natural logarithm)."""
    return apply("Log", [x], name)


def log1p(x: Any, name: str | None = None) -> Tensor:
    """``np.log1p(x)``, i.e. log(1 + x), accurate for small x."""
    return apply("Log1p", [x], name)


def tanh(x: Any, name: str | None = None) -> Tensor:
    """``np.tanh(x)``."""
    return apply("Tanh", [x], name)


def sigmoid(x: Any, name: str | None = None) -> Tensor:
    """``1 / (1 + np.exp(-x))``, finite for all x."""
    return apply("Sigmoid", [x], name)


def relu(features: Any, name: str | None = None) -> Tensor:
    """``np.maximum(features, 0)``."""
    return apply("Relu", [features], name)


def softplus(features: Any, name: str | None = None) -> Tensor:
    """``np.log(1 + np.exp(features))``, computed without overflow."""
    return apply("Softplus", [features], name)


def sin(x: Any, name: str | None = None) -> Tensor:
    """``np.sin(x)``."""
    return apply("Sin", [x], name)


def cos(x: Any, name: str | None = None) -> Tensor:
    """``np.cos(x)``."""
    return apply("Cos", [x], name)


# ------------------------------------------------------------------ add_n
def _add_n_infer(*xs: TensorType) -> TensorType:
    out = xs[0]
    _check_kind(out, "numeric")
    for x in xs[1:]:
        if x.dtype is not out.dtype:
            raise TypeError(f"inputs differ in dtype: {xs[0]} vs {x}")
        if out.shape is None:
            out = x
        elif x.shape is not None:
            if len(x.shape) != len(out.shape) or any(
                a is not None and b is not None and a != b for a, b in zip(x.shape, out.shape)
            ):
                raise InvalidArgumentError(f"inputs differ in shape: {xs[0]} vs {x}")
            merged = tuple(a if a is not None else b for a, b in zip(out.shape, x.shape))
            out = TensorType(out.dtype, merged)
    return out


def _add_n(xp, *xs):
    out = xs[0]
    for x in xs[1:]:
        if x.shape != out.shape:
            # (numpy would broadcast: a sum of another shape than an input, whose
            # gradient, the sum's, is then not of that input's shape)
            raise InvalidArgumentError(
                f"inputs differ in shape: {list(out.shape)} vs {list(x.shape)}")
    for i, x in enumerate(xs[1:]):
        # from the second addition on, `out` is our own buffer: accumulate in place
        out = xp.add(out, x, out=out) if i and out.ndim else out + x
    return out


register(OpDef("AddN", infer=_add_n_infer, kernel=_add_n, gpu_kernel=add_n_gpu(_add_n)))
RegisterGradient("AddN")(lambda op, g: [g] * len(op.inputs))


def add_n(inputs: Any, name: str | None = None) -> Tensor:
    """``sum(inputs)`` for a list of tensors of one dtype and shape."""
    inputs = list(inputs)
    if not inputs:
        raise ValueError("add_n needs at least one input")
    return apply("AddN", inputs, name)


# ------------------------------------------------------------------- cast
def _cast_infer(x: TensorType, *, dtype: dtypes.DType) -> TensorType:
    return TensorType(dtype, x.shape)


def _cast(xp, x, *, dtype):
    return x.astype(dtype.np)


def _exact_scalar_cast(src: np.dtype, dst: np.dtype) -> bool:
    """Whether dst's scalar type, called on a src scalar, gives exactly what astype does:
    casts that lose nothing (numpy's "safe"), and ints of <= 32 bits to floats (exact in
    float64, so one rounding either way). Narrowing and float-to-int casts can differ
    (astype wraps, the constructor raises) and keep astype."""
    if np.can_cast(src, dst, "safe"):
        return True
    return src.kind in "biu" and src.itemsize <= 4 and dst.kind == "f"


@_binds(_cast)
def _bind_cast(xp, *, dtype):
    to = dtype.np
    make = to.type
    exact = frozenset(t for t in _REAL_SCALARS if _exact_scalar_cast(np.dtype(t), to))

    def cast(x):
        if type(x) in exact:
            return make(x)  # a numpy scalar: ~2x cheaper than its astype
        return x.astype(to)

    return cast


register(OpDef("Cast", infer=_cast_infer, kernel=_cast))


@_gradient("Cast")
def _cast_grad(op, g):
    x = op.inputs[0]
    if x.dtype.is_floating and op.outputs[0].dtype.is_floating:
        return [cast(g, x.dtype)]
    return [None]


def cast(x: Any, dtype: Any, name: str | None = None) -> Tensor:
    """``x.astype(dtype)`` (float to int truncates toward 0; nonzero to bool is True).

    Returns x itself when it already has that dtype.
    """
    dt = dtypes.as_dtype(dtype)
    x = convert_to_tensor(x)
    if x.dtype is dt:
        return x
    return apply("Cast", [x], name, dtype=dt)


# ----------------------------------------------------------------- matmul
def _matmul_dims(t: TensorType, transpose: bool) -> tuple:
    assert t.shape is not None
    m, k = t.shape[-2:]
    return (k, m) if transpose else (m, k)


def _matmul_check(
    a: TensorType,
    b: TensorType,
    transpose_a: bool,
    transpose_b: bool,
    min_rank: int,
    max_rank: int | None,
) -> tuple:
    if a.dtype is not b.dtype:
        raise TypeError(f"dtypes differ: {a.dtype} vs {b.dtype}; cast one with dcf.cast")
    if a.dtype.is_bool:
        raise TypeError(f"does not support bool tensors, got {a}")
    for t, what in ((a, "a"), (b, "b")):
        r = None if t.shape is None else len(t.shape)
        if r is not None and not min_rank <= r <= (max_rank or r):
            need = "rank 2" if max_rank == 2 else "rank >= 2"
            raise InvalidArgumentError(f"{what} must have {need}, got {t}")
    if a.shape is None or b.shape is None:
        return None, None
    (m, k1), (k2, n) = _matmul_dims(a, transpose_a), _matmul_dims(b, transpose_b)
    if k1 is not None and k2 is not None and k1 != k2:
        ta, tb = " (transposed)" * transpose_a, " (transposed)" * transpose_b
        raise InvalidArgumentError(f"inner dimensions differ: a is {a}{ta}, b is {b}{tb}")
    return m, n


def _matmul_infer(
    a: TensorType, b: TensorType, *, transpose_a: bool, transpose_b: bool
) -> TensorType:
    m, n = _matmul_check(a, b, transpose_a, transpose_b, 2, 2)
    return TensorType(a.dtype, (m, n))


def _batch_matmul_infer(
    a: TensorType, b: TensorType, *, transpose_a: bool, transpose_b: bool
) -> TensorType:
    m, n = _matmul_check(a, b, transpose_a, transpose_b, 2, None)
    if a.shape is None or b.shape is None:
        return TensorType(a.dtype, None)
    return TensorType(a.dtype, (broadcast_shape(a.shape[:-2], b.shape[:-2]) or ()) + (m, n))


def _matmul(xp, a, b, *, transpose_a, transpose_b):
    return (a.T if transpose_a else a) @ (b.T if transpose_b else b)


def _batch_matmul(xp, a, b, *, transpose_a, transpose_b):
    if a.ndim < 2 or b.ndim < 2:
        # (numpy would take a vector as a matrix of one row or column: another rank than
        # inferred, and an error in the gradient)
        raise InvalidArgumentError(f"matmul needs values of rank >= 2, got shapes "
                                   f"{list(a.shape)} and {list(b.shape)}")
    return (xp.swapaxes(a, -1, -2) if transpose_a else a) @ (
        xp.swapaxes(b, -1, -2) if transpose_b else b
    )


@_binds(_matmul)
def _bind_matmul(xp, *, transpose_a, transpose_b):
    if not transpose_a and not transpose_b:
        return operator.matmul
    if transpose_a and not transpose_b:
        return lambda a, b: a.T @ b
    if not transpose_a:
        return lambda a, b: a @ b.T
    return lambda a, b: a.T @ b.T


register(OpDef("MatMul", infer=_matmul_infer, kernel=_matmul,
               gpu_kernel=matmul_gpu(_matmul)))
register(OpDef("BatchMatMulV2", infer=_batch_matmul_infer, kernel=_batch_matmul,
               gpu_kernel=batch_matmul_gpu(_batch_matmul)))


def _matmul_grads(op, g) -> tuple[Tensor, Tensor]:
    a, b = op.inputs
    ta, tb = op.attrs["transpose_a"], op.attrs["transpose_b"]
    if not ta and not tb:
        return matmul(g, b, transpose_b=True), matmul(a, g, transpose_a=True)
    if ta and not tb:
        return matmul(b, g, transpose_b=True), matmul(a, g)
    if not ta and tb:
        return matmul(g, b), matmul(g, a, transpose_a=True)
    return matmul(b, g, transpose_a=True, transpose_b=True), matmul(
        g, a, transpose_a=True, transpose_b=True
    )


@_gradient("MatMul")
def _matmul_grad(op, g):
    return list(_matmul_grads(op, g))


@_gradient("BatchMatMulV2")
def _batch_matmul_grad(op, g):
    a, b = op.inputs
    ga, gb = _matmul_grads(op, g)

    def batch_only(t):  # the matrix axes are never broadcast
        return None if t.shape is None else t.shape[:-2] + (1, 1)

    return [_sum_to(ga, a, batch_only(b)), _sum_to(gb, b, batch_only(a))]


def matmul(
    a: Any, b: Any, transpose_a: bool = False, transpose_b: bool = False, name: str | None = None
) -> Tensor:
    """``(a.T if transpose_a else a) @ (b.T if transpose_b else b)``.

    Inputs of rank > 2 are stacks of matrices (numpy matmul: batch axes broadcast, and
    transposes swap the last two axes). Raises InvalidArgumentError when the inner
    dimensions differ.
    """
    a, b = _pair(a, b)
    type_ = "MatMul" if a.type.rank == 2 and b.type.rank == 2 else "BatchMatMulV2"
    return apply(type_, [a, b], name, transpose_a=bool(transpose_a), transpose_b=bool(transpose_b))


# ------------------------------------------------------------- reductions
def _reduce_infer(
    x: TensorType, *dyn: TensorType, axis: tuple | None, keepdims: bool
) -> TensorType:
    _check_kind(x, "numeric")
    r = None if x.shape is None else len(x.shape)
    if dyn:
        a = dyn[0]
        _check_int(a, "axis")
        if r is None:
            return TensorType(x.dtype, None)
        if keepdims:
            return TensorType(x.dtype, (None,) * r)
        if a.shape == ():
            return TensorType(x.dtype, (None,) * (r - 1))
        if a.shape is not None and len(a.shape) == 1 and a.shape[0] is not None:
            return TensorType(x.dtype, (None,) * builtins.max(r - a.shape[0], 0))
        return TensorType(x.dtype, None)
    if axis is None:
        if not keepdims:
            return TensorType(x.dtype, ())
        return TensorType(x.dtype, None if r is None else (1,) * r)
    if x.shape is None:
        return TensorType(x.dtype, None)
    axes = {_norm_axis(a, r) for a in axis}
    if len(axes) != len(axis):
        raise InvalidArgumentError(f"duplicate axes in {list(axis)} for {x}")
    if keepdims:
        return TensorType(x.dtype, tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    return TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def _axis_value(a):
    """A dynamic axis input as numpy's axis argument."""
    return int(a) if a.ndim == 0 else _ints(a)


# a max / min over no elements is the reduction's identity (TF's; numpy raises): the
# lowest value of the dtype for a max, the highest for a min
_EMPTY_EXTREME = {"max": 0, "min": 1}


def _empty_extreme(xp, method, x, axis, keepdims):
    shape = np.add.reduce(np.empty(x.shape, np.int8), axis=axis, keepdims=keepdims).shape
    lo, hi = (-np.inf, np.inf) if x.dtype.kind == "f" else \
        (np.iinfo(x.dtype).min, np.iinfo(x.dtype).max)
    out = xp.full(shape, (lo, hi)[_EMPTY_EXTREME[method]], x.dtype)
    return out[()] if out.ndim == 0 else out


def _int_mean(xp, x, axis, keepdims):
    """An integer mean as TF's: the sum (in 64 bits, which wrap only for int64), divided
    by the count with the quotient truncated toward 0, all in integers (numpy's mean
    sums in x's dtype and divides in float64, which rounds int64 sums past 2**53)."""
    acc = x.dtype if x.dtype.itemsize == 8 else np.dtype(x.dtype.kind + "8")
    s = x.sum(axis=axis, dtype=acc, keepdims=keepdims)
    n = x.size // builtins.max(s.size, 1)
    if n == 0:   # a mean of no integers is 0, as TF's (numpy's 0 / 0 cast was INT_MIN)
        out = xp.zeros_like(s, dtype=x.dtype)
    else:
        q = s // n
        out = (q + ((s < 0) & (q * n != s))).astype(x.dtype)   # floor to truncation
    return out[()] if out.ndim == 0 else out


def _reducer(method: str, dtype_rule: str):
    """Reduction kernel calling the array method (faster than np.sum's Python dispatch).

    dtype_rule: "same" keeps the input dtype (numpy widens int32 sums to int64), "int"
    keeps it for ints only (a float16 mean accumulates in float32), "" leaves it to numpy.
    """

    def kernel(xp, x, *dyn, axis, keepdims):
        if dyn:
            axis = _axis_value(dyn[0])
        if method == "mean" and x.dtype.kind in "iu":
            return _int_mean(xp, x, axis, keepdims)
        if method in _EMPTY_EXTREME and x.size == 0:
            return _empty_extreme(xp, method, x, axis, keepdims)
        f = getattr(x, method)
        if dtype_rule == "same" or (dtype_rule == "int" and x.dtype.kind in "iu"):
            out = f(axis=axis, dtype=x.dtype, keepdims=keepdims)
        else:
            out = f(axis=axis, keepdims=keepdims)
        return out[()] if out.ndim == 0 else out

    ufunc = _REDUCE_UFUNC.get(method)

    @_binds(kernel)
    def bind(xp, *, axis, keepdims):
        if xp is not np:
            return None
        if method == "mean":
            return _bind_mean(kernel, axis, keepdims)
        if ufunc is None:
            return None
        reduce = ufunc.reduce
        same = dtype_rule == "same"

        small = _small_last_axis(ufunc, method, axis, keepdims)

        # x.sum(...) / x.max(...) are these same ufunc reductions, reached through
        # numpy's Python wrappers (_methods.py)
        def reducer(x, *dyn):
            if dyn or type(x) is not np.ndarray:
                return kernel(xp, x, *dyn, axis=axis, keepdims=keepdims)
            if small is not None and x.ndim == 2 and 2 <= x.shape[1] <= 4 and \
                    x.dtype.char in small:
                return _reduce_columns(ufunc, x)
            if same:
                out = reduce(x, axis=axis, dtype=x.dtype, keepdims=keepdims)
            else:
                try:
                    out = reduce(x, axis=axis, keepdims=keepdims)
                except ValueError:   # a max/min over no elements (numpy's error)
                    return kernel(xp, x, axis=axis, keepdims=keepdims)
            return out[()] if out.ndim == 0 else out

        return reducer

    return kernel


_REDUCE_UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def _small_last_axis(ufunc: Any, method: str, axis: Any, keepdims: bool) -> str | None:
    """The dtype chars for which a max/min of a [n, k<=4] array over its last axis is
    done column by column (see _reduce_columns), or None where it never is."""
    if keepdims or axis not in ((1,), (-1,)) or method not in ("max", "min"):
        return None
    return "efdgbhilqBHILQ"      # exact: the same comparisons, any order


def _reduce_columns(ufunc: Any, x: np.ndarray) -> np.ndarray:
    """ufunc.reduce(x, axis=1) of a [n, k] array with 2 <= k <= 4, for maximum/minimum,
    as k-1 ufunc calls on its columns (~0.7 us instead of ~3.2 us for n=64, k=2: numpy's
    reduction of a short contiguous axis runs its inner loop once per row). The same
    comparisons of the same values, so the same bits (NaNs win either way). (A sum
    column by column is no faster: it needs numpy's +0.0 start as a third call.)"""
    out = ufunc(x[:, 0], x[:, 1])
    for j in _pyrange(2, x.shape[1]):
        ufunc(out, x[:, j], out=out)
    return out


def _bind_mean(kernel: Any, axis: Any, keepdims: bool) -> Any:
    """x.mean() for float32/float64 x without numpy's Python `_mean`: the same pairwise
    sum (np.add.reduce) divided by the count. numpy divides by an np.intp count, so in
    float64, and rounds back to float32; dividing in float32 by a count that float32
    holds exactly (n <= 2**24) is the same correctly rounded quotient (double rounding
    is harmless for a division when 53 >= 2 * 24 + 2), and ~20x cheaper on a scalar."""
    add, true_divide = np.add.reduce, np.true_divide
    axes = None if axis is None else (axis,) if isinstance(axis, (int, np.integer)) else \
        tuple(axis)

    def mean(x, *dyn):
        if dyn or type(x) is not np.ndarray or x.dtype.char not in "fd":
            return kernel(np, x, *dyn, axis=axis, keepdims=keepdims)
        if axes is None:
            n = x.size
        else:
            n = 1
            shp, nd = x.shape, x.ndim
            for a in axes:
                n *= shp[a + nd if a < 0 else a]
        if not 0 < n <= 16777216:
            return kernel(np, x, axis=axis, keepdims=keepdims)
        ret = add(x, axis=axis, keepdims=keepdims)
        if type(ret) is np.ndarray:
            ret = true_divide(ret, n, out=ret)
            return ret[()] if ret.ndim == 0 else ret
        return ret / n  # a numpy scalar of x's dtype (n is a weak Python int)

    return mean


# fmt: off
_REDUCE = [
    ("Sum",  "sum",  "same"),
    ("Prod", "prod", "same"),
    ("Mean", "mean", "int"),
    ("Max",  "max",  ""),
    ("Min",  "min",  ""),
]
# fmt: on
for _type, _method, _rule in _REDUCE:
    _k = _reducer(_method, _rule)
    register(OpDef(_type, infer=_reduce_infer, kernel=_k,
                   gpu_kernel=sum_gpu(_k, _axis_value) if _type == "Sum" else None))


def _axis_arg(op) -> Any:
    """The reduction's axes: a tuple, None (all), or the dynamic axis tensor."""
    return op.inputs[1] if len(op.inputs) > 1 else op.attrs["axis"]


def _kept(op, t: Tensor) -> Tensor:
    """t, shaped like the reduction's output, reshaped as if keepdims=True (a scalar from
    a full reduction is left alone: it broadcasts)."""
    x, axis = op.inputs[0], _axis_arg(op)
    if op.attrs["keepdims"] or axis is None:
        return t
    r = x.type.rank
    if isinstance(axis, tuple) and r is not None:
        axes = {a % r for a in axis}
        return strided_slice(
            t, tuple(None if i in axes else builtins.slice(None) for i in _pyrange(r))
        )
    axes_t = axis if isinstance(axis, Tensor) else _const(list(axis), dtypes.int32, x.graph)
    return reshape(t, reduced_shape(shape(x), axes_t))


@_gradient("Sum")
def _sum_grad(op, g):
    return [broadcast_to(_kept(op, g), _shape_of(op.inputs[0]))]


@_gradient("Mean")
def _mean_grad(op, g):
    x, y = op.inputs[0], op.outputs[0]
    grad = broadcast_to(_kept(op, g), _shape_of(x))
    # a float16 count may exceed float16's largest value (65504): divide in float32
    dt = dtypes.float32 if x.dtype is dtypes.float16 else x.dtype
    if _known(x.shape) and _known(y.shape):
        count = _const(_prod(x.shape) // builtins.max(_prod(y.shape), 1), dt, x.graph)
    else:
        count = cast(size(x), dt) / cast(maximum(size(y), 1), dt)
    return [cast(cast(grad, dt) / count, x.dtype)]


def _minmax_grad(op, g):
    x = op.inputs[0]
    ind = cast(equal(x, _kept(op, op.outputs[0])), x.dtype)
    num = reduce_sum(ind, _axis_arg(op), keepdims=True)
    return [ind / num * _kept(op, g)]


_gradient("Max")(_minmax_grad)
_gradient("Min")(_minmax_grad)


@_gradient("Prod")
def _prod_grad(op, g):
    # d prod / d x_i is the product of the other entries: with no zero that is prod / x_i,
    # with one zero it is nonzero only at the zero, with two or more zeros it is 0
    x, axis = op.inputs[0], _axis_arg(op)
    zero = equal(x, 0)
    xs = select(zero, ones_like(x), x)
    p = reduce_prod(xs, axis, keepdims=True)
    nz = reduce_sum(cast(zero, x.dtype), axis, keepdims=True)
    z = zeros_like(p)
    others = select(zero, select(equal(nz, 1), p, z), select(equal(nz, 0), p, z) / xs)
    return [_kept(op, g) * others]


def _reduce(type_: str, x: Any, axis: Any, keepdims: bool, name: str | None) -> Tensor:
    x = convert_to_tensor(x)
    if axis is not None and _is_tensorlike(axis):
        v = constant_value(axis)
        if v is None:
            return apply(type_, [x, axis], name, axis=None, keepdims=bool(keepdims))
        axis = v
    if axis is not None:
        axis = _static_axes(axis)
    return apply(type_, [x], name, axis=axis, keepdims=bool(keepdims))


def reduce_sum(
    input_tensor: Any, axis: Any = None, keepdims: bool = False, name: str | None = None
) -> Tensor:
    """``np.sum(input_tensor, axis, keepdims=keepdims)`` keeping the dtype.

    axis: None (all axes), an int, a list of ints, or an int tensor.
    """
    return _reduce("Sum", input_tensor, axis, keepdims, name)


def reduce_mean(
    input_tensor: Any, axis: Any = None, keepdims: bool = False, name: str | None = None
) -> Tensor:
    """``np.mean(input_tensor, axis, keepdims=keepdims)``; integer means truncate (as TF)."""
    return _reduce("Mean", input_tensor, axis, keepdims, name)


def reduce_max(
    input_tensor: Any, axis: Any = None, keepdims: bool = False, name: str | None = None
) -> Tensor:
    """``np.max(input_tensor, axis, keepdims=keepdims)``; ties share the gradient. Over no
    elements it is the dtype's lowest value (-inf for floats), as in TF."""
    return _reduce("Max", input_tensor, axis, keepdims, name)


def reduce_min(
    input_tensor: Any, axis: Any = None, keepdims: bool = False, name: str | None = None
) -> Tensor:
    """``np.min(input_tensor, axis, keepdims=keepdims)``; ties share the gradient. Over no
    elements it is the dtype's highest value (inf for floats), as in TF."""
    return _reduce("Min", input_tensor, axis, keepdims, name)


def reduce_prod(
    input_tensor: Any, axis: Any = None, keepdims: bool = False, name: str | None = None
) -> Tensor:
    """``np.prod(input_tensor, axis, keepdims=keepdims)`` keeping the dtype."""
    return _reduce("Prod", input_tensor, axis, keepdims, name)


# ---------------------------------------------------------- argmax, argmin
def _arg_infer(
    x: TensorType, *dyn: TensorType, axis: int | None, output_type: dtypes.DType
) -> TensorType:
    _check_kind(x, "numeric")
    if x.shape is not None and len(x.shape) == 0:
        raise InvalidArgumentError(f"needs a tensor of rank >= 1, got {x}")
    if dyn or x.shape is None:
        if dyn:
            _check_scalar_int(dyn[0], "axis")
        return TensorType(output_type, None if x.shape is None else (None,) * (len(x.shape) - 1))
    a = _norm_axis(axis if axis is not None else 0, len(x.shape))
    return TensorType(output_type, x.shape[:a] + x.shape[a + 1 :])


def _arg_kernel(method: str):
    def kernel(xp, x, *dyn, axis, output_type):
        a = int(dyn[0]) if dyn else axis
        return getattr(x, method)(axis=a).astype(output_type.np, copy=False)

    @_binds(kernel)
    def bind(xp, *, axis, output_type):
        to = output_type.np

        def arg(x, *dyn):
            if dyn:
                return kernel(xp, x, *dyn, axis=axis, output_type=output_type)
            return getattr(x, method)(axis=axis).astype(to, copy=False)

        return arg

    return kernel


register(OpDef("ArgMax", infer=_arg_infer, kernel=_arg_kernel("argmax")))
register(OpDef("ArgMin", infer=_arg_infer, kernel=_arg_kernel("argmin")))
not_differentiable("ArgMax", "ArgMin")


def _arg(type_: str, x: Any, axis: Any, output_type: Any, name: str | None) -> Tensor:
    dt = dtypes.as_dtype(output_type)
    if axis is None:
        axis = 0
    if _is_tensorlike(axis) and constant_value(axis) is None:
        return apply(type_, [x, axis], name, axis=None, output_type=dt)
    a = constant_value(axis) if _is_tensorlike(axis) else axis
    return apply(type_, [x], name, axis=_static_axis(a), output_type=dt)


def argmax(
    input: Any, axis: Any = 0, output_type: Any = dtypes.int64, name: str | None = None
) -> Tensor:
    """``np.argmax(input, axis)`` as int64; axis defaults to 0 (as TF). Not differentiable."""
    return _arg("ArgMax", input, axis, output_type, name)


def argmin(
    input: Any, axis: Any = 0, output_type: Any = dtypes.int64, name: str | None = None
) -> Tensor:
    """``np.argmin(input, axis)`` as int64; axis defaults to 0 (as TF). Not differentiable."""
    return _arg("ArgMin", input, axis, output_type, name)


# ------------------------------------------------------------------ range
def _range_infer(
    *dyn: TensorType, start: Any, limit: Any, delta: Any, dtype: dtypes.DType
) -> TensorType:
    for t in dyn:
        if t.shape not in ((), None):
            raise InvalidArgumentError(f"start, limit and delta must be scalars, got {t}")
    if dyn:
        return TensorType(dtype, (None,))
    if delta == 0:
        raise InvalidArgumentError("delta must not be 0")
    return TensorType(dtype, (builtins.max(0, math.ceil((limit - start) / delta)),))


def _range(xp, *dyn, start, limit, delta, dtype):
    start, limit, delta = _fill_dyn(dyn, start, limit, delta)
    if delta == 0:
        raise InvalidArgumentError("delta must not be 0")
    return xp.arange(start, limit, delta, dtype=dtype.np)


register(OpDef("Range", infer=_range_infer, kernel=_range))
not_differentiable("Range")


def range(
    start: Any, limit: Any = None, delta: Any = 1, dtype: Any = None, name: str | None = None
) -> Tensor:
    """``np.arange(start, limit, delta)``; ``range(n)`` is ``np.arange(n)``.

    dtype defaults to float32 if any argument is a float, else int32 (tensors: theirs).
    """
    if limit is None:
        start, limit = 0, start
    args = [start, limit, delta]
    if dtype is None:
        cands = [
            convert_to_tensor(a).dtype if _is_tensorlike(a) else dtypes.infer_dtype(a) for a in args
        ]
        order = [dtypes.int32, dtypes.int64, dtypes.float16, dtypes.float32, dtypes.float64]
        dtype = builtins.max(cands, key=order.index)
    dt = dtypes.as_dtype(dtype)
    statics: list = []
    dyn: list = []
    for a in args:
        v = constant_value(a) if _is_tensorlike(a) else a
        if v is None:
            statics.append(None)
            dyn.append(cast(a, dt))
        else:
            statics.append(float(v) if dt.is_floating else int(v))
    return apply(
        "Range",
        dyn,
        name or "range",
        start=statics[0],
        limit=statics[1],
        delta=statics[2],
        dtype=dt,
    )


# ---------------------------------------------------------- clip_by_value
def _clip_infer(t: TensorType, lo: TensorType, hi: TensorType) -> TensorType:
    out = binary_infer(binary_infer(t, lo), hi)
    _check_kind(t, "numeric")
    return out


register(
    OpDef(
        "ClipByValue",
        infer=_clip_infer,
        kernel=lambda xp, t, lo, hi: xp.minimum(xp.maximum(t, lo), hi),
    )
)


@_gradient("ClipByValue")
def _clip_grad(op, g):
    t, lo, hi = op.inputs
    # as min(max(t, lo), hi): hi wins where max(t, lo) exceeds it (also where lo > hi)
    above = greater(maximum(t, lo), hi)
    below, z = logical_and(less(t, lo), logical_not(above)), zeros_like(g)
    return [
        _sum_to(select(logical_or(below, above), z, g), t, lo, hi),
        _sum_to(select(below, g, z), lo, t, hi),
        _sum_to(select(above, g, z), hi, t, lo),
    ]


def clip_by_value(
    t: Any, clip_value_min: Any, clip_value_max: Any, name: str | None = None
) -> Tensor:
    """``np.minimum(np.maximum(t, clip_value_min), clip_value_max)``.

    The gradient flows to t where it is inside [min, max] and to the bound elsewhere.
    """
    t = convert_to_tensor(t)
    lo = (
        clip_value_min
        if _is_tensorlike(clip_value_min)
        else _const_like(clip_value_min, t.dtype, t.graph)
    )
    hi = (
        clip_value_max
        if _is_tensorlike(clip_value_max)
        else _const_like(clip_value_max, t.dtype, t.graph)
    )
    return apply("ClipByValue", [t, lo, hi], name)


# --------------------------------------------------------- Python operators
def _as_method(fn):
    return lambda self, other: fn(self, other)


def _reflected(fn):
    return lambda self, other: fn(other, self)


def _install_operators() -> None:
    """`+ - * / // % ** @ & | ^` with reflected forms, unary `-`, abs(), `~` and `< <= > >=`.

    `==` and hash stay identity: tensors are dict keys (use dcf.equal)."""
    binary = {
        "add": add,
        "sub": subtract,
        "mul": multiply,
        "truediv": divide,
        "floordiv": floordiv,
        "mod": mod,
        "pow": pow,
        "matmul": matmul,
        "and": logical_and,
        "or": logical_or,
        "xor": logical_xor,
    }
    for name, fn in binary.items():
        setattr(Tensor, f"__{name}__", _as_method(fn))
        setattr(Tensor, f"__r{name}__", _reflected(fn))
    unary_and_compare = {"lt": less, "le": less_equal, "gt": greater, "ge": greater_equal}
    for name, fn in unary_and_compare.items():
        setattr(Tensor, f"__{name}__", _as_method(fn))
    unary = {"neg": negative, "abs": abs, "invert": logical_not}
    for name, fn in unary.items():
        setattr(Tensor, f"__{name}__", fn)  # fn(x, name=None) works as a method


_install_operators()
