"""A run's own cost on the CPU: `sess.run` of one add with a scalar feed, 20,000 runs a
sample, seven samples; prints the min and median in us per run (bench/NOTES.md, "GPU,
session 25": the per-run list of a failed run's stores, compared tree against tree by
running this in each, alternating). `python -m bench.probes.run_cost`."""
import time

import dcf


def main() -> None:
    g = dcf.Graph()
    with g.as_default():
        c = dcf.constant(1.0)
        x = dcf.placeholder(dcf.float32, [])
        y = x + c
    with dcf.Session(g) as sess:
        for _ in range(2000):
            sess.run(c)
        samples = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(20000):
                sess.run(y, {x: 1.0})
            samples.append((time.perf_counter() - t) / 20000 * 1e6)
    samples.sort()
    print(f"run with a feed us: min {samples[0]:.2f} median {samples[3]:.2f}")


if __name__ == "__main__":
    main()
