"""Fused LSTM gate math: one kernel for the elementwise part of an LSTM step.

    i, j, f, o = split(z, 4, axis=1)
    c_new = c * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j)
    h_new = tanh(c_new) * sigmoid(o)

Fusing saves about ten op firings (and their temporaries) per step; the gradient is
one fused kernel too.
"""

from __future__ import annotations

from typing import Any

from dcf.errors import InvalidArgumentError
from dcf.graph import Tensor, TensorType
from dcf.ops.registry import OpDef, RegisterGradient, apply, register

__all__: list[str] = []


def _sig(xp, x):
    return 0.5 * xp.tanh(0.5 * x) + 0.5  # exact identity; one transcendental call


def _gates_infer(z: TensorType, c: TensorType, *, forget_bias: float) -> list[TensorType]:
    if z.dtype is not c.dtype or not z.dtype.is_floating:
        raise TypeError(f"LSTM gates need matching float inputs, got {z} and {c}")
    if z.shape is not None and c.shape is not None and z.shape[1] is not None and \
            c.shape[1] is not None and z.shape[1] != 4 * c.shape[1]:
        raise InvalidArgumentError(f"z must have 4*units columns: z is {z}, c is {c}")
    return [c, c, z]


def _gates(xp, z, c, *, forget_bias):
    u = c.shape[1]
    i = _sig(xp, z[:, :u])
    j = xp.tanh(z[:, u:2 * u])
    f = _sig(xp, z[:, 2 * u:3 * u] + forget_bias)
    o = _sig(xp, z[:, 3 * u:])
    c_new = c * f + i * j
    tc = xp.tanh(c_new)
    h_new = tc * o
    acts = xp.concatenate([i, j, f, o], axis=1)
    return c_new, h_new, acts


def _gates_grad_infer(c: TensorType, acts: TensorType, c_new: TensorType, dc: TensorType,
                      dh: TensorType) -> list[TensorType]:
    return [acts, c]


def _gates_grad(xp, c, acts, c_new, dc, dh):
    u = c.shape[1]
    i, j, f, o = acts[:, :u], acts[:, u:2 * u], acts[:, 2 * u:3 * u], acts[:, 3 * u:]
    tc = xp.tanh(c_new)
    dc_total = dc + dh * o * (1 - tc * tc)
    di = dc_total * j * i * (1 - i)
    dj = dc_total * i * (1 - j * j)
    df = dc_total * c * f * (1 - f)
    do = dh * tc * o * (1 - o)
    return xp.concatenate([di, dj, df, do], axis=1), dc_total * f


register(OpDef("LSTMGates", infer=_gates_infer, kernel=_gates))
register(OpDef("LSTMGatesGrad", infer=_gates_grad_infer, kernel=_gates_grad))


@RegisterGradient("LSTMGates")
def _lstm_gates_grad(op: Any, dc_new: Any, dh_new: Any, dacts: Any) -> list:
    from dcf.ops.array_ops import zeros_like

    z, c = op.inputs
    c_new, h_new, acts = op.outputs
    dc_new = dc_new if dc_new is not None else zeros_like(c_new)
    dh_new = dh_new if dh_new is not None else zeros_like(h_new)
    dz, dc = apply("LSTMGatesGrad", [c, acts, c_new, dc_new, dh_new], name="LSTMGatesGrad")
    return [dz, dc]


def lstm_gates(z: Tensor, c: Tensor, forget_bias: float = 1.0, name: str | None = None) -> tuple:
    """(c_new, h_new) of an LSTM step from pre-activations z = [x, h] @ W + b."""
    c_new, h_new, _ = apply("LSTMGates", [z, c], name=name or "LSTMGates",
                            forget_bias=float(forget_bias))
    return c_new, h_new
