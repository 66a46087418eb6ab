"""The GPU runtime: placement and transfers, mixed CPU/GPU loops, memory budget and
swapping, traces with one track per stream (dcf/actors/gpu.py, gpu_swap.py and
gpu_actor.py)."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf import nn
from dcf.errors import ResourceExhaustedError


def _gpu():
    from dcf.actors.gpu import GpuDevice

    return GpuDevice.get(0)


def _run(fetches, feed=None, config=None, init=False):
    with dcf.Session(config=config) as sess:
        if init:
            sess.run(dcf.global_variables_initializer())
        return sess.run(fetches, feed)


def _close(a, b, tol=1e-5):
    for x, y in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol * max(1.0, float(np.abs(y).max(
            initial=0.0))))


# ------------------------------------------------------------------ basics
def test_matmul_runs_on_the_gpu_and_fetches_numpy(rng):
    a, b = rng.standard_normal((64, 32)), rng.standard_normal((32, 16))
    before = _gpu().stats["h2d_bytes"]
    with dcf.device("/gpu:0"):
        y = dcf.matmul(dcf.constant(a), dcf.constant(b))
        s = dcf.reduce_sum(y)
    got, total = _run([y, s])
    assert type(got) is np.ndarray and isinstance(total, np.generic)
    np.testing.assert_allclose(got, a @ b, rtol=1e-10)
    assert _gpu().stats["h2d_bytes"] > before          # the constants went to the device


def test_a_device_array_can_be_fed_directly(rng):
    from dcf import gpu_devices

    cp = gpu_devices.backend()
    xv = rng.standard_normal((8, 8)).astype(np.float32)
    with dcf.device("/gpu:0"):
        x = dcf.placeholder(dcf.float32, [8, 8])
        y = dcf.tanh(x) * 2.0
    np.testing.assert_allclose(_run(y, {x: cp.asarray(xv)}), np.tanh(xv) * 2, rtol=1e-6)


def test_integer_loop_counters_stay_on_the_host(rng):
    """A loop whose counter and predicate live on the GPU device runs without the host
    waiting on the GPU: int scalars are host-memory values (as TF keeps int32)."""
    w = rng.standard_normal((16, 16)) * 0.1
    with dcf.device("/gpu:0"):
        _, x = dcf.while_loop(lambda i, x: i < 20, lambda i, x: (i + 1, dcf.tanh(x @ w)),
                              (0, dcf.constant(np.eye(16))))
    want = np.eye(16)
    for _ in range(20):
        want = np.tanh(want @ w)
    np.testing.assert_allclose(_run(x), want, rtol=1e-10)


def test_a_predicate_computed_from_device_data(rng):
    with dcf.device("/gpu:0"):
        _, x = dcf.while_loop(lambda i, x: dcf.reduce_sum(x) < 100.0,
                              lambda i, x: (i + 1, x * 1.5), (0, dcf.ones([4, 4])))
    want = np.ones((4, 4))
    while want.sum() < 100:
        want = want * 1.5
    np.testing.assert_allclose(_run(x), want, rtol=1e-6)


# ------------------------------------------------------------ mixed placement
def test_mixed_cpu_and_gpu_placement_inside_one_loop(rng):
    """Each iteration crosses devices four times: GPU matmul, CPU py_func, CPU tanh,
    GPU add; the loop's control state machines run on both."""
    w = rng.standard_normal((8, 8)) * 0.3
    calls = []

    def host_scale(v):
        assert isinstance(v, np.ndarray)      # py_func inputs are host values
        calls.append(1)
        return v * 0.5

    def build(gpu):
        g = dcf.Graph()
        with g.as_default():
            def body(i, x):
                with dcf.device("/gpu:0" if gpu else "/cpu:0"):
                    y = x @ w
                z = dcf.py_func(host_scale, [y], dcf.float64)
                z = dcf.reshape(z, [8, 8])
                with dcf.device("/cpu:0"):
                    z = dcf.tanh(z)
                with dcf.device("/gpu:0" if gpu else "/cpu:0"):
                    return i + 1, z + x * 0.1
            with dcf.device("/gpu:0" if gpu else "/cpu:0"):
                _, out = dcf.while_loop(lambda i, x: i < 7, body,
                                        (0, dcf.constant(np.eye(8))), parallel_iterations=4)
        return g, out

    g, out = build(False)
    with dcf.Session(g) as s:
        want = s.run(out)
    g, out = build(True)
    with dcf.Session(g) as s:
        got = s.run(out)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert len(calls) == 14


