"""Review 34, dcf.nn as a TF1 port meets it: a sequence_length whose length is only
known when it runs must still be one length per example (TF1's dynamic_rnn asserts
its shape is [batch_size]); a one-element vector was broadcast to every example. An
initial state of another batch, width or dtype than the inputs' is named at
construction; cells refuse integer inputs (TF1 does) before making variables;
static_rnn steps and dense inputs of the wrong rank are named at construction; a
user's cell may take integer ids (the outputs get the state's dtype) and return a
tuple of outputs (TF1's output_size structure); a cell built in one graph says so in
another; a GRUCell checks its state's structure. References are a numpy GRU and
TF1's documented behaviour."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf import nn
from tests.gru_reference import gru_reference


def _gru_rnn(static, x, seq):
    cell = nn.GRUCell(2)
    if static:
        outs, final = nn.static_rnn(cell, dcf.unstack(dcf.transpose(x, [1, 0, 2])),
                                    sequence_length=seq, dtype=dcf.float64)
        return cell, dcf.transpose(dcf.stack(outs), [1, 0, 2]), final
    out, final = nn.dynamic_rnn(cell, x, sequence_length=seq, dtype=dcf.float64)
    return cell, out, final


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("batch_known", [False, True])
def test_fed_sequence_length_must_have_one_length_per_example(static, batch_known):
    xv = np.random.default_rng(3).standard_normal((4, 5, 3))
    with dcf.Graph().as_default():
        x = dcf.placeholder(dcf.float64, (4 if batch_known else None, 5, 3))
        seq = dcf.placeholder(dcf.int32, (None,))
        cell, out, final = _gru_rnn(static, x, seq)
        with dcf.Session() as sess:
            sess.run(dcf.global_variables_initializer())
            w = sess.run(cell.variables)
            o, f = sess.run([out, final], {x: xv, seq: [5, 0, 2, 3]})
            for bad in ([2], [1, 2, 3], [1, 2, 3, 4, 5]):
                with pytest.raises(dcf.errors.InvalidArgumentError,
                                   match=r"'rnn/sequence_length'"):
                    sess.run(out, {x: xv, seq: bad})
    ro, rf = gru_reference(w, xv.transpose(1, 0, 2), [5, 0, 2, 3])
    np.testing.assert_allclose(o, ro.transpose(1, 0, 2), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(f, rf, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("static", [False, True])
def test_one_static_length_is_not_broadcast_over_an_unknown_batch(static):
    xv = np.random.default_rng(4).standard_normal((3, 4, 3))
    with dcf.Graph().as_default():
        x = dcf.placeholder(dcf.float64, (None, 4, 3))
        _, out, _ = _gru_rnn(static, x, np.array([2], np.int32))
        with dcf.Session() as sess:
            sess.run(dcf.global_variables_initializer())
            with pytest.raises(dcf.errors.InvalidArgumentError,
                               match=r"'rnn/sequence_length'"):
                sess.run(out, {x: xv})


def _state(kind, batch, units, dtype=np.float64):
    z = np.zeros((batch, units), dtype)
    return nn.LSTMStateTuple(z, z) if kind == "lstm" else z


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bad", ["batch", "units", "dtype", "zero_state_dtype"])
def test_initial_state_of_another_batch_width_or_dtype_is_named_at_construction(
        static, kind, bad):
    # TF1 fails at the cell's concat; dcf failed inside the loop at LSTMGates or
    # RNNMatMul, ops the user never made. Now: a ValueError naming the state
    x = np.zeros((4, 5, 3))
    kw = {"dtype": dcf.float32} if bad == "zero_state_dtype" else {"initial_state": _state(
        kind, 3 if bad == "batch" else 4, 3 if bad == "units" else 2,
        np.float32 if bad == "dtype" else np.float64)}
    with dcf.Graph().as_default():
        cell = nn.LSTMCell(2) if kind == "lstm" else nn.GRUCell(2)
        with pytest.raises(ValueError, match=r"(static|dynamic)_rnn: .* must be "
                                             r"\[batch_size, 2\] tensors of the inputs' "
                                             r"dtype float64 \(batch_size 4"):
            if static:
                nn.static_rnn(cell, [x[:, t] for t in range(5)], **kw)
            else:
                nn.dynamic_rnn(cell, x, **kw)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_initial_state_of_unknown_batch_is_accepted(kind):
    with dcf.Graph().as_default():
        c = dcf.placeholder(dcf.float64, (None, 2))
        cell = nn.LSTMCell(2) if kind == "lstm" else nn.GRUCell(2)
        state = nn.LSTMStateTuple(c, c) if kind == "lstm" else c
        out, _ = nn.dynamic_rnn(cell, np.ones((4, 5, 3)), initial_state=state)
        with dcf.Session() as sess:
            sess.run(dcf.global_variables_initializer())
            assert sess.run(out, {c: np.zeros((4, 2))}).shape == (4, 5, 2)


@pytest.mark.parametrize("how", ["call", "dynamic", "static"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_cells_refuse_integer_inputs_before_making_variables(how, kind):
    # TF1: "RNN cell only supports floating point inputs"; dcf built an int32 kernel
    # (the Glorot values truncated to zeros) and failed later at Sigmoid or RNNMatMul
    x = np.ones((4, 5, 3), np.int32)
    name = "LSTMCell" if kind == "lstm" else "GRUCell"
    with dcf.Graph().as_default():
        cell = nn.LSTMCell(2) if kind == "lstm" else nn.GRUCell(2)
        with pytest.raises(TypeError, match=name + r".*inputs must be floating point, "
                                                  r"got int32"):
            if how == "call":
                cell(x[:, 0], _state(kind, 4, 2, np.int32))
            elif how == "static":
                nn.static_rnn(cell, [x[:, t] for t in range(5)], dtype=dcf.float32)
            else:
                nn.dynamic_rnn(cell, x, dtype=dcf.float32)
        assert cell.variables == [] and dcf.global_variables() == []


def test_static_rnn_steps_must_be_matrices():
    x = np.zeros((4, 5, 3))
    with dcf.Graph().as_default():
        with pytest.raises(ValueError, match=r"static_rnn: inputs must be a list of "
                                             r"\[batch, depth\] tensors .* float64\[4,5,3\] "
                                             r".* at step 0"):
            nn.static_rnn(nn.GRUCell(2), [x], dtype=dcf.float64)
        with pytest.raises(ValueError, match=r"float64\[4\] .* at step 1"):
            nn.static_rnn(nn.GRUCell(2), [x[:, 0], x[:, 1, 0]], dtype=dcf.float64)


def test_dense_needs_a_rank_two_input_and_names_the_layer():
    with dcf.Graph().as_default():
        with pytest.raises(ValueError, match=r"dense 'head': the input must have rank >= 2 "
                                             r".*float64\[3\]"):
            nn.dense(np.zeros(3), 2, name="head")
        # rank 3 works on the last axis, as TF1's
        xv = np.arange(24.0).reshape(2, 3, 4)
        y = nn.dense(xv, 5, name="head")
        with dcf.Session() as sess:
            sess.run(dcf.global_variables_initializer())
            k, b, out = sess.run([dcf.global_variables()[0], dcf.global_variables()[1], y])
    np.testing.assert_allclose(out, xv @ k + b, rtol=1e-12)


class _EmbeddingCell:
    """A user's cell (as TF1's RNNCell subclasses): int32 token ids [batch, 1] in, a
    float64 state and output; TF1 gives the outputs the state's dtype."""

    state_size = 3
    output_size = 3

    def __init__(self, table):
        self.table = dcf.constant(table)

    def zero_state(self, batch, dtype):
        return dcf.zeros((batch, 3), dtype)

    def __call__(self, ids, h):
        h = dcf.tanh(dcf.gather(self.table, ids[:, 0]) + h)
        return h, h


