"""dynamic_rnn's hoisted input projection and the LSTM kernels it uses.

For LSTMCell and GRUCell, dynamic_rnn computes `[x, 1] @ [W_x; b]` for all steps before
the while_loop and the loop does only `h @ W_h` (RNNMatMul) plus the fused gates with
the step's projection as addend. These tests check the values against an independent
float64 numpy implementation of the cells, the gradients against float64 central
finite differences of that numpy implementation, and the hoisted graph against the
unhoisted one (the cell called on every step, as static_rnn does).
"""

from __future__ import annotations

import numpy as np
import pytest

import dcf
import dcf.nn as dnn
from dcf.ops import rnn_ops
from tests.autodiff.gradcheck import OPTS, check_grads

F64 = dcf.float64
B, T, D, U = 3, 5, 4, 6


# ---------------------------------------------------------------- numpy reference
def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_lstm(x_tbd, kernel, bias, forget_bias, c0, h0):
    """TF1 BasicLSTMCell semantics, float64, time-major input."""
    c, h, outs = c0, h0, []
    for x in x_tbd:
        z = np.concatenate([x, h], 1) @ kernel + bias
        i, j, f, o = np.split(z, 4, axis=1)
        c = c * _sig(f + forget_bias) + _sig(i) * np.tanh(j)
        h = np.tanh(c) * _sig(o)
        outs.append(h)
    return np.stack(outs), (c, h)


def np_gru(x_tbd, gk, gb, ck, cb, h0):
    h, outs = h0, []
    for x in x_tbd:
        r, u = np.split(_sig(np.concatenate([x, h], 1) @ gk + gb), 2, axis=1)
        c = np.tanh(np.concatenate([x, r * h], 1) @ ck + cb)
        h = u * h + (1 - u) * c
        outs.append(h)
    return np.stack(outs), h


def np_forward(kind, x_tbd, params, state0):
    if kind == "lstm":
        return np_lstm(x_tbd, params[0], params[1], 1.0, *state0)
    return np_gru(x_tbd, *params, state0[0])


def _loss_np(kind, x_tbd, params, state0, w_out):
    out, state = np_forward(kind, x_tbd, params, state0)
    last = state[0] if kind == "lstm" else state
    return float(np.sum(out * w_out) + np.sum(last * last))


def _build(kind, x, state0, hoist, time_major, cell=None, monkeypatch=None):
    cell = cell or (dnn.LSTMCell(U) if kind == "lstm" else dnn.GRUCell(U))
    init = dnn.LSTMStateTuple(*state0) if kind == "lstm" else state0[0]
    if not hoist:
        monkeypatch.setattr(dnn, "_hoisted_rnn", lambda *a: None)
    out, state = dnn.dynamic_rnn(cell, x, initial_state=init, time_major=time_major)
    if not hoist:
        monkeypatch.undo()
    return cell, out, state


