"""Math ops: kernels against numpy, shape/dtype inference, errors, operators, gradients."""

from __future__ import annotations

import warnings

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

import dcf
from dcf import dtypes
from dcf.errors import InvalidArgumentError
from dcf.graph import Graph, Tensor
from dcf.ops import math_ops as M
from dcf.ops.registry import GRADIENTS, OPS
from tests.ops.oracle import build, check_grads, placeholder, run_op

SETTINGS = settings(max_examples=15, deadline=None)
SHAPES = ("static", "dims", "rank")


def _values(rng, shape, dt, domain="any"):
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if np.dtype(dt).kind == "i":
        lo = 1 if domain in ("pos", "nonzero") else -5
        v = rng.integers(lo, 6, size=shape).astype(dt)
        if domain == "nonzero":
            v = v * np.where(rng.random(shape) < 0.5, -1, 1).astype(dt)
        return v
    if domain == "pos":
        return rng.uniform(0.5, 2.0, size=shape).astype(dt)
    if domain in ("nonzero", "away"):
        v = rng.standard_normal(shape)
        return (np.sign(v) * (0.25 + np.abs(v))).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def _feed_shape(shape, how):
    return {"static": shape, "dims": (None,) * len(shape), "rank": None}[how]


def _run_binary(fn, x, y, how):
    g = Graph()
    with g.as_default():
        px = placeholder(x.dtype, _feed_shape(x.shape, how))
        py = placeholder(y.dtype, _feed_shape(y.shape, how))
        out = fn(px, py)
    return out, run_op(out, {px: x, py: y})


# ------------------------------------------------------------------ binary
# wrapper, numpy reference, dtypes, domain of y, domain of x
BINARY = [
    (M.add, np.add, (np.float32, np.int32), "any", "any"),
    (M.subtract, np.subtract, (np.float32, np.int64), "any", "any"),
    (M.multiply, np.multiply, (np.float32, np.int32), "any", "any"),
    (M.divide, np.true_divide, (np.float32, np.float64), "nonzero", "any"),
    (M.floordiv, lambda x, y: np.floor(x / y) if x.dtype.kind == "f" else x // y,  # TF's
     (np.float32, np.int32), "nonzero", "any"),
    (M.mod, np.mod, (np.float32, np.int32), "nonzero", "any"),
    (M.pow, np.power, (np.float32, np.int32), "pos", "pos"),
    (M.maximum, np.maximum, (np.float32, np.int32), "any", "any"),
    (M.minimum, np.minimum, (np.float64, np.int32), "any", "any"),
    (M.equal, np.equal, (np.float32, np.int32, np.bool_), "any", "any"),
    (M.not_equal, np.not_equal, (np.int32, np.bool_), "any", "any"),
    (M.less, np.less, (np.float32, np.int32), "any", "any"),
    (M.less_equal, np.less_equal, (np.float32, np.int32), "any", "any"),
    (M.greater, np.greater, (np.float32, np.int64), "any", "any"),
    (M.greater_equal, np.greater_equal, (np.float16, np.int32), "any", "any"),
    (M.logical_and, np.logical_and, (np.bool_,), "any", "any"),
    (M.logical_or, np.logical_or, (np.bool_,), "any", "any"),
    (M.logical_xor, np.logical_xor, (np.bool_,), "any", "any"),
]


@pytest.mark.parametrize("fn,ref,dts,ydom,xdom", BINARY, ids=[b[0].__name__ for b in BINARY])
@SETTINGS
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4), data=st.data()
)
def test_binary_op_matches_numpy_with_broadcasting(fn, ref, dts, ydom, xdom, shapes, data):
    dt = data.draw(st.sampled_from(dts))
    how = data.draw(st.sampled_from(SHAPES))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    x = _values(rng, shapes.input_shapes[0], dt, xdom)
    y = _values(rng, shapes.input_shapes[1], dt, ydom)
    out, got = _run_binary(fn, x, y, how)
    want = ref(x, y)
    if how == "static":
        assert out.shape == want.shape
    np.testing.assert_allclose(np.asarray(got, dtype=want.dtype), want, rtol=1e-6)
    assert np.asarray(got).dtype == want.dtype


