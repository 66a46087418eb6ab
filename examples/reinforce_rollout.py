"""REINFORCE on CartPole-v1: a whole episode rolled out inside ONE while_loop.

Run: python examples/reinforce_rollout.py [--episodes 300] [--seed 0]
Needs: pip install -e '.[rl]' (gymnasium).

One `sess.run(train)` per episode does all of this in the graph (paper section 2.2,
"in-graph while-loops in which the agent interacts with its environment"):

    s = py_func(env.reset)
    t = 0; done = False
    while not done and t < 500:                        # dcf.while_loop
        p = softmax(policy(s))                         # the policy's action probabilities
        a = 0 if uniform() < p[0] else 1               # sampled with random_uniform
        obs[t], act[t] = s, a                          # TensorArrays, one entry per step
        logp[t] = log_softmax(policy(s))[a]
        s, r[t], done = py_func(env.step, a)           # the environment inside the loop
        t += 1
    G = discounted returns-to-go of r                  # dcf.scan over the reversed rewards
    loss = -sum(logp * normalize(G))                   # REINFORCE with a baseline
    adam.minimize(loss)                                # gradients flow back THROUGH the loop

The gradient of `loss` runs as a backward loop with the forward trip count, fed by the
values the forward loop saved (no recomputation, no environment replay).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from typing import Any

import numpy as np

import dcf


class CartPole:
    """A gymnasium CartPole-v1 seen from the graph as `reset()` and `step(action)`."""

    def __init__(self, seed: int) -> None:
        import gymnasium as gym

        self.env = gym.make("CartPole-v1")
        self.seed: int | None = seed
        self.episodes = 0

    def reset(self) -> tuple[np.ndarray, np.int32]:
        """(first observation, episode number), like gymnasium's (obs, info)."""
        obs, _ = self.env.reset(seed=self.seed)
        self.seed = None                       # seed only the first episode
        self.episodes += 1
        return obs.astype(np.float32), np.int32(self.episodes)

    def step(self, action: Any) -> tuple[np.ndarray, np.float32, bool]:
        obs, r, terminated, truncated, _ = self.env.step(int(action))
        return obs.astype(np.float32), np.float32(r), bool(terminated or truncated)

    def close(self) -> None:
        self.env.close()


def build(env: CartPole, *, hidden: int = 32, lr: float = 0.003, gamma: float = 0.99,
          max_steps: int = 500, seed: int = 0) -> dict:
    """The rollout-and-update graph in the default graph; returns the tensors to run."""
    rng = np.random.default_rng(seed)

    def glorot(a: int, b: int) -> np.ndarray:
        lim = np.sqrt(6.0 / (a + b))
        return rng.uniform(-lim, lim, (a, b)).astype(np.float32)

    params = [dcf.Variable(glorot(4, hidden), name="policy/W0"),
              dcf.Variable(np.zeros(hidden, np.float32), name="policy/b0"),
              dcf.Variable(glorot(hidden, 2), name="policy/W1"),
              dcf.Variable(np.zeros(2, np.float32), name="policy/b1")]
    w0, b0, w1, b1 = params

    def logits_of(s: dcf.Tensor) -> dcf.Tensor:                # [4] -> [1, 2]
        h = dcf.tanh(dcf.matmul(dcf.reshape(s, (1, 4)), w0) + b0)
        return dcf.matmul(h, w1) + b1

    s0, episode = dcf.py_func(env.reset, [], [dcf.float32, dcf.int32], name="env_reset")
    s0 = dcf.reshape(s0, (4,))

    def body(t, s, done, obs_ta, act_ta, r_ta, logp_ta):
        logits = logits_of(s)
        p0 = dcf.nn.softmax(logits)[0, 0]
        u = dcf.random_uniform((), seed=seed)
        a = dcf.cast(u >= p0, dcf.int32)                      # P(a = 0) = p0
        logp = dcf.reduce_sum(dcf.nn.log_softmax(logits)[0] * dcf.one_hot(a, 2))
        s2, r, d = dcf.py_func(env.step, [a], [dcf.float32, dcf.float32, dcf.bool],
                               name="env_step")
        # The environment is not differentiable: no gradient flows into env.step.
        s2, r = dcf.stop_gradient(dcf.reshape(s2, (4,))), dcf.stop_gradient(dcf.reshape(r, ()))
        return (t + 1, s2, dcf.reshape(d, ()), obs_ta.write(t, s), act_ta.write(t, a),
                r_ta.write(t, r), logp_ta.write(t, logp))

    def ta(dtype, name):
        return dcf.TensorArray(dtype, size=0, dynamic_size=True, name=name)

    t, _, _, obs_ta, act_ta, r_ta, logp_ta = dcf.while_loop(
        lambda t, s, done, *_: dcf.logical_and(dcf.logical_not(done), t < max_steps), body,
        (dcf.constant(0), s0, dcf.constant(False), ta(dcf.float32, "observations"),
         ta(dcf.int32, "actions"), ta(dcf.float32, "rewards"), ta(dcf.float32, "logp")),
        name="episode")
    logp, rewards = logp_ta.stack(), r_ta.stack()             # [T], [T]

    # Discounted returns-to-go G[t] = r[t] + gamma G[t+1]: a scan over reversed rewards.
    rev = dcf.range(t - 1, -1, -1)
    g_rev = dcf.scan(lambda acc, r: r + gamma * acc, dcf.gather(rewards, rev),
                     initializer=dcf.constant(0.0))
    g = dcf.gather(g_rev, rev)
    adv = (g - dcf.reduce_mean(g)) / (dcf.sqrt(dcf.reduce_mean(dcf.square(
        g - dcf.reduce_mean(g)))) + 1e-6)
    loss = -dcf.reduce_sum(logp * dcf.stop_gradient(adv))
    train = dcf.train.AdamOptimizer(lr).minimize(loss, params)
    return {"train": train, "episode_return": dcf.reduce_sum(rewards), "loss": loss,
            "steps": t, "episode": episode, "params": params, "observations": obs_ta.stack(),
            "actions": act_ta.stack(), "rewards": rewards, "advantages": adv}


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


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (a learning rate of nan or inf trains to nan)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=positive_int, default=300)
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--lr", type=positive_float, default=0.003)
    p.add_argument("--report-every", type=positive_int, default=20,
                   help="print the average return every N episodes")
    args = p.parse_args(argv)
    if importlib.util.find_spec("gymnasium") is None:
        p.error("CartPole needs gymnasium: pip install -e '.[rl]'")
    env = CartPole(args.seed)
    g = dcf.Graph()
    with g.as_default():
        m = build(env, lr=args.lr, seed=args.seed)
        init = dcf.global_variables_initializer()
    returns = []
    with dcf.Session(g) as sess:
        sess.run(init)
        for ep in range(1, args.episodes + 1):
            ret, loss, _ = sess.run([m["episode_return"], m["loss"], m["train"]])
            returns.append(float(ret))
            if ep % args.report_every == 0:
                print(f"episode {ep:4d}  average return (last {args.report_every}) "
                      f"{np.mean(returns[-args.report_every:]):6.1f}  loss {loss:8.3f}",
                      flush=True)
    env.close()
    k = min(args.report_every, len(returns))     # (fewer episodes than one report)
    first, last = np.mean(returns[:k]), np.mean(returns[-k:])
    print(f"average return: first {k} episodes {first:.1f}, last {k} episodes {last:.1f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:       # Ctrl-C: the session closes on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
