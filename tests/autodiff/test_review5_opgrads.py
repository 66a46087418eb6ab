"""Review 5 of op gradients, by use: every differentiable op against float64 central finite
differences (check_grads) and closed forms, over shapes that break things (rank 0,
size-0 dimensions, broadcasting both ways, negative axes, ranks known only at run time),
values at kinks and ties, float16 counts, grad_ys of the wrong dtype or shape, and
second derivatives. Reference values were also compared with TF1 when the tests were
written; the tests assert closed forms and finite differences only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dcf
from dcf.ops.registry import OpDef, register

from tests.autodiff.gradcheck import OPTS, check_grads, run

f64 = dcf.float64


def _grads_with_unknown_shapes(build, inputs, order=1):
    """dcf's gradient (and with order=2, the gradient of <gradient, 1>) of
    build(*placeholders) w.r.t. float64 placeholders of unknown shape."""
    xs = [dcf.placeholder(f64, None) for _ in inputs]
    y = build(*xs)
    gs = dcf.gradients(y, xs)
    out = list(gs)
    if order == 2:
        out += dcf.gradients(dcf.add_n([dcf.reduce_sum(g) for g in gs]), xs)
    return run(out, dict(zip(xs, inputs)))


# ------------------------------------------------------------ relu's second derivative
def test_relu_second_derivative_is_zeros_not_none():
    """relu's output reaches its own gradient (ReluGrad(g, relu(x))): the gradient of that
    gradient w.r.t. x is zeros (relu is piecewise linear), not None, which API.md keeps
    for x with no path to y (TF1 gives zeros too)."""
    x = dcf.placeholder(f64, [4])
    g, = dcf.gradients(dcf.reduce_sum(dcf.relu(x) * 3.0), [x])
    h, = dcf.gradients(dcf.reduce_sum(g * g), [x])
    assert h is not None
    got_g, got_h = run([g, h], {x: np.array([-1.0, 0.0, 0.5, 2.0])})
    np.testing.assert_array_equal(got_g, [0.0, 0.0, 3.0, 3.0])
    np.testing.assert_array_equal(got_h, np.zeros(4))


# ------------------------------------------------ gather along an axis, ranks unknown
GATHERS = {
    "axis1_2d_indices": (1, (3, 4, 2), [[1, 1], [0, 3]]),
    "axis-1_repeated": (-1, (3, 2), [1, 1, 0]),
    "axis-2": (-2, (2, 3, 2), [1, 1, 0]),
    "scalar_index": (1, (3, 4), 1),
    "scalar_index_axis-1": (-1, (3, 4), 2),
    "no_indices": (1, (3, 4), np.zeros((0, 2), np.int32)),
    "empty_params": (1, (0, 4, 2), [1, 0]),
}


@pytest.mark.parametrize("case", sorted(GATHERS))
def test_gather_gradient_along_inner_axis_with_unknown_rank(case):
    """The gradient of a gather along an axis other than 0 was a ValueError at build
    time when params' rank was known only at run time; it sums the gradient of every
    gathered slice into the slice it came from (repeated indices add up)."""
    axis, shp, idx = GATHERS[case]
    idx = np.asarray(idx, np.int32)
    p = np.random.default_rng(0).uniform(0.5, 2, shp)
    want_y = np.take(p, idx, axis=axis)
    ct = np.random.default_rng(1).standard_normal(want_y.shape)
    want_g = np.zeros_like(p)
    moved = np.moveaxis(want_g, axis, 0)          # a view: writes land in want_g
    ct_moved = np.moveaxis(ct, list(range(axis % p.ndim, axis % p.ndim + idx.ndim)),
                           list(range(idx.ndim)))
    np.add.at(moved, idx, ct_moved)
    x = dcf.placeholder(f64, None)
    y = dcf.gather(x, idx, axis=axis)
    g, = dcf.gradients(y, [x], grad_ys=dcf.constant(ct))
    got_y, got_g = run([y, g], {x: p})
    np.testing.assert_array_equal(got_y, want_y)
    np.testing.assert_allclose(got_g, want_g, rtol=1e-15, atol=0)


def test_gather_gradient_with_indices_of_unknown_rank():
    """Indices from a py_func (no static shape) along axis 1: the same gradient."""
    p = np.arange(12.0).reshape(3, 4)
    idx = np.array([[3, 0, 3]], np.int32)
    x = dcf.placeholder(f64, [3, 4])
    i = dcf.py_func(lambda: idx, [], dcf.int32)
    g, = dcf.gradients(dcf.reduce_sum(dcf.gather(x, i, axis=1) * 2.0), [x])
    np.testing.assert_array_equal(run(g, {x: p}), np.tile([2.0, 0.0, 0.0, 4.0], (3, 1)))


# -------------------------------------------------------- clip_by_value with lo > hi
def test_clip_by_value_gradient_goes_to_the_bound_it_returns_when_lo_exceeds_hi():
    """clip_by_value is min(max(t, lo), hi) (numpy's np.clip): where lo > hi it returns hi,
    so the gradient goes to hi alone. It went to lo as well (t < lo) or instead (t < hi <
    lo)."""
    t = np.array([0.0, 1.5, 3.0, 1.5, 1.0])
    lo = np.array([2.0, 2.0, 2.0, 1.0, 1.0])
    hi = np.array([1.0, 1.0, 1.0, 2.0, 1.0])
    # (finite differences away from the tie, where the function has no derivative)
    check_grads(lambda a, b, c: dcf.clip_by_value(a, b, c), [t[:4], lo[:4], hi[:4]])
    a, b, c = (dcf.constant(v) for v in (t, lo, hi))
    y = dcf.clip_by_value(a, b, c)
    got = run([y] + dcf.gradients(y, [a, b, c]))
    np.testing.assert_array_equal(got[0], np.clip(t, lo, hi))
    # at a tie (t == lo == hi: the last entry) the gradient goes to t, as TF1's
    np.testing.assert_array_equal(got[1], [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(got[2], [0, 0, 0, 0, 0])
    np.testing.assert_array_equal(got[3], [1, 1, 1, 0, 0])


def test_clip_by_value_gradient_with_broadcast_bounds():
    rng = np.random.default_rng(2)
    check_grads(lambda a, b, c: dcf.clip_by_value(a, b, c),
                [rng.uniform(-2, 2, (3, 4)), rng.uniform(-1, 0.5, (4,)),
                 rng.uniform(0, 1, (3, 1))])


# --------------------------------------------------- reduce_mean's gradient in float16
@pytest.mark.parametrize("known", [True, False])
def test_float16_mean_gradient_over_more_elements_than_float16_holds(known):
    """d mean / d x_i = 1/n. With n = 90000 > 65504 (float16's largest value) the count
    became inf in float16 and the gradient 0."""
    x = dcf.placeholder(dcf.float16, (300, 300) if known else None)
    g, = dcf.gradients(dcf.reduce_mean(x), [x])
    got = run(g, {x: np.ones((300, 300), np.float16)})
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, np.full((300, 300), np.float16(1 / 90000)))


def test_float16_mean_gradient_along_an_axis():
    x = dcf.placeholder(dcf.float16, (4, 3))
    g, = dcf.gradients(dcf.reduce_mean(x * x, axis=0), [x])
    xv = np.arange(12, dtype=np.float16).reshape(4, 3)
    np.testing.assert_allclose(run(g, {x: xv}), (2 * xv.astype(np.float64) / 4), rtol=1e-3)


# ----------------------------------------------- grad_ys and gradient shapes checked
def test_grad_ys_of_another_dtype_is_a_clear_type_error():
    x = dcf.constant([1.0, 2.0])
    y = x * x
    with pytest.raises(TypeError, match=r"grad_ys\[0\].*float64.*dtype of ys\[0\].*float32"):
        dcf.gradients(y, [x], grad_ys=dcf.constant([1.0, 1.0], f64))


def test_grad_ys_of_another_shape_is_an_error_not_a_gradient_of_another_shape():
    """A [2, 3] grad_ys for a [3] y gave x (shape [3]) a [2, 3] gradient (TF1 raises)."""
    x = dcf.constant([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"grad_ys\[0\].*\[2,3\].*shape of ys\[0\]"):
        dcf.gradients(dcf.sin(x), [x], grad_ys=dcf.ones([2, 3]))


@pytest.mark.parametrize("gy", [2.0, [2.0]])
def test_grad_ys_that_broadcasts_to_y_is_accepted(gy):
    """A scalar (or [1]) grad_ys scales every entry, as in TF1."""
    x = dcf.constant([1.0, 2.0, 3.0])
    g, = dcf.gradients(x * x, [x], grad_ys=dcf.constant(gy))
    np.testing.assert_array_equal(run(g), [4.0, 8.0, 12.0])


def test_grad_ys_given_as_numbers_take_the_dtype_of_their_y():
    """A numpy array (float64 by default) or a list of numbers as a float32 y's grad_ys is
    that y's value, converted as an operand meeting a tensor is (it was a dtype error in
    the gradient graph's Mul, and [[1, 2]] for [y] counted as two grad_ys)."""
    x = dcf.constant([1.0, 2.0])
    y = x * x
    g1, = dcf.gradients(y, [x], grad_ys=np.array([1.0, 3.0]))
    g2, = dcf.gradients([y], [x], grad_ys=[[1.0, 3.0]])
    g3, = dcf.gradients([y, x], [x], grad_ys=[[1.0, 3.0], 2.0])
    assert g1.dtype is dcf.float32
    got = run([g1, g2, g3])
    np.testing.assert_array_equal(got[0], [2.0, 12.0])
    np.testing.assert_array_equal(got[1], [2.0, 12.0])
    np.testing.assert_array_equal(got[2], [4.0, 14.0])


def test_grad_ys_as_numbers_for_ys_of_a_graph_that_is_not_the_default():
    g = dcf.Graph()
    with g.as_default():
        x = dcf.constant([1.0, 2.0])
        y = dcf.sin(x)
    gx, = dcf.gradients(y, [x], grad_ys=[2.0, 3.0])
    assert gx.graph is g
    with dcf.Session(graph=g) as sess:
        np.testing.assert_allclose(sess.run(gx, options=OPTS), [2 * np.cos(1.0), 3 * np.cos(2.0)],
                                   rtol=1e-6)


register(OpDef("Review5WrongGradShape", infer=lambda x: x, kernel=lambda xp, x: x))


@dcf.RegisterGradient("Review5WrongGradShape")
def _review5_wrong_grad_shape(op, g):
    return [dcf.stack([g, g])]


def test_a_gradient_function_returning_another_shape_is_an_error_naming_the_op():
    x = dcf.constant([1.0, 2.0, 3.0])
    y = dcf.apply("Review5WrongGradShape", [x], name="odd")
    with pytest.raises(ValueError, match=r"Review5WrongGradShape 'odd'.*input 0.*\[3\].*\[2,3\]"):
        dcf.gradients(y, [x])


# --------------------------------------------- the ops over shapes that break things
BINARY = {
    "add": dcf.add, "subtract": dcf.subtract, "multiply": dcf.multiply, "divide": dcf.divide,
    "pow": dcf.pow, "maximum": dcf.maximum, "minimum": dcf.minimum,
    "where": lambda a, b: dcf.where(a > b, a * a, b),
}
BROADCASTS = [((), ()), ((), (3,)), ((1,), (4,)), ((4, 1), (1, 3)), ((2, 3, 4), (4,)),
              ((4,), (2, 3, 4)), ((2, 1, 4), (3, 1)), ((0,), (1,)), ((2, 0), (2, 1))]


@settings(max_examples=12, derandomize=True, deadline=None)
@given(op=st.sampled_from(sorted(BINARY)), shapes=st.sampled_from(BROADCASTS),
       swap=st.booleans())
def test_binary_op_gradients_against_finite_differences(op, shapes, swap):
    sa, sb = shapes[::-1] if swap else shapes
    rng = np.random.default_rng(7)
    with dcf.Graph().as_default():
        check_grads(BINARY[op], [rng.uniform(0.5, 2, sa), rng.uniform(0.5, 2, sb)])


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min",
                                "reduce_prod"])
