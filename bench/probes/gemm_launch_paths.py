"""Host us per call of launch paths dcf does not use, measured against the ones it does: cuBLAS's
sgemm (cupy) vs a cuBLASLt matmul through ctypes with the algorithm chosen once; a RawKernel launch
vs cuLaunchKernel through ctypes; cupy.empty vs cupy.ndarray. `python -m bench.probes.gemm_launch_paths`
(bench/NOTES.md, "GPU, session 7": the cuBLASLt path was tried in dcf and reverted)."""
import ctypes, time, numpy as np, cupy
from cupy_backends.cuda.libs import cublas
cupy.cuda.Device(0).use()
s = cupy.cuda.Stream(non_blocking=True); s.use()
h = cupy.cuda.device.get_cublas_handle()
A = cupy.random.standard_normal((256, 2048), dtype=cupy.float32)
W = cupy.random.standard_normal((2048, 4096), dtype=cupy.float32)
C1 = cupy.empty((256, 4096), cupy.float32); C2 = cupy.empty_like(C1)
one = np.ones(1, np.float32); zero = np.zeros(1, np.float32)
def sg():
    cublas.setStream(h, s.ptr)
    cublas.sgemm(h, 0, 0, 4096, 256, 2048, one.ctypes.data, W.data.ptr, 4096, A.data.ptr, 2048, zero.ctypes.data, C1.data.ptr, 4096)
paths = [l.split()[-1] for l in open("/proc/self/maps") if "libcublasLt" in l]
print("cublasLt:", sorted(set(paths)))
lt = ctypes.CDLL(sorted(set(paths))[0])
vp, i32, u64, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
def chk(st, what):
    if st != 0: raise RuntimeError(f"{what}: status {st}")
H = vp(); chk(lt.cublasLtCreate(ctypes.byref(H)), "create")
D = vp(); chk(lt.cublasLtMatmulDescCreate(ctypes.byref(D), 68, 0), "desc")
for attr in (3, 4):
    v = i32(0); chk(lt.cublasLtMatmulDescSetAttribute(D, attr, ctypes.byref(v), 4), "attr")
lt.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), i32, u64, u64, i64]
def layout(rows, cols, ld):
    L = vp(); chk(lt.cublasLtMatrixLayoutCreate(ctypes.byref(L), 0, rows, cols, ld), "layout"); return L
La, Lb, Lc = layout(4096, 2048, 4096), layout(2048, 256, 2048), layout(4096, 256, 4096)
P = vp(); chk(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(P)), "pref")
ws_bytes = u64(32 << 20); chk(lt.cublasLtMatmulPreferenceSetAttribute(P, 1, ctypes.byref(ws_bytes), 8), "pref attr")
res = (ctypes.c_char * 96 * 4)(); n = i32()
chk(lt.cublasLtMatmulAlgoGetHeuristic(H, D, La, Lb, Lc, Lc, P, 4, res, ctypes.byref(n)), "heur")
print("algos", n.value, "ws", [int.from_bytes(bytes(res[i])[64:72], "little") for i in range(n.value)])
algo = ctypes.addressof(res)
ws = cupy.empty(32 << 20, cupy.uint8)
f = lt.cublasLtMatmul
f.argtypes = [vp] * 14 + [sz, vp]
f.restype = i32
Hv, Dv, Lav, Lbv, Lcv = H.value, D.value, La.value, Lb.value, Lc.value
onep, zerop, wsp = one.ctypes.data, zero.ctypes.data, ws.data.ptr
def ltmm():
    return f(Hv, Dv, onep, W.data.ptr, Lav, A.data.ptr, Lbv, zerop, C2.data.ptr, Lcv, C2.data.ptr, Lcv, algo, wsp, 32 << 20, s.ptr)
sg(); chk(ltmm(), "matmul"); s.synchronize()
print("max |sgemm - lt|", float(abs(C1 - C2).max()), "max|C|", float(abs(C1).max()), "equal bits", bool((C1 == C2).all()))
def bench(fn, n=300):
    for _ in range(20): fn()
    s.synchronize()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): fn()
        best = min(best, (time.perf_counter() - t) / n)
        s.synchronize()
    return best * 1e6
# small GEMMs so the GPU is not the limit: host cost only
A = cupy.random.standard_normal((8, 64), dtype=cupy.float32); W = cupy.random.standard_normal((64, 64), dtype=cupy.float32)
C1 = cupy.empty((8, 64), cupy.float32); C2 = cupy.empty_like(C1)
def sg():
    cublas.setStream(h, s.ptr)
    cublas.sgemm(h, 0, 0, 64, 8, 64, one.ctypes.data, W.data.ptr, 64, A.data.ptr, 64, zero.ctypes.data, C1.data.ptr, 64)
La, Lb, Lc = layout(64, 64, 64), layout(64, 8, 64), layout(64, 8, 64)
chk(lt.cublasLtMatmulAlgoGetHeuristic(H, D, La, Lb, Lc, Lc, P, 4, res, ctypes.byref(n)), "heur")
Lav, Lbv, Lcv = La.value, Lb.value, Lc.value
for r in range(2):
    print(f"round {r}: sgemm {bench(sg):.2f} us, cublasLt {bench(ltmm):.2f} us, empty {bench(lambda: cupy.empty((256, 1024), cupy.float32)):.2f} us, ndarray {bench(lambda: cupy.ndarray((256, 1024), cupy.float32)):.2f} us", flush=True)
# a raw kernel: cupy launch vs cuLaunchKernel
k = cupy.RawKernel(r'''extern "C" __global__ void addk(const float* a, const float* b, float* c, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) c[i] = a[i] + b[i]; }''', "addk")
x = cupy.ones(1024, cupy.float32); y = cupy.ones(1024, cupy.float32); z = cupy.empty_like(x)
nn = np.int64(1024)
def cl(): k((4,), (256,), (x, y, z, nn))
cl(); s.synchronize()
cuda = ctypes.CDLL("libcuda.so.1")
fn_ptr = k.kernel.ptr
vals = (ctypes.c_uint64 * 4)(); params = (vp * 4)(*[ctypes.addressof(vals) + 8 * i for i in range(4)])
launch = cuda.cuLaunchKernel
launch.argtypes = [vp, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, vp, vp, vp]
pp = ctypes.addressof(params)
def dl():
    vals[0] = x.data.ptr; vals[1] = y.data.ptr; vals[2] = z.data.ptr; vals[3] = 1024
    return launch(fn_ptr, 4, 1, 1, 256, 1, 1, 0, s.ptr, pp, None)
z.fill(0); chk(dl(), "launch"); s.synchronize(); print("driver launch result ok", bool((z == 2).all()))
for r in range(2):
    print(f"round {r}: RawKernel call {bench(cl):.2f} us, cuLaunchKernel via ctypes {bench(dl):.2f} us", flush=True)