def test_rnn_with_the_cell_on_gpu_and_the_loss_on_cpu(rng):
    xv = rng.standard_normal((5, 4, 3)).astype(np.float32)

    def build(cell_dev):
        g = dcf.Graph()
        with g.as_default():
            x = dcf.placeholder(dcf.float32, [5, 4, 3])
            with dcf.device(cell_dev):
                cell = nn.LSTMCell(6, name="cell")
                out, st = nn.dynamic_rnn(cell, x, dtype=dcf.float32, time_major=True)
            with dcf.device("/cpu:0"):
                loss = dcf.reduce_sum(out * out) + dcf.reduce_sum(st.c)
            grads = dcf.gradients(loss, cell.variables)
            init = dcf.global_variables_initializer()
        return g, x, [loss] + grads, init

    res = []
    for dev in ("/cpu:0", "/gpu:0"):
        g, x, f, init = build(dev)
        with dcf.Session(g) as s:
            s.run(init)
            res.append(s.run(f, {x: xv}))
    _close(res[1], res[0], 1e-4)


def test_two_gpus_in_one_loop(rng, gpu_count):
    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    w0, w1 = rng.standard_normal((32, 32)) * 0.2, rng.standard_normal((32, 32)) * 0.2

    def build(d0, d1):
        g = dcf.Graph()
        with g.as_default():
            def body(i, a, b):
                with dcf.device(d0):
                    a2 = dcf.tanh(a @ w0)
                with dcf.device(d1):
                    b2 = dcf.tanh(b @ w1 + a2)
                return i + 1, a2, b2
            with dcf.device(d0):
                r = dcf.while_loop(lambda i, a, b: i < 10, body,
                                   (0, dcf.constant(np.eye(32)), dcf.constant(np.eye(32))))
        return g, r[2]

    outs = []
    for devs in (("/cpu:0", "/cpu:0"), ("/gpu:0", "/gpu:1")):
        g, out = build(*devs)
        with dcf.Session(g) as s:
            outs.append(s.run(out))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-9)


# ------------------------------------------------------------ memory & swap
B, U, D, T = 128, 128, 16, 40


def _lstm_step(swap, forward_only=False, seed=0):
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        x = dcf.placeholder(dcf.float32, [T, B, D])
        cell = nn.LSTMCell(U, name="cell")
        _, st = nn.dynamic_rnn(cell, x, dtype=dcf.float32, time_major=True,
                               swap_memory=swap)
        loss = dcf.reduce_sum(st.h)     # (outputs unused: saved values dominate memory)
        fetch = [loss] if forward_only else [loss] + dcf.gradients(loss, cell.variables)
        init = dcf.global_variables_initializer()
    xv = np.random.default_rng(seed).standard_normal((T, B, D)).astype(np.float32)
    return g, fetch, {x: xv}, init


def _run_lstm(swap, config=None, forward_only=False):
    g, fetch, feed, init = _lstm_step(swap, forward_only)
    with dcf.Session(g, config=config) as s:
        s.run(init)
        return s.run(fetch, feed)


def _in_use() -> int:
    import gc

    gc.collect()
    gpu = _gpu()
    gpu.collect()
    gpu.activate()
    gpu.pool.free_all_blocks()
    return gpu.used_bytes()


def _peak_bytes(fn):
    """fn()'s result and the high-water mark of live device bytes while it ran."""
    gpu = _gpu()
    _in_use()
    with gpu.peak_tracker() as t:
        out = fn()
    return out, t.peak


def test_the_peak_tracker_counts_the_blocks_of_its_own_gpu(gpu_count):
    """Each GPU's tracker sees its own device's blocks only, whichever GPU allocated
    first in the process (cupy 14 gives every device's pool the id of the device current
    at the first allocation, so the hooks' device_id names one GPU for all)."""
    from dcf import gpu_devices
    from dcf.actors.gpu import GpuDevice

    if gpu_count < 2 or gpu_devices.is_fake():
        pytest.skip("needs two real GPUs (the stand-in's tracker reads its pool's total)")
    cp = gpu_devices.backend()
    for mine, other in ((0, 1), (1, 0)):
        g = GpuDevice.get(mine)
        with g.peak_tracker() as t:
            start = t.cur
            with cp.cuda.Device(other):
                big = cp.empty(64 << 20, np.uint8)       # another GPU's: not counted
            with cp.cuda.Device(mine):
                small = cp.empty(8 << 20, np.uint8)
            del big, small
        assert (8 << 20) <= t.peak - start < (64 << 20), (mine, t.peak - start)


