"""Dynamic control flow vs static unrolling (paper section "Dynamic Control Flow vs.
Static Unrolling"): one LSTM training step, ``dynamic_rnn`` (a while_loop over
TensorArrays) against ``static_rnn`` (one copy of the cell per time step).

Workload: single-layer ``LSTMCell(128)``, input 64, batch-major input fed through a
placeholder (``bench.peers.lstm_data``), ``loss = reduce_mean(square(outputs))``, one
``GradientDescentOptimizer(0.01).minimize(loss)`` step per call, as
``bench.peers.tf1_lstm_step``.

1. **Time**: sequence 200 (quick 50), batch 64, 128, 256, 512 (quick 64, 128). dcf
   dynamic and static in this process (default ``SessionConfig()``), timed in interleaved
   rounds, and TF1 (``tf1_lstm_step`` static/dynamic) where installed. Reported: ms per
   step, the time ratio dynamic/static of each system, graph op counts, graph build time
   (forward + gradients + update) and first-run time.
2. **Memory**: one fresh subprocess per (system, kind, sequence length), batch 64 (quick
   32): peak resident memory (``ru_maxrss``) of building the graph and running two training
   steps, for growing sequence lengths; the longest sequence whose peak stays under the
   stated limit (``--mem-limit-mib``, default 1024 MiB; quick 512 MiB). A kind stops growing
   once it is over the limit. For TF1 the limit applies to the growth over the process's
   resident size after importing TensorFlow (TF's import alone is several hundred MiB).

    python -m bench.static_vs_dynamic [--quick] [--out FILE] [--mem-limit-mib N]
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
import traceback
from typing import Any

import numpy as np

from bench.harness import Result, Stats, base_argparser, peer_available, peer_versions, report

UNITS, INPUT = 128, 64
_MARK = "STATIC_VS_DYNAMIC_CHILD "


def _rss_kib() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)   # KiB on Linux


def _current_rss_kib() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except OSError:
        return _rss_kib()


# ------------------------------------------------------------------------ time part
def time_part(quick: bool) -> tuple[list[Result], dict, dict]:
    from bench import peers
    from bench.gradients import DcfLstm
    from bench.harness import time_call

    seq = 50 if quick else 200
    batches = (64, 128) if quick else (64, 128, 256, 512)
    rounds = 2 if quick else 3
    tf1 = peer_available("tf1_rnn")
    results: list[Result] = []
    ratios: dict[str, Any] = {}
    facts: dict[str, Any] = {"seq": seq, "batches": list(batches), "rounds": rounds}
    for b in batches:
        repeat = 2 if b >= 256 or quick else 3
        graphs = {}
        for kind in ("dynamic", "static"):
            g = DcfLstm(seq, b, INPUT, UNITS, kind=kind)
            g.session("dcf")          # init + first run (timed inside)
            graphs[kind] = g
            facts[f"dcf_{kind}_b{b}"] = {"num_ops": g.num_ops, "build_s": g.build_s,
                                         "first_run_s": g.first_run_s["dcf"]}
        samples: dict[str, list[float]] = {}
        tf_extra: dict[str, dict] = {}
        for _ in range(rounds):
            for kind, g in graphs.items():
                st = time_call(lambda g=g: g.call("dcf"), repeat=repeat, warmup=1)
                samples.setdefault(f"dcf-{kind}", []).extend(st.samples)
            if tf1:
                for kind in ("dynamic", "static"):
                    try:
                        st = peers.tf1_lstm_step(kind, seq=seq, batch=b, input=INPUT,
                                                 units=UNITS, repeat=repeat, warmup=1)
                    except Exception as e:  # noqa: BLE001
                        facts[f"tf1_{kind}_b{b}_error"] = f"{type(e).__name__}: {e}"[:300]
                        continue
                    samples.setdefault(f"tf1-{kind}", []).extend(st.samples)
                    tf_extra.setdefault(kind, st.extra)
        for kind, ex in tf_extra.items():
            facts[f"tf1_{kind}_b{b}"] = {k: ex[k] for k in ("num_ops", "build_s", "first_run_s",
                                                            "build_and_first_run_s")}
        for g in graphs.values():
            g.close()
        med = {}
        for system, xs in samples.items():
            st = Stats.from_samples(xs)
            med[system] = st.median
            results.append(Result.from_stats(system, f"train step seq {seq} batch {b}", st))
        for sysname in ("dcf", "tf1"):
            if f"{sysname}-dynamic" in med and f"{sysname}-static" in med:
                ratios[f"{sysname}:dynamic/static b{b}"] = \
                    med[f"{sysname}-dynamic"] / med[f"{sysname}-static"]
        if "tf1-dynamic" in med:
            ratios[f"dynamic:dcf/tf1 b{b}"] = med["dcf-dynamic"] / med["tf1-dynamic"]
        if "tf1-static" in med:
            ratios[f"static:dcf/tf1 b{b}"] = med["dcf-static"] / med["tf1-static"]
        for kind in ("dynamic", "static"):
            f = facts[f"dcf_{kind}_b{b}"]
            f["build_and_first_run_s"] = f["build_s"] + f["first_run_s"]
        d, s = facts[f"dcf_dynamic_b{b}"], facts[f"dcf_static_b{b}"]
        ratios[f"dcf:build+first run static/dynamic b{b}"] = \
            s["build_and_first_run_s"] / d["build_and_first_run_s"]
        if f"tf1_static_b{b}" in facts and f"tf1_dynamic_b{b}" in facts:
            ratios[f"tf1:build+first run static/dynamic b{b}"] = \
                facts[f"tf1_static_b{b}"]["build_and_first_run_s"] / \
                facts[f"tf1_dynamic_b{b}"]["build_and_first_run_s"]
    return results, ratios, facts


# ---------------------------------------------------------------------- memory part
def _child(spec: dict) -> dict:
    """One config in a fresh process: build, init, two training steps; peak RSS."""
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


def run_child(spec: dict, timeout_s: float) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    try:
        proc = subprocess.run([sys.executable, "-m", "bench.static_vs_dynamic", "--child",
                               json.dumps(spec)], cwd=root, env=env, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout_s} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    return {"error": f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-600:]}"}


def memory_part(quick: bool, limit_mib: float) -> tuple[list[Result], dict, dict]:
    batch = 32 if quick else 64
    seqs = (50, 100, 200, 400, 800) if quick else \
        (100, 200, 300, 400, 600, 800, 1200, 1600, 2400, 3200)
    systems = [("dcf", "dynamic"), ("dcf", "static")]
    if peer_available("tf1_rnn"):
        systems += [("tf1", "dynamic"), ("tf1", "static")]
    limit_kib = limit_mib * 1024
    rows: dict[str, list[dict]] = {}
    longest: dict[str, Any] = {}
    for system, kind in systems:
        key = f"{system}-{kind}"
        rows[key] = []
        longest[key] = None
        for seq in seqs:
            r = run_child({"system": system, "kind": kind, "seq": seq, "batch": batch},
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
            if quick and seq >= 400 and system == "tf1":
                break
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
        try:
            out = _child(json.loads(sys.argv[2]))
        except BaseException:  # noqa: BLE001
            out = {"error": traceback.format_exc()[-1500:]}
        print(_MARK + json.dumps(out), flush=True)
        os._exit(0)
    ap = base_argparser(__doc__.split("\n\n")[0])
    ap.add_argument("--mem-limit-mib", type=float, default=None,
                    help="memory limit for the longest-sequence search (default 1024; quick 512)")
    ap.add_argument("--skip-memory", action="store_true", help="only the time part")
    args = ap.parse_args()
    from bench.gradients import machine_config

    limit = args.mem_limit_mib or (512.0 if args.quick else 1024.0)
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
