"""examples/dqn_cartpole.py's two agents with their graphs on a GPU (`device=`, the
example's `--device` and bench.dqn's): the same transitions, losses and weights as on the
CPU. The random draws come from the same seeded generators on both devices, so only the
float rounding of the GPU's kernels may differ."""

from __future__ import annotations

import numpy as np
import pytest

from bench.dqn import load_example

pytest.importorskip("gymnasium")

TINY = {"hidden": 8, "batch": 8, "capacity": 32, "learn_start": 10, "target_every": 7,
        "eps_decay_steps": 20}


def _forty_steps(dqn, agent_cls, device):
    cfg = dqn.DQNConfig(**TINY)
    env = dqn.CartPole(cfg.seed)
    agent = agent_cls(env, cfg, device=device)
    try:
        agent.run_steps(40)
        sess = agent.sess
        return (sess.run(agent.net.var), sess.run(agent.target.var),
                sess.run(agent.buffer.table), np.array(agent.losses), list(env.returns))
    finally:
        agent.close()
        env.close()


@pytest.mark.parametrize("kind", ["InGraphAgent", "ClientAgent"])
def test_dqn_agent_on_a_gpu_learns_as_on_the_cpu(kind):
    dqn = load_example()
    cls = getattr(dqn, kind)
    w, tw, table, losses, returns = _forty_steps(dqn, cls, "/gpu:0")
    w0, tw0, table0, losses0, returns0 = _forty_steps(dqn, cls, None)
    assert len(losses) == len(losses0) == 31
    np.testing.assert_array_equal(table, table0)       # the same actions and transitions
    assert returns == returns0
    np.testing.assert_allclose(losses, losses0, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(w, w0, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(tw, tw0, rtol=1e-4, atol=1e-5)
    assert not np.array_equal(w, tw)                   # learned since the last refresh