def test_scalar_results_are_numpy_scalars_of_the_input_dtype():
    _, (a, b, c, d) = build(
        lambda: (
            M.add(np.float32(1), np.float32(2)),
            M.multiply(np.int32(3), np.int32(4)),
            M.less(np.float32(1), np.float32(2)),
            M.reduce_sum(np.ones(3, np.int32)),
        )
    )
    vals = run_op([a, b, c, d])
    assert [type(v) for v in vals] == [np.float32, np.int32, np.bool_, np.int32]


def test_integer_division_is_true_division_in_float64():
    _, t = build(lambda: M.divide(np.array([3, 4], np.int32), np.int32(2)))
    assert t.dtype is dtypes.float64
    np.testing.assert_array_equal(run_op(t), [1.5, 2.0])


# ------------------------------------------------------------------- unary
# wrapper, numpy reference, dtypes, domain
UNARY = [
    (M.negative, np.negative, (np.float32, np.int32), "any"),
    (M.abs, np.abs, (np.float32, np.int32), "any"),
    (M.sign, np.sign, (np.float32, np.int32), "any"),
    (M.square, np.square, (np.float32, np.int32), "any"),
    (M.sqrt, np.sqrt, (np.float32, np.float64), "pos"),
    (M.rsqrt, lambda x: 1 / np.sqrt(x), (np.float32, np.float64), "pos"),
    (M.exp, np.exp, (np.float32, np.float16), "any"),
    (M.log, np.log, (np.float32, np.float64), "pos"),
    (M.log1p, np.log1p, (np.float32,), "pos"),
    (M.tanh, np.tanh, (np.float32, np.float64), "any"),
    (M.sigmoid, lambda x: 1 / (1 + np.exp(-x.astype(np.float64))), (np.float32, np.float64), "any"),
    (M.relu, lambda x: np.maximum(x, 0), (np.float32, np.int32), "any"),
    (M.softplus, lambda x: np.log1p(np.exp(x.astype(np.float64))), (np.float32, np.float64), "any"),
    (M.sin, np.sin, (np.float32,), "any"),
    (M.cos, np.cos, (np.float64,), "any"),
    (M.logical_not, np.logical_not, (np.bool_,), "any"),
]


@pytest.mark.parametrize("fn,ref,dts,dom", UNARY, ids=[u[0].__name__ for u in UNARY])
@SETTINGS
@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4), data=st.data())
def test_unary_op_matches_numpy(fn, ref, dts, dom, shape, data):
    dt = data.draw(st.sampled_from(dts))
    how = data.draw(st.sampled_from(SHAPES))
    x = _values(np.random.default_rng(data.draw(st.integers(0, 2**31))), shape, dt, dom)
    g = Graph()
    with g.as_default():
        px = placeholder(dt, _feed_shape(shape, how))
        out = fn(px)
    got = run_op(out, {px: x})
    assert got.dtype == np.dtype(dt) and np.shape(got) == shape
    rtol = 2e-3 if dt == np.float16 else 2e-7 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(got, np.asarray(ref(x)).astype(dt), rtol=rtol, atol=1e-30)


