"""Neural-network ops: softmax, log_softmax and the softmax cross-entropy losses."""

from __future__ import annotations

from typing import Any

from dcf import dtypes
from dcf.errors import InvalidArgumentError
from dcf.graph import Tensor, TensorType
from dcf.ops.array_ops import (
    _check_int,
    _gradient,
    _norm_axis,
    _s,
    _static_axis,
    concat,
    expand_dims,
    rank,
    transpose,
)
from dcf.ops.math_ops import _check_kind, _sum_to, exp, reduce_sum, relu, sigmoid, tanh
from dcf.ops.math_ops import range as range_
from dcf.ops.registry import (
    OpDef,
    RegisterGradient,
    apply,
    broadcast_shape,
    convert_to_tensor,
    register,
)

__all__ = [
    "log_softmax",
    "relu",
    "sigmoid",
    "softmax",
    "softmax_cross_entropy_with_logits",
    "sparse_softmax_cross_entropy_with_logits",
    "tanh",
]


# ---------------------------------------------------------- softmax, log_softmax
def _softmax_infer(x: TensorType, *, axis: int) -> TensorType:
    _check_kind(x, "float")
    if x.rank == 0:
        raise InvalidArgumentError(f"needs a tensor of rank >= 1, got {x}")
    _norm_axis(axis, x.rank)
    return x


def _softmax(xp, x, *, axis):
    if not x.size:   # nothing to normalise (numpy's max of no elements would raise)
        return x.copy()
    e = x - x.max(axis=axis, keepdims=True)
    xp.exp(e, out=e)
    e /= e.sum(axis=axis, keepdims=True)
    return e


def _log_softmax(xp, x, *, axis):
    if not x.size:
        return x.copy()
    s = x - x.max(axis=axis, keepdims=True)
    s -= xp.log(xp.exp(s).sum(axis=axis, keepdims=True))
    return s


register(OpDef("Softmax", infer=_softmax_infer, kernel=_softmax))
register(OpDef("LogSoftmax", infer=_softmax_infer, kernel=_log_softmax))


@_gradient("Softmax")
def _softmax_grad(op, g):
    y, axis = op.outputs[0], op.attrs["axis"]
    return [(g - reduce_sum(g * y, axis, keepdims=True)) * y]


@_gradient("LogSoftmax")
def _log_softmax_grad(op, g):
    y, axis = op.outputs[0], op.attrs["axis"]
    return [g - reduce_sum(g, axis, keepdims=True) * exp(y)]


def softmax(logits: Any, axis: int | None = None, name: str | None = None) -> Tensor:
    """``e = np.exp(logits - logits.max(axis, keepdims=True)); e / e.sum(axis, keepdims=True)``
    with axis=-1 by default."""
    return apply("Softmax", [logits], name, axis=-1 if axis is None else _static_axis(axis))


def log_softmax(logits: Any, axis: int | None = None, name: str | None = None) -> Tensor:
    """``logits - log(sum(exp(logits), axis, keepdims=True))``, computed stably;
    axis=-1 by default."""
    return apply("LogSoftmax", [logits], name,
                 axis=-1 if axis is None else _static_axis(axis))


# ------------------------------------------------------------ cross-entropy
def _xent_infer(logits: TensorType, labels: TensorType) -> list[TensorType]:
    _check_kind(logits, "float")
    if labels.dtype is not logits.dtype:
        raise TypeError(f"labels and logits differ in dtype: {labels} vs {logits}")
    shp = broadcast_shape(logits.shape, labels.shape)
    if shp is not None and len(shp) == 0:
        raise InvalidArgumentError("logits and labels must have rank >= 1")
    if shp is not None and logits.shape is not None and len(logits.shape) == len(shp) and \
            any(a is not None and b is not None and a != b
                for a, b in zip(logits.shape, shp)):
        # (labels may broadcast to the logits' shape, not the logits to the labels')
        raise InvalidArgumentError(f"logits of shape {list(logits.shape)} do not have the "
                                   f"shape of the labels, {list(labels.shape)}")
    return [
        TensorType(logits.dtype, None if shp is None else shp[:-1]),
        TensorType(logits.dtype, shp),
    ]


def _xent(xp, logits, labels):
    if not logits.shape[-1]:   # no classes: a loss of 0, an empty gradient
        back = logits - labels
        return _s(back.sum(axis=-1)), back
    s = logits - logits.max(axis=-1, keepdims=True)
    e = xp.exp(s)
    total = e.sum(axis=-1, keepdims=True)
    s -= xp.log(total)  # log-probabilities
    loss = -(labels * s).sum(axis=-1)
    # d loss / d logits = softmax * sum(labels) - labels: exact for unnormalised labels too
    e *= labels.sum(axis=-1, keepdims=True) / total
    return _s(loss), e - labels


register(OpDef("SoftmaxCrossEntropyWithLogits", infer=_xent_infer, kernel=_xent))


def _softmax_jvp_t(g_backprop: Any, logits: Any) -> Any:
    """Transposed Jacobian of softmax(logits) along the last axis applied to g_backprop."""
    p = softmax(logits)
    return (g_backprop - reduce_sum(g_backprop * p, -1, keepdims=True)) * p