def test_swap_on_and_off_give_identical_gradients():
    stats = _gpu().stats
    plain = _run_lstm(False)
    before = stats["swap_out_bytes"], stats["swap_in_bytes"]
    swapped = _run_lstm(True, dcf.SessionConfig(swap_threshold=0.0))
    assert stats["swap_out_bytes"] > before[0]          # values did go to the host
    assert stats["swap_in_bytes"] > before[1]           # and came back
    for a, b in zip(plain, swapped):
        np.testing.assert_array_equal(a, b)              # bit for bit


def test_inference_only_runs_never_swap():
    stats = _gpu().stats
    before = stats["swap_out_bytes"]
    _run_lstm(True, dcf.SessionConfig(swap_threshold=0.0), forward_only=True)
    assert stats["swap_out_bytes"] == before


def test_a_budget_that_fails_without_swap_fits_with_swap(monkeypatch):
    from dcf.fusion import accumulate

    base = _in_use()
    # the reference peak with each gradient term added in its own iteration: terms held
    # for a chunk (dcf/fusion/accumulate.py) raise a run's peak where no limit is set,
    # but no chunk starts past the swap threshold of a limit, as in the runs below
    with monkeypatch.context() as m:
        m.setattr(accumulate, "CHUNK", 1)
        want, peak = _peak_bytes(lambda: _run_lstm(False))
    # the live high-water mark counts garbage that a collection under pressure frees:
    # find the largest budget the no-swap run cannot meet (the swap run's live bytes at
    # the start of the backward loop -- weights, the input, the outputs' TensorArray,
    # the entries being fetched back -- came within 2-4% of a budget at share 0.5 on
    # H200 machines, where the test failed in most runs of 2026-11-26c)
    fitted = []
    for share in (0.8, 0.65, 0.5, 0.35, 0.25, 0.18):
        budget = base + int((peak - base) * share)
        try:
            _, used = _peak_bytes(
                lambda: _run_lstm(False, dcf.SessionConfig(gpu_memory_limit=budget)))
            fitted.append((budget, used))
        except ResourceExhaustedError as e:
            msg = str(e)
            del e       # its traceback holds the failed run's device arrays
            break
    else:
        pytest.fail(f"the no-swap run fit every budget down to {budget:,} bytes "
                    f"(peak {peak:,}, base {base:,}; (budget, its peak): {fitted})")
    assert "/gpu:0" in msg and "'" in msg and "gpu_memory_limit" in msg   # names the op
    _in_use()
    before = _gpu().stats["swap_out_bytes"]
    got, peak_swap = _peak_bytes(
        lambda: _run_lstm(True, dcf.SessionConfig(gpu_memory_limit=budget, swap_threshold=0.05)))
    assert peak_swap <= budget
    assert _gpu().stats["swap_out_bytes"] > before
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    _run_lstm(False, dcf.SessionConfig())            # lifts the limit for later tests


def test_resource_exhausted_names_the_op(rng):
    with dcf.device("/gpu:0"):
        a = dcf.placeholder(dcf.float32, [512, 512])
        y = dcf.matmul(a, a, name="big_product")
    limit = _in_use() + 1_500_000           # the 1 MB feed fits, its product does not
    with pytest.raises(ResourceExhaustedError, match="MatMul 'big_product'"):
        _run(y, {a: rng.standard_normal((512, 512)).astype(np.float32)},
             config=dcf.SessionConfig(gpu_memory_limit=limit))
    _run(y, {a: np.zeros((512, 512), np.float32)}, config=dcf.SessionConfig())


def test_resource_exhausted_by_a_feed_names_the_fed_tensor():
    big = dcf.placeholder(dcf.float32, [None], name="big_in")
    with dcf.device("/gpu:0"):
        y = big * 2.0
    limit = _in_use() + 1_000_000           # a 4 MB feed does not fit
    with pytest.raises(ResourceExhaustedError, match="feed of tensor 'big_in:0'"):
        _run(y, {big: np.ones(1 << 20, np.float32)},
             config=dcf.SessionConfig(gpu_memory_limit=limit))
    _run(y, {big: np.ones(4, np.float32)}, config=dcf.SessionConfig())


