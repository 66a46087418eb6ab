"""tests/core/test_interrupt.py's GPU case on this machine's GPUs (two where there are,
else both halves on /gpu:0): Ctrl-C stops a run once, on the event loop (traced) and
inline, and the session runs again."""

from __future__ import annotations

import pytest

from tests.core.test_interrupt import interrupt_round_trip

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("trace", [True, False])
def test_interrupt_stops_a_run_on_gpus(trace, gpu_count, caplog) -> None:
    interrupt_round_trip(("/gpu:0", "/gpu:1" if gpu_count > 1 else "/gpu:0"), trace, caplog)
