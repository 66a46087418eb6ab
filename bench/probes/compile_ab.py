"""One of spy_workload's GPU workloads built twice in ONE process, compiled under two
settings, their steps alternating (A B B A ...): median ms per step of each and the median
of the rounds' paired ratios B / A (bench/NOTES.md, "GPU, sessions 18 and 20").

    python -m bench.probes.compile_ab KIND ROUNDS [A B]   # KIND as in spy_workload: mp2_32, ...

A and B (default `s17 now`): `s17` is session 17's frame compiler settings -- four GPU marks
per parallel_iterations window, a yield every 2 ms (the current one too; session 18's calls
ran with 5 ms), and no GPU copy of a loop predicate read as the predicate itself (each
variable of a loop over several devices tested for DEAD every iteration); `now` the current
ones; anything else a mode of svd_modes (e.g. `nohold base`: each gradient term added in
its own iteration against the current chunks, session 20)."""
import gc
import statistics
import sys
import time

import dcf.frame_compiler as fc
from bench import gpu_common as G
from bench.probes.spy_workload import build
from bench.probes.svd_modes import _apply

_ONLY_PREDICATE = fc._only_predicate


def _settings(mode: str) -> None:
    _apply("base")      # svd_modes' defaults: marks, yields, accumulations
    fc._only_predicate = _ONLY_PREDICATE
    if mode == "s17":
        fc.MARKS_PER_WINDOW, fc._YIELD_S, fc._only_predicate = 4, 0.002, lambda n: False
    elif mode != "now":
        _apply(mode)


def main() -> None:
    kind, rounds = sys.argv[1], int(sys.argv[2])
    a, b = sys.argv[3:5] if len(sys.argv) > 4 else ("s17", "now")
    models = {}
    for name in (a, b):
        _settings(name)
        m, xv = build(kind)
        m.step(xv)                       # compiled here, under these settings
        models[name] = (m, xv)
    _settings("now")
    for m, xv in models.values():
        m.step(xv)
    G.sync_all()
    gc.collect()
    gc.disable()
    t: dict = {k: [] for k in models}
    for r in range(rounds):
        for k in ((a, b) if r % 2 == 0 else (b, a)):
            m, xv = models[k]
            t0 = time.perf_counter()
            m.step(xv)
            G.sync_all()
            t[k].append(1e3 * (time.perf_counter() - t0))
    gc.enable()
    ratio = statistics.median(y / x for x, y in zip(t[a], t[b]))
    print(f"{kind}: {a} {statistics.median(t[a]):.2f} ms, {b} {statistics.median(t[b]):.2f}"
          f" ms per step; {b}/{a} paired {ratio:.3f} ({rounds} rounds)", flush=True)
    for m, _ in models.values():
        m.close()


if __name__ == "__main__":
    main()
