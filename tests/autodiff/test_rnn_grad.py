"""dynamic_rnn (a while_loop over TensorArrays) against static_rnn (the same cell
unrolled): equal outputs and equal gradients w.r.t. inputs, initial state and the
cell's variables, for LSTMCell and GRUCell, with sequence_length masking and
time_major; plus finite-difference checks of dynamic_rnn itself."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from tests.autodiff.gradcheck import check_grads

F64 = dcf.float64
B, T, D, U = 3, 5, 4, 6


def _cell(kind):
    return dcf.nn.LSTMCell(U) if kind == "lstm" else dcf.nn.GRUCell(U)


def _flat_state(s):
    return list(s) if isinstance(s, tuple) else [s]


@pytest.mark.parametrize("time_major", [False, True], ids=["batch_major", "time_major"])
@pytest.mark.parametrize("masked", [False, True], ids=["full", "seq_len"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_dynamic_rnn_grads_equal_static_rnn(compiled, rng, kind, masked, time_major):
    x_np = rng.uniform(-1, 1, (T, B, D) if time_major else (B, T, D))
    x = dcf.placeholder(F64, x_np.shape)
    seq_np = np.array([T, 2, 0]) if masked else None
    seq = dcf.placeholder(dcf.int32, (B,)) if masked else None
    cell = _cell(kind)
    dyn_out, dyn_state = dcf.nn.dynamic_rnn(cell, x, sequence_length=seq, dtype=F64,
                                            time_major=time_major)
    xs = dcf.unstack(x, axis=0 if time_major else 1)
    st_outs, st_state = dcf.nn.static_rnn(cell, xs, sequence_length=seq, dtype=F64)
    st_out = dcf.stack(st_outs, axis=0 if time_major else 1)
    w_out = rng.standard_normal(x_np.shape[:2] + (U,))

    def loss(out, state):
        return dcf.reduce_sum(out * w_out) + sum(dcf.reduce_sum(s * s) for s in
                                                 _flat_state(state))
    var_list = cell.variables
    assert len(var_list) == (2 if kind == "lstm" else 4)
    g_dyn = dcf.gradients(loss(dyn_out, dyn_state), [x] + var_list)
    g_st = dcf.gradients(loss(st_out, st_state), [x] + var_list)
    assert all(gr is not None for gr in g_dyn + g_st)
    feed = {x: x_np}
    if masked:
        feed[seq] = seq_np
    with dcf.Session(config=compiled) as sess:
        sess.run(dcf.global_variables_initializer())
        (do, so), gd, gs = sess.run([(dyn_out, st_out), g_dyn, g_st], feed)
    np.testing.assert_allclose(do, so, rtol=1e-12, atol=1e-14)
    for a, b in zip(gd, gs):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    if masked:  # past an example's length: zero outputs, zero input gradients
        tb = (lambda t, b: (t, b)) if time_major else (lambda t, b: (b, t))
        assert np.all(do[tb(slice(2, None), 1)] == 0.0)
        assert np.all(gd[0][tb(slice(None), 2)] == 0.0)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_dynamic_rnn_grad_finite_differences(compiled, rng, kind):
    def f(x, h0):
        cell = _cell(kind)
        init = dcf.nn.LSTMStateTuple(h0 * 0.5, h0) if kind == "lstm" else h0
        out, state = dcf.nn.dynamic_rnn(cell, x, initial_state=init,
                                        sequence_length=dcf.constant([3, 1], dcf.int32))
        return out[:, -1] + _flat_state(state)[-1] * 2.0 + out[:, 0]
    check_grads(f, [rng.uniform(-1, 1, (2, 3, 2)), rng.uniform(-1, 1, (2, U))],
                config=compiled)


def test_dynamic_rnn_training_step_matches_static_rnn_step(compiled, rng):
    """GradientDescent on the shared variables moves them identically."""
    x_np = rng.uniform(-1, 1, (B, T, D))
    x = dcf.placeholder(F64, x_np.shape)
    cell = dcf.nn.LSTMCell(U)
    out_d, _ = dcf.nn.dynamic_rnn(cell, x, dtype=F64)
    out_s, _ = dcf.nn.static_rnn(cell, dcf.unstack(x, axis=1), dtype=F64)
    loss_d = dcf.reduce_mean(dcf.square(out_d))
    loss_s = dcf.reduce_mean(dcf.square(dcf.stack(out_s, axis=1)))
    opt = dcf.train.GradientDescentOptimizer(0.5)
    step_d, step_s = opt.minimize(loss_d), opt.minimize(loss_s)
    with dcf.Session(config=compiled) as sess:
        sess.run(dcf.global_variables_initializer())
        init = sess.run(cell.variables)
        sess.run(step_d, {x: x_np})
        after_d = sess.run(cell.variables)
        for v, val in zip(cell.variables, init):
            sess.run(v.assign(val))
        sess.run(step_s, {x: x_np})
        after_s = sess.run(cell.variables)
    for a, b, c in zip(after_d, after_s, init):
        assert not np.allclose(a, c)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_dynamic_and_static_rnn_name_variables_alike_so_checkpoints_swap(compiled, rng,
                                                                         tmp_path, kind):
    """A model trained with dynamic_rnn restores into static_rnn (as in TF1): the cell's
    variables are built outside the while_loop, under the rnn scope, in both."""
    x_np = rng.uniform(-1, 1, (B, T, D))
    names, outs = {}, {}
    path = str(tmp_path / "ckpt")
    for rnn in ("dynamic", "static"):
        g = dcf.Graph()
        with g.as_default():
            x = dcf.placeholder(F64, x_np.shape)
            cell = _cell(kind)
            if rnn == "dynamic":
                out, _ = dcf.nn.dynamic_rnn(cell, x, dtype=F64)
            else:
                ys, _ = dcf.nn.static_rnn(cell, dcf.unstack(x, axis=1), dtype=F64)
                out = dcf.stack(ys, axis=1)
            assert all(v.handle.op.ctx is None for v in cell.variables)
            names[rnn] = [v.name for v in cell.variables]
            saver = dcf.train.Saver(cell.variables)
            with dcf.Session(graph=g, config=compiled) as sess:
                sess.run(dcf.global_variables_initializer())
                if rnn == "dynamic":
                    for v in cell.variables:   # move away from the deterministic init
                        sess.run(v.assign_add(dcf.ones_like(v.read_value()) * 0.1))
                    saver.save(sess, path)
                else:
                    saver.restore(sess, path)
                outs[rnn] = sess.run(out, {x: x_np})
    assert names["dynamic"] == names["static"]
    assert all(n.startswith("rnn/") and "while" not in n for n in names["dynamic"])
    np.testing.assert_allclose(outs["dynamic"], outs["static"], rtol=1e-12)
