"""TensorArray: every method against numpy, as a loop variable and through cond, and
its runtime errors with messages pinned (array name, op, index; frame and iteration
inside loops)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dcf
from dcf.errors import InvalidArgumentError, OutOfRangeError

SETTINGS = settings(max_examples=8, deadline=None)


def _loop_over(n, body, ta, name="loop"):
    """while i < n: ta = body(i, ta); returns the final TensorArray."""
    return dcf.while_loop(lambda i, t: i < n, lambda i, t: (i + 1, body(i, t)), (0, ta), name=name)[
        1
    ]


# --------------------------------------------------------------------- methods
def test_write_read_size_stack(compiled, run_graph):
    ta = dcf.TensorArray(dcf.float32, size=3, clear_after_read=False, name="arr")
    ta = ta.write(0, [1.0, 2.0]).write(2, [5.0, 6.0]).write(1, [3.0, 4.0])
    r1, size = ta.read(1), ta.size()
    got = run_graph([r1, size, ta.stack()], config=compiled)
    np.testing.assert_array_equal(got[0], [3.0, 4.0])
    assert got[1] == 3
    np.testing.assert_array_equal(got[2], [[1, 2], [3, 4], [5, 6]])
    assert ta.stack().shape == (3, 2)  # a fixed size known at build time, as TF



def test_gather_and_concat_static_shapes_as_tf(compiled, run_graph):
    # a gather's first dimension is its indices' length, a concat's the fixed size times
    # the element's first dimension (TF1's static shapes); a gather was [?, 3], so a loop
    # var entering as [2, 3] and set to a gather raised "[2,3] when it enters the loop but
    # [?,3] after one iteration"
    xs = np.arange(12.0).reshape(4, 3)
    ta = dcf.TensorArray(dcf.float64, size=4, clear_after_read=False).unstack(xs)
    assert ta.gather([1, 2]).shape == (2, 3)
    assert ta.concat().shape == (12,)
    parts = dcf.TensorArray(dcf.float64, size=2, element_shape=[None, 3]).unstack(
        np.zeros((2, 2, 3)))
    assert parts.concat().shape == (4, 3)
    ragged = dcf.TensorArray(dcf.float64, size=2, element_shape=[None, 3], infer_shape=False)
    assert ragged.unstack(np.zeros((2, 2, 3))).concat().shape == (None, 3)
    out = dcf.while_loop(lambda i, a: i < 3,
                         lambda i, a: (i + 1, ta.gather(dcf.stack([i, i + 1])) * 2.0),
                         (0, np.zeros((2, 3))))[1]
    assert out.shape == (2, 3)
    np.testing.assert_array_equal(run_graph(out, config=compiled), xs[2:4] * 2.0)

@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data())
@SETTINGS
def test_unstack_gather_scatter_match_numpy(shape, data):
    dcf.reset_default_graph()
    rng = np.random.default_rng(len(shape))
    value = rng.standard_normal(shape).astype(np.float32)
    n = shape[0]
    perm = data.draw(st.permutations(range(n)))
    idx = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n))
    unstacked = dcf.TensorArray(dcf.float32, size=n, clear_after_read=False).unstack(value)
    scattered = dcf.TensorArray(dcf.float32, size=n).scatter(np.asarray(perm, np.int32), value)
    with dcf.Session() as sess:
        stacked, gathered, back = sess.run(
            [unstacked.stack(), unstacked.gather(idx), scattered.stack()]
        )
    np.testing.assert_array_equal(stacked, value)
    np.testing.assert_array_equal(gathered, value[idx])
    want = np.empty_like(value)
    want[perm] = value
    np.testing.assert_array_equal(back, want)


@given(first_dims=st.lists(st.integers(0, 4), min_size=1, max_size=5), width=st.integers(1, 3))
@SETTINGS
def test_concat_joins_elements_of_different_first_dims(first_dims, width):
    dcf.reset_default_graph()
    parts = [np.full((d, width), k, np.float32) for k, d in enumerate(first_dims)]
    ta = dcf.TensorArray(dcf.float32, size=len(parts), infer_shape=False)
    for k, p in enumerate(parts):
        ta = ta.write(k, p)
    with dcf.Session() as sess:
        got = sess.run(ta.concat())
    np.testing.assert_array_equal(got, np.concatenate(parts))


def test_concat_in_a_loop_with_data_dependent_lengths(compiled, run_graph):
    n = dcf.placeholder(dcf.int32, ())
    ta = dcf.TensorArray(dcf.int32, size=n, infer_shape=False, name="pieces")
    ta = _loop_over(n, lambda i, t: t.write(i, dcf.fill([i + 1], i)), ta)
    got = run_graph(ta.concat(), {n: 4}, config=compiled)
    np.testing.assert_array_equal(got, [0, 1, 1, 2, 2, 2, 3, 3, 3, 3])


def test_dynamic_size_grows_on_write(compiled, run_graph):
    ta = dcf.TensorArray(dcf.float32, size=0, dynamic_size=True, name="grow")
    ta = ta.write(4, 1.5)
    n = dcf.placeholder(dcf.int32, ())
    looped = _loop_over(
        n,
        lambda i, t: t.write(i, dcf.cast(i, dcf.float32) * 2.0),
        dcf.TensorArray(dcf.float32, size=1, dynamic_size=True),
    )
    size, read, lsize, stacked = run_graph(
        [ta.size(), ta.read(4), looped.size(), looped.stack()], {n: 6}, config=compiled
    )
    assert (size, read, lsize) == (5, 1.5, 6)
    np.testing.assert_array_equal(stacked, [0, 2, 4, 6, 8, 10])


def test_clear_after_read(run_graph):
    ta = dcf.TensorArray(dcf.float32, size=1, name="once").write(0, 1.0)
    with pytest.raises(
        InvalidArgumentError,
        match=r"TensorArrayReadV3 'second': read of index 0 from TensorArray "
        r"'once' .* already read and cleared",
    ):
        run_graph(ta.read(0) + ta.read(0, name="second"))
    keep = dcf.TensorArray(dcf.float32, size=1, clear_after_read=False).write(0, 2.0)
    assert run_graph(keep.read(0) + keep.read(0)) == 4.0


def test_empty_stack_has_the_element_shape(run_graph):
    ta = dcf.TensorArray(dcf.float32, size=0, element_shape=(2, 3))
    assert run_graph(ta.stack()).shape == (0, 2, 3)


# ---------------------------------------------------------------- loop variables
def test_tensor_array_as_loop_variable_collects_every_iteration(compiled, run_graph):
    xs = np.arange(12, dtype=np.float64).reshape(4, 3)
    elems = dcf.TensorArray(dcf.float64, size=4, name="elems").unstack(xs)
    out = dcf.TensorArray(dcf.float64, size=4, name="out")

    def body(i, acc, ta):
        acc = acc + elems.read(i)
        return i + 1, acc, ta.write(i, acc)

    _, final, out = dcf.while_loop(lambda i, a, t: i < 4, body, (0, np.zeros(3), out))
    got_final, got = run_graph([final, out.stack()], config=compiled)
    np.testing.assert_array_equal(got, np.cumsum(xs, axis=0))
    np.testing.assert_array_equal(got_final, xs.sum(0))


def test_nested_loops_write_one_array_each(compiled, run_graph):
    def outer(i, ta):
        inner = _loop_over(
            i + 1,
            lambda j, t: t.write(j, i * 10 + j),
            dcf.TensorArray(dcf.int32, size=i + 1),
            name="inner",
        )
        return ta.write(i, dcf.reduce_sum(inner.stack()))

    ta = _loop_over(4, outer, dcf.TensorArray(dcf.int32, size=4), name="outer")
    got = run_graph(ta.stack(), config=compiled)
    want = [sum(i * 10 + j for j in range(i + 1)) for i in range(4)]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("pred", [True, False])
def test_cond_returns_the_taken_branchs_tensor_array(pred, compiled, run_graph):
    p = dcf.placeholder(dcf.bool, ())
    ta = dcf.TensorArray(dcf.float32, size=2).write(0, 1.0)
    ta = dcf.cond(p, lambda: ta.write(1, 10.0), lambda: ta.write(1, -10.0))
    assert run_graph(ta.stack(), {p: pred}, config=compiled).tolist() == [
        1.0,
        10.0 if pred else -10.0,
    ]


def test_cond_with_a_tensor_array_in_one_branch_only_is_a_type_error():
    ta = dcf.TensorArray(dcf.float32, size=1)
    with pytest.raises(
        TypeError,
        match=r"true_fn returned a TensorArray, false_fn returned "
        r"float32\[\]",
    ):
        dcf.cond(dcf.constant(True), lambda: ta.write(0, 1.0), lambda: dcf.constant(1.0))


# ---------------------------------------------------------------------- errors
def test_writing_an_index_twice_names_array_op_and_index(run_graph):
    ta = dcf.TensorArray(dcf.float32, size=3, name="acc")
    ta = ta.write(1, 1.0).write(1, 2.0, name="again")
    with pytest.raises(
        InvalidArgumentError,
        match=r"TensorArrayWriteV3 'again': index 1 of TensorArray 'acc' "
        r"\(size 3, dynamic_size=False\) was already written",
    ):
        run_graph(ta.stack())


def test_reading_an_unwritten_index_names_array_op_and_index(run_graph):
    ta = dcf.TensorArray(dcf.float32, size=3, name="acc").write(0, 1.0)
    with pytest.raises(
        InvalidArgumentError,
        match=r"TensorArrayReadV3 'peek': read of index 2 from TensorArray "
        r"'acc' .* never written",
    ):
        run_graph(ta.read(2, name="peek"))


@pytest.mark.parametrize("index", [3, 7, -1])
def test_index_out_of_range_of_a_fixed_size_array(index, run_graph):
    ta = dcf.TensorArray(dcf.float32, size=3, name="fixed")
    with pytest.raises(
        OutOfRangeError,
        match=rf"TensorArrayWriteV3 'w': write of (negative )?index {index} "
        rf"(to|in) TensorArray 'fixed' \(size 3, dynamic_size=False\)",
    ):
        run_graph(ta.write(index, 1.0, name="w").stack())
    with pytest.raises(
        OutOfRangeError,
        match=rf"TensorArrayReadV3 'r': read of (negative )?index {index} "
        rf"(from|in) TensorArray 'fixed'",
    ):
        run_graph(ta.read(index, name="r"))


def test_writing_a_wrong_dtype_names_array_and_both_dtypes():
    ta = dcf.TensorArray(dcf.float32, size=2, name="floats")
    with pytest.raises(TypeError, match=r"TensorArray 'floats' holds float32, cannot write int32"):
        ta.write(0, dcf.constant(1, dcf.int32))


def test_writing_a_wrong_dtype_names_the_write_and_its_index():
    ta = dcf.TensorArray(dcf.float32, size=2, name="floats")
    with pytest.raises(TypeError, match=r"TensorArray 'floats'.*write.*index 1"):
        ta.write(1, dcf.constant(1, dcf.int32))


def test_writing_a_wrong_static_shape_is_a_build_error():
    ta = dcf.TensorArray(dcf.float32, size=2, name="rows").write(0, [1.0, 2.0])
    with pytest.raises(
        InvalidArgumentError,
        match=r"TensorArray 'rows': write of shape \[3\] "
        r"does not match its element shape \[2\]",
    ):
        ta.write(1, [1.0, 2.0, 3.0])


def test_writing_a_wrong_runtime_shape_names_array_and_index(run_graph):
    x = dcf.placeholder(dcf.float32, (None,))
    ta = dcf.TensorArray(dcf.float32, size=2, name="rows").write(0, x).write(1, x[1:], name="short")
    with pytest.raises(
        InvalidArgumentError,
        match=r"TensorArrayWriteV3 'short': write of shape \[1\] to index 1 of "
        r"TensorArray 'rows' .* elements have shape \[2\]",
    ):
        run_graph(ta.stack(), {x: [1.0, 2.0]})


def test_errors_inside_a_loop_name_frame_and_iteration(compiled, run_graph):
    n = dcf.placeholder(dcf.int32, ())
    twice = _loop_over(
        3,
        lambda i, t: t.write(dcf.minimum(i, 1), 1.0),
        dcf.TensorArray(dcf.float32, size=3, name="acc"),
        name="dup",
    )
    with pytest.raises(
        InvalidArgumentError,
        match=r"TensorArrayWriteV3 'dup/TensorArrayWrite', frame 'dup' "
        r"iteration 2: index 1 of TensorArray 'acc' .* already written",
    ):
        run_graph(twice.stack(), config=compiled)
    over = _loop_over(
        n,
        lambda i, t: t.write(i, 1.0),
        dcf.TensorArray(dcf.float32, size=3, name="acc3"),
        name="over",
    )
    with pytest.raises(
        OutOfRangeError,
        match=r"TensorArrayWriteV3 'over/TensorArrayWrite', frame 'over' "
        r"iteration 3: write of index 3 to TensorArray 'acc3'",
    ):
        run_graph(over.stack(), {n: 5}, config=compiled)
    src = dcf.TensorArray(dcf.float32, size=4, name="src").write(0, 1.0).write(1, 1.0)
    total = dcf.while_loop(
        lambda i, s: i < 4, lambda i, s: (i + 1, s + src.read(i)), (0, 0.0), name="sum"
    )[1]
    with pytest.raises(
        InvalidArgumentError,
        match=r"TensorArrayReadV3 'sum/TensorArrayRead', frame 'sum' "
        r"iteration 2: read of index 2 from TensorArray 'src' .* never "
        r"written",
    ):
        run_graph(total, config=compiled)


def test_errors_in_a_nested_loop_name_the_inner_frame_and_its_iteration(compiled, run_graph):
    def outer(i, ta):  # the inner loop runs i + 1 times: only outer iteration 2 overflows
        inner = _loop_over(
            i + 1,
            lambda j, t: t.write(j, 1.0),
            dcf.TensorArray(dcf.float32, size=2, name="row"),
            name="inner",
        )
        return ta.write(i, inner.read(0))

    ta = _loop_over(3, outer, dcf.TensorArray(dcf.float32, size=3), name="outer")
    with pytest.raises(
        OutOfRangeError,
        match=r"TensorArrayWriteV3 'outer/inner/TensorArrayWrite', frame "
        r"'outer/inner' iteration 2, inside frame 'outer' iteration 2: write of index 2 "
        r"to TensorArray "
        r"'outer/row' \(size 2, dynamic_size=False\)",
    ):
        run_graph(ta.stack(), config=compiled)


# ------------------------------------------------------ unstack: all rows at once
def _store(n, **kw):
    from dcf.ops.data_ops import TensorArrayStore

    args = dict(dynamic_size=False, clear_after_read=False, element_shape=None, infer_shape=True)
    args.update(kw)
    return TensorArrayStore("arr", dcf.float32, n, **args)


@pytest.mark.parametrize("layout", ["c", "transposed", "strided"])
def test_unstack_places_row_views_that_read_back_as_numpy_rows(layout):
    from dcf.ops.data_ops import _rows

    base = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(6, 4, 5)
    v = {"c": base[:3], "transposed": base[:3].transpose(0, 2, 1), "strided": base[::2]}[layout]
    rows = _rows(v)
    assert [r.shape for r in rows] == [v.shape[1:]] * 3
    for k, r in enumerate(rows):
        np.testing.assert_array_equal(r, v[k])
    s = _store(3)
    s.unstack(v)
    for k in range(3):
        np.testing.assert_array_equal(s.read(k), v[k])
    assert s.element_shape == v.shape[1:]


def test_unstack_of_a_wrong_dtype_or_shape_names_the_array():
    s = _store(2, element_shape=(3,))
    with pytest.raises(InvalidArgumentError, match="float64 value to index 0 of TensorArray 'arr'"):
        s.unstack(np.zeros((2, 3)))
    with pytest.raises(InvalidArgumentError, match=r"shape \[4\] to index 0 of TensorArray 'arr'"):
        s.unstack(np.zeros((2, 4), np.float32))
    assert s.elements == [None, None]


def test_unstack_into_an_array_with_a_written_element_checks_each_row():
    s = _store(3)
    s.write(1, np.ones(2, np.float32))
    with pytest.raises(InvalidArgumentError, match=r"index 1 of TensorArray 'arr' \(size 3.*was already written"):
        s.unstack(np.zeros((3, 2), np.float32))


def test_unstack_accumulate_adds_to_written_rows_and_fills_empty_ones():
    v = np.arange(6, dtype=np.float32).reshape(3, 2)
    empty = _store(3)
    empty.unstack(v, np.arange(3), accumulate=True)          # all rows at once
    np.testing.assert_array_equal(np.stack([empty.read(k) for k in range(3)]), v)
    part = _store(3)
    part.write(2, np.full(2, 10, np.float32))
    part.unstack(v, np.arange(3), accumulate=True)           # row by row
    np.testing.assert_array_equal(part.read(2), v[2] + 10)
    np.testing.assert_array_equal(part.read(0), v[0])
    other = _store(3)
    other.unstack(v, np.array([2, 0, 1]), accumulate=True)   # not 0..n-1: row by row
    np.testing.assert_array_equal(other.read(2), v[0])
    np.testing.assert_array_equal(other.read(1), v[2])


def test_accumulating_rows_to_too_few_or_too_many_indices_names_the_array():
    """ScatterAccumulate (the gradient of a gather) and scatter share one path: a row count
    that does not match the indices is an error naming the array, accumulating or not,
    with nothing written."""
    v = np.ones((3, 2), np.float32)
    for idx in (np.array([0, 1]), np.array([0, 1, 2, 0])):
        for acc in (True, False):
            s = _store(4)
            with pytest.raises(InvalidArgumentError,
                               match=rf"scatter of 3 rows to {len(idx)} indices of TensorArray 'arr'"):
                s.unstack(v, idx, accumulate=acc)
            assert s.elements == [None] * 4
    s = _store(2)
    s.write(0, np.ones(2, np.float32))
    s.scatter(np.array([0, 0]), np.stack([np.full(2, 2, np.float32)] * 2), accumulate=True)
    np.testing.assert_array_equal(s.read(0), np.full(2, 5, np.float32))


def test_unstack_of_fewer_rows_than_elements_leaves_the_rest_unwritten():
    s = _store(3)
    s.unstack(np.ones((2, 2), np.float32))
    assert s.elements[2] is None
    with pytest.raises(OutOfRangeError, match="write of index 3 to TensorArray 'arr'"):
        _store(3).unstack(np.ones((4, 2), np.float32))


def test_unstack_of_a_scalar_names_the_array(run_graph):
    ta = dcf.TensorArray(dcf.float32, size=1, name="arr")
    with pytest.raises(InvalidArgumentError, match="unstack of a scalar into TensorArray 'arr'"):
        run_graph(ta.unstack(dcf.constant(1.0)).read(0))


@pytest.mark.parametrize("clear", [True, False])
def test_stack_of_a_full_array_equals_numpy_and_clears_as_reads_would(clear):
    v = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    s = _store(3, clear_after_read=clear)
    s.unstack(v)
    np.testing.assert_array_equal(s.stack(), v)
    if clear:
        with pytest.raises(InvalidArgumentError, match="index 0 .* already read and cleared"):
            s.read(0)
    else:
        np.testing.assert_array_equal(s.stack(), v)
    part = _store(3, clear_after_read=clear)        # an unwritten element: the read's error
    part.write(0, v[0])
    with pytest.raises(InvalidArgumentError, match="read of index 1 .* never written"):
        part.stack()
