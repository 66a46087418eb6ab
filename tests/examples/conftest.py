"""Load the scripts in examples/ (not a package) as modules for their tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def load(name: str):
    """examples/NAME.py as a module named NAME (loaded once per test session)."""
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__file__", None) == str(EXAMPLES / f"{name}.py"):
        return mod
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def example():
    """`example("dqn_cartpole")` -> the module."""
    return load
