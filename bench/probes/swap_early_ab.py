"""lstm_swap's model (512 units, batch 512) at its calibrated budget: the swap overhead
(paired, the GPUs synchronised around each step) with early fetches (dcf/fused.py,
EARLY_FETCH) on and off -- four models (early on/off x swap on/off) alternating in one
process, so that the host's speed falls on all four alike.

    python -m bench.probes.swap_early_ab LENGTHS ROUNDS      # e.g. 400,500 10
"""
import sys
import time

import numpy as np

import dcf
import dcf.fused as F
from bench import gpu_common as G
from bench.harness import host_python_seconds
from bench.lstm_swap import DcfLSTM, _input, calibrate_budget


def main() -> None:
    lengths = [int(v) for v in sys.argv[1].split(",")]
    rounds = int(sys.argv[2])
    B = U = D = 512
    budget = calibrate_budget(B, U, D, 32, 530, 100)["budget"]
    cfg = dcf.SessionConfig(gpu_memory_limit=budget, swap_threshold=0.7)
    models = {(early, swap): DcfLSTM("/gpu:0", B, U, D, swap, 32, cfg)
              for early in (True, False) for swap in (False, True)}
    print(f"host: python loop {host_python_seconds().median * 1e6:.1f} us", flush=True)
    try:
        for L in lengths:
            xv = _input(L, B, D, False)
            for (early, _), m in models.items():
                F.EARLY_FETCH = early      # read when the step's plan is built (its first run)
                m.step(xv)
            ts: dict = {k: [] for k in models}
            for r in range(rounds):
                for k in (list(models) if r % 2 == 0 else list(reversed(list(models)))):
                    G.sync_all()
                    t0 = time.perf_counter()
                    models[k].step(xv)
                    G.sync_all()
                    ts[k].append((time.perf_counter() - t0) / L * 1e3)
            for early in (True, False):
                a, b = ts[(early, True)], ts[(early, False)]
                pair = float(np.median([x / y for x, y in zip(a, b)]))
                print(f"L={L} early={early}: ms/iter noswap {np.median(b):.4f} swap "
                      f"{np.median(a):.4f}; paired overhead {100 * (pair - 1):+.2f}%", flush=True)
            del xv
    finally:
        F.EARLY_FETCH = True
        for m in models.values():
            m.close()
    print(f"host: python loop {host_python_seconds().median * 1e6:.1f} us", flush=True)


if __name__ == "__main__":
    main()
