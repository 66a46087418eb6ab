"""Review 9, op-by-op against TF1: values, static shapes and gradients where dcf differed
(each expected value checked against tf.compat.v1 in graph mode)."""

import numpy as np
import pytest

import dcf


def _run(fetches, feed=None, graph=None):
    with dcf.Session(graph) as sess:
        return sess.run(fetches, feed)


def test_reshape_of_an_empty_batch_with_minus_one_as_tf1():
    # flattening a batch that happens to be empty: TF1 gives [0, 12]; numpy's reshape
    # (0 into (0, -1)) raised "cannot reshape array of size 0"
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, [None, 3, 4])
        flat = dcf.reshape(x, [dcf.shape(x)[0], -1])
        static = dcf.reshape(x, [0, -1])
        loss = dcf.reduce_sum(dcf.matmul(flat, dcf.ones([12, 2])))
        (gx,) = dcf.gradients(loss, [x])
        c = dcf.zeros([0, 4])
        consts = [dcf.reshape(c, s) for s in ([0, -1], [-1, 0], [2, -1, 0], [-1, 2])]
    assert static.shape == (0, None)
    # TF1's rule: the product of the input's nonzero dimensions over the target's
    assert [t.shape for t in consts] == [(0, 4), (4, 0), (2, 2, 0), (0, 2)]
    empty = np.zeros((0, 3, 4), np.float32)
    fv, sv, gv, cv = _run([flat, static, gx, consts], {x: empty}, g)
    assert fv.shape == (0, 12) and sv.shape == (0, 12) and gv.shape == (0, 3, 4)
    assert [v.shape for v in cv] == [(0, 4), (4, 0), (2, 2, 0), (0, 2)]
    # a batch that is not empty still cannot go into [0, -1]
    with pytest.raises(dcf.errors.InvalidArgumentError, match="Reshape 'Reshape_1'"):
        _run(static, {x: np.zeros((1, 3, 4), np.float32)}, g)


def test_integer_mean_of_no_elements_is_zero_as_tf1():
    # TF1 gives 0; numpy's 0 / 0 cast to int32 was -2147483648 (and warned)
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.int32, [None, 3])
        y = dcf.placeholder(dcf.int64, [None])
        outs = [dcf.reduce_mean(x), dcf.reduce_mean(x, axis=0),
                dcf.reduce_mean(x, axis=0, keepdims=True), dcf.reduce_mean(y)]
    feed = {x: np.zeros((0, 3), np.int32), y: np.zeros((0,), np.int64)}
    all_, cols, kept, v = _run(outs, feed, g)
    assert all_ == 0 and all_.dtype == np.int32 and np.ndim(all_) == 0
    np.testing.assert_array_equal(cols, np.zeros(3, np.int32))
    assert cols.dtype == np.int32
    np.testing.assert_array_equal(kept, np.zeros((1, 3), np.int32))
    assert v == 0 and v.dtype == np.int64
    # non-empty integer means still truncate toward 0
    assert _run(dcf.reduce_mean(dcf.constant([-3, -4]))) == -3


def test_float16_sigmoid_of_very_negative_inputs_as_tf1():
    # exp(12) overflows float16, so 1 / (1 + exp(-x)) was 0 for x < -11.1 (and its
    # gradient too) where TF1 gives sigmoid's value rounded to float16: 6.14e-06 at -12
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float16, [None])
        s = dcf.placeholder(dcf.float16, [])
        y = dcf.sigmoid(x)
        (dx,) = dcf.gradients(y, [x])
        ys = dcf.sigmoid(s)
    xv = np.array([-17.0, -14.0, -12.0, -11.5, -3.0, 0.0, 4.0, 12.0], np.float16)
    yv, dxv, ysv = _run([y, dx, ys], {x: xv, s: np.float16(-12.0)}, g)
    ref = 1 / (1 + np.exp(-xv.astype(np.float64)))
    assert yv.dtype == np.float16 and dxv.dtype == np.float16
    # within half a float16 ulp (6e-08 among the subnormals below 6.1e-05)
    np.testing.assert_allclose(yv, ref, rtol=1e-3, atol=3e-8)
    # (for x > 0, y * (1 - y) keeps float16's rounding of y near 1, in TF1 as here)
    np.testing.assert_allclose(dxv[:5], (ref * (1 - ref))[:5], rtol=3e-3, atol=6e-8)
    assert ysv.dtype == np.float16 and np.ndim(ysv) == 0
    np.testing.assert_allclose(ysv, ref[2], rtol=2e-3)


