"""Host us of cupy's pool used_bytes / total_bytes / free_bytes with 100-5000 arrays in use:
`python -m bench.probes.pool_cost`."""
import time, cupy
pool = cupy.get_default_memory_pool()
keep = []
for n in (100, 1000, 2500, 5000):
    while len(keep) < n:
        keep.append(cupy.empty((256, 1024), cupy.float32))     # 1 MiB each
    for name in ("used_bytes", "total_bytes", "free_bytes"):
        f = getattr(pool, name)
        f(); t = time.perf_counter()
        for _ in range(200): f()
        print(f"n={n} {name}: {1e6 * (time.perf_counter() - t) / 200:.1f} us", flush=True)
