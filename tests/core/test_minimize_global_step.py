"""`minimize(..., global_step=v)` and `apply_gradients(..., global_step=v)` add 1 to an
integer Variable once the variables are updated, as TF1's optimizers do (a TF1 user's
training loop passes it on nearly every call). The values are checked against plain
numpy gradient descent and a counter kept by hand."""

from __future__ import annotations

import os

import numpy as np
import pytest

import dcf


@pytest.mark.parametrize("dtype", [dcf.int64, dcf.int32])
def test_minimize_counts_its_steps_and_updates_first(dtype, tmp_path):
    g = dcf.Graph()
    with g.as_default():
        w = dcf.Variable(np.array([1.0, -2.0]), name="w")
        step = dcf.Variable(np.array(0, dtype.np), name="global_step", trainable=False)
        loss = dcf.reduce_sum(dcf.square(w - 3.0))
        train = dcf.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
        saver = dcf.train.Saver()
        init = dcf.global_variables_initializer()
    assert isinstance(train, dcf.Operation)
    want = np.array([1.0, -2.0])
    with dcf.Session(g) as sess:
        sess.run(init)
        for k in range(1, 4):
            sess.run(train)
            want = want - 0.1 * 2 * (want - 3.0)
            assert sess.run(step) == k
            np.testing.assert_allclose(sess.run(w), want, rtol=1e-12)
        path = saver.save(sess, str(tmp_path / "ckpt"), global_step=step)
    assert os.path.basename(path) == "ckpt-3.npz"      # (dcf's file name for step 3)


def test_adam_apply_gradients_counts_steps():
    g = dcf.Graph()
    with g.as_default():
        w = dcf.Variable(np.array([0.5]), name="w")
        step = dcf.Variable(np.array(0, np.int64), trainable=False)
        opt = dcf.train.AdamOptimizer(0.01)
        loss = dcf.reduce_sum(w * w)
        train = opt.apply_gradients(opt.compute_gradients(loss), global_step=step)
        init = dcf.global_variables_initializer()
    with dcf.Session(g) as sess:
        sess.run(init)
        for _ in range(5):
            sess.run(train)
        assert sess.run(step) == 5
        # the first Adam step moves w by the learning rate (bias-corrected m/sqrt(v) = 1)
        assert sess.run(w)[0] < 0.5 - 0.04


def test_global_step_must_be_a_variable():
    w = dcf.Variable(1.0)
    loss = w * w
    with pytest.raises(TypeError, match="global_step must be a dcf.Variable"):
        dcf.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=dcf.constant(0))
