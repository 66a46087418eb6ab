"""The paper's Figure 1 model: two recurrent layers with a mixture of experts between them,
inside ONE while_loop over time, experts on different devices, trained end to end; the
second recurrent layer is an Adaptive Computation Time (ACT) cell, a while_loop nested in
the time loop whose trip count depends on a learned halting probability.

Run: python examples/moe_rnn.py [--steps 200] [--experts 4] [--top-k 2] [--devices 2]
     python examples/moe_rnn.py --workers 2     # experts on worker processes (dcf.Cluster)
     Also: [--batch 16] [--seq 8] (sequence length, time steps) [--units 16] (units of
     the recurrent layers) [--seed 0] (the data, the initial weights and the batches).
Shows a progress bar (tqdm when installed, else a printed one) and the loss falling.

    for t in range(T):                                   # dcf.while_loop, TensorArrays
        h1, s1 = lstm(x[t], s1)                          # recurrent layer 1 (LSTMCell)
        g = softmax over the top-k of (h1 @ W_gate)      # learned gate, per example
        m = sum_e  g[:, e] * expert_e(h1)                # only the chosen experts run:
              for each expert e (on device e % devices):    cond(any example chose e,
                rows = examples that chose e                     gather rows -> expert ->
                out += scatter(rows, g[rows, e] * expert_e(h1[rows]))   scatter back, 0)
        y[t], s2 = act(m, s2)                            # recurrent layer 2: ACT cell
    loss = mean((y @ W_out - target)^2) + ponder_cost * tau + balance * cv(importance)^2

ACT cell (Graves 2016) around an LSTMCell, per time step:

    while any example has halting sum < 1 - eps and n < max_ponder:   # nested while_loop
        out, s = lstm(concat(m, first_step_flag), s)     # (examples that halted keep s)
        p = sigmoid(s.h @ W_halt + b_halt)               # learned halting probability
        halting now: weight = 1 - halting sum (the remainder), else weight = p
        y += weight * out;  halting sum += weight;  n_updates += running
    ponder cost = n_updates + remainder

The synthetic task: each sequence carries a mode (one of `modes`, one-hot in every input);
the target at step t is a mode-specific map of the running mean of the inputs, so experts
can specialise by mode and the recurrent layers must integrate over time.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

import dcf

LSTMStateTuple = dcf.nn.LSTMStateTuple


# ----------------------------------------------------------------------------- data
def make_task(n: int, steps: int, features: int, modes: int, outputs: int,
              seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs [n, steps, features + modes] and targets [n, steps, outputs]."""
    rng = np.random.default_rng(seed)
    maps = np.random.default_rng(1234).normal(0, 1.0 / np.sqrt(features),
                                              (modes, features, outputs))
    x = rng.normal(0, 1, (n, steps, features))
    mode = rng.integers(0, modes, n)
    running_mean = np.cumsum(x, axis=1) / np.arange(1, steps + 1)[None, :, None]
    y = np.tanh(2.0 * np.einsum("ntf,nfo->nto", running_mean, maps[mode]))
    onehot = np.broadcast_to(np.eye(modes)[mode][:, None, :], (n, steps, modes))
    return (np.concatenate([x, onehot], axis=2).astype(np.float32), y.astype(np.float32))


# ----------------------------------------------------------------------------- layers
def _var(rng: np.random.Generator, shape: tuple, name: str, scale: float | None = None
         ) -> dcf.Variable:
    lim = scale if scale is not None else np.sqrt(6.0 / (shape[0] + shape[-1]))
    return dcf.Variable(rng.uniform(-lim, lim, shape).astype(np.float32), name=name)


def _cumsum_rows(mask: dcf.Tensor, batch: int) -> dcf.Tensor:
    """Inclusive cumulative sum of a [batch] float vector (a matmul with a triangle)."""
    upper = np.triu(np.ones((batch, batch), np.float32))
    return dcf.reshape(dcf.matmul(dcf.reshape(mask, (1, batch)), upper), (batch,))


