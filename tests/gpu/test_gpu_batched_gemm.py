"""BatchMatMulV2 on a GPU as one strided-batched GEMM (dcf/ops/gpu_kernels.py), its
transposes as GEMM flags; a loop's gradient of a stack of weights accumulated by that
GEMM with beta = 1 (dcf/fusion/accumulate.py); LSTMGates on a stack of layers; and the
wavefront LSTM of bench.model_parallel equal to the layer-by-layer one on a GPU. Under
DCF_FAKE_GPUS (no cuBLAS) the kernels decline and the generic bodies run."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf import gpu_devices
from dcf.actors.gpu import GpuDevice
from dcf.ops.gpu_kernels import batched_gemm, batched_gemm_accumulate
from tests.wavefront_gradients import wavefront_and_layers


@pytest.fixture
def cp():
    GpuDevice.get(0).activate()
    return gpu_devices.backend()


def _operands(dt, ta, tb, batch=(3,), m=37, k=53, n=29, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(batch + ((k, m) if ta else (m, k))).astype(dt)
    b = rng.standard_normal(batch + ((n, k) if tb else (k, n))).astype(dt)
    return a, b


def _want(a, b, ta, tb):
    return (np.swapaxes(a, -1, -2) if ta else a).astype(np.float64) @ \
        (np.swapaxes(b, -1, -2) if tb else b).astype(np.float64)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("batch", [(3,), (2, 2), (1,)])
def test_batched_gemm_and_its_accumulation_give_the_products(cp, dt, ta, tb, batch):
    a, b = _operands(dt, ta, tb, batch)
    got = batched_gemm(cp, cp.asarray(a), cp.asarray(b), ta, tb)
    c = np.random.default_rng(1).standard_normal(batch + (37, 29)).astype(dt)
    acc = cp.asarray(c)
    done = batched_gemm_accumulate(cp, acc, cp.asarray(a), cp.asarray(b), ta, tb)
    if gpu_devices.is_fake():
        assert got is None and not done and np.array_equal(cp.asnumpy(acc), c)
        return
    tol = 1e-5 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(cp.asnumpy(got), _want(a, b, ta, tb), rtol=tol, atol=tol * 10)
    assert done
    np.testing.assert_allclose(cp.asnumpy(acc), c + _want(a, b, ta, tb), rtol=tol,
                               atol=tol * 10)


def test_batched_gemm_declines_what_one_call_cannot_do(cp):
    a, b = _operands(np.float32, False, False)
    A, Bm = cp.asarray(a), cp.asarray(b)
    assert batched_gemm(cp, A, cp.asarray(b[:1]), False, False) is None      # broadcast
    assert batched_gemm(cp, A[0], Bm[0], False, False) is None               # rank 2
    assert batched_gemm(cp, cp.asarray(np.swapaxes(a, 1, 2)).swapaxes(1, 2), Bm,
                        False, False) is None                                 # a view
    assert batched_gemm(cp, A, Bm.astype(np.float64), False, False) is None
    acc = cp.zeros((3, 37, 29), np.float32)
    assert not batched_gemm_accumulate(cp, acc.astype(np.float64), A, Bm, False, False)
    assert not batched_gemm_accumulate(cp, cp.zeros((3, 29, 37), np.float32), A, Bm, False,
                                       False)
    assert not cp.asnumpy(acc).any()


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_the_op_on_a_gpu_equals_the_cpu_broadcast_included(ta, tb):
    a, b = _operands(np.float64, ta, tb, seed=3)
    got = {}
    for dev in ("/cpu:0", "/gpu:0"):
        g = dcf.Graph()
        with g.as_default(), dcf.device(dev):
            x, y = dcf.constant(a), dcf.constant(b)
            outs = [dcf.matmul(x, y, transpose_a=ta, transpose_b=tb),
                    dcf.matmul(x, y[:1], transpose_a=ta, transpose_b=tb)]   # broadcast
            outs += dcf.gradients(dcf.reduce_sum(outs[0] * outs[0]) + dcf.reduce_sum(outs[1]),
                                  [x, y])
        with dcf.Session(g) as s:
            got[dev] = s.run(outs)
    for w, o in zip(got["/cpu:0"], got["/gpu:0"]):
        np.testing.assert_allclose(o, w, rtol=1e-12, atol=1e-12)


def test_a_loops_gradient_of_a_weight_stack_accumulates_in_place(fused_accumulations):
    """sum_t sum((x_t @ W)^2) over a while loop: W's gradient is summed over the backward
    loop's iterations by one strided-batched GEMM with beta = 1 on a GPU."""
    rng = np.random.default_rng(4)
    xs = rng.standard_normal((6, 3, 8, 16))
    w0 = rng.standard_normal((3, 16, 32)) * 0.3
    got = {}
    for dev in ("/cpu:0", "/gpu:0"):
        g = dcf.Graph()
        with g.as_default(), dcf.device(dev):
            x = dcf.constant(xs)
            w = dcf.Variable(w0)
            ta = dcf.TensorArray(dcf.float64, size=6).unstack(x)

            def body(t, acc):
                y = dcf.matmul(ta.read(t), w)
                return t + 1, acc + dcf.reduce_sum(y * y)

            _, total = dcf.while_loop(lambda t, _: t < 6, body, (0, dcf.constant(0.0,
                                                                                 dcf.float64)))
            gw = dcf.gradients(total, [w])[0]
            init = dcf.global_variables_initializer()
        with dcf.Session(g) as s:
            s.run(init)
            got[dev] = s.run(gw)
    want = sum(2 * np.swapaxes(xs[t], 1, 2) @ (xs[t] @ w0) for t in range(6))
    np.testing.assert_allclose(got["/cpu:0"], want, rtol=1e-12)
    np.testing.assert_allclose(got["/gpu:0"], want, rtol=1e-12)
    if not gpu_devices.is_fake():
        ran = [f for f in fused_accumulations if f.kind == "batched"]
        assert ran and all(f.in_place == 5 for f in ran), [(f.kind, f.in_place)
                                                             for f in fused_accumulations]


