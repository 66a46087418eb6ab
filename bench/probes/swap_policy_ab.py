"""lstm_swap's model (512 units, batch 512) at a few lengths under its calibrated budget:
no swap, and swap under the current policy and under a variant set by a module constant
of dcf/actors/gpu_swap.py or dcf/actors/gpu.py (set on the module whose code reads it),
alternating in one process (the swapping model is the same one; the swapper reads its
constants as it acts):

    python -m bench.probes.swap_policy_ab NAME=VALUE LENGTHS ROUNDS

e.g. `SWAP_MIN_BYTES=3145728 400,500 6`, or several constants at once joined by `+`
(`PUMP_BATCH=8+PREFETCH_BATCH=16`). Prints per length the median ms per loop
iteration of each, the paired overheads over no swap, and values and MiB moved out per
step (bench/NOTES.md, "GPU, session 12")."""
import os, sys, time

import numpy as np

import dcf
import dcf.actors.gpu as gdev
import dcf.actors.gpu_swap as gswap
from bench import gpu_common as G
from bench.lstm_swap import DcfLSTM, _input, calibrate_budget


def _module_of(name):
    """The module whose code reads constant `name`: the swapper's, else the device's."""
    return gswap if hasattr(gswap, name) else gdev


def main() -> None:
    pairs = [p.split("=") for p in sys.argv[1].split("+")]   # NAME=VALUE[+NAME=VALUE...]
    lengths = [int(v) for v in sys.argv[2].split(",")]
    rounds = int(sys.argv[3])
    name = "+".join(n for n, _ in pairs)
    base_value = tuple(getattr(_module_of(n), n) for n, _ in pairs)
    variant = tuple(type(b)(float(v)) if not isinstance(b, int) else int(v)
                    for b, (_, v) in zip(base_value, pairs))

    def set_constants(values):               # every constant of the variant at once
        for (n, _), v in zip(pairs, values):
            setattr(_module_of(n), n, v)
    B = U = D = int(os.environ.get("DCF_PROBE_UNITS", 512))   # small: stand-in GPUs
    budget = calibrate_budget(B, U, D, 32, 530, 100 if B >= 256 else 20)["budget"]
    cfg = dcf.SessionConfig(gpu_memory_limit=budget, swap_threshold=0.7)
    plain = DcfLSTM("/gpu:0", B, U, D, False, 32, cfg)
    swap = DcfLSTM("/gpu:0", B, U, D, True, 32, cfg)
    gpu = G.gpu_device(0)
    print(f"budget {budget / 2**20:.0f} MiB; {name}: {base_value} vs {variant}", flush=True)
    try:
        for L in lengths:
            xv = _input(L, B, D, False)
            runs = {"noswap": (plain, base_value), "swap": (swap, base_value),
                    "variant": (swap, variant)}
            for m, v in runs.values():
                set_constants(v)
                m.step(xv)
            ts: dict = {k: [] for k in runs}
            moved: dict = {k: [0, 0, 0, 0] for k in runs}
            for r in range(rounds):
                order = list(runs) if r % 2 == 0 else list(reversed(list(runs)))
                for k in order:
                    m, v = runs[k]
                    set_constants(v)
                    before = dict(gpu.stats)
                    G.sync_all()
                    t0 = time.perf_counter()
                    m.step(xv)
                    G.sync_all()
                    ts[k].append((time.perf_counter() - t0) / L * 1e3)
                    moved[k][0] += gpu.stats["swap_outs"] - before.get("swap_outs", 0)
                    moved[k][1] += gpu.stats["swap_out_bytes"] - before.get("swap_out_bytes", 0)
                    moved[k][2] += gpu.stats["swap_batches"] - before.get("swap_batches", 0)
                    moved[k][3] += gpu.stats["swap_kept"] - before.get("swap_kept", 0)
            set_constants(base_value)
            med = {k: float(np.median(v)) for k, v in ts.items()}
            pair = {k: float(np.median([a / b for a, b in zip(ts[k], ts["noswap"])]))
                    for k in ("swap", "variant")}
            print(f"L={L}: ms/iter noswap {med['noswap']:.4f} swap {med['swap']:.4f} "
                  f"variant {med['variant']:.4f}; paired overhead swap {100 * (pair['swap'] - 1):+.1f}% "
                  f"variant {100 * (pair['variant'] - 1):+.1f}%; moved per step: swap "
                  f"{moved['swap'][0] / rounds:.0f} values {moved['swap'][1] / rounds / 2**20:.0f} MiB, "
                  f"variant {moved['variant'][0] / rounds:.0f} values "
                  f"{moved['variant'][1] / rounds / 2**20:.0f} MiB; copy batches (both ways) "
                  f"{moved['swap'][2] / rounds:.0f} / {moved['variant'][2] / rounds:.0f}, "
                  f"kept (memory shared) {moved['swap'][3] / rounds:.0f} / "
                  f"{moved['variant'][3] / rounds:.0f}", flush=True)
            del xv
    finally:
        plain.close()
        swap.close()


if __name__ == "__main__":
    main()
