"""static_vs_dynamic's LSTM step at one batch with the dynamic loop's parallel_iterations
(the in-flight window) varied, static and each dynamic variant interleaved in one
process: ms per step and each variant's paired ratio to static.
`python -m bench.probes.svd_window 64 32,64,200`."""
import sys, time, gc, statistics
from bench.static_vs_dynamic_gpu import GpuLstm
from bench.lstm_swap import _input
from bench import gpu_common as G

b, pis = int(sys.argv[1]), [int(p) for p in sys.argv[2].split(",")]
xv = _input(200, b, 512, False)
ms = {"static": GpuLstm("static", 200, b, 512, 512)}
for pi in pis:
    ms[f"pi{pi}"] = GpuLstm("dynamic", 200, b, 512, 512, parallel_iterations=pi)
for m in ms.values():
    m.step(xv); m.step(xv)
G.sync_all(); gc.collect(); gc.disable()
t = {k: [] for k in ms}
for _ in range(6):
    for k, m in ms.items():
        t0 = time.perf_counter(); m.step(xv); t[k].append(1e3 * (time.perf_counter() - t0))
gc.enable()
for k in ms:
    pr = [d / s for d, s in zip(t[k], t["static"])]
    print(f"b{b} {k}: {statistics.median(t[k]):.2f} ms (min {min(t[k]):.2f}), "
          f"paired / static {statistics.median(pr):.3f}", flush=True)
for m in ms.values():
    m.close()
