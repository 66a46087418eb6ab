"""Is a slow chain process a slow host or dcf's doing? (bench/NOTES.md, "GPU, session 16")
In one fresh process: the speed of plain Python before and after, cupy's own host cost for
an allocation and an elementwise launch (no dcf involved), then parallel_iterations' chain
(one layer per GPU, K = 1024, 200 iterations a run, pi = 32) with the process's CPU time
over wall time and the garbage collections during its runs. Run it in several processes:

    for i in 1 2 3 4 5; do python -m bench.probes.process_speed; done
"""
import gc
import os
import statistics
import time
import timeit


def python_us() -> float:
    """us per call of a small dict-and-str loop (the fastest of five rounds): the
    interpreter's speed on this core (bench.harness.host_python_seconds)."""
    from bench.harness import host_python_seconds

    return host_python_seconds().min * 1e6


def cpu_now() -> int:
    with open("/proc/self/stat") as fh:            # field 39: the CPU it last ran on
        return int(fh.read().rsplit(")", 1)[1].split()[36])


def cupy_us() -> tuple:
    """Host us of cupy.empty (4 MiB, from the pool) and of cupy.tanh in place."""
    import cupy as cp
    x = cp.ones((1024, 1024), cp.float32)
    cp.cuda.Device(0).synchronize()

    def empties():
        for _ in range(1000):
            cp.empty((1024, 1024), cp.float32)

    def tanhs():
        for _ in range(1000):
            cp.tanh(x, out=x)
    e = min(timeit.repeat(empties, number=1, repeat=5)) / 1000 * 1e6
    t = min(timeit.repeat(tanhs, number=1, repeat=5)) / 1000 * 1e6
    cp.cuda.Device(0).synchronize()
    return e, t


def main() -> None:
    py0 = python_us()
    t_empty, t_tanh = cupy_us()
    import dcf
    from bench import gpu_common as G
    from bench.parallel_iterations import build

    if G.gpu_count() < 2:
        raise SystemExit("needs two GPUs")
    collections = []
    started = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            collections.append((info["generation"], time.perf_counter() - started[0]))
    g, out, _, _ = build(G.devices(2, False), 2, 1024, 200, 32)
    with dcf.Session(g) as sess:
        sess.run(out)
        sess.run(out)
        gc.callbacks.append(on_gc)
        rates = []
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(5):
            t0 = time.perf_counter()
            sess.run(out)
            rates.append(200 / (time.perf_counter() - t0))
        cpu_share = (time.process_time() - c0) / (time.perf_counter() - w0)
        gc.callbacks.remove(on_gc)
    py1 = python_us()
    print(f"pid {os.getpid()} cpu {cpu_now()}: chain pi=32 {statistics.median(rates):.0f} it/s "
          f"(process CPU / wall {cpu_share:.2f}); python {py0:.1f} us before, {py1:.1f} after; "
          f"cupy.empty {t_empty:.2f} us, cupy.tanh launch {t_tanh:.2f} us; "
          f"{len(collections)} collections, {sum(t for _, t in collections) * 1e3:.1f} ms",
          flush=True)


if __name__ == "__main__":
    main()
