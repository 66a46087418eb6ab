"""Review 4, building: constructs and stateful objects build in their inputs' graph,
TF1's one-var while_loop, shape invariants, FIFOQueue shapes, lossless constants, int64
inference for large ints, and the static first dimension of map_fn/scan/stack."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError


def _only_in(g: dcf.Graph, *ts) -> None:
    """Every tensor is g's, and the default graph got no op."""
    assert all(t.graph is g for t in ts)
    assert dcf.get_default_graph().get_operations() == []


# ------------------------------------------------- 1. constructs follow their inputs
def test_cond_case_while_map_fn_scan_build_in_their_inputs_graph(compiled):
    g = dcf.Graph()
    with g.as_default():
        x = dcf.constant(2.0)
        xs = dcf.constant(np.arange(4.0, dtype=np.float32))
    c = dcf.cond(x > 1.0, lambda: x * 3.0, lambda: x)
    k = dcf.case([(x < 0.0, lambda: x), (x > 1.0, lambda: x + 10.0)], default=lambda: -x)
    w = dcf.while_loop(lambda a: a < 100.0, lambda a: a * 3.0, [x])
    m = dcf.map_fn(lambda e: e * e + 1.0, xs)
    s = dcf.scan(lambda a, e: a + e, xs)
    f = dcf.foldl(lambda a, e: a * 2.0 + e, xs, initializer=x)
    _only_in(g, c, k, w, m, s, f)
    with dcf.Session(g, config=compiled) as sess:
        got = sess.run([c, k, w, m, s, f])
    a = 2.0
    while a < 100.0:
        a *= 3.0
    fold = 2.0
    for e in range(4):
        fold = fold * 2.0 + e
    assert got[:3] == [6.0, 12.0, a]
    np.testing.assert_allclose(got[3], np.arange(4.0) ** 2 + 1.0)
    np.testing.assert_allclose(got[4], np.cumsum(np.arange(4.0)))
    assert got[5] == fold


def test_create_op_refuses_an_input_of_another_graph():
    g1, g2 = dcf.Graph(), dcf.Graph()
    with g1.as_default():
        x = dcf.constant(1.0)
    with g2.as_default():
        y = dcf.constant(2.0)
    with pytest.raises(ValueError, match=r"Identity 'mine': input 'Const:0' belongs to another"):
        g2.create_op("Identity", [x], [x.type], name="mine")
    with pytest.raises(ValueError, match=r"Add 'Add': input 'Const:0' is from another graph"):
        dcf.add(x, y)
    # a cond in g2 whose branch captures a tensor of g1
    with pytest.raises(ValueError, match=r"Switch .*another graph"):
        dcf.cond(y > 0.0, lambda: x, lambda: y)


# --------------------------------------- 2. Python values in a Variable/TA/queue's graph
def test_variable_tensor_array_and_queue_take_python_values_outside_their_graph(compiled):
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable(1.0, name="v")
        init = dcf.global_variables_initializer()
        ta = dcf.TensorArray(dcf.float32, size=2)
        q = dcf.FIFOQueue(3, [dcf.float32], shapes=[()])
    ops = [v.assign(5.0), v.assign_add(1.5), v.assign_sub(np.float32(0.25))]
    stacked = ta.write(0, 3.0).write(1, 4.0).stack()
    unstacked = ta.unstack([7.0, 8.0]).read(1)
    sq = dcf.square(v)
    enq, enq_many, deq = q.enqueue([1.0]), q.enqueue_many([[2.0, 3.0]]), q.dequeue_many(3)
    _only_in(g, *ops, stacked, unstacked, sq, deq)
    with dcf.Session(g, config=compiled) as sess:
        sess.run(init)
        assert [sess.run(op) for op in ops] == [5.0, 6.5, 6.25]
        np.testing.assert_array_equal(sess.run(stacked), [3.0, 4.0])
        assert sess.run(unstacked) == 8.0
        assert sess.run(sq) == 6.25**2
        sess.run(enq)
        sess.run(enq_many)
        np.testing.assert_array_equal(sess.run(deq), [1.0, 2.0, 3.0])


# ------------------------------------------------- 3. TF1's one-var while_loop
@pytest.mark.parametrize("wrap", [list, tuple])
@pytest.mark.parametrize("returns_list", [False, True])
def test_one_loop_var_in_a_list_comes_back_as_a_tensor(wrap, returns_list, compiled,
                                                       run_graph):
    i = dcf.constant(0)
    body = (lambda i: [i + 3]) if returns_list else (lambda i: i + 3)
    r = dcf.while_loop(lambda i: i < 10, body, wrap([i]))
    assert isinstance(r, dcf.Tensor)
    assert run_graph(r, config=compiled) == 12
    same = dcf.while_loop(lambda i: i < 10, body, wrap([i]), return_same_structure=True)
    assert isinstance(same, wrap) and len(same) == 1
    assert run_graph(same[0], config=compiled) == 12


