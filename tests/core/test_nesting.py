"""Every construct nested one, two and three deep in every combination, against plain
Python: cond, while_loop (data-dependent trip counts), map_fn, scan, and a while_loop
with a TensorArray loop variable. Each level wraps the level below it as a scalar
float64 function, so a combination is built and its Python reference computed by the
same composition."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dcf

F64 = dcf.float64
XS = [-0.9, 0.3, 0.6, 1.7]  # both cond branches; trip counts 2, 0, 1, 2


def _trips(x):
    return dcf.cast(dcf.abs(x) * 3.0, dcf.int32) % 3


def _trips_ref(x: float) -> int:
    return int(abs(x) * 3.0) % 3


def _leaf(x):
    return dcf.sin(x) + 0.5 * x


def _leaf_ref(x: float) -> float:
    return float(np.sin(x)) + 0.5 * x  # np.sin, as the kernel: same rounding


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
    return lambda x: inner(x) + 1.0 if x > 0.5 else inner(x - 1.0) * 0.5


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
        a = x
        for i in range(_trips_ref(x)):
            a = a * 0.5 + inner(a + i)
        return a

    return f


def _map(inner):
    return lambda x: dcf.reduce_sum(dcf.map_fn(inner, dcf.stack([x, x * 0.5 - 1.0, -x])))


def _map_ref(inner):
    return lambda x: sum(inner(e) for e in (x, x * 0.5 - 1.0, -x))


def _scan(inner):
    def f(x):
        elems = dcf.stack([x, x + 1.0, x * 0.25])
        return dcf.reduce_sum(
            dcf.scan(lambda a, e: a * 0.5 + inner(e + a), elems, initializer=x * 0.1)
        )

    return f


def _scan_ref(inner):
    def f(x):
        a, out = x * 0.1, []
        for e in (x, x + 1.0, x * 0.25):
            a = a * 0.5 + inner(e + a)
            out.append(a)
        return sum(out)

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
    return lambda x: sum(inner(x + i) for i in range(_trips_ref(x)))


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
    np.testing.assert_allclose(got, [ref(v) for v in XS], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("combo", COMBOS, ids=["-in-".join(reversed(c)) for c in COMBOS])
def test_nested_constructs_split_over_devices_match_python(combo, compiled):
    build, ref = _compose(combo, split=True)
    x = dcf.placeholder(F64, (), name="x")
    y = build(x)
    opts = dcf.RunOptions(timeout_s=20.0)  # a lost dead signal fails instead of hanging
    with dcf.Session(config=compiled) as sess:
        got = [sess.run(y, {x: v}, options=opts) for v in XS]
    np.testing.assert_allclose(got, [ref(v) for v in XS], rtol=1e-10, atol=1e-12)


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
        np.testing.assert_allclose(got, [ref(v) for v in xs], rtol=1e-10, atol=1e-12)
