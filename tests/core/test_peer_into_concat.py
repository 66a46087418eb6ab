"""A value crossing from one GPU to another where it is the first part of a
concatenation `[x, h]` whose buffer the layer's gates have offered (dcf/ops/concat_slots.py):
the transfer writes it into the buffer's first columns (`GpuDevice.import_into_offer`,
a kernel reading the peer's memory on a real GPU; an assignment on the stand-in here)
and the concatenation copies nothing. These tests check the hand-over, every case that
falls back to the plain copy, and that a fused plan's transfer knows its concatenation;
tests/gpu/test_gpu_peer_into_concat.py runs it on two real GPUs."""

from __future__ import annotations

import numpy as np
import pytest

KEY = 424242            # a concatenation's key (its plan node's id() in a plan)


def _offer(cp, rows, lead, u, seed, key=KEY):
    """On /gpu:1: a [rows, lead + u] buffer of NaN whose last u columns hold h, offered
    to the concatenation `key`."""
    from dcf.ops import concat_slots

    rng = np.random.default_rng(seed)
    with cp.cuda.Device(1):
        buf = cp.asarray(np.full((rows, lead + u), np.nan, np.float32))
        h = buf[:, lead:]
        h[...] = cp.asarray(rng.standard_normal((rows, u)).astype(np.float32))
    concat_slots.offer(1, h, buf, lead, key)
    return buf, h


def _on_gpu0(cp, a, wide=False):
    with cp.cuda.Device(0):
        if not wide:
            return cp.asarray(a)
        w = cp.asarray(np.zeros((a.shape[0], a.shape[1] + 5), a.dtype))
        w[:, 5:] = cp.asarray(a)
        return w[:, 5:]                     # a column block (rows apart), as the gates' h


def _concat(cp):
    from dcf.ops import array_ops  # noqa: F401  (registers ConcatV2)
    from dcf.ops.registry import OPS

    return lambda *xs: OPS["ConcatV2"].gpu_kernel(cp, *xs, axis=1)


@pytest.mark.parametrize("wide", [False, True])
def test_a_value_from_another_gpu_goes_into_the_offered_buffer(fake_gpus, wide):
    from dcf.actors.gpu import GpuDevice
    from dcf.ops import concat_slots

    cp = fake_gpus
    g1 = GpuDevice.get(1)
    buf, h = _offer(cp, 3, 2, 4, seed=1)
    xv = np.arange(6, dtype=np.float32).reshape(3, 2) + 0.5
    before = g1.stats["peer_into_concat"]
    x = g1.import_into_offer(_on_gpu0(cp, xv, wide), KEY, "x")
    assert g1.stats["peer_into_concat"] == before + 1
    assert x.data.device_id == 1 and concat_slots.open_offer(KEY).filled is x
    np.testing.assert_array_equal(cp.asnumpy(buf)[:, :2], xv)
    with cp.cuda.Device(1):
        buf[:, :2] = cp.asarray(np.full((3, 2), -9.0, np.float32))   # x *is* those columns
        np.testing.assert_array_equal(cp.asnumpy(x), -9.0)
        out = _concat(cp)(x, h)
    assert out is buf                       # claimed; x already in place: nothing copied
    np.testing.assert_array_equal(cp.asnumpy(out)[:, 2:], cp.asnumpy(h))
    assert concat_slots.open_offer(KEY) is None


@pytest.mark.parametrize("case", ["no offer", "filled", "shape", "dtype", "same gpu",
                                  "switch off"])
def test_what_the_offer_does_not_fit_is_copied_as_usual(fake_gpus, monkeypatch, case):
    from dcf.actors import gpu as G
    from dcf.ops import concat_slots

    cp = fake_gpus
    g1 = G.GpuDevice.get(1)
    buf, h = _offer(cp, 3, 2, 4, seed=2)
    xv = np.full((3, 2), 3.25, np.float32)
    key = KEY
    if case == "no offer":
        key = KEY + 1
    elif case == "filled":
        concat_slots.open_offer(KEY).filled = h
    elif case == "shape":
        xv = np.full((3, 3), 3.25, np.float32)
    elif case == "dtype":
        xv = xv.astype(np.float64)
    elif case == "switch off":
        monkeypatch.setattr(G, "PEER_KERNEL", False)
    if case == "same gpu":
        with cp.cuda.Device(1):
            v = cp.asarray(xv)
    else:
        v = _on_gpu0(cp, xv)
    before = g1.stats["peer_into_concat"]
    x = g1.import_into_offer(v, key, "x")
    assert g1.stats["peer_into_concat"] == before
    assert x.data.device_id == 1
    np.testing.assert_array_equal(cp.asnumpy(x), xv)
    assert np.isnan(cp.asnumpy(buf)[:, :2]).all()          # the buffer untouched
    o = concat_slots.open_offer(KEY)
    assert o is not None and (o.filled is h if case == "filled" else o.filled is None)
    concat_slots.clear(1)


def test_a_model_parallel_loops_transfer_knows_its_concatenation(fake_gpus, instances_of):
    """Two LSTM layers in one loop on two GPUs (bench.model_parallel's model): the
    transfer of the lower layer's h to /gpu:1 is keyed to the upper layer's
    concatenation -- the one the upper layer's gates offer their buffer to -- and the
    gradients equal the CPU's."""
    from dcf import fused as F
    from dcf.fusion import matmul_gates
    from tests.lstm_gradients import layers_in_one_loop

    xfers = instances_of(F._ToDevice)
    gates = instances_of(matmul_gates.FusedMatMulGates)
    xv = np.random.default_rng(6).standard_normal((4, 3, 2)).astype(np.float32)
    cpu = layers_in_one_loop(["/cpu:0", "/cpu:0"], xv, 4)
    gpu = layers_in_one_loop(["/gpu:0", "/gpu:1"], xv, 4)
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    keyed = {t.x_concat for t in xfers if t.x_concat >= 0}
    upper = {f.h_concat for f in gates if f.gpu.index == 1 and f.h_concat >= 0}
    assert keyed and keyed <= upper
    assert all(t.gpu.index == 1 for t in xfers if t.x_concat >= 0)
