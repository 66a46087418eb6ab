"""Ctrl-C during a synchronous run: the interrupt comes out of `Session.run` once, the run
stops, and the session runs again and closes cleanly (no second KeyboardInterrupt at
close, no "Task exception was never retrieved" report).

The interrupt is a real SIGINT sent to the main thread (`signal.pthread_kill`), once the
run is inside its loop -- a py_func in the body says so -- and the loop is long enough
never to end first. The body's py_func tells it through a plain list, no lock: a
KeyboardInterrupt raised inside `Event.set()` can leave the event's lock held (the next
run would then wait on it forever -- that is this test's own hazard, not dcf's).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
import time

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


def _graph(started: list, devices=("/cpu:0", "/cpu:1")):
    """Newton's iteration for sqrt(x) over two devices, n iterations; the body appends to
    `started` once it has run three iterations."""
    x = dcf.placeholder(dcf.float64, (None,), name="x")
    n = dcf.placeholder(dcf.int32, (), name="n")

    def mark(i):
        if i >= 3 and not started:
            started.append(int(i))
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


def _wait_for(flag: list, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while not flag:
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def _interrupt_when(started: list, delay: float = 0.0) -> threading.Thread:
    """SIGINT to the main thread once `started` has an entry (and `delay` s more: a
    signal that comes just before a blocking call is acted on when the call returns)."""
    def go():
        if _wait_for(started):
            time.sleep(delay)
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
    started: list = []
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
    started: list = []
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


def _slow(inside: list, caught: list):
    """A py_func body that sleeps 0.2 s (appending its argument to `inside` first) and
    records in `caught` a KeyboardInterrupt raised inside it."""
    def slow(v):
        inside.append(v.item())
        try:
            time.sleep(0.2)
        except KeyboardInterrupt:
            caught.append(v.item())
            raise
        return v
    return slow


def _sleeping_graph(inside: list, caught: list):
    """A loop whose body's py_func is `_slow`."""
    n = dcf.placeholder(dcf.int32, (), name="n")
    slow = _slow(inside, caught)

    def body(i, s):
        j = dcf.reshape(dcf.py_func(slow, [i], dcf.int32), [])
        return j + 1, s + dcf.cast(j, dcf.float64)

    _, s = dcf.while_loop(lambda i, s: i < n, body, (0, dcf.constant(0.0, dcf.float64)))
    return n, s


PATHS = ["uvloop", "asyncio", "inline"]


def _path(path: str, monkeypatch) -> dcf.RunOptions:
    """The run options that take `path`: traced runs go on the event loop (of the kind
    asked for), untraced compiled ones run inline with no loop."""
    if path == "inline":
        return dcf.RunOptions()
    _loop_kind(path, monkeypatch)
    return dcf.RunOptions(trace=True)


@pytest.mark.parametrize("path", PATHS)
def test_interrupt_is_never_raised_inside_user_code(path, monkeypatch) -> None:
    """The first Ctrl-C asks the run to stop instead of raising inside whatever runs
    (Python's handler would raise it in the py_func's sleep: a user's `with lock:` there
    could be left locked); the py_func ends its call, the run stops at its next yield or
    check, KeyboardInterrupt comes out of run, and SIGINT's handler is Python's own
    again."""
    opts = _path(path, monkeypatch)
    inside: list = []
    caught: list = []
    n, s = _sleeping_graph(inside, caught)
    sess = dcf.Session()
    t = _interrupt_when(inside)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        sess.run(s, {n: 10**6}, options=opts)
    t.join(5)
    assert caught == []                     # not raised inside the py_func
    assert len(inside) <= 3, inside         # stopped within a call or two of the signal
    assert time.monotonic() - start < 10
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    _again_and_close(sess, lambda: sess.run(s, {n: 2}, options=opts), 1.0)


@pytest.mark.parametrize("path", PATHS)
def test_a_second_interrupt_raises_where_it_lands(path, monkeypatch) -> None:
    """A run stuck in user code (a py_func that sleeps long) stops for the first Ctrl-C
    only at its next yield or check; a second Ctrl-C raises KeyboardInterrupt inside it
    at once -- the escape hatch -- and the session still runs again."""
    opts = _path(path, monkeypatch)
    inside: list = []
    caught: list = []
    n, s = _sleeping_graph(inside, caught)
    sess = dcf.Session()
    main = threading.main_thread().ident

    def twice():
        if _wait_for(inside):
            # both well inside the first call's 0.2 s sleep: a signal that comes just
            # before a blocking call is acted on only when the call returns (CPython)
            time.sleep(0.05)
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.05)
            signal.pthread_kill(main, signal.SIGINT)

    t = threading.Thread(target=twice, daemon=True)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        sess.run(s, {n: 10**6}, options=opts)
    t.join(5)
    assert caught == [0]                    # the second one was raised inside the call
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    _again_and_close(sess, lambda: sess.run(s, {n: 2}, options=opts), 1.0)


@pytest.mark.parametrize("path", PATHS)
def test_a_handler_of_the_users_own_is_left_alone(path, monkeypatch) -> None:
    """A program that installed its own SIGINT handler keeps it during runs: dcf does not
    replace it (the handler is called, the run goes on to its end)."""
    opts = _path(path, monkeypatch)
    inside: list = []
    caught: list = []
    n, s = _sleeping_graph(inside, caught)
    sess = dcf.Session()
    calls: list = []

    def mine(signum, frame):
        calls.append(signum)

    old = signal.signal(signal.SIGINT, mine)
    try:
        t = _interrupt_when(inside)
        assert sess.run(s, {n: 2}, options=opts) == 1.0
        t.join(5)
        assert calls == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, old)
    sess.close()


@pytest.mark.parametrize("path", LOOPS)
def test_an_interrupt_in_a_run_without_a_loop_comes_out_after_it(path, monkeypatch) -> None:
    """A run on the event loop whose graph has no loop has no yield to stop at: a Ctrl-C
    during its one slow py_func comes out of run as KeyboardInterrupt once the run is
    over (not lost, not raised inside the py_func). (Inline, such a run keeps Python's
    own handler: dcf/session.py, run_inline.)"""
    opts = _path(path, monkeypatch)
    inside: list = []
    caught: list = []
    x = dcf.placeholder(dcf.float64, (), name="x")
    y = dcf.reshape(dcf.py_func(_slow(inside, caught), [x * 2.0], dcf.float64), []) + 1.0
    sess = dcf.Session()
    t = _interrupt_when(inside, delay=0.05)
    with pytest.raises(KeyboardInterrupt):
        sess.run(y, {x: 1.0}, options=opts)
    t.join(5)
    assert caught == [] and inside == [2.0]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    inside.clear()
    _again_and_close(sess, lambda: sess.run(y, {x: 2.0}, options=opts), 5.0)
