"""Every construct nested one, two and three deep in every combination, against plain
Python: cond, while_loop (data-dependent trip counts), map_fn, scan, and a while_loop
with a TensorArray loop variable. Each level wraps the level below it as a scalar
float64 function, so a combination is built and its Python reference computed by the
same composition."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import dcf

F64 = dcf.float64
XS = [-0.9, 0.3, 0.6, 1.7]   # both cond branches; trip counts 2, 0, 1, 2


def _trips(x):
    return dcf.cast(dcf.abs(x) * 3.0, dcf.int32) % 3


def _trips_ref(x: float) -> int:
    return int(abs(x) * 3.0) % 3


def _leaf(x):
    return dcf.sin(x) + 0.5 * x


def _leaf_ref(x: float) -> float:
    return math.sin(x) + 0.5 * x


# Each construct: (build(inner) -> scalar fn on tensors, ref(inner_ref) -> scalar fn on floats)
def _cond(inner):
    return lambda x: dcf.cond(x > 0.5, lambda: inner(x) + 1.0, lambda: inner(x - 1.0) * 0.5)


def _cond_ref(inner):
    return lambda x: inner(x) + 1.0 if x > 0.5 else inner(x - 1.0) * 0.5


def _while(inner):
    def f(x):
        n = _trips(x)
        _, acc = dcf.while_loop(
            lambda i, a: i < n,
            lambda i, a: (i + 1, a * 0.5 + inner(a + dcf.cast(i, F64))),
            (0, x))
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
        return dcf.reduce_sum(dcf.scan(lambda a, e: a * 0.5 + inner(e + a), elems,
                                       initializer=x * 0.1))
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
            (0, ta))
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


def _compose(combo):
    """Outermost construct first: ("cond", "while") is a while_loop inside a cond."""
    build, ref = _leaf, _leaf_ref
    for name in reversed(combo):
        b, r = CONSTRUCTS[name]
        build, ref = b(build), r(ref)
    return build, ref


@pytest.mark.parametrize("combo", COMBOS, ids=["-in-".join(reversed(c)) for c in COMBOS])
def test_nested_constructs_match_python(combo, compiled, run_graph):
    build, ref = _compose(combo)
    x = dcf.placeholder(F64, (), name="x")
    y = build(x)
    with dcf.Session(config=compiled) as sess:
        got = [sess.run(y, {x: v}) for v in XS]
    np.testing.assert_allclose(got, [ref(v) for v in XS], rtol=1e-10, atol=1e-12)
