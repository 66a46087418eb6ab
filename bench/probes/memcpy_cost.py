"""Host us of one cudaMemcpyAsync call (D2H and H2D, pinned host memory), with the stream
idle before each call, by size; and of alloc_pinned_memory (cupy's pinned pool)."""
import time
import cupy as cp
rt = cp.cuda.runtime
s = cp.cuda.Stream(non_blocking=True)
def cost(label, f, n=200, sync=True):
    for _ in range(10): f()
    s.synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        if sync: s.synchronize()
    ts.sort()
    print(f"{label:48s} median {ts[len(ts)//2]*1e6:8.2f} us  p10 {ts[len(ts)//10]*1e6:8.2f}", flush=True)
for mb in (0.0625, 1, 4, 16):
    nb = int(mb * (1 << 20))
    d = cp.empty(nb, cp.uint8)
    h = cp.cuda.alloc_pinned_memory(nb)
    cost(f"D2H {mb:g} MiB pinned (idle stream)", lambda: rt.memcpyAsync(h.ptr, d.data.ptr, nb, 2, s.ptr))
    cost(f"H2D {mb:g} MiB pinned (idle stream)", lambda: rt.memcpyAsync(d.data.ptr, h.ptr, nb, 1, s.ptr))
    cost(f"D2H {mb:g} MiB pinned, 8 queued", lambda: [rt.memcpyAsync(h.ptr, d.data.ptr, nb, 2, s.ptr) for _ in range(8)], n=50)
    cost(f"alloc_pinned_memory {mb:g} MiB (pool)", lambda: cp.cuda.alloc_pinned_memory(nb), sync=False)
    hm = cp.cuda.PinnedMemoryPointer(cp.cuda.PinnedMemory(nb), 0)
    cost(f"D2H {mb:g} MiB cudaHostAlloc'd directly", lambda: rt.memcpyAsync(hm.ptr, d.data.ptr, nb, 2, s.ptr))
