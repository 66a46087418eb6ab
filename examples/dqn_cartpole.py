"""DQN on CartPole-v1 with the whole agent step in ONE graph run per environment step.

Run: python examples/dqn_cartpole.py [--steps 40000] [--seed 0] [--plot bench/results/dqn.png]
     python examples/dqn_cartpole.py --client     # the same algorithm driven from Python
     python examples/dqn_cartpole.py --stop-at-target   # stop once the average return
                                                        # over 20 episodes reaches 150
     python examples/dqn_cartpole.py --device /gpu:0    # the networks, the replay buffer
                                                        # and the update on a GPU
Needs: pip install -e '.[rl]' (gymnasium); matplotlib for --plot (pip install -e '.[plot]').

Paper section 6.5 (Figure "Dynamic control flow in Deep Q-Networks"). One `sess.run(step)`
does everything an agent does per interaction with its environment:

    s       = obs                                # a Variable: the current observation
    a       = cond(uniform() < eps(t),           # epsilon-greedy, decided in the graph
                   lambda: random action,
                   lambda: argmax Q(s))          # Q is only evaluated when exploiting
    s2, r, done, s_next = py_func(env.step, a)   # the environment lives in the closure
    table[w] = (s, a, r, done, s2)               # a scatter update at a write index Variable
    w = (w + 1) % capacity;  n = min(n + 1, capacity);  obs = s_next;  t += 1
    loss = cond(n >= learn_start,                # sample and learn only with enough data
                lambda: huber(Q(S)[A] - (R + gamma (1-D) max_a' Q_target(S2)[a'])),
                lambda: 0)                       # S, A, R, D, S2 = gather(table, uniform idx)
    cond(n >= learn_start, lambda: adam.apply(gradients(loss)), ...)
    cond((t + 1) % target_every == 0, lambda: target.assign(online), ...)

The client-driven baseline (`ClientAgent`) runs the same graph pieces with several
`sess.run` calls per step and makes every decision in Python: act (only when
exploiting), `env.step` in Python, store, train (once enough experience exists),
refresh the target (every `target_every` steps).

Semantics note: the gradient is taken of the *output of the learning cond*: when the
cond does not learn, the gradient cond's untaken branch yields zeros at almost no cost,
and the Adam update itself sits in a second cond on the same predicate so that it only
runs (and only moves Adam's moment estimates) when the agent learns. (`gradients()` is
called outside the conds; Variables the learning branch uses are read outside it.)

`python -m bench.dqn` times both agents (and the same two in TF1 where TensorFlow is
installed); bench/NOTES.md, section dqn, has the figures and the learning results.

Placement: by default everything runs on the embedded CPU device. With `--device /gpu:0`
(`device=` of both agents) the networks, the replay buffer, the sampling and the update
are placed on that GPU, as in the paper's section 6.5; the environment's py_func runs on
the host either way. A run on a GPU costs the host far more than on a CPU (~70-120 us
against ~4-14 us: the GPU's step begun and ended, fetched values' copies waited for), so
the in-graph agent's one run a step saves more there (bench/NOTES.md, "Session 36").
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import itertools
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import dcf


@dataclass
class DQNConfig:
    """Hyper-parameters shared by the in-graph agent and the client-driven baseline."""

    hidden: int = 64               # units in each of the two hidden layers
    lr: float = 5e-4               # Adam learning rate
    gamma: float = 0.99
    batch: int = 64
    capacity: int = 10_000         # replay buffer rows
    learn_start: int = 1_000       # transitions in the buffer before learning starts
    target_every: int = 500        # environment steps between target-network refreshes
    eps_start: float = 1.0
    eps_end: float = 0.02
    eps_decay_steps: int = 10_000  # linear decay of epsilon over this many steps
    seed: int = 0


# ----------------------------------------------------------------------------- environment
class CartPole:
    """A gymnasium CartPole-v1 with automatic reset, seen from the graph as one function.

    `step(action)` returns (s2, reward, terminated, s_next): s2 is the observation the
    action led to (what the replay buffer stores), s_next the one the agent sees next
    (a fresh reset observation when the episode ended). Finished episodes' returns are
    kept in `returns`.
    """

    def __init__(self, seed: int) -> None:
        import gymnasium as gym

        self.env = gym.make("CartPole-v1")
        self.env.action_space.seed(seed)
        self._seed = seed
        self.obs, _ = self.env.reset(seed=seed)
        self.obs = self.obs.astype(np.float32)
        self.episode_return = 0.0
        self.returns: list[float] = []
        self.episode_ends: list[int] = []   # environment step at which each episode ended
        self.steps = 0

    def step(self, action: Any) -> tuple[np.ndarray, np.float32, np.float32, np.ndarray]:
        s2, r, terminated, truncated, _ = self.env.step(int(action))
        s2 = s2.astype(np.float32)
        self.steps += 1
        self.episode_return += float(r)
        s_next = s2
        if terminated or truncated:
            self.returns.append(self.episode_return)
            self.episode_ends.append(self.steps)
            self.episode_return = 0.0
            s_next, _ = self.env.reset()
            s_next = s_next.astype(np.float32)
        self.obs = s_next
        return s2, np.float32(r), np.float32(terminated), s_next

    def close(self) -> None:
        self.env.close()


# ----------------------------------------------------------------------------- network
class QNetwork:
    """A 2-hidden-layer relu MLP whose weights live in ONE flat Variable.

    One Variable per network (instead of one per weight matrix and bias) keeps the
    in-graph agent lean: one read, one Switch where a cond captures it, one pair of
    Adam moments, and one assign to refresh the target network.
    """

    def __init__(self, cfg: DQNConfig, n_obs: int, n_act: int, name: str) -> None:
        rng = np.random.default_rng(cfg.seed)
        dims = [n_obs, cfg.hidden, cfg.hidden, n_act]
        parts, self.shapes = [], []
        for a, b in itertools.pairwise(dims):
            lim = np.sqrt(6.0 / (a + b))                         # Glorot uniform
            parts += [rng.uniform(-lim, lim, a * b), np.zeros(b)]
            self.shapes += [(a, b), (b,)]
        self.var = dcf.Variable(np.concatenate(parts).astype(np.float32), name=name)

    def __call__(self, flat: Any, x: Any) -> dcf.Tensor:
        """Q(x) [B, n_act] for a batch x [B, n_obs], with weights `flat` (a read of `var`)."""
        # one split into the 6 weights (views), whose gradient is one concat
        parts = dcf.split(flat, [int(np.prod(sh)) for sh in self.shapes])
        ws = [dcf.reshape(p, sh) if len(sh) == 2 else p for p, sh in zip(parts, self.shapes)]
        h = x
        for k in range(0, len(ws), 2):
            h = dcf.matmul(h, ws[k]) + ws[k + 1]
            if k + 2 < len(ws):
                h = dcf.nn.relu(h)
        return h


def _huber(x: dcf.Tensor) -> dcf.Tensor:
    ax = dcf.abs(x)
    return dcf.where(ax < 1.0, 0.5 * dcf.square(x), ax - 0.5)


def _td_loss(cfg: DQNConfig, net: QNetwork, online: Any, target: Any, s, a, r, s2, d
             ) -> dcf.Tensor:
    q = net(online, s)
    q_sa = dcf.reduce_sum(q * dcf.one_hot(a, 2), axis=1)
    q_next = dcf.reduce_max(net(target, s2), axis=1)
    y = dcf.stop_gradient(r + cfg.gamma * (1.0 - d) * q_next)
    return dcf.reduce_mean(_huber(q_sa - y))


def _epsilon(cfg: DQNConfig, t: Any) -> Any:
    frac = dcf.minimum(dcf.cast(t, dcf.float32) / float(cfg.eps_decay_steps), 1.0)
    return cfg.eps_start + (cfg.eps_end - cfg.eps_start) * frac


class _Buffer:
    """The in-graph replay buffer: a table Variable with one transition per row
    (s, a, r, done, s2 as float32 columns), a write-index Variable and a size Variable."""

    def __init__(self, cfg: DQNConfig, n_obs: int) -> None:
        self.capacity, self.n_obs = cfg.capacity, n_obs
        self.table = dcf.Variable(np.zeros((cfg.capacity, 2 * n_obs + 3), np.float32),
                                  name="replay/table", trainable=False)
        self.write = dcf.Variable(np.int32(0), name="replay/write_index", trainable=False)
        self.size = dcf.Variable(np.int32(0), name="replay/size", trainable=False)

    def store(self, s, a, r, s2, d) -> dcf.Operation:
        """Write one transition at the write index, then advance the index and the size."""
        w = self.write.read_value()
        row = dcf.concat([s, dcf.reshape(dcf.cast(a, dcf.float32), (1,)), dcf.reshape(r, (1,)),
                          dcf.reshape(d, (1,)), s2], 0)
        write = self.table.scatter_update(dcf.reshape(w, (1,)), dcf.reshape(row, (1, -1)))
        with dcf.control_dependencies([write]):
            return dcf.group(self.write.assign((w + 1) % self.capacity),
                             self.size.assign(dcf.minimum(self.size + 1, self.capacity)))

    def sample(self, table: Any, batch: int, size: Any, seed: int) -> tuple:
        """`batch` uniform rows among the first `size` rows of `table` (with replacement),
        as (s, a, r, s2, done)."""
        u = dcf.random_uniform((batch,), seed=seed)
        idx = dcf.minimum(dcf.cast(u * dcf.cast(size, dcf.float32), dcf.int32), size - 1)
        n = self.n_obs
        rows = dcf.gather(table, idx)
        return (rows[:, :n], dcf.cast(rows[:, n], dcf.int32), rows[:, n + 1], rows[:, n + 3:],
                rows[:, n + 2])


# ----------------------------------------------------------------------------- in-graph
def _placed(device: str | None) -> contextlib.AbstractContextManager:
    """`dcf.device(device)`, or no scope for None (the embedded default device)."""
    return dcf.device(device) if device else contextlib.nullcontext()


class InGraphAgent:
    """Builds the one-run-per-step DQN graph into `graph` (a fresh one by default), placed
    on `device` (None: the default device; the environment's py_func stays on the host)."""

    def __init__(self, env: CartPole, cfg: DQNConfig, graph: dcf.Graph | None = None,
                 device: str | None = None) -> None:
        self.env, self.cfg = env, cfg
        self.graph = graph or dcf.Graph()
        n_obs = int(np.asarray(env.obs).shape[0])
        with self.graph.as_default(), _placed(device):
            self.net = QNetwork(cfg, n_obs, 2, "online")
            self.target = QNetwork(cfg, n_obs, 2, "target")
            self.buffer = _Buffer(cfg, n_obs)
            self.obs = dcf.Variable(np.asarray(env.obs, np.float32), name="obs", trainable=False)
            self.t = dcf.Variable(np.int32(0), name="env_steps", trainable=False)
            self.opt = dcf.train.AdamOptimizer(cfg.lr)
            self.step_op, self.loss = self._build()
            self.init = dcf.global_variables_initializer()
        self.sess = dcf.Session(self.graph)
        self.sess.run(self.init)
        self.losses: list[float] = []

    def _build(self) -> tuple[dcf.Operation, dcf.Tensor]:
        cfg, buf = self.cfg, self.buffer
        s = self.obs.read_value()
        t = self.t.read_value()
        # The online weights are read once, outside the conds: acting and learning
        # use the same snapshot, and gradients are taken with respect to these reads.
        w = self.net.var.read_value()

        # 1. act: epsilon-greedy inside the graph.
        explore = dcf.random_uniform((), seed=cfg.seed) < _epsilon(cfg, t)
        a = dcf.cond(explore,
                     lambda: dcf.random_uniform((), 0, 2, dtype=dcf.int32, seed=cfg.seed + 1),
                     lambda: dcf.cast(dcf.argmax(self.net(w, dcf.reshape(s, (1, -1)))[0]),
                                      dcf.int32),
                     name="act")

        # 2. the environment step, in the graph.
        s2, r, d, s_next = dcf.py_func(self.env.step, [a],
                                       [dcf.float32, dcf.float32, dcf.float32, dcf.float32],
                                       name="env_step")
        s2, s_next = dcf.reshape(s2, (-1,)), dcf.reshape(s_next, (-1,))
        r, d = dcf.reshape(r, ()), dcf.reshape(d, ())

        # 3. store the transition, advance the observation and the step counter.
        store = buf.store(s, a, r, s2, d)
        with dcf.control_dependencies([store]):
            advance = dcf.group(self.obs.assign(s_next), self.t.assign_add(1))
            size = buf.size.read_value()            # after this step's write
            table = buf.table.read_value()
            ready = size >= cfg.learn_start
        tw = self.target.var.read_value()

        # 4. learn, only once enough experience exists. (Variables are read outside the
        # cond and their values captured: a read is a reference, not a copy.)
        def td_loss():
            return _td_loss(cfg, self.net, w, tw,
                            *buf.sample(table, cfg.batch, size, cfg.seed + 2))

        loss = dcf.cond(ready, td_loss, lambda: dcf.constant(0.0), name="learn")
        (grad,) = dcf.gradients(loss, [w])

        def apply():
            upd = self.opt.apply_gradients([(grad, self.net.var)])
            with dcf.control_dependencies([upd]):
                return dcf.identity(loss)

        trained = dcf.cond(ready, apply, lambda: dcf.constant(0.0), name="train")

        # 5. refresh the target network every `target_every` steps (after the update).
        with dcf.control_dependencies([trained]):
            refresh_now = dcf.equal((t + 1) % cfg.target_every, 0)

        def refresh():
            with dcf.control_dependencies([self.target.var.assign(self.net.var.read_value())]):
                return dcf.constant(True)

        refreshed = dcf.cond(refresh_now, refresh, lambda: dcf.constant(False), name="refresh")
        return dcf.group(advance, refreshed), trained

    def run_steps(self, n: int) -> None:
        """n environment steps, one `sess.run` each."""
        run, fetch = self.sess.run, [self.loss, self.step_op]
        for _ in range(n):
            loss, _ = run(fetch)
            if loss:
                self.losses.append(float(loss))

    def close(self) -> None:
        self.sess.close()


# ----------------------------------------------------------------------------- client
class ClientAgent:
    """The baseline: the same networks, buffer and update, but every decision in Python and
    one `sess.run` per piece (act; env.step in Python; store; train; refresh), placed on
    `device` like the in-graph agent's."""

    def __init__(self, env: CartPole, cfg: DQNConfig, graph: dcf.Graph | None = None,
                 device: str | None = None) -> None:
        self.env, self.cfg = env, cfg
        self.graph = graph or dcf.Graph()
        n_obs = int(np.asarray(env.obs).shape[0])
        with self.graph.as_default(), _placed(device):
            self.net = net = QNetwork(cfg, n_obs, 2, "online")
            self.target = QNetwork(cfg, n_obs, 2, "target")
            self.buffer = buf = _Buffer(cfg, n_obs)
            self.s_ph = dcf.placeholder(dcf.float32, (n_obs,), name="s")
            self.a_ph = dcf.placeholder(dcf.int32, (), name="a")
            self.r_ph = dcf.placeholder(dcf.float32, (), name="r")
            self.s2_ph = dcf.placeholder(dcf.float32, (n_obs,), name="s2")
            self.d_ph = dcf.placeholder(dcf.float32, (), name="d")
            self.greedy = dcf.cast(
                dcf.argmax(net(net.var, dcf.reshape(self.s_ph, (1, -1)))[0]), dcf.int32)
            self.store = buf.store(self.s_ph, self.a_ph, self.r_ph, self.s2_ph, self.d_ph)
            self.loss = _td_loss(cfg, net, net.var, self.target.var,
                                 *buf.sample(buf.table, cfg.batch, buf.size.read_value(),
                                            cfg.seed + 2))
            self.train = dcf.train.AdamOptimizer(cfg.lr).minimize(self.loss, [net.var])
            self.refresh = self.target.var.assign(net.var).op
            init = dcf.global_variables_initializer()
        self.sess = dcf.Session(self.graph)
        self.sess.run(init)
        self.rng = np.random.default_rng(cfg.seed)
        self.t = 0
        self.size = 0
        self.losses: list[float] = []

    def run_steps(self, n: int) -> None:
        cfg, env, run = self.cfg, self.env, self.sess.run
        for _ in range(n):
            eps = cfg.eps_start + (cfg.eps_end - cfg.eps_start) * min(
                self.t / cfg.eps_decay_steps, 1.0)
            s = env.obs
            if self.rng.random() < eps:
                a = int(self.rng.integers(2))
            else:
                a = int(run(self.greedy, {self.s_ph: s}))                   # act
            s2, r, d, _ = env.step(a)                                        # env in Python
            run(self.store, {self.s_ph: s, self.a_ph: a, self.r_ph: r,       # store
                             self.s2_ph: s2, self.d_ph: d})
            self.size = min(self.size + 1, cfg.capacity)
            if self.size >= cfg.learn_start:
                loss, _ = run([self.loss, self.train])                       # train
                self.losses.append(float(loss))
            self.t += 1
            if self.t % cfg.target_every == 0:
                run(self.refresh)                                            # refresh

    def close(self) -> None:
        self.sess.close()


# ----------------------------------------------------------------------------- main
def moving_average(xs: list[float], k: int) -> np.ndarray:
    x = np.asarray(xs, np.float64)
    if len(x) < k:
        return np.array([])
    c = np.cumsum(np.insert(x, 0, 0.0))
    return (c[k:] - c[:-k]) / k


def train(steps: int, cfg: DQNConfig, *, client: bool = False, target: float = 150.0,
          window: int = 20, log_every: int = 2000, stop_at_target: bool = False,
          quiet: bool = False, device: str | None = None) -> dict:
    """Train for `steps` environment steps on `device` (None: the default device); returns
    returns, the step at which the average return over `window` episodes first reached
    `target` (or None), and the rate."""
    env = CartPole(cfg.seed)
    agent = (ClientAgent if client else InGraphAgent)(env, cfg, device=device)
    reached = None
    t0 = time.perf_counter()
    done = 0
    try:
        while done < steps:
            n = min(log_every, steps - done)
            agent.run_steps(n)
            done += n
            ma = moving_average(env.returns, window)
            if reached is None and len(ma) and ma.max() >= target:
                k = int(np.argmax(ma >= target))
                reached = env.episode_ends[k + window - 1]
            if not quiet:
                last = f"{ma[-1]:6.1f}" if len(ma) else "   -  "
                loss = np.mean(agent.losses[-200:]) if agent.losses else float("nan")
                print(f"step {done:6d}  episodes {len(env.returns):4d}  "
                      f"avg return (last {window}) {last}  loss {loss:.4f}  "
                      f"{done / (time.perf_counter() - t0):6.0f} steps/s", flush=True)
            if stop_at_target and reached is not None:
                break
    finally:
        agent.close()
        env.close()
    elapsed = time.perf_counter() - t0
    ma = moving_average(env.returns, window)
    return {"returns": env.returns, "episode_ends": env.episode_ends, "reached_at": reached,
            "best_avg": float(ma.max()) if len(ma) else None, "steps": done,
            "steps_per_s": done / elapsed, "seconds": elapsed}


def plot_learning_curve(result: dict, path: str, window: int = 20, target: float = 150.0,
                        title: str = "") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ends, rets = result["episode_ends"], result["returns"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(ends, rets, ".", ms=3, alpha=0.4, label="episode return")
    ma = moving_average(rets, window)
    if len(ma):
        ax.plot(ends[window - 1:], ma, "-", lw=2, label=f"average of last {window}")
    ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target:g}")
    if result.get("reached_at"):
        ax.axvline(result["reached_at"], color="green", ls=":", lw=1,
                   label=f"reached at step {result['reached_at']}")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("return")
    ax.set_title(title or "in-graph DQN on CartPole-v1 (dcf)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    if not os.path.splitext(path)[1]:
        path += ".png"                  # what savefig writes for a name without extension
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a clear error for 0, negatives and non-integers)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (>= 1), got {value}")
    return value


def device_problem(device: str) -> str | None:
    """None where `device` exists in this process (an op placed there runs), else what is
    wrong with it, in the session's words: "/gpu:0 does not exist here (no GPU is
    visible: ...)" or "invalid device spec ...". A small run, so that a bad --device is
    refused before CartPole and the agent's graph are made."""
    g = dcf.Graph()
    try:
        with g.as_default(), dcf.device(device):
            probe = dcf.constant(np.float32(0.0), name="device_probe")
        with dcf.Session(g) as sess:
            sess.run(probe)
    except (ValueError, dcf.errors.InvalidArgumentError) as e:
        # "/gpu:0 does not exist here (no GPU is visible: ...)": without the probe op
        return str(e).split(" is placed on ", 1)[-1].replace(
            ", which does not exist in this session", " does not exist here", 1)
    return None


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
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=positive_int, default=40_000, help="environment steps")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--client", action="store_true",
                   help="run the client-driven baseline instead of the in-graph agent")
    p.add_argument("--plot", metavar="PNG", default=None,
                   help="save the learning curve (.png, or the format its extension names)")
    p.add_argument("--stop-at-target", action="store_true",
                   help="stop once the average return over 20 episodes reaches 150")
    p.add_argument("--device", default=None, metavar="DEVICE",
                   help="place the agent's graph there, e.g. /gpu:0 (default: the CPU)")
    args = p.parse_args(argv)
    if importlib.util.find_spec("gymnasium") is None:
        p.error("CartPole needs gymnasium: pip install -e '.[rl]'")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        p.error("--plot needs matplotlib: pip install -e '.[plot]'")
    if args.plot:                       # (refused now, not after the whole training run)
        from matplotlib.figure import Figure

        kinds = Figure().canvas.get_supported_filetypes()
        ext = os.path.splitext(args.plot)[1][1:].lower()
        if ext and ext not in kinds:
            p.error(f"argument --plot: matplotlib cannot write .{ext} pictures; give one "
                    f"of .{', .'.join(sorted(kinds))} (or no extension: .png)")
    problem = device_problem(args.device) if args.device else None
    if problem:
        p.error(f"argument --device: {problem}")
    cfg = DQNConfig(seed=args.seed)
    kind = "client-driven" if args.client else "in-graph"
    print(f"{kind} DQN on CartPole-v1 on {args.device or 'the CPU'}, seed {args.seed}, up "
          f"to {args.steps} steps; {dataclasses.asdict(cfg)}")
    res = train(args.steps, cfg, client=args.client, stop_at_target=args.stop_at_target,
                device=args.device)
    if res["reached_at"] is not None:
        print(f"average return over 20 episodes reached 150 at environment step "
              f"{res['reached_at']} (best average {res['best_avg']:.1f}); "
              f"{res['steps_per_s']:.0f} steps/s")
    else:
        best = "no 20 episodes finished yet" if res["best_avg"] is None else \
            f"best average {res['best_avg']:.1f}"
        print(f"average return over 20 episodes did not reach 150 in {res['steps']} steps "
              f"({best}); {res['steps_per_s']:.0f} steps/s")
    if args.plot:
        print("learning curve:", plot_learning_curve(res, args.plot,
                                                     title=f"{kind} DQN, CartPole-v1, seed "
                                                     f"{args.seed}"))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:       # Ctrl-C: the agent's session and the environment close on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
