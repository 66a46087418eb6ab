"""Host time per kernel call, by op type, of model_parallel's two schedules (layer by layer,
and the wavefront) at a batch small enough that the host paces the step: each op's GPU body
timed around its call (no synchronisation), then a cProfile of one wavefront step.
`python -m bench.probes.wavefront_host [batch] [devices]` (defaults 8 and every GPU, at most
2; devices "1x2": two groups of layers on GPU 0, spelled /gpu:0 and /device:GPU:0, for the host
cost of a 2-GPU step where one GPU is lent)."""
import collections, cProfile, io, pstats, sys, time
import numpy as np
import cupy
from dcf.actors import gpu_actor as A
from bench.model_parallel import MultiLayerLSTM, WavefrontLSTM

spent = collections.Counter()
calls = collections.Counter()
orig = A._kernel_fn


def timed(gpu, name, typ, frame, dev, host, pure, on_device=False):
    f = orig(gpu, name, typ, frame, dev, host, pure, on_device)

    def w(*a):
        t = time.perf_counter()
        try:
            return f(*a)
        finally:
            spent[typ] += time.perf_counter() - t
            calls[typ] += 1
    return w


A._kernel_fn = timed
B = int(sys.argv[1]) if len(sys.argv) > 1 else 8
arg = sys.argv[2] if len(sys.argv) > 2 else str(min(2, cupy.cuda.runtime.getDeviceCount()))
devs = ["/gpu:0", "/device:GPU:0"] if arg == "1x2" else [f"/gpu:{k}" for k in range(int(arg))]
T = 100
xv = cupy.asarray((np.random.default_rng(0).standard_normal((T, B, 1024)) * 0.1).astype(np.float32))
for cls in (MultiLayerLSTM, WavefrontLSTM):
    m = cls(devs, 8, B, 1024, 1024, 32)
    for _ in range(3):
        m.step(xv)
    cupy.cuda.runtime.deviceSynchronize()
    spent.clear(); calls.clear()
    t = time.perf_counter()
    for _ in range(3):
        m.step(xv)
    wall = (time.perf_counter() - t) / 3
    tot = sum(spent.values()) / 3
    print(f"== {cls.__name__} on {devs}, batch {B}: {wall * 1e3:.1f} ms a step, kernels' host time "
          f"{tot * 1e3:.1f} ms, {sum(calls.values()) / 3 / T:.1f} calls per time step")
    for typ, s in spent.most_common(14):
        print(f"   {typ:24s} {s / 3 * 1e3:7.2f} ms  {calls[typ] / 3 / T:5.2f} calls/step  "
              f"{s / calls[typ] * 1e6:6.1f} us/call")
    if cls is WavefrontLSTM:
        pr = cProfile.Profile()
        pr.enable()
        m.step(xv)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue()[-6000:])
    m.close()
