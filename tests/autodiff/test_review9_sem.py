"""Gradients a TF1 user checks against TF1 (review 9, by use)."""

from __future__ import annotations

import numpy as np

import dcf


def _loops():
    x = dcf.placeholder(dcf.float32, [], name="x")
    t0 = dcf.placeholder(dcf.float32, [], name="t0")

    def body(t, a):
        return t + 0.5, dcf.cond(t > 1.0, lambda: a * x, lambda: a + x)

    def outer(t, a):
        _, a2 = dcf.while_loop(lambda u, b: u < t, lambda u, b: (u + 1.0, b * x), [0.0, a])
        return t + 1.0, a2

    plain = dcf.while_loop(lambda t, a: t < 3.0, lambda t, a: (t + 1.0, a * x),
                           [t0, dcf.constant(1.0)])
    in_cond = dcf.while_loop(lambda t, a: t * 2.0 < 6.0, body, [t0, dcf.constant(1.0)])
    nested = dcf.while_loop(lambda t, a: t < 3.0, outer, [t0, dcf.constant(1.0)])
    # s starts at x and grows by x, but only the predicate reads it
    s_only = dcf.while_loop(lambda s, a: s < 3.0, lambda s, a: (s + x, a * 2.0),
                            [x, dcf.constant(1.0)])
    return x, t0, plain, in_cond, nested, s_only


def test_a_float_loop_variable_only_the_predicate_reads_gets_no_gradient_as_in_tf1():
    # TF1 gives None for t0 in each (checked with tf.compat.v1, control flow v1); dcf
    # gave zeros, and for x through s (s = x + k x, read by the predicate only) zeros too
    g = dcf.Graph()
    with g.as_default():
        x, t0, plain, in_cond, nested, s_only = _loops()
        grads = [dcf.gradients(loop[1], [x, t0]) for loop in (plain, in_cond, nested)]
        (g_s,) = dcf.gradients(s_only[1], [x])
        # t read by the result as well: both get gradients, as in TF1
        g_both = dcf.gradients(plain[1] + plain[0], [x, t0])
    assert [gt0 for _, gt0 in grads] == [None, None, None] and g_s is None
    assert all(gx is not None for gx, _ in grads) and None not in g_both
    with dcf.Session(graph=g) as sess:
        vals = sess.run([gx for gx, _ in grads] + g_both, {x: 2.0, t0: 0.0})
    # closed forms (TF1 gives the same): x^3 -> 3x^2; in_cond: + x at t = 0, .5, 1 and
    # * x at t = 1.5, 2, 2.5 -> (1 + 3x) x^3, d = 3x^3 + 3x^2 (1 + 3x); nested: inner
    # trips 0, 1, 2 -> x^3
    assert vals == [12.0, 3 * 8 + 3 * 4 * 7, 12.0, 12.0, 1.0]
