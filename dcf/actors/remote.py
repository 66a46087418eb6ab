"""The client <-> worker protocol: message names, keys, errors, and the loop thread.

Every message travels on the authenticated transport (`transport.py`): control messages
are msgpack maps (bulky payloads in the blob frame), tensors are data messages keyed
like rendezvous slots. A run looks like this::

    client -> worker   C {"type": "plan", "plan", "session", "compile"} + graph blob
                                                                  (once per plan)
    client -> worker   T (step, "!feed", (k,)) value              (the feeds it needs)
    client -> worker   C {"type": "run", "step", "plan", "session", "trace"}
    worker <-> worker  T (step, edge, tag) value | dead ...       (Send/Recv pairs; the
                                                                  values a burst sends
                                                                  one peer: one message)
    worker -> client   T (step, "!fetch", (k,)) value | dead      (its fetches)
    worker -> client   C {"type": "done", "step", "fired"} [+ trace blob]
                     | C {"type": "error", "step", "error", "message"}
    client -> worker   C {"type": "abort", "step"}                (timeout or failure)
    worker -> client   C {"type": "error", "step", ...}           (also when the worker
                                                                  aborts a step because
                                                                  the client went silent:
                                                                  the run fails, it never
                                                                  waits forever)
    client -> worker   C {"type": "release", "session"}           (session closed)

Every process also sends each peer a heartbeat every interval, from a thread of its own
(see `transport.py`): a kernel that holds a process's event loop (a slow py_func) does
not make it look dead; a killed or stopped process is still found out within the
heartbeat timeout.

ZeroMQ keeps messages of one sender to one receiver in order, so a worker has a run's
plan and feeds before its "run", and the client has a worker's fetches before its
"done". Only run start, completion and failure involve the client; Sends between
partitions go straight from worker to worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any

from dcf import errors
from dcf.actors.transport import BATCH_MAX_BYTES, ZmqTransport

__all__ = ["BATCH_MAX_BYTES", "FEED", "FETCH", "LoopThread", "LowLatencyTransport",
           "error_from_msg", "error_to_msg", "new_event_loop", "valid_key"]

log = logging.getLogger(__name__)

FEED = "!feed"     # edge name of a fed value's data message
FETCH = "!fetch"   # edge name of a fetched value's data message


def valid_key(key: Any) -> bool:
    """A rendezvous key as the wire carries it: (step int, edge str, tag tuple)."""
    return (type(key) is tuple and len(key) == 3 and type(key[0]) is int
            and type(key[1]) is str and type(key[2]) is tuple)


def error_to_msg(step: int, e: BaseException) -> dict:
    """A worker-side exception as an "error" control message."""
    msg = str(e) or type(e).__name__
    if not isinstance(e, errors.DcfError):
        msg = f"{type(e).__name__}: {msg}"
    # Sendable whatever the text: a lone surrogate (a file name from os.fsdecode) has no
    # UTF-8, and the message must fit a control message in bytes; a message that could not
    # be sent would leave the client's run waiting for ever. Long ones keep both ends
    # (the cause is often at the end).
    data = msg.encode("utf-8", "backslashreplace")
    if len(data) > 60000:
        data = data[:30000] + b" ... " + data[-30000:]
    return {"type": "error", "step": step, "error": type(e).__name__,
            "message": data.decode("utf-8", "ignore")}


def error_from_msg(msg: dict, worker: str) -> errors.DcfError:
    """The dcf.errors exception a worker's "error" message names (WorkerError otherwise)."""
    name = msg.get("error")
    text = str(msg.get("message", ""))
    cls = getattr(errors, name, None) if isinstance(name, str) else None
    if isinstance(cls, type) and issubclass(cls, errors.DcfError):
        err = cls(text)
    else:
        err = errors.WorkerError(f"worker {worker} failed: {text}")
    err._dcf_located = True  # type: ignore[attr-defined]
    return err


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed, else the standard one."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class TaskOnLoop:
    """A coroutine run as a task on `loop` for a caller elsewhere (another thread, another
    loop): `done` settles once the task has ended -- cancelled, failed or returned, not
    when a cancel is only asked for -- and `cancel()` asks for it from any thread (after
    the task has started: callbacks run in order); it raises RuntimeError where the loop
    is closed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]
                 ) -> None:
        self.done: concurrent.futures.Future = concurrent.futures.Future()
        self._loop = loop
        self._task: asyncio.Task | None = None
        try:
            loop.call_soon_threadsafe(self._start, coro)
        except RuntimeError:    # (the loop is closed)
            coro.close()
            raise

    def _start(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._task = self._loop.create_task(coro)
        self._task.add_done_callback(self._finished)

    def _finished(self, t: asyncio.Task) -> None:
        if t.cancelled():
            self.done.cancel()
        elif t.exception() is not None:
            self.done.set_exception(t.exception())
        else:
            self.done.set_result(t.result())

    def cancel(self) -> None:
        self._loop.call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class LoopThread:
    """An event loop running forever on a daemon thread (the cluster's I/O loop)."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def in_loop(self) -> bool:
        return threading.current_thread() is self.thread

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Run `coro` on the loop and wait for its result from another thread."""
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except BaseException:
            fut.cancel()
            raise

    def start(self, coro: Coroutine[Any, Any, Any]) -> TaskOnLoop:
        """`coro` as a task on this loop, for a caller in another thread or loop, which
        can cancel it and learn when it has ended (see TaskOnLoop)."""
        return TaskOnLoop(self.loop, coro)

    async def wrap(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Await `coro` running on this loop from another running loop. Cancelling the
        awaiting task cancels `coro`'s task here, and CancelledError comes once that task
        has ended (as a cancelled local run's, not while it still runs in this thread)."""
        here = asyncio.get_running_loop()
        over = here.create_future()     # settled from `coro`'s task when it is done

        def relay(f: concurrent.futures.Future) -> None:     # (in the caller's loop)
            if over.done():
                return
            if f.cancelled():
                over.cancel()
            elif f.exception() is not None:
                over.set_exception(f.exception())
            else:
                over.set_result(f.result())

        def settle(f: concurrent.futures.Future) -> None:
            with contextlib.suppress(RuntimeError):     # (the caller's loop is closed)
                here.call_soon_threadsafe(relay, f)

        run = self.start(coro)
        run.done.add_done_callback(settle)
        try:
            return await asyncio.shield(over)
        except asyncio.CancelledError:
            if not over.done():
                with contextlib.suppress(RuntimeError):     # (this loop is closed)
                    run.cancel()
                while not over.done() and self.thread.is_alive() and \
                        not self.loop.is_closed():
                    await asyncio.wait([over], timeout=0.1)
            if over.done() and not over.cancelled():
                over.exception()        # retrieved: no "never retrieved" report
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
        if not self.thread.is_alive() and not self.loop.is_running():
            self.loop.close()


# The transport's latency cuts (immediate sends, reader-callback receives, batched
# tensors) now live in `ZmqTransport` itself; the old name stays for callers.
LowLatencyTransport = ZmqTransport
