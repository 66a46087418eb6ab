"""Review 5, timelines: Chrome trace JSON that Perfetto takes as it is (metadata events
with ts/pid/tid, no slice overlapping the next on its track), and plot's empty-trace error."""

from __future__ import annotations

import json

import pytest

import dcf


def _slices_by_track(trace: dict) -> dict:
    tracks: dict = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    return tracks


def test_every_trace_event_has_ph_ts_pid_tid_and_each_device_is_named():
    g = dcf.Graph()
    with g.as_default():
        with dcf.device("/cpu:1"):
            a = dcf.ones((2, 2))
        _, b = dcf.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2.0), (0, a))
    md = dcf.RunMetadata()
    with dcf.Session(g) as sess:
        sess.run(b, options=dcf.RunOptions(trace=True), run_metadata=md)
    trace = json.loads(json.dumps(dcf.trace.to_chrome_trace(md.trace)))
    for e in trace["traceEvents"]:
        assert {"ph", "ts", "pid", "tid", "name"} <= set(e), e
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == ["/cpu:0", "/cpu:1"]
    assert len(_slices_by_track(trace)) == 2        # one track per device
    frames = {e["args"]["frame"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert "while" in frames and "<root>" in frames


def test_a_zero_length_op_does_not_overlap_the_op_that_starts_as_it_ends():
    # (GPU event timing is coarse: a tiny kernel can take 0 s and the next start then)
    events = [("/gpu:0", "a", "Tanh", "", 0, 1.0, 1.0, "compute"),
              ("/gpu:0", "b", "MatMul", "", 0, 1.0, 1.001, "compute"),
              ("/gpu:0", "c", "Tanh", "", 0, 1.001, 1.002, "compute")]
    (slices,) = _slices_by_track(dcf.trace.to_chrome_trace(events)).values()
    for (s0, e0), (s1, e1) in zip(slices, slices[1:]):
        assert e0 <= s1, slices              # each ends before the next begins
    assert slices[1] == (0.0, pytest.approx(1000.0))


def test_plot_of_an_empty_trace_says_it_is_empty():
    pytest.importorskip("matplotlib")
    with pytest.raises(ValueError, match="trace is empty"):
        dcf.trace.plot(dcf.RunMetadata(), "never-written.png")


def test_format_graph_keeps_an_op_with_a_newline_in_its_name_on_one_line():
    g = dcf.Graph()
    with g.as_default():
        a = dcf.constant(1.0, name="two\nlines")
        dcf.identity(a, name="carriage\rreturn")
    lines = dcf.format_graph(g).splitlines()
    assert lines == ["two\\nlines:0 = Const[dtype=float32, value=1.0]()",
                     "carriage\\rreturn:0 = Identity(two\\nlines:0)"]


def test_graph_to_dot_nests_loop_clusters_and_escapes_quotes_and_backslashes():
    import re

    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (), name='in"put\\é')

        def outer(i, acc):
            _, s = dcf.while_loop(
                lambda j, s: j < 3,
                lambda j, s: (j + 1, dcf.cond(s > 1.0, lambda: s * 2.0, lambda: s + 1.0)),
                (0, acc), name='inner"q')
            return i + 1, s

        dcf.while_loop(lambda i, acc: i < 2, outer, (0, x), name="outer\\w")
    dot = dcf.graph_to_dot(g)
    strings = r'"(?:[^"\\]|\\.)*"'
    bare = re.sub(strings, "S", dot)                  # every quoted string ends
    assert '"' not in bare and "\\" not in bare
    depth, deepest = 0, 0
    for ch in bare:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
        deepest = max(deepest, depth)
    assert depth == 0 and deepest == 3               # graph > outer cluster > inner cluster
    opened = [m.start() for m in re.finditer(r"subgraph ", dot)]
    assert len(opened) == 2
    assert dot.index('subgraph "cluster_outer\\\\w/inner\\"q"') > dot.index(
        'subgraph "cluster_outer\\\\w"')
    assert 'label="in\\"put\\\\é\\nPlaceholder"' in dot
