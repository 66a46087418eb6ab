"""Review by use, round 5: one session driven from several threads and event loops, as
TF1 users do (TF1's Session.run is thread-safe): variable updates that lose none of
each other's increments, one device actor (one set of variables) and one queue whatever
threads start them, queues shared by runs in two event loops or closed from another
thread, a queue's close as TF1 spells it, close() of a session from other threads and
event loops (it returns once runs have stopped), and RunOptions checked where made."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time

import numpy as np
import pytest

import dcf
from dcf.errors import CancelledError, OutOfRangeError


@contextlib.contextmanager
def _threads_switching_often():
    """Threads switch every microsecond (the default is every 5 ms): a read-modify-write
    that is not atomic loses updates within a few runs instead of a few thousand."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _in_threads(n: int, work, timeout: float = 30) -> None:
    """`work(k)` in threads k = 0..n-1: none still running after `timeout` s each, none
    raised."""
    errors: list = []

    def guarded(k):
        try:
            work(k)
        except BaseException as e:      # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors


def test_variable_updates_from_eight_threads_lose_no_increment(monkeypatch):
    """TF1's resource variables update under the variable's lock: 8 threads running
    assign_add, assign_sub, scatter_add and Adam's update (one op) on one Session (each
    run inline in its own thread) end where as many updates in a row end. (Reading the
    value to update lets other threads run, as a thread switch there would.)"""
    from dcf.ops import state_ops
    from dcf.ops.state_ops import apply_adam

    for name in ("_read_kernel", "_own_buffer"):
        monkeypatch.setattr(state_ops, name, _then_other_threads(getattr(state_ops, name)))

    count = dcf.Variable(np.float64(0.0))
    down = dcf.Variable(np.int64(0))
    table = dcf.Variable(np.zeros(3, np.float64))
    w, m, v = dcf.Variable(np.ones(2)), dcf.Variable(np.zeros(2)), dcf.Variable(np.zeros(2))
    grad = np.array([0.1, -0.3])
    step = dcf.group(count.assign_add(1.0), down.assign_sub(np.int64(2)),
                     dcf.scatter_add(table, [0, 2], np.array([1.0, 0.5])),
                     apply_adam(w, m, v, 0.01, grad, 0.9, 0.999, 1e-8))
    runs = 150
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        with _threads_switching_often():
            _in_threads(8, lambda k: [sess.run(step) for _ in range(runs)])
        got = sess.run([count, down, table, w, m])
    n = 8 * runs
    assert got[0] == n
    assert got[1] == -2 * n
    np.testing.assert_array_equal(got[2], [n, 0.0, 0.5 * n])
    want_w, want_m, want_v = np.ones(2), np.zeros(2), np.zeros(2)
    for _ in range(n):
        want_m = want_m * 0.9 + grad * 0.1
        want_v = want_v * 0.999 + grad * grad * 0.001
        want_w = want_w - 0.01 * want_m / (np.sqrt(want_v) + 1e-8)
    np.testing.assert_allclose(got[3], want_w, rtol=1e-9)
    np.testing.assert_allclose(got[4], want_m, rtol=1e-9)


def _then_other_threads(fn):
    def then_let_others_run(*args, **kwargs):
        out = fn(*args, **kwargs)
        time.sleep(0)
        return out
    return then_let_others_run


def test_first_runs_in_several_threads_share_one_device_actor(monkeypatch):
    """Threads whose first runs start the session's devices together (a GPU's actor takes
    a while to make): each device gets one actor, so the variables one run initialized
    are the ones every plan reads (two actors of /cpu:0 made the plans built with the
    other one read a variable 'not initialized')."""
    from dcf.actors.device_actor import DeviceActor

    class SlowToStart(DeviceActor):
        def __init__(self, *args, **kwargs):
            time.sleep(0.05)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr("dcf.session.DeviceActor", SlowToStart)
    v = dcf.Variable(np.float64(2.0))
    x = dcf.placeholder(dcf.float64, [])
    outs = [v * float(k) + x for k in range(4)]
    init = dcf.global_variables_initializer()
    warm = x + 1.0
    with dcf.Session() as sess:
        barrier = threading.Barrier(4)

        def first_run(k):
            barrier.wait()
            sess.run(warm, {x: 0.0}) if k else sess.run(init)

        _in_threads(4, first_run)
        sess.run(init)
        assert [sess.run(o, {x: 1.0}) for o in outs] == [1.0, 3.0, 5.0, 7.0]
        assert len({id(a.resources) for a in sess._async._actors.values()}) == 1


