"""A loop's accumulation acc + MatMul / acc + Sum(axis 0) on a GPU runs as one call that
updates the accumulator in place after the first iteration (dcf/fusion/accumulate.py).
GPUs here are the cupy stand-in, so the in-place path is the term's own kernel and an
in-place add; tests/gpu checks the cuBLAS and column-sum kernels on a real GPU."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import dcf
from tests.lstm_gradients import lstm_gradients


@pytest.fixture
def fused(fused_accumulations):
    return fused_accumulations


def _data(n=5, b=3, k=4, m=6, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, b, k)).astype(np.float32),
            rng.standard_normal((n, b, m)).astype(np.float32))


def _accumulating_loop(xs, ys, dev="/gpu:0", extra_reader=False):
    """acc = sum_t xs[t]^T @ ys[t] and bias = sum_t ys[t].sum(0), in a while loop."""
    n, _, k = xs.shape
    m = ys.shape[2]
    g = dcf.Graph()
    with g.as_default(), dcf.device(dev):
        X, Y = dcf.constant(xs), dcf.constant(ys)

        def body(i, acc, bias, seen):
            x, y = dcf.gather(X, i), dcf.gather(Y, i)
            if extra_reader:   # the accumulator is read by another op: not fused
                seen = seen + dcf.reduce_sum(acc)
            return (i + 1, acc + dcf.matmul(x, y, transpose_a=True),
                    bias + dcf.reduce_sum(y, axis=0), seen)

        out = dcf.while_loop(lambda i, *_: i < n, body,
                             (0, dcf.zeros([k, m]), dcf.zeros([m]), dcf.constant(0.0)))
    return g, out[1:]


def _reference(xs, ys, extra_reader=False):
    x, y = xs.astype(np.float64), ys.astype(np.float64)
    acc = np.zeros((x.shape[2], y.shape[2]))
    seen = 0.0
    for t in range(len(x)):
        seen += acc.sum() if extra_reader else 0.0
        acc = acc + x[t].T @ y[t]
    return acc, y.sum(axis=(0, 1)), seen


def test_loop_accumulations_update_in_place_and_equal_numpy(fake_gpus, fused):
    xs, ys = _data()
    g, out = _accumulating_loop(xs, ys)
    want = _reference(xs, ys)
    with dcf.Session(graph=g) as sess:
        first = sess.run(out)
        kept = [np.array(v, copy=True) for v in first]
        for got, w in zip(first, want):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
        assert sorted(f.kind for f in fused) == ["colsum", "matmul"]
        # iterations 1..4 of the run wrote in place; iteration 0 made a new array
        assert all(f.in_place == len(xs) - 1 for f in fused)
        second = sess.run(out)
        for got, w in zip(second, want):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
        # the first run's results are not the buffers the second run updated
        for a, b in zip(first, kept):
            np.testing.assert_array_equal(a, b)
        assert all(f.in_place == 2 * (len(xs) - 1) for f in fused)


def test_an_accumulator_read_by_another_op_is_not_updated_in_place(fake_gpus, fused):
    xs, ys = _data(seed=1)
    g, out = _accumulating_loop(xs, ys, extra_reader=True)
    want = _reference(xs, ys, extra_reader=True)
    with dcf.Session(graph=g) as sess:
        got = sess.run(out)
    for a, w in zip(got, want):
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5)
    assert [f.kind for f in fused] == ["colsum"]     # only the bias, which nobody reads


def test_an_inner_loop_accumulates_afresh_in_each_outer_iteration(fake_gpus, fused):
    """The inner loop's first value is the outer loop's running total: it must get a
    new array in every outer iteration (the outer loop keeps its old value)."""
    xs, ys = _data(n=3, seed=2)
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        X, Y = dcf.constant(xs), dcf.constant(ys)

        def outer(j, total, history):
            def inner(i, acc):
                return i + 1, acc + dcf.matmul(dcf.gather(X, i), dcf.gather(Y, i),
                                               transpose_a=True)
            _, acc = dcf.while_loop(lambda i, acc: i < 3, inner, (0, total))
            return j + 1, acc, history + dcf.reduce_sum(total)

        _, total, history = dcf.while_loop(
            lambda j, *_: j < 4, outer, (0, dcf.zeros([4, 6]), dcf.constant(0.0)))
    step = sum(xs[t].astype(np.float64).T @ ys[t] for t in range(3))
    with dcf.Session(graph=g) as sess:
        t, h = sess.run([total, history])
    np.testing.assert_allclose(t, 4 * step, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h, sum(k * step.sum() for k in range(4)), rtol=1e-5, atol=1e-4)
    assert [(f.kind, f.in_place) for f in fused] == [("matmul", 4 * 2)]


def test_a_failing_term_names_the_matmul_frame_and_iteration(fake_gpus):
    xs, ys = _data()
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        k = dcf.placeholder(dcf.int32, [])
        X, Y = dcf.constant(xs), dcf.constant(ys)

        def body(i, acc):
            x = dcf.gather(X, i)[: dcf.where(i < k, 3, 2)]     # fewer rows from k on
            return i + 1, acc + dcf.matmul(x, dcf.gather(Y, i), transpose_a=True,
                                           name="term")

        _, acc = dcf.while_loop(lambda i, acc: i < 5, body, (0, dcf.zeros([4, 6])),
                                name="accloop")
    with dcf.Session(graph=g) as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError) as e:
            sess.run(acc, {k: 2})
    msg = str(e.value)
    assert "term" in msg and "MatMul" in msg and "iteration 2" in msg and "accloop" in msg


def test_the_lstm_weight_and_bias_gradients_are_fused_and_equal_the_cpu(fake_gpus, fused):
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((6, 2, 3)).astype(np.float32)

    cpu = lstm_gradients("/cpu:0", xv, 5)[0]
    assert not fused
    gpu = lstm_gradients("/gpu:0", xv, 5)[0]
    assert sorted(f.kind for f in fused) == ["colsum", "matmul"]
    assert all(f.in_place == 5 for f in fused)
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def _rows_loop(xs, ys, rows=None, dev="/gpu:0"):
    """acc = sum_t xs[t][:rows[t]]^T @ ys[t][:rows[t]] and bias = sum_t ys[t][:rows[t]]
    .sum(0) over a fed number of iterations (all rows where `rows` is None)."""
    n, b, k = xs.shape
    m = ys.shape[2]
    g = dcf.Graph()
    with g.as_default(), dcf.device(dev):
        X, Y = dcf.constant(xs), dcf.constant(ys)
        R = dcf.constant(np.full(n, b, np.int32) if rows is None else np.asarray(rows, np.int32))
        trips = dcf.placeholder(dcf.int32, [])

        def body(i, acc, bias):
            r = dcf.gather(R, i)
            x, y = dcf.gather(X, i)[:r], dcf.gather(Y, i)[:r]
            return (i + 1, acc + dcf.matmul(x, y, transpose_a=True),
                    bias + dcf.reduce_sum(y, axis=0))

        out = dcf.while_loop(lambda i, *_: i < trips, body,
                             (0, dcf.zeros([k, m]), dcf.zeros([m])))
    return g, trips, out[1:]


def _rows_reference(xs, ys, trips, rows=None):
    x, y = xs.astype(np.float64), ys.astype(np.float64)
    r = [x.shape[1]] * trips if rows is None else rows
    acc = sum(x[t, :r[t]].T @ y[t, :r[t]] for t in range(trips))
    return acc, sum(y[t, :r[t]].sum(0) for t in range(trips))


@pytest.mark.parametrize("trips", [1, 2, 16, 17, 40])
def test_terms_are_added_in_chunks_and_when_the_loop_ends(fake_gpus, fused, trips):
    """Iterations 1.. hold their terms; every CHUNK of them is added at once, the rest
    when the loop ends (accumulate.CHUNK terms a chunk)."""
    from dcf.fusion.accumulate import CHUNK

    xs, ys = _data(n=40, b=3, k=16, m=24, seed=5)
    g, trips_ph, out = _rows_loop(xs, ys)
    with dcf.Session(graph=g) as sess:
        got = sess.run(out, {trips_ph: trips})
    for a, w in zip(got, _rows_reference(xs, ys, trips)):
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-4)
    held = trips - 1
    if held:
        assert sorted(f.kind for f in fused) == ["colsum", "matmul"]
        assert all(f.in_place == held for f in fused)
        assert all(f.flushes == -(-held // CHUNK) for f in fused)


def test_a_term_of_another_shape_adds_what_is_held_first(fake_gpus, fused):
    """Rows that change between iterations: each run of equal shapes is one chunk."""
    rows = [3, 3, 3, 2, 2, 3, 1, 1, 1, 3]
    xs, ys = _data(n=len(rows), b=3, k=16, m=24, seed=6)
    g, trips_ph, out = _rows_loop(xs, ys, rows)
    with dcf.Session(graph=g) as sess:
        got = sess.run(out, {trips_ph: len(rows)})
    for a, w in zip(got, _rows_reference(xs, ys, len(rows), rows)):
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-4)
    # held from iteration 1 on: [3, 3] [2, 2] [3] [1, 1, 1] [3]
    assert [f.flushes for f in fused] == [5, 5]


@pytest.mark.asyncio
async def test_runs_in_flight_at_once_each_hold_their_own_terms(fake_gpus, fused):
    """Concurrent runs of one plan interleave their loops' iterations on the event loop:
    each run's terms go to its own accumulator."""
    xs, ys = _data(n=40, b=3, k=16, m=24, seed=7)
    g, trips_ph, out = _rows_loop(xs, ys)
    trips = [40, 3, 25, 17, 1, 33]
    async with dcf.AsyncSession(graph=g) as sess:
        got = await asyncio.gather(*[sess.run(out, {trips_ph: t}) for t in trips])
    for t, res in zip(trips, got):
        for a, w in zip(res, _rows_reference(xs, ys, t)):
            np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-4)
    assert sum(f.in_place for f in fused) == 2 * sum(t - 1 for t in trips)


