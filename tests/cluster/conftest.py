"""Fixtures for tests that start worker processes (marked `cluster`).

One `Cluster.local(3)` serves a whole test module (starting workers costs about a
second); tests that break workers start their own.
"""

from __future__ import annotations

import pytest

import dcf


@pytest.fixture(scope="module")
def cluster3():
    with dcf.Cluster.local(3) as cluster:
        yield cluster
