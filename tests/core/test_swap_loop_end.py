"""A loop that pushes saved values pays what it owes the swapper at its end
(dcf/actors/gpu_swap.py, Swapper.tick): between ticks a debt smaller than a batch of
values waits for more, and after the loop's last tick no more would come. On the
stand-in GPUs: a loop shorter than the ticks are apart, its run the first thing on the
device, moves its saved values past a threshold of 0."""

from __future__ import annotations

import numpy as np

import dcf
from dcf.actors import gpu_swap


def _short_loop_gradient(swap: bool):
    rng = np.random.default_rng(0)
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        x = dcf.constant(rng.uniform(-1, 1, (160, 128)).astype(np.float32))     # 80 KiB
        w = dcf.constant((rng.standard_normal((128, 128)) / np.sqrt(128)).astype(np.float32))
        out = dcf.while_loop(lambda i, a: i < gpu_swap.TICK_EVERY - 1,
                             lambda i, a: (i + 1, dcf.tanh(a @ w)), (0, x),
                             swap_memory=swap)[1]
        grads = dcf.gradients(dcf.reduce_sum(out * out), [x, w])
    return g, grads


def test_a_loop_shorter_than_a_tick_apart_pays_its_debt_at_its_end(fake_gpus):
    from dcf.actors.gpu import GpuDevice

    stats = GpuDevice.get(0).stats
    before = stats["swap_out_bytes"], stats["swap_in_bytes"]
    g, grads = _short_loop_gradient(True)
    with dcf.Session(g, config=dcf.SessionConfig(swap_threshold=0.0)) as sess:
        swapped = sess.run(grads)
    # the values of iterations 1 and 2 (iteration 0's is the constant x, which stays)
    assert stats["swap_out_bytes"] - before[0] == 2 * 160 * 128 * 4
    assert stats["swap_in_bytes"] > before[1]
    g, grads = _short_loop_gradient(False)
    with dcf.Session(g) as sess:
        plain = sess.run(grads)
    for a, b in zip(plain, swapped):
        np.testing.assert_array_equal(a, b)