# ---------------------------------------------------------------- dynamic_rnn
@pytest.mark.parametrize("time_major", [False, True], ids=["batch_major", "time_major"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_hoisted_dynamic_rnn_matches_numpy_unhoisted_and_finite_differences(
        compiled, rng, monkeypatch, kind, time_major):
    x_tbd = rng.uniform(-1, 1, (T, B, D))
    x_np = x_tbd if time_major else x_tbd.transpose(1, 0, 2)
    s0_np = [rng.uniform(-1, 1, (B, U)) for _ in range(2 if kind == "lstm" else 1)]
    w_out = rng.standard_normal((T, B, U))
    x = dcf.placeholder(F64, x_np.shape)
    s0 = [dcf.placeholder(F64, (B, U)) for _ in s0_np]
    cell, out_h, st_h = _build(kind, x, s0, True, time_major)
    _, out_u, st_u = _build(kind, x, s0, False, time_major, cell=cell, monkeypatch=monkeypatch)
    ops = dcf.get_default_graph().get_operations()
    assert any(op.type == "RNNMatMul" for op in ops)          # the hoisted step was built

    def loss(out, state):
        out_tbd = out if time_major else dcf.transpose(out, [1, 0, 2])
        last = state[0] if kind == "lstm" else state
        return dcf.reduce_sum(out_tbd * w_out) + dcf.reduce_sum(last * last)
    xs = [x] + s0 + cell.variables
    g_h = dcf.gradients(loss(out_h, st_h), xs)
    g_u = dcf.gradients(loss(out_u, st_u), xs)
    feed = {x: x_np, **dict(zip(s0, s0_np))}
    with dcf.Session(config=compiled) as sess:
        sess.run(dcf.global_variables_initializer())
        params = sess.run(cell.variables)
        oh, ou, gh, gu = sess.run([out_h, out_u, g_h, g_u], feed, options=OPTS)
    ref, _ = np_forward(kind, x_tbd, params, s0_np)
    ref = ref if time_major else ref.transpose(1, 0, 2)
    np.testing.assert_allclose(oh, ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(ou, ref, rtol=1e-12, atol=1e-13)
    for a, b in zip(gh, gu):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    # <grad, v> against float64 central differences of the numpy model, per argument
    eps = 1e-6
    args = [x_tbd] + s0_np + list(params)
    for k, gk in enumerate(gh):
        v = rng.standard_normal(args[k].shape)

        def f(sign):
            a = list(args)
            a[k] = args[k] + sign * eps * v
            return _loss_np(kind, a[0], a[1 + len(s0_np):], a[1:1 + len(s0_np)], w_out)
        numeric = (f(1) - f(-1)) / (2 * eps)
        gk_tbd = gk if (k != 0 or time_major) else gk.transpose(1, 0, 2)
        assert np.isclose(np.sum(gk_tbd * v), numeric, rtol=1e-6, atol=1e-9), (k, numeric)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_hoisted_dynamic_rnn_with_unknown_batch_and_time(compiled, rng, kind):
    x_np = rng.uniform(-1, 1, (B, T, D))
    x = dcf.placeholder(F64, (None, None, D))
    cell = dnn.LSTMCell(U) if kind == "lstm" else dnn.GRUCell(U)
    out, _ = dnn.dynamic_rnn(cell, x, dtype=F64)
    (gk,) = dcf.gradients(dcf.reduce_sum(out * out), cell.variables[:1])
    with dcf.Session(config=compiled) as sess:
        sess.run(dcf.global_variables_initializer())
        params = sess.run(cell.variables)
        o, g = sess.run([out, gk], {x: x_np}, options=OPTS)
    zeros = [np.zeros((B, U))] * (2 if kind == "lstm" else 1)
    ref, _ = np_forward(kind, x_np.transpose(1, 0, 2), params, zeros)
    np.testing.assert_allclose(o, ref.transpose(1, 0, 2), rtol=1e-12, atol=1e-13)
    eps, v = 1e-6, rng.standard_normal(params[0].shape)

    def f(sign):
        p = [params[0] + sign * eps * v] + list(params[1:])
        out_np, _ = np_forward(kind, x_np.transpose(1, 0, 2), p, zeros)
        return float(np.sum(out_np * out_np))
    assert np.isclose(np.sum(g * v), (f(1) - f(-1)) / (2 * eps), rtol=1e-6, atol=1e-9)


def test_hoisted_gradient_of_inputs_runs_only_when_asked(monkeypatch, rng):
    """d(inputs) is one [T*B, D+1] GEMM after the backward loop, run only when fetched;
    inside the loops there is no GEMM over the input columns, and no per-step weight
    gradient."""
    import dataclasses

    from dcf.ops.registry import OPS

    shapes: list = []
    plain = OPS["MatMul"].kernel

    def counting(xp, a, b, **kw):
        out = plain(xp, a, b, **kw)
        shapes.append(out.shape)
        return out
    monkeypatch.setitem(OPS, "MatMul", dataclasses.replace(OPS["MatMul"], kernel=counting))
    x_np = rng.uniform(-1, 1, (B, T, D)).astype(np.float32)
    x = dcf.placeholder(dcf.float32, (B, T, D))
    cell = dnn.LSTMCell(U)
    out, _ = dnn.dynamic_rnn(cell, x, dtype=dcf.float32)
    grads = dcf.gradients(dcf.reduce_sum(out), [x] + cell.variables)
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        shapes.clear()
        sess.run(grads[1:], {x: x_np})
        without = list(shapes)
        shapes.clear()
        sess.run(grads, {x: x_np})
        with_x = list(shapes)
    # per backward step only dh = dz @ W_h^T: the projection and the gradients of W_x,
    # the bias and the tied W_h are the GEMMs of TensorArrayProjectUnstack and
    # TensorArrayProjectGrad, once per run
    assert without == [(B, U)] * T
    assert (T * B, D + 1) not in without
    assert with_x.count((T * B, D + 1)) == 1


def test_hoisted_lstm_keeps_the_variables_and_matches_static_rnn(rng):
    """Same kernel/bias variables (names, shapes) as static_rnn, and the same values."""
    x_np = rng.uniform(-1, 1, (B, T, D)).astype(np.float32)
    x = dcf.placeholder(dcf.float32, x_np.shape)
    cell = dnn.LSTMCell(U, forget_bias=0.5)
    out_d, _ = dnn.dynamic_rnn(cell, x, dtype=dcf.float32)
    out_s, _ = dnn.static_rnn(cell, dcf.unstack(x, axis=1), dtype=dcf.float32)
    assert [v.name for v in cell.variables] == ["rnn/lstm_cell/kernel", "rnn/lstm_cell/bias"]
    assert [tuple(v.shape) for v in cell.variables] == [(D + U, 4 * U), (4 * U,)]
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        sess.run(cell.bias.assign(rng.uniform(-1, 1, 4 * U).astype(np.float32)))
        kernel, bias = sess.run(cell.variables)
        d, s = sess.run([out_d, dcf.stack(out_s, axis=1)], {x: x_np})
    ref, _ = np_lstm(x_np.transpose(1, 0, 2).astype(np.float64), kernel, bias, 0.5,
                     np.zeros((B, U)), np.zeros((B, U)))
    np.testing.assert_allclose(d, ref.transpose(1, 0, 2), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(s, ref.transpose(1, 0, 2), rtol=2e-5, atol=2e-6)


# ---------------------------------------------------------------- the kernels
class _Generic:
    """numpy behind another name: the kernels take their xp-generic (cupy) path."""

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("addend", [None, "row", "full"])
@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
def test_lstm_gates_kernels_match_numpy_reference(rng, dtype, addend, forget_bias):
    z = rng.standard_normal((7, 4 * 5)).astype(dtype)
    c = rng.standard_normal((7, 5)).astype(dtype)
    b = None if addend is None else rng.standard_normal(
        (4 * 5,) if addend == "row" else (7, 4 * 5)).astype(dtype)
    zz = (z if b is None else z + b).astype(np.float64)
    i, j, f, o = np.split(zz, 4, axis=1)
    c_ref = c * _sig(f + forget_bias) + _sig(i) * np.tanh(j)
    h_ref = np.tanh(c_ref) * _sig(o)
    tol = 1e-6 if dtype == np.float32 else 1e-14
    fast = rnn_ops._gates(np, z, c, b, forget_bias=forget_bias)
    generic = rnn_ops._gates(_Generic(), z, c, b, forget_bias=forget_bias)
    for got in (fast, generic):
        np.testing.assert_allclose(got[0], c_ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(got[1], h_ref, rtol=tol, atol=tol)
        assert all(a.dtype == dtype for a in got)
    for a, g in zip(fast, generic):      # the same formulas, rounded the same way
        np.testing.assert_array_equal(a, g)
    dc = rng.standard_normal((7, 5)).astype(dtype)
    dh = rng.standard_normal((7, 5)).astype(dtype)
    gf = rnn_ops._gates_grad(np, c, fast[2], fast[0], dc, dh)
    gg = rnn_ops._gates_grad(_Generic(), c, fast[2], fast[0], dc, dh)
    for a, g in zip(gf, gg):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, g, rtol=tol, atol=tol)


@pytest.mark.parametrize("addend", [None, "row", "full"])
def test_lstm_gates_op_gradients_finite_differences(compiled, rng, addend):
    w = rng.standard_normal((2, 7, 3))

    def f(z, c, *b):
        c_new, h_new = rnn_ops.lstm_gates(z, c, 0.7, b=b[0] if b else None)
        return c_new * w[0] + h_new * w[1]
    inputs = [rng.standard_normal((7, 12)), rng.standard_normal((7, 3))]
    if addend is not None:
        inputs.append(rng.standard_normal((12,) if addend == "row" else (7, 12)))
    check_grads(f, inputs, config=compiled)


def test_lstm_gates_rejects_a_misshaped_addend():
    z = dcf.placeholder(dcf.float32, (4, 8))
    c = dcf.placeholder(dcf.float32, (4, 2))
    with pytest.raises(dcf.errors.InvalidArgumentError, match="addend"):
        rnn_ops.lstm_gates(z, c, b=dcf.placeholder(dcf.float32, (4, 7)))
    with pytest.raises(TypeError, match="addend"):
        rnn_ops.lstm_gates(z, c, b=dcf.placeholder(dcf.float64, (8,)))


def test_rnn_matmul_and_transpose_copy(compiled, rng):
    a_np, w_np = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    a = dcf.placeholder(F64, (3, 4))
    w = dcf.placeholder(F64, (4, 5))
    wt = rnn_ops.transpose_copy(w)
    y = rnn_ops.rnn_matmul(a, w, wt)
    # w_t only stands for w^T: the whole derivative flows to w
    assert dcf.gradients(y, [wt])[0] is None
    with dcf.Session(config=compiled) as sess:
        yv, wtv = sess.run([y, wt], {a: a_np, w: w_np})
    np.testing.assert_allclose(yv, a_np @ w_np, rtol=1e-14)
    assert wtv.flags.c_contiguous
    np.testing.assert_array_equal(wtv, w_np.T)
    check_grads(lambda a, w: rnn_ops.rnn_matmul(a, w, rnn_ops.transpose_copy(w)),
                [a_np, w_np], config=compiled)
    check_grads(lambda w: rnn_ops.transpose_copy(w) * np.arange(20.0).reshape(5, 4),
                [w_np], config=compiled)
    with pytest.raises(dcf.errors.InvalidArgumentError, match="transpose"):
        rnn_ops.rnn_matmul(a, w, dcf.placeholder(F64, (4, 5)))


@pytest.mark.parametrize("chunk_rows", [4096, 4], ids=["one_gemm", "chunked"])
def test_project_unstack_and_its_weight_gradient_op(compiled, rng, monkeypatch, chunk_rows):
    """TensorArrayProjectUnstack writes x[t] @ w to index t; TensorArrayProjectGrad is
    sum_t x[t]^T P[t] over an array's elements (in chunks of rows), with gradients."""
    monkeypatch.setattr(rnn_ops, "_PROJECT_CHUNK_ROWS", chunk_rows)
    x_np, w_np = rng.standard_normal((T, B, D)), rng.standard_normal((D, U))
    p_np = rng.standard_normal((T, B, U))

    def project(x, w):
        ta = dcf.TensorArray(F64, size=T)
        return rnn_ops.project_unstack(ta, x, w).stack()

    def weight_grad(x, p):
        ta = dcf.TensorArray(F64, size=T, clear_after_read=False).unstack(p)
        return dcf.ops.registry.apply("TensorArrayProjectGrad", [ta.handle, x, ta.flow],
                                      units=U)
    x = dcf.placeholder(F64, (T, B, D))
    w = dcf.placeholder(F64, (D, U))
    p = dcf.placeholder(F64, (T, B, U))
    with dcf.Session(config=compiled) as sess:
        pv, gv = sess.run([project(x, w), weight_grad(x, p)], {x: x_np, w: w_np, p: p_np})
    np.testing.assert_allclose(pv, x_np @ w_np, rtol=1e-13)
    np.testing.assert_allclose(gv, np.einsum("tbd,tbu->du", x_np, p_np), rtol=1e-12)
    check_grads(project, [x_np, w_np], config=compiled)
    check_grads(weight_grad, [x_np, p_np], config=compiled)


@pytest.mark.parametrize("device", [None, "/cpu:0", "/gpu:0"])
def test_hoisting_is_for_loops_on_cpus(device):
    """GPU loops keep the per-step cell: the projection would be device memory that
    swap_memory cannot move, and swapping must not change results (built, not run)."""
    x = dcf.placeholder(dcf.float32, (B, T, D))
    with dcf.device(device):
        dnn.dynamic_rnn(dnn.LSTMCell(U), x, dtype=dcf.float32)
    types = {op.type for op in dcf.get_default_graph().get_operations()}
    hoisted = device != "/gpu:0"
    assert ("TensorArrayProjectUnstack" in types) == hoisted
    assert ("RNNMatMul" in types) == hoisted


def test_shared_cell_in_two_hoisted_loops_with_masks(compiled, rng, monkeypatch):
    """Each loop's projection supplies its own share of dL/dW_h (the tied weight), so a
    cell used by two dynamic_rnn calls gets the sum, as without hoisting."""
    xa_np, xb_np = rng.uniform(-1, 1, (B, T, D)), rng.uniform(-1, 1, (B, T - 2, D))
    seq_np = np.array([T, 2, 0])
    xa, xb = dcf.placeholder(F64, xa_np.shape), dcf.placeholder(F64, xb_np.shape)
    seq = dcf.placeholder(dcf.int32, (B,))
    cell = dnn.LSTMCell(U)
    wa, wb = rng.standard_normal((B, T, U)), rng.standard_normal((B, T - 2, U))

    def loss():
        oa, sa = dnn.dynamic_rnn(cell, xa, sequence_length=seq, dtype=F64)
        ob, _ = dnn.dynamic_rnn(cell, xb, initial_state=sa, dtype=F64)
        return dcf.reduce_sum(oa * wa) + dcf.reduce_sum(ob * wb)
    g_h = dcf.gradients(loss(), [xa, xb] + cell.variables)
    monkeypatch.setattr(dnn, "_hoisted_rnn", lambda *a: None)
    g_u = dcf.gradients(loss(), [xa, xb] + cell.variables)
    ops = [op.type for op in dcf.get_default_graph().get_operations()]
    assert ops.count("TensorArrayProjectUnstack") == 2
    with dcf.Session(config=compiled) as sess:
        sess.run(dcf.global_variables_initializer())
        gh, gu = sess.run([g_h, g_u], {xa: xa_np, xb: xb_np, seq: seq_np}, options=OPTS)
    for a, b in zip(gh, gu):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_project_grad_with_a_tied_array(compiled, rng):
    """TensorArrayProjectGrad with a second array H: (sum_t x[t]^T P[t], sum_t H[t]^T P[t])."""
    from dcf.ops.registry import apply

    x_np, p_np, h_np = (rng.standard_normal((T, B, k)) for k in (D, U, 2))
    x = dcf.placeholder(F64, x_np.shape)
    pt = dcf.TensorArray(F64, size=T, clear_after_read=False).unstack(
        dcf.placeholder(F64, p_np.shape, name="p"))
    ht = dcf.TensorArray(F64, size=T, clear_after_read=False).unstack(
        dcf.placeholder(F64, h_np.shape, name="h"))
    dw, dh = apply("TensorArrayProjectGrad", [pt.handle, x, pt.flow, ht.handle, ht.flow],
                   units=U, tied_rows=2)
    g = dcf.get_default_graph()
    feed = {x: x_np, g.get_tensor_by_name("p:0"): p_np, g.get_tensor_by_name("h:0"): h_np}
    with dcf.Session(config=compiled) as sess:
        a, b = sess.run([dw, dh], feed)
    np.testing.assert_allclose(a, np.einsum("tbd,tbu->du", x_np, p_np), rtol=1e-12)
    np.testing.assert_allclose(b, np.einsum("tbk,tbu->ku", h_np, p_np), rtol=1e-12)
