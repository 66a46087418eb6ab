"""Autodiff cost: time per forward+backward call of loops and of an LSTM training step.

Workloads (the same data as the peers, from ``bench.peers``):

* ``chain3`` / ``chain1000``: ``x = tanh(x @ W)`` 3 and 1000 times as a ``while_loop``
  (10x10 float32, ``grad_chain_data``), ``loss = reduce_sum(x)``; one call is one
  ``Session.run`` of ``gradients(loss, W)`` (forward and backward loop in one run).
  ``W`` is a Variable, ``x0`` a constant, parallel_iterations 32, as in
  ``bench.peers.tf1_grad_chain``.
* ``lstm``: single-layer ``LSTMCell(128)``, batch 32, input 64, 100 steps,
  ``dynamic_rnn``, ``loss = reduce_mean(square(outputs))``; one call is one run of
  ``GradientDescentOptimizer(0.01).minimize(loss, cell.variables)`` (gradients of the
  cell's variables and the update, all in the run), as ``bench.peers.tf1_lstm_step``.

Systems: ``dcf`` (default ``SessionConfig()``: frames compiled to straight-line Python,
single-threaded BLAS), ``dcf-executor`` (``compile_frames=False``, the tagged-token
executor), ``dcf-blas2`` (``intra_op_threads=2``: BLAS on both cores, as TF1 and PyTorch
use them), and where
importable ``tf1`` (``tf.compat.v1`` graph mode, control flow v1), ``torch`` (eager; for
the LSTM the ``nn.LSTMCell`` Python loop, and the fused ``nn.LSTM`` for reference) and
``jax`` (``jit(grad)`` over ``lax.scan``). Each system is timed in a fresh process of its
own (frameworks' thread pools, TF's and OpenBLAS's spinning workers, would otherwise
compete for the cores), in rounds with the systems' order rotated, so that outside load on
a shared machine hits all alike; the median is over all rounds' samples.

Checks before timing: dcf's chain gradient against a float64 numpy reference and the
peers' ``grad_sum``; dcf's LSTM loss against JAX's (dcf's kernel is set to the values
``jax_lstm_step`` initialises), and dcf's LSTM variable gradients against PyTorch's
``LSTMCell`` loaded with the same weights (gate order mapped).

Saved-stack memory of the 1000-chain: every ``StackPushV2``/``StackPopV2`` of one run (on
the tagged-token executor, whose pushes and pops go through ``StackStore``) is counted (bytes live on the stacks, their peak, and the pushes), next to what PyTorch's
autograd saves for the same chain (``saved_tensors_hooks``).

Ratios are **time ratios dcf / peer** of the medians (< 1: dcf is faster); the ``(min)``
ratios divide the fastest samples, which outside load on a shared machine disturbs least.

    python -m bench.gradients [--quick] [--out FILE] [--profile FILE]
"""

from __future__ import annotations

import cProfile
import functools
import io
import json
import os
import platform
import pstats
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

import dcf
from bench import peers
from bench.harness import (
    Result,
    Stats,
    base_argparser,
    cpu_model,
    peer_available,
    peer_versions,
    report,
    source_fingerprint,
    time_call,
)
from bench.peers import LSTM_LEARNING_RATE, grad_chain_data, lstm_data

#: dcf systems -> SessionConfig arguments. "dcf" is the default config (compiled frames,
#: single-threaded BLAS); "dcf-blas2" lets BLAS use 2 threads, as TF1 and PyTorch do here.
DCF_SYSTEMS: dict[str, dict] = {"dcf": {}, "dcf-executor": {"compile_frames": False},
                                "dcf-blas2": {"intra_op_threads": 2}}
LSTM_SHAPE = {"seq": 100, "batch": 32, "input": 64, "units": 128}
HOT_PATH_FILES = ("executor.py", "frame_compiler.py", "session.py", "nn.py", "ops/rnn_ops.py",
                  "ops/math_ops.py", "autodiff/gradients.py", "autodiff/control_flow_grad.py",
                  "autodiff/loop_state.py")


# ------------------------------------------------------------------------ machine facts
def machine_config() -> dict[str, Any]:
    """The machine, environment, load and dcf source (git HEAD + hot-file hashes)."""
    src = source_fingerprint(HOT_PATH_FILES)
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model(),
            "python": platform.python_version(), "numpy": np.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "loadavg_start": load,
            "dcf_source": src}


