"""Helpers for the cluster tests."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import dcf
from dcf.errors import WorkerError


def task(k: int) -> str:
    """The device prefix of worker k."""
    return f"/job:worker/task:{k}"


def on(k: int | None):
    """`dcf.device` of worker k, or no placement when k is None (the oracle's build)."""
    return dcf.device(task(k) if k is not None else None)


def both(build: Callable[[Callable[[int], Any]], tuple], cluster: dcf.Cluster,
         config: dcf.SessionConfig | None = None) -> tuple[Any, Any]:
    """Build the same graph twice, placed on the cluster's workers and unplaced, and run
    each: (cluster result, single-process result)."""
    g = dcf.Graph()
    with g.as_default():
        fetches, feeds = build(on)
    with dcf.Session(g, cluster=cluster, config=config) as sess:
        got = sess.run(fetches, feeds)
    g2 = dcf.Graph()
    with g2.as_default():
        fetches2, feeds2 = build(lambda k: on(None))
    with dcf.Session(g2, config=config) as sess:
        want = sess.run(fetches2, feeds2)
    return got, want


def assert_same(got, want) -> None:
    """The same structure of fetches, with equal values."""
    got_l, want_l = dcf.nest.flatten(got), dcf.nest.flatten(want)
    assert len(got_l) == len(want_l)
    for a, b in zip(got_l, want_l):
        np.testing.assert_array_equal(a, b)


def open_fds(pid: int | None = None) -> int:
    return len(os.listdir(f"/proc/{pid or os.getpid()}/fd"))


def rss_bytes(pid: int | None = None) -> int:
    with open(f"/proc/{pid or os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def long_loop(n: int = 10**8):
    """A loop whose body spans workers 0 and 1; it would run for minutes."""
    def body(i, a):
        with on(1):
            a = a + 1.0
        with on(0):
            return i + 1, a

    with on(0):
        i0 = dcf.constant(0)
        lim = dcf.constant(n)

    def cond(i, a):
        with on(0):
            return i < lim

    return dcf.while_loop(cond, body, (i0, dcf.constant(0.0)))


def wait_for(cond, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def run_in_thread(fn):
    """Start fn() on a daemon thread: (thread, box); box gets "value" or "error", and
    "t", the time it returned."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e
        box["t"] = time.monotonic()

    th = threading.Thread(target=target, daemon=True)
    th.start()
    return th, box


@contextlib.contextmanager
def worker_1_stopped_mid_run(cluster, sess, fetch):
    """Run `fetch` on a thread and SIGSTOP worker 1 once it runs; yields (box, the time
    of the stop) once the run ended or 10 s passed (box as run_in_thread's), and lets
    the worker go on (SIGCONT) on the way out."""
    th, box = run_in_thread(lambda: sess.run(fetch))
    time.sleep(0.3)
    stopped = time.monotonic()
    os.kill(cluster.worker_pids[1], signal.SIGSTOP)
    try:
        th.join(10)
        yield box, stopped
    finally:
        os.kill(cluster.worker_pids[1], signal.SIGCONT)


def close_mid_run(cluster) -> list:
    """Close `cluster` while a run of long_loop() is on it: the run fails (WorkerError,
    or RuntimeError from the closed session) within 10 s. Returns the workers' pids."""
    pids = list(cluster.worker_pids)
    sess = dcf.Session(cluster=cluster)
    th, box = run_in_thread(lambda: sess.run(long_loop()))
    time.sleep(0.3)
    cluster.close()
    th.join(10)
    assert not th.is_alive()
    assert isinstance(box.get("error"), (WorkerError, RuntimeError)), box
    return pids


def lose_worker_1_mid_loop(cluster, kill: Callable[[], None]) -> tuple:
    """On `cluster` (two workers), set a variable on worker 0 to 5.0, run long_loop() on a
    thread and call kill() once it runs: the run fails with WorkerError naming task 1
    within the heartbeat bound, a run that needs the lost worker fails at once, and the
    variable kept its 5.0. Returns (the session, the first run's error)."""
    with on(0):
        v = dcf.Variable(np.float32(0.0), name="v")
    set_v = v.assign(5.0)
    out = long_loop()
    sess = dcf.Session(cluster=cluster)
    sess.run(dcf.global_variables_initializer())
    sess.run(set_v)
    th, box = run_in_thread(lambda: sess.run(out))
    time.sleep(0.3)
    assert th.is_alive(), "the loop is running"
    t_kill = time.monotonic()
    kill()
    th.join(10)
    assert not th.is_alive(), "the run returned"
    assert isinstance(box.get("error"), WorkerError), box
    assert "/job:worker/task:1" in str(box["error"])
    assert box["t"] - t_kill < dcf.SessionConfig().heartbeat_timeout_s
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="task:1"):
        sess.run(out)
    assert time.monotonic() - t0 < 1.0
    assert sess.run(v) == 5.0
    return sess, box["error"]


# ------------------------------------------------------ workers started by hand
def spec_file(folder: str | os.PathLike, workers: list[str]) -> pathlib.Path:
    """folder/cluster.json naming `workers`, whose secret_file is a fresh HMAC secret
    written to folder/secret."""
    folder = pathlib.Path(folder)
    (folder / "secret").write_text(os.urandom(32).hex())
    spec = folder / "cluster.json"
    spec.write_text(json.dumps({"worker": workers, "secret_file": "secret"}))
    return spec


def start_worker(spec: str | os.PathLike, task: int = 0, *, task_by_env: bool = False,
                 **popen: Any) -> subprocess.Popen:
    """`python -m dcf.worker --cluster SPEC` as a user starts it, this checkout importable,
    for `task` (given as --task, or with `task_by_env` as DCF_TASK_INDEX, the other way);
    `popen`: more of subprocess.Popen's arguments (stderr=subprocess.PIPE, say)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    argv = [sys.executable, "-m", "dcf.worker", "--cluster", str(spec)]
    if task_by_env:
        env["DCF_TASK_INDEX"] = str(task)
    else:
        argv += ["--task", str(task)]
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, **popen)


def stop_process(proc: subprocess.Popen, wait_s: float = 5.0) -> None:
    """Terminate `proc` and wait for it; kill it where it has not ended within wait_s."""
    proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
