"""Bugs found by bench/probes/tf1_diff_fuzz.py (random programs built the same way in dcf
and in TF1 control flow v1), each shrunk to a few ops and checked against values computed
by hand (closed forms, or TF1 where noted)."""

from __future__ import annotations

import numpy as np

import dcf

f64 = dcf.float64
XV = np.array([[0.3, -0.7, 1.1], [0.5, 0.2, -0.4]])
YV = np.array([[1.2, 0.4, -0.6], [0.8, -1.1, 0.3]])


def _run(fetches, feeds, compile_frames=True):
    with dcf.Session(config=dcf.SessionConfig(compile_frames=compile_frames)) as sess:
        return sess.run(fetches, feeds)


def test_unstacked_array_read_only_by_a_dead_read_in_a_nested_loop():
    """A TensorArray made in a scan's body and read, by a read whose value is unused, in
    a loop inside: its unstack's gradient array was made before (and without) the
    unstack running, so it had no element shape and its gather failed ('read of index 0
    ... which was never written'). TF1 gives d/dx = [[2, 2, 2], [0, 0, 0]] (from acc)."""
    with dcf.Graph().as_default():
        x = dcf.placeholder(f64, (2, 3))
        y = dcf.placeholder(f64, (2, 3))

        def step(acc, row):
            ta = dcf.TensorArray(f64, size=2).unstack(dcf.stack([y, x]))

            def body(i, a):
                ta.read(i)              # unused
                return i + 1, a * y
            w = dcf.while_loop(lambda i, a: i < 2, body, (dcf.constant(0), y))[1]
            return dcf.reduce_mean(w, axis=0) + acc
        out = dcf.scan(step, x, initializer=x[0])
        gx, gy = dcf.gradients(out, [x, y])
        for compiled in (True, False):
            vx, vy = _run([gx, gy], {x: XV, y: YV}, compiled)
            np.testing.assert_allclose(vx, [[2, 2, 2], [0, 0, 0]], rtol=1e-12)
            # w = y^3; the scan's outputs are m + x[0] and 2m + x[0], m = mean_rows(y^3)
            np.testing.assert_allclose(vy, 4.5 * YV ** 2, rtol=1e-12)


def _second_order_through_cond_of_a_variable(xv):
    """d/dv of sum(d out/dx), out = cond(sum(x) > 0, x*x, x*v), on both executors."""
    with dcf.Graph().as_default():
        x = dcf.placeholder(f64, (3,))
        v = dcf.Variable(np.array([1.0, 2.0, 3.0]))
        out = dcf.cond(dcf.reduce_sum(x) > 0.0, lambda: x * x, lambda: x * v)
        (gx,) = dcf.gradients(out, [x])
        (hv,) = dcf.gradients(dcf.reduce_sum(gx), [v])
        init = dcf.global_variables_initializer()
        res = []
        for compiled in (True, False):
            with dcf.Session(config=dcf.SessionConfig(compile_frames=compiled)) as sess:
                sess.run(init)
                res.append(sess.run(hv, {x: xv}))
        return res


def test_second_order_wrt_a_variable_read_only_in_the_branch_not_taken():
    """The true branch runs: the second gradient's zeros for it were a zeros_like of the
    variable's read in the other (dead) branch, so the fetch was dead ('lies on a branch
    that was not taken'). TF1: 0."""
    for hv in _second_order_through_cond_of_a_variable(np.ones(3)):
        np.testing.assert_array_equal(hv, [0, 0, 0])


def test_second_order_wrt_a_variable_read_in_the_branch_taken_counts_once():
    """The false branch runs: d out/dx = v, so d/dv sum(v) = 1 (TF1: 1); the read's
    gradient came back out of the forward cond and was also kept from the gradient
    cond's walk: 2."""
    for hv in _second_order_through_cond_of_a_variable(-np.ones(3)):
        np.testing.assert_array_equal(hv, [1, 1, 1])


def test_second_order_with_a_loop_whose_results_only_dead_reads_use():
    """Inside map_fn: a loop's result unstacked into a TensorArray that a second loop
    reads without using the value. Second order pushes the gradients reaching the first
    loop's saved values from the backward-of-backward loop; nothing read that loop's
    results, so it was left out of the run and the pops found an empty stack. Each row
    maps to 0.18 * row: d/dx = 0.18, second order 0."""
    with dcf.Graph().as_default():
        x = dcf.placeholder(f64, (2, 3))

        def per_row(row):
            def body(i, a):
                return i + 1, dcf.tanh(dcf.tanh(x) * a)
            w = dcf.while_loop(lambda i, a: i < 2, body, (dcf.constant(0), x))[1]
            ta = dcf.TensorArray(f64, size=2).unstack(w)

            def reader(j, acc):
                ta.read(j)              # unused
                return j + 1, acc
            return dcf.while_loop(lambda j, acc: j < 2, reader,
                                  (dcf.constant(0), row * 0.18))[1]
        out = dcf.map_fn(per_row, x)
        (gx,) = dcf.gradients(out, [x])
        (hx,) = dcf.gradients(dcf.reduce_sum(gx * XV), [x])
        for compiled in (True, False):
            vg, vh = _run([gx, hx], {x: XV}, compiled)
            np.testing.assert_allclose(vg, np.full((2, 3), 0.18), rtol=1e-12)
            np.testing.assert_array_equal(vh, np.zeros((2, 3)))