def test_tanh_and_sigmoid_are_finite_accurate_and_quiet_for_large_inputs():
    x = np.concatenate([np.linspace(-120, 120, 2001), [-1e30, 1e30, -np.inf, np.inf]])
    x32 = x.astype(np.float32)
    _, (t, s) = build(lambda: (M.tanh(x32), M.sigmoid(x32)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tv, sv = run_op([t, s])
    assert np.all(np.isfinite(tv)) and np.all(np.isfinite(sv))
    with np.errstate(over="ignore"):
        ref = 1 / (1 + np.exp(-x32.astype(np.float64)))
    tiny = np.finfo(np.float32).tiny
    rel = np.abs(sv - ref) / np.maximum(ref, tiny)
    assert rel[ref > tiny].max() < 4 * np.finfo(np.float32).eps  # relative, even in the tails
    np.testing.assert_array_max_ulp(tv, np.tanh(x32), maxulp=2)


def test_sigmoid_of_a_scalar_is_a_scalar():
    _, s = build(lambda: M.sigmoid(np.float32(-200.0)))
    v = run_op(s)
    assert type(v) is np.float32 and v == 0.0


# -------------------------------------------------------- errors and dtypes
def test_binary_dtype_mismatch_names_op_and_dtypes():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (2,))
        i = placeholder(dtypes.int32, (2,))
        with pytest.raises(
            TypeError,
            match=r"Add 'Add': dtypes differ: float32 vs int32"
            r"(.|\n)*op created at test_math_ops.py:\d+",
        ):
            M.add(x, i)


def test_incompatible_shapes_name_op_and_shapes():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (2, 3))
        y = placeholder(dtypes.float32, (4,))
        with pytest.raises(
            InvalidArgumentError,
            match=r"Mul 'scale': shapes \[2, 3\] and \[4\] cannot be broadcast",
        ):
            M.multiply(x, y, name="scale")


def test_python_scalars_take_the_tensor_dtype():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (2,))
        i = placeholder(dtypes.int32, (2,))
        y = x * 2
        assert y.dtype is dtypes.float32 and y.op.inputs[1].dtype is dtypes.float32
        assert (2 - i).dtype is dtypes.int32
        assert (x + np.float64(1.5)).dtype is dtypes.float32
        with pytest.raises(TypeError, match=r"cannot use 2.5 \(float64\) with a int32 tensor"):
            i * 2.5
        with pytest.raises(TypeError, match=r"cannot use True"):
            x + True


@pytest.mark.parametrize(
    "fn,dt,msg",
    [
        (M.sqrt, dtypes.int32, r"Sqrt 'Sqrt': does not support int32 tensors \(needs float\)"),
        (M.logical_not, dtypes.float32, r"LogicalNot 'LogicalNot': does not support float32"),
        (lambda x: M.add(x, x), dtypes.bool_, r"Add 'Add': does not support bool"),
        (lambda x: M.divide(x, x), dtypes.bool_, r"RealDiv 'RealDiv': does not support bool"),
        (lambda x: x & x, dtypes.int32, r"LogicalAnd 'LogicalAnd': does not support int32"),
    ],
)
def test_unsupported_dtypes_raise_type_error(fn, dt, msg):
    g = Graph()
    with g.as_default(), pytest.raises(TypeError, match=msg):
        fn(placeholder(dt, (3,)))


