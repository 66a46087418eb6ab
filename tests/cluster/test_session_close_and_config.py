"""A cluster Session's close() and its settings against the cluster's own."""

from __future__ import annotations

import time

import pytest

import dcf
from dcf.errors import WorkerError
from tests.cluster.helpers import long_loop, run_in_thread, worker_1_stopped_mid_run

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


def test_closing_a_cluster_session_cancels_a_run_in_flight_in_another_thread():
    with dcf.Cluster.local(2) as cluster:
        out = long_loop()
        sess = dcf.Session(cluster=cluster)
        th, box = run_in_thread(lambda: sess.run(out))
        time.sleep(0.5)
        sess.close()
        closed = time.monotonic()
        th.join(5)
        assert not th.is_alive()
        assert isinstance(box.get("error"), dcf.errors.CancelledError), box
        assert box["t"] <= closed + 0.5
        with dcf.Session(cluster=cluster) as again:      # the workers serve a new one
            assert again.run(dcf.constant(2.0) * 3.0) == 6.0


def test_the_clusters_heartbeat_timeout_holds_where_the_session_leaves_its_default():
    with dcf.Cluster.local(2, heartbeat_timeout_s=1.0) as cluster:
        out = long_loop()
        with dcf.Session(cluster=cluster) as sess:
            with worker_1_stopped_mid_run(cluster, sess, out) as (box, stopped):
                assert isinstance(box.get("error"), WorkerError), box
                assert box["t"] - stopped < 1.0 + 1.5      # not the session default's 5 s
