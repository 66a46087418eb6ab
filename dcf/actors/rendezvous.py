"""The rendezvous: where a Send's value meets its Recv, keyed by (step, edge, tag).

Each slot holds either a value that arrived first or the callback of a Recv that is
waiting. Same-process hand-off is a synchronous dictionary operation: nothing is
serialised. A remote transport plugs in by calling `send` when a message arrives, and
Sends whose Recv lives in another process go out through `remote_send(peer, key, value)`.
A value that arrives for a step that already ended (a late message of an aborted step)
is dropped, so nothing accumulates.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["LocalRendezvous", "RendezvousClosed"]


_ENDED_KEPT = 4096  # ended steps remembered, to drop their late messages


class RendezvousClosed(Exception):
    """The step this key belongs to was aborted."""


class LocalRendezvous:
    """Send/Recv hand-off table for the devices of one process."""

    def __init__(self) -> None:
        self._values: dict[tuple, Any] = {}
        self._waiters: dict[tuple, Callable[[Any], None]] = {}
        self._aborted: dict[Any, BaseException] = {}
        self._ended: OrderedDict[Any, None] = OrderedDict()
        self.remote_send: Callable[[str, tuple, Any], Any] | None = None
        # Several values for one peer at once (same effect as remote_send of each).
        self.remote_send_batch: Callable[[str, list], Any] | None = None
        # While a message of several values is delivered: the consumers (device actors)
        # to wake once all of them are in (see `deliver_all`); None otherwise.
        self.deferred: list | None = None

    def send(self, key: tuple, value: Any) -> None:
        """Deliver `value` (or DEAD) for `key`: to its waiting Recv, or keep it."""
        cb = self._waiters.pop(key, None)
        if cb is not None:
            cb(value)
        elif key[0] not in self._aborted and key[0] not in self._ended:
            self._values.setdefault(key, value)   # a slot takes one value: the first

    def deliver_all(self, items: list[tuple[tuple, Any]]) -> None:
        """`send` each (key, value), then wake each consumer that got one, once (at
        `release` instead, while `hold` is in effect)."""
        if self.deferred is not None:   # held: the wake-ups wait for release()
            for key, value in items:
                self.send(key, value)
            return
        self.deferred = woken = []
        try:
            for key, value in items:
                self.send(key, value)
        finally:
            self.deferred = None
        for consumer in woken:
            consumer.on_values()

    def hold(self) -> None:
        """Until `release`, values are delivered at once but their consumers are woken
        later, once each (a transport that reads several messages in one go)."""
        if self.deferred is None:
            self.deferred = []

    def release(self) -> None:
        """Wake each consumer that got values since `hold`, once."""
        woken, self.deferred = self.deferred, None
        for consumer in woken or ():
            consumer.on_values()

    def recv(self, key: tuple, callback: Callable[[Any], None]) -> None:
        """Call `callback(value)` when the value for `key` is there (maybe now)."""
        err = self._aborted.get(key[0])
        if err is not None:
            raise RendezvousClosed(str(err))
        try:
            v = self._values.pop(key)
        except KeyError:
            self._waiters[key] = callback
            return
        callback(v)

    def abort_step(self, step: Any, error: BaseException) -> None:
        """Drop every slot of `step`: a failed or cancelled step leaves nothing behind."""
        self._aborted[step] = error
        _drop_step(self._values, self._waiters, step=step)

    def end_step(self, step: Any) -> None:
        """Forget `step`: its slots go, and values that still arrive for it are dropped."""
        self._ended[step] = None
        if len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)
        self._aborted.pop(step, None)
        _drop_step(self._values, self._waiters, step=step)

    def pending(self, step: Any | None = None) -> int:
        return sum(1 for t in (self._values, self._waiters) for k in list(t)
                   if step is None or k[0] == step)


def _drop_step(*tables: dict, step: Any) -> None:
    """Drop `step`'s keys from each table. The runs of an AsyncSession used from several
    threads' event loops share one rendezvous, so another thread may add or remove its
    own steps' keys meanwhile: the keys are looked at in a copy (list() of a dict is
    taken whole, under the GIL), not while iterating over the dict."""
    for table in tables:
        for k in [k for k in list(table) if k[0] == step]:
            table.pop(k, None)