# --------------------------------------------------------------- operators
def test_python_operators_build_the_matching_ops():
    x = np.array([[1.5, -2.0], [3.0, 4.5]], np.float32)
    y = np.array([0.5, 2.0], np.float32)
    b = np.array([True, False])
    c = np.array([True, True])
    g = Graph()
    with g.as_default():
        tx, ty, tb, tc = (placeholder(v.dtype, v.shape) for v in (x, y, b, c))
        cases = [
            (tx + ty, "Add", x + y),
            (1 + tx, "Add", 1 + x),
            (tx - ty, "Sub", x - y),
            (2 - tx, "Sub", 2 - x),
            (tx * ty, "Mul", x * y),
            (3 * tx, "Mul", 3 * x),
            (tx / ty, "RealDiv", x / y),
            (1 / tx, "RealDiv", 1 / x),
            (tx // ty, "FloorDiv", x // y),
            (7 // tx, "FloorDiv", 7 // x),
            (tx % ty, "FloorMod", x % y),
            (5 % tx, "FloorMod", 5 % x),
            (tx**2, "Pow", x**2),
            (2**tx, "Pow", 2**x),
            (tx @ tx, "MatMul", x @ x),
            (x @ tx, "MatMul", x @ x),
            (-tx, "Neg", -x),
            (abs(tx), "Abs", np.abs(x)),
            (tx < ty, "Less", x < y),
            (tx <= 1.5, "LessEqual", x <= 1.5),
            (tx > ty, "Greater", x > y),
            (tx >= ty, "GreaterEqual", x >= y),
            (1 < tx, "Greater", 1 < x),
            (tb & tc, "LogicalAnd", b & c),
            (tb | tc, "LogicalOr", b | c),
            (~tb, "LogicalNot", ~b),
            (True & tb, "LogicalAnd", b),
            (np.ones(2, np.float32) + ty, "Add", 1 + y),
            (np.float32(2) * ty, "Mul", 2 * y),
        ]
    feed = {tx: x, ty: y, tb: b, tc: c}
    vals = run_op([t for t, _, _ in cases], feed)
    for (t, type_, want), got in zip(cases, vals):
        assert isinstance(t, Tensor) and t.op.type == type_, (t, type_)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_xor_operator_on_bool_tensors_and_variables():
    # TF1's Tensor has `^` (logical_xor) next to `&` and `|`; dcf's had no __xor__
    b = np.array([True, False, True, False])
    c = np.array([True, True, False, False])
    g = Graph()
    with g.as_default():
        tb, tc = placeholder(dcf.bool, (4,)), placeholder(dcf.bool, (4,))
        v = dcf.Variable(c)
        outs = [tb ^ tc, True ^ tb, tb ^ False, v ^ tb, b ^ v, M.logical_xor(tb, tc)]
        with pytest.raises(TypeError, match="needs bool"):
            placeholder(dtypes.int32, (2,)) ^ 1
        with dcf.Session(g) as sess:
            sess.run(dcf.global_variables_initializer())
            got = sess.run(outs, {tb: b, tc: c})
    for out, want in zip(got, [b ^ c, ~b, b, c ^ b, b ^ c, b ^ c]):
        np.testing.assert_array_equal(out, want)


def test_equality_and_hash_stay_identity():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (2,))
        y = x + 0
    assert x.__eq__(x) is True and (x == y) is False and (x != y) is True
    assert {x: 1, y: 2}[y] == 2


# ------------------------------------------------------------------ matmul
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("how", SHAPES)
def test_matmul_matches_numpy_with_transposes(ta, tb, how):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4) if not ta else (4, 3)).astype(np.float32)
    b = rng.standard_normal((4, 5) if not tb else (5, 4)).astype(np.float32)
    out, got = _run_binary(lambda x, y: M.matmul(x, y, transpose_a=ta, transpose_b=tb), a, b, how)
    want = (a.T if ta else a) @ (b.T if tb else b)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert out.op.type == ("MatMul" if how != "rank" else "BatchMatMulV2")
    if how == "static":
        assert out.shape == (3, 5)


@SETTINGS
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, max_side=3),
    data=st.data(),
)
def test_batched_matmul_broadcasts_batch_axes_like_numpy(shapes, data):
    ta, tb = data.draw(st.booleans()), data.draw(st.booleans())
    how = data.draw(st.sampled_from(SHAPES))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    m, k, n = 2, 3, 4
    a = rng.standard_normal(shapes.input_shapes[0] + ((k, m) if ta else (m, k)))
    b = rng.standard_normal(shapes.input_shapes[1] + ((n, k) if tb else (k, n)))
    _, got = _run_binary(lambda x, y: M.matmul(x, y, transpose_a=ta, transpose_b=tb), a, b, how)
    want = (np.swapaxes(a, -1, -2) if ta else a) @ (np.swapaxes(b, -1, -2) if tb else b)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_matmul_keeps_int32():
    _, t = build(lambda: M.matmul(np.ones((2, 3), np.int32), np.ones((3, 2), np.int32)))
    assert run_op(t).dtype == np.int32


def test_matmul_errors_name_shapes():
    g = Graph()
    with g.as_default():
        a = placeholder(dtypes.float32, (2, 3))
        b = placeholder(dtypes.float32, (4, 5))
        with pytest.raises(
            InvalidArgumentError,
            match=r"MatMul 'mm': inner dimensions differ: "
            r"a is float32\[2,3\], b is float32\[4,5\]",
        ):
            M.matmul(a, b, name="mm")
        with pytest.raises(
            InvalidArgumentError,
            match=r"BatchMatMulV2 'BatchMatMulV2': "
            r"a must have rank >= 2",
        ):
            M.matmul(placeholder(dtypes.float32, (3,)), b)