def test_terms_large_next_to_their_accumulator_are_added_at_once(fake_gpus, fused):
    """Operands over HOLD_SHARE of the weight accumulator's bytes, and column sums of
    over HOLD_ROWS rows: each term is added in its own iteration, none held."""
    from dcf.fusion.accumulate import HOLD_ROWS

    xs, ys = _data(n=6, b=HOLD_ROWS + 1, k=16, m=24, seed=8)
    g, trips_ph, out = _rows_loop(xs, ys)
    with dcf.Session(graph=g) as sess:
        got = sess.run(out, {trips_ph: 6})
    for a, w in zip(got, _rows_reference(xs, ys, 6)):
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-3)
    assert sorted((f.kind, f.in_place, f.flushes) for f in fused) == \
        [("colsum", 5, 0), ("matmul", 5, 0)]


def test_no_chunk_starts_while_device_memory_is_past_its_swap_threshold(fake_gpus, fused):
    """Held terms keep their memory: under a limit, past the swap threshold (here 0,
    always past it), each term is added in its own iteration; under no limit they are
    held. The values are the same."""
    xs, ys = _data(n=20, b=3, k=16, m=24, seed=9)
    want = _rows_reference(xs, ys, 20)

    def run(limit):
        g, trips_ph, out = _rows_loop(xs, ys)
        cfg = dcf.SessionConfig(gpu_memory_limit=limit, swap_threshold=0.0)
        with dcf.Session(graph=g, config=cfg) as sess:
            got = sess.run(out, {trips_ph: 20})
        for a, w in zip(got, want):
            np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-4)
        return [(f.in_place, f.flushes) for f in fused]

    assert run(1 << 30) == [(19, 0), (19, 0)]
    assert run(None) == [(19, 0), (19, 0), (19, 2), (19, 2)]


