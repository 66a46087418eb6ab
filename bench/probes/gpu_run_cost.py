"""Probe: what one `sess.run` on a GPU costs the host, and where (cProfile by own time):
a fetch of a GPU constant, a fetch of a GPU op's result with a [4] feed, and a run of a
GPU variable's assign_add with no fetch -- the shapes of the DQN client's act, train and
store runs (bench/NOTES.md, "dqn, session 36").

    python -m bench.probes.gpu_run_cost [--device /gpu:0] [--runs 2000] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

import dcf


def run_costs(device: str, runs: int = 2000, profile: bool = False) -> dict[str, float]:
    """Microseconds of one run of each case on `device` (the best of three times `runs`
    runs), printing each case's cProfile by own time with `profile`."""
    g = dcf.Graph()
    with g.as_default(), dcf.device(device):
        c = dcf.constant(1.0)
        x = dcf.placeholder(dcf.float32, (4,))
        y = dcf.reduce_sum(x * 2.0)
        v = dcf.Variable(np.zeros(4, np.float32))
        bump = v.assign_add(np.ones(4, np.float32)).op
        init = dcf.global_variables_initializer()
    feed = {x: np.ones(4, np.float32)}
    cases = {"fetch a constant": (c, None), "feed [4], fetch a reduction": (y, feed),
             "assign_add, no fetch": (bump, None)}
    out = {}
    with dcf.Session(g) as sess:
        sess.run(init)
        for name, (fetch, fd) in cases.items():
            for _ in range(200):
                sess.run(fetch, fd)
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                for _ in range(runs):
                    sess.run(fetch, fd)
                best = min(best, (time.perf_counter() - t) / runs)
            out[name] = best * 1e6
            if profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(runs):
                    sess.run(fetch, fd)
                prof.disable()
                print(f"--- {device} {name}: {runs} runs, by own time")
                pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="/gpu:0")
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    for name, us in run_costs(args.device, args.runs, args.profile).items():
        print(f"{args.device} {name}: {us:.1f} us a run", flush=True)


if __name__ == "__main__":
    main()
