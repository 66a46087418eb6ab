"""The swapper's policy, through a swapping stack: each push past the threshold moves
out the oldest tracked value (the backward pass wants it last), pops return every
value intact, swapped entries come back ahead of their pops, and throttling moves
values out when an allocation would pass the budget."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from dcf.actors import gpu as G

MB = 1 << 20


@pytest.fixture
def gpu():
    d = G.GpuDevice.get(0)
    d.activate()
    gc.collect()
    d.collect()
    d.pool.free_all_blocks()
    yield d
    d.configure(None, 0.7)
    d.swapper.reset()


def _fill(gpu, k: int, nbytes: int = MB):
    return gpu.cp.full((nbytes // 4,), float(k), dtype=np.float32)


def _settle(sw) -> None:
    while sw.out or (sw.owed and sw.resident):
        sw.pump(force=True)
        if sw.out:
            sw.out[-1][1].synchronize()
        sw.collect()


def _states(stack) -> list:
    return [it.state if type(it) is G._Rec else None for it in stack.items]


def test_pushes_past_the_threshold_move_out_the_oldest_tracked_values(gpu):
    base = gpu.used_bytes()
    gpu.configure(base + 64 * MB, 0.5)
    gpu.swapper.reset()
    sw = gpu.swapper
    limit = gpu.swap_threshold * gpu.capacity
    stack = G.GpuStackStore("s", True, gpu)
    past = 0
    for k in range(40):
        x = _fill(gpu, k)
        sw._countdown = 0                      # a fresh reading of pool use each push
        past += gpu.used_bytes() >= limit
        stack.push(x)
        del x
    _settle(sw)
    states = _states(stack)
    tracked = [s for s in states if s is not None]
    assert past > 0 and len(tracked) > past
    # the swapped entries are the oldest tracked ones, as many as pushes past the threshold
    first = states.index(tracked[0])
    assert states[first:first + past] == [G._Rec.HOST] * past
    assert all(s == G._Rec.QUEUED for s in states[first + past:])
    assert all(s is None for s in states[:first])          # under the watch share: plain
    # pops give every value back, newest first
    for k in range(39, -1, -1):
        v = stack.pop()
        np.testing.assert_array_equal(gpu.cp.asnumpy(v), np.full(MB // 4, k, np.float32))


def test_swapped_entries_come_back_ahead_of_their_pops(gpu):
    gpu.configure(None, 0.0)                    # every saved value swaps
    gpu.swapper.reset()
    sw = gpu.swapper
    stack = G.GpuStackStore("s", True, gpu)
    n = 3 * G.PREFETCH_ITEMS
    for k in range(n):
        stack.push(_fill(gpu, k))
    _settle(sw)
    assert _states(stack) == [G._Rec.HOST] * n
    fetched = gpu.stats["swap_ins"]
    v = stack.pop()                            # fetched on demand, the next ones ahead
    np.testing.assert_array_equal(gpu.cp.asnumpy(v), np.full(MB // 4, n - 1, np.float32))
    ahead = [s for s in _states(stack)[-G.PREFETCH_ITEMS:]]
    assert ahead == [G._Rec.IN] * G.PREFETCH_ITEMS
    assert gpu.stats["swap_ins"] - fetched == 1 + G.PREFETCH_ITEMS
    for k in range(n - 2, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                      np.full(MB // 4, k, np.float32))
    assert gpu.stats["swap_ins"] - fetched == n        # each entry came back once


def test_the_same_buffer_pushed_twice_moves_once(gpu):
    gpu.configure(None, 0.0)
    gpu.swapper.reset()
    a, b = G.GpuStackStore("a", True, gpu), G.GpuStackStore("b", True, gpu)
    x = _fill(gpu, 7)
    out = gpu.stats["swap_outs"]
    a.push(x)
    b.push(x)
    for k in range(G.PUMP_BATCH):
        a.push(_fill(gpu, k))
    _settle(gpu.swapper)
    assert gpu.stats["swap_outs"] - out == 1 + G.PUMP_BATCH
    for k in range(G.PUMP_BATCH - 1, -1, -1):
        a.pop()
    for s in (a, b):
        np.testing.assert_array_equal(gpu.cp.asnumpy(s.pop()), np.full(MB // 4, 7, np.float32))


def test_throttling_moves_tracked_values_out_to_make_room(gpu):
    base = gpu.used_bytes()
    gpu.configure(base + 64 * MB, 0.9)
    gpu.swapper.reset()
    stack = G.GpuStackStore("s", True, gpu)
    out = gpu.stats["swap_out_bytes"]
    for k in range(50):        # past the watch share (~29 MB), under the threshold (~58 MB)
        stack.push(_fill(gpu, k))
    assert gpu.stats["swap_out_bytes"] == out         # nothing was owed
    throttled = gpu.stats["throttled"]
    big = gpu.alloc((24 * MB // 4,), np.float32, "a test allocation")   # needs room
    assert big.nbytes == 24 * MB
    assert gpu.stats["swap_out_bytes"] - out >= 10 * MB
    assert gpu.stats["throttled"] > throttled
    del big
    for k in range(49, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                      np.full(MB // 4, k, np.float32))


def test_a_dropped_stack_leaves_nothing_behind(gpu):
    gpu.configure(None, 0.0)
    gpu.swapper.reset()
    stack = G.GpuStackStore("s", True, gpu)
    for k in range(10):
        stack.push(_fill(gpu, k))
    _settle(gpu.swapper)
    used = gpu.used_bytes()
    del stack
    gc.collect()
    gpu.swapper.reset()
    assert not gpu.swapper.resident and not gpu.swapper.host
    assert gpu.used_bytes() <= used


def test_throttling_shows_in_the_trace(gpu):
    base = gpu.used_bytes()
    gpu.configure(base + 64 * MB, 0.9)
    gpu.swapper.reset()
    stack = G.GpuStackStore("s", True, gpu)
    for k in range(50):
        stack.push(_fill(gpu, k))
    gpu.begin_trace()
    try:
        big = gpu.alloc((24 * MB // 4,), np.float32, "a test allocation")
    finally:
        events = gpu.end_trace()
    del big
    slices = [e for e in events if e[1] == "Throttle"]
    assert slices and slices[0][6] == "d2h" and slices[0][5] >= slices[0][4]
    assert any(e[1] == "MemcpyDtoH" and e[0] == "swap out" for e in events)


def test_pops_of_values_that_stayed_bring_swapped_ones_back_ahead(gpu):
    """The newest values stay on the device and are popped first; those pops already
    bring the swapped (older) entries back, so the first swapped pop finds its value
    on the way or there."""
    base = gpu.used_bytes()
    gpu.configure(base + 64 * MB, 0.5)
    gpu.swapper.reset()
    sw = gpu.swapper
    stack = G.GpuStackStore("s", True, gpu)
    for k in range(40):
        sw._countdown = 0
        stack.push(_fill(gpu, k))
    _settle(sw)
    states = _states(stack)
    last_out = max(i for i, s in enumerate(states) if s == G._Rec.HOST)
    fetched = gpu.stats["swap_ins"]
    for k in range(39, last_out, -1):            # the plain values above the swapped ones
        stack.pop()
    assert gpu.stats["swap_ins"] > fetched       # prefetched before any swapped pop
    assert _states(stack)[last_out] == G._Rec.IN
    for k in range(last_out, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                      np.full(MB // 4, k, np.float32))
