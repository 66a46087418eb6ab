"""Devices of one process run as one compiled program (dcf/fused.py): transfers at
device edges, parallel_iterations bounding the GPU work in flight, and elementwise
GPU chains fused into one kernel (dcf/fusion/elementwise.py). GPUs here are the cupy
stand-in (dcf/actors/_fake_cuda.py), so this runs in CI; tests/gpu runs the same
paths on real GPUs."""

from __future__ import annotations

import re

import numpy as np
import pytest

import dcf


def _fused_plans(sess: dcf.Session) -> list:
    return [rp.fused for rp in sess._async._plans.values()]


def _chain_graph(devs: list[str], n: int, pi: int = 32, seed: int = 0):
    """x_{t+1} = tanh(x_t @ W_d + b_d) * 0.5 through the devices, n iterations; the
    loop counter and predicate stay on the host."""
    rng = np.random.default_rng(seed)
    Ws = [rng.standard_normal((4, 4)).astype(np.float32) / 2 for _ in devs]
    bs = [rng.standard_normal(4).astype(np.float32) for _ in devs]
    x0 = rng.standard_normal((3, 4)).astype(np.float32)
    g = dcf.Graph()
    with g.as_default():
        def body(i, x):
            for d, W, b in zip(devs, Ws, bs):
                with dcf.device(d):
                    x = dcf.tanh(dcf.matmul(x, dcf.constant(W)) + dcf.constant(b)) * 0.5
            return i + 1, x

        _, out = dcf.while_loop(lambda i, x: i < n, body, (0, dcf.constant(x0)),
                                parallel_iterations=pi)
    want = x0.astype(np.float64)
    for _ in range(n):
        for W, b in zip(Ws, bs):
            want = np.tanh(want @ W + b) * 0.5
    return g, out, want


def test_in_process_devices_run_as_one_program():
    g, out, want = _chain_graph(["/cpu:0", "/cpu:1", "/cpu:2"], 7)
    with dcf.Session(graph=g) as sess:
        np.testing.assert_allclose(sess.run(out), want, rtol=1e-5)
        assert all(f is not None for f in _fused_plans(sess))
    with dcf.Session(graph=g, config=dcf.SessionConfig(fuse_devices=False)) as sess:
        np.testing.assert_allclose(sess.run(out), want, rtol=1e-5)
        assert all(f is None for f in _fused_plans(sess))


def test_gpus_and_cpu_in_one_loop_with_a_gpu_value_read_on_the_host(fake_gpus):
    """Each iteration a GPU value decides a cond on the CPU (a device-to-host transfer
    the program waits for), and values cross GPU 0 -> GPU 1 -> CPU."""
    rng = np.random.default_rng(1)
    W = rng.standard_normal((4, 4)).astype(np.float32) / 2
    x0 = rng.standard_normal((2, 4)).astype(np.float32)
    g = dcf.Graph()
    with g.as_default():
        def body(i, x):
            with dcf.device("/gpu:0"):
                y = dcf.matmul(x, dcf.constant(W))
            with dcf.device("/gpu:1"):
                s = dcf.reduce_sum(y)
            with dcf.device("/cpu:0"):
                z = dcf.cond(s > 0, lambda: y * 0.5, lambda: -y)
            return i + 1, z

        _, out = dcf.while_loop(lambda i, x: i < 6, body, (0, dcf.constant(x0)))
    want = x0.astype(np.float64)
    for _ in range(6):
        y = want @ W
        want = y * 0.5 if y.sum() > 0 else -y
    for fuse in (True, False):
        with dcf.Session(graph=g, config=dcf.SessionConfig(fuse_devices=fuse)) as sess:
            np.testing.assert_allclose(sess.run(out), want, rtol=1e-5)
            assert all((f is not None) == fuse for f in _fused_plans(sess))


@pytest.mark.parametrize("pred_on", ["/cpu:0", "/gpu:0"])
@pytest.mark.parametrize("n", [0, 1, 7])
def test_gpu_copies_of_a_predicate_share_its_guard(fake_gpus, sources, n, pred_on):
    """A loop over two GPUs whose predicate is computed on the host or on one GPU: the
    GPUs' copies of the predicate, read only by Switches (which use only its truth, the
    same in every copy), are the predicate itself to the frame compiler, so the loop
    ends on `if not (pred)` and moves its variables in one assignment (no per-variable
    DEAD tests); a cond on a GPU inside the body still takes the right branch. Values
    for 0, 1 and 7 iterations."""
    rng = np.random.default_rng(3)
    W = rng.standard_normal((4, 4)).astype(np.float32) / 2
    x0 = rng.standard_normal((3, 4)).astype(np.float32)
    g = dcf.Graph()
    with g.as_default():
        def body(i, x, s):
            with dcf.device("/gpu:0"):
                x = dcf.tanh(dcf.matmul(x, dcf.constant(W)))
            with dcf.device("/gpu:1"):
                x = dcf.cond(dcf.equal(i % 2.0, 0.0), lambda: x * 2.0, lambda: x - 1.0)
                s = s + dcf.reduce_sum(x)
            return i + 1, x, s

        with dcf.device("/gpu:0"):     # the loop variables' machinery on the GPUs
            x_init = dcf.constant(x0)
        with dcf.device("/gpu:1"):
            s_init = dcf.constant(np.zeros((), np.float32))
        with dcf.device(pred_on):      # the counter and the predicate
            i_init = dcf.constant(np.float32(0))

        def cond(i, x, s):
            with dcf.device(pred_on):
                return i < float(n)

        _, out, tot = dcf.while_loop(cond, body, (i_init, x_init, s_init))
    want, want_s = x0.astype(np.float64), 0.0
    for i in range(n):
        want = np.tanh(want @ W)
        want = want * 2.0 if i % 2 == 0 else want - 1.0
        want_s += want.sum()
    with dcf.Session(graph=g) as sess:
        got, got_s = sess.run([out, tot])
        assert all(f is not None for f in _fused_plans(sess))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got_s == pytest.approx(want_s, rel=1e-5, abs=1e-5)
    src = "\n".join(sources)
    assert re.search(r"^ +if not \(v\d+_0\):$", src, re.M), src     # ends on the predicate
    assert "some loop variables ended" not in src and "is not DEAD" not in src, src


