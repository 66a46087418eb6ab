"""The swapper's policy, through a swapping stack: the bytes of each push past the
threshold move out as the oldest tracked values, large ones first (the backward pass
wants the oldest last), pops return every value intact, swapped entries come back ahead of their pops, and throttling moves
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
    while sw.out or (sw.owed > 0 and sw._next()[0] is not None):
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
    watched = []
    for k in range(40):
        x = _fill(gpu, k)
        sw._countdown = 0                      # a fresh reading of pool use each push
        used = gpu.used_bytes()
        past += used >= limit
        watched.append(used >= sw._watch)
        stack.push(x)
        del x
    _settle(sw)
    states = _states(stack)
    first = watched.index(True)
    assert past > 0 and watched.count(True) > past
    # the swapped entries are the oldest tracked ones, as many as pushes past the threshold;
    # those under the watch share were never tracked, the newer ones stayed
    assert states[first:first + past] == [G._Rec.HOST] * past
    assert all(s is None for s in states[:first] + states[first + past:])
    # pops give every value back, newest first
    for k in range(39, -1, -1):
        v = stack.pop()
        np.testing.assert_array_equal(gpu.cp.asnumpy(v), np.full(MB // 4, k, np.float32))


def test_large_values_move_out_first_and_pay_the_bytes_owed(gpu):
    """Pushes of 4 MB and 1 MB values alternate; past the threshold the bytes owed are
    paid with the oldest *large* tracked values (a copy costs the host about the same
    whatever its size), the small ones stay while large ones are left, and what moves
    covers what is owed by less than one value more."""
    base = gpu.used_bytes()
    gpu.configure(base + 160 * MB, 0.5)
    gpu.swapper.reset()
    sw = gpu.swapper
    sw.largest = sw._step_largest = 0
    limit = gpu.swap_threshold * gpu.capacity
    stack = G.GpuStackStore("s", True, gpu)
    owed = 0
    sizes = []
    watched = []
    out = gpu.stats["swap_out_bytes"]
    for k in range(40):
        n = 4 * MB if k % 2 else MB
        x = _fill(gpu, k, n)
        sw._countdown = 0
        sw.collect()                           # as the push does first: finished copies
        used = gpu.used_bytes()                # free their device buffers
        if used >= limit:
            owed += n
        watched.append(used >= sw._watch)
        stack.push(x)
        sizes.append(n)
        del x
    _settle(sw)
    moved = gpu.stats["swap_out_bytes"] - out
    assert owed > 8 * MB and owed <= moved < owed + 4 * MB
    states = _states(stack)
    large = [s for s, n, w in zip(states, sizes, watched) if w and n == 4 * MB]
    small = [s for s, n, w in zip(states, sizes, watched) if w and n == MB]
    assert small and all(s is None for s in small)        # large ones were left
    k = large.count(G._Rec.HOST)
    assert k * 4 * MB == moved and large[:k] == [G._Rec.HOST] * k    # the oldest large
    assert all(s is None for s in large[k:])
    for k in range(39, -1, -1):
        v = stack.pop()
        np.testing.assert_array_equal(gpu.cp.asnumpy(v),
                                      np.full(sizes[k] // 4, k, np.float32))


def test_small_values_move_when_no_large_one_is_left(gpu):
    gpu.configure(None, 0.0)                    # every push owes its bytes
    gpu.swapper.reset()
    sw = gpu.swapper
    stack = G.GpuStackStore("s", True, gpu)
    for k in range(3):
        stack.push(_fill(gpu, k, 4 * MB))
    for k in range(3, 9):
        stack.push(_fill(gpu, k, MB))
    _settle(sw)
    assert _states(stack) == [G._Rec.HOST] * 9
    for k in range(8, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                      np.full((4 * MB if k < 3 else MB) // 4, k, np.float32))


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


def test_a_buffer_pushed_again_while_it_moves_out_shares_its_record(gpu, monkeypatch):
    gpu.configure(None, 0.0)
    gpu.swapper.reset()
    sw = gpu.swapper
    a, b = G.GpuStackStore("a", True, gpu), G.GpuStackStore("b", True, gpu)
    x = _fill(gpu, 7)
    out = gpu.stats["swap_outs"]
    a.push(x)
    sw.pump(force=True)
    assert _states(a) == [G._Rec.OUT]
    with monkeypatch.context() as m:           # its copy still running
        m.setattr(sw, "collect", lambda: None)
        b.push(x)
    assert b.items[0] is a.items[0] and a.items[0].refs == 2
    _settle(sw)
    assert gpu.stats["swap_outs"] - out == 1
    for s in (a, b):
        np.testing.assert_array_equal(gpu.cp.asnumpy(s.pop()), np.full(MB // 4, 7, np.float32))


def test_swap_outs_wait_for_a_compute_event_recorded_after_the_pushes(gpu):
    """A batch's copies wait for its values' producers: an event already recorded on the
    compute stream after their pushes (a loop's in-flight mark) serves, else a new one."""
    gpu.configure(None, 0.0)
    gpu.swapper.reset()
    sw = gpu.swapper
    stack = G.GpuStackStore("s", True, gpu)
    for k in range(2):
        stack.push(_fill(gpu, k))
    marks = gpu.compute_marks
    sw.pump(force=True)                       # nothing recorded since the pushes: a new one
    assert gpu.compute_marks == marks + 1
    sw.collect()
    for k in range(2, 4):
        stack.push(_fill(gpu, k))
    mark = gpu.record(gpu.compute)            # as the loop's marker does
    marks = gpu.compute_marks
    sw.pump(force=True)
    assert gpu.compute_marks == marks and gpu.last_compute is mark      # reused
    _settle(sw)
    assert _states(stack) == [G._Rec.HOST] * 4
    for k in range(3, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()), np.full(MB // 4, k, np.float32))


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


def test_pinned_blocks_go_back_to_the_device_and_are_reused(gpu, monkeypatch):
    """A swapped value's pinned block returns to its GPU's idle blocks when its entry is
    popped, and the next step's swap-outs of that size take it again instead of a new
    cudaHostAlloc."""
    gpu.configure(None, 0.0)
    gpu.swapper.reset()
    gpu._swap_blocks.clear()
    gpu._swap_idle_bytes = 0
    made = []
    alloc = gpu.cp.cuda.alloc_pinned_memory
    monkeypatch.setattr(gpu.cp.cuda, "alloc_pinned_memory",
                        lambda n: made.append(n) or alloc(n))

    def step():
        stack = G.GpuStackStore("s", True, gpu)
        for k in range(2 * G.PUMP_BATCH):
            stack.push(_fill(gpu, k))
        _settle(gpu.swapper)
        bases = {it.host_ptr for it in stack.items}
        for k in range(2 * G.PUMP_BATCH - 1, -1, -1):
            np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                          np.full(MB // 4, k, np.float32))
        del stack
        gpu.h2d.synchronize()
        gc.collect()
        gpu.collect()
        return bases

    n = 2 * G.PUMP_BATCH
    bases = step()
    assert len(bases) == n and len(made) == n                # a block per value
    idle = {p for lst in gpu._swap_blocks.values() for _, p in lst}
    assert idle == bases
    assert gpu._swap_idle_bytes == sum(size * len(lst) for size, lst in gpu._swap_blocks.items())
    assert step() == bases and len(made) == n                # the same blocks again


def test_memory_holders_count_the_other_arrays_on_the_same_memory(gpu):
    a = _fill(gpu, 1)
    assert gpu.memory_holders(a)[0] == 0
    v = a[1:]                                     # a view at an offset
    assert gpu.memory_holders(a)[0] == 1 and gpu.memory_holders(v)[0] == 1
    assert gpu.memory_holders(a)[1] == gpu.memory_holders(v)[1]
    r = a.reshape(2, -1)                          # and one at offset 0
    assert gpu.memory_holders(a)[0] == 2
    del v, r
    assert gpu.memory_holders(a)[0] == 0
    assert gpu.memory_holders(a)[1] != gpu.memory_holders(_fill(gpu, 2))[1]


def test_a_buffer_a_live_view_keeps_stays_on_the_device(gpu):
    """An LSTM's concatenation [x, h] is saved while the outputs' TensorArray keeps h, a
    view into it: moving the buffer out would free nothing (a copy each way for
    nothing), so it stays and the bytes owed are paid with values whose move frees
    them."""
    gpu.configure(None, 0.0)                    # every push owes its bytes
    gpu.swapper.reset()
    sw = gpu.swapper
    kept = gpu.stats["swap_kept"]
    stack = G.GpuStackStore("s", True, gpu)
    views = []
    for k in range(8):
        x = _fill(gpu, k, 2 * MB)
        if k % 2:
            views.append(x[MB // 4:])           # its last half lives on
        stack.push(x)
        del x
    _settle(sw)
    states = _states(stack)
    assert states[0::2] == [G._Rec.HOST] * 4
    assert states[1::2] == [None] * 4          # stayed, as they were pushed
    assert gpu.stats["swap_kept"] - kept == 4
    for k in range(7, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                      np.full(MB // 2, k, np.float32))
    for k, v in zip(range(1, 8, 2), views):
        np.testing.assert_array_equal(gpu.cp.asnumpy(v), np.full(MB // 4, k, np.float32))


def test_saved_views_of_one_buffer_move_together(gpu):
    """Views of one buffer all saved move out once the last of them comes up (together
    they hold the memory); while an unsaved view lives on, none moves."""
    gpu.configure(None, 0.0)
    gpu.swapper.reset()
    sw = gpu.swapper
    stack = G.GpuStackStore("s", True, gpu)
    a = _fill(gpu, 1, 2 * MB)
    b = _fill(gpu, 2, 2 * MB)
    views = [a[:MB // 4], a[MB // 4:], b[:MB // 4], b[MB // 4:]]
    other = b[:8]                               # not saved: b's memory stays
    del a, b
    for v in views:
        stack.push(v)
    del views, v
    _settle(sw)
    assert _states(stack) == [G._Rec.HOST] * 2 + [None] * 2
    for k in (2, 2, 1, 1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                      np.full(MB // 4, k, np.float32))
    np.testing.assert_array_equal(gpu.cp.asnumpy(other), np.full(8, 2, np.float32))
