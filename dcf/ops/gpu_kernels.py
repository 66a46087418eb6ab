"""GPU bodies of a few ops whose generic (`xp = cupy`) bodies cost the host far more
than the GPU work they start.

On a GPU the host's cost per op is what limits a step of small kernels (see
bench/NOTES.md, "GPU, session 3"): measured on an H200 host inside an LSTM training
step, `cupy.concatenate` of two [256, 1024] arrays took 34-45 us of host time, a
column `sum` 31-38 us, `cupy.split` (views only) 11 us. Here:

- concatenation of C-contiguous arrays (or, along the last axis of 2-D ones, column
  blocks of wider matrices) is one strided device-to-device copy per input
  (`cudaMemcpy2DAsync` on the current stream) into one new array -- or, where its last
  input is on offer (dcf/ops/concat_slots.py: the LSTM gates wrote h into a buffer made
  for this concatenation), into that buffer, copying only the parts not already in it;
- a sum over the rows of a wide C-contiguous matrix (an LSTM's bias gradient) is one
  raw kernel, a thread per column adding the rows in order in double;
- a split returns views made directly (a pointer into the input, its strides);
- a 2-D matrix product of C-contiguous float32/float64 matrices is one cuBLAS GEMM
  call on the current stream (transposes as GEMM flags), into a new array: cupy's
  `matmul` costs 14-22 us of host time per call there, more with transposed operands.

Each falls back to the generic body for anything else (other layouts, dtypes or
axes, and the test stand-in for cupy, which has no `memcpy2DAsync`).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from dcf.ops.concat_slots import claim
from dcf.ops.gpu_raw import RawLoop, c_contiguous, row_stride

__all__ = ["concat_gpu", "sum_gpu", "split_gpu", "matmul_gpu", "gemm", "gemm_accumulate",
           "colsum_accumulate", "stack_rows", "forget_stacks", "STACK_ROWS_MAX"]

_D2D = 3   # cudaMemcpyDeviceToDevice
_ident = threading.get_ident


def concat_gpu(generic: Any) -> Any:
    backends: dict = {}    # id(xp) -> (ndarray type, memcpy2DAsync, get_current_stream) | None

    def backend(xp: Any) -> Any:
        rt = getattr(getattr(xp, "cuda", None), "runtime", None)
        b = backends[id(xp)] = (xp.ndarray, rt.memcpy2DAsync, xp.cuda.get_current_stream) \
            if rt is not None and hasattr(rt, "memcpy2DAsync") else None
        return b

    def concat(xp, *xs, axis):
        b = backends.get(id(xp), False)
        if b is False:
            b = backend(xp)
        if len(xs) > 1:
            o = claim(xs[-1])           # h's buffer, made by the gates that computed it
            if o is not None:
                got = _into_slot(xp, b, xs, axis, o)
                if got is not None:
                    return got
        first = xs[0]
        if b is None or type(first) is not b[0]:
            return generic(xp, *xs, axis=axis)
        nd, copy, stream_of = b
        shape, dt = first.shape, first.dtype
        r = len(shape)
        a = axis + r if axis < 0 else axis
        if r == 0 or not 0 <= a < r:
            return generic(xp, *xs, axis=axis)
        lead, tail = shape[:a], shape[a + 1:]
        layout = _pitches(nd, xs, a, lead, tail, dt)
        if layout is None:
            return generic(xp, *xs, axis=axis)
        pitches, total = layout
        out = nd(lead + (total,) + tail, dt)     # cupy.empty without its wrapper
        rows = 1
        for d in lead:
            rows *= d
        inner = dt.itemsize
        for d in tail:
            inner *= d
        pitch = total * inner
        if rows == 0 or pitch == 0:
            return out
        _copy_parts(copy, stream_of().ptr, out.data.ptr, pitch, xs, pitches, a, inner, rows)
        return out
    return concat


def _pitches(nd: Any, xs: tuple, a: int, lead: tuple, tail: tuple, dt: Any) -> tuple | None:
    """(each part's source row pitch in bytes -- 0 for a C-contiguous part --, the parts'
    total size along axis a) where every part is an `nd` array of dtype dt shaped
    lead + (w,) + tail, C-contiguous or, joined along the last axis of 2-D arrays, a
    column block of a wider matrix; None for anything else."""
    r = len(lead) + 1 + len(tail)
    total = 0
    pitches = []
    for x in xs:
        if type(x) is not nd or x.dtype != dt:
            return None
        s = x.shape
        if len(s) != r or s[:a] != lead or s[a + 1:] != tail:
            return None
        if c_contiguous(x):
            pitches.append(0)
        else:                       # a column block of a wider matrix: rows apart
            ld = row_stride(x) if r == 2 and a == 1 else None
            if ld is None:
                return None
            pitches.append(ld * dt.itemsize)
        total += s[a]
    return pitches, total


def _copy_parts(copy: Any, stream: int, dst: int, pitch: int, xs: tuple, pitches: list,
                a: int, inner: int, rows: int) -> None:
    """The parts side by side into `rows` rows of `pitch` bytes from address dst: one
    strided copy (`copy`, cudaMemcpy2DAsync's signature) each, on `stream`."""
    for x, sp in zip(xs, pitches):
        width = x.shape[a] * inner
        if width:
            copy(dst, pitch, x.data.ptr, sp or width, width, rows, _D2D, stream)
            dst += width


def _into_slot(xp: Any, b: Any, xs: tuple, axis: int, o: Any) -> Any:
    """The concatenation of 2-D `xs` along their last axis written into the offer's
    buffer, whose columns from `lead` on already hold xs[-1] (the gates wrote it there):
    the other parts are copied in front of it, unless the layer below wrote the one
    other part there itself (the offer is filled with that very value). None where the
    shapes or layouts say otherwise (then the caller concatenates as usual; the buffer
    is left to its view)."""
    buf, lead = o.buf, o.lead
    h = xs[-1]
    if getattr(h, "ndim", 0) != 2 or axis not in (1, -1):
        return None
    rows, total = buf.shape
    nd, dt, parts = type(buf), buf.dtype, xs[:-1]
    layout = _pitches(nd, parts, 1, (rows,), (), dt)
    if layout is None or layout[1] != lead or h.shape != (rows, total - lead):
        return None
    if len(parts) == 1 and o.filled is parts[0]:
        return buf                                  # x is in place too
    if b is None or nd is not b[0]:                 # the test stand-in: plain assignment
        at = 0
        for x in parts:
            buf[:, at:at + x.shape[1]] = x
            at += x.shape[1]
        return buf
    if rows:
        isz = dt.itemsize
        _copy_parts(b[1], b[2]().ptr, buf.data.ptr, total * isz, parts, layout[0], 1, isz,
                    rows)
    return buf


# the column sums as raw kernels (dcf/ops/gpu_raw.py): a thread per column adds the
# rows in order in double; the accumulating form adds that sum, rounded, to y
_COLSUM_PARAMS = ("const T* __restrict__ x, const long long rows, const long long cols, "
                  "T* __restrict__ y")
_COLSUM_SUM = "    double s = 0; for (long long r = 0; r < rows; ++r) s += x[r * cols + i];"
_COLSUM_RAW = RawLoop("dcf_colsum_raw", _COLSUM_PARAMS, _COLSUM_SUM + " y[i] = (T)s;")
_COLSUM_ACC_RAW = RawLoop("dcf_colsum_acc_raw", _COLSUM_PARAMS,
                          _COLSUM_SUM + " y[i] = y[i] + (T)s;")


def sum_gpu(generic: Any, axis_value: Any) -> Any:
    """`generic` is the Sum kernel; `axis_value` turns a dynamic axis input into
    numpy's axis argument (math_ops._axis_value)."""
    def sum_(xp, x, *dyn, axis, keepdims):
        ax = axis_value(dyn[0]) if dyn else axis
        if isinstance(ax, (tuple, list)) and len(ax) == 1:
            ax = ax[0]
        if (ax == 0 or ax == -2) and type(x) is xp.ndarray and x.ndim == 2 and \
                x.dtype.kind == "f" and x.dtype.itemsize >= 4 and c_contiguous(x) and \
                x.shape[1] >= 512 and x.shape[0] and RawLoop.available(xp):
            rows, cols = x.shape
            y = xp.ndarray((cols,), x.dtype)
            _COLSUM_RAW(xp, x.dtype, cols, (x, np.int64(rows), np.int64(cols), y))
            return y.reshape(1, cols) if keepdims else y
        return generic(xp, x, *dyn, axis=axis, keepdims=keepdims)
    return sum_


def split_gpu(generic: Any) -> Any:
    def split(xp, x, *dyn, sizes, num, axis):
        if sizes is None or dyn or type(x) is not xp.ndarray or num < 2 or -1 in sizes:
            return generic(xp, x, *dyn, sizes=sizes, num=num, axis=axis)
        a = axis + x.ndim if axis < 0 else axis
        if not 0 <= a < x.ndim or sum(sizes) != x.shape[a] or min(sizes) < 0 or \
                len(sizes) != num:
            return generic(xp, x, *dyn, sizes=sizes, num=num, axis=axis)
        out, start = [], 0
        if min(sizes) > 0 and x.strides[a] > 0 and hasattr(xp.cuda, "MemoryPointer"):
            # views made directly (a pointer into x, x's strides): cupy's basic slicing
            # costs several us of host time per view
            mk, mem, dt, strides, step = xp.ndarray, x.data, x.dtype, x.strides, x.strides[a]
            shape = list(x.shape)
            for s in sizes:
                shape[a] = s
                out.append(mk(tuple(shape), dt, mem + start * step, strides))
                start += s
            return tuple(out)
        head = (slice(None),) * a
        for s in sizes:
            out.append(x[head + (slice(start, start + s),)])
            start += s
        return tuple(out)
    return split


_GEMM_SCALARS: dict = {}      # dtype char -> (one, zero, address of one, address of zero)
_HANDLES: dict = {}           # (thread, device) -> dcf's own cuBLAS handle, host pointer mode
_STREAM_OF: dict = {}         # handle -> the stream last set on it
_LIBS: dict = {}              # id(xp) -> cupy's cublas module, or None (the stand-in)


def _cublas(xp) -> Any:
    lib = _LIBS.get(id(xp), _LIBS)
    if lib is _LIBS:
        cuda = getattr(xp, "cuda", None)
        lib = getattr(cuda, "cublas", None)
        if lib is None or not hasattr(lib, "sgemm") or not hasattr(cuda, "device"):
            lib = None
        _LIBS[id(xp)] = lib
    return lib


def _scalars(dtype: Any) -> tuple:
    sc = _GEMM_SCALARS.get(dtype.char)
    if sc is None:
        one, zero = np.ones(1, dtype), np.zeros(1, dtype)
        sc = _GEMM_SCALARS[dtype.char] = (one, zero, one.ctypes.data, zero.ctypes.data)
    return sc


def _handle(xp, lib, device: int) -> int:
    """A cuBLAS handle for this thread and device that only these GEMMs use (not cupy's
    shared one), so the stream it was last given is known and set only when it changes
    (a `setStream` per GEMM was ~1 us of the host's time in an LSTM step)."""
    key = (_ident(), device)
    h = _HANDLES.get(key)
    if h is None:
        h = _HANDLES[key] = lib.create()            # on the current device: `device`
        lib.setPointerMode(h, 0)                    # CUBLAS_POINTER_MODE_HOST
    return h


def _gemm_shape(xp, lib, a, b, transpose_a, transpose_b) -> tuple | None:
    """(m, n, k, device) of op(a) @ op(b) where one GEMM computes it, else None."""
    nd = xp.ndarray
    if lib is None or type(a) is not nd or type(b) is not nd:
        return None
    sa, sb, dt = a.shape, b.shape, a.dtype
    if len(sa) != 2 or len(sb) != 2 or dt != b.dtype or dt.char not in "fd" or \
            not a._c_contiguous or not b._c_contiguous:      # (cupy arrays: type checked)
        return None
    m, k = (sa[1], sa[0]) if transpose_a else sa
    kb, n = (sb[1], sb[0]) if transpose_b else sb
    dev = a.data.device_id
    if k != kb or not (m and n and k) or dev != b.data.device_id:
        return None
    return m, n, k, dev


def _handle_on_stream(xp, lib, dev: int) -> int:
    """This thread's handle for `dev`, set to the current stream."""
    h = _handle(xp, lib, dev)
    stream = xp.cuda.get_current_stream().ptr
    if _STREAM_OF.get(h) != stream:
        lib.setStream(h, stream)
        _STREAM_OF[h] = stream
    return h


def _gemm(xp, lib, a, b, out, transpose_a, transpose_b, m, n, k, dev, beta) -> None:
    char = a.dtype.char
    sc = _scalars(a.dtype)
    h = _handle_on_stream(xp, lib, dev)
    (lib.sgemm if char == "f" else lib.dgemm)(
        h, 1 if transpose_b else 0, 1 if transpose_a else 0, n, m, k, sc[2],
        b.data.ptr, b.shape[1], a.data.ptr, a.shape[1], sc[2] if beta else sc[3],
        out.data.ptr, n)


def gemm_accumulate(xp, acc, a, b, transpose_a: bool, transpose_b: bool) -> bool:
    """acc += op(a) @ op(b) as one GEMM (beta = 1) on the current stream, where acc is
    a C-contiguous (m, n) array of the operands' dtype on their device that overlaps
    neither; False (nothing done) otherwise."""
    lib = _cublas(xp)
    dims = _gemm_shape(xp, lib, a, b, transpose_a, transpose_b)
    if dims is None or type(acc) is not xp.ndarray or acc.dtype != a.dtype or \
            acc.shape != dims[:2] or not c_contiguous(acc) or \
            acc.data.device_id != dims[3] or acc.data.ptr in (a.data.ptr, b.data.ptr):
        return False
    _gemm(xp, lib, a, b, acc, transpose_a, transpose_b, *dims, beta=1)
    return True


def colsum_accumulate(xp, acc, x) -> bool:
    """acc += x.sum(axis=0) for a wide C-contiguous float matrix, as one kernel that
    adds each column's sum (in sum_gpu's order and precision) to acc: the same bits as
    the Sum then the Add. False (nothing done) where sum_gpu would not take x."""
    if type(x) is not xp.ndarray or x.ndim != 2 or x.dtype.kind != "f" or \
            x.dtype.itemsize < 4 or not c_contiguous(x) or x.shape[1] < 512 or \
            not x.shape[0] or not RawLoop.available(xp) or \
            type(acc) is not xp.ndarray or acc.shape != (x.shape[1],) or \
            acc.dtype != x.dtype or not c_contiguous(acc) or \
            acc.data.device_id != x.data.device_id or acc.data.ptr == x.data.ptr:
        return False
    _COLSUM_ACC_RAW(xp, x.dtype, x.shape[1], (x, np.int64(x.shape[0]), np.int64(x.shape[1]),
                                               acc))
    return True


# k equal C-contiguous arrays stacked along their first axis by one raw kernel that takes
# each array's address as a parameter (a copy per array would be a launch each, and an
# array of addresses an upload): element i of the output is element i % per of array
# i // per
STACK_ROWS_MAX = 16
_STACK_PARAMS = ", ".join(f"const T* __restrict__ p{j}" for j in range(STACK_ROWS_MAX)) + \
    ", const long long per, T* __restrict__ y"
_STACK_BODY = ("    const long long j = i / per; const T* p = p0;\n    switch (j) {" +
               "".join(f" case {j}: p = p{j}; break;" for j in range(1, STACK_ROWS_MAX)) +
               " }\n    y[i] = p[i - j * per];")
_STACK_RAW = RawLoop("dcf_stack_rows", _STACK_PARAMS, _STACK_BODY)


# A column block of another GPU's matrix (rows `lds` elements apart) into memory here
# (rows `ldd` apart), read through peer access by one raw kernel on the current stream:
# the host pays one launch (~4 us) where a strided cudaMemcpy2DAsync between devices
# costs it ~15 us (bench/NOTES.md, "GPU, session 23"). Element i of the block is row
# i // cols, column i % cols.
_PEER_ROWS_RAW = RawLoop(
    "dcf_peer_rows", "const T* __restrict__ src, T* __restrict__ dst",
    "    const long long r = i / cols, c = i - r * cols;\n"
    "    dst[r * ldd + c] = src[r * lds + c];")
_BITS_AS = {4: "f", 8: "d"}     # elements moved as float / double: loads and stores
#                                 of a register keep every bit (NaN payloads included)


def peer_rows_kernel(cp: Any, src: Any, ldd: int | None = None) -> Any:
    """The kernel that copies `src` (a 2-D array on another GPU whose peer memory this
    device's kernels may read: the caller's check; each row contiguous, see row_stride)
    into memory on this device whose rows are `ldd` elements apart (None: C-contiguous),
    for launch_peer_rows; None where it does not apply: no RawKernel, an element size
    other than 4 or 8 bytes, no elements, rows not each contiguous."""
    char = _BITS_AS.get(src.itemsize)
    if char is None or src.ndim != 2 or not src.size or not RawLoop.available(cp):
        return None
    ld = row_stride(src)
    if ld is None:
        return None
    cols = src.shape[1]
    return _PEER_ROWS_RAW.kernel(cp, char, (("long long", "cols", cols), ("long long", "lds", ld),
                                            ("long long", "ldd", cols if ldd is None else ldd)))


def launch_peer_rows(k: Any, dst_ptr: int, src: Any) -> None:
    """Launch peer_rows_kernel's `k` for `src` into the memory at `dst_ptr`, on the
    current device and stream."""
    RawLoop.launch(k, src.size, (np.uint64(src.data.ptr), np.uint64(dst_ptr)))


_LAST_STACK: dict = {}   # thread -> [(the inputs, the stack)] of its last two stack_rows


def stack_rows(xp, xs: list) -> Any:
    """xs (arrays of one shape and dtype) one after another along axis 0, as one new
    C-contiguous array: xp.concatenate(xs), as one raw kernel where it can be (up to
    STACK_ROWS_MAX C-contiguous float arrays on one device). The same arrays stacked
    again by the same thread, with at most one other stack between, give the same stack
    (a loop's weight and bias gradients stack the same terms in one iteration;
    `forget_stacks`, called at the next term held, drops them)."""
    first = xs[0]
    k = len(xs)
    if k == 1:
        return first
    if 1 < k <= STACK_ROWS_MAX and type(first) is xp.ndarray and first.ndim >= 1 and \
            first.dtype.kind == "f" and first.dtype.itemsize >= 4 and first.size and \
            RawLoop.available(xp) and all(
                type(x) is xp.ndarray and x.shape == first.shape and x.dtype == first.dtype
                and c_contiguous(x) and x.data.device_id == first.data.device_id for x in xs):
        t = _ident()
        last = _LAST_STACK.get(t)
        if last is None:
            last = _LAST_STACK[t] = []
        for ins, stacked in last:
            if len(ins) == k and all(a is b for a, b in zip(ins, xs)):
                return stacked
        out = xp.ndarray((k * first.shape[0],) + first.shape[1:], first.dtype)
        ptrs = tuple(xs) + (first,) * (STACK_ROWS_MAX - k)
        _STACK_RAW(xp, first.dtype, k * first.size, ptrs + (np.int64(first.size), out))
        last.append((tuple(xs), out))
        if len(last) > 2:
            del last[0]
        return out
    return xp.concatenate(xs, axis=0)


def forget_stacks() -> None:
    """Drop this thread's last stacks (and their hold on the stacked arrays)."""
    if _LAST_STACK:
        _LAST_STACK.pop(_ident(), None)


def gemm(xp, a, b, transpose_a: bool, transpose_b: bool) -> Any:
    """op(a) @ op(b) as one GEMM on the current stream into a new array, or None where
    one GEMM does not compute it (see _gemm_shape): MatMul's GPU body without the
    fallback, for fused calls that have their own."""
    lib = _cublas(xp)
    dims = _gemm_shape(xp, lib, a, b, transpose_a, transpose_b)
    if dims is None:
        return None
    out = xp.ndarray(dims[:2], a.dtype)
    _gemm(xp, lib, a, b, out, transpose_a, transpose_b, *dims, beta=0)
    return out


def _batched_shape(xp, lib, a, b, transpose_a, transpose_b) -> tuple | None:
    """(batch, m, n, k, device) of op(a) @ op(b) for two C-contiguous stacks of matrices
    with the same batch axes (rank >= 3, no broadcasting), where one strided-batched
    GEMM computes it, else None."""
    nd = xp.ndarray
    if lib is None or type(a) is not nd or type(b) is not nd or \
            not hasattr(lib, "sgemmStridedBatched"):
        return None
    sa, sb, dt = a.shape, b.shape, a.dtype
    if len(sa) < 3 or sa[:-2] != sb[:-2] or dt != b.dtype or dt.char not in "fd" or \
            not a._c_contiguous or not b._c_contiguous:
        return None
    m, k = (sa[-1], sa[-2]) if transpose_a else sa[-2:]
    kb, n = (sb[-1], sb[-2]) if transpose_b else sb[-2:]
    batch = math.prod(sa[:-2])
    dev = a.data.device_id
    if k != kb or not (m and n and k and batch) or dev != b.data.device_id:
        return None
    return batch, m, n, k, dev


def _batched_gemm(xp, lib, a, b, out, transpose_a, transpose_b, batch, m, n, k, dev,
                  beta) -> None:
    """_gemm over `batch` matrices at fixed strides (cublas<t>gemmStridedBatched)."""
    sc = _scalars(a.dtype)
    h = _handle_on_stream(xp, lib, dev)
    sa, sb = a.shape, b.shape
    (lib.sgemmStridedBatched if a.dtype.char == "f" else lib.dgemmStridedBatched)(
        h, 1 if transpose_b else 0, 1 if transpose_a else 0, n, m, k, sc[2],
        b.data.ptr, sb[-1], sb[-1] * sb[-2], a.data.ptr, sa[-1], sa[-1] * sa[-2],
        sc[2] if beta else sc[3], out.data.ptr, n, m * n, batch)


def batched_gemm(xp, a, b, transpose_a: bool, transpose_b: bool) -> Any:
    """op(a) @ op(b) of two stacks of matrices (see _batched_shape) as one strided-batched
    GEMM on the current stream into a new array, or None where one does not compute it.
    The transposes are GEMM flags: no copy of a transposed operand."""
    lib = _cublas(xp)
    dims = _batched_shape(xp, lib, a, b, transpose_a, transpose_b)
    if dims is None:
        return None
    out = xp.ndarray(a.shape[:-2] + dims[1:3], a.dtype)
    _batched_gemm(xp, lib, a, b, out, transpose_a, transpose_b, *dims, beta=0)
    return out


def batched_gemm_accumulate(xp, acc, a, b, transpose_a: bool, transpose_b: bool) -> bool:
    """acc += op(a) @ op(b) for stacks of matrices as one strided-batched GEMM (beta =
    1), where acc is a C-contiguous array of the product's shape and the operands' dtype
    and device that overlaps neither; False (nothing done) otherwise."""
    lib = _cublas(xp)
    dims = _batched_shape(xp, lib, a, b, transpose_a, transpose_b)
    if dims is None or type(acc) is not xp.ndarray or acc.dtype != a.dtype or \
            acc.shape != a.shape[:-2] + dims[1:3] or not c_contiguous(acc) or \
            acc.data.device_id != dims[4] or acc.data.ptr in (a.data.ptr, b.data.ptr):
        return False
    _batched_gemm(xp, lib, a, b, acc, transpose_a, transpose_b, *dims, beta=1)
    return True


def matmul_gpu(generic: Any) -> Any:
    """MatMul of 2-D C-contiguous float32/float64 device arrays as one GEMM.

    A C-contiguous (r, c) matrix is, to column-major cuBLAS, its transpose with leading
    dimension c; C = op(A) @ op(B) is computed as C^T = op(B)^T @ op(A)^T, so the
    operands go in swapped and each transpose flag becomes a GEMM flag."""
    return _or_generic(gemm, generic)


def batch_matmul_gpu(generic: Any) -> Any:
    """BatchMatMulV2 of C-contiguous float32/float64 stacks with the same batch axes as
    one strided-batched GEMM; anything else (broadcast batch axes, other layouts) by
    `generic`."""
    return _or_generic(batched_gemm, generic)


def _or_generic(fast: Any, generic: Any) -> Any:
    def matmul(xp, a, b, *, transpose_a, transpose_b):
        out = fast(xp, a, b, transpose_a, transpose_b)
        if out is None:
            return generic(xp, a, b, transpose_a=transpose_a, transpose_b=transpose_b)
        return out
    return matmul
