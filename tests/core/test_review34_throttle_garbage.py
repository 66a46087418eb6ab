"""A run that throttles gives its device memory back when it ends, without the garbage
collector (stand-in GPUs): a kernel whose allocation fails twice and then fits (relieved
by swapping saved values out: dcf/actors/gpu_actor.py, `oom`) kept the second
MemoryError, whose traceback held the kernel wrapper's frame and, through the callers'
frames, the compiled loop's frame -- its values and stacks -- in a reference cycle. The
device kept ~1 MB in use after each such run until a collection: the next run's swapper
counted it as use over its threshold and moved values out for nothing."""

from __future__ import annotations

import gc

import numpy as np

import dcf

R, C, N = 160, 128, 40           # 80 KiB saved values, 40 iterations: ~6.5 MB saved


def test_a_run_that_throttled_leaves_no_device_memory_in_cyclic_garbage(fake_gpus):
    from dcf.actors.gpu import GpuDevice

    gpu = GpuDevice.get(0)
    rng = np.random.default_rng(0)
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        x = dcf.placeholder(dcf.float32, (R, C))
        w = dcf.Variable((rng.standard_normal((C, C)) / np.sqrt(C)).astype(np.float32))
        out = dcf.while_loop(lambda i, a: i < N, lambda i, a: (i + 1, dcf.tanh(a @ w) * 1.01),
                             (0, x), swap_memory=True)[1]
        grads = dcf.gradients(dcf.reduce_sum(out * out), [x, w])
        init = dcf.global_variables_initializer()
    xv = rng.uniform(-1, 1, (R, C)).astype(np.float32)
    config = dcf.SessionConfig(gpu_memory_limit=2 << 20, swap_threshold=0.5)
    with dcf.Session(g, config=config) as sess:
        sess.run(init)
        first = sess.run(grads, {x: xv})
        gc.collect()
        base = gpu.used_bytes()
        throttled = gpu.stats["throttled"]
        gc.disable()
        try:
            again = sess.run(grads, {x: xv})
            left = gpu.used_bytes() - base
        finally:
            gc.enable()
        assert gpu.stats["throttled"] > throttled          # it did throttle
        assert left == 0, f"{left:,} bytes still in use after the run"
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
