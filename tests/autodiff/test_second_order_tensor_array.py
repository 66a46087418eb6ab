"""Second order through loops and TensorArrays: Hessian-vector products against central
finite differences of the first derivative (float64), and the one refused case."""

from __future__ import annotations

import numpy as np
import pytest

import dcf

T, B, D = 4, 2, 3


def _hvp_and_fd(build, seed: int = 0):
    """(d/dW <d loss/dW, v>, the same by central differences of d loss/dW) for the
    (loss, W) that `build(rng)` makes in a fresh graph."""
    rng = np.random.default_rng(seed)
    g = dcf.Graph()
    with g.as_default():
        loss, W = build(rng)
        gw = dcf.gradients(loss, W)[0]
        v = dcf.constant(rng.standard_normal(tuple(W.shape)))
        hv = dcf.gradients(dcf.reduce_sum(gw * v), W)[0]
        with dcf.Session() as s:
            s.run(dcf.global_variables_initializer())
            w0, vv, got = s.run([W, v, hv])

            def grad_at(w):
                s.run(W.assign(w))
                return s.run(gw)
            eps = 1e-5
            fd = (grad_at(w0 + eps * vv) - grad_at(w0 - eps * vv)) / (2 * eps)
    return got, fd


def _weights(rng):
    return dcf.Variable(rng.standard_normal((D, D)) * 0.5)


def test_second_order_through_a_loop_reading_a_tensor_array():
    def build(rng):
        W = _weights(rng)
        ta = dcf.TensorArray(dcf.float64, size=T).unstack(
            dcf.constant(rng.standard_normal((T, B, D))))
        _, h = dcf.while_loop(lambda t, h: t < T,
                              lambda t, h: (t + 1, dcf.tanh(dcf.matmul(h, W) + ta.read(t))),
                              (0, dcf.zeros((B, D), dcf.float64)))
        return dcf.reduce_sum(h * h), W
    got, fd = _hvp_and_fd(build)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)


def test_second_order_through_a_loop_writing_a_tensor_array():
    def build(rng):
        W = _weights(rng)
        x = dcf.constant(rng.standard_normal((B, D)))

        def body(t, h, ta):
            h2 = dcf.tanh(dcf.matmul(h, W) + x)
            return t + 1, h2, ta.write(t, h2)
        _, _, ta = dcf.while_loop(lambda t, h, ta: t < T, body,
                                  (0, x, dcf.TensorArray(dcf.float64, size=T)))
        o = ta.stack()
        return dcf.reduce_sum(o * o), W
    got, fd = _hvp_and_fd(build)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)


def test_second_order_through_tensor_array_writes_outside_loops():
    def build(rng):
        W = _weights(rng)
        x = dcf.constant(rng.standard_normal((B, D)))
        h1 = dcf.tanh(dcf.matmul(x, W))
        h2 = dcf.tanh(dcf.matmul(h1, W))
        o = dcf.TensorArray(dcf.float64, size=2).write(0, h1).write(1, h2).stack()
        return dcf.reduce_sum(o * o), W
    got, fd = _hvp_and_fd(build)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("cell", ["gru", "tanh"])
def test_second_order_through_dynamic_rnn_equals_finite_differences(cell):
    """Hessian-vector product of a dynamic_rnn loss with respect to its input weights
    (GRUCell: the hoisted CPU path)."""
    def build(rng):
        xv = rng.standard_normal((2, T, D))
        if cell == "tanh":
            W = dcf.Variable(rng.standard_normal((D + 2, 2)) * 0.5)

            def step(x, h):
                y = dcf.tanh(dcf.matmul(dcf.concat([x, h], 1), W))
                return y, y
            out, _ = dcf.nn.dynamic_rnn(step, dcf.constant(xv), dtype=dcf.float64,
                                        initial_state=dcf.zeros((2, 2), dcf.float64))
        else:
            c = dcf.nn.GRUCell(2)
            out, _ = dcf.nn.dynamic_rnn(c, dcf.constant(xv), dtype=dcf.float64)
            W = c.variables[0]
        return dcf.reduce_sum(out * out), W
    got, fd = _hvp_and_fd(build, seed=3)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)
