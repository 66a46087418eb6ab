"""Host cost of saving values on a swapping stack and popping them, where nothing is owed:
3,000 64 KiB values, best of 7. "inline" is what a compiled loop does with any stack
(a list's append and pop, plus the swapper's tick every TICK_EVERY pushes); "push()" is
the stack's own push and pop (outside compiled loops: a tick per push). Runs on a GPU or
on the stand-in (`DCF_FAKE_GPUS=1 python -m bench.probes.swap_track_cost`), where it
measures the swapper's own Python (bench/NOTES.md, "GPU, sessions 13-14")."""
import time

import numpy as np

from dcf.actors import gpu as G
from dcf.actors import gpu_swap as S


def main() -> None:
    gpu = G.GpuDevice.get(0)
    gpu.activate()
    gpu.configure(None, 1.0)        # nothing owed: what every push pays
    sw = gpu.swapper
    vals = [gpu.cp.ones((128, 128), np.float32) for _ in range(3000)]

    def inline() -> None:
        st = S.GpuStackStore("s", True, gpu)
        items = st.items
        for k, v in enumerate(vals):
            items.append(v)
            if not k % S.TICK_EVERY:
                sw.tick(True)
        for _ in vals:
            items.pop()

    def method() -> None:
        st = S.GpuStackStore("s", True, gpu)
        for v in vals:
            st.push(v)
        for _ in vals:
            st.pop()

    for label, fn in (("inline", inline), ("push()", method)):
        ts = []
        for _ in range(7):
            sw.reset()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        print(f"{label}: {min(ts) / len(vals) * 1e6:.2f} us per push and pop", flush=True)


if __name__ == "__main__":
    main()
