"""Review 9, timelines by use: what a traced run records (every op that fired, Recvs
included) and how the Chrome trace JSON and the DOT text read."""

from __future__ import annotations

import numpy as np

import dcf


def _split_loop():
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (4, 4), name="x")

        def body(i, v):
            with dcf.device("/cpu:1"):
                v = dcf.tanh(v)
            return i + 1, v * 2.0

        _, y = dcf.while_loop(lambda i, v: i < 3, body, (0, x), name="L")
    return g, x, y


def test_a_trace_holds_each_recv_that_received_a_value():
    """A Recv whose value arrived fires outside the executor's run loop (the rendezvous
    delivers it, a live value or a dead one): it was missing from the timeline. Each
    Send in an iteration has its Recv on the other device in the same frame and
    iteration, and the step's fired count matches the events."""
    g, x, y = _split_loop()
    md = dcf.RunMetadata()
    with dcf.Session(g, config=dcf.SessionConfig(compile_frames=False)) as sess:
        sess.run(y, {x: np.eye(4, dtype=np.float32)}, options=dcf.RunOptions(trace=True),
                 run_metadata=md)
    sends = {(e[1][len("_send/"):], e[3], e[4]): e for e in md.trace
             if e[1].startswith("_send/")}
    recvs = {(e[1][len("_recv/"):], e[3], e[4]): e for e in md.trace
             if e[1].startswith("_recv/")}
    assert len(sends) == 8                          # two edges, iterations 0..3
    assert recvs.keys() == sends.keys()
    for key, r in recvs.items():
        edge = key[0]
        assert r[0] == edge.rsplit("->", 1)[1]      # on the receiving device
        assert r[2] == "_Recv" and r[5] <= r[6]
        assert sends[key][5] <= r[6]                # (received after it was sent)
    assert len(md.trace) == md.step_stats["nodes_fired"]


def test_a_kept_trace_of_an_earlier_run_is_not_overwritten_by_the_next_run():
    """A RunMetadata given to a run holds that run's timeline only, but a reference kept
    to an earlier run's `trace` (or `step_stats`) -- `traces.append(md.trace)` in a
    training loop -- still holds that run's: tf.compat.v1 checked, a kept
    `md.step_stats` keeps the first run's 13 node stats after md is reused for a run of
    6. Here the run cleared and refilled the same list, so every kept trace was the
    last run's."""
    x = dcf.placeholder(dcf.float32, (3,), name="x")
    big = dcf.reduce_sum(dcf.tanh(x) + dcf.sin(x), name="big")
    small = dcf.multiply(x, 2.0, name="small")
    md = dcf.RunMetadata()
    kept = []
    with dcf.Session() as sess:
        for fetch in (big, small, big):
            sess.run(fetch, {x: np.ones(3, np.float32)}, options=dcf.RunOptions(trace=True),
                     run_metadata=md)
            kept.append((md.trace, md.step_stats))
        failed = dcf.RunMetadata()
        sess.run(small, {x: np.ones(3, np.float32)}, options=dcf.RunOptions(trace=True),
                 run_metadata=failed)
        events = failed.trace
        try:
            sess.run(small, {x: np.ones(2, np.float32)}, options=dcf.RunOptions(trace=True),
                     run_metadata=failed)
        except dcf.errors.InvalidArgumentError:
            pass
    names = [{e[1] for e in trace} for trace, _ in kept]
    assert "big" in names[0] and "big" in names[2]
    assert "small" in names[1] and "big" not in names[1]
    assert [stats["nodes_fired"] for _, stats in kept] == [len(t) for t, _ in kept]
    assert kept[0][0] is not kept[1][0] and md.trace is kept[2][0]
    assert failed.trace == [] and events and "small" in {e[1] for e in events}
