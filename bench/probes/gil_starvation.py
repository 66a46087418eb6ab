"""Does a run in a background thread starve the main thread of the GIL? (bench/NOTES.md,
"GIL and Ctrl-C".)

The main thread sleeps 10 ms at a time for 3 s while another thread runs loops of 20,000
iterations, one `Session.run` after another; each sleep's overshoot is the time the main
thread waited for the GIL (and the OS). Paths:

  tagged     compile_frames=False: the tagged-token executor on the session's event loop
  traced     compiled frames, traced: on the event loop
  both       compile_frames=False, traced

    python -m bench.probes.gil_starvation [tagged|traced|both] [seconds]
"""
import sys
import threading
import time

import numpy as np

import dcf

PATHS = {"tagged": (False, False), "traced": (True, True), "both": (False, True)}


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "tagged"
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    compiled, trace = PATHS[path]
    n = dcf.placeholder(dcf.int32, ())
    _, s = dcf.while_loop(lambda i, s: i < n, lambda i, s: (i + 1, s * 0.5 + 1.0),
                          (0, dcf.constant(0.0, dcf.float64)))
    sess = dcf.Session(config=dcf.SessionConfig(compile_frames=compiled))
    opts = dcf.RunOptions(trace=trace)
    sess.run(s, {n: 10}, options=opts)
    runs: list = []

    def background() -> None:
        t0 = time.perf_counter()
        k = 0
        while time.perf_counter() - t0 < seconds:
            sess.run(s, {n: 20_000}, options=opts)
            k += 1
        runs.append(k)

    th = threading.Thread(target=background)
    th.start()
    time.sleep(0.05)
    over = []
    while not runs:
        t0 = time.perf_counter()
        time.sleep(0.01)
        over.append(time.perf_counter() - t0 - 0.01)
    th.join()
    ms = np.array(over) * 1e3
    print(f"{path}: {runs[0]} runs in the background thread; the main thread's "
          f"{len(ms)} sleeps of 10 ms (ideal ~{seconds / 0.0101:.0f}) overshot by "
          f"p50 {np.median(ms):.2f} ms, p99 {np.percentile(ms, 99):.1f} ms, "
          f"max {ms.max():.1f} ms")
    sess.close()


if __name__ == "__main__":
    main()