@pytest.mark.parametrize("labels, logits", [
    (np.array([1], np.int32), np.zeros((2, 4), np.float32)),       # one label, two rows
    (np.array(1, np.int32), np.zeros((2, 4), np.float32)),         # a scalar label
    (np.array([[1]], np.int32), np.zeros((2, 4), np.float32)),     # labels of another rank
    (np.array([1, 2], np.int32), np.zeros((2, 1, 4), np.float32)),
    (np.array([1, 0, 2], np.int32), np.zeros((2, 4), np.float32)),
])
def test_sparse_cross_entropy_refuses_labels_of_another_shape_at_run_time(labels, logits):
    # shapes unknown when the graph is built: TF1's kernel refuses labels that are not
    # logits.shape[:-1]; numpy's fancy indexing broadcast them (a loss per row from one
    # label, a gradient that did not match that loss, or a [1, 2] loss for [1, 1] labels)
    g = dcf.Graph()
    with g.as_default():
        lab = dcf.placeholder(dcf.int32, None)
        lg = dcf.placeholder(dcf.float32, None)
        loss = dcf.nn.sparse_softmax_cross_entropy_with_logits(labels=lab, logits=lg)
    with pytest.raises(dcf.errors.InvalidArgumentError,
                       match=r"SparseSoftmaxCrossEntropyWithLogits '.*': labels of shape "):
        _run(loss, {lab: labels, lg: logits}, g)


def _grad_case(build, feeds):
    """Runs build(*placeholders of unknown shape) and the gradient of its square's sum."""
    g = dcf.Graph()
    with g.as_default():
        phs = [dcf.placeholder(dcf.as_dtype(np.asarray(v).dtype), None) for v in feeds]
        y = build(*phs)
        grads = dcf.gradients(dcf.reduce_sum(y * y), [p for p in phs if p.dtype.is_floating])
    return g, [y] + grads, dict(zip(phs, feeds))


@pytest.mark.parametrize("what, build, feeds", [
    # shapes that static inference refuses, fed at run time: numpy broadcast them, so
    # the op ran and the gradient of an input had the shape of the broadcast (here
    # [2, 3] for updates of [1, 3], [3, 2] for data of [1, 2])
    ("ScatterNd", lambda i, u: dcf.scatter_nd(i, u, [4, 3]),
     [np.array([[1], [2]], np.int32), np.ones((1, 3), np.float32)]),
    ("ScatterNd", lambda i, u: dcf.scatter_nd(i, u, [4, 3]),
     [np.array([[1], [2]], np.int32), np.float32(1)]),
    ("UnsortedSegmentSum", lambda d, s: dcf.unsorted_segment_sum(d, s, 3),
     [np.ones((1, 2), np.float32), np.array([0, 1, 1], np.int32)]),
    ("UnsortedSegmentSum", lambda d, s: dcf.unsorted_segment_sum(d, s, 3),
     [np.ones((3,), np.float32), np.array([[0, 1, 1], [0, 0, 2]], np.int32)]),
])
def test_scatter_nd_and_segment_sum_refuse_broadcasting_at_run_time(what, build, feeds):
    # TF1's kernels refuse these shapes (scatter_nd: updates of indices.shape[:-1] +
    # shape[depth:]; unsorted_segment_sum: ids a prefix of data's shape)
    g, fetches, feed = _grad_case(build, feeds)
    with pytest.raises(dcf.errors.InvalidArgumentError, match=f"{what} '{what}'"):
        _run(fetches, feed, g)


