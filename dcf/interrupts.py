"""Ctrl-C during a synchronous run.

Python's own SIGINT handler raises KeyboardInterrupt in whatever bytecode runs when the
signal comes: inside the event loop's machinery (a handle popped and never run: the loop
then waits for it forever, bpo-39622), inside a `with lock:` of user code or of a device's
bookkeeping (the lock stays held, the pool half-updated), or in a place whose exception
is dropped (the interrupt is lost and the run goes on). While a run is driven from the
main thread and the program kept Python's default handler, `Interrupt` takes SIGINT over:
the first one only records the request (and calls `on_first`: cancel the run's task);
the run stops at its next check or yield, and KeyboardInterrupt is raised there, once. A
second SIGINT before then raises where it lands (an escape for a run stuck in user code).
A handler of the program's own is left alone. Cost per run: ~1.9 us (through the C
module; `signal.signal`'s enum wrapping costs ~4 us a call).
"""

from __future__ import annotations

import _signal  # the C module under `signal`: the same calls without the enum wrapping
import signal
import threading
from typing import Any, Callable

__all__ = ["Interrupt"]

_SIGINT = int(signal.SIGINT)
_DEFAULT = signal.default_int_handler
_MAIN = threading.main_thread().ident


class Interrupt:
    """A context in which the first SIGINT sets `requested` (see the module's text)."""

    __slots__ = ("requested", "on_first", "_handler")

    def __init__(self, on_first: Callable[[], None] | None = None) -> None:
        self.requested = False
        self.on_first = on_first
        self._handler: Any = None

    def __enter__(self) -> Interrupt:
        if threading.get_ident() == _MAIN and _signal.getsignal(_SIGINT) is _DEFAULT:
            h = self._handler = self._on_sigint
            try:
                _signal.signal(_SIGINT, h)
            except ValueError:          # (not the main interpreter)
                self._handler = None
        return self

    def __exit__(self, *exc: Any) -> None:
        h = self._handler
        if h is not None:
            self._handler = None
            if _signal.getsignal(_SIGINT) is h:
                _signal.signal(_SIGINT, _DEFAULT)

    def settle(self, wait: Callable[[], Any], cancelled: type) -> Any:
        """`wait()`'s result, where the first SIGINT cancelled what it waits for (raising
        `cancelled`, or a failure while it unwound) or came after: KeyboardInterrupt, once."""
        try:
            result = wait()
        except cancelled:
            if self.requested:
                raise KeyboardInterrupt from None
            raise
        except Exception as e:
            if self.requested:      # failed while it unwound: the user asked to stop
                raise KeyboardInterrupt from e
            raise
        if self.requested:          # it came after the run's last yield
            raise KeyboardInterrupt
        return result

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.on_first is not None:
            self.on_first()
