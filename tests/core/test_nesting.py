"""Every construct nested one, two and three deep in every combination, against plain
Python: cond, while_loop (data-dependent trip counts), map_fn, scan, and a while_loop
with a TensorArray loop variable. Each level wraps the level below it as a scalar
float64 function, so a combination is built and its Python reference computed by the
same composition.

The reference gives the *possible* results: a value within _EDGE of a trip-count
boundary or of a cond's threshold may go either way when another math library (a
GPU's sin) rounds the last bit differently, so there the reference follows both ways.
Anywhere else it has one result, and the graph's must match it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dcf

F64 = dcf.float64
XS = [-0.9, 0.3, 0.6, 1.7]  # both cond branches; trip counts 2, 0, 1, 2
_EDGE = 1e-9                # closer than this to a boundary: either side is right


def _trips(x):
    return dcf.cast(dcf.abs(x) * 3.0, dcf.int32) % 3


def _trips_ref(x: float) -> list[int]:
    t = abs(x) * 3.0
    n = int(t)
    out = [n % 3]
    if n and t - n < _EDGE:
        out.append((n - 1) % 3)
    elif n + 1 - t < _EDGE:
        out.append((n + 1) % 3)
    return out


def _uniq(vals) -> list[float]:
    """Possible results, one of each (values closer than 1e-13 relative are one)."""
    out: list[float] = []
    for v in sorted(vals):
        if not out or abs(v - out[-1]) > 1e-13 * max(1.0, abs(v)):
            out.append(v)
    return out


def _check(got, xs, ref) -> None:
    for g, v in zip(got, xs):
        cands = ref(v)
        assert any(np.isclose(g, c, rtol=1e-10, atol=1e-12) for c in cands), \
            f"x={v}: got {g!r}, the reference gives {cands}"


def _leaf(x):
    return dcf.sin(x) + 0.5 * x


def _leaf_ref(x: float) -> list[float]:
    return [float(np.sin(x)) + 0.5 * x]  # np.sin, as the kernel: same rounding


def _placed(inner, dev):
    """`inner` with its ops placed on `dev` (None: the default device)."""
    if dev is None:
        return inner

    def f(x):
        with dcf.device(dev):
            return inner(x)

    return f


# Each construct: (build(inner) -> scalar fn on tensors, ref(inner_ref) -> scalar fn on floats)
def _cond(inner):
    return lambda x: dcf.cond(x > 0.5, lambda: inner(x) + 1.0, lambda: inner(x - 1.0) * 0.5)


def _cond_ref(inner):
    def f(x):
        out = []
        if x > 0.5 or abs(x - 0.5) < _EDGE:
            out += [v + 1.0 for v in inner(x)]
        if x <= 0.5 or abs(x - 0.5) < _EDGE:
            out += [v * 0.5 for v in inner(x - 1.0)]
        return _uniq(out)

    return f


def _while(inner):
    def f(x):
        n = _trips(x)
        _, acc = dcf.while_loop(
            lambda i, a: i < n, lambda i, a: (i + 1, a * 0.5 + inner(a + dcf.cast(i, F64))), (0, x)
        )
        return acc

    return f


def _while_ref(inner):
    def f(x):
        out = []
        for n in _trips_ref(x):
            accs = [x]
            for i in range(n):
                accs = _uniq(a * 0.5 + v for a in accs for v in inner(a + i))
            out += accs
        return _uniq(out)

    return f


def _map(inner):
    return lambda x: dcf.reduce_sum(dcf.map_fn(inner, dcf.stack([x, x * 0.5 - 1.0, -x])))


def _map_ref(inner):
    def f(x):
        parts = [inner(e) for e in (x, x * 0.5 - 1.0, -x)]
        return _uniq(sum(c) for c in itertools.product(*parts))

    return f


def _scan(inner):
    def f(x):
        elems = dcf.stack([x, x + 1.0, x * 0.25])
        return dcf.reduce_sum(
            dcf.scan(lambda a, e: a * 0.5 + inner(e + a), elems, initializer=x * 0.1)
        )

    return f


def _scan_ref(inner):
    def f(x):
        states = [(x * 0.1, 0)]          # (carry, sum of the outputs so far)
        for e in (x, x + 1.0, x * 0.25):
            states = list({(a2, s + a2): None for a, s in states
                           for a2 in (a * 0.5 + v for v in inner(e + a))})
        return _uniq(s for _, s in states)

    return f


def _ta(inner):
    def f(x):
        n = _trips(x)
        ta = dcf.TensorArray(F64, size=n)
        _, ta = dcf.while_loop(
            lambda i, ta: i < n,
            lambda i, ta: (i + 1, ta.write(i, inner(x + dcf.cast(i, F64)))),
            (0, ta),
        )
        return dcf.reduce_sum(ta.stack())

    return f


def _ta_ref(inner):
    def f(x):
        out = []
        for n in _trips_ref(x):
            out += [sum(c) for c in itertools.product(*[inner(x + i) for i in range(n)])]
        return _uniq(out)

    return f


CONSTRUCTS = {
    "cond": (_cond, _cond_ref),
    "while": (_while, _while_ref),
    "map_fn": (_map, _map_ref),
    "scan": (_scan, _scan_ref),
    "ta_loop": (_ta, _ta_ref),
}
NAMES = list(CONSTRUCTS)
COMBOS = [c for depth in (1, 2, 3) for c in itertools.product(NAMES, repeat=depth)]


def _compose(combo, split=False):
    """Outermost construct first: ("cond", "while") is a while_loop inside a cond. With
    `split`, what a construct at depth k wraps runs on "/cpu:{k + 1}" (the leaf on the
    deepest device), so every level's body sits on another device than its control."""
    build, ref = _leaf, _leaf_ref
    for depth in reversed(range(len(combo))):
        b, r = CONSTRUCTS[combo[depth]]
        build = b(_placed(build, f"/cpu:{depth + 1}" if split else None))
        ref = r(ref)
    return build, ref


