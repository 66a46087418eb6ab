"""TensorArray and the functional ops as a TF1 user porting code finds them, from a review
by use: split and identity, close as an op, a given element shape holding without
infer_shape, zeros for the gradient of a ragged element nothing read, empty stacks of the
rank the graph gives them, vector indices for gather and scatter, shape errors that name
the elements, and TF1's map_fn / scan arguments (parallel_iterations=None, infer_shape).
Expected values are numpy's or closed forms (TF1 agrees with each)."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError


# ------------------------------------------------------------------ split, identity, close
def test_split_writes_the_pieces_and_concat_joins_them(compiled, run_graph):
    x = dcf.placeholder(dcf.float32, (None,))
    ta = dcf.TensorArray(dcf.float32, size=3, infer_shape=False, clear_after_read=False,
                         name="pieces").split(x, [1, 2, 3])
    xv = np.arange(6, dtype=np.float32)
    got = run_graph([ta.read(0), ta.read(1), ta.read(2), ta.concat(), ta.size()], {x: xv},
                    config=compiled)
    for piece, want in zip(got[:3], np.split(xv, [1, 3])):
        np.testing.assert_array_equal(piece, want)
    np.testing.assert_array_equal(got[3], xv)
    assert got[4] == 3


def test_split_into_equal_lengths_gives_the_element_shape():
    ta = dcf.TensorArray(dcf.float32, size=2).split(np.ones((4, 3), np.float32), [2, 2])
    assert ta.element_shape == (2, 3)
    assert ta.stack().shape == (2, 2, 3)


@pytest.mark.parametrize("lengths, match", [
    ([1, 2, 2], r"TensorArraySplitV3 'TensorArraySplit': split of 6 rows into lengths "
                r"summing to 5 in TensorArray 'pieces'"),
    ([4, -1, 3], r"split into negative lengths \[4, -1, 3\] in TensorArray 'pieces'"),
])
def test_split_lengths_that_do_not_fit_are_errors(lengths, match, run_graph):
    ta = dcf.TensorArray(dcf.float32, size=3, infer_shape=False, name="pieces")
    ta = ta.split(np.arange(6, dtype=np.float32), lengths)
    with pytest.raises(InvalidArgumentError, match=match):
        run_graph(ta.concat())


def test_split_gradient_is_the_concat_of_the_pieces_gradients_zeros_where_unread(compiled):
    # y = sum(sin(piece 1)) + sum(piece 2 ** 2); piece 0 is never read: its gradient is 0
    x = dcf.placeholder(dcf.float64, (6,))
    ta = dcf.TensorArray(dcf.float64, size=3, infer_shape=False).split(x, [1, 2, 3])
    y = dcf.reduce_sum(dcf.sin(ta.read(1))) + dcf.reduce_sum(ta.read(2) ** 2)
    (g,) = dcf.gradients(y, [x])
    xv = np.arange(6.0) / 3
    with dcf.Session(config=compiled) as sess:
        got = sess.run(g, {x: xv})
    np.testing.assert_allclose(got, np.concatenate([[0.0], np.cos(xv[1:3]), 2 * xv[3:]]))


def test_gradient_of_a_ragged_element_nothing_read_is_zeros_of_its_shape(compiled):
    # infer_shape=False: elements 0 (2x2) and 1 (2,) differ; only element 1 is read
    x = dcf.placeholder(dcf.float64, (2, 2))
    ta = dcf.TensorArray(dcf.float64, size=2, infer_shape=False).write(0, x).write(1, x[1])
    (g,) = dcf.gradients(dcf.reduce_sum(dcf.sin(ta.read(1))), [x])
    xv = np.arange(4.0).reshape(2, 2)
    with dcf.Session(config=compiled) as sess:
        got = sess.run(g, {x: xv})
    np.testing.assert_allclose(got, [[0.0, 0.0], np.cos(xv[1])])


@pytest.mark.parametrize("how", ["unstack", "scatter"])
def test_gradient_of_rows_nothing_read_is_zero_without_infer_shape(how, compiled):
    x = dcf.placeholder(dcf.float64, (3, 2))
    ta = dcf.TensorArray(dcf.float64, size=4, infer_shape=False)
    ta = ta.unstack(x) if how == "unstack" else ta.scatter([3, 0, 1], x)
    (g,) = dcf.gradients(dcf.reduce_sum(dcf.sin(ta.gather([1]))), [x])
    xv = np.arange(6.0).reshape(3, 2)
    with dcf.Session(config=compiled) as sess:
        got = sess.run(g, {x: xv})
    row = 1 if how == "unstack" else 2        # the row written to index 1
    want = np.zeros((3, 2))
    want[row] = np.cos(xv[row])
    np.testing.assert_allclose(got, want)


def test_gradient_of_an_unstack_into_a_larger_array_has_the_value_s_rows(compiled):
    x = dcf.placeholder(dcf.float64, (None, 2))
    ta = dcf.TensorArray(dcf.float64, size=4).unstack(x)       # 3 rows into 4 elements
    (g,) = dcf.gradients(dcf.reduce_sum(dcf.sin(ta.read(1))), [x])
    xv = np.arange(6.0).reshape(3, 2)
    with dcf.Session(config=compiled) as sess:
        got = sess.run(g, {x: xv})
    np.testing.assert_allclose(got, [[0.0, 0.0], np.cos(xv[1]), [0.0, 0.0]])


def test_identity_orders_reads_after_its_control_dependencies(compiled, run_graph):
    v = dcf.Variable(1.0)
    ta = dcf.TensorArray(dcf.float32, size=1).write(0, 5.0)
    bump = v.assign_add(2.0)
    with dcf.control_dependencies([bump]):
        ta2 = ta.identity()
    assert isinstance(ta2, dcf.TensorArray) and ta2.handle is ta.handle
    with dcf.Session(config=compiled) as sess:
        sess.run(dcf.global_variables_initializer())
        with dcf.control_dependencies([ta2.flow]):
            after = v.read_value()
        got, seen = sess.run([ta2.read(0), after])
    assert got == 5.0 and seen == 3.0


def test_close_is_an_op_to_fetch_or_depend_on(run_graph):
    ta = dcf.TensorArray(dcf.float32, size=1).write(0, 3.0)
    closed = ta.close()
    with dcf.control_dependencies([closed]):
        one = dcf.constant(1.0)
    assert run_graph([ta.read(0), closed, one]) == [3.0, None, 1.0]


# ------------------------------------------------------------------ element shapes
def test_a_given_element_shape_holds_without_infer_shape_at_build_time():
    ta = dcf.TensorArray(dcf.float32, size=2, element_shape=[None, 2], infer_shape=False,
                         name="arr")
    ta.write(0, np.ones((1, 2), np.float32)).write(1, np.ones((3, 2), np.float32))
    with pytest.raises(InvalidArgumentError, match=r"TensorArray 'arr': write of shape "
                                                   r"\[3,3\] does not match its element "
                                                   r"shape \[\?,2\]"):
        ta.write(1, np.ones((3, 3), np.float32))


def test_a_given_element_shape_holds_without_infer_shape_at_run_time(compiled, run_graph):
    p = dcf.placeholder(dcf.float32, (None,))
    ta = dcf.TensorArray(dcf.float32, size=1, element_shape=[3], infer_shape=False,
                         name="arr").write(0, p)
    with pytest.raises(InvalidArgumentError, match=r"TensorArrayWriteV3 'TensorArrayWrite': "
                                                   r"write of shape \[2\] to index 0 of "
                                                   r"TensorArray 'arr' .* whose elements "
                                                   r"have shape \[3\]"):
        run_graph(ta.read(0), {p: np.ones(2, np.float32)}, config=compiled)


def test_stack_and_concat_of_mismatched_elements_name_the_shapes(run_graph):
    ta = dcf.TensorArray(dcf.float32, size=3, infer_shape=False, clear_after_read=False,
                         name="ragged")
    ta = ta.write(0, np.ones((1, 2), np.float32)).write(1, np.ones((1, 2), np.float32))
    ta = ta.write(2, np.ones((3, 3), np.float32))
    with pytest.raises(InvalidArgumentError, match=r"TensorArrayStack 'TensorArrayStack': "
                                                   r"stack of elements of different shapes "
                                                   r"\(index 0: \[1, 2\], index 2: \[3, 3\]\)"
                                                   r" in TensorArray 'ragged'"):
        run_graph(ta.stack())
    with pytest.raises(InvalidArgumentError, match=r"concat of elements whose shapes differ "
                                                   r"past their first dimension \(index 0: "
                                                   r"\[1, 2\], index 2: \[3, 3\]\)"):
        run_graph(ta.concat())


def test_map_fn_over_an_empty_batch_keeps_the_rank_of_unknown_outputs(compiled, run_graph):
    # fn's output is a vector of a data-dependent length: the static shape is [?, ?]
    n = dcf.placeholder(dcf.int32, (None,))
    out = dcf.map_fn(lambda k: dcf.ones(dcf.reshape(k, [1])), n)
    assert out.shape == (None, None)
    rows = dcf.reduce_sum(out, axis=1)
    got, got_rows = run_graph([out, rows], {n: np.zeros(0, np.int32)}, config=compiled)
    assert got.shape == (0, 0) and got_rows.shape == (0,)


# ------------------------------------------------------------------ gather / scatter indices
@pytest.mark.parametrize("indices", [1, [[0, 1], [1, 0]]])
def test_gather_and_scatter_take_a_vector_of_indices(indices):
    ta = dcf.TensorArray(dcf.float32, size=2, name="arr").unstack([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(ValueError, match=r"TensorArray 'arr' \(gather\): indices must be a "
                                         r"vector, got shape \[.*\]"):
        ta.gather(indices)
    with pytest.raises(ValueError, match=r"TensorArray 'arr' \(scatter\): indices must be a "
                                         r"vector"):
        ta.scatter(indices, [[5.0, 6.0]])


def test_gather_with_indices_of_unknown_rank_checks_them_at_run_time(run_graph):
    p = dcf.placeholder(dcf.int32)
    ta = dcf.TensorArray(dcf.float32, size=2, name="arr").unstack([1.0, 2.0])
    with pytest.raises(InvalidArgumentError, match=r"TensorArrayGatherV3 'TensorArrayGather': "
                                                   r"gather with indices of shape \[\] in "
                                                   r"TensorArray 'arr' .*: indices must be a "
                                                   r"vector"):
        run_graph(ta.gather(p), {p: 1})


# ------------------------------------------------------------------ TF1's functional arguments
# (these need /tmp/review5/patches/tarray-1.patch, dcf/functional.py)
def test_map_fn_takes_tf1s_parallel_iterations_none_and_infer_shape(compiled, run_graph):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    doubled = dcf.map_fn(lambda r: r * 2.0, x, parallel_iterations=None)
    heads = dcf.map_fn(lambda r: r[:2], x, infer_shape=False, dtype=dcf.float32)
    heads_inferred = dcf.map_fn(lambda r: r[:2], x, infer_shape=False)
    got = run_graph([doubled, heads, heads_inferred], config=compiled)
    np.testing.assert_array_equal(got[0], x * 2)
    np.testing.assert_array_equal(got[1], x[:, :2])
    np.testing.assert_array_equal(got[2], x[:, :2])


def test_map_fn_with_infer_shape_false_stacks_outputs_only_when_alike(run_graph):
    n = dcf.placeholder(dcf.int32, (None,))
    out = dcf.map_fn(lambda k: dcf.ones(dcf.reshape(k, [1])), n, infer_shape=False)
    np.testing.assert_array_equal(run_graph(out, {n: [2, 2]}), np.ones((2, 2)))
    with pytest.raises(InvalidArgumentError, match=r"stack of elements of different shapes "
                                                   r"\(index 0: \[1\], index 1: \[2\]\)"):
        run_graph(out, {n: [1, 2]})


def test_scan_takes_tf1s_infer_shape_and_reverse_in_tf1s_order(compiled, run_graph):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    fwd = dcf.scan(lambda a, e: a + e, x, None, 10, True, False, False)   # infer_shape=False
    rev = dcf.scan(lambda a, e: a + e, x, None, 10, True, False, True, True)  # reverse=True
    got_fwd, got_rev = run_graph([fwd, rev], config=compiled)
    np.testing.assert_array_equal(got_fwd, np.cumsum(x, 0))
    np.testing.assert_array_equal(got_rev, np.cumsum(x[::-1], 0)[::-1])
