"""tests/core/test_interrupt.py's GPU case on this machine's GPUs (two where there are,
else both halves on /gpu:0): Ctrl-C stops a run once, on the event loop (traced) and
inline, and the session runs again."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

import dcf
from tests.core.test_interrupt import _again_and_close, _graph, _interrupt_when, _no_unretrieved

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("trace", [True, False])
def test_interrupt_stops_a_run_on_gpus(trace, gpu_count, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    started = threading.Event()
    x, n, y = _graph(started, ("/gpu:0", "/gpu:1" if gpu_count > 1 else "/gpu:0"))
    data = np.array([2.0, 9.0, 30.0])
    opts = dcf.RunOptions(trace=trace)
    sess = dcf.Session()
    np.testing.assert_allclose(sess.run(y, {x: data, n: 30}, options=opts), np.sqrt(data))
    started.clear()
    t = _interrupt_when(started)
    with pytest.raises(KeyboardInterrupt):
        sess.run(y, {x: data, n: 10**9}, options=opts)
    t.join(5)
    _again_and_close(sess, lambda: sess.run(y, {x: data, n: 30}, options=opts), np.sqrt(data))
    _no_unretrieved(caplog)
