"""The wire from review 10, with workers started the long way (`python -m dcf.worker
--cluster FILE --task N`) and `dcf.Cluster(spec)`: IPv6 loopback addresses, two
clients of one worker, a client that could not attach leaving nothing running, and a
worker whose address is taken."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time

import pytest
import zmq

import dcf
from dcf.errors import WorkerError
from tests.cluster.helpers import on, spec_file, start_worker, stop_process

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


def _free_ipv6_port() -> int:
    try:
        s = socket.socket(socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 here")
    try:
        s.bind(("::1", 0))
        return s.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")
    finally:
        s.close()


def _start_worker(folder, address: str):
    """A worker started by hand at `address`: (its spec file's path, its process)."""
    spec = spec_file(folder, [address])
    return spec, start_worker(spec, stderr=subprocess.PIPE)


@pytest.fixture
def ipv6_worker(tmp_path):
    spec, proc = _start_worker(tmp_path, f"tcp://[::1]:{_free_ipv6_port()}")
    try:
        yield spec, proc
    finally:
        stop_process(proc)


@pytest.fixture
def worker(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    spec, proc = _start_worker(tmp_path, f"tcp://127.0.0.1:{port}")
    try:
        yield spec, proc
    finally:
        stop_process(proc)


def _doubler():
    x = dcf.placeholder(dcf.float32, ())
    with on(0):
        y = x * 2.0
    return x, y


def _attach(spec, proc, **kw) -> dcf.Cluster:
    try:
        return dcf.Cluster(spec, connect_timeout_s=5.0, **kw)
    except WorkerError:
        if proc.poll() is not None:   # say why the worker is gone
            pytest.fail(f"the worker exited: {proc.stderr.read().decode()[-400:]}")
        raise


def test_a_worker_and_a_client_on_the_ipv6_loopback(ipv6_worker):
    spec, proc = ipv6_worker
    with_client = dict(json.loads(spec.read_text()), client="tcp://[::1]:*",
                       secret_file=str(spec.parent / "secret"))
    x, y = _doubler()
    for s in (spec, with_client):       # the client on 127.0.0.1, then on [::1] too
        with _attach(s, proc) as cluster, dcf.Session(cluster=cluster) as sess:
            assert sess.run(y, {x: 3.0}) == 6.0


def test_a_client_with_a_shorter_heartbeat_timeout_leaves_the_other_attached(worker):
    # The slow client beats every 0.5 s; the fast one asks the worker to judge silence
    # by 0.4 s, which must not apply to the slow one (it was dropped, its runs failed).
    spec, proc = worker
    x, y = _doubler()
    with _attach(spec, proc, heartbeat_timeout_s=3.0) as slow, \
            dcf.Session(cluster=slow) as s_slow:
        assert s_slow.run(y, {x: 1.0}) == 2.0
        with _attach(spec, proc, heartbeat_timeout_s=0.4) as fast, \
                dcf.Session(cluster=fast) as s_fast:
            assert s_fast.run(y, {x: 2.0}) == 4.0
            time.sleep(1.2)
            assert s_slow.run(y, {x: 3.0}) == 6.0
            assert s_fast.run(y, {x: 4.0}) == 8.0
        assert s_slow.run(y, {x: 5.0}) == 10.0


def _dcf_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("dcf-"))


def test_a_cluster_that_cannot_attach_leaves_no_thread_or_socket_behind(tmp_path):
    (tmp_path / "secret").write_text(os.urandom(32).hex())
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()          # a port in use (nothing that speaks ZeroMQ)
    busy = s.getsockname()[1]
    try:
        before = _dcf_threads()
        fds = len(os.listdir("/proc/self/fd"))
        nobody = {"worker": ["tcp://127.0.0.1:9"], "secret_file": str(tmp_path / "secret")}
        for _ in range(3):   # no worker there: it does not answer
            with pytest.raises(WorkerError, match="did not answer"):
                dcf.Cluster(nobody, connect_timeout_s=0.2)
        with pytest.raises(zmq.ZMQError, match="in use"):   # the client cannot bind
            dcf.Cluster(dict(nobody, client=f"tcp://127.0.0.1:{busy}"))
        assert _dcf_threads() == before
        assert len(os.listdir("/proc/self/fd")) <= fds + 2
    finally:
        s.close()


def test_a_worker_whose_address_is_in_use_says_which_task_and_where(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    try:
        _, proc = _start_worker(tmp_path, address)
        _, err = proc.communicate(timeout=30)
    finally:
        s.close()
    assert proc.returncode == 1
    err = err.decode()
    assert f"/job:worker/task:0 cannot bind {address}: Address already in use" in err
    assert "Traceback" not in err
