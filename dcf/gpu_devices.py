"""How many GPUs this process can use (0 without cupy or without a GPU)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def count() -> int:
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0
