"""Variables read and written inside while_loop bodies and cond branches (review 34):
the values expected are plain Python's, and TF1's (tensorflow.compat.v1 with control flow
v1 and resource variables, float64) where TF1 orders the same updates."""

from __future__ import annotations

import numpy as np
import pytest

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


def test_a_variable_made_in_a_body_from_a_tensor_of_the_body_names_the_variable():
    # TF1 refuses it too ("use a lambda as the initial_value"); dcf's error named the
    # initializer's AssignVariableOp 'Assign' and said to use the loop's outputs
    def body(i):
        w = dcf.Variable(dcf.zeros([2], dtype=dcf.float64), name="w")
        return i + dcf.cast(dcf.reduce_sum(w), dcf.int32) + 1

    with dcf.Graph().as_default():
        with pytest.raises(ValueError, match=r"Variable 'while/w'.*inside while_loop "
                           r"'while'.*lambda"):
            dcf.while_loop(lambda i: i < 3, body, [dcf.constant(0)])
    p = dcf.placeholder(dcf.bool, ())
    with pytest.raises(ValueError, match=r"Variable 'cond/w'.*inside cond 'cond'.*lambda"):
        dcf.cond(p, lambda: dcf.Variable(dcf.ones([2]) * 2.0, name="w").read_value(),
                 lambda: dcf.zeros([2]))


def test_a_variable_made_in_a_body_from_a_lambda_or_a_constant_is_lifted():
    p = dcf.placeholder(dcf.bool, ())
    made = []

    def branch():
        w = dcf.Variable(lambda: dcf.ones([2], dtype=dcf.float64) * 2.0, name="w")
        made.append(w)
        return dcf.reduce_sum(w)

    y = dcf.cond(p, branch, lambda: dcf.constant(np.float64(0.0)))

    def body(i):
        u = dcf.Variable(np.int32(3), name="u")
        return i + u

    out = dcf.while_loop(lambda i: i < 10, body, [dcf.constant(0)])
    assert [v.name for v in dcf.global_variables()] == ["cond/w", "while/u"]
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        assert sess.run(y, {p: True}) == 4.0
        assert sess.run(y, {p: False}) == 0.0
        assert sess.run(out) == 12


def test_an_update_built_before_a_cond_runs_on_either_branch_as_in_tf1():
    # docs/from-tf1.md said `cond(p, lambda: train_op, no_op)` runs train_op only when p
    # holds; as in TF1 (checked with tensorflow.compat.v1), an op or tensor built before
    # the cond runs whichever branch is taken, and one built inside the branch only there
    v = dcf.Variable(np.float64(0.0), name="v")
    p = dcf.placeholder(dcf.bool, ())
    before = v.assign_add(10.0).op
    a = v.assign_add(1.0)
    outside_op = dcf.cond(p, lambda: before, dcf.no_op)
    outside_tensor = dcf.cond(p, lambda: a, lambda: dcf.constant(np.float64(-1.0)))
    inside = dcf.cond(p, lambda: v.assign_add(100.0).op, dcf.no_op)
    with dcf.Session() as sess:
        sess.run(v.initializer)
        assert not sess.run(outside_op, {p: False})
        assert sess.run(v) == 10.0
        assert sess.run(outside_tensor, {p: False}) == -1.0
        assert sess.run(v) == 11.0
        assert not sess.run(inside, {p: False})
        assert sess.run(v) == 11.0
        assert sess.run(inside, {p: True})
        assert sess.run(v) == 111.0
