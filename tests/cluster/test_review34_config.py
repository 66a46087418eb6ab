"""A cluster Session's SessionConfig on its workers (review 34): intra_op_threads, which a
session in one process sets process-wide, sets the workers' BLAS threads too; and
options given as numpy scalars (which SessionConfig and RunOptions take) reach them; and
a session's heartbeat_timeout_s holds while it is open, not after."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf import blas

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


def _blas_threads(_):
    from dcf import blas as worker_blas

    return np.int32(worker_blas.get_threads())


@pytest.mark.skipif(blas.get_threads() is None, reason="BLAS threads not controllable here")
def test_intra_op_threads_is_the_workers_blas_threads_too():
    with dcf.device("/job:worker/task:0/cpu:0"):
        threads = dcf.py_func(_blas_threads, [dcf.constant(0)], dcf.int32)
    with dcf.Cluster.local(1) as cluster:
        for n in (2, 1, np.int64(2)):
            config = dcf.SessionConfig(intra_op_threads=n)
            with dcf.Session(cluster=cluster, config=config) as sess:
                assert sess.run(threads) == n
        with dcf.Session(cluster=cluster) as sess:
            assert sess.run(threads) == 1
        with dcf.Session(cluster=cluster,
                         config=dcf.SessionConfig(intra_op_threads=None)) as sess:
            assert sess.run(threads) == 1   # (None leaves it alone)


def test_options_given_as_numpy_scalars_work_on_a_cluster():
    with dcf.device("/job:worker/task:0/cpu:0"):
        out = dcf.constant(1.0) * 2.0
    config = dcf.SessionConfig(gpu_memory_limit=np.int64(2**30), swap_threshold=np.float32(0.5),
                               heartbeat_timeout_s=np.float64(4.0), intra_op_threads=np.int32(1),
                               compile_frames=np.bool_(True), fuse_devices=np.bool_(False))
    with dcf.Cluster.local(1) as cluster, dcf.Session(cluster=cluster, config=config) as sess:
        md = dcf.RunMetadata()
        options = dcf.RunOptions(trace=np.bool_(True), timeout_s=np.float32(30.0))
        assert sess.run(out, options=options, run_metadata=md) == 2.0
        assert md.trace
        assert cluster._client.transport.heartbeat_timeout_s == 4.0
    assert all(type(getattr(config, k)) in (int, float, bool) for k in vars(config))


def _heartbeat_timeout(cluster) -> float:
    async def read():       # (on the I/O loop, after the settings queued there)
        return cluster._client.transport.heartbeat_timeout_s
    return cluster._io.call(read())


def test_a_sessions_heartbeat_timeout_does_not_outlive_it():
    with dcf.Cluster.local(1, heartbeat_timeout_s=1.0) as cluster:
        a = dcf.Session(cluster=cluster, config=dcf.SessionConfig(heartbeat_timeout_s=30.0))
        assert _heartbeat_timeout(cluster) == 30.0
        b = dcf.Session(cluster=cluster, config=dcf.SessionConfig(heartbeat_timeout_s=20.0))
        assert _heartbeat_timeout(cluster) == 20.0      # (the latest open session's)
        b.close()
        assert _heartbeat_timeout(cluster) == 30.0
        a.close()
        with dcf.Session(cluster=cluster) as sess:      # left at its default: the cluster's
            assert sess.run(dcf.constant(2.0)) == 2.0
            assert _heartbeat_timeout(cluster) == 1.0
