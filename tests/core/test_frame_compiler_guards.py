"""The frame compiler's branch guards: code for a cond branch runs under one `if` on the
predicate, so an untaken branch costs one test however many ops it holds; values that
run-time readers need (fetches, Exits, NextIterations, Merges whose inputs' guards do
not combine, ops with such inputs) are still set to DEAD exactly where they are dead.

Values are checked on every execution path (the `compiled` fixture); the O(1) property
is checked by counting the lines the generated root executes (no timing).
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError
from dcf.ops.control_ops import merge, switch


def _counter(calls: list, tag: str):
    def fn(x):
        calls.append(tag)
        return x

    return lambda x: dcf.reshape(dcf.py_func(fn, [x], dcf.float32, name=f"c_{tag}"), [])


def _chain(x, n):
    for k in range(n):
        x = x * 1.0001 + float(k % 3)
    return x


def _chain_np(x, n):
    x = np.float32(x)
    for k in range(n):
        x = x * np.float32(1.0001) + np.float32(k % 3)
    return x


# ------------------------------------------------------------------ values
@pytest.mark.parametrize("pred", [True, False])
def test_nested_conds_and_loops_inside_branches(pred, compiled, run_graph):
    """An untaken branch holding a cond and a while loop (itself holding a cond) never
    runs them; the taken one does; outer Merges get the live side's value."""
    calls: list = []
    p = dcf.placeholder(dcf.bool, ())
    x = dcf.placeholder(dcf.float32, ())

    def heavy():
        inner = dcf.cond(x > 1.0, lambda: _counter(calls, "in_t")(x) * 2.0,
                         lambda: _counter(calls, "in_f")(x) - 2.0)

        def body(i, a):
            return i + 1, a + dcf.cond(a > 5.0, lambda: _counter(calls, "lp_t")(a),
                                       lambda: a * 0.5 + 1.0)

        _, acc = dcf.while_loop(lambda i, a: i < 4, body, (0, inner))
        return acc + 1.0

    def light():
        return _counter(calls, "light")(x) + 100.0

    out = dcf.cond(p, heavy, light)
    after = out * 3.0                        # a consumer after the outer Merge
    got = run_graph([out, after], {p: pred, x: 3.0}, config=compiled)
    if pred:
        a = 6.0
        for _ in range(4):
            a = a + (a if a > 5.0 else a * 0.5 + 1.0)
        assert got == pytest.approx([a + 1.0, 3 * (a + 1.0)])
        assert sorted(set(calls)) == ["in_t", "lp_t"] and calls.count("lp_t") == 4
    else:
        assert got == pytest.approx([103.0, 309.0])
        assert calls == ["light"]


@pytest.mark.parametrize("pred", [True, False])
def test_cond_in_loop_body_with_a_loop_in_its_branch(pred, compiled, run_graph):
    calls: list = []
    p = dcf.placeholder(dcf.bool, ())

    def body(i, a):
        def taken():
            _, s = dcf.while_loop(lambda j, s: j < 3,
                                  lambda j, s: (j + 1, s + _counter(calls, "deep")(a)),
                                  (0, 0.0))
            return s

        return i + 1, a + dcf.cond(p, taken, lambda: a * 2.0)

    _, out = dcf.while_loop(lambda i, a: i < 3, body, (0, 1.0))
    got = run_graph(out, {p: pred}, config=compiled)
    if pred:
        assert got == pytest.approx(64.0) and calls == ["deep"] * 9   # a *= 4, 3 times
    else:
        assert got == pytest.approx(27.0) and calls == []


def test_two_conds_on_one_predicate_and_gradient_through_them(compiled, run_graph):
    """The DQN pattern: a loss cond, the gradient of its output, and an update cond on
    the same predicate."""
    p = dcf.placeholder(dcf.bool, ())
    w = dcf.Variable(np.array([1.0, 2.0], np.float32))
    r = w.read_value()
    loss = dcf.cond(p, lambda: dcf.reduce_sum(r * r * 3.0), lambda: dcf.constant(0.0))
    (g,) = dcf.gradients(loss, [r])

    def upd():
        with dcf.control_dependencies([w.assign_sub(0.1 * g)]):
            return dcf.identity(loss)

    trained = dcf.cond(p, upd, lambda: dcf.constant(-1.0))
    with dcf.Session(config=compiled) as sess:
        sess.run(dcf.global_variables_initializer())
        assert sess.run([trained, g], {p: False}) == [-1.0, pytest.approx([0.0, 0.0])]
        np.testing.assert_array_equal(sess.run(w), [1.0, 2.0])
        t, gv = sess.run([trained, g], {p: True})
        assert t == pytest.approx(15.0) and gv == pytest.approx([6.0, 12.0])
        np.testing.assert_allclose(sess.run(w), [0.4, 0.8], rtol=1e-6)


