"""Random ops: seeded uniform and normal samples.

The kernels draw from ``res.rng(node_name, seed)``, a numpy (or cupy) Generator that the
device keeps per op for the session, so every run (and every loop iteration) draws new
numbers and a seeded op repeats its sequence in a new session. seed=None asks the device
for a generator seeded from fresh entropy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dcf import dtypes
from dcf.errors import InvalidArgumentError
from dcf.graph import Tensor, TensorType
from dcf.ops.array_ops import _dyn_shape, _ints, _is_tensorlike, _s, _shape_arg
from dcf.ops.registry import (
    OpDef,
    apply,
    constant_value,
    convert_to_tensor,
    not_differentiable,
    register,
)

__all__ = ["random_normal", "random_uniform"]


def _random_infer(
    *dyn: TensorType,
    shape: tuple | None,
    dtype: dtypes.DType,
    seed: int | None,
    hint: tuple | None = None,
    **params: Any,
) -> TensorType:
    if shape is None:
        return TensorType(dtype, _dyn_shape(dyn[0], hint))
    if any(d < 0 for d in shape):
        raise InvalidArgumentError(f"negative dimension in shape {list(shape)}")
    return TensorType(dtype, tuple(shape))


def _sample_float(gen, shape, dtype, uniform=False):
    """Draw in the requested dtype directly; float16 goes through float32."""
    if dtype is not dtypes.float16:
        return gen(size=shape, dtype=dtype.np)
    out = gen(size=shape, dtype=np.float32)
    if uniform:
        # uniform [0, 1) on float16's grid: rounding a float32 draw to float16 gives
        # exactly 1.0 for draws >= 1 - 2**-12; truncating to a multiple of 2**-11 cannot
        out = np.floor(out * 2048.0) * (1.0 / 2048.0)
    return out.astype(dtype.np)


def _below_max(np_dt: Any, minval: float, maxval: float) -> Any:
    """The largest value a scaled uniform draw may take: ``u * (maxval - minval) + minval``
    rounds to maxval itself for u near 1 where minval is large next to the width (1000 to
    1001 in float32: about 3 draws in 10**5), and the range is [minval, maxval). None where
    nothing needs clamping (minval >= maxval: TF's formula, unclamped)."""
    if not minval < maxval:
        return None
    top = np_dt.type(maxval)
    return top if float(top) < maxval else np.nextafter(top, np_dt.type(-np.inf))


def _scale_uniform(out: Any, minval: float, maxval: float) -> Any:
    out = out * (maxval - minval) + minval  # Python floats keep the array's dtype
    top = _below_max(out.dtype, minval, maxval)
    return out if top is None else np.minimum(out, top)


def _random_uniform(xp, *dyn, shape, dtype, seed, minval, maxval, res, node_name, hint=None):
    shape = shape if shape is not None else _ints(dyn[0])
    rng = res.rng(node_name, seed)
    if dtype.is_integer:
        return _s(rng.integers(minval, maxval, size=shape, dtype=dtype.np))
    out = _sample_float(rng.random, shape, dtype, uniform=True)
    if minval != 0 or maxval != 1:
        out = _scale_uniform(out, minval, maxval)
    return _s(out)


def _bind_random_uniform(xp, *, shape, dtype, seed, minval, maxval, res, node_name,
                         hint=None):
    """RandomUniform bound to its node: the same draws from the same generator, without
    a keyword partial of 8 attrs and the dtype dispatch on every call."""
    if shape is None or xp is not np or dtype is dtypes.float16:
        return None
    # the node's generator (the one res.rng keeps for the session), looked up once
    shape, np_dt, gen = tuple(shape), dtype.np, res.rng(node_name, seed)
    if dtype.is_integer:
        lo, hi = minval, maxval
        integers = gen.integers
        if not shape:
            # integers(..) without a size draws the same number from the same stream
            # as size=() and returns the numpy scalar out[()] would: ~1 us, not ~7 us
            return lambda: integers(lo, hi, dtype=np_dt)

        def uniform_int():
            return integers(lo, hi, size=shape, dtype=np_dt)

        return uniform_int
    scaled = minval != 0 or maxval != 1
    width = maxval - minval
    top = _below_max(np.dtype(np_dt), minval, maxval) if scaled else None
    random = gen.random
    minimum = np.minimum

    def uniform():
        out = random(size=shape, dtype=np_dt)
        if scaled:
            out = out * width + minval  # Python floats keep the array's dtype
            if top is not None:
                out = minimum(out, top, out=out) if out.ndim else minimum(out, top)
        return out[()] if out.ndim == 0 else out

    return uniform


_random_uniform.bind = _bind_random_uniform  # type: ignore[attr-defined]


def _random_normal(xp, *dyn, shape, dtype, seed, mean, stddev, res, node_name, hint=None):
    shape = shape if shape is not None else _ints(dyn[0])
    out = _sample_float(res.rng(node_name, seed).standard_normal, shape, dtype)
    if mean != 0 or stddev != 1:
        out = out * stddev + mean
    return _s(out)


register(
    OpDef(
        "RandomUniform", infer=_random_infer, kernel=_random_uniform, stateful=True, resource=True
    )
)
register(
    OpDef("RandomNormal", infer=_random_infer, kernel=_random_normal, stateful=True, resource=True)
)
not_differentiable("RandomUniform", "RandomNormal")


def _static_number(v: Any) -> Any:
    """A build-time Python number, or None when v is a tensor of unknown value or not a
    scalar (an array of bounds broadcasts against the samples, as in TF)."""
    if _is_tensorlike(v):
        v = constant_value(v)
        if v is None:
            return None
    v = np.asarray(v)
    return v.item() if v.ndim == 0 else None


def _tensor_param(v: Any, dtype: dtypes.DType) -> Any:
    """A bound or moment that is not a static scalar: tensors as they are (their dtype
    must match), anything else (a list, an array) as a constant of the samples' dtype."""
    return v if _is_tensorlike(v) else convert_to_tensor(v, dtype=dtype)


def _seed_attr(seed: Any) -> int | None:
    """TF seeds are int64: a negative one is accepted and names another stream (numpy's
    generators take only non-negative seeds)."""
    if seed is None:
        return None
    seed = int(seed)
    return seed + 2**64 if seed < 0 else seed


def _random(
    type_: str, shape: Any, dtype: Any, seed: Any, name: str | None, **params: Any
) -> Tensor:
    static, hint, dyn = _shape_arg(shape)
    seed = _seed_attr(seed)
    attrs = dict(shape=static, dtype=dtypes.as_dtype(dtype), seed=seed, **params)
    if dyn is None:
        return apply(type_, [], name, **attrs)
    return apply(type_, [dyn], name, hint=hint, **attrs)


def random_uniform(
    shape: Any,
    minval: Any = 0,
    maxval: Any = None,
    dtype: Any = dtypes.float32,
    seed: int | None = None,
    name: str | None = None,
) -> Tensor:
    """``rng.uniform(minval, maxval, size=shape).astype(dtype)``: samples in [minval, maxval).

    maxval defaults to 1 for floats; integer dtypes need maxval. minval/maxval may be
    tensors or arrays that broadcast against the samples (floats only). Each run draws
    new values; `seed` makes the sequence repeatable.
    """
    dt = dtypes.as_dtype(dtype)
    if maxval is None:
        if dt.is_integer:
            raise ValueError(f"random_uniform: maxval is required for {dt}")
        maxval = 1
    lo, hi = _static_number(minval), _static_number(maxval)
    if lo is None or hi is None:
        if not dt.is_floating:
            raise ValueError("random_uniform: tensor minval/maxval need a float dtype")
        unit = _random("RandomUniform", shape, dt, seed, name, minval=0.0, maxval=1.0)
        minval, maxval = _tensor_param(minval, dt), _tensor_param(maxval, dt)
        return unit * (maxval - minval) + minval
    if dt.is_integer:
        if int(lo) >= int(hi):
            raise ValueError(f"random_uniform: need minval < maxval, got {lo} and {hi}")
        return _random("RandomUniform", shape, dt, seed, name, minval=int(lo), maxval=int(hi))
    if not dt.is_floating:
        raise TypeError(f"random_uniform: unsupported dtype {dt}")
    return _random("RandomUniform", shape, dt, seed, name, minval=float(lo), maxval=float(hi))


def random_normal(
    shape: Any,
    mean: Any = 0.0,
    stddev: Any = 1.0,
    dtype: Any = dtypes.float32,
    seed: int | None = None,
    name: str | None = None,
) -> Tensor:
    """``rng.normal(mean, stddev, size=shape).astype(dtype)``.

    mean/stddev may be tensors or arrays that broadcast against the samples. Each run
    draws new values; `seed` makes the sequence repeatable.
    """
    dt = dtypes.as_dtype(dtype)
    if not dt.is_floating:
        raise TypeError(f"random_normal: dtype must be a float type, got {dt}")
    m, s = _static_number(mean), _static_number(stddev)
    if m is None or s is None:
        unit = _random("RandomNormal", shape, dt, seed, name, mean=0.0, stddev=1.0)
        return unit * _tensor_param(stddev, dt) + _tensor_param(mean, dt)
    return _random("RandomNormal", shape, dt, seed, name, mean=float(m), stddev=float(s))
