"""Host us per call of launch paths (small arrays: the GPU never limits)."""
import time
import numpy as np
import cupy as cp
from dcf.ops.gpu_kernels import matmul_gpu
from dcf.ops.math_ops import _matmul
s = cp.cuda.Stream(non_blocking=True); s.use()
x = cp.ones((64, 64), cp.float32); y = cp.ones((64, 64), cp.float32); out = cp.empty_like(x)
n = x.size
ek = cp.ElementwiseKernel('T x', 'T y', 'y = tanh(x)', 'dcf_tanh_t')
ek2 = cp.ElementwiseKernel('T x, T z', 'T y', 'y = tanh(x + z)', 'dcf_tanh_add_t')
src = r'''extern "C" __global__ void tanh_f(const float* x, float* y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = tanhf(x[i]); }'''
rk = cp.RawKernel(src, 'tanh_f')
mod = cp.RawModule(code=src); fn = mod.get_function('tanh_f')
blocks = (n + 255) // 256
nn = np.int64(n)
mm = matmul_gpu(_matmul)
def t(name, f, n=3000):
    for _ in range(100): f()
    s.synchronize()
    best = 1e9
    for r in range(5):
        t0 = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        s.synchronize()
    print(f"{name:45s} {best:7.2f} us", flush=True)
t("cp.empty 64x64", lambda: cp.empty((64, 64), cp.float32))
t("cp.tanh(x)", lambda: cp.tanh(x))
t("x + y", lambda: x + y)
t("ElementwiseKernel tanh (alloc out)", lambda: ek(x))
t("ElementwiseKernel tanh (out given)", lambda: ek(x, out))
t("ElementwiseKernel tanh(x+z)", lambda: ek2(x, y))
t("RawKernel tanh (out given)", lambda: rk((blocks,), (256,), (x, out, nn)))
t("RawKernel tanh + cp.empty", lambda: rk((blocks,), (256,), (x, cp.empty((64, 64), cp.float32), nn)))
t("RawModule fn (out given)", lambda: fn((blocks,), (256,), (x, out, nn)))
t("dcf matmul_gpu 64x64", lambda: mm(cp, x, y, transpose_a=False, transpose_b=False))
t("cp.matmul 64x64", lambda: x @ y)
ev = cp.cuda.Event(disable_timing=True)
t("Event()+record", lambda: cp.cuda.Event(disable_timing=True).record(s))
t("record reused", lambda: ev.record(s))
t("event.done", lambda: ev.done)
rt = cp.cuda.runtime
t("runtime.eventQuery", lambda: rt.eventQuery(ev.ptr))
