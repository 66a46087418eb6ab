"""LSTMGatesGrad reading dh in place -- one row-strided matrix (a SplitV column block) or
the sum of two (dcf/fusion/gates_grad.py) -- as one raw kernel on a GPU: the same bits
as the AddN then the gates' kernel, and stacked LSTM gradients equal to the CPU's.
Under DCF_FAKE_GPUS (no RawKernel) the kernel declines and the ops run one by one."""

from __future__ import annotations

import numpy as np
import pytest

from dcf import gpu_devices
from dcf.actors.gpu import GpuDevice
from dcf.ops import rnn_ops
from tests.lstm_gradients import lstm_gradients


@pytest.fixture
def cp():
    GpuDevice.get(0).activate()
    return gpu_devices.backend()


def _inputs(cp, dt, B, u, seed):
    rng = np.random.default_rng(seed)
    c, c_new, dc = (cp.asarray(rng.standard_normal((B, u)).astype(dt)) for _ in range(3))
    acts = cp.asarray(rng.uniform(0.05, 0.95, (B, 4 * u)).astype(dt))
    # dh parts as column blocks of wider matrices (what SplitV gives) and contiguous
    wide_a = cp.asarray(rng.standard_normal((B, 3 * u + 5)).astype(dt))
    wide_b = cp.asarray(rng.standard_normal((B, u + 7)).astype(dt))
    return c, acts, c_new, dc, wide_a[:, u + 5:2 * u + 5], wide_b[:, 7:]


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("B,u", [(37, 129), (1, 8), (256, 512)])
@pytest.mark.parametrize("layout", ["blocks", "contiguous", "mixed"])
def test_the_sum_inside_the_kernel_gives_the_add_n_then_gates_bits(cp, dt, B, u, layout):
    c, acts, c_new, dc, a, b = _inputs(cp, dt, B, u, seed=B + u)
    if layout != "blocks":
        a = cp.ascontiguousarray(a)
    if layout == "contiguous":
        b = cp.ascontiguousarray(b)
    got = rnn_ops.gates_grad_sum(cp, c, acts, c_new, dc, (a, b))
    if gpu_devices.is_fake():
        assert got is None
        return
    assert got is not None
    dh = cp.ascontiguousarray(a + b)        # AddN's one rounding
    want = rnn_ops.gates_grad_sum(cp, c, acts, c_new, dc, (dh,))   # the gates' kernel
    for g, w in zip(got, want):
        np.testing.assert_array_equal(cp.asnumpy(g), cp.asnumpy(w))
    # the single dh read in place from a column block gives the same bits
    wide = cp.zeros((B, u + 3), dt)
    wide[:, 3:] = dh
    one = rnn_ops.gates_grad_sum(cp, c, acts, c_new, dc, (wide[:, 3:],))
    for g, w in zip(one, want):
        np.testing.assert_array_equal(cp.asnumpy(g), cp.asnumpy(w))


def test_a_column_block_dh_takes_the_raw_kernel_in_the_op_body(cp):
    """The top layer's dh (recurrence only) is a SplitV column block: the op's GPU body
    reads it in place, with the contiguous copy's results."""
    c, acts, c_new, dc, a, _ = _inputs(cp, np.float32, 16, 32, seed=3)
    got = rnn_ops._gates_grad_gpu(cp, c, acts, c_new, dc, a)
    want = rnn_ops._gates_grad_gpu(cp, c, acts, c_new, dc, cp.ascontiguousarray(a))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(cp.asnumpy(g), cp.asnumpy(w))


def test_what_the_kernel_declines(cp):
    c, acts, c_new, dc, a, b = _inputs(cp, np.float32, 8, 16, seed=4)
    assert rnn_ops.gates_grad_sum(cp, c, acts, c_new, dc, (a, b[:4])) is None   # shape
    assert rnn_ops.gates_grad_sum(cp, c, acts, c_new, dc, (a, b.astype(np.float64))) is None
    assert rnn_ops.gates_grad_sum(cp, c, acts, c_new, dc, (a, b.T.T[::-1])) is None  # rows
    assert rnn_ops.gates_grad_sum(cp, c, acts, c_new, dc, (a, cp.asnumpy(b))) is None  # host
    assert rnn_ops.gates_grad_sum(cp, c, acts[:, ::-1], c_new, dc, (a, b)) is None
    assert rnn_ops.gates_grad_sum(cp, c, acts, c_new, dc, (a, b, b)) is None   # three parts


def test_stacked_lstm_gradients_on_the_gpu_equal_the_cpu(cp, instances_of):
    from dcf.fusion import gates_grad as gates_grad_fusion

    made = instances_of(gates_grad_fusion.FusedGatesGrad)
    rng = np.random.default_rng(5)
    xv = (rng.standard_normal((12, 64, 96)) * 0.5).astype(np.float32)

    cpu, gpu = (lstm_gradients(dev, xv, 128, layers=3, with_x=True, runs=2)
                for dev in ("/cpu:0", "/gpu:0"))
    assert made
    if not gpu_devices.is_fake():
        assert sum(f.fused for f in made) >= 2 * 3 * 11     # 3 layers, 11 of 12 steps, 2 runs
    for run_c, run_g in zip(cpu, gpu):
        for a, b in zip(run_c, run_g):
            np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-4)
