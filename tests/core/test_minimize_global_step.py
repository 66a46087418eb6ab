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


def test_minimize_inside_a_cond_names_the_cond_and_the_way_that_works():
    w = dcf.Variable(np.array([2.0]), name="w")
    n = dcf.placeholder(dcf.int32, [])
    loss = dcf.reduce_sum(w * w)
    opt = dcf.train.GradientDescentOptimizer(0.25)
    with pytest.raises(ValueError, match=r"inside cond 'skip' \(true branch\).*"
                                         r"opt.compute_gradients.*opt.apply_gradients"):
        dcf.cond(n > 0, lambda: opt.minimize(loss), lambda: dcf.no_op(), name="skip")
    # what the message says: gradients outside, the update on one branch only
    grads = opt.compute_gradients(loss)
    # (a branch may return an op, as in TF1: the cond runs it on its branch only)
    step = dcf.cond(n > 0, lambda: opt.apply_gradients(grads), dcf.no_op)
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        sess.run(step, {n: 0})
        assert sess.run(w)[0] == 2.0
        sess.run(step, {n: 1})
        assert sess.run(w)[0] == 2.0 - 0.25 * 4.0


def test_an_op_returned_by_a_branch_runs_only_on_that_branch_in_a_loop():
    # TF1's "update on some steps" pattern inside a loop: the cond's value is the branch
    # taken, and the op runs only there
    v = dcf.Variable(0.0)
    def body(i, taken):
        t = dcf.cond(dcf.equal(i % 3, 0), lambda: v.assign_add(1.0).op, dcf.no_op)
        return i + 1, taken + dcf.cast(t, dcf.int32)
    _, taken = dcf.while_loop(lambda i, t: i < 7, body, (0, 0))
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        assert sess.run(taken) == 3          # i = 0, 3, 6
        assert sess.run(v) == 3.0
