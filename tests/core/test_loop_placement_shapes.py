"""Loops of random shapes AND random placement, run every way a run can go, against the
same graph on one device: the loop's counter and predicate on one device, each loop
variable's update on another (three in-process CPU devices here; tests/gpu runs the
same with the GPUs), loops of one to four variables that pass through, update, choose
by a cond (its branches on the variable's device or on the two others), sum by an inner
loop (its body on the variable's device or the next), fold a constant vector (a loop
over a TensorArray, on the next device), read an outer value or rotate (all must move at
once),
for 0-4 iterations, any subset fetched; with `grad`, the gradient of the sum of the
outputs with respect to the input, through the loop. The ways: compiled (a plan over
several devices is one fused program), the partitioned tagged-token executor (Send /
Recv per cut edge, control loops), and a traced run (the partitions again, compiled).

The draws found a hang: a loop constant entered under one device scope and read under
another crossed devices inside the loop's frame, sent once while its Recv waited in
every iteration (dcf/partition.py, _enters_with_their_readers)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dcf

F64 = dcf.float64
KINDS = ("pass", "affine", "cond", "split_cond", "inner", "split_inner", "fold", "outer",
         "rotate")
WAYS = ("compiled", "executor", "traced")

pytestmark = pytest.mark.timeout(300)


def build(kinds, places, pred_place, fetch, grad, devices):
    """(n, x0, fetches) of a loop whose variable j is updated by kinds[j] on
    devices[places[j]], its counter and predicate on devices[pred_place]. On one device
    a passed, rotated or outer value goes on as it is (an op of its own is what puts it
    on another device)."""
    n = dcf.placeholder(dcf.int32, (), name="n")
    x0 = dcf.placeholder(F64, (), name="x0")
    outer = dcf.constant(0.5, F64) * x0
    bare = len(set(devices)) == 1

    def update(kind, i, v, w, place):
        if kind == "rotate":
            return w if bare else dcf.identity(w)
        if kind == "pass":
            return v if bare else dcf.identity(v)
        if kind == "affine":
            return v * 1.5 - 0.25
        if kind == "cond":
            return dcf.cond(v > 0.0, lambda: v - 1.0, lambda: v * v + 0.5)
        if kind == "split_cond":    # each branch on another device than the predicate
            def on(k, fn):
                def branch():
                    with dcf.device(devices[(place + k) % len(devices)]):
                        return fn()
                return branch
            return dcf.cond(v > 0.0, on(1, lambda: v - outer), on(2, lambda: v * v + 0.5))
        if kind == "inner":
            _, s = dcf.while_loop(lambda j, s: j < i % 3, lambda j, s: (j + 1, s + v),
                                  (0, v))
            return s
        if kind == "split_inner":   # its body on the next device, reading an outer value
            def inner_body(j, s):
                with dcf.device(devices[(place + 1) % len(devices)]):
                    return j + 1, s * 0.5 + v + outer
            _, s = dcf.while_loop(lambda j, s: j < i % 3, inner_body, (0, v))
            return s
        if kind == "fold":          # a foldl (a loop over a TensorArray) on the next device
            with dcf.device(devices[(place + 1) % len(devices)]):
                return dcf.foldl(lambda a, e: a * 0.5 + e * v,
                                 dcf.constant([1.0, -2.0, 0.5], F64), initializer=v)
        return outer if bare else outer * 1.0

    def body(i, *vs):
        with dcf.device(devices[pred_place]):
            i1 = i + 1
        out = []
        for j, (k, v) in enumerate(zip(kinds, vs)):
            with dcf.device(devices[places[j]]):
                out.append(update(k, i, v, vs[(j + 1) % len(vs)], places[j]))
        return (i1,) + tuple(out)

    def pred(i, *vs):
        with dcf.device(devices[pred_place]):
            return i < n

    init = tuple(x0 + float(k) for k in range(len(kinds)))
    outs = dcf.while_loop(pred, body, (0,) + init)
    if grad:
        (g,) = dcf.gradients(dcf.add_n(list(outs[1:])), [x0])
        return n, x0, [outs[0], g]
    return n, x0, [o for o, f in zip(outs, [True] + fetch) if f]


def run_all_ways(devices, kinds, places, pred_place, fetch_bits, trips, grad, x):
    places = [p % len(devices) for p in places]
    pred_place %= len(devices)
    fetch = [bool(fetch_bits >> k & 1) for k in range(len(kinds))]
    got = {}
    for how in WAYS + ("one device",):
        dcf.reset_default_graph()
        devs = [devices[0]] * len(devices) if how == "one device" else devices
        n, x0, outs = build(kinds, places, pred_place, fetch, grad, devs)
        cfg = dcf.SessionConfig(compile_frames=how != "executor")
        opts = dcf.RunOptions(trace=True) if how == "traced" else None
        with dcf.Session(config=cfg) as sess:
            got[how] = [np.asarray(v) for v in sess.run(outs, {n: trips, x0: x},
                                                        options=opts)]
    for how in WAYS:
        assert len(got[how]) == len(got["one device"]), how
        for a, b in zip(got[how], got["one device"]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=how)
    assert got["one device"][0] == trips


DRAWS = dict(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=4),
             places=st.lists(st.integers(0, 2), min_size=4, max_size=4),
             pred_place=st.integers(0, 2), fetch_bits=st.integers(0, 15),
             trips=st.integers(0, 4), grad=st.booleans(),
             x=st.floats(-2.0, 2.0, allow_nan=False))


@given(**DRAWS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_loops_over_three_devices_match_one_device(kinds, places, pred_place, fetch_bits,
                                                   trips, grad, x):
    run_all_ways(["/cpu:0", "/cpu:1", "/cpu:2"], kinds, places, pred_place, fetch_bits,
                 trips, grad, x)


@pytest.mark.parametrize("read_there_too", [False, True])
@pytest.mark.parametrize("how", WAYS)
def test_a_loop_constant_entered_on_one_device_and_read_on_another(how, read_there_too):
    """The hang the draws found, as it was: the first read of `outer` in the body (under
    /cpu:1) placed its Enter there; the read under /cpu:0 crossed devices inside the
    loop. Not fetching the /cpu:1 variable left its Enter no reader on /cpu:1."""
    n = dcf.placeholder(dcf.int32, (), name="n")
    x0 = dcf.placeholder(F64, (), name="x0")
    outer = dcf.constant(0.5, F64) * x0

    def body(i, a, b):
        with dcf.device("/cpu:1"):
            a1 = outer * 1.0
        return i + 1, a1, outer * 3.0 + b

    i, a, b = dcf.while_loop(lambda i, a, b: i < n, body, (0, x0, x0 + 1.0))
    fetches = [i, a, b] if read_there_too else [i, b]
    cfg = dcf.SessionConfig(compile_frames=how != "executor")
    opts = dcf.RunOptions(trace=True) if how == "traced" else None
    with dcf.Session(config=cfg) as sess:
        for trips in range(4):
            got = sess.run(fetches, {n: trips, x0: 1.5}, options=opts)
            assert got[0] == trips
            assert got[-1] == pytest.approx(2.5 + 2.25 * trips)
            if read_there_too:
                assert got[1] == (0.75 if trips else 1.5)