# --------------------------------------------------------------------- trace
def test_trace_has_a_track_per_stream(tmp_path):
    g, fetch, feed, init = _lstm_step(True)
    md = dcf.RunMetadata()
    with dcf.Session(g, config=dcf.SessionConfig(swap_threshold=0.0)) as s:
        s.run(init)
        s.run(fetch, feed, options=dcf.RunOptions(trace=True), run_metadata=md)
    tracks = {e[7] for e in md.trace if e[0] == "/gpu:0"}
    assert {"compute", "h2d", "d2h"} <= tracks
    assert all(len(e) == 8 and e[5] <= e[6] for e in md.trace)
    kernels = [e for e in md.trace if e[7] == "compute"]
    assert any(e[2] == "MatMul" and e[4] >= 0 for e in kernels)   # op, type, frame, it
    md.write_trace(str(tmp_path / "t.json"))
    dcf.trace.plot(md, str(tmp_path / "t.png"))


# ------------------------------------------------------------ fused kernels
def test_fused_lstm_gates_match_the_generic_kernels(rng):
    from dcf import gpu_devices
    from dcf.ops import rnn_ops

    cp = gpu_devices.backend()
    for dt, tol in ((np.float32, 1e-6), (np.float64, 1e-13)):
        z = cp.asarray(rng.standard_normal((7, 4 * 5)).astype(dt))
        c = cp.asarray(rng.standard_normal((7, 5)).astype(dt))
        fused = rnn_ops._gates_gpu(cp, z, c, forget_bias=1.0)
        plain = rnn_ops._gates(cp, z, c, forget_bias=1.0)
        for a, b in zip(fused, plain):
            np.testing.assert_allclose(a.get(), b.get(), rtol=tol, atol=tol)
        dc = cp.asarray(rng.standard_normal((7, 5)).astype(dt))
        dh = cp.asarray(rng.standard_normal((7, 5)).astype(dt))
        fused = rnn_ops._gates_grad_gpu(cp, c, plain[2], plain[0], dc, dh)
        ref = rnn_ops._gates_grad(cp, c, plain[2], plain[0], dc, dh)
        for a, b in zip(fused, ref):
            np.testing.assert_allclose(a.get(), b.get(), rtol=tol, atol=tol)


def test_training_on_gpu_matches_cpu(rng):
    xv = rng.standard_normal((32, 10)).astype(np.float32)
    yv = rng.standard_normal((32, 1)).astype(np.float32)

    def train(dev):
        g = dcf.Graph()
        with g.as_default(), dcf.device(dev):
            x = dcf.placeholder(dcf.float32, [32, 10])
            y = dcf.placeholder(dcf.float32, [32, 1])
            h = nn.dense(x, 16, activation=dcf.tanh, name="h")
            p = nn.dense(h, 1, name="p")
            loss = dcf.reduce_mean((p - y) * (p - y))
            step = dcf.train.AdamOptimizer(0.01).minimize(loss)
            init = dcf.global_variables_initializer()
        with dcf.Session(g) as s:
            s.run(init)
            for _ in range(5):
                s.run(step, {x: xv, y: yv})
            return s.run(loss, {x: xv, y: yv})

    np.testing.assert_allclose(train("/gpu:0"), train("/cpu:0"), rtol=1e-4)


