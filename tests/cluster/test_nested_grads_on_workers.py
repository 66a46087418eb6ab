"""tests/autodiff/test_nested_grads.py over worker processes: each level of a nested
construct runs its body on another worker than its control (the client holds the
outermost control), and the gradient -- backward loops whose stacks, accumulators and
replayed cond decisions cross processes as Send/Recv pairs with dynamic tags -- must
match the central finite differences of the plain Python reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import dcf
from tests.autodiff.gradcheck import OPTS
from tests.autodiff.test_nested_grads import DEEP, XS, _check, _fd2
from tests.cluster.helpers import task
from tests.core.test_nesting import CONSTRUCTS, F64, NAMES, _leaf, _leaf_ref, _placed

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

COMBOS = list(itertools.product(NAMES, repeat=2)) + DEEP


def _compose_on_workers(combo):
    """As test_nesting._compose with split, but what the construct at depth k wraps runs
    on worker k % 3 (the leaf on the deepest level's worker)."""
    build, ref = _leaf, _leaf_ref
    for depth in reversed(range(len(combo))):
        b, r = CONSTRUCTS[combo[depth]]
        build = b(_placed(build, task(depth % 3)))
        ref = r(ref)
    return build, ref


@pytest.mark.parametrize("combo", COMBOS, ids=["-in-".join(reversed(c)) for c in COMBOS])
def test_nested_gradients_over_workers(combo, cluster3):
    g = dcf.Graph()
    with g.as_default():
        build, ref = _compose_on_workers(combo)
        x = dcf.placeholder(F64, (), name="x")
        y = build(x)
        (dx,) = dcf.gradients(y, [x])
    with dcf.Session(g, cluster=cluster3) as sess:
        got = [sess.run([y, dx], {x: v}, options=OPTS) for v in XS]
    assert _check(got, XS, ref, combo) >= 3


@pytest.mark.parametrize("combo", COMBOS, ids=["-in-".join(reversed(c)) for c in COMBOS])
def test_nested_second_derivatives_over_workers(combo, cluster3):
    """d2y/dx2 with each level on another worker: the stacks of extra gradients that
    the second gradient's loops push and pop cross processes too."""
    g = dcf.Graph()
    with g.as_default():
        build, ref = _compose_on_workers(combo)
        x = dcf.placeholder(F64, (), name="x")
        (dx,) = dcf.gradients(build(x), [x])
        (dxx,) = dcf.gradients(dx, [x])
    with dcf.Session(g, cluster=cluster3) as sess:
        got = [sess.run(dxx, {x: v}, options=OPTS) for v in XS]
    checked = 0
    for hv, v in zip(got, XS):
        want = _fd2(ref, v)
        if want is not None:
            checked += 1
            assert np.isclose(hv, want, rtol=1e-5, atol=1e-5), (combo, v, hv, want)
    assert checked >= 2
