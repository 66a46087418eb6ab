"""A JAX / PyTorch user's first dcf programs (review 6c), checked against values computed
independently: PyTorch 2.13 (CPU, float64; the constants below were printed by it, so CI
needs no torch), TF1 where dcf follows TF1's conventions, or closed forms.

The programs: `fori_loop`/`while_loop`/`scan` equivalents (an RK4 integrator, a Newton
solver against its implicit gradient), per-example gradients (`vmap(grad)`) and a training
loop, `cond`/`switch` pieces, Hessians and a jvp by double vjp, and the gradient edge
cases a JAX user checks first.
"""

from __future__ import annotations

import numpy as np
import pytest

import dcf


@pytest.fixture(autouse=True)
def _fresh_graph():
    dcf.reset_default_graph()
    yield
    dcf.reset_default_graph()


def _rk4(y0, k, h: float, steps: int):
    def f(y):
        return dcf.stack([y[1], -k * dcf.sin(y[0]) - 0.1 * y[1]])

    def body(i, y):
        k1 = f(y)
        k2 = f(y + 0.5 * h * k1)
        k3 = f(y + 0.5 * h * k2)
        k4 = f(y + h * k3)
        return i + 1, y + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)

    return dcf.while_loop(lambda i, y: i < steps, body, (0, y0))[1]


def test_rk4_final_state_and_its_gradients_match_torch():
    y0 = dcf.placeholder(dcf.float64, (2,))
    k = dcf.placeholder(dcf.float64, ())
    y_end = _rk4(y0, k, 0.05, 40)
    loss = dcf.reduce_sum(y_end * dcf.constant([1.0, 2.0], dtype=dcf.float64))
    g_y0, g_k = dcf.gradients(loss, [y0, k])
    with dcf.Session() as sess:
        got = sess.run([y_end, g_y0, g_k], {y0: [1.0, 0.0], k: 2.0})
    # torch: the same 40 RK4 steps unrolled, loss.backward()
    np.testing.assert_allclose(got[0], [-0.7870568684883976, -0.5420878719360827], rtol=1e-12)
    np.testing.assert_allclose(got[1], [-2.241920174233542, -1.4257440243184336], rtol=1e-10)
    np.testing.assert_allclose(got[2], 0.8772677954888287, rtol=1e-10)


def test_newton_loop_gradient_matches_the_implicit_gradient():
    # x solves x^3 + a x = b; implicit function theorem: dx/da = -x / (3x^2 + a),
    # dx/db = 1 / (3x^2 + a). The loop stops on a residual, so its trip count is data's.
    a = dcf.placeholder(dcf.float64, ())
    b = dcf.placeholder(dcf.float64, ())
    steps, x = dcf.while_loop(
        lambda i, x: dcf.logical_and(i < 50, dcf.abs(x ** 3 + a * x - b) > 1e-12),
        lambda i, x: (i + 1, x - (x ** 3 + a * x - b) / (3 * x ** 2 + a)),
        (0, dcf.constant(1.0, dcf.float64)))
    g_a, g_b = dcf.gradients(x, [a, b])
    with dcf.Session() as sess:
        trips = set()
        for a_val, b_val in [(1.0, 10.0), (2.0, 0.5), (0.5, 100.0)]:
            n, x_val, ga, gb = sess.run([steps, x, g_a, g_b], {a: a_val, b: b_val})
            trips.add(int(n))
            slope = 3 * x_val ** 2 + a_val
            np.testing.assert_allclose(x_val ** 3 + a_val * x_val, b_val, rtol=1e-12)
            np.testing.assert_allclose(ga, -x_val / slope, rtol=1e-9)
            np.testing.assert_allclose(gb, 1.0 / slope, rtol=1e-9)
    assert len(trips) > 1


_X = np.array([[0.5, -1.0], [1.5, 0.25], [-0.75, 2.0]])
_Y = np.array([1.0, -0.5, 0.25])
_W1 = np.array([[0.3, -0.2], [0.1, 0.4]])
_W2 = np.array([0.7, -1.1])