# ------------------------------------------------------------------ work in flight
def test_overlapping_sessions_with_different_budgets_run_under_the_strictest():
    """One process has one memory pool per GPU: while steps of two sessions with
    different memory settings overlap, both run under the smaller limit and threshold
    (neither goes over its own budget); a step alone runs under its own settings, and
    a budget lifts once the step that brought it ends."""
    import asyncio
    import time

    gpu = _gpu()
    small = 300 << 20
    a_cfg = dcf.SessionConfig(gpu_memory_limit=small, swap_threshold=0.9)
    b_cfg = dcf.SessionConfig(swap_threshold=0.5)
    seen: dict = {"a": [], "b": []}
    a_running = [False]

    def watcher(name, sleep):
        def f(x):
            time.sleep(sleep)
            seen[name].append((gpu.limit, gpu.swap_threshold, a_running[0]))
            return x
        return f

    ga = dcf.Graph()
    with ga.as_default():
        def body(i, x):
            with dcf.device("/gpu:0"):
                y = x * 1.0
            y = dcf.reshape(dcf.py_func(watcher("a", 0.002), [y], dcf.float32), [4])
            return i + 1, y
        _, out_a = dcf.while_loop(lambda i, x: i < 40, body, (0, dcf.constant(np.ones(4, np.float32))),
                                  parallel_iterations=1)
    gb = dcf.Graph()
    with gb.as_default():
        with dcf.device("/gpu:0"):
            yb = dcf.constant(np.ones(4, np.float32)) * 2.0
        out_b = dcf.py_func(watcher("b", 0.0), [yb], dcf.float32)

    async def main():
        sa = dcf.AsyncSession(ga, config=a_cfg)
        sb = dcf.AsyncSession(gb, config=b_cfg)
        try:
            async def run_a():
                a_running[0] = True
                try:
                    return await sa.run(out_a)
                finally:
                    a_running[0] = False

            async def run_b_during_a():
                while len(seen["a"]) < 5:                 # A's loop is under way
                    await asyncio.sleep(0.001)
                return await sb.run(out_b)

            got_a, got_b = await asyncio.gather(run_a(), run_b_during_a())
            np.testing.assert_array_equal(got_a, np.ones(4))
            np.testing.assert_array_equal(got_b, 2 * np.ones(4))
            await sb.run(out_b)                           # B alone
            await sa.run(out_a)                           # A alone
        finally:
            await sa.close()
            await sb.close()

    asyncio.run(main())
    b_during, b_alone = seen["b"]
    assert b_during == (small, 0.5, True)                 # overlapping: the strictest
    assert b_alone == (None, 0.5, False)                  # alone: its own
    a_first = seen["a"][:40]
    assert all(lim == small for lim, _, _ in a_first)     # A never over its budget
    assert {thr for _, thr, _ in a_first} <= {0.5, 0.9} and (small, 0.9, True) in a_first
    assert all(s == (small, 0.9, False) for s in seen["a"][40:])   # A alone again


def test_a_gpu_that_fails_to_start_a_step_leaves_no_settings_counted(monkeypatch, gpu_count):
    """A step over two GPUs whose second GPU fails to start it (its settings could not be
    applied) fails with that error, and neither GPU keeps the step's memory settings
    counted -- else a later step alone would run under a budget nobody holds; the next
    run works."""
    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    from dcf.actors.gpu import GpuDevice

    g0, g1 = GpuDevice.get(0), GpuDevice.get(1)
    g = dcf.Graph()
    with g.as_default():
        with dcf.device("/gpu:0"):
            a = dcf.constant(np.arange(4, dtype=np.float32)) * 2.0
        with dcf.device("/gpu:1"):
            b = a + 1.0
    cfg = dcf.SessionConfig(gpu_memory_limit=256 << 20, swap_threshold=0.7)
    with dcf.Session(g, config=cfg) as sess:
        np.testing.assert_array_equal(sess.run(b), np.arange(4) * 2.0 + 1.0)
        assert not g0._steps and not g1._steps

        def refuse():
            raise RuntimeError("no settings for you")
        monkeypatch.setattr(g1, "_apply_settings", refuse)
        with pytest.raises(RuntimeError, match="no settings for you"):
            sess.run(b)
        assert not g0._steps and not g1._steps
        monkeypatch.undo()
        np.testing.assert_array_equal(sess.run(b), np.arange(4) * 2.0 + 1.0)
        assert not g0._steps and not g1._steps


def test_each_step_restarts_the_swapper_once(monkeypatch):
    """A step starts with the GPU's swapper reset once, whether its session's settings
    change the GPU's (configure() resets it: steps of two sessions taking turns) or not
    (a session's steps one after another)."""
    from dcf.actors import gpu_swap as S

    resets = []
    orig = S._Swapper.reset

    def counted(self):
        resets.append(self.gpu.index)
        return orig(self)
    monkeypatch.setattr(S._Swapper, "reset", counted)
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        y = dcf.constant(np.arange(3, dtype=np.float32)) * 3.0
    a = dcf.Session(g, config=dcf.SessionConfig(gpu_memory_limit=200 << 20,
                                                 swap_threshold=0.6))
    b = dcf.Session(g, config=dcf.SessionConfig(swap_threshold=0.8))
    try:
        a.run(y)
        b.run(y)                                  # (each session's first run makes its actor)
        for sess in (a, b, a, b, b, a, a):
            resets.clear()
            np.testing.assert_array_equal(sess.run(y), np.arange(3) * 3.0)
            assert resets == [0]
    finally:
        a.close()
        b.close()