# ------------------------------------------------------------------------ dcf: chain
class DcfChain:
    """``x = tanh(x @ W)`` ``iters`` times in a while_loop; fetch d sum(x) / dW."""

    def __init__(self, iters: int) -> None:
        x0_np, w0_np = grad_chain_data()
        self.iters = iters
        self.graph = dcf.Graph()
        t0 = time.perf_counter()
        with self.graph.as_default():
            self.w = dcf.Variable(w0_np, name="W")
            x0 = dcf.constant(x0_np, name="x0")
            w = self.w.read_value()
            _, x = dcf.while_loop(lambda i, x: i < iters,
                                  lambda i, x: (i + 1, dcf.tanh(dcf.matmul(x, w))),
                                  (dcf.constant(0), x0), parallel_iterations=32)
            self.loss = dcf.reduce_sum(x)
            (self.grad,) = dcf.gradients(self.loss, [self.w])
            self.init = dcf.global_variables_initializer()
        self.build_s = time.perf_counter() - t0
        self.num_ops = len(self.graph.get_operations())
        self.sessions: dict[str, dcf.Session] = {}

    def session(self, system: str) -> dcf.Session:
        s = self.sessions.get(system)
        if s is None:
            s = dcf.Session(graph=self.graph,
                            config=dcf.SessionConfig(**DCF_SYSTEMS[system]))
            s.run(self.init)
            self.sessions[system] = s
        return s

    def call(self, system: str) -> Any:
        return self.session(system).run(self.grad)

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()


def chain_reference(iters: int) -> np.ndarray:
    """d sum(x_n) / dW in float64 numpy (the paper's unrolled MatMulGrad accumulation)."""
    x0, w0 = grad_chain_data()
    x, w = x0.astype(np.float64), w0.astype(np.float64)
    xs = [x]
    for _ in range(iters):
        xs.append(np.tanh(xs[-1] @ w))
    g, acc = np.ones_like(x), np.zeros_like(w)
    for k in range(iters, 0, -1):
        gz = g * (1 - xs[k] ** 2)
        acc += xs[k - 1].T @ gz
        g = gz @ w.T
    return acc


class StackMeter:
    """Counts bytes on the gradient stacks during one run (patches StackStore)."""

    def __enter__(self) -> StackMeter:  # noqa: PYI034
        from dcf.ops import data_ops

        self.cls = data_ops.StackStore
        self.orig = (self.cls.push, self.cls.pop)
        self.live = self.peak = self.pushed = self.pushes = 0
        meter = self
        push0, pop0 = self.orig

        def push(st: Any, value: Any) -> Any:
            n = int(getattr(value, "nbytes", 0))
            meter.live += n
            meter.pushed += n
            meter.pushes += 1
            meter.peak = max(meter.peak, meter.live)
            return push0(st, value)

        def pop(st: Any) -> Any:
            v = pop0(st)
            meter.live -= int(getattr(v, "nbytes", 0))
            return v

        self.cls.push, self.cls.pop = push, pop
        return self

    def __exit__(self, *exc: object) -> None:
        self.cls.push, self.cls.pop = self.orig


def stack_memory(ch: DcfChain) -> StackMeter:
    """One run of `ch` with its stack pushes and pops counted, on the tagged-token
    executor: compiled frames push and pop inline, past StackStore's methods."""
    with StackMeter() as meter:
        ch.call("dcf-executor")
    if not meter.pushes:
        raise RuntimeError("no stack push was counted: StackMeter no longer sees them")
    return meter


def torch_saved_bytes(iters: int) -> int | None:
    """Bytes PyTorch autograd saves for backward on the same chain."""
    if not peer_available("torch"):
        return None
    import torch

    x0_np, w0_np = grad_chain_data()
    w = torch.from_numpy(w0_np.copy()).requires_grad_(True)
    total = [0]

    def pack(t: Any) -> Any:
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        x = torch.from_numpy(x0_np.copy())
        for _ in range(iters):
            x = torch.tanh(x @ w)
        x.sum().backward()
    return total[0]