def _per_example_losses(w1, w2, x, y):
    """An MLP's loss per example, with one copy of the weights per example (vmap(grad))."""
    batch = dcf.shape(x)[0]
    w1_copies = dcf.expand_dims(w1, 0) * dcf.ones(dcf.stack([batch, 1, 1]), dtype=dcf.float64)
    w2_copies = dcf.expand_dims(w2, 0) * dcf.ones(dcf.stack([batch, 1]), dtype=dcf.float64)

    def loss(e):
        xi, yi, a, b = e
        hidden = dcf.tanh(dcf.matmul(dcf.expand_dims(xi, 0), a))
        return dcf.square(dcf.reduce_sum(hidden[0] * b) - yi)

    return dcf.map_fn(loss, (x, y, w1_copies, w2_copies)), w1_copies, w2_copies


def test_per_example_gradients_match_torch_vmap_grad_and_sgd_steps():
    w1 = dcf.Variable(_W1, name="w1")
    w2 = dcf.Variable(_W2, name="w2")
    x = dcf.placeholder(dcf.float64, (None, 2))
    y = dcf.placeholder(dcf.float64, (None,))
    losses, w1_copies, w2_copies = _per_example_losses(w1.read_value(), w2.read_value(), x, y)
    per_w1, per_w2 = dcf.gradients(dcf.reduce_sum(losses), [w1_copies, w2_copies])
    step = dcf.train.GradientDescentOptimizer(0.1).minimize(dcf.reduce_mean(losses))
    feed = {x: _X, y: _Y}
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        got_w1, got_w2 = sess.run([per_w1, per_w2], feed)
        for _ in range(3):
            sess.run(step, feed)
        after_w1, after_w2 = sess.run([w1, w2])
    # torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    np.testing.assert_allclose(got_w1, [
        [[-0.31889228987531326, 0.39508797646466937], [0.6377845797506265, -0.7901759529293387]],
        [[1.734368624772801, -3.256037205365415], [0.2890614374621335, -0.5426728675609025]],
        [[1.134611317231834, -0.8076883855536492], [-3.0256301792848905, 2.153835694809731]]],
        rtol=1e-10)
    np.testing.assert_allclose(got_w2, [[-0.045632006118851626, 0.4220980559414486],
                                        [0.9080529068803246, -0.4052802590922255],
                                        [0.0540516252878668, -1.5997922580234063]], rtol=1e-10)
    # torch.optim.SGD(lr=0.1), three steps on the mean loss
    np.testing.assert_allclose(after_w1, [[0.11726160833614314, 0.06613945172227757],
                                          [0.2241183226846807, 0.35416520629710696]], rtol=1e-10)
    np.testing.assert_allclose(after_w2, [0.6549850574166025, -1.0181051728296673], rtol=1e-10)


def test_gradients_in_a_map_fn_body_say_map_fn_bodies_are_loop_bodies():
    w = dcf.Variable(np.float32([1.0, 2.0]), name="w")
    x = dcf.placeholder(dcf.float32, (None, 2))
    with pytest.raises(ValueError, match="map_fn") as info:
        dcf.map_fn(lambda r: dcf.gradients(dcf.reduce_sum(r * w.read_value()), [w])[0], x)
    assert "outside cond/while_loop bodies" in str(info.value)


def test_piecewise_case_in_map_fn_first_and_second_derivatives():
    x = dcf.placeholder(dcf.float64, (None,))

    def piece(v):
        return dcf.case([(v < -1.0, lambda: v * v), (v < 1.0, lambda: 2.0 * v + 3.0)],
                        default=lambda: dcf.exp(v))

    y = dcf.map_fn(piece, x)
    (g,) = dcf.gradients(dcf.reduce_sum(y * y), [x])
    (gg,) = dcf.gradients(dcf.reduce_sum(g), [x])
    xs = np.array([-2.0, -0.5, 0.5, 1.5, 3.0])
    with dcf.Session() as sess:
        got_y, got_g, got_gg = sess.run([y, g, gg], {x: xs})
    # closed forms of y^2 per piece: x^4, (2x+3)^2, exp(2x)
    pieces = [xs < -1.0, (xs >= -1.0) & (xs < 1.0), xs >= 1.0]
    np.testing.assert_allclose(got_y, np.select(pieces, [xs ** 2, 2 * xs + 3, np.exp(xs)]))
    np.testing.assert_allclose(got_g, np.select(pieces, [4 * xs ** 3, 4 * (2 * xs + 3),
                                                         2 * np.exp(2 * xs)]))
    np.testing.assert_allclose(got_gg, np.select(pieces, [12 * xs ** 2, np.full_like(xs, 8.0),
                                                          4 * np.exp(2 * xs)]))


