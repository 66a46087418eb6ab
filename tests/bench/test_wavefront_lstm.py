"""bench.model_parallel's wavefront schedule (layer l at time i - l, a device's layers
batched) is the same model as the layer-by-layer one: the same loss and the same
gradient of every layer's kernel and bias, in float64 on CPU devices, for sequences
shorter than, as long as and longer than the layer count, over one to three devices."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from bench.model_parallel import MultiLayerLSTM, WavefrontLSTM


def _run(model, x):
    loss, grads = model.sess.run([model.loss, [g for g, _ in model.grads]], {model.x: x})
    return loss, grads


@pytest.mark.parametrize("layers,steps,devices", [(4, 3, 1), (4, 4, 2), (4, 9, 2),
                                                  (5, 6, 3), (2, 1, 2), (1, 5, 1)])
def test_the_wavefront_is_the_layer_by_layer_model(layers, steps, devices):
    B, U = 3, 5
    devs = [f"/cpu:{k}" for k in range(devices)]
    x = np.random.default_rng(layers * 10 + steps).standard_normal((steps, B, U))
    a = MultiLayerLSTM(devs, layers, B, U, U, 4, dtype=dcf.float64)
    b = WavefrontLSTM(devs, layers, B, U, U, 4, dtype=dcf.float64)
    try:
        (la, ga), (lb, gb) = _run(a, x), _run(b, x)
        # the layer-by-layer gradients in the wavefront's order: kernels, then biases,
        # per group of layers on one device
        kernels = np.stack(ga[0::2])
        biases = np.stack(ga[1::2])[:, None, :]
        names = [v.name for _, v in b.grads]
        got_k = np.concatenate([g for g, n in zip(gb, names) if "kernel" in n])
        got_b = np.concatenate([g for g, n in zip(gb, names) if "bias" in n])
    finally:
        a.close()
        b.close()
    assert abs(la - lb) <= 1e-13 * max(1.0, abs(la))
    assert np.abs(kernels).max() > 0
    np.testing.assert_allclose(got_k, kernels, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(got_b, biases, rtol=1e-10, atol=1e-14)


def test_a_training_step_moves_both_models_alike():
    devs = ["/cpu:0", "/cpu:1"]
    x = np.random.default_rng(7).standard_normal((6, 2, 4))
    a = MultiLayerLSTM(devs, 4, 2, 4, 4, 2, dtype=dcf.float64)
    b = WavefrontLSTM(devs, 4, 2, 4, 4, 2, dtype=dcf.float64)
    try:
        got = [(a.step(x), b.step(x)) for _ in range(3)]
    finally:
        a.close()
        b.close()
    for la, lb in got:
        assert abs(la - lb) <= 1e-13 * max(1.0, abs(la))
    assert got[0][0] != got[2][0]


def test_the_wavefront_needs_inputs_as_deep_as_its_units():
    with pytest.raises(ValueError, match="depth == units"):
        WavefrontLSTM(["/cpu:0"], 2, 2, 4, 3, 2)
