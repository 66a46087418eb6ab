"""tests/core/test_async_sessions.py's cancelled and closed runs with the loop's work on
the GPUs: a run cancelled by its caller stops while a run beside it finishes, and
closing the session under runs in flight cancels them, with kernels and copies queued
on the GPUs' streams."""

from __future__ import annotations

import asyncio

import pytest

import dcf
from tests.core.test_async_sessions import _ticking_loop, cancel_mid_run, close_mid_run


def _devices() -> list[str]:
    from dcf import gpu_devices

    return ["/cpu:0", f"/gpu:{min(gpu_devices.count(), 2) - 1}"]


@pytest.mark.parametrize("compile_frames", [True, False])
def test_a_cancelled_run_on_gpus_stops_and_the_session_goes_on(compile_frames):
    calls: list = []
    n, out = _ticking_loop(_devices(), lambda v: (calls.append(1), v)[1])

    async def go():
        async with dcf.AsyncSession(
                config=dcf.SessionConfig(compile_frames=compile_frames)) as sess:
            await cancel_mid_run(sess, n, out, lambda: len(calls))
    asyncio.run(go())


@pytest.mark.parametrize("compile_frames", [True, False])
def test_closing_the_session_cancels_runs_in_flight_on_gpus(compile_frames):
    calls: list = []
    n, out = _ticking_loop(_devices(), lambda v: (calls.append(1), v)[1])
    sess = dcf.AsyncSession(config=dcf.SessionConfig(compile_frames=compile_frames))
    asyncio.run(close_mid_run(sess, n, out, lambda: len(calls)))
