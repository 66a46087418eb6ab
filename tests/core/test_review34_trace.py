"""Review 34, timelines: dcf.trace.plot on traces of thousands of op executions; the
device events of concurrent runs on one GPU kept apart."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import dcf


def test_plot_of_thousands_of_events_draws_one_collection_per_track_and_op_type(
        tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    types = ["Add", "Mul", "Tanh"]
    tracks = [("/cpu:0", None), ("/gpu:0", "compute"), ("/gpu:0", "h2d")]
    events = []
    for k in range(6000):
        dev, track = tracks[k % 3]
        ev = (dev, f"op{k}", types[(k // 3) % 3], "while", k, k * 1e-6, k * 1e-6 + 5e-7)
        events.append(ev if track is None else ev + (track,))
    drawn = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **kw: (
        drawn.append(fig), save(fig, *a, **kw))[1])
    path = dcf.trace.plot(events, str(tmp_path / "timeline"))
    assert path.endswith(".png") and (tmp_path / "timeline.png").stat().st_size > 0
    (ax,) = drawn[0].axes
    # (one artist per event made plotting a 9,000-event loop take over half a minute)
    assert len(ax.collections) == len(tracks) * len(types)
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert bars == len(events)                        # every execution is still drawn
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "/cpu:0 compute", "/gpu:0 compute", "/gpu:0 h2d"]


def _two_loops_on_a_gpu():
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        x = dcf.placeholder(dcf.float32, [4, 4], name="x")
        a = dcf.while_loop(lambda i, v: i < 300, lambda i, v: (i + 1, dcf.tanh(v @ v)),
                           (0, x), name="A")[1]
        b = dcf.while_loop(lambda i, v: i < 300, lambda i, v: (i + 1, dcf.sigmoid(v) * 2.0),
                           (0, x), name="B")[1]
    return g, x, a, b


def _device_ops(md):
    """The op names of a trace's events on a GPU's compute track."""
    return sorted(e[1] for e in md.trace if len(e) > 7 and e[7] == "compute")


@pytest.mark.parametrize("b_traced", [True, False])
def test_concurrent_runs_on_one_gpu_keep_their_own_device_events(fake_gpus, b_traced):
    """Each run's RunMetadata holds that run's timeline (API.md), also where runs of
    one AsyncSession share a GPU: the device records into the scope of the step whose
    code runs, not into whichever traced run began last."""
    g, x, a, b = _two_loops_on_a_gpu()
    feed = {x: np.eye(4, dtype=np.float32) * 0.1}
    opts = dcf.RunOptions(trace=True)

    async def main():
        async with dcf.AsyncSession(g) as s:
            alone_a, alone_b = dcf.RunMetadata(), dcf.RunMetadata()
            await s.run(a, feed, options=opts, run_metadata=alone_a)
            await s.run(b, feed, options=opts, run_metadata=alone_b)
            md_a, md_b = dcf.RunMetadata(), dcf.RunMetadata()
            await asyncio.gather(
                s.run(a, feed, options=opts, run_metadata=md_a),
                s.run(b, feed, options=opts if b_traced else None,
                      run_metadata=md_b if b_traced else None))
            return alone_a, alone_b, md_a, md_b

    alone_a, alone_b, md_a, md_b = asyncio.run(main())
    assert _device_ops(alone_a) and all(n.startswith("A/") for n in _device_ops(alone_a))
    assert _device_ops(md_a) == _device_ops(alone_a)
    assert _device_ops(md_b) == (_device_ops(alone_b) if b_traced else [])
    if b_traced:                # the two runs did overlap in time
        (a0, a1), (b0, b1) = ((min(e[5] for e in md.trace), max(e[6] for e in md.trace))
                              for md in (md_a, md_b))
        assert a0 < b1 and b0 < a1
