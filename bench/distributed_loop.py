"""Distributed while loop with a trivial body (the paper's Figure "performance of a
distributed while-loop with a trivial body", section 6.1).

One ``while_loop`` whose body puts one scalar float32 add on each of N worker processes
(``dcf.Cluster.local(N)``); the counter ``i`` and the predicate ``i < n`` live on task 0:

* ``no barrier``: loop vars ``(i, x_0, ..., x_{N-1})``; ``x_k``, its loop machinery and
  ``x_k + 1`` on task k. Tasks share only the predicate, so each partition runs ahead of
  the others within ``parallel_iterations`` (32): no per-iteration round trip.
* ``barrier``: loop vars ``(i, x)`` with ``x`` on task 0; task k computes ``x + 1`` and the
  next ``x = add_n(y_0..y_{N-1}) * (1/N)`` is summed on task 0, so every iteration waits
  for every task.

This is the graph `bench.peers.tf1_distributed_loop` builds for TensorFlow 1.x (gRPC
servers on 127.0.0.1, one per task, in one process), measured in the same run where
TensorFlow is importable. One sample is one ``Session.run`` of the whole loop;
iterations/s = n / seconds. dcf's n is calibrated so that a run lasts about 0.25 s
(0.1 s with --quick); each result is checked (every ``x`` ends at n). Systems are
measured in alternating rounds so that bursts of outside load on a shared machine land
on both. Reported: median with 5th/95th percentiles and min/max, ratios dcf / TF1 of
the medians, and a PNG of iterations/s against N.

    python -m bench.distributed_loop [--quick] [--workers 1,2,4,8,16] [--no-peer] [--out FILE]

Without TensorFlow (or with --no-peer) only dcf is measured. dcf's workers talk over
Unix-domain sockets (ZeroMQ ipc, `Cluster.local`'s default on Linux).
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import tempfile
import time
from typing import Any

import numpy as np

import dcf
from bench.harness import (
    Result,
    Stats,
    base_argparser,
    cpu_model,
    peer_available,
    peer_versions,
    report,
)
from dcf.cluster import _ipc_available

PARALLEL_ITERATIONS = 32
VARIANTS = {False: "no barrier", True: "barrier"}


def task(k: int) -> str:
    return f"/job:worker/task:{k}"


def build(num_workers: int, barrier: bool) -> tuple[dcf.Graph, Any, Any]:
    """(graph, fetches, n placeholder) of the benchmark loop over `num_workers` tasks."""
    g = dcf.Graph()
    with g.as_default():
        with dcf.device(task(0)):
            n = dcf.placeholder(dcf.int32, (), name="n")
            i0 = dcf.constant(0, name="i0")
        if barrier:
            with dcf.device(task(0)):
                x0 = dcf.constant(0.0, name="x0")
            scale = 1.0 / num_workers

            def body(i, x):
                ys = []
                for k in range(num_workers):
                    with dcf.device(task(k)):
                        ys.append(x + 1.0)
                with dcf.device(task(0)):
                    return i + 1, dcf.add_n(ys) * scale

            loop_vars = [i0, x0]
        else:
            xs0 = []
            for k in range(num_workers):
                with dcf.device(task(k)):
                    xs0.append(dcf.constant(0.0, name=f"x0_{k}"))

            def body(i, *xs):
                out = []
                for k, x in enumerate(xs):
                    with dcf.device(task(k)):
                        out.append(x + 1.0)
                with dcf.device(task(0)):
                    return (i + 1, *out)

            loop_vars = [i0, *xs0]

        def cond(i, *_):
            with dcf.device(task(0)):
                return i < n

        # Unplaced, each loop variable's Enter/Merge/Switch/NextIteration/Exit goes where
        # its initial value is (dcf.placement), as the TF1 peer's device function does.
        final = dcf.while_loop(cond, body, loop_vars, parallel_iterations=PARALLEL_ITERATIONS)
    return g, final, n


class DcfCase:
    """One benchmark graph in a session on a cluster."""

    def __init__(self, cluster: dcf.Cluster, num_workers: int, barrier: bool) -> None:
        self.graph, self.fetch, self.n = build(num_workers, barrier)
        self.session = dcf.Session(self.graph, cluster=cluster)

    def run(self, n: int) -> float:
        t = time.perf_counter()
        values = self.session.run(self.fetch, {self.n: n})
        dt = time.perf_counter() - t
        if int(values[0]) != n or any(abs(float(v) - n) > 1e-3 * n for v in values[1:]):
            raise RuntimeError(f"distributed loop computed {values}, expected all {n}")
        return dt

    def calibrate(self, target_s: float) -> int:
        """The n whose run lasts about `target_s`. The first run builds the partitions'
        plans, many times a warm run's time: it is not a measure."""
        n = 200
        self.run(n)
        while True:
            dt = self.run(n)
            if dt >= target_s / 4 or n >= 2_000_000:
                return int(min(2_000_000, max(1000, n * target_s / max(dt, 1e-6))))
            n *= 8

    def close(self) -> None:
        self.session.close()


def _tf1(num_workers: int, barrier: bool, iters: int, repeat: int) -> Stats:
    from bench.peers import tf1_distributed_loop

    return tf1_distributed_loop(num_workers, barrier, iters, repeat=repeat, warmup=1)


def _rates(samples_s: list[float], n: int) -> dict[str, float]:
    """The printed and plotted it/s: those of the JSON's row (n / the time statistics;
    percentiles of the rates themselves differ where they interpolate)."""
    r = Result.rate("", "", Stats.from_samples(samples_s), n)
    return {"median": r.median, "p5": r.p5, "p95": r.p95}


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "python": platform.python_version(),
            "numpy": np.__version__, "dcf": getattr(dcf, "__version__", "?"),
            "loadavg_start": list(os.getloadavg())}


