"""model_parallel on 2 GPUs at several parallel_iterations: step ms, the host thread's CPU ms per step and the
GPU events it waited for: `python -m bench.probes.mp_parallel_iterations 2,4,8,16,32`."""
import sys, time, gc, statistics
import numpy as np, cupy
from dcf.actors import gpu as G
from bench.model_parallel import MultiLayerLSTM
xv = cupy.asarray((np.random.default_rng(0).standard_normal((100, 256, 1024)) * 0.1).astype(np.float32))
for pi in [int(p) for p in sys.argv[1].split(",")]:
    m = MultiLayerLSTM(["/gpu:0", "/gpu:1"], 8, 256, 1024, 1024, pi)
    G.GpuDevice.get(0).activate()
    m.step(xv); m.step(xv)
    gc.collect(); gc.disable()
    w, c = [], []
    for _ in range(4):
        t0, c0 = time.perf_counter(), time.thread_time(); m.step(xv)
        w.append(1e3 * (time.perf_counter() - t0)); c.append(1e3 * (time.thread_time() - c0))
    gc.enable()
    fa = [a for k, a in m.sess._async._actors.items() if k.startswith("<fused>")]
    hw = fa[0].host_waits if fa else None
    print(f"pi={pi}: step ms {statistics.median(w):.1f} (min {min(w):.1f}) host cpu ms {statistics.median(c):.1f} host waits {hw[0] if hw else None} / {1e3*hw[1] if hw else 0:.1f} ms", flush=True)
    m.close(); del m
    cupy.get_default_memory_pool().free_all_blocks()
