"""Session edges a TF1 user meets: a queue handed between threads of one Session, a run
that ends past its deadline with no loop to stop at, arrays that stay the caller's
(feeds) or become the caller's (fetches), empty fetches, out-of-range feeds, and fetches
from inside a loop."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import dcf
from dcf.errors import DeadlineExceededError, InvalidArgumentError

PATHS = [
    pytest.param(dict(), None, id="compiled"),
    pytest.param(dict(compile_frames=False), None, id="tagged"),
    pytest.param(dict(), dcf.RunOptions(trace=True), id="traced"),
]


def _sleeping(seconds: float):
    def fn(x):
        time.sleep(seconds)
        return x
    return fn


# ------------------------------------------------------------------ threads
def test_a_queue_hands_values_between_threads_of_one_session():
    """One thread dequeues (its run waits), another enqueues on the same Session: the
    second run must not wait for the first to end (it would wait forever)."""
    q = dcf.FIFOQueue(4, [dcf.float32], shapes=[[]])
    x = dcf.placeholder(dcf.float32, [])
    enqueue, dequeue = q.enqueue([x]), q.dequeue()
    got: list = []
    with dcf.Session() as sess:
        consumer = threading.Thread(target=lambda: got.extend(sess.run(dequeue)
                                                              for _ in range(3)))
        consumer.start()
        time.sleep(0.2)
        for v in (1.0, 2.0, 3.0):
            producer = threading.Thread(target=sess.run, args=(enqueue, {x: v}))
            producer.start()
            producer.join(timeout=10)
            assert not producer.is_alive(), "an enqueue waited for the dequeue's run"
        consumer.join(timeout=10)
        assert not consumer.is_alive()
        assert got == [1.0, 2.0, 3.0]
        assert sess.run(x * 2.0, {x: 4.0}) == 8.0      # from this thread, after it all
    assert sess._thread is None


def test_a_run_inside_a_run_of_the_same_session_is_an_error_not_a_hang():
    x = dcf.placeholder(dcf.float32, [])
    with dcf.Session() as sess:
        inner = dcf.constant(1.0) + 1.0

        def fn(v):
            return np.float32(v + sess.run(inner, options=dcf.RunOptions(trace=True)))
        y = dcf.py_func(fn, [x], dcf.float32)
        with pytest.raises(Exception, match="inside a run of the same session"):
            sess.run(y, {x: 1.0}, options=dcf.RunOptions(trace=True))


# ------------------------------------------------------------------ deadlines
@pytest.mark.parametrize("config,options", PATHS)
def test_a_run_with_no_loop_that_ends_past_its_deadline_raises(config, options):
    x = dcf.placeholder(dcf.float32, [])
    y = dcf.reshape(dcf.py_func(_sleeping(0.4), [x], dcf.float32), []) * 2.0
    opts = dcf.RunOptions(timeout_s=0.1, trace=bool(options and options.trace))
    with dcf.Session(config=dcf.SessionConfig(**config)) as sess:
        with pytest.raises(DeadlineExceededError, match=r"timeout_s=0\.1"):
            sess.run(y, {x: 1.0}, options=opts)
        assert sess.run(y, {x: 1.5}) == 3.0      # still usable; no deadline, no error


def test_an_async_run_that_ends_past_its_deadline_raises():
    x = dcf.placeholder(dcf.float32, [])
    y = dcf.reshape(dcf.py_func(_sleeping(0.4), [x], dcf.float32), [])

    async def main():
        async with dcf.AsyncSession() as sess:
            with pytest.raises(DeadlineExceededError):
                await sess.run(y, {x: 1.0}, options=dcf.RunOptions(timeout_s=0.1))
            return await sess.run(y, {x: 2.0}, options=dcf.RunOptions(timeout_s=30))
    assert asyncio.run(main()) == 2.0


# ------------------------------------------------------------------ arrays
@pytest.mark.parametrize("config,options", PATHS)
def test_a_fed_array_stays_the_callers_and_what_was_assigned_from_it_does_not_move(
        config, options):
    x = dcf.placeholder(dcf.float32, [3])
    v = dcf.Variable(np.zeros(3, np.float32))
    assign = v.assign(x)
    buf = np.array([1.0, 2.0, 3.0], np.float32)
    with dcf.Session(config=dcf.SessionConfig(**config)) as sess:
        sess.run(v.initializer)
        sess.run(assign, {x: buf}, options=options)
        assert buf.flags.writeable
        buf[:] = 7.0                                 # the caller reuses its buffer
        np.testing.assert_array_equal(sess.run(v, options=options), [1.0, 2.0, 3.0])


@pytest.mark.parametrize("config,options", PATHS)
def test_fetched_arrays_are_the_callers_to_write(config, options):
    v = dcf.Variable(np.zeros((3, 2), np.float32))
    c = dcf.constant(np.ones(2, np.float32))
    scatter = v.scatter_update([1], np.ones((1, 2), np.float32))
    add = v.assign_add(np.ones((3, 2), np.float32))
    want_v = np.array([[1, 1], [2, 2], [1, 1]], np.float32)
    with dcf.Session(config=dcf.SessionConfig(**config)) as sess:
        sess.run(v.initializer)
        fetched = [sess.run(scatter, options=options), sess.run(add, options=options),
                   sess.run(v, options=options), sess.run(c, options=options)]
        for a in fetched:
            assert a.flags.writeable
            a[...] = 100.0
        np.testing.assert_array_equal(sess.run(v, options=options), want_v)
        np.testing.assert_array_equal(sess.run(c, options=options), [1.0, 1.0])
        # the variable's own updates still write in place once nothing else holds it
        del fetched, a
        np.testing.assert_array_equal(sess.run(add, options=options), want_v + 1.0)


# ------------------------------------------------------------------ fetches and feeds
@pytest.mark.parametrize("config,options", PATHS)
def test_empty_fetches_and_fetches_of_fed_tensors_only(config, options):
    x = dcf.placeholder(dcf.float32, [2])
    with dcf.Session(config=dcf.SessionConfig(**config)) as sess:
        assert sess.run([], options=options) == []
        assert sess.run({}, options=options) == {}
        got = sess.run({"a": x, "b": [x]}, {x: [1.0, 2.0]}, options=options)
        np.testing.assert_array_equal(got["a"], [1.0, 2.0])
        np.testing.assert_array_equal(got["b"][0], [1.0, 2.0])


def test_an_out_of_range_int_feed_names_the_placeholder():
    steps = dcf.placeholder(dcf.int32, [], name="steps")
    with dcf.Session() as sess:
        with pytest.raises(TypeError, match="Placeholder 'steps'"):
            sess.run(steps + 1, {steps: 2**40})


def test_a_tensor_inside_a_loop_cannot_be_fetched_but_a_loop_output_can_be_fed():
    box: dict = {}

    def body(i, s):
        box["inner"] = s * 2.0
        return i + 1, box["inner"]
    _, s = dcf.while_loop(lambda i, s: i < 3, body, (0, 1.0), name="L")
    y = s * 10.0
    with dcf.Session() as sess:
        with pytest.raises(InvalidArgumentError, match=r"Mul.*inside while_loop frame 'L'"):
            sess.run(box["inner"])
        assert sess.run(y) == 80.0
        assert sess.run(y, {s: 1.5}) == 15.0        # a loop output is fed like any tensor


def test_a_tensor_array_is_fixed_and_empty_by_default():
    """API.md: TensorArray(dtype, size=0, dynamic_size=False, ...)."""
    ta = dcf.TensorArray(dcf.float32)
    grown = dcf.TensorArray(dcf.float32, dynamic_size=True).write(0, 4.0).write(1, 5.0)
    with dcf.Session() as sess:
        assert sess.run(ta.size()) == 0
        np.testing.assert_array_equal(sess.run(grown.stack()), [4.0, 5.0])
        with pytest.raises(dcf.errors.OutOfRangeError, match="size 0, dynamic_size=False"):
            sess.run(ta.write(0, 1.0).stack())          # out of range of a fixed size 0


def test_fetching_a_variable_adds_no_op_and_no_plan_per_run():
    v = dcf.Variable(np.float32(3.0))
    g = v.graph
    with dcf.Session() as sess:
        sess.run(v.initializer)
        sess.run(v)
        ops, plans = len(g.get_operations()), len(sess._async._plans)
        for _ in range(20):
            assert sess.run(v) == 3.0
            assert sess.run([v, dcf.trainable_variables()[0]]) == [3.0, 3.0]
        assert (len(g.get_operations()), len(sess._async._plans)) == (ops, plans + 1)


def test_a_task_cancelled_by_its_caller_and_by_close_stays_cancelled():
    """aiohttp cancels a handler whose client went away; if the app closes the session
    at that moment, the handler must still end cancelled, not go on after catching
    dcf's CancelledError."""
    n = dcf.placeholder(dcf.int32, ())
    count = dcf.while_loop(lambda i: i < n, lambda i: i + 1, dcf.constant(0))
    log: list = []

    async def handler(sess):
        try:
            await sess.run(count, {n: 2**31 - 1}, options=dcf.RunOptions(trace=True))
        except dcf.errors.DcfError as e:
            log.append(type(e).__name__)
        await asyncio.sleep(0.2)
        log.append("went on")

    async def main():
        sess = dcf.AsyncSession()
        t = asyncio.create_task(handler(sess))
        await asyncio.sleep(0.1)
        t.cancel()
        await sess.close()
        await asyncio.gather(t, return_exceptions=True)
        return t.cancelled()
    if not hasattr(asyncio.Task, "uncancel"):
        pytest.skip("Python < 3.11 has no cancel counts")
    assert asyncio.run(main()) and log == []
