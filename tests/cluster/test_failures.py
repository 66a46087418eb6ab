"""Failures: dead or silent workers, deadlines, and the client going away.

Nothing may hang: every affected run raises within the heartbeat bound, healthy workers
keep their state, and closing tears every process down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import dcf
from dcf.errors import DeadlineExceededError, WorkerError
from tests.cluster.helpers import (alive, close_mid_run, long_loop, lose_worker_1_mid_loop,
                                   on, wait_for, worker_1_stopped_mid_run)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


def test_killed_worker_raises_worker_error_within_seconds_and_everything_closes():
    cluster = dcf.Cluster.local(2)
    pids = list(cluster.worker_pids)
    sess, _ = lose_worker_1_mid_loop(cluster, lambda: os.kill(pids[1], signal.SIGKILL))
    sess.close()
    cluster.close()
    wait_for(lambda: not any(alive(p) for p in pids), 10, "workers to exit")
    with dcf.Cluster.local(1) as fresh, dcf.Session(cluster=fresh) as s2:
        with on(0):
            y = dcf.constant(2.0) * 3.0
        assert s2.run(y) == 6.0


def test_silent_worker_raises_worker_error_after_the_heartbeat_timeout():
    with dcf.Cluster.local(2) as cluster:
        out = long_loop()
        config = dcf.SessionConfig(heartbeat_timeout_s=1.0)
        with dcf.Session(cluster=cluster, config=config) as sess:
            with worker_1_stopped_mid_run(cluster, sess, out) as (box, t_stop):
                assert isinstance(box.get("error"), WorkerError), box
                assert "/job:worker/task:1" in str(box["error"])
                assert "heartbeat" in str(box["error"])
                assert box["t"] - t_stop < 1.0 + 1.5
            # once it answers again (heartbeats), runs may use it again
            with on(1):
                y = dcf.constant(1.0) + 1.0
            wait_for(lambda: cluster._client.workers["/job:worker/task:1"].alive, 10,
                      "the worker to be heard from again")
            assert sess.run(y) == 2.0


def test_deadline_aborts_the_step_on_every_worker_and_the_session_goes_on():
    with dcf.Cluster.local(3) as cluster:
        with on(1):
            q = dcf.FIFOQueue(4, [dcf.float32], shapes=[()], name="q")
            item = q.dequeue()                  # the queue stays empty: it waits forever
        with on(2):
            spin = long_loop(10**8)[1]         # and a loop across workers 0 and 1
        total = item + spin
        with dcf.Session(cluster=cluster) as sess:
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceededError, match="timeout_s=0.5"):
                sess.run(total, options=dcf.RunOptions(timeout_s=0.5))
            assert time.monotonic() - t0 < 3.0
            wait_for(lambda: all(cluster._stats(k)[0]["steps"] == 0 for k in range(3)),
                      10, "every worker to drop the aborted step")
            with on(1):
                fill = q.enqueue([dcf.constant(7.0)])
            sess.run(fill)
            assert sess.run(item) == 7.0


def test_ctrl_c_during_a_run_aborts_it_on_every_worker_and_the_session_goes_on():
    """Ctrl-C while the client waits for a run over two workers: KeyboardInterrupt comes
    out of run once, every worker drops the step, and the session runs again."""
    with dcf.Cluster.local(2) as cluster:
        spin = long_loop(10**8)[1]
        with dcf.Session(cluster=cluster) as sess:
            main = threading.main_thread().ident
            timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
            timer.start()
            t0 = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                sess.run(spin)
            timer.join()
            assert time.monotonic() - t0 < 5.0
            wait_for(lambda: all(cluster._stats(k)[0]["steps"] == 0 for k in range(2)),
                     10, "every worker to drop the interrupted step")
            with on(1):
                z = dcf.constant(2.0) * 3.0
            assert sess.run(z) == 6.0


def test_ctrl_c_returns_once_the_clients_py_func_in_the_run_has_returned():
    """A cluster run's client-side py_funcs run in the I/O thread: KeyboardInterrupt comes
    out of run once the run has unwound there, not while a py_func is still running beside
    the caller's handler (as in-process runs, whose py_funcs run in the caller's thread)."""
    inside = threading.Event()
    state = {"running": False, "calls": 0}

    def slow(i):
        state["running"] = True
        state["calls"] += 1
        inside.set()
        time.sleep(0.4)
        state["running"] = False
        return i

    with dcf.Cluster.local(1) as cluster:
        step = lambda i: dcf.reshape(dcf.py_func(slow, [i], dcf.int32), []) + 1   # noqa: E731
        r = dcf.while_loop(lambda i: i < 5, step, [0])
        with dcf.Session(cluster=cluster) as sess:
            main = threading.main_thread().ident
            threading.Thread(target=lambda: (inside.wait(10), signal.pthread_kill(
                main, signal.SIGINT))).start()
            with pytest.raises(KeyboardInterrupt):
                sess.run(r)
            assert not state["running"]
            calls = state["calls"]
            time.sleep(0.5)
            assert state["calls"] == calls == 1     # nothing of the run goes on after it


def test_a_cluster_run_takes_ctrl_c_over_while_it_waits():
    """While the main thread waits for a cluster run, SIGINT goes to dcf's handler, which
    only records the request and cancels the run, as in-process runs do (dcf/interrupts.py).
    After the run, the program's handler is back."""
    seen = []

    def handler_now(x):
        seen.append(signal.getsignal(signal.SIGINT))
        return x

    with dcf.Cluster.local(1) as cluster:
        y = dcf.py_func(handler_now, [dcf.constant(1.0)], dcf.float32)   # (the client's)
        with dcf.Session(cluster=cluster) as sess:
            assert sess.run(y) == 1.0
    assert seen and seen[0] is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_workers_exit_when_their_client_process_dies(tmp_path):
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        import dcf
        cluster = dcf.Cluster.local(2)
        print(" ".join(map(str, cluster.worker_pids)), flush=True)
        time.sleep(60)
    """))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env,
                            text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        proc.kill()
        proc.wait(5)
        wait_for(lambda: not any(alive(p) for p in pids), 10, "orphaned workers to exit")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_close_during_a_run_fails_the_run_and_stops_the_workers():
    pids = close_mid_run(dcf.Cluster.local(2))
    wait_for(lambda: not any(alive(p) for p in pids), 10, "workers to exit")


def test_local_workers_use_a_private_ipc_directory_that_close_removes():
    import stat

    with dcf.Cluster.local(1) as cluster:
        address = cluster.spec["worker"][0]
        if not address.startswith("ipc://"):
            pytest.skip("no ipc endpoints on this platform")
        folder = os.path.dirname(address[len("ipc://"):])
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert cluster._client.transport.address.startswith(f"ipc://{folder}/")
    assert not os.path.exists(folder)
    with dcf.Cluster.local(1, ipc=False) as cluster:
        assert cluster.spec["worker"][0].startswith("tcp://127.0.0.1:")
