"""What slows the host while a swap's copies run? Host us per (GEMM launch + allocation), or
per unit of pure-Python work, while 4 MiB copies run on another stream, by copy path:
device->host and host->device by cudaMemcpyAsync (the copy engines), device->device by
cudaMemcpyAsync, and device->host by a kernel that stores into the pinned buffer over PCIe
(no copy engine); and each path's throughput; then which side-stream work (a copy, a tiny
copy, an event record, an event query) slows a GEMM, an allocation or a raw launch.
`python -m bench.probes.copy_paths [ROUNDS]`
(bench/NOTES.md, "GPU, session 12")."""
import sys, time
import cupy as cp
from dcf.ops.gpu_kernels import matmul_gpu
from dcf.ops.math_ops import _matmul

rt = cp.cuda.runtime
comp = cp.cuda.Stream(non_blocking=True)
side = cp.cuda.Stream(non_blocking=True)
comp.use()
a = cp.ones((64, 64), cp.float32); b = cp.ones((64, 64), cp.float32)
mm = matmul_gpu(_matmul)
NB = 4 << 20
dev = [cp.ones((NB // 4,), cp.float32) for _ in range(16)]
dev2 = [cp.empty((NB // 4,), cp.float32) for _ in range(16)]
host = [cp.cuda.alloc_pinned_memory(NB) for _ in range(16)]
_COPY = cp.RawKernel(r'''extern "C" __global__ void copy16(const float4* src, float4* dst, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) dst[i] = src[i]; }''', "copy16")
N16 = cp.int64(NB // 16)


def kernel_d2h(i):
    with side:
        _COPY((264,), (512,), (dev[i % 16], cp.uint64(host[i % 16].ptr), N16))


PATHS = {
    "D2H memcpyAsync": lambda i: rt.memcpyAsync(host[i % 16].ptr, dev[i % 16].data.ptr, NB, 2, side.ptr),
    "H2D memcpyAsync": lambda i: rt.memcpyAsync(dev2[i % 16].data.ptr, host[i % 16].ptr, NB, 1, side.ptr),
    "D2D memcpyAsync": lambda i: rt.memcpyAsync(dev2[i % 16].data.ptr, dev[i % 16].data.ptr, NB, 3, side.ptr),
    "D2H kernel stores": kernel_d2h,
}


def gpu_work(i):
    mm(cp, a, b, transpose_a=False, transpose_b=False)
    cp.ndarray((256, 256), cp.float32)


_acc = [0]


def py_work(i):                 # ~ the interpreter alone: no CUDA call
    s = 0
    for k in range(60):
        s += k * i
    _acc[0] = s


def bench(work, copy, every, n=3000):
    for i in range(200): work(i)
    comp.synchronize(); side.synchronize()
    res = []
    for r in range(5):
        t0 = time.perf_counter()
        for i in range(n):
            work(i)
            if copy is not None and i % every == 0:
                copy(i)
        res.append((time.perf_counter() - t0) / n * 1e6)
        comp.synchronize(); side.synchronize()
    res.sort()
    return res[2], res[0]


def throughput(copy, k=64):
    copy(0); side.synchronize()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record(side)
    for i in range(k): copy(i)
    e1.record(side); e1.synchronize()
    return k * NB / (cp.cuda.get_elapsed_time(e0, e1) * 1e-3) / 1e9


_ev_done = cp.cuda.Event(); _ev_done.record(side)
small = [cp.ones((16384,), cp.float32) for _ in range(2)]
SIDE_OPS = {     # what else the side stream gets: which of it slows the launches?
    "D2H 4MiB": PATHS["D2H memcpyAsync"],
    "D2D 64KiB": lambda i: rt.memcpyAsync(small[1].data.ptr, small[0].data.ptr, 65536, 3, side.ptr),
    "event rec": lambda i: cp.cuda.Event(block=False, disable_timing=True).record(side),
    "ev query": lambda i: _ev_done.done,
}
_K = cp.RawKernel(r'''extern "C" __global__ void inc(float* a, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) a[i] += 1.0f; }''', "inc")
_kx = cp.zeros(4096, cp.float32); _kn = cp.int64(4096)
WORKS = {
    "gemm": lambda i: mm(cp, a, b, transpose_a=False, transpose_b=False),
    "alloc": lambda i: cp.ndarray((256, 256), cp.float32),
    "raw": lambda i: _K((16,), (256,), (_kx, _kn)),
}
ok = cp.empty_like(dev[0]); kernel_d2h(3); side.synchronize()
import numpy as np
hv = np.frombuffer(host[3], np.float32, NB // 4)
print("kernel D2H wrote the values:", bool((hv == 1).all()), flush=True)
for name, f in PATHS.items():
    print(f"{name:22s} {throughput(f):6.1f} GB/s", flush=True)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
for r in range(rounds):
    for wname, work in (("gemm+alloc", gpu_work), ("python", py_work)):
        base = bench(work, None, 1)
        line = [f"{wname:10s} none {base[0]:6.2f}"]
        for every in (20, 5):
            for name, f in PATHS.items():
                m, _ = bench(work, f, every)
                line.append(f"{name.split()[0]}{'-k' if 'kernel' in name else ''}/{every} {m:6.2f}")
        print(f"round {r}: " + "  ".join(line), flush=True)
for r in range(rounds):
    for wname, work in WORKS.items():
        base = bench(work, None, 1)
        line = [f"{wname:6s} none {base[0]:6.2f}"]
        for name, f in SIDE_OPS.items():
            line.append(f"{name}/5 {bench(work, f, 5)[0]:6.2f}")
        print(f"round {r}: " + "  ".join(line), flush=True)
