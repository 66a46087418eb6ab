"""Ctrl-C, many times over (bench/NOTES.md, "GIL and Ctrl-C"): R rounds, each a run of
tests/core/test_interrupt.py's graph (Newton's sqrt over two devices) interrupted by a
real SIGINT once its loop runs, then a normal run; a round whose interrupt has not ended
the run within 8 s says so and sends another (the interrupt was lost), and any round
over 5 s is reported. It ends with "done R" unless a round hangs (run it under
`timeout`).

    python -m bench.probes.interrupt_stress [uvloop|asyncio] [compiled 0|1] [R] [inline]

Without `inline` the runs are traced (the event-loop path); with it, untraced compiled
runs go inline.
"""
import asyncio
import signal
import sys
import threading
import time

import numpy as np

import dcf
from dcf import session as session_mod
from tests.core.test_interrupt import _graph, _wait_for


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "uvloop"
    compiled = (sys.argv[2] if len(sys.argv) > 2 else "1") == "1"
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    inline = len(sys.argv) > 4 and sys.argv[4] == "inline"
    if kind == "asyncio":
        session_mod._new_loop = asyncio.new_event_loop
    main_ident = threading.main_thread().ident
    data = np.array([2.0, 9.0, 30.0])
    opts = dcf.RunOptions(trace=not inline)
    for k in range(rounds):
        started: list = []
        done = threading.Event()
        sent: list = []
        x, n, y = _graph(started)
        sess = dcf.Session(config=dcf.SessionConfig(compile_frames=compiled))
        sess.run(y, {x: data, n: 30}, options=opts)
        started.clear()

        def go() -> None:
            if not _wait_for(started):
                print(f"round {k}: the loop did not start in 30 s", flush=True)
                return
            signal.pthread_kill(main_ident, signal.SIGINT)
            sent.append(time.time())
            while not done.wait(8):
                print(f"round {k}: run not stopped 8 s after SIGINT; resending", flush=True)
                signal.pthread_kill(main_ident, signal.SIGINT)
                sent.append(time.time())

        threading.Thread(target=go, daemon=True).start()
        t0 = time.time()
        try:
            sess.run(y, {x: data, n: 10**9}, options=opts)
            print(f"round {k}: the run ended without an interrupt", flush=True)
        except KeyboardInterrupt:
            pass
        done.set()
        took = time.time() - t0
        if took > 5 or len(sent) > 1:
            print(f"round {k}: {took:.1f} s, {len(sent)} SIGINT sent", flush=True)
        np.testing.assert_allclose(sess.run(y, {x: data, n: 30}, options=opts),
                                   np.sqrt(data))
        sess.close()
    print("done", rounds)


if __name__ == "__main__":
    main()
