"""Concurrency and cancellation found by a review by use (round 8): many runs of one
session from threads, tasks and several event loops, cancelled, timed out or closed under
them. Each test fails (or hangs into its timeout) without its fix."""

from __future__ import annotations

import threading

import pytest

from dcf.actors.rendezvous import LocalRendezvous
from tests.core.test_review5_threads import _in_threads, _threads_switching_often


@pytest.mark.timeout(120)
def test_steps_of_several_threads_end_on_one_rendezvous():
    # An AsyncSession used from several threads' event loops (the queues' docs allow it)
    # has one rendezvous for all of their runs: a step that ended or timed out dropped its
    # slots by iterating over the tables while another thread's steps added theirs, and
    # the run failed with "RuntimeError: dictionary changed size during iteration" (a few
    # runs in a thousand, with loops over two devices and timeouts).
    rv = LocalRendezvous()
    failed = threading.Event()

    def steps(k):
        for step in range(k * 10**6, k * 10**6 + 10_000):
            if failed.is_set():         # (another thread has shown it: no need to go on)
                return
            for edge in range(20):
                rv.send((step, edge, ()), edge)     # values wait for their Recvs
            try:
                if step % 2:
                    rv.abort_step(step, RuntimeError("timed out"))
                rv.end_step(step)
            except RuntimeError:
                failed.set()
                raise

    with _threads_switching_often():
        _in_threads(3, steps, timeout=60)       # (asserts no thread failed)
    assert rv.pending() == 0


@pytest.mark.timeout(60)
def test_a_timed_run_whose_steps_ended_in_time_keeps_its_dequeued_element():
    # A consumer polling a queue with RunOptions(timeout_s=...) under load: its steps
    # ended in time, but its task got the loop back only after the deadline (other runs'
    # bursts came first: here a callback that holds the loop). The run was reported as
    # DeadlineExceededError all the same, and the element it had dequeued was lost (16
    # threads polling: 88 of 190 elements).
    import asyncio
    import time

    import dcf

    hold = []

    def hold_the_loop(v):
        if hold:    # (the loop is held after this step's last op, before its task resumes)
            asyncio.get_running_loop().call_soon(time.sleep, 2.0)
        return v

    q = dcf.FIFOQueue(10, dcf.float64, shapes=[[]])
    with dcf.device("/cpu:1"):      # (two partitions: their steps end in tasks of their own)
        got = dcf.py_func(hold_the_loop, [q.dequeue()], dcf.float64)

    async def main():
        async with dcf.AsyncSession() as sess:
            await sess.run(q.enqueue_many([[1.0, 7.0]]))
            assert await sess.run(got, options=dcf.RunOptions(timeout_s=60)) == 1.0
            hold.append(True)
            value = await sess.run(got, options=dcf.RunOptions(timeout_s=1.0))
            return value, await sess.run(q.size())

    assert asyncio.run(main()) == (7.0, 0)


@pytest.mark.timeout(60)
def test_a_dequeue_woken_after_its_runs_deadline_leaves_the_element_in_the_queue():
    # The dequeue of a run with a timeout_s waits on an empty queue; an enqueue wakes it,
    # but the loop gets to the woken dequeue only after the deadline (a callback holds
    # the loop meanwhile), before the run's timeout has cancelled it. The dequeue took
    # the element all the same, and the run then failed with DeadlineExceededError: the
    # element was lost (5 in 190 with 16 threads polling under load). No kernel starts
    # past the deadline now.
    import asyncio
    import time

    import dcf

    def hold_the_loop(v):
        asyncio.get_running_loop().call_soon(time.sleep, 1.5)
        return v

    q = dcf.FIFOQueue(10, dcf.float64, shapes=[[]])
    dequeue = q.dequeue()
    with dcf.control_dependencies([q.enqueue(5.0)]):
        enqueue_then_hold = dcf.py_func(hold_the_loop, [dcf.constant(0.0, dcf.float64)],
                                        dcf.float64)

    async def main():
        async with dcf.AsyncSession() as sess:
            consumer = asyncio.ensure_future(
                sess.run(dequeue, options=dcf.RunOptions(timeout_s=1.0)))
            while not sess._running:        # (its dequeue waits on the empty queue)
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.01)
            await sess.run(enqueue_then_hold)
            with pytest.raises(dcf.errors.DeadlineExceededError):
                await consumer
            return await sess.run(q.size())

    assert asyncio.run(main()) == 1
