"""A run that fails lets go of its stacks' saved values and its TensorArrays' elements at
once (TensorFlow's are resources of their step), not when the caller lets go of the
exception: a kept traceback (a notebook keeps the last one) held every value the forward
loop had saved, on the device too. On every execution path, on CPU and on stand-in GPUs
with swapping."""

from __future__ import annotations

import asyncio
import gc

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError
from dcf.ops.data_ops import StackStore, TensorArrayStore
from tests.core.test_runtime_errors import _fail_at

STEPS, FAIL_AT, N = 12, 7, 64


def _model(device: str = "/cpu:0", swap: bool = False):
    """A loop whose gradient saves a [N, N] value each step, failing at step FAIL_AT
    (after FAIL_AT steps' values were pushed); returns (train op, loss)."""
    with dcf.device(device):
        w = dcf.Variable(np.eye(N, dtype=np.float32) * 0.5, name="w")

        def body(i, h):
            h = dcf.tanh(dcf.matmul(h, w))
            j = dcf.reshape(dcf.py_func(_fail_at(FAIL_AT), [i], dcf.int32, name="check"), [])
            return j + 1, h

        _, h = dcf.while_loop(lambda i, h: i < STEPS, body,
                              (0, dcf.ones([N, N], dtype=dcf.float32)), swap_memory=swap)
        loss = dcf.reduce_sum(h)
        train = dcf.train.GradientDescentOptimizer(0.1).minimize(loss)
    return train, loss, w


def _full_stacks() -> list:
    gc.collect()
    return [s for s in gc.get_objects() if isinstance(s, StackStore) and s.items]


def test_a_failed_run_drops_its_stacks(compiled):
    train, loss, w = _model()
    kept = []
    with dcf.Session(config=compiled) as sess:
        sess.run(w.initializer)
        with pytest.raises(InvalidArgumentError, match="bad value 7") as info:
            sess.run(train)
        kept.append(info.value)                 # the caller keeps the exception
        assert _full_stacks() == []
        np.testing.assert_array_equal(sess.run(w), np.eye(N, dtype=np.float32) * 0.5)


def test_a_failed_async_run_drops_its_stacks():
    train, loss, w = _model()

    async def main():
        sess = dcf.AsyncSession()
        await sess.run(w.initializer)
        try:
            await sess.run(train)
        except InvalidArgumentError as e:
            return e, _full_stacks()
        finally:
            await sess.close()
        raise AssertionError("the run did not fail")

    err, full = asyncio.run(main())
    assert "bad value 7" in str(err) and full == []


def test_a_failed_run_drops_its_tensor_arrays(compiled):
    g = dcf.Graph()
    with g.as_default():
        ta = dcf.TensorArray(dcf.float32, size=STEPS, element_shape=(N, N))

        def body(i, ta):
            j = dcf.reshape(dcf.py_func(_fail_at(FAIL_AT), [i], dcf.int32, name="check"), [])
            return j + 1, ta.write(i, dcf.fill([N, N], dcf.cast(i, dcf.float32)))

        _, ta = dcf.while_loop(lambda i, ta: i < STEPS, body, (0, ta))
        total = dcf.reduce_sum(ta.stack())
    kept = []
    with dcf.Session(g, config=compiled) as sess:
        with pytest.raises(InvalidArgumentError, match="bad value 7") as info:
            sess.run(total)
        kept.append(info.value)
        gc.collect()
        held = [t for t in gc.get_objects() if isinstance(t, TensorArrayStore) and
                any(e is not None for e in t.elements)]
        assert held == []


