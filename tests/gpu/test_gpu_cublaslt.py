"""GEMMs through cuBLASLt (dcf/ops/cublaslt.py): the product for every transpose pair and
both float dtypes against float64 numpy, in place with beta = 1, the same as cuBLAS's
sgemm/dgemm up to rounding, and each shape's algorithm chosen once. Under
DCF_FAKE_GPUS (no cuBLAS) the MatMul kernel never reaches it."""

from __future__ import annotations

import numpy as np
import pytest

from dcf import gpu_devices
from dcf.actors.gpu import GpuDevice
from dcf.ops import cublaslt, gpu_kernels


@pytest.fixture
def cp():
    if gpu_devices.is_fake():
        pytest.skip("the cupy stand-in has no cuBLAS")
    GpuDevice.get(0).activate()
    return gpu_devices.backend()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("beta", [0, 1])
def test_lt_gemm_equals_float64_numpy(cp, dt, ta, tb, beta):
    rng = np.random.default_rng(int(ta) + 2 * int(tb) + 4 * beta)
    m, k, n = 37, 53, 29
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dt)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dt)
    c = rng.standard_normal((m, n)).astype(dt)
    out = cp.asarray(c)
    sc = gpu_kernels._scalars(np.dtype(dt))
    done = cublaslt.gemm(cp, cp.asarray(a), cp.asarray(b), out, ta, tb, m, n, k, 0, sc[2],
                         sc[2] if beta else sc[3])
    assert done, "cuBLASLt did not take a plain C-contiguous GEMM"
    want = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    if beta:
        want += c
    tol = 1e-5 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=tol, atol=tol * 10)
    key = (0, np.dtype(dt).char, ta, tb, m, n, k, a.shape[1], b.shape[1])
    assert cublaslt._plans.get(key) is not None        # the shape's plan, made once


def test_matmul_kernel_takes_lt_and_matches_sgemm(cp):
    """The MatMul GPU body goes through cuBLASLt; cuBLAS's sgemm on the same operands
    gives the same product up to rounding (an LSTM-sized GEMM)."""
    from cupy_backends.cuda.libs import cublas

    rng = np.random.default_rng(7)
    a = cp.asarray(rng.standard_normal((256, 2048)).astype(np.float32))
    w = cp.asarray(rng.standard_normal((2048, 4096)).astype(np.float32))
    mm = gpu_kernels.matmul_gpu(None)
    before = len(cublaslt._plans)
    got = mm(cp, a, w, transpose_a=False, transpose_b=False)
    assert len(cublaslt._plans) >= before and \
        cublaslt._plans[(0, "f", False, False, 256, 4096, 2048, 2048, 4096)] is not None
    ref = cp.empty_like(got)
    sc = gpu_kernels._scalars(np.dtype(np.float32))
    h = gpu_kernels._handle(cp, cublas, 0)
    cublas.setStream(h, cp.cuda.get_current_stream().ptr)
    cublas.sgemm(h, 0, 0, 4096, 256, 2048, sc[2], w.data.ptr, 4096, a.data.ptr, 2048, sc[3],
                 ref.data.ptr, 4096)
    np.testing.assert_allclose(cp.asnumpy(got), cp.asnumpy(ref), rtol=1e-5, atol=1e-3)
