"""A cluster Session's SessionConfig on its workers (review 34): intra_op_threads, which a
session in one process sets process-wide, sets the workers' BLAS threads too."""

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
