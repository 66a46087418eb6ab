"""Cluster.ray: dcf workers as actors of a (local) Ray cluster.

Ray places, schedules and supervises the workers; tensors still travel over ZeroMQ
between them, signed with the cluster's secret. One `ray.init` serves the module (it
takes seconds); each test starts its own workers (well under a second once Ray is up).
Skipped where ray is not installed (the `ray` extra).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest

import dcf
import dcf.worker
from dcf.actors.transport import ZmqTransport
from dcf.errors import WorkerError
from tests.cluster.helpers import (alive, assert_same, both, close_mid_run,
                                   lose_worker_1_mid_loop, on, task, wait_for)

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def ray_cpus2():
    """A local Ray instance with 2 CPUs and 2 units of a custom resource "dcf_test"."""
    ray.init(num_cpus=2, resources={"dcf_test": 2}, include_dashboard=False,
             ignore_reinit_error=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _cpus_free() -> float:
    return ray.available_resources().get("CPU", 0.0)


# ------------------------------------------------------------------- graphs
def _split_loop_and_cond(on):
    """A while_loop whose body runs on both workers, and a cond whose untaken branch
    sits on the other worker and would fail the run if it ran."""
    x = dcf.placeholder(dcf.float32, (3,), name="x")
    n = dcf.placeholder(dcf.int32, (), name="n")
    p = dcf.placeholder(dcf.bool, (), name="p")

    def body(i, a):
        with on(1):
            a = a * 0.5 + dcf.cast(i, dcf.float32)
        with on(0):
            return i + 1, a - 1.0

    with on(0):
        i0 = dcf.constant(0)
    _, looped = dcf.while_loop(lambda i, a: i < n, body, (i0, x))

    def boom(v):
        raise RuntimeError("the untaken branch ran")

    def taken():
        with on(0):
            return looped * 2.0

    def untaken():
        with on(1):
            return dcf.py_func(boom, [looped], dcf.float32)

    with on(0):
        out = dcf.cond(p, taken, untaken)
    return [looped, out], {x: np.array([1.0, 2.0, 3.0], np.float32), n: 6, p: True}


def _numpy_split_loop_and_cond():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    for i in range(6):
        a = a * np.float32(0.5) + np.float32(i) - np.float32(1.0)
    return a, a * np.float32(2.0)


def test_a_graph_placed_on_two_ray_workers_matches_one_process(ray_cpus2):
    with dcf.Cluster.ray(2) as cluster:
        assert cluster.devices == [f"{task(0)}/cpu:0", f"{task(1)}/cpu:0"]
        got, want = both(_split_loop_and_cond, cluster)
    assert_same(got, want)
    assert_same(got, _numpy_split_loop_and_cond())


def test_both_branches_of_a_cond_across_ray_workers(ray_cpus2):
    x = dcf.placeholder(dcf.float32, (), name="x")
    p = dcf.placeholder(dcf.bool, (), name="p")

    def on0():
        with on(0):
            return x + 10.0

    def on1():
        with on(1):
            return x * 3.0

    with on(0):
        out = dcf.cond(p, on0, on1)
    with dcf.Cluster.ray(2) as cluster, dcf.Session(cluster=cluster) as sess:
        assert sess.run(out, {x: 2.0, p: True}) == 12.0
        assert sess.run(out, {x: 2.0, p: False}) == 6.0


def test_tensors_between_ray_workers_travel_over_zeromq(ray_cpus2):
    x = dcf.placeholder(dcf.float32, (), name="x")
    with on(0):
        big = dcf.fill([1 << 18], x)             # 1 MiB of float32, made on worker 0
    with on(1):
        total = dcf.reduce_sum(big * 2.0)        # and consumed on worker 1
    with dcf.Cluster.ray(2) as cluster, dcf.Session(cluster=cluster) as sess:
        assert all(a.startswith("tcp://127.0.0.1:") for a in cluster.spec["worker"])
        before = [cluster._stats(k)[0]["transport"] for k in range(2)]
        assert sess.run(total, {x: 0.5}) == float(1 << 18)
        after = [cluster._stats(k)[0]["transport"] for k in range(2)]
    sent0 = after[0].get("sent_bytes", 0) - before[0].get("sent_bytes", 0)
    got1 = after[1].get("received_bytes", 0) - before[1].get("received_bytes", 0)
    assert sent0 >= 4 << 18, "worker 0 sent the array over its ZeroMQ transport"
    assert got1 >= 4 << 18, "worker 1 received it over its ZeroMQ transport"


def test_py_func_runs_in_the_ray_actor_of_its_worker(ray_cpus2):
    def actor_id():
        hexid = ray.get_runtime_context().get_actor_id()
        return np.frombuffer(bytes.fromhex(hexid), np.uint8).astype(np.int32)

    with on(1):
        pid1 = dcf.py_func(lambda: np.int64(os.getpid()), [], dcf.int64)
        aid1 = dcf.py_func(actor_id, [], dcf.int32)
    here = dcf.py_func(lambda: np.int64(os.getpid()), [], dcf.int64)
    with dcf.Cluster.ray(2) as cluster, dcf.Session(cluster=cluster) as sess:
        got_pid, got_aid, got_here = sess.run([pid1, aid1, here])
        assert got_pid != os.getpid()
        assert got_pid == cluster.worker_pids[1]
        assert got_here == os.getpid()
        want = list(bytes.fromhex(cluster._ray_actors[1]._actor_id.hex()))
        assert list(got_aid) == want


def test_resources_per_worker_are_what_ray_grants_the_actor(ray_cpus2):
    def assigned():
        res = ray.get_runtime_context().get_assigned_resources()
        return np.array([res.get("CPU", -1.0), res.get("dcf_test", -1.0)])

    with on(0):
        granted = dcf.py_func(assigned, [], dcf.float64)
    wait_for(lambda: _cpus_free() == 2.0, what="the earlier tests' workers to go")
    with dcf.Cluster.ray(1, {"CPU": 2, "dcf_test": 1}) as cluster:
        with dcf.Session(cluster=cluster) as sess:
            np.testing.assert_array_equal(sess.run(granted), [2.0, 1.0])
        wait_for(lambda: _cpus_free() == 0.0, what="Ray to count the worker's CPUs")
        assert ray.available_resources().get("dcf_test") == 1.0
    wait_for(lambda: _cpus_free() == 2.0 and
              ray.available_resources().get("dcf_test") == 2.0,
              what="Ray to release the closed worker's resources")
    with dcf.Cluster.ray(1, {"num_cpus": 1}) as cluster, dcf.Session(cluster=cluster) as sess:
        np.testing.assert_array_equal(sess.run(granted), [1.0, -1.0])


def test_resources_ray_cannot_grant_fail_the_start_and_leave_nothing(ray_cpus2):
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"task:0.*within 1 s"):
        dcf.Cluster.ray(1, {"CPU": 3}, start_timeout_s=1.0)
    assert time.monotonic() - t0 < 10.0
    wait_for(lambda: _cpus_free() == 2.0, what="the pending actor to go")
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"resources_per_worker\['CPU'\] must be"):
            dcf.Cluster.ray(1, {"CPU": bad})
    with pytest.raises(ValueError, match="num_cpus"):
        dcf.Cluster.ray(1, {"CPU": 1, "num_cpus": 1})
    with pytest.raises(ValueError, match="num_workers"):
        dcf.Cluster.ray(0)


def test_a_worker_that_fails_to_start_as_a_ray_actor_says_why(ray_cpus2, monkeypatch):
    """Ray's error puts "the actor died ... in its creation task" first and the
    constructor's exception last: the WorkerError carries both, without colour codes."""
    class Unbindable:   # defined here: travels to the actor by value
        def __init__(self, **kwargs):
            raise OSError("no port for the data plane")

    monkeypatch.setattr(dcf.worker, "WorkerHost", Unbindable)
    with pytest.raises(WorkerError, match=r"task:0 failed to start as a Ray actor: "
                       r"ActorDiedError: .*creation task.*OSError: no port for the data "
                       r"plane") as info:
        dcf.Cluster.ray(1)
    assert "\x1b[" not in str(info.value)
    wait_for(lambda: _cpus_free() == 2.0, what="the failed actor's CPU to be free")


