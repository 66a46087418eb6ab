"""Cluster edges from review 4: a py_func on a worker that returns its own buffer and
changes it in place (large enough for the zero-copy send); py_func exceptions that are not
Exceptions on a worker (no hang, no dead worker); fetched values the caller may write; and
the private socket folder of a `Cluster.local` whose client was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

W0 = "/job:worker/task:0/cpu:0"
W1 = "/job:worker/task:1/cpu:0"


@pytest.fixture(scope="module")
def cluster2():
    with dcf.Cluster.local(2) as cluster:
        yield cluster


@pytest.mark.parametrize("size", [16, 20_000], ids=["small", "zero-copy"])
def test_py_func_buffer_changed_in_place_reaches_the_other_worker_as_produced(cluster2, size):
    n = 12
    buf = np.zeros(size, np.float32)

    def step(i):
        buf[:] = float(i)          # state updated in place, returned by reference
        return buf

    def body(i, acc):
        with dcf.device(W0):
            o = dcf.py_func(step, [i], dcf.float32, name="env")
        with dcf.device(W1):
            acc = acc + dcf.reduce_sum(dcf.cast(o, dcf.float64))
        return i + 1, acc

    with dcf.Graph().as_default():
        acc = dcf.while_loop(lambda i, a: i < n, body, (0, dcf.constant(0.0, dcf.float64)))[1]
        with dcf.Session(cluster=cluster2) as sess:
            for _ in range(2):
                got = sess.run(acc, options=dcf.RunOptions(timeout_s=30))
                assert got == size * n * (n - 1) // 2


class _EnvDone(BaseException):
    pass


def _raise(exc):
    def fn():
        raise exc
    return fn


@pytest.mark.parametrize("exc", [_EnvDone("episode over"), GeneratorExit(), KeyboardInterrupt(),
                                 SystemExit(2)],
                         ids=["custom", "GeneratorExit", "KeyboardInterrupt", "SystemExit"])
def test_py_func_base_exception_on_a_worker_is_an_op_error_and_the_worker_lives(cluster2, exc):
    pids = list(cluster2.worker_pids)
    with dcf.Graph().as_default():
        with dcf.device(W0):
            y = dcf.py_func(_raise(exc), [], dcf.float32, name="env_step")
            ok = dcf.constant(1.5) * 2
        with dcf.Session(cluster=cluster2) as sess:
            t0 = time.monotonic()
            with pytest.raises(InvalidArgumentError,
                               match=rf"PyFunc 'env_step' on {W0}.*{type(exc).__name__}"):
                sess.run(y, options=dcf.RunOptions(timeout_s=30))
            assert time.monotonic() - t0 < 10        # an answer, not the deadline
            assert sess.run(ok) == 3.0
    assert all(os.path.exists(f"/proc/{p}") for p in pids)


def test_values_fetched_from_a_worker_are_writable(cluster2):
    with dcf.Graph().as_default():
        with dcf.device(W0):
            w = dcf.Variable(np.zeros(3, np.float32), name="w")
            y = w + 1.0
        p = dcf.placeholder(dcf.float32, (2,))
        with dcf.device(W1):
            z = p * 2.0
        with dcf.Session(cluster=cluster2) as sess:
            sess.run(dcf.global_variables_initializer())
            r, fed, rz = sess.run([y, p, z], {p: np.ones(2, np.float32)})
            for a in (r, fed, rz):
                assert a.flags.writeable
            r[0] = 5.0
            np.testing.assert_array_equal(r, [5.0, 1.0, 1.0])
            np.testing.assert_array_equal(sess.run(y), [1.0, 1.0, 1.0])   # w is untouched
            np.testing.assert_array_equal(rz, [2.0, 2.0])


_CHILD = """
import dcf, time
c = dcf.Cluster.local(2)
print(c._ipc_dir, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_socket_folder_goes_when_the_client_is_killed(sig):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True,
                            env=env)
    folder = proc.stdout.readline().strip()
    if folder == "None":
        proc.kill()
        proc.wait()
        pytest.skip("no ipc sockets on this platform")
    assert os.path.isdir(folder)
    proc.send_signal(sig)
    proc.wait()
    deadline = time.monotonic() + 20
    while os.path.exists(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(folder), sorted(os.listdir(folder))
