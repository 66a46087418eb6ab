"""Letting other threads have the GIL while a run goes on.

A run on an event loop lets go of the GIL at every turn of the loop (its select) and takes
it back at once, and an inline run whose kernels let go of it (ctypes, cupy's launches)
does the same between kernels: far more often than the interpreter's switch interval
(5 ms). Each release restarts the wait of a thread that wants the GIL, which then never
asks for it: it starved for up to a second at a time (a service's event loop in the main
thread while a run goes on in an executor thread: tests/core/test_threads_share_the_gil.py,
bench/NOTES.md "GIL and Ctrl-C"). So the places where a run hands control back (a
partition's pump, an inline run's checks) call `share_if_due(now)`: now and then, where
other threads exist, it sleeps _SHARE_S (~75 us on a VM whose shortest sleep is ~55 us),
long enough for a waiter to wake and take the GIL. When one did (the sleep came back
late), the next share is due a switch interval later; while none does, the interval
doubles up to _IDLE_S (a cost of ~0.75% of a run's time where idle threads exist; none
where there are no other threads).
"""

from __future__ import annotations

import threading
import time

__all__ = ["share_if_due"]

_SHARE_S = 0.00002   # how long to let go of the GIL for other threads ...
_BUSY_S = 0.005      # ... this often while one takes it (the switch interval) ...
_IDLE_S = 0.01       # ... backing off to this while none does
_RAN_S = 0.0005      # a sleep this late means another thread ran meanwhile


class _Sharing:
    due = 0.0
    every = _BUSY_S


_state = _Sharing()


def share_if_due(now: float) -> float:
    """Let a waiting thread have the GIL if one is due (`now`: time.perf_counter());
    return the time after it (`now` where nothing was shared)."""
    st = _state
    if now < st.due:
        return now
    if threading.active_count() > 1:
        time.sleep(_SHARE_S)
        after = time.perf_counter()
        if after - now > _RAN_S:
            st.every = _BUSY_S
        elif st.every < _IDLE_S:
            st.every *= 2
        st.due = after + st.every
        return after
    st.due = now + _IDLE_S
    return now
