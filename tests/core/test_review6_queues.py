"""FIFOQueue as a TF1 input pipeline uses it: a dequeue_many of more elements than the
capacity, TF's negative (unbounded) capacity, a dequeue_many whose elements cannot be
stacked, enqueues in loops (iteration order), close and timeouts that keep the elements,
and a queue on another device or on a worker of a cluster."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import dcf
from dcf.errors import DeadlineExceededError, InvalidArgumentError, OutOfRangeError

SHORT = dcf.RunOptions(timeout_s=2.0)


def _in_thread(fn):
    """Start fn in a thread; returns (thread, dict with its 'value' or 'error')."""
    got: dict = {}

    def work():
        try:
            got["value"] = fn()
        except BaseException as e:     # noqa: BLE001 - what the run raised is the test
            got["error"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    return t, got


def _wait_until_waiting(store, timeout: float = 5.0) -> None:
    """Until a dequeue waits on `store` (its future is registered)."""
    deadline = time.monotonic() + timeout
    while not store._waiters:
        assert time.monotonic() < deadline, "the dequeue never started to wait"
        time.sleep(0.005)


def _store(sess, name: str, device: str = "/cpu:0"):
    return sess._async._actors[device].resources.queues[name]


def test_a_dequeue_many_of_more_than_the_capacity_takes_elements_as_they_come():
    """TF1: dequeue_many(5) on a queue of capacity 3 gets the 5 elements that producers
    enqueue one at a time (it takes them as they come). The producer's 4th enqueue
    waited for room that the waiting dequeue never made: both waited for good."""
    q = dcf.FIFOQueue(3, dcf.float32, shapes=(), name="q")
    x = dcf.placeholder(dcf.float32, [])
    enqueue, dequeue_many, size = q.enqueue(x), q.dequeue_many(5), q.size()
    with dcf.Session() as sess:
        sess.run(size)
        t, got = _in_thread(lambda: sess.run(dequeue_many, options=SHORT))
        _wait_until_waiting(_store(sess, "q"))
        for i in range(5):
            sess.run(enqueue, {x: float(i)}, options=SHORT)
        t.join(timeout=10)
        np.testing.assert_array_equal(got.get("value"), [0.0, 1.0, 2.0, 3.0, 4.0])
        assert sess.run(size) == 0
        # with nobody waiting, the capacity holds again
        for i in range(3):
            sess.run(enqueue, {x: float(i)})
        with pytest.raises(DeadlineExceededError):
            sess.run(enqueue, {x: 3.0}, options=dcf.RunOptions(timeout_s=0.05))
        assert sess.run(size) == 3


def test_a_negative_capacity_is_no_limit_and_capacity_zero_is_refused():
    """TF1's FIFOQueue(-1, ...) has no limit (its op's default): dcf took the first
    element in and made the second enqueue wait for good. Capacity 0 (every TF1 enqueue
    waits for good) and a capacity that is no int are refused where the queue is made."""
    q = dcf.FIFOQueue(-1, dcf.float32, shapes=())
    fill, one, size = q.enqueue_many([dcf.range(100.0)]), q.enqueue(7.0), q.size()
    with dcf.Session() as sess:
        sess.run(fill, options=SHORT)
        sess.run(one, options=SHORT)
        sess.run(fill, options=SHORT)
        assert sess.run(size) == 201
    with pytest.raises(ValueError, match=r"FIFOQueue 'fifo_queue_1': capacity 0 holds "):
        dcf.FIFOQueue(0, dcf.float32)
    for bad in (2.5, None, True, "3"):
        with pytest.raises(TypeError, match=r"capacity must be an int"):
            dcf.FIFOQueue(bad, dcf.float32)
    assert dcf.FIFOQueue(np.int64(2), dcf.float32).handle is not None


def test_a_dequeue_many_whose_elements_cannot_be_stacked_leaves_them_in_the_queue():
    """A queue made without shapes holds elements of any shape; a dequeue_many of two
    that differ fails naming the queue and the shapes (numpy's 'all input arrays must
    have the same shape' named neither), and the elements stay (they were lost)."""
    q = dcf.FIFOQueue(5, dcf.float32, name="ragged")
    x = dcf.placeholder(dcf.float32, None)
    enqueue, dequeue, dequeue_many, size = q.enqueue(x), q.dequeue(), q.dequeue_many(2), \
        q.size()
    with dcf.Session() as sess:
        sess.run(enqueue, {x: [1.0, 2.0]})
        sess.run(enqueue, {x: [3.0, 4.0, 5.0]})
        with pytest.raises(InvalidArgumentError,
                           match=r"QueueDequeueV2 'dequeue_many'(.|\n)*queue 'ragged'(.|\n)*"
                                 r"component 0: elements of shapes \[2\] and \[3\]"):
            sess.run(dequeue_many)
        assert sess.run(size) == 2
        np.testing.assert_array_equal(sess.run(dequeue), [1.0, 2.0])
        sess.run(enqueue, {x: [6.0, 7.0, 8.0]})
        np.testing.assert_array_equal(sess.run(dequeue_many), [[3, 4, 5], [6, 7, 8]])


def test_enqueues_of_a_loop_keep_iteration_order_under_parallel_iterations(compiled):
    """Decision: the stateful ops of a loop body run in iteration order, whatever
    parallel_iterations says (TF1 makes no promise): a producer loop's elements come out
    in its iteration order, and a consumer loop in the same run takes them in order."""
    n = 12
    q = dcf.FIFOQueue(4, dcf.int32, shapes=())

    def produce(i):
        with dcf.control_dependencies([q.enqueue(i * 10)]):
            return dcf.identity(i + 1)

    def consume(i, seen):
        return i + 1, seen.write(i, q.dequeue())

    produced = dcf.while_loop(lambda i: i < n, produce, [0], parallel_iterations=8)
    consumed = dcf.while_loop(lambda i, s: i < n, consume,
                              [0, dcf.TensorArray(dcf.int32, size=n)],
                              parallel_iterations=8)[1].stack()
    with dcf.Session(config=compiled) as sess:
        got = sess.run([produced, consumed], options=SHORT)[1]
    np.testing.assert_array_equal(got, np.arange(n) * 10)


def test_dequeue_many_after_close_or_a_timeout_keeps_what_is_left():
    """TF1: dequeue_many(n) with fewer than n left in a closed queue fails with
    OutOfRangeError and puts the elements back; size() still counts them and dequeue()
    gets them. A dequeue_many that times out waiting takes nothing. Closing twice is
    harmless (decision: TF1's second close fails with CancelledError)."""
    q = dcf.FIFOQueue(4, dcf.float32, shapes=(), name="q")
    x = dcf.placeholder(dcf.float32, [None])
    fill, take3, take1, size, close = q.enqueue_many([x]), q.dequeue_many(3), q.dequeue(), \
        q.size(), q.close()
    with dcf.Session() as sess:
        sess.run(fill, {x: [1.0, 2.0]})
        with pytest.raises(DeadlineExceededError):
            sess.run(take3, options=dcf.RunOptions(timeout_s=0.05))
        assert sess.run(size) == 2
        sess.run(close)
        sess.run(close)
        with pytest.raises(OutOfRangeError, match=r"'dequeue_many'(.|\n)*queue 'q' is closed "
                                                  r"and has 2 elements, fewer than the 3"):
            sess.run(take3)
        assert sess.run(size) == 2
        assert [sess.run(take1), sess.run(take1)] == [1.0, 2.0]
        with pytest.raises(OutOfRangeError):
            sess.run(take1)
        assert sess.run(size) == 0


def test_a_queue_on_a_second_device_serves_ops_placed_elsewhere(compiled):
    """The queue lives on /cpu:1; enqueue and dequeue built under /cpu:0 still reach it
    (they run where the handle is), across runs and execution paths."""
    with dcf.device("/cpu:1"):
        q = dcf.FIFOQueue(2, dcf.float32, shapes=(), name="far")
    x = dcf.placeholder(dcf.float32, [])
    with dcf.device("/cpu:0"):
        enqueue, dequeue_many = q.enqueue(x * 2.0), q.dequeue_many(3) + 1.0
    with dcf.Session(config=compiled) as sess:
        t, got = _in_thread(lambda: sess.run(dequeue_many, options=SHORT))
        for i in range(3):
            sess.run(enqueue, {x: float(i)}, options=SHORT)
        t.join(timeout=10)
    np.testing.assert_array_equal(got.get("value"), [1.0, 3.0, 5.0])


def test_a_queue_on_a_worker_of_a_cluster():
    """A queue on a worker process: elements enqueued by runs of the client come back in
    order, a dequeue_many larger than the capacity gets them as they come."""
    with dcf.Cluster.local(1) as cluster:
        with dcf.device("/job:worker/task:0/cpu:0"):
            q = dcf.FIFOQueue(2, dcf.float32, shapes=())
        x = dcf.placeholder(dcf.float32, [])
        enqueue, dequeue, dequeue_many = q.enqueue(x), q.dequeue() * 10.0, q.dequeue_many(3)
        with dcf.Session(cluster=cluster) as sess:
            sess.run(enqueue, {x: 1.0}, options=SHORT)
            sess.run(enqueue, {x: 2.0}, options=SHORT)
            assert [sess.run(dequeue), sess.run(dequeue)] == [10.0, 20.0]
            t, got = _in_thread(lambda: sess.run(dequeue_many, options=SHORT))
            for i in range(3):
                sess.run(enqueue, {x: float(i)}, options=SHORT)
            t.join(timeout=10)
    np.testing.assert_array_equal(got.get("value"), [0.0, 1.0, 2.0])


def test_shapes_are_read_as_tf1_reads_them():
    """TF1: a list of ints is one shape, a list of lists one shape per component, so a
    one-dtype queue takes shapes=[()] or [[2]] (dcf failed inside int(): "int() argument
    must be ... not 'tuple'"), and two dtypes with shapes=[2, 3] are one shape too few."""
    assert dcf.FIFOQueue(2, dcf.float32, shapes=[()]).shapes == [()]
    assert dcf.FIFOQueue(2, dcf.float32, shapes=[[2]]).shapes == [(2,)]
    assert dcf.FIFOQueue(2, dcf.float32, shapes=[2]).shapes == [(2,)]
    assert dcf.FIFOQueue(2, [dcf.float32, dcf.int32], shapes=[(), [2]]).shapes == [(), (2,)]
    with pytest.raises(ValueError, match=r"got 1 shapes for 2 dtypes"):
        dcf.FIFOQueue(2, [dcf.float32, dcf.int32], shapes=[2, 3])
    with pytest.raises(TypeError, match=r"the shape of component 1 must be a list of "):
        dcf.FIFOQueue(2, [dcf.float32, dcf.int32], shapes=[(), 3])
    q = dcf.FIFOQueue(2, dcf.float32, shapes=[()])
    with dcf.Session() as sess:
        sess.run(q.enqueue(1.5))
        assert sess.run(q.dequeue()) == 1.5