def test_switch_by_index_inside_scan_matches_the_unrolled_recurrence():
    x = dcf.placeholder(dcf.float64, (None,))
    idx = dcf.placeholder(dcf.int32, (None,))

    def step(acc, e):
        v, k = e
        return dcf.case([(dcf.equal(k, 0), lambda: acc * v),
                         (dcf.equal(k, 1), lambda: acc + dcf.sin(v))],
                        default=lambda: acc - v * v, exclusive=True)

    z = dcf.scan(step, (x, idx), initializer=dcf.constant(1.0, dcf.float64))
    (g,) = dcf.gradients(dcf.reduce_sum(z), [x])
    xs = [-2.0, -0.5, 0.5, 1.5, 3.0]
    with dcf.Session() as sess:
        got_z, got_g = sess.run([z, g], {x: xs, idx: [0, 1, 2, 0, 1]})
    # torch: the same recurrence in a Python loop, autograd.grad
    np.testing.assert_allclose(got_z, [-2.0, -2.479425538604203, -2.729425538604203,
                                       -4.094138307906304, -3.9530182998464367], rtol=1e-12)
    np.testing.assert_allclose(got_g, [6.0, 4.387912809451864, -4.0, -5.458851077208406,
                                       -0.9899924966004454], rtol=1e-12)


def test_where_sqrt_gradient_is_nan_as_in_jax_and_the_double_where_is_not():
    x = dcf.placeholder(dcf.float32, (3,))
    naive = dcf.where(x > 0.0, dcf.sqrt(x), dcf.zeros_like(x))
    safe = dcf.where(x > 0.0, dcf.sqrt(dcf.where(x > 0.0, x, dcf.ones_like(x))), dcf.zeros_like(x))
    s = dcf.placeholder(dcf.float32, ())
    by_cond = dcf.cond(s > 0.0, lambda: dcf.sqrt(s), lambda: dcf.zeros_like(s))
    (g_naive,) = dcf.gradients(dcf.reduce_sum(naive), [x])
    (g_safe,) = dcf.gradients(dcf.reduce_sum(safe), [x])
    (g_cond,) = dcf.gradients(by_cond, [s])
    with np.errstate(all="ignore"), dcf.Session() as sess:
        got_naive, got_safe = sess.run([g_naive, g_safe], {x: [-1.0, 0.0, 4.0]})
        got_cond = [sess.run(g_cond, {s: v}) for v in (-1.0, 0.0, 4.0)]
    # torch.where(t > 0, t.sqrt(), 0).sum().backward() -> [nan, nan, 0.25] (TF1 and JAX too)
    assert np.isnan(got_naive[:2]).all() and got_naive[2] == 0.25
    np.testing.assert_array_equal(got_safe, [0.0, 0.0, 0.25])
    np.testing.assert_array_equal(got_cond, [0.0, 0.0, 0.25])


def _hessian(y, x):
    (g,) = dcf.gradients(y, [x])
    return g, dcf.stack([dcf.gradients(g[i], [x])[0] for i in range(x.shape[0])])


def test_hessian_through_scan_with_cond_matches_torch_hessian():
    x = dcf.placeholder(dcf.float64, (3,))

    def step(acc, e):
        return dcf.cond(acc > 0.0, lambda: dcf.sin(acc) * e + e * e, lambda: acc * acc * e)

    y = dcf.reduce_sum(dcf.scan(step, x, initializer=dcf.constant(0.5, dcf.float64)))
    g, h = _hessian(y, x)
    with dcf.Session() as sess:
        got_g, got_h = sess.run([g, h], {x: [0.3, -1.2, 2.0]})
    # torch.autograd.functional.jacobian / hessian of the unrolled recurrence
    np.testing.assert_allclose(got_g, [-1.1824967049310215, -3.892287972597695, 4.91758276001819],
                               rtol=1e-12)
    np.testing.assert_allclose(got_h, [
        [-4.523218785183742, -3.129079488805693, -0.5009306736435989],
        [-3.1290794888056936, -5.037875550913552, -0.8619953412195521],
        [-0.5009306736435988, -0.8619953412195521, 2.0]], rtol=1e-10)