def test_recorded_events_are_reused_only_once_nothing_holds_them(monkeypatch):
    """GpuDevice.record re-records an event it made before only when nothing but its pool
    holds it: an event someone keeps (to wait on or query) is never recorded again
    under them, and the pool stops growing at EVENT_POOL; traces get new events with
    timing."""
    from dcf.actors import gpu as G

    gpu = _gpu()
    gpu.activate()
    s = gpu.d2h                          # (compute's last event is held as last_compute)
    gpu._events.clear()
    made = []
    real = gpu.cp.cuda.Event

    def event(*a, **k):
        made.append(k.get("disable_timing"))
        return real(*a, **k)
    monkeypatch.setattr(gpu.cp.cuda, "Event", event)

    first = gpu.record(s)
    first_id = id(first)
    del first                            # idle now: the next record takes it again
    assert id(gpu.record(s)) == first_id and len(made) == 1
    kept = [gpu.record(s) for _ in range(3)]
    kept_ids = {id(e) for e in kept}
    n = 3 * G.EVENT_POOL
    for _ in range(n):
        e = gpu.record(s)
        assert id(e) not in kept_ids
    del e
    assert len(made) == len(gpu._events) <= G.EVENT_POOL     # every one made is pooled,
    assert len(made) < n // 4                                # and reused, not made per record
    assert set(made) == {True}
    gpu.tracing = True
    try:
        traced = gpu.record(s)
    finally:
        gpu.tracing = False
    assert made[-1] is False and all(e is not traced for e in gpu._events)
    del kept, traced
    gpu._events.clear()


