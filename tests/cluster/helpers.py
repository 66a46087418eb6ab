"""Helpers for the cluster tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import dcf


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
