"""Cluster.ray: workers as Ray actors (skipped where ray is not installed)."""

from __future__ import annotations

import pytest

import dcf
from tests.cluster.helpers import on

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def test_ray_workers_run_a_placed_graph():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    try:
        with dcf.Cluster.ray(2) as cluster:
            x = dcf.placeholder(dcf.float32, ())
            with on(0):
                a = x + 1.0
            with on(1):
                b = a * 2.0
            with dcf.Session(cluster=cluster) as sess:
                assert sess.run(b, {x: 1.0}) == 4.0
    finally:
        ray.shutdown()
