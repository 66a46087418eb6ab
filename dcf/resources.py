"""Per-device state that outlives a run: variables, random generators, queues."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class VarStore:
    """The storage of one variable on its device."""

    name: str
    value: Any = None

    @property
    def initialized(self) -> bool:
        return self.value is not None


@dataclass
class DeviceResources:
    """State owned by one device of one session.

    Kernels of resource ops receive it as `res=`.
    """

    device: str = "/cpu:0"
    xp: Any = np
    variables: dict[str, VarStore] = field(default_factory=dict)
    queues: dict[str, Any] = field(default_factory=dict)
    _rngs: dict[str, np.random.Generator] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def variable(self, name: str) -> VarStore:
        v = self.variables.get(name)
        if v is None:
            with self._lock:
                v = self.variables.setdefault(name, VarStore(name))
        return v

    def rng(self, key: str, seed: int | None) -> np.random.Generator:
        """A generator persistent for this session: seeded ops repeat across sessions."""
        g = self._rngs.get(key)
        if g is None:
            g = self._rngs[key] = np.random.default_rng(seed)
        return g

    def queue(self, name: str, factory: Any) -> Any:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = factory()
        return q
