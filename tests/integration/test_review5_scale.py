"""Review by use, round 5, at scale: graphs thousands of ops long or loops nested past
Python's limits, and sessions let go of without close() in a long-lived process. Values
are checked against closed forms and numpy."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time

import numpy as np
import pytest

import dcf


def _wait_for(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


# ------------------------------------------------------------- deep graphs
def test_gradients_of_a_chain_of_thousands_of_ops():
    # gradients() walked the graph recursively: past ~1000 ops in a chain it raised
    # RecursionError (TF1 differentiates such a chain)
    n = 2500
    x = dcf.placeholder(dcf.float64, shape=[3])
    y = x
    for _ in range(n):
        y = dcf.sin(y)
    (gx,) = dcf.gradients(dcf.reduce_sum(y), [x])
    xv = np.array([0.1, 0.5, 1.0])
    value, deriv = xv.copy(), np.ones(3)
    for _ in range(n):      # d/dx sin^n(x) = prod cos(sin^k(x))
        deriv *= np.cos(value)
        value = np.sin(value)
    with dcf.Session() as sess:
        got_y, got_g = sess.run([y, gx], {x: xv})
    np.testing.assert_allclose(got_y, value, rtol=1e-12)
    np.testing.assert_allclose(got_g, deriv, rtol=1e-10)


@pytest.mark.parametrize("grad", [False, True])
def test_loops_nested_deeper_than_pythons_limit_on_nested_blocks(grad):
    # the frame compiler emitted one Python block per nested loop: 21 nested loops were a
    # SyntaxError ("too many statically nested blocks") at the first run
    depth = 22
    x = dcf.placeholder(dcf.float64, shape=[])

    def nest(k, v):
        if k == 0:
            return v * 1.5
        return dcf.while_loop(lambda i, w: i < 1, lambda i, w: (i + 1, nest(k - 1, w)),
                              [0, v])[1]

    out = nest(depth, x)
    fetch = dcf.gradients(out, [x])[0] if grad else out
    with dcf.Session() as sess:
        assert sess.run(fetch, {x: 2.0}) == (1.5 if grad else 3.0)


def test_a_control_scope_of_thousands_of_ops_is_walked_once(monkeypatch):
    # each op built in `control_dependencies(ops)` (and dcf.group(*ops)) deduplicated the
    # scope's ops against a list: n^2/2 comparisons per op, 76 s for 20 ops in a scope of
    # 20k (TF1: 21 s); now a dict. Counted here as comparisons between ops, not as time.
    n = 2000
    x = dcf.placeholder(dcf.float32, shape=[])
    ops = [(x + float(i)).op for i in range(n)]
    comparisons = [0]

    def counted_eq(self, other):
        comparisons[0] += 1
        return self is other

    monkeypatch.setattr(dcf.Operation, "__eq__", counted_eq)
    grouped = dcf.group(*ops)
    with dcf.control_dependencies(ops[: n // 2]), dcf.control_dependencies(ops[n // 2:] + ops[:5]):
        y = dcf.identity(x)
    assert comparisons[0] < 10 * n
    assert grouped.control_inputs == ops
    assert y.op.control_inputs == ops[n // 2:] + ops[: n // 2]
    with dcf.Session() as sess:
        assert sess.run([grouped, y], {x: 2.0})[1] == 2.0


# ------------------------------------------------- long chains on a GPU
@pytest.fixture
def stand_in_gpu():
    from dcf.gpu_devices import stand_in_gpus as _stand_in_gpus

    with _stand_in_gpus(1) as cp:
        yield cp


def test_a_chain_of_thousands_of_elementwise_ops_on_a_gpu(stand_in_gpu):
    # planning its elementwise fusion recursed once per op of the chain: RecursionError
    # (on a real GPU too, where the chain would have been one kernel)
    n = 500
    x = dcf.placeholder(dcf.float32, shape=[4])
    with dcf.device("/gpu:0"):
        y = x
        for _ in range(n):
            y = dcf.tanh(y) * 1.0001 + 0.001
    xv = np.linspace(-1, 1, 4).astype(np.float32)
    ref = xv.copy()
    for _ in range(n):
        ref = np.tanh(ref) * np.float32(1.0001) + np.float32(0.001)
    with dcf.Session() as sess:
        np.testing.assert_allclose(sess.run(y, {x: xv}), ref, rtol=1e-5)


def test_a_fused_kernel_stays_small_where_its_ops_repeat_their_input(stand_in_gpu,
                                                                      monkeypatch):
    # Square is "({0} * {0})": a chain of 20 of them fused into one expression of ~8M
    # characters (26 of them hung compiling it on an H200); fused trees are now bounded
    from dcf.fusion import elementwise

    expressions = []
    plan_groups = elementwise.fusion_groups

    def spy(*args, **kw):
        groups = plan_groups(*args, **kw)
        expressions.extend(e for _, _, e, _ in groups.values())
        return groups

    monkeypatch.setattr(elementwise, "fusion_groups", spy)
    x = dcf.placeholder(dcf.float32, shape=[4])
    with dcf.device("/gpu:0"):
        y = x
        for _ in range(20):
            y = dcf.square(y)
    xv = np.array([0.999, 0.9995, 0.9999, 1.0], np.float32)
    ref = xv.copy()
    for _ in range(20):
        ref = ref * ref
    with dcf.Session() as sess:
        np.testing.assert_allclose(sess.run(y, {x: xv}), ref, rtol=1e-4)
    assert expressions, "the chain was planned for fusion"
    assert max(map(len, expressions)) < 20_000


# ------------------------------------------- sessions let go of unclosed
def _loop_threads():
    return [t for t in threading.enumerate() if t.name == "dcf-session-loop"]


def test_an_unclosed_session_lets_go_of_its_loop_thread():
    # a Session used from a running event loop drives its actors on a thread of its own;
    # let go of without close(), that thread (and its loop's descriptors) stayed forever
    x = dcf.placeholder(dcf.float32, shape=[])
    y = x * 2.0
    before = len(_loop_threads())

    async def serve():
        for _ in range(5):
            sess = dcf.Session()
            assert sess.run(y, {x: 1.5}, options=dcf.RunOptions(trace=True)) == 3.0
        del sess

    asyncio.run(serve())
    gc.collect()
    assert _wait_for(lambda: len(_loop_threads()) <= before), _loop_threads()


def test_unclosed_sessions_leave_no_file_descriptors_behind():
    # each Session let go of unclosed kept its private event loop's descriptors (uvloop's
    # loops are not closed by the garbage collector): a service leaked ~7 per request
    x = dcf.placeholder(dcf.float32, shape=[])
    y = x + 1.0
    dcf.Session().run(y, {x: 1.0}, options=dcf.RunOptions(trace=True))
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        assert dcf.Session().run(y, {x: 1.0}, options=dcf.RunOptions(trace=True)) == 2.0
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 2


# ------------------------------------------------------------------ clusters
@pytest.fixture(scope="module")
def cluster1():
    with dcf.Cluster.local(1) as cluster:
        yield cluster


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_a_cluster_run_returns_the_structure_of_its_own_fetches(cluster1):
    # the plan cached with the first run's structure ({'a': x}) was used to pack the
    # values of every later run with the same tensors ([x], x)
    with dcf.device("/job:worker/task:0/cpu:0"):
        x = dcf.constant(1.0) + 1.0
    with dcf.Session(cluster=cluster1) as sess:
        assert sess.run({"a": x}) == {"a": 2.0}
        assert sess.run([x]) == [2.0]
        assert sess.run((x, x)) == (2.0, 2.0)
        assert sess.run(x) == 2.0


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_an_unclosed_cluster_session_releases_its_partitions_on_the_workers(cluster1):
    # as a TensorFlow session collected unclosed: its workers drop what it shipped them
    with dcf.device("/job:worker/task:0/cpu:0"):
        y = dcf.constant(2.0) * 3.0
    for _ in range(5):
        assert dcf.Session(cluster=cluster1).run(y) == 6.0
    gc.collect()
    assert _wait_for(lambda: cluster1._stats(0)[0]["plans"] == 0), cluster1._stats(0)[0]