@pytest.mark.parametrize("bias", [None, "per layer", "full"])
def test_stacked_gates_on_a_gpu_equal_the_cpu(bias):
    """Unbiased and with a bias shaped like z: the raw kernels on the stack as it is;
    a bias per layer: broadcast first."""
    rng = np.random.default_rng(5)
    z, c = rng.standard_normal((3, 37, 4 * 129)), rng.standard_normal((3, 37, 129))
    b = None if bias is None else rng.standard_normal(
        (3, 1, 4 * 129) if bias == "per layer" else z.shape)
    got = {}
    for dev in ("/cpu:0", "/gpu:0"):
        g = dcf.Graph()
        with g.as_default(), dcf.device(dev):
            zt, ct = dcf.constant(z), dcf.constant(c)
            bt = None if b is None else dcf.constant(b)
            c_new, h_new = dcf.nn.lstm_gates(zt, ct, 1.0, b=bt)
            outs = [c_new, h_new] + dcf.gradients(dcf.reduce_sum(c_new * h_new),
                                                  [zt, ct] + ([] if b is None else [bt]))
        with dcf.Session(g) as s:
            got[dev] = s.run(outs)
    for w, o in zip(got["/cpu:0"], got["/gpu:0"]):
        assert o.shape == w.shape
        np.testing.assert_allclose(o, w, rtol=1e-11, atol=1e-12)


def test_the_wavefront_lstm_on_gpus_equals_the_layer_by_layer_one(gpu_count):
    devs = [f"/gpu:{k}" for k in range(min(2, gpu_count))]
    x = np.random.default_rng(6).standard_normal((7, 4, 16))
    la, lb, want_k, got_k = wavefront_and_layers(devs, devs, x, 4)
    assert abs(la - lb) <= 1e-12 * abs(la)
    np.testing.assert_allclose(got_k, want_k, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 3])
def test_wavefront_inputs_on_a_gpu_equal_the_cpu(dt, n):
    from dcf.nn import wavefront_inputs

    rng = np.random.default_rng(n)
    below = rng.standard_normal((37, 129)).astype(dt)
    h = rng.standard_normal((n, 37, 129)).astype(dt)
    w = rng.standard_normal((n, 37, 258)).astype(dt)
    got = {}
    for dev in ("/cpu:0", "/gpu:0"):
        g = dcf.Graph()
        with g.as_default(), dcf.device(dev):
            bt, ht = dcf.constant(below), dcf.constant(h)
            xh = wavefront_inputs(bt, ht)
            outs = [xh] + dcf.gradients(dcf.reduce_sum(xh * xh * w), [bt, ht])
        with dcf.Session(g) as s:
            got[dev] = s.run(outs)
    for a, b in zip(got["/cpu:0"], got["/gpu:0"]):
        np.testing.assert_allclose(b, a, rtol=1e-6 if dt == np.float32 else 1e-13)
