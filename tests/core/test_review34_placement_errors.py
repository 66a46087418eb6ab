"""A run with an op on a worker's device that the session lacks says why: a plain
Session has no workers (the error named only the op and the device), and a worker has
one CPU device, /cpu:0 (every /cpu:K exists only in the session's own process)."""

from __future__ import annotations

import pytest

import dcf
from dcf.placement import place


def test_a_workers_device_in_a_plain_session_says_there_is_no_cluster():
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (), name="x")
        with dcf.device("/job:worker/task:1"):
            y = dcf.square(x, name="y")
    with dcf.Session(graph=g) as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError,
                           match=r"Square 'y' is placed on /job:worker/task:1/cpu:0, .*"
                                 r"no cluster.*dcf\.Session\(cluster=\.\.\.\)"):
            sess.run(y, {x: 1.0})


def test_a_workers_second_cpu_says_a_worker_has_one():
    g = dcf.Graph()
    with g.as_default():
        with dcf.device("/job:worker/task:1/cpu:3"):
            y = dcf.constant(1.0, name="y")
    exists = lambda d: d in ("/cpu:0", "/job:worker/task:1/cpu:0")   # noqa: E731
    with pytest.raises(dcf.errors.InvalidArgumentError,
                       match=r"Const 'y' is placed on /job:worker/task:1/cpu:3, .*"
                             r"one CPU device, /job:worker/task:1/cpu:0"):
        place([y.op], "/cpu:0", exists, process_of=lambda d: d.rsplit("/", 1)[0])
