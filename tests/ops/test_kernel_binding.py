"""Kernels specialised at bind time (`kernel.bind`, used by DeviceResources.bind_kernel):
each bound callable must return exactly what the generic kernel returns for the same
inputs and attrs (same values bit for bit, same dtype, numpy scalars for 0-d values) and
raise where it raises. The generic kernels are checked against numpy in the other tests
of this folder; here they are the reference."""

from __future__ import annotations

import functools
import itertools
from types import SimpleNamespace

import numpy as np
import pytest

import dcf
from dcf import dtypes
from dcf.ops.registry import OPS
from dcf.resources import DeviceResources


def _bound(op_type: str, **attrs):
    """(bound callable, generic callable) of op_type with attrs."""
    kernel = OPS[op_type].kernel
    res = DeviceResources()
    fn = res.bind_kernel(SimpleNamespace(kernel=kernel), dict(attrs))
    return fn, functools.partial(kernel, np, **attrs)


def _same(a, b) -> None:
    """Equal values, dtypes, types (numpy scalar vs array) and shapes, NaNs and signed
    zeros included."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    assert a.dtype == b.dtype and np.shape(a) == np.shape(b)
    np.testing.assert_array_equal(np.signbit(a), np.signbit(b)) if a.dtype.kind == "f" else None
    np.testing.assert_array_equal(a, b)


def _check(op_type: str, args: tuple, **attrs) -> None:
    fn, ref = _bound(op_type, **attrs)
    _same(fn(*args), ref(*args))


RNG = np.random.default_rng(7)


def _arr(shape, dt=np.float32):
    if np.dtype(dt).kind in "iu":
        return RNG.integers(-5, 6, size=shape).astype(dt)
    return (RNG.standard_normal(shape) * 3).astype(dt)


# ------------------------------------------------------------------- reductions
@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axis", [((64,), None), ((64,), 0), ((1,), None),
                                        ((1000,), None), ((7, 5), 1), ((7, 5), 0),
                                        ((7, 5), (0, 1)), ((7, 5), -1), ((3, 4, 5), (0, 2)),
                                        ((257, 3), 0), ((0, 3), 1)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_mean_is_numpys_mean_bit_for_bit(dt, shape, axis, keepdims):
    for _ in range(20):
        x = _arr(shape, dt)
        _check("Mean", (x,), axis=axis, keepdims=keepdims)
        fn, _ = _bound("Mean", axis=axis, keepdims=keepdims)
        _same(fn(x), np.asarray(x.mean(axis=axis, keepdims=keepdims))[()])


@pytest.mark.parametrize("dt", [np.float16, np.int32, np.int64, np.bool_])
def test_mean_of_other_dtypes_takes_the_generic_path(dt):
    x = _arr((6, 4), dt) if dt is not np.bool_ else RNG.random((6, 4)) > 0.5
    for axis, keepdims in itertools.product([None, 0, 1], [False, True]):
        _check("Mean", (x,), axis=axis, keepdims=keepdims)


def test_mean_with_a_dynamic_axis_and_of_specials():
    x = _arr((4, 6))
    fn, ref = _bound("Mean", axis=None, keepdims=False)
    _same(fn(x, np.int32(1)), ref(x, np.int32(1)))
    y = np.array([np.inf, 1.0, np.nan], np.float32)
    _check("Mean", (y,), axis=None, keepdims=False)
    _check("Mean", (np.array([-0.0, -0.0], np.float32),), axis=None, keepdims=False)


@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Prod"])
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int32, np.int8])
def test_reductions(op, dt):
    for shape, axis in [((64, 64), 0), ((64, 2), 1), ((5,), None), ((3, 4), (0, 1)),
                        ((3, 4, 2), -1)]:
        for keepdims in (False, True):
            _check(op, (_arr(shape, dt),), axis=axis, keepdims=keepdims)
    # over no elements: the identity, -inf for a max (as TF; numpy would raise)
    empty = np.zeros((0, 3), np.float32)
    _check("Max", (empty,), axis=0, keepdims=False)
    np.testing.assert_array_equal(_bound("Max", axis=0, keepdims=False)[0](empty), [-np.inf] * 3)


# ----------------------------------------------------------------------- one_hot
@pytest.mark.parametrize("on,off", [(1.0, 0.0), (1.0, -0.0), (2.0, 0.0), (1.0, 0.5),
                                    (0.0, 1.0)])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(on, off, axis):
    idx = np.array([[0, 1, 2], [3, -1, 1]], np.int32)
    args = (idx, np.float32(on), np.float32(off))
    _check("OneHot", args, depth=3, axis=axis)


@pytest.mark.parametrize("dt", [np.float64, np.int32, np.bool_])
def test_one_hot_dtypes_and_scalar_indices(dt):
    on, off = np.array(1, dt)[()], np.array(0, dt)[()]
    _check("OneHot", (np.array([0, 1, 1, 0], np.int64), on, off), depth=2, axis=-1)
    _check("OneHot", (np.int32(1), on, off), depth=4, axis=-1)


# ---------------------------------------------------------------- shape & slicing
def test_reshape_strided_slice_and_its_gradient():
    flat = _arr((4610,))
    for shape in [(10, 461), (-1,), (4610, 1), (5, -1)]:
        _check("Reshape", (flat,), shape=shape)
    for x in (np.float32(2.5), np.array([2.5], np.float32), np.array(3, np.int32)):
        _check("Reshape", (x,), shape=())
    with pytest.raises(ValueError):
        _bound("Reshape", shape=())[0](np.zeros(2, np.float32))
    key = (slice(256, 320, None),)
    _check("StridedSlice", (flat,), key=key)
    m = _arr((5, 4))
    _check("StridedSlice", (m,), key=(1, 2))             # a scalar
    _check("StridedSlice", (m,), key=(slice(None), 3))
    _check("StridedSliceGrad", (_arr((64,)),), key=key, shape=(4610,))
    _check("StridedSliceGrad", (np.float32(1.5),), key=(1, 2), shape=(5, 4))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_split(axis):
    x = _arr((6, 10))
    n = x.shape[axis]
    sizes = (1, n - 3, 2)
    _check("SplitV", (x,), sizes=sizes, num=3, axis=axis)
    _check("SplitV", (x,), sizes=(n,), num=1, axis=axis)
    with pytest.raises(dcf.errors.InvalidArgumentError):
        _bound("SplitV", sizes=(1, 2), num=2, axis=axis)[0](x)
    flat = _arr((4610,))
    fn, _ = _bound("SplitV", sizes=(256, 64, 4096, 64, 128, 2), num=6, axis=0)
    for piece, ref in zip(fn(flat), np.split(flat, [256, 320, 4416, 4480, 4608])):
        np.testing.assert_array_equal(piece, ref)
        assert np.shares_memory(piece, flat)  # views, as np.split makes


def test_broadcast_to():
    _check("BroadcastTo", (np.float32(0.25),), shape=(64,))
    _check("BroadcastTo", (_arr((64, 1)),), shape=(64, 2))
    _check("BroadcastTo", (_arr((3,)),), shape=(2, 3))
    _check("BroadcastTo", (np.float32(-0.0),), shape=())
    fn, _ = _bound("BroadcastTo", shape=(64, 2))
    out = fn(_arr((64, 1)))
    assert out.flags.owndata   # small: a new array, not a view
    big, _ = _bound("BroadcastTo", shape=(1000, 1000))
    np.testing.assert_array_equal(big(np.float32(2)), np.full((1000, 1000), 2, np.float32))
    for bad in (_arr((3,)), _arr((1, 64))):
        with pytest.raises(ValueError):
            _bound("BroadcastTo", shape=(64,))[0](bad)


def test_zeros_and_ones_like():
    for x in (_arr((3, 2)), np.float32(2), np.int32(-3), np.bool_(True), _arr((0,)),
              np.array(1.5, np.float64), np.complex64(1 + 2j)):
        for op in ("ZerosLike", "OnesLike"):
            kernel = OPS[op].kernel
            _same(kernel(np, x), np.asarray(np.zeros_like(x) if op == "ZerosLike"
                                            else np.ones_like(x))[()])


# ------------------------------------------------------------------ math & casts
@pytest.mark.parametrize("op", ["Minimum", "Maximum"])
def test_minimum_maximum_of_scalars_follow_numpy(op):
    ref = np.minimum if op == "Minimum" else np.maximum
    fvals = [0.0, -0.0, 1.0, -2.5, np.nan, np.inf, -np.inf]
    kernel = OPS[op].kernel
    for dt in (np.float32, np.float64, np.float16, np.int8, np.uint8, np.bool_):
        vals = fvals if np.dtype(dt).kind == "f" else [0, 1, 3]
        for a, b in itertools.product(vals, vals):
            x, y = dt(a), dt(b)
            _same(kernel(np, x, y), ref(x, y))
    for a, b in itertools.product([-3, 0, 7], [-3, 0, 7]):
        _same(kernel(np, np.int32(a), np.int32(b)), ref(np.int32(a), np.int32(b)))
    v = _arr((3,))
    _same(kernel(np, np.float32(1), v), ref(np.float32(1), v))


def test_matmul_variants():
    a, b = _arr((5, 3)), _arr((3, 4))
    for ta, tb in itertools.product([False, True], repeat=2):
        x = a.T if ta else a
        y = b.T if tb else b
        _check("MatMul", (x.copy(), y.copy()), transpose_a=ta, transpose_b=tb)


@pytest.mark.parametrize("src,dst", list(itertools.product(
    [np.int32, np.int64, np.int8, np.uint32, np.float32, np.float64, np.bool_, np.float16],
    [dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.bool_, dtypes.float16])))
def test_cast(src, dst):
    for v in [0, 1, -1, 3.7, -2.5, 16777217, 2**31 + 5, 300]:
        with np.errstate(all="ignore"):
            try:
                x = np.array(v).astype(src)[()]
            except OverflowError:
                continue
            fn, ref = _bound("Cast", dtype=dst)
            _same(fn(x), ref(x))
            _same(fn(np.array([x, x])), ref(np.array([x, x])))


def test_argmax_concat_gather():
    x = _arr((6, 5))
    _check("ArgMax", (x,), axis=1, output_type=dtypes.int32)
    _check("ArgMax", (x[0],), axis=0, output_type=dtypes.int64)
    _check("ConcatV2", (x, x[:2]), axis=0)
    _check("ConcatV2", (np.float32(1).reshape(1), x[0]), axis=0)
    idx = np.array([3, 0, 5, 5], np.int32)
    _check("GatherV2", (x, idx), axis=0)
    _check("GatherV2", (x[0], np.int32(2)), axis=0)


# ---------------------------------------------------------------------- py_func
def test_py_func_fast_path_keeps_values_and_converts_the_rest():
    def f(a):
        return (np.arange(3, dtype=np.float32) * a, np.float32(a), np.float64(a), a + 1,
                np.arange(2, dtype=np.int64))

    tout = [dtypes.float32, dtypes.float32, dtypes.float32, dtypes.float32, dtypes.int32]
    for a in (np.float32(2.0), 3):
        _check("PyFunc", (a,), fn=f, tout=tout, stateful=True, fn_name="f")
    g = lambda a: (np.ones(2, np.float32), np.float32(a))  # noqa: E731
    _check("PyFunc", (np.float32(1),), fn=g, tout=[dtypes.float32, dtypes.float32],
           stateful=True, fn_name="g")
    one = lambda a: np.float32(a)  # noqa: E731
    _check("PyFunc", (np.float32(1),), fn=one, tout=[dtypes.float32], stateful=True,
           fn_name="one")
    fn, _ = _bound("PyFunc", fn=lambda a: (a,), tout=[dtypes.float32, dtypes.float32],
                   stateful=True, fn_name="short")
    with pytest.raises(dcf.errors.InvalidArgumentError, match="returned 1 values"):
        fn(np.float32(1))


def test_a_session_runs_bound_kernels():
    """End to end: a graph of bound ops in a Session, against numpy."""
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (8, 6))
        a, b, c = dcf.split(x, [1, 3, 2], axis=1)
        y = dcf.reduce_mean(dcf.reshape(b, (-1,))) + dcf.reduce_sum(a) * dcf.reduce_max(c)
        oh = dcf.one_hot(dcf.cast(dcf.reduce_sum(c, axis=1) > 0, dcf.int32), 2)
        (gx,) = dcf.gradients(y + dcf.reduce_sum(oh), [x])
    xv = _arr((8, 6))
    with dcf.Session(g) as sess:
        yv, ohv, gv = sess.run([y, oh, gx], {x: xv})
    want = xv[:, 1:4].reshape(-1).mean() + xv[:, :1].sum() * xv[:, 4:].max()
    np.testing.assert_allclose(yv, want, rtol=1e-6)
    np.testing.assert_array_equal(ohv, np.eye(2, dtype=np.float32)[
        (xv[:, 4:].sum(1) > 0).astype(int)])
    gw = np.zeros_like(xv)
    gw[:, 1:4] = 1 / 24
    gw[:, :1] = xv[:, 4:].max()
    gw[np.unravel_index(np.argmax(xv[:, 4:]), (8, 2))[0],
       4 + np.unravel_index(np.argmax(xv[:, 4:]), (8, 2))[1]] += xv[:, :1].sum()
    np.testing.assert_allclose(gv, gw, rtol=1e-5)
