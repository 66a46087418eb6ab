"""Loops and conds partitioned over several in-process devices ("/cpu:K", each its own
actor, Send/Recv keyed by tags), checked against the same graph on one device and
against Python; and parallel_iterations 1 vs 32 giving identical results."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dcf


def _dev(split: bool, k: int):
    return dcf.device(f"/cpu:{k}" if split else None)


def _run(fetches, feeds=None, config=None, trace=False):
    """Run in a fresh Session; the timeout makes a lost dead signal fail instead of hang."""
    md = dcf.RunMetadata()
    with dcf.Session(config=config) as sess:
        out = sess.run(
            fetches, feeds, options=dcf.RunOptions(trace=trace, timeout_s=20.0), run_metadata=md
        )
    return (out, md.trace) if trace else out


# ------------------------------------------------------------------- models
def _split_body_loop(split: bool, pi: int, p):
    """Body split over /cpu:0 and /cpu:1; a cond whose branch on /cpu:2 is taken only when
    `p` is fed True."""

    def body(i, x, acc):
        with _dev(split, 1):
            y = dcf.tanh(x) * 2.0
        with _dev(split, 0):
            z = y + dcf.cast(i, dcf.float64)

        def far():
            with _dev(split, 2):
                return z * 100.0

        w = dcf.cond(p, far, lambda: z - 1.0)
        return i + 1, w * 0.01, acc + w

    return dcf.while_loop(
        lambda i, x, a: i < 10,
        body,
        (0, dcf.constant(0.3, dcf.float64), dcf.constant(0.0, dcf.float64)),
        parallel_iterations=pi,
    )


def _split_body_ref(p: bool):
    x, acc = 0.3, 0.0
    for i in range(10):
        z = math.tanh(x) * 2.0 + i
        w = z * 100.0 if p else z - 1.0
        x, acc = w * 0.01, acc + w
    return 10, x, acc


def _nested_three_devices(split: bool, pi: int, n):
    """while i < n: (on /cpu:1) x *= 0.5; while j < i (on /cpu:2): y = sin(y) + j."""

    def inner(i, x):
        def ib(j, y):
            with _dev(split, 2):
                y2 = dcf.sin(y) + dcf.cast(j, dcf.float64)
            return j + 1, y2

        return dcf.while_loop(lambda j, y: j < i, ib, (0, x), parallel_iterations=pi)[1]

    def ob(i, x):
        with _dev(split, 1):
            x2 = x * 0.5
        return i + 1, inner(i, x2)

    return dcf.while_loop(
        lambda i, x: i < n, ob, (0, dcf.constant(1.0, dcf.float64)), parallel_iterations=pi
    )[1]


def _nested_three_ref(n: int) -> float:
    x = 1.0
    for i in range(n):
        x *= 0.5
        for j in range(i):
            x = math.sin(x) + j
    return x


def _ta_split_loop(split: bool, pi: int, n):
    """A TensorArray written on /cpu:0 from values computed on /cpu:1."""

    def body(i, ta):
        with _dev(split, 1):
            v = dcf.cast(i * i, dcf.float64) + 0.5
        return i + 1, ta.write(i, v)

    ta = dcf.while_loop(
        lambda i, t: i < n, body, (0, dcf.TensorArray(dcf.float64, size=n)), parallel_iterations=pi
    )[1]
    return ta.stack()


# --------------------------------------------------------------------- tests
@pytest.mark.parametrize("p", [False, True], ids=["near_branch", "far_branch"])
def test_split_loop_equals_single_device_and_python(p, compiled):
    want = _split_body_ref(p)
    results = {}
    for split in (False, True):
        for pi in (1, 32):
            dcf.reset_default_graph()
            pred = dcf.placeholder(dcf.bool, ())
            results[split, pi] = _run(_split_body_loop(split, pi, pred), {pred: p}, compiled)
    for key, got in results.items():
        assert got[0] == want[0], key
        np.testing.assert_allclose(got[1:], want[1:], rtol=1e-12, err_msg=str(key))
        assert got == results[False, 1], f"{key} differs from one device, sequential"


@pytest.mark.parametrize("n", [0, 1, 4])
def test_nested_loops_split_across_three_devices(n, compiled):
    results = {}
    for split in (False, True):
        for pi in (1, 32):
            dcf.reset_default_graph()
            trips = dcf.placeholder(dcf.int32, ())
            results[split, pi] = _run(_nested_three_devices(split, pi, trips), {trips: n}, compiled)
    assert len(set(results.values())) == 1, results
    assert results[True, 32] == pytest.approx(_nested_three_ref(n), rel=1e-12)


def test_nested_split_loops_run_on_every_device():
    trips = dcf.placeholder(dcf.int32, ())
    _, trace = _run(_nested_three_devices(True, 32, trips), {trips: 4}, trace=True)
    by_device = {}
    for e in trace:
        by_device.setdefault(e[0], set()).add(e[3])
    assert set(by_device) == {"/cpu:0", "/cpu:1", "/cpu:2"}
    assert "while/while" in by_device["/cpu:2"] and "while" in by_device["/cpu:1"]


@pytest.mark.parametrize("n", [0, 3, 7])
def test_tensor_array_written_from_another_device(n, compiled):
    results = {}
    for split in (False, True):
        for pi in (1, 32):
            dcf.reset_default_graph()
            trips = dcf.placeholder(dcf.int32, ())
            results[split, pi] = _run(_ta_split_loop(split, pi, trips), {trips: n}, compiled)
    for got in results.values():
        np.testing.assert_array_equal(got, np.arange(n) ** 2 + 0.5)


@pytest.mark.parametrize("pred", [True, False])
def test_untaken_branch_on_another_device_never_blocks(pred, compiled):
    calls: list = []

    def far_work(x):
        calls.append(float(x))
        return x

    p = dcf.placeholder(dcf.bool, ())
    x = dcf.constant(2.0)

    def far(v):
        with dcf.device("/cpu:2"):
            out, _ = dcf.py_func(lambda u: (far_work(u), 0), [v * 3.0], [dcf.float32, dcf.int32])
            return dcf.reshape(out, []) + 1.0

    with dcf.device("/cpu:1"):
        near = x - 1.0
    top = dcf.cond(p, lambda: far(x), lambda: near)
    in_loop = dcf.while_loop(
        lambda i, a: i < 3,
        lambda i, a: (i + 1, a + dcf.cond(p, lambda: far(a + 2.0), lambda: near)),
        (0, 0.0),
    )[1]
    assert _run([top, in_loop], {p: pred}, compiled) == ([7.0, 147.0] if pred else [1.0, 3.0])
    assert sorted(calls) == ([6.0, 6.0, 27.0, 111.0] if pred else [])


def test_cond_with_pred_and_branches_on_three_devices(compiled):
    x = dcf.placeholder(dcf.float32, ())
    with dcf.device("/cpu:2"):
        pred = x > 0.0

    def pos():
        with dcf.device("/cpu:1"):
            return x * 2.0

    def neg():
        with dcf.device("/cpu:0"):
            return -x

    out = dcf.cond(pred, pos, neg)
    assert [_run(out, {x: v}, compiled) for v in (3.0, -4.0)] == [6.0, 4.0]


@pytest.mark.parametrize("split", [False, True], ids=["one_device", "two_devices"])
def test_parallel_iterations_do_not_change_results(split, compiled):
    """A loop with several independent recurrences and a data-dependent inner loop."""

    def build(pi):
        dcf.reset_default_graph()
        n = dcf.placeholder(dcf.int32, ())

        def body(i, a, b, ta):
            with _dev(split, 1):
                a2 = a * 0.9 + dcf.cast(i, dcf.float64)
            inner = dcf.while_loop(
                lambda j, s: j < i % 3, lambda j, s: (j + 1, s + a2), (0, b), parallel_iterations=pi
            )[1]
            return i + 1, a2, inner * 0.5, ta.write(i, a2 - inner)

        out = dcf.while_loop(
            lambda i, *_: i < n,
            body,
            (
                0,
                dcf.constant(1.0, dcf.float64),
                dcf.constant(0.0, dcf.float64),
                dcf.TensorArray(dcf.float64, size=n),
            ),
            parallel_iterations=pi,
        )
        return n, [out[1], out[2], out[3].stack()]

    got = {}
    for pi in (1, 32):
        n, fetch = build(pi)
        got[pi] = _run(fetch, {n: 9}, compiled)
    assert got[1][0] == got[32][0] and got[1][1] == got[32][1]
    np.testing.assert_array_equal(got[1][2], got[32][2])
