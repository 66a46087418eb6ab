"""Heartbeats say "this process is alive": a long kernel is not a dead process.

A py_func that holds a process's event loop past the heartbeat timeout (on a worker or on
the client) must not make anyone count that process as lost; and a step that a worker
does abort because its client went silent must fail the client's run, never hang it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import dcf
from tests.cluster.helpers import on

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]

TIMEOUT_S = 1.0     # heartbeat timeout of these tests
KERNEL_S = 2.5      # how long their kernels hold the event loop


def _slow(value: float):
    def fn():
        time.sleep(KERNEL_S)        # holds the loop it runs on (a slow env step, a load)
        return np.float32(value)
    return fn


def test_a_worker_py_func_longer_than_the_heartbeat_timeout_returns_its_value():
    with dcf.Cluster.local(1, heartbeat_timeout_s=TIMEOUT_S) as cluster:
        with on(0):
            y = dcf.py_func(_slow(1.0), [], dcf.float32, name="slow_on_worker") + 1.0
        config = dcf.SessionConfig(heartbeat_timeout_s=TIMEOUT_S)
        with dcf.Session(cluster=cluster, config=config) as sess:
            t0 = time.monotonic()
            assert sess.run(y) == 2.0
            assert KERNEL_S <= time.monotonic() - t0 < KERNEL_S + 3.0
            assert cluster._client.workers["/job:worker/task:0"].alive
            # and the worker still serves this client (it aborted nothing)
            with on(0):
                z = dcf.constant(3.0) * 2.0
            assert sess.run(z) == 6.0


def test_a_client_py_func_longer_than_the_heartbeat_timeout_feeds_a_worker_op():
    with dcf.Cluster.local(1, heartbeat_timeout_s=TIMEOUT_S) as cluster:
        a = dcf.py_func(_slow(1.0), [], dcf.float32, name="slow_on_client")
        with on(0):
            y = (a + 1.0) * 2.0
        config = dcf.SessionConfig(heartbeat_timeout_s=TIMEOUT_S)
        with dcf.Session(cluster=cluster, config=config) as sess:
            t0 = time.monotonic()
            assert sess.run(y) == 4.0
            assert KERNEL_S <= time.monotonic() - t0 < KERNEL_S + 3.0
            assert sess.run(y) == 4.0     # twice: nothing was aborted or lost


def test_a_slow_worker_py_func_beside_a_loop_over_two_workers():
    """A kernel holding worker 1's loop while worker 0 and the client wait on it: nobody
    counts anybody as lost, the values come back."""
    with dcf.Cluster.local(2, heartbeat_timeout_s=TIMEOUT_S) as cluster:
        with on(1):
            s = dcf.py_func(_slow(5.0), [], dcf.float32, name="slow_on_worker1")
            s = dcf.reshape(s, [])
        with on(0):
            y = s * 2.0

            def body(i, acc):
                return i + 1, acc + y

            out = dcf.while_loop(lambda i, acc: i < 3, body, (dcf.constant(0), 0.0))[1]
        config = dcf.SessionConfig(heartbeat_timeout_s=TIMEOUT_S)
        with dcf.Session(cluster=cluster, config=config) as sess:
            assert sess.run(out) == 30.0


def test_a_step_aborted_for_a_silent_client_fails_its_run_when_the_client_is_back(tmp_path):
    """The client process is stopped (SIGSTOP) past the heartbeat timeout while a run waits
    on a worker: the worker aborts the step; once the client runs again, that run raises
    WorkerError saying so (it used to wait forever), and the session goes on."""
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        import dcf
        from dcf.errors import WorkerError
        with dcf.Cluster.local(1, heartbeat_timeout_s={TIMEOUT_S}) as cluster:
            with dcf.device("/job:worker/task:0"):
                q = dcf.FIFOQueue(2, [dcf.float32], shapes=[()])
                item = q.dequeue()            # waits (asynchronously) for an enqueue
                fill = q.enqueue([dcf.constant(7.0)])
            config = dcf.SessionConfig(heartbeat_timeout_s={TIMEOUT_S})
            with dcf.Session(cluster=cluster, config=config) as sess:
                print("running", flush=True)
                try:
                    sess.run(item)
                    print("result")
                except WorkerError as e:
                    print("WorkerError", str(e).replace(chr(10), " "), flush=True)
                sess.run(fill)
                print("then", sess.run(item), flush=True)
    """))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "running"
        time.sleep(0.5)               # the run is in flight on the worker
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(KERNEL_S)          # silent past the heartbeat timeout
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(5)
    lines = out.splitlines()
    assert lines[0].startswith("WorkerError"), out
    assert "aborted step" in lines[0] and "silent" in lines[0], out
    assert lines[1] == "then 7.0", out


