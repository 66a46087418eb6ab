"""Review 10, by use: Ctrl-C while `Cluster.local` starts its workers."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from dcf.cluster import _WORKER_MAIN

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(sys.platform == "win32", reason="ipc sockets")
def test_a_worker_whose_cluster_closed_before_it_bound_exits_without_a_traceback():
    # Cluster.local interrupted while its workers start: the client closes, a worker that
    # stops first removes the (still empty) socket folder, and the others cannot bind.
    folder = tempfile.mkdtemp(prefix="dcf-cluster-")
    os.rmdir(folder)
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run(
        [sys.executable, "-c", _WORKER_MAIN, "--task", "0", "--client",
         f"ipc://{folder}/client", "--bind", f"ipc://{folder}/w0"],
        input=b"00" * 32 + b"\n", capture_output=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    assert b"Traceback" not in p.stderr, p.stderr.decode()
    assert not os.path.exists(folder)


@pytest.mark.skipif(sys.platform == "win32", reason="ipc sockets")
def test_a_second_ctrl_c_while_the_cluster_closes_leaves_no_socket_folder(monkeypatch):
    import dcf
    from dcf import cluster as cluster_mod

    cluster = dcf.Cluster.local(1, ipc=True)
    folder, pid = cluster._ipc_dir, cluster.worker_pids[0]
    real_reap = cluster_mod._reap

    def interrupted(procs, grace_s=3.0):          # Ctrl-C again while it waits
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster_mod, "_reap", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cluster.close()
    assert not os.path.exists(folder)
    procs = [w.proc for w in cluster._client.workers.values()]
    real_reap(procs)                               # (the worker still stops on its own)
    assert procs[0].pid == pid and procs[0].returncode == 0
