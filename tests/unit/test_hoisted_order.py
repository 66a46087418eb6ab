"""The frame compiler's hoisting of early-fetched nodes (dcf/frame_compiler.py, _hoisted):
on random graphs, the order stays topological, keeps every item, and puts each hoisted
node right after the last item it needs (only other hoisted nodes may come between)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dcf.frame_compiler import _hoisted
from dcf.plan import NodeInfo


def _node(i: int) -> NodeInfo:
    return NodeInfo(id=i, local=i, name=f"n{i}", type="Sum", kind=0, fn=None, n_in=0, in_base=0,
                    ctrl_slot=0, n_out=1, frame=None)


@st.composite
def _graphs(draw):
    n = draw(st.integers(1, 24))
    nodes = [_node(i) for i in range(n)]
    items = {k: {nodes[j] for j in range(i) if draw(st.booleans()) and draw(st.booleans())}
             for i, k in enumerate(nodes)}
    rnd = random.Random(draw(st.integers(0, 2**16)))
    out, done, pending = [], set(), list(nodes)
    while pending:                       # a random topological order
        ready = [k for k in pending if items[k] <= done]
        k = rnd.choice(ready)
        out.append(k)
        done.add(k)
        pending.remove(k)
    hoist = {k.id for k in nodes if draw(st.booleans())}
    return nodes, items, out, hoist


@given(_graphs())
@settings(max_examples=200, deadline=None)
def test_hoisted_nodes_follow_what_they_need_and_the_order_stays_topological(g):
    nodes, items, out, hoist = g
    got = _hoisted(list(out), items, hoist)
    assert sorted(k.id for k in got) == sorted(k.id for k in nodes)
    pos = {k: i for i, k in enumerate(got)}
    for k, deps in items.items():
        assert all(pos[d] < pos[k] for d in deps)
    for k in got:
        if k.id in hoist:
            last = max((pos[d] for d in items[k]), default=-1)
            assert all(x.id in hoist for x in got[last + 1:pos[k]])


def test_nothing_to_hoist_leaves_the_order_as_it_is():
    a, b = _node(0), _node(1)
    out = [a, b]
    assert _hoisted(out, {a: set(), b: {a}}, set()) is out
