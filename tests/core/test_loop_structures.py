"""while_loop and cond over nested structures of loop variables, maximum_iterations,
shape_invariants on nested structures, and the timeline a traced run records."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

import dcf

State = collections.namedtuple("State", ["step", "value"])


def test_single_tensor_in_single_tensor_out(compiled, run_graph):
    out = dcf.while_loop(lambda x: x < 100, lambda x: x * 3, 1)
    assert isinstance(out, dcf.Tensor)
    assert run_graph(out, config=compiled) == 243


def test_lists_and_tuples_count_as_the_same_structure(compiled, run_graph):
    out = dcf.while_loop(lambda i, s: i < 4, lambda i, s: (i + 1, s + i), [0, 10])
    assert isinstance(out, list)
    assert run_graph(out, config=compiled) == [4, 16]


def test_dict_and_namedtuple_loop_vars(compiled, run_graph):
    init = {"state": State(0, dcf.constant(1.0)), "log": [dcf.constant(0.0)]}

    def body(v):
        st = v["state"]
        return ({"state": State(st.step + 1, st.value * 2.0), "log": [v["log"][0] + st.value]},)

    (out,) = dcf.while_loop(lambda v: v["state"].step < 5, body, (init,))
    assert isinstance(out["state"], State)
    got = run_graph(out, config=compiled)
    assert got["state"] == State(5, 32.0) and got["log"] == [31.0]


def test_tensor_array_inside_a_nested_loop_var(compiled, run_graph):
    init = (0, {"ta": dcf.TensorArray(dcf.int32, size=4), "sum": 0})

    def body(i, d):
        return i + 1, {"ta": d["ta"].write(i, i * i), "sum": d["sum"] + i}

    _, d = dcf.while_loop(lambda i, d: i < 4, body, init)
    stacked, total = run_graph([d["ta"].stack(), d["sum"]], config=compiled)
    np.testing.assert_array_equal(stacked, [0, 1, 4, 9])
    assert total == 6


@pytest.mark.parametrize("limit,want", [(0, 0), (3, 3), (10, 6)])
def test_maximum_iterations_stops_the_loop(limit, want, compiled, run_graph):
    m = dcf.placeholder(dcf.int32, ())
    out = dcf.while_loop(lambda i: i < 6, lambda i: i + 1, 0, maximum_iterations=m)
    assert run_graph(out, {m: limit}, config=compiled) == want


def test_shape_invariants_for_a_nested_structure(compiled, run_graph):
    def body(i, d):
        return i + 1, {"rows": dcf.concat([d["rows"], d["rows"][:1] + 1.0], 0), "k": d["k"]}

    init = (0, {"rows": dcf.zeros([1, 2]), "k": dcf.constant(7)})
    _, d = dcf.while_loop(
        lambda i, d: i < 3, body, init, shape_invariants=((), {"rows": (None, 2), "k": ()})
    )
    assert d["rows"].shape == (None, 2)
    rows, k = run_graph([d["rows"], d["k"]], config=compiled)
    np.testing.assert_array_equal(rows, [[0, 0], [1, 1], [1, 1], [1, 1]])
    assert k == 7


@pytest.mark.parametrize("pred", [True, False])
def test_cond_returns_nested_structures(pred, compiled, run_graph):
    p = dcf.placeholder(dcf.bool, ())
    x = dcf.constant([1.0, 2.0])
    out = dcf.cond(
        p,
        lambda: {"a": (x * 2.0, dcf.constant(1)), "b": [x[0]]},
        lambda: {"a": (x - 1.0, dcf.constant(2)), "b": [x[1]]},
    )
    got = run_graph(out, {p: pred}, config=compiled)
    np.testing.assert_array_equal(got["a"][0], [2.0, 4.0] if pred else [0.0, 1.0])
    assert got["a"][1] == (1 if pred else 2) and got["b"] == [1.0 if pred else 2.0]


def test_traced_run_records_every_executed_node_and_writes_chrome_json(tmp_path):
    _, out = dcf.while_loop(
        lambda i, x: i < 3, lambda i, x: (i + 1, x + 1.0), (0, 0.0), name="loop"
    )
    md = dcf.RunMetadata()
    with dcf.Session() as sess:
        assert sess.run(out, options=dcf.RunOptions(trace=True), run_metadata=md) == 3.0
    assert md.trace and all(len(e) == 7 for e in md.trace)
    assert all(e[0] == "/cpu:0" and e[5] <= e[6] for e in md.trace)  # device, t0, t1
    assert {e[4] for e in md.trace if e[3] == "loop"} == {0, 1, 2, 3}
    assert md.step_stats["nodes_fired"] == len(md.trace)
    path = tmp_path / "trace.json"
    md.write_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(md.trace)
    assert {e["args"]["frame"] for e in events} == {"<root>", "loop"}
    assert max(e["args"]["iteration"] for e in events) == 3
