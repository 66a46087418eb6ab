"""One of spy_workload's GPU workloads built twice in ONE process, once compiled with
session 17's frame compiler settings and once with the current ones, their steps
alternating (A B B A ...): median ms per step of each and the median of the rounds'
paired ratios (bench/NOTES.md, "GPU, session 18").

    python -m bench.probes.compile_ab KIND ROUNDS        # KIND as in spy_workload: chain2_32, mp2_32

Session 17's settings: four GPU marks per parallel_iterations window, a yield every 2 ms
(the current one too; session 18's calls ran with 5 ms), and no GPU copy of a loop
predicate read as the predicate itself (each variable of a loop over several devices
tested for DEAD every iteration)."""
import gc
import statistics
import sys
import time

import dcf.frame_compiler as fc
from bench import gpu_common as G
from bench.probes.spy_workload import build

_NOW = (fc.MARKS_PER_WINDOW, fc._YIELD_S, fc._only_predicate)


def _settings(old: bool) -> None:
    if old:
        fc.MARKS_PER_WINDOW, fc._YIELD_S, fc._only_predicate = 4, 0.002, lambda n: False
    else:
        fc.MARKS_PER_WINDOW, fc._YIELD_S, fc._only_predicate = _NOW


def main() -> None:
    kind, rounds = sys.argv[1], int(sys.argv[2])
    models = {}
    for name, old in (("s17", True), ("now", False)):
        _settings(old)
        m, xv = build(kind)
        m.step(xv)                       # compiled here, under these settings
        models[name] = (m, xv)
    _settings(False)
    for m, xv in models.values():
        m.step(xv)
    G.sync_all()
    gc.collect()
    gc.disable()
    t: dict = {k: [] for k in models}
    for r in range(rounds):
        for k in (("s17", "now") if r % 2 == 0 else ("now", "s17")):
            m, xv = models[k]
            t0 = time.perf_counter()
            m.step(xv)
            G.sync_all()
            t[k].append(1e3 * (time.perf_counter() - t0))
    gc.enable()
    ratio = statistics.median(a / b for a, b in zip(t["now"], t["s17"]))
    print(f"{kind}: s17 {statistics.median(t['s17']):.2f} ms, now {statistics.median(t['now']):.2f}"
          f" ms per step; now/s17 paired {ratio:.3f} ({rounds} rounds)", flush=True)
    for m, _ in models.values():
        m.close()


if __name__ == "__main__":
    main()