# -------------------------------------------------------------- reductions
REDUCE = [
    (M.reduce_sum, np.sum),
    (M.reduce_mean, np.mean),
    (M.reduce_max, np.max),
    (M.reduce_min, np.min),
    (M.reduce_prod, np.prod),
]


def _reduce_ref(ref, x, axis, keepdims):
    if np.dtype(x.dtype).kind == "i" and ref is np.mean:
        s = np.sum(x, axis=axis, keepdims=keepdims, dtype=np.int64)
        n = x.size // max(np.size(s), 1)
        return np.trunc(s / n).astype(x.dtype)
    return np.asarray(ref(x, axis=axis, keepdims=keepdims)).astype(x.dtype)


@pytest.mark.parametrize("fn,ref", REDUCE, ids=[r[0].__name__ for r in REDUCE])
@SETTINGS
@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4), data=st.data())
def test_reduction_matches_numpy_over_random_axes(fn, ref, shape, data):
    nd = len(shape)
    axis = data.draw(
        st.one_of(
            st.none(),
            st.lists(st.integers(0, nd - 1), unique=True).map(tuple) if nd else st.none(),
            st.integers(-nd, nd - 1) if nd else st.none(),
        )
    )
    if isinstance(axis, tuple) and axis and data.draw(st.booleans()):
        axis = tuple(a - nd for a in axis)  # negative spelling
    keepdims = data.draw(st.booleans())
    dt = data.draw(st.sampled_from([np.float32, np.int32, np.float64]))
    how = data.draw(st.sampled_from(("static", "rank", "dynamic_axis")))
    x = _values(np.random.default_rng(data.draw(st.integers(0, 2**31))), shape, dt)
    g = Graph()
    with g.as_default():
        px = placeholder(dt, None if how == "rank" else shape)
        feed = {px: x}
        ax = axis
        if how == "dynamic_axis" and axis is not None:
            ax = placeholder(dtypes.int32, np.shape(axis))
            feed[ax] = np.asarray(axis, np.int32)
        out = fn(px, axis=ax, keepdims=keepdims)
    got = run_op(out, feed)
    want = _reduce_ref(ref, x, axis, keepdims)
    assert np.asarray(got).dtype == np.dtype(dt) and np.shape(got) == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5)
    if how == "static":
        assert out.shape == want.shape


def test_integer_mean_is_exact_and_truncates_toward_zero():
    # TF's integer mean: the sum in integers (an int32 sum in 64 bits), divided by the
    # count in integers; numpy's mean divides in float64, which rounded an int64 sum past
    # 2**53, and sums int32 in int32, which wrapped
    import dcf

    def trunc_div(s, n):            # Python ints: exact
        return abs(s) // n * (1 if s >= 0 else -1)

    big = [[2**60 + 1, 2**60 + 3, -(2**55) - 8]]
    wide = [2**31 - 1, 2**31 - 1, -5]
    neg = [[-7, 0], [7, 0], [-1, -2]]
    g = Graph()
    with g.as_default():
        outs = [M.reduce_mean(np.array(big, np.int64), axis=1),
                M.reduce_mean(np.array(big, np.int64)[:, :1]),
                M.reduce_mean(np.array(wide, np.int32)),
                M.reduce_mean(np.array(neg, np.int32), axis=-1, keepdims=True)]
    with dcf.Session(g) as sess:
        got = sess.run(outs)
    assert got[0].tolist() == [trunc_div(sum(big[0]), 3)]
    assert got[1] == 2**60 + 1
    assert got[2].dtype == np.int32 and got[2] == trunc_div(sum(wide), 3)
    assert got[3].tolist() == [[trunc_div(sum(r), 2)] for r in neg] == [[-3], [3], [-1]]


