"""Static shapes from a review by use (a fuzzer of random graphs checking every kernel's
value against its op's static shape and dtype, and the static shapes against TF1's):
kernels that numpy would let give another rank than inferred, negative sizes that built
a graph with negative static dimensions, and loops whose static shapes claimed more than
the values had."""
import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError


def _run(fetch, feeds):
    with dcf.Session(fetch.graph) as s:
        return s.run(fetch, feeds)


@pytest.mark.parametrize("build, value, what", [
    # numpy's tile prepends axes for extra multiples and the value's axes for missing ones
    (lambda x: dcf.tile(x, [2, 2]), np.ones(2, np.float32), "multiples"),
    (lambda x: dcf.tile(x, [2]), np.ones((2, 2), np.float32), "multiples"),
    # the pad and slice kernels zipped their rows with the value's axes, dropping the rest
    (lambda x: dcf.pad(x, [[1, 1], [0, 0]]), np.ones(3, np.float32), "paddings"),
    (lambda x: dcf.slice(x, [0, 0], [1, 1]), np.ones((2, 2, 2), np.float32), "begin"),
    (lambda x: dcf.slice(x, [0, 0], [1, 1]), np.ones(2, np.float32), "begin"),
    # numpy's matmul takes a vector as one row or column
    (lambda x: dcf.matmul(x, dcf.ones([2, 2])), np.ones(2, np.float32), "rank >= 2"),
])
def test_a_value_of_another_rank_than_the_ops_arguments_is_an_error(build, value, what):
    # (static [?,?] for tile(x, [2, 2]) but a value of shape (2, 4) before)
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, None)
        y = build(x)
    with pytest.raises(InvalidArgumentError, match=f"'{y.op.name}'.*{what}"):
        _run(y, {x: value})


def test_dynamic_arguments_are_checked_against_the_rank_too():
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, [None])
        m = dcf.placeholder(dcf.int32, [None])
        p = dcf.placeholder(dcf.int32, [None, 2])
        t, q = dcf.tile(x, m), dcf.pad(x, p)
    assert t.shape == (None,) and q.shape == (None,)
    with pytest.raises(InvalidArgumentError, match="Tile.*multiples has 2 entries"):
        _run(t, {x: np.ones(2, np.float32), m: [2, 2]})
    with pytest.raises(InvalidArgumentError, match="Pad.*paddings has 2 entries"):
        _run(q, {x: np.ones(2, np.float32), p: [[1, 1], [1, 1]]})
    np.testing.assert_array_equal(_run(t, {x: [1.0, 2.0], m: [2]}), [1, 2, 1, 2])


@pytest.mark.parametrize("build, message", [
    (lambda x, i: dcf.one_hot(i, -1), "OneHot 'OneHot'.*depth must not be negative"),
    (lambda x, i: dcf.tile(x, [1, -1]), "Tile 'Tile'.*negative multiple"),
    (lambda x, i: dcf.split(x, [-2, 5], axis=1), "SplitV 'SplitV'.*negative size"),
    (lambda x, i: dcf.split(x, 0, axis=1), "SplitV 'SplitV'.*0 parts"),
    (lambda x, i: dcf.unsorted_segment_sum(x, i, -2),
     "UnsortedSegmentSum 'UnsortedSegmentSum'.*num_segments must not be negative"),
    (lambda x, i: dcf.broadcast_to(x[0, 0], [-2]), "BroadcastTo 'BroadcastTo'.*negative"),
    (lambda x, i: dcf.scatter_nd([[0]], [1.0], [-3]), "ScatterNd 'ScatterNd'.*negative"),
])
def test_negative_sizes_are_build_time_errors(build, message):
    # (they built ops with negative static dimensions, e.g. one_hot(i, -1) as [2,-1], whose
    # values had 0 there or failed at run time; split(x, 0) was a ZeroDivisionError)
    g = dcf.Graph()
    with g.as_default():
        x = dcf.constant(np.ones((2, 3), np.float32))
        i = dcf.constant([0, 1])
        with pytest.raises(InvalidArgumentError, match=message):
            build(x, i)


def test_one_hot_with_a_negative_depth_known_at_run_time_is_an_error():
    g = dcf.Graph()
    with g.as_default():
        d = dcf.placeholder(dcf.int32, [])
        h = dcf.one_hot(dcf.constant([0, 1]), d)
    with pytest.raises(InvalidArgumentError, match="OneHot.*depth must not be negative"):
        _run(h, {d: -1})
    assert _run(h, {d: 3}).shape == (2, 3)


def test_a_shape_invariant_of_known_rank_for_a_var_of_unknown_rank_is_an_error():
    # as TF1's; the loop's static rank was the invariant's (3) whatever the value's (2)
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, None)
        with pytest.raises(ValueError, match="while_loop 'w': the shape invariant .* of loop "
                                             "var 0 .* unknown rank"):
            dcf.while_loop(lambda y: dcf.reduce_sum(y) < 10, lambda y: y * 2, [x],
                           shape_invariants=[[None, None, None]], name="w")
        y = dcf.while_loop(lambda y: dcf.reduce_sum(y) < 10, lambda y: y * 2, [x],
                           shape_invariants=[None])
    assert y.shape is None
    assert _run(y, {x: np.ones((4, 1), np.float32)}).shape == (4, 1)


def test_gradient_of_a_loop_var_whose_shape_changes_has_the_inputs_shape():
    # the gradient loop took the static shape of the gradient of the loop's output ([1])
    # for every iteration: the gradient of the scalar x claimed shape [?], and adding the
    # gradient of x's other use failed to build ("AddN: inputs differ in shape")
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, [])
        _, y = dcf.while_loop(lambda i, y: i < 2, lambda i, y: (i + 1, dcf.expand_dims(y, 0)),
                              [0, x], shape_invariants=[(), None])
        z = dcf.slice(y, [0, 0], [1, 1])       # static [1, 1], the value's shape
        (gx,) = dcf.gradients(dcf.reduce_sum(z) * 3.0 + x, [x])
    assert gx.shape == ()
    assert _run(gx, {x: 2.0}) == 4.0  # d/dx (3x + x)


def test_gradient_of_a_loop_var_of_unknown_rank_whose_shape_changes():
    # no invariant is needed (the var enters with an unknown shape); the gradient loop
    # still took the last iteration's shape ([?] here) for the scalar x's gradient
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, None)
        _, y = dcf.while_loop(lambda i, y: i < 1, lambda i, y: (i + 1, dcf.expand_dims(y, 0)),
                              [0, x])
        b = dcf.placeholder(dcf.float32, [None])
        z = dcf.add_n([y, b])                   # static [?]: its gradient's too
        (gx,) = dcf.gradients(dcf.reduce_sum(z) * 3.0, [x])
    assert gx.shape is None or gx.shape == ()
    assert _run(gx, {x: 2.0, b: [0.0]}) == 3.0