@pytest.mark.parametrize("empty", [[], (), {}])
def test_while_loop_without_loop_vars_is_a_value_error(empty):
    with pytest.raises(ValueError, match=r"while_loop 'w': loop_vars must be provided"):
        dcf.while_loop(lambda: True, lambda: [], empty, name="w")


# ----------------------------------------------------- 4. shape invariants hold
@pytest.mark.parametrize("inv", [(3,), (None, None), ()])
def test_shape_invariant_incompatible_with_the_entry_shape_is_refused(inv):
    x = dcf.ones((2,))
    with pytest.raises(ValueError, match=r"while_loop 'grow': the shape invariant .* of loop "
                                         r"var 1 \('Fill:0'\) is not compatible with the shape "
                                         r"\[2\]"):
        dcf.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x), (0, x),
                       shape_invariants=((), inv), name="grow")


@pytest.mark.parametrize("inv,static", [((None,), (None,)), (None, None), ((2,), (2,))])
def test_compatible_shape_invariants_relax_the_static_shape(inv, static, run_graph):
    x = dcf.ones((2,))
    _, y = dcf.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2.0), (0, x),
                          shape_invariants=((), inv))
    assert y.shape == static
    np.testing.assert_array_equal(run_graph(y), [8.0, 8.0])


# ------------------------------------------------------- 5. FIFOQueue shapes
def test_queue_refuses_static_shapes_and_lengths_it_does_not_hold():
    q = dcf.FIFOQueue(5, [dcf.float32, dcf.int32], shapes=[(2,), ()], name="q")
    with pytest.raises(ValueError, match=r"QueueEnqueueV2 'enqueue': component 0 has shape "
                                         r"\[3\], queue 'q' holds \[2\]"):
        q.enqueue([[1.0, 2.0, 3.0], 7])
    with pytest.raises(ValueError, match=r"'enqueue_many': component 0 has elements of shape "
                                         r"\[3\]"):
        q.enqueue_many([[[1.0, 2.0, 3.0]], [1]])
    with pytest.raises(ValueError, match=r"'enqueue_many': the components have different first "
                                         r"dimensions \[1, 2\]"):
        q.enqueue_many([[[1.0, 2.0]], [1, 2]])
    with pytest.raises(TypeError, match=r"QueueEnqueueV2 'enqueue': component 1 .*1.5.*int32"):
        q.enqueue([[1.0, 2.0], 1.5])
    with pytest.raises(ValueError, match=r"FIFOQueue 'fifo_queue': shapes must have one entry "
                                         r"per dtype, got 2 shapes for 1 dtypes"):
        dcf.FIFOQueue(2, [dcf.float32], shapes=[(1,), (2,)])
    with pytest.raises(ValueError, match=r"QueueDequeueManyV2 'dequeue_many': n must be >= 0"):
        q.dequeue_many(-1)


def test_queue_refuses_fed_shapes_it_does_not_hold_when_the_enqueue_runs(compiled):
    q = dcf.FIFOQueue(5, [dcf.float32, dcf.int32], shapes=[(2,), ()], name="q")
    p = dcf.placeholder(dcf.float32, None)
    n = dcf.placeholder(dcf.int32, None)
    one, many = q.enqueue([p, 1]), q.enqueue_many([p, n])
    k = dcf.placeholder(dcf.int32, ())
    deq = q.dequeue_many(k)
    assert deq[0].shape == (None, 2) and q.dequeue_many(dcf.constant(2))[0].shape == (2, 2)
    with dcf.Session(config=compiled) as sess:
        with pytest.raises(InvalidArgumentError, match=r"QueueEnqueueV2 'enqueue'(.|\n)*shape "
                                                       r"mismatch in component 0: expected "
                                                       r"\[2\], got \[4\]"):
            sess.run(one, {p: np.ones(4, np.float32)})
        with pytest.raises(InvalidArgumentError, match=r"QueueEnqueueV2 'enqueue_many'(.|\n)*"
                                                       r"different first dimensions \[2, 3\]"):
            sess.run(many, {p: np.ones((2, 2)), n: [1, 2, 3]})
        with pytest.raises(InvalidArgumentError, match=r"'enqueue_many'(.|\n)*component 0: "
                                                       r"expected elements of shape \[2\]"):
            sess.run(many, {p: np.ones((2, 3)), n: [1, 2]})
        assert sess.run(q.size()) == 0      # nothing refused got in
        sess.run(many, {p: [[1.0, 2.0], [3.0, 4.0]], n: [5, 6]})
        sess.run(one, {p: [7.0, 8.0]})
        a, b = sess.run(deq, {k: 2})
        np.testing.assert_array_equal(a, [[1.0, 2.0], [3.0, 4.0]])
        np.testing.assert_array_equal(b, [5, 6])
        with pytest.raises(InvalidArgumentError, match=r"QueueDequeueManyV2 'dequeue_many'"
                                                       r"(.|\n)*n must be >= 0, got -1"):
            sess.run(deq, {k: -1})
        a, b = sess.run(deq, {k: 1})
        np.testing.assert_array_equal(a, [[7.0, 8.0]])
        np.testing.assert_array_equal(b, [1])


