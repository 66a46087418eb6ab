"""Review 5: random ops used as a TF1 user would (bounds as arrays, negative seeds,
the [minval, maxval) range)."""

import numpy as np
import pytest

import dcf


def _run(fetches, feed=None, compile_frames=True):
    with dcf.Session(config=dcf.SessionConfig(compile_frames=compile_frames)) as sess:
        return sess.run(fetches, feed_dict=feed)


def test_array_bounds_broadcast_against_the_samples_as_in_tf():
    with dcf.Graph().as_default():
        lo = np.array([[0.0], [100.0]])  # float64 array: a float32 constant, as in TF
        u = dcf.random_uniform([1000], minval=lo, maxval=lo + 1.0, seed=1)
        v = dcf.random_uniform([3], minval=[0.0, 10.0, 20.0], maxval=dcf.constant(21.0), seed=2)
        n = dcf.random_normal([2, 3], mean=dcf.constant([[0.0], [100.0]]), stddev=0.0, seed=3)
        out_u, out_v, out_n = _run([u, v, n])
    assert out_u.shape == (2, 1000) and out_u.dtype == np.float32
    assert 0.0 <= out_u[0].min() and out_u[0].max() < 1.0
    assert 100.0 <= out_u[1].min() and out_u[1].max() < 101.0
    assert np.all(out_v >= [0.0, 10.0, 20.0]) and np.all(out_v < 21.0)
    np.testing.assert_array_equal(out_n, [[0.0] * 3, [100.0] * 3])


def test_a_negative_seed_is_accepted_and_repeats_as_in_tf():
    with dcf.Graph().as_default():
        u = dcf.random_uniform([4], seed=-7)
        first = _run(u)
        again = _run(u)
    np.testing.assert_array_equal(first, again)
    assert np.all((first >= 0) & (first < 1))


@pytest.mark.parametrize("compile_frames", [True, False])
@pytest.mark.parametrize("dt", [dcf.float16, dcf.float32, dcf.float64])
def test_scaled_uniform_never_reaches_maxval(dt, compile_frames):
    # u * 1 + 1000 rounds to 1001 for u within 2**-15 of 1 in float32 (about 3 draws in
    # 10**5 without the clamp); float16 and float64 round the same way at 100 and 2**40
    lo, hi = {dcf.float16: (100.0, 101.0), dcf.float32: (1000.0, 1001.0),
              dcf.float64: (2.0**40, 2.0**40 + 1.0)}[dt]
    with dcf.Graph().as_default():
        u = dcf.random_uniform([200_000], minval=lo, maxval=hi, dtype=dt, seed=1)
        v = dcf.random_uniform([], minval=lo, maxval=hi, dtype=dt, seed=1)
        out, scalar = _run([u, v], compile_frames=compile_frames)
    assert out.min() >= lo and out.max() < hi and lo <= scalar < hi
    # the clamp keeps the distribution: the mean stays within 5 sigma of the midpoint
    assert abs(out.astype(np.float64).mean() - (lo + hi) / 2) < 5 * np.sqrt(1 / 12 / out.size)
