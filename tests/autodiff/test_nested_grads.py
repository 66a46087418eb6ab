"""Gradients of every construct nested one and two deep (and a set three deep), on every
execution path and split over devices, against central finite differences of the plain
Python reference of tests/core/test_nesting.py (float64; no dcf in the reference).

The constructs are piecewise smooth in x (data-dependent trip counts and cond
thresholds); a point is checked only where the reference has one value over the whole
difference stencil, so the derivative exists there and the difference approximates it.
What this covers that the single-construct tests don't: a loop's gradient inside a
cond's and the other way round, stacks of an inner loop pushed from an outer loop's
iterations, loop-invariant accumulation of values captured from outer frames (the
TensorArray loop and map_fn read x inside), integer trip counts (no gradient) computed
from the differentiated value, and the backward frames placed on other devices than
their forward control."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dcf
from tests.autodiff.gradcheck import OPTS
from tests.core.test_nesting import F64, NAMES, _compose

XS = [-0.9, 0.3, 0.6, 1.7, -1.45]
_H = 1e-5           # the stencil's step


def _fd(ref, x: float) -> float | None:
    """The reference's central difference at x, or None where the stencil meets an edge
    (more than one possible value at some point of it, or values that jump)."""
    pts = [x - 2 * _H, x - _H, x, x + _H, x + 2 * _H]
    vals = [ref(p) for p in pts]
    if any(len(v) != 1 for v in vals):
        return None
    f = [v[0] for v in vals]
    d1 = (f[3] - f[1]) / (2 * _H)
    d2 = (f[4] - f[0]) / (4 * _H)
    if not np.isclose(d1, d2, rtol=1e-4, atol=1e-6):      # a kink or jump inside
        return None
    return (4 * d1 - d2) / 3                                 # Richardson: O(h^4)


def _grads(combo, xs, config, split=False):
    dcf.reset_default_graph()
    build, ref = _compose(combo, split=split)
    x = dcf.placeholder(F64, (), name="x")
    y = build(x)
    (g,) = dcf.gradients(y, [x])
    with dcf.Session(config=config) as sess:
        got = [sess.run([y, g], {x: v}, options=OPTS) for v in xs]
    return got, ref


def _check(got, xs, ref, combo) -> int:
    checked = 0
    for (y, g), v in zip(got, xs):
        want = _fd(ref, v)
        if want is None:
            continue
        checked += 1
        assert np.isclose(g, want, rtol=1e-6, atol=1e-7), \
            f"{'-in-'.join(reversed(combo))} at x={v}: gradient {g!r}, finite differences {want!r}"
        assert any(np.isclose(y, c, rtol=1e-10, atol=1e-12) for c in ref(v))
    return checked


COMBOS = [c for depth in (1, 2) for c in itertools.product(NAMES, repeat=depth)]
DEEP = [("while", "cond", "while"), ("cond", "while", "ta_loop"), ("scan", "while", "cond"),
        ("map_fn", "ta_loop", "while"), ("while", "while", "while"),
        ("ta_loop", "scan", "map_fn"), ("cond", "ta_loop", "cond"), ("cond", "while", "cond")]


@pytest.mark.parametrize("combo", COMBOS + DEEP, ids=["-in-".join(reversed(c)) for c in COMBOS + DEEP])
def test_nested_gradients_match_finite_differences(combo, compiled):
    got, ref = _grads(combo, XS, compiled)
    assert _check(got, XS, ref, combo) >= 3        # most points are away from the edges


@pytest.mark.parametrize("combo", [c for c in COMBOS if len(c) == 2] + DEEP[:3],
                         ids=lambda c: "-in-".join(reversed(c)))
def test_nested_gradients_split_over_devices(combo):
    """Each level's body on another device than its control: the backward loops' stacks
    and accumulators cross devices as the forward's values did."""
    got, ref = _grads(combo, XS, dcf.SessionConfig(), split=True)
    assert _check(got, XS, ref, combo) >= 3


@given(combo=st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(tuple),
       xs=st.lists(st.floats(-2.4, 2.4), min_size=1, max_size=3),
       compile_frames=st.booleans())
@settings(max_examples=25, deadline=None)
def test_nested_gradients_at_random_points(combo, xs, compile_frames):
    got, ref = _grads(combo, xs, dcf.SessionConfig(compile_frames=compile_frames))
    _check(got, xs, ref, combo)


def _fd2(ref, x: float) -> float | None:
    """The reference's second central difference at x (Richardson-extrapolated), or None
    where the stencil meets an edge (as _fd)."""
    h = 1e-3
    pts = [x + k * h for k in (-2, -1, 0, 1, 2)]
    vals = [ref(p) for p in pts]
    if any(len(v) != 1 for v in vals) or _fd(ref, x - 2 * h) is None or \
            _fd(ref, x + 2 * h) is None:
        return None
    f = [v[0] for v in vals]
    d_h = (f[3] - 2 * f[2] + f[1]) / h ** 2
    d_2h = (f[4] - 2 * f[2] + f[0]) / (4 * h ** 2)
    if not np.isclose(d_h, d_2h, rtol=1e-3, atol=1e-4):
        return None
    return (4 * d_h - d_2h) / 3


