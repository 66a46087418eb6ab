"""Runs and sessions leave nothing behind: sockets, processes, memory, worker state."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import dcf
from tests.cluster.helpers import on, open_fds, rss_bytes

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


def _children() -> set[int]:
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                        out.add(int(pid))
            except OSError:
                pass
    return out


def _graph():
    x = dcf.placeholder(dcf.float32, (64,), name="x")

    def body(i, a):
        with on(1):
            a = dcf.tanh(a) + 1.0
        with on(2):
            a = a * 0.5
        with on(0):
            return i + 1, a

    with on(0):
        i0 = dcf.constant(0)
    out = dcf.while_loop(lambda i, a: i < 20, body, (i0, x))
    return x, out


def test_a_hundred_runs_leak_no_sockets_processes_or_memory(cluster3):
    x, out = _graph()
    feed = {x: np.linspace(0, 1, 64, dtype=np.float32)}
    with dcf.Session(cluster=cluster3) as sess:
        want = sess.run(out, feed)
        for _ in range(20):
            sess.run(out, feed)
        gc.collect()
        fds, kids, rss = open_fds(), _children(), rss_bytes()
        w_fds = [open_fds(p) for p in cluster3.worker_pids]
        w_rss = [rss_bytes(p) for p in cluster3.worker_pids]
        for _ in range(100):
            got = sess.run(out, feed)
        np.testing.assert_array_equal(got[1], want[1])
        gc.collect()
        assert open_fds() <= fds + 2, "client sockets"
        assert _children() == kids, "processes"
        assert rss_bytes() - rss < 20 << 20, "client memory"
        for p, n, r in zip(cluster3.worker_pids, w_fds, w_rss):
            assert open_fds(p) <= n + 2, f"worker {p} sockets"
            assert rss_bytes(p) - r < 20 << 20, f"worker {p} memory"
        for k in range(3):
            info, _ = cluster3._stats(k)
            assert info["steps"] == 0 and info["feeds"] == 0 and info["rendezvous"] == 0


def test_closed_sessions_release_their_plans_and_resources_on_workers(cluster3):
    x, out = _graph()
    with on(1):
        dcf.Variable(np.float32(1.0), name="v")
    base = [cluster3._stats(k)[0] for k in range(3)]
    fds = open_fds()
    for _ in range(10):
        with dcf.Session(cluster=cluster3) as sess:
            sess.run(dcf.global_variables_initializer())
            sess.run(out, {x: np.zeros(64, np.float32)})
    after = [cluster3._stats(k)[0] for k in range(3)]
    for b, a in zip(base, after):
        assert a["plans"] == b["plans"] and a["sessions"] == b["sessions"]
    assert open_fds() <= fds + 2


def test_resource_ops_follow_their_handle_across_explicit_placements(cluster3):
    def build(on):
        with on(1):
            v = dcf.Variable(np.float32(3.0), name="w")
        with on(2):
            r = v.read_value() * 2.0     # the read runs on worker 1, the product here
            upd = v.assign_add(1.0)      # so does the update
        return v, r, upd

    g = dcf.Graph()
    with g.as_default():
        v, r, upd = build(on)
        init = dcf.global_variables_initializer()
    with dcf.Session(g, cluster=cluster3) as sess:
        sess.run(init)
        sess.run(upd)
        assert sess.run([v, r]) == [4.0, 8.0]


def test_a_resource_edge_that_would_cross_processes_is_refused_naming_the_op(cluster3):
    from dcf.ops.control_ops import merge

    with on(1):
        a = dcf.Variable(np.float32(1.0), name="a")
    with on(2):
        b = dcf.Variable(np.float32(2.0), name="b")
    m = merge([a.handle, b.handle], name="both_handles")[0]
    with dcf.Session(cluster=cluster3) as sess, pytest.raises(dcf.errors.InvalidArgumentError,
                       match=r"Merge 'both_handles'.*another process"):
        sess.run(m)


def test_pinned_workers_run_on_their_own_cpus():
    cpus = sorted(os.sched_getaffinity(0))
    with dcf.Cluster.local(2, cpus_per_worker=1) as cluster:
        got = [os.sched_getaffinity(p) for p in cluster.worker_pids]
        assert got == [{cpus[0]}, {cpus[1 % len(cpus)]}]
        with on(1):
            y = dcf.constant(2.0) * 4.0
        with dcf.Session(cluster=cluster) as sess:
            assert sess.run(y) == 8.0
