"""An AsyncSession on a cluster runs on the cluster's I/O loop: cancelling the task that
awaits a run cancels the run there, and the CancelledError comes once it has unwound --
as without a cluster -- not while the run still goes on in the I/O loop's thread (where a
py_func of it could still be running beside the caller's code)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import dcf

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


def test_a_cancelled_run_has_stopped_when_its_await_raises():
    inside, release = threading.Event(), threading.Event()
    state = {"in_py_func": False}

    def step(i):
        state["in_py_func"] = True
        try:
            if i >= 3:
                inside.set()
                release.wait(30)        # the run is busy here when it is cancelled
            return i
        finally:
            state["in_py_func"] = False

    g = dcf.Graph()
    with g.as_default():
        with dcf.device("/job:worker/task:0/cpu:0"):
            one = dcf.constant(1)
        n = dcf.placeholder(dcf.int32, ())
        out = dcf.while_loop(
            lambda i: i < n,
            lambda i: dcf.reshape(dcf.py_func(step, [i + one], dcf.int32), []), 0)

    async def main(cluster) -> dict:
        async with dcf.AsyncSession(g, cluster=cluster) as sess:
            run = asyncio.ensure_future(sess.run(out, {n: 10 ** 9}))
            await asyncio.get_running_loop().run_in_executor(None, inside.wait, 30)
            run.cancel()
            # (the py_func lets go a moment later; the await must wait for that)
            asyncio.get_running_loop().call_later(0.2, release.set)
            seen = {}
            try:
                await run
            except asyncio.CancelledError:
                seen["in_py_func_when_cancelled"] = state["in_py_func"]
                seen["runs_in_flight"] = len(sess._running)
            release.set()
            seen["next"] = await sess.run(out, {n: 2})
            return seen

    with dcf.Cluster.local(1) as cluster:
        seen = asyncio.run(main(cluster))
    assert seen == {"in_py_func_when_cancelled": False, "runs_in_flight": 0,
                    "next": np.int32(2)}
