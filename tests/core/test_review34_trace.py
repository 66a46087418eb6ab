"""Review 34, timelines: dcf.trace.plot on traces of thousands of op executions."""

from __future__ import annotations

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
