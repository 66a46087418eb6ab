"""Semantics a TF1 user relies on where numpy's differ (review 9, by use): float floor
division, ..."""

from __future__ import annotations

import numpy as np
import pytest

import dcf


@pytest.mark.filterwarnings("ignore:.*encountered in divide:RuntimeWarning")
@pytest.mark.parametrize("dt", [np.float16, np.float32, np.float64])
def test_float_floordiv_is_the_floor_of_the_quotient_as_in_tf1(dt):
    # numpy's 1.0 // 0.1 floors the exact quotient of the two binary values (9.0), and
    # gives nan for inf // 2; TF1's FloorDiv is floor(x / y): 10.0 and inf
    vals = np.array([1.0, -1.0, 0.1, -0.1, 0.0, 7.5, -7.5, 3.0, np.inf, -np.inf, np.nan], dt)
    x, y = np.meshgrid(vals, vals, indexing="ij")
    with np.errstate(all="ignore"):
        want = np.floor(x / y)
    with dcf.Session() as sess:
        got, one, inf = sess.run([dcf.constant(x) // dcf.constant(y),
                                  dcf.floordiv(dt(1.0), dt(0.1)),
                                  dcf.floordiv(dt(np.inf), dt(2.0))])
    np.testing.assert_array_equal(got, want)
    assert got.dtype == dt and np.array_equal(np.signbit(got), np.signbit(want))
    assert one == 10.0 and inf == np.inf


def test_int_floordiv_and_mod_round_toward_minus_infinity_as_in_tf1():
    x = np.array([-7, -7, 7, 7, 0, -8], np.int32)
    y = np.array([2, -2, 2, -2, 3, 3], np.int32)
    with dcf.Session() as sess:
        q, r = sess.run([dcf.constant(x) // y, dcf.constant(x) % y])
    np.testing.assert_array_equal(q, [-4, 3, 3, -4, 0, -3])
    np.testing.assert_array_equal(r, [1, -1, 1, -1, 0, 1])


def test_the_gradient_of_mod_uses_tf1s_floor_of_the_quotient():
    # TF1: d(x % y)/dy = -floor(x / y): -10 at (1.0, 0.1), where numpy's quotient gives -9
    x = dcf.constant([1.0, -1.0, 7.5, 5.0])
    y = dcf.constant([0.1, -0.1, 0.1, -3.0])
    gx, gy = dcf.gradients(dcf.mod(x, y), [x, y], grad_ys=dcf.constant([1.0, 2.0, 3.0, 4.0]))
    with dcf.Session() as sess:
        gx, gy = sess.run([gx, gy])
    np.testing.assert_array_equal(gx, [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(gy, [-10.0, -20.0, -225.0, 8.0])
