"""Fused LSTM gate math: one kernel for the elementwise part of an LSTM step.

    z = z + b                               (b optional: the bias [4u], or the step's
                                             precomputed input projection [batch, 4u])
    i, j, f, o = split(z, 4, axis=1)
    c_new = c * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j)
    h_new = tanh(c_new) * sigmoid(o)

Fusing saves about ten op firings (and their temporaries) per step; the gradient is
one fused kernel too. `RNNMatMul(h, w, w_t)` is `h @ w` for a recurrent weight that a
loop uses every step: `w_t` is a contiguous copy of `w`'s transpose, made once before
the loop, so the backward loop's `dz @ w^T` is a plain (faster) GEMM instead of one
against a transposed view. `TensorArrayProjectUnstack` writes `x[t] @ w` of all steps
into a TensorArray with one GEMM (dynamic_rnn's hoisted input projection), and
`TensorArrayProjectGrad` is its weight gradient `sum_t x[t]^T dP[t]` read from the
gradient TensorArray in chunks.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from dcf.errors import InvalidArgumentError
from dcf.graph import Tensor, TensorType
from dcf.ops.gpu_raw import RawLoop, c_contiguous, row_stride
from dcf.ops.registry import OpDef, RegisterGradient, apply, register

__all__: list[str] = []


def _sig(xp, x):
    return 0.5 * xp.tanh(0.5 * x) + 0.5  # exact identity; one transcendental call


def _gates_infer(z: TensorType, c: TensorType, b: TensorType | None = None, *,
                 forget_bias: float) -> list[TensorType]:
    if z.dtype is not c.dtype or not z.dtype.is_floating:
        raise TypeError(f"LSTM gates need matching float inputs, got {z} and {c}")
    if z.shape is not None and c.shape is not None and (
            len(z.shape) != len(c.shape) or len(c.shape) < 2 or
            any(x is not None and y is not None and x != y
                for x, y in zip(z.shape[:-1], c.shape[:-1])) or
            (z.shape[-1] is not None and c.shape[-1] is not None and
             z.shape[-1] != 4 * c.shape[-1])):
        raise InvalidArgumentError(f"z must be c's shape with 4*units columns: z is {z}, "
                                   f"c is {c}")
    if b is not None:
        if b.dtype is not z.dtype:
            raise TypeError(f"LSTM gates: the addend b must have z's dtype, got {b} and {z}")
        if b.shape is not None and (
                (len(b.shape) != 1 and z.shape is not None and len(b.shape) != len(z.shape))
                or (z.shape is not None and any(
                    x is not None and y is not None and x != y and x != 1
                    for x, y in zip(b.shape[::-1], z.shape[::-1])))):
            raise InvalidArgumentError(f"the addend b must be [4*units], or shaped like z "
                                       f"(or broadcast to it): b is {b}, z is {z}")
    return [c, c, z]


def _rows_of(fn: Any) -> Any:
    """A gates kernel over [rows, ...] matrices made to take z, c of any rank >= 2 (a
    stack of layers' batches, [layers, batch, 4u]): the leading axes flattened into
    rows, an addend broadcast to z's shape, and the results shaped back."""
    def kernel(xp, z, c, b=None, *, forget_bias):
        if getattr(c, "ndim", 2) <= 2:
            return fn(xp, z, c, b, forget_bias=forget_bias)
        if b is not None and getattr(b, "ndim", 1) > 1 and b.shape != z.shape:
            b = xp.ascontiguousarray(xp.broadcast_to(b, z.shape))
        if b is not None and getattr(b, "ndim", 1) > 1:
            b = b.reshape(-1, b.shape[-1])
        c_new, h_new, acts = fn(xp, z.reshape(-1, z.shape[-1]), c.reshape(-1, c.shape[-1]),
                                b, forget_bias=forget_bias)
        return c_new.reshape(c.shape), h_new.reshape(c.shape), acts.reshape(z.shape)
    kernel.__name__ = fn.__name__
    return kernel


def _grad_rows_of(fn: Any) -> Any:
    """_rows_of for the gradient kernels: fn(xp, c, acts, c_new, dc, dh) -> (dz, dc_prev)."""
    def kernel(xp, c, acts, c_new, dc, dh):
        if getattr(c, "ndim", 2) <= 2:
            return fn(xp, c, acts, c_new, dc, dh)
        u = c.shape[-1]
        dz, dc_prev = fn(xp, c.reshape(-1, u), acts.reshape(-1, 4 * u),
                         *(a.reshape(-1, u) for a in (c_new, dc, dh)))
        return dz.reshape(acts.shape), dc_prev.reshape(c.shape)
    kernel.__name__ = fn.__name__
    return kernel


_FULL_ROWS_MAX = 1 << 18


@functools.lru_cache(maxsize=32)
def _rows(n: int, u: int, forget_bias: float, dt: Any) -> tuple:
    """Full-size [n, 4u] constants (same-shape numpy ops are cheaper than broadcasting
    a row): the gates are acts = tanh(z * s + off) * s + add, where s is 1/2 in the
    sigmoid blocks (sigmoid(x) = tanh(x/2)/2 + 1/2) and 1 in the tanh block, off adds
    forget_bias/2 to the f block and add is 1/2 in the sigmoid blocks. Scaling by powers
    of two is exact, so this rounds exactly as the slice-by-slice formulas do."""
    s = np.full((n, 4 * u), 0.5, dt)
    s[:, u:2 * u] = 1.0
    off = np.zeros((n, 4 * u), dt)
    off[:, 2 * u:3 * u] = dt(0.5) * dt(forget_bias)
    add = np.full((n, 4 * u), 0.5, dt)
    add[:, u:2 * u] = 0.0
    for a in (s, off, add):
        a.flags.writeable = False
    return s, off, add


@functools.lru_cache(maxsize=32)
def _grad_rows(n: int, u: int, dt: Any) -> tuple:
    """q, r of the gradient kernel: 1, 0 in the sigmoid blocks, 0, 1 in the tanh block."""
    q = np.ones((n, 4 * u), dt)
    q[:, u:2 * u] = 0.0
    r = np.zeros((n, 4 * u), dt)
    r[:, u:2 * u] = 1.0
    for a in (q, r):
        a.flags.writeable = False
    return q, r


def _gates(xp, z, c, b=None, *, forget_bias):
    u = c.shape[1]
    if xp is np and z.ndim == 2 and z.dtype.kind == "f" and c.dtype == z.dtype:
        a = None if b is None else z + b
        shape = z.shape if a is None else a.shape
        n = shape[0] if shape[0] * shape[1] <= _FULL_ROWS_MAX else 1  # large: one row
        s, off, add = _rows(n, u, float(forget_bias), z.dtype.type)
        if a is None:
            a = z * s
        else:
            a *= s
        if forget_bias:
            a += off
        np.tanh(a, out=a)
        a *= s
        a += add
        i, j, f, o = a[:, :u], a[:, u:2 * u], a[:, 2 * u:3 * u], a[:, 3 * u:]
        c_new = c * f
        c_new += i * j
        h_new = np.tanh(c_new)
        h_new *= o
        return c_new, h_new, a
    if b is not None:
        z = z + b
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
    if xp is np and acts.ndim == 2 and getattr(dc, "ndim", 0) == 2 and \
            getattr(dh, "ndim", 0) == 2 and acts.dtype == c.dtype == dc.dtype == dh.dtype:
        # dz = D * U: D the activations' derivatives, a (1 - a) in the sigmoid blocks
        # and 1 - a^2 in the tanh block, = (q - a) a + r with full-size q, r; U the
        # upstream products [dct j, dct i, dct c, dh tc]
        q, r = _grad_rows(acts.shape[0] if acts.size <= _FULL_ROWS_MAX else 1, u,
                          acts.dtype.type)
        tc = np.tanh(c_new)
        dz = np.subtract(q, acts)
        dz *= acts
        dz += r
        di, dj, df, do = dz[:, :u], dz[:, u:2 * u], dz[:, 2 * u:3 * u], dz[:, 3 * u:]
        dct = dh * tc
        do *= dct                                 # dh tc o (1 - o)
        dct *= tc
        np.subtract(dh, dct, out=dct)             # dh (1 - tc^2)
        dct *= o
        dct += dc                                 # dc_total
        di *= j
        di *= dct
        dj *= i
        dj *= dct
        df *= c
        df *= dct
        dct *= f
        return dz, dct
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
_GATES_CUDA = """
    const ptrdiff_t b = i / u, k = i - b * u, base = b * 4 * u + k;
    const T ig = {sig_i};
    const T jg = tanh({z_j});
    const T fg = {sig_f};
    const T og = {sig_o};
    const T cn = c * fg + ig * jg;
    c_new = cn;
    h_new = tanh(cn) * og;
    acts[base] = ig; acts[base + u] = jg; acts[base + 2 * u] = fg; acts[base + 3 * u] = og;
"""
# the pre-activation of gate g (0..3): z alone, z plus a [4u] bias row, or z plus an
# addend shaped like z
_Z = {"": "z[base + {g} * u]", "row": "(z[base + {g} * u] + bias[k + {g} * u])",
      "full": "(z[base + {g} * u] + bias[base + {g} * u])"}


def _gates_source(addend: str) -> str:
    zg = [_Z[addend].format(g=g) for g in range(4)]
    return _GATES_CUDA.format(sig_i=_CUDA_SIG.format(zg[0]), z_j=zg[1],
                              sig_f=_CUDA_SIG.format(zg[2] + " + fb"),
                              sig_o=_CUDA_SIG.format(zg[3]))


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
_raw_kernels: dict = {}


# dh read from one or two [batch, u] matrices whose rows are `ld` elements apart (a
# C-contiguous matrix, ld = u, or a column block of a wider one: a SplitV output), the
# two added first in the order AddN adds them
_DH_READ = {1: "dh_a[r_ * lda + k_]", 2: "dh_a[r_ * lda + k_] + dh_b[r_ * ldb + k_]"}


def _raw_kernel(which: str) -> RawLoop:
    """The same bodies as raw kernels over C-contiguous arrays (dcf/ops/gpu_raw.py):
    half the host's cost per launch of the ElementwiseKernels below. The backward ones,
    "bwd_s1" and "bwd_s2", read dh from one or two row-strided matrices (see _DH_READ)."""
    k = _raw_kernels.get(which)
    if k is None:
        if which.startswith("bwd_s"):
            n = int(which[5:])
            k = RawLoop(f"dcf_lstm_gates_grad_dh{n}",
                        "const T* __restrict__ c_, const T* __restrict__ acts, "
                        "const T* __restrict__ c_new_, const T* __restrict__ dc_, "
                        "const T* __restrict__ dh_a, const long long lda, " +
                        ("const T* __restrict__ dh_b, const long long ldb, " if n == 2 else "") +
                        "const long long u, T* __restrict__ dz, T* __restrict__ dc_prev_",
                        "    const long long r_ = i / u, k_ = i - r_ * u;\n"
                        "    const T c = c_[i], c_new = c_new_[i], dc = dc_[i];\n"
                        f"    const T dh = {_DH_READ[n]};\n"
                        "    T dc_prev;" + _GATES_GRAD_CUDA + "    dc_prev_[i] = dc_prev;")
        elif which.startswith("fwd_into"):
            # acts written over z; "..._ld": h written into rows `ldh` elements apart;
            # "..._x": h written a second time, into hx's rows `ldx` apart (see
            # gates_into). u, fb, ldh and ldx are the kernel's constants.
            x = which.endswith("_x")
            w = which.removesuffix("_x")
            ld = w.endswith("_ld")
            addend = w.removesuffix("_ld")[9:]
            k = RawLoop("dcf_lstm_gates_into" + (f"_{addend}" if addend else "") +
                        ("_ld" if ld else "") + ("_x" if x else ""),
                        "T* z, const T* __restrict__ c_, " +
                        ("const T* __restrict__ bias, " if addend else "") +
                        "T* __restrict__ c_new_, T* __restrict__ h_new_" +
                        (", T* __restrict__ hx" if x else ""),
                        "    T* const acts = z;\n"
                        "    const T c = c_[i];\n    T c_new, h_new;" + _gates_source(addend) +
                        "    c_new_[i] = c_new; " +
                        ("h_new_[(i / u) * ldh + i % u] = h_new;" if ld else "h_new_[i] = h_new;") +
                        ("\n    hx[(i / u) * ldx + i % u] = h_new;" if x else ""))
        else:   # "fwd", "fwd_row", "fwd_full" (see _Z)
            addend = which[4:]
            k = RawLoop("dcf_lstm_gates_raw" + (f"_{addend}" if addend else ""),
                        "const T* __restrict__ z, const T* __restrict__ c_, const T fb, "
                        "const long long u, " +
                        ("const T* __restrict__ bias, " if addend else "") +
                        "T* __restrict__ c_new_, T* __restrict__ h_new_, T* __restrict__ acts",
                        "    const T c = c_[i];\n    T c_new, h_new;" + _gates_source(addend) +
                        "    c_new_[i] = c_new; h_new_[i] = h_new;")
        _raw_kernels[which] = k
    return k


def _cuda_kernel(xp, which: str):
    k = _cuda_kernels.get(which)
    if k is None:
        if which == "bwd":
            k = xp.ElementwiseKernel("T c, raw T acts, T c_new, T dc, T dh, int64 u",
                                     "raw T dz, T dc_prev", _GATES_GRAD_CUDA,
                                     "dcf_lstm_gates_grad")
        else:   # "fwd", "fwd_row", "fwd_full": see _Z
            addend = which[4:]
            k = xp.ElementwiseKernel(
                "raw T z, T c, T fb, int64 u" + (", raw T bias" if addend else ""),
                "T c_new, T h_new, raw T acts", _gates_source(addend),
                "dcf_lstm_gates" + (f"_{addend}" if addend else ""))
        _cuda_kernels[which] = k
    return k


def _fusable(xp, *arrays) -> bool:
    nd = getattr(xp, "ndarray", None)
    if not hasattr(xp, "ElementwiseKernel"):
        return False
    for a in arrays:
        if type(a) is not nd or a.ndim < 2 or a.dtype.kind != "f" or a.dtype.itemsize < 4:
            return False
    return True


def _addend_form(z: Any, b: Any, u: int) -> str | None:
    """How the gates' kernels take the addend b (see _Z): "" (none), "_row" (a [4u] row)
    or "_full" (shaped like z); None where b is neither, or not an array of z's kind and
    dtype."""
    if b is None:
        return ""
    if type(b) is not type(z) or b.dtype != z.dtype:
        return None
    if b.shape == (4 * u,):
        return "_row"
    return "_full" if b.shape == z.shape else None


def _gates_gpu(xp, z, c, b=None, *, forget_bias):
    """The gates as one kernel over c's elements (any rank >= 2: the kernels index rows
    of 4u and u elements, so a stack of layers' batches needs no reshape)."""
    if not _fusable(xp, z, c) or z.dtype != c.dtype:
        return _gates_rows(xp, z, c, b, forget_bias=forget_bias)
    u = c.shape[-1]
    if z.shape[-1] != 4 * u or z.shape[:-1] != c.shape[:-1]:
        return _gates_rows(xp, z, c, b, forget_bias=forget_bias)
    form = _addend_form(z, b, u)   # the addend inside the kernel: one launch, no z + b
    if form is None:
        return _gates_rows(xp, z, c, b, forget_bias=forget_bias)
    which = "fwd" + form
    extra = () if b is None else (b if c_contiguous(b) else xp.ascontiguousarray(b),)
    if not c_contiguous(z):
        z = xp.ascontiguousarray(z)
    raw = RawLoop.available(xp) and c_contiguous(c)
    new = xp.ndarray if raw else xp.empty      # (cupy.empty without its wrapper)
    c_new = new(c.shape, c.dtype)
    h_new = new(c.shape, c.dtype)
    acts = new(z.shape, z.dtype)
    fb = z.dtype.type(forget_bias)
    if raw:
        _raw_kernel(which)(xp, z.dtype, c.size,
                           (z, c, fb, np.int64(u)) + extra + (c_new, h_new, acts))
    else:
        _cuda_kernel(xp, which)(z, c, fb, u, *extra, c_new, h_new, acts)
    return c_new, h_new, acts


def gates_into(xp: Any, z: Any, c: Any, b: Any, forget_bias: float,
               h_lead: int = 0, x_into: Any = None) -> Any:
    """LSTMGates(z, c[, b]) as one raw kernel that writes the activations over z, for a
    z nothing else reads (a fresh product whose only consumer is the gates): (c_new,
    h_new, acts) with acts the array z, or None where the arrays don't fit it (not all
    C-contiguous device arrays of one float dtype and the gates' shapes, a bias neither
    a [4u] row nor shaped like z, no RawKernel). Each element of z is read by the one
    thread that overwrites it, before it does, so the results are _gates_gpu's.

    With `h_lead` > 0, h is written into the last u columns of a new [rows, h_lead + u]
    array `buf` and h_new is the view of them (rows h_lead + u elements apart): the
    result is (c_new, h_new, acts, buf), for a concatenation [x, h] with x h_lead wide
    to take over (dcf/ops/concat_slots.py). With `x_into` (an open concat_slots.Offer
    of the layer above, whose first u columns are for this h), h is also written there
    and the offer is filled with h_new. The same bits either way."""
    nd = getattr(xp, "ndarray", None)
    if not RawLoop.available(xp) or type(z) is not nd or type(c) is not nd or \
            c.ndim != 2 or z.ndim != 2:
        return None
    dt = c.dtype
    rows, u = c.shape
    if dt.kind != "f" or dt.itemsize < 4 or z.dtype != dt or z.shape != (rows, 4 * u) or \
            not c_contiguous(z) or not c_contiguous(c):
        return None
    form = _addend_form(z, b, u)
    if form is None or (b is not None and not c_contiguous(b)):
        return None
    fb = float(forget_bias)
    if not math.isfinite(fb):
        return None
    which = "fwd_into" + form
    c_new = nd(c.shape, dt)
    args: tuple = (z, c) if b is None else (z, c, b)
    consts: tuple = (("long long", "u", u), ("T", "fb", fb))
    four = h_lead > 0 or x_into is not None      # the caller asked for buf
    if not rows:
        h_lead, x_into = 0, None
    if x_into is not None:
        xb = x_into.buf
        if type(xb) is not nd or xb.dtype != dt or xb.ndim != 2 or xb.shape[0] != rows or \
                x_into.lead != u or not c_contiguous(xb) or \
                xb.data.device_id != c.data.device_id:
            x_into = None
    if h_lead > 0:
        ld = h_lead + u
        buf = nd((rows, ld), dt)
        isz = dt.itemsize
        h_new = nd(c.shape, dt, buf.data + h_lead * isz, (ld * isz, isz))
        which += "_ld"
        consts += (("long long", "ldh", ld),)
    else:
        buf = None
        h_new = nd(c.shape, dt)
    args += (c_new, h_new)
    if x_into is not None:
        args += (x_into.buf,)
        which += "_x"
        consts += (("long long", "ldx", x_into.buf.shape[1]),)
    n = c.size
    if n:
        loop = _raw_kernel(which)
        loop.launch(loop.kernel(xp, dt.char, consts), n, args)
    if x_into is not None:
        x_into.filled = h_new
    return (c_new, h_new, z, buf) if four else (c_new, h_new, z)


def _gates_grad_gpu(xp, c, acts, c_new, dc, dh):
    if not _fusable(xp, c, acts, c_new) or getattr(dc, "ndim", 0) != c.ndim or \
            getattr(dh, "ndim", 0) != c.ndim:
        return _gates_grad_rows(xp, c, acts, c_new, dc, dh)
    if not c_contiguous(acts):
        acts = xp.ascontiguousarray(acts)
    got = gates_grad_sum(xp, c, acts, c_new, dc, (dh,))   # one raw kernel, dh read in place
    if got is not None:
        return got
    if c.ndim != 2:
        return _gates_grad_rows(xp, c, acts, c_new, dc, dh)
    dz = xp.empty(acts.shape, acts.dtype)
    dc_prev = xp.empty(c.shape, c.dtype)
    _cuda_kernel(xp, "bwd")(c, acts, c_new, dc, dh, c.shape[1], dz, dc_prev)
    return dz, dc_prev


def gates_grad_sum(xp: Any, c: Any, acts: Any, c_new: Any, dc: Any, dhs: tuple) -> Any:
    """LSTMGatesGrad with dh = dhs[0] (+ dhs[1]), added inside the kernel, as one raw
    kernel: (dz, dc_prev), or None where the arrays don't fit it (not all device arrays
    of one float dtype, c/c_new/dc/acts not C-contiguous, a dh whose rows are not each
    contiguous, no RawKernel). The sum is the one AddN makes (one rounding), so the
    results are those of the AddN then LSTMGatesGrad."""
    nd = getattr(xp, "ndarray", None)
    if not RawLoop.available(xp) or type(c) is not nd or c.ndim < 2 or \
            c.dtype.kind != "f" or c.dtype.itemsize < 4 or not 1 <= len(dhs) <= 2:
        return None
    shape, dt = c.shape, c.dtype
    u = shape[-1]
    if type(acts) is not nd or acts.dtype != dt or acts.shape != shape[:-1] + (4 * u,) or \
            not c_contiguous(acts):
        return None
    for a in (c, c_new, dc):
        if type(a) is not nd or a.shape != shape or a.dtype != dt or not c_contiguous(a):
            return None
    args: tuple = ()
    for a in dhs:
        ld = None
        if type(a) is nd and a.shape == shape and a.dtype == dt:
            # a stack of layers' rows ([layers, batch, u]) only as a C-contiguous array
            ld = row_stride(a) if len(shape) == 2 else (u if c_contiguous(a) else None)
        if ld is None:
            return None
        args += (a, np.int64(ld))
    dz = xp.ndarray(acts.shape, dt)
    dc_prev = xp.ndarray(shape, dt)
    _raw_kernel(f"bwd_s{len(dhs)}")(xp, dt, c.size, (c, acts, c_new, dc) + args +
                                     (np.int64(u), dz, dc_prev))
    return dz, dc_prev


_gates_rows = _rows_of(_gates)
_gates_grad_rows = _grad_rows_of(_gates_grad)
register(OpDef("LSTMGates", infer=_gates_infer, kernel=_gates_rows, gpu_kernel=_gates_gpu))
register(OpDef("LSTMGatesGrad", infer=_gates_grad_infer, kernel=_gates_grad_rows,
               gpu_kernel=_gates_grad_gpu))


@RegisterGradient("LSTMGates")
def _lstm_gates_grad(op: Any, dc_new: Any, dh_new: Any, dacts: Any) -> list:
    from dcf.ops.array_ops import zeros_like
    from dcf.ops.math_ops import _sum_to

    z, c = op.inputs[:2]
    c_new, h_new, acts = op.outputs
    dc_new = dc_new if dc_new is not None else zeros_like(c_new)
    dh_new = dh_new if dh_new is not None else zeros_like(h_new)
    dz, dc = apply("LSTMGatesGrad", [c, acts, c_new, dc_new, dh_new], name="LSTMGatesGrad")
    if dacts is not None:  # second order: LSTMGatesGrad read the activations
        dz = dz + dacts * _activation_slopes(acts)
    if len(op.inputs) == 2:
        return [dz, dc]
    b = op.inputs[2]
    return [dz, dc, _sum_to(dz, b, z)]   # a [4u] bias: summed over the batch


def _activation_slopes(acts: Tensor) -> Tensor:
    """d acts / d z, elementwise: a (1 - a) in the sigmoid blocks (i, f, o), 1 - a^2 in
    the tanh block (j)."""
    from dcf.ops.array_ops import concat, split

    i, j, f, o = split(acts, 4, axis=-1)
    return concat([i * (1 - i), 1 - j * j, f * (1 - f), o * (1 - o)], axis=-1)


@RegisterGradient("LSTMGatesGrad")
def _lstm_gates_grad_grad(op: Any, g_dz: Any, g_dc_prev: Any) -> list:
    """The gradient of LSTMGatesGrad (second order through an LSTM step), from its
    formulas: with tc = tanh(c_new), s = 1 - tc^2 and dct = dc + dh o s,
    dz = [dct j i(1-i), dct i (1-j^2), dct c f(1-f), dh tc o(1-o)], dc_prev = dct f."""
    from dcf.ops.array_ops import concat, split, zeros_like
    from dcf.ops.math_ops import tanh

    c, acts, c_new, dc, dh = op.inputs
    g_dz = g_dz if g_dz is not None else zeros_like(acts)
    g_dcp = g_dc_prev if g_dc_prev is not None else zeros_like(c)
    i, j, f, o = split(acts, 4, axis=-1)
    gi, gj, gf, go = split(g_dz, 4, axis=-1)
    tc = tanh(c_new)
    s = 1 - tc * tc
    dct = dc + dh * o * s
    di, dj, df, do = i * (1 - i), 1 - j * j, f * (1 - f), o * (1 - o)
    g_dct = gi * j * di + gj * i * dj + gf * c * df + g_dcp * f
    g_acts = concat([dct * (gi * j * (1 - 2 * i) + gj * dj),
                     dct * (gi * di - 2 * gj * i * j),
                     dct * (gf * c * (1 - 2 * f) + g_dcp),
                     dh * (g_dct * s + go * tc * (1 - 2 * o))], axis=-1)
    g_tc = dh * (go * do - 2 * g_dct * o * tc)
    return [gf * dct * df, g_acts, g_tc * s, g_dct, g_dct * o * s + go * tc * do]


def lstm_gates(z: Tensor, c: Tensor, forget_bias: float = 1.0, name: str | None = None,
               b: Any = None) -> tuple:
    """(c_new, h_new) of an LSTM step from pre-activations z (+ b): z = [x, h] @ W and
    b the bias, or z = h @ W_h and b the step's x @ W_x + bias."""
    c_new, h_new, _ = apply("LSTMGates", [z, c] + ([] if b is None else [b]),
                            name=name or "LSTMGates", forget_bias=float(forget_bias))
    return c_new, h_new


# ------------------------------------------------------------- recurrent matmul
def _rnn_matmul_infer(a: TensorType, w: TensorType, w_t: TensorType, *,
                      w_grad: bool = True) -> TensorType:
    from dcf.ops.math_ops import _matmul_infer

    if w_t.dtype is not w.dtype:
        raise TypeError(f"RNNMatMul: w_t must have w's dtype, got {w_t} and {w}")
    if w.shape is not None and w_t.shape is not None and len(w_t.shape) == 2 and \
            len(w.shape) == 2 and any(x is not None and y is not None and x != y
                                      for x, y in zip(w.shape, w_t.shape[::-1])):
        raise InvalidArgumentError(f"RNNMatMul: w_t must be w's transpose: w is {w}, "
                                   f"w_t is {w_t}")
    return _matmul_infer(a, w, transpose_a=False, transpose_b=False)


def _rnn_matmul(xp, a, w, w_t, *, w_grad=True):
    return a @ w


def _transpose_copy(xp, x):
    return xp.ascontiguousarray(x.T)


register(OpDef("RNNMatMul", infer=_rnn_matmul_infer, kernel=_rnn_matmul))
register(OpDef("TransposeCopy",
               infer=lambda x: TensorType(x.dtype, None if x.shape is None
                                          else tuple(reversed(x.shape))),
               kernel=_transpose_copy))


@RegisterGradient("RNNMatMul")
def _rnn_matmul_grad(op: Any, g: Any) -> list:
    from dcf.ops.math_ops import matmul

    a, w, w_t = op.inputs
    # the value does not depend on w_t (it only stands for w^T): no gradient flows to it.
    # w_grad=False: the op that made the loop's input projection supplies dL/dw for every
    # step at once (TensorArrayProjectUnstack with a tied weight), so none is made here
    dw = matmul(a, g, transpose_a=True) if op.attrs.get("w_grad", True) else None
    return [matmul(g, w_t), dw, None]


@RegisterGradient("TransposeCopy")
def _transpose_copy_grad(op: Any, g: Any) -> list:
    return [transpose_copy(g)]


def transpose_copy(x: Any, name: str | None = None) -> Tensor:
    """A contiguous copy of the transpose of a matrix (Transpose is a view)."""
    return apply("TransposeCopy", [x], name=name or "TransposeCopy")


def rnn_matmul(a: Any, w: Any, w_t: Any, name: str | None = None, *,
               w_grad: bool = True) -> Tensor:
    """`a @ w`, where `w_t` is `transpose_copy(w)` made once outside the loop: the
    gradient w.r.t. `a` is `g @ w_t`, a plain GEMM (no per-step transposed view).
    w_grad=False only for a `w` tied to a TensorArrayProjectUnstack (see there)."""
    return apply("RNNMatMul", [a, w, w_t], name=name or "RNNMatMul", w_grad=bool(w_grad))


# ------------------------------------------------- input projection into a TensorArray
def _project_unstack_infer(handle: TensorType, x: TensorType, w: TensorType,
                           flow: TensorType, *tied: TensorType) -> TensorType:
    from dcf.ops.data_ops import _FLOW
    from dcf.ops.math_ops import _matmul_infer

    if x.shape is not None and len(x.shape) != 3:
        raise InvalidArgumentError(f"the inputs must be [time, batch, depth], got {x}")
    _matmul_infer(TensorType(x.dtype, None if x.shape is None else x.shape[1:]), w,
                  transpose_a=False, transpose_b=False)
    if tied:
        if len(tied) != 1:
            raise InvalidArgumentError("at most one tied weight")
        _matmul_infer(TensorType(x.dtype, (None, None)), tied[0], transpose_a=False,
                      transpose_b=False)
        if w.shape is not None and tied[0].shape is not None and \
                w.shape[1] != tied[0].shape[1]:
            raise InvalidArgumentError(f"the tied weight {tied[0]} must have w's columns "
                                       f"({w})")
    return _FLOW


def _project_unstack(xp, handle, x, w, flow, *tied):
    from dcf.ops.data_ops import _FLOW_VALUE

    t, b, k = x.shape
    p = (x.reshape(t * b, k) @ w).reshape(t, b, w.shape[1])   # one GEMM for all steps
    handle.scatter(np.arange(t), p)
    return _FLOW_VALUE


register(OpDef("TensorArrayProjectUnstack", infer=_project_unstack_infer,
               kernel=_project_unstack))


@RegisterGradient("TensorArrayProjectUnstack")
def _project_unstack_grad(op: Any, gflow_out: Any) -> list:
    from dcf.autodiff.gradients import active_state
    from dcf.ops import array_ops
    from dcf.ops.math_ops import matmul

    handle, x, w, _ = op.inputs[:4]
    gh, gflow = apply("TensorArrayGradV3", [handle, gflow_out], name="ta_grad",
                      source=active_state().source)
    n = w.shape[1] if w.shape is not None else None
    if n is None:
        raise ValueError("TensorArrayProjectUnstack: the gradient needs w's static width")
    dp = apply("TensorArrayStack", [gh, gflow], name="ta_grad_stack", dtype=x.dtype,
               element_shape=None if x.shape is None else (x.shape[1], n))
    dx = array_ops.reshape(matmul(array_ops.reshape(dp, [-1, n]), w, transpose_b=True),
                           array_ops.shape(x))
    # dW = X^T dP over all steps, read from the gradient array in chunks (no [T, B, N]
    # copy of it); dX = dP W^T, which stacks dP, runs only when dX is asked for
    if len(op.inputs) == 4:
        dw = apply("TensorArrayProjectGrad", [gh, x, gflow], name="ta_project_grad_w",
                   units=n)
        return [None, dx, dw, gflow_out]
    # A tied recurrent weight w_h: the loop adds h[t] @ w_h to step t's projection and
    # records h[t] in a TensorArray (see tie_recorded_inputs), so dL/dw_h =
    # sum_t h[t]^T dP[t] -- the same dP: one pass over its chunks gives both gradients.
    (w_h,) = op.inputs[4:]
    rec = [r for o, r in op.graph.get_collection(_TIED_RECORDS) if o is op]
    u = w_h.shape[0] if w_h.shape is not None else None
    if len(rec) != 1 or u is None:
        raise ValueError(f"TensorArrayProjectUnstack '{op.name}': a tied weight needs its "
                         "recorded inputs (tie_recorded_inputs) and a static shape")
    dw, dw_h = apply("TensorArrayProjectGrad", [gh, x, gflow, rec[0].handle, rec[0].flow],
                     name="ta_project_grad_w", units=n, tied_rows=u)
    return [None, dx, dw, gflow_out, dw_h]


#: rows of X per GEMM in TensorArrayProjectGrad (a chunk's dP copy stays in cache)
_PROJECT_CHUNK_ROWS = 4096


def _project_grad_infer(handle: TensorType, x: TensorType, flow: TensorType,
                        *tied: TensorType, units: int, tied_rows: int | None = None) -> Any:
    if x.shape is not None and len(x.shape) != 3:
        raise InvalidArgumentError(f"the inputs must be [time, batch, depth], got {x}")
    dw = TensorType(x.dtype, (None if x.shape is None else x.shape[2], units))
    if not tied:
        return dw
    return [dw, TensorType(x.dtype, (tied_rows, units))]


def _project_grad(xp, handle, x, flow, *tied, units, tied_rows=None):
    """sum_t x[t]^T @ P[t] over the TensorArray's elements P[t] ([batch, units]); with a
    second TensorArray H also sum_t H[t]^T @ P[t], from the same chunks of P."""
    t, b, k = x.shape
    x2 = x.reshape(t * b, k)
    per = max(1, _PROJECT_CHUNK_ROWS // max(b, 1))
    out = out_h = None
    for s in range(0, t, per):
        e = min(t, s + per)
        p = xp.stack([handle.read(i, xp) for i in range(s, e)]).reshape((e - s) * b, units)
        part = x2[s * b:e * b].T @ p
        out = part if out is None else xp.add(out, part, out=out)
        if tied:
            h = xp.stack([tied[0].read(i, xp) for i in range(s, e)]).reshape((e - s) * b, tied_rows)
            part = h.T @ p
            out_h = part if out_h is None else xp.add(out_h, part, out=out_h)
    if out is None:
        out = xp.zeros((k, units), x.dtype)
        out_h = xp.zeros((tied_rows, units), x.dtype) if tied else None
    return (out, out_h) if tied else out


register(OpDef("TensorArrayProjectGrad", infer=_project_grad_infer, kernel=_project_grad))


@RegisterGradient("TensorArrayProjectGrad")
def _project_grad_grad(op: Any, g: Any, g_h: Any = None) -> list:
    """d/dx and d/dP of sum_t x[t]^T P[t]: P[t] g^T and x[t] g (as TensorArrayStack's
    gradient, the latter scattered into the array's gradient array). With a tied array
    H, d/dP also gets H[t] g_h, and H (through its gradient array) gets P[t] g_h^T."""
    from dcf.autodiff.gradients import active_state
    from dcf.ops import array_ops
    from dcf.ops.math_ops import matmul, range as range_

    handle, x, flow = op.inputs[:3]
    units = op.attrs["units"]
    k = x.shape[2] if x.shape is not None and x.shape[2] is not None else -1
    if g is None:
        g = array_ops.zeros_like(op.outputs[0])
    p = apply("TensorArrayStack", [handle, flow], name="ta_stack", dtype=x.dtype,
              element_shape=None if x.shape is None else (x.shape[1], units))
    dx = array_ops.reshape(matmul(array_ops.reshape(p, [-1, units]), g, transpose_b=True),
                           array_ops.shape(x))
    tb = array_ops.shape(x)[:2]
    dp2 = matmul(array_ops.reshape(x, [-1, k]), g)
    if len(op.inputs) > 3 and g_h is not None:   # (H's own flow input gets None)
        hs = apply("TensorArrayStack", [op.inputs[3], flow], name="ta_tied_stack",
                   dtype=x.dtype, element_shape=None)
        dp2 = dp2 + matmul(array_ops.reshape(hs, [-1, op.attrs["tied_rows"]]), g_h)
    dp = array_ops.reshape(dp2, array_ops.concat([tb, [units]], 0))
    gh, gflow = apply("TensorArrayGradV3", [handle, flow], name="ta_grad",
                      source=active_state().source)
    n = apply("TensorArraySizeV3", [handle, flow], name="ta_size")
    f = apply("TensorArrayScatterAccumulate", [gh, range_(n), dp, gflow],
              name="ta_grad_scatter")
    if len(op.inputs) == 3 or g_h is None:
        return [None, dx, f] + [None] * (len(op.inputs) - 3)
    h_handle, h_flow = op.inputs[3:]
    dh = matmul(array_ops.reshape(p, [-1, units]), g_h, transpose_b=True)
    dh = array_ops.reshape(dh, array_ops.concat([tb, [op.attrs["tied_rows"]]], 0))
    ghh, ghflow = apply("TensorArrayGradV3", [h_handle, h_flow], name="ta_grad",
                        source=active_state().source)
    fh = apply("TensorArrayScatterAccumulate", [ghh, range_(n), dh, ghflow],
               name="ta_grad_scatter")
    return [None, dx, f, None, fh]


_TIED_RECORDS = "dcf_rnn_tied_records"


def tie_recorded_inputs(projected: Any, recorded: Any) -> None:
    """Tell the gradient of `projected` (a TensorArray from project_unstack with a tied
    weight) where the loop recorded the tied matmul's inputs: `recorded` is that
    TensorArray after the loop (its flow orders the reads after every write)."""
    op = projected.flow.op
    op.graph.add_to_collection(_TIED_RECORDS, (op, recorded))


def project_unstack(ta: Any, x: Any, w: Any, name: str | None = None, *,
                    tied: Any = None) -> Any:
    """`ta.unstack(x @ w)` for x [T, B, K] as one [T*B, K] @ [K, N] GEMM, without the
    [T, B, N] product outliving the TensorArray's elements (each is released when the
    loop reads it). Returns the TensorArray with the new flow; the gradient is
    dW = sum_t X[t]^T dP[t] read from the TensorArray's gradient (and dX = dP W^T if
    asked for).

    tied=w_h: the loop that reads `ta` adds `rnn_matmul(h[t], w_h, ..., w_grad=False)`
    to element t and writes that h[t] (under stop_gradient) to a TensorArray
    (clear_after_read=False) that it passes to `tie_recorded_inputs` after the loop.
    Then dL/dw_h = sum_t h[t]^T dP[t] comes from this op's gradient, in the same pass
    over dP as dW, instead of a GEMM and an accumulation in every backward step. Valid
    when element t reaches the loss only added to that product (dynamic_rnn's hoisted
    LSTM step)."""
    from dcf.ops.registry import convert_to_tensor

    x, w = convert_to_tensor(x), convert_to_tensor(w)
    if x.shape is not None and w.shape is not None:
        ta._merge_shape((x.shape[1], w.shape[1]), "unstack")
    extra = [] if tied is None else [convert_to_tensor(tied)]
    flow = apply("TensorArrayProjectUnstack", [ta.handle, x, w, ta.flow] + extra,
                 name=name or "TensorArrayProjectUnstack")
    return ta._with_flow(flow)


# --------------------------------------------------------- a wavefront's layer inputs
# A stack of n LSTM layers stepped at once (a wavefront: layer l at time i - l) reads
# [input_l, h_l] per layer, where layer 0's input is `below` (the layer beneath the stack,
# or the sequence) and layer l's is h_{l-1} of the step before: one op (one kernel on a
# GPU) instead of an expand, a slice and two concatenations, and one for its gradient
# instead of two splits, a slice's gradient and a sum.
_WF_FWD = """
    const long long w = 2 * u, r = i / w, k = i - r * w, l = r / B, b = r - l * B;
    xh[i] = k < u ? (l == 0 ? below[b * u + k] : h[((l - 1) * B + b) * u + k])
                  : h[(l * B + b) * u + (k - u)];
"""
_WF_BWD = """
    const long long r = i / u, k = i - r * u, l = r / B, b = r - l * B, w = 2 * u;
    T d = dxh[r * w + u + k];
    if (l + 1 < layers) d += dxh[(r + B) * w + k];
    dh[i] = d;
    if (l == 0) dbelow[b * u + k] = dxh[r * w + k];
"""
_WF_RAW: dict = {}


def _wf_raw(which: str) -> RawLoop:
    k = _WF_RAW.get(which)
    if k is None:
        if which == "fwd":
            k = RawLoop("dcf_wavefront_inputs",
                        "const T* __restrict__ below, const T* __restrict__ h, "
                        "const long long B, const long long u, T* __restrict__ xh", _WF_FWD)
        else:
            k = RawLoop("dcf_wavefront_inputs_grad",
                        "const T* __restrict__ dxh, const long long layers, const long long B, "
                        "const long long u, T* __restrict__ dh, T* __restrict__ dbelow",
                        _WF_BWD)
        _WF_RAW[which] = k
    return k


def _wf_infer(below: TensorType, h: TensorType) -> TensorType:
    if below.dtype is not h.dtype:
        raise TypeError(f"WavefrontInputs: below and h must have one dtype, got {below} "
                        f"and {h}")
    if below.shape is not None and len(below.shape) != 2 or \
            h.shape is not None and len(h.shape) != 3:
        raise InvalidArgumentError(f"WavefrontInputs takes below [batch, u] and h "
                                   f"[layers, batch, u], got {below} and {h}")
    if below.shape is not None and h.shape is not None and any(
            x is not None and y is not None and x != y
            for x, y in zip(below.shape, h.shape[1:])):
        raise InvalidArgumentError(f"WavefrontInputs: below must be one layer's h, "
                                   f"[batch, u], got {below} for h {h}")
    if h.shape is None:
        return TensorType(h.dtype, None)
    u = h.shape[2]
    return TensorType(h.dtype, (h.shape[0], h.shape[1], None if u is None else 2 * u))


def _wf(xp, below, h):
    n, B, u = h.shape
    if below.shape != (B, u):
        raise InvalidArgumentError(f"WavefrontInputs: below must be [batch, u] = "
                                   f"{[B, u]}, got {list(below.shape)}")
    nd = getattr(xp, "ndarray", None)
    if RawLoop.available(xp) and type(h) is nd and type(below) is nd and \
            h.dtype.kind == "f" and below.dtype == h.dtype and h.size:
        h = h if c_contiguous(h) else xp.ascontiguousarray(h)
        below = below if c_contiguous(below) else xp.ascontiguousarray(below)
        xh = nd((n, B, 2 * u), h.dtype)
        _wf_raw("fwd")(xp, h.dtype, xh.size, (below, h, np.int64(B), np.int64(u), xh))
        return xh
    xh = xp.empty((n, B, 2 * u), h.dtype)
    if n:
        xh[0, :, :u] = below
        xh[1:, :, :u] = h[:-1]
        xh[:, :, u:] = h
    return xh


def _wf_grad_infer(dxh: TensorType, h: TensorType) -> list[TensorType]:
    return [h, TensorType(h.dtype, None if h.shape is None else h.shape[1:])]


def _wf_grad(xp, dxh, h):
    n, B, u = h.shape
    nd = getattr(xp, "ndarray", None)
    if RawLoop.available(xp) and type(dxh) is nd and \
            dxh.dtype.kind == "f" and dxh.size:
        dxh = dxh if c_contiguous(dxh) else xp.ascontiguousarray(dxh)
        dh = nd((n, B, u), dxh.dtype)
        dbelow = nd((B, u), dxh.dtype)
        _wf_raw("bwd")(xp, dxh.dtype, dh.size, (dxh, np.int64(n), np.int64(B), np.int64(u),
                                                dh, dbelow))
        return dh, dbelow
    dh = dxh[:, :, u:].copy()
    if n > 1:
        dh[:-1] += dxh[1:, :, :u]
    dbelow = dxh[0, :, :u].copy() if n else xp.zeros((B, u), dxh.dtype)
    return dh, dbelow


register(OpDef("WavefrontInputs", infer=_wf_infer, kernel=_wf))
register(OpDef("WavefrontInputsGrad", infer=_wf_grad_infer, kernel=_wf_grad))


@RegisterGradient("WavefrontInputs")
def _wavefront_inputs_grad(op: Any, dxh: Any) -> list:
    dh, dbelow = apply("WavefrontInputsGrad", [dxh, op.inputs[1]], name="WavefrontInputsGrad")
    return [dbelow, dh]


@RegisterGradient("WavefrontInputsGrad")
def _wavefront_inputs_grad_grad(op: Any, g_dh: Any, g_dbelow: Any) -> list:
    """WavefrontInputsGrad is linear in dxh, and its adjoint is WavefrontInputs itself:
    <dh, g_dh> + <dbelow, g_dbelow> = <dxh, WavefrontInputs(g_dbelow, g_dh)>."""
    from dcf.ops.array_ops import zeros_like

    h = op.inputs[1]
    g_dh = g_dh if g_dh is not None else zeros_like(h)
    if g_dbelow is None:
        g_dbelow = zeros_like(op.outputs[1])
    return [wavefront_inputs(g_dbelow, g_dh), None]


def wavefront_inputs(below: Any, h: Any, name: str | None = None) -> Tensor:
    """The inputs [x_l, h_l] ([layers, batch, 2u]) of a stack of LSTM layers stepped at
    once: x_0 = below ([batch, u]), x_l = h_{l-1} for l >= 1, beside h ([layers, batch,
    u]) along the last axis. concat([concat([below[None], h[:-1]], 0), h], 2) in one op."""
    return apply("WavefrontInputs", [below, h], name=name or "WavefrontInputs")
