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


# ------------------------------------------------------------------ GPU kernels
# One cupy ElementwiseKernel per direction instead of ~12 launches of slices, tanh and
# concatenate. Same formulas (sigmoid as 0.5 * tanh(0.5 x) + 0.5) as the kernels above.
_CUDA_SIG = "(T)0.5 * tanh((T)0.5 * ({0})) + (T)0.5"
_GATES_CUDA = f"""
    const ptrdiff_t b = i / u, k = i - b * u, base = b * 4 * u + k;
    const T ig = {_CUDA_SIG.format("z[base]")};
    const T jg = tanh(z[base + u]);
    const T fg = {_CUDA_SIG.format("z[base + 2 * u] + fb")};
    const T og = {_CUDA_SIG.format("z[base + 3 * u]")};
    const T cn = c * fg + ig * jg;
    c_new = cn;
    h_new = tanh(cn) * og;
    acts[base] = ig; acts[base + u] = jg; acts[base + 2 * u] = fg; acts[base + 3 * u] = og;
"""
_GATES_GRAD_CUDA = """
    const ptrdiff_t b = i / u, k = i - b * u, base = b * 4 * u + k;
    const T ig = acts[base], jg = acts[base + u], fg = acts[base + 2 * u], og = acts[base + 3 * u];
    const T tc = tanh(c_new);
    const T dct = dc + dh * og * ((T)1 - tc * tc);
    dz[base] = dct * jg * ig * ((T)1 - ig);
    dz[base + u] = dct * ig * ((T)1 - jg * jg);
    dz[base + 2 * u] = dct * c * fg * ((T)1 - fg);
    dz[base + 3 * u] = dh * tc * og * ((T)1 - og);
    dc_prev = dct * fg;
"""
_cuda_kernels: dict = {}


def _cuda_kernel(xp, which: str):
    k = _cuda_kernels.get(which)
    if k is None:
        if which == "fwd":
            k = xp.ElementwiseKernel("raw T z, T c, T fb, int64 u", "T c_new, T h_new, raw T acts",
                                     _GATES_CUDA, "dcf_lstm_gates")
        else:
            k = xp.ElementwiseKernel("T c, raw T acts, T c_new, T dc, T dh, int64 u",
                                     "raw T dz, T dc_prev", _GATES_GRAD_CUDA,
                                     "dcf_lstm_gates_grad")
        _cuda_kernels[which] = k
    return k


def _fusable(xp, *arrays) -> bool:
    return hasattr(xp, "ElementwiseKernel") and all(
        getattr(a, "ndim", 0) == 2 and a.dtype.kind == "f" and a.dtype.itemsize >= 4
        for a in arrays)


def _gates_gpu(xp, z, c, *, forget_bias):
    if not _fusable(xp, z, c) or z.dtype != c.dtype:
        return _gates(xp, z, c, forget_bias=forget_bias)
    z = xp.ascontiguousarray(z)
    c_new = xp.empty(c.shape, c.dtype)
    h_new = xp.empty(c.shape, c.dtype)
    acts = xp.empty(z.shape, z.dtype)
    _cuda_kernel(xp, "fwd")(z, c, z.dtype.type(forget_bias), c.shape[1], c_new, h_new, acts)
    return c_new, h_new, acts


def _gates_grad_gpu(xp, c, acts, c_new, dc, dh):
    if not _fusable(xp, c, acts, c_new) or getattr(dc, "ndim", 0) != 2 or \
            getattr(dh, "ndim", 0) != 2:
        return _gates_grad(xp, c, acts, c_new, dc, dh)
    acts = xp.ascontiguousarray(acts)
    dz = xp.empty(acts.shape, acts.dtype)
    dc_prev = xp.empty(c.shape, c.dtype)
    _cuda_kernel(xp, "bwd")(c, acts, c_new, dc, dh, c.shape[1], dz, dc_prev)
    return dz, dc_prev


register(OpDef("LSTMGates", infer=_gates_infer, kernel=_gates, gpu_kernel=_gates_gpu))
register(OpDef("LSTMGatesGrad", infer=_gates_grad_infer, kernel=_gates_grad,
               gpu_kernel=_gates_grad_gpu))


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