@pytest.mark.parametrize("feeds", [
    [np.ones((2, 3), np.float32), np.ones((3,), np.float32)],
    [np.ones((3,), np.float32), np.ones((2, 3), np.float32), np.ones((2, 3), np.float32)],
])
def test_add_n_refuses_inputs_of_another_shape_at_run_time(feeds):
    # shapes static inference refuses, fed at run time: numpy broadcast them, so the sum
    # had the broadcast's shape and so did the gradient of the [3] input (its gradient
    # is the sum's); TF1's AddN kernel refuses inputs of different shapes
    g, fetches, feed = _grad_case(lambda *xs: dcf.add_n(list(xs)), feeds)
    with pytest.raises(dcf.errors.InvalidArgumentError, match="AddN 'AddN'"):
        _run(fetches, feed, g)


def test_scatter_nd_segment_sum_and_add_n_of_matching_shapes_still_run():
    for build, feeds in [
        (lambda i, u: dcf.scatter_nd(i, u, [4, 3]),
         [np.array([[1], [1]], np.int32), np.ones((2, 3), np.float32)]),
        (lambda i, u: dcf.scatter_nd(i, u, [4, 3]),
         [np.array([[1, 2], [3, 0]], np.int32), np.ones((2,), np.float32)]),
        (lambda d, s: dcf.unsorted_segment_sum(d, s, 3),
         [np.ones((3, 2), np.float32), np.array([0, 2, 2], np.int32)]),
        (lambda a, b: dcf.add_n([a, b]), [np.ones((2, 3), np.float32)] * 2),
    ]:
        g, fetches, feed = _grad_case(build, feeds)
        y, *grads = _run(fetches, feed, g)
        floats = [v for v in feeds if np.asarray(v).dtype.kind == "f"]
        assert [gv.shape for gv in grads] == [np.shape(v) for v in floats]


def test_fill_refuses_a_value_that_is_not_a_scalar_at_run_time():
    # shape inference refuses a vector value; fed at run time np.full broadcast it along
    # the last axis, and the value's gradient (a sum: a scalar) was not of its shape.
    # TF1's Fill kernel refuses it
    g, fetches, feed = _grad_case(lambda v: dcf.fill([2, 3], v), [np.ones(3, np.float32)])
    with pytest.raises(dcf.errors.InvalidArgumentError, match="Fill 'Fill': value must be"):
        _run(fetches, feed, g)
    g, fetches, feed = _grad_case(lambda v: dcf.fill([2, 3], v), [np.float32(2)])
    y, gv = _run(fetches, feed, g)
    np.testing.assert_array_equal(y, np.full((2, 3), 2, np.float32))
    assert gv == 24 and np.ndim(gv) == 0


@pytest.mark.parametrize("depth_known", [True, False])
def test_one_hot_refuses_on_and_off_values_that_are_not_scalars_at_run_time(depth_known):
    # shape inference refuses them; fed at run time, where(hot, on, off) used a vector
    # on_value as one value per class ([[5, 0, 0], [0, 6, 0]]); TF1's OneHot refuses it
    g = dcf.Graph()
    with g.as_default():
        i = dcf.placeholder(dcf.int32, None)
        on = dcf.placeholder(dcf.float32, None)
        d = dcf.placeholder(dcf.int32, [])
        y = dcf.one_hot(i, 3 if depth_known else d, on_value=on, off_value=0.0)
    feed = {i: [0, 1], d: 3}
    with pytest.raises(dcf.errors.InvalidArgumentError, match="OneHot 'OneHot': on_value"):
        _run(y, {**feed, on: np.array([5, 6, 7], np.float32)}, g)
    np.testing.assert_array_equal(_run(y, {**feed, on: np.float32(5)}, g),
                                  [[5, 0, 0], [0, 5, 0]])
