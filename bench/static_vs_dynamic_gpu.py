"""`python -m bench.static_vs_dynamic --gpu`: dynamic_rnn against static unrolling on one
GPU (paper section "Dynamic Control Flow vs. Static Unrolling").

1. **Time**: one training step of a single-layer LSTM (512 units, input 512), sequence
   200, batch 64, 128, 256, 512 (quick: sequence 50, batch 64); dynamic and static
   warmed twice, then their timed steps interleaved (A B B A ..., repeat each, after a
   garbage collection with the collector off). Reported: ms per step, dynamic/static of
   the medians and the median of each round's paired ratio.
2. **Memory**: the paper's example, 2048 units and batch 256 (input 512), under a device
   memory budget (`--gpu-budget-gib`, default 12 GiB, a K40's memory): the longest
   sequence each kind trains without running out (64, 128, 192, 256, 384, 512, 768,
   1024; quick: 32 units' worth smaller), with its peak live device bytes. No swapping:
   `swap_memory` is off for both.

Loss: mean of the squared outputs; one `GradientDescentOptimizer(1e-6)` step per run.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bench import gpu_common as G
from bench.harness import Result, report
from bench.lstm_swap import _input, _measure_paired, _warm


class GpuLstm:
    def __init__(self, kind: str, seq: int, batch: int, inp: int, units: int,
                 budget: int | None = None, parallel_iterations: int = 32) -> None:
        import dcf

        t0 = time.perf_counter()
        self.g = dcf.Graph()
        with self.g.as_default(), dcf.device("/gpu:0"):
            self.x = dcf.placeholder(dcf.float32, [seq, batch, inp], name="x")
            cell = dcf.nn.LSTMCell(units, name="lstm")
            if kind == "dynamic":
                out, _ = dcf.nn.dynamic_rnn(cell, self.x, dtype=dcf.float32,
                                            time_major=True,
                                            parallel_iterations=parallel_iterations)
            else:
                outs, _ = dcf.nn.static_rnn(cell, dcf.unstack(self.x, axis=0),
                                            dtype=dcf.float32)
                out = dcf.stack(outs, axis=0)
            self.loss = dcf.reduce_mean(dcf.square(out))
            self.train = dcf.train.GradientDescentOptimizer(1e-6).minimize(self.loss)
            init = dcf.global_variables_initializer()
        self.num_ops = len(self.g.get_operations())
        self.build_s = time.perf_counter() - t0
        self.sess = dcf.Session(self.g, config=dcf.SessionConfig(gpu_memory_limit=budget))
        self.sess.run(init)

    def step(self, xv: Any) -> float:
        return float(self.sess.run([self.loss, self.train], {self.x: xv})[0])

    def close(self) -> None:
        self.sess.close()


def time_part(quick: bool, units: int, inp: int, repeat: int) -> tuple[list, dict, dict]:
    seq, batches = (50, (64,)) if quick else (200, (64, 128, 256, 512))
    results: list[Result] = []
    ratios: dict[str, Any] = {}
    facts: dict[str, Any] = {"seq": seq, "batches": list(batches), "units": units,
                             "input": inp, "repeat": repeat}
    for b in batches:
        xv = _input(seq, b, inp, False)
        models = {k: GpuLstm(k, seq, b, inp, units) for k in ("dynamic", "static")}
        try:
            losses = {k: m.step(xv) for k, m in models.items()}
            pair: dict = {}
            got = _measure_paired({k: (lambda m=m: m.step(xv)) for k, m in models.items()},
                                  1, repeat, False, pair)
            for k, (st, peak, status) in got.items():
                if st is None:
                    facts[f"{k}_b{b}"] = status
                    continue
                results.append(Result.from_stats(f"dcf-{k}", f"train step seq {seq} batch {b}", st))
                facts[f"{k}_b{b}"] = {"num_ops": models[k].num_ops, "build_s": models[k].build_s,
                                      "peak_bytes": peak, "loss": losses[k]}
            if all(got[k][0] is not None for k in got):
                ratios[f"dynamic/static b{b}"] = got["dynamic"][0].median / got["static"][0].median
                if pair.get("static"):     # static/dynamic per round -> invert
                    ratios[f"dynamic/static b{b} (paired)"] = \
                        float(np.median([1.0 / r for r in pair["static"]]))
            print(f"  batch {b}: " + ", ".join(
                f"{k} {got[k][0].median * 1e3:.2f} ms" for k in got if got[k][0] is not None),
                flush=True)
        finally:
            for m in models.values():
                m.close()
            del xv
            G.release_device_memory()
    return results, ratios, facts


def memory_part(quick: bool, budget: int) -> tuple[list, dict, dict]:
    units, batch, inp = (256, 32, 64) if quick else (2048, 256, 512)
    seqs = (16, 32, 64, 128) if quick else (64, 128, 192, 256, 384, 512, 768, 1024)
    longest: dict[str, Any] = {}
    rows: dict[str, list] = {}
    results: list[Result] = []
    for kind in ("dynamic", "static"):
        longest[kind] = None
        rows[kind] = []
        for seq in seqs:
            G.release_device_memory()
            xv = _input(seq, batch, inp, False)
            m = GpuLstm(kind, seq, batch, inp, units, budget)
            try:
                peak, status = _warm(lambda: m.step(xv), False)   # (peak, "ok" / "OOM: ...")
            finally:
                m.close()
                del xv
                G.release_device_memory()
            rows[kind].append({"seq": seq, "status": status, "peak_bytes": peak})
            print(f"  {kind:8s} seq {seq:5d}: {status}"
                  + (f", peak {peak / 2**30:.2f} GiB" if peak else ""), flush=True)
            if status != "ok":
                break
            longest[kind] = seq
            results.append(Result(f"dcf-{kind}", f"peak GiB seq {seq}", peak / 2**30,
                                  peak / 2**30, peak / 2**30, "GiB"))
    ratios = {}
    if longest["dynamic"] and longest["static"]:
        ratios["longest seq dynamic/static"] = longest["dynamic"] / longest["static"]
    facts = {"units": units, "batch": batch, "input": inp, "budget_bytes": budget,
             "seqs": list(seqs), "longest": longest, "rows": rows, "swap_memory": False}
    return results, ratios, facts


def main(args: Any) -> None:
    if G.gpu_count() == 0:
        G.skip("static_vs_dynamic", "no GPU visible (cupy with a CUDA device is needed)",
               args.out)
    budget = int(args.gpu_budget_gib * 2**30)
    config: dict[str, Any] = {"device": "/gpu:0", "card": G.card_name(0), "date": G.today(),
                              "quick": args.quick}
    # 16 rounds: the device hosts have slow phases of a few steps (a step 30-60 % longer,
    # bench/NOTES.md "GPU, session 16"); with 6 rounds one such phase moved the paired
    # median by several per cent ("GPU, session 18")
    results, ratios, facts = time_part(args.quick, 512, 512, 2 if args.quick else 16)
    config["time"] = facts
    if not args.skip_memory:
        r2, q2, f2 = memory_part(args.quick, budget)
        results += r2
        ratios.update(q2)
        config["memory"] = f2
    report("static_vs_dynamic", config, results, ratios, args.out)
