"""2-D GEMMs through cuBLASLt with each shape's algorithm chosen once (GPU).

A loop of small GPU kernels is bound by the host's cost per launch (bench/NOTES.md), and
a GEMM is the dearest launch in an LSTM step: cuBLAS's `sgemm` costs the host about
15 us per call on the lent H100 hosts, because it describes the problem and asks its
heuristics again on every call. cuBLASLt takes the description (operation, layouts) and
the algorithm as objects made once: with them cached per shape, a call costs about
10 us through ctypes (same host, same shapes; "GPU, session 7" in bench/NOTES.md).

cuBLASLt ships with cuBLAS (libcublas loads libcublasLt), so this finds the library
cupy's cuBLAS already loaded and calls it through ctypes: no new dependency. Row-major
C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T, as
gpu_kernels.matmul_gpu does with `sgemm`. Each stream of a GPU that runs GEMMs gets a workspace
of its own from cudaMalloc (32 MiB on Hopper, 4 MiB before, NVIDIA's advice), outside the
memory pool and its budget, as cuBLAS's own workspace is. Anything that fails (no library found, a
status other than success for a shape) makes `gemm` return False and the caller uses
cuBLAS's `sgemm`/`dgemm`; a shape that failed once is not tried again.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

__all__ = ["gemm"]

_COMPUTE = {"f": 68, "d": 70}        # CUBLAS_COMPUTE_32F / _64F (no TF32: sgemm's math)
_DATA = {"f": 0, "d": 1}             # CUDA_R_32F / CUDA_R_64F
_TRANSA, _TRANSB = 3, 4              # cublasLtMatmulDescAttributes_t
_PREF_MAX_WORKSPACE = 1              # cublasLtMatmulPreferenceAttributes_t
_HEURISTIC_BYTES = 96                # sizeof(cublasLtMatmulHeuristicResult_t)

_vp = ctypes.c_void_p
_lock = threading.Lock()
_state: dict = {}         # "lib" -> the loaded library or None
_handles: dict = {}       # (thread, device) -> cublasLt handle
_plans: dict = {}         # problem key -> (desc, layout a, layout b, layout c, algo) or None
_workspace: dict = {}     # (device, stream) -> (pointer, bytes)


def _library() -> Any:
    lib = _state.get("lib", _state)
    if lib is not _state:
        return lib
    lib = None
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "libcublasLt.so" in line})
        for path in paths:
            try:
                cand = ctypes.CDLL(path)
            except OSError:
                continue
            cand.cublasLtMatmul.argtypes = [_vp] * 14 + [ctypes.c_size_t, _vp]
            cand.cublasLtMatmul.restype = ctypes.c_int
            cand.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(_vp), ctypes.c_int,
                                                        ctypes.c_uint64, ctypes.c_uint64,
                                                        ctypes.c_int64]
            lib = cand
            break
    except OSError:
        lib = None
    _state["lib"] = lib
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cublasLt {what}: status {status}")


def _handle(lib: Any, device: int) -> int:
    key = (threading.get_ident(), device)
    h = _handles.get(key)
    if h is None:
        hv = _vp()
        _check(lib.cublasLtCreate(ctypes.byref(hv)), "create")
        h = _handles[key] = hv.value
    return h


def _workspace_of(xp: Any, device: int, stream: int) -> tuple:
    """The workspace of GEMMs on `stream` of `device` (one per stream: GEMMs on one
    stream run in order, so they may share it)."""
    with _lock:
        ws = _workspace.get((device, stream))
        if ws is None:
            major = int(xp.cuda.Device(device).compute_capability[:-1] or 0)
            size = (32 if major >= 9 else 4) << 20
            ws = _workspace[(device, stream)] = (xp.cuda.runtime.malloc(size), size)
    return ws


def _plan(lib: Any, h: int, key: tuple, ws_bytes: int) -> tuple:
    char, ta, tb, m, n, k, lda, ldb = key[1:]
    desc = _vp()
    _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE[char], _DATA[char]),
           "matmul descriptor")
    for attr, flag in ((_TRANSA, tb), (_TRANSB, ta)):     # operands swapped: see module
        v = ctypes.c_int(1 if flag else 0)
        _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), 4), "transpose")

    def layout(rows: int, cols: int, ld: int) -> Any:
        lay = _vp()
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), _DATA[char], rows, cols, ld),
               "layout")
        return lay

    # a C-contiguous (r, c) array is the column-major (c, r) matrix with ld = c
    lay_b = layout(*((k, n) if tb else (n, k)), ldb)
    lay_a = layout(*((m, k) if ta else (k, m)), lda)
    lay_c = layout(n, m, n)
    pref = _vp()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
    wsb = ctypes.c_uint64(ws_bytes)
    _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE,
                                                    ctypes.byref(wsb), 8), "workspace")
    algo = ctypes.create_string_buffer(_HEURISTIC_BYTES)
    count = ctypes.c_int()
    _check(lib.cublasLtMatmulAlgoGetHeuristic(_vp(h), desc, lay_b, lay_a, lay_c, lay_c, pref,
                                              1, algo, ctypes.byref(count)), "heuristic")
    lib.cublasLtMatmulPreferenceDestroy(pref)
    if count.value < 1:
        raise RuntimeError("cublasLt heuristic: no algorithm")
    # the algo is the first 64 bytes of the heuristic result; keep the buffer alive
    return desc.value, lay_b.value, lay_a.value, lay_c.value, algo, ctypes.addressof(algo)


def gemm(xp: Any, a: Any, b: Any, out: Any, transpose_a: bool, transpose_b: bool, m: int,
         n: int, k: int, device: int, alpha_ptr: int, beta_ptr: int) -> bool:
    """out = op(a) @ op(b) (* alpha, + beta * out) for C-contiguous 2-D float32/float64
    device arrays on `device` (current), on the current stream; False where cuBLASLt is
    not available or does not take the shape (nothing done)."""
    char = a.dtype.char
    key = (device, char, transpose_a, transpose_b, m, n, k, a.shape[1], b.shape[1])
    plan = _plans.get(key, _plans)
    if plan is None:
        return False
    lib = _state.get("lib", _state)
    if lib is _state:
        lib = _library()
    if lib is None:
        return False
    h = _handle(lib, device)
    stream = xp.cuda.get_current_stream().ptr
    ws, ws_bytes = _workspace.get((device, stream)) or _workspace_of(xp, device, stream)
    if plan is _plans:
        with _lock:
            try:
                plan = _plans[key] = _plan(lib, h, key, ws_bytes)
            except RuntimeError:
                _plans[key] = None
                return False
    desc, lay_b, lay_a, lay_c, _, algo = plan
    o = out.data.ptr
    st = lib.cublasLtMatmul(h, desc, alpha_ptr, b.data.ptr, lay_b, a.data.ptr, lay_a, beta_ptr,
                            o, lay_c, o, lay_c, algo, ws, ws_bytes, stream)
    if st != 0:
        _plans[key] = None
        return False
    return True
