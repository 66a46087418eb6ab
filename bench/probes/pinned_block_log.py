"""A pytest plugin that watches the GPUs' pinned swap blocks (bench/NOTES.md, "GPU,
session 25"): prints a line starting "PINNED" where a block is handed out while an
earlier hand-out of it is still out, or given back twice, with where each happened, and
each give-back made during a garbage collection (with its generation). How the block
shared by two swapped entries was found:

    python -m pytest -p bench.probes.pinned_block_log -s tests/gpu/test_gpu_swapper.py
"""
import gc
import traceback

from dcf.actors import gpu as G

_state: dict = {}           # address -> ("out" | "idle", where)
_collecting: list = [None]  # the generation being collected, None outside collections
_pinned_buffer = G.GpuDevice.pinned_buffer
_swap_block_done = G.GpuDevice._swap_block_done


def _where() -> str:
    return "".join(traceback.format_stack(limit=8)[:-2])


def _on_gc(phase: str, info: dict) -> None:
    _collecting[0] = info.get("generation") if phase == "start" else None


def pinned_buffer(self, nbytes):
    owner, ptr = _pinned_buffer(self, nbytes)
    prev = _state.get(ptr)
    if prev is not None and prev[0] == "out":
        print(f"\nPINNED {ptr:#x} handed out while out; before:\n{prev[1]}now:\n{_where()}")
    _state[ptr] = ("out", _where())
    return owner, ptr


def swap_block_done(self, size, ptr):
    prev = _state.get(ptr)
    if prev is not None and prev[0] == "idle":
        print(f"\nPINNED {ptr:#x} given back twice; before:\n{prev[1]}now:\n{_where()}")
    if _collecting[0] is not None:
        print(f"\nPINNED {ptr:#x} given back in a collection of generation {_collecting[0]}")
    _state[ptr] = ("idle", _where())
    return _swap_block_done(self, size, ptr)


gc.callbacks.append(_on_gc)
G.GpuDevice.pinned_buffer = pinned_buffer
G.GpuDevice._swap_block_done = swap_block_done
