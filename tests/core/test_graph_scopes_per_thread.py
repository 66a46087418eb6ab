"""Two threads building into one graph do not see each other's scopes: a name scope,
a device scope, control dependencies and the control-flow context (a cond branch or a
while_loop body being built) belong to the thread that opened them, as in TF1, whose
graph keeps these stacks thread-local. Before, a plain op built by one thread while
another was inside a loop body landed in that loop's frame."""

from __future__ import annotations

import threading

import numpy as np

import dcf


def _in_other_thread(fn):
    out, err = {}, []

    def run():
        try:
            out["v"] = fn()
        except BaseException as e:    # (reported by the caller)
            err.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert not t.is_alive() and not err, err
    return out["v"]


def test_scopes_opened_in_one_thread_do_not_reach_another():
    g = dcf.Graph()
    with g.as_default():
        a = dcf.constant(1.0, name="a")
        with g.name_scope("outer"), g.device("/cpu:1"), g.control_dependencies([a.op]):
            def build_elsewhere():
                with g.as_default():
                    return dcf.constant(2.0, name="b")
            b = _in_other_thread(build_elsewhere)
            inside = dcf.constant(3.0, name="c")
    assert b.op.name == "b" and b.op.device in ("", None) and b.op.control_inputs == []
    assert inside.op.name == "outer/c" and inside.op.control_inputs == [a.op]


def test_a_loop_body_being_built_does_not_capture_another_threads_ops():
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, [])
        built = {}

        def body(i, s):
            # while this body is being built, another thread builds a plain op
            def other():
                with g.as_default():
                    return x * 10.0
            built["y"] = _in_other_thread(other)
            return i + 1, s + x

        out = dcf.while_loop(lambda i, s: i < 3, body, (0, dcf.constant(0.0)))[1]
        y = built["y"]
    assert y.op.frame_ctx is None            # in the root frame, not the loop's
    with dcf.Session(g) as sess:
        got_y, got_out = sess.run([y, out], {x: 2.0})
    assert got_y == np.float32(20.0) and got_out == np.float32(6.0)
