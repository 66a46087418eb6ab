"""A py_func's state on a worker is what it is in the client's process: py_funcs that
share an object (an environment's reset and step) share it there too, within a run and
across runs, and a py_func's state outlives the plan that first shipped it (a run that
fetches something else)."""

from __future__ import annotations

import numpy as np
import pytest

import dcf

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

W0 = "/job:worker/task:0/cpu:0"


class _Env:
    def __init__(self) -> None:
        self.t = -100                 # not reset yet

    def reset(self) -> np.int32:
        self.t = 0
        return np.int32(self.t)

    def step(self, action: np.ndarray) -> np.int32:
        self.t += 1
        return np.int32(self.t)


def _runs(device: str, cluster: dcf.Cluster | None) -> list:
    env = _Env()
    with dcf.Graph().as_default():
        with dcf.device(device):
            reset = dcf.py_func(env.reset, [], dcf.int32, name="reset")
            with dcf.control_dependencies([reset]):
                reset_step = dcf.py_func(env.step, [dcf.constant(1)], dcf.int32,
                                         name="reset_step")
            step = dcf.py_func(env.step, [dcf.constant(1)], dcf.int32, name="step")
            other = dcf.constant(7) * 2
        opts = dcf.RunOptions(timeout_s=30)
        with dcf.Session(cluster=cluster) as sess:
            got = [int(sess.run(f, options=opts)) for f in
                   (reset_step, reset_step, reset, step, step)]
            # another fetch set: another plan, the same environment
            return got + [int(sess.run([step, other], options=opts)[0])]


def test_py_funcs_sharing_an_environment_share_it_on_a_worker():
    want = _runs("/cpu:0", None)
    assert want == [1, 1, 0, 1, 2, 3]
    with dcf.Cluster.local(1) as cluster:
        assert _runs(W0, cluster) == want
