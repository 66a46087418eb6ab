"""LSTMGates writing its activations over the product z it reads (rnn_ops.gates_into,
planned by dcf/fusion/matmul_gates.py) as one raw kernel on a GPU: the gates' own
kernel's bits, the activations in z's own buffer, and LSTM gradients equal to the
CPU's. Under DCF_FAKE_GPUS (no RawKernel) the kernel declines and the gates' own kernel
runs on the product."""

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


def _inputs(cp, dt, B, u, addend, seed):
    rng = np.random.default_rng(seed)
    z = cp.asarray(rng.standard_normal((B, 4 * u)).astype(dt) * 2)
    c = cp.asarray(rng.standard_normal((B, u)).astype(dt))
    b = {"none": None, "row": cp.asarray(rng.standard_normal(4 * u).astype(dt)),
         "full": cp.asarray(rng.standard_normal((B, 4 * u)).astype(dt))}[addend]
    return z, c, b


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("B,u", [(37, 129), (1, 8), (256, 512)])
@pytest.mark.parametrize("addend", ["none", "row", "full"])
def test_gates_written_over_z_give_the_gates_kernels_bits(cp, dt, B, u, addend):
    z, c, b = _inputs(cp, dt, B, u, addend, seed=B + u)
    want = rnn_ops._gates_gpu(cp, z, c, b, forget_bias=0.7)
    z_before = cp.asnumpy(z)
    got = rnn_ops.gates_into(cp, z, c, b, 0.7)
    if gpu_devices.is_fake():
        assert got is None
        return
    assert got is not None and got[2] is z          # the activations are z's buffer
    for g, w in zip(got, want):
        np.testing.assert_array_equal(cp.asnumpy(g), cp.asnumpy(w))
    # and they are the float64 gates of the product as it was
    zz = z_before.astype(np.float64) + (0 if b is None else cp.asnumpy(b).astype(np.float64))
    sig = lambda x: 1 / (1 + np.exp(-x))                                # noqa: E731
    i, j, f, o = (zz[:, q * u:(q + 1) * u] for q in range(4))
    cn = cp.asnumpy(c).astype(np.float64) * sig(f + 0.7) + sig(i) * np.tanh(j)
    tol = 2e-5 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(cp.asnumpy(got[0]), cn, rtol=tol, atol=tol)
    np.testing.assert_allclose(cp.asnumpy(got[1]), np.tanh(cn) * sig(o), rtol=tol, atol=tol)


def test_what_the_kernel_declines(cp):
    z, c, b = _inputs(cp, np.float32, 8, 16, "row", seed=4)
    assert rnn_ops.gates_into(cp, z[:, ::-1], c, b, 1.0) is None            # layout
    assert rnn_ops.gates_into(cp, z[:, :32], c, b, 1.0) is None             # shape
    assert rnn_ops.gates_into(cp, z, c.astype(np.float64), b, 1.0) is None  # dtypes
    assert rnn_ops.gates_into(cp, z, c, b[:16], 1.0) is None                # bias shape
    assert rnn_ops.gates_into(cp, cp.asnumpy(z), c, b, 1.0) is None         # host z
    assert rnn_ops.gates_into(cp, z, c, cp.asnumpy(b), 1.0) is None         # host bias


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_lstm_gradients_with_the_gates_over_z_equal_the_cpu(cp, instances_of, kind):
    from dcf.fusion import matmul_gates

    made = instances_of(matmul_gates.FusedMatMulGates)
    rng = np.random.default_rng(6)
    xv = (rng.standard_normal((10, 64, 96)) * 0.5).astype(np.float32)
    cpu, gpu = (lstm_gradients(dev, xv, 128, layers=2, kind=kind, with_x=True, runs=2)
                for dev in ("/cpu:0", "/gpu:0"))
    assert made
    if not gpu_devices.is_fake():
        assert sum(f.into for f in made) >= 2 * 2 * 10      # 2 layers, 10 steps, 2 runs
    for run_c, run_g in zip(cpu, gpu):
        for a, b in zip(run_c, run_g):
            np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-4)
