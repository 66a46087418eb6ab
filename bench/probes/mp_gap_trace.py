"""Where model_parallel's GPUs wait, kernel by kernel: one steady step traced on each GPU
(GpuDevice.begin_trace: every kernel's and copy's device times and when the host enqueued
it), cut into the step's phases -- the root frame's runs of kernels ("gaps": prologue,
epilogue, loss, gradient bookkeeping, updates) and the loops' -- and, per phase and GPU:
its span, the GPU's busy time, and its idle time split by cause:
  host  -- the next kernel was enqueued after the GPU had finished the one before it (the
           GPU waited for the host to issue it);
  dep   -- it was enqueued in time but started later (it waited on an event: another
           stream, the other GPU, a peer copy).
The biggest idle intervals of each gap are listed with the kernels around them. The
tracing's own events cost the host ~2 records a kernel, so the traced step is slower than
an untraced one (both printed): a "host" figure is an upper bound.

    python -m bench.probes.mp_gap_trace [DEVICES]        # 1,2 by default

Env: DCF_PROBE_SCHEDULE (wavefront by default, or layers), DCF_PROBE_UNITS, DCF_PROBE_BATCH,
DCF_PROBE_STEPS (warm steps run back to back before the traced one, 3)."""
import collections, os, sys, time
import numpy as np
from dcf import gpu_devices
from dcf.actors import gpu as G
from bench.model_parallel import SCHEDULES

cp = gpu_devices.backend()
counts = [int(d) for d in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 2]
U = int(os.environ.get("DCF_PROBE_UNITS", 1024))
B = int(os.environ.get("DCF_PROBE_BATCH", 256))
T = int(os.environ.get("DCF_PROBE_T", 100))
WARM = int(os.environ.get("DCF_PROBE_STEPS", 3))
SCHEDULE = os.environ.get("DCF_PROBE_SCHEDULE", "wavefront")


def phases(events: list) -> list:
    """Consecutive compute kernels of one frame kind: [(kind, [events])], kind "root"
    for the root frame, else "loop <frame>" (a peer copy on the compute stream, which
    names no frame, stays in the phase it runs in)."""
    out: list = []
    for e in events:
        frame = e[2] or ""
        kind = "root" if frame in ("", "root") else "loop " + frame
        if out and (out[-1][0] == kind or e[1].startswith("Memcpy")):
            out[-1][1].append(e)
        else:
            out.append((kind, [e]))
    return out


def idle_split(evs: list) -> tuple[float, float, list]:
    """(idle waiting for the host, idle waiting on a dependency, [(gap, before, after)])
    between consecutive kernels of one stream, in seconds."""
    host = dep = 0.0
    gaps = []
    for a, b in zip(evs, evs[1:]):
        gap = b[4] - a[5]
        if gap <= 0:
            continue
        th = b[7]
        late = 0.0 if th is None else min(gap, max(0.0, th - a[5]))
        host += late
        dep += gap - late
        gaps.append((gap, late, a, b))
    return host, dep, gaps


def report(ndev: int, per_gpu: dict, wall: float) -> None:
    print(f"devices={ndev}: traced step {wall * 1e3:.1f} ms (host)", flush=True)
    t_first = min(e[4] for evs in per_gpu.values() for e in evs if e[6] == "compute")
    for gi, evs in sorted(per_gpu.items()):
        comp = sorted((e for e in evs if e[6] == "compute"), key=lambda e: e[4])
        copies = collections.Counter()
        for e in evs:
            if e[6] != "compute":
                copies[e[6]] += e[5] - e[4]
        span = comp[-1][5] - comp[0][4]
        print(f"  gpu {gi}: {len(comp)} kernels, span {span * 1e3:.1f} ms, copies "
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sorted(copies.items())),
              flush=True)
        ph = phases(comp)
        for i, (kind, pe) in enumerate(ph):
            busy = sum(e[5] - e[4] for e in pe)
            pspan = pe[-1][5] - pe[0][4]
            nxt = ph[i + 1][1][0] if i + 1 < len(ph) else None
            host, dep, gaps = idle_split(pe + ([nxt] if nxt else []))
            if kind != "root" and pspan < 1e-3 and len(pe) < 20:
                continue          # a loop's few stray kernels
            print(f"    {kind:<14} @{(pe[0][4] - t_first) * 1e3:7.1f} span {pspan * 1e3:6.1f} "
                  f"busy {busy * 1e3:6.1f} idle host {host * 1e3:5.1f} dep {dep * 1e3:5.1f} ms "
                  f"({len(pe)} kernels)", flush=True)
            if kind == "root":
                by = collections.Counter()
                for e in pe:
                    by[e[1]] += e[5] - e[4]
                print("      busy by op: " + ", ".join(
                    f"{k} {v * 1e3:.2f}" for k, v in by.most_common(8)), flush=True)
                for gap, late, a, b in sorted(gaps, key=lambda g: -g[0])[:6]:
                    print(f"      idle {gap * 1e6:7.0f} us (host {late * 1e6:5.0f}) "
                          f"{a[0]}:{a[1]} -> {b[0]}:{b[1]} [{b[2] or ''} {b[3]}]", flush=True)


def main() -> None:
    rng = np.random.default_rng(0)
    xv = cp.asarray((rng.standard_normal((T, B, U)) * 0.1).astype(np.float32))
    for ndev in counts:
        m = SCHEDULES[SCHEDULE]([f"/gpu:{k}" for k in range(ndev)], 8, B, U, U, 32)
        G.GpuDevice.get(0).activate()
        m.step(xv)
        gpus = [G.GpuDevice.get(d) for d in range(ndev)]
        for g in gpus:
            g.activate()
            cp.cuda.Device(g.index).synchronize()
        t0 = time.perf_counter()
        for _ in range(WARM):
            m.step(xv)
        for g in gpus:
            cp.cuda.Device(g.index).synchronize()
        untraced = (time.perf_counter() - t0) / WARM
        print(f"devices={ndev}: untraced steps {untraced * 1e3:.1f} ms a step "
              f"(back to back, synchronised after {WARM})", flush=True)
        scopes = [g.begin_trace() for g in gpus]
        t0 = time.perf_counter()
        m.step(xv)
        wall = time.perf_counter() - t0
        per_gpu = {g.index: g.end_trace(s) for g, s in zip(gpus, scopes)}
        report(ndev, per_gpu, wall)
        m.close()
        del m
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
