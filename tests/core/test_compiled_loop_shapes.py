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

F64 = dcf.float64
KINDS = ("pass", "affine", "cond", "inner", "outer", "rotate")


def _build(kinds: list[str], fetch: list[bool]):
    n = dcf.placeholder(dcf.int32, (), name="n")
    x0 = dcf.placeholder(F64, (), name="x0")
    outer = dcf.constant(0.5, F64) * x0

    def update(kind: str, i, v, w):
        if kind == "rotate":    # the next variable's value of this iteration
            return w
        if kind == "pass":
            return v
        if kind == "affine":
            return v * 1.5 - 0.25
        if kind == "cond":
            return dcf.cond(v > 0.0, lambda: v - 1.0, lambda: v * v + 0.5)
        if kind == "inner":     # 0-2 inner iterations, by the outer counter
            _, s = dcf.while_loop(lambda j, s: j < i % 3, lambda j, s: (j + 1, s + v),
                                  (0, v))
            return s
        return outer             # a value from outside the loop

    def body(i, *vs):
        return (i + 1,) + tuple(update(k, i, v, vs[(j + 1) % len(vs)])
                                for j, (k, v) in enumerate(zip(kinds, vs)))

    init = tuple(x0 + float(k) for k in range(len(kinds)))
    outs = dcf.while_loop(lambda i, *vs: i < n, body, (0,) + init)
    fetched = [o for o, f in zip(outs, [True] + fetch) if f]
    return n, x0, fetched


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
