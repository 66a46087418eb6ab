"""A module-level switch of dcf on and off, in one process:

    python -m bench.probes.switch_ab MODULE:NAME KINDS ROUNDS [plan]

e.g. `dcf.ops.cublaslt:ENABLED mp1_256,mp2_256 8` (read at every call: one model per
kind, the switch flipped between rounds) or `dcf.fusion.matmul_gates:H_INTO_CONCAT
mp2_256 8 plan` (read when the graph is planned: each kind built twice, the switch on,
then off). KINDS as in `spy_workload`. Each model is warmed, then timed in alternating
rounds of 3 steps; prints each kind's median ms per step on and off and their paired
ratio, and for mp1/mp2 the model_parallel speedup with and without. (Session 11's
`concat_slots_ab` was this with the concatenation buffers' switch.)"""
import importlib, sys, time

import numpy as np

from bench import gpu_common as G
from bench.probes.spy_workload import build


def main() -> None:
    modname, attr = sys.argv[1].split(":")
    mod = importlib.import_module(modname)
    kinds, rounds = sys.argv[2].split(","), int(sys.argv[3])
    at_plan = len(sys.argv) > 4 and sys.argv[4] == "plan"
    med: dict = {}
    for kind in kinds:
        models = {}
        for on in (True, False):
            setattr(mod, attr, on)
            if at_plan or not models:
                m, xv = build(kind)
            m.step(xv); m.step(xv)
            models[on] = (m, xv)
        ts: dict = {True: [], False: []}
        for r in range(rounds):
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                m, xv = models[on]
                setattr(mod, attr, on)
                G.sync_all()
                t0 = time.perf_counter()
                for _ in range(3):
                    m.step(xv)
                G.sync_all()
                ts[on].append((time.perf_counter() - t0) / 3)
        setattr(mod, attr, True)
        pairs = [a / b for a, b in zip(ts[True], ts[False])]
        med[kind] = {on: float(np.median(ts[on])) for on in ts}
        print(f"{kind}: on {1e3 * med[kind][True]:.2f} ms, off {1e3 * med[kind][False]:.2f} ms, "
              f"on/off paired median {np.median(pairs):.4f} (rounds {len(pairs)})", flush=True)
        for m, _ in {id(m): (m, x) for m, x in models.values()}.values():
            m.close()
        G.release_device_memory()
    for a, b in (("mp1_256", "mp2_256"),):
        if a in med and b in med:
            print(f"model_parallel speedup: on {med[a][True] / med[b][True]:.3f}x, "
                  f"off {med[a][False] / med[b][False]:.3f}x", flush=True)


if __name__ == "__main__":
    main()
