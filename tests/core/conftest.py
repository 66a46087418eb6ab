"""Fixtures of the core tests."""

from __future__ import annotations

import contextlib
import os

import pytest


@contextlib.contextmanager
def _stand_in_gpus(n: int):
    """`n` stand-in GPUs while the block runs (the process's real or stand-in ones
    after)."""
    from dcf import gpu_devices
    from dcf.actors import gpu as gpu_mod

    old = os.environ.get("DCF_FAKE_GPUS")
    saved = dict(gpu_mod.GpuDevice._instances)
    os.environ["DCF_FAKE_GPUS"] = str(n)
    gpu_devices.count.cache_clear()
    gpu_devices.backend.cache_clear()
    gpu_mod.GpuDevice._instances.clear()
    try:
        yield gpu_devices.backend()
    finally:
        if old is None:
            os.environ.pop("DCF_FAKE_GPUS", None)
        else:
            os.environ["DCF_FAKE_GPUS"] = old
        gpu_devices.count.cache_clear()
        gpu_devices.backend.cache_clear()
        gpu_mod.GpuDevice._instances.clear()
        gpu_mod.GpuDevice._instances.update(saved)
        gpu_mod._ACTIVE[:] = [None, None]


@pytest.fixture
def fake_gpus():
    """Two stand-in GPUs for this test only."""
    with _stand_in_gpus(2) as cp:
        yield cp


@pytest.fixture
def three_fake_gpus():
    """Three stand-in GPUs for this test only."""
    with _stand_in_gpus(3) as cp:
        yield cp


@pytest.fixture
def sources(monkeypatch):
    """The generated source of every compiled root built while the test runs."""
    import dcf.frame_compiler as fc

    out: list[str] = []
    orig = fc._Codegen.build_root

    def build_root(self):
        fn = orig(self)
        out.append("\n".join(self.lines))
        return fn

    monkeypatch.setattr(fc._Codegen, "build_root", build_root)
    return out