def test_without_the_secret_a_ray_worker_ignores_control_messages(ray_cpus2):
    """The workers' ZeroMQ channel is signed as Cluster.local's is: a peer without the
    secret cannot shut a worker down or feed it values."""
    x = dcf.placeholder(dcf.float32, (), name="x")
    with on(0):
        a = x + 1.0
    with on(1):
        b = a * 2.0
    with dcf.Cluster.ray(2) as cluster, dcf.Session(cluster=cluster) as sess:
        assert sess.run(b, {x: 1.0}) == 4.0
        before = cluster._stats(1)[0]["rejections"].get("mac", 0)

        async def intrude() -> None:
            t = ZmqTransport("intruder", secret=b"not-the-secret", heartbeat_interval_s=60)
            await t.start()
            t.add_peer(task(1), cluster.spec["worker"][1])
            t.send_control(task(1), {"type": "shutdown"})
            t.send_tensor(task(1), (1, "a", (0,)), np.float32(100.0))
            deadline = time.monotonic() + 20
            while cluster._stats(1)[0]["rejections"].get("mac", 0) < before + 2:
                assert time.monotonic() < deadline, "the worker never got the messages"
                await asyncio.sleep(0.05)
            await t.close()

        asyncio.run(intrude())
        assert sess.run(b, {x: 2.0}) == 6.0
        assert all(alive(p) for p in cluster.worker_pids)


# ----------------------------------------------------------------- failures
@pytest.mark.parametrize("how", ["ray.kill", "SIGKILL"])
def test_a_worker_lost_to_ray_raises_worker_error_and_close_removes_the_actors(
        ray_cpus2, how):
    cluster = dcf.Cluster.ray(2)
    pids = list(cluster.worker_pids)

    def kill():
        if how == "ray.kill":
            ray.kill(cluster._ray_actors[1])
        else:
            os.kill(pids[1], signal.SIGKILL)

    try:
        sess, error = lose_worker_1_mid_loop(cluster, kill)
        sess.close()
    finally:
        cluster.close()   # a failed check leaves no actor holding the CPUs
    assert "lost to Ray" in str(error), "Ray told, not the heartbeats"
    assert ("killed by `ray.kill`" if how == "ray.kill" else
            "its worker process has died") in str(error), "and why"
    wait_for(lambda: not any(alive(p) for p in pids), 10, "the actors' processes to exit")
    wait_for(lambda: _cpus_free() == 2.0, 10, "Ray to release the workers' CPUs")
    # and a new Ray cluster of workers starts on the freed resources
    with dcf.Cluster.ray(2) as fresh, dcf.Session(cluster=fresh) as s2:
        assert set(fresh.worker_pids).isdisjoint(pids)
        with on(1):
            y = dcf.constant(2.0) * 3.0
        assert s2.run(y) == 6.0


def test_close_during_a_run_fails_the_run_and_kills_the_actors(ray_cpus2):
    pids = close_mid_run(dcf.Cluster.ray(2))
    wait_for(lambda: not any(alive(p) for p in pids), 10, "the actors' processes to exit")
    wait_for(lambda: _cpus_free() == 2.0, 10, "Ray to release the workers' CPUs")
