"""Compiled loops of random shapes against the tagged-token executor: the frame
compiler ends a loop on its predicate and captures its Exits under it only where its
guards prove every loop variable live exactly while the predicate holds
(bench/NOTES.md, "loop_rate, session 17"); anything else keeps the run-time tests. Here
loops of one to four variables, each passed through, updated, chosen by a cond, summed
by an inner loop, replaced by an outer value or by the next variable's value (the
variables rotate: all must move at once), for 0-4 iterations, with any subset
fetched, must give the executor's values (which never uses the compiler)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import dcf
from tests.core.test_loop_placement_shapes import build

KINDS = ("pass", "affine", "cond", "inner", "outer", "rotate")


def _build(kinds: list[str], fetch: list[bool]):
    # tests/core/test_loop_placement_shapes.py's loops, all on one device
    return build(kinds, [0] * len(kinds), 0, fetch, False, ["/cpu:0"])


@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=4),
       fetch_bits=st.integers(0, 15), trips=st.integers(0, 4),
       x=st.floats(-2.0, 2.0, allow_nan=False))
@settings(max_examples=40, deadline=None)
def test_compiled_loops_match_the_executor(kinds, fetch_bits, trips, x):
    fetch = [bool(fetch_bits >> k & 1) for k in range(len(kinds))]
    got = {}
    for compiled in (True, False):
        dcf.reset_default_graph()
        n, x0, outs = _build(kinds, fetch)
        with dcf.Session(config=dcf.SessionConfig(compile_frames=compiled)) as sess:
            got[compiled] = sess.run(outs, {n: trips, x0: x})
    assert len(got[True]) == len(got[False])
    for a, b in zip(got[True], got[False]):
        np.testing.assert_array_equal(a, b)
    assert got[True][0] == trips                   # the counter