def test_max_and_min_over_no_elements_are_the_identity():
    # TF's max of nothing is the dtype's lowest value (-inf), its min the highest; numpy
    # raises (a batch that happens to be empty must not fail the run)
    import dcf

    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (None, 3))
        i = placeholder(dtypes.int32, (None, 2))
        outs = [M.reduce_max(x, axis=0), M.reduce_min(x), M.reduce_max(i, axis=0, keepdims=True),
                M.reduce_min(i, axis=-2), M.reduce_max(x, axis=1)]
        gx = dcf.gradients(M.reduce_sum(M.reduce_min(x, axis=0)), x)[0]
    xv, iv = np.zeros((0, 3), np.float32), np.zeros((0, 2), np.int32)
    with dcf.Session(g) as sess:
        got = sess.run(outs + [gx], {x: xv, i: iv})
    np.testing.assert_array_equal(got[0], np.max(xv, axis=0, initial=-np.inf))
    assert got[1].dtype == np.float32 and got[1] == np.inf
    np.testing.assert_array_equal(got[2], [[np.iinfo(np.int32).min] * 2])
    np.testing.assert_array_equal(got[3], [np.iinfo(np.int32).max] * 2)
    assert got[4].shape == (0,) and got[5].shape == (0, 3)


def test_reduction_bad_axis_is_named():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (2, 3))
        with pytest.raises(
            InvalidArgumentError,
            match=r"Sum 'Sum': axis 2 is out of range "
            r"for a tensor of rank 2",
        ):
            M.reduce_sum(x, 2)
        with pytest.raises(InvalidArgumentError, match=r"Mean 'Mean': duplicate axes in \[1, -1\]"):
            M.reduce_mean(x, [1, -1])


@pytest.mark.parametrize("fn,ref", [(M.argmax, np.argmax), (M.argmin, np.argmin)])
@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4), data=st.data())
def test_argmax_argmin_match_numpy_as_int64(fn, ref, shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = _values(np.random.default_rng(data.draw(st.integers(0, 2**31))), shape, np.float32)
    g = Graph()
    with g.as_default():
        px = placeholder(dtypes.float32, shape)
        out, default = fn(px, axis), fn(px)
    got, got0 = run_op([out, default], {px: x})
    assert out.dtype is dtypes.int64 and got.dtype == np.int64
    np.testing.assert_array_equal(got, ref(x, axis=axis))
    np.testing.assert_array_equal(got0, ref(x, axis=0))


# ------------------------------------------------ cast, range, clip, add_n
def test_cast_truncates_and_returns_same_dtype_input_unchanged():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (3,))
        assert M.cast(x, "float32") is x
        i, b = M.cast(x, dtypes.int32), M.cast(x, dtypes.bool_)
    got_i, got_b = run_op([i, b], {x: [1.7, -1.7, 0.0]})
    np.testing.assert_array_equal(got_i, [1, -1, 0])
    np.testing.assert_array_equal(got_b, [True, True, False])


def test_range_static_dynamic_and_dtype_inference():
    g = Graph()
    with g.as_default():
        n = placeholder(dtypes.int32, ())
        r1, r2, r3 = M.range(5), M.range(0, 1.5, 0.5), M.range(2, 11, 3)
        r4, r5 = M.range(n), M.range(1, n, 2, dtype=dtypes.int64)
    assert r1.shape == (5,) and r1.dtype is dtypes.int32
    assert r2.shape == (3,) and r2.dtype is dtypes.float32 and r3.shape == (3,)
    assert r4.shape == (None,) and r5.dtype is dtypes.int64
    vals = run_op([r1, r2, r3, r4, r5], {n: 7})
    for got, want in zip(
        vals,
        [
            np.arange(5),
            np.arange(0, 1.5, 0.5),
            np.arange(2, 11, 3),
            np.arange(7),
            np.arange(1, 7, 2),
        ],
    ):
        np.testing.assert_allclose(got, want)


def test_clip_by_value_and_add_n():
    x = np.array([-2.0, 0.5, 3.0], np.float32)
    _, (c, s) = build(lambda: (M.clip_by_value(x, -1, 1), M.add_n([x, x, x])))
    c_v, s_v = run_op([c, s])
    np.testing.assert_array_equal(c_v, [-1.0, 0.5, 1.0])
    np.testing.assert_array_equal(s_v, 3 * x)