# ------------------------------------------------------------------------- dcf: LSTM
def jax_initial_kernel(input: int, units: int) -> np.ndarray:
    """The kernel ``bench.peers.jax_lstm_step`` starts from (so the losses compare)."""
    rng = np.random.default_rng(3)
    limit = np.sqrt(6.0 / (input + units + 4 * units))
    return rng.uniform(-limit, limit, size=(input + units, 4 * units)).astype(np.float32)


class DcfLstm:
    """One LSTM training step: dynamic_rnn (or static_rnn), mean-square loss, SGD update."""

    def __init__(self, seq: int, batch: int, input: int, units: int,
                 kind: str = "dynamic") -> None:
        self.x_np = lstm_data(seq, batch, input)
        self.kernel0 = jax_initial_kernel(input, units)
        self.graph = dcf.Graph()
        t0 = time.perf_counter()
        with self.graph.as_default():
            self.x = dcf.placeholder(dcf.float32, (batch, seq, input), name="x")
            self.cell = dcf.nn.LSTMCell(units)
            if kind == "dynamic":
                out, _ = dcf.nn.dynamic_rnn(self.cell, self.x, dtype=dcf.float32,
                                            parallel_iterations=32)
            else:
                outs, _ = dcf.nn.static_rnn(self.cell, dcf.unstack(self.x, axis=1),
                                            dtype=dcf.float32)
                out = dcf.stack(outs, axis=1)
            self.loss = dcf.reduce_mean(dcf.square(out))
            self.var_list = self.cell.variables
            self.grads = dcf.gradients(self.loss, self.var_list)
            if hasattr(dcf, "train"):
                opt = dcf.train.GradientDescentOptimizer(LSTM_LEARNING_RATE)
                self.step = opt.apply_gradients(list(zip(self.grads, self.var_list)))
            else:  # gradients only
                self.step = self.grads
            self.init = dcf.global_variables_initializer()
            self.reset = [self.cell.kernel.assign(self.kernel0),
                          self.cell.bias.assign(np.zeros(4 * units, np.float32))]
        self.build_s = time.perf_counter() - t0
        self.num_ops = len(self.graph.get_operations())
        self.sessions: dict[str, dcf.Session] = {}
        self.first_run_s: dict[str, float] = {}

    def session(self, system: str) -> dcf.Session:
        s = self.sessions.get(system)
        if s is None:
            s = dcf.Session(graph=self.graph,
                            config=dcf.SessionConfig(**DCF_SYSTEMS[system]))
            s.run(self.init)
            s.run(self.reset)
            t0 = time.perf_counter()
            s.run(self.step, {self.x: self.x_np})
            self.first_run_s[system] = time.perf_counter() - t0
            self.sessions[system] = s
        return s

    def call(self, system: str) -> Any:
        return self.session(system).run(self.step, {self.x: self.x_np})

    def loss_and_grads(self, system: str) -> tuple[float, list[np.ndarray]]:
        """Loss and gradients at the initial weights (resets the variables)."""
        s = self.session(system)
        s.run(self.reset)
        loss, grads = s.run([self.loss, self.grads], {self.x: self.x_np})
        return float(loss), grads

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()


def torch_lstm_grads(x_np: np.ndarray, kernel: np.ndarray, units: int
                     ) -> tuple[float, list[np.ndarray]] | None:
    """Loss and (kernel, bias) gradients in TF layout from torch.nn.LSTMCell with the same
    weights: TF's gates are i, j, f, o (forget bias 1.0); torch's rows are i, f, g, o."""
    if not peer_available("torch"):
        return None
    import torch

    d = x_np.shape[2]
    u = units
    cell = torch.nn.LSTMCell(d, u).double()
    ki, kj, kf, ko = np.split(kernel.astype(np.float64), 4, axis=1)
    w_t = np.concatenate([ki, kf, kj, ko], axis=1).T        # [4u, d + u] in torch order
    with torch.no_grad():
        cell.weight_ih.copy_(torch.from_numpy(w_t[:, :d]))
        cell.weight_hh.copy_(torch.from_numpy(w_t[:, d:]))
        cell.bias_ih.zero_()
        cell.bias_hh.zero_()
        cell.bias_ih[u:2 * u] = 1.0                          # forget_bias
    x = torch.from_numpy(x_np.astype(np.float64))
    h = torch.zeros(x.shape[0], u, dtype=torch.float64)
    c = torch.zeros_like(h)
    outs = []
    for t in range(x.shape[1]):
        h, c = cell(x[:, t], (h, c))
        outs.append(h)
    loss = torch.stack(outs, 1).square().mean()
    loss.backward()
    gw = torch.cat([cell.weight_ih.grad, cell.weight_hh.grad], 1).T.numpy()  # [d+u, 4u]
    gi, gf, gj, go = np.split(gw, 4, axis=1)
    gb = cell.bias_ih.grad.numpy()
    bi, bf, bj, bo = np.split(gb, 4)
    return float(loss), [np.concatenate([gi, gj, gf, go], 1), np.concatenate([bi, bj, bf, bo])]


