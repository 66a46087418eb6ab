"""Paper Fig. "effect of parallel iterations": one while loop whose body is a chain of
layers spread over D devices, one layer per device by default (the paper: "8 layers of
computation, one for each GPU; each GPU performs a 1024x1024 matrix multiplication
before passing the result of its computation to the next"); layer d computes
    s_d(t) = tanh((s_d(t-1) + s_{d-1}(t)) @ W_d)          (the sum is s_0(t-1) for d = 0)
so each layer depends on its own state from the previous iteration and on the
previous layer's output of this iteration, with its matmul on that path: with one
iteration in flight the devices take turns, and only running iterations in parallel
lets device 0 start iteration t+1 while device 1 computes iteration t. The loop
predicate (i < N) does not depend on the body. With more layers than devices
(`--layers`), layers go to devices in contiguous groups. Measured: iterations/s for
parallel_iterations 1..32, and the speedup over parallel_iterations=1; with it, the
speed of the process's core after the dcf runs (a pure-Python loop, "host python us"),
since on a GPU the chain at pi = 32 is bound by the host where the core is slow.
Peers: PyTorch eager on the same chain and devices, host-synchronised (a
torch.cuda.synchronize() after every iteration: an out-of-graph loop) and
stream-pipelined (no synchronisation until the end).
(Before 2026-11-26c the chain was s_d(t) = tanh(s_d(t-1) @ W_d + s_{d-1}(t)), 8 layers
on any number of devices: its matmuls did not wait for the previous layer, so with
GPU-bound sizes the devices overlapped even at parallel_iterations=1.)

    python -m bench.parallel_iterations --out bench/results/parallel_iterations-DATE-CARD.json
    python -m bench.parallel_iterations --cpu --devices 2 --quick   # on CPU devices
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bench import gpu_common as G
from bench.harness import (Result, Stats, base_argparser, host_python_seconds, report,
                           results_in_own_process)

BENCH = "parallel_iterations"


def layer_devices(n_layers: int, devs: list[str]) -> list[str]:
    return [devs[d * len(devs) // n_layers] for d in range(n_layers)]


def build(devs: list[str], n_layers: int, K: int, N: int, pi: int, seed: int = 0):
    import dcf

    rng = np.random.default_rng(seed)
    Ws = [(rng.standard_normal((K, K)) / np.sqrt(K)).astype(np.float32)
          for _ in range(n_layers)]
    s0 = (rng.standard_normal((K, K)) * 0.1).astype(np.float32)
    ldev = layer_devices(n_layers, devs)
    g = dcf.Graph()
    with g.as_default():
        init = []
        for d in range(n_layers):       # each layer's state lives on its layer's device
            with dcf.device(ldev[d]):
                init.append(dcf.constant(s0))

        def body(i, *s):
            out, prev = [], None
            for d in range(n_layers):
                with dcf.device(ldev[d]):
                    x = s[d] if prev is None else s[d] + prev
                    prev = dcf.tanh(dcf.matmul(x, dcf.constant(Ws[d])))
                    out.append(prev)
            return (i + 1,) + tuple(out)

        # No device scope around the loop: each loop variable's Enter/Merge/Switch/
        # NextIteration/Exit goes where its initial value is (its layer's device), and
        # the counter and predicate (i < N) stay on the host's /cpu:0.
        res = dcf.while_loop(lambda i, *s: i < N, body, (0,) + tuple(init),
                             parallel_iterations=pi)
    return g, res[-1], Ws, s0


def reference(Ws: list, s0: np.ndarray, N: int) -> np.ndarray:
    s = [s0.astype(np.float64)] * len(Ws)
    for _ in range(N):
        out, prev = [], None
        for d, W in enumerate(Ws):
            x = s[d] if prev is None else s[d] + prev
            prev = np.tanh(x @ W)
            out.append(prev)
        s = out
    return s[-1]


def torch_chain(devs: list[str], n_layers: int, Ws: list, s0: np.ndarray, N: int,
                sync_each: bool, cpu: bool) -> Any:
    import torch

    tdevs = [torch.device("cpu") if cpu else torch.device(f"cuda:{d.split(':')[-1]}")
             for d in layer_devices(n_layers, devs)]
    W = [torch.from_numpy(w).to(td) for w, td in zip(Ws, tdevs)]
    s = [torch.from_numpy(s0).to(td) for td in tdevs]

    def run() -> None:
        st = list(s)
        for _ in range(N):
            prev = None
            out = []
            for d in range(n_layers):
                x = st[d] if prev is None else st[d] + prev.to(tdevs[d], non_blocking=True)
                prev = torch.tanh(x @ W[d])
                out.append(prev)
            st = out
            if sync_each and not cpu:
                for td in set(tdevs):
                    torch.cuda.synchronize(td)
        if not cpu:
            for td in set(tdevs):
                torch.cuda.synchronize(td)
        return st[-1]
    return run


def main(argv: list[str] | None = None) -> dict:
    ap = base_argparser(__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="use CPU devices /cpu:K")
    ap.add_argument("--devices", type=int, default=None,
                    help="devices in the chain (default: every GPU; 2 with --cpu)")
    ap.add_argument("--layers", type=int, default=None,
                    help="layers in the chain (default: one per device, as the paper)")
    ap.add_argument("--size", type=int, default=None, help="K (default 1024; 64 with --cpu)")
    ap.add_argument("--iterations", type=int, default=None, help="loop trip count per run")
    ap.add_argument("--pis", default="1,2,4,8,16,32")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--processes", type=int, default=0, metavar="N",
                    help="also measure everything again in N processes of their own and "
                         "report the medians over them (processes on a shared host differ "
                         "by up to 1.8x in host speed: bench/NOTES.md, \"GPU, session 16\")")
    args = ap.parse_args(argv)

    import dcf

    cpu = args.cpu
    if not cpu and G.gpu_count() == 0:
        G.skip(BENCH, "no GPU visible (--cpu runs the chain on CPU devices)", args.out)
    n_dev = args.devices or (2 if cpu else G.gpu_count())
    if not cpu and n_dev > G.gpu_count():
        G.skip(BENCH, f"{n_dev} devices asked, {G.gpu_count()} GPU(s) visible", args.out)
    devs = G.devices(n_dev, cpu)
    n_layers = args.layers or n_dev
    K = args.size or (64 if cpu else 1024)
    N = args.iterations or (50 if args.quick else (100 if cpu else 200))
    pis = [int(p) for p in args.pis.split(",")]
    if args.quick:
        pis = [p for p in pis if p in (1, 4, 32)] or pis[:2]
    repeat = 2 if args.quick else args.repeat
    config = {"devices": devs, "card": "cpu" if cpu else G.card_name(0), "date": G.today(),
              "layers": n_layers, "size": K, "iterations_per_run": N, "repeat": repeat,
              "layer_devices": layer_devices(n_layers, devs),
              "chain": "s_d(t) = tanh((s_d(t-1) + s_{d-1}(t)) @ W_d)"}
    results: list[Result] = []
    rates: dict[str, float] = {}
    want = None
    for pi in pis:
        g, out, Ws, s0 = build(devs, n_layers, K, N, pi)
        if want is None:
            want = reference(Ws, s0, N)
        with dcf.Session(g) as sess:
            got = sess.run(out)
            err = float(np.max(np.abs(got - want)))
            if err > 1e-2:
                raise AssertionError(f"pi={pi}: result off by {err}")
            samples = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                sess.run(out)
                samples.append(time.perf_counter() - t0)
        st = Stats.from_samples(samples)
        r = Result.rate("dcf", f"iterations/s pi={pi}", st, N)
        results.append(r)
        rates[f"pi={pi}"] = r.median
        print(f"  dcf pi={pi:3d}: {r.median:10.1f} it/s  (max error {err:.2e})", flush=True)
        del g, sess
        G.release_device_memory()
    # the core's speed after the dcf runs: a host-bound pi=32 figure is read with it
    results.append(Result.from_stats("host", "python loop us", host_python_seconds(),
                                     unit="us", scale=1e6))
    ratios: dict[str, Any] = {}
    base = rates.get(f"pi={pis[0]}")
    for k, v in rates.items():
        ratios[f"dcf speedup {k} over pi={pis[0]}"] = v / base if base else None
    if not args.no_torch:
        try:
            import torch
            ok = cpu or torch.cuda.device_count() >= n_dev
        except ImportError:
            ok = False
        if ok:
            config["torch"] = torch.__version__
            _, _, Ws, s0 = build(devs, n_layers, K, N, 1)
            for name, sync_each in (("torch host-synchronised", True),
                                    ("torch stream-pipelined", False)):
                fn = torch_chain(devs, n_layers, Ws, s0, N, sync_each, cpu)
                fn()
                samples = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    fn()
                    samples.append(time.perf_counter() - t0)
                r = Result.rate(name, "iterations/s", Stats.from_samples(samples), N)
                results.append(r)
                print(f"  {name}: {r.median:10.1f} it/s", flush=True)
                if base:
                    ratios[f"dcf best / {name}"] = max(rates.values()) / r.median
            G.release_device_memory()
    if args.processes > 0:
        ratios.update(_in_processes(args, config, pis))
    payload = report(BENCH, config, results, ratios, args.out)
    if args.out and args.out.endswith(".json"):
        _plot(pis, rates, results, config, args.out[:-5] + ".png")
    return payload


def _in_processes(args: Any, config: dict, pis: list) -> dict:
    """The same measurement in `args.processes` fresh processes, one after another:
    config["process_rates"] gets each one's medians (it/s by system and pi, and the
    core's speed: "host python us", bench.harness.host_python_seconds); the ratios
    returned are the medians over the processes of each process's own ratios."""
    child = ["--pis", ",".join(str(p) for p in pis), "--repeat", str(args.repeat),
             "--devices", str(len(config["devices"])), "--layers", str(config["layers"]),
             "--size", str(config["size"]), "--iterations", str(config["iterations_per_run"])]
    child += ["--no-torch"] if args.no_torch else []
    child += ["--cpu"] if args.cpu else []
    child += ["--quick"] if args.quick else []

    def name(r: dict) -> str:      # "pi=32", "host python us", or the peer's system
        if r["system"] == "dcf":
            return r["metric"].split()[-1]
        return "host python us" if r["system"] == "host" else r["system"]
    per: list[dict] = []
    for k in range(args.processes):
        rows = results_in_own_process("bench.parallel_iterations", child, f"process {k}",
                                      timeout=900)
        got = {name(r): r["median"] for r in rows}
        per.append(got)
        print(f"  process {k}: " + ", ".join(f"{n} {v:.1f}" if n == "host python us" else
                                             f"{n} {v:.0f}" for n, v in got.items()),
              flush=True)
    config["process_rates"] = per
    out: dict[str, Any] = {}
    first = f"pi={pis[0]}"
    for p in pis[1:]:
        out[f"median over {len(per)} processes: dcf speedup pi={p} over {first}"] = float(
            np.median([d[f"pi={p}"] / d[first] for d in per]))
    for peer in ("torch host-synchronised", "torch stream-pipelined"):
        if all(peer in d for d in per):
            out[f"median over {len(per)} processes: dcf best / {peer}"] = float(np.median(
                [max(v for n, v in d.items() if n.startswith("pi=")) / d[peer] for d in per]))
    return out


def _plot(pis: list, rates: dict, results: list, config: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.plot(pis, [rates[f"pi={p}"] for p in pis], marker="o", label="dcf")
    for r in results:
        if r.system.startswith("torch"):
            ax.axhline(r.median, ls="--", lw=1, label=r.system, color=None)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("parallel_iterations")
    ax.set_ylabel("iterations/s")
    ax.set_title(f"{config['layers']}-layer chain on {len(config['devices'])} device(s), "
                 f"K={config['size']}\n{config['card']}, {config['date']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