@RegisterGradient("SoftmaxCrossEntropyWithLogits")
def _xent_grad(op, g_loss, g_backprop):
    # backprop = softmax(logits) - labels is an output too; its gradient only matters for
    # second derivatives (the gradient of a gradient)
    logits, labels = op.inputs
    g_logits = g_labels = None
    if g_loss is not None:
        gl = expand_dims(g_loss, -1)
        g_logits = gl * op.outputs[1]
        g_labels = gl * -apply("LogSoftmax", [logits], axis=-1)
    if g_backprop is not None:  # backprop = softmax(logits) * sum(labels) - labels
        total = reduce_sum(labels, -1, keepdims=True)
        p = softmax(logits)
        d_logits = _softmax_jvp_t(g_backprop * total, logits)
        d_labels = reduce_sum(g_backprop * p, -1, keepdims=True) - g_backprop
        g_logits = d_logits if g_logits is None else g_logits + d_logits
        g_labels = d_labels if g_labels is None else g_labels + d_labels
    return [_sum_to(g_logits, logits, labels), _sum_to(g_labels, labels, logits)]


def _sparse_xent_infer(logits: TensorType, labels: TensorType) -> list[TensorType]:
    _check_kind(logits, "float")
    _check_int(labels, "labels")
    if logits.rank == 0:
        raise InvalidArgumentError(f"logits must have rank >= 1, got {logits}")
    if (
        logits.shape is not None
        and labels.shape is not None
        and (
            len(labels.shape) != len(logits.shape) - 1
            or any(
                a is not None and b is not None and a != b
                for a, b in zip(labels.shape, logits.shape)
            )
        )
    ):
        raise InvalidArgumentError(
            f"labels {labels} must have the shape of logits {logits} without its last axis"
        )
    batch = logits.shape[:-1] if logits.shape is not None else labels.shape
    return [TensorType(logits.dtype, batch), logits]


def _sparse_xent(xp, logits, labels):
    if logits.ndim == 0 or labels.shape != logits.shape[:-1]:
        # (numpy's indexing below would broadcast labels of another shape: a loss per
        # row from one label, and a backprop that does not match it)
        raise InvalidArgumentError(
            f"labels of shape {list(labels.shape)} must have the shape of the logits, "
            f"{list(logits.shape)}, without its last axis"
        )
    n = logits.shape[-1]
    flat = labels.reshape(-1)
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= n):
        bad = flat[(flat < 0) | (flat >= n)][0]
        raise InvalidArgumentError(
            f"label {int(bad)} is out of range [0, {n}) for logits of shape {list(logits.shape)}"
        )
    s = logits - logits.max(axis=-1, keepdims=True)
    e = xp.exp(s)
    total = e.sum(axis=-1, keepdims=True)
    rows = xp.arange(flat.size)
    picked = s.reshape(-1, n)[rows, flat].reshape(labels.shape)
    loss = xp.log(total[..., 0]) - picked
    e /= total
    # e has the layout of logits (numpy keeps a transposed input's strides), so its
    # reshape may be a copy: subtract from the reshaped array and return that
    backprop = e.reshape(-1, n)
    backprop[rows, flat] -= 1
    return _s(loss), backprop.reshape(e.shape)


register(
    OpDef("SparseSoftmaxCrossEntropyWithLogits", infer=_sparse_xent_infer, kernel=_sparse_xent)
)


@RegisterGradient("SparseSoftmaxCrossEntropyWithLogits")
def _sparse_xent_grad(op, g_loss, g_backprop):
    logits = op.inputs[0]
    g_logits = None
    if g_loss is not None:
        g_logits = expand_dims(g_loss, -1) * op.outputs[1]
    if g_backprop is not None:
        extra = _softmax_jvp_t(g_backprop, logits)
        g_logits = extra if g_logits is None else g_logits + extra
    return [g_logits, None]


def _move_to_last(t: Tensor, axis: int) -> Tensor:
    r = t.type.rank
    if axis == -1 or (r is not None and axis == r - 1):
        return t
    if r is None:  # the permutation at run time
        rt = rank(t)
        a = axis if axis >= 0 else rt + axis
        return transpose(t, concat([range_(0, a), range_(a + 1, rt), expand_dims(a, 0)], 0))
    a = _norm_axis(axis, r)
    return transpose(t, [i for i in range(r) if i != a] + [a])


def softmax_cross_entropy_with_logits(
    *, labels: Any, logits: Any, axis: int = -1, name: str | None = None
) -> Tensor:
    """``-np.sum(labels * log_softmax(logits, axis), axis)``: the cross-entropy of each row
    of class probabilities `labels` against unnormalised `logits` (same shape and dtype).

    The gradient flows to both logits and labels.
    """
    logits = convert_to_tensor(logits)
    labels = (
        convert_to_tensor(labels)
        if isinstance(labels, Tensor) or hasattr(labels, "_as_tensor")
        else convert_to_tensor(labels, dtype=logits.dtype)
    )
    loss, _ = apply(
        "SoftmaxCrossEntropyWithLogits",
        [_move_to_last(logits, axis), _move_to_last(labels, axis)],
        name,
    )
    return loss


def sparse_softmax_cross_entropy_with_logits(
    *, labels: Any, logits: Any, name: str | None = None
) -> Tensor:
    """``-log_softmax(logits)[..., labels]``: the cross-entropy of integer class `labels`
    (shape ``logits.shape[:-1]``) against `logits`. A label outside [0, classes) is an
    InvalidArgumentError when the op runs."""
    if not isinstance(labels, Tensor):
        labels = convert_to_tensor(labels)
    if labels.dtype not in (dtypes.int32, dtypes.int64):
        raise TypeError(f"labels must be int32 or int64, got {labels!r}")
    loss, _ = apply("SparseSoftmaxCrossEntropyWithLogits", [logits, labels], name)
    return loss
