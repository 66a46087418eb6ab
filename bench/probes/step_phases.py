"""Where a fused GPU step's host time goes: per step of a spy_workload KIND (model_parallel's
mp1_B / mp2_B, ...), its wall ms, the host's time until the whole step is enqueued (the
compiled root's generator: `enq`), the ms it waited for GPU events inside the step (loop
marks, values the host reads: the fused actor's `host_waits`, `w`) and the ms it waited
for the fetch copies after (`f`) -- with early fetches (dcf/fused.py, EARLY_FETCH) on and
off, a model each.

    python -m bench.probes.step_phases KINDS [STEPS]      # e.g. mp2_256,mp1_256 8
"""
import sys
import time

import dcf.fused as F
from bench.probes.spy_workload import build

_REC: list = []
_RUN_SYNC, _START_FETCHES = F.FusedActor._run_sync, F.start_fetches
_FETCH_AT: list = []


def _start_fetches(results):
    _FETCH_AT.append(time.perf_counter())      # the generator has ended: all enqueued
    return _START_FETCHES(results)


def _run_sync(self, plan, feeds, check):
    """FusedActor._run_sync with its phases timed around it."""
    t0 = time.perf_counter()
    results = _RUN_SYNC(self, plan, feeds, check)
    t1 = _FETCH_AT[-1]
    _REC.append((t1 - t0, self.host_waits[1], time.perf_counter() - t1))
    return results


def main() -> None:
    kinds = sys.argv[1].split(",")
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    F.FusedActor._run_sync = _run_sync
    F.start_fetches = _start_fetches              # (looked up in dcf.fused at each call)
    for kind in kinds:
        for on in (True, False):
            F.EARLY_FETCH = on            # read when the step's plan is built
            m, xv = build(kind)
            for _ in range(2):
                m.step(xv)
            _REC.clear()
            walls = []
            for _ in range(steps):
                a = time.perf_counter()
                m.step(xv)
                walls.append(time.perf_counter() - a)
            print(f"{kind} early={on}: " + "  ".join(
                f"{w * 1e3:.0f}[enq {e * 1e3:.0f} w {wt * 1e3:.0f} f {f * 1e3:.1f}]"
                for w, (e, wt, f) in zip(walls, _REC)), flush=True)
            m.close()
            del m


if __name__ == "__main__":
    main()
