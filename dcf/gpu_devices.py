"""How many GPUs this process can use (0 without cupy or without a GPU), and the array
module that backs them.

`DCF_FAKE_GPUS=N` (tests on machines without a GPU) reports N GPUs backed by
`dcf.actors._fake_cuda`, a stand-in for cupy that keeps arrays in host memory but
refuses implicit host conversion as cupy does.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["count", "backend", "is_fake", "array_module", "stand_in_gpus"]


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


def why_none() -> str:
    """What an error about a missing GPU adds when `count()` is 0 because cupy is not
    installed ("" otherwise)."""
    if is_fake() or importlib.util.find_spec("cupy") is not None:
        return ""
    return (": cupy is not installed; pip install 'dcf[gpu]' for CUDA 12 drivers, "
            "'dcf[gpu-cuda13]' for CUDA 13")


def is_fake() -> bool:
    return bool(os.environ.get("DCF_FAKE_GPUS"))


def array_module(*values: Any) -> Any:
    """numpy, or the GPU array module when any of `values` is a device array."""
    import numpy as np

    for v in values:
        if hasattr(v, "__cuda_array_interface__"):
            return backend()
    return np


@contextlib.contextmanager
def stand_in_gpus(n: int = 2) -> Iterator[Any]:
    """`n` stand-in GPUs (DCF_FAKE_GPUS) while the block runs, for tests and probes on
    machines without one; the process's own GPUs, real or stand-in, after. Yields the
    stand-in array module."""
    from dcf.actors import gpu as gpu_mod

    old = os.environ.get("DCF_FAKE_GPUS")
    saved = dict(gpu_mod.GpuDevice._instances)
    os.environ["DCF_FAKE_GPUS"] = str(n)
    count.cache_clear()
    backend.cache_clear()
    gpu_mod.GpuDevice._instances.clear()
    try:
        yield backend()
    finally:
        if old is None:
            os.environ.pop("DCF_FAKE_GPUS", None)
        else:
            os.environ["DCF_FAKE_GPUS"] = old
        count.cache_clear()
        backend.cache_clear()
        gpu_mod.GpuDevice._instances.clear()
        gpu_mod.GpuDevice._instances.update(saved)
        gpu_mod._ACTIVE[:] = [None, None]
