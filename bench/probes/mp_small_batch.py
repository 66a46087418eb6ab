"""model_parallel at small batches, where each kernel's GPU work is small:
`python -m bench.probes.mp_small_batch 8,64,256 [1,2]` (batches, device counts)."""
import sys, time, gc, statistics
import numpy as np, cupy
from dcf.actors import gpu as G
from bench.model_parallel import MultiLayerLSTM
for B in [int(b) for b in sys.argv[1].split(",")]:
    xv = cupy.asarray((np.random.default_rng(0).standard_normal((100, B, 1024)) * 0.1).astype(np.float32))
    for ndev in [int(d) for d in (sys.argv[2] if len(sys.argv) > 2 else "1,2").split(",")]:
        m = MultiLayerLSTM([f"/gpu:{k}" for k in range(ndev)], 8, B, 1024, 1024, 32)
        G.GpuDevice.get(0).activate()
        m.step(xv); m.step(xv)
        gc.collect(); gc.disable()
        w = []
        for _ in range(5):
            t0 = time.perf_counter(); m.step(xv); w.append(1e3 * (time.perf_counter() - t0))
        gc.enable()
        print(f"B={B} devices={ndev}: step ms {statistics.median(w):.1f} (min {min(w):.1f}, max {max(w):.1f})", flush=True)
        m.close(); del m
        cupy.get_default_memory_pool().free_all_blocks()