def test_a_dequeue_waiting_in_one_event_loop_wakes_on_an_enqueue_from_another():
    """One AsyncSession used from two threads' event loops: the consumer's dequeue waits
    in loop A, the producer enqueues from loop B. The waiting op must wake at once (its
    future was set from the wrong thread: loop A slept on, forever without a timeout)."""
    q = dcf.FIFOQueue(2, dcf.float64)
    x = dcf.placeholder(dcf.float64, [])
    enqueue, dequeue = q.enqueue(x), q.dequeue()
    sess = dcf.AsyncSession()
    got: dict = {}
    waiting = threading.Event()

    async def consume():
        run = asyncio.ensure_future(sess.run(dequeue))
        await asyncio.sleep(0.05)       # (the dequeue now waits on the empty queue)
        waiting.set()
        got["value"] = await run

    consumer = threading.Thread(target=asyncio.run, args=(consume(),), daemon=True)
    consumer.start()
    assert waiting.wait(timeout=10)
    asyncio.run(sess.run(enqueue, {x: 7.0}))
    consumer.join(timeout=1.0)
    assert got.get("value") == 7.0, "the dequeue in the other event loop did not wake"


def test_dequeues_that_time_out_leave_no_waiter_behind():
    """A consumer polling an empty queue with a timeout (a common TF1 loop): each run that
    gave up must not leave its waiter in the queue's list for good."""
    q = dcf.FIFOQueue(2, dcf.float64, name="polled")
    dequeue = q.dequeue()
    with dcf.Session() as sess:
        for _ in range(100):
            with pytest.raises(dcf.errors.DeadlineExceededError):
                sess.run(dequeue, options=dcf.RunOptions(timeout_s=0.002))
        store = sess._async._actors["/cpu:0"].resources.queues["polled"]
        assert len(store._waiters) <= 64


@pytest.mark.parametrize("cancel", [False, True])
def test_queue_close_as_tf1_spells_it_cancels_pending_and_later_enqueues(cancel):
    """`q.close(cancel_pending_enqueues=...)` (TF1's signature): an enqueue waiting on the
    full queue and later ones fail with CancelledError (TF1's error for an enqueue to a
    closed queue); dequeues take what is left, then fail with OutOfRangeError."""
    q = dcf.FIFOQueue(1, dcf.float64)
    x = dcf.placeholder(dcf.float64, [])
    enqueue, dequeue = q.enqueue(x), q.dequeue()
    close = q.close(cancel_pending_enqueues=cancel)
    with dcf.Session() as sess:
        sess.run(enqueue, {x: 1.0})
        pending: dict = {}

        def producer():
            try:
                sess.run(enqueue, {x: 2.0})
            except BaseException as e:  # noqa: BLE001 - what the run raised is the test
                pending["error"] = e

        t = threading.Thread(target=producer)
        t.start()
        time.sleep(0.1)                 # (the enqueue now waits on the full queue)
        sess.run(close)
        t.join(timeout=10)
        assert isinstance(pending.get("error"), CancelledError), pending
        assert "QueueEnqueueV2 'enqueue'" in str(pending["error"])
        with pytest.raises(CancelledError, match="closed"):
            sess.run(enqueue, {x: 3.0})
        assert sess.run(dequeue) == 1.0
        with pytest.raises(OutOfRangeError):
            sess.run(dequeue)
    with pytest.raises(TypeError, match="cancel_pending_enqueues"):
        q.close(cancel_pending_enqueues="yes")


