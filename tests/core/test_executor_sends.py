"""Executor.run hands Sends to its caller promptly: with `break_on_send` it returns right
after a Send of the oldest live iteration, and Sends ready one after another (one value
for several peers) fire together, even past the node budget."""

from __future__ import annotations

import numpy as np

import dcf
from dcf.executor import SEND, Executor
from dcf.partition import partition
from dcf.placement import place
from dcf.plan import build_plan
from dcf.session import _prune


def _task(k: int) -> str:
    return f"/job:worker/task:{k}/cpu:0"


def _source_plan(num_peers: int):
    """The plan of task 0 in a graph whose one value goes to `num_peers` other tasks."""
    g = dcf.Graph()
    with g.as_default():
        with dcf.device(_task(0)):
            x = dcf.constant(1.0, name="x")
            y = dcf.identity(x, name="y")
        outs = []
        for k in range(1, num_peers + 1):
            with dcf.device(_task(k)):
                outs.append(y + float(k))
    ops = _prune(outs, [])
    device_of = place(ops, "/cpu:0", lambda d: True, process_of=lambda d: d)
    parts = partition(ops, device_of, [(t.op, t.index) for t in outs], [])
    prt = parts[_task(0)]
    return build_plan(prt.nodes, [], [], frame_parents=prt.frame_parents)


def test_sends_ready_together_fire_together_past_the_budget():
    ex = Executor(_source_plan(3), compiled=False)
    ex.break_on_send = True
    ex.start([])
    fired = 0
    while not [o for o in ex.outbox if o[0] == "send"]:
        fired += ex.run(1)   # one node at a time until the first Send fires
    sends = [o for o in ex.outbox if o[0] == "send"]
    assert len(sends) == 3, "the other two Sends of the same value left with the first"
    assert {o[1].pnode.attrs["dst"] for o in sends} == {_task(k) for k in (1, 2, 3)}
    assert all(float(o[3]) == 1.0 for o in sends)
    assert not any(n.kind == SEND for n, _ in ex.ready)
    ex.run(100)
    assert ex.done


def test_a_single_send_still_breaks_the_run():
    ex = Executor(_source_plan(1), compiled=False)
    ex.break_on_send = True
    ex.start([])
    ex.run(100)
    assert [o[0] for o in ex.outbox].count("send") == 1
    np.testing.assert_equal(float(ex.outbox[0][3]), 1.0)
