"""Session arguments and feeds from review 34 (options and run arguments): a cluster
argument that is no dcf.Cluster, and a tensor fed twice in one feed_dict (as itself and
by its name)."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

import dcf


def test_session_cluster_that_is_not_a_cluster_is_a_type_error_naming_it(monkeypatch):
    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(TypeError, match=r"Session\(cluster=...\) takes a dcf.Cluster, "
                                        r"got str 'tcp://host0:5555'"):
        dcf.Session(cluster="tcp://host0:5555")
    with pytest.raises(TypeError, match=r"Session\(cluster=...\) takes a dcf.Cluster, got dict"):
        dcf.AsyncSession(cluster={"worker": ["tcp://host0:5555"]})
    gc.collect()
    assert unraisable == []     # the half-made sessions went quietly (nothing in __del__)


@pytest.mark.parametrize("devices", [("/cpu:0",), ("/cpu:0", "/cpu:1")])
def test_a_tensor_fed_twice_takes_the_later_value_for_its_fetch_and_its_consumers(
        compiled, devices):
    # (TF1 likewise: the later of {x: a, "x:0": b} is fed)
    with dcf.device(devices[0]):
        x = dcf.placeholder(dcf.float32, [2], name="x")
    with dcf.device(devices[-1]):
        z = x * 2.0 + 1.0
    with dcf.Session(config=compiled) as sess:
        fx, fz = sess.run([x, z], {x: [1.0, 2.0], "x:0": [3.0, 4.0]})
        np.testing.assert_array_equal(fx, [3.0, 4.0])
        np.testing.assert_array_equal(fz, [7.0, 9.0])
        fx, fz = sess.run([x, z], {"x:0": [3.0, 4.0], x: [1.0, 2.0]})
        np.testing.assert_array_equal(fx, [1.0, 2.0])
        np.testing.assert_array_equal(fz, [3.0, 5.0])