class MixtureOfExperts:
    """Top-k gated experts (2-layer relu MLPs), expert e placed on `devices[e % len]`.

    Each expert runs inside a cond that only executes when at least one example of the
    batch chose it; it sees only those examples' rows (gather) and its outputs go back to
    their rows (scatter_nd), weighted by the gate.
    """

    def __init__(self, d_in: int, d_hidden: int, d_out: int, n_experts: int, k: int,
                 devices: list[str], rng: np.random.Generator) -> None:
        self.n, self.k, self.devices, self.d_out = n_experts, k, devices, d_out
        self.w_gate = _var(rng, (d_in, n_experts), "moe/gate", scale=0.01)
        self.experts = []
        for e in range(n_experts):
            with dcf.device(devices[e % len(devices)]):
                self.experts.append((
                    _var(rng, (d_in, d_hidden), f"moe/expert{e}/W0"),
                    dcf.Variable(np.zeros(d_hidden, np.float32), name=f"moe/expert{e}/b0"),
                    _var(rng, (d_hidden, d_out), f"moe/expert{e}/W1"),
                    dcf.Variable(np.zeros(d_out, np.float32), name=f"moe/expert{e}/b1")))

    def gates(self, h: dcf.Tensor) -> dcf.Tensor:
        """[B, E] softmax over each example's top-k gate logits, zero elsewhere."""
        logits = dcf.matmul(h, self.w_gate)
        chosen = dcf.zeros_like(logits)
        masked = logits
        for _ in range(self.k):                       # top-k by repeated argmax
            pick = dcf.one_hot(dcf.argmax(masked, axis=1), self.n)
            chosen = chosen + pick
            masked = masked - 1e9 * pick
        return dcf.nn.softmax(dcf.where(chosen > 0.0, logits, logits - 1e9))

    def __call__(self, h: dcf.Tensor, batch: int) -> tuple[dcf.Tensor, dcf.Tensor]:
        """(output [B, d_out], the gates [B, E])."""
        g = self.gates(h)
        out = dcf.zeros((batch, self.d_out))
        for e, (w0, b0, w1, b1) in enumerate(self.experts):
            ge = g[:, e]
            sel = dcf.cast(ge > 0.0, dcf.float32)                    # [B] chose e?
            count = dcf.cast(dcf.reduce_sum(sel), dcf.int32)
            # rows[p] = the p-th example that chose e: scatter each example's index to its
            # rank among the chosen ones (the others to a spare slot), keep `count` of them.
            rank = dcf.cast(_cumsum_rows(sel, batch), dcf.int32) - 1
            slot = dcf.where(sel > 0.0, rank, dcf.fill((batch,), batch))
            rows_all = dcf.scatter_nd(dcf.expand_dims(slot, 1), dcf.range(batch), (batch + 1,))

            def expert(w0=w0, b0=b0, w1=w1, b1=b1, ge=ge, count=count, rows_all=rows_all,
                       e=e):
                rows = dcf.slice(rows_all, [0], dcf.reshape(count, (1,)))
                with dcf.device(self.devices[e % len(self.devices)]):
                    x = dcf.gather(h, rows)
                    y = dcf.matmul(dcf.nn.relu(dcf.matmul(x, w0) + b0), w1) + b1
                y = y * dcf.expand_dims(dcf.gather(ge, rows), 1)
                return dcf.scatter_nd(dcf.expand_dims(rows, 1), y, (batch, self.d_out))

            out = out + dcf.cond(count > 0, expert,
                                 lambda: dcf.zeros((batch, self.d_out)), name=f"expert{e}")
        return out, g


class ACTCell:
    """Adaptive Computation Time around an LSTMCell: a nested while_loop per time step.

    Returns (output, new state, ponder cost [B], steps taken this time step).
    """

    def __init__(self, d_in: int, units: int, rng: np.random.Generator, max_ponder: int = 8,
                 eps: float = 0.01) -> None:
        self.cell = dcf.nn.LSTMCell(units, name="act/lstm")
        self.units, self.max_ponder, self.eps = units, max_ponder, eps
        self.w_halt = _var(rng, (units, 1), "act/halt/W", scale=0.01)
        self.b_halt = dcf.Variable(np.full(1, -1.0, np.float32), name="act/halt/b")

    def __call__(self, x: dcf.Tensor, state: Any, batch: int) -> tuple:
        u = self.units
        first = dcf.concat([x, dcf.ones((batch, 1))], 1)
        later = dcf.concat([x, dcf.zeros((batch, 1))], 1)
        one = 1.0 - self.eps

        def cond(n, s, acc, hsum, rem, nupd):
            return dcf.logical_and(n < self.max_ponder, dcf.reduce_min(hsum) < one)

        def body(n, s, acc, hsum, rem, nupd):
            inp = dcf.cond(dcf.equal(n, 0), lambda: first, lambda: later, name="flag")
            out, s2 = self.cell(inp, s)
            p = dcf.reshape(dcf.sigmoid(dcf.matmul(s2.h, self.w_halt) + self.b_halt), (batch,))
            running = dcf.cast(hsum < one, dcf.float32)
            if_cont = hsum + p * running
            still = dcf.cast(if_cont < one, dcf.float32) * running
            halting = running - still
            w = p * still + (1.0 - hsum) * halting             # the remainder when halting
            keep = dcf.expand_dims(running, 1)
            s_new = LSTMStateTuple(keep * s2.c + (1.0 - keep) * s.c,
                                   keep * s2.h + (1.0 - keep) * s.h)
            return (n + 1, s_new, acc + dcf.expand_dims(w, 1) * out, hsum + w,
                    rem + halting * (1.0 - hsum), nupd + running)

        zeros_b = dcf.zeros((batch,))
        n, s, acc, hsum, rem, nupd = dcf.while_loop(
            cond, body, (dcf.constant(0), state, dcf.zeros((batch, u)), zeros_b, zeros_b,
                         zeros_b), name="ponder")
        # Examples cut off by max_ponder never halted: give them the remainder too.
        return acc, s, nupd + rem + (1.0 - hsum), n


