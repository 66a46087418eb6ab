"""examples/reinforce_rollout.py: an episode inside one while_loop and the REINFORCE
gradient through it, checked against a numpy computation on the same episode."""

from __future__ import annotations

import numpy as np
import pytest

import dcf

pytest.importorskip("gymnasium")


@pytest.fixture
def rf(example):
    return example("reinforce_rollout")


def _numpy_grads(params, obs, act, adv):
    """d/dparams of -sum(log pi(a|s) * adv) for the tanh MLP policy, by hand."""
    w0, b0, w1, b1 = params
    h = np.tanh(obs @ w0 + b0)
    logits = h @ w1 + b1
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dlogits = -(np.eye(2)[act] - p) * adv[:, None]
    dpre = (dlogits @ w1.T) * (1.0 - h ** 2)
    return [obs.T @ dpre, dpre.sum(0), h.T @ dlogits, dlogits.sum(0)]


def test_gradient_through_the_rollout_loop_matches_numpy(rf):
    env = rf.CartPole(seed=3)
    m = rf.build(env, hidden=8, max_steps=40, seed=3)
    grads = dcf.gradients(m["loss"], m["params"])
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        params = sess.run(m["params"])
        for _ in range(2):                                   # two different episodes
            out = sess.run({"g": grads, "obs": m["observations"], "act": m["actions"],
                            "r": m["rewards"], "adv": m["advantages"], "T": m["steps"],
                            "ret": m["episode_return"], "loss": m["loss"]})
            T = int(out["T"])
            assert 1 <= T <= 40 and out["obs"].shape == (T, 4) and out["act"].shape == (T,)
            assert out["ret"] == T and np.all(out["r"] == 1.0)   # CartPole: +1 per step
            assert np.isfinite(out["loss"])
            g = 0.99 ** np.arange(T)
            returns = np.array([np.sum(g[: T - t] * out["r"][t:]) for t in range(T)])
            adv = (returns - returns.mean()) / (returns.std() + 1e-6)
            np.testing.assert_allclose(out["adv"], adv, rtol=1e-4, atol=1e-5)
            want = _numpy_grads([p.astype(np.float64) for p in params],
                                out["obs"].astype(np.float64), out["act"], adv)
            for got, ref in zip(out["g"], want):
                np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-5)
    env.close()


def test_main_trains_and_prints_returns(rf, capsys):
    assert rf.main(["--episodes", "6", "--report-every", "3"]) == 0
    out = capsys.readouterr().out
    assert "episode    6" in out and "average return" in out


def test_summary_counts_only_the_episodes_that_ran(rf, capsys):
    # fewer episodes than --report-every: the summary must not claim 20 episodes
    assert rf.main(["--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "first 2 episodes" in out and "last 2 episodes" in out
    assert "20 episodes" not in out
