"""Review 8 (training loops): optimizers, variables and queues used as a TF1 user would."""

from __future__ import annotations

import numpy as np
import pytest

import dcf


def _adam_numpy(w, x, y, lr, betas, eps, steps):
    """Adam on loss = mean((x @ w - y)^2) in float64; `betas(t)` gives step t's (b1, b2)."""
    m, v, p1, p2, out = np.zeros_like(w), np.zeros_like(w), 1.0, 1.0, []
    for t in range(steps):
        b1, b2 = betas(t)
        g = 2.0 * x.T @ (x @ w - y) / y.size
        p1, p2 = p1 * b1, p2 * b2
        m = b1 * m + (1.0 - b1) * g
        v = b2 * v + (1.0 - b2) * g * g
        w = w - lr * np.sqrt(1.0 - p2) / (1.0 - p1) * m / (np.sqrt(v) + eps)
        out.append(w)
    return out


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_adam_takes_beta1_beta2_and_epsilon_as_tensors(dtype, rtol):
    # TF1's AdamOptimizer takes its hyperparameters as tensors (a placeholder, a
    # Variable); they were passed to float() as the fused update op was built
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((8, 3)), rng.standard_normal((8, 1))
    w0 = rng.standard_normal((3, 1))
    g = dcf.Graph()
    with g.as_default():
        w = dcf.Variable(w0.astype(dtype), name="w")
        b1 = dcf.placeholder(dcf.float32, [], name="beta1")
        b2 = dcf.constant(0.9921875, dtype=dcf.float64)
        eps = dcf.Variable(np.float32(2.0 ** -20), name="eps", trainable=False)
        loss = dcf.reduce_mean(dcf.square(dcf.matmul(x.astype(dtype), w) - y.astype(dtype)))
        train = dcf.train.AdamOptimizer(0.125, beta1=b1, beta2=b2, epsilon=eps).minimize(loss)
        with dcf.Session() as sess:
            sess.run(dcf.global_variables_initializer())
            got = []
            for t in range(40):
                sess.run(train, {b1: 0.75 if t < 20 else 0.875})   # read at every step
                got.append(sess.run(w))
    want = _adam_numpy(w0, x, y, 0.125, lambda t: (0.75 if t < 20 else 0.875, 0.9921875),
                       2.0 ** -20, 40)
    for t, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=rtol, err_msg=f"step {t}")
