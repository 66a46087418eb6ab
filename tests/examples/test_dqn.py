"""examples/dqn_cartpole.py and bench/dqn.py: a few environment steps of each agent (the
learning run itself is not a test; see bench/NOTES.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gymnasium")

ROOT = Path(__file__).resolve().parents[2]

TINY = {"hidden": 8, "batch": 8, "capacity": 32, "learn_start": 10, "target_every": 7,
        "eps_decay_steps": 20}


@pytest.fixture
def dqn(example):
    return example("dqn_cartpole")


def test_in_graph_agent_steps_stores_learns_and_refreshes(dqn):
    cfg = dqn.DQNConfig(**TINY)
    env = dqn.CartPole(cfg.seed)
    agent = dqn.InGraphAgent(env, cfg)
    try:
        sess, buf = agent.sess, agent.buffer
        w0 = sess.run(agent.net.var)
        agent.run_steps(9)                       # below learn_start: no learning yet
        assert agent.losses == []
        assert sess.run(buf.size) == 9 and sess.run(buf.write) == 9
        np.testing.assert_array_equal(sess.run(agent.net.var), w0)
        agent.run_steps(31)                      # 40 steps: learns, wraps the buffer
        assert len(agent.losses) == 31 and np.all(np.isfinite(agent.losses))
        assert sess.run(buf.size) == 32 and sess.run(buf.write) == 40 % 32
        assert sess.run(agent.t) == 40 == env.steps
        assert not np.array_equal(sess.run(agent.net.var), w0)
        # the target was refreshed at step 35 (every 7) and the online net moved since
        tgt = sess.run(agent.target.var)
        assert not np.array_equal(tgt, w0)
        table = sess.run(buf.table)
        assert np.all(np.isin(table[:, 4], [0.0, 1.0]))          # actions
        assert np.all(table[:, 5] == 1.0)                        # CartPole rewards
        np.testing.assert_array_equal(sess.run(agent.obs), env.obs)
    finally:
        agent.close()
        env.close()


def test_client_agent_runs_the_same_algorithm(dqn):
    cfg = dqn.DQNConfig(**TINY)
    env = dqn.CartPole(cfg.seed)
    agent = dqn.ClientAgent(env, cfg)
    try:
        agent.run_steps(40)
        assert len(agent.losses) == 31 and np.all(np.isfinite(agent.losses))
        assert agent.sess.run(agent.buffer.size) == 32
        assert env.steps == 40
    finally:
        agent.close()
        env.close()


def test_train_reports_returns_and_learning_curve_png(dqn, tmp_path):
    res = dqn.train(60, dqn.DQNConfig(**TINY), log_every=30, quiet=True)
    assert res["steps"] == 60 and res["returns"] and res["steps_per_s"] > 0
    assert len(res["returns"]) == len(res["episode_ends"])
    pytest.importorskip("matplotlib")
    path = dqn.plot_learning_curve(res, str(tmp_path / "curve.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_bench_dqn_measures_both_agents(dqn, capsys):
    sys.path.insert(0, str(ROOT))
    try:
        from bench import dqn as bench_dqn
        from bench.harness import Result, report
    finally:
        sys.path.remove(str(ROOT))
    stats = bench_dqn.measure(dqn, dqn.DQNConfig(**TINY), skip=12, block=5, rounds=2)
    assert set(stats) == {"in-graph", "client"}
    assert all(len(s[c].samples) == 2 and s[c].median > 0 for s in stats.values()
               for c in ("wall", "cpu"))
    report("dqn", {}, [Result.rate(k, "steps/s", s["wall"], 1.0) for k, s in stats.items()],
           {})
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last)["bench"] == "dqn"


def test_main_summary_before_20_episodes_end_prints_no_none(dqn, capsys):
    assert dqn.main(["--steps", "50"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "did not reach 150 in 50 steps" in last and "None" not in last, last


def test_bench_dqn_on_a_gpu_is_skipped_cleanly_without_one(capsys, monkeypatch, tmp_path):
    sys.path.insert(0, str(ROOT))
    try:
        from bench import dqn as bench_dqn
        from bench import gpu_common
    finally:
        sys.path.remove(str(ROOT))
    monkeypatch.setattr(gpu_common, "gpu_count", lambda: 0)     # as on a CPU-only machine
    out = tmp_path / "dqn.json"
    with pytest.raises(SystemExit) as ei:
        bench_dqn.main(["--quick", "--device", "/gpu:0", "--out", str(out)])
    assert ei.value.code == 0
    assert "skipped: no GPU visible" in capsys.readouterr().out
    assert json.loads(out.read_text())["config"]["skipped"].startswith("no GPU visible")


def test_agents_placed_on_the_cpu_by_name_run_the_default_placement(dqn):
    cfg = dqn.DQNConfig(**TINY)
    runs = []
    for device in (None, "/cpu:0"):
        env = dqn.CartPole(cfg.seed)
        agent = dqn.InGraphAgent(env, cfg, device=device)
        try:
            agent.run_steps(20)
            runs.append((agent.sess.run(agent.net.var), list(agent.losses)))
        finally:
            agent.close()
            env.close()
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1] and len(runs[0][1]) == 11
