"""A step that stops while saved values are on their way to the host gives their device
buffers back when it ends (dcf/actors/gpu_swap.py, `_Swapper.settle`, from
GpuActor.finish): the swapper's copies in flight hold them until it collects them, which
only a later swapping loop's tick did -- after a run that failed or was cancelled in its
forward loop, up to D2H_IN_FLIGHT saved values stayed in use on the device, through any
number of inference runs. Stand-in GPUs (whose copies are done at once)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import dcf

R, C = 160, 128                  # 80 KiB values


def _stop(i, at):
    if i == at:
        raise ValueError("stopped by the test")
    return np.float32(0.0)


def test_a_run_that_fails_in_a_swapping_loop_leaves_no_swap_out_buffers(fake_gpus):
    from dcf.actors.gpu import GpuDevice

    gpu = GpuDevice.get(0)
    rng = np.random.default_rng(0)
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        at = dcf.placeholder(dcf.int32, ())
        x = dcf.constant(rng.uniform(-1, 1, (R, C)).astype(np.float32))
        w = dcf.constant((rng.standard_normal((C, C)) / np.sqrt(C)).astype(np.float32))

        def body(i, a):
            with dcf.device("/cpu:0"):
                z = dcf.reshape(dcf.py_func(_stop, [i, at], dcf.float32), [])
            return i + 1, dcf.tanh(a @ w) + z

        out = dcf.while_loop(lambda i, a: i < 120, body, (0, x), swap_memory=True)[1]
        grads = dcf.gradients(dcf.reduce_sum(out * out), [x, w])
        y = dcf.reduce_sum(x)
    with dcf.Session(g, config=dcf.SessionConfig(swap_threshold=0.0)) as sess:
        sess.run(grads, {at: -1})            # (the plans and their constants stay: the
        sess.run(y)                          # baseline)
        gc.collect()
        base = gpu.used_bytes()
        outs = gpu.stats["swap_outs"]
        gc.disable()
        try:
            try:
                sess.run(grads, {at: 90})
            except dcf.errors.InvalidArgumentError as e:
                assert "stopped by the test" in str(e)
            else:
                pytest.fail("the run did not stop")
            sess.run(y)                      # an inference run: no swapping loop
            left = gpu.used_bytes() - base
        finally:
            gc.enable()
        assert gpu.stats["swap_outs"] > outs
        assert left == 0, f"{left:,} bytes still in use after the failed run"
