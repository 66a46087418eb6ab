"""Paper Fig. "8-layer LSTM parallel speedup": one training step of an 8-layer LSTM
written as a single while loop over time whose body is partitioned across devices,
one contiguous group of layers per device (8 layers on 2 devices: 4 and 4). The
backward loop is partitioned the same way (a GPU op's gradient is built on its
device). Reported: step time and speedup over one device, for 1, 2, 4, ... devices,
for two schedules of the same model (`--schedule`, default both): "layers", a layer after
another within each time step (MultiLayerLSTM, the paper's form; its metrics keep their
earlier names), and "wavefront" (WavefrontLSTM: layer l at time i - l, so a device's
layers in one iteration are one batched GEMM and one gates kernel, as cuDNN runs a
multi-layer LSTM; the same loss and gradients, tests/bench/test_wavefront_lstm.py).

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
    python -m bench.model_parallel --schedule wavefront               # one schedule only
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np

from bench import gpu_common as G
from bench.harness import (Result, Stats, base_argparser, host_python_seconds, report,
                           results_in_own_process)

BENCH = "model_parallel"


class MultiLayerLSTM:
    def __init__(self, devs: list[str], layers: int, B: int, U: int, D: int, pi: int,
                 dtype: Any = None) -> None:
        import dcf
        from dcf import nn

        dtype = dtype or dcf.float32

        ldev = [devs[k * len(devs) // layers] for k in range(layers)]
        self.layer_devices = ldev
        self.g = dcf.Graph()
        with self.g.as_default():
            steps, in_ta = self._inputs(ldev[0], dtype, B, D)
            cells, state0 = [], []
            for k in range(layers):
                with dcf.device(ldev[k]):
                    cells.append(nn.LSTMCell(U, name=f"layer{k}"))
                    state0 += [dcf.zeros([B, U], dtype), dcf.zeros([B, U], dtype)]

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
            self.cells = cells
            self._training(ldev[0], [(ldev[k], cell.variables) for k, cell in
                                     enumerate(cells)])

    def _inputs(self, dev: str, dtype: Any, B: int, D: int) -> tuple:
        """The sequence fed as self.x on `dev`: (its length, a TensorArray of its steps)."""
        import dcf

        with dcf.device(dev):
            self.x = dcf.placeholder(dtype, [None, B, D], name="x")
            steps = dcf.shape(self.x)[0]
            return steps, dcf.TensorArray(dtype, size=steps, element_shape=(B, D),
                                          name="inputs").unstack(self.x)

    def _training(self, first: str, owners: list) -> None:
        """SGD on self.loss: the gradient ops sit with their forward ops (the gradient
        loop's bookkeeping on `first`), each (device, variables) of `owners` updated on its
        device (an update placed elsewhere would use its variables remotely); then the
        session, initialised."""
        import dcf

        opt = dcf.train.GradientDescentOptimizer(1e-6)
        with dcf.device(first):
            self.grads = opt.compute_gradients(self.loss)
        updates = []
        for k, (dev, variables) in enumerate(owners):
            mine = {id(v) for v in variables}
            with dcf.device(dev):
                updates.append(opt.apply_gradients(
                    [(g, v) for g, v in self.grads if id(v) in mine], name=f"update{k}"))
        self.train = dcf.group(*updates)
        init = dcf.global_variables_initializer()
        self.sess = dcf.Session(self.g)
        self.sess.run(init)

    def step(self, xv: Any) -> float:
        return float(self.sess.run([self.loss, self.train], {self.x: xv})[0])

    def close(self) -> None:
        self.sess.close()


class WavefrontLSTM(MultiLayerLSTM):
    """The same L-layer LSTM (the same variables' values, the same loss) with its layers
    in wavefront order, as cuDNN runs a multi-layer LSTM: iteration i computes layer l
    at time i - l for every layer at once, so the layers of one iteration are
    independent of each other. A device's group of layers is then one batched GEMM over
    its stacked kernels ([Lg, D + U, 4U]) and one gates kernel per iteration instead of a
    GEMM and a gates kernel per layer: fewer launches for the host, which paces the
    2-GPU step in slow processes (bench/NOTES.md, "GPU, session 27").

    The first and last L - 1 iterations, where some layers are outside their T steps,
    run before and after the loop, a layer at a time (the "prologue" and "epilogue");
    the loop runs the T - L + 1 iterations where every layer is busy. Needs D == U (the
    layers' inputs stack) and T >= L - 1 (a shorter input fails its TensorArray read)."""

    def __init__(self, devs: list[str], layers: int, B: int, U: int, D: int, pi: int,
                 dtype: Any = None) -> None:
        import dcf
        from dcf import nn
        from dcf.nn import lstm_gates, wavefront_inputs

        if D != U:
            raise ValueError(f"the wavefront schedule stacks the layers' inputs: it needs "
                             f"depth == units, got {D} and {U}")
        dtype = dtype or dcf.float32
        L = layers
        ldev = [devs[k * len(devs) // L] for k in range(L)]
        self.layer_devices = ldev
        # contiguous layers on one device
        groups = [list(ks) for _, ks in itertools.groupby(range(L), key=ldev.__getitem__)]
        self.g = dcf.Graph()
        with self.g.as_default():
            steps, in_ta = self._inputs(ldev[0], dtype, B, D)
            kernels, biases = [], []
            for gi, ks in enumerate(groups):
                with dcf.device(ldev[ks[0]]):
                    w = np.stack([nn._glorot(f"layer{k}/kernel", (D + U, 4 * U), dtype)
                                  for k in ks])
                    kernels.append(dcf.Variable(w, name=f"group{gi}/kernel"))
                    biases.append(dcf.Variable(np.zeros((len(ks), 1, 4 * U), dtype.np),
                                               name=f"group{gi}/bias"))
            # each layer's kernel and bias for the prologue and epilogue: one unstack of
            # a group's variables (its gradient one stack), not a slice per use
            w_of, b_of = {}, {}
            for gi, ks in enumerate(groups):
                with dcf.device(ldev[ks[0]]):
                    ws = dcf.unstack(kernels[gi], num=len(ks))
                    bs = dcf.unstack(dcf.reshape(biases[gi], [len(ks), 4 * U]), num=len(ks))
                for j, k in enumerate(ks):
                    w_of[k], b_of[k] = ws[j], bs[j]

            def layer_step(k, inp, c, h):     # one layer alone (prologue, epilogue)
                with dcf.device(ldev[k]):
                    z = dcf.matmul(dcf.concat([inp, h], 1), w_of[k])
                    return lstm_gates(z, c, 1.0, b=b_of[k])

            def peeled(active, cs, hs, x_t):
                """One iteration of the layers in `active` (per-layer lists of states)."""
                new_c, new_h = list(cs), list(hs)
                for k in active:
                    inp = x_t if k == 0 else hs[k - 1]
                    new_c[k], new_h[k] = layer_step(k, inp, cs[k], hs[k])
                return new_c, new_h

            cs = [None] * L
            hs = [None] * L
            for k in range(L):
                with dcf.device(ldev[k]):
                    cs[k] = hs[k] = dcf.zeros([B, U], dtype)
            for i in range(L - 1):                         # prologue: layers 0..i
                with dcf.device(ldev[0]):
                    x_t = in_ta.read(i)
                cs, hs = peeled(range(i + 1), cs, hs, x_t)

            state0, b_full = [], []
            for gi, ks in enumerate(groups):
                with dcf.device(ldev[ks[0]]):
                    state0 += [dcf.stack([cs[k] for k in ks]), dcf.stack([hs[k] for k in ks])]
                    # the bias over the batch, once a run: the gates kernel adds it as it
                    # reads z, and its gradient in the loop is dz itself (no sum there). A
                    # tile, not broadcast_to, whose view the kernel would copy every step
                    b_full.append(dcf.tile(biases[gi], [1, B, 1]))

            def body(i, *flat):
                with dcf.device(ldev[0]):
                    below = in_ta.read(i)
                new = []
                for gi, ks in enumerate(groups):
                    n = len(ks)
                    c, h = flat[2 * gi], flat[2 * gi + 1]
                    with dcf.device(ldev[ks[0]]):
                        # [x_l, h_l] of every layer: x_0 = below, x_l = h_{l-1}
                        z = dcf.matmul(wavefront_inputs(below, h), kernels[gi])
                        new += list(lstm_gates(z, c, 1.0, b=b_full[gi]))
                        if gi + 1 < len(groups):
                            below = h[n - 1]   # the group's top layer, an iteration behind
                with dcf.device(ldev[0]):
                    i1 = i + 1
                return (i1,) + tuple(new)

            res = dcf.while_loop(lambda i, *_: i < steps, body, (L - 1,) + tuple(state0),
                                 parallel_iterations=pi)
            for gi, ks in enumerate(groups):
                with dcf.device(ldev[ks[0]]):
                    cs_g = dcf.unstack(res[1 + 2 * gi], num=len(ks))
                    hs_g = dcf.unstack(res[2 + 2 * gi], num=len(ks))
                for j, k in enumerate(ks):
                    cs[k], hs[k] = cs_g[j], hs_g[j]
            for e in range(L - 1):                          # epilogue: layers e+1..L-1
                cs, hs = peeled(range(e + 1, L), cs, hs, None)
            with dcf.device(ldev[-1]):
                self.loss = dcf.reduce_sum(hs[-1])
            self._training(ldev[0], [(ldev[ks[0]], [kernels[gi], biases[gi]])
                                     for gi, ks in enumerate(groups)])


SCHEDULES = {"layers": MultiLayerLSTM, "wavefront": WavefrontLSTM}


def _suffix(schedule: str) -> str:
    """Metric names: the layer-by-layer schedule keeps the names of earlier results."""
    return "" if schedule == "layers" else f" {schedule}"


def main(argv: list[str] | None = None) -> dict:
    ap = base_argparser(__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="use CPU devices /cpu:K")
    ap.add_argument("--max-devices", type=int, default=None)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--units", type=int, default=None, help="default 1024 (32 with --cpu)")
    ap.add_argument("--batch", type=int, default=None, help="default 256 (16 with --cpu)")
    ap.add_argument("--steps", type=int, default=None, help="sequence length (default 100)")
    ap.add_argument("--parallel-iterations", type=int, default=32)
    ap.add_argument("--schedule", choices=["layers", "wavefront", "both"], default="both",
                    help="layers: a layer after another in each iteration; wavefront: "
                         "layer l at time i - l, a device's layers batched (default both)")
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
    schedules = ["layers", "wavefront"] if args.schedule == "both" else [args.schedule]
    config = {"card": "cpu" if cpu else G.card_name(0), "date": G.today(),
              "layers": args.layers, "units": U, "batch": B, "depth": D, "steps": T,
              "parallel_iterations": args.parallel_iterations, "device_counts": counts,
              "schedules": schedules, "repeat": repeat, "steps_per_sample": args.block}
    rng = np.random.default_rng(0)
    xv_host = (rng.standard_normal((T, B, D)) * 0.1).astype(np.float32)
    results: list[Result] = []
    times: dict[str, dict[int, float]] = {}
    losses: dict[str, float] = {}
    for schedule in schedules:
        sfx = _suffix(schedule)
        times[schedule] = {}
        for n in counts:
            devs = G.devices(n, cpu)
            m = SCHEDULES[schedule](devs, args.layers, B, U, D, args.parallel_iterations)
            try:
                if cpu:
                    xv = xv_host
                else:
                    from dcf import gpu_devices

                    G.gpu_device(0).activate()
                    xv = gpu_devices.backend().asarray(xv_host)
                losses[f"{schedule} devices={n}"] = m.step(xv)   # warm-up (and compiles)
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
            times[schedule][n] = st.median
            results.append(Result.from_stats("dcf", f"step ms devices={n}{sfx}", st))
            if synced:
                results.append(Result.from_stats(
                    "dcf", f"step ms synchronised devices={n}{sfx}",
                    Stats.from_samples(synced)))
            # the core's speed right after: where the step is host-bound (the 2-GPU
            # forward loop at 1024 units), its time follows it (NOTES, "GPU, session 21")
            host = host_python_seconds()
            results.append(Result.from_stats("host", f"python loop us devices={n}{sfx}",
                                             host, unit="us", scale=1e6))
            print(f"  {schedule:9s} devices={n}: {st.median * 1e3:9.2f} ms/step  layers on "
                  f"{m.layer_devices}  (host: python loop {host.median * 1e6:.1f} us)",
                  flush=True)
            del m
            G.release_device_memory()
    ratios = {f"speedup devices={n}{_suffix(s)}": ts[counts[0]] / t
              for s, ts in times.items() for n, t in ts.items()}
    if args.processes > 0:
        ratios.update(_in_processes(args, config, counts, schedules))
    config["first_step_loss"] = losses
    payload = report(BENCH, config, results, ratios, args.out)
    if args.out and args.out.endswith(".json"):
        _plot(counts, times, config, args.out[:-5] + ".png")
    return payload


def _in_processes(args: Any, config: dict, counts: list, schedules: list) -> dict:
    """The same measurement in `args.processes` fresh processes, one after another:
    config["process_step_ms"] gets each one's median step (ms) per schedule and device
    count and its core's speed after the last ("host python us"); the ratios returned
    are the medians over the processes of each process's own speedups."""
    child = ["--layers", str(config["layers"]), "--units", str(config["units"]),
             "--batch", str(config["batch"]), "--steps", str(config["steps"]),
             "--parallel-iterations", str(config["parallel_iterations"]),
             "--repeat", str(args.repeat), "--block", str(args.block),
             "--max-devices", str(counts[-1]), "--schedule", args.schedule]
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
        line = []
        for s in schedules:
            first = got[f"step ms devices={counts[0]}{_suffix(s)}"]
            line += [f"{s} devices={n} {got[f'step ms devices={n}{_suffix(s)}']:.1f} ms "
                     f"({first / got[f'step ms devices={n}{_suffix(s)}']:.3f}x)"
                     for n in counts]
        print(f"  process {k}: " + ", ".join(line) +
              (f", host python {got['host python us']:.1f} us" if host else ""), flush=True)
    config["process_step_ms"] = per
    return {f"median over {len(per)} processes: speedup devices={n}{_suffix(s)}": float(
        np.median([d[f"step ms devices={counts[0]}{_suffix(s)}"] /
                   d[f"step ms devices={n}{_suffix(s)}"] for d in per]))
        for s in schedules for n in counts[1:]}


def _plot(counts: list, times: dict[str, dict[int, float]], config: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for schedule, ts in times.items():
        ax.plot(counts, [ts[counts[0]] / ts[n] for n in counts], marker="o",
                label=f"dcf, {schedule}")
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