# ------------------------------------------------------------------------ measuring
class Timed:
    """Pooled samples of one system on one workload over interleaved rounds."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.extra: dict[str, Any] = {}

    def add(self, st: Stats) -> None:
        self.samples.extend(st.samples)
        for k, v in st.extra.items():
            self.extra.setdefault(k, v)

    def stats(self) -> Stats:
        return Stats.from_samples(self.samples, extra=self.extra)


def _close(a: float, b: float, rtol: float) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-12)


def run_bench(quick: bool) -> tuple[dict, list[Result], dict, dict]:
    chains = (3, 1000)
    rounds = 1 if quick else 5
    config: dict[str, Any] = {"quick": quick, "rounds": rounds, "chain_size": 10,
                              "chain_iters": list(chains), "lstm": dict(LSTM_SHAPE),
                              "learning_rate": LSTM_LEARNING_RATE, **machine_config()}
    peers_on = {p: peer_available(p) for p in ("tf1", "tf1_rnn", "torch", "jax")}
    config["peers"] = {**peers_on, "versions": peer_versions()}
    checks: dict[str, Any] = {}

    # ---- build dcf graphs and check them
    dchains = {n: DcfChain(n) for n in chains}
    for n, ch in dchains.items():
        ref = chain_reference(n)
        for system in DCF_SYSTEMS:
            got = np.asarray(ch.call(system), np.float64)
            err = float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-12))
            if err > 1e-3:
                raise RuntimeError(f"{system} chain{n} gradient differs from float64 numpy "
                                   f"(max rel err {err:.3g})")
            checks[f"chain{n}_{system}_max_rel_err_vs_f64"] = err
        checks[f"chain{n}_dcf_grad_sum"] = float(np.sum(ch.call("dcf")))
    lstm = DcfLstm(**LSTM_SHAPE)
    for system in DCF_SYSTEMS:
        loss, grads = lstm.loss_and_grads(system)
        checks[f"lstm_{system}_initial_loss"] = loss
        ref = torch_lstm_grads(lstm.x_np, lstm.kernel0, LSTM_SHAPE["units"])
        if ref is not None:
            rl, rg = ref
            errs = [float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(grads, rg)]
            checks[f"lstm_{system}_grad_max_rel_err_vs_torch_f64"] = max(errs)
            if not _close(loss, rl, 1e-5) or max(errs) > 1e-3:
                raise RuntimeError(f"{system} LSTM loss {loss} / gradients differ from "
                                   f"torch's {rl} (grad rel err {errs})")

    # ---- timed rounds: each (round, system) in a fresh process, systems rotated
    systems = list(DCF_SYSTEMS) + [p for p in ("tf1", "torch", "jax") if peers_on[p]]
    timed: dict[tuple[str, str], Timed] = {}
    for r in range(rounds):
        k = r % len(systems)
        for system in systems[k:] + systems[:k]:
            out = run_child("bench.gradients", {"system": system, "quick": quick},
                            timeout_s=900)
            if "error" in out:
                checks[f"{system}_round{r}_error"] = out["error"][-600:]
                continue
            for key, val in out.items():
                sysname, wl = key.split("|")
                if "error" in val:
                    checks[f"{sysname}_{wl}_error"] = val["error"][-300:]
                    continue
                t = timed.setdefault((sysname, wl), Timed())
                t.samples.extend(val["samples"])
                for ek, ev in val["extra"].items():
                    t.extra.setdefault(ek, ev)

    # ---- peers' reported values against dcf's
    for (system, wl), t in timed.items():
        if system.startswith("dcf"):
            continue
        ex = t.extra
        if wl.startswith("chain") and "grad_sum" in ex:
            mine = checks[f"{wl}_dcf_grad_sum"]
            checks[f"{wl}_{system}_grad_sum"] = ex["grad_sum"]
            checks[f"{wl}_grad_sum_matches_{system}"] = _close(mine, ex["grad_sum"], 1e-3)
        if wl == "lstm" and "loss" in ex:
            checks[f"lstm_{system}_initial_loss"] = ex["loss"]
    if "lstm_jax_initial_loss" in checks:
        checks["lstm_loss_matches_jax_same_init"] = _close(
            checks["lstm_dcf_initial_loss"], checks["lstm_jax_initial_loss"], 1e-4)
    bad = [k for k, v in checks.items() if "matches" in k and v is False]
    if bad:
        raise RuntimeError(f"dcf disagrees with a peer: {bad}\n{checks}")

    # ---- saved stacks of the 1000-chain
    ch = dchains[1000]
    meter = stack_memory(ch)
    n_stacks = len(dcf.autodiff.loop_state.saved_stacks(ch.graph))
    memory = {"chain1000_stacks": n_stacks, "chain1000_stack_pushes": meter.pushes,
              "chain1000_stack_bytes_pushed": meter.pushed,
              "chain1000_stack_peak_bytes": meter.peak,
              "chain1000_stack_bytes_left_after_run": meter.live,
              "chain1000_torch_saved_bytes": torch_saved_bytes(1000)}

    # ---- results and ratios
    results: list[Result] = []
    unit_metric = {"chain3": "fwd+bwd chain 3 iters", "chain1000": "fwd+bwd chain 1000 iters",
                   "lstm": "LSTM train step (100 steps)"}
    med: dict[tuple[str, str], float] = {}
    best: dict[tuple[str, str], float] = {}
    for (system, wl), t in sorted(timed.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        st = t.stats()
        med[(system, wl)] = st.median
        best[(system, wl)] = st.min
        results.append(Result.from_stats(system, unit_metric[wl], st))
    results.append(Result("dcf", "saved stack peak, chain 1000", meter.peak / 1024,
                          meter.peak / 1024, meter.peak / 1024, "KiB"))
    if memory["chain1000_torch_saved_bytes"] is not None:
        tb = memory["chain1000_torch_saved_bytes"] / 1024
        results.append(Result("torch", "autograd saved tensors, chain 1000", tb, tb, tb, "KiB"))
    ratios: dict[str, Any] = {}
    for wl in ("chain3", "chain1000", "lstm"):
        for system in DCF_SYSTEMS:
            if (system, wl) not in med:
                continue
            for peer in ("tf1", "torch", "torch-fused", "jax"):
                if (peer, wl) in med:
                    ratios[f"{wl}:{system}/{peer}"] = med[(system, wl)] / med[(peer, wl)]
                    ratios[f"{wl}:{system}/{peer} (min)"] = best[(system, wl)] / best[(peer, wl)]
    extra = {"checks": checks, "memory": memory,
             "graph": {"chain3_ops": dchains[3].num_ops, "chain1000_ops": dchains[1000].num_ops,
                       "lstm_ops": lstm.num_ops, "lstm_build_s": lstm.build_s,
                       "lstm_first_run_s": lstm.first_run_s,
                       "tf1_lstm_ops": timed.get(("tf1", "lstm"), Timed()).extra.get("num_ops"),
                       "tf1_chain1000_ops": timed.get(("tf1", "chain1000"),
                                                      Timed()).extra.get("num_ops")}}
    config["loadavg_end"] = list(os.getloadavg())
    for ch in dchains.values():
        ch.close()
    lstm.close()
    return config, results, ratios, extra


def child_measure(spec: dict) -> dict:
    """Time every workload of one system in this (fresh) process."""
    system, quick = spec["system"], spec["quick"]
    # samples per workload, each one call for dcf and the peers alike (a mean over a block
    # of calls has a higher median and minimum than a single call: they would not compare)
    rep = {"chain3": 100, "chain1000": 2 if quick else 3, "lstm": 2 if quick else 3}
    out: dict[str, Any] = {}

    def keep(name: str, wl: str, fn: Callable[[], Stats]) -> None:
        try:
            st = fn()
            out[f"{name}|{wl}"] = {"samples": st.samples, "extra": st.extra}
        except Exception as e:  # noqa: BLE001 - a failing peer is reported, not fatal
            out[f"{name}|{wl}"] = {"error": f"{type(e).__name__}: {e}"}

    def dcf_time(obj: Any, wl: str) -> Stats:
        return time_call(lambda: obj.call(system), repeat=rep[wl], warmup=1)

    for n in (3, 1000):
        wl = f"chain{n}"
        if system in DCF_SYSTEMS:
            ch = DcfChain(n)
            keep(system, wl, functools.partial(dcf_time, ch, wl))
            ch.close()
        elif system in ("tf1", "torch", "jax"):
            fn = getattr(peers, f"{system}_grad_chain")
            keep(system, wl, functools.partial(fn, n, repeat=rep[wl], warmup=2))
    repeat = rep["lstm"]
    if system in DCF_SYSTEMS:
        lstm = DcfLstm(**LSTM_SHAPE)
        keep(system, "lstm", lambda: dcf_time(lstm, "lstm"))
        lstm.close()
    elif system == "tf1" and peer_available("tf1_rnn"):
        keep(system, "lstm", lambda: peers.tf1_lstm_step("dynamic", **LSTM_SHAPE, repeat=repeat,
                                                         warmup=1))
    elif system == "torch":
        keep(system, "lstm", lambda: peers.torch_lstm_step("cell_loop", **LSTM_SHAPE,
                                                           repeat=repeat, warmup=1))
        keep("torch-fused", "lstm", lambda: peers.torch_lstm_step("fused", **LSTM_SHAPE,
                                                                  repeat=repeat, warmup=1))
    elif system == "jax":
        keep(system, "lstm", lambda: peers.jax_lstm_step(**LSTM_SHAPE, repeat=repeat, warmup=1))
    return out


_MARK = "BENCH_CHILD_RESULT "


def run_child(module: str, spec: dict, timeout_s: float) -> dict:
    """``python -m MODULE --child SPEC`` in a fresh process; its JSON result.

    Each system is timed in its own process so that frameworks' thread pools (TF's,
    OpenBLAS's spinning workers) never compete with each other for the cores."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    try:
        proc = subprocess.run([sys.executable, "-m", module, "--child", json.dumps(spec)],
                              cwd=root, env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout_s} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    return {"error": f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}"}


