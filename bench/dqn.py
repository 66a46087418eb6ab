"""Paper section 6.5: DQN in one graph run per environment step vs driven from the client.

Both dcf agents are in ``examples/dqn_cartpole.py`` and run the same algorithm on the
same gymnasium CartPole-v1 with the same hyper-parameters and seed:

* ``in-graph``: one ``sess.run`` per environment step: epsilon-greedy action (cond),
  ``env.step`` (py_func), replay write (scatter update), sampling and the Adam update
  (conds on the amount of experience), the target refresh (cond every K steps);
* ``client``: act (a run, only when exploiting), ``env.step`` in Python, store (a run),
  train (a run, once enough experience exists), refresh (a run every K steps), with every
  decision taken in Python.

Where TensorFlow is importable, ``tf1-in-graph`` and ``tf1-client`` are the same two
agents, op for op, in ``tf.compat.v1`` graph mode with control flow v1 (one intra- and
one inter-op thread), measured in the learning regime: the paper's own setting on this
machine, and the peer ratio dcf / TF1.

Metric: environment steps per second, in regimes each measured in interleaved blocks
(in-graph block, client block, ...) so outside load hits the systems alike:

* ``learning`` (the headline): after ``learn_start`` transitions and with epsilon at its
  final value, so every step acts greedily, stores and learns (the bulk of a DQN run);
* ``collecting``: the first steps, before learning starts, epsilon near 1 (the client
  then makes a single ``run`` per step, the store);
* ``training_run``: the first 18,000 steps (quick: 4,500) of a training run from scratch
  with the example's settings, in three interleaved blocks: the mix a real run sees.

Each block is timed by the wall clock (the headline, ``speedup_*``) and by this
process's CPU time (``*_cpu``: steps per CPU-second, which outside load on a shared
machine disturbs much less). ``speedup_*`` = in-graph / client steps/s (> 1: in-graph
faster); the paper reports 1.21x (21 %) for its in-graph DQN. ``dcf_vs_tf1_*`` = dcf /
TF1 steps/s of the same agent. ``config.run_overhead_us`` records what a dcf ``sess.run``
that computes nearly nothing costs here (a Const; a Const and an op; five scalar feeds):
fusing the client's ~3 runs a step into one can save about that much per removed run.

``--device /gpu:0`` places both agents' graphs on a GPU (the environment's py_func stays on
the host), as the paper's DQN ran: a GPU benchmark, skipped cleanly where no GPU is
visible; TF1's agents are left out there (the device machine has no TensorFlow).

    python -m bench.dqn [--quick] [--no-tf1] [--device /gpu:0] [--out FILE]
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import dcf
from bench.harness import (
    Result,
    Stats,
    base_argparser,
    cpu_model,
    git_head,
    peer_available,
    peer_versions,
    report,
    source_fingerprint,
)

ROOT = Path(__file__).resolve().parents[1]
# dcf files on this benchmark's hot path (their hashes go into the JSON's config)
HOT_PATH_FILES = ("frame_compiler.py", "session.py", "plan.py", "resources.py",
                  "ops/state_ops.py", "ops/math_ops.py", "ops/array_ops.py", "ops/data_ops.py",
                  "ops/random_ops.py", "ops/nn_ops.py", "fusion/elementwise.py", "train.py")


def load_example() -> Any:
    """examples/dqn_cartpole.py as a module (examples/ is not a package)."""
    name = "dqn_cartpole"
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "dqn_cartpole.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------ TF1 peer
def _tf1() -> tuple[Any, Any]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    v1.disable_control_flow_v2()
    tf.get_logger().setLevel("ERROR")
    return tf, v1


class TF1Agent:
    """The example's two agents, op for op, in TF1 graph mode (control flow v1)."""

    def __init__(self, env: Any, cfg: Any, in_graph: bool) -> None:
        tf, v1 = _tf1()
        self.env, self.cfg, self.in_graph = env, cfg, in_graph
        n = int(np.asarray(env.obs).shape[0])
        rng = np.random.default_rng(cfg.seed)
        dims, parts, shapes = [n, cfg.hidden, cfg.hidden, 2], [], []
        for a, b in itertools.pairwise(dims):          # the same initial weights as dcf's
            lim = np.sqrt(6.0 / (a + b))
            parts += [rng.uniform(-lim, lim, a * b), np.zeros(b)]
            shapes += [(a, b), (b,)]
        init = np.concatenate(parts).astype(np.float32)

        def q(flat: Any, x: Any) -> Any:
            ws, at = [], 0
            for sh in shapes:
                size = int(np.prod(sh))
                piece = flat[at:at + size]
                ws.append(tf.reshape(piece, sh) if len(sh) == 2 else piece)
                at += size
            h = x
            for k in range(0, len(ws), 2):
                h = tf.matmul(h, ws[k]) + ws[k + 1]
                if k + 2 < len(ws):
                    h = tf.nn.relu(h)
            return h

        def var(value: Any, trainable: bool = False) -> Any:
            return v1.Variable(value, use_resource=True, trainable=trainable)

        self.graph = tf.Graph()
        with self.graph.as_default():
            net, tgt = var(init, True), var(init)
            table = var(np.zeros((cfg.capacity, 2 * n + 3), np.float32))
            write, size = var(np.int32(0)), var(np.int32(0))
            opt = v1.train.AdamOptimizer(cfg.lr)

            def store(s: Any, a: Any, r: Any, s2: Any, d: Any) -> Any:
                w = write.read_value()
                row = tf.concat([s, tf.reshape(tf.cast(a, tf.float32), (1,)),
                                 tf.reshape(r, (1,)), tf.reshape(d, (1,)), s2], 0)
                put = v1.scatter_update(table, tf.reshape(w, (1,)), tf.reshape(row, (1, -1)))
                with tf.control_dependencies([put]):
                    return tf.group(write.assign((w + 1) % cfg.capacity),
                                    size.assign(tf.minimum(size.read_value() + 1,
                                                           cfg.capacity)))

            def td_loss(w: Any, tw: Any, tab: Any, sz: Any) -> Any:
                u = v1.random_uniform((cfg.batch,), seed=cfg.seed + 2)
                idx = tf.minimum(tf.cast(u * tf.cast(sz, tf.float32), tf.int32), sz - 1)
                rows = tf.gather(tab, idx)
                s, a, r = rows[:, :n], tf.cast(rows[:, n], tf.int32), rows[:, n + 1]
                d, s2 = rows[:, n + 2], rows[:, n + 3:]
                q_sa = tf.reduce_sum(q(w, s) * tf.one_hot(a, 2), axis=1)
                y = tf.stop_gradient(r + cfg.gamma * (1.0 - d) * tf.reduce_max(q(tw, s2), 1))
                x = q_sa - y
                return tf.reduce_mean(tf.where(tf.abs(x) < 1.0, 0.5 * tf.square(x),
                                               tf.abs(x) - 0.5))

            if in_graph:
                obs, tv = var(np.asarray(env.obs, np.float32)), var(np.int32(0))
                s, t, w = obs.read_value(), tv.read_value(), net.read_value()
                eps = cfg.eps_start + (cfg.eps_end - cfg.eps_start) * tf.minimum(
                    tf.cast(t, tf.float32) / cfg.eps_decay_steps, 1.0)
                a = v1.cond(v1.random_uniform((), seed=cfg.seed) < eps,
                            lambda: v1.random_uniform((), 0, 2, tf.int32, seed=cfg.seed + 1),
                            lambda: tf.cast(tf.argmax(q(w, tf.reshape(s, (1, -1)))[0]),
                                            tf.int32))
                s2, r, d, s_next = v1.py_func(env.step, [a], [tf.float32] * 4)
                s2, s_next = tf.reshape(s2, (n,)), tf.reshape(s_next, (n,))
                r, d = tf.reshape(r, ()), tf.reshape(d, ())
                st = store(s, a, r, s2, d)
                with tf.control_dependencies([st]):
                    advance = tf.group(obs.assign(s_next), tv.assign_add(1))
                    sz, tab = size.read_value(), table.read_value()
                    ready = sz >= cfg.learn_start
                tw = tgt.read_value()
                loss = v1.cond(ready, lambda: td_loss(w, tw, tab, sz), lambda: tf.constant(0.0))
                (grad,) = tf.gradients(loss, [w])

                def apply() -> Any:
                    with tf.control_dependencies([opt.apply_gradients([(grad, net)])]):
                        return tf.identity(loss)

                trained = v1.cond(ready, apply, lambda: tf.constant(0.0))
                with tf.control_dependencies([trained]):
                    refresh_now = tf.equal((t + 1) % cfg.target_every, 0)

                def refresh() -> Any:
                    with tf.control_dependencies([tgt.assign(net.read_value())]):
                        return tf.constant(True)

                refreshed = v1.cond(refresh_now, refresh, lambda: tf.constant(False))
                self.fetch = [trained, tf.group(advance, refreshed)]
            else:
                self.s_ph = v1.placeholder(tf.float32, (n,))
                self.a_ph = v1.placeholder(tf.int32, ())
                self.r_ph = v1.placeholder(tf.float32, ())
                self.s2_ph = v1.placeholder(tf.float32, (n,))
                self.d_ph = v1.placeholder(tf.float32, ())
                self.greedy = tf.cast(tf.argmax(q(net.read_value(),
                                                  tf.reshape(self.s_ph, (1, -1)))[0]), tf.int32)
                self.store = store(self.s_ph, self.a_ph, self.r_ph, self.s2_ph, self.d_ph)
                self.loss = td_loss(net.read_value(), tgt.read_value(), table.read_value(),
                                    size.read_value())
                self.train = opt.minimize(self.loss, var_list=[net])
                self.refresh = tgt.assign(net.read_value())
                self.rng = np.random.default_rng(cfg.seed)
                self.t = self.size = 0
            init_op = v1.global_variables_initializer()
        conf = v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
        self.sess = v1.Session(graph=self.graph, config=conf)
        self.sess.run(init_op)

    def run_steps(self, k: int) -> None:
        if self.in_graph:
            for _ in range(k):
                self.sess.run(self.fetch)
            return
        cfg, env, run = self.cfg, self.env, self.sess.run
        for _ in range(k):
            eps = cfg.eps_start + (cfg.eps_end - cfg.eps_start) * min(
                self.t / cfg.eps_decay_steps, 1.0)
            s = env.obs
            if self.rng.random() < eps:
                a = int(self.rng.integers(2))
            else:
                a = int(run(self.greedy, {self.s_ph: s}))
            s2, r, d, _ = env.step(a)
            run(self.store, {self.s_ph: s, self.a_ph: a, self.r_ph: r, self.s2_ph: s2,
                             self.d_ph: d})
            self.size = min(self.size + 1, cfg.capacity)
            if self.size >= cfg.learn_start:
                run([self.loss, self.train])
            self.t += 1
            if self.t % cfg.target_every == 0:
                run(self.refresh)

    def close(self) -> None:
        self.sess.close()


