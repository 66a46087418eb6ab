"""Review 8, loops whose ops alternate between the host and the GPUs: swapping and
throttling under a small gpu_memory_limit where the loop's values also go to the host
each iteration, against the same graph on the CPU alone."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.actors.gpu import GpuDevice

R, C = 64, 256                    # 64 KiB float32 values: SWAP_MIN_BYTES


def _x() -> np.ndarray:
    return np.linspace(-1, 1, R * C).reshape(R, C).astype(np.float32)


def _w() -> np.ndarray:
    return (np.eye(C) * 0.9 + 0.001).astype(np.float32)


def _run(g: dcf.Graph, fetches, x, config: dcf.SessionConfig | None, fuse: bool):
    """`fetches` of graph g with _x() fed to x, its variables initialised, under `config`
    (the default one where None) on the compiled (fuse) or partitioned path."""
    cfg = config or dcf.SessionConfig()
    cfg.fuse_devices = fuse
    with g.as_default():
        init = dcf.global_variables_initializer()
    with dcf.Session(g, config=cfg) as sess:
        sess.run(init)
        return sess.run(fetches, {x: _x()})


def _nested_grad(gpu: str, steps: int, config: dcf.SessionConfig | None,
                 fuse: bool) -> tuple:
    """d sum(h_T) / d w of h <- inner(tanh(h @ w)), inner two steps of u <- sigmoid(u) * u:
    the outer loop's counter and h on the host, the product and the inner loop's ops on
    `gpu`. tanh(h @ w) is saved by the outer loop (tanh's gradient) and by the inner
    loop's first iteration (its u, in a stack of each inner run's own)."""
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (R, C), name="x")
        with dcf.device(gpu):
            w = dcf.Variable(_w(), name="w")

        def body(i, h):
            with dcf.device(gpu):
                h = dcf.tanh(dcf.matmul(h, w.read_value()))

            def inner(j, u):
                with dcf.device(gpu):
                    return j + 1, dcf.sigmoid(u) * u
            _, h = dcf.while_loop(lambda j, u: j < 2, inner, (0, h), swap_memory=True)
            return i + 1, h
        _, h = dcf.while_loop(lambda i, h: i < steps, body, (0, x), swap_memory=True)
        loss = dcf.reduce_sum(h)
        (gw,) = dcf.gradients(loss, [w])
    return _run(g, [loss, gw], x, config, fuse)


@pytest.mark.parametrize("fuse", [True, False], ids=["compiled", "partitioned"])
def test_a_value_saved_by_an_outer_and_an_inner_loop_swaps_out(fuse):
    """The same array in the outer loop's stack (at its iteration i) and in the inner
    loop's (first entry of a stack of its own) was looked for next to index i only:
    each stack took the other's entry for a holder that stays, the outer stack was given
    up after HELD_RUN entries and the inner one's entries never moved, and the run
    failed with ResourceExhaustedError on a budget that fits with swapping (24 outer
    iterations of four 64 KiB saved values on 3 MiB)."""
    steps = 24
    want = _nested_grad("/cpu:0", steps, None, fuse)
    got = _nested_grad("/gpu:0", steps, dcf.SessionConfig(gpu_memory_limit=3 << 20,
                                                          swap_threshold=0.0), fuse)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-4)


def _ping_pong(devices: tuple, steps: int, config: dcf.SessionConfig | None,
               fuse: bool) -> np.ndarray:
    """h <- (h * 0.5 on devices[0]) + 1 on devices[1], `steps` times: a new array on the
    first device each iteration, copied to the second."""
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (R, C), name="x")

        def body(i, h):
            with dcf.device(devices[0]):
                a = h * 0.5
            with dcf.device(devices[1]):
                h = a + 1.0
            return i + 1, h
        _, h = dcf.while_loop(lambda i, h: i < steps, body, (0, x))
    cfg = config or dcf.SessionConfig()
    cfg.fuse_devices = fuse
    with dcf.Session(g, config=cfg) as sess:
        return sess.run(h, {x: _x()})


@pytest.mark.parametrize("fuse", [True, False], ids=["compiled", "partitioned"])
def test_copies_to_another_gpu_that_are_done_give_their_sources_back(fuse, gpu_count):
    """A peer copy's source stays alive on the receiving GPU until an event after the
    copy (GpuDevice._release_peer_sources, defer), and that GPU let go of it only when
    it collected: a failed allocation on the sending GPU collected only its own, so a
    loop that makes a 64 KiB array on /gpu:0 for /gpu:1 each iteration, with no more
    than two alive at once, ran out of a 1 MiB budget on /gpu:0."""
    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    steps = 40
    want = _ping_pong(("/cpu:0", "/cpu:0"), steps, None, fuse)
    got = _ping_pong(("/gpu:0", "/gpu:1"), steps, dcf.SessionConfig(gpu_memory_limit=1 << 20),
                     fuse)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _transposed_to_host(gpu: str, config: dcf.SessionConfig | None, fuse: bool) -> tuple:
    """A swapping loop h <- tanh(h @ w) on `gpu` whose h.T (a view, not C-contiguous)
    goes to the host each iteration; the sum of its first columns and d sum(h) / d w."""
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (R, C), name="x")
        with dcf.device(gpu):
            w = dcf.Variable(_w(), name="w")

        def body(i, h, s):
            with dcf.device(gpu):
                h = dcf.tanh(dcf.matmul(h, w.read_value()))
                t = dcf.transpose(h)
            with dcf.device("/cpu:0"):
                s = s + dcf.reduce_sum(t[:, :3])
            return i + 1, h, s
        _, h, s = dcf.while_loop(lambda i, h, s: i < 24, body, (0, x, 0.0),
                                 swap_memory=True)
        (gw,) = dcf.gradients(dcf.reduce_sum(h), [w])
    return _run(g, [s, gw], x, config, fuse)


@pytest.mark.parametrize("fuse", [True, False], ids=["compiled", "partitioned"])
def test_a_view_going_to_the_host_makes_room_for_its_compact_copy(fuse):
    """A value that is not C-contiguous is compacted on the GPU before its copy to the
    host; that allocation went straight to the pool, so where the budget was reached it
    failed (ResourceExhaustedError naming the transfer) where any kernel's allocation
    would have moved saved values out first."""
    want = _transposed_to_host("/cpu:0", None, fuse)
    got = _transposed_to_host("/gpu:0", dcf.SessionConfig(gpu_memory_limit=2 << 20,
                                                          swap_threshold=0.9), fuse)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-4)
