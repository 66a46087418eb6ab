"""Where a swapping LSTM step's extra time goes: lstm_swap's model at length L under its
calibrated budget, no swap and swap alternating in one process, with the swapper's
methods, the device's allocation retries (throttling), its event polling and the garbage
collector timed in place (inclusive host us per step; ~0.3 us of timer per call):

    python -m bench.probes.swap_costs L ROUNDS

Prints per model the median step, and per step the calls and host ms of each timed
function, and the polls made while the host waited for the GPU (bench/NOTES.md, "GPU,
session 12")."""
import collections, os, sys, time

import numpy as np

import dcf
import dcf.actors.gpu as gmod
import dcf.actors.gpu_swap as gswap
from bench import gpu_common as G
from bench.lstm_swap import DcfLSTM, _input, calibrate_budget

_T: collections.Counter = collections.Counter()
_N: collections.Counter = collections.Counter()


def _timed_call(f, label):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            _T[label] += time.perf_counter() - t0
            _N[label] += 1
    return wrapper


for _name in ("tick", "pump", "_next", "collect", "pop", "_fetch", "_prefetch", "make_room"):
    setattr(gswap._Swapper, _name, _timed_call(getattr(gswap._Swapper, _name), f"_Swapper.{_name}"))
for _name in ("relieve", "collect", "record", "pinned_buffer", "copy_parts", "used_bytes"):
    setattr(gmod.GpuDevice, _name, _timed_call(getattr(gmod.GpuDevice, _name),
                                               f"GpuDevice.{_name}"))


_gc_t0 = [0.0]


def _gc_timer(phase, info):           # the collector's own time, as a timed "function"
    if phase == "start":
        _gc_t0[0] = time.perf_counter()
    else:
        _T[f"gc (gen {info['generation']})"] += time.perf_counter() - _gc_t0[0]
        _N[f"gc (gen {info['generation']})"] += 1


def main() -> None:
    import gc
    gc.callbacks.append(_gc_timer)
    L, rounds = int(sys.argv[1]), int(sys.argv[2])
    B = U = D = int(os.environ.get("DCF_PROBE_UNITS", 512))   # small: stand-in GPUs
    budget = calibrate_budget(B, U, D, 32, 530, 100 if B >= 256 else 20)["budget"]
    cfg = dcf.SessionConfig(gpu_memory_limit=budget, swap_threshold=0.7)
    models = {"noswap": DcfLSTM("/gpu:0", B, U, D, False, 32, cfg),
              "swap": DcfLSTM("/gpu:0", B, U, D, True, 32, cfg)}
    xv = _input(L, B, D, B < 256)
    gpu = G.gpu_device(0)
    gpu._memcpy = _timed_call(gpu._memcpy, "cudaMemcpyAsync")
    try:
        for m in models.values():
            m.step(xv)
        ts: dict = {k: [] for k in models}
        per: dict = {k: (collections.Counter(), collections.Counter()) for k in models}
        for r in range(rounds):
            for k in (models if r % 2 == 0 else reversed(list(models))):
                _T.clear(); _N.clear()
                G.sync_all()
                c0, t0 = time.process_time(), time.perf_counter()
                models[k].step(xv)
                G.sync_all()
                ts[k].append((time.perf_counter() - t0, time.process_time() - c0))
                per[k][0].update(_T); per[k][1].update(_N)
        for k in models:
            wall = np.median([w for w, _ in ts[k]]) * 1e3
            cpu = np.median([c for _, c in ts[k]]) * 1e3
            print(f"{k}: step {wall:.2f} ms (host CPU {cpu:.2f} ms), {wall / L * 1e3:.1f} us/iter; "
                  f"swap_outs {gpu.stats['swap_outs']}, copy batches {gpu.stats['swap_batches']}, "
                  f"kept {gpu.stats['swap_kept']} (totals)", flush=True)
            T, N = per[k]
            for label, t in T.most_common():
                print(f"    {label:22s} {N[label] / rounds:8.0f} calls {t / rounds * 1e3:8.2f} ms",
                      flush=True)
    finally:
        for m in models.values():
            m.close()


if __name__ == "__main__":
    main()
