"""A worker that receives a loop variable's body value (the loop's pivot) runs its part of
the loop off that value: the value is dead in the last iteration only, so its Recv
drives the worker's control loop and no predicate is sent to it. A worker that gets
only other values of the loop still receives the predicate.

Each graph is checked two ways: the partitions take the path the test is about
(structure), and the cluster computes what one process computes (the oracle).
"""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.ops.registry import Kind
from dcf.partition import partition
from dcf.placement import place
from dcf.session import _prune
from tests.cluster.helpers import assert_same, both, on

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


def _loops_of(build) -> dict[int, dict[str, int]]:
    """worker index -> {"driven": control loops driven by a received loop value,
    "predicate": control loops fed the predicate, "pred_recvs": Recvs of a LoopCond},
    for `build` placed on workers 0-2 and partitioned."""
    g = dcf.Graph()
    with g.as_default():
        fetches, feeds = build(on)
    flat = dcf.nest.flatten(fetches)
    ops = _prune(flat, list(feeds))
    device_of = place(ops, "/job:worker/task:0/cpu:0", lambda d: True,
                      process_of=lambda d: d.split("/cpu")[0])
    parts = partition(ops, device_of, [(t.op, t.index) for t in flat], list(feeds))
    out: dict[int, dict[str, int]] = {}
    for dev, prt in parts.items():
        k = int(dev.split("task:")[1].split("/")[0])
        cl = [p for p in prt.nodes if p.name.startswith("_cl/")]
        nxt = [p for p in cl if p.kind == Kind.NEXT_ITERATION]
        out[k] = {
            "driven": sum(1 for p in nxt if p.inputs[0][0].kind == Kind.RECV),
            "predicate": sum(1 for p in cl if p.kind == Kind.SWITCH),
            "pred_recvs": sum(1 for p in prt.nodes if p.kind == Kind.RECV
                              and "LoopCond" in p.attrs["edge"]),
        }
    return out


# ---------------------------------------------------------------- barrier loop
def _barrier(num_workers: int, n_value: int):
    """The benchmark's barrier loop: i and x on worker 0, x + 1 on every worker."""
    def build(on):
        n = dcf.placeholder(dcf.int32, (), name="n")
        with on(0):
            i0 = dcf.constant(0)
            x0 = dcf.constant(0.0)

        def body(i, x):
            ys = []
            for k in range(num_workers):
                with on(k):
                    ys.append(x + 1.0)
            with on(0):
                return i + 1, dcf.add_n(ys) * (1.0 / num_workers)

        def cond(i, x):
            with on(0):
                return i < n

        return dcf.while_loop(cond, body, (i0, x0)), {n: n_value}
    return build


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("n", [0, 1, 7])
def test_barrier_loop_driven_by_the_loop_value_matches_one_process(cluster3, workers, n):
    build = _barrier(workers, n)
    loops = _loops_of(build)
    for k in range(1, workers):
        assert loops[k] == {"driven": 1, "predicate": 0, "pred_recvs": 0}, loops
    assert loops[0]["predicate"] == 0 and loops[0]["driven"] == 0   # the real loop
    got, want = both(build, cluster3)
    assert_same(got, want)
    assert got[0] == n and got[1] == float(n)


def test_benchmark_graph_sends_no_predicate():
    from bench.distributed_loop import build

    g, fetch, n = build(4, True)
    ops = _prune(list(fetch), [n])
    device_of = place(ops, "/cpu:0", lambda d: True, process_of=lambda d: d)
    parts = partition(ops, device_of, [(t.op, t.index) for t in fetch], [n])
    sends = [p for prt in parts.values() for p in prt.nodes if p.kind == Kind.SEND]
    # per iteration: x to each of 3 workers and x + 1 back from each, nothing else
    assert len(sends) == 6
    assert not [p for p in sends if "LoopCond" in p.attrs["edge"]]


# ------------------------------------------------------- predicate on the worker
def _predicate_on_worker(on):
    """The loop variables live on worker 0, the predicate is computed on worker 1, the
    body spans workers 1 and 2."""
    n = dcf.placeholder(dcf.int32, (), name="n")
    with on(0):
        i0 = dcf.constant(0)
        x0 = dcf.constant(1.0)

    def cond(i, x):
        with on(1):
            return dcf.logical_and(i < n, x < 1000.0)

    def body(i, x):
        with on(1):
            y = x * 1.5
        with on(2):
            z = x + dcf.cast(i, dcf.float32)
        with on(0):
            return i + 1, y + z

    return dcf.while_loop(cond, body, (i0, x0)), {n: 9}


def test_predicate_computed_on_a_worker(cluster3):
    loops = _loops_of(_predicate_on_worker)
    # worker 2 only receives the loop value x: driven; worker 1 receives x too
    assert loops[2] == {"driven": 1, "predicate": 0, "pred_recvs": 0}, loops
    assert loops[1]["pred_recvs"] == 0, loops
    got, want = both(_predicate_on_worker, cluster3)
    assert_same(got, want)


def _body_value_not_a_loop_variable(on):
    """Worker 2 gets only a value computed in the body (not a loop variable): it still
    needs the predicate; worker 1 gets the loop variable."""
    def body(i, x):
        with on(0):
            h = x * 2.0
        with on(1):
            u = x - 1.0
        with on(2):
            v = h + 1.0
        with on(0):
            return i + 1, (u + v) * 0.5

    with on(0):
        out = dcf.while_loop(lambda i, x: i < 6, body, (0, dcf.constant(1.0)))
    return out, {}