# ------------------------------------------------------ run-time readers of guarded values
@pytest.mark.parametrize("pq", [(False, False), (False, True), (True, False), (True, True)])
def test_merge_of_inputs_on_unrelated_predicates(pq, compiled, run_graph):
    """A Merge of values live under different predicates has no single guard: it tests
    its inputs at run time, so they must be DEAD where their branch was not taken."""
    p, q = dcf.placeholder(dcf.bool, ()), dcf.placeholder(dcf.bool, ())
    _, a = switch(dcf.constant(1.0), p)
    _, b = switch(dcf.constant(2.0), q)
    a2, b2 = a * 10.0, b * 10.0                         # ops inside each branch
    m, idx = merge([a2, b2], name="m")
    after = m + a2 if pq[0] else m + 0.5                # a mixed-guard consumer
    feeds = {p: pq[0], q: pq[1]}
    if not any(pq):
        with pytest.raises(InvalidArgumentError, match="is dead"):
            run_graph(m, feeds, config=compiled)
        return
    want = 10.0 if pq[0] else 20.0
    got = run_graph([m, idx, after], feeds, config=compiled)
    assert got == [want, 0 if pq[0] else 1, pytest.approx(want + (10.0 if pq[0] else 0.5))]


@pytest.mark.parametrize("pred", [True, False])
def test_fetches_inside_a_branch_and_control_deps_out_of_it(pred, compiled, run_graph):
    p = dcf.placeholder(dcf.bool, ())
    _, t = switch(dcf.constant(4.0), p)
    inside = t * 2.0
    alias = dcf.identity(inside, name="alias")
    with dcf.control_dependencies([inside]):
        ctl = dcf.constant(7.0) + 1.0                   # dead where `inside` is dead
    fetches = {"inside": inside, "alias": alias, "ctl": ctl}
    for name, f in fetches.items():
        if pred:
            assert run_graph(f, {p: True}, config=compiled) == {"inside": 8.0, "alias": 8.0,
                                                                "ctl": 8.0}[name]
        else:
            with pytest.raises(InvalidArgumentError, match="is dead"):
                run_graph(f, {p: False}, config=compiled)


def test_loop_entered_from_values_with_different_guards(compiled, run_graph):
    """Loop variables live under different predicates: the loop is run (and its Exits
    tested) at run time, as before. (With the untaken side the compiled loop reports
    its partly dead loop variables, the tagged executor a dead fetch: both as before
    the guards.)"""
    p = dcf.placeholder(dcf.bool, ())
    _, t = switch(dcf.constant(1.0), p)
    f, _ = switch(dcf.constant(2.0), p)
    m, _ = merge([t, f])
    _, out = dcf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * m + t), (0, t))
    assert run_graph(out, {p: True}, config=compiled) == pytest.approx(4.0)
    with pytest.raises(InvalidArgumentError, match="is dead|ended while others continued"):
        run_graph(out, {p: False}, config=compiled)



@pytest.mark.parametrize("n", [0, 1, 7])
def test_loop_ending_on_its_predicate_exits_with_the_last_values(n, compiled, run_graph):
    """Every loop variable (one of them a cond's merge in the body) lives exactly while
    the predicate holds: the loop ends on the predicate alone and its Exits capture the
    values of the iteration that tests false (none run: the entry values)."""
    k = dcf.placeholder(dcf.int32, ())
    x0 = dcf.placeholder(dcf.float32, (3,))

    def body(i, x, s):
        y = dcf.cond(dcf.equal(i % 2, 0), lambda: x * 2.0, lambda: x - 1.0)
        return i + 1, y, s + dcf.reduce_sum(y)

    i, x, s = dcf.while_loop(lambda i, x, s: i < k, body, (0, x0, 0.0))
    xv = np.array([1.0, -2.0, 0.5], np.float32)
    want_x, want_s = xv.copy(), np.float32(0.0)
    for j in range(n):
        want_x = want_x * np.float32(2.0) if j % 2 == 0 else want_x - np.float32(1.0)
        want_s = want_s + want_x.sum(dtype=np.float32)
    got = run_graph([i, x, s], {k: n, x0: xv}, config=compiled)
    assert got[0] == n
    np.testing.assert_array_equal(got[1], want_x)
    assert got[2] == pytest.approx(want_s, rel=1e-6)



@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_loop_variables_that_trade_values_move_at_once(n, compiled, run_graph):
    """(x, y) -> (y, x) and (a, b, c) -> (b, c, a): each loop variable takes another's
    value of the same iteration, so all of them move at once."""
    k = dcf.placeholder(dcf.int32, ())
    _, x, y = dcf.while_loop(lambda i, x, y: i < k, lambda i, x, y: (i + 1, y, x),
                             (0, 1.0, 2.0))
    _, a, b, c = dcf.while_loop(lambda i, a, b, c: i < k, lambda i, a, b, c: (i + 1, b, c, a),
                                (0, 1.0, 2.0, 3.0))
    got = run_graph([x, y, a, b, c], {k: n}, config=compiled)
    xy, abc = [1.0, 2.0], [1.0, 2.0, 3.0]
    want = xy[n % 2:] + xy[:n % 2] + abc[n % 3:] + abc[:n % 3]
    assert [float(v) for v in got] == want

