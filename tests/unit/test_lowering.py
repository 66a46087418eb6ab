"""Lowering of cond / while_loop to Switch, Merge, Enter, Exit, NextIteration: golden
dumps of `dcf.format_graph` (tests/golden/*.txt) and structural rules.

Set DCF_UPDATE_GOLDEN=1 to rewrite the golden files after an intended change, then
review the diff like code.
"""

from __future__ import annotations

import os
import pathlib
from collections import Counter

import pytest

import dcf

GOLDEN_DIR = pathlib.Path(__file__).resolve().parent.parent / "golden"


def _cond():
    x = dcf.placeholder(dcf.float32, (), name="x")
    dcf.cond(x > 0.0, lambda: x * 2.0, lambda: x - 1.0)


def _while():
    dcf.while_loop(lambda i: i < 10, lambda i: i + 1, 0)


def _while_captured_constant():
    c = dcf.constant(3.0, name="c")
    dcf.while_loop(lambda i, acc: i < 4, lambda i, acc: (i + 1, acc + c), (0, 0.0))


def _while_in_cond():
    x = dcf.placeholder(dcf.float32, (), name="x")

    def loop():
        return dcf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * x), (0, 1.0))[1]

    dcf.cond(x > 1.0, loop, lambda: x)


def _cond_in_while():
    x = dcf.placeholder(dcf.float32, (), name="x")

    def body(i, a):
        return i + 1, dcf.cond(a > x, lambda: a - x, lambda: a + 1.0)

    dcf.while_loop(lambda i, a: i < 5, body, (0, 0.0))


GRAPHS = {
    "cond": _cond,
    "while_loop": _while,
    "while_captured_constant": _while_captured_constant,
    "while_in_cond": _while_in_cond,
    "cond_in_while": _cond_in_while,
}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_lowered_graph_matches_golden_dump(name):
    GRAPHS[name]()
    got = dcf.format_graph(dcf.get_default_graph())
    path = GOLDEN_DIR / f"{name}.txt"
    if os.environ.get("DCF_UPDATE_GOLDEN") == "1":
        GOLDEN_DIR.mkdir(exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"missing {path}; run with DCF_UPDATE_GOLDEN=1 to create it"
    assert got == path.read_text(), (
        f"lowering of {name} changed; if intended, rerun with DCF_UPDATE_GOLDEN=1 and review"
    )


@pytest.mark.parametrize("name", list(GRAPHS))
def test_lowering_is_deterministic(name):
    GRAPHS[name]()
    first = dcf.format_graph()
    g = dcf.Graph()
    with g.as_default():
        GRAPHS[name]()
    assert dcf.format_graph(g) == first


def _types(g: dcf.Graph) -> Counter:
    return Counter(op.type for op in g.get_operations())


def test_each_loop_variable_gets_its_own_primitive_chain():
    dcf.while_loop(lambda a, b, c: a < 3, lambda a, b, c: (a + 1, b * 2.0, c), (0, 1.0, 5))
    t = _types(dcf.get_default_graph())
    for prim in ("Merge", "Switch", "Exit", "NextIteration"):
        assert t[prim] == 3, prim
    assert t["LoopCond"] == 1
    enters = [op for op in dcf.get_default_graph().get_operations() if op.type == "Enter"]
    assert [op.attrs["is_constant"] for op in enters] == [False] * 3
    assert {op.attrs["frame_name"] for op in enters} == {"while"}


def test_captured_tensor_enters_the_frame_once_as_a_loop_constant():
    c = dcf.constant(2.0, name="c")
    dcf.while_loop(lambda i, a: i < c, lambda i, a: (i + 1.0, a + c * c), (0.0, 0.0))
    const_enters = [
        op
        for op in dcf.get_default_graph().get_operations()
        if op.type == "Enter" and op.attrs["is_constant"]
    ]
    assert [op.inputs[0].name for op in const_enters] == ["c:0"]


def test_cond_guards_each_external_tensor_with_its_own_switch():
    x = dcf.constant(1.0, name="x")
    y = dcf.constant(2.0, name="y")
    p = dcf.placeholder(dcf.bool, (), name="p")
    dcf.cond(p, lambda: x + y + x, lambda: y)
    switches = [op for op in dcf.get_default_graph().get_operations() if op.type == "Switch"]
    guarded = Counter(op.inputs[0].name for op in switches)
    # true branch: x and y once each; false branch: y; plus one pred switch per branch
    assert guarded == {"x:0": 1, "y:0": 2, "p:0": 2}
    merges = [op for op in dcf.get_default_graph().get_operations() if op.type == "Merge"]
    assert len(merges) == 1


def test_nested_frames_name_their_parent_frame():
    def outer_body(i):
        return dcf.while_loop(lambda j: j < 2, lambda j: j + 1, i, name="inner")

    dcf.while_loop(lambda i: i < 3, outer_body, 0, name="outer")
    enters = {op.name: op for op in dcf.get_default_graph().get_operations() if op.type == "Enter"}
    inner = [op for n, op in enters.items() if op.attrs["frame_name"] == "outer/inner"]
    assert inner and all(op.frame_name == "outer" for op in inner)
    outer = [op for op in enters.values() if op.attrs["frame_name"] == "outer"]
    assert outer and all(op.frame_name == "" for op in outer)


def test_graph_to_dot_draws_each_frame_as_a_nested_cluster():
    _cond_in_while()
    dcf.while_loop(
        lambda i: i < 2,
        lambda i: dcf.while_loop(lambda j: j < 2, lambda j: j + 1, i, name="in"),
        0,
        name="out",
    )
    dot = dcf.graph_to_dot()
    assert dot.startswith("digraph")
    for frame in ("while", "out", "out/in"):
        assert f'subgraph "cluster_{frame}"' in dot
    assert dot.index('"cluster_out"') < dot.index('"cluster_out/in"')
    assert 'label="back"' in dot