@pytest.mark.parametrize("pi", [1, 3, 8, 10, 32])
def test_a_gpu_loop_keeps_at_most_parallel_iterations_in_flight(monkeypatch, pi):
    """The compiled loop bounds the GPU work it has enqueued but not seen finish by
    waiting for events it records on the compute stream: stand-in events that finish
    only once the host waits for them show how far it runs ahead -- never more than
    parallel_iterations, and (with a predicate on the host) at least half of it."""
    from dcf import frame_compiler

    started = [0]          # iterations whose body has been enqueued
    done_upto = [0]        # iterations the "GPU" has finished
    in_flight: list = []

    class Ev:
        def __init__(self, upto):
            self.upto = upto
            self.asked = False

        @property
        def done(self):
            if not self.asked:           # the first look finds it running
                self.asked = True
                return False
            done_upto[0] = max(done_upto[0], self.upto)
            return True

        def synchronize(self):
            done_upto[0] = max(done_upto[0], self.upto)

        def query(self):
            return self.done

    def marker(gpus):
        def mark():
            in_flight.append(started[0] - done_upto[0])
            return [Ev(started[0]) for _ in gpus]
        return mark

    monkeypatch.setattr(frame_compiler, "_marker", marker)

    def count(i):
        started[0] += 1
        return i

    n = 40
    g = dcf.Graph()
    with g.as_default():
        def body(i, x):
            j = dcf.reshape(dcf.py_func(count, [i], dcf.int32), [])
            with dcf.device("/gpu:0"):
                return j + 1, dcf.tanh(x @ dcf.constant(np.eye(4) * 0.5))
        with dcf.device("/gpu:0"):
            _, out = dcf.while_loop(lambda i, x: i < n, body, (0, dcf.constant(np.ones((4, 4)))),
                                    parallel_iterations=pi)
    with dcf.Session(g) as s:
        got = s.run(out)
    want = np.ones((4, 4))
    for _ in range(n):
        want = np.tanh(want @ (np.eye(4) * 0.5))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert started[0] == n and in_flight
    assert max(in_flight) <= pi
    assert max(in_flight) >= max(1, (pi + 1) // 2)


def _chain_across_gpus(K: int, n: int, seed: int) -> tuple:
    """a <- tanh(a @ w) on /gpu:0 and b <- b / 2 + a on /gpu:1, n iterations, 8 in
    flight: each iteration's a ([K, K] float32) is copied to /gpu:1. The graph, its two
    outputs, and numpy's float64 values of them."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((K, K)) / np.sqrt(K)).astype(np.float32)
    s0 = (rng.standard_normal((K, K)) * 0.1).astype(np.float32)
    g = dcf.Graph()
    with g.as_default():
        with dcf.device("/gpu:0"):
            a0 = dcf.constant(s0)
        with dcf.device("/gpu:1"):
            b0 = dcf.constant(np.zeros_like(s0))

        def body(i, a, b):
            with dcf.device("/gpu:0"):
                a2 = dcf.tanh(dcf.matmul(a, dcf.constant(w)))
            with dcf.device("/gpu:1"):
                b2 = b * 0.5 + a2           # a2 crosses to /gpu:1
            return i + 1, a2, b2
        _, a_out, b_out = dcf.while_loop(lambda i, a, b: i < n, body, (0, a0, b0),
                                         parallel_iterations=8)
    a, b = s0.astype(np.float64), np.zeros_like(s0, np.float64)
    for _ in range(n):
        a = np.tanh(a @ w)
        b = b * 0.5 + a
    return g, a_out, b_out, a, b


def test_large_peer_copies_land_in_recycled_buffers_and_stay_right(gpu_count):
    """A value of >= LANDING_MIN_BYTES going from /gpu:0 to /gpu:1 every iteration, with
    iterations in flight: the copies reuse landing buffers (on the h2d stream) and every
    iteration's result equals numpy's. Real cupy with two GPUs only (the stand-in has no
    UnownedMemory)."""
    from dcf.actors import gpu as G

    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    g1 = G.GpuDevice.get(1)
    if g1._landing is None:
        pytest.skip("the cupy stand-in cannot wrap memory")
    g, a_out, b_out, a, b = _chain_across_gpus(1536, 12, 7)   # 9 MiB of float32 per copy
    before = g1.stats["landing_reused"]
    with dcf.Session(g) as sess:
        got_a, got_b = sess.run([a_out, b_out])
        got_a2, got_b2 = sess.run([a_out, b_out])
    np.testing.assert_allclose(got_a, a, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(got_b, b, rtol=1e-3, atol=1e-4)
    np.testing.assert_array_equal(got_b2, got_b)
    assert g1.stats["landing_reused"] > before
    assert all(len(v) <= G.LANDING_KEEP for v in g1._landing.values())


def test_peer_copies_to_a_busy_gpu_land_and_stay_right(gpu_count):
    """Copies of LANDING_BUSY_BYTES to LANDING_MIN_BYTES land on the h2d stream while the
    receiving GPU's compute stream is busy: the first ones, with no idle landing buffer,
    run on the compute stream into buffers that come back as landing buffers, and the
    later ones reuse those on the h2d stream. Every iteration's result equals numpy's.
    The receiver is kept busy by work enqueued just before the run."""
    from dcf.actors import gpu as G

    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    g1 = G.GpuDevice.get(1)
    if g1._landing is None:
        pytest.skip("the cupy stand-in cannot wrap memory")
    K = 512                                     # 1 MiB of float32 per copy
    assert G.LANDING_BUSY_BYTES <= K * K * 4 < G.LANDING_MIN_BYTES
    g, a_out, b_out, a, b = _chain_across_gpus(K, 40, 8)
    cp = g1.cp
    with dcf.Session(g) as sess:
        sess.run([a_out, b_out])                      # compiled, kernels built
        seeded, reused = g1.stats["landing_seeded"], g1.stats["landing_reused"]
        g1.activate()
        with g1.compute:                              # ~100 ms of work on /gpu:1 first
            x = cp.full((8192, 8192), 1e-4, cp.float32)
            for _ in range(6):
                x = x @ x
        got_a, got_b = sess.run([a_out, b_out])
    np.testing.assert_allclose(got_a, a, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(got_b, b, rtol=1e-3, atol=1e-4)
    assert g1.stats["landing_seeded"] > seeded
    assert g1.stats["landing_reused"] > reused
    assert all(len(v) <= G.LANDING_KEEP for v in g1._landing.values())


@pytest.mark.parametrize("cols", [96, 1536])        # a plain peer copy; a landing buffer
def test_column_blocks_cross_gpus_in_one_strided_copy(gpu_count, cols):
    """A column block of a wider matrix on /gpu:0 (rows apart, as the LSTM gates' h in
    its concatenation buffer) imported on /gpu:1: equal to the block, without a compact
    copy on /gpu:0 first where cupy has strided copies."""
    from dcf.actors import gpu as G

    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    g0, g1 = G.GpuDevice.get(0), G.GpuDevice.get(1)
    g0.activate()
    cp = g0.cp
    rng = np.random.default_rng(cols)
    wide = cp.asarray(rng.standard_normal((1024, 2 * cols + 3)).astype(np.float32))
    block = wide[:, cols + 3:]
    assert not block.flags.c_contiguous
    assert g1._peer_copyable(block) == (g1._memcpy2d is not None)
    got = g1.import_value(block)
    g1.compute.synchronize()
    assert got.data.device_id == 1 and got.flags.c_contiguous
    with cp.cuda.Device(0):
        want = cp.asnumpy(block)
    with cp.cuda.Device(1):
        np.testing.assert_array_equal(cp.asnumpy(got), want)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "float16"])
@pytest.mark.parametrize("kernel", [True, False])
def test_column_blocks_cross_gpus_by_a_kernel_reading_the_peer(gpu_count, monkeypatch,
                                                               dtype, kernel):
    """A column block crossing GPUs with peer access on: one raw kernel on the receiver's
    compute stream reads the peer's memory (4- and 8-byte elements), else the strided
    copy; either way every bit of the block arrives (NaN payloads and -0.0 included),
    and the kernel's result is read only after the producer's event."""
    from dcf.actors import gpu as G

    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    g0, g1 = G.GpuDevice.get(0), G.GpuDevice.get(1)
    if g1._memcpy2d is None:
        pytest.skip("the cupy stand-in has no strided copies")
    monkeypatch.setattr(G, "PEER_KERNEL", kernel)
    launched = []
    real = G.launch_peer_rows
    monkeypatch.setattr(G, "launch_peer_rows",
                        lambda k, dst, src: launched.append(src.shape) or real(k, dst, src))
    g0.activate()
    cp = g0.cp
    rng = np.random.default_rng(3)
    host = (rng.standard_normal((333, 517)) * 1000).astype(dtype)
    if host.dtype.kind == "f":
        bits = host.view(f"u{host.itemsize}")
        bits[0, 200] = np.array(np.nan, dtype).view(bits.dtype) | 1   # a NaN payload
        host[1, 201] = -0.0
    wide = cp.asarray(host)
    big = cp.asarray(rng.standard_normal((2048, 2048)).astype(np.float32))
    for _ in range(8):                       # keep /gpu:0 busy before the block is ready
        big = cp.tanh(big @ big * 1e-3)
    wide[:, 190:200] = (big[:333, :10] * 0).astype(dtype)   # made after the busy work
    block = wide[:, 190:]
    with cp.cuda.Device(0):
        want = cp.asnumpy(block)
    got = g1.import_value(block)
    g1.compute.synchronize()
    assert got.data.device_id == 1 and got.flags.c_contiguous
    with cp.cuda.Device(1):
        arrived = cp.asnumpy(got)
    np.testing.assert_array_equal(arrived.view(f"u{arrived.itemsize}"),
                                  want.view(f"u{want.itemsize}"))
    assert not arrived[:, :10].any()
    np.testing.assert_array_equal(arrived[:, 10:].view(f"u{host.itemsize}"),
                                  host[:, 200:].view(f"u{host.itemsize}"))
    direct = kernel and 0 in g1._peer_direct and host.itemsize in (4, 8)
    assert launched == ([(333, 327)] if direct else [])


class _Flag:
    """An event whose `done` is set by the test (cupy's Event has `done`)."""

    def __init__(self, done: bool = False) -> None:
        self.done = done


def test_event_callbacks_are_polled_by_the_loop_that_waits_for_them():
    """A GPU device outlives event loops (each Session drives its own): a poller task left
    pending on a loop that stopped (a copy still in flight when its run ended) must not
    stand for the poller of the next loop, whose waits then never end (a hang found by
    tests/core/test_loop_placement_shapes.py's draws on the stand-in GPUs); and a
    callback runs on the loop that registered it, never on another."""
    import asyncio

    from dcf.actors.gpu import GpuDevice

    gpu = GpuDevice.get(0)
    ran: list = []
    stale = _Flag()

    async def leave_a_copy_in_flight() -> None:
        gpu.when_done(stale, lambda: ran.append("first loop"))
        await asyncio.sleep(0)

    loop1 = asyncio.new_event_loop()
    loop1.run_until_complete(leave_a_copy_in_flight())
    loop1.close()

    async def wait_on_a_new_loop() -> None:
        ev = _Flag()
        asyncio.get_running_loop().call_later(0.01, setattr, ev, "done", True)
        await asyncio.wait_for(gpu.wait(ev), 5)
        ran.append("second loop")

    stale.done = True
    loop2 = asyncio.new_event_loop()
    try:
        loop2.run_until_complete(wait_on_a_new_loop())
    finally:
        loop2.close()
    assert ran == ["second loop"]      # the closed loop's callback is dropped, not run