def test_transport_heartbeats_flow_while_the_event_loop_is_held():
    """Transport level: B's loop is held (a blocking kernel) for several heartbeat
    timeouts; A, on another loop, keeps hearing B, and B does not report A when its
    loop is free again. A closed B is still reported within the timeout."""
    from dcf.actors.remote import LoopThread
    from dcf.actors.transport import ZmqTransport

    secret = b"heartbeat-test-secret"
    io_a, io_b = LoopThread("test-hb-a"), LoopThread("test-hb-b")
    lost: dict[str, list] = {"A": [], "B": []}
    kw = {"secret": secret, "heartbeat_interval_s": 0.05, "heartbeat_timeout_s": 0.4}
    a = ZmqTransport("A", **kw, on_peer_lost=lambda *m: lost["A"].append(m))
    b = ZmqTransport("B", **kw, on_peer_lost=lambda *m: lost["B"].append(m))

    async def start(t):
        await t.start()
        return t.address

    try:
        addr_a, addr_b = io_a.call(start(a)), io_b.call(start(b))

        async def add(t, name, address):
            t.add_peer(name, address)

        io_a.call(add(a, "B", addr_b))
        io_b.call(add(b, "A", addr_a))
        time.sleep(0.3)
        io_b.loop.call_soon_threadsafe(time.sleep, 1.5)   # B's loop held for 1.5 s
        time.sleep(1.8)
        assert lost == {"A": [], "B": []}
        assert a.stats["rejected"] == b.stats["rejected"] == 0
        t_closed = time.monotonic()
        io_b.call(b.close())
        deadline = time.monotonic() + 3.0
        while not lost["A"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [peer for peer, _ in lost["A"]] == ["B"]
        assert time.monotonic() - t_closed < 0.4 + 0.5
    finally:
        io_a.call(a.close())
        io_b.call(b.close())
        io_a.stop()
        io_b.stop()


def test_only_heartbeats_come_from_a_heartbeat_identity():
    """A peer's heartbeat identity ("name" + NUL + "hb") carries heartbeats, nothing else."""
    import zmq

    from dcf.actors.codec import pack_tensors
    from dcf.actors.remote import LoopThread
    from dcf.actors.transport import ZmqTransport

    io = LoopThread("test-hb-ident")
    got: list = []
    t = ZmqTransport("A", heartbeat_interval_s=60,
                     on_tensor=lambda *m: got.append(m))

    async def start():
        await t.start()
        t.add_peer("B", "tcp://127.0.0.1:9")
        return t.address

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        address = io.call(start())
        sock.linger = 0
        sock.routing_id = b"B\0hb"
        sock.connect(address)
        body, bulk = pack_tensors((((1, "e", ()), np.float32(1), False),), 1 << 20)
        sock.send(b"T" + body)
        sock.send(b"H")
        deadline = time.monotonic() + 3.0
        while t.stats["received"] + t.stats["rejected"] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert got == []
        assert t.stats["received"] == 1 and dict(t.rejections) == {"kind": 1}
    finally:
        sock.close(linger=0)
        ctx.term()
        io.call(t.close())
        io.stop()
