"""Building graphs as a TF1 user writes model code, from a review by use: Python operators
with numpy values and Variables on either side, tensors in numpy calls, Python values
that do not fit the tensor's dtype, control dependencies and groups across graphs and of
nested structures, and tensor names."""

from __future__ import annotations

import numpy as np
import pytest

import dcf


def _run(fetches, feed=None):
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        return sess.run(fetches, feed)


# ------------------------------------------------------------- numpy and tensors
def test_a_tensor_in_a_numpy_call_is_a_clear_type_error_naming_it():
    t = dcf.constant([1.0, 2.0], name="obs")
    for call in (lambda: np.asarray(t), lambda: np.array([t, 1.0])):
        with pytest.raises(TypeError, match=r"symbolic tensor 'obs:0'.*Session.run"):
            call()


def test_a_list_holding_a_tensor_names_the_tensor_and_points_at_stack():
    t = dcf.constant([1.0, 2.0])
    with pytest.raises(TypeError, match=r"symbolic tensor 'StridedSlice:0'.*dcf.stack"):
        dcf.constant([t[0], 1.0])
    packed = dcf.stack([t[0], 1.0])
    np.testing.assert_array_equal(_run(packed), [1.0, 1.0])


def test_python_ints_that_do_not_fit_the_tensor_dtype_are_refused_not_wrapped():
    # numpy would wrap 2**40 to 0 in int32 (1 + 2**40 -> 1); TF1 does the same silently.
    # dcf refuses it as dcf.constant(2**40, dtype=dcf.int32) does.
    x = dcf.constant([1, 2])
    for big in (np.int64(2**40), np.array([2**40, 1]), 2**40, [2**40, 1]):
        with pytest.raises(TypeError, match=r"does not fit int32"):
            x + big
    wide = dcf.cast(x, dcf.int64) + np.int64(2**40)
    small = x + np.int64(5) - np.array([1, 1], np.int64)
    np.testing.assert_array_equal(_run(wide), [2**40 + 1, 2**40 + 2])
    np.testing.assert_array_equal(_run(small), [5, 6])