# ------------------------------------------------------------------------------ measuring
def measure(ex: Any, cfg: Any, *, skip: int, block: int, rounds: int,
            systems: dict[str, Callable[[Any, Any], Any]] | None = None
            ) -> dict[str, dict[str, Stats]]:
    """Per environment step, wall-clock and process CPU seconds of each system: `rounds`
    interleaved blocks of `block` steps after `skip` untimed steps (which also warm the
    plans up). `systems` maps a name to `factory(env, cfg) -> agent` (default: dcf's
    in-graph and client agents). Returns {system: {"wall": Stats, "cpu": Stats}}."""
    systems = systems or {"in-graph": ex.InGraphAgent, "client": ex.ClientAgent}
    agents = {}
    for name, make in systems.items():
        env = ex.CartPole(cfg.seed)
        agents[name] = (make(env, cfg), env)
    wall: dict[str, list[float]] = {k: [] for k in agents}
    cpu: dict[str, list[float]] = {k: [] for k in agents}
    try:
        for agent, _ in agents.values():
            agent.run_steps(skip)
        for _ in range(rounds):
            for name, (agent, _) in agents.items():
                t0, c0 = time.perf_counter(), time.process_time()
                agent.run_steps(block)
                cpu[name].append((time.process_time() - c0) / block)
                wall[name].append((time.perf_counter() - t0) / block)
    finally:
        for agent, env in agents.values():
            agent.close()
            env.close()
    return {k: {"wall": Stats.from_samples(wall[k], number=block),
                "cpu": Stats.from_samples(cpu[k], number=block)} for k in agents}


