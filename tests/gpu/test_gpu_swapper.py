"""The swapper's policy, through a swapping stack: the bytes pool use is over the
threshold move out as the oldest entries, large ones first (the backward pass wants the
oldest last), entries whose move would free nothing stay, pops return every value
intact, swapped entries come back ahead of their pops, and throttling moves values out
when an allocation would pass the budget. Pushes here go through the stack's `push`,
which ticks the swapper each time (compiled loops append inline and tick every few
iterations: tests/gpu/test_gpu_runtime.py)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from dcf.actors import gpu as G
from dcf.actors import gpu_swap as S
from tests.core.test_pinned_swap_blocks import (PinnedPool, check_block_dropped_in_a_cycle,
                                                check_values_after_a_stack_dies_in_a_cycle,
                                                drop_idle_blocks)
from tests.core.test_pinned_swap_blocks import settle as _settle

MB = 1 << 20


@pytest.fixture
def gpu():
    d = G.GpuDevice.get(0)
    d.activate()
    _nothing_left_to_free(d)
    yield d
    d.configure(None, 0.7)
    d.swapper.reset()


def _nothing_left_to_free(d) -> None:
    """Free now what earlier tests of this process left for a failed allocation to free
    (idle peer-copy landing buffers, copies' sources other GPUs keep until their work is
    done, cached blocks): the tests below set budgets from `used_bytes()`, and memory
    freed on demand later made room where a test expects values to be moved out (seen
    on two H200 under `-n 8`: `test_throttling_moves_tracked_values_out_to_make_room`)."""
    gc.collect()
    for other in list(G.GpuDevice._instances.values()):
        other._device.synchronize()
        other.collect()
    d.make_current()
    d.relieve(0)


def _fill(gpu, k: int, nbytes: int = MB):
    return gpu.cp.full((nbytes // 4,), float(k), dtype=np.float32)


def _pushed_and_settled(gpu, keep, nbytes: int = MB, n: int = 8) -> tuple:
    """(stack, what else holds its values, swap_kept before): n values k = 0..n-1 of
    `nbytes` each, full of k, pushed on a swapping stack with every push owing its bytes
    (threshold 0), the swapper then settled; keep(k, x) gives what else holds value k
    (the value itself, as a variable would; a view into it) or None."""
    gpu.configure(None, 0.0)
    gpu.swapper.reset()
    kept = gpu.stats["swap_kept"]
    stack = S.GpuStackStore("s", True, gpu)
    holders = []
    for k in range(n):
        x = _fill(gpu, k, nbytes)
        holders.append(keep(k, x))
        stack.push(x)
        del x
    _settle(gpu.swapper)
    return stack, [h for h in holders if h is not None], kept


def _states(stack) -> list:
    return [it.state if type(it) is S._Rec else None for it in stack.items]


def _drain(sw) -> None:
    """Let every copy in flight finish and be collected (collecting may start more)."""
    while sw.out:
        sw.out[-1][1].synchronize()
        sw.collect()


def _why(sw) -> str:
    """The swapper's state, for an assertion's message (a policy test that failed once
    on four H200s and passed on rerun: bench/NOTES.md, "GPU, session 14")."""
    g = sw.gpu
    return (f"threshold {g.swap_threshold}, limit {sw._limit}, owed {sw.owed}, "
            f"in flight {len(sw.out)}, stacks {len(sw.stacks)}, "
            f"kept {g.stats['swap_kept']} in {len(sw.shared)} groups, outs {g.stats['swap_outs']}, "
            f"holders base {g._holders_base}, lone refs {sw._lone}")


def test_use_over_the_threshold_moves_out_the_oldest_entries(gpu):
    base = gpu.used_bytes()
    gpu.configure(base + 64 * MB, 0.5)
    gpu.swapper.reset()
    sw = gpu.swapper
    limit = gpu.swap_threshold * gpu.capacity
    stack = S.GpuStackStore("s", True, gpu)
    peak = 0
    for k in range(40):
        x = _fill(gpu, k)
        stack.push(x)
        del x
        peak = max(peak, gpu.used_bytes())
        _drain(sw)      # the bound is the policy's: not how fast this GPU's copies run
    _settle(sw)
    states = _states(stack)
    moved = states.count(S._Rec.HOST)
    # the entries that moved are the oldest; what stays fits under the threshold
    assert moved > 0 and states == [S._Rec.HOST] * moved + [None] * (40 - moved), _why(sw)
    assert gpu.used_bytes() <= limit + MB, _why(sw)
    assert peak <= limit + (S.PUMP_BATCH + 1) * MB      # paid in batches as use grew
    # pops give every value back, newest first
    for k in range(39, -1, -1):
        v = stack.pop()
        np.testing.assert_array_equal(gpu.cp.asnumpy(v), np.full(MB // 4, k, np.float32))


def test_large_values_move_out_first(gpu):
    """Two stacks, of 1 MB and of 4 MB values, pushed in turns (as a loop pushes one
    value of each per iteration): the bytes over the threshold are paid with the oldest
    *large* entries (a copy costs the host about the same whatever its size), and the
    small ones stay while large ones are left."""
    base = gpu.used_bytes()
    gpu.configure(base + 160 * MB, 0.5)
    gpu.swapper.reset()
    sw = gpu.swapper
    sw.largest = sw._step_largest = 0
    limit = gpu.swap_threshold * gpu.capacity
    small, large = S.GpuStackStore("small", True, gpu), S.GpuStackStore("large", True, gpu)
    for k in range(20):
        for stack, n in ((small, MB), (large, 4 * MB)):
            x = _fill(gpu, k, n)
            stack.push(x)
            del x
    _settle(sw)
    moved = _states(large).count(S._Rec.HOST)
    assert moved > 2 and _states(large) == [S._Rec.HOST] * moved + [None] * (20 - moved), \
        _why(sw)
    assert _states(small) == [None] * 20, _why(sw)          # large ones were left
    assert gpu.used_bytes() <= limit + 4 * MB, _why(sw)
    for k in range(19, -1, -1):
        for stack, n in ((large, 4 * MB), (small, MB)):
            np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                          np.full(n // 4, k, np.float32))


def test_small_values_move_when_no_large_one_is_left(gpu):
    gpu.configure(None, 0.0)                    # every push owes its bytes
    gpu.swapper.reset()
    sw = gpu.swapper
    stack = S.GpuStackStore("s", True, gpu)
    for k in range(3):
        stack.push(_fill(gpu, k, 4 * MB))
    for k in range(3, 9):
        stack.push(_fill(gpu, k, MB))
    _settle(sw)
    assert _states(stack) == [S._Rec.HOST] * 9, _why(sw)
    for k in range(8, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                      np.full((4 * MB if k < 3 else MB) // 4, k, np.float32))


def test_swapped_entries_come_back_ahead_of_their_pops(gpu):
    gpu.configure(None, 0.0)                    # every saved value swaps
    gpu.swapper.reset()
    sw = gpu.swapper
    stack = S.GpuStackStore("s", True, gpu)
    n = 3 * S.PREFETCH_ITEMS
    for k in range(n):
        stack.push(_fill(gpu, k))
    _settle(sw)
    assert _states(stack) == [S._Rec.HOST] * n, _why(sw)
    fetched = gpu.stats["swap_ins"]
    v = stack.pop()                            # fetched on demand, the next ones ahead
    np.testing.assert_array_equal(gpu.cp.asnumpy(v), np.full(MB // 4, n - 1, np.float32))
    ahead = [s for s in _states(stack)[-S.PREFETCH_ITEMS:]]
    assert ahead == [S._Rec.IN] * S.PREFETCH_ITEMS
    assert gpu.stats["swap_ins"] - fetched == 1 + S.PREFETCH_ITEMS
    for k in range(n - 2, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                      np.full(MB // 4, k, np.float32))
    assert gpu.stats["swap_ins"] - fetched == n        # each entry came back once


def test_entries_brought_back_ahead_keep_their_buffers_until_the_copy_is_done(gpu):
    """A stack dropped with entries brought back ahead of their pops (a run that failed in
    its backward loop): their device buffers stay out of the pool until the copies into
    them are done -- nothing on the compute stream waited for those copies, so a buffer
    the pool handed out again could still be written by its old copy."""
    gpu.configure(None, 0.0)                    # every saved value swaps
    gpu.swapper.reset()
    stack = S.GpuStackStore("s", True, gpu)
    n = 3 * S.PREFETCH_ITEMS
    for k in range(n):
        stack.push(_fill(gpu, k))
    _settle(gpu.swapper)
    gpu.h2d.synchronize()
    stack.pop()                                 # fetched, and the next ones ahead
    ahead = [r for r in stack.items if type(r) is S._Rec and r.state == S._Rec.IN]
    assert len(ahead) == S.PREFETCH_ITEMS
    for s in (gpu.compute, gpu.h2d, gpu.d2h):
        s.synchronize()
    running = _Running()                        # stands for their copy, still running
    for rec in ahead:
        rec.ev_in = running
    in_use = gpu.used_bytes()
    del stack, ahead, rec
    gc.collect()
    assert gpu.used_bytes() == in_use           # the buffers wait for their copy
    running.done = True
    gpu.collect()
    gc.collect()
    assert gpu.used_bytes() <= in_use - S.PREFETCH_ITEMS * MB


class _Running:
    """An event whose `done` the test sets (cupy's Event has `done`)."""

    done = False


def test_the_same_buffer_pushed_twice_moves_once(gpu):
    gpu.configure(None, 0.0)
    gpu.swapper.reset()
    a, b = S.GpuStackStore("a", True, gpu), S.GpuStackStore("b", True, gpu)
    x = _fill(gpu, 7)
    out = gpu.stats["swap_outs"]
    gpu.configure(None, 1.0)                    # nothing owed while the pushes go on
    a.push(x)
    b.push(x)                                   # (c(t) of an LSTM is c_prev of t + 1)
    del x
    for k in range(S.PUMP_BATCH):
        a.push(_fill(gpu, k))
    gpu.configure(None, 0.0)
    _settle(gpu.swapper)
    assert b.items[0] is a.items[0] and a.items[0].refs == 2
    assert gpu.stats["swap_outs"] - out == 1 + S.PUMP_BATCH
    for k in range(S.PUMP_BATCH - 1, -1, -1):
        a.pop()
    for s in (a, b):
        np.testing.assert_array_equal(gpu.cp.asnumpy(s.pop()), np.full(MB // 4, 7, np.float32))


def test_a_value_something_else_holds_stays_on_the_device(gpu):
    """A saved value another object holds (a variable's array, a TensorArray's element)
    would not free its memory by moving: it stays, and the next entries pay."""
    stack, held, kept = _pushed_and_settled(gpu, lambda k, x: x if k < 3 else None)
    assert _states(stack) == [None] * 3 + [S._Rec.HOST] * 5, _why(gpu.swapper)
    assert gpu.stats["swap_kept"] - kept == 3
    for k in range(7, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()), np.full(MB // 4, k, np.float32))


def test_a_stack_of_values_held_elsewhere_is_passed_over(gpu):
    """A variable's value pushed every iteration (the same array each time): after
    HELD_RUN entries in a row held elsewhere, the stack's later entries are passed over
    without a look, and another stack's pay what is owed."""
    gpu.configure(None, 1.0)
    gpu.swapper.reset()
    sw = gpu.swapper
    kept = gpu.stats["swap_kept"]
    weights, saved = S.GpuStackStore("w", True, gpu), S.GpuStackStore("s", True, gpu)
    w = _fill(gpu, 9)                           # the variable holds it
    n = 3 * S.HELD_RUN
    for k in range(n):
        weights.push(w)
        saved.push(_fill(gpu, k))
    gpu.configure(None, 0.0)
    _settle(sw)
    assert weights.held and _states(weights) == [None] * n
    assert gpu.stats["swap_kept"] - kept == n - S.KEEP_NEWEST
    assert _states(saved) == [S._Rec.HOST] * n, _why(sw)
    for k in range(n - 1, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(saved.pop()), np.full(MB // 4, k, np.float32))
        assert weights.pop() is w


def test_the_newest_entries_held_elsewhere_are_looked_at_again(gpu):
    """A loop still holds the values it just pushed: among a stack's newest entries, one
    held elsewhere is not passed over for good, and moves once let go."""
    gpu.configure(None, 0.0)
    gpu.swapper.reset()
    sw = gpu.swapper
    stack = S.GpuStackStore("s", True, gpu)
    x = _fill(gpu, 1)
    stack.push(x)                               # the loop's variable still holds it
    _settle(sw)
    assert _states(stack) == [None]
    del x
    _settle(sw)
    assert _states(stack) == [S._Rec.HOST], _why(sw)
    np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()), np.full(MB // 4, 1, np.float32))


def test_swap_outs_wait_for_their_values_producers(gpu):
    """A batch's copies run on the d2h stream after an event recorded on the compute
    stream: one event per batch."""
    gpu.configure(None, 1.0)
    gpu.swapper.reset()
    sw = gpu.swapper
    stack = S.GpuStackStore("s", True, gpu)
    for k in range(4):
        stack.push(_fill(gpu, k))
    gpu.configure(None, 0.0)
    sw.owed = 4 * MB
    marks = gpu.compute_marks
    sw.pump(force=True)
    assert gpu.compute_marks == marks + 1
    _settle(sw)
    assert _states(stack) == [S._Rec.HOST] * 4, _why(sw)
    for k in range(3, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()), np.full(MB // 4, k, np.float32))


def test_throttling_moves_tracked_values_out_to_make_room(gpu):
    base = gpu.used_bytes()
    gpu.configure(base + 64 * MB, 0.9)
    gpu.swapper.reset()
    stack = S.GpuStackStore("s", True, gpu)
    out = gpu.stats["swap_out_bytes"]
    for k in range(50):        # under the threshold (~58 MB)
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
    stack = S.GpuStackStore("s", True, gpu)
    for k in range(10):
        stack.push(_fill(gpu, k))
    _settle(gpu.swapper)
    used = gpu.used_bytes()
    del stack
    gc.collect()
    gpu.swapper.reset()
    assert not gpu.swapper.stacks and not gpu.swapper.host
    assert gpu.used_bytes() <= used


def test_throttling_shows_in_the_trace(gpu):
    base = gpu.used_bytes()
    gpu.configure(base + 64 * MB, 0.9)
    gpu.swapper.reset()
    stack = S.GpuStackStore("s", True, gpu)
    for k in range(50):
        stack.push(_fill(gpu, k))
    scope = gpu.begin_trace()
    try:
        big = gpu.alloc((24 * MB // 4,), np.float32, "a test allocation")
    finally:
        events = gpu.end_trace(scope)
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
    stack = S.GpuStackStore("s", True, gpu)
    for k in range(40):
        stack.push(_fill(gpu, k))
    _settle(sw)
    states = _states(stack)
    last_out = max(i for i, s in enumerate(states) if s == S._Rec.HOST)
    fetched = gpu.stats["swap_ins"]
    for k in range(39, last_out, -1):            # the plain values above the swapped ones
        stack.pop()
    assert gpu.stats["swap_ins"] > fetched       # prefetched before any swapped pop
    assert _states(stack)[last_out] == S._Rec.IN
    for k in range(last_out, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                      np.full(MB // 4, k, np.float32))


def test_pinned_blocks_go_back_to_the_device_and_are_reused(gpu, monkeypatch):
    """A swapped value's pinned block returns to its GPU's idle blocks when its entry is
    popped, and the next step's swap-outs of that size take it again instead of a new
    cudaHostAlloc."""
    gpu.configure(None, 0.0)
    gpu.swapper.reset()
    drop_idle_blocks(gpu)
    made = []
    alloc = gpu.cp.cuda.alloc_pinned_memory
    monkeypatch.setattr(gpu.cp.cuda, "alloc_pinned_memory",
                        lambda n: made.append(n) or alloc(n))

    def step():
        stack = S.GpuStackStore("s", True, gpu)
        for k in range(2 * S.PUMP_BATCH):
            stack.push(_fill(gpu, k))
        _settle(gpu.swapper)
        bases = {it.host_ptr for it in stack.items}
        for k in range(2 * S.PUMP_BATCH - 1, -1, -1):
            np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                          np.full(MB // 4, k, np.float32))
        del stack
        gpu.h2d.synchronize()
        gc.collect()
        gpu.collect()
        return bases

    n = 2 * S.PUMP_BATCH
    bases = step()
    assert len(bases) == n and len(made) == n                # a block per value
    idle = {p for lst in gpu._swap_blocks.values() for p in lst}
    assert idle == bases
    assert gpu._swap_idle_bytes == sum(size * len(lst) for size, lst in gpu._swap_blocks.items())
    assert step() == bases and len(made) == n                # the same blocks again


def test_a_pinned_block_dropped_in_a_reference_cycle_is_not_handed_out_twice(
        gpu, monkeypatch):
    """tests/core/test_pinned_swap_blocks.py with cupy's own pinned pool (on the
    stand-in, a pool built like it)."""
    from dcf import gpu_devices

    if gpu_devices.is_fake():
        monkeypatch.setattr(gpu.cp.cuda, "alloc_pinned_memory", PinnedPool().malloc)
    check_block_dropped_in_a_cycle(gpu)


def test_a_stack_that_dies_in_a_cycle_leaves_the_next_stacks_values_intact(gpu, monkeypatch):
    """tests/core/test_pinned_swap_blocks.py's end-to-end check with cupy's own pool."""
    from dcf import gpu_devices

    if gpu_devices.is_fake():
        monkeypatch.setattr(gpu.cp.cuda, "alloc_pinned_memory", PinnedPool().malloc)
    check_values_after_a_stack_dies_in_a_cycle(gpu)


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
    stack, views, kept = _pushed_and_settled(        # the odd values' last halves live on
        gpu, lambda k, x: x[MB // 4:] if k % 2 else None, 2 * MB)
    states = _states(stack)
    assert states[0::2] == [S._Rec.HOST] * 4
    assert states[1::2] == [None] * 4          # stayed, as they were pushed
    assert gpu.stats["swap_kept"] - kept == 3  # (the newest is looked at again later)
    for k in range(7, -1, -1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                      np.full(MB // 2, k, np.float32))
    for k, v in zip(range(1, 8, 2), views):
        np.testing.assert_array_equal(gpu.cp.asnumpy(v), np.full(MB // 4, k, np.float32))


def test_saved_views_of_one_buffer_move_together(gpu):
    """Views of one buffer all saved move out once the last of them comes up (together
    they hold the memory); while an unsaved view lives on, none moves."""
    gpu.configure(None, 1.0)                    # nothing owed while the pushes go on
    gpu.swapper.reset()
    sw = gpu.swapper
    stack = S.GpuStackStore("s", True, gpu)
    a = _fill(gpu, 1, 2 * MB)
    b = _fill(gpu, 2, 2 * MB)
    views = [a[:MB // 4], a[MB // 4:], b[:MB // 4], b[MB // 4:]]
    other = b[:8]                               # not saved: b's memory stays
    del a, b
    for v in views:
        stack.push(v)
    del views, v
    gpu.configure(None, 0.0)
    _settle(sw)
    assert _states(stack) == [S._Rec.HOST] * 2 + [None] * 2
    for k in (2, 2, 1, 1):
        np.testing.assert_array_equal(gpu.cp.asnumpy(stack.pop()),
                                      np.full(MB // 4, k, np.float32))
    np.testing.assert_array_equal(gpu.cp.asnumpy(other), np.full(8, 2, np.float32))
