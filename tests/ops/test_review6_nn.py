"""Review 6, dcf.nn against TF1: the hoisted LSTM's weight gradients with an empty batch
(TF1 gives zeros); dense refuses integer inputs (TF1: a Dense layer needs a float
dtype) and names the layer; sequence_length must be a vector of batch_size lengths
(TF1 checks at construction); an LSTM state is LSTMStateTuple(c, h), not one
concatenated tensor; the inputs' gradient of a loop over no steps keeps the batch.
References are closed forms (zeros, shapes) and TF1's documented behaviour."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf import nn


def _run(fetches, feeds=None):
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        return sess.run(fetches, feeds)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_hoisted_rnn_gradients_with_an_empty_batch(kind):
    # TF1: outputs [0, T, U], state [0, U], every weight's gradient zeros of its shape
    t, d, u = 4, 2, 3
    with dcf.Graph().as_default():
        cell = nn.LSTMCell(u) if kind == "lstm" else nn.GRUCell(u)
        x = dcf.placeholder(dcf.float64, [None, None, d])
        out, final = nn.dynamic_rnn(cell, x, dtype=dcf.float64)
        loss = dcf.reduce_sum(out) + sum(dcf.reduce_sum(s) for s in dcf.nest.flatten(final))
        grads = dcf.gradients(loss, [x] + cell.variables)
        o, gs = _run([out, grads], {x: np.zeros((0, t, d))})
        assert o.shape == (0, t, u)
        assert gs[0].shape == (0, t, d)
        for g, v in zip(gs[1:], cell.variables):
            np.testing.assert_array_equal(g, np.zeros(v.shape))


def test_dense_refuses_integer_inputs_and_names_the_layer():
    # TF1: "A Dense layer can only be built with a floating-point dtype"; before, dcf
    # built an int32 kernel of Glorot values truncated to zeros and returned zeros
    with dcf.Graph().as_default():
        x = dcf.constant(np.arange(6, dtype=np.int32).reshape(2, 3))
        with pytest.raises(TypeError, match="dense 'logits'.*floating point.*int32"):
            nn.dense(x, 4, name="logits")
        p = dcf.placeholder(dcf.float32, [None, None])
        with pytest.raises(ValueError, match="dense 'hidden'.*last dimension"):
            nn.dense(p, 4, name="hidden")


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("seq", [[1, 2], [[1], [2], [3]]])
def test_sequence_length_must_be_a_vector_of_batch_lengths(static, seq):
    # TF1 raises at construction ("must be a vector of length batch_size" / "Dimension 0
    # in both shapes must be equal"); dcf failed at run time in a BroadcastTo in the loop
    x = np.zeros((3, 4, 2))
    with dcf.Graph().as_default():
        cell = nn.GRUCell(3)
        with pytest.raises(ValueError, match=r"sequence_length must be a vector of "
                                             r"batch_size \(3\)"):
            if static:
                nn.static_rnn(cell, [x[:, i] for i in range(4)], dtype=dcf.float64,
                              sequence_length=seq)
            else:
                nn.dynamic_rnn(cell, x, dtype=dcf.float64, sequence_length=seq)


@pytest.mark.parametrize("static", [False, True])
def test_lstm_state_must_be_a_c_h_pair_not_one_concatenated_tensor(static):
    x = np.zeros((3, 4, 2))
    with dcf.Graph().as_default():
        cell = nn.LSTMCell(5)
        with pytest.raises(TypeError, match=r"LSTMCell.*state_size LSTMStateTuple"):
            if static:
                nn.static_rnn(cell, [x[:, 0]], initial_state=np.zeros((3, 10)))
            else:
                nn.dynamic_rnn(cell, x, initial_state=np.zeros((3, 10)))
        # the pair, as a plain tuple, is accepted
        out, (c, h) = nn.dynamic_rnn(cell, x, initial_state=(np.zeros((3, 5)),) * 2)
        np.testing.assert_array_equal(_run(h), _run(out)[:, -1])


class _PerStepCell:
    """A cell without `_hoist`: dynamic_rnn unstacks its inputs into a TensorArray and
    runs it per step (as on GPUs)."""

    def __init__(self, cell):
        self.cell = cell

    def __call__(self, x, state):
        return self.cell(x, state)


def test_inputs_gradient_of_a_loop_over_no_steps_has_the_inputs_shape():
    # needs /tmp/review6/patches/nn-1.patch (dcf/autodiff/tensor_array_grad.py): the
    # gradient of TensorArray.unstack over 0 rows gathered nothing and returned
    # [0, 0, d] for inputs [0, batch, d] of unknown static batch
    with dcf.Graph().as_default():
        gru = nn.GRUCell(3)
        x = dcf.placeholder(dcf.float64, [None, None, 2])
        h0 = dcf.placeholder(dcf.float64, [None, 3])
        gru(x[:, 0], h0)   # built outside the loop
        out, final = nn.dynamic_rnn(_PerStepCell(gru), x, initial_state=h0)
        gx, gh = dcf.gradients(dcf.reduce_sum(out) + dcf.reduce_sum(final), [x, h0])
        vx, vh = _run([gx, gh], {x: np.zeros((4, 0, 2)), h0: np.zeros((4, 3))})
        np.testing.assert_array_equal(vx, np.zeros((4, 0, 2)))
        np.testing.assert_array_equal(vh, np.ones((4, 3)))
