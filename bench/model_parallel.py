"""Paper Fig. "8-layer LSTM parallel speedup": one training step of an 8-layer LSTM
written as a single while loop over time whose body is partitioned across devices,
one contiguous group of layers per device (8 layers on 2 devices: 4 and 4). The
backward loop is partitioned the same way (a GPU op's gradient is built on its
device). Reported: step time and speedup over one device, for 1, 2, 4, ... devices.

A run returns once the host has enqueued the step and its loss has reached the host,
while the GPUs may still run the step's last backward iterations and the updates
(dcf/fused.py, early fetches); the next run's work queues behind them. So a sample is
the mean over --block consecutive steps as a training loop runs them, with no
synchronisation (the steady state: every step starts and ends at the same point of the
pipeline). "step ms synchronised" is the step with the GPUs synchronised after it (the
run's latency, as before early fetches), for reference.

The 2-GPU step is paced by the host's core in the forward loop, and the speed of a core
differs from process to process on a shared host (bench/NOTES.md, "GPU, session 21"):
`--processes N` measures again in N fresh processes, one after another, and reports the
median over them of each process's own speedup beside this process's.

    python -m bench.model_parallel --out bench/results/model_parallel-DATE-CARD.json
    python -m bench.model_parallel --processes 5       # and the median over 5 processes
    python -m bench.model_parallel --cpu --max-devices 2 --quick     # on CPU devices
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bench import gpu_common as G
from bench.harness import (Result, Stats, base_argparser, host_python_seconds, report,
                           results_in_own_process)

BENCH = "model_parallel"


class MultiLayerLSTM:
    def __init__(self, devs: list[str], layers: int, B: int, U: int, D: int, pi: int) -> None:
        import dcf
        from dcf import nn

        ldev = [devs[k * len(devs) // layers] for k in range(layers)]
        self.layer_devices = ldev
        self.g = dcf.Graph()
        with self.g.as_default():
            with dcf.device(ldev[0]):
                self.x = dcf.placeholder(dcf.float32, [None, B, D], name="x")
                steps = dcf.shape(self.x)[0]
                in_ta = dcf.TensorArray(dcf.float32, size=steps, element_shape=(B, D),
                                        name="inputs").unstack(self.x)
            cells, state0 = [], []
            for k in range(layers):
                with dcf.device(ldev[k]):
                    cells.append(nn.LSTMCell(U, name=f"layer{k}"))
                    state0 += [dcf.zeros([B, U]), dcf.zeros([B, U])]

            def body(t, *flat):
                with dcf.device(ldev[0]):
                    inp = in_ta.read(t)
                new = []
                for k in range(layers):
                    with dcf.device(ldev[k]):
                        h, st = cells[k](inp, nn.LSTMStateTuple(flat[2 * k], flat[2 * k + 1]))
                        new += [st.c, st.h]
                        inp = h
                with dcf.device(ldev[0]):
                    t1 = t + 1
                return (t1,) + tuple(new)

            # No device scope around the loop: each layer's loop variables (Enter/Merge/
            # Switch/NextIteration/Exit) go where their initial state is, the layer's
            # device; the counter and predicate stay on the host.
            res = dcf.while_loop(lambda t, *_: t < steps, body, (0,) + tuple(state0),
                                 parallel_iterations=pi)
            with dcf.device(ldev[-1]):
                self.loss = dcf.reduce_sum(res[-1])
            # gradient ops sit with their forward ops; each layer's update runs on the
            # layer's device (an update placed elsewhere would use its variable remotely)
            opt = dcf.train.GradientDescentOptimizer(1e-6)
            with dcf.device(ldev[0]):   # gradient-loop bookkeeping; GPU ops colocate
                pairs = opt.compute_gradients(self.loss)
            updates = []
            for k, cell in enumerate(cells):
                mine = {id(v) for v in cell.variables}
                with dcf.device(ldev[k]):
                    updates.append(opt.apply_gradients(
                        [(g, v) for g, v in pairs if id(v) in mine], name=f"update{k}"))
            self.train = dcf.group(*updates)
            init = dcf.global_variables_initializer()
        self.sess = dcf.Session(self.g)
        self.sess.run(init)

    def step(self, xv: Any) -> float:
        return float(self.sess.run([self.loss, self.train], {self.x: xv})[0])

    def close(self) -> None:
        self.sess.close()


def main(argv: list[str] | None = None) -> dict:
    ap = base_argparser(__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="use CPU devices /cpu:K")
    ap.add_argument("--max-devices", type=int, default=None)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--units", type=int, default=None, help="default 1024 (32 with --cpu)")
    ap.add_argument("--batch", type=int, default=None, help="default 256 (16 with --cpu)")
    ap.add_argument("--steps", type=int, default=None, help="sequence length (default 100)")
    ap.add_argument("--parallel-iterations", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--block", type=int, default=3,
                    help="consecutive steps per sample (their mean; default 3)")
    ap.add_argument("--processes", type=int, default=0, metavar="N",
                    help="also measure in N fresh processes, one after another, and report "
                         "the median over them of each one's speedup")
    args = ap.parse_args(argv)

    cpu = args.cpu
    if not cpu and G.gpu_count() == 0:
        G.skip(BENCH, "no GPU visible (--cpu runs on CPU devices)", args.out)
    avail = args.max_devices or (2 if cpu else G.gpu_count())
    if not cpu:
        avail = min(avail, G.gpu_count())
    counts = [n for n in (1, 2, 4, 8) if n <= avail and n <= args.layers]
    U = args.units or (32 if cpu else 1024)
    B = args.batch or (16 if cpu else 256)
    D = U
    T = args.steps or (10 if (cpu or args.quick) else 100)
    repeat = 1 if args.quick else args.repeat
    config = {"card": "cpu" if cpu else G.card_name(0), "date": G.today(),
              "layers": args.layers, "units": U, "batch": B, "depth": D, "steps": T,
              "parallel_iterations": args.parallel_iterations, "device_counts": counts,
              "repeat": repeat, "steps_per_sample": args.block}
    rng = np.random.default_rng(0)
    xv_host = (rng.standard_normal((T, B, D)) * 0.1).astype(np.float32)
    results: list[Result] = []
    times: dict[int, float] = {}
    losses: dict[int, float] = {}
    for n in counts:
        devs = G.devices(n, cpu)
        m = MultiLayerLSTM(devs, args.layers, B, U, D, args.parallel_iterations)
        try:
            if cpu:
                xv = xv_host
            else:
                from dcf import gpu_devices

                G.gpu_device(0).activate()
                xv = gpu_devices.backend().asarray(xv_host)
            losses[n] = m.step(xv)              # warm-up (and plan compilation)
            m.step(xv)
            samples = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                for _ in range(args.block):
                    m.step(xv)
                samples.append((time.perf_counter() - t0) / args.block)
            synced = []
            for _ in range(0 if cpu else repeat):
                G.sync_all()
                t0 = time.perf_counter()
                m.step(xv)
                G.sync_all()
                synced.append(time.perf_counter() - t0)
        finally:
            m.close()
        st = Stats.from_samples(samples)
        times[n] = st.median
        results.append(Result.from_stats("dcf", f"step ms devices={n}", st))
        if synced:
            results.append(Result.from_stats("dcf", f"step ms synchronised devices={n}",
                                             Stats.from_samples(synced)))
        # the core's speed right after: where the step is host-bound (the 2-GPU forward
        # loop at 1024 units), its time follows it (bench/NOTES.md, "GPU, session 21")
        host = host_python_seconds()
        results.append(Result.from_stats("host", f"python loop us devices={n}", host,
                                         unit="us", scale=1e6))
        print(f"  devices={n}: {st.median * 1e3:9.2f} ms/step  layers on {m.layer_devices}"
              f"  (host: python loop {host.median * 1e6:.1f} us)", flush=True)
        del m
        G.release_device_memory()
    ratios = {f"speedup devices={n}": times[counts[0]] / t for n, t in times.items()}
    if args.processes > 0:
        ratios.update(_in_processes(args, config, counts))
    config["first_step_loss"] = losses
    payload = report(BENCH, config, results, ratios, args.out)
    if args.out and args.out.endswith(".json"):
        _plot(counts, times, config, args.out[:-5] + ".png")
    return payload


def _in_processes(args: Any, config: dict, counts: list) -> dict:
    """The same measurement in `args.processes` fresh processes, one after another:
    config["process_step_ms"] gets each one's median step (ms) per device count and its
    core's speed after the last ("host python us"); the ratios returned are the medians
    over the processes of each process's own speedups."""
    child = ["--layers", str(config["layers"]), "--units", str(config["units"]),
             "--batch", str(config["batch"]), "--steps", str(config["steps"]),
             "--parallel-iterations", str(config["parallel_iterations"]),
             "--repeat", str(args.repeat), "--block", str(args.block),
             "--max-devices", str(counts[-1])]
    child += ["--cpu"] if args.cpu else []
    child += ["--quick"] if args.quick else []
    per: list[dict] = []
    for k in range(args.processes):
        rows = results_in_own_process("bench.model_parallel", child, f"process {k}",
                                      timeout=900)
        got = {r["metric"]: r["median"] for r in rows
               if r["system"] == "dcf" and r["metric"].startswith("step ms devices=")}
        host = [r["median"] for r in rows if r["system"] == "host"]
        if host:
            got["host python us"] = host[-1]
        per.append(got)
        first = got[f"step ms devices={counts[0]}"]
        print(f"  process {k}: " + ", ".join(
            f"devices={n} {got[f'step ms devices={n}']:.1f} ms "
            f"({first / got[f'step ms devices={n}']:.3f}x)" for n in counts) +
            (f", host python {got['host python us']:.1f} us" if host else ""), flush=True)
    config["process_step_ms"] = per
    return {f"median over {len(per)} processes: speedup devices={n}": float(np.median(
        [d[f"step ms devices={counts[0]}"] / d[f"step ms devices={n}"] for d in per]))
        for n in counts[1:]}


def _plot(counts: list, times: dict, config: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(counts, [times[counts[0]] / times[n] for n in counts], marker="o", label="dcf")
    ax.plot(counts, counts, ls="--", color="grey", label="linear")
    ax.set_xlabel("devices")
    ax.set_ylabel("speedup over 1 device")
    ax.set_title(f"{config['layers']}-layer LSTM ({config['units']} units, batch "
                 f"{config['batch']}, {config['steps']} steps)\n{config['card']}, "
                 f"{config['date']}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