def run_overheads(n: int = 5000, device: str | None = None) -> dict[str, float]:
    """Microseconds of one dcf `sess.run` that computes next to nothing, on `device` (None:
    the default): what fusing a client's runs into one can save, per run it removes."""
    g = dcf.Graph()
    with g.as_default(), dcf.device(device):    # (None in a fresh graph: no placement)
        c = dcf.constant(1.0)
        v = dcf.Variable(np.float32(0.0))
        op = dcf.group(v.assign_add(1.0))
        phs = [dcf.placeholder(dcf.float32, ()) for _ in range(5)]
        total = dcf.add_n(phs)
        init = dcf.global_variables_initializer()
    out = {}
    with dcf.Session(g) as sess:
        sess.run(init)
        feeds = {p: np.float32(1.0) for p in phs}
        for name, fetch, fd in (("fetch_const", c, None), ("fetch_const_and_op", [c, op], None),
                                ("five_scalar_feeds", total, feeds)):
            sess.run(fetch, fd)
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                for _ in range(n):
                    sess.run(fetch, fd)
                best = min(best, (time.perf_counter() - t0) / n)
            out[name] = round(best * 1e6, 2)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = base_argparser(__doc__.split("\n")[0])
    parser.add_argument("--no-tf1", action="store_true", help="skip the TF1 peer")
    parser.add_argument("--device", default=None, metavar="DEVICE",
                        help="place both dcf agents' graphs there, e.g. /gpu:0 "
                             "(default: the embedded CPU device)")
    args = parser.parse_args(argv)
    device = args.device
    on_gpu = bool(device) and "gpu" in device.lower()
    if on_gpu:
        from bench import gpu_common as G

        if G.gpu_count() == 0:
            G.skip("dqn", "no GPU visible (cupy with a CUDA device is needed)", args.out)
    ex = load_example()
    import gymnasium

    quick = args.quick
    block, rounds = (300, 8) if quick else (1000, 21)
    learn_cfg = ex.DQNConfig(learn_start=500 if quick else 1000,
                             eps_decay_steps=500 if quick else 1000)
    collect_cfg = ex.DQNConfig(learn_start=10**9)
    run_cfg, run_block = ex.DQNConfig(), (1500 if quick else 6000)
    tf1 = not args.no_tf1 and not on_gpu and peer_available("tf1")
    systems = {"in-graph": lambda env, cfg: ex.InGraphAgent(env, cfg, device=device),
               "client": lambda env, cfg: ex.ClientAgent(env, cfg, device=device)}
    dcf_systems = dict(systems)
    if tf1:
        systems["tf1-in-graph"] = lambda env, cfg: TF1Agent(env, cfg, True)
        systems["tf1-client"] = lambda env, cfg: TF1Agent(env, cfg, False)
    load_before = os.getloadavg()
    regimes = {
        # skip past learn_start and the epsilon decay: greedy acting, learning every step
        "learning": measure(ex, learn_cfg, skip=learn_cfg.learn_start + 100, block=block,
                            rounds=rounds, systems=systems),
        # from the first step on, never learning: epsilon ~ 1
        "collecting": measure(ex, collect_cfg, skip=50, block=block,
                              rounds=max(3, rounds // 2), systems=dcf_systems),
        # a training run from scratch with the example's settings (collecting, then
        # learning while epsilon decays over 10,000 steps), in 3 interleaved blocks
        "training_run": measure(ex, run_cfg, skip=0, block=run_block, rounds=3,
                                systems=dcf_systems),
    }
    results, ratios = [], {}
    for regime, stats in regimes.items():
        for clock in ("wall", "cpu"):
            for system, st in stats.items():
                metric = f"{regime} env steps/s" + (" (process CPU time)" if clock == "cpu"
                                                    else "")
                results.append(Result.rate(system, metric, st[clock], 1.0, unit="steps/s"))
            sfx = "" if clock == "wall" else "_cpu"
            med = {k: v[clock].median for k, v in stats.items()}
            ratios[f"speedup_{regime}{sfx}"] = med["client"] / med["in-graph"]
            if "tf1-in-graph" in med:
                ratios[f"speedup_{regime}_tf1{sfx}"] = med["tf1-client"] / med["tf1-in-graph"]
                ratios[f"dcf_vs_tf1_in-graph_{regime}{sfx}"] = med["tf1-in-graph"] / \
                    med["in-graph"]
                ratios[f"dcf_vs_tf1_client_{regime}{sfx}"] = med["tf1-client"] / med["client"]
    ratios["paper_speedup"] = 1.21
    config = {
        "quick": quick, "env": "CartPole-v1", "block_steps": block, "rounds": rounds,
        "device": device or "/cpu:0", "card": G.card_name(0) if on_gpu else "cpu",
        "dqn": dict(vars(learn_cfg)), "learning_skip": learn_cfg.learn_start + 100,
        "training_run": {"steps": 3 * run_block, "dqn": dict(vars(run_cfg))},
        "tf1": tf1, "peers": peer_versions() if tf1 else {},
        "cpus": os.cpu_count(), "cpu_model": cpu_model(),
        "python": platform.python_version(), "numpy": np.__version__,
        "gymnasium": gymnasium.__version__, "dcf": getattr(dcf, "__version__", "?"),
        "git_head": git_head(),
        "dcf_source": source_fingerprint(HOT_PATH_FILES),
        "example_sha1": hashlib.sha1((ROOT / "examples" / "dqn_cartpole.py").read_bytes())
        .hexdigest()[:10],
        "run_overhead_us": run_overheads(1000 if quick else 5000, device),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    return report("dqn", config, results, ratios, out=args.out)


if __name__ == "__main__":
    main()
