"""Where each GPU's time goes in model_parallel's 2-GPU step: an event on each GPU's compute
stream at every loop iteration (the frame compiler's in-flight marks, made every iteration
and timed), so that the GPU time between consecutive marks is that GPU's time per
iteration, gaps included; the host's clock at each mark shows how far ahead it was.
Prints, per loop (forward, backward) and GPU: the loop's span on the GPU, the median and
sum of per-iteration times, and the host's lead. `python -m bench.probes.mp_gpu_timeline
[DEVICES [on|off]]` (devices 1,2 by default; off: the gates' h not written into the next
concatenation's buffer, dcf/ops/concat_slots.py). Each loop's iterations over 1 ms are
listed too (index: ms), where the held gradient terms' stacked GEMMs or a wait for the
other GPU lengthen them. With DCF_PROBE_STEADY=N, N more steps run back to back as a
training loop runs them (no synchronisation between them: the next step's forward is
enqueued while the GPUs still run the backward) and each GPU's loops are listed in order
with their spans and the GPU time from one loop's last mark to the next one's first
("+gap"), which shows where the GPUs wait at the boundaries; the "host" lines give the
same from the host's side (when each loop's first mark was enqueued, ms after the first
run was called, the host span and the host time to the next loop's first mark).
DCF_PROBE_SCHEDULE=wavefront times the wavefront schedule instead (its prologue and
epilogue run outside the loops: in the gaps)."""
import os, statistics, sys, time, gc
import numpy as np
import cupy
from dcf import frame_compiler as FC
from bench.model_parallel import SCHEDULES
from dcf.actors import gpu as G

FC.MARKS_PER_WINDOW = 1 << 30          # stride 1: a mark every iteration (the bound stays pi)
log: list = []
step_no = [0]           # the step the marks belong to (DCF_PROBE_STEADY)


def timed_marker(gpus):
    key = object()          # one per loop (frame) the compiler builds a marker for

    def mark():
        evs = []
        t = time.perf_counter()
        for g in gpus:
            g.activate()
            ev = cupy.cuda.Event(disable_timing=False)
            ev.record(g.compute)
            evs.append(ev)
            log.append((key, g.index, t, ev, step_no[0]))
        return evs
    return mark


FC._marker = timed_marker
if len(sys.argv) > 2:
    import dcf.fusion.matmul_gates as MG
    MG.H_INTO_CONCAT = sys.argv[2] != "off"
counts = [int(d) for d in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 2]
U = int(os.environ.get("DCF_PROBE_UNITS", 1024))     # small: stand-in GPUs on a CPU
B = int(os.environ.get("DCF_PROBE_BATCH", 256))
SCHEDULE = os.environ.get("DCF_PROBE_SCHEDULE", "layers")     # or wavefront
xv = cupy.asarray((np.random.default_rng(0).standard_normal((100, B, U)) * 0.1).astype(np.float32))
for ndev in counts:
    m = SCHEDULES[SCHEDULE]([f"/gpu:{k}" for k in range(ndev)], 8, B, U, U, 32)
    G.GpuDevice.get(0).activate()
    m.step(xv); m.step(xv)
    for d in range(ndev):
        cupy.cuda.Device(d).synchronize()
    log.clear(); gc.disable()
    t0 = time.perf_counter(); m.step(xv); wall = time.perf_counter() - t0
    gc.enable()
    for d in range(ndev):
        cupy.cuda.Device(d).synchronize()
    loops: dict = {}
    for key, gi, t, ev, _ in log:
        loops.setdefault(key, {}).setdefault(gi, []).append((t, ev))
    print(f"devices={ndev}: step {wall * 1e3:.1f} ms, {len(loops)} loops", flush=True)
    first = None
    for li, (key, per) in enumerate(loops.items()):
        for gi, marks in sorted(per.items()):
            evs = [e for _, e in marks]
            ts = [t for t, _ in marks]
            with cupy.cuda.Device(gi):
                dts = [cupy.cuda.get_elapsed_time(a, b) for a, b in zip(evs, evs[1:])]
                if first is None:
                    first = (gi, evs[0], ts[0])
            span = sum(dts)
            host_span = (ts[-1] - ts[0]) * 1e3
            print(f"  loop {li} gpu {gi}: {len(marks)} marks, GPU span {span:.1f} ms "
                  f"(per iteration median {statistics.median(dts):.3f}, min {min(dts):.3f}, "
                  f"max {max(dts):.3f} ms); host span {host_span:.1f} ms", flush=True)
            long = [f"{i}: {d:.2f}" for i, d in enumerate(dts) if d > 1.0]
            print(f"    iterations over 1 ms ({len(long)}, {sum(d for d in dts if d > 1.0):.1f}"
                  f" ms): " + ", ".join(long[:24]) + (", ..." if len(long) > 24 else ""),
                  flush=True)
    steady = int(os.environ.get("DCF_PROBE_STEADY", 0))
    if steady:
        log.clear(); gc.disable()
        t0 = time.perf_counter()
        starts = []
        for s in range(steady):
            step_no[0] = s
            starts.append(time.perf_counter())
            m.step(xv)
        starts.append(time.perf_counter())
        wall = (time.perf_counter() - t0) / steady
        gc.enable()
        for d in range(ndev):
            cupy.cuda.Device(d).synchronize()
        keys = list(dict.fromkeys(k for k, *_ in log))      # forward first, then backward
        print(f"  steady: {steady} steps back to back, {wall * 1e3:.1f} ms a step (host); "
              "runs called at " + ", ".join(f"{(t - t0) * 1e3:.1f}" for t in starts) + " ms",
              flush=True)
        for gi in range(ndev):
            segs: list = []         # [(step, loop), first event, last event]
            for k, g, t, ev, s in log:
                if g != gi:
                    continue
                if segs and segs[-1][0] == (s, keys.index(k)):
                    segs[-1][2] = ev
                    segs[-1][4] = t
                else:
                    segs.append([(s, keys.index(k)), ev, ev, t, t])
            parts, hparts = [], []
            with cupy.cuda.Device(gi):
                for i, ((s, li), first, last, t_first, t_last) in enumerate(segs):
                    name = f"s{s} {('fwd', 'bwd')[li] if li < 2 else li}"
                    span = cupy.cuda.get_elapsed_time(first, last)
                    gap = (f" +{cupy.cuda.get_elapsed_time(last, segs[i + 1][1]):.1f}"
                           if i + 1 < len(segs) else "")
                    parts.append(f"{name} {span:.1f}{gap}")
                    # the same from the host's side: when the marks were enqueued
                    hgap = (f" +{(segs[i + 1][3] - t_last) * 1e3:.1f}"
                            if i + 1 < len(segs) else "")
                    hparts.append(f"{name} @{(t_first - t0) * 1e3:.1f} "
                                  f"{(t_last - t_first) * 1e3:.1f}{hgap}")
            print(f"  gpu {gi}: " + ", ".join(parts), flush=True)
            print(f"  host {gi}: " + ", ".join(hparts), flush=True)
    m.close(); del m
    cupy.get_default_memory_pool().free_all_blocks()
