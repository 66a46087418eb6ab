"""Second order through loops and TensorArrays: Hessian-vector products against central
finite differences of the first derivative (float64), and the one refused case."""

from __future__ import annotations

import numpy as np
import pytest

import dcf

T, B, D = 4, 2, 3


def _hvp_and_fd(loss_of):
    rng = np.random.default_rng(0)
    g = dcf.Graph()
    with g.as_default():
        W = dcf.Variable(rng.standard_normal((D, D)) * 0.5)
        loss = loss_of(W, rng)
        gw = dcf.gradients(loss, W)[0]
        v = dcf.constant(rng.standard_normal((D, D)))
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


def test_second_order_through_a_loop_reading_a_tensor_array():
    def loss_of(W, rng):
        ta = dcf.TensorArray(dcf.float64, size=T).unstack(
            dcf.constant(rng.standard_normal((T, B, D))))
        _, h = dcf.while_loop(lambda t, h: t < T,
                              lambda t, h: (t + 1, dcf.tanh(dcf.matmul(h, W) + ta.read(t))),
                              (0, dcf.zeros((B, D), dcf.float64)))
        return dcf.reduce_sum(h * h)
    got, fd = _hvp_and_fd(loss_of)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)


def test_second_order_through_a_loop_writing_a_tensor_array_is_refused():
    def loss_of(W, rng):
        x = dcf.constant(rng.standard_normal((B, D)))

        def body(t, h, ta):
            h2 = dcf.tanh(dcf.matmul(h, W) + x)
            return t + 1, h2, ta.write(t, h2)
        _, _, ta = dcf.while_loop(lambda t, h, ta: t < T, body,
                                  (0, x, dcf.TensorArray(dcf.float64, size=T)))
        o = ta.stack()
        return dcf.reduce_sum(o * o)
    with pytest.raises(NotImplementedError, match="writes a TensorArray"):
        _hvp_and_fd(loss_of)
