"""Session arguments, feeds and fetches from review 34 (options and run arguments): a
cluster argument that is no dcf.Cluster, a tensor fed twice in one feed_dict (as itself
and by its name), fetch dicts whose keys do not sort or that are defaultdicts, and GPU
arrays fed to a tensor of another dtype."""

from __future__ import annotations

import collections
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


def test_fetch_dicts_with_keys_of_mixed_types_and_defaultdicts(compiled):
    # (TF1's Session takes both: its fetch structures are not sorted by key)
    x = dcf.placeholder(dcf.float32, [2], name="x")
    y = x * 2.0
    z = y + 1.0
    op = dcf.no_op()
    fetches = collections.defaultdict(list)
    fetches["ys"].append(y)
    fetches["ys"].append(z)
    fetches["ops"].append(op)
    with dcf.Session(config=compiled) as sess:
        got = sess.run({1: y, "a": z, (0, 1): [op, {2: z, "b": y}]}, {x: [1.0, 2.0]})
        assert list(got) == [1, "a", (0, 1)]    # (the caller's order, and its values)
        np.testing.assert_array_equal(got[1], [2.0, 4.0])
        np.testing.assert_array_equal(got["a"], [3.0, 5.0])
        assert got[(0, 1)][0] is None
        np.testing.assert_array_equal(got[(0, 1)][1][2], [3.0, 5.0])
        np.testing.assert_array_equal(got[(0, 1)][1]["b"], [2.0, 4.0])
        got = sess.run(fetches, {x: [1.0, 2.0]})
    assert type(got) is collections.defaultdict and got.default_factory is list
    np.testing.assert_array_equal(got["ys"][1], [3.0, 5.0])
    assert got["ops"] == [None] and got["missing"] == []


@pytest.mark.parametrize("consumer", ["/gpu:0", "/gpu:1", "/cpu:0"])
def test_a_gpu_array_fed_to_a_tensor_of_another_dtype_is_converted_as_a_host_one(
        compiled, fake_gpus, consumer):
    # (a numpy array is converted to the tensor's dtype -- TF1 too -- and so is a GPU one)
    x = dcf.placeholder(dcf.float32, [2], name="x")
    i = dcf.placeholder(dcf.int32, [2], name="i")
    with dcf.device(consumer):
        y = x * 2.0
        j = i * 2
    with fake_gpus.cuda.Device(1):
        x64 = fake_gpus.asarray(np.array([1.0, 2.0]))
        frac = fake_gpus.asarray(np.array([1.5, 2.5]))
    with dcf.Session(config=compiled) as sess:
        fx, fy, fj = sess.run([x, y, j], {x: x64, i: frac})
    assert (fx.dtype, fy.dtype, fj.dtype) == (np.float32, np.float32, np.int32)
    np.testing.assert_array_equal(fy, [2.0, 4.0])
    np.testing.assert_array_equal(fj, [2, 4])
    assert x64.dtype == np.float64        # (the caller's array is left as it was)


def test_a_bad_feed_names_the_tensor_of_an_op_with_several_outputs():
    x = dcf.placeholder(dcf.float32, [4, 2], name="x")
    a, b = dcf.split(x, 2)
    with dcf.Session() as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError,
                           match=r"SplitV 'SplitV': fed a value of shape \[2\], expected "
                                 r"\[2, 2\] for SplitV:1"):
            sess.run(a, {b: [1.0, 2.0]})
        with pytest.raises(TypeError, match=r"SplitV 'SplitV': cannot feed list as float32 "
                                             r"to SplitV:1: could not convert"):
            sess.run(a, {b: [["u", "v"]]})