def test_worker_without_a_loop_value_still_gets_the_predicate(cluster3):
    loops = _loops_of(_body_value_not_a_loop_variable)
    assert loops[1] == {"driven": 1, "predicate": 0, "pred_recvs": 0}, loops
    assert loops[2] == {"driven": 0, "predicate": 1, "pred_recvs": 1}, loops
    got, want = both(_body_value_not_a_loop_variable, cluster3)
    assert_same(got, want)


# ------------------------------------------------------------------ nested loops
def _nested(on):
    """An outer loop on worker 0; an inner loop whose variables live on worker 1 and
    whose body runs on worker 2, which also uses the outer loop's value."""
    x = dcf.placeholder(dcf.float32, (2,), name="x")

    def outer(i, a):
        with on(1):
            b0 = a * 0.5

        def inner(j, b):
            with on(2):
                b = b + a * dcf.cast(j, dcf.float32)
            return j + 1, b

        with on(1):
            _, b = dcf.while_loop(lambda j, b: j < i, inner, (0, b0))
        with on(0):
            return i + 1, b + 1.0

    with on(0):
        out = dcf.while_loop(lambda i, a: i < 4, outer, (0, x))
    return out, {x: np.array([1.0, -2.0], np.float32)}


def test_nested_loops_driven_by_loop_values(cluster3):
    loops = _loops_of(_nested)
    # worker 2: the inner loop off b, the outer one off a (both received as loop values)
    assert loops[2] == {"driven": 2, "predicate": 0, "pred_recvs": 0}, loops
    got, want = both(_nested, cluster3)
    assert_same(got, want)


def _nested_inner_zero_trips(on):
    """Inner loops that run 0 times in some outer iterations (early exit), driven on
    worker 2."""
    def outer(i, a):
        def inner(j, b):
            with on(2):
                b = b * 2.0
            return j + 1, b

        with on(1):
            _, a = dcf.while_loop(lambda j, b: j < i - 1, inner, (0, a))
        return i + 1, a

    with on(0):
        out = dcf.while_loop(lambda i, a: i < 4, outer, (0, dcf.constant(1.0)))
    return out, {}


def test_inner_loop_with_zero_iterations(cluster3):
    assert _loops_of(_nested_inner_zero_trips)[2]["driven"] == 1
    got, want = both(_nested_inner_zero_trips, cluster3)
    assert_same(got, want)
    assert got[1] == 2.0 ** 3


def _loop_in_a_cond(on):
    """A loop inside a cond branch (taken or not per outer iteration), its body on
    worker 2: in an untaken branch the loop runs dead and worker 2's part must end."""
    def outer(i, a):
        def branch():
            def inner(j, b):
                with on(2):
                    b = b * 1.5 + 1.0
                return j + 1, b

            with on(1):
                return dcf.while_loop(lambda j, b: j < 3, inner, (0, a))[1]

        with on(0):
            a = dcf.cond(dcf.equal(i % 2, 0), branch, lambda: a - 1.0)
            return i + 1, a

    with on(0):
        out = dcf.while_loop(lambda i, a: i < 5, outer, (0, dcf.constant(1.0)))
    return out, {}


def test_loop_in_an_untaken_branch_ends_on_the_driven_worker(cluster3):
    assert _loops_of(_loop_in_a_cond)[2]["driven"] >= 1
    got, want = both(_loop_in_a_cond, cluster3)
    assert_same(got, want)


# --------------------------------------------------------------- conds in loops
def _cond_branch_elsewhere(on):
    """A cond in the loop body whose branches run on workers 1 and 2, which also use
    the loop value directly; each branch is untaken in some iterations."""
    def body(i, x):
        with on(0):
            p = dcf.equal(i % 3, 0)
        with on(1):
            w = x * 0.25

        def yes():
            with on(2):
                return x * 3.0 + 1.0

        def no():
            with on(1):
                return x - 2.0

        with on(0):
            c = dcf.cond(p, yes, no)
        with on(2):
            w2 = x + 0.5
        with on(0):
            return i + 1, c + w + w2

    with on(0):
        out = dcf.while_loop(lambda i, x: i < 7, body, (0, dcf.constant(1.0)))
    return out, {}


def test_cond_branches_on_other_workers_inside_a_driven_loop(cluster3):
    loops = _loops_of(_cond_branch_elsewhere)
    assert loops[1]["driven"] == loops[2]["driven"] == 1, loops
    assert loops[1]["pred_recvs"] == loops[2]["pred_recvs"] == 0, loops
    got, want = both(_cond_branch_elsewhere, cluster3)
    assert_same(got, want)


# ------------------------------------------------------------------- gradients
def test_gradient_of_a_driven_loop(cluster3):
    def build(on):
        x = dcf.placeholder(dcf.float32, (2,), name="x")
        w = dcf.constant(np.array([0.5, -1.5], np.float32))

        def body(i, a):
            with on(1):
                b = dcf.sin(a * w)
            with on(2):
                c = a * a * 0.5
            with on(0):
                return i + 1, b + c

        with on(0):
            _, y = dcf.while_loop(lambda i, a: i < 4, body, (0, x))
            loss = dcf.reduce_sum(y)
        gx, gw = dcf.gradients(loss, [x, w])
        return [loss, gx, gw], {x: np.array([0.3, 0.7], np.float32)}

    loops = _loops_of(build)
    assert loops[1]["driven"] >= 1 and loops[2]["driven"] >= 1, loops
    got, want = both(build, cluster3)
    assert_same(got, want)


def test_failure_tests_loop_is_driven():
    """The loop `test_failures` kills a worker in runs on worker 1 off the loop value
    (so a worker dying in a driven loop gives WorkerError: that test)."""
    from tests.cluster.helpers import long_loop

    def build(on):
        return long_loop(10), {}

    loops = _loops_of(build)
    assert loops[1] == {"driven": 1, "predicate": 0, "pred_recvs": 0}, loops
