"""Host cost of a swapping stack's push and pop of a tracked value (past the watch share,
never owed) against a plain one: 3,000 64 KiB values pushed and popped, best of 7.
Runs on a GPU or on the stand-in (`DCF_FAKE_GPUS=1 python -m bench.probes.swap_track_cost`),
where it measures the swapper's own Python (bench/NOTES.md, "GPU, session 13")."""
import time

import numpy as np

from dcf.actors import gpu as G


def main() -> None:
    gpu = G.GpuDevice.get(0)
    gpu.activate()
    gpu.configure(None, 0.7)
    sw = gpu.swapper
    vals = [gpu.cp.ones((128, 128), np.float32) for _ in range(3000)]

    def run() -> None:
        st = G.GpuStackStore("s", True, gpu)
        for v in vals:
            st.push(v)
        for _ in vals:
            st.pop()

    for label, watch in (("tracked", 0), ("plain", 1 << 60)):
        sw.reset()
        sw._watch, sw._limit = watch, 1 << 60
        run()
        ts = []
        for _ in range(7):
            t0 = time.perf_counter()
            run()
            ts.append(time.perf_counter() - t0)
        print(f"{label}: {min(ts) / len(vals) * 1e6:.2f} us per push and pop", flush=True)


if __name__ == "__main__":
    main()
