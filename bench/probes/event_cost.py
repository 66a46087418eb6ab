"""Host us of the CUDA calls a swapped value costs, each timed alone (median of many,
the streams idle): an event made and recorded (what GpuDevice.record does) against one
recorded again (a pooled event), a stream waiting on an event, an event query, a device
allocation of a 4 MiB value from cupy's pool, and the Python of taking a recycled pinned
block (GpuDevice.pinned_buffer) -- to see which are worth removing per value
(bench/NOTES.md, "GPU, session 15").

    python -m bench.probes.event_cost
"""
import time

import cupy as cp

from bench import gpu_common as G


def cost(label, f, n=2000):
    for _ in range(50):
        f()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    print(f"{label:52s} median {ts[len(ts) // 2] * 1e6:7.2f} us  p10 {ts[len(ts) // 10] * 1e6:7.2f}",
          flush=True)


def main() -> None:
    gpu = G.gpu_device(0)
    gpu.activate()
    s, c = gpu.d2h, gpu.compute
    kept = []

    def new_event():
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(c)
        kept.append(ev)
        if len(kept) > 64:
            del kept[:32]
    cost("Event(disable_timing=True) + record", new_event)
    ev = cp.cuda.Event(disable_timing=True)
    cost("record of an existing event", lambda: ev.record(c))
    cost("GpuDevice.record(compute)", lambda: kept.append(gpu.record(c)) or
         (len(kept) > 64 and kept.clear()))
    ev.record(c)
    cost("stream.wait_event", lambda: s.wait_event(ev))
    cost("event.done (query, completed)", lambda: ev.done)
    keep = []
    cost("cupy.empty 4 MiB (pool)", lambda: keep.append(cp.empty((512, 2048), cp.float32)) or
         (len(keep) > 8 and keep.clear()))
    blocks = [gpu.pinned_buffer(4 << 20) for _ in range(4)]
    del blocks

    def pinned():
        b = gpu.pinned_buffer(4 << 20)
        del b
    cost("GpuDevice.pinned_buffer 4 MiB (recycled) + release", pinned)


if __name__ == "__main__":
    main()
