"""static_vs_dynamic's LSTM step on /gpu:0 at given batches, dynamic and static interleaved in one process:
ms per step and the paired ratio: `python -m bench.probes.svd_pair LABEL 64,512 [MODE]`.
MODE changes the compiled loops for this process: `nomark` (no GPU marks bounding the work in
flight), `markN` (N marks per parallel_iterations window; default 2, 4 before session 18),
`noyield` (no deadline yields), `yieldMS` (a yield every MS ms; default 2), `s17` (session
17's settings: 4 marks, 2 ms) -- what each costs the dynamic step
(bench/NOTES.md, "GPU, sessions 17-18")."""
import sys, time, gc, statistics
import dcf.frame_compiler as fc
mode = sys.argv[3] if len(sys.argv) > 3 else "base"
if mode == "nomark":
    fc._marker = lambda gpus: (lambda: [])
elif mode.startswith("mark"):
    fc.MARKS_PER_WINDOW = int(mode[4:])
elif mode == "noyield":
    fc._YIELD_S = 1e9
elif mode.startswith("yield"):      # yieldMS: hand the event loop back every MS ms
    fc._YIELD_S = float(mode[5:]) / 1e3
elif mode == "s17":                 # session 17's settings: 4 marks a window, 2 ms
    fc.MARKS_PER_WINDOW, fc._YIELD_S = 4, 0.002
from bench.static_vs_dynamic_gpu import GpuLstm
from bench.lstm_swap import _input
from bench import gpu_common as G
label = sys.argv[1]
for b in [int(x) for x in sys.argv[2].split(",")]:
    xv = _input(200, b, 512, False)
    ms = {k: GpuLstm(k, 200, b, 512, 512) for k in ("dynamic", "static")}
    for m in ms.values():
        m.step(xv); m.step(xv)
    G.sync_all(); gc.collect(); gc.disable()
    t = {"dynamic": [], "static": []}
    order = ["dynamic", "static", "static", "dynamic"] * 3
    for k in order:
        t0 = time.perf_counter(); ms[k].step(xv); t[k].append(1e3 * (time.perf_counter() - t0))
    gc.enable()
    pr = [d / s for d, s in zip(t["dynamic"], t["static"])]
    print(f"{label} {mode} b{b}: dynamic {statistics.median(t['dynamic']):.2f} static {statistics.median(t['static']):.2f} ms; "
          f"ratio of medians {statistics.median(t['dynamic'])/statistics.median(t['static']):.3f} paired median {statistics.median(pr):.3f} "
          f"min d/s {min(t['dynamic']):.2f}/{min(t['static']):.2f}", flush=True)
    for m in ms.values(): m.close()
    del ms; G.release_device_memory()
