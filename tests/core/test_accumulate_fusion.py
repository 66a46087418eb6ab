"""A loop's accumulation acc + MatMul / acc + Sum(axis 0) on a GPU runs as one call that
updates the accumulator in place after the first iteration (dcf/fusion/accumulate.py).
GPUs here are the cupy stand-in, so the in-place path is the term's own kernel and an
in-place add; tests/gpu checks the cuBLAS and column-sum kernels on a real GPU."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from tests.lstm_gradients import lstm_gradients


@pytest.fixture
def fused(fused_accumulations):
    return fused_accumulations


def _data(n=5, b=3, k=4, m=6, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, b, k)).astype(np.float32),
            rng.standard_normal((n, b, m)).astype(np.float32))


def _accumulating_loop(xs, ys, dev="/gpu:0", extra_reader=False):
    """acc = sum_t xs[t]^T @ ys[t] and bias = sum_t ys[t].sum(0), in a while loop."""
    n, _, k = xs.shape
    m = ys.shape[2]
    g = dcf.Graph()
    with g.as_default(), dcf.device(dev):
        X, Y = dcf.constant(xs), dcf.constant(ys)

        def body(i, acc, bias, seen):
            x, y = dcf.gather(X, i), dcf.gather(Y, i)
            if extra_reader:   # the accumulator is read by another op: not fused
                seen = seen + dcf.reduce_sum(acc)
            return (i + 1, acc + dcf.matmul(x, y, transpose_a=True),
                    bias + dcf.reduce_sum(y, axis=0), seen)

        out = dcf.while_loop(lambda i, *_: i < n, body,
                             (0, dcf.zeros([k, m]), dcf.zeros([m]), dcf.constant(0.0)))
    return g, out[1:]


def _reference(xs, ys, extra_reader=False):
    x, y = xs.astype(np.float64), ys.astype(np.float64)
    acc = np.zeros((x.shape[2], y.shape[2]))
    seen = 0.0
    for t in range(len(x)):
        seen += acc.sum() if extra_reader else 0.0
        acc = acc + x[t].T @ y[t]
    return acc, y.sum(axis=(0, 1)), seen


def test_loop_accumulations_update_in_place_and_equal_numpy(fake_gpus, fused):
    xs, ys = _data()
    g, out = _accumulating_loop(xs, ys)
    want = _reference(xs, ys)
    with dcf.Session(graph=g) as sess:
        first = sess.run(out)
        kept = [np.array(v, copy=True) for v in first]
        for got, w in zip(first, want):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
        assert sorted(f.kind for f in fused) == ["colsum", "matmul"]
        # iterations 1..4 of the run wrote in place; iteration 0 made a new array
        assert all(f.in_place == len(xs) - 1 for f in fused)
        second = sess.run(out)
        for got, w in zip(second, want):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
        # the first run's results are not the buffers the second run updated
        for a, b in zip(first, kept):
            np.testing.assert_array_equal(a, b)
        assert all(f.in_place == 2 * (len(xs) - 1) for f in fused)


def test_an_accumulator_read_by_another_op_is_not_updated_in_place(fake_gpus, fused):
    xs, ys = _data(seed=1)
    g, out = _accumulating_loop(xs, ys, extra_reader=True)
    want = _reference(xs, ys, extra_reader=True)
    with dcf.Session(graph=g) as sess:
        got = sess.run(out)
    for a, w in zip(got, want):
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5)
    assert [f.kind for f in fused] == ["colsum"]     # only the bias, which nobody reads


def test_an_inner_loop_accumulates_afresh_in_each_outer_iteration(fake_gpus, fused):
    """The inner loop's first value is the outer loop's running total: it must get a
    new array in every outer iteration (the outer loop keeps its old value)."""
    xs, ys = _data(n=3, seed=2)
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        X, Y = dcf.constant(xs), dcf.constant(ys)

        def outer(j, total, history):
            def inner(i, acc):
                return i + 1, acc + dcf.matmul(dcf.gather(X, i), dcf.gather(Y, i),
                                               transpose_a=True)
            _, acc = dcf.while_loop(lambda i, acc: i < 3, inner, (0, total))
            return j + 1, acc, history + dcf.reduce_sum(total)

        _, total, history = dcf.while_loop(
            lambda j, *_: j < 4, outer, (0, dcf.zeros([4, 6]), dcf.constant(0.0)))
    step = sum(xs[t].astype(np.float64).T @ ys[t] for t in range(3))
    with dcf.Session(graph=g) as sess:
        t, h = sess.run([total, history])
    np.testing.assert_allclose(t, 4 * step, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h, sum(k * step.sum() for k in range(4)), rtol=1e-5, atol=1e-4)
    assert [(f.kind, f.in_place) for f in fused] == [("matmul", 4 * 2)]


def test_a_failing_term_names_the_matmul_frame_and_iteration(fake_gpus):
    xs, ys = _data()
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        k = dcf.placeholder(dcf.int32, [])
        X, Y = dcf.constant(xs), dcf.constant(ys)

        def body(i, acc):
            x = dcf.gather(X, i)[: dcf.where(i < k, 3, 2)]     # fewer rows from k on
            return i + 1, acc + dcf.matmul(x, dcf.gather(Y, i), transpose_a=True,
                                           name="term")

        _, acc = dcf.while_loop(lambda i, acc: i < 5, body, (0, dcf.zeros([4, 6])),
                                name="accloop")
    with dcf.Session(graph=g) as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError) as e:
            sess.run(acc, {k: 2})
    msg = str(e.value)
    assert "term" in msg and "MatMul" in msg and "iteration 2" in msg and "accloop" in msg


def test_the_lstm_weight_and_bias_gradients_are_fused_and_equal_the_cpu(fake_gpus, fused):
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((6, 2, 3)).astype(np.float32)

    cpu = lstm_gradients("/cpu:0", xv, 5)[0]
    assert not fused
    gpu = lstm_gradients("/gpu:0", xv, 5)[0]
    assert sorted(f.kind for f in fused) == ["colsum", "matmul"]
    assert all(f.in_place == 5 for f in fused)
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
