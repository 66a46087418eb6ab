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