def test_held_terms_are_added_at_once_when_memory_passes_the_threshold(fake_gpus, fused,
                                                                        monkeypatch):
    """Under a limit the device's use is read at every term: once it is past the swap
    threshold, what is held is added and nothing more is held."""
    from dcf.actors.gpu import GpuDevice
    from dcf.fusion import accumulate

    reads = []
    limit = 1 << 30

    def used_bytes(self):                 # below the threshold for the first two reads
        reads.append(1)
        return 0 if len(reads) <= 2 else limit

    stacked = []
    real_stack = accumulate.stack_rows
    monkeypatch.setattr(GpuDevice, "used_bytes", used_bytes)
    monkeypatch.setattr(accumulate, "stack_rows",
                        lambda xp, xs: stacked.append(len(xs)) or real_stack(xp, xs))
    xs, ys = _data(n=20, b=3, k=16, m=24, seed=10)
    g, trips_ph, out = _rows_loop(xs, ys)
    with dcf.Session(graph=g, config=dcf.SessionConfig(gpu_memory_limit=limit)) as sess:
        got = sess.run(out, {trips_ph: 20})
    for a, w in zip(got, _rows_reference(xs, ys, 20)):
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-4)
    # each accumulation held its iteration-1 term, then added it alone at iteration 2
    assert [(f.in_place, f.flushes) for f in fused] == [(19, 1), (19, 1)]
    assert stacked == []


