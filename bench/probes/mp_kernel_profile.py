"""Every kernel and copy of model_parallel's steps, timed by the GPUs themselves (CUPTI,
through torch.profiler, which records all kernels of the process whatever library
launched them: cupy's, cuBLAS's): per GPU, the step's span and busy time (streams
merged), and the time per step by kernel name -- so that what does not halve from one GPU
to two shows by name. The executor runs as in the benchmark (compiled frames, no
tracing of its own); CUPTI adds ~1-2 us of host time a launch.

    python -m bench.probes.mp_kernel_profile [DEVICES]        # 1,2 by default

Env: DCF_PROBE_SCHEDULE (wavefront by default, or layers), DCF_PROBE_STEPS (profiled
steps, back to back, 2), DCF_PROBE_TOP (names listed per GPU, 24). Needs torch with CUDA
(on the device machine)."""
import collections, json, os, sys, tempfile, time
import numpy as np

import cupy as cp
import torch
from torch.profiler import ProfilerActivity, profile

from dcf.actors import gpu as G
from bench.model_parallel import SCHEDULES

counts = [int(d) for d in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 2]
U = int(os.environ.get("DCF_PROBE_UNITS", 1024))
B = int(os.environ.get("DCF_PROBE_BATCH", 256))
T = int(os.environ.get("DCF_PROBE_T", 100))
STEPS = int(os.environ.get("DCF_PROBE_STEPS", 2))
TOP = int(os.environ.get("DCF_PROBE_TOP", 24))
SCHEDULE = os.environ.get("DCF_PROBE_SCHEDULE", "wavefront")


def short(name: str) -> str:
    return name if len(name) <= 88 else name[:60] + "..." + name[-25:]


def device_events(trace_path: str) -> dict:
    """device -> [(name, category, ts_us, dur_us, stream)] of kernels, copies, memsets."""
    with open(trace_path) as f:
        data = json.load(f)
    out: dict = collections.defaultdict(list)
    for e in data.get("traceEvents", []):
        cat = e.get("cat", "")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset") or "dur" not in e:
            continue
        a = e.get("args", {})
        out[int(a.get("device", -1))].append((e["name"], cat, float(e["ts"]), float(e["dur"]),
                                              a.get("stream")))
    return out


def busy_union(evs: list) -> float:
    total, end = 0.0, -1e30
    for _, _, ts, dur, _ in sorted(evs, key=lambda e: e[2]):
        if ts >= end:
            total += dur
            end = ts + dur
        elif ts + dur > end:
            total += ts + dur - end
            end = ts + dur
    return total


def profile_steps(m, xv, ndev: int) -> dict:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(STEPS):
            m.step(xv)
        for d in range(ndev):
            cp.cuda.Device(d).synchronize()
        wall = time.perf_counter() - t0
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    evs = device_events(path)
    os.unlink(path)
    print(f"devices={ndev}: {STEPS} profiled steps, {wall / STEPS * 1e3:.1f} ms a step (host)",
          flush=True)
    return evs


def report(ndev: int, evs: dict, by_name_all: dict) -> None:
    for d in sorted(evs):
        de = evs[d]
        t_lo = min(e[2] for e in de)
        t_hi = max(e[2] + e[3] for e in de)
        busy = busy_union(de)
        streams = collections.Counter(e[4] for e in de)
        print(f"  gpu {d}: span {(t_hi - t_lo) / 1e3 / STEPS:.1f} ms a step, busy "
              f"{busy / 1e3 / STEPS:.1f} ms, {len(de) / STEPS:.0f} kernels/copies a step on "
              f"{len(streams)} streams", flush=True)
        by = collections.defaultdict(lambda: [0.0, 0])
        for name, cat, ts, dur, _ in de:
            key = ("memcpy " if cat != "kernel" else "") + name
            by[key][0] += dur
            by[key][1] += 1
            by_name_all[(ndev, d, key)] = by[key]
        for key, (tot, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:TOP]:
            print(f"    {tot / 1e3 / STEPS:8.2f} ms {n / STEPS:7.0f}x {tot / n:8.1f} us  "
                  f"{short(key)}", flush=True)


def main() -> None:
    torch.cuda.init()
    for d in range(max(counts)):
        torch.zeros(1, device=f"cuda:{d}")
    rng = np.random.default_rng(0)
    xv = cp.asarray((rng.standard_normal((T, B, U)) * 0.1).astype(np.float32))
    by_name_all: dict = {}
    for ndev in counts:
        m = SCHEDULES[SCHEDULE]([f"/gpu:{k}" for k in range(ndev)], 8, B, U, U, 32)
        G.GpuDevice.get(0).activate()
        for _ in range(3):
            m.step(xv)
        for d in range(ndev):
            cp.cuda.Device(d).synchronize()
        report(ndev, profile_steps(m, xv, ndev), by_name_all)
        m.close()
        del m
        cp.get_default_memory_pool().free_all_blocks()
    if 1 in counts and 2 in counts:
        # what does not halve: each name's time on one GPU against the slower of two
        names = {k for (_, _, k) in by_name_all}
        rows = []
        for k in names:
            one = sum(v[0] for (n, _, kk), v in by_name_all.items() if n == 1 and kk == k)
            two = [v[0] for (n, _, kk), v in by_name_all.items() if n == 2 and kk == k]
            rows.append((max(two, default=0.0) - one / 2, one, sum(two), max(two, default=0.0), k))
        print("  by name: 1 GPU, 2 GPUs (sum, slower GPU), slower GPU minus half of 1 GPU "
              "(ms a step):", flush=True)
        for extra, one, s2, m2, k in sorted(rows, reverse=True)[:TOP]:
            print(f"    {one / 1e3 / STEPS:8.2f} {s2 / 1e3 / STEPS:8.2f} {m2 / 1e3 / STEPS:8.2f} "
                  f"{extra / 1e3 / STEPS:+8.2f}  {short(k)}", flush=True)


if __name__ == "__main__":
    main()
