"""lstm_swap's model at length L under its calibrated budget, no swap and swap each timed
in a block of its own steps (after one untimed step) and then interleaved step by step as
the bench script pairs them, in one process (one memory pool): whether a step pays for
the other model's cached blocks near the budget. `python -m bench.probes.swap_alone L
STEPS` prints ms per loop iteration of each and the pool's bytes held after each
model's step; `... L STEPS swap` (or `noswap`) builds and times that model alone, for
runs in separate processes (bench/NOTES.md, "GPU, session 14")."""
import gc, os, statistics, sys, time

import dcf
from bench import gpu_common as G
from bench.lstm_swap import DcfLSTM, _input, calibrate_budget


def main() -> None:
    L, n = int(sys.argv[1]), int(sys.argv[2])
    B = U = D = int(os.environ.get("DCF_PROBE_UNITS", 512))   # small: stand-in GPUs
    budget = calibrate_budget(B, U, D, 32, 530, 100 if B >= 256 else 20)["budget"]
    cfg = dcf.SessionConfig(gpu_memory_limit=budget, swap_threshold=0.7)
    only = sys.argv[3] if len(sys.argv) > 3 else None
    models = {k: DcfLSTM("/gpu:0", B, U, D, k == "swap", 32, cfg)
              for k in ("noswap", "swap") if only in (None, k)}
    gpu = G.gpu_device(0)
    xv = _input(L, B, D, False)

    keys = ("swap_outs", "swap_ins", "pinned_allocs", "throttled", "evicted", "swap_batches")
    moved: dict = {}

    def timed(m) -> float:
        gc.collect()
        gc.disable()
        s0 = dict(gpu.stats)
        t0 = time.perf_counter()
        m.step(xv)
        t = (time.perf_counter() - t0) / L * 1e3
        gc.enable()
        moved.setdefault(id(m), []).append(tuple(gpu.stats[k] - s0.get(k, 0) for k in keys))
        return t

    held = {}
    for name, m in models.items():           # each alone: a block of its own steps
        m.step(xv)
        ts = [timed(m) for _ in range(n)]
        held[name] = gpu.pool.total_bytes()
        print(f"L={L} alone {name}: {statistics.median(ts):.4f} ms/iter "
              f"(min {min(ts):.4f}); pool holds {held[name] / 2**20:.0f} MiB", flush=True)
        print(f"    per step ({', '.join(keys)}): {moved.get(id(m), [])}", flush=True)
    if only is not None:
        for m in models.values():
            m.close()
        return
    inter: dict = {k: [] for k in models}
    for r in range(n):                       # interleaved, as the bench script pairs them
        for name in (list(models) if r % 2 == 0 else list(models)[::-1]):
            inter[name].append(timed(models[name]))
    a, b = (statistics.median(inter[k]) for k in models)
    print(f"L={L} interleaved: noswap {a:.4f} swap {b:.4f} ms/iter ({100 * (b / a - 1):+.1f} %); "
          f"budget {budget / 2**20:.0f} MiB", flush=True)
    for m in models.values():
        m.close()


if __name__ == "__main__":
    main()
