"""nn ops: softmax, log_softmax and the cross-entropy losses against numpy, and gradients."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from dcf import dtypes
from dcf.errors import InvalidArgumentError
from dcf.graph import Graph
from dcf.ops import math_ops as M
from dcf.ops import nn_ops as N
from tests.ops.oracle import check_grads, placeholder, run_op

SETTINGS = settings(max_examples=20, deadline=None)


def _log_softmax(x, axis=-1):
    x = x.astype(np.float64)
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=5), data=st.data())
def test_softmax_and_log_softmax_match_numpy(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dt = data.draw(st.sampled_from([np.float32, np.float64]))
    x = (
        np.random.default_rng(data.draw(st.integers(0, 2**31))).standard_normal(shape) * 30
    ).astype(dt)
    g = Graph()
    with g.as_default():
        px = placeholder(dt, data.draw(st.sampled_from([shape, None])))
        sm, lsm = N.softmax(px, axis), N.log_softmax(px, axis)
    v_sm, v_lsm = run_op([sm, lsm], {px: x})
    want = _log_softmax(x, axis)
    tol = 1e-5 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(v_lsm, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(v_sm, np.exp(want), rtol=tol, atol=tol)
    assert v_sm.dtype == dt


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4)])
def test_softmax_cross_entropy_matches_numpy(shape):
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(shape) * 10).astype(np.float32)
    labels = np.exp(_log_softmax(rng.standard_normal(shape))).astype(np.float32)
    ints = rng.integers(0, shape[-1], size=shape[:-1]).astype(np.int64)
    g = Graph()
    with g.as_default():
        pl, pt = placeholder(dtypes.float32, shape), placeholder(dtypes.float32, shape)
        pi = placeholder(dtypes.int64, shape[:-1])
        dense = N.softmax_cross_entropy_with_logits(labels=pt, logits=pl)
        sparse = N.sparse_softmax_cross_entropy_with_logits(labels=pi, logits=pl)
    assert dense.shape == shape[:-1] and sparse.shape == shape[:-1]
    v_dense, v_sparse = run_op([dense, sparse], {pl: logits, pt: labels, pi: ints})
    lsm = _log_softmax(logits)
    atol = 1e-6 * np.abs(logits).max()  # float32 log-sum-exp minus a logit: absolute error
    np.testing.assert_allclose(v_dense, -(labels * lsm).sum(-1), rtol=1e-5, atol=atol)
    want = -np.take_along_axis(lsm, ints[..., None], -1)[..., 0]
    np.testing.assert_allclose(v_sparse, want, rtol=1e-5, atol=atol)


def test_cross_entropy_along_another_axis():
    rng = np.random.default_rng(1)
    logits, labels = rng.standard_normal((4, 3)), np.full((4, 3), 0.25)
    g = Graph()
    with g.as_default():
        loss = N.softmax_cross_entropy_with_logits(labels=labels, logits=logits, axis=0)
    np.testing.assert_allclose(run_op(loss), -(labels * _log_softmax(logits, 0)).sum(0))


def test_softmax_over_no_classes_is_empty_and_its_cross_entropy_zero():
    # an axis of length 0 has nothing to normalise (as TF); numpy's max of it would raise
    import dcf

    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float64, (2, None))
        y = N.softmax(x) + N.log_softmax(x) + N.softmax(x, axis=0)
        loss = N.softmax_cross_entropy_with_logits(labels=x * 0.5, logits=x)
        gx = dcf.gradients(M.reduce_sum(y) + M.reduce_sum(loss), x)[0]
    with dcf.Session(g) as sess:
        got = sess.run([y, loss, gx], {x: np.zeros((2, 0))})
    assert got[0].shape == (2, 0) and got[2].shape == (2, 0)
    np.testing.assert_array_equal(got[1], np.zeros(2))


def test_sparse_label_out_of_range_is_an_error_naming_the_label():
    g = Graph()
    with g.as_default():
        logits = placeholder(dtypes.float32, (2, 3))
        labels = placeholder(dtypes.int32, (2,))
        loss = N.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        with pytest.raises(
            InvalidArgumentError,
            match=r"SparseSoftmaxCrossEntropyWithLogits "
            r"'SparseSoftmaxCrossEntropyWithLogits': "
            r"labels int32\[3\] must have the shape",
        ):
            N.sparse_softmax_cross_entropy_with_logits(
                labels=placeholder(dtypes.int32, (3,)), logits=logits
            )
    with pytest.raises(InvalidArgumentError, match=r"label 3 is out of range \[0, 3\)"):
        run_op(loss, {logits: np.zeros((2, 3)), labels: [0, 3]})


def test_softmax_errors():
    g = Graph()
    with g.as_default():
        with pytest.raises(TypeError, match=r"Softmax 'Softmax': does not support int32"):
            N.softmax(placeholder(dtypes.int32, (3,)))
        with pytest.raises(
            InvalidArgumentError,
            match=r"Softmax 'Softmax': needs a tensor of "
            r"rank >= 1",
        ):
            N.softmax(placeholder(dtypes.float32, ()))


GRAD_CASES = [
    ("softmax", lambda x: N.softmax(x), [(2, 4)]),
    ("softmax_axis0", lambda x: N.softmax(x, 0), [(3, 2)]),
    ("log_softmax", lambda x: N.log_softmax(x), [(2, 4)]),
    (
        "xent_logits",
        lambda x: N.softmax_cross_entropy_with_logits(
            labels=np.array([[0.2, 0.3, 0.5], [1.0, 0, 0]]), logits=x
        ),
        [(2, 3)],
    ),
    (
        "xent_both",
        lambda x, y: N.softmax_cross_entropy_with_logits(labels=y, logits=x),
        [(2, 3), (2, 3)],
    ),
    (
        "sparse_xent",
        lambda x: N.sparse_softmax_cross_entropy_with_logits(
            labels=np.array([2, 0], np.int32), logits=x
        ),
        [(2, 3)],
    ),
    (
        "xent_then_mean",
        lambda x: M.reduce_mean(
            N.sparse_softmax_cross_entropy_with_logits(
                labels=np.array([[1, 0], [2, 2]], np.int64), logits=x
            )
        ),
        [(2, 2, 3)],
    ),
]


@pytest.mark.parametrize("how", ["static", "rank"])
@pytest.mark.parametrize("case,f,shapes", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradient_matches_finite_differences(case, f, shapes, how):
    rng = np.random.default_rng(5)
    if how == "rank" and case == "softmax_axis0":
        how = "dims"  # a non-last axis needs the rank
    check_grads(f, [rng.standard_normal(s) for s in shapes], shapes=how)


@pytest.mark.parametrize(
    "case", ["softmax", "log_softmax", "xent_logits", "xent_both", "sparse_xent"]
)
def test_second_order_gradient_matches_finite_differences(case):
    _, f, shapes = next(c for c in GRAD_CASES if c[0] == case)
    rng = np.random.default_rng(6)
    check_grads(f, [rng.standard_normal(s) for s in shapes], order=2)
