"""Probe: where a DQN step's time goes, per agent, with the example's graphs placed on a
device (the paper's section 6.5 ran its DQN on a GPU: "overlapping of I/O with other work
on a GPU").

Both agents are the example's (`examples/dqn_cartpole.py`), built with
``device=DEVICE`` in the learning regime (greedy acting, learning every step); the
environment's py_func stays on the host. The in-graph agent is timed per run, with the
environment's own step timed inside it; the client-driven agent is driven by the same
loop as its ``run_steps`` with a timer around each piece (act, env, store, train,
refresh). Also the cost of a bare run on the device (a [4] feed and a scalar fetched:
bench.probes.gpu_run_cost). Interleaved blocks, medians of the blocks.

    python -m bench.probes.dqn_gpu [--devices /gpu:0,/cpu:0] [--block 300] [--rounds 8]
                                   [--profile N]   # cProfile N steps of each agent too
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.dqn import load_example
from bench.probes.gpu_run_cost import run_costs


class _TimedEnv:
    """Wraps a gymnasium env: the seconds spent in its `step`."""

    def __init__(self, env) -> None:
        self._env, self.seconds = env, 0.0

    def step(self, a):
        t = time.perf_counter()
        try:
            return self._env.step(a)
        finally:
            self.seconds += time.perf_counter() - t

    def __getattr__(self, name):
        return getattr(self._env, name)


def _client_steps(agent, n: int, parts: dict) -> None:
    """`ClientAgent.run_steps(n)` with a timer around each piece (same decisions)."""
    cfg, env, run, pc = agent.cfg, agent.env, agent.sess.run, time.perf_counter
    for _ in range(n):
        t0 = pc()
        eps = cfg.eps_start + (cfg.eps_end - cfg.eps_start) * min(agent.t / cfg.eps_decay_steps,
                                                                  1.0)
        s = env.obs
        if agent.rng.random() < eps:
            a = int(agent.rng.integers(2))
            t1 = pc()
        else:
            t_a = pc()
            a = int(run(agent.greedy, {agent.s_ph: s}))
            t1 = pc()
            parts["act run"] += t1 - t_a
        s2, r, d, _ = env.step(a)
        t2 = pc()
        parts["env step"] += t2 - t1
        run(agent.store, {agent.s_ph: s, agent.a_ph: a, agent.r_ph: r, agent.s2_ph: s2,
                          agent.d_ph: d})
        t3 = pc()
        parts["store run"] += t3 - t2
        agent.size = min(agent.size + 1, cfg.capacity)
        if agent.size >= cfg.learn_start:
            loss, _ = run([agent.loss, agent.train])
            agent.losses.append(float(loss))
        t4 = pc()
        parts["train run"] += t4 - t3
        agent.t += 1
        if agent.t % cfg.target_every == 0:
            run(agent.refresh)
        parts["total"] += pc() - t0


def profile(ex, device: str, n: int, top: int = 22) -> None:
    """cProfile `n` learning steps of each agent on `device`: the functions by own time."""
    import cProfile
    import pstats

    cfg = ex.DQNConfig(learn_start=500, eps_decay_steps=500)
    for kind, cls in (("in-graph", ex.InGraphAgent), ("client", ex.ClientAgent)):
        env = ex.CartPole(cfg.seed)
        agent = cls(env, cfg, device=device)
        try:
            agent.run_steps(cfg.learn_start + 100)
            prof = cProfile.Profile()
            prof.enable()
            agent.run_steps(n)
            prof.disable()
        finally:
            agent.close()
            env.close()
        print(f"--- {device} {kind}: {n} steps, by own time")
        pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def measure(ex, device: str, block: int, rounds: int) -> dict:
    cfg = ex.DQNConfig(learn_start=500, eps_decay_steps=500)
    agents = {}
    for kind, cls in (("in-graph", ex.InGraphAgent), ("client", ex.ClientAgent)):
        env = ex.CartPole(cfg.seed)
        env.env = timed = _TimedEnv(env.env)
        agent = cls(env, cfg, device=device)
        agent.run_steps(cfg.learn_start + 100)
        agents[kind] = (agent, env, timed)
    samples: dict = {"in-graph": [], "client": []}
    try:
        for _ in range(rounds):
            agent, env, timed = agents["in-graph"]
            timed.seconds = 0.0
            t = time.perf_counter()
            agent.run_steps(block)
            total = time.perf_counter() - t
            samples["in-graph"].append({"total": total / block,
                                        "env step": timed.seconds / block})
            agent, env, timed = agents["client"]
            parts = dict.fromkeys(("total", "act run", "env step", "store run", "train run"),
                                  0.0)
            _client_steps(agent, block, parts)
            samples["client"].append({k: v / block for k, v in parts.items()})
    finally:
        for agent, env, _ in agents.values():
            agent.close()
            env.close()
    med = {k: {p: statistics.median(s[p] for s in v) * 1e6 for p in v[0]}
           for k, v in samples.items()}
    med["bare run us"] = run_costs(device)["feed [4], fetch a reduction"]
    return med


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--devices", default="/gpu:0,/cpu:0")
    p.add_argument("--block", type=int, default=300)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--profile", type=int, default=0, metavar="N")
    args = p.parse_args(argv)
    ex = load_example()
    for device in args.devices.split(","):
        m = measure(ex, device, args.block, args.rounds)
        ig, cl = m["in-graph"], m["client"]
        print(f"{device}: in-graph {ig['total']:7.1f} us a step (env step {ig['env step']:.1f}); "
              f"client {cl['total']:7.1f} us a step (" +
              ", ".join(f"{k} {v:.1f}" for k, v in cl.items() if k != "total") +
              f"); in-graph / client {cl['total'] / ig['total']:.3f}; "
              f"a bare run (feed [4], fetch a scalar) {m['bare run us']:.1f} us", flush=True)
        if args.profile:
            profile(ex, device, args.profile)


if __name__ == "__main__":
    main()
