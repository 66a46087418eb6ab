"""A split of `g @ W^T` of which one part is read runs as one GEMM on that part's rows of
W on a GPU (dcf/fusion/split_matmul.py): the LSTM's first layer, whose input needs no
gradient. GPUs here are the cupy stand-in (the narrow product runs through its MatMul);
tests/gpu/test_gpu_split_matmul.py runs it on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from tests.lstm_gradients import lstm_gradients


@pytest.fixture
def fused_splits(instances_of):
    from dcf.fusion import split_matmul as split_matmul_fusion

    return instances_of(split_matmul_fusion.FusedSplitMatMul)


@pytest.mark.parametrize("with_x", [False, True])
def test_the_first_layers_input_part_is_not_computed_unless_asked(fake_gpus, fused_splits,
                                                                  with_x):
    xv = np.random.default_rng(0).standard_normal((6, 3, 4)).astype(np.float32)
    cpu = lstm_gradients("/cpu:0", xv, 5, with_x=with_x, runs=2)
    gpu = lstm_gradients("/gpu:0", xv, 5, with_x=with_x, runs=2)
    narrowed = sum(f.narrowed for f in fused_splits)
    if with_x:          # the input's part is read: the product and the split run whole
        assert narrowed == 0
    else:               # 6 steps, 2 runs
        assert narrowed == 12 and all(f.r0 == 4 and f.r1 == 9 for f in fused_splits)
    for run_c, run_g in zip(cpu, gpu):
        for a, b in zip(run_c, run_g):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def _split_loop(gv, wv, w_transposed=False, bad_from=None):
    """sum over 3 iterations of split(g * (i + 1) @ W^T, [2, 3, 1])[1]."""
    n = 3
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        k = dcf.placeholder(dcf.int32, [])
        G = dcf.constant(gv)
        W = dcf.transpose(dcf.constant(np.ascontiguousarray(wv.T))) if w_transposed else \
            dcf.constant(wv)

        def body(i, acc):
            gi = G * dcf.cast(i + 1, dcf.float32)
            if bad_from is not None:
                gi = gi[:, : dcf.where(i < k, gv.shape[1], gv.shape[1] - 1)]
            prod = dcf.matmul(gi, W, transpose_b=True, name="prod")
            _, mid, _ = dcf.split(prod, [2, 3, 1], axis=1)
            return i + 1, acc + mid

        out = dcf.while_loop(lambda i, acc: i < n, body, (0, dcf.zeros([gv.shape[0], 3])),
                             name="sloop")
    return g, k, out[1]


@pytest.mark.parametrize("w_transposed", [False, True])
def test_a_loops_narrowed_product_equals_float64_numpy(fake_gpus, fused_splits, w_transposed):
    rng = np.random.default_rng(1)
    gv = rng.standard_normal((4, 7)).astype(np.float32)
    wv = rng.standard_normal((6, 7)).astype(np.float32)
    g, k, out = _split_loop(gv, wv, w_transposed)
    with dcf.Session(graph=g) as s:
        got = s.run(out, {k: 9})
    want = 6 * (gv.astype(np.float64) @ wv.astype(np.float64).T)[:, 2:5]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    narrowed = sum(f.narrowed for f in fused_splits)
    # a transposed view of W is not C-contiguous: the product and the split run whole
    assert fused_splits and narrowed == (0 if w_transposed else 3)


def test_a_failing_product_names_the_matmul_frame_and_iteration(fake_gpus, fused_splits):
    rng = np.random.default_rng(2)
    g, k, out = _split_loop(rng.standard_normal((4, 7)).astype(np.float32),
                            rng.standard_normal((6, 7)).astype(np.float32), bad_from=1)
    with dcf.Session(graph=g) as s:
        with pytest.raises(dcf.errors.InvalidArgumentError) as e:
            s.run(out, {k: 1})
    msg = str(e.value)
    assert fused_splits
    assert "prod" in msg and "MatMul" in msg and "iteration 1" in msg and "sloop" in msg


def test_sizes_that_miss_ws_rows_fail_as_the_split_does(fake_gpus, fused_splits):
    # W's rows are known only when it runs: 5 rows against sizes [2, 2] is the split's
    # error on the CPU, and must not become columns 2:4 of the 5-column product here
    rng = np.random.default_rng(3)
    gv, wv = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    with dcf.Graph().as_default(), dcf.device("/gpu:0"):
        g = dcf.placeholder(dcf.float64, [3, 4])
        w = dcf.placeholder(dcf.float64, [None, 4])
        _, part = dcf.split(dcf.matmul(g, w, transpose_b=True), [2, 2], axis=1)
        out = part * 2.0
        with dcf.Session() as sess:
            with pytest.raises(dcf.errors.InvalidArgumentError, match="do not add up to 5"):
                sess.run(out, {g: gv, w: wv})
            # W of 4 rows: the narrow product, as before
            got = sess.run(out, {g: gv, w: wv[:4]})
    np.testing.assert_allclose(got, 2.0 * (gv @ wv[:4].T)[:, 2:], rtol=1e-13, atol=1e-13)
    assert fused_splits and sum(f.narrowed for f in fused_splits) == 1
