"""A closed session lets go of its devices' state (dcf/session.py, AsyncSession.close):
`with dcf.Session(...) as sess:` leaves `sess` bound, and the closed session kept its
variables and the constants its GPU plans had uploaded on the device -- in use under the
next session's gpu_memory_limit (the pool is one per GPU and process) -- until the name
was rebound. Stand-in GPUs."""

from __future__ import annotations

import asyncio
import gc

import numpy as np
import pytest

import dcf


def _graph():
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        v = dcf.Variable(np.ones((256, 256), np.float32))            # 256 KiB
        c = dcf.constant(np.full((160, 128), 0.5, np.float32))       # 80 KiB
        y = dcf.reduce_sum(c * 2.0) + dcf.reduce_sum(v)
        init = dcf.global_variables_initializer()
    return g, y, init


def test_a_closed_session_still_bound_holds_no_device_memory(fake_gpus):
    from dcf.actors.gpu import GpuDevice

    gpu = GpuDevice.get(0)
    gc.collect()
    base = gpu.used_bytes()
    g, y, init = _graph()
    with dcf.Session(g) as sess:
        sess.run(init)
        assert sess.run(y) == 256 * 256 + 160 * 128
        assert gpu.used_bytes() - base >= 256 * 256 * 4 + 160 * 128 * 4
    gc.collect()
    assert gpu.used_bytes() == base            # `sess` is still bound here
    with pytest.raises(RuntimeError, match="closed"):
        sess.run(y)


def test_a_closed_async_session_still_bound_holds_no_device_memory(fake_gpus):
    from dcf.actors.gpu import GpuDevice

    gpu = GpuDevice.get(0)
    gc.collect()
    base = gpu.used_bytes()
    g, y, init = _graph()

    async def main():
        async with dcf.AsyncSession(g) as sess:
            await sess.run(init)
            assert await sess.run(y) == 256 * 256 + 160 * 128
        gc.collect()
        return sess, gpu.used_bytes()

    sess, used = asyncio.run(main())
    assert used == base
