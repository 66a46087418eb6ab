"""Random ops: shapes, dtypes, ranges, seeding through the device resources."""

from __future__ import annotations

import numpy as np
import pytest

from dcf import dtypes
from dcf.graph import Graph
from dcf.ops import random_ops as R
from dcf.ops.registry import GRADIENTS, OPS
from tests.ops.oracle import FakeResources, placeholder, run_op


def test_random_ops_are_stateful_resource_ops_without_gradients():
    for t in ("RandomUniform", "RandomNormal"):
        assert OPS[t].stateful and OPS[t].resource
        assert GRADIENTS[t] is None


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.float32, dtypes.float64])
def test_uniform_and_normal_have_the_requested_shape_dtype_and_range(dt):
    g = Graph()
    with g.as_default():
        u = R.random_uniform([200, 50], minval=-2, maxval=3, dtype=dt)
        n = R.random_normal([200, 50], mean=1.0, stddev=2.0, dtype=dt)
        s = R.random_uniform([], dtype=dt)
    assert u.shape == (200, 50) and u.dtype is dt and s.shape == ()
    vu, vn, vs = run_op([u, n, s])
    assert vu.min() >= -2 and vu.max() <= 3 and abs(float(vu.mean()) - 0.5) < 0.1
    assert abs(float(vn.mean()) - 1.0) < 0.1 and abs(float(vn.std()) - 2.0) < 0.1
    assert type(vs) is dt.np.type and 0 <= vs < 1


def test_integer_uniform():
    g = Graph()
    with g.as_default():
        t = R.random_uniform([1000], minval=3, maxval=7, dtype=dtypes.int32)
        with pytest.raises(ValueError, match=r"maxval is required"):
            R.random_uniform([2], dtype=dtypes.int64)
    v = run_op(t)
    assert v.dtype == np.int32 and set(np.unique(v)) == {3, 4, 5, 6}


def test_seeded_ops_repeat_in_a_new_session_and_advance_within_one():
    g = Graph()
    with g.as_default():
        t = R.random_normal([4], seed=42)
        u = R.random_uniform([4])
    res = FakeResources()
    first, second = run_op(t, res=res), run_op(t, res=res)
    assert not np.array_equal(first, second)  # the generator lives on across runs
    np.testing.assert_array_equal(run_op(t, res=FakeResources()), first)
    assert not np.array_equal(run_op(u, res=FakeResources()), run_op(u, res=FakeResources()))


def test_dynamic_shape_and_tensor_bounds():
    g = Graph()
    with g.as_default():
        n = placeholder(dtypes.int32, ())
        lo = placeholder(dtypes.float32, ())
        t = R.random_uniform([n, 3], minval=lo, maxval=lo + 1)
        m = R.random_normal(placeholder(dtypes.int32, (2,), name="shp"), mean=lo)
    assert t.shape == (None, 3) and m.shape == (None, None)
    v = run_op(t, {n: 5, lo: 10.0})
    assert v.shape == (5, 3) and v.min() >= 10 and v.max() <= 11
    shp = g.get_tensor_by_name("shp:0")
    assert run_op(m, {shp: [2, 6], lo: 0.0}).shape == (2, 6)