SECOND = COMBOS + DEEP + [("cond", "cond", "cond")]


@pytest.mark.parametrize("combo", SECOND, ids=["-in-".join(reversed(c)) for c in SECOND])
def test_nested_second_derivatives_match_finite_differences(combo, compiled):
    """d2y/dx2: the gradient of the gradient, whose backward loops pop what the first
    gradient's loops pushed (loop_state.push_pop_grad), through every nesting."""
    dcf.reset_default_graph()
    build, ref = _compose(combo)
    x = dcf.placeholder(F64, (), name="x")
    (g,) = dcf.gradients(build(x), [x])
    (h,) = dcf.gradients(g, [x])
    with dcf.Session(config=compiled) as sess:
        got = [sess.run(h, {x: v}, options=OPTS) for v in XS]
    checked = 0
    for hv, v in zip(got, XS):
        want = _fd2(ref, v)
        if want is None:
            continue
        checked += 1
        assert np.isclose(hv, want, rtol=1e-5, atol=1e-5), \
            f"{'-in-'.join(reversed(combo))} at x={v}: d2y/dx2 {hv!r}, finite differences {want!r}"
    assert checked >= 2


def _loop_power(x, n: int, captured: bool):
    """x ** 3 ** n by a loop (a -> a * a * a), or x ** (2 ** (n + 1) - 1) where the body
    also reads x from outside (a -> a * a * x)."""
    body = (lambda i, a: (i + 1, a * a * x)) if captured else (lambda i, a: (i + 1, a * a * a))
    return dcf.while_loop(lambda i, a: i < n, body, (0, x))[1]


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("captured", [False, True], ids=["loop_var_only", "captured"])
def test_third_and_fourth_derivatives_through_a_loop(n, captured, compiled):
    """The second gradient's loops pop, besides forward values, the gradients that the
    first gradient's own gradient loops pushed (pop_stack_grads): a third gradient
    passes through those pops too, and builds the loop that pushed them after the one
    that pops them. (A loop of a*a*a gave d3y/dx3 = 2 for x**3.)"""
    dcf.reset_default_graph()
    x = dcf.placeholder(F64, (), name="x")
    ds = [_loop_power(x, n, captured)]
    for _ in range(4):
        ds += dcf.gradients(ds[-1], [x])
    p = 2 ** (n + 1) - 1 if captured else 3 ** n
    x0 = 0.7
    want = [np.prod(np.arange(p, p - k, -1.0)) * x0 ** (p - k) for k in range(5)]
    with dcf.Session(config=compiled) as sess:
        got = sess.run(ds, {x: x0}, options=OPTS)
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_third_derivative_through_map_fn_and_scan(compiled):
    dcf.reset_default_graph()
    x = dcf.placeholder(F64, (3,), name="x")
    y = dcf.reduce_sum(dcf.map_fn(lambda e: e * e * e, x)) + \
        dcf.reduce_sum(dcf.scan(lambda c, e: c * e, x, initializer=dcf.constant(1.0, F64)))
    (g,) = dcf.gradients(y, [x])
    (h,) = dcf.gradients(dcf.reduce_sum(g), [x])
    (k,) = dcf.gradients(dcf.reduce_sum(h), [x])
    x0 = np.array([0.7, -0.4, 1.3])
    with dcf.Session(config=compiled) as sess:
        got = sess.run(k, {x: x0}, options=OPTS)
    # k_j = sum_{i,l} d3y/dx_i dx_l dx_j: 6 from e^3; from the scan's a + ab + abc only
    # abc's mixed derivatives (1 for three distinct indices): the 2 ordered pairs (i, l)
    # of the other two indices
    np.testing.assert_allclose(got, np.full(3, 6.0 + 2.0), rtol=1e-10)


def _out_frame(op):
    """The frame an op's outputs live in: an Enter's in its loop, an Exit's in the loop's
    outer frame, any other op's in the frame it runs in."""
    if op.type == "Enter":
        return op.ctx
    if op.type == "Exit":
        return op.ctx.while_ctx if op.ctx is not None else None
    return op.frame_ctx


def frame_crossings(graph) -> list:
    """Edges (data or control) whose value would cross into or out of a loop's frame
    without its Enter or Exit: the tagged-token executor cannot deliver them (a run
    waits forever or an op reads the wrong iteration), even where straight-line
    compiled code happens to read the right value."""
    bad = []
    for op in graph.get_operations():
        for src in [t.op for t in op.inputs] + list(op.control_inputs):
            if _out_frame(src) is not op.frame_ctx:
                bad.append(f"{src.name} -> {op.name}")
    return bad


