"""Gradients through while_loop: against the same computation unrolled in Python,
against finite differences, with data-dependent trip counts, nesting three deep,
loop constants, Variables read inside loops, and second order (not yet)."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.autodiff import loop_state
from tests.autodiff.gradcheck import OPTS, check_grads, run

F64 = dcf.float64


def _chain_loop(x0, w, n):
    _, x = dcf.while_loop(lambda i, x: i < n, lambda i, x: (i + 1, dcf.tanh(x @ w)), (0, x0))
    return x


def _chain_unrolled(x0, w, n):
    x = x0
    for _ in range(n):
        x = dcf.tanh(x @ w)
    return x


@pytest.mark.parametrize("n", [0, 1, 3])
def test_while_loop_grad_matches_unrolled_static_graph(compiled, rng, n):
    x0_np = rng.uniform(-1, 1, (4, 4))
    w_np = rng.standard_normal((4, 4)) / 2
    x0 = dcf.placeholder(F64, (4, 4))
    w = dcf.placeholder(F64, (4, 4))
    loss_loop = dcf.reduce_sum(dcf.square(_chain_loop(x0, w, n)))
    loss_unr = dcf.reduce_sum(dcf.square(_chain_unrolled(x0, w, n)))
    g_loop = dcf.gradients(loss_loop, [x0, w])
    g_unr = dcf.gradients(loss_unr, [x0, w])
    feed = {x0: x0_np, w: w_np}
    if n == 0:
        # no path from w to the unrolled loss; the loop's w still gets (zero) gradient
        assert g_unr[1] is None
        gl = run(g_loop, feed, compiled)
        np.testing.assert_allclose(gl[0], 2 * x0_np)
        np.testing.assert_array_equal(gl[1], np.zeros_like(w_np))
        return
    gl, gu = run([g_loop, g_unr], feed, compiled)
    for a, b in zip(gl, gu):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_while_loop_grad_finite_differences(compiled, rng):
    check_grads(lambda x0, w: _chain_loop(x0, w, 3) * 1.5,
                [rng.uniform(-1, 1, (3, 4)), rng.standard_normal((4, 4)) / 2], config=compiled)


def test_while_grad_data_dependent_trip_count(compiled, rng):
    """Loop while the norm is below a threshold: the trip count depends on the data."""
    def f(x, w):
        def body(i, v):
            return i + 1, v @ w + 0.5 * v
        i, v = dcf.while_loop(lambda i, v: dcf.sqrt(dcf.reduce_sum(v * v)) < 10.0, body, (0, x))
        return v, i
    x_np = rng.uniform(0.1, 0.3, (1, 3))
    w_np = np.eye(3) * 0.7 + rng.uniform(0, 0.1, (3, 3))
    x = dcf.placeholder(F64, (1, 3))
    w = dcf.placeholder(F64, (3, 3))
    v, trips = f(x, w)
    trips_v = run(trips, {x: x_np, w: w_np}, compiled)
    assert trips_v > 3  # a real loop
    # same trip count unrolled in Python
    u = x
    for _ in range(int(trips_v)):
        u = u @ w + 0.5 * u
    gl = dcf.gradients(dcf.reduce_sum(v), [x, w])
    gu = dcf.gradients(dcf.reduce_sum(u), [x, w])
    a, b = run([gl, gu], {x: x_np, w: w_np}, compiled)
    for p, q in zip(a, b):
        np.testing.assert_allclose(p, q, rtol=1e-12)
    check_grads(lambda x, w: f(x, w)[0], [x_np, w_np], config=compiled)


def test_nested_while_grad_data_dependent_trip_count(compiled):
    """Inner trip count depends on the outer loop variable."""
    def f(x):
        def outer(i, a):
            n_in = dcf.cast(dcf.abs(a) * 2.0, dcf.int32) % 3 + 1
            _, b = dcf.while_loop(lambda j, b: j < n_in,
                                  lambda j, b: (j + 1, dcf.sin(b) * 1.3 + 0.1), (0, a))
            return i + 1, b
        return dcf.while_loop(lambda i, a: i < 3, outer, (0, x))[1]
    for x in (0.3, 1.1):
        check_grads(f, [np.array(x)], config=compiled)


def test_while_in_while_in_while_grad(compiled, rng):
    def f(x, w):
        def l1(i, a):
            def l2(j, b):
                def l3(k, c):
                    return k + 1, dcf.tanh(c @ w) + 0.1 * c
                return j + 1, dcf.while_loop(lambda k, c: k < 2, l3, (0, b))[1] * 0.9
            return i + 1, dcf.while_loop(lambda j, b: j < 2, l2, (0, a))[1] + a
        return dcf.while_loop(lambda i, a: i < 2, l1, (0, x))[1]
    check_grads(f, [rng.uniform(-1, 1, (2, 3)), rng.standard_normal((3, 3)) / 2], config=compiled)


def test_cond_in_while_grad(compiled):
    def f(x, w):
        def body(i, a):
            a = dcf.cond(a > 0.0, lambda: dcf.sin(a) * w, lambda: a * a - w)
            return i + 1, a
        return dcf.while_loop(lambda i, a: i < 4, body, (0, x))[1]
    for x in (0.7, -0.4):   # both branches taken across iterations
        check_grads(f, [np.array(x), np.array(1.3)], config=compiled)


def test_while_in_cond_grad(compiled):
    def f(x, w):
        def loop():
            return dcf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, dcf.tanh(a * w)),
                                  (0, x))[1]
        return dcf.cond(x > 0.0, loop, lambda: x * w)
    for x in (0.5, -0.5):
        check_grads(f, [np.array(x), np.array(1.7)], config=compiled)


def test_cond_in_cond_in_while_grad(compiled):
    def f(x, w):
        def body(i, a):
            def inner():
                return dcf.cond(a > 0.5, lambda: a * w, lambda: dcf.exp(-a) + w)
            a = dcf.cond(a > 0.0, inner, lambda: -a * a * w)
            return i + 1, a
        return dcf.while_loop(lambda i, a: i < 4, body, (0, x))[1]
    for x in (0.9, 0.2, -0.3):
        check_grads(f, [np.array(x), np.array(0.8)], config=compiled)


def test_grad_wrt_loop_constant_weight_matrix(compiled, rng):
    """W is captured by the body (a loop constant); its gradient sums over iterations."""
    x_np, w_np = rng.uniform(-1, 1, (2, 3)), rng.standard_normal((3, 3)) / 2
    x = dcf.placeholder(F64, (2, 3))
    w = dcf.placeholder(F64, (3, 3))
    y = dcf.reduce_sum(_chain_loop(x, w, 4))
    (gw,) = dcf.gradients(y, [w])
    gw_v = run(gw, {x: x_np, w: w_np}, compiled)
    # numpy reference: the paper's unrolled MatMulGrad accumulation
    xs = [x_np]
    for _ in range(4):
        xs.append(np.tanh(xs[-1] @ w_np))
    g, acc = np.ones_like(xs[-1]), np.zeros_like(w_np)
    for k in range(4, 0, -1):
        gz = g * (1 - xs[k] ** 2)
        acc += xs[k - 1].T @ gz
        g = gz @ w_np.T
    np.testing.assert_allclose(gw_v, acc, rtol=1e-12)
    check_grads(lambda w: _chain_loop(dcf.constant(x_np), w, 4), [w_np], config=compiled)


def test_grad_wrt_variable_read_inside_loop(compiled, rng):
    w_np = rng.standard_normal((3, 3)) / 2
    x_np = rng.uniform(-1, 1, (2, 3))
    v = dcf.Variable(w_np, name="W")
    x = dcf.placeholder(F64, (2, 3))

    def body(i, a):
        return i + 1, dcf.tanh(a @ v.read_value())
    _, out = dcf.while_loop(lambda i, a: i < 3, body, (0, x))
    y = dcf.reduce_sum(out * out)
    (gv,) = dcf.gradients(y, [v])
    # reference: the same with W as a fed placeholder
    wp = dcf.placeholder(F64, (3, 3))
    (gref,) = dcf.gradients(dcf.reduce_sum(dcf.square(_chain_loop(x, wp, 3))), [wp])
    with dcf.Session(config=compiled) as sess:
        sess.run(dcf.global_variables_initializer())
        a, b = sess.run([gv, gref], {x: x_np, wp: w_np})
    np.testing.assert_allclose(a, b, rtol=1e-12)
    assert np.abs(a).sum() > 0


def test_grad_wrt_variable_read_inside_nested_loop(compiled, rng):
    w_np = rng.standard_normal((3, 3)) / 2
    x_np = rng.uniform(-1, 1, (2, 3))
    v = dcf.Variable(w_np, name="W")
    x = dcf.placeholder(F64, (2, 3))

    def outer(i, a):
        inner = dcf.while_loop(lambda j, b: j < 2,
                               lambda j, b: (j + 1, dcf.tanh(b @ v.read_value())), (0, a))[1]
        return i + 1, inner + a
    out = dcf.while_loop(lambda i, a: i < 2, outer, (0, x))[1]
    (gv,) = dcf.gradients(dcf.reduce_sum(out), [v])

    wp = dcf.placeholder(F64, (3, 3))
    u = x
    for _ in range(2):
        u = _chain_unrolled(u, wp, 2) + u
    (gref,) = dcf.gradients(dcf.reduce_sum(u), [wp])
    with dcf.Session(config=compiled) as sess:
        sess.run(dcf.global_variables_initializer())
        a, b = sess.run([gv, gref], {x: x_np, wp: w_np})
    np.testing.assert_allclose(a, b, rtol=1e-12)


# Second order through while_loop is not implemented at the base commit. A change that
# implements it (the gradient of a stack pop flowing back to the pushed value, as
# dcf.autodiff.loop_state.push_pop_grad) turns this into an ordinary test; until then
# the xfail is strict, so an accidental "pass" is noticed.
_SECOND_ORDER = hasattr(loop_state, "push_pop_grad")


@pytest.mark.xfail(not _SECOND_ORDER, strict=True,
                   reason="second-order derivatives through while_loop are not implemented "
                   "yet: a forward value saved on a stack reaches the gradient loop through "
                   "StackPopV2, which is not differentiable, so the Hessian-vector product "
                   "misses every term that flows through saved values")
def test_while_loop_hessian_vector_product_matches_finite_differences(compiled, rng):
    x_np, w_np = rng.uniform(-1, 1, (2, 3)), rng.standard_normal((3, 3)) / 2
    v_np = rng.standard_normal((3, 3))
    x = dcf.constant(x_np)
    w = dcf.placeholder(F64, (3, 3))
    vv = dcf.placeholder(F64, (3, 3))
    (gw,) = dcf.gradients(dcf.reduce_sum(_chain_loop(x, w, 3)), [w])
    (hv,) = dcf.gradients(dcf.reduce_sum(gw * vv), [w])
    eps = 1e-6
    with dcf.Session(config=compiled) as sess:
        hv_v = sess.run(hv, {w: w_np, vv: v_np}, options=OPTS)
        gp = sess.run(gw, {w: w_np + eps * v_np}, options=OPTS)
        gm = sess.run(gw, {w: w_np - eps * v_np}, options=OPTS)
    np.testing.assert_allclose(hv_v, (gp - gm) / (2 * eps), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("pi", [1, 32])
@pytest.mark.parametrize("swap", [False, True], ids=["noswap", "swap"])
def test_while_grad_same_for_parallel_iterations_and_swap_memory(compiled, rng, pi, swap):
    x_np, w_np = rng.uniform(-1, 1, (2, 3)), rng.standard_normal((3, 3)) / 2
    x = dcf.placeholder(F64, (2, 3))
    w = dcf.placeholder(F64, (3, 3))
    _, out = dcf.while_loop(lambda i, a: i < 5, lambda i, a: (i + 1, dcf.tanh(a @ w)), (0, x),
                            parallel_iterations=pi, swap_memory=swap)
    g_loop = dcf.gradients(dcf.reduce_sum(out), [x, w])
    g_unr = dcf.gradients(dcf.reduce_sum(_chain_unrolled(x, w, 5)), [x, w])
    a, b = run([g_loop, g_unr], {x: x_np, w: w_np}, compiled)
    for p, q in zip(a, b):
        np.testing.assert_allclose(p, q, rtol=1e-12)


def test_while_grad_maximum_iterations_and_mixed_loop_vars(compiled, rng):
    """Int and float loop vars side by side; maximum_iterations cuts the loop short."""
    def f(x, w):
        def body(i, k, a, b):
            return i + 1, k * 2, a * w + b, dcf.sin(b) + dcf.cast(k, F64) * 0.01
        out = dcf.while_loop(lambda i, k, a, b: i < 100, body, (0, 1, x, x * 0.5),
                             maximum_iterations=3)
        return out[2] + out[3] * 2.0
    check_grads(f, [rng.standard_normal(3), rng.standard_normal(3)], config=compiled)


def test_case_in_while_grad(compiled):
    def f(x):
        def body(i, a):
            a = dcf.case([(a > 1.0, lambda: a * 0.5), (a > 0.0, lambda: a * a + 0.3)],
                         default=lambda: -a)
            return i + 1, a
        return dcf.while_loop(lambda i, a: i < 4, body, (0, x))[1]
    for x in (0.6, 1.4, -0.2):
        check_grads(f, [np.array(x)], config=compiled)


def test_check_grads_catches_a_wrong_gradient(compiled):
    """The checker itself: a deliberately wrong registered gradient is caught, and the
    message shows both numbers."""
    from dcf.ops.registry import GRADIENTS

    old = GRADIENTS["Tanh"]
    try:
        dcf.RegisterGradient("Tanh")(lambda op, g: [g * 1.01 * (1.0 - op.outputs[0] ** 2)])
        with pytest.raises(AssertionError, match=r"<ct, J v> = .* \(finite differences\) "
                           r"but <J\^T ct, v> = .* \(dcf.gradients\)"):
            check_grads(lambda x, w: _chain_loop(x, w, 2), [np.ones((1, 2)), np.eye(2)],
                        config=compiled)
    finally:
        GRADIENTS["Tanh"] = old