class _TwoOutputCell:
    """output_size (2, 2): TF1's dynamic_rnn returns a pair of [batch, time, 2] outputs."""

    state_size = 2
    output_size = (2, 2)

    def zero_state(self, batch, dtype):
        return dcf.zeros((batch, 2), dtype)

    def __call__(self, x, h):
        h = dcf.tanh(x + h)
        return (h, 2.0 * h), h


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("seq", [None, [3, 1]])
def test_user_cells_with_integer_inputs_or_a_tuple_of_outputs(static, seq):
    table = np.arange(30.0).reshape(10, 3) / 30
    ids = np.array([[[1], [2], [3]], [[4], [5], [6]]], np.int32)
    xv = np.random.default_rng(5).standard_normal((2, 3, 2))
    keep = np.ones((2, 3, 1)) if seq is None else \
        (np.arange(3) < np.array(seq)[:, None])[..., None]

    def ref(step, xs, units):
        h, outs = np.zeros((2, units)), []
        for t in range(3):
            hn = step(xs[:, t], h)
            h = np.where(keep[:, t], hn, h)
            outs.append(hn * keep[:, t])
        return np.stack(outs, 1), h
    want_e, want_eh = ref(lambda i, h: np.tanh(table[i[:, 0]] + h), ids, 3)
    want_t, want_th = ref(lambda x, h: np.tanh(x + h), xv, 2)
    with dcf.Graph().as_default():
        def rnn(cell, x, **kw):
            if not static:
                return nn.dynamic_rnn(cell, x, sequence_length=seq, **kw)
            outs, final = nn.static_rnn(cell, [x[:, t] for t in range(3)],
                                        sequence_length=seq, **kw)
            return dcf.nest.map_structure(lambda *o: dcf.stack(o, 1), *outs), final
        emb = rnn(_EmbeddingCell(table), ids, dtype=dcf.float64)
        two = rnn(_TwoOutputCell(), xv)
        with dcf.Session() as sess:
            (e, eh), ((t1, t2), th) = sess.run([emb, two])
    np.testing.assert_allclose(e, want_e, rtol=1e-12)
    np.testing.assert_allclose(eh, want_eh, rtol=1e-12)
    np.testing.assert_allclose(t1, want_t, rtol=1e-12)
    np.testing.assert_allclose(t2, 2 * want_t, rtol=1e-12)
    np.testing.assert_allclose(th, want_th, rtol=1e-12)


@pytest.mark.parametrize("how", ["call", "dynamic", "static"])
def test_a_cell_built_in_one_graph_says_so_in_another(how):
    cell = nn.GRUCell(2, name="enc")
    x = np.zeros((1, 2, 3))
    with dcf.Graph().as_default():
        nn.dynamic_rnn(cell, x)
    with dcf.Graph().as_default():
        with pytest.raises(ValueError, match=r"GRUCell 'enc': its variables are in another "
                                             r"graph"):
            if how == "call":
                cell(x[:, 0], np.zeros((1, 2)))
            elif how == "static":
                nn.static_rnn(cell, [x[:, 0]], dtype=dcf.float64)
            else:
                nn.dynamic_rnn(cell, x)


def test_gru_cell_called_with_an_lstm_state_names_the_cell():
    # as LSTMCell's call (and dynamic_rnn) already did; it failed at the cell's ConcatV2
    with dcf.Graph().as_default():
        with pytest.raises(TypeError, match=r"GRUCell: the state must be shaped like "
                                            r"state_size 2"):
            nn.GRUCell(2)(np.ones((2, 4)), _state("lstm", 2, 2))
