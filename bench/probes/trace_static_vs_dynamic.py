"""Device time of the dynamic and the static LSTM training step (b512, 512 units, seq 200):
kernel durations from dcf's own trace (CUDA events around each kernel)."""
import collections, time, gc
import dcf
from bench.static_vs_dynamic_gpu import GpuLstm
from bench.lstm_swap import _input
from bench import gpu_common as G
L = 200
xv = _input(L, 512, 512, False)
for kind in ("dynamic", "static", "dynamic", "static"):
    m = GpuLstm(kind, L, 512, 512, 512)
    for _ in range(2): m.step(xv)
    G.sync_all(); gc.disable()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter(); m.step(xv); ts.append(time.perf_counter() - t0)
    gc.enable()
    md = dcf.RunMetadata()
    m.sess.run([m.loss, m.train], {m.x: xv}, options=dcf.RunOptions(trace=True), run_metadata=md)
    ev = md.trace if hasattr(md, "trace") else None
    comp = [e for e in (ev or []) if len(e) > 7 and e[7] == "compute"]
    if not comp:
        print(kind, "no compute events; trace sample:", (ev or [])[:2]); m.close(); continue
    busy = sum(e[6] - e[5] for e in comp)
    span = max(e[6] for e in comp) - min(e[5] for e in comp)
    c = collections.Counter(); d = collections.Counter()
    for e in comp: c[e[2]] += 1; d[e[2]] += e[6] - e[5]
    print(f"{kind}: wall {sorted(ts)[2]*1e3:.1f} ms/step; traced {len(comp)} kernels, device busy {busy*1e3:.1f} ms, span {span*1e3:.1f} ms", flush=True)
    for k, v in d.most_common(10): print(f"   {k:28s} n={c[k]:5d} {v*1e3:8.2f} ms  {v/c[k]*1e6:7.1f} us each")
    m.close()