def child_main(fn: Callable[[dict], dict]) -> None:
    """Entry point of a ``--child`` process: run fn(spec), print the marker line."""
    try:
        out = fn(json.loads(sys.argv[2]))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        out = {"error": traceback.format_exc()[-3000:]}
    sys.stdout.write(_MARK + json.dumps(out, default=float) + "\n")
    sys.stdout.flush()
    os._exit(0)


def profile_lstm(path: str | None, steps: int = 10) -> str:
    """cProfile of dcf's LSTM training step (default config); returns the report text."""
    lstm = DcfLstm(**LSTM_SHAPE)
    lstm.call("dcf")
    lstm.call("dcf")
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    for _ in range(steps):
        lstm.call("dcf")
    pr.disable()
    wall = (time.perf_counter() - t0) / steps
    buf = io.StringIO()
    buf.write(f"dcf LSTM training step {LSTM_SHAPE}, {steps} steps under cProfile, "
              f"{wall * 1e3:.1f} ms/step with profiling on\n")
    ps = pstats.Stats(pr, stream=buf)
    ps.sort_stats("tottime").print_stats(20)
    ps.sort_stats("cumulative").print_stats(12)
    lstm.close()
    text = buf.getvalue()
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return text


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child_main(child_measure)
    ap = base_argparser(__doc__.split("\n\n")[0])
    ap.add_argument("--profile", metavar="FILE", nargs="?", const="-", default=None,
                    help="instead of the benchmark, cProfile dcf's LSTM step (to FILE or stdout)")
    args = ap.parse_args()
    if args.profile is not None:
        text = profile_lstm(None if args.profile == "-" else args.profile)
        print(text)
        return
    config, results, ratios, extra = run_bench(args.quick)
    config.update(extra)
    report("gradients", config, results, ratios, args.out)


if __name__ == "__main__":
    main()