@pytest.mark.parametrize("pi", [1, 2, 5, 8])
def test_parallel_iterations_bounds_the_gpu_iterations_in_flight(fake_gpus, monkeypatch, pi):
    """The compiled loop waits for the GPU events of the mark a window back (pi
    iterations, or the most whole strides of marks in pi) before it goes on, and for no
    later one."""
    from dcf import frame_compiler

    log: list[tuple[int, int]] = []    # (iteration waited for, iterations marked by then)
    marks = [0]

    class Ev:
        def __init__(self, k: int) -> None:
            self.k, self.queried = k, False

        @property
        def done(self) -> bool:
            if not self.queried:
                self.queried = True
                log.append((self.k, marks[0]))
                return False
            return True

        def synchronize(self) -> None:
            pass

    def marker(gpus):
        def mark():
            marks[0] += 1
            return [Ev(marks[0])]
        return mark

    monkeypatch.setattr(frame_compiler, "_marker", marker)
    n = 12
    g, out, want = _chain_graph(["/gpu:0", "/gpu:1"], n, pi=pi)
    with dcf.Session(graph=g) as sess:
        np.testing.assert_allclose(sess.run(out), want, rtol=1e-5)
    stride = max(1, pi // frame_compiler.MARKS_PER_WINDOW)   # iterations per mark
    window = pi // stride                                      # marks per window
    assert marks[0] == n // stride    # one mark per `stride` iterations that ran the body
    assert log, "the loop never waited"
    for waited, marked in log:
        assert marked - waited == window - 1 or (window == 1 and marked == waited)


class _EmulatedElementwiseKernel:
    """cupy.ElementwiseKernel for the stand-in: evaluates `out = <expr>` with numpy."""

    made: list = []

    def __init__(self, in_params: str, out_params: str, operation: str, name: str) -> None:
        self.names = [p.split()[-1] for p in in_params.split(",")]
        assert operation.startswith("out = ")
        self.expr = operation[len("out = "):].replace("(T)", "")
        self.calls = 0
        _EmulatedElementwiseKernel.made.append(self)

    def __call__(self, *args):
        from dcf.actors import _fake_cuda

        self.calls += 1
        vals = [_fake_cuda.asnumpy(a) if isinstance(a, _fake_cuda.ndarray) else a
                for a in args]
        dt = next(v.dtype for v in vals if isinstance(v, (np.ndarray, np.generic)))
        env = dict(zip(self.names, vals), tanh=np.tanh, exp=np.exp)
        return _fake_cuda.asarray(np.asarray(eval(self.expr, env)).astype(dt))


def test_elementwise_gpu_chains_run_as_one_kernel(fake_gpus, monkeypatch):
    from dcf.actors import _fake_cuda

    _EmulatedElementwiseKernel.made = []
    monkeypatch.setattr(_fake_cuda, "ElementwiseKernel", _EmulatedElementwiseKernel,
                        raising=False)
    n = 5
    g, out, want = _chain_graph(["/gpu:0", "/gpu:1"], n)
    with dcf.Session(graph=g) as sess:
        np.testing.assert_allclose(sess.run(out), want, rtol=1e-5)
    # (kernels made but never called, e.g. for values that stay on the host, do not count)
    used = [k for k in _EmulatedElementwiseKernel.made if k.calls]
    # per device: tanh(x @ W + b) * 0.5 -> one kernel over (matmul, b, 0.5)
    assert len(used) == 2
    assert all(re.fullmatch(r"\(tanh\(\(in0 \+ in1\)\) \* in2\)", k.expr) for k in used)
    assert [k.calls for k in used] == [n, n]


def test_a_fused_chain_given_host_values_runs_op_by_op(fake_gpus, monkeypatch):
    """Integer scalars stay in host memory on a GPU (as TF's HostMemory): a fused chain
    given them runs op by op through the ops' own kernels, with the same values."""
    from dcf.actors import _fake_cuda

    _EmulatedElementwiseKernel.made = []
    monkeypatch.setattr(_fake_cuda, "ElementwiseKernel", _EmulatedElementwiseKernel,
                        raising=False)
    g = dcf.Graph()
    with g.as_default():
        k = dcf.placeholder(dcf.int32, [])
        a = dcf.placeholder(dcf.float32, [3])
        with dcf.device("/gpu:0"):
            j = (k * 3 + 1) - k
            y = dcf.tanh(a * 2.0 + 1.0)
        with dcf.device("/gpu:1"):
            z = dcf.exp(y) - y
    av = np.array([0.1, -0.3, 2.0], np.float32)
    with dcf.Session(graph=g) as sess:
        got_j, got_z = sess.run([j, z], {k: np.int32(7), a: av})
    assert got_j == 7 * 3 + 1 - 7
    y_np = np.tanh(av.astype(np.float64) * 2 + 1)
    np.testing.assert_allclose(got_z, np.exp(y_np) - y_np, rtol=1e-6)
    used = sorted(k.expr for k in _EmulatedElementwiseKernel.made if k.calls)
    assert used == ["(exp(in0) - in0)", "tanh(((in0 * in1) + in2))"]


def test_a_loop_over_two_gpus_switches_device_once_per_gpu_and_iteration(fake_gpus,
                                                                          monkeypatch):
    """Two independent chains of five steps, one per GPU, built alternately: the compiled
    iteration runs one GPU's chain, then the other's (two device switches), not the
    ops in the order they became ready, which would switch at every step."""
    from dcf.actors import gpu as gpu_mod

    switches = [0]
    activate = gpu_mod.GpuDevice.activate

    def counting(self):
        switches[0] += 1
        activate(self)

    monkeypatch.setattr(gpu_mod.GpuDevice, "activate", counting)
    rng = np.random.default_rng(5)
    a0, b0 = rng.standard_normal((2, 3, 4)).astype(np.float32)
    n = 6
    g = dcf.Graph()
    with g.as_default():
        def body(i, a, b):
            for _ in range(5):      # built interleaved: a's op, b's op, a's op, ...
                with dcf.device("/gpu:0"):
                    a = dcf.tanh(a) * 0.9 + 0.1
                with dcf.device("/gpu:1"):
                    b = dcf.sin(b) * 1.1 - 0.2
            return i + 1, a, b

        with dcf.device("/gpu:0"):
            a_init = dcf.constant(a0)
        with dcf.device("/gpu:1"):
            b_init = dcf.constant(b0)
        _, a, b = dcf.while_loop(lambda i, a, b: i < n, body, (0, a_init, b_init))
    wa, wb = a0.astype(np.float64), b0.astype(np.float64)
    for _ in range(n):
        for _ in range(5):
            wa = np.tanh(wa) * 0.9 + 0.1
            wb = np.sin(wb) * 1.1 - 0.2
    with dcf.Session(graph=g) as sess:
        sess.run([a, b])
        switches[0] = 0
        got_a, got_b = sess.run([a, b])
    np.testing.assert_allclose(got_a, wa, rtol=1e-5)
    np.testing.assert_allclose(got_b, wb, rtol=1e-5)
    assert switches[0] <= 2 * n + 4, switches[0]


@pytest.mark.parametrize("path", ["fused", "fused-async", "per-device"])
def test_out_of_memory_outside_any_kernel_is_resource_exhausted(fake_gpus, monkeypatch, path):
    """An allocation outside any kernel (kernels map their own) that fails -- an event
    of a fused loop's in-flight marks, a host value's copy arriving at a GPU partition
    -- fails the run with ResourceExhaustedError saying so, on each path a GPU step
    takes: the fused program run inline or from an event loop, a GPU partition's actor."""
    import asyncio

    from dcf import frame_compiler
    from dcf.actors.gpu import GpuDevice

    def no_room(*a, **k):
        raise MemoryError("no room")

    g = dcf.Graph()
    with g.as_default():
        if path == "per-device":
            monkeypatch.setattr(GpuDevice, "import_value", no_room)
            x = dcf.constant(np.ones(4, np.float32))      # on the host: a copy to the GPU
            with dcf.device("/gpu:0"):
                y = x * 2.0
            want = r"^out of memory on .* computing a transfer: no room$"
        else:
            monkeypatch.setattr(frame_compiler, "_marker", lambda gpus: no_room)
            with dcf.device("/gpu:0"):
                x0 = dcf.constant(np.ones(4, np.float32))
            _, y = dcf.while_loop(lambda i, x: i < 8, lambda i, x: (i + 1, x * 2.0), (0, x0),
                                  parallel_iterations=2)
            want = r"^out of GPU memory in a transfer: no room$"
    config = dcf.SessionConfig(fuse_devices=path != "per-device")
    if path == "fused-async":
        async def run():
            async with dcf.AsyncSession(g, config=config) as sess:
                return await sess.run(y)
        with pytest.raises(dcf.errors.ResourceExhaustedError, match=want):
            asyncio.run(run())
    else:
        with dcf.Session(graph=g, config=config) as sess:
            with pytest.raises(dcf.errors.ResourceExhaustedError, match=want):
                sess.run(y)