def test_closing_a_queue_from_another_thread_ends_a_waiting_dequeue():
    """TF1's way to stop a consumer thread: the main thread closes the queue, and the
    consumer's waiting dequeue fails with OutOfRangeError. The close runs inline in the
    main thread, with no event loop: the consumer's loop (in its own thread) must still
    be woken (it slept on for good)."""
    q = dcf.FIFOQueue(2, dcf.float64)
    dequeue, close = q.dequeue(), q.close()
    with dcf.Session() as sess:
        got: dict = {}

        def consumer():
            try:
                got["value"] = sess.run(dequeue)
            except BaseException as e:  # noqa: BLE001 - what the run raised is the test
                got["error"] = e

        t = threading.Thread(target=consumer, daemon=True)
        t.start()
        time.sleep(0.1)                 # (the dequeue now waits on the empty queue)
        sess.run(close)
        t.join(timeout=1.0)
        assert isinstance(got.get("error"), OutOfRangeError), got


def test_closing_an_async_session_in_one_event_loop_cancels_a_run_waiting_in_another():
    """close() awaited in loop A while a run of the same AsyncSession waits (a dequeue on
    an empty queue) in loop B of another thread: the run is cancelled at once (the cancel
    was made from the wrong thread, loop B slept on: close gave up after 10 s and the run
    hung for good)."""
    q = dcf.FIFOQueue(2, dcf.float64)
    dequeue = q.dequeue()
    sess = dcf.AsyncSession()
    got: dict = {}
    waiting = threading.Event()

    async def consume():
        run = asyncio.ensure_future(sess.run(dequeue))
        await asyncio.sleep(0.05)       # (the dequeue now waits on the empty queue)
        waiting.set()
        try:
            got["value"] = await run
        except BaseException as e:      # noqa: BLE001 - what the run raised is the test
            got["error"] = e

    consumer = threading.Thread(target=asyncio.run, args=(consume(),), daemon=True)
    consumer.start()
    assert waiting.wait(timeout=10)
    asyncio.run(asyncio.wait_for(sess.close(), 1.0))
    consumer.join(timeout=1.0)
    assert isinstance(got.get("error"), CancelledError), got


def test_close_returns_once_an_inline_run_of_another_thread_has_stopped():
    """Session.close() documents that a run in flight in another thread has stopped
    before it returns. A compiled run (inline in its own thread) stops at its next
    check: close must wait for that, not return while the run's py_func still runs
    (its effects landed after close had returned)."""
    calls: list = []

    def slow(a):
        time.sleep(0.02)
        calls.append(1)
        return a

    n = dcf.placeholder(dcf.int32, [])
    out = dcf.while_loop(lambda i, acc: i < n,
                         lambda i, acc: (i + 1, dcf.reshape(dcf.py_func(slow, [acc],
                                                                        dcf.float64), []) + 1.0),
                         [0, dcf.constant(0.0, dcf.float64)])[1]
    sess = dcf.Session()
    assert sess.run(out, {n: 2}) == 2.0
    got: dict = {}

    def work():
        try:
            got["value"] = sess.run(out, {n: 10**6})
        except BaseException as e:      # noqa: BLE001 - what the run raised is the test
            got["error"] = e

    t = threading.Thread(target=work)
    t.start()
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:    # (the run is under way)
        time.sleep(0.005)
    sess.close()
    made = len(calls)
    t.join(timeout=10)
    assert isinstance(got.get("error"), CancelledError), got
    assert len(calls) == made, "a py_func of the run went on after close() returned"


@pytest.mark.parametrize("kwargs, exc", [
    (dict(timeout_s="1"), TypeError), (dict(timeout_s=True), TypeError),
    (dict(timeout_s=0), ValueError), (dict(timeout_s=-1.0), ValueError),
    (dict(timeout_s=float("nan")), ValueError), (dict(trace="yes"), TypeError)])
def test_run_options_refuse_a_timeout_that_is_no_number_of_seconds(kwargs, exc):
    """RunOptions is checked where it is made: a string timeout failed deep in the run
    ("unsupported operand type(s) for +"), and timeout_s=0 or -1 raised
    DeadlineExceededError after the run had done its work (an assign_add counted)."""
    with pytest.raises(exc, match=r"RunOptions\((timeout_s|trace)"):
        dcf.RunOptions(**kwargs)
    assert dcf.RunOptions(timeout_s=0.5).timeout_s == 0.5
    assert dcf.RunOptions(timeout_s=float("inf"), trace=True).trace is True


