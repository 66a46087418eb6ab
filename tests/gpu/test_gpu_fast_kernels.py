"""The GPU-only bodies of dcf/ops/gpu_kernels.py and the fused LSTM gates with an
addend, at sizes and layouts that take those paths (and some that fall back), against
numpy on the host. Under DCF_FAKE_GPUS the generic bodies run (no memcpy2DAsync or
ElementwiseKernel there), so these equalities hold in both cases."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.ops.rnn_ops import lstm_gates


def _run(build, feeds):
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        phs = [dcf.placeholder(dcf.as_dtype(v.dtype), v.shape) for v in feeds]
        outs = build(*phs)
    with dcf.Session(g) as s:
        return s.run(outs, dict(zip(phs, feeds)))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_of_device_arrays_equals_numpy(dt, axis):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 5, 3)).astype(dt)
    b = rng.standard_normal((6, 5, 3)).astype(dt)
    c = rng.standard_normal((6, 5, 3)).astype(dt)
    got = _run(lambda x, y, z: [dcf.concat([x, y, z], axis=axis),
                                dcf.concat([x, dcf.transpose(y, [0, 1, 2]) * 2.0], axis=axis)],
               [a, b, c])
    np.testing.assert_array_equal(got[0], np.concatenate([a, b, c], axis=axis))
    np.testing.assert_array_equal(got[1], np.concatenate([a, b * 2], axis=axis))


def test_concat_with_an_empty_input_and_of_lstm_sized_matrices():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    h = rng.standard_normal((256, 512)).astype(np.float32)
    e = np.zeros((256, 0), np.float32)
    got = _run(lambda p, q, r: [dcf.concat([p, q], 1), dcf.concat([p, r, q], 1),
                                dcf.concat([p[:, :100], q], 1)], [x, h, e])
    np.testing.assert_array_equal(got[0], np.concatenate([x, h], 1))
    np.testing.assert_array_equal(got[1], np.concatenate([x, h], 1))
    np.testing.assert_array_equal(got[2], np.concatenate([x[:, :100], h], 1))


@pytest.mark.parametrize("shape", [(256, 4096), (3, 512), (1000, 600), (7, 100)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_sum_over_rows_equals_float64_numpy(shape, keepdims):
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    got = _run(lambda p: [dcf.reduce_sum(p, axis=0, keepdims=keepdims),
                          dcf.reduce_sum(p, axis=[0]), dcf.reduce_sum(p, axis=-2),
                          dcf.reduce_sum(p, axis=1)], [x])
    x64 = x.astype(np.float64)
    want0 = x64.sum(0)

    def close(got_, want, scale):   # float32 summation error bound: ~eps log2(n) sum|x|
        assert got_.dtype == np.float32 and got_.shape == want.shape
        assert np.all(np.abs(got_ - want) <= 2e-6 * scale + 1e-30), (got_, want)

    close(got[0], want0.reshape(1, -1) if keepdims else want0,
          np.abs(x64).sum(0, keepdims=keepdims))
    close(got[1], want0, np.abs(x64).sum(0))
    close(got[2], want0, np.abs(x64).sum(0))
    close(got[3], x64.sum(1), np.abs(x64).sum(1))


def test_bias_gradient_of_a_wide_layer_equals_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 32)).astype(np.float64)
    w = rng.standard_normal((32, 1024)).astype(np.float64)
    b = rng.standard_normal(1024).astype(np.float64)
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        xv = dcf.constant(x)
        wv, bv = dcf.Variable(w), dcf.Variable(b)
        loss = dcf.reduce_sum(dcf.tanh(dcf.matmul(xv, wv) + bv))
        db, = dcf.gradients(loss, [bv])
        init = dcf.global_variables_initializer()
    with dcf.Session(g) as s:
        s.run(init)
        got = s.run(db)
    np.testing.assert_allclose(got, (1 - np.tanh(x @ w + b) ** 2).sum(0), rtol=1e-12)


@pytest.mark.parametrize("sizes,axis", [((3, 5, 2), 1), ((2, 2), 0), ((1, 0, 9), 1)])
def test_split_views_equal_numpy(sizes, axis):
    x = np.random.default_rng(4).standard_normal((4, 10, 3) if axis else (4, 6)).astype(
        np.float32)
    if not axis:
        x = x[:4]
    got = _run(lambda p: [o * 1.0 for o in dcf.split(p, list(sizes), axis=axis)], [x])
    cuts = np.cumsum(sizes)[:-1]
    for g_, w in zip(got, np.split(x, cuts, axis=axis)):
        np.testing.assert_array_equal(g_, w)


def _gates_numpy(z, c, fb):
    u = c.shape[1]
    sig = lambda v: 1 / (1 + np.exp(-v))   # noqa: E731
    i, j, f, o = (z[:, k * u:(k + 1) * u] for k in range(4))
    cn = c * sig(f + fb) + sig(i) * np.tanh(j)
    return cn, np.tanh(cn) * sig(o)


@pytest.mark.parametrize("addend", ["none", "row", "full"])
def test_fused_gates_with_an_addend_equal_numpy(addend):
    rng = np.random.default_rng(5)
    n, u = 8, 64
    z = rng.standard_normal((n, 4 * u))
    c = rng.standard_normal((n, u))
    b = {"none": None, "row": rng.standard_normal(4 * u),
         "full": rng.standard_normal((n, 4 * u))}[addend]
    feeds = [z, c] + ([] if b is None else [b])
    got = _run(lambda *p: list(lstm_gates(p[0], p[1], forget_bias=1.0,
                                          b=p[2] if len(p) > 2 else None)), feeds)
    want = _gates_numpy(z if b is None else z + b, c, 1.0)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("mkn", [(64, 48, 80), (1, 512, 2048), (256, 1, 3), (300, 1024, 1)])
def test_matmul_as_one_gemm_equals_float64_numpy(dt, ta, tb, mkn):
    m, k, n = mkn
    rng = np.random.default_rng(3)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dt)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dt)
    got = _run(lambda p, q: [dcf.matmul(p, q, transpose_a=ta, transpose_b=tb),
                             # a non-contiguous operand (a slice) takes the generic body
                             dcf.matmul(p[:, :], q, transpose_a=ta, transpose_b=tb)], [a, b])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64.T if ta else a64) @ (b64.T if tb else b64)
    bound = np.abs(a64.T if ta else a64) @ np.abs(b64.T if tb else b64)
    eps = np.finfo(dt).eps
    for g in got:
        assert g.shape == (m, n) and g.dtype == dt
        assert np.all(np.abs(g - want) <= 4 * k * eps * bound + 1e-30)


def test_matmul_of_empty_and_mismatched_operands():
    a = np.ones((3, 0), np.float32)
    b = np.ones((0, 4), np.float32)
    got = _run(lambda p, q: dcf.matmul(p, q), [a, b])
    np.testing.assert_array_equal(got, np.zeros((3, 4), np.float32))
    with pytest.raises(Exception):
        _run(lambda p, q: dcf.matmul(p, q),
             [np.ones((3, 2), np.float32), np.ones((3, 2), np.float32)])


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("addend", ["", "row", "full"])
def test_raw_lstm_gate_kernels_equal_the_elementwise_kernels(dt, addend):
    """The raw launches (dcf/ops/gpu_raw.py) run the ElementwiseKernels' bodies: the
    same results, forward and backward (compiled alike; at most the last bit where the
    compiler contracts differently)."""
    from dcf import gpu_devices
    from dcf.ops import rnn_ops

    cp = gpu_devices.backend()
    if not hasattr(cp, "RawKernel"):
        pytest.skip("the cupy stand-in has no RawKernel")
    cp.cuda.Device(0).use()
    rng = np.random.default_rng(9)
    B, u = 37, 129
    z, bias_full = (cp.asarray(rng.standard_normal((B, 4 * u)).astype(dt)) for _ in range(2))
    c = cp.asarray(rng.standard_normal((B, u)).astype(dt))
    bias = {"": None, "row": cp.asarray(rng.standard_normal(4 * u).astype(dt)),
            "full": bias_full}[addend]
    fb, which = dt(1.0), "fwd" + (f"_{addend}" if addend else "")
    outs = [[cp.empty((B, u), dt), cp.empty((B, u), dt), cp.empty((B, 4 * u), dt)]
            for _ in range(2)]
    extra = () if bias is None else (bias,)
    rnn_ops._raw_kernel(which)(cp, z.dtype, c.size, (z, c, fb, np.int64(u)) + extra +
                               tuple(outs[0]))
    rnn_ops._cuda_kernel(cp, which)(z, c, fb, u, *extra, *outs[1])
    tol = 1e-6 if dt == np.float32 else 1e-14
    for a, b in zip(*outs):
        np.testing.assert_allclose(cp.asnumpy(a), cp.asnumpy(b), rtol=tol, atol=tol)
    acts, c_new = outs[0][2], outs[0][0]
    dc, dh = (cp.asarray(rng.standard_normal((B, u)).astype(dt)) for _ in range(2))
    grads = [[cp.empty((B, 4 * u), dt), cp.empty((B, u), dt)] for _ in range(2)]
    grads[0] = rnn_ops.gates_grad_sum(cp, c, acts, c_new, dc, (dh,))   # the raw kernel
    rnn_ops._cuda_kernel(cp, "bwd")(c, acts, c_new, dc, dh, u, *grads[1])
    for a, b in zip(*grads):
        np.testing.assert_allclose(cp.asnumpy(a), cp.asnumpy(b), rtol=tol, atol=tol)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_raw_column_sum_adds_the_rows_in_order_in_double(dt):
    """Bit for bit against numpy doing the same: rows added in order in float64, the sum
    rounded to the dtype once."""
    from dcf import gpu_devices
    from dcf.ops import gpu_kernels

    cp = gpu_devices.backend()
    if not hasattr(cp, "RawKernel"):
        pytest.skip("the cupy stand-in has no RawKernel")
    cp.cuda.Device(0).use()
    xh = np.random.default_rng(10).standard_normal((300, 700)).astype(dt)
    raw = cp.empty(700, dt)
    gpu_kernels._COLSUM_RAW(cp, xh.dtype, 700, (cp.asarray(xh), np.int64(300), np.int64(700),
                                                 raw))
    want = np.zeros(700)
    for row in xh.astype(np.float64):
        want += row
    np.testing.assert_array_equal(cp.asnumpy(raw), want.astype(dt))
