"""Paper section 6.5: DQN in one graph run per environment step vs driven from the client.

Both agents are in ``examples/dqn_cartpole.py`` and run the same algorithm on the same
gymnasium CartPole-v1 with the same hyper-parameters and seed:

* ``in-graph``: one ``sess.run`` per environment step: epsilon-greedy action (cond),
  ``env.step`` (py_func), replay write (scatter update), sampling and the Adam update
  (conds on the amount of experience), the target refresh (cond every K steps);
* ``client``: act (a run, only when exploiting), ``env.step`` in Python, store (a run),
  train (a run, once enough experience exists), refresh (a run every K steps), with every
  decision taken in Python.

Metric: environment steps per second, in two regimes, each measured in interleaved
blocks (in-graph block, client block, ...) so outside load hits both alike:

* ``learning`` (the headline): after ``learn_start`` transitions and with epsilon at its
  final value, so every step acts greedily, stores and learns (the bulk of a DQN run);
* ``collecting``: the first steps, before learning starts, epsilon near 1 (the client
  then makes a single ``run`` per step, the store).

Each block is timed by the wall clock (the headline, ``speedup_*``) and by this
process's CPU time (``*_cpu``: steps per CPU-second, which outside load on a shared
machine disturbs much less). Ratio = in-graph / client steps/s (> 1: in-graph faster);
the paper reports 1.21x (21 %) for its in-graph DQN.

    python -m bench.dqn [--quick] [--out FILE]
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import dcf
from bench.harness import Result, Stats, base_argparser, report

ROOT = Path(__file__).resolve().parents[1]


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


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def measure(ex: Any, cfg: Any, *, skip: int, block: int, rounds: int
            ) -> dict[str, dict[str, Stats]]:
    """Per environment step, wall-clock and process CPU seconds of each agent: `rounds`
    interleaved blocks of `block` steps after `skip` untimed steps (which also warm the
    plans up). Returns {system: {"wall": Stats, "cpu": Stats}}."""
    agents = {}
    for name, cls in (("in-graph", ex.InGraphAgent), ("client", ex.ClientAgent)):
        env = ex.CartPole(cfg.seed)
        agents[name] = (cls(env, cfg), env)
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


def main(argv: list[str] | None = None) -> dict:
    parser = base_argparser(__doc__.split("\n")[0])
    args = parser.parse_args(argv)
    ex = load_example()
    import gymnasium

    quick = args.quick
    block, rounds = (200, 6) if quick else (400, 15)
    learn_cfg = ex.DQNConfig(learn_start=500 if quick else 1000,
                             eps_decay_steps=500 if quick else 1000)
    collect_cfg = ex.DQNConfig(learn_start=10**9)
    load_before = os.getloadavg()
    regimes = {
        # skip past learn_start and the epsilon decay: greedy acting, learning every step
        "learning": measure(ex, learn_cfg, skip=learn_cfg.learn_start + 100,
                            block=block, rounds=rounds),
        # from the first step on, never learning: epsilon ~ 1
        "collecting": measure(ex, collect_cfg, skip=50, block=block,
                              rounds=max(3, rounds // 2)),
    }
    results, ratios = [], {}
    for regime, stats in regimes.items():
        for clock in ("wall", "cpu"):
            for system, st in stats.items():
                metric = f"{regime} env steps/s" + (" (process CPU time)" if clock == "cpu"
                                                    else "")
                results.append(Result.rate(system, metric, st[clock], 1.0, unit="steps/s"))
            suffix = "" if clock == "wall" else "_cpu"
            ratios[f"speedup_{regime}{suffix}"] = \
                stats["client"][clock].median / stats["in-graph"][clock].median
    ratios["paper_speedup"] = 1.21
    config = {
        "quick": quick, "env": "CartPole-v1", "block_steps": block, "rounds": rounds,
        "dqn": {k: v for k, v in vars(learn_cfg).items()},
        "learning_skip": learn_cfg.learn_start + 100,
        "cpus": os.cpu_count(), "cpu_model": _cpu_model(),
        "python": platform.python_version(), "numpy": np.__version__,
        "gymnasium": gymnasium.__version__, "dcf": getattr(dcf, "__version__", "?"),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    return report("dqn", config, results, ratios, out=args.out)


if __name__ == "__main__":
    main()