def test_nested_loops_ending_on_their_predicates(compiled, run_graph):
    """An inner loop whose Exits feed the outer loop's next values, both ending on
    their predicates: sum over i < 4 of sum over j < i of (i * j)."""

    def outer(i, acc):
        _, inner = dcf.while_loop(lambda j, a: j < i, lambda j, a: (j + 1, a + i * j),
                                  (0, acc))
        return i + 1, inner

    _, out = dcf.while_loop(lambda i, a: i < 4, outer, (0, 0))
    assert run_graph(out, config=compiled) == sum(i * j for i in range(4) for j in range(i))

# ------------------------------------------------------------------ O(1) and code shape
def _lines_executed(fn) -> int:
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename.startswith("<dcf root"):
            if event == "line":
                count += 1
            return tracer
        return None

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def test_untaken_branch_costs_the_same_whatever_its_size(sources):
    counts = {}
    for n in (5, 60):
        dcf.reset_default_graph()
        p = dcf.placeholder(dcf.bool, ())
        x = dcf.placeholder(dcf.float32, ())
        out = dcf.cond(p, lambda: _chain(x, n), lambda: x - 1.0)
        with dcf.Session() as sess:
            assert sess.run(out, {p: False, x: 2.0}) == 1.0
            assert sess.run(out, {p: True, x: 2.0}) == pytest.approx(_chain_np(2.0, n))
            counts[n] = _lines_executed(lambda: sess.run(out, {p: False, x: 2.0}))
            taken = _lines_executed(lambda: sess.run(out, {p: True, x: 2.0}))
        # the taken side runs the chain's 2n ops (a Mul and an Add each, constants
        # hoisted) where the untaken one ran one Sub
        assert taken >= counts[n] + 2 * n - 1
    assert counts[5] == counts[60] > 0
    src = sources[-1]
    assert "is DEAD" not in src, "a plain cond needs no run-time tests for DEAD"


def test_traced_runs_still_fire_the_untaken_branch_dead(run_graph):
    p = dcf.placeholder(dcf.bool, ())
    x = dcf.placeholder(dcf.float32, ())
    out = dcf.cond(p, lambda: _chain(x, 4), lambda: x - 1.0, name="c")
    v, trace = run_graph(out, {p: False, x: 2.0}, trace=True)
    assert v == 1.0
    fired = [e[1] for e in trace]
    assert sum(1 for n in fired if n.startswith("c/") and "Mul" in n) == 4


def test_a_loop_body_keeps_no_arrays_alive_after_the_loop(compiled, run_graph):
    """As when the exit iteration ran every body op dead: once a loop has ended, no
    variable of its body still holds an array of its last iterations (GPU memory
    budgets and swapping count on it)."""
    import weakref

    refs: list = []
    seen: list = []

    def alloc(i):
        arr = np.full(1000, float(i), np.float32)
        refs.append(weakref.ref(arr))
        return arr

    def check(x):
        import gc

        gc.collect()
        seen.append([r() is None for r in refs])
        return x

    def body(i, a):
        big = dcf.py_func(alloc, [i], dcf.float32)
        return i + 1, a + dcf.reduce_sum(big)

    _, out = dcf.while_loop(lambda i, a: i < 4, body, (0, 0.0))
    checked = dcf.reshape(dcf.py_func(check, [out], dcf.float32), [])
    assert run_graph(checked, config=compiled) == pytest.approx(6000.0)
    assert len(refs) == 4 and seen == [[True] * 4]


def test_a_loop_ending_on_its_predicate_tests_it_alone(sources):
    """The loop's end is one test of its predicate (not one per loop variable) under which
    its Exits are captured (no per-value DEAD tests), and it goes on with the values
    themselves (no per-variable copies)."""
    k = dcf.placeholder(dcf.int32, ())
    i, x, y = dcf.while_loop(lambda i, x, y: i < k, lambda i, x, y: (i + 1, x * 2.0, y + x),
                             (0, 1.0, 0.0))
    with dcf.Session() as sess:
        assert sess.run([i, x, y], {k: 5}) == [5, 32.0, 31.0]
    src = sources[-1]
    loop = src[src.index("while True:"):]
    assert "is not DEAD or" not in loop and "ended while others continued" not in loop
    lines = [line.strip() for line in loop.splitlines()]
    # the end: one test of the predicate, the Exits captured under it, then break
    end = next(k for k, line in enumerate(lines) if re.fullmatch(r"if not \(v\d+_0\):", line))
    assert [line.startswith("if x") for line in lines[end + 1:end + 5]] == [True] * 3 + [False]
    assert lines[end + 4] == "break"
    assert not any("is not DEAD" in line for line in lines[end + 1:end + 4])
    # the loop variables are read from the loop's own variables, not copied each iteration
    assert not any(re.fullmatch(r"v\d+_0 = m\d+", line) for line in lines)
    # the body's constants are read where they are used, not assigned each iteration
    assert "_C" in loop and not any(line.strip().split(" = ")[-1].startswith("_C")
                                    for line in loop.splitlines())
