"""Session.run: the structure of fetches, feeds, Variables, timeouts, and reuse of a
session after errors."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import dcf
from dcf.errors import DeadlineExceededError, InvalidArgumentError


def _py_scalar(fn, inputs, dtype, name=None):
    """A py_func computing a scalar of `dtype`, with a static scalar shape."""
    return dcf.reshape(dcf.py_func(fn, list(inputs), dtype, name=name), [])


# ------------------------------------------------------------------- fetches
def test_fetch_structure_is_preserved():
    a = dcf.constant(1.0)
    b = dcf.constant([2, 3])
    c = a * 4.0
    with dcf.Session() as sess:
        assert sess.run(a) == 1.0
        assert isinstance(sess.run((a,)), tuple) and isinstance(sess.run([a]), list)
        got = sess.run({"a": a, "nested": [(b, c), {"z": a}]})
    assert set(got) == {"a", "nested"}
    assert got["a"] == 1.0
    np.testing.assert_array_equal(got["nested"][0][0], [2, 3])
    assert isinstance(got["nested"][0], tuple) and got["nested"][0][1] == 4.0
    assert got["nested"][1] == {"z": 1.0}


def test_fetching_an_op_gives_none():
    a = dcf.constant(1.0)
    op = dcf.no_op(name="noop")
    with dcf.Session() as sess:
        assert sess.run(op) is None
        assert sess.run([a + 1.0, op]) == [2.0, None]
        assert sess.run("noop") is None


def test_op_fetched_before_tensors_keeps_every_value_in_its_slot():
    a = dcf.constant(1.0)
    b = dcf.constant(2.0)
    op = dcf.no_op()
    with dcf.Session() as sess:
        assert sess.run([op, a, b]) == [None, 1.0, 2.0]


def test_fetch_by_name_and_feed_by_tensor_or_name():
    x = dcf.placeholder(dcf.float32, (2,), name="x")
    y = dcf.multiply(x, 3.0, name="y")
    with dcf.Session() as sess:
        np.testing.assert_array_equal(sess.run(y, {x: [1.0, 2.0]}), [3.0, 6.0])
        np.testing.assert_array_equal(sess.run("y:0", {"x:0": np.array([2.0, 0.0])}), [6.0, 0.0])


def test_fetching_a_fed_tensor_returns_the_fed_value():
    x = dcf.placeholder(dcf.float32, (), name="x")
    y = x * 2.0
    with dcf.Session() as sess:
        assert sess.run([x, y], {x: 3.0}) == [3.0, 6.0]


def test_feeding_an_intermediate_tensor_skips_its_producer():
    x = dcf.placeholder(dcf.float32, (), name="x")
    y = x * 2.0
    z = y + 1.0
    with dcf.Session() as sess:
        assert sess.run(z, {y: 10.0}) == 11.0  # x is never needed


def test_fetching_a_tensor_array_or_another_graphs_tensor_is_refused():
    ta = dcf.TensorArray(dcf.float32, size=1).write(0, 1.0)
    other = dcf.Graph()
    with other.as_default():
        foreign = dcf.constant(1.0)
    with dcf.Session() as sess:
        with pytest.raises(TypeError, match=r"\.stack\(\) or \.read\(i\)"):
            sess.run(ta)
        with pytest.raises(ValueError, match=r"not an element of this session's graph"):
            sess.run(foreign)


def test_single_output_py_func_value_is_not_wrapped_in_a_tuple():
    y = dcf.py_func(lambda a: a * 3, [dcf.constant(2.0)], dcf.float32)
    with dcf.Session() as sess:
        got = sess.run(y)
    assert not isinstance(got, tuple) and got == 6.0


# --------------------------------------------------------------------- feeds
def test_feeding_a_wrong_shape_names_the_placeholder_and_both_shapes():
    x = dcf.placeholder(dcf.float32, (2, 3), name="x")
    with dcf.Session() as sess:
        with pytest.raises(
            InvalidArgumentError,
            match=r"Placeholder 'x': fed a value of shape \[3, 2\], "
            r"expected \[2, 3\]",
        ):
            sess.run(x * 2.0, {x: np.ones((3, 2), np.float32)})
        assert sess.run(dcf.reduce_sum(x), {x: np.ones((2, 3))}) == 6.0  # still usable


def test_unfed_placeholder_says_to_feed_it():
    x = dcf.placeholder(dcf.float32, (), name="x")
    with (
        dcf.Session() as sess,
        pytest.raises(
            InvalidArgumentError,
            match=r"Placeholder 'x': you must feed a value for this placeholder",
        ),
    ):
        sess.run(x + 1.0)


def test_feeding_a_tensor_inside_a_loop_frame_is_refused():
    inner = []

    def body(i):
        inner.append(i)
        return i + 1

    dcf.while_loop(lambda i: i < 3, body, 0)
    with (
        dcf.Session() as sess,
        pytest.raises(InvalidArgumentError, match=r"lives inside a loop frame"),
    ):
        sess.run(dcf.constant(1), {inner[0]: 5})


# ----------------------------------------------------------------- Variables
def test_variables_assign_and_persist_across_runs_not_sessions():
    v = dcf.Variable([1.0, 2.0], name="v")
    n = dcf.Variable(5, name="n")
    init = dcf.global_variables_initializer()
    add = v.assign_add([1.0, 1.0])
    sub = n.assign_sub(2)
    with dcf.Session() as sess:
        assert sess.run(init) is None
        np.testing.assert_array_equal(sess.run(v), [1.0, 2.0])
        np.testing.assert_array_equal(sess.run(add), [2.0, 3.0])
        np.testing.assert_array_equal(sess.run(add), [3.0, 4.0])
        assert sess.run(sub) == 3 and sess.run(sub) == 1
        np.testing.assert_array_equal(sess.run(v.assign([0.0, 9.0])), [0.0, 9.0])
        got = sess.run({"v": v, "n": n, "read": v.read_value() * 2.0})
        np.testing.assert_array_equal(got["v"], [0.0, 9.0])
        assert got["n"] == 1
        np.testing.assert_array_equal(got["read"], [0.0, 18.0])
    with (
        dcf.Session() as sess,
        pytest.raises(  # state belongs to the session
            InvalidArgumentError, match=r"variable 'v' was read before it was initialized"
        ),
    ):
        sess.run(v)
    assert dcf.trainable_variables() == [v, n]


def test_reading_an_uninitialized_variable_names_it_and_the_fix():
    v = dcf.Variable(0.0, name="weights")
    with dcf.Session() as sess:
        with pytest.raises(
            InvalidArgumentError,
            match=r"variable 'weights' was read before it was initialized; "
            r"run dcf.global_variables_initializer\(\) first",
        ):
            sess.run(v.assign_add(1.0))
        sess.run(v.initializer)
        assert sess.run(v.assign_add(1.0)) == 1.0


def test_variable_updated_in_a_loop(compiled):
    v = dcf.Variable(0.0, name="total")
    x = dcf.placeholder(dcf.float32, ())

    def body(i):
        with dcf.control_dependencies([v.assign_add(x * dcf.cast(i, dcf.float32))]):
            return i + 1

    out = dcf.while_loop(lambda i: i < 4, body, 0)
    with dcf.Session(config=compiled) as sess:
        sess.run(v.initializer)
        assert sess.run(out, {x: 1.0}) == 4
        assert sess.run(v) == 6.0
        sess.run(out, {x: 10.0})
        assert sess.run(v) == 66.0


# -------------------------------------------------------------- timeouts
def _sleepy_loop(calls: list, started: list):
    n = dcf.placeholder(dcf.int32, (), name="n")

    def nap(i):
        if time.perf_counter() - started[0] > 1.5:
            raise RuntimeError("still running 1.5 s after a 0.2 s deadline")
        calls.append(int(i))
        time.sleep(0.005)
        return i

    out = dcf.while_loop(lambda i: i < n, lambda i: _py_scalar(nap, [i], dcf.int32) + 1, 0)
    return n, out


def test_timeout_raises_deadline_exceeded_and_session_stays_usable(compiled):
    calls: list = []
    started = [time.perf_counter()]
    n, out = _sleepy_loop(calls, started)
    with dcf.Session(config=compiled) as sess:
        t0 = started[0] = time.perf_counter()
        with pytest.raises(DeadlineExceededError, match=r"timeout_s=0\.2.*still usable"):
            sess.run(out, {n: 1000}, options=dcf.RunOptions(timeout_s=0.2))
        assert time.perf_counter() - t0 < 1.5
        assert 0 < len(calls) < 1000
        before = len(calls)
        started[0] = time.perf_counter()
        assert sess.run(out, {n: 3}) == 3
        assert calls[before:] == [0, 1, 2], "the timed-out run was cancelled, not left running"


def test_session_is_usable_after_a_runtime_error(compiled):
    x = dcf.placeholder(dcf.float32, (None,))
    out = dcf.while_loop(
        lambda i, s: i < 3,
        lambda i, s: (i + 1, s + dcf.reduce_sum(dcf.reshape(x, [2, -1]))),
        (0, 0.0),
    )[1]
    with dcf.Session(config=compiled) as sess:
        with pytest.raises(InvalidArgumentError, match=r"Reshape"):
            sess.run(out, {x: np.ones(3)})
        assert sess.run(out, {x: np.ones(4)}) == 12.0


def test_closed_session_refuses_to_run():
    a = dcf.constant(1.0)
    sess = dcf.Session()
    assert sess.run(a) == 1.0
    sess.close()
    with pytest.raises(RuntimeError, match=r"closed"):
        sess.run(a)


def test_session_runs_from_several_threads():
    x = dcf.placeholder(dcf.int32, ())
    out = dcf.while_loop(lambda i, s: i < x, lambda i, s: (i + 1, s + i), (0, 0))[1]
    results: dict = {}
    with dcf.Session() as sess:

        def work(k):
            results[k] = sess.run(out, {x: k})

        threads = [threading.Thread(target=work, args=(k,)) for k in range(2, 8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert results == {k: k * (k - 1) // 2 for k in range(2, 8)}


def test_closing_a_session_cancels_a_run_in_flight_in_another_thread():
    """The synchronous session's close(), from another thread: the run in flight (here
    a compiled one, run inline in its thread) raises CancelledError at its next check
    (every few ms) instead of running on to its end."""
    n = dcf.placeholder(dcf.int32, ())
    out = dcf.while_loop(lambda i, x: i < n, lambda i, x: (i + 1, x * 0.5 + 1.0), (0, 0.0))
    sess = dcf.Session()
    assert sess.run(out, {n: 3})[0] == 3
    got: dict = {}

    def work():
        try:
            got["value"] = sess.run(out, {n: 2**31 - 1})
        except BaseException as e:      # noqa: BLE001 - what the run raised is the test
            got["error"] = e

    t = threading.Thread(target=work)
    t.start()
    time.sleep(0.2)
    sess.close()
    t.join(timeout=30)
    assert not t.is_alive(), "the run went on after close()"
    assert isinstance(got.get("error"), dcf.errors.CancelledError), got
    with pytest.raises(RuntimeError, match="closed"):
        sess.run(out, {n: 3})
