"""Ctrl-C during a synchronous run: the interrupt comes out of `Session.run` once, the run
stops, and the session runs again and closes cleanly (no second KeyboardInterrupt at
close, no "Task exception was never retrieved" report).

The interrupt is a real SIGINT sent to the main thread (`signal.pthread_kill`: Python's
handler raises KeyboardInterrupt there, also where it waits on a lock), once the run is
inside its loop -- a py_func in the body says so -- and the loop is long enough never to
end first.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading

import numpy as np
import pytest

import dcf
from dcf import session as session_mod

LOOPS = ["uvloop", "asyncio"]


def _loop_kind(kind: str, monkeypatch) -> None:
    if kind == "uvloop":
        pytest.importorskip("uvloop")
    else:
        monkeypatch.setattr(session_mod, "_new_loop", asyncio.new_event_loop)


def _graph(started: threading.Event, devices=("/cpu:0", "/cpu:1")):
    """Newton's iteration for sqrt(x) over two devices, n iterations; the body tells
    `started` when it runs."""
    x = dcf.placeholder(dcf.float64, (None,), name="x")
    n = dcf.placeholder(dcf.int32, (), name="n")

    def mark(i):
        if i >= 3:
            started.set()
        return i

    def body(i, y):
        with dcf.device(devices[1]):
            z = x / y
        i = dcf.reshape(dcf.py_func(mark, [i], dcf.int32), [])
        with dcf.device(devices[0]):
            return i + 1, 0.5 * (y + z)

    with dcf.device(devices[0]):
        y0 = x + 1.0
    _, y = dcf.while_loop(lambda i, y: i < n, body, (0, y0), parallel_iterations=4)
    return x, n, y


def _interrupt_when(started: threading.Event) -> threading.Thread:
    def go():
        if started.wait(30):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def _again_and_close(sess, run, expected) -> None:
    """The session's next run and its close, where a second KeyboardInterrupt (the first
    run's, left pending) fails this test instead of stopping pytest."""
    try:
        np.testing.assert_allclose(run(), expected)
        sess.close()
    except KeyboardInterrupt:
        pytest.fail("a second KeyboardInterrupt came out after the interrupted run")


def _nothing_pending(sess) -> None:
    """No task of the interrupted run is left on the session's private loop (each of its
    partitions has unwound, its device's step ended)."""
    left = [t for t in asyncio.all_tasks(sess._loop) if not t.done()]
    assert not left, left


def _no_unretrieved(caplog) -> None:
    gc.collect()
    bad = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert not bad, bad


pytestmark = pytest.mark.timeout(60)


def interrupt_round_trip(devices: tuple, trace: bool, caplog, **config) -> None:
    """A run of _graph over `devices`, one interrupted once its loop runs, then another
    run and the session's close: the values are sqrt(x), the interrupt comes out once,
    nothing of the interrupted run is left on the session's loop (where it ran on one),
    no task's exception goes unretrieved."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    started = threading.Event()
    x, n, y = _graph(started, devices)
    data = np.array([2.0, 9.0, 30.0])
    opts = dcf.RunOptions(trace=trace)
    sess = dcf.Session(config=dcf.SessionConfig(**config))
    np.testing.assert_allclose(sess.run(y, {x: data, n: 30}, options=opts), np.sqrt(data))
    started.clear()
    t = _interrupt_when(started)
    with pytest.raises(KeyboardInterrupt):
        sess.run(y, {x: data, n: 10**9}, options=opts)
    t.join(5)
    if sess._loop is not None:
        _nothing_pending(sess)
    _again_and_close(sess, lambda: sess.run(y, {x: data, n: 30}, options=opts), np.sqrt(data))
    _no_unretrieved(caplog)


@pytest.mark.parametrize("kind", LOOPS)
@pytest.mark.parametrize("compiled", [True, False])
def test_interrupt_stops_the_run_once(kind, compiled, monkeypatch, caplog) -> None:
    # traced: the run stays on the event loop (no inline path) with compiled frames too
    _loop_kind(kind, monkeypatch)
    interrupt_round_trip(("/cpu:0", "/cpu:1"), True, caplog, compile_frames=compiled)


@pytest.mark.parametrize("trace", [True, False])
def test_interrupt_stops_a_run_on_gpus(trace, fake_gpus, caplog) -> None:
    """The same over two (stand-in) GPUs: on the event loop (traced: the GPUs' actors)
    and without one (the GPUs' fused plan run inline)."""
    interrupt_round_trip(("/gpu:0", "/gpu:1"), trace, caplog)


def test_interrupt_while_waiting_on_the_sessions_loop_thread(monkeypatch, caplog) -> None:
    """A session first used inside a running event loop runs on a loop thread of its own;
    an interrupt of the thread that waits for it cancels the run there too."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    started = threading.Event()
    x, n, y = _graph(started)
    data = np.array([4.0, 16.0])
    opts = dcf.RunOptions(trace=True)
    sess = dcf.Session()

    async def inside_a_loop():
        return sess.run(y, {x: data, n: 30}, options=opts)

    np.testing.assert_allclose(asyncio.run(inside_a_loop()), [2.0, 4.0])
    assert sess._thread is not None                 # the session's loop thread exists
    started.clear()
    t = _interrupt_when(started)
    with pytest.raises(KeyboardInterrupt):
        sess.run(y, {x: data, n: 10**9}, options=opts)
    t.join(5)
    _again_and_close(sess, lambda: sess.run(y, {x: data, n: 30}, options=opts), [2.0, 4.0])
    _no_unretrieved(caplog)
