"""cProfile of one run: chain K=1024 pi=32 (2 GPUs), model_parallel 2 GPUs, LSTM dynamic and static
b512 (`lstm`; `lstmN` for batch N; `mpN`: model_parallel at batch N): `python -m bench.probes.host_profile [chain] [mp] [lstm64] ...`."""
import cProfile, pstats, io, sys, time, gc
import numpy as np
import cupy
import dcf
from bench import parallel_iterations as P
from bench.model_parallel import MultiLayerLSTM
from bench.static_vs_dynamic_gpu import GpuLstm
from bench.lstm_swap import _input

def prof(name, fn, n=3):
    for _ in range(2): fn()
    cupy.cuda.runtime.deviceSynchronize()
    gc.collect(); gc.disable()
    t = time.perf_counter(); fn(); wall = time.perf_counter() - t
    pr = cProfile.Profile(); pr.enable(); t = time.perf_counter(); fn(); pw = time.perf_counter() - t; pr.disable()
    gc.enable()
    s = io.StringIO(); st = pstats.Stats(pr, stream=s); st.sort_stats("tottime").print_stats(40)
    print(f"==== {name}: wall {wall*1e3:.1f} ms, profiled {pw*1e3:.1f} ms", flush=True)
    print(s.getvalue(), flush=True)

which = sys.argv[1:] or ["chain", "mp", "lstm"]
if "chain" in which and cupy.cuda.runtime.getDeviceCount() >= 2:
    g, out, Ws, s0 = P.build(["/gpu:0", "/gpu:1"], 2, 1024, 200, 32)
    with dcf.Session(g) as sess:
        prof("chain K1024 pi32 200 it", lambda: sess.run(out))
for arg in which:
    if not arg.startswith("mp") or cupy.cuda.runtime.getDeviceCount() < 2:
        continue
    b = int(arg[2:] or 256)    # a small batch leaves the host's own time
    m = MultiLayerLSTM(["/gpu:0", "/gpu:1"], 8, b, 1024, 1024, 32)
    xv = cupy.asarray((np.random.default_rng(0).standard_normal((100, b, 1024)) * 0.1).astype(np.float32))
    prof(f"model_parallel 2 GPUs b{b}", lambda: m.step(xv))
    m.close()
for arg in which:
    if not arg.startswith("lstm"):
        continue
    b = int(arg[4:] or 512)
    xv = _input(200, b, 512, False)
    for k in ("dynamic", "static"):
        m = GpuLstm(k, 200, b, 512, 512)
        prof(f"lstm {k} b{b}", lambda: m.step(xv))
        m.close()
