"""`wavefront_and_layers`: bench.model_parallel's two schedules of one LSTM run on the same
input, for the tests that compare the wavefront's fused paths with the layer-by-layer
model (tests/core, tests/gpu)."""

from __future__ import annotations

import numpy as np

import dcf


def wavefront_and_layers(layer_devs: list, wavefront_devs: list, x: np.ndarray,
                         layers: int) -> tuple:
    """(loss of the layer-by-layer model on `layer_devs`, the wavefront's on
    `wavefront_devs`, the layer-by-layer kernels' gradients stacked, the wavefront's
    kernel gradients concatenated over its groups), in float64, x: [steps, batch, units]."""
    from bench.model_parallel import MultiLayerLSTM, WavefrontLSTM

    _, B, U = x.shape
    a = MultiLayerLSTM(layer_devs, layers, B, U, U, 4, dtype=dcf.float64)
    b = WavefrontLSTM(wavefront_devs, layers, B, U, U, 4, dtype=dcf.float64)
    try:
        la, ga = a.sess.run([a.loss, [g for g, _ in a.grads]], {a.x: x})
        lb, gb = b.sess.run([b.loss, [g for g, _ in b.grads]], {b.x: x})
    finally:
        a.close()
        b.close()
    names = [v.name for _, v in b.grads]
    got_k = np.concatenate([g for g, n in zip(gb, names) if "kernel" in n])
    return la, lb, np.stack(ga[0::2]), got_k
