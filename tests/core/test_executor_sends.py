"""Executor.run hands Sends to its caller promptly: with `break_on_send` it returns right
after a Send of the oldest live iteration, and Sends ready one after another (one value
for several peers) fire together, even past the node budget."""

from __future__ import annotations

import numpy as np

import dcf
from dcf.executor import DEAD, SEND, Executor
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


def test_barrier_loop_run_returns_right_after_its_urgent_sends():
    """Task 0 of the benchmark's barrier loop over 3 tasks, its peers simulated: every
    run() that fires a Send of the oldest iteration fires nothing but Sends after it."""
    from bench.distributed_loop import build

    g, fetch, n = build(3, True)
    ops = _prune(list(fetch), [n])
    device_of = place(ops, "/cpu:0", lambda d: True, process_of=lambda d: d)
    parts = partition(ops, device_of, [(t.op, t.index) for t in fetch], [n])
    prt = parts[_task(0)]
    plan = build_plan(prt.nodes, [(fn, 0) for fn, _ in prt.feeds],
                      [(p, idx) for p, idx, _ in prt.fetches], frame_parents=prt.frame_parents)
    ex = Executor(plan, trace=True, compiled=False)
    ex.break_on_send = True
    ex.start([np.int32(6)])
    recvs: dict = {}      # (edge, tag) -> (node, ist) of a registered Recv
    answers: dict = {}    # (edge, tag) -> value a peer sent back
    for _ in range(10000):
        if ex.done:
            break
        before = len(ex.trace)
        ex.run(8)
        names = [e[0] for e in ex.trace[before:]]
        x_sends = [k for k, nm in enumerate(names) if "Identity_1" in nm and "_send" in nm]
        if x_sends:
            assert all(nm.startswith("_send/") for nm in names[x_sends[0]:]), names
        out, ex.outbox = ex.outbox, []
        for item in out:
            if item[0] == "send":
                _, node, ist, v = item
                dst = node.pnode.attrs["dst"]
                if "Identity_1" in node.name:   # the peer answers x + 1 (or dead)
                    answers[(dst, ist.tag)] = v if v is DEAD else v + np.float32(1)
            elif item[0] == "recv":
                recvs[(item[1].pnode.attrs["src"], item[2].tag)] = (item[1], item[2])
        for key in [k for k in recvs if k in answers]:
            node, ist = recvs.pop(key)
            ex.deliver_recv(node, ist, answers.pop(key))
    assert ex.done
    assert [float(v) for v in ex.results] == [6.0, 6.0]
