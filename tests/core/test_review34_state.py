"""Variables read and written inside while_loop bodies and cond branches (review 34):
the values expected are plain Python's, and TF1's (tensorflow.compat.v1 with control flow
v1 and resource variables, float64) where TF1 orders the same updates."""

from __future__ import annotations

import numpy as np

import dcf


def _scatter_counter_loop(dev: str, pi: int) -> tuple:
    """A loop of 20 iterations adding i to row i % 4 of a table and 1 (plus 100 on even
    iterations, in a cond) to a counter, both variables on `dev`."""
    with dcf.device(dev):
        table = dcf.Variable(np.zeros(4), name="table")
        count = dcf.Variable(np.float64(0.0), name="count")

    def body(i):
        with dcf.device(dev):
            a = count.assign_add(1.0)
            s = dcf.scatter_add(table, dcf.reshape(i % 4, [1]),
                                dcf.reshape(dcf.cast(i, dcf.float64), [1]))
            c = dcf.cond(dcf.equal(i % 2, 0), lambda: count.assign_add(100.0),
                         lambda: dcf.constant(np.float64(0.0)))
        with dcf.control_dependencies([a, s, c]):
            return i + 1

    out = dcf.while_loop(lambda i: i < 20, body, [dcf.constant(0)], parallel_iterations=pi)
    with dcf.control_dependencies([out]):
        after = count.read_value() + dcf.reduce_sum(table.read_value())
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        got = sess.run(after)
        return got, sess.run(table), sess.run(count)


def test_scatter_add_in_a_loop_on_a_stand_in_gpu_as_on_the_cpu(fake_gpus):
    # the stand-in's ufuncs had no `at` (cupy's have): a scatter_add into a variable on
    # /gpu:0 failed with "'function' object has no attribute 'at'"
    rows = [sum(i for i in range(20) if i % 4 == r) for r in range(4)]    # [40, 45, 50, 55]
    for dev in ("/cpu:0", "/gpu:0"):
        for pi in (1, 32):
            with dcf.Graph().as_default():
                after, table, count = _scatter_counter_loop(dev, pi)
            np.testing.assert_array_equal(table, rows)
            assert count == 20 + 100 * 10
            assert after == 1020 + sum(rows)

