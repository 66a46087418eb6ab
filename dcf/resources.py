"""Per-device state that outlives a run: variables, random generators, queues."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class VarStore:
    """The storage of one variable on its device.

    A numpy value is made read-only as it is stored: a read of the variable (a fetch, a
    value the user keeps) is its buffer itself, and must not be a way to change it. An
    update writes in place only where nothing else refers to the buffer (state_ops's
    `_writable`), and the buffer is read-only again once stored. An update that reads
    the value it replaces (assign_add, a scatter, Adam's) holds `lock` meanwhile, so
    that runs in several threads lose none of each other's updates (as TF's resource
    variables); reads take no lock, so a read alongside an in-place update may see it
    half done (as TF1's ref variables without use_locking)."""

    __slots__ = ("name", "_value", "lock")

    def __init__(self, name: str, value: Any = None) -> None:
        self.name = name
        self._value = None
        self.lock = threading.Lock()
        if value is not None:
            self.value = value

    @property
    def value(self) -> Any:
        return self._value

    @value.setter
    def value(self, v: Any) -> None:
        if type(v) is np.ndarray and v.flags.writeable:
            v.flags.writeable = False
        self._value = v

    @property
    def initialized(self) -> bool:
        return self._value is not None

    def __repr__(self) -> str:
        return f"VarStore({self.name!r}, {self._value!r})"


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

    def bind_kernel(self, p: Any, kw: dict) -> Any:
        """The callable that runs node `p` (plan.py calls this for every kernel node).

        A kernel may carry a `bind(xp, **attrs)` attribute returning a callable
        specialised for this node's attrs (or None): it must compute exactly what
        `kernel(xp, *inputs, **attrs)` computes, minus the per-call cost of a keyword
        partial and of re-reading the attrs.
        """
        kernel = p.kernel
        binder = getattr(kernel, "bind", None)
        if binder is not None:
            fn = binder(self.xp, **kw)
            if fn is not None:
                return fn
        return functools.partial(kernel, self.xp, **kw) if kw else \
            functools.partial(kernel, self.xp)

    def rng(self, key: str, seed: int | None) -> np.random.Generator:
        """A generator persistent for this session: seeded ops repeat across sessions."""
        g = self._rngs.get(key)
        return g if g is not None else \
            self._made(self._rngs, key, lambda: np.random.default_rng(seed))

    def queue(self, name: str, factory: Any) -> Any:
        q = self.queues.get(name)
        return q if q is not None else self._made(self.queues, name, factory)

    def _made(self, table: dict, key: str, make: Any) -> Any:
        """table[key], made by `make()` where it is missing: once, also where runs in
        several threads ask for it together (each would have made its own: a queue's
        elements went into one that the other runs never saw)."""
        with self._lock:
            v = table.get(key)
            if v is None:
                v = table[key] = make()
            return v
