"""AsyncSession and FIFOQueue as a service uses them (review 10): producer and consumer
runs in tasks of one event loop, checked against TF1's FIFOQueue."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import dcf

SHORT = dcf.RunOptions(timeout_s=2.0)


async def _until_waiting(task: asyncio.Task, store) -> None:
    """Yield to the loop until a take waits on `store` (or `task` ended)."""
    for _ in range(100_000):
        if task.done() or any(not f.done() for f, _ in store._waiters):
            return
        await asyncio.sleep(0)
    raise AssertionError("the dequeue never started to wait")


@pytest.mark.asyncio
@pytest.mark.parametrize("capacity, held, take, put", [(2, [1, 2], 3, [3, 4]),
                                                        (3, [1, 2], 3, [3, 4])])
async def test_a_waiting_dequeue_many_makes_room_for_an_enqueue_many(capacity, held, take,
                                                                      put):
    """TF1 (compat.v1 FIFOQueue): with `held` in a queue of `capacity`, a dequeue_many(3)
    waiting and an enqueue_many of `put` both end: the dequeue_many gets [1, 2, 3], the
    queue keeps [4]. dcf let the enqueue_many in only up to max(capacity, 3) elements,
    so it waited for room that the waiting dequeue_many never made: both waited for
    good (also with 3 = the capacity, where the waiting take did not even wake it)."""
    q = dcf.FIFOQueue(capacity, dcf.int32, shapes=(), name="q")
    xs = dcf.placeholder(dcf.int32, [None])
    fill, take_many, size, one = q.enqueue_many([xs]), q.dequeue_many(take), q.size(), \
        q.dequeue()
    async with dcf.AsyncSession() as sess:
        await sess.run(fill, {xs: held}, options=SHORT)
        waiting = asyncio.create_task(sess.run(take_many, options=SHORT))
        await _until_waiting(waiting, sess._actors["/cpu:0"].resources.queues["q"])
        await sess.run(fill, {xs: put}, options=SHORT)
        np.testing.assert_array_equal(await waiting, [1, 2, 3])
        assert await sess.run(size) == 1
        assert await sess.run(one, options=SHORT) == 4


def _waits_kept() -> int:
    """Tasks of queue waits that are over and still referenced."""
    import gc

    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, asyncio.Task) and o.done()
               and getattr(o.get_coro(), "__qualname__", "") == "_StepRun.wait_then_resume")


@pytest.mark.asyncio
async def test_a_loop_that_waits_on_its_queue_keeps_none_of_its_waits():
    """An in-graph consumer (a while_loop dequeuing what other runs enqueue, a server
    loop of a service) kept each wait of its dequeues, a done asyncio Task (about
    0.5 KiB with asyncio's own records), until the run ended: memory that grew with
    every element for as long as the loop ran."""
    trips = 150
    q = dcf.FIFOQueue(4, dcf.float32, shapes=(), name="q")
    x = dcf.placeholder(dcf.float32, [])
    enqueue = q.enqueue(x)
    total = dcf.while_loop(lambda i, s: i < trips, lambda i, s: (i + 1, s + q.dequeue()),
                           (0, 0.0))[1]
    async with dcf.AsyncSession() as sess:
        await sess.run(enqueue, {x: 0.0})      # (the queue's store exists)
        store = sess._actors["/cpu:0"].resources.queues["q"]
        consumer = asyncio.create_task(sess.run(total, options=SHORT))
        for i in range(trips - 1):
            await _until_waiting(consumer, store)    # each dequeue of the loop waits
            if i == trips - 2:
                assert not consumer.done()
                kept = _waits_kept()
            await sess.run(enqueue, {x: 1.0}, options=SHORT)
        assert await consumer == trips - 1
    assert kept <= 2, f"{kept} waits of {trips - 1} kept by the running loop"
