"""Gradients through conds whose branches read Variables."""

from __future__ import annotations

import numpy as np
import pytest

import dcf


@pytest.mark.parametrize("take", [True, False])
def test_gradient_of_variable_read_inside_a_cond_branch(take):
    w = dcf.Variable(np.float64(1.0), name="w")
    p = dcf.placeholder(dcf.bool, ())
    y = dcf.cond(p, lambda: dcf.square(w - 3.0), lambda: dcf.constant(0.0, dcf.float64))
    (gw,) = dcf.gradients(y, [w])
    assert gw is not None
    with dcf.Session() as s:
        s.run(dcf.global_variables_initializer())
        assert s.run(gw, {p: take}) == (2 * (1.0 - 3.0) if take else 0.0)


def test_cond_reading_a_variable_differentiates_other_inputs():
    v = dcf.Variable(np.float64(2.0), name="v")
    x = dcf.placeholder(dcf.float64, ())
    p = dcf.placeholder(dcf.bool, ())
    y = dcf.cond(p, lambda: v * x, lambda: dcf.constant(0.0, dcf.float64))
    (gx,) = dcf.gradients(y, [x])
    with dcf.Session() as s:
        s.run(dcf.global_variables_initializer())
        assert s.run(gx, {p: True, x: 5.0}) == 2.0
        assert s.run(gx, {p: False, x: 5.0}) == 0.0


@pytest.mark.parametrize("xv", [1.5, -0.7])
def test_second_order_through_cond_matches_finite_differences(xv):
    x = dcf.placeholder(dcf.float64, ())
    c = dcf.cond(x > 0, lambda: x * x * dcf.sin(x), lambda: x * x * x)
    (g1,) = dcf.gradients(c, [x])
    (g2,) = dcf.gradients(g1, [x])
    with dcf.Session() as s:
        eps = 1e-5
        fd = (s.run(g1, {x: xv + eps}) - s.run(g1, {x: xv - eps})) / (2 * eps)
        np.testing.assert_allclose(s.run(g2, {x: xv}), fd, rtol=1e-6, atol=1e-8)
