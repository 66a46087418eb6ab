"""How many GPUs this process can use (0 without cupy or without a GPU), and the array
module that backs them.

`DCF_FAKE_GPUS=N` (tests on machines without a GPU) reports N GPUs backed by
`dcf.actors._fake_cuda`, a stand-in for cupy that keeps arrays in host memory but
refuses implicit host conversion as cupy does.
"""

from __future__ import annotations

import functools
import os
from typing import Any

__all__ = ["count", "backend", "is_fake", "array_module"]


@functools.lru_cache(maxsize=1)
def count() -> int:
    fake = os.environ.get("DCF_FAKE_GPUS")
    if fake:
        from dcf.actors import _fake_cuda

        _fake_cuda.set_device_count(int(fake))
        return int(fake)
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


@functools.lru_cache(maxsize=1)
def backend() -> Any:
    """The cupy module (or its stand-in under DCF_FAKE_GPUS)."""
    if os.environ.get("DCF_FAKE_GPUS"):
        count()
        from dcf.actors import _fake_cuda

        return _fake_cuda
    import cupy

    return cupy


def is_fake() -> bool:
    return bool(os.environ.get("DCF_FAKE_GPUS"))


def array_module(*values: Any) -> Any:
    """numpy, or the GPU array module when any of `values` is a device array."""
    import numpy as np

    for v in values:
        if hasattr(v, "__cuda_array_interface__"):
            return backend()
    return np
