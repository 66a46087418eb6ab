"""GPU tests: every test here is marked `gpu` and runs on a CUDA GPU with cupy, or on
CPU machines under DCF_FAKE_GPUS=N (the cupy stand-in in dcf/actors/_fake_cuda.py,
which refuses implicit host conversions as cupy does). Without either, the whole
directory is skipped."""

from __future__ import annotations

import os

import pytest


def _gpu_reason() -> str | None:
    if os.environ.get("DCF_FAKE_GPUS"):
        return None
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install
        return f"cupy cannot be imported ({type(e).__name__})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"cupy sees no CUDA device ({type(e).__name__})"
    return None if n > 0 else "cupy sees no CUDA device"


_REASON = _gpu_reason()


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {_REASON}") if _REASON else None
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if skip is not None:
                item.add_marker(skip)


@pytest.fixture
def gpu_count() -> int:
    from dcf import gpu_devices

    return gpu_devices.count()


def pytest_report_header(config):
    if _REASON is not None:
        return f"tests/gpu: skipped ({_REASON})"
    from dcf import gpu_devices

    fake = " (DCF_FAKE_GPUS stand-in)" if gpu_devices.is_fake() else ""
    return f"tests/gpu: {gpu_devices.count()} GPU(s){fake}"
