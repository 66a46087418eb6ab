"""Why the chain's pipelining differs from process to process (bench/NOTES.md, "GPU,
session 15"): parallel_iterations' chain (one layer per GPU, K = 1024, 200 iterations a
run) at pi = 1 and pi = 32, many runs in this process, each with its rate, the host's CPU
time and the GPU events the host waited for (FusedActor.host_waits: count, seconds).

    python -m bench.probes.chain_modes RUNS
"""
import sys
import time

import numpy as np

import dcf
from bench import gpu_common as G
from bench.parallel_iterations import build


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    n_dev = G.gpu_count()
    devs = G.devices(n_dev, False)
    for pi in (1, 32):
        g, out, _, _ = build(devs, n_dev, 1024, 200, pi)
        with dcf.Session(g) as sess:
            sess.run(out)
            fused = [a for a in sess._async._actors.values() if hasattr(a, "host_waits")]
            rows = []
            for _ in range(runs):
                c0, t0 = time.process_time(), time.perf_counter()
                sess.run(out)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                n, waited = fused[0].host_waits if fused else (0, 0.0)
                rows.append((200 / wall, cpu / wall, n, waited / wall))
        r = np.array(rows)
        print(f"pi={pi}: it/s median {np.median(r[:, 0]):7.0f} (min {r[:, 0].min():7.0f} max "
              f"{r[:, 0].max():7.0f}); host CPU/wall {np.median(r[:, 1]):.2f}; waits per run "
              f"{np.median(r[:, 2]):.0f}, waiting {100 * np.median(r[:, 3]):.0f}% of the run",
              flush=True)
        del g, sess
        G.release_device_memory()


if __name__ == "__main__":
    main()