class FigureOneModel:
    """LSTM -> mixture of experts -> ACT(LSTM) over time in one while_loop, + readout."""

    def __init__(self, *, d_in: int, d_out: int, units: int = 16, experts: int = 4,
                 k: int = 2, devices: list[str] | None = None, seed: int = 0,
                 max_ponder: int = 6) -> None:
        rng = np.random.default_rng(seed)
        self.units = units
        self.lstm1 = dcf.nn.LSTMCell(units, name="lstm1")
        self.moe = MixtureOfExperts(units, 2 * units, units, experts, k,
                                    devices or ["/cpu:0"], rng)
        self.act = ACTCell(units + 1, units, rng, max_ponder=max_ponder)
        self.w_out = _var(rng, (units, d_out), "readout/W")
        self.b_out = dcf.Variable(np.zeros(d_out, np.float32), name="readout/b")

    def __call__(self, x: dcf.Tensor, batch: int, steps: int) -> dict:
        """x [steps, batch, d_in] (time major) -> outputs [steps, batch, d_out] and stats."""
        u = self.units
        xs = dcf.TensorArray(dcf.float32, size=steps, name="inputs").unstack(x)
        zero = dcf.zeros((batch, u))

        def body(t, s1, s2, out_ta, ponder, gate_sum, steps_ta):
            h1, s1 = self.lstm1(xs.read(t), s1)
            m, g = self.moe(h1, batch)
            y, s2, pc, n = self.act(m, s2, batch)
            out = dcf.matmul(y, self.w_out) + self.b_out
            return (t + 1, s1, s2, out_ta.write(t, out), ponder + pc,
                    gate_sum + dcf.reduce_sum(g, axis=0), steps_ta.write(t, n))

        _, _, _, out_ta, ponder, importance, steps_ta = dcf.while_loop(
            lambda t, *_: t < steps, body,
            (dcf.constant(0), LSTMStateTuple(zero, zero), LSTMStateTuple(zero, zero),
             dcf.TensorArray(dcf.float32, size=steps, name="outputs"),
             dcf.zeros((batch,)), dcf.zeros((self.moe.n,)),
             dcf.TensorArray(dcf.int32, size=steps, name="ponder_steps")),
            name="time")
        return {"y": out_ta.stack(), "ponder": ponder / steps, "importance": importance,
                "ponder_steps": steps_ta.stack()}


def build(batch: int, steps: int, *, features: int = 6, modes: int = 4, outputs: int = 3,
          units: int = 16, experts: int = 4, k: int = 2, devices: list[str] | None = None,
          lr: float = 0.01, tau: float = 0.01, balance: float = 0.01, seed: int = 0) -> dict:
    """The training graph in the default graph: feeds x, target; fetches loss, train."""
    x = dcf.placeholder(dcf.float32, (batch, steps, features + modes), name="x")
    target = dcf.placeholder(dcf.float32, (batch, steps, outputs), name="target")
    model = FigureOneModel(d_in=features + modes, d_out=outputs, units=units, experts=experts,
                           k=k, devices=devices, seed=seed)
    out = model(dcf.transpose(x, [1, 0, 2]), batch, steps)
    y = dcf.transpose(out["y"], [1, 0, 2])
    mse = dcf.reduce_mean(dcf.square(y - target))
    imp = out["importance"]
    cv2 = dcf.reduce_mean(dcf.square(imp - dcf.reduce_mean(imp))) / \
        (dcf.square(dcf.reduce_mean(imp)) + 1e-9)
    ponder = dcf.reduce_mean(out["ponder"])
    loss = mse + tau * ponder + balance * cv2
    train = dcf.train.AdamOptimizer(lr).minimize(loss)
    return {"x": x, "target": target, "loss": loss, "mse": mse, "ponder": ponder,
            "train": train, "importance": imp, "ponder_steps": out["ponder_steps"],
            "model": model}


