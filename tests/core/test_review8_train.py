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


@pytest.mark.parametrize("beta1", [0.75, "tensor"])
@pytest.mark.parametrize("how", ["validate_shape=False", "fed initial value"])
def test_adam_moments_of_a_variable_without_a_static_shape_have_its_shape(tmp_path, how,
                                                                          beta1):
    # the moments were made scalars (static shape []): the fused update broadcast them to
    # the gradient's shape, but a Saver could not restore them (a checkpoint of shape
    # [3, 2] for a variable of shape []), and the op-by-op update refused the assign
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((8, 3)), rng.standard_normal((8, 2))
    w0 = rng.standard_normal((3, 2))
    g = dcf.Graph()
    with g.as_default():
        fed = dcf.placeholder(dcf.float64, [None, 2])
        if how == "validate_shape=False":
            w = dcf.Variable(w0, name="w", validate_shape=False)
        else:
            w = dcf.Variable(fed, name="w")
        assert w.shape is None
        loss = dcf.reduce_mean(dcf.square(dcf.matmul(x, w) - y))
        b1 = 0.75 if beta1 == 0.75 else dcf.constant(0.75, dtype=dcf.float64)
        opt = dcf.train.AdamOptimizer(0.125, beta1=b1, beta2=0.9921875, epsilon=2.0 ** -20)
        train = opt.minimize(loss)
        saver = dcf.train.Saver()
        with dcf.Session() as sess:
            sess.run(dcf.global_variables_initializer(), {fed: w0})
            got = []
            for t in range(10):
                sess.run(train)
                got.append(sess.run(w))
                if t == 4:
                    path = saver.save(sess, str(tmp_path / "ckpt"))
            m, v = opt._slots[w]
            assert sess.run(m).shape == sess.run(v).shape == (3, 2)
            saver.restore(sess, path)      # and training goes on from step 5 as before
            for t in range(5, 10):
                sess.run(train)
                np.testing.assert_array_equal(sess.run(w), got[t])
    want = _adam_numpy(w0, x, y, 0.125, lambda t: (0.75, 0.9921875), 2.0 ** -20, 10)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_restore_of_none_says_there_is_no_checkpoint(tmp_path):
    """`saver.restore(sess, dcf.train.latest_checkpoint(empty_dir))` is TF1's ValueError
    saying the path is None (it was an AttributeError from os.path), and the variable
    keeps its value."""
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable(np.float32(2.5), name="v")
        saver = dcf.train.Saver([v])
    with dcf.Session(g) as sess:
        sess.run(v.initializer)
        assert dcf.train.latest_checkpoint(str(tmp_path)) is None
        with pytest.raises(ValueError, match="save_path is None"):
            saver.restore(sess, dcf.train.latest_checkpoint(str(tmp_path)))
        assert sess.run(v) == np.float32(2.5)
