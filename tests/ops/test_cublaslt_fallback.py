"""dcf/ops/cublaslt.py declines (returns False, does nothing) where cuBLASLt is not loaded
in the process -- CPU machines, the cupy stand-in -- so the caller uses cuBLAS's GEMM.
tests/gpu/test_gpu_cublaslt.py checks the GEMMs on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from dcf.ops import cublaslt


def test_without_the_library_gemm_declines_and_leaves_out_alone(monkeypatch):
    monkeypatch.setattr(cublaslt, "_state", {"lib": None})
    a, b = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    out = np.full((2, 4), 7.0, np.float32)
    assert cublaslt.gemm(np, a, b, out, False, False, 2, 4, 3, 0, 0, 0) is False
    np.testing.assert_array_equal(out, np.full((2, 4), 7.0, np.float32))


def test_the_library_is_found_only_where_cublas_loaded_it():
    with open("/proc/self/maps") as f:
        loaded = any("libcublasLt.so" in line for line in f)
    if loaded:
        pytest.skip("this process has cuBLASLt loaded")
    cublaslt._state.pop("lib", None)
    assert cublaslt._library() is None
