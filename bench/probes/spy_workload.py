"""Timed steps of one GPU workload for an outside sampling profiler (py-spy; cProfile
inflates every Python call):

    py-spy record -r 1000 -f raw -o OUT.txt -- python -m bench.probes.spy_workload KIND SECONDS
    python -m bench.probes.spy_summary OUT.txt

KIND: mp1_B / mp2_B (model_parallel's 8-layer LSTM on 1 or 2 GPUs at batch B; wf1_B / wf2_B
its wavefront schedule, wf1x2_B that schedule's two groups of layers on GPU 0), dyn_B /
sta_B (static_vs_dynamic's dynamic or unrolled LSTM at batch B; mp's
parallel_iterations DCF_PROBE_PI, default 32), chainG_PI (parallel_iterations'
chain, 8 layers of 1024 over G GPUs -- DCF_PROBE_LAYERS layers, if set --, 200 iterations a run,
parallel_iterations PI). Two warm-up steps, then
steps for SECONDS inside `timed()`, which spy_summary keeps."""
import os, sys, time
import numpy as np
from bench import gpu_common as G
from dcf import gpu_devices


def build(kind):
    name, b = kind.split("_")
    b = int(b)
    if name.startswith("chain"):
        import dcf
        from bench.parallel_iterations import build as chain
        k = int(os.environ.get("DCF_PROBE_UNITS", 1024))    # small: stand-in GPUs on a CPU
        layers = int(os.environ.get("DCF_PROBE_LAYERS", 8))
        g, out, _, _ = chain(G.devices(int(name[5:]), False), layers, k, 200, b)
        sess = dcf.Session(g)

        class Chain:
            def step(self, _):
                sess.run(out)

            def close(self):
                sess.close()
        return Chain(), None
    if name.startswith(("mp", "wf")):
        from bench.model_parallel import MultiLayerLSTM, WavefrontLSTM
        u = int(os.environ.get("DCF_PROBE_UNITS", 1024))    # small: stand-in GPUs on a CPU
        pi = int(os.environ.get("DCF_PROBE_PI", 32))      # parallel_iterations
        devs = (["/gpu:0", "/device:GPU:0"] if name[2:] == "1x2" else
                ["/gpu:0", "/gpu:1"][:int(name[2:])])
        m = (MultiLayerLSTM if name.startswith("mp") else WavefrontLSTM)(devs, 8, b, u, u, pi)
        G.gpu_device(0).activate()
        xv = gpu_devices.backend().asarray(
            (np.random.default_rng(0).standard_normal((100, b, u)) * 0.1).astype(np.float32))
        return m, xv
    from bench.static_vs_dynamic_gpu import GpuLstm
    from bench.lstm_swap import _input
    units = int(os.environ.get("DCF_PROBE_UNITS", 512))   # small: stand-in GPUs on a CPU
    return GpuLstm({"dyn": "dynamic", "sta": "static"}[name], 200, b, units, units), \
        _input(200, b, units, False)


def timed(m, xv, secs):
    t_end, ts = time.perf_counter() + secs, []
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        m.step(xv)
        ts.append(time.perf_counter() - t0)
    return sorted(ts)


if __name__ == "__main__":
    kind, secs = sys.argv[1], float(sys.argv[2])
    m, xv = build(kind)
    m.step(xv); m.step(xv); G.sync_all()
    ts = timed(m, xv, secs)
    print(f"{kind}: {len(ts)} steps, median {1e3 * ts[len(ts) // 2]:.1f} ms, min {1e3 * ts[0]:.1f}",
          flush=True)
    m.close()