def plot(points: dict, path: str, workers: list[int]) -> str | None:
    """it/s against N, one line per (system, variant), 5th-95th percentile bars."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = {("dcf", False): ("tab:blue", "-o"), ("dcf", True): ("tab:blue", "--s"),
              ("tf1", False): ("tab:orange", "-o"), ("tf1", True): ("tab:orange", "--s")}
    for (system, barrier), pts in sorted(points.items()):
        if not pts:
            continue
        ns = [p[0] for p in pts]
        med = [p[1]["median"] for p in pts]
        lo = [p[1]["median"] - p[1]["p5"] for p in pts]
        hi = [p[1]["p95"] - p[1]["median"] for p in pts]
        color, fmt = styles[(system, barrier)]
        ax.errorbar(ns, med, yerr=[lo, hi], fmt=fmt, color=color, capsize=3,
                    label=f"{'dcf' if system == 'dcf' else 'TF 1.x'} ({VARIANTS[barrier]})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(workers)
    ax.set_xticklabels([str(w) for w in workers])
    ax.set_xlabel("worker processes (N)")
    ax.set_ylabel("iterations / s (median, 5th-95th pct)")
    ax.set_title("Distributed while loop, trivial body")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict:
    ap = base_argparser(__doc__.split("\n")[0])
    ap.add_argument("--workers", default=None,
                    help="comma-separated worker counts, e.g. 1,2,4,8,16 (default 1,2,4,8; "
                         "quick 1,2,4)")
    ap.add_argument("--no-peer", action="store_true", help="skip TensorFlow")
    args = ap.parse_args(argv)
    quick = args.quick
    workers = [int(w) for w in (args.workers or ("1,2,4" if quick else "1,2,4,8")).split(",")]
    target_s = 0.1 if quick else 0.25
    repeat = 5 if quick else 16          # dcf samples per (N, variant), at least
    rounds = 1 if quick else 3           # alternations of dcf and TF1 blocks
    tf_repeat = 2 if quick else 3        # TF1 samples per block
    per_round = math.ceil(repeat / rounds)
    use_tf = not args.no_peer and peer_available("tf1")
    config: dict[str, Any] = {"quick": quick, "workers": workers,
                              "parallel_iterations": PARALLEL_ITERATIONS,
                              "dcf_repeat": per_round * rounds, "rounds": rounds,
                              "tf1_repeat": tf_repeat * rounds if use_tf else None,
                              "tf1": peer_versions().get("tf1") if use_tf else None,
                              "dcf_endpoints": "ipc" if _ipc_available() else "tcp",
                              **machine()}
    results: list[Result] = []
    ratios: dict[str, Any] = {}
    points: dict = {(s, b): [] for s in ("dcf", "tf1") for b in (False, True)}
    started = time.perf_counter()
    for nw in workers:
        with dcf.Cluster.local(nw) as cluster:
            for barrier in (False, True):
                label = f"N={nw} {VARIANTS[barrier]}"
                case = DcfCase(cluster, nw, barrier)
                try:
                    n = case.calibrate(target_s)
                    for _ in range(2):
                        case.run(n)            # warm-up
                    tf_iters = max(200, min(3000, 600 if quick else 2000))
                    dcf_samples: list[float] = []
                    tf_samples: list[float] = []
                    for _ in range(rounds):
                        dcf_samples += [case.run(n) for _ in range(per_round)]
                        if use_tf:
                            st = _tf1(nw, barrier, tf_iters, tf_repeat)
                            tf_samples += st.samples
                finally:
                    case.close()
                ds = Stats.from_samples(dcf_samples, extra={"iterations": n})
                # a loop's iterations per run (dcf's calibrated, TF1's fixed): the rates
                # amortise a run's fixed cost over them
                config.setdefault("iterations", {})[label] = {
                    "dcf": n, "tf1": tf_iters if tf_samples else None}
                results.append(Result.rate("dcf", f"{label} it/s", ds, n))
                points[("dcf", barrier)].append((nw, _rates(dcf_samples, n)))
                dr = _rates(dcf_samples, n)
                line = (f"  {label:<18} dcf {dr['median']:>9.0f} it/s "
                        f"[{dr['p5']:.0f}-{dr['p95']:.0f}] (n={n})")
                if tf_samples:
                    ts = Stats.from_samples(tf_samples, extra={"iterations": tf_iters})
                    results.append(Result.rate("tf1", f"{label} it/s", ts, tf_iters))
                    points[("tf1", barrier)].append((nw, _rates(tf_samples, tf_iters)))
                    ratio = (n / ds.median) / (tf_iters / ts.median)
                    ratios[f"dcf/tf1 {label}"] = ratio
                    tr = _rates(tf_samples, tf_iters)
                    line += (f"   tf1 {tr['median']:>8.0f} it/s [{tr['p5']:.0f}-{tr['p95']:.0f}]"
                             f"   x{ratio:.2f}")
                print(line, flush=True)
    config["loadavg_end"] = list(os.getloadavg())
    config["wall_s"] = round(time.perf_counter() - started, 1)
    date = datetime.date.today().isoformat()
    # beside --out; without it in the temp folder, so that a quick run never overwrites a
    # recorded result in bench/results
    png = (os.path.splitext(args.out)[0] + ".png") if args.out else \
        os.path.join(tempfile.gettempdir(), f"distributed_loop-{date}-cpu.png")
    config["plot"] = plot(points, png, workers)
    return report("distributed_loop", config, results, ratios, args.out)


if __name__ == "__main__":
    main()
