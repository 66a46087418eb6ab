"""LSTMGates on a stack of layers' batches ([layers, batch, 4u], as a wavefront LSTM
steps all its layers at once): each layer's rows give what the 2-D op gives on them, a
bias per layer ([layers, 1, 4u]) is broadcast over the batch, and the gradients
(first and second order) are those of the 2-D op on the flattened rows and match float64
central differences."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError
from dcf.nn import lstm_gates


def _np_gates(z, c, fb):
    u = c.shape[-1]
    sig = lambda x: 1 / (1 + np.exp(-x))   # noqa: E731
    i, j, f, o = (z[..., k * u:(k + 1) * u] for k in range(4))
    c_new = c * sig(f + fb) + sig(i) * np.tanh(j)
    return c_new, np.tanh(c_new) * sig(o)


def _values(L=3, B=4, u=5, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((L, B, 4 * u)), rng.standard_normal((L, B, u)),
            rng.standard_normal((L, 1, 4 * u)))


@pytest.mark.parametrize("bias", ["none", "row", "per layer", "full"])
def test_a_stack_of_layers_gives_each_layers_gates(bias):
    z, c, b = _values()
    bv = {"none": None, "row": b[0, 0], "per layer": b,
          "full": np.broadcast_to(b, z.shape).copy()}[bias]
    g = dcf.Graph()
    with g.as_default():
        out = lstm_gates(dcf.constant(z), dcf.constant(c), 0.5,
                         b=None if bv is None else dcf.constant(bv))
    with dcf.Session(g) as s:
        c_new, h_new = s.run(list(out))
    want = _np_gates(z if bv is None else z + bv, c, 0.5)
    assert c_new.shape == c.shape and h_new.shape == c.shape
    np.testing.assert_allclose(c_new, want[0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(h_new, want[1], rtol=1e-12, atol=1e-14)


def test_the_gradients_are_the_flat_ops_and_match_central_differences():
    z, c, b = _values(seed=1)
    L, B, u = c.shape
    wc, wh = (np.random.default_rng(2).standard_normal(c.shape) for _ in range(2))

    def build(stacked):
        g = dcf.Graph()
        with g.as_default():
            zt, ct, bt = dcf.constant(z), dcf.constant(c), dcf.constant(b)
            if stacked:
                c_new, h_new = lstm_gates(zt, ct, 1.0, b=bt)
            else:     # the flat op on [L * B] rows, the bias broadcast by hand
                zb = dcf.reshape(zt + bt, [L * B, 4 * u])
                c_new, h_new = lstm_gates(zb, dcf.reshape(ct, [L * B, u]), 1.0)
                c_new, h_new = dcf.reshape(c_new, c.shape), dcf.reshape(h_new, c.shape)
            loss = dcf.reduce_sum(c_new * wc + h_new * h_new * wh)
            grads = dcf.gradients(loss, [zt, ct, bt])
            second = dcf.gradients(dcf.reduce_sum(grads[0] * grads[0]), [zt])[0]
        with dcf.Session(g) as s:
            return s.run([loss] + grads + [second])

    got, flat = build(True), build(False)
    for a, w in zip(got, flat):
        np.testing.assert_allclose(a, w, rtol=1e-10, atol=1e-12)

    def loss_at(zv):
        c_new, h_new = _np_gates(zv + b, c, 1.0)
        return float(np.sum(c_new * wc + h_new * h_new * wh))
    eps, idx = 1e-6, [(0, 0, 0), (1, 3, 7), (2, 2, 19)]
    for k in idx:
        d = np.zeros_like(z)
        d[k] = eps
        fd = (loss_at(z + d) - loss_at(z - d)) / (2 * eps)
        assert abs(got[1][k] - fd) < 1e-7, (k, got[1][k], fd)


def test_leading_axes_that_differ_are_refused_at_build():
    g = dcf.Graph()
    with g.as_default():
        with pytest.raises(InvalidArgumentError, match="z must be c's shape"):
            lstm_gates(dcf.zeros([3, 4, 20], dcf.float64), dcf.zeros([2, 4, 5], dcf.float64))
        with pytest.raises(InvalidArgumentError, match="z must be c's shape"):
            lstm_gates(dcf.zeros([3, 4, 20], dcf.float64), dcf.zeros([12, 5], dcf.float64))
        with pytest.raises(InvalidArgumentError, match="addend b"):
            lstm_gates(dcf.zeros([3, 4, 20], dcf.float64), dcf.zeros([3, 4, 5], dcf.float64),
                       b=dcf.zeros([2, 1, 20], dcf.float64))


def _wf_graph(below, h, w, second=False):
    from dcf.nn import wavefront_inputs

    g = dcf.Graph()
    with g.as_default():
        bt, ht = dcf.constant(below), dcf.constant(h)
        for fused in (True, False):
            if fused:
                xh = wavefront_inputs(bt, ht)
            else:
                inp = dcf.expand_dims(bt, 0)
                if h.shape[0] > 1:
                    inp = dcf.concat([inp, ht[:h.shape[0] - 1]], 0)
                xh = dcf.concat([inp, ht], 2)
            loss = dcf.reduce_sum(xh * xh * w)
            grads = dcf.gradients(loss, [bt, ht])
            outs = [xh] + grads
            if second:
                outs += dcf.gradients(dcf.reduce_sum(grads[1] * grads[1] * w[..., :h.shape[2]]) +
                                      dcf.reduce_sum(grads[0] * grads[0]), [bt, ht])
            yield outs, g


@pytest.mark.parametrize("n", [1, 2, 4])
def test_wavefront_inputs_are_the_shifted_concatenation_and_so_are_its_gradients(n):
    rng = np.random.default_rng(n)
    B, u = 3, 5
    below, h = rng.standard_normal((B, u)), rng.standard_normal((n, B, u))
    w = rng.standard_normal((n, B, 2 * u))
    (fused, g), (plain, _) = list(_wf_graph(below, h, w, second=True))
    with dcf.Session(g) as s:
        got, want = s.run([fused, plain])
    xh = got[0]
    np.testing.assert_array_equal(xh[0, :, :u], below)
    np.testing.assert_array_equal(xh[1:, :, :u], h[:-1])
    np.testing.assert_array_equal(xh[:, :, u:], h)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_wavefront_inputs_refuse_a_below_of_another_shape():
    from dcf.nn import wavefront_inputs

    g = dcf.Graph()
    with g.as_default():
        with pytest.raises(InvalidArgumentError, match="WavefrontInputs"):
            wavefront_inputs(dcf.zeros([3, 4]), dcf.zeros([2, 3, 5]))
        with pytest.raises(InvalidArgumentError, match="WavefrontInputs"):
            wavefront_inputs(dcf.zeros([3, 5]), dcf.zeros([3, 5]))