def test_with_no_limit_no_chunk_starts_past_the_threshold_of_the_device_memory(
        fake_gpus, fused, monkeypatch):
    """No gpu_memory_limit: a chunk starts only below HOLD_DEVICE_SHARE of the device's
    own memory."""
    from dcf.fusion.accumulate import HOLD_DEVICE_SHARE
    from dcf.actors.gpu import GpuDevice

    xs, ys = _data(n=20, b=3, k=16, m=24, seed=11)
    want = _rows_reference(xs, ys, 20)
    g, trips_ph, out = _rows_loop(xs, ys)
    monkeypatch.setattr(GpuDevice, "used_bytes",
                        lambda self: int(HOLD_DEVICE_SHARE * self.total_memory) + 1)
    with dcf.Session(graph=g) as sess:
        got = sess.run(out, {trips_ph: 20})
    for a, w in zip(got, want):
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-4)
    assert [(f.in_place, f.flushes) for f in fused] == [(19, 0), (19, 0)]


@pytest.mark.parametrize("draw", range(10))
def test_lstm_gradients_with_held_terms_equal_the_cpu(fake_gpus, fused, draw):
    """Drawn LSTMs (1-40 steps, batch 1-6, 8-64 units, 1-2 layers on one or two GPUs,
    parallel_iterations 1-32, one or two runs a session): the gradients equal the CPU's."""
    import random

    rng = random.Random(draw)
    steps, batch, units = rng.randint(1, 40), rng.randint(1, 6), rng.choice([8, 16, 32, 64])
    layers, runs, pi = rng.choice([1, 2]), rng.choice([1, 2]), rng.choice([1, 4, 32])
    devs = "/gpu:0" if layers == 1 or rng.random() < 0.5 else ["/gpu:0", "/gpu:1"]
    xv = np.random.default_rng(draw).standard_normal(
        (steps, batch, rng.randint(2, 12))).astype(np.float32)
    cpu = lstm_gradients("/cpu:0", xv, units, layers=layers, runs=runs, parallel_iterations=pi)
    gpu = lstm_gradients(devs, xv, units, layers=layers, runs=runs, parallel_iterations=pi)
    for run_cpu, run_gpu in zip(cpu, gpu):
        for a, b in zip(run_cpu, run_gpu):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(a).max()))
    if steps > 2:           # iterations 1.. of each backward loop held their terms
        assert all(f.flushes for f in fused) and list(fused)
