"""The narrowed product of dcf/fusion/split_matmul.py on a GPU: one GEMM on a block of W's
rows gives the columns of the whole product (to rounding), and an LSTM whose input needs
no gradient trains to the CPU's gradients with its first layer's input part never
computed. Under DCF_FAKE_GPUS the same runs through the stand-in's MatMul."""

from __future__ import annotations

import numpy as np
import pytest

from dcf import gpu_devices
from dcf.actors.gpu import GpuDevice
from tests.lstm_gradients import lstm_gradients


def test_a_row_block_product_equals_the_whole_products_columns():
    if gpu_devices.is_fake():
        pytest.skip("the cupy stand-in has no cuBLAS")
    GpuDevice.get(0).activate()
    cp = gpu_devices.backend()
    from dcf.ops import gpu_kernels

    mm = gpu_kernels.matmul_gpu(None)
    rng = np.random.default_rng(0)
    g = cp.asarray(rng.standard_normal((256, 2048)).astype(np.float32))
    w = cp.asarray(rng.standard_normal((1024, 2048)).astype(np.float32))
    whole = mm(cp, g, w, transpose_a=False, transpose_b=True)
    part = mm(cp, g, w[512:], transpose_a=False, transpose_b=True)
    assert part.flags.c_contiguous and part.shape == (256, 512)
    np.testing.assert_allclose(cp.asnumpy(part), cp.asnumpy(whole)[:, 512:], rtol=1e-5,
                               atol=1e-3)


def test_an_lstm_on_the_gpu_skips_its_inputs_part_and_equals_the_cpu(instances_of):
    from dcf.fusion import split_matmul as split_matmul_fusion

    made = instances_of(split_matmul_fusion.FusedSplitMatMul)
    rng = np.random.default_rng(1)
    xv = (rng.standard_normal((10, 64, 96)) * 0.5).astype(np.float32)

    cpu, gpu = (lstm_gradients(dev, xv, 128, kind="static")[0] for dev in ("/cpu:0", "/gpu:0"))
    # every step of the unrolled LSTM but the first (whose state part is not read either)
    assert sum(f.narrowed for f in made) == 9
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-4)
