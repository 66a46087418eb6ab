"""Helpers the GPU benchmarks share: device discovery, the card's name, memory
readings, and the skip line a GPU benchmark prints where there is no GPU."""

from __future__ import annotations

import datetime
import gc
import json
import os
from typing import Any


def gpu_count() -> int:
    from dcf import gpu_devices

    return gpu_devices.count()


def card_name(index: int = 0) -> str:
    try:
        from dcf import gpu_devices

        if gpu_devices.is_fake():
            return "fake-gpu (DCF_FAKE_GPUS)"
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception as e:  # no cupy / no device
        return f"unknown ({type(e).__name__})"


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def devices(n: int, cpu: bool) -> list[str]:
    return [f"/cpu:{k}" if cpu else f"/gpu:{k}" for k in range(n)]


def skip(bench: str, reason: str, out: str | None = None) -> None:
    """Print the one-line JSON of a benchmark that could not run here, and exit 0."""
    payload = {"bench": bench, "config": {"skipped": reason}, "results": [], "ratios": {}}
    print(f"== {bench} ==\nskipped: {reason}")
    print(json.dumps(payload))
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(payload, f)
            f.write("\n")
    raise SystemExit(0)


def gpu_device(index: int = 0) -> Any:
    from dcf.actors.gpu import GpuDevice

    return GpuDevice.get(index)


def release_device_memory() -> None:
    """Drop garbage and the cupy pool's cached blocks (and torch's, if loaded)."""
    gc.collect()
    try:
        from dcf import gpu_devices

        if gpu_devices.count():
            from dcf.actors.gpu import GpuDevice

            for g in list(GpuDevice._instances.values()):
                g.collect()
                g.activate()
                g.pool.free_all_blocks()
    except Exception:
        pass
    import sys

    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def pool_peak(index: int = 0) -> int:
    """High-water mark of dcf's device pool since the last release_device_memory()."""
    g = gpu_device(index)
    g.activate()
    return int(g.pool.total_bytes())


def pool_used(index: int = 0) -> int:
    return gpu_device(index).used_bytes()


def sync_all() -> None:
    from dcf import gpu_devices

    if gpu_devices.count():
        cp = gpu_devices.backend()
        for k in range(gpu_devices.count()):
            with cp.cuda.Device(k):
                cp.cuda.runtime.deviceSynchronize()
