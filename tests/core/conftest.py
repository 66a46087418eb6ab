"""Fixtures of the core tests."""

from __future__ import annotations

import pytest

from dcf.gpu_devices import stand_in_gpus as _stand_in_gpus


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
