"""Swapping inside nested control flow: with every saved value of 64 KiB or more owed
(swap_threshold=0), gradients through nested loops, conds inside loops, TensorArrays
and several parallel_iterations equal, bit for bit, those of the same graph without
swapping, on the compiled and partitioned paths and in a traced run (the tagged executor), and
values did move."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.actors import gpu as G
from dcf.actors import gpu_swap as S

R, C = 160, 128                  # 80 KiB float32 values: past SWAP_MIN_BYTES


def _gpu():
    return G.GpuDevice.get(0)


def _run(build, swap: bool, config: dcf.SessionConfig, seed: int = 0):
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        rng = np.random.default_rng(seed)
        x = dcf.constant(rng.uniform(-1, 1, (R, C)).astype(np.float32))
        w = dcf.constant((rng.standard_normal((C, C)) / np.sqrt(C)).astype(np.float32))
        out = build(x, w, swap)
        grads = dcf.gradients(dcf.reduce_sum(out * out), [x, w])
    cfg = dcf.SessionConfig(swap_threshold=0.0 if swap else 0.7,
                            fuse_devices=config.fuse_devices)
    with dcf.Session(g, config=cfg) as sess:
        return sess.run(grads)


@pytest.fixture(params=["compiled", "partitioned"])
def path(request) -> dcf.SessionConfig:
    return dcf.SessionConfig(fuse_devices=request.param == "compiled")


def _nested(x, w, swap, pi=10):
    def inner(j, a):
        return j + 1, dcf.tanh(a @ w)

    def outer(i, a):
        _, a = dcf.while_loop(lambda j, a: j < 3, inner, (0, a), swap_memory=swap,
                              parallel_iterations=pi)
        return i + 1, dcf.sin(a) * 0.9

    return dcf.while_loop(lambda i, a: i < 4, outer, (0, x), swap_memory=swap,
                          parallel_iterations=pi)[1]


def _cond_in_loop(x, w, swap, pi=10):
    def body(i, a):
        a = dcf.cond(dcf.equal(i % 2, 0), lambda: dcf.tanh(a @ w), lambda: dcf.sin(a) @ w)
        return i + 1, a * 0.8

    return dcf.while_loop(lambda i, a: i < 7, body, (0, x), swap_memory=swap,
                          parallel_iterations=pi)[1]


def _tensor_array(x, w, swap, pi=10):
    ta = dcf.TensorArray(dcf.float32, size=6)

    def body(i, a, ta):
        a = dcf.tanh(a @ w)
        return i + 1, a, ta.write(i, a * 0.5)   # (an element the array holds would not move)

    _, a, ta = dcf.while_loop(lambda i, a, ta: i < 6, body, (0, x, ta), swap_memory=swap,
                              parallel_iterations=pi)
    return a + dcf.reduce_sum(ta.stack(), axis=0) * 0.1


def _short(x, w, swap, pi=10):
    # fewer iterations than a loop's swapper ticks are apart (TICK_EVERY): it ticks at its end
    return dcf.while_loop(lambda i, a: i < S.TICK_EVERY - 1, lambda i, a: (i + 1, dcf.tanh(a @ w)),
                          (0, x), swap_memory=swap, parallel_iterations=pi)[1]


@pytest.mark.parametrize("build", [_nested, _cond_in_loop, _tensor_array, _short],
                         ids=["nested loops", "cond in a loop", "tensor array", "short loop"])
@pytest.mark.parametrize("pi", [1, 32])
def test_swapping_inside_control_flow_changes_no_gradient(path, build, pi):
    stats = _gpu().stats
    plain = _run(lambda x, w, s: build(x, w, s, pi), False, path)
    before = stats["swap_out_bytes"], stats["swap_in_bytes"], stats["swap_popped_in_flight"]
    swapped = _run(lambda x, w, s: build(x, w, s, pi), True, path)
    assert stats["swap_out_bytes"] > before[0]          # values did go to the host
    # and came back -- or were popped while their copies out still ran (a short loop
    # moves its values at its end, just before the backward loop pops them: on a busy
    # GPU, under tests in parallel, the copies may not be done yet)
    assert stats["swap_in_bytes"] > before[1] or stats["swap_popped_in_flight"] > before[2]
    for a, b in zip(plain, swapped):
        np.testing.assert_array_equal(a, b)


def test_swapping_in_a_traced_run_changes_no_gradient():
    """A traced run takes the tagged executor: pushes through the stacks' own push."""
    stats = _gpu().stats
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        rng = np.random.default_rng(1)
        x = dcf.constant(rng.uniform(-1, 1, (R, C)).astype(np.float32))
        w = dcf.constant((rng.standard_normal((C, C)) / np.sqrt(C)).astype(np.float32))
        grads = [dcf.gradients(dcf.reduce_sum(_nested(x, w, s) ** 2), [x, w])
                 for s in (False, True)]
    with dcf.Session(g, config=dcf.SessionConfig(swap_threshold=0.0)) as sess:
        before = stats["swap_out_bytes"]
        plain, swapped = sess.run(grads, options=dcf.RunOptions(trace=True))
    assert stats["swap_out_bytes"] > before
    for a, b in zip(plain, swapped):
        np.testing.assert_array_equal(a, b)
