"""Paper Table "training time per loop iteration": one LSTM layer trained with
dynamic_rnn under a device-memory budget, swap_memory off and on.

Workload (defaults): 512 units, batch 512, input depth 512, time-major input
[T, 512, 512] fed as a device array, loss = sum of the final h, one SGD step per run.
The budget is calibrated on this card so that the run without swapping fails a little
above 500 steps (`--fail-near`): the pool's high-water mark is measured at two lengths
and extrapolated. With swap_memory=True, stack pushes move to pinned host memory once
pool use passes `--swap-threshold` of the budget.

Reported per system and sequence length: ms per loop iteration (step time / T; one
iteration = one forward and one backward step), the device-memory high-water mark, and
the longest sequence that fits. dcf without and with swapping are measured as a pair: at
each length both are warmed up, then their timed runs alternate (A B B A A B ...), so
drift of the host over the run falls on both alike (`--sequential`: one after the
other, as before 2026-11-26c; `--processes ROUNDS`: also each alone in a process of its
own, alternating, since in one process the two share a memory pool whose cached blocks
near the budget cost whichever model runs next). Peers in the same process on the same
card and budget
(torch.cuda.set_per_process_memory_fraction): a hand-written PyTorch LSTM cell loop
(eager), the same loop under torch.autograd.graph.save_on_cpu(pin_memory=True), and
cuDNN's nn.LSTM.

    python -m bench.lstm_swap --out bench/results/lstm_swap-DATE-CARD.json
    python -m bench.lstm_swap --cpu --quick       # CPU devices, tiny sizes (a smoke test)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import time
from typing import Any

import numpy as np

from bench import gpu_common as G
from bench.harness import Result, Stats, base_argparser, report, results_in_own_process

BENCH = "lstm_swap"


# ----------------------------------------------------------------------- dcf
class DcfLSTM:
    def __init__(self, dev: str, B: int, U: int, D: int, swap: bool, pi: int,
                 config: Any) -> None:
        import dcf
        from dcf import nn

        self.g = dcf.Graph()
        with self.g.as_default(), dcf.device(dev):
            self.x = dcf.placeholder(dcf.float32, [None, B, D], name="x")
            cell = nn.LSTMCell(U, name="lstm")
            _, st = nn.dynamic_rnn(cell, self.x, dtype=dcf.float32, time_major=True,
                                   swap_memory=swap, parallel_iterations=pi)
            self.loss = dcf.reduce_sum(st.h)
            self.train = dcf.train.GradientDescentOptimizer(1e-6).minimize(self.loss)
            init = dcf.global_variables_initializer()
        self.sess = dcf.Session(self.g, config=config)
        self.sess.run(init)

    def step(self, xv: Any) -> float:
        return float(self.sess.run([self.loss, self.train], {self.x: xv})[0])

    def close(self) -> None:
        self.sess.close()


def _input(L: int, B: int, D: int, cpu: bool) -> Any:
    if cpu:
        return np.random.default_rng(L).standard_normal((L, B, D)).astype(np.float32) * 0.1
    from dcf import gpu_devices

    cp = gpu_devices.backend()
    G.gpu_device(0).activate()
    try:
        x = cp.random.standard_normal((L, B, D), dtype=cp.float32)
    except TypeError:                    # the DCF_FAKE_GPUS stand-in (numpy's random)
        x = cp.random.standard_normal((L, B, D)).astype(cp.float32)
    x *= 0.1
    return x


def _is_oom(e: BaseException) -> bool:
    from dcf.errors import ResourceExhaustedError

    if isinstance(e, (ResourceExhaustedError, MemoryError)):
        return True
    return type(e).__name__ in ("OutOfMemoryError",)


def _warm(step, cpu: bool) -> tuple[int | None, str]:
    """Run `step()` once after freeing cached device memory: (peak bytes, status)."""
    try:
        G.release_device_memory()
        if cpu:
            step()
            return None, "ok"
        with G.gpu_device(0).peak_tracker() as t:
            step()                           # warm-up; its live high-water mark
        return t.peak, "ok"
    except Exception as e:
        if not _is_oom(e):
            raise
        msg = str(e).splitlines()[0][:200]
        del e
        G.release_device_memory()
        return None, "OOM: " + msg


def _measure_paired(steps: dict, L: int, repeat: int, cpu: bool,
                    ratios: dict | None = None) -> dict:
    """(stats per loop iteration, peak bytes, status) of each system's `step()` at
    length L, their timed runs interleaved (A B B A A B ...), so that drift of the host
    or the card over a run falls on all of them alike: {name: (stats, peak, status)}.
    Each timed run starts after a garbage collection, with the collector off (as
    timeit does). With `ratios`, ratios[name] gets each round's time over the first
    system's in the same round (the paired estimate: a round's two runs are
    neighbours, so slow drift cancels in the ratio)."""
    import gc

    warm = {n: _warm(f, cpu) for n, f in steps.items()}
    live = [n for n, (_, st) in warm.items() if st == "ok"]
    for n in live:          # a second untimed run each, after every warm-up's allocations
        steps[n]()
    if not cpu:
        G.sync_all()
    samples: dict = {n: [] for n in live}
    try:
        for r in range(repeat):
            for n in (live if r % 2 == 0 else live[::-1]):
                gc.collect()
                gc.disable()
                t0 = time.perf_counter()
                steps[n]()
                if not cpu:     # a run returns once its loss is copied, maybe before the
                    G.sync_all()   # GPU is done (dcf/fused.py): time the whole step
                samples[n].append((time.perf_counter() - t0) / L)
                gc.enable()
    finally:
        gc.enable()
    if ratios is not None and live:
        first = samples[live[0]]
        for n in live[1:]:
            ratios[n] = [a / b for a, b in zip(samples[n], first)]
    return {n: ((Stats.from_samples(samples[n]), peak, "ok") if n in samples
                else (None, None, st)) for n, (peak, st) in warm.items()}


# --------------------------------------------------------------------- torch
class TorchLSTM:
    """mode: "cell" (eager cell loop), "save_on_cpu" (the same under
    torch.autograd.graph.save_on_cpu(pin_memory=True)) or "cudnn" (nn.LSTM)."""

    def __init__(self, mode: str, B: int, U: int, D: int, cpu: bool) -> None:
        import torch

        self.torch, self.mode, self.B, self.U = torch, mode, B, U
        self.dev = torch.device("cpu" if cpu else "cuda:0")
        g = torch.Generator().manual_seed(0)
        if mode == "cudnn":
            self.lstm = torch.nn.LSTM(D, U).to(self.dev)
            self.params = list(self.lstm.parameters())
        else:
            lim = math.sqrt(6.0 / (D + U + 4 * U))
            W = (torch.rand(D + U, 4 * U, generator=g) * 2 - 1) * lim
            self.W = W.to(self.dev).requires_grad_()
            self.b = torch.zeros(4 * U, device=self.dev, requires_grad=True)
            self.params = [self.W, self.b]

    def step(self, x: Any) -> float:
        torch = self.torch
        if self.mode == "cudnn":
            _, (h, _) = self.lstm(x)
            loss = h.sum()
        else:
            ctx = (torch.autograd.graph.save_on_cpu(pin_memory=True)
                   if self.mode == "save_on_cpu" else contextlib.nullcontext())
            with ctx:
                h = torch.zeros(self.B, self.U, device=self.dev)
                c = torch.zeros(self.B, self.U, device=self.dev)
                for t in range(x.shape[0]):
                    z = torch.addmm(self.b, torch.cat([x[t], h], 1), self.W)
                    i, j, f, o = z.chunk(4, 1)
                    c = c * torch.sigmoid(f + 1.0) + torch.sigmoid(i) * torch.tanh(j)
                    h = torch.tanh(c) * torch.sigmoid(o)
                loss = h.sum()
        loss.backward()
        with torch.no_grad():
            for p in self.params:
                p -= 1e-6 * p.grad
                p.grad = None
        return float(loss.item())                  # waits for the GPU


def _torch_input(L: int, B: int, D: int, cpu: bool) -> Any:
    import torch

    g = torch.Generator().manual_seed(L)
    x = torch.randn(L, B, D, generator=g) * 0.1
    return x if cpu else x.cuda()


def _torch_measure(model: TorchLSTM, L: int, repeat: int, B: int, D: int, cpu: bool):
    import torch

    try:
        G.release_device_memory()
        x = _torch_input(L, B, D, cpu)
        if not cpu:
            torch.cuda.reset_peak_memory_stats()
        model.step(x)
        peak = None if cpu else int(torch.cuda.max_memory_allocated())
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            model.step(x)
            samples.append((time.perf_counter() - t0) / L)
        return Stats.from_samples(samples), peak, "ok"
    except Exception as e:
        if not _is_oom(e) and "out of memory" not in str(e).lower():
            raise
        msg = str(e).splitlines()[0][:200]
        del e
        for p in model.params:
            p.grad = None
        G.release_device_memory()
        return None, None, "OOM: " + msg


# ----------------------------------------------------------------------- main
def calibrate_budget(B: int, U: int, D: int, pi: int, fail_near: int, short: int) -> dict:
    """Measure the no-swap run's pool high-water mark at two lengths; the budget is the
    straight line through them at `fail_near` steps."""
    import dcf

    m = DcfLSTM("/gpu:0", B, U, D, False, pi, dcf.SessionConfig())
    peaks = {}
    try:
        for L in (short, 2 * short):
            xv = _input(L, B, D, False)
            m.step(xv)
            G.release_device_memory()
            with G.gpu_device(0).peak_tracker() as t:
                m.step(xv)
            peaks[L] = t.peak
            del xv
    finally:
        m.close()
    per_step = (peaks[2 * short] - peaks[short]) / short
    base = peaks[short] - short * per_step
    return {"peaks": peaks, "bytes_per_step": per_step, "base_bytes": base,
            "budget": int(base + per_step * fail_near)}


def main(argv: list[str] | None = None) -> dict:
    ap = base_argparser(__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="run on /cpu:0 with tiny sizes")
    ap.add_argument("--units", type=int, default=512)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--depth", type=int, default=512, help="input depth")
    ap.add_argument("--lengths", default="100,200,300,400,500,600,700,800,1000,1200,1400,1600")
    ap.add_argument("--fail-near", type=int, default=530,
                    help="the budget makes the no-swap run fail past about this many steps")
    ap.add_argument("--budget", type=int, default=None, help="device-memory budget in bytes")
    ap.add_argument("--swap-threshold", type=float, default=0.7,
                    help="SessionConfig.swap_threshold (default: the API default, 0.7)")
    ap.add_argument("--parallel-iterations", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--swap-all-lengths", default="100,500",
                    help="lengths also run with swap_threshold=0 (every saved value swaps)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--sequential", action="store_true",
                    help="measure dcf without swapping, then with (default: the two "
                         "interleaved at each length)")
    ap.add_argument("--swap-first", action="store_true",
                    help="with --sequential: measure with swapping first (order effects)")
    ap.add_argument("--processes", type=int, default=0, metavar="ROUNDS",
                    help="also time dcf without and with swapping each alone in a process "
                         "of its own (its own memory pool), alternating, ROUNDS rounds per "
                         "length where both fit")
    ap.add_argument("--child", default=None, choices=["dcf", "dcf swap"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--png", default=None, help="plot file (default: next to --out)")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds; later measurements are skipped past it (results so far "
                         "are reported; SIGTERM does the same)")
    args = ap.parse_args(argv)
    import signal

    def _term(signum, frame):
        raise _Stop("SIGTERM")
    signal.signal(signal.SIGTERM, _term)
    t_start = time.perf_counter()

    def out_of_time() -> bool:
        return args.time_budget is not None and time.perf_counter() - t_start > args.time_budget

    import dcf

    cpu = args.cpu
    if cpu:
        B, U, D = 16, 32, 32
        lengths = [10, 20, 40] if args.quick else [10, 20, 40, 80]
        swap_all = [10]
    else:
        if G.gpu_count() == 0:
            G.skip(BENCH, "no GPU visible (cupy with a CUDA device is needed; --cpu runs on "
                   "CPU devices)", args.out)
        B, U, D = args.batch, args.units, args.depth
        lengths = [int(v) for v in args.lengths.split(",")]
        swap_all = [int(v) for v in args.swap_all_lengths.split(",") if v]
        if args.quick:
            lengths, swap_all = lengths[:2], swap_all[:1]
    repeat = 1 if args.quick else args.repeat
    dev = "/cpu:0" if cpu else "/gpu:0"
    config: dict[str, Any] = {
        "device": dev, "card": "cpu" if cpu else G.card_name(0), "date": G.today(),
        "units": U, "batch": B, "depth": D, "lengths": lengths, "repeat": repeat,
        "parallel_iterations": args.parallel_iterations, "swap_threshold": args.swap_threshold,
        "loss": "sum of the final h; one SGD step per run",
    }
    cal = None
    if not cpu:
        if args.budget is None:
            cal = calibrate_budget(B, U, D, args.parallel_iterations, args.fail_near,
                                   50 if args.quick else 100)
            budget = cal["budget"]
        else:
            budget = args.budget
        config.update(budget_bytes=budget, calibration=cal)
        from dcf import gpu_devices

        config["cupy"] = getattr(gpu_devices.backend(), "__version__", "fake")
    else:
        budget = None

    systems: dict[str, dict] = {}

    def run_dcf(names: dict, threshold: float, only: list[int] | None = None) -> None:
        """Measure dcf with the given {name: swap_memory} models, interleaved per length."""
        cfg = dcf.SessionConfig(gpu_memory_limit=budget, swap_threshold=threshold)
        models = {n: DcfLSTM(dev, B, U, D, swap, args.parallel_iterations, cfg)
                  for n, swap in names.items()}
        moved: dict = {n: {} for n in models}     # swap counters, per model

        def counted(n: str, step: Any) -> Any:
            def run() -> Any:
                before = dict(G.gpu_device(0).stats) if not cpu else {}
                try:
                    return step()
                finally:
                    if not cpu:
                        after = G.gpu_device(0).stats
                        for k in ("swap_out_bytes", "swap_in_bytes", "throttled"):
                            moved[n][k] = moved[n].get(k, 0) + after.get(k, 0) - before.get(k, 0)
            return run

        try:
            for L in lengths:
                if only is not None and L not in only:
                    continue
                todo = {}
                for n, m in models.items():
                    rows = systems.setdefault(n, {})
                    if any(r[2] != "ok" for r in rows.values()):
                        rows[L] = (None, None, "OOM (a shorter length failed)")
                    elif out_of_time():
                        config.setdefault("not_run", []).append(f"{n} L={L}")
                    else:
                        todo[n] = m
                if not todo:
                    continue
                xv = _input(L, B, D, cpu)
                for n in todo:
                    moved[n] = {}
                pair: dict = {}
                got = _measure_paired({n: counted(n, functools.partial(m.step, xv))
                                       for n, m in todo.items()}, L, repeat, cpu, pair)
                for n, rs in pair.items():
                    config.setdefault("paired_ratios", {}).setdefault(n, {})[L] = rs
                for n, row in got.items():
                    systems[n][L] = row
                    if not cpu:
                        runs = repeat + (2 if row[2] == "ok" else 1)
                        config.setdefault("swap_bytes_per_run", {}).setdefault(n, {})[L] = {
                            k: v / runs for k, v in moved[n].items()}
                    print(f"  {n:14s} L={L:5d}: {_fmt_row(row)}", flush=True)
                del xv
        finally:
            for m in models.values():
                m.close()
            G.release_device_memory()

    def run_torch() -> None:
        try:
            import torch  # noqa: F401
            have_torch = cpu or torch.cuda.is_available()
        except ImportError:
            have_torch = False
        if have_torch:
            import torch

            config["torch"] = torch.__version__
            if not cpu:
                total = torch.cuda.get_device_properties(0).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
                config["torch_cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
                config["torch_matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
            modes = [("torch cell loop", "cell"), ("torch cudnn", "cudnn")]
            if not cpu:
                modes.insert(1, ("torch save_on_cpu", "save_on_cpu"))
            for name, mode in modes:
                model = TorchLSTM(mode, B, U, D, cpu)
                rows = systems.setdefault(name, {})
                for L in lengths:
                    if any(r[2] != "ok" for r in rows.values()):
                        rows[L] = (None, None, "OOM (a shorter length failed)")
                        continue
                    if out_of_time():
                        config.setdefault("not_run", []).append(f"{name} L={L}")
                        continue
                    rows[L] = _torch_measure(model, L, repeat if L <= 500 else
                                             max(1, repeat - 1), B, D, cpu)
                    print(f"  {name:14s} L={L:5d}: {_fmt_row(rows[L])}", flush=True)
                del model
                G.release_device_memory()
            if not cpu:
                torch.cuda.set_per_process_memory_fraction(1.0)

    if args.child:              # one model in this process (see --processes)
        run_dcf({args.child: args.child == "dcf swap"}, args.swap_threshold)
        return report(BENCH, config, [Result.from_stats(n, f"ms/iter L={L}", r[0])
                                      for n, rows in systems.items()
                                      for L, r in rows.items() if r[0] is not None],
                      {}, args.out)
    try:
        if args.sequential:     # one system after the other (the earlier method)
            order = [("dcf", False), ("dcf swap", True)]
            for name, swap in (order[::-1] if args.swap_first else order):
                run_dcf({name: swap}, args.swap_threshold)
        else:                   # paired: the timed runs of both interleaved per length
            run_dcf({"dcf": False, "dcf swap": True}, args.swap_threshold)
        if args.processes and not cpu:
            _in_processes(systems, config, args, budget)
        if swap_all:
            run_dcf({"dcf swap all": True}, 0.0, swap_all)
        if not args.no_torch:
            run_torch()
    except _Stop as e:
        config["interrupted"] = str(e)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return _finish(systems, config, budget, args, cpu, B, U, D)


class _Stop(Exception):
    pass


def _finish(systems: dict, config: dict, budget: Any, args: Any, cpu: bool, B: int, U: int,
            D: int) -> dict:
    results: list[Result] = []
    longest: dict[str, int] = {}
    status: dict[str, dict] = {}
    for name, rows in systems.items():
        ok = [L for L, r in rows.items() if r[2] == "ok"]
        longest[name] = max(ok) if ok else 0
        status[name] = {str(L): r[2] for L, r in rows.items()}
        for L, (st, peak, _) in rows.items():
            if st is not None:
                results.append(Result.from_stats(name, f"ms/iter L={L}", st))
            if peak is not None:
                results.append(Result(name, f"peak MiB L={L}", peak / 2**20, peak / 2**20,
                                      peak / 2**20, "MiB"))
        results.append(Result(name, "longest sequence that fits", longest[name],
                              longest[name], longest[name], "steps"))
    config["status"] = status
    ratios = _ratios(systems, longest, dict(config.get("paired_ratios", {}),
                                            __processes__=config.get("process_ratios", {})))
    payload = report(BENCH, config, results, ratios, args.out)
    png = args.png or (args.out[:-5] + ".png" if args.out and args.out.endswith(".json") else
                       None)
    if png:
        _plot(systems, budget, config, png)
        if not cpu and "interrupted" not in config:
            _timeline(B, U, D, args.parallel_iterations, budget, png[:-4] + "-timeline.png")
    return payload


def _in_processes(systems: dict, config: dict, args: Any, budget: int) -> None:
    """dcf without and with swapping, each alone in a process of its own, alternating
    (their order swapped every round), at each length where both fit in the paired
    measurement: in one process the two models share one memory pool, and near the
    budget a step can pay for the other model's cached blocks (bench/NOTES.md, "GPU,
    session 14"). config["process_ratios"][L]: each round's swap / no-swap ms per
    iteration."""
    swap = systems.get("dcf swap", {})
    both = [L for L, row in sorted(systems.get("dcf", {}).items())
            if row[2] == "ok" and L in swap and swap[L][2] == "ok"]
    out: dict = {}
    for L in both:
        for r in range(args.processes):
            got = {}
            for name in (("dcf", "dcf swap") if r % 2 == 0 else ("dcf swap", "dcf")):
                rows = results_in_own_process(
                    "bench.lstm_swap",
                    ["--child", name, "--lengths", str(L), "--budget", str(budget),
                     "--repeat", str(args.repeat), "--no-torch", "--swap-all-lengths", "",
                     "--swap-threshold", str(args.swap_threshold),
                     "--units", str(args.units), "--batch", str(args.batch),
                     "--depth", str(args.depth), "--parallel-iterations",
                     str(args.parallel_iterations)], f"{name} L={L}", timeout=600)
                got[name] = next(x["median"] for x in rows if x["system"] == name)
            out.setdefault(L, []).append(got["dcf swap"] / got["dcf"])
            print(f"  separate processes L={L:5d} round {r}: no swap {got['dcf']:.4f}, "
                  f"swap {got['dcf swap']:.4f} ms/iter", flush=True)
    config["process_ratios"] = out


def _timeline(B: int, U: int, D: int, pi: int, budget: int, path: str) -> None:
    """The paper's swap timeline: one traced step with every saved value swapped, drawn
    as compute / h2d / d2h tracks (dcf.trace.plot)."""
    import dcf

    m = DcfLSTM("/gpu:0", B, U, D, True, pi,
                dcf.SessionConfig(gpu_memory_limit=budget, swap_threshold=0.0))
    try:
        xv = _input(40, B, D, False)
        m.step(xv)
        md = dcf.RunMetadata()
        m.sess.run([m.loss, m.train], {m.x: xv}, options=dcf.RunOptions(trace=True),
                   run_metadata=md)
        dev = [e for e in md.trace if e[7] in ("compute", "h2d", "d2h")]
        md.trace = dev
        dcf.trace.plot(md, path, title="LSTM step, 40 steps, every saved value swapped: "
                                       "compute and copy streams")
        md.write_trace(path[:-4] + ".json")
    finally:
        m.close()
        G.release_device_memory()


def _fmt_row(r: tuple) -> str:
    st, peak, status = r
    if st is None:
        return status
    p = "" if peak is None else f", peak {peak / 2**20:.0f} MiB"
    return f"{st.median * 1e3:.4f} ms/iter [{st.min * 1e3:.4f}-{st.max * 1e3:.4f}]{p}"


def _med(systems: dict, name: str, L: int) -> float | None:
    r = systems.get(name, {}).get(L)
    return r[0].median * 1e3 if r is not None and r[0] is not None else None


def _ratios(systems: dict, longest: dict, paired: dict) -> dict:
    out: dict[str, Any] = {}
    lengths = sorted({L for rows in systems.values() for L in rows})
    for L in lengths:
        a, b = _med(systems, "dcf", L), _med(systems, "dcf swap", L)
        if a and b:
            out[f"swap overhead L={L}"] = b / a - 1
        rs = paired.get("dcf swap", {}).get(L)
        if rs:        # the median of the rounds' own ratios: drift between rounds cancels
            out[f"swap overhead, paired L={L}"] = float(np.median(rs)) - 1
        rs = paired.get("__processes__", {}).get(L)
        if rs:
            out[f"swap overhead, separate processes L={L}"] = float(np.median(rs)) - 1
        c = _med(systems, "dcf swap all", L)
        if a and c:
            out[f"swap-all overhead L={L}"] = c / a - 1
        t = _med(systems, "torch cell loop", L)
        if a and t:
            out[f"dcf / torch cell loop L={L}"] = a / t
        s = _med(systems, "torch save_on_cpu", L)
        if t and s:
            out[f"save_on_cpu overhead L={L}"] = s / t - 1
        k = _med(systems, "torch cudnn", L)
        if a and k:
            out[f"dcf / cudnn L={L}"] = a / k
    if longest.get("dcf"):
        out["longest swap / longest no-swap"] = longest.get("dcf swap", 0) / longest["dcf"]
    return out


def _plot(systems: dict, budget: int | None, config: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name, rows in systems.items():
        Ls = sorted(rows)
        xs = [L for L in Ls if rows[L][0] is not None]
        ys = [rows[L][0].median * 1e3 for L in xs]
        line, = ax1.plot(xs, ys, marker="o", label=name)
        oom = [L for L in Ls if rows[L][0] is None]
        if oom:
            ax1.plot([oom[0]], [max(ys) if ys else 0], marker="x", ms=12, color=line.get_color())
        px = [L for L in Ls if rows[L][1] is not None]
        ax2.plot(px, [rows[L][1] / 2**30 for L in px], marker="o", label=name,
                 color=line.get_color())
    ax1.set_xlabel("sequence length (steps)")
    ax1.set_ylabel("ms per loop iteration (fwd+bwd)")
    ax1.set_yscale("log")
    ax1.set_title("time per loop iteration (x: first OOM)")
    ax1.legend(fontsize=8)
    if budget:
        ax2.axhline(budget / 2**30, color="k", ls="--", label="budget")
    ax2.set_xlabel("sequence length (steps)")
    ax2.set_ylabel("peak device memory (GiB)")
    ax2.legend(fontsize=8)
    fig.suptitle(f"LSTM {config['units']} units, batch {config['batch']}: {config['card']}, "
                 f"{config['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
