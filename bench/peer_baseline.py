"""Peer baselines: run every peer workload of ``bench.peers`` and report it.

    python -m bench.peer_baseline [--quick] [--out FILE] [--only GROUPS] [--max-tasks N]

Groups: ``loop_rate`` (TF1), ``grad_chain`` (TF1, PyTorch, JAX), ``lstm``
(TF1 dynamic/static, PyTorch cell loop/fused, JAX scan) and ``distributed``
(TF1 gRPC on loopback). Peers that are not installed are skipped and listed
in the config's ``skipped``. Loop rates are iterations/s, everything else ms
per call; TF1 graph sizes and build times are reported as extra rows.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any

from bench.harness import (
    Result,
    Stats,
    base_argparser,
    peer_available,
    peer_versions,
    report,
)

GROUPS = ("loop_rate", "grad_chain", "lstm", "distributed")


def _scalar(system: str, metric: str, value: float, unit: str) -> Result:
    """A single-valued row (op counts, one-off build times)."""
    return Result(system=system, metric=metric, median=value, min=value, max=value, unit=unit)


def _ratio(a: Result | None, b: Result | None) -> float | None:
    if a is None or b is None or not b.median:
        return None
    return a.median / b.median


def run_loop_rate(quick: bool, results: list[Result], ratios: dict[str, Any]) -> None:
    """TF1 loop rates: trivial and matmul64 bodies, parallel_iterations 1 and 32."""
    from bench import peers

    repeat, warmup = (5, 1) if quick else (10, 2)
    sizes = {"trivial": 10_000 if quick else 100_000, "matmul64": 1_000 if quick else 5_000}
    for body, n in sizes.items():
        rows: dict[int, Result] = {}
        for pi in (1, 32):
            st = peers.tf1_loop_rate(n, pi, body, repeat=repeat, warmup=warmup)  # type: ignore[arg-type]
            rows[pi] = Result.rate("tf1", f"loop_rate {body} n={n} pi={pi}", st, n)
            results.append(rows[pi])
        ratios[f"tf1 loop_rate {body} pi32/pi1"] = _ratio(rows[32], rows[1])


def run_grad_chain(quick: bool, results: list[Result], ratios: dict[str, Any]) -> None:
    """Forward+backward of the tanh(x @ W) chain, 3 and 1000 steps, on each peer."""
    from bench import peers

    repeat, warmup = (5, 1) if quick else (20, 3)
    funcs = {
        "tf1": (peers.tf1_grad_chain, "tf1"),
        "torch": (peers.torch_grad_chain, "torch"),
        "jax": (peers.jax_grad_chain, "jax"),
    }
    for iters in (3, 1000):
        rows: dict[str, Result] = {}
        for system, (fn, peer) in funcs.items():
            if not peer_available(peer):
                continue
            st = fn(iters, repeat=repeat, warmup=warmup)
            rows[system] = Result.from_stats(system, f"grad_chain iters={iters}", st)
            results.append(rows[system])
            if system == "tf1":
                results.append(
                    _scalar(
                        "tf1", f"grad_chain iters={iters} graph ops", st.extra["num_ops"], "ops"
                    )
                )
        ratios[f"grad_chain iters={iters} tf1/torch"] = _ratio(rows.get("tf1"), rows.get("torch"))
        ratios[f"grad_chain iters={iters} tf1/jax"] = _ratio(rows.get("tf1"), rows.get("jax"))


def run_lstm(quick: bool, results: list[Result], ratios: dict[str, Any]) -> None:
    """LSTM training step (seq 100, batch 32, input 64, 128 units; seq 20 with --quick)."""
    from bench import peers

    shape = {"seq": 20 if quick else 100, "batch": 32, "input": 64, "units": 128}
    repeat, warmup = (3, 1) if quick else (10, 2)
    tag = f"seq={shape['seq']} batch={shape['batch']}"
    rows: dict[str, Result] = {}
    if peer_available("tf1_rnn"):
        for kind in ("dynamic", "static"):
            st = peers.tf1_lstm_step(kind, **shape, repeat=repeat, warmup=warmup)  # type: ignore[arg-type]
            rows[f"tf1 {kind}"] = Result.from_stats("tf1", f"lstm_step {kind} {tag}", st)
            results.append(rows[f"tf1 {kind}"])
            results.append(
                _scalar("tf1", f"lstm_step {kind} graph ops", st.extra["num_ops"], "ops")
            )
            results.append(_scalar("tf1", f"lstm_step {kind} build", st.extra["build_s"], "s"))
            results.append(
                _scalar(
                    "tf1",
                    f"lstm_step {kind} build+first run",
                    st.extra["build_and_first_run_s"],
                    "s",
                )
            )
    if peer_available("torch"):
        for kind in ("cell_loop", "fused"):
            st = peers.torch_lstm_step(kind, **shape, repeat=repeat, warmup=warmup)  # type: ignore[arg-type]
            rows[f"torch {kind}"] = Result.from_stats("torch", f"lstm_step {kind} {tag}", st)
            results.append(rows[f"torch {kind}"])
    if peer_available("jax"):
        st = peers.jax_lstm_step(**shape, repeat=repeat, warmup=warmup)
        rows["jax"] = Result.from_stats("jax", f"lstm_step scan {tag}", st)
        results.append(rows["jax"])
        results.append(
            _scalar(
                "jax", "lstm_step scan compile+first run", st.extra["compile_and_first_run_s"], "s"
            )
        )
    ratios["lstm tf1 dynamic/static"] = _ratio(rows.get("tf1 dynamic"), rows.get("tf1 static"))
    ratios["lstm tf1 dynamic/torch cell_loop"] = _ratio(
        rows.get("tf1 dynamic"), rows.get("torch cell_loop")
    )
    ratios["lstm torch cell_loop/fused"] = _ratio(
        rows.get("torch cell_loop"), rows.get("torch fused")
    )


def run_distributed(
    quick: bool, max_tasks: int, results: list[Result], ratios: dict[str, Any]
) -> None:
    """TF1 distributed loop over 1..max_tasks loopback gRPC tasks, with/without barrier."""
    from bench import peers

    iters = 200 if quick else 1000
    repeat, warmup = (3, 1) if quick else (7, 1)
    counts = [n for n in (1, 2, 4, 8, 16) if n <= max_tasks]
    for n in counts:
        rows: dict[bool, Result] = {}
        for barrier in (False, True):
            st: Stats = peers.tf1_distributed_loop(n, barrier, iters, repeat=repeat, warmup=warmup)
            name = "barrier" if barrier else "no barrier"
            rows[barrier] = Result.rate("tf1", f"distributed_loop tasks={n} {name}", st, iters)
            results.append(rows[barrier])
        ratios[f"tf1 distributed tasks={n} barrier/no-barrier"] = _ratio(rows[True], rows[False])


def main(argv: list[str] | None = None) -> int:
    """Run the selected peer groups and print the harness table and JSON line."""
    parser = base_argparser(__doc__.splitlines()[0] if __doc__ else "peer baselines")
    parser.add_argument(
        "--only", default=",".join(GROUPS), help=f"comma-separated groups from {', '.join(GROUPS)}"
    )
    parser.add_argument(
        "--max-tasks",
        type=int,
        default=None,
        help="largest task count of the distributed loop (default 2 with --quick, else 8)",
    )
    args = parser.parse_args(argv)
    groups = [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        parser.error(f"unknown group(s) {unknown}; choose from {list(GROUPS)}")
    quick: bool = args.quick
    max_tasks = args.max_tasks if args.max_tasks is not None else (2 if quick else 8)

    available = {p: peer_available(p) for p in ("tf1", "tf1_rnn", "torch", "jax")}
    skipped: list[str] = []
    results: list[Result] = []
    ratios: dict[str, Any] = {}
    t0 = time.perf_counter()
    for group in groups:
        if group in ("loop_rate", "distributed") and not available["tf1"]:
            skipped.append(f"{group} (tf1 not importable)")
            continue
        print(f"[peer_baseline] {group} ...", file=sys.stderr, flush=True)
        if group == "loop_rate":
            run_loop_rate(quick, results, ratios)
        elif group == "grad_chain":
            run_grad_chain(quick, results, ratios)
        elif group == "lstm":
            run_lstm(quick, results, ratios)
        elif group == "distributed":
            run_distributed(quick, max_tasks, results, ratios)
    skipped.extend(f"{p} (not importable)" for p, ok in available.items() if not ok)

    config: dict[str, Any] = {
        "quick": quick,
        "groups": groups,
        "max_tasks": max_tasks,
        "peers": peer_versions(),
        "skipped": skipped,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "wall_s": round(time.perf_counter() - t0, 2),
    }
    report("peer_baseline", config, results, ratios, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
