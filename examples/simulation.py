"""A multi-process simulation: 4 worker processes each step their own environments
inside an in-graph loop (py_func on that worker), and a learner on the client's device
aggregates their results every iteration. One Session.run per round.

Run: python examples/simulation.py [--workers 4] [--rounds 5] [--steps 20]

Each worker holds a batch of noisy 1-D "thermostat" environments whose best setting
differs per worker; the learner moves one shared setting theta up the average reward
gradient the workers report, iteration by iteration, inside the while_loop.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import dcf


def make_env_step(worker: int, n_envs: int = 16):
    """An environment batch living in the worker process (state in the closure)."""
    rng = np.random.default_rng(worker)
    target = 1.0 + worker                     # each worker's environments prefer a setting
    state = {"temp": rng.normal(size=n_envs), "steps": 0}

    def env_step(theta):
        noise = rng.normal(scale=0.1, size=n_envs)
        state["temp"] = 0.8 * state["temp"] + 0.2 * theta + noise
        state["steps"] += 1
        reward = -np.mean((state["temp"] - target) ** 2)
        grad = -np.mean(2 * (state["temp"] - target) * 0.2)   # d reward / d theta (local)
        return np.float32(reward), np.float32(grad), np.int32(os.getpid())

    return env_step


def build(num_workers: int, steps: int):
    theta_var = dcf.Variable(np.float32(0.0), name="theta")

    def body(i, theta, total):
        rewards, grads = [], []
        for k in range(num_workers):
            with dcf.device(f"/job:worker/task:{k}/cpu:0"):
                r, g, _ = dcf.py_func(make_env_step(k), [theta],
                                      [dcf.float32, dcf.float32, dcf.int32], name=f"env{k}")
            rewards.append(dcf.reshape(r, []))
            grads.append(dcf.reshape(g, []))
        # the learner (client device): aggregate every worker's result, update in-graph
        g = dcf.add_n(grads) / float(num_workers)
        return i + 1, theta + 0.5 * g, total + dcf.add_n(rewards) / float(num_workers)

    _, theta, total = dcf.while_loop(lambda i, t, s: i < steps, body,
                                     (0, theta_var.read_value(), dcf.constant(0.0)))
    with dcf.control_dependencies([theta_var.assign(theta)]):
        mean_reward = dcf.identity(total / float(steps))
    return theta_var, mean_reward


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a clear error for 0, negatives and non-integers)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (>= 1), got {value}")
    return value


def main(argv: list[str] | None = None) -> list[float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=positive_int, default=4)
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--steps", type=positive_int, default=20)
    args = ap.parse_args(argv)
    history = []
    with dcf.Cluster.local(args.workers) as cluster:
        theta, mean_reward = build(args.workers, args.steps)
        with dcf.Session(cluster=cluster) as sess:
            sess.run(theta.initializer)
            for rnd in range(args.rounds):
                r = float(sess.run(mean_reward))      # one run = one whole round
                history.append(r)
                print(f"round {rnd}: mean reward {r:8.3f}  theta {float(sess.run(theta)):.3f}")
        print(f"workers {cluster.worker_pids}; best shared setting is "
              f"{np.mean([1.0 + k for k in range(args.workers)]):.2f}")
    return history


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:       # Ctrl-C: the session and the workers close on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