@pytest.mark.parametrize("combo", COMBOS, ids=["-in-".join(reversed(c)) for c in COMBOS])
def test_nested_constructs_match_python(combo, compiled, run_graph):
    build, ref = _compose(combo)
    x = dcf.placeholder(F64, (), name="x")
    y = build(x)
    with dcf.Session(config=compiled) as sess:
        got = [sess.run(y, {x: v}) for v in XS]
    _check(got, XS, ref)


@pytest.mark.parametrize("combo", COMBOS, ids=["-in-".join(reversed(c)) for c in COMBOS])
def test_nested_constructs_split_over_devices_match_python(combo, compiled):
    build, ref = _compose(combo, split=True)
    x = dcf.placeholder(F64, (), name="x")
    y = build(x)
    opts = dcf.RunOptions(timeout_s=20.0)  # a lost dead signal fails instead of hanging
    with dcf.Session(config=compiled) as sess:
        got = [sess.run(y, {x: v}, options=opts) for v in XS]
    _check(got, XS, ref)


@pytest.mark.parametrize(
    "combo",
    [
        ("while", "while", "while"),
        ("cond", "while", "cond"),
        ("while", "ta_loop", "cond"),
        ("scan", "while", "map_fn"),
    ],
    ids=lambda c: "-in-".join(reversed(c)),
)
@given(xs=st.lists(st.floats(-2.5, 2.5), min_size=1, max_size=4))
@settings(max_examples=10, deadline=None)
def test_nested_constructs_with_random_inputs(combo, xs):
    """Random inputs: data-dependent trip counts 0-2 at every level and either branch."""
    for compile_frames in (True, False):
        dcf.reset_default_graph()
        build, ref = _compose(combo)
        x = dcf.placeholder(F64, ())
        y = build(x)
        with dcf.Session(config=dcf.SessionConfig(compile_frames=compile_frames)) as sess:
            got = [sess.run(y, {x: v}) for v in xs]
        _check(got, xs, ref)