# ----------------------------------------------- 6. conversions that change values
@pytest.mark.parametrize("make", [
    lambda: dcf.constant([1, 2.9], dtype=dcf.int32),
    lambda: dcf.constant(np.array([0.5]), dtype=dcf.int64),
    lambda: dcf.constant(float("nan"), dtype=dcf.int32),
    lambda: dcf.constant(300, dtype=dcf.bool),
    lambda: dcf.constant(np.array([2, 0]), dtype=dcf.bool),
    lambda: dcf.constant(np.array([2**40]), dtype=dcf.int32),
    lambda: dcf.Variable(5, name="n").assign(0.7),
    lambda: dcf.TensorArray(dcf.int32, size=1).write(0, 2.5),
])
def test_a_conversion_that_changes_a_value_is_a_type_error(make):
    with pytest.raises(TypeError, match=r"Const 'Const'.* to (int32|int64|bool)"):
        make()


def test_exact_conversions_pass(run_graph):
    v = dcf.Variable(5, name="n")
    a = v.assign(2.0)
    c = dcf.constant([1, 2.0], dtype=dcf.int32)
    b = dcf.constant([0, 1, 1.0], dtype=dcf.bool)
    t = dcf.constant(True, dtype=dcf.int32)
    with dcf.Session() as sess:
        sess.run(v.initializer)
        got = sess.run([a, c, b, t])
    assert got[0] == 2 and got[3] == 1
    np.testing.assert_array_equal(got[1], [1, 2])
    np.testing.assert_array_equal(got[2], [False, True, True])


# ------------------------------------------------------ 7. ints beyond int32
def test_python_ints_beyond_int32_become_int64(run_graph):
    big = dcf.constant(2**40)
    mixed = dcf.constant([1, -(2**40)])
    small = dcf.constant([1, 2])
    assert (big.dtype, mixed.dtype, small.dtype) == (dcf.int64, dcf.int64, dcf.int32)
    got = run_graph([big, mixed])
    assert got[0] == 2**40
    np.testing.assert_array_equal(got[1], np.array([1, -(2**40)], np.int64))


@pytest.mark.parametrize("value,dtype", [(2**40, dcf.int32), (2**70, None), ([1, 2**64], None)])
def test_an_int_that_does_not_fit_is_a_type_error_naming_the_op(value, dtype):
    with pytest.raises(TypeError, match=r"Const 'big': cannot convert"):
        dcf.constant(value, dtype=dtype, name="big")


# -------------------------------------------- 8. static first dim of map_fn/scan/stack
def test_map_fn_and_scan_keep_the_static_first_dimension(compiled):
    x = dcf.placeholder(dcf.float64, (4, 3))
    assert dcf.map_fn(lambda e: e * 2.0, x).shape == (4, 3)
    assert dcf.map_fn(lambda e: e * 2.0, x, dtype=dcf.float64).shape == (4, 3)
    assert dcf.scan(lambda a, e: a + e, x).shape == (4, 3)
    assert dcf.map_fn(lambda e: e, dcf.placeholder(dcf.float64, (None, 3))).shape == (None, 3)
    # TF1's idiom: a loop var updated by map_fn keeps its shape across iterations
    v0 = dcf.placeholder(dcf.float64, (4,))
    _, v = dcf.while_loop(lambda i, v: i < 2,
                          lambda i, v: (i + 1, dcf.map_fn(lambda e: dcf.sin(e), v)), (0, v0))
    assert v.shape == (4,)
    with dcf.Session(config=compiled) as sess:
        got = sess.run(v, {v0: np.arange(4.0)})
    np.testing.assert_allclose(got, np.sin(np.sin(np.arange(4.0))))


def test_stack_has_a_static_size_only_when_the_size_is_fixed():
    n = dcf.placeholder(dcf.int32, ())
    fixed = dcf.TensorArray(dcf.float32, size=3).write(0, [1.0, 2.0])
    grown = dcf.TensorArray(dcf.float32, size=3, dynamic_size=True).write(0, [1.0, 2.0])
    fed = dcf.TensorArray(dcf.float32, size=n).write(0, [1.0, 2.0])
    assert fixed.stack().shape == (3, 2)
    assert grown.stack().shape == (None, 2)
    assert fed.stack().shape == (None, 2)
