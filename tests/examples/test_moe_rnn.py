"""examples/moe_rnn.py: the Figure 1 model (LSTM -> top-k mixture of experts on two
devices -> ACT cell) in one time loop; gradients checked against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import dcf


@pytest.fixture
def moe(example):
    return example("moe_rnn")


def _tiny(moe, **kw):
    m = moe.build(4, 3, units=4, experts=3, k=2, devices=["/cpu:0", "/cpu:1"], **kw)
    x, y = moe.make_task(4, 3, 6, 4, 3, seed=0)
    return m, {m["x"]: x, m["target"]: y}


def test_training_steps_give_finite_falling_loss_on_two_devices(moe):
    m, fd = _tiny(moe)
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        md = dcf.RunMetadata()
        sess.run(m["train"], fd, options=dcf.RunOptions(trace=True), run_metadata=md)
        devices = {e[0] for e in md.trace}
        assert {"/cpu:0", "/cpu:1"} <= devices                 # experts really ran there
        assert any(e[2] == "MatMul" for e in md.trace if e[0] == "/cpu:1")
        losses = [float(sess.run([m["loss"], m["train"]], fd)[0]) for _ in range(15)]
        imp, steps = sess.run([m["importance"], m["ponder_steps"]], fd)
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    # top-2 of 3 experts: the gates of each example sum to 1 at each of the 3 time steps
    assert imp.shape == (3,) and abs(imp.sum() - 4 * 3) < 1e-3
    assert steps.shape == (3,) and np.all((steps >= 1) & (steps <= 6))


def test_every_variable_gets_a_gradient_that_matches_finite_differences(moe):
    m, fd = _tiny(moe, balance=0.0)
    vs = dcf.trainable_variables()
    grads = dcf.gradients(m["loss"], vs)
    assert all(g is not None for g in grads), [v.name for v, g in zip(vs, grads) if g is None]
    checked = [k for k, v in enumerate(vs)
               if any(s in v.name for s in ("expert1/W0", "halt/W", "lstm1/kernel", "act/lstm"))]
    ph = {k: dcf.placeholder(dcf.float32, vs[k].shape) for k in checked}
    sets = {k: vs[k].assign(ph[k]) for k in checked}
    rng = np.random.default_rng(1)
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        gv = sess.run(grads, fd)
        for k in checked:
            base = sess.run(vs[k])
            for _ in range(2):
                idx = tuple(int(rng.integers(0, d)) for d in base.shape)
                vals = []
                for sgn in (1.0, -1.0):
                    w = base.copy()
                    w[idx] += sgn * 1e-2
                    sess.run(sets[k], {ph[k]: w})
                    vals.append(float(sess.run(m["loss"], fd)))
                sess.run(sets[k], {ph[k]: base})
                num = (vals[0] - vals[1]) / 2e-2
                assert abs(gv[k][idx] - num) <= 2e-3 * max(1.0, abs(num)) + 1e-4, \
                    (vs[k].name, idx, gv[k][idx], num)


def test_main_prints_progress_and_falling_loss(moe, capsys):
    assert moe.main(["--steps", "12", "--batch", "4", "--seq", "3", "--units", "4",
                     "--experts", "3"]) == 0
    out = capsys.readouterr().out
    assert "mse: first step" in out and "experts on ['/cpu:0', '/cpu:1']" in out


@pytest.mark.cluster
@pytest.mark.skipif(not hasattr(dcf, "Cluster"), reason="dcf.Cluster is not there yet")
def test_experts_on_worker_processes(moe, capsys):
    assert moe.main(["--steps", "3", "--batch", "4", "--seq", "2", "--units", "4",
                     "--experts", "2", "--workers", "2"]) == 0
    assert "/job:worker/task:1/cpu:0" in capsys.readouterr().out
