"""The in-place accumulation kernels of a loop's gradient sums (dcf/ops/gpu_kernels.py,
dcf/fusion/accumulate.py) on a GPU: acc += op(a) @ op(b) as one GEMM with beta = 1, and
acc += x.sum(0) as one column-sum kernel with the same bits as the Sum then the Add.
Under DCF_FAKE_GPUS (no cuBLAS, no ElementwiseKernel) they decline and change nothing."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf import gpu_devices
from dcf.actors.gpu import GpuDevice
from dcf.ops.gpu_kernels import colsum_accumulate, gemm_accumulate
from tests.lstm_gradients import lstm_gradients


@pytest.fixture
def cp():
    GpuDevice.get(0).activate()
    return gpu_devices.backend()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_accumulate_adds_the_product(cp, dt, ta, tb):
    rng = np.random.default_rng(0)
    m, k, n = 37, 53, 29
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dt)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dt)
    c = rng.standard_normal((m, n)).astype(dt)
    acc = cp.asarray(c)
    done = gemm_accumulate(cp, acc, cp.asarray(a), cp.asarray(b), ta, tb)
    got = cp.asnumpy(acc)
    if gpu_devices.is_fake():
        assert not done and np.array_equal(got, c)
        return
    assert done
    want = c.astype(np.float64) + (a.T if ta else a).astype(np.float64) @ \
        (b.T if tb else b).astype(np.float64)
    tol = 1e-5 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)


def test_gemm_accumulate_declines_what_one_gemm_cannot_do(cp):
    rng = np.random.default_rng(1)
    a = cp.asarray(rng.standard_normal((8, 6)).astype(np.float32))
    b = cp.asarray(rng.standard_normal((6, 5)).astype(np.float32))
    acc = cp.zeros((8, 5), np.float32)
    before = cp.asnumpy(acc)
    assert not gemm_accumulate(cp, cp.zeros((8, 5), np.float64), a, b, False, False)
    assert not gemm_accumulate(cp, cp.zeros((5, 8), np.float32), a, b, False, False)
    assert not gemm_accumulate(cp, cp.zeros((8, 10), np.float32)[:, ::2], a, b, False, False)
    assert not gemm_accumulate(cp, acc, a, b, True, False)        # inner sizes differ
    sq = cp.asarray(rng.standard_normal((6, 6)).astype(np.float32))
    assert not gemm_accumulate(cp, sq, sq, sq, False, False)      # acc is an operand
    assert np.array_equal(cp.asnumpy(acc), before)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 512), (7, 600), (512, 2048)])
def test_colsum_accumulate_equals_the_sum_then_the_add(cp, dt, shape):
    """Bit for bit: the Sum op's GPU body, then the Add op, on the same values."""
    rng = np.random.default_rng(2)
    x = cp.asarray(rng.standard_normal(shape).astype(dt))
    c = rng.standard_normal(shape[1]).astype(dt)
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        xp, cph = dcf.placeholder(dcf.as_dtype(dt), shape), dcf.placeholder(dcf.as_dtype(dt),
                                                                            [shape[1]])
        unfused = cph + dcf.reduce_sum(xp, axis=0)
    with dcf.Session(g) as s:
        want = s.run(unfused, {xp: cp.asnumpy(x), cph: c})
    acc = cp.asarray(c)
    done = colsum_accumulate(cp, acc, x)
    if gpu_devices.is_fake():
        assert not done and np.array_equal(cp.asnumpy(acc), c)
        return
    assert done
    np.testing.assert_array_equal(cp.asnumpy(acc), want)


def test_colsum_accumulate_declines_narrow_and_other_layouts(cp):
    rng = np.random.default_rng(3)
    acc = cp.zeros(256, np.float32)
    assert not colsum_accumulate(cp, acc, cp.asarray(rng.standard_normal((4, 256)).astype(
        np.float32)))                                    # narrow: cupy's own sum there
    wide = cp.asarray(rng.standard_normal((4, 1024)).astype(np.float32))
    assert not colsum_accumulate(cp, cp.zeros(512, np.float32), wide[:, ::2])
    assert not colsum_accumulate(cp, cp.zeros(1024, np.float64), wide)
    assert not colsum_accumulate(cp, cp.zeros((1, 1024), np.float32), wide)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("k", [2, 5, 16, 17])
def test_stack_rows_equals_concatenate(cp, dt, k):
    """One raw kernel for up to STACK_ROWS_MAX arrays; cupy's concatenate beyond."""
    from dcf.ops.gpu_kernels import stack_rows

    rng = np.random.default_rng(k)
    xs = [rng.standard_normal((3, 7)).astype(dt) for _ in range(k)]
    got = stack_rows(cp, [cp.asarray(x) for x in xs])
    assert got.shape == (3 * k, 7) and got.flags.c_contiguous
    np.testing.assert_array_equal(cp.asnumpy(got), np.concatenate(xs))


@pytest.mark.parametrize("steps,runs", [(12, 2), (40, 1)])
def test_an_lstm_gradient_with_fused_accumulations_equals_the_cpu(fused_accumulations, steps,
                                                                  runs):
    """512 units: the bias gradient takes the column-sum kernel, the weight's the GEMM;
    their terms are added CHUNK at a time, then the rest when the loop ends."""
    from dcf.fusion.accumulate import CHUNK

    rng = np.random.default_rng(4)
    xv = rng.standard_normal((steps, 4, 16)).astype(np.float32)
    cpu, gpu = (lstm_gradients(dev, xv, 512, loss="mean", runs=runs, parallel_iterations=8)
                for dev in ("/cpu:0", "/gpu:0"))
    ran = list(fused_accumulations)
    assert sorted(f.kind for f in ran) == ["colsum", "matmul"]
    held = steps - 1
    assert all(f.in_place == runs * held and f.flushes == runs * -(-held // CHUNK)
               for f in ran)
    for run_cpu, run_gpu in zip(cpu, gpu):
        for a, b in zip(run_cpu, run_gpu):
            np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-6 * np.abs(a).max())


def test_stack_rows_gives_the_same_arrays_the_stack_it_made_last(cp):
    """The last two stacks of a thread are kept: a loop's weight and bias gradients stack
    the same terms. Other arrays (or equal values in other arrays) get a stack of their
    own; forget_stacks drops them."""
    from dcf.ops.gpu_kernels import forget_stacks, stack_rows

    if gpu_devices.is_fake():
        pytest.skip("the stand-in concatenates (no raw kernels)")
    rng = np.random.default_rng(6)
    xs = [cp.asarray(rng.standard_normal((2, 5)).astype(np.float32)) for _ in range(4)]
    ys = [cp.asarray(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(4)]
    forget_stacks()
    sx = stack_rows(cp, xs)
    sy = stack_rows(cp, ys)
    assert stack_rows(cp, xs) is sx and stack_rows(cp, ys) is sy
    copies = [x.copy() for x in xs]
    sc = stack_rows(cp, copies)
    assert sc is not sx
    np.testing.assert_array_equal(cp.asnumpy(sc), cp.asnumpy(sx))
    assert stack_rows(cp, xs[:3]) is not sx                      # fewer arrays
    forget_stacks()
    again = stack_rows(cp, xs)
    assert again is not sx
    np.testing.assert_array_equal(cp.asnumpy(again), np.concatenate([cp.asnumpy(x) for x in xs]))