# ----------------------------------------------------------------------------- progress
class Progress:
    """tqdm when it is installed, else a line printed every `every` steps."""

    def __init__(self, total: int, every: int | None = None) -> None:
        self.total, self.n, self.t0 = total, 0, time.perf_counter()
        self.every = every or max(1, total // 10)
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", dynamic_ncols=True)
        except ImportError:
            self.bar = None

    def update(self, **stats: float) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.4f}" for k, v in stats.items()}, refresh=False)
            self.bar.update(1)
        elif self.n % self.every == 0 or self.n == self.total:
            width = 30
            filled = int(width * self.n / self.total)
            rate = self.n / (time.perf_counter() - self.t0)
            text = "  ".join(f"{k} {v:.4f}" for k, v in stats.items())
            print(f"[{'#' * filled}{'.' * (width - filled)}] {self.n}/{self.total} "
                  f"{rate:.1f} step/s  {text}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def format_floats(values: Any, digits: int = 2) -> str:
    """[49.15, 16.86] for a float32 vector: rounded in decimal, not float32 noise
    such as 49.150001525878906."""
    return "[" + ", ".join(f"{float(v):.{digits}f}" for v in np.ravel(values)) + "]"


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a clear error for 0, negatives and non-integers)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (>= 1), got {value}")
    return value


def seed_int(text: str) -> int:
    """argparse type: a seed, an integer >= 0 (numpy's and gymnasium's generators refuse
    negative ones, with a traceback)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed is an integer >= 0, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=positive_int, default=200, help="training steps")
    p.add_argument("--batch", type=positive_int, default=16)
    p.add_argument("--seq", type=positive_int, default=8, help="sequence length (time steps)")
    p.add_argument("--units", type=positive_int, default=16)
    p.add_argument("--experts", type=positive_int, default=4)
    p.add_argument("--top-k", type=positive_int, default=2,
                   help="experts chosen per example (at most --experts)")
    p.add_argument("--devices", type=positive_int, default=None,
                   help="in-process devices /cpu:0 ... /cpu:N-1 for the experts (2; not "
                        "with --workers)")
    p.add_argument("--workers", type=int, default=0,
                   help="place the experts on N worker processes (needs dcf.Cluster)")
    p.add_argument("--seed", type=seed_int, default=0)
    args = p.parse_args(argv)
    if args.workers < 0:
        p.error(f"argument --workers: must be 0 or more, got {args.workers}")
    if args.top_k > args.experts:
        p.error(f"argument --top-k: at most --experts ({args.experts}), got {args.top_k}")
    if args.workers and args.devices is not None:
        p.error("argument --devices: the experts go on the --workers' devices; give one "
                "of the two")

    cluster = None
    if args.workers:
        cluster = dcf.Cluster.local(args.workers)
        devices = [f"/job:worker/task:{i}/cpu:0" for i in range(args.workers)]
    else:
        devices = [f"/cpu:{i}" for i in range(args.devices or 2)]
    features, modes, outputs = 6, 4, 3
    g = dcf.Graph()
    with g.as_default():
        m = build(args.batch, args.seq, features=features, modes=modes, outputs=outputs,
                  units=args.units, experts=args.experts, k=args.top_k, devices=devices,
                  seed=args.seed)
        init = dcf.global_variables_initializer()
    x_all, y_all = make_task(args.batch * 64, args.seq, features, modes, outputs, args.seed)
    print(f"experts on {devices}; batch {args.batch}, {args.seq} time steps, "
          f"{args.experts} experts (top {args.top_k})")
    try:
        with dcf.Session(g, cluster=cluster) as sess:
            sess.run(init)
            rng = np.random.default_rng(args.seed)
            bar = Progress(args.steps)
            mses: list[float] = []
            for _ in range(args.steps):
                idx = rng.integers(0, len(x_all), args.batch)
                mse, ponder, _ = sess.run([m["mse"], m["ponder"], m["train"]],
                                          {m["x"]: x_all[idx], m["target"]: y_all[idx]})
                mses.append(float(mse))
                bar.update(mse=float(mse), ponder=float(ponder))
            bar.close()
            fd = {m["x"]: x_all[: args.batch], m["target"]: y_all[: args.batch]}
            imp, ps = sess.run([m["importance"], m["ponder_steps"]], fd)
    finally:
        if cluster is not None:
            cluster.close()
    print(f"mse: first step {mses[0]:.4f}, mean of the last {min(10, len(mses))} steps "
          f"{np.mean(mses[-10:]):.4f}")
    print(f"expert importance (summed gates over a batch and all time steps): "
          f"{format_floats(imp)}")
    print(f"ACT ponder steps per time step: {ps.tolist()}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:       # Ctrl-C: the session (and any workers) close on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