# ---------------------------------------------------------------- gradients
def _arg(rng, shape, domain="any"):
    return _values(rng, shape, np.float64, domain)


# id, function of float64 tensors, argument (shape, domain) list
GRAD_CASES = [
    ("add_bcast", lambda x, y: x + y, [((2, 3), "any"), ((3,), "any")]),
    ("add_ones", lambda x, y: x + y, [((2, 1, 3), "any"), ((4, 1), "any")]),
    ("add_scalar", lambda x, y: x + y, [((), "any"), ((2, 2), "any")]),
    ("sub", lambda x, y: x - y, [((2, 3), "any"), ((2, 1), "any")]),
    ("mul", lambda x, y: x * y, [((3,), "any"), ((2, 3), "any")]),
    ("div", lambda x, y: x / y, [((2, 3), "any"), ((3,), "away")]),
    ("mod", lambda x, y: M.mod(x, y), [((2, 3), "any"), ((3,), "pos")]),
    ("pow", lambda x, y: x**y, [((2, 3), "pos"), ((3,), "any")]),
    ("pow_const", lambda x: x**3, [((2, 3), "any")]),
    ("maximum", M.maximum, [((2, 3), "any"), ((3,), "any")]),
    ("minimum", M.minimum, [((2, 1), "any"), ((1, 3), "any")]),
    ("neg", M.negative, [((2, 3), "any")]),
    ("abs", M.abs, [((2, 3), "away")]),
    ("square", M.square, [((2, 3), "any")]),
    ("sqrt", M.sqrt, [((2, 3), "pos")]),
    ("rsqrt", M.rsqrt, [((2, 3), "pos")]),
    ("exp", M.exp, [((2, 3), "any")]),
    ("log", M.log, [((2, 3), "pos")]),
    ("log1p", M.log1p, [((2, 3), "pos")]),
    ("tanh", M.tanh, [((2, 3), "any")]),
    ("sigmoid", M.sigmoid, [((2, 3), "any")]),
    ("relu", M.relu, [((2, 3), "away")]),
    ("softplus", M.softplus, [((2, 3), "any")]),
    ("sin", M.sin, [((2, 3), "any")]),
    ("cos", M.cos, [((2, 3), "any")]),
    ("matmul", M.matmul, [((2, 3), "any"), ((3, 4), "any")]),
    (
        "matmul_ta",
        lambda a, b: M.matmul(a, b, transpose_a=True),
        [((3, 2), "any"), ((3, 4), "any")],
    ),
    (
        "matmul_tb",
        lambda a, b: M.matmul(a, b, transpose_b=True),
        [((2, 3), "any"), ((4, 3), "any")],
    ),
    ("matmul_tab", lambda a, b: M.matmul(a, b, True, True), [((3, 2), "any"), ((4, 3), "any")]),
    ("batch_matmul", M.matmul, [((2, 2, 3), "any"), ((3, 4), "any")]),
    (
        "batch_matmul_bcast",
        lambda a, b: M.matmul(a, b, transpose_b=True),
        [((2, 1, 2, 3), "any"), ((3, 4, 3), "any")],
    ),
    ("sum_all", M.reduce_sum, [((2, 3), "any")]),
    ("sum_axis", lambda x: M.reduce_sum(x, 1), [((2, 3, 2), "any")]),
    ("sum_axes_keep", lambda x: M.reduce_sum(x, [0, 2], keepdims=True), [((2, 3, 2), "any")]),
    ("mean_axis", lambda x: M.reduce_mean(x, -1), [((2, 3), "any")]),
    ("mean_all_keep", lambda x: M.reduce_mean(x, keepdims=True), [((2, 3), "any")]),
    ("max_axis", lambda x: M.reduce_max(x, 0), [((3, 4), "any")]),
    ("min_all", M.reduce_min, [((3, 4), "any")]),
    ("prod_axis", lambda x: M.reduce_prod(x, 1), [((2, 3), "any")]),
    (
        "prod_with_zeros",
        lambda x: M.reduce_prod(x * np.array([[0.0, 1, 1], [0, 0, 1]]), 1),
        [((2, 3), "any")],
    ),
    (
        "prod_one_zero",
        lambda x: M.reduce_prod(x * np.array([[1.0, 0, 1], [1, 1, 1]]), [0, 1]),
        [((2, 3), "any")],
    ),
    ("clip", M.clip_by_value, [((2, 3), "any"), ((), "any"), ((3,), "pos")]),
    ("add_n", lambda x, y, z: M.add_n([x, y, z]), [((2, 3), "any")] * 3),
    (
        "cast_roundtrip",
        lambda x: M.cast(M.cast(x, dtypes.float32), dtypes.float64) * 2,
        [((2, 3), "any")],
    ),
]