def test_jvp_by_differentiating_a_vjp_matches_torch_jvp():
    x = dcf.placeholder(dcf.float64, (3,))
    z = dcf.stack([dcf.sin(x[0]) * x[1], x[1] * x[2] ** 2])
    u = dcf.zeros_like(z)                       # the vjp is linear in u; its value is unused
    (vjp,) = dcf.gradients(z, [x], grad_ys=[u])
    (jvp,) = dcf.gradients(vjp, [u], grad_ys=[dcf.constant([1.0, -2.0, 0.5], dtype=dcf.float64)])
    with dcf.Session() as sess:
        got = sess.run(jvp, {x: [0.3, -1.2, 2.0]})
    # torch.func.jvp(f, (x,), (v,))
    np.testing.assert_allclose(got, [-1.7374442002734063, -10.4], rtol=1e-12)


def _value_and_grad(build, value):
    x = dcf.placeholder(dcf.float32, np.shape(value))
    y = build(x)
    (g,) = dcf.gradients(y, [x])
    with np.errstate(all="ignore"), dcf.Session() as sess:
        return sess.run([y, g], {x: np.asarray(value, np.float32)})


@pytest.mark.parametrize("build,value,expected", [
    # the same as torch and JAX
    (lambda x: dcf.reduce_sum(dcf.abs(x)), [0.0, -1.0, 2.0], [0.0, -1.0, 1.0]),
    (lambda x: dcf.reduce_sum(dcf.relu(x)), [0.0, -1.0, 2.0], [0.0, 0.0, 1.0]),
    (lambda x: dcf.reduce_max(x), [1.0, 3.0, 3.0], [0.0, 0.5, 0.5]),
    (lambda x: dcf.reduce_min(x), [1.0, 1.0, 3.0], [0.5, 0.5, 0.0]),
    (lambda x: dcf.nn.log_softmax(x)[1], [1000.0, 0.0, -1000.0], [-1.0, 1.0, 0.0]),
    (lambda x: dcf.reduce_sum(dcf.nn.softmax_cross_entropy_with_logits(
        labels=dcf.constant([[0.0, 1.0, 0.0]]), logits=x)), [[1000.0, 0.0, -1000.0]],
     [[1.0, -1.0, 0.0]]),
    (lambda x: dcf.reduce_prod(x), [2.0, 0.0, 3.0], [0.0, 6.0, 0.0]),
    (lambda x: dcf.reduce_prod(x), [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]),
    (lambda x: dcf.reduce_sum(dcf.reduce_prod(x, axis=1)), [[2.0, 0.0], [0.0, 0.0]],
     [[0.0, 2.0], [0.0, 0.0]]),
    (lambda x: -dcf.softplus(-x), -100.0, 1.0),     # log(sigmoid(x)), stable: torch's logsigmoid
    # TF1's conventions (torch/JAX give [0.5, 0.5], and 0 for x^x at 0)
    (lambda x: dcf.maximum(x[0], x[1]), [1.0, 1.0], [1.0, 0.0]),
    (lambda x: dcf.minimum(x[0], x[1]), [1.0, 1.0], [1.0, 0.0]),
    (lambda x: dcf.pow(x[0], x[1]), [-2.0, 3.0], [12.0, 0.0]),
])
def test_gradient_edge_cases(build, value, expected):
    _, got = _value_and_grad(build, value)
    np.testing.assert_allclose(got, expected, atol=1e-7)


def test_nan_gradients_where_torch_and_tf1_give_nan_too():
    # sqrt(sum(x^2)) at 0, log(sigmoid(-100)) in float32, x^x at 0: NaN in TF1 and torch
    _, g_norm = _value_and_grad(lambda x: dcf.sqrt(dcf.reduce_sum(x * x)), [0.0, 0.0])
    _, g_log_sigmoid = _value_and_grad(lambda x: dcf.log(dcf.sigmoid(x)), -100.0)
    _, g_pow = _value_and_grad(lambda x: dcf.reduce_sum(dcf.pow(x, x)), [0.0, 2.0])
    assert np.isnan(g_norm).all() and np.isnan(g_log_sigmoid)
    assert np.isnan(g_pow[0]) and abs(g_pow[1] - 4.0 * (np.log(2.0) + 1.0)) < 1e-5


def test_floordiv_carries_no_gradient_as_in_tf1():
    x = dcf.placeholder(dcf.float32, (2,))
    assert dcf.gradients(dcf.reduce_sum(x // 3.0), [x]) == [None]
    (g,) = dcf.gradients(dcf.reduce_sum(x + dcf.stop_gradient(x // 1.0 - x)), [x])  # straight-through
    with dcf.Session() as sess:
        np.testing.assert_array_equal(sess.run(g, {x: [0.3, 1.7]}), [1.0, 1.0])
