"""map_fn, foldl, foldr and scan against numpy (nested structures in and out, with and
without initializers), and case's first-true-wins rule."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dcf

SETTINGS = settings(max_examples=6, deadline=None)
shapes = st.tuples(st.integers(1, 5), st.integers(1, 3))


def _data(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float64)


# -------------------------------------------------------------------- map_fn
@given(shape=shapes)
@SETTINGS
def test_map_fn_matches_numpy(shape):
    for compile_frames in (True, False):
        dcf.reset_default_graph()
        xs = _data(shape)
        out = dcf.map_fn(lambda row: dcf.reduce_sum(row * row) + row[0], xs)
        with dcf.Session(config=dcf.SessionConfig(compile_frames=compile_frames)) as sess:
            got = sess.run(out)
        np.testing.assert_allclose(got, (xs * xs).sum(1) + xs[:, 0])


def test_map_fn_nested_structure_in_and_out_infers_dtypes(compiled, run_graph):
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = np.array([1, 2, 3], np.int32)

    def fn(d):
        x, (k,) = d["x"], d["k"]
        return {"scaled": x * dcf.cast(k, dcf.float32), "pair": (k * 2, dcf.reduce_max(x))}

    out = dcf.map_fn(fn, {"x": a, "k": (b,)})
    assert out["pair"][0].dtype is dcf.int32 and out["scaled"].dtype is dcf.float32
    got = run_graph(out, config=compiled)
    np.testing.assert_array_equal(got["scaled"], a * b[:, None])
    np.testing.assert_array_equal(got["pair"][0], b * 2)
    np.testing.assert_array_equal(got["pair"][1], a.max(1))


def test_map_fn_with_explicit_dtype(compiled, run_graph):
    xs = np.array([0.4, 1.6, 2.5], np.float32)
    out = dcf.map_fn(lambda x: dcf.cast(x * 2.0, dcf.int32), xs, dtype=dcf.int32)
    np.testing.assert_array_equal(run_graph(out, config=compiled), [0, 3, 5])



def test_map_fn_output_must_have_dtypes_structure():
    # TF's rule: a structure other than dtype's was packed into dtype's silently (a dict
    # given for a tuple, its values in key order; a nested tuple flattened into pairs)
    xs = np.array([[1.0, 2.0], [3.0, 4.0]])
    f64 = dcf.float64
    with pytest.raises(ValueError, match=r"map_fn: fn must return the structure given by "
                       r"dtype=:\n  \* at top level: dict with 2 keys vs tuple of length 2"):
        dcf.map_fn(lambda e: (e * 2.0, e), xs, dtype={"a": f64, "b": f64})
    with pytest.raises(ValueError, match=r"at \[0\]: a single value vs tuple of length 1"):
        dcf.map_fn(lambda e: ((e * 2.0,), e), xs, dtype=(f64, f64))
    with pytest.raises(TypeError, match=r"map_fn: fn returned float64 at output\[1\] where "
                       r"dtype= says int32"):
        dcf.map_fn(lambda e: (e, e), xs, dtype=(f64, dcf.int32))
    with pytest.raises(TypeError, match=r"map_fn: fn returned None; it must return a tensor"):
        dcf.map_fn(lambda e: None, xs)


def test_map_fn_python_numbers_take_dtypes_dtype(compiled, run_graph):
    xs = np.array([1.0, 2.0])
    out = dcf.map_fn(lambda e: (1.5, e * 2.0, 3), xs, dtype=(dcf.float64, dcf.float64, dcf.int64))
    assert [t.dtype for t in out] == [dcf.float64, dcf.float64, dcf.int64]
    got = run_graph(out, config=compiled)
    np.testing.assert_array_equal(got[0], [1.5, 1.5])
    np.testing.assert_array_equal(got[1], [2.0, 4.0])
    np.testing.assert_array_equal(got[2], [3, 3])

def test_map_fn_over_a_fed_batch_of_unknown_length(compiled, run_graph):
    x = dcf.placeholder(dcf.float32, (None, 2))
    out = dcf.map_fn(lambda r: r[1] - r[0], x)
    for n in (0, 1, 4):
        xs = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
        np.testing.assert_array_equal(
            run_graph(out, {x: xs}, config=compiled), np.ones(n, np.float32)
        )


# ------------------------------------------------------------------ folds
def _step(acc, x):
    return acc * 0.5 + x


@given(shape=shapes, with_init=st.booleans())
@SETTINGS
def test_foldl_and_foldr_match_functools_reduce(shape, with_init):
    for compile_frames in (True, False):
        dcf.reset_default_graph()
        xs = _data(shape)
        init = np.full(shape[1:], 0.25) if with_init else None
        left = dcf.foldl(_step, xs, initializer=init)
        right = dcf.foldr(_step, xs, initializer=init)
        with dcf.Session(config=dcf.SessionConfig(compile_frames=compile_frames)) as sess:
            got_l, got_r = sess.run([left, right])
        rows = list(xs)
        want_l = functools.reduce(_step, rows, init) if with_init else functools.reduce(_step, rows)
        want_r = (
            functools.reduce(_step, rows[::-1], init)
            if with_init
            else functools.reduce(_step, rows[::-1])
        )
        np.testing.assert_allclose(got_l, want_l)
        np.testing.assert_allclose(got_r, want_r)


def test_foldl_nested_structures(compiled, run_graph):
    a = np.arange(1, 7, dtype=np.float64).reshape(3, 2)
    out = dcf.foldl(
        lambda acc, x: {"sum": acc["sum"] + x[0], "prod": acc["prod"] * x[1]},
        (a, a + 1),
        initializer={"sum": np.zeros(2), "prod": np.ones(2)},
    )
    got = run_graph(out, config=compiled)
    np.testing.assert_array_equal(got["sum"], a.sum(0))
    np.testing.assert_array_equal(got["prod"], (a + 1).prod(0))


# -------------------------------------------------------------------- scan
@given(shape=shapes, with_init=st.booleans())
@SETTINGS
def test_scan_matches_python_accumulate(shape, with_init):
    for compile_frames in (True, False):
        dcf.reset_default_graph()
        xs = _data(shape)
        init = np.full(shape[1:], -1.0) if with_init else None
        out = dcf.scan(_step, xs, initializer=init)
        with dcf.Session(config=dcf.SessionConfig(compile_frames=compile_frames)) as sess:
            got = sess.run(out)
        rows = list(xs)
        want = (
            list(itertools.accumulate(rows, _step, initial=init))[1:]
            if with_init
            else list(itertools.accumulate(rows, _step))
        )
        np.testing.assert_allclose(got, np.stack(want))


@pytest.mark.parametrize("with_init", [True, False])
def test_scan_nested_structures(with_init, compiled, run_graph):
    u = np.arange(6, dtype=np.float64).reshape(3, 2)
    v = u + 1.0

    def fn(acc, x):
        return (acc[0] + x["u"], acc[1] * x["v"])

    init = (np.zeros(2), np.ones(2)) if with_init else None
    if with_init:
        out = dcf.scan(fn, {"u": u, "v": v}, initializer=init)
        want = (np.cumsum(u, 0), np.cumprod(v, 0))
    else:
        out = dcf.scan(
            lambda acc, x: {"u": acc["u"] + x["u"], "v": acc["v"] * x["v"]}, {"u": u, "v": v}
        )
        want = {"u": np.cumsum(u, 0), "v": np.cumprod(v, 0)}
    got = run_graph(out, config=compiled)
    for k in (0, 1) if with_init else ("u", "v"):
        np.testing.assert_array_equal(got[k], want[k])


def test_scan_in_a_loop_in_a_map_fn(compiled, run_graph):
    xs = np.arange(12, dtype=np.float64).reshape(3, 4)

    def per_row(row):
        def body(i, s):
            return i + 1, s + dcf.reduce_sum(dcf.scan(lambda a, e: a + e, row))

        return dcf.while_loop(lambda i, s: i < 2, body, (0, dcf.constant(0.0, dcf.float64)))[1]

    got = run_graph(dcf.map_fn(per_row, xs), config=compiled)
    np.testing.assert_allclose(got, 2 * np.cumsum(xs, 1).sum(1))


# -------------------------------------------------------------------- case
@pytest.mark.parametrize(
    "preds",
    list(itertools.product([False, True], repeat=3)),
    ids=lambda p: "".join("T" if b else "F" for b in p),
)
def test_case_first_true_predicate_wins(preds, compiled, run_graph):
    calls: list = []

    def branch(k):
        def fn():
            def rec(x):
                calls.append(k)
                return x

            out, _ = dcf.py_func(lambda x: (rec(x), 0), [dcf.constant(k)], [dcf.int32, dcf.int32])
            return dcf.reshape(out, [])

        return fn

    ps = [dcf.placeholder(dcf.bool, (), name=f"p{k}") for k in range(3)]
    out = dcf.case([(ps[k], branch(k)) for k in range(3)], default=branch(-1))
    want = next((k for k, b in enumerate(preds) if b), -1)
    assert run_graph(out, dict(zip(ps, preds)), config=compiled) == want
    assert calls == [want], "only the chosen branch ran"


def test_case_in_a_loop_picks_per_iteration(compiled, run_graph):
    def body(i, acc):
        v = dcf.case([(i < 2, lambda: i * 100), (i < 4, lambda: i * 10)], default=lambda: i)
        return i + 1, acc + v

    _, acc = dcf.while_loop(lambda i, a: i < 6, body, (0, 0))
    assert run_graph(acc, config=compiled) == 0 + 100 + 20 + 30 + 4 + 5


def test_case_without_default_uses_the_last_pair_only_on_its_predicate():
    # TF1's rule: the last pair stands in for the default, and no true predicate is an
    # error when it runs (not the last fn run on a false predicate)
    p = dcf.placeholder(dcf.bool, ())
    q = dcf.placeholder(dcf.bool, ())
    out = dcf.case([(p, lambda: dcf.constant(1)), (q, lambda: 2)], name="pick")
    with dcf.Session() as sess:
        assert sess.run(out, {p: True, q: False}) == 1
        assert sess.run(out, {p: False, q: True}) == 2
        assert sess.run(out, {p: True, q: True}) == 1
        with pytest.raises(dcf.errors.InvalidArgumentError,
                           match=r"case 'pick' has no default and none of its predicates"):
            sess.run(out, {p: False, q: False})
    with pytest.raises(ValueError, match=r"case needs at least one"):
        dcf.case([])


def test_case_without_default_differentiates_through_the_last_pair():
    x = dcf.placeholder(dcf.float64, ())
    y = dcf.case([(x < 0.0, lambda: -x), (x >= 0.0, lambda: x * x)])
    (dx,) = dcf.gradients(y, [x])
    with dcf.Session() as sess:
        assert sess.run([y, dx], {x: 3.0}) == [9.0, 6.0]
        assert sess.run([y, dx], {x: -2.0}) == [2.0, -1.0]