ALL3 = [c for depth in (1, 2, 3) for c in itertools.product(NAMES, repeat=depth)]


def test_gradient_graphs_of_every_nesting_keep_values_in_their_frames():
    """Every nesting three deep, first and second order: no edge skips an Enter/Exit.
    (A gradient cond inside a backward loop once read a forward cond's saved-value
    stack from outside the loop directly: cond in TensorArray loop in cond hung on the
    tagged executor and in traced runs.)"""
    found = {}
    for combo in ALL3:
        dcf.reset_default_graph()
        build, _ = _compose(combo)
        x = dcf.placeholder(F64, (), name="x")
        (g,) = dcf.gradients(build(x), [x])
        dcf.gradients(g, [x])
        bad = frame_crossings(g.graph)
        if bad:
            found["-in-".join(reversed(combo))] = bad[:2]
    assert not found, found


@pytest.mark.parametrize("combo", [("cond", "ta_loop", "cond"), ("cond", "while", "cond")],
                         ids=lambda c: "-in-".join(reversed(c)))
def test_traced_runs_of_nested_gradients_give_the_untraced_values(combo):
    """A traced run takes the tagged-token executor with the default config: the
    gradient of a cond in a loop in a cond hung there before its frames were fixed."""
    build, ref = _compose(combo)
    x = dcf.placeholder(F64, (), name="x")
    (g,) = dcf.gradients(build(x), [x])
    with dcf.Session() as sess:
        for v in XS:
            md = dcf.RunMetadata()
            traced = sess.run(g, {x: v}, options=dcf.RunOptions(trace=True, timeout_s=30),
                              run_metadata=md)
            assert traced == sess.run(g, {x: v}, options=OPTS) and md.trace


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "partitioned"])
@pytest.mark.parametrize("combo", [c for c in COMBOS if len(c) == 2] + DEEP[:3],
                         ids=lambda c: "-in-".join(reversed(c)))
def test_nested_second_derivatives_split_over_devices(combo, fuse):
    """d2y/dx2 with each level's body on another device than its control: the stacks of
    extra gradients are pushed and popped across devices (Send/Recv where unfused)."""
    dcf.reset_default_graph()
    build, ref = _compose(combo, split=True)
    x = dcf.placeholder(F64, (), name="x")
    (g,) = dcf.gradients(build(x), [x])
    (h,) = dcf.gradients(g, [x])
    with dcf.Session(config=dcf.SessionConfig(fuse_devices=fuse)) as sess:
        got = [sess.run(h, {x: v}, options=OPTS) for v in XS]
    checked = 0
    for hv, v in zip(got, XS):
        want = _fd2(ref, v)
        if want is not None:
            checked += 1
            assert np.isclose(hv, want, rtol=1e-5, atol=1e-5), (combo, v, hv, want)
    assert checked >= 2


def _compose_with_variable(combo, w):
    """_compose's nesting around a leaf that reads a variable: sin(x * W) + x / 2 (the
    graph's W a dcf.Variable; the reference's a float)."""
    from tests.core.test_nesting import CONSTRUCTS

    build = lambda x: dcf.sin(x * w) + 0.5 * x             # noqa: E731
    for depth in reversed(range(len(combo))):
        build = CONSTRUCTS[combo[depth]][0](build)
    return build


def _ref_with_variable(combo, wv: float):
    from tests.core.test_nesting import CONSTRUCTS

    ref = lambda x: [float(np.sin(x * wv)) + 0.5 * x]     # noqa: E731
    for depth in reversed(range(len(combo))):
        ref = CONSTRUCTS[combo[depth]][1](ref)
    return ref


W0 = 0.7


@pytest.mark.parametrize("combo", COMBOS + DEEP, ids=["-in-".join(reversed(c)) for c in COMBOS + DEEP])
def test_gradients_of_a_variable_read_at_the_deepest_level(combo, compiled):
    """dy/dW for a Variable read inside every level's innermost body: each loop around the
    read accumulates its gradient over the iterations (a loop constant), each cond
    replays its decision; against finite differences of the reference in W."""
    dcf.reset_default_graph()
    w = dcf.Variable(np.float64(W0), name="W")
    x = dcf.placeholder(F64, (), name="x")
    (gw,) = dcf.gradients(_compose_with_variable(combo, w)(x), [w])
    with dcf.Session(config=compiled) as sess:
        sess.run(w.initializer)
        got = [sess.run(gw, {x: v}, options=OPTS) for v in XS]
    checked = 0
    for gv, v in zip(got, XS):
        want = _fd(lambda wv: _ref_with_variable(combo, wv)(v), W0)
        if want is None:
            continue
        checked += 1
        assert np.isclose(gv, want, rtol=1e-6, atol=1e-7), (combo, v, gv, want)
    assert checked >= 2
