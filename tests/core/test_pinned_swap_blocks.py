"""A GPU's pinned swap blocks and cyclic garbage (stand-in GPUs; tests/gpu runs the same
check with cupy's own pool).

cupy's pinned memory pool hands out a pooled block that gives its memory back to the pool
from a Python `__del__` (cupy/cuda/pinned_memory.pyx). A swapped stack entry's owner puts
its block back among its GPU's idle blocks when the entry is gone. When entries die in
cyclic garbage -- a failed run's traceback holding its stack -- the collector runs every
finalizer of the cycle, so a block that an owner held would be freed to cupy's pool and
kept idle by the GPU at once, and two swap-outs would write the same memory (seen on two
H200: pops returned another entry's value; bench/NOTES.md, "GPU, session 25")."""

from __future__ import annotations

import gc

import numpy as np

from dcf.actors import gpu as G

MB = 1 << 20


class PinnedPool:
    """cupy's pinned pool as cupy builds it: a pooled block is a Python object that puts
    its memory back in the pool from `__del__`, behind a pointer object that holds it.
    For the stand-in GPUs, whose own pinned buffers are plain bytearrays."""

    def __init__(self):
        self.free: dict = {}

    def malloc(self, size):
        lst = self.free.get(size)
        buf = lst.pop() if lst else np.empty(size, np.uint8)
        return _PinnedPointer(_PooledBlock(self, buf))


class _PooledBlock:
    def __init__(self, pool, buf):
        self.pool, self.buf, self.ptr = pool, buf, buf.ctypes.data

    def __del__(self):
        self.pool.free.setdefault(self.buf.size, []).append(self.buf)


class _PinnedPointer:
    def __init__(self, mem):
        self.mem, self.ptr = mem, mem.ptr


def drop_idle_blocks(gpu) -> None:
    """Forget the GPU's idle pinned swap blocks (back to the pinned pool)."""
    for lst in gpu._swap_blocks.values():
        for p in lst:
            del gpu._swap_mem[p]
    gpu._swap_blocks.clear()
    gpu._swap_idle_bytes = 0


def check_block_dropped_in_a_cycle(gpu) -> None:
    """An entry's owner dropped in a reference cycle: its block is idle on the GPU, and
    the pinned pool hands out another one."""
    drop_idle_blocks(gpu)
    owner, ptr = gpu.pinned_buffer(MB)
    size = G.pinned_size(MB)
    cycle: list = [owner]
    cycle.append(cycle)
    del owner, cycle
    gc.collect()
    assert gpu._swap_blocks[size] == [ptr]           # kept for the next swap-out
    other = gpu.cp.cuda.alloc_pinned_memory(size)    # the pool's: another block
    assert other.ptr != ptr
    again, ptr2 = gpu.pinned_buffer(MB)
    assert ptr2 == ptr
    del again, other
    drop_idle_blocks(gpu)


def check_values_after_a_stack_dies_in_a_cycle(gpu) -> None:
    """The failure as it showed: a stack whose entries all moved to the host dies in
    cyclic garbage; a new stack's entries then move out in two batches and must come
    back as they were pushed."""
    from dcf.actors import gpu_swap as S

    drop_idle_blocks(gpu)
    gpu.configure(None, 0.0)                  # every saved value swaps
    try:
        sw = gpu.swapper
        sw.reset()
        n = 2 * S.PUMP_BATCH
        old = S.GpuStackStore("old", True, gpu)
        for k in range(n):
            old.push(gpu.cp.full((MB // 4,), 100.0 + k, dtype=np.float32))
        settle(sw)
        cycle: list = [old]
        cycle.append(cycle)
        del old, cycle
        gc.collect()
        sw.reset()
        new = S.GpuStackStore("new", True, gpu)
        for k in range(2 * n):
            new.push(gpu.cp.full((MB // 4,), float(k), dtype=np.float32))
        settle(sw)
        assert gpu.stats["swap_outs"] >= 2 * n
        for k in range(2 * n - 1, -1, -1):
            np.testing.assert_array_equal(gpu.cp.asnumpy(new.pop()),
                                          np.full(MB // 4, k, np.float32))
    finally:
        gpu.configure(None, 0.7)
        gpu.swapper.reset()
        gc.collect()
        gpu.collect()
        drop_idle_blocks(gpu)


def settle(sw) -> None:
    """Every owed byte moved and every copy done (tests/gpu/test_gpu_swapper.py too)."""
    sw.tick(True)
    while sw.out or (sw.owed > 0 and sw._next()[0] is not None):
        sw.pump(force=True)
        if sw.out:
            sw.out[-1][1].synchronize()
        sw.collect()


def test_a_pinned_block_dropped_in_a_reference_cycle_is_not_handed_out_twice(
        fake_gpus, monkeypatch):
    monkeypatch.setattr(fake_gpus.cuda, "alloc_pinned_memory", PinnedPool().malloc)
    check_block_dropped_in_a_cycle(G.GpuDevice.get(0))


def test_an_idle_block_over_the_limit_goes_back_to_the_pool(fake_gpus, monkeypatch):
    """Past SWAP_BLOCKS_IDLE_MAX of idle blocks, a block given back leaves the GPU: the
    pool has it again."""
    pool = PinnedPool()
    monkeypatch.setattr(fake_gpus.cuda, "alloc_pinned_memory", pool.malloc)
    gpu = G.GpuDevice.get(0)
    drop_idle_blocks(gpu)
    size = G.pinned_size(MB)
    monkeypatch.setattr(G, "SWAP_BLOCKS_IDLE_MAX", size)
    a, pa = gpu.pinned_buffer(MB)
    b, pb = gpu.pinned_buffer(MB)
    del a                                          # idle: one block's worth
    assert gpu._swap_blocks[size] == [pa] and pa in gpu._swap_mem
    del b                                          # over the limit: back to the pool
    assert gpu._swap_blocks[size] == [pa] and pb not in gpu._swap_mem
    assert [x.ctypes.data for x in pool.free[size]] == [pb]
    drop_idle_blocks(gpu)


def test_a_stack_that_dies_in_a_cycle_leaves_the_next_stacks_values_intact(
        fake_gpus, monkeypatch):
    monkeypatch.setattr(fake_gpus.cuda, "alloc_pinned_memory", PinnedPool().malloc)
    check_values_after_a_stack_dies_in_a_cycle(G.GpuDevice.get(0))


class _Running:
    """An event whose copy is still running until the test says it is done."""
    done = False

    def synchronize(self):
        pass


def test_a_fetch_buffer_stays_alive_until_its_copy_is_done(fake_gpus, monkeypatch):
    """A device-to-host copy's pinned buffer, dropped by its caller before the copy is
    done (a run that failed with fetches on their way), stays out of the pinned pool
    until the copy's event is done: the pool would otherwise hand it out again (a
    staging buffer for an upload) while the old copy still writes it."""
    import weakref

    gpu = G.GpuDevice.get(0)
    gpu.activate()
    x = fake_gpus.arange(8, dtype=np.float32)
    running = _Running()
    record = gpu.record
    monkeypatch.setattr(gpu, "record",
                        lambda stream: running if stream is gpu.d2h else record(stream))
    host, ev = gpu.to_host_async(x, "fetch 0")
    assert ev is running
    kept = weakref.ref(host)
    del host
    gc.collect()
    gpu.collect()
    assert kept() is not None            # the copy may still write it
    running.done = True
    gpu.collect()
    gc.collect()
    assert kept() is None