@pytest.mark.parametrize("axis", [None, -1, [0, -1], []])
def test_reduction_gradients_with_unknown_shape_equal_known(op, axis):
    """Ties (rounded values) share reduce_max/min's gradient; keepdims on and off; the
    input's shape known statically or not gives the same first and second gradients."""
    xv = np.round(np.random.default_rng(3).uniform(0.5, 2, (2, 3, 4)) * 2) / 2
    for keepdims in (False, True):
        def f(x):
            return getattr(dcf, op)(x * x, axis=axis, keepdims=keepdims)
        with dcf.Graph().as_default():
            known = dcf.placeholder(f64, xv.shape)
            gs = dcf.gradients(f(known), [known])
            hs = dcf.gradients(dcf.reduce_sum(gs[0]), [known])
            want = run(gs + hs, {known: xv})
        with dcf.Graph().as_default():
            got = _grads_with_unknown_shapes(f, [xv], order=2)
        for w, gv in zip(want, got):
            np.testing.assert_allclose(gv, w, rtol=1e-14)


def test_reduce_max_splits_ties_equally():
    x = dcf.constant([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    g0, = dcf.gradients(dcf.reduce_max(x, axis=-1), [x])
    g1, = dcf.gradients(dcf.reduce_max(x), [x])
    got0, got1 = run([g0, g1])
    np.testing.assert_allclose(got0, [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_allclose(got1, [[0, 0.5, 0.5], [0, 0, 0]])


# ------------------------------------------------ second derivatives through an LSTM
# (needs /tmp/review5/patches/opgrads-1.patch: LSTMGatesGrad had no gradient)
def test_lstm_gates_second_derivatives_against_finite_differences():
    from dcf.ops.rnn_ops import lstm_gates

    rng = np.random.default_rng(4)
    z, c, b = rng.uniform(-1, 1, (3, 8)), rng.uniform(-1, 1, (3, 2)), rng.uniform(-1, 1, 8)

    def first(z, c, b):
        c_new, h_new = lstm_gates(z, c, forget_bias=1.0, b=b)
        gz, gc, gb = dcf.gradients(dcf.reduce_sum(h_new * h_new) + dcf.reduce_sum(c_new * h_new),
                                   [z, c, b])
        return dcf.concat([dcf.reshape(gz, [-1]), dcf.reshape(gc, [-1]), gb], 0)

    check_grads(first, [z, c, b], rtol=1e-6)


def _rnn(kind, cell, x, seq):
    if kind == "dynamic":
        return dcf.nn.dynamic_rnn(cell, x, sequence_length=seq, dtype=f64)[0]
    outs, _ = dcf.nn.static_rnn(cell, dcf.unstack(x, axis=1), dtype=f64)
    return dcf.stack(outs, axis=1)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("cell_type", ["LSTMCell", "GRUCell"])
def test_rnn_hessian_vector_product_wrt_weights(kind, cell_type):
    """H v for the cell's variables against central differences of the gradient. Through
    dynamic_rnn's hoisted LSTM the gradient of the tied recurrent weight (sum_t h_t^T dP_t,
    h_t recorded in a TensorArray) reaches h_t too."""
    rng = np.random.default_rng(5)
    x = dcf.constant(rng.uniform(-1, 1, (2, 3, 3)))
    seq = dcf.constant([3, 2]) if kind == "dynamic" else None
    cell = getattr(dcf.nn, cell_type)(2)
    out = _rnn(kind, cell, x, seq)
    vs = cell.variables
    gs = dcf.gradients(dcf.reduce_sum(out * out * out), vs)
    dirs = [rng.standard_normal(v.shape) for v in vs]
    hvs = dcf.gradients(dcf.add_n([dcf.reduce_sum(g * d) for g, d in zip(gs, dirs)]), vs)
    feeds = [dcf.placeholder(f64, v.shape) for v in vs]
    assign = [v.assign(p) for v, p in zip(vs, feeds)]
    eps = 1e-6
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer(), options=OPTS)
        w0 = sess.run([v.read_value() for v in vs], options=OPTS)
        got = sess.run(hvs, options=OPTS)
        sess.run(assign, dict(zip(feeds, [w + eps * d for w, d in zip(w0, dirs)])), options=OPTS)
        g_plus = sess.run(gs, options=OPTS)
        sess.run(assign, dict(zip(feeds, [w - eps * d for w, d in zip(w0, dirs)])), options=OPTS)
        g_minus = sess.run(gs, options=OPTS)
    for hv, gp, gm in zip(got, g_plus, g_minus):
        np.testing.assert_allclose(hv, (gp - gm) / (2 * eps), rtol=1e-6, atol=1e-8)


# ------------------------------------- cross-entropy along an axis of a rank unknown
@pytest.mark.parametrize("axis", [0, -2])
def test_softmax_cross_entropy_along_an_axis_of_unknown_rank(axis):
    """axis other than the last on logits of unknown rank was a ValueError at build time
    (TF1 moves the axis at run time); loss and gradients as with the static shape."""
    rng = np.random.default_rng(6)
    lg, lb = rng.standard_normal((2, 3, 4)), rng.uniform(0, 1, (2, 3, 4))
    x, labels = dcf.placeholder(f64, None), dcf.placeholder(f64, None)
    y = dcf.nn.softmax_cross_entropy_with_logits(labels=labels, logits=x, axis=axis)
    gx, gl = dcf.gradients(y, [x, labels])
    got_y, got_gx, got_gl = run([y, gx, gl], {x: lg, labels: lb})
    log_p = lg - np.log(np.exp(lg).sum(axis, keepdims=True))
    np.testing.assert_allclose(got_y, -(lb * log_p).sum(axis), rtol=1e-13)
    # d/d logits = softmax * sum(labels) - labels; d/d labels = -log_softmax
    want_gx = np.exp(log_p) * lb.sum(axis, keepdims=True) - lb
    np.testing.assert_allclose(got_gx, want_gx, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got_gl, -log_p, rtol=1e-13)


# ------------------------------- second derivatives against differences of the gradient
def _first_gradient(f):
    """x -> the gradient of sum(f(x)^2) w.r.t. every input, flattened and joined."""
    def first(*xs):
        y = f(*xs)
        gs = dcf.gradients(dcf.reduce_sum(y * y), list(xs))
        return dcf.concat([dcf.reshape(g, [-1]) for g in gs], 0)
    return first


SECOND_ORDER = {
    "tanh": (dcf.tanh, [(2, 3)]),
    "sigmoid": (dcf.sigmoid, [(3,)]),
    "softplus": (dcf.softplus, [(3,)]),
    "rsqrt": (dcf.rsqrt, [(3,)]),
    "log1p": (dcf.log1p, [()]),
    "softmax_axis0": (lambda x: dcf.nn.softmax(x, axis=0), [(3, 2)]),
    "log_softmax": (dcf.nn.log_softmax, [(2, 3)]),
    "pow_bcast": (dcf.pow, [(2, 1), (3,)]),
    "div_bcast": (dcf.divide, [(3,), (2, 1)]),
    "mul_rank_mismatch": (dcf.multiply, [(2, 1, 3), (3,)]),
    "matmul_transposed": (lambda a, b: dcf.matmul(a, b, transpose_a=True), [(3, 2), (3, 4)]),
    "batch_matmul_bcast": (dcf.matmul, [(2, 1, 2, 3), (4, 3, 2)]),
    "reduce_prod_axis-1": (lambda x: dcf.reduce_prod(x, axis=-1, keepdims=True), [(2, 3)]),
    "reduce_mean_axes": (lambda x: dcf.reduce_mean(x * x, axis=[0, 2]), [(2, 3, 2)]),
    "reduce_max": (lambda x: dcf.reduce_max(x * x, axis=0), [(3, 2)]),
    "xent": (lambda a, b: dcf.nn.softmax_cross_entropy_with_logits(labels=b, logits=a),
             [(2, 3), (2, 3)]),
    "gather_axis1": (lambda x: dcf.gather(x * x, np.array([2, 2, 0], np.int32), axis=1),
                     [(2, 3)]),
}


@pytest.mark.parametrize("case", sorted(SECOND_ORDER))
def test_second_derivatives_against_differences_of_the_gradient(case):
    f, shapes = SECOND_ORDER[case]
    rng = np.random.default_rng(8)
    check_grads(_first_gradient(f), [rng.uniform(0.5, 1.5, s) for s in shapes],
                rtol=1e-6, atol=1e-8)
