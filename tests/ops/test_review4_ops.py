"""Ops edges found by a review by use (session 30): float16 uniform draws, empty index
tuples in gather_nd, the gradient of sign."""
import numpy as np
import pytest

import dcf


def test_float16_uniform_never_reaches_maxval():
    g = dcf.Graph()
    with g.as_default():
        u = dcf.random_uniform([400_000], dtype=dcf.float16, seed=3)
        w = dcf.random_uniform([200_000], minval=-1.0, maxval=2.0, dtype=dcf.float16, seed=4)
    with dcf.Session(g) as s:
        a, b = s.run([u, w])
    assert a.dtype == np.float16 and b.dtype == np.float16
    assert a.min() >= 0 and a.max() < 1  # TF's contract: [minval, maxval)
    assert b.min() >= -1 and b.max() < 2
    # still uniform: the mean of 400k draws is within a few standard errors of 1/2
    assert abs(float(a.astype(np.float64).mean()) - 0.5) < 5 * (1 / 12) ** 0.5 / 400_000 ** 0.5
    assert len(np.unique(a)) > 1000


def test_gather_nd_with_empty_index_tuples_selects_all_of_params_per_row():
    p = np.arange(12, dtype=np.float32).reshape(3, 4)
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (3, 4))
        t = dcf.gather_nd(x, np.zeros((2, 0), np.int32))
        (gx,) = dcf.gradients(dcf.reduce_sum(t * t), [x])
    with dcf.Session(g) as s:
        r, rg = s.run([t, gx], {x: p})
    assert t.shape == (2, 3, 4) and r.shape == (2, 3, 4)
    np.testing.assert_array_equal(r, np.broadcast_to(p, (2, 3, 4)))
    np.testing.assert_allclose(rg, 2 * 2 * p)  # both rows select all of x


def test_sign_gradient_is_zeros_not_none():
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float64, (3,))
        y = dcf.reduce_sum(dcf.sign(x) * x)
        (gx,) = dcf.gradients(y, [x])
    assert gx is not None
    with dcf.Session(g) as s:
        r = s.run(gx, {x: np.array([-2.0, 0.5, 3.0])})
    # d/dx (sign(x) * x) with sign's derivative 0 (TF's convention) is sign(x)
    np.testing.assert_array_equal(r, [-1.0, 1.0, 1.0])
    assert r.dtype == np.float64


def test_scatter_nd_with_empty_index_tuples_adds_every_update_to_all_of_the_output():
    u = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    g = dcf.Graph()
    with g.as_default():
        t = dcf.scatter_nd(np.zeros((2, 0), np.int64), u, [3, 4])
    with dcf.Session(g) as s:
        r = s.run(t)
    np.testing.assert_array_equal(r, u[0] + u[1])


def test_negative_dimensions_are_refused_at_build_time():
    g = dcf.Graph()
    with g.as_default():
        with pytest.raises(ValueError, match="Placeholder 'p'.*negative"):
            dcf.placeholder(dcf.float32, (-2, 3), name="p")
        assert dcf.placeholder(dcf.float32, (-1, 3)).shape == (None, 3)  # -1: unknown, as TF
        with pytest.raises(ValueError, match="Eye 'e'.*num_rows"):
            dcf.eye(-1, name="e")
        with pytest.raises(ValueError, match="num_columns"):
            dcf.eye(2, -3)
        with pytest.raises(ValueError, match="batch_shape"):
            dcf.eye(2, batch_shape=[-1])
        n = dcf.placeholder(dcf.int32, ())
        e = dcf.eye(n)
    with dcf.Session(g) as s:
        np.testing.assert_array_equal(s.run(e, {n: 3}), np.eye(3, dtype=np.float32))
