"""Gradient ops go where their forward ops go, whatever device scope gradients() is
called in (TF1's colocate_gradients_with_ops, which resets the device stack): an
unplaced forward op's gradient is unplaced (it runs on /cpu:0 with the op; it went to the
scope's device), and a forward op on "/cpu:2" keeps its gradient on "/cpu:2" under a
"/job:worker/task:1" scope (the scope's job and task were merged in: a device of another
process, or none). What only the gradient machinery has (a gradient loop's counter and
predicate) still goes on the scope. TF1's answers were taken from tensorflow.compat.v1."""

from __future__ import annotations

import numpy as np

import dcf


def _devices(g: dcf.Graph, types: tuple[str, ...]) -> set[str]:
    return {op.device for op in g.get_operations()
            if op.name.startswith("gradients") and op.type in types}


def test_an_unplaced_forward_op_gets_unplaced_gradients_under_any_scope():
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (3,))
        w = dcf.Variable(np.ones(3, np.float32), name="w")
        y = dcf.reduce_sum(dcf.tanh(x * w))
        with dcf.device("/cpu:1"):
            gw, = dcf.gradients(y, [w])
        # TF1: "" for every one (colocated with the forward ops)
        assert {op.device for op in g.get_operations()
                if op.name.startswith("gradients")} == {""}
        with dcf.Session() as sess:
            sess.run(dcf.global_variables_initializer())
            np.testing.assert_allclose(sess.run(gw, {x: [1.0, 2.0, 3.0]}),
                                       [1.0, 2.0, 3.0] / np.cosh([1.0, 2.0, 3.0]) ** 2,
                                       rtol=1e-5)


def test_a_scope_with_a_job_does_not_move_gradients_to_another_process():
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, ())
        with dcf.device("/cpu:2"):
            y = dcf.sin(x) * x
        with dcf.device("/job:worker/task:1"):
            gx, = dcf.gradients(y, [x])
        # TF1: /device:CPU:2 for the gradients of sin and mul (x's sum: unplaced as x)
        assert _devices(g, ("Mul", "Cos", "OnesLike")) == {"/cpu:2"}
        with dcf.Session() as sess:             # there was no /job:worker/task:1/cpu:2
            np.testing.assert_allclose(sess.run(gx, {x: 2.0}), np.cos(2.0) * 2.0 + np.sin(2.0),
                                       rtol=1e-6)


def test_a_loop_over_unplaced_ops_differentiates_them_unplaced():
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (3,))
        w = dcf.Variable(np.full(3, 0.5, np.float32), name="w")
        _, h = dcf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, dcf.tanh(h * w)),
                              (0, x))
        y = dcf.reduce_sum(h)
        with dcf.device("/cpu:1"):
            gw, gx = dcf.gradients(y, [w, x])
        assert _devices(g, ("TanhGrad", "Mul")) == {""}        # were on /cpu:1
        assert _devices(g, ("LoopCond",)) == {"/cpu:1"}        # bookkeeping: the scope's
        with dcf.Session() as sess:
            sess.run(dcf.global_variables_initializer())
            got = sess.run([gw, gx], {x: [1.0, 2.0, 3.0]})

    def f(w_val: np.ndarray, x_val: np.ndarray) -> float:
        h = x_val
        for _ in range(3):
            h = np.tanh(h * w_val)
        return float(h.sum())

    w0, x0, eps = np.full(3, 0.5), np.array([1.0, 2.0, 3.0]), 1e-5
    for k in range(3):
        e = np.eye(3)[k] * eps
        np.testing.assert_allclose(got[0][k], (f(w0 + e, x0) - f(w0 - e, x0)) / (2 * eps),
                                   rtol=1e-3)
        np.testing.assert_allclose(got[1][k], (f(w0, x0 + e) - f(w0, x0 - e)) / (2 * eps),
                                   rtol=1e-3)
