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
    from dcf.ops import concat_slots

    claims = concat_slots.claims[0]

    made = instances_of(matmul_gates.FusedMatMulGates)
    rng = np.random.default_rng(6)
    xv = (rng.standard_normal((10, 64, 96)) * 0.5).astype(np.float32)
    cpu, gpu = (lstm_gradients(dev, xv, 128, layers=2, kind=kind, with_x=True, runs=2)
                for dev in ("/cpu:0", "/gpu:0"))
    assert made
    if not gpu_devices.is_fake():
        assert sum(f.into for f in made) >= 2 * 2 * 10      # 2 layers, 10 steps, 2 runs
        # h went into the next step's concatenation buffer, which the step took
        assert sum(f.offers for f in made) >= 2 * 2 * 9
    for run_c, run_g in zip(cpu, gpu):
        for a, b in zip(run_c, run_g):
            np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-4)
    if not gpu_devices.is_fake():
        assert concat_slots.claims[0] - claims >= 2 * 2 * 9
    assert concat_slots.pending(0) == 0          # nothing held past the runs


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("B,lead,u", [(37, 96, 129), (1, 1, 8), (256, 512, 512)])
def test_h_written_into_a_concatenation_buffer_gives_the_same_bits(cp, dt, B, lead, u):
    z, c, b = _inputs(cp, dt, B, u, "row", seed=B + lead)
    want = rnn_ops.gates_into(cp, z.copy(), c, b, 0.7)
    got = rnn_ops.gates_into(cp, z, c, b, 0.7, h_lead=lead)
    if gpu_devices.is_fake():
        assert got is None
        return
    c_new, h, acts, buf = got
    assert buf.shape == (B, lead + u) and acts is z
    assert h.data.ptr == buf.data.ptr + lead * buf.itemsize and h.strides == buf.strides
    for g, w in zip((c_new, h, acts), want):
        np.testing.assert_array_equal(cp.asnumpy(g), cp.asnumpy(w))
    np.testing.assert_array_equal(cp.asnumpy(buf)[:, lead:], cp.asnumpy(want[1]))


def test_the_concatenation_takes_the_buffer_and_copies_x_in_front(cp):
    from dcf.ops import array_ops  # noqa: F401  (registers ConcatV2)
    from dcf.ops import concat_slots
    from dcf.ops.registry import OPS

    concat = OPS["ConcatV2"].gpu_kernel
    z, c, b = _inputs(cp, np.float32, 64, 96, "row", seed=9)
    got = rnn_ops.gates_into(cp, z, c, b, 1.0, h_lead=80)
    if gpu_devices.is_fake():
        pytest.skip("no raw kernels in the stand-in")
    _, h, _, buf = got
    concat_slots.offer(0, h, buf, 80)
    wide = cp.asarray(np.random.default_rng(3).standard_normal((64, 200)).astype(np.float32))
    x = wide[:, 17:97]                          # a column block: rows 200 apart
    want = np.concatenate([cp.asnumpy(x), cp.asnumpy(h)], axis=1)
    out = concat(cp, x, h, axis=1)
    assert out is buf
    np.testing.assert_array_equal(cp.asnumpy(out), want)
    again = concat(cp, x, h, axis=-1)           # claimed once: this one copies both
    assert again is not buf
    np.testing.assert_array_equal(cp.asnumpy(again), want)
    # column blocks on either side, without an offer: strided copies
    y = cp.asarray(np.random.default_rng(4).standard_normal((64, 5)).astype(np.float32))
    np.testing.assert_array_equal(cp.asnumpy(concat(cp, y, x, h, axis=1)),
                                  np.concatenate([cp.asnumpy(y), want], axis=1))


@pytest.mark.parametrize("own", [0, 64])
def test_h_also_written_into_the_layer_aboves_offer(cp, own):
    """The lower layer's gates write h into the first u columns of the buffer the upper
    layer offered (and, with `own`, into their own buffer too): the same bits as the
    gates alone, and the offer is filled with the h they return."""
    from dcf.ops import concat_slots

    if gpu_devices.is_fake():
        pytest.skip("no raw kernels in the stand-in")
    B, u, u_up = 48, 96, 80
    z, c, b = _inputs(cp, np.float32, B, u, "row", seed=11)
    want = rnn_ops.gates_into(cp, z.copy(), c, b, 0.9)
    up = cp.full((B, u + u_up), np.nan, np.float32)
    concat_slots.clear(0)
    concat_slots.offer(0, up[:, u:], up, u, concat=7)
    o = concat_slots.open_offer(7)
    c_new, h, acts, buf = rnn_ops.gates_into(cp, z, c, b, 0.9, h_lead=own, x_into=o)
    assert o.filled is h and (buf is None) == (own == 0)
    for g, w in zip((c_new, h, acts), want):
        np.testing.assert_array_equal(cp.asnumpy(g), cp.asnumpy(w))
    np.testing.assert_array_equal(cp.asnumpy(up)[:, :u], cp.asnumpy(want[1]))
    assert np.isnan(cp.asnumpy(up)[:, u:]).all()          # the upper h's columns untouched
    bad = concat_slots.Offer(up[:, u:], up, u + 1, 0, 8)     # a width that is not this h's
    got = rnn_ops.gates_into(cp, z.copy(), c, b, 0.9, x_into=bad)
    assert bad.filled is None and got[3] is None
    concat_slots.clear(0)


def test_layers_in_one_loop_copy_no_concatenation_and_equal_the_cpu(cp, instances_of):
    from dcf.fusion import matmul_gates
    from dcf.ops import concat_slots
    from tests.lstm_gradients import layers_in_one_loop

    made = instances_of(matmul_gates.FusedMatMulGates)
    rng = np.random.default_rng(12)
    xv = (rng.standard_normal((9, 32, 48)) * 0.5).astype(np.float32)
    claims = concat_slots.claims[0]
    cpu = layers_in_one_loop(["/cpu:0"] * 3, xv, 64)
    gpu = layers_in_one_loop(["/gpu:0"] * 3, xv, 64)
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-4)
    if not gpu_devices.is_fake():
        assert sum(f.offers for f in made) >= 3 * 8           # 3 layers, steps 0-7 offer
        assert sum(f.fills for f in made) >= 2 * 8            # the 2 lower layers fill
        assert concat_slots.claims[0] - claims >= 3 * 8
    assert concat_slots.pending(0) == 0