def test_runs_of_two_threads_that_first_touch_a_queue_together_share_it(monkeypatch):
    """Thread 1's enqueue_many (on the session's loop) and thread 2's size() (inline in
    its own thread) both find the queue not yet made: one queue must come of it (each
    made its own, and the elements went into the one the dictionary then dropped)."""
    from dcf import queues

    made = queues.QueueStore.__init__

    def slow_to_make(self, *args, **kwargs):
        time.sleep(0.05)
        made(self, *args, **kwargs)

    monkeypatch.setattr(queues.QueueStore, "__init__", slow_to_make)
    q = dcf.FIFOQueue(5, dcf.float64)
    fill, size, dequeue = q.enqueue_many([[1.0, 2.0, 3.0]]), q.size(), q.dequeue()
    with dcf.Session() as sess:
        sess.run(dcf.constant(0.0) + 1.0)           # (the device's actor is made)
        seen: dict = {}

        def first_touch(k):
            if k == 0:
                sess.run(fill)
            else:
                time.sleep(0.01)
                seen["size"] = sess.run(size)

        _in_threads(2, first_touch)
        assert seen["size"] in (0, 3)
        assert sess.run(size) == 3
        assert sess.run(dequeue) == 1.0


@pytest.mark.parametrize("config", [dict(), dict(compile_frames=False)],
                         ids=["compiled", "tagged"])
def test_several_threads_closing_one_session_at_once_all_return(config):
    """Runs in flight on the session's loop (dequeues waiting, loops) and three threads
    closing the session together (a `with` block's exit and a worker's `finally`): every
    close returns without error and every run is cancelled (a second close found the
    loop the first had just dropped: AttributeError, or it waited on it for good)."""
    n = dcf.placeholder(dcf.int32, [])
    loop = dcf.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, a + 1.0), [0, 0.0])[1]
    dequeue = dcf.FIFOQueue(2, dcf.float64).dequeue()
    sess = dcf.Session(config=dcf.SessionConfig(**config))
    assert sess.run(loop, {n: 3}) == 3.0
    runs: list = []

    def run(k):
        try:
            sess.run(dequeue) if k % 2 else sess.run(loop, {n: 10**8})
        except BaseException as e:      # noqa: BLE001 - what the run raised is the test
            runs.append(e)

    runners = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(4)]
    for t in runners:
        t.start()
    time.sleep(0.2)
    barrier = threading.Barrier(3)
    failed: list = []

    def close():
        barrier.wait()
        try:
            sess.close()
        except BaseException as e:      # noqa: BLE001 - reported by the test
            failed.append(e)

    closers = [threading.Thread(target=close, daemon=True) for _ in range(3)]
    for t in closers:
        t.start()
    for t in closers + runners:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in closers + runners)
    assert not failed, failed
    # (cancelled in flight; or closed before it began, on a machine slow to start it)
    assert len(runs) == 4 and all(isinstance(e, CancelledError) or "closed" in str(e)
                                  for e in runs), runs


def test_a_py_func_closing_its_session_while_another_thread_closes_it_does_not_deadlock():
    # the other thread's close waits for the run; the run's py_func closes the session
    # too, and must not wait for that close (it held the closers' lock: both waited)
    g = dcf.Graph()
    started = threading.Event()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, ())

        def slow(v):
            started.set()
            time.sleep(0.2)
            sess.close()
            return v

        y = dcf.py_func(slow, [x], dcf.float32)
    sess = dcf.Session(g, config=dcf.SessionConfig(compile_frames=False))
    results = []

    def runner():
        try:
            results.append(sess.run(y, {x: 1.0}))
        except dcf.errors.CancelledError as e:
            results.append(e)

    threads = [threading.Thread(target=runner, daemon=True),
               threading.Thread(target=lambda: (started.wait(5), sess.close()), daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert len(results) == 1