@pytest.mark.parametrize("how", ["static", "rank"])
@pytest.mark.parametrize("case,f,specs", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradient_matches_finite_differences(case, f, specs, how):
    rng = np.random.default_rng(1)
    args = [_arg(rng, s, d) for s, d in specs]
    if f is M.clip_by_value:  # keep the bounds ordered and away from the data
        args = [args[0], np.float64(-0.3), args[2]]
    loose = case == "cast_roundtrip"  # float32 rounding inside: a larger step, looser match
    check_grads(f, args, shapes=how, eps=1e-3 if loose else 1e-6, rtol=1e-4 if loose else 1e-6)


SECOND_ORDER = [
    "mul",
    "div",
    "tanh",
    "sigmoid",
    "relu",
    "softplus",
    "matmul_tb",
    "sum_axis",
    "mean_axis",
    "max_axis",
    "prod_axis",
    "pow",
    "batch_matmul_bcast",
    "clip",
]


@pytest.mark.parametrize("case", SECOND_ORDER)
def test_second_order_gradient_matches_finite_differences(case):
    _, f, specs = next(c for c in GRAD_CASES if c[0] == case)
    rng = np.random.default_rng(2)
    args = [_arg(rng, s, d) for s, d in specs]
    if f is M.clip_by_value:
        args = [args[0], np.float64(-0.3), args[2]]
    check_grads(f, args, order=2)


def test_gradient_of_a_broadcast_with_unknown_dims_reduces_at_run_time():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float64, (None, None))
        y = placeholder(dtypes.float64, (None,))
        gx, gy = GRADIENTS["Add"](M.add(x, y).op, M.add(x, y))
    assert gy.op.type == "Reshape"  # dynamic: BroadcastGradientArgs + Sum + Reshape
    xv, yv = np.ones((2, 3)), np.ones(3)
    np.testing.assert_array_equal(run_op(gy, {x: xv, y: yv}), [4.0, 4.0, 4.0])
    np.testing.assert_array_equal(run_op(gx, {x: xv, y: yv}), 2 * np.ones((2, 3)))


def test_gradient_of_a_bias_add_with_unknown_batch_is_static():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (None, 4))
        b = placeholder(dtypes.float32, (4,))
        y = x + b
        gx, gb = GRADIENTS["Add"](y.op, y)
    assert gx is y and gb.op.type == "Sum" and gb.op.attrs["axis"] == (0,)


MY_MODULES = {"dcf.ops.math_ops", "dcf.ops.array_ops", "dcf.ops.nn_ops", "dcf.ops.random_ops"}


def test_every_op_type_here_declares_its_gradient_or_none():
    mine = [t for t, d in OPS.items() if d.kernel is not None and d.kernel.__module__ in MY_MODULES]
    assert len(mine) > 80
    missing = [t for t in mine if t not in GRADIENTS]
    assert not missing


def test_add_n_needs_one_shape():
    g = Graph()
    with g.as_default():
        a = placeholder(dtypes.float32, (2, 3))
        assert M.add_n([a, placeholder(dtypes.float32, (None, 3)), a]).shape == (2, 3)
        with pytest.raises(
            InvalidArgumentError,
            match=r"AddN 'AddN': inputs differ in shape: "
            r"float32\[2,3\] vs float32\[3\]",
        ):
            M.add_n([a, placeholder(dtypes.float32, (3,))])
