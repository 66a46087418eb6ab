"""A loop's gradient differentiates only the loop constants a gradient is wanted for: data
read from a TensorArray of a placeholder gets no gradient TensorArray (written every
iteration, read by nothing) when only the weights are differentiated, and gets one, with
the right values, when the data is among the xs."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from tests.autodiff.gradcheck import OPTS, check_grads

T, B, D, U = 5, 3, 4, 2


def _rnn(x, w, u):
    """h(t+1) = tanh(x[t] @ w + h(t) @ u), x read from a TensorArray inside the loop."""
    ta = dcf.TensorArray(x.dtype, size=T, element_shape=(B, D)).unstack(x)

    def body(t, h):
        return t + 1, dcf.tanh(dcf.matmul(ta.read(t), w) + dcf.matmul(h, u))

    _, h = dcf.while_loop(lambda t, h: t < T, body, (0, dcf.zeros([B, U], dtype=x.dtype)))
    return dcf.reduce_sum(h * h)


def _op_types(g):
    return {op.type for op in g.get_operations()}


def _reference(xv, wv, uv):
    """float64 numpy forward and reverse mode of _rnn: (dx, dw, du)."""
    hs = [np.zeros((B, U))]
    for t in range(T):
        hs.append(np.tanh(xv[t] @ wv + hs[-1] @ uv))
    dh = 2 * hs[-1]
    dx, dw, du = np.zeros_like(xv), np.zeros_like(wv), np.zeros_like(uv)
    for t in reversed(range(T)):
        dz = dh * (1 - hs[t + 1] ** 2)
        dx[t] = dz @ wv.T
        dw += xv[t].T @ dz
        du += hs[t].T @ dz
        dh = dz @ uv.T
    return dx, dw, du


@pytest.mark.parametrize("with_x", [False, True])
def test_data_read_in_a_loop_gets_a_gradient_only_when_asked(with_x):
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((T, B, D))
    wv, uv = rng.standard_normal((D, U)) * 0.5, rng.standard_normal((U, U)) * 0.5
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float64, [T, B, D])
        w, u = dcf.Variable(wv, name="w"), dcf.Variable(uv, name="u")
        loss = _rnn(x, w, u)
        before = _op_types(g)
        xs = ([x] if with_x else []) + [w, u]
        grads = dcf.gradients(loss, xs)
        added = _op_types(g) - before
        init = dcf.global_variables_initializer()
    # the gradient of the data's TensorArray: a gradient TensorArray written each iteration
    assert ("TensorArrayGradV3" in added) == with_x
    with dcf.Session(g) as s:
        s.run(init, options=OPTS)
        got = s.run(grads, {x: xv}, options=OPTS)
    want = _reference(xv, wv, uv)
    for a, b in zip(got, want if with_x else want[1:]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_the_data_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    wv, uv = rng.standard_normal((D, U)) * 0.5, rng.standard_normal((U, U)) * 0.5

    def build(x):
        return _rnn(x, dcf.constant(wv), dcf.constant(uv))

    assert check_grads(build, [rng.standard_normal((T, B, D))]) != 0.0
