"""h written into the next step's concatenation buffer (dcf/ops/concat_slots.py) on and
off, in one process: `python -m bench.probes.concat_slots_ab KINDS ROUNDS` with KINDS
as in `spy_workload` (e.g. mp1_256,mp2_256,dyn_64,sta_64). Each kind is built twice
(the planner's switch on, then off), warmed, and timed in alternating rounds of 3 steps
each; prints each kind's median ms per step on and off and their ratio, and for mp1/mp2
the model_parallel speedup with and without."""
import sys, time

import numpy as np

from bench import gpu_common as G
from bench.probes.spy_workload import build
import dcf.fusion.matmul_gates as mg


def main() -> None:
    kinds, rounds = sys.argv[1].split(","), int(sys.argv[2])
    med: dict = {}
    for kind in kinds:
        models = {}
        for on in (True, False):
            mg.H_INTO_CONCAT = on
            m, xv = build(kind)
            m.step(xv); m.step(xv)
            models[on] = (m, xv)
        mg.H_INTO_CONCAT = True
        ts: dict = {True: [], False: []}
        for r in range(rounds):
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                m, xv = models[on]
                G.sync_all()
                t0 = time.perf_counter()
                for _ in range(3):
                    m.step(xv)
                G.sync_all()
                ts[on].append((time.perf_counter() - t0) / 3)
        pairs = [a / b for a, b in zip(ts[True], ts[False])]
        med[kind] = {on: float(np.median(ts[on])) for on in ts}
        print(f"{kind}: on {1e3 * med[kind][True]:.2f} ms, off {1e3 * med[kind][False]:.2f} ms, "
              f"on/off paired median {np.median(pairs):.4f} (rounds {len(pairs)})", flush=True)
        for m, _ in models.values():
            m.close()
        G.release_device_memory()
    for a, b in (("mp1_256", "mp2_256"),):
        if a in med and b in med:
            print(f"model_parallel speedup: on {med[a][True] / med[b][True]:.3f}x, "
                  f"off {med[a][False] / med[b][False]:.3f}x", flush=True)


if __name__ == "__main__":
    main()
