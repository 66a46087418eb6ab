"""Host us to make a column-block view of a device matrix: cupy slicing vs an ndarray
made from a pointer and strides (split_gpu): `python -m bench.probes.view_cost`."""
import time
import cupy as cp
x = cp.ones((256, 2048), cp.float32)
def t(label, f, n=20000):
    for _ in range(200): f()
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    print(f"{label:40s} {best:6.2f} us", flush=True)
mem, st, dt = x.data, x.strides, x.dtype
t("x[:, 1024:2048]", lambda: x[:, 1024:2048])
t("x[(slice(None), slice(1024, 2048))]", lambda: x[(slice(None), slice(1024, 2048))])
t("ndarray(shape, dt, mem + off, strides)", lambda: cp.ndarray((256, 1024), dt, mem + 4096, st))
