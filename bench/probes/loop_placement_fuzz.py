"""tests/core/test_loop_placement_shapes.py's draws, many in one process, each logged
before it runs and each given 30 s: a hang dumps every thread's stack to the log and
ends the process (bench/NOTES.md, "GPU, session 19").

    python -m bench.probes.loop_placement_fuzz DEVICES SEED N LOG [SECONDS]
    # DEVICES: /cpu:0,/cpu:1,/cpu:2 or /cpu:0,/gpu:0,/gpu:1; stops after N draws or SECONDS
"""
import faulthandler
import random
import sys
import time

from tests.core.test_loop_placement_shapes import KINDS, run_all_ways

devices = sys.argv[1].split(",")
rng = random.Random(int(sys.argv[2]))
N = int(sys.argv[3])
log = open(sys.argv[4], "w")
limit = float(sys.argv[5]) if len(sys.argv) > 5 else float("inf")
t0 = time.time()
ex = 0
for ex in range(N):
    if time.time() - t0 > limit:
        break
    kinds = [rng.choice(KINDS) for _ in range(rng.randint(1, 4))]
    places = [rng.randint(0, 2) for _ in range(4)]
    args = (kinds, places, rng.randint(0, 2), rng.randint(0, 15), rng.randint(0, 4),
            rng.random() < 0.5, rng.uniform(-2, 2))
    print(ex, args, file=log, flush=True)
    faulthandler.dump_traceback_later(30, exit=True, file=log)
    run_all_ways(devices, *args)
    faulthandler.cancel_dump_traceback_later()
print("done", ex, "draws", round(time.time() - t0, 1), "s", file=log, flush=True)
