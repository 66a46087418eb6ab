"""A Variable keeps the shape it was created with. An assign of a value of another
shape, or an assign_add / assign_sub whose delta would broadcast the value to a larger
shape, is refused -- at build time where both shapes are known (ValueError naming the op
and both shapes), else at run time (InvalidArgumentError naming the op, and in a loop
the frame and iteration) -- and the variable keeps its value; the session goes on. A
delta that broadcasts *to* the variable's shape (a scalar added to a vector) is an
update. A variable whose shape is unknown when it is made takes values of any shape
(an update still keeps the shape its value has).

Before, such an assign replaced the value and its shape while every read still carried
the creation shape as its static shape."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError


def _session(config=None):
    sess = dcf.Session(config=config)
    sess.run(dcf.global_variables_initializer())
    return sess


def test_build_time_refusals_name_the_op_the_variable_and_both_shapes():
    v = dcf.Variable(np.zeros(5, np.float32), name="v")
    with pytest.raises(ValueError, match=r"AssignVariableOp 'v/Assign.*': cannot assign a "
                                         r"value of shape \[3\] to variable 'v' of shape \[5\]"):
        v.assign(np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"AssignAddVariableOp 'v/AssignAdd.*': cannot update "
                                         r"it by a delta of shape \[2, 5\] to variable 'v' "
                                         r"of shape \[5\]"):
        v.assign_add(np.ones((2, 5), np.float32))
    with pytest.raises(ValueError, match=r"AssignSubVariableOp .*delta of shape \[1, 5\]"):
        v.assign_sub(np.ones((1, 5), np.float32))
    with pytest.raises(ValueError, match=r"shape \[4\] to variable 'v' of shape \[5\]"):
        v.assign_add(np.ones(4, np.float32))


@pytest.mark.parametrize("kind", ["assign", "assign_add", "assign_sub"])
def test_run_time_refusal_leaves_the_variable_and_the_session_usable(compiled, kind):
    v = dcf.Variable(np.arange(5, dtype=np.float32), name="v")
    x = dcf.placeholder(dcf.float32, None, name="x")
    op = getattr(v, kind)(x)
    bad = np.ones(3, np.float32) if kind == "assign" else np.ones((2, 5), np.float32)
    with _session(compiled) as sess:
        with pytest.raises(InvalidArgumentError) as info:
            sess.run(op, {x: bad})
        msg = str(info.value)
        assert msg.startswith(f"{op.op.type} '{op.op.name}': ")
        assert f"variable 'v' of shape [5]: the value has shape {list(bad.shape)}" in msg
        np.testing.assert_array_equal(sess.run(v.read_value()), np.arange(5))
        ok = np.full(5, 2.0, np.float32)
        want = {"assign": ok, "assign_add": np.arange(5) + ok, "assign_sub": np.arange(5) - ok}
        np.testing.assert_array_equal(sess.run(op, {x: ok}), want[kind])
        np.testing.assert_array_equal(sess.run(v.read_value()), want[kind])


def test_a_delta_that_broadcasts_to_the_variable_shape_is_an_update(compiled):
    v = dcf.Variable(np.ones((2, 3), np.float32), name="v")
    x = dcf.placeholder(dcf.float32, None, name="x")
    add = v.assign_add(x)
    with _session(compiled) as sess:
        sess.run(add, {x: np.float32(2.0)})
        sess.run(add, {x: np.array([1.0, 2.0, 3.0], np.float32)})
        sess.run(v.assign_sub(np.float32(0.5)))
        np.testing.assert_array_equal(sess.run(v.read_value()),
                                      np.ones((2, 3)) + 2.0 + [1.0, 2.0, 3.0] - 0.5)


def test_a_refused_assign_in_a_loop_names_frame_and_iteration(compiled):
    v = dcf.Variable(np.zeros(2, np.float32), name="v")

    def body(i):
        # two elements in iterations 0 and 1, three in iteration 2
        val = dcf.fill(dcf.reshape(2 + dcf.maximum(i - 1, 0), [1]), 1.0)
        with dcf.control_dependencies([v.assign(val, name="put")]):
            return i + 1

    out = dcf.while_loop(lambda i: i < 4, body, 0, name="loop")
    with _session(compiled) as sess:
        with pytest.raises(InvalidArgumentError,
                           match=r"^AssignVariableOp 'loop/put', frame 'loop' iteration 2: "
                                 r".*variable 'v' of shape \[2\]: the value has shape \[3\]"):
            sess.run(out)
        np.testing.assert_array_equal(sess.run(v.read_value()), [1.0, 1.0])


def test_a_variable_of_unknown_static_shape_takes_any_value(compiled):
    """Its reads promise no shape (None), so nothing is refused (as TensorFlow's
    validate_shape=False)."""
    n = dcf.placeholder(dcf.int32, (), name="n")
    v = dcf.Variable(dcf.zeros(dcf.reshape(n, [1])), name="v")
    assert v.shape is None and v.read_value().shape is None
    x = dcf.placeholder(dcf.float32, None, name="x")
    put, add = v.assign(x), v.assign_add(x)
    with dcf.Session(config=compiled) as sess:
        sess.run(v.initializer, {n: 3})
        sess.run(put, {x: np.arange(7, dtype=np.float32)})
        np.testing.assert_array_equal(sess.run(v.read_value()), np.arange(7))
        sess.run(put, {x: np.ones((2, 2), np.float32)})
        sess.run(add, {x: np.ones(2, np.float32)})
        np.testing.assert_array_equal(sess.run(v.read_value()), np.full((2, 2), 2.0))
        with pytest.raises(InvalidArgumentError, match=r"of shape \[2, 2\]: the value has "
                                                       r"shape \[3, 2, 2\]"):
            sess.run(add, {x: np.ones((3, 2, 2), np.float32)})


def test_the_same_refusal_on_a_stand_in_gpu(fake_gpus):
    with dcf.device("/gpu:0"):
        v = dcf.Variable(np.arange(4, dtype=np.float32), name="v")
        x = dcf.placeholder(dcf.float32, None, name="x")
        add = v.assign_add(x)
    with _session() as sess:
        with pytest.raises(InvalidArgumentError, match=r"variable 'v' of shape \[4\]: the "
                                                       r"value has shape \[3, 4\]"):
            sess.run(add, {x: np.ones((3, 4), np.float32)})
        np.testing.assert_array_equal(sess.run(v.read_value()), np.arange(4))
        np.testing.assert_array_equal(sess.run(add, {x: np.ones(4, np.float32)}),
                                      np.arange(4) + 1)


def test_validate_shape_false_makes_a_variable_that_grows(compiled):
    """TensorFlow's escape hatch: a buffer that grows by assignment."""
    v = dcf.Variable(np.zeros(0, np.float32), name="buf", validate_shape=False)
    assert v.shape is None and v.read_value().shape is None
    x = dcf.placeholder(dcf.float32, (None,), name="x")
    grow = v.assign(dcf.concat([v.read_value(), x], 0))
    with _session(compiled) as sess:
        sess.run(grow, {x: [1.0, 2.0]})
        sess.run(grow, {x: [3.0]})
        np.testing.assert_array_equal(sess.run(v.read_value()), [1.0, 2.0, 3.0])
