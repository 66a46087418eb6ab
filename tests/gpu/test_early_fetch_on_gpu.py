"""On a real GPU, a run that fetches a value made early in the step (its loss) returns
once the host has enqueued the step and that value's copy is done, while the GPU still
computes the rest; the next run's kernels queue behind it (dcf/fused.py, early
fetches). tests/core/test_early_fetch.py checks the order of the copies on the stand-in."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf import gpu_devices

N, CHAIN = 4096, 24


def _graph(rng):
    """loss = sum(x @ a), then CHAIN products z <- z @ diag(d) (full 4096^3 GEMMs, ~0.1 s
    of GPU work together) written to a variable."""
    d = rng.uniform(0.95, 1.05, N).astype(np.float32)
    x = rng.standard_normal((8, N)).astype(np.float32)
    a = rng.standard_normal((N, 4)).astype(np.float32)
    z0 = rng.standard_normal((N, N)).astype(np.float32)
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        xs = dcf.Variable(x, name="x")
        av = dcf.Variable(a, name="a")
        dm = dcf.Variable(np.diag(d), name="d")
        sink = dcf.Variable(z0, name="sink")
        loss = dcf.reduce_sum(dcf.matmul(xs.read_value(), av.read_value()))
        z = sink.read_value()
        dr = dm.read_value()
        for _ in range(CHAIN):
            z = dcf.matmul(z, dr)
        step = sink.assign(z).op
        read = sink.read_value()
        init = dcf.global_variables_initializer()
    want_loss = float((x.astype(np.float64) @ a.astype(np.float64)).sum())
    return g, init, loss, step, read, z0, d, want_loss


def test_a_run_that_fetches_its_loss_returns_while_the_gpu_works(rng):
    if gpu_devices.is_fake():
        pytest.skip("the stand-in's copies and kernels complete at once")
    from dcf.actors.gpu import GpuDevice

    g, init, loss, step, read, z0, d, want_loss = _graph(rng)
    gpu = GpuDevice.get(0)
    with dcf.Session(graph=g) as sess:
        sess.run(init)
        sess.run([loss, step])                 # warm-up: kernels and handles made
        gpu.compute.synchronize()
        busy = []
        for _ in range(2):
            got = sess.run([loss, step])[0]
            busy.append(not gpu.compute.done)  # the products were still running
            np.testing.assert_allclose(got, want_loss, rtol=1e-4)
        assert busy == [True, True]
        gpu.compute.synchronize()
        z = sess.run(read)
    # three runs of CHAIN products each, in order: z0 diag(d)^(3 CHAIN)
    want = z0.astype(np.float64) * d.astype(np.float64) ** (3 * CHAIN)
    np.testing.assert_allclose(z, want, rtol=2e-3, atol=1e-3)
