"""The lower layer's h crossing to the next GPU written straight into the upper layer's
concatenation buffer (GpuDevice.import_into_offer: a kernel reading the peer's memory)
on two real GPUs: the gradients of a model-parallel LSTM equal the CPU's, every step
after the first fills an offer, and switched off (PEER_KERNEL) the same bits come out
of the plain copies."""

from __future__ import annotations

import numpy as np
import pytest

from tests.lstm_gradients import layers_in_one_loop


@pytest.mark.parametrize("units", [8, 96])
def test_model_parallel_lstm_with_h_written_across_gpus(gpu_count, monkeypatch, units):
    from dcf import gpu_devices
    from dcf.actors import gpu as G

    if gpu_count < 2 or gpu_devices.is_fake():
        pytest.skip("needs two real GPUs (the stand-in makes no offers: no raw kernels)")
    xv = np.random.default_rng(units).standard_normal((6, 16, 5)).astype(np.float32)
    cpu = layers_in_one_loop(["/cpu:0"] * 2, xv, units)
    G.GpuDevice.get(0)      # (GPU 0 first, as a model placed from /gpu:0 on makes them)
    g1 = G.GpuDevice.get(1)
    before = g1.stats["peer_into_concat"]
    on = layers_in_one_loop(["/gpu:0", "/gpu:1"], xv, units)
    # one crossing a step; step 0's concatenation has no offer (h is the zero state); the
    # backward's crossings carry no concatenation's part
    assert g1.stats["peer_into_concat"] - before == xv.shape[0] - 1
    for a, b in zip(cpu, on):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5)
    monkeypatch.setattr(G, "PEER_KERNEL", False)
    off = layers_in_one_loop(["/gpu:0", "/gpu:1"], xv, units)
    for a, b in zip(off, on):
        np.testing.assert_array_equal(b, a)
