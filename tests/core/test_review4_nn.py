"""Review 4, nn and optimizers: a learning-rate tensor of another dtype than the
variables is cast (as TF's optimizers do); an int64 sequence_length is cast (as TF's
dynamic_rnn does); a built cell called with inputs of another depth says so at graph
construction. References are numpy / closed form."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from tests.gru_reference import gru_reference


@pytest.mark.parametrize("opt", ["gd", "adam"])
def test_float32_learning_rate_tensor_with_float64_variables(opt):
    w0 = np.array([1.0, -2.0, 0.5])
    g = dcf.Graph()
    with g.as_default():
        lr = dcf.placeholder(dcf.float32, ())
        w = dcf.Variable(w0)
        o = dcf.train.GradientDescentOptimizer(lr) if opt == "gd" else \
            dcf.train.AdamOptimizer(lr)
        step = o.minimize(dcf.reduce_sum(w * w))
        with dcf.Session() as s:
            s.run(dcf.global_variables_initializer())
            for _ in range(2):
                s.run(step, {lr: 0.25})
            got = s.run(w)
    want = w0.copy()
    m = v = 0.0
    lr32 = float(np.float32(0.25))
    for t in (1, 2):
        grad = 2 * want
        if opt == "gd":
            want = want - lr32 * grad
        else:
            m = 0.9 * m + 0.1 * grad
            v = 0.999 * v + 0.001 * grad * grad
            want = want - lr32 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / \
                (np.sqrt(v) + 1e-8)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("static", [False, True])
def test_int64_sequence_length(static):
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((3, 4, 2))
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float64, (3, 4, 2))
        sl = dcf.placeholder(dcf.int64, (3,))
        cell = dcf.nn.GRUCell(5)
        if static:
            outs, final = dcf.nn.static_rnn(cell, dcf.unstack(dcf.transpose(x, [1, 0, 2])),
                                            sequence_length=sl, dtype=dcf.float64)
            out = dcf.transpose(dcf.stack(outs), [1, 0, 2])
        else:
            out, final = dcf.nn.dynamic_rnn(cell, x, sequence_length=sl, dtype=dcf.float64)
        with dcf.Session() as s:
            s.run(dcf.global_variables_initializer())
            w = s.run(cell.variables)
            o, f = s.run([out, final], {x: xv, sl: np.array([4, 0, 2], np.int64)})
    ro, rf = gru_reference(w, xv.transpose(1, 0, 2), [4, 0, 2])
    np.testing.assert_allclose(o, ro.transpose(1, 0, 2), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(f, rf, rtol=1e-10, atol=1e-12)
    assert not o[1].any() and not o[2, 2:].any()


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_shared_cell_with_other_input_depth_raises_at_construction(kind):
    g = dcf.Graph()
    with g.as_default():
        cell = dcf.nn.LSTMCell(3) if kind == "lstm" else dcf.nn.GRUCell(3)
        dcf.nn.dynamic_rnn(cell, dcf.zeros((2, 4, 2)), dtype=dcf.float32)
        with pytest.raises(ValueError, match="depth 2.*depth 5"):
            dcf.nn.dynamic_rnn(cell, dcf.zeros((2, 4, 5)), dtype=dcf.float32)
        with pytest.raises(ValueError, match="depth 2.*depth 5"):
            dcf.nn.static_rnn(cell, [dcf.zeros((2, 5))], dtype=dcf.float32)


def test_adam_two_minimize_ops_share_the_beta_powers():
    # TF1: one beta1_power/beta2_power per optimizer and graph, shared by every
    # minimize() op, as the m/v slots are: alternating two ops is one Adam sequence.
    g = dcf.Graph()
    with g.as_default():
        w = dcf.Variable(np.array([1.0, -2.0]))
        opt = dcf.train.AdamOptimizer(0.1)
        a = opt.minimize(dcf.reduce_sum(w * w))
        b = opt.minimize(dcf.reduce_sum(3.0 * w))
        with dcf.Session() as s:
            s.run(dcf.global_variables_initializer())
            for op in (a, b, a):
                s.run(op)
            got = s.run(w)
    want = np.array([1.0, -2.0])
    m = v = 0.0
    for t, kind in enumerate("aba", 1):
        grad = 2 * want if kind == "a" else np.full(2, 3.0)
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad * grad
        want = want - 0.1 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-8)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_adam_powers_shared_by_minimize_ops_over_variables_of_two_dtypes():
    g = dcf.Graph()
    with g.as_default():
        a = dcf.Variable(np.array([1.0, -2.0], np.float32))
        b = dcf.Variable(np.array([0.5], np.float64))
        opt = dcf.train.AdamOptimizer(0.1)
        s1 = opt.minimize(dcf.reduce_sum(a * a))
        s2 = opt.minimize(dcf.reduce_sum(b * b))   # powers made for float32 variables
        init = dcf.global_variables_initializer()
    with dcf.Session(g) as s:
        s.run(init)
        s.run(s1)
        s.run(s2)
        ra, rb = s.run([a, b])
    # step 1 (t = 1) moves each element of a by lr * sign(grad); step 2 is t = 2 for b
    np.testing.assert_allclose(ra, [0.9, -1.9], rtol=1e-6)
    b1, b2, grad = 0.9, 0.999, 1.0
    lr_t = 0.1 * np.sqrt(1 - b2 ** 2) / (1 - b1 ** 2)
    m, v = (1 - b1) * grad, (1 - b2) * grad ** 2
    # (lr_t is computed in the powers' float32, then cast: float32 rounding)
    np.testing.assert_allclose(rb, [0.5 - lr_t * m / (np.sqrt(v) + 1e-8)], rtol=1e-5)
