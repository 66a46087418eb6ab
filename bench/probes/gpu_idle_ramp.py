"""Does a GPU run slower right after it idled? A fixed burst of GEMMs the size of
static_vs_dynamic's LSTM step at batch B ((B, 1024) @ (1024, 2048), 40 of them, ~one
time step's forward and backward), timed on the GPU by events, after the device idled for
0, 1, 10, 50 and 200 ms (the host asleep) and after a full garbage collection instead.
Prints each case's median GPU time of the first burst and of the fifth (bench/NOTES.md,
"GPU, session 19").

    python -m bench.probes.gpu_idle_ramp [B] [ROUNDS]
"""
import gc
import statistics
import sys
import time


def main() -> None:
    import cupy as cp

    b = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    a = cp.random.standard_normal((b, 1024), dtype=cp.float32)
    w = cp.random.standard_normal((1024, 2048), dtype=cp.float32)
    out = cp.empty((b, 2048), cp.float32)

    def burst() -> tuple:
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for _ in range(40):
            cp.matmul(a, w, out=out)
        e1.record()
        return e0, e1

    for _ in range(50):
        burst()
    cp.cuda.Device().synchronize()
    cases = [("idle 0 ms", 0.0), ("idle 1 ms", 1e-3), ("idle 10 ms", 1e-2),
             ("idle 50 ms", 5e-2), ("idle 200 ms", 0.2), ("gc.collect", None)]
    res: dict = {name: ([], []) for name, _ in cases}
    gc_ms: list = []          # the collections' own host time
    for _ in range(rounds):
        for name, idle in cases:
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            if idle is None:
                gc.collect()
            else:
                time.sleep(idle)
            host = time.perf_counter() - t0
            evs = [burst() for _ in range(5)]
            evs[-1][1].synchronize()
            res[name][0].append(cp.cuda.get_elapsed_time(*evs[0]))
            res[name][1].append(cp.cuda.get_elapsed_time(*evs[-1]))
            if idle is None:
                gc_ms.append(1e3 * host)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, batch {b}, "
          f"40 GEMMs a burst, {rounds} rounds: median GPU ms of the first / fifth burst")
    for name, _ in cases:
        first, fifth = res[name]
        print(f"  {name:12s} {statistics.median(first):7.3f} / {statistics.median(fifth):7.3f}")
    print(f"  a collection took {statistics.median(gc_ms):.1f} ms of host time")


if __name__ == "__main__":
    main()
