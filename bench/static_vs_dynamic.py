"""Dynamic control flow vs static unrolling (paper section "Dynamic Control Flow vs.
Static Unrolling"): one LSTM training step, ``dynamic_rnn`` (a while_loop over
TensorArrays) against ``static_rnn`` (one copy of the cell per time step).

Workload: single-layer ``LSTMCell(128)``, input 64, batch-major input fed through a
placeholder (``bench.peers.lstm_data``), ``loss = reduce_mean(square(outputs))``, one
``GradientDescentOptimizer(0.01).minimize(loss)`` step per call, as
``bench.peers.tf1_lstm_step``.

1. **Time**: sequence 200 (quick 50), batch 64, 128, 256, 512 (quick 64, 128). dcf
   dynamic and static (default ``SessionConfig()``) and TF1 (``tf1_lstm_step``
   static/dynamic) where installed, each system in a fresh process of its own per round
   (3 rounds, order alternating; quick 1), dynamic and static alternating inside it. Reported: ms per
   step, the time ratio dynamic/static of each system, graph op counts, graph build time
   (forward + gradients + update) and first-run time.
2. **Memory**: one fresh subprocess per (system, kind, sequence length), batch 64 (quick
   32, dcf only, sequences 100, 200, 400): peak resident memory (``VmHWM``) of building the
   graph and running two training steps, for growing sequence lengths; the longest
   sequence whose peak stays under the stated limit (``--mem-limit-mib``, default 1024 MiB;
   quick 160 MiB). A kind stops growing
   once it is over the limit. For TF1 the limit applies to the growth over the process's
   resident size after importing TensorFlow (TF's import alone is several hundred MiB).

    python -m bench.static_vs_dynamic [--quick] [--out FILE] [--mem-limit-mib N]
    python -m bench.static_vs_dynamic --gpu [--quick] [--gpu-budget-gib G]   # one GPU
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

import numpy as np

from bench.harness import Result, Stats, base_argparser, peer_available, peer_versions, report

UNITS, INPUT = 128, 64


def _rss_kib() -> int:
    """Peak resident memory of this process image, KiB: VmHWM (ru_maxrss would include
    the parent's peak, which Linux carries across exec)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _current_rss_kib() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except OSError:
        return _rss_kib()


# ------------------------------------------------------------------------ time part
def _time_config(quick: bool) -> tuple[int, tuple[int, ...], int]:
    return (50, (64, 128), 1) if quick else (200, (64, 128, 256, 512), 3)


def time_child(spec: dict) -> dict:
    """One system's (dcf or tf1) dynamic and static steps at every batch size, in this
    fresh process; dynamic and static alternate."""
    from bench import peers
    from bench.gradients import DcfLstm
    from bench.harness import time_call

    seq, batches, _ = _time_config(spec["quick"])
    system = spec["system"]
    out: dict[str, Any] = {}
    for b in batches:
        repeat = 2 if b >= 256 or spec["quick"] else 3
        if system == "dcf":
            graphs = {}
            for kind in ("dynamic", "static"):
                g = DcfLstm(seq, b, INPUT, UNITS, kind=kind)
                g.session("dcf")          # init + the first run (timed inside)
                graphs[kind] = g
            samples: dict[str, list] = {"dynamic": [], "static": []}
            for _ in range(2):
                for kind, g in graphs.items():
                    st = time_call(lambda g=g: g.call("dcf"), repeat=repeat, warmup=1)
                    samples[kind].extend(st.samples)
            for kind, g in graphs.items():
                out[f"{kind}|{b}"] = {"samples": samples[kind], "num_ops": g.num_ops,
                                      "build_s": g.build_s,
                                      "first_run_s": g.first_run_s["dcf"],
                                      "build_and_first_run_s": g.build_s + g.first_run_s["dcf"]}
                g.close()
        else:
            for kind in ("dynamic", "static"):
                st = peers.tf1_lstm_step(kind, seq=seq, batch=b, input=INPUT, units=UNITS,
                                         repeat=2 * repeat, warmup=1)
                out[f"{kind}|{b}"] = {"samples": st.samples,
                                      **{k: st.extra[k] for k in ("num_ops", "build_s",
                                                                  "first_run_s",
                                                                  "build_and_first_run_s")}}
    return out


def time_part(quick: bool) -> tuple[list[Result], dict, dict]:
    from bench.gradients import run_child

    seq, batches, rounds = _time_config(quick)
    systems = ["dcf"] + (["tf1"] if peer_available("tf1_rnn") else [])
    results: list[Result] = []
    ratios: dict[str, Any] = {}
    facts: dict[str, Any] = {"seq": seq, "batches": list(batches), "rounds": rounds}
    pooled: dict[tuple[str, str, int], list[float]] = {}
    for r in range(rounds):
        for system in (systems if r % 2 == 0 else systems[::-1]):
            out = run_child("bench.static_vs_dynamic", {"part": "time", "system": system,
                                                        "quick": quick}, timeout_s=1800)
            if "error" in out:
                facts[f"{system}_round{r}_error"] = out["error"][-800:]
                continue
            for key, val in out.items():
                kind, b = key.split("|")
                pooled.setdefault((system, kind, int(b)), []).extend(val.pop("samples"))
                facts.setdefault(f"{system}_{kind}_b{b}", val)   # first round's build facts
    for b in batches:
        med, best = {}, {}
        for system in systems:
            for kind in ("dynamic", "static"):
                xs = pooled.get((system, kind, b))
                if not xs:
                    continue
                st = Stats.from_samples(xs)
                med[(system, kind)] = st.median
                best[(system, kind)] = st.min
                results.append(Result.from_stats(f"{system}-{kind}",
                                                 f"train step seq {seq} batch {b}", st))
        for system in systems:
            if (system, "dynamic") in med and (system, "static") in med:
                ratios[f"{system}:dynamic/static b{b}"] = \
                    med[(system, "dynamic")] / med[(system, "static")]
                ratios[f"{system}:dynamic/static b{b} (min)"] = \
                    best[(system, "dynamic")] / best[(system, "static")]
            d, s = facts.get(f"{system}_dynamic_b{b}"), facts.get(f"{system}_static_b{b}")
            if d and s:
                ratios[f"{system}:build+first run static/dynamic b{b}"] = \
                    s["build_and_first_run_s"] / d["build_and_first_run_s"]
        for kind in ("dynamic", "static"):
            if ("dcf", kind) in med and ("tf1", kind) in med:
                ratios[f"{kind}:dcf/tf1 b{b}"] = med[("dcf", kind)] / med[("tf1", kind)]
                ratios[f"{kind}:dcf/tf1 b{b} (min)"] = best[("dcf", kind)] / best[("tf1", kind)]
    return results, ratios, facts


# ---------------------------------------------------------------------- memory part
def _child(spec: dict) -> dict:
    """One config in a fresh process: build, init, two training steps; peak RSS."""
    if spec.get("part") == "time":
        return time_child(spec)
    system, kind, seq, batch = spec["system"], spec["kind"], spec["seq"], spec["batch"]
    base0 = _current_rss_kib()
    if system == "tf1":
        from bench import peers

        peers._tf1()
        import tensorflow  # noqa: F401

        base = _current_rss_kib()
        st = peers.tf1_lstm_step(kind, seq=seq, batch=batch, input=INPUT, units=UNITS,
                                 repeat=1, warmup=0)
        return {"peak_kib": _rss_kib(), "base_kib": base, "num_ops": st.extra["num_ops"],
                "build_s": st.extra["build_s"], "first_run_s": st.extra["first_run_s"],
                "step_s": st.median}
    import dcf
    from bench.gradients import DcfLstm

    _ = dcf
    base = _current_rss_kib()
    g = DcfLstm(seq, batch, INPUT, UNITS, kind=kind)
    g.session("dcf")
    t0 = time.perf_counter()
    g.call("dcf")
    step = time.perf_counter() - t0
    out = {"peak_kib": _rss_kib(), "base_kib": base, "start_kib": base0, "num_ops": g.num_ops,
           "build_s": g.build_s, "first_run_s": g.first_run_s["dcf"], "step_s": step}
    g.close()
    return out


def memory_part(quick: bool, limit_mib: float) -> tuple[list[Result], dict, dict]:
    from bench.gradients import run_child

    batch = 32 if quick else 64
    seqs = (100, 200, 400) if quick else \
        (100, 200, 300, 400, 600, 800, 1200, 1600, 2400, 3200)
    systems = [("dcf", "dynamic"), ("dcf", "static")]
    if peer_available("tf1_rnn") and not quick:   # TF1 imports take too long for --quick
        systems += [("tf1", "dynamic"), ("tf1", "static")]
    limit_kib = limit_mib * 1024
    rows: dict[str, list[dict]] = {}
    longest: dict[str, Any] = {}
    for system, kind in systems:
        key = f"{system}-{kind}"
        rows[key] = []
        longest[key] = None
        for seq in seqs:
            r = run_child("bench.static_vs_dynamic", {"system": system, "kind": kind, "seq": seq, "batch": batch},
                          timeout_s=120 if quick else 600)
            r["seq"] = seq
            rows[key].append(r)
            if "error" in r:
                break
            used = r["peak_kib"] - (r["base_kib"] if system == "tf1" else 0)
            r["counted_mib"] = used / 1024
            if used > limit_kib:
                break
            longest[key] = seq
    results = []
    for key, rs in rows.items():
        for r in rs:
            if "counted_mib" in r:
                v = r["counted_mib"]
                results.append(Result(key, f"peak memory seq {r['seq']} batch {batch}", v, v, v,
                                      "MiB"))
    ratios: dict[str, Any] = {}
    for sysname in ("dcf", "tf1"):
        d, s = longest.get(f"{sysname}-dynamic"), longest.get(f"{sysname}-static")
        if d and s:
            ratios[f"{sysname}:longest seq under limit dynamic/static"] = d / s
    facts = {"batch": batch, "limit_mib": limit_mib, "seqs": list(seqs),
             "limit_rule": "dcf: peak RSS of the whole process; tf1: peak RSS minus the "
                           "RSS after importing TensorFlow",
             "longest_seq_under_limit": longest, "rows": rows}
    return results, ratios, facts


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        from bench.gradients import child_main

        child_main(_child)
    ap = base_argparser(__doc__.split("\n\n")[0])
    ap.add_argument("--mem-limit-mib", type=float, default=None,
                    help="memory limit for the longest-sequence search (default 1024; quick 160)")
    ap.add_argument("--skip-memory", action="store_true", help="only the time part")
    ap.add_argument("--gpu", action="store_true",
                    help="on /gpu:0 (bench/static_vs_dynamic_gpu.py): 512 units for the time "
                         "part, 2048 units and batch 256 under --gpu-budget-gib for memory")
    ap.add_argument("--gpu-budget-gib", type=float, default=12.0,
                    help="device memory budget of the GPU memory part (default 12, a K40)")
    args = ap.parse_args()
    if args.gpu:
        from bench import static_vs_dynamic_gpu

        static_vs_dynamic_gpu.main(args)
        return
    from bench.gradients import machine_config

    limit = args.mem_limit_mib or (160.0 if args.quick else 1024.0)
    config: dict[str, Any] = {"quick": args.quick, "units": UNITS, "input": INPUT,
                              **machine_config(),
                              "peers": {"tf1_rnn": peer_available("tf1_rnn"),
                                        "versions": peer_versions()}}
    results, ratios, facts = time_part(args.quick)
    config["time"] = facts
    if not args.skip_memory:
        r2, q2, f2 = memory_part(args.quick, limit)
        results += r2
        ratios.update(q2)
        config["memory"] = f2
    config["loadavg_end"] = list(os.getloadavg())
    _ = np
    report("static_vs_dynamic", config, results, ratios, args.out)


if __name__ == "__main__":
    main()
