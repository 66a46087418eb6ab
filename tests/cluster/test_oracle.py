"""Graphs placed across worker processes give exactly what one process gives.

The single-process Session is the oracle: each test builds the same graph twice, once
placed on the workers of a `Cluster.local(3)` and once unplaced, and compares.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError
from tests.cluster.helpers import assert_same, both, on, task

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


# ------------------------------------------------------------------ control flow
def _nested_loops_and_conds(on):
    x = dcf.placeholder(dcf.float32, (3,), name="x")

    def outer_body(i, acc):
        with on(1):
            def inner_body(j, a):
                with on(2):
                    b = dcf.cond(dcf.equal(j % 2, 0), lambda: a * 1.5, lambda: a - 1.0)
                return j + 1, b

            _, a2 = dcf.while_loop(lambda j, a: j < i, inner_body, (0, acc))
        with on(0):
            return i + 1, a2 + dcf.cast(i, dcf.float32)

    out = dcf.while_loop(lambda i, a: i < 5, outer_body, (0, x))
    return out, {x: np.array([1.0, 2.0, 3.0], np.float32)}


def test_nested_loops_and_conds_over_three_workers_match_one_process(cluster3):
    got, want = both(_nested_loops_and_conds, cluster3)
    assert_same(got, want)
    assert got[0] == 5


def _loop_constant_entered_on_one_worker_read_on_others(on):
    x = dcf.placeholder(dcf.float32, (2,), name="x")
    outer = x * 0.5

    def body(i, a, b):
        with on(1):
            a1 = a + outer          # the first read of `outer`: its Enter goes to worker 1
        with on(2):
            b1 = b * 0.5 + outer    # read again on worker 2, and the client reads it too
        return i + 1, a1, b1 + dcf.reduce_sum(outer)

    out = dcf.while_loop(lambda i, a, b: i < 4, body, (0, x, x + 1.0))
    return (out[0], out[2]), {x: np.array([1.0, -2.0], np.float32)}


def test_a_loop_constant_read_on_workers_other_than_its_enters_matches_one_process(cluster3):
    """A loop constant whose Enter sat on one worker while others read it crossed
    processes inside the loop's frame: sent once, awaited every iteration (a hang,
    dcf/partition.py). Worker 1's variable is not fetched, so nothing reads the Enter on
    worker 1 itself."""
    got, want = both(_loop_constant_entered_on_one_worker_read_on_others, cluster3)
    assert_same(got, want)
    assert got[0] == 4


def _case_in_loop_with_data_dependent_trip_count(on):
    n = dcf.placeholder(dcf.int32, (), name="n")

    def body(i, s):
        with on(1):
            t = dcf.case([(i < 3, lambda: s + 1.0), (i < 6, lambda: s * 2.0)],
                         default=lambda: s - 3.0)
        with on(2):
            stop = dcf.cast(t > 100.0, dcf.int32) * 1000
        return i + 1 + stop, t

    out = dcf.while_loop(lambda i, s: i < n, body, (0, dcf.constant(1.0)))
    return out, {n: 40}


def test_case_in_loop_with_data_dependent_trip_count(cluster3):
    got, want = both(_case_in_loop_with_data_dependent_trip_count, cluster3)
    assert_same(got, want)


def _tensor_arrays_scan_map(on):
    x = dcf.placeholder(dcf.float32, (6, 2), name="x")
    with on(1):
        y = dcf.scan(lambda a, e: a * 0.5 + e, x)
    with on(2):
        z = dcf.map_fn(lambda e: dcf.reduce_sum(e * e), y)
    with on(0):
        f = dcf.foldl(lambda a, e: a + e, z, initializer=dcf.constant(0.0))
    return [y, z, f], {x: np.arange(12, dtype=np.float32).reshape(6, 2)}


def test_tensor_arrays_scan_map_fold_across_workers(cluster3):
    got, want = both(_tensor_arrays_scan_map, cluster3)
    assert_same(got, want)


def _tensor_array_written_on_one_worker_read_on_another(on):
    n = dcf.placeholder(dcf.int32, (), name="n")
    with on(1):
        ta = dcf.TensorArray(dcf.float32, size=n)

    def body(i, ta):
        with on(2):
            v = dcf.cast(i, dcf.float32) ** 2   # computed on worker 2, stored on worker 1
        return i + 1, ta.write(i, v)

    _, ta = dcf.while_loop(lambda i, ta: i < n, body, (0, ta))
    stacked = ta.stack()
    with on(0):
        total = dcf.reduce_sum(stacked)
    return [stacked, total], {n: 7}


def test_tensor_array_stays_with_its_handle_while_values_cross(cluster3):
    got, want = both(_tensor_array_written_on_one_worker_read_on_another, cluster3)
    assert_same(got, want)


@pytest.mark.parametrize("workers", [2, 3])
def test_gradients_of_a_loop_split_over_workers(cluster3, workers):
    def build(on):
        x = dcf.placeholder(dcf.float32, (2,), name="x")
        w = dcf.constant(np.array([0.7, -0.3], np.float32))

        def body(i, a):
            with on(1):
                a = dcf.tanh(a * w) + 0.1
            with on(workers - 1):
                a = dcf.cond(dcf.reduce_sum(a) > 0.0, lambda: a * a, lambda: a + 1.0)
            return i + 1, a

        _, y = dcf.while_loop(lambda i, a: i < 5, body, (0, x))
        loss = dcf.reduce_sum(y * y)
        gx, gw = dcf.gradients(loss, [x, w])
        return [loss, gx, gw], {x: np.array([0.9, -0.4], np.float32)}

    got, want = both(build, cluster3)
    assert_same(got, want)


def test_nested_loop_gradient_with_stacks_on_workers(cluster3):
    def build(on):
        x = dcf.placeholder(dcf.float32, (), name="x")

        def outer(i, a):
            def inner(j, b):
                with on(2):
                    b = dcf.sin(b) * 1.1
                return j + 1, b

            with on(1):
                _, a = dcf.while_loop(lambda j, b: j < i + 1, inner, (0, a))
            return i + 1, a

        _, y = dcf.while_loop(lambda i, a: i < 3, outer, (0, x))
        (g,) = dcf.gradients(y, [x])
        return [y, g], {x: 0.8}

    got, want = both(build, cluster3)
    assert_same(got, want)


def test_untaken_branch_on_another_worker_completes(cluster3):
    def build(on):
        p = dcf.placeholder(dcf.bool, (), name="p")
        with on(0):
            x = dcf.constant(2.0)

        def taken():
            return x + 1.0

        def untaken():
            with on(2):
                y = x * 10.0
                for _ in range(3):
                    y = y + 1.0
            return y

        with on(1):
            out = dcf.cond(p, untaken, taken)
        return out, {p: False}

    got, want = both(build, cluster3)
    assert got == want == 3.0


def test_fetch_from_an_untaken_branch_is_an_error_naming_it(cluster3):
    p = dcf.placeholder(dcf.bool, ())

    def true_fn():
        with on(2):
            return dcf.constant(1.0) * 2.0

    with on(1):
        sw = dcf.cond(p, true_fn, lambda: dcf.constant(0.0))
    dead = sw.op.inputs[1]   # the true branch's value, dead when p is False
    with dcf.Session(cluster=cluster3) as sess:
        with pytest.raises(InvalidArgumentError, match="dead"):
            sess.run(dead, {p: False})
        assert sess.run(sw, {p: True}) == 2.0


# ------------------------------------------------------------- state and values
def test_variables_live_on_their_worker_across_runs(cluster3):
    with on(1):
        v = dcf.Variable(np.float32(1.0), name="v")
    with on(2):
        w = v * 2.0            # reads v where v lives (worker 1); the product here
    step = v.assign_add(1.0)
    with dcf.Session(cluster=cluster3) as sess:
        sess.run(dcf.global_variables_initializer())
        for _ in range(3):
            sess.run(step)
        assert sess.run(v) == 4.0
        assert sess.run(w) == 8.0
    with dcf.Session(cluster=cluster3) as sess, \
            pytest.raises(InvalidArgumentError, match="initialized"):
        sess.run(v)   # a new session: fresh variables


def test_a_worker_refuses_an_assign_of_another_shape_and_keeps_the_value(cluster3):
    with on(1):
        v = dcf.Variable(np.arange(3, dtype=np.float32), name="v")
        x = dcf.placeholder(dcf.float32, None, name="x")
        put, add = v.assign(x), v.assign_add(x)
    with dcf.Session(cluster=cluster3) as sess:
        sess.run(dcf.global_variables_initializer())
        with pytest.raises(InvalidArgumentError,
                           match=r"AssignVariableOp 'v/Assign_1'.*variable 'v' of shape \[3\]: "
                                 r"the value has shape \[2\]"):
            sess.run(put, {x: np.ones(2, np.float32)})
        with pytest.raises(InvalidArgumentError, match=r"the value has shape \[4, 3\]"):
            sess.run(add, {x: np.ones((4, 3), np.float32)})
        np.testing.assert_array_equal(sess.run(v), [0.0, 1.0, 2.0])
        np.testing.assert_array_equal(sess.run(add, {x: np.float32(1.0)}), [1.0, 2.0, 3.0])


def test_client_and_workers_mix_and_feeds_reach_every_worker(cluster3):
    def build(on):
        a = dcf.placeholder(dcf.float32, (None,), name="a")
        b = dcf.placeholder(dcf.int32, (), name="b")
        with on(0):
            c = a * 2.0
        with on(2):
            d = dcf.cast(b, dcf.float32) + c
        e = d - a   # on the client
        return {"c": c, "e": (e, [a, b])}, {a: np.arange(4, dtype=np.float32), b: 5}

    got, want = both(build, cluster3)
    assert_same(got, want)
    assert isinstance(got["e"], tuple)


def test_py_func_runs_in_the_process_of_its_worker(cluster3):
    with on(1):
        pid1 = dcf.py_func(lambda: np.int64(os.getpid()), [], dcf.int64)
    with on(2):
        pid2 = dcf.py_func(lambda: np.int64(os.getpid()), [], dcf.int64)
    here = dcf.py_func(lambda: np.int64(os.getpid()), [], dcf.int64)
    with dcf.Session(cluster=cluster3) as sess:
        got = sess.run([pid1, pid2, here])
    pids = cluster3.worker_pids
    assert list(got) == [pids[1], pids[2], os.getpid()]


def test_kernel_error_on_a_worker_raises_the_same_class_naming_op_and_worker(cluster3):
    x = dcf.placeholder(dcf.float32, (None,))
    with on(2):
        y = dcf.reshape(x, [2, 2], name="square")
    with dcf.Session(cluster=cluster3) as sess:
        with pytest.raises(InvalidArgumentError,
                           match=r"Reshape 'square' on /job:worker/task:2/cpu:0"):
            sess.run(y, {x: np.ones(3, np.float32)})
        assert sess.run(y, {x: np.ones(4, np.float32)}).shape == (2, 2)


def test_traces_have_events_from_every_worker(cluster3):
    def body(i, a):
        with on(1):
            a = a + 1.0
        with on(2):
            a = a * 1.0
        return i + 1, a

    with on(0):
        out = dcf.while_loop(lambda i, a: i < 3, body, (0, dcf.constant(0.0)))
    md = dcf.RunMetadata()
    with dcf.Session(cluster=cluster3) as sess:
        sess.run(out, options=dcf.RunOptions(trace=True), run_metadata=md)
    devices = {ev[0] for ev in md.trace}
    assert {task(k) + "/cpu:0" for k in range(3)} <= devices


def test_async_session_runs_on_a_cluster_from_the_callers_loop(cluster3):
    x = dcf.placeholder(dcf.float32, ())
    with on(1):
        y = x * 3.0

    async def main():
        async with dcf.AsyncSession(cluster=cluster3) as sess:
            return await asyncio.gather(*(sess.run(y, {x: float(k)}) for k in range(5)))

    assert asyncio.run(main()) == [0.0, 3.0, 6.0, 9.0, 12.0]


def test_loop_partitions_run_ahead_without_client_round_trips(cluster3):
    """The client only starts and ends the run: the loop's predicate and values move
    between workers directly, and the client sees no data message per iteration."""
    n = 200

    def body(i, a, b):
        with on(1):
            a = a + 1.0
        with on(2):
            b = b + 2.0
        with on(0):
            return i + 1, a, b

    with on(0):
        i0 = dcf.constant(0)
    with on(1):
        a0 = dcf.constant(0.0)
    with on(2):
        b0 = dcf.constant(0.0)

    def cond(i, a, b):
        with on(0):
            return i < n

    out = dcf.while_loop(cond, body, (i0, a0, b0))
    with dcf.Session(cluster=cluster3) as sess:
        sess.run(out)
        before = dict(cluster3._client.transport.stats)
        assert list(sess.run(out)) == [n, n * 1.0, n * 2.0]
        after = cluster3._client.transport.stats
    # three fetches and three "done" messages, plus perhaps a few heartbeats
    assert after["received"] - before["received"] < 20


def test_distinct_rendezvous_keys_per_iteration(cluster3):
    n = 6

    def body(i, a):
        with on(2):
            a = a * 2.0
        return i + 1, a

    with on(1):
        out = dcf.while_loop(lambda i, a: i < n, body, (0, dcf.constant(1.0)))
    with dcf.Session(cluster=cluster3) as sess:
        cluster3._stats(2, record_keys=True)
        assert sess.run(out)[1] == 2.0 ** n
        _, keys = cluster3._stats(2, record_keys=False)
    data = [k for k in keys if not k[1].startswith("!")]
    assert data, "worker 2 received its loop's values as data messages"
    by_edge: dict = {}
    for step, edge, tag in data:
        by_edge.setdefault(edge, []).append((step, tag))
    assert len({s for seen in by_edge.values() for s, _ in seen}) == 1, "one step"
    for edge, seen in by_edge.items():
        tags = [t for _, t in seen]
        assert len(tags) == len(set(tags)), f"{edge}: a key repeated"
        its = sorted(t[-1] for t in tags)
        assert its == list(range(len(its))), f"{edge}: one key per iteration"
    # worker 2 gets `a` in every iteration, the exit one included (dead), and that
    # value drives its part of the loop: no predicate message
    assert not [e for e in by_edge if "LoopCond" in e]
    assert len(by_edge) == 1
    assert len(next(iter(by_edge.values()))) == n + 1


def _tick_file(path: str):
    def tick(v):
        with open(path, "ab") as f:
            f.write(b"x")
        return v
    return tick


@pytest.mark.parametrize("where", [(1, 0), (0, None), (None, 0)])
@pytest.mark.parametrize("compile_frames", [True, False])
def test_a_cancelled_run_stops_on_the_workers_and_the_session_goes_on(cluster3, tmp_path,
                                                                        where, compile_frames):
    from tests.core.test_async_sessions import _ticking_loop, cancel_mid_run

    path = str(tmp_path / "ticks")
    devices = [task(k) if k is not None else "/cpu:0" for k in where]
    n, out = _ticking_loop(devices, _tick_file(path))

    def ticks() -> int:
        return os.path.getsize(path) if os.path.exists(path) else 0

    async def go():
        async with dcf.AsyncSession(cluster=cluster3,
                                    config=dcf.SessionConfig(compile_frames=compile_frames)) \
                as sess:
            await cancel_mid_run(sess, n, out, ticks)
    asyncio.run(go())


@pytest.mark.parametrize("compile_frames", [True, False])
def test_closing_the_session_cancels_the_runs_in_flight_on_the_workers(cluster3, tmp_path,
                                                                       compile_frames):
    from tests.core.test_async_sessions import _ticking_loop, close_mid_run

    path = str(tmp_path / "ticks")
    n, out = _ticking_loop([task(1), "/cpu:0"], _tick_file(path))

    def ticks() -> int:
        return os.path.getsize(path) if os.path.exists(path) else 0

    async def go():
        sess = dcf.AsyncSession(cluster=cluster3,
                                config=dcf.SessionConfig(compile_frames=compile_frames))
        await close_mid_run(sess, n, out, ticks)
    asyncio.run(go())
