"""Where a fused GPU step's host time goes: per step of a spy_workload KIND (model_parallel's
mp1_B / mp2_B, ...), its wall ms, the host's time until the whole step is enqueued (the
compiled root's generator: `enq`), the ms it waited for GPU events inside the step (loop
marks, values the host reads: `w`) and the ms it waited for the fetch copies after (`f`) --
with early fetches (dcf/fused.py, EARLY_FETCH) on and off, a model each.

    python -m bench.probes.step_phases KINDS [STEPS]      # e.g. mp2_256,mp1_256 8
"""
import sys
import time

import dcf.fused as F
from dcf.actors.gpu_actor import end_fetches, start_fetches
from bench.probes.spy_workload import build

_REC: list = []


def _run_sync(self, plan, feeds, check):
    """FusedActor._run_sync with its phases timed (the same steps, in the same order)."""
    t0 = time.perf_counter()
    gen = plan.compiled_root.start(feeds)
    waited = 0.0
    try:
        while True:
            ev = next(gen)
            if ev is not None:
                a = time.perf_counter()
                ev.synchronize()
                waited += time.perf_counter() - a
    except StopIteration as stop:
        results = list(stop.value)
    finally:
        gen.close()
    t1 = time.perf_counter()
    pending = start_fetches(results)
    for _, _, ev, _ in pending:
        ev.synchronize()
    end_fetches(results, pending)
    self._collect()
    _REC.append((t1 - t0, waited, time.perf_counter() - t1))
    return results


def main() -> None:
    kinds = sys.argv[1].split(",")
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    F.FusedActor._run_sync = _run_sync
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