# ------------------------------------------------------------- Variables as operands
def test_variables_take_every_reflected_operator_and_numpy_on_the_left():
    v = dcf.Variable([7.0, -7.0, 5.0])
    b = dcf.Variable([True, False])
    a = np.array([1.0, 2.0, 3.0], np.float32)
    ref = np.array([7.0, -7.0, 5.0], np.float32)
    outs = _run([2.0 // v, 2.0 % v, a + v, a < v, True & b, False | b])
    np.testing.assert_array_equal(outs[0], 2.0 // ref)
    np.testing.assert_array_equal(outs[1], 2.0 % ref)
    np.testing.assert_array_equal(outs[2], a + ref)
    np.testing.assert_array_equal(outs[3], a < ref)
    np.testing.assert_array_equal(outs[4], [True, False])
    np.testing.assert_array_equal(outs[5], [True, False])


def test_a_variable_is_not_a_python_bool_nor_iterable():
    v = dcf.Variable([1.0, 2.0], name="w")
    n = len(dcf.get_default_graph().get_operations())
    with pytest.raises(TypeError, match=r"variable 'w' as a Python bool"):
        bool(v)
    with pytest.raises(TypeError, match=r"variable 'w' is not iterable"):
        list(v)
    with pytest.raises(TypeError, match=r"variable 'w' to a numpy array"):
        np.asarray(v)
    assert len(dcf.get_default_graph().get_operations()) == n  # (no reads were built)


# ------------------------------------------------------- control dependencies, group
def test_a_control_dependency_on_an_op_of_another_graph_is_refused():
    other = dcf.Graph()
    with other.as_default():
        side = dcf.print_(dcf.constant(1.0), message="never printed ")
    with pytest.raises(ValueError, match=r"Print 'Print' belongs to another graph"):
        with dcf.control_dependencies([side]):
            dcf.constant(2.0)


def test_group_flattens_nested_structures_and_builds_in_its_inputs_graph():
    x, y, z = dcf.constant(1.0), dcf.constant(2.0), dcf.constant(3.0)
    g = dcf.group([x, [y]], {"k": z})
    assert g.type == "NoOp"
    assert set(g.control_inputs) == {x.op, y.op, z.op}
    other = dcf.Graph()
    with other.as_default():
        w = dcf.constant(4.0)
    gw = dcf.group(w)
    assert gw.graph is other and gw.control_inputs == [w.op]


def test_control_dependencies_nest_as_a_union_and_none_clears_them():
    a, b = dcf.constant(1.0, name="a"), dcf.constant(2.0, name="b")
    with dcf.control_dependencies([a]):
        with dcf.control_dependencies([b]):
            both = dcf.constant(3.0)
        with dcf.control_dependencies(None):
            free = dcf.constant(4.0)
            with dcf.control_dependencies([b]):
                only_b = dcf.constant(5.0)
    assert set(both.op.control_inputs) == {a.op, b.op}
    assert free.op.control_inputs == []
    assert only_b.op.control_inputs == [b.op]


def test_exclusive_case_refuses_two_true_predicates_when_it_runs():
    # TF1's tf.case(..., exclusive=True) raises when more than one predicate holds,
    # the last pair's too when it stands in for the default.
    x = dcf.placeholder(dcf.int32, ())
    with_default = dcf.case([(x > 0, lambda: dcf.constant(1)), (x > 1, lambda: dcf.constant(2))],
                            default=lambda: dcf.constant(0), exclusive=True)
    p, q = dcf.placeholder(dcf.bool, ()), dcf.placeholder(dcf.bool, ())
    last_is_default = dcf.case([(p, lambda: dcf.constant(1)), (q, lambda: dcf.constant(2))],
                               exclusive=True)
    with dcf.Session() as sess:
        assert [int(sess.run(with_default, {x: v})) for v in (-1, 1)] == [0, 1]
        assert int(sess.run(last_is_default, {p: False, q: True})) == 2
        with pytest.raises(dcf.errors.InvalidArgumentError,
                           match=r"case 'case' is exclusive.*positions \[0, 1\]"):
            sess.run(with_default, {x: 2})
        with pytest.raises(dcf.errors.InvalidArgumentError, match=r"positions \[0, 1\]"):
            sess.run(last_is_default, {p: True, q: True})


def test_exclusive_case_inside_a_loop_counts_each_iteration():
    def body(i, acc):
        step = dcf.case([(i < 2, lambda: 1), (i > 3, lambda: 10)], default=lambda: 100,
                        exclusive=True)
        return i + 1, acc + step

    _, total = dcf.while_loop(lambda i, acc: i < 6, body, (0, 0))
    assert int(_run(total)) == 1 + 1 + 100 + 100 + 10 + 10


# ------------------------------------------------------------------------- names
def test_len_of_a_scalar_tensor_says_it_is_a_scalar():
    with pytest.raises(TypeError, match=r"len\(\) of tensor 'Const:0' a scalar"):
        len(dcf.constant(1.0))
    with pytest.raises(TypeError, match=r"unknown first dimension"):
        len(dcf.placeholder(dcf.float32, [None, 2]))
    assert len(dcf.constant([[1.0, 2.0]] * 3)) == 3


def test_get_tensor_by_name_wants_a_string():
    t = dcf.constant(1.0, name="x")
    g = dcf.get_default_graph()
    assert g.get_tensor_by_name("x:0") is t
    with pytest.raises(TypeError, match=r"tensor names are strings"):
        g.get_tensor_by_name(t)
    with pytest.raises(ValueError, match=r"look like 'op:0'"):
        g.get_tensor_by_name("x")
    with pytest.raises(KeyError, match=r"no operation named 'nope'"):
        g.get_tensor_by_name("nope:0")


def test_duplicate_names_are_made_unique_as_tf1_does():
    names = [dcf.constant(1.0, name=n).name for n in ("x", "x", "x_1", "x")]
    assert names == ["x:0", "x_1:0", "x_1_1:0", "x_2:0"]


def test_tensors_of_two_graphs_in_one_op_name_both():
    other = dcf.Graph()
    with other.as_default():
        a = dcf.constant(1.0, name="a")
    b = dcf.constant(2.0, name="b")
    with pytest.raises(ValueError, match=r"Add 'Add': input 'b:0' is from another graph than "
                                         r"its input 'a:0'"):
        a + b
