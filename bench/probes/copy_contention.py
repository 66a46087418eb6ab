"""Host us per launch while device->host copies into pinned memory run on another stream
(or not): is the slowdown seen in swapping runs a driver/host effect of the copies?"""
import time
import cupy as cp
from dcf.ops.gpu_kernels import matmul_gpu
from dcf.ops.math_ops import _matmul
comp = cp.cuda.Stream(non_blocking=True); d2h = cp.cuda.Stream(non_blocking=True)
comp.use()
a = cp.ones((64, 64), cp.float32); b = cp.ones((64, 64), cp.float32)
mm = matmul_gpu(_matmul)
big = [cp.ones((1 << 20,), cp.float32) for _ in range(16)]     # 4 MB each
pinned = cp.cuda.alloc_pinned_memory(4 << 20 * 1)
host = [cp.cuda.alloc_pinned_memory(4 << 20) for _ in range(16)]
rt = cp.cuda.runtime
def copies(k):
    for i in range(k):
        src = big[i % 16]
        rt.memcpyAsync(host[i % 16].ptr, src.data.ptr, src.nbytes, 2, d2h.ptr)
def bench(label, every):
    n = 4000
    for _ in range(200): mm(cp, a, b, transpose_a=False, transpose_b=False)
    comp.synchronize(); d2h.synchronize()
    best = []
    for r in range(5):
        t0 = time.perf_counter(); nc = 0
        for i in range(n):
            mm(cp, a, b, transpose_a=False, transpose_b=False)
            cp.empty((256, 256), cp.float32)
            if every and i % every == 0:
                copies(1); nc += 1
        dt = time.perf_counter() - t0
        comp.synchronize(); d2h.synchronize()
        best.append(dt / n * 1e6)
    print(f"{label:40s} median {sorted(best)[2]:6.2f} us per (gemm + empty), min {min(best):6.2f}", flush=True)
bench("no copies", 0)
bench("a 4 MB D2H copy every 20 launches", 20)
bench("a 4 MB D2H copy every 5 launches", 5)
bench("no copies (again)", 0)
t0 = time.perf_counter()
for i in range(2000): copies(1)
print(f"memcpyAsync D2H 4 MB call: {(time.perf_counter() - t0) / 2000 * 1e6:.2f} us host", flush=True)
d2h.synchronize()