def test_a_successful_run_keeps_what_it_returns():
    # the stacks a run makes outlive nothing it returns, and a run that does not fail
    # leaves the same values as before
    g = dcf.Graph()
    with g.as_default():
        x = dcf.Variable(np.float32(0.5), name="x")
        _, y = dcf.while_loop(lambda i, y: i < 5, lambda i, y: (i + 1, dcf.sin(y) * x),
                              (0, dcf.constant(1.0)))
        (gx,) = dcf.gradients(y, [x])
    with dcf.Session(g) as sess:
        sess.run(x.initializer)
        y_v, g_v = sess.run([y, gx])
    yy, dy = 1.0, 0.0                           # forward-mode check in float64
    for _ in range(5):
        yy, dy = np.sin(yy) * 0.5, np.cos(yy) * dy * 0.5 + np.sin(yy)
    np.testing.assert_allclose(y_v, yy, rtol=1e-5)
    np.testing.assert_allclose(g_v, dy, rtol=1e-4)


def test_a_failed_gpu_run_gives_its_saved_values_back(fake_gpus):
    """On a (stand-in) GPU with swapping on: the pool's bytes in use go back after the
    failure while the exception is kept."""
    from dcf.actors import gpu as G

    train, loss, w = _model("/gpu:0", swap=True)
    gpu = G.GpuDevice.get(0)
    kept = []
    with dcf.Session(config=dcf.SessionConfig(swap_threshold=0.0)) as sess:
        sess.run(w.initializer)
        gc.collect()
        gpu.collect()
        base = gpu.used_bytes()
        with pytest.raises(InvalidArgumentError, match="bad value 7") as info:
            sess.run(train)
        kept.append(info.value)
        assert _full_stacks() == []
        gc.collect()
        gpu.collect()
        # what the kept frames hold of the last steps (5 values here), not the FAIL_AT
        # values each of the three stacks had saved (11 values without the drop)
        assert gpu.used_bytes() - base < FAIL_AT * N * N * 4


def _dcf_frames_holding_values(err: BaseException) -> list:
    """The dcf frames in `err`'s traceback (and the errors it chains) whose locals hold a
    run's values: arrays, lists of arrays, or an executor (which holds a loop's state)."""
    import os

    from dcf.executor import Executor

    root = os.path.dirname(os.path.abspath(dcf.__file__)) + os.sep

    def value(v) -> bool:
        return isinstance(v, (np.ndarray, Executor)) or \
            isinstance(v, (list, tuple)) and any(isinstance(a, np.ndarray) for a in v)

    found, seen, todo = [], set(), [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            f = tb.tb_frame
            if f.f_code.co_filename.startswith(root):
                held = sorted(k for k, v in f.f_locals.items() if value(v))
                if held:
                    found.append((f.f_code.co_name, held))
            tb = tb.tb_next
        todo += (e.__cause__, e.__context__)
    return found


@pytest.mark.parametrize("how", ["cancel", "wait_for", "timeout_s", "close"])
def test_an_async_run_stopped_midway_lets_go_of_its_values(how):
    """A run cancelled (its task, asyncio.wait_for, the session's close) or past its
    timeout_s: the error the caller keeps holds none of the run's values (its feeds'
    copies, the loop's state), as for any other failed run."""
    x = dcf.placeholder(dcf.float64, (None,))
    n = dcf.placeholder(dcf.int32, ())
    _, y = dcf.while_loop(lambda i, y: i < n, lambda i, y: (i + 1, y * 0.5 + x), (0, x))
    feeds = {x: np.ones(1000), n: 10 ** 9}

    async def main():
        sess = dcf.AsyncSession()
        try:
            if how == "timeout_s":
                try:
                    await sess.run(y, feeds, options=dcf.RunOptions(timeout_s=0.05))
                except dcf.errors.DeadlineExceededError as e:
                    return e
            elif how == "wait_for":
                try:
                    await asyncio.wait_for(sess.run(y, feeds), 0.05)
                except asyncio.TimeoutError as e:
                    return e
            else:
                run = asyncio.ensure_future(sess.run(y, feeds))
                await asyncio.sleep(0.05)                     # it has begun
                if how == "cancel":
                    run.cancel()
                else:
                    await sess.close()
                try:
                    await run
                except (asyncio.CancelledError, dcf.errors.CancelledError) as e:
                    return e
        finally:
            await sess.close()
        raise AssertionError("the run was not stopped")

    err = asyncio.run(main())
    assert _dcf_frames_holding_values(err) == []
