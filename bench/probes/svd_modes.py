"""static_vs_dynamic's LSTM step on /gpu:0 with several compiled-loop settings in ONE process:
a static model and one dynamic model per MODE (each compiled under its mode), stepped in
rotating order round after round, so that a host's slow phases hit every model alike.
Prints, per batch, each model's median ms per step and the median over rounds of each
dynamic model's time over the static one's of the same round (and over the first mode's).

    python -m bench.probes.svd_modes 64,128 ROUNDS [--block K] [--gc] [--pause MS] MODE [MODE ...]

With --block K each model runs K steps in a row per turn (its median is the turn's time:
each model in the steady state of running alone, the blocks rotating as the steps do).
With --gc every timed step follows a full garbage collection (as the bench script's do);
without, the collector is off for all the rounds. With --pause MS every timed step follows
MS ms of sleep (the device idles as it does during a collection, the host's caches stay warm).

MODE: `base` (the current settings), `s17` (session 17's: 4 marks a window, a yield every
2 ms; during session 18's calls the current settings yielded every 5 ms), `markN` (N
marks a window), `yieldMS` (a yield every MS ms), `nomark`, `noyield`,
`noacc` (a probe of what the backward loop's in-place gradient accumulations cost: after
a loop's first iteration they do nothing, so its gradients are WRONG), `nohold` (each
accumulation term added in its own iteration, as before session 20), `chunkN` (N terms
added at once), `shareX` / `rowsN` (accumulate.HOLD_SHARE / HOLD_ROWS), or several
joined by `+` (bench/NOTES.md, "GPU, sessions 18 and 20")."""
import gc
import itertools
import statistics
import sys
import time

import dcf.frame_compiler as fc
import dcf.fusion.accumulate as acc_mod
from bench import gpu_common as G
from bench.lstm_swap import _input
from bench.static_vs_dynamic_gpu import GpuLstm

_DEFAULTS = (fc.MARKS_PER_WINDOW, fc._YIELD_S, fc._marker, acc_mod.FusedAccumulate,
             acc_mod.CHUNK, acc_mod.HOLD_SHARE, acc_mod.HOLD_ROWS)


class _NoAccumulate(acc_mod.FusedAccumulate):
    """After the first iteration, the accumulator as it is: no launch (wrong values)."""

    def __call__(self, acc, *args):
        return super().__call__(acc, *args) if not args[-2] else acc


class _NoHold(acc_mod.FusedAccumulate):
    """Every term added in its own iteration (no list of held terms)."""

    def __call__(self, acc, *args):
        return super().__call__(acc, *args[:-1], None)


def _apply(mode: str) -> None:
    (fc.MARKS_PER_WINDOW, fc._YIELD_S, fc._marker, acc_mod.FusedAccumulate,
     acc_mod.CHUNK, acc_mod.HOLD_SHARE, acc_mod.HOLD_ROWS) = _DEFAULTS
    for part in mode.split("+"):
        if part == "base":
            pass
        elif part == "s17":
            fc.MARKS_PER_WINDOW, fc._YIELD_S = 4, 0.002
        elif part == "nomark":
            fc._marker = lambda gpus: (lambda: [])
        elif part == "noacc":
            acc_mod.FusedAccumulate = _NoAccumulate
        elif part == "nohold":
            acc_mod.FusedAccumulate = _NoHold
        elif part.startswith("chunk"):
            acc_mod.CHUNK = int(part[5:])
        elif part.startswith("share"):
            acc_mod.HOLD_SHARE = float(part[5:])
        elif part.startswith("rows"):
            acc_mod.HOLD_ROWS = int(part[4:])
        elif part == "noyield":
            fc._YIELD_S = 1e9
        elif part.startswith("mark"):
            fc.MARKS_PER_WINDOW = int(part[4:])
        elif part.startswith("yield"):
            fc._YIELD_S = float(part[5:]) / 1e3
        else:
            raise SystemExit(f"unknown mode {part!r}")


def main() -> None:
    batches = [int(b) for b in sys.argv[1].split(",")]
    rounds = int(sys.argv[2])
    args = sys.argv[3:]
    block, collect = 1, False
    if args[:1] == ["--block"]:
        block, args = int(args[1]), args[2:]
    if args[:1] == ["--gc"]:
        collect, args = True, args[1:]
    pause = 0.0
    if args[:1] == ["--pause"]:
        pause, args = float(args[1]) / 1e3, args[2:]
    gc_s: list = []
    modes = args or ["base"]
    for b in batches:
        xv = _input(200, b, 512, False)
        models = {"static": GpuLstm("static", 200, b, 512, 512)}
        models["static"].step(xv)
        for m in modes:
            models[m] = GpuLstm("dynamic", 200, b, 512, 512)
            _apply(m)
            models[m].step(xv)            # compiled here, under this mode's settings
            _apply("base")
        for m in models.values():
            m.step(xv)
        G.sync_all()
        gc.collect()
        gc.disable()
        t: dict = {k: [] for k in models}
        orders = list(itertools.permutations(models))
        for r in range(rounds):
            for k in orders[r % len(orders)]:
                turn = []
                for _ in range(block):
                    if collect:
                        t0 = time.perf_counter()
                        gc.collect()
                        gc_s.append(time.perf_counter() - t0)
                    if pause:
                        time.sleep(pause)
                    t0 = time.perf_counter()
                    models[k].step(xv)
                    turn.append(1e3 * (time.perf_counter() - t0))
                t[k].append(statistics.median(turn))
        gc.enable()
        med = {k: statistics.median(v) for k, v in t.items()}
        line = [f"b{b}{'' if block == 1 else f' blocks of {block}'}{' gc' if collect else ''}{f' pause {1e3 * pause:g} ms' if pause else ''}: static {med['static']:.2f} ms"]
        for m in modes:
            over_s = statistics.median(d / s for d, s in zip(t[m], t["static"]))
            part = f"{m} {med[m]:.2f} ms, /static {over_s:.3f}"
            if m != modes[0]:
                part += f", /{modes[0]} " + \
                    f"{statistics.median(d / o for d, o in zip(t[m], t[modes[0]])):.3f}"
            line.append(part)
        if gc_s:
            line.append(f"a collection {1e3 * statistics.median(gc_s):.1f} ms")
            gc_s.clear()
        print("; ".join(line), flush=True)
        for m in models.values():
            m.close()
        del models
        G.release_device_memory()


if __name__ == "__main__":
    main()
