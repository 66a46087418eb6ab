"""The client <-> worker protocol: message names, keys, errors, and the loop thread.

Every message travels on the authenticated transport (`transport.py`): control messages
are msgpack maps (bulky payloads in the blob frame), tensors are data messages keyed
like rendezvous slots. A run looks like this::

    client -> worker   C {"type": "plan", "plan", "session", "compile"} + graph blob
                                                                  (once per plan)
    client -> worker   T (step, "!feed", (k,)) value              (the feeds it needs)
    client -> worker   C {"type": "run", "step", "plan", "session", "trace"}
    worker <-> worker  T (step, edge, tag) value | dead           (Send/Recv pairs)
    worker -> client   T (step, "!fetch", (k,)) value | dead      (its fetches)
    worker -> client   C {"type": "done", "step", "fired"} [+ trace blob]
                     | C {"type": "error", "step", "error", "message"}
    client -> worker   C {"type": "abort", "step"}                (timeout or failure)
    client -> worker   C {"type": "release", "session"}           (session closed)

ZeroMQ keeps messages of one sender to one receiver in order, so a worker has a run's
plan and feeds before its "run", and the client has a worker's fetches before its
"done". Only run start, completion and failure involve the client; Sends between
partitions go straight from worker to worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import msgpack
import zmq

from dcf import errors
from dcf.actors import transport as _transport
from dcf.actors.codec import CodecError, decode_tensor, encode_tensor
from dcf.actors.transport import ZmqTransport
from dcf.token import DEAD

__all__ = ["BATCH_MAX_BYTES", "FEED", "FETCH", "LoopThread", "LowLatencyTransport",
           "decode_batch", "encode_batch", "error_from_msg", "error_to_msg", "new_event_loop",
           "valid_key"]

log = logging.getLogger(__name__)

# Plain ints: pyzmq's flag enums cost microseconds per operation in the hot path.
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)

FEED = "!feed"     # edge name of a fed value's data message
FETCH = "!fetch"   # edge name of a fetched value's data message
BATCH_MAX_BYTES = 16 * 1024   # values up to this size may share a "batch" message


def valid_key(key: Any) -> bool:
    """A rendezvous key as the wire carries it: (step int, edge str, tag tuple)."""
    return (type(key) is tuple and len(key) == 3 and type(key[0]) is int
            and type(key[1]) is str and type(key[2]) is tuple)


def error_to_msg(step: int, e: BaseException) -> dict:
    """A worker-side exception as an "error" control message."""
    msg = str(e) or type(e).__name__
    if not isinstance(e, errors.DcfError):
        msg = f"{type(e).__name__}: {msg}"
    return {"type": "error", "step": step, "error": type(e).__name__, "message": msg[:60000]}


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


def split_batch(items: list[tuple[tuple, Any]]) -> tuple[list, list]:
    """(values small enough to share one batch message, values sent on their own)."""
    small, large = [], []
    for key, v in items:
        (small if v is DEAD or getattr(v, "nbytes", 0) <= BATCH_MAX_BYTES else large).append(
            (key, v))
    return small, large


def encode_batch(items: list[tuple[tuple, Any]]) -> bytes:
    """Several (key, value | DEAD) pairs for one peer as one control-message blob.

    Each item is the codec's own frames (msgpack header, raw bytes), so decoding
    validates exactly as for a tensor message. A burst that sends a peer several small
    values (loop predicates of iterations running ahead, a predicate and the value it
    switches) then costs one message, one MAC and one wake-up of the receiver.
    """
    from dcf.token import DEAD

    out = []
    for key, v in items:
        frames = encode_tensor(key, None, is_dead=True) if v is DEAD else \
            encode_tensor(key, v)
        out.append([bytes(f) for f in frames])
    return msgpack.packb(out, use_bin_type=True)


def decode_batch(blob: bytes | None) -> Iterator[tuple[tuple, Any, bool]]:
    """The (key, value | None, is_dead) items of an `encode_batch` blob, decoded one at a
    time (the first is acted on before the next is decoded); CodecError where anything is
    malformed."""
    if blob is None:
        raise CodecError("a batch message has no blob")
    try:
        items = msgpack.unpackb(blob, use_list=True, raw=False, strict_map_key=True,
                                ext_hook=_no_ext, timestamp=0)
    except CodecError:
        raise
    except Exception as e:  # msgpack raises assorted types on corrupt input
        raise CodecError(f"batch is not valid msgpack: {type(e).__name__}: {e}") from e
    if not isinstance(items, list):
        raise CodecError("a batch is a list of tensor messages")
    for frames in items:
        if not (isinstance(frames, list) and all(isinstance(f, bytes) for f in frames)):
            raise CodecError("a batch item is a list of byte frames")
        yield decode_tensor(frames)


def _no_ext(code: int, data: bytes) -> Any:
    raise CodecError(f"msgpack extension type {code} is not allowed")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed, else the standard one."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


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

    async def wrap(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Await `coro` running on this loop from another running loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
        if not self.thread.is_alive() and not self.loop.is_running():
            self.loop.close()


class LowLatencyTransport(ZmqTransport):
    """`ZmqTransport` with two latency cuts for the per-iteration messages of loops.

    * A message to a peer whose send queue is empty and whose sender task is idle goes
      out at once with a non-blocking send, instead of waking the sender task first (one
      event-loop hop less per message). Otherwise it queues as before, so per-peer order
      holds.
    * The ROUTER inbox is read from a plain reader callback on libzmq's FD (one
      non-blocking receive per ready message) instead of awaiting ``zmq.asyncio``
      futures, so a message is handled in the loop iteration that sees it arrive.

    Validation, MACs, heartbeats and the wire format are the base class's.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shadows: dict[str, zmq.Socket] = {}

    def remove_peer(self, name: str) -> None:
        self._shadows.pop(name, None)
        super().remove_peer(name)

    def _enqueue(self, peer_name: str, kind: bytes, payload: list[Any]) -> None:
        peer = self._peers.get(peer_name)
        # Fast path only when nothing is queued or in flight: the sender task clears its
        # wakeup flag only once its queue is empty and its last send has completed.
        if peer is None or self._closed or peer.socket is None or peer.queue \
                or peer.wakeup.is_set():
            super()._enqueue(peer_name, kind, payload)
            return
        frames = [kind, *payload]
        if self._mac_base is not None:
            frames.insert(0, self._mac(self._ident, peer_name.encode(), frames))
        sizes = [len(f) for f in frames]
        nbytes = sum(sizes)
        if nbytes > self.max_message_bytes:
            raise ValueError(f"message to {peer_name!r} is {nbytes} bytes; max_message_bytes "
                             f"is {self.max_message_bytes}")
        copy = max(sizes) < _transport.COPY_THRESHOLD
        sock = self._shadows.get(peer_name)
        if sock is None:
            sock = self._shadows[peer_name] = zmq.Socket.shadow(peer.socket.underlying)
        send = sock.send
        try:
            # A multipart message is atomic in libzmq: the first frame reaches the pipe
            # only with the last, so Again can only come at the first frame.
            last = len(frames) - 1
            for i, f in enumerate(frames):
                send(f, _NOBLOCK_MORE if i < last else _NOBLOCK, copy=copy)
        except zmq.ZMQError:  # full pipe (or closing): the sender task takes over
            peer.queue.append((frames, copy, nbytes))
            peer.wakeup.set()
            return
        self.stats["sent"] += 1
        self.stats["sent_bytes"] += nbytes

    async def _recv_loop(self) -> None:
        assert self._router is not None
        sock: zmq.Socket = zmq.Socket.shadow(self._router.underlying)
        fd = int(sock.getsockopt(zmq.FD))  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        handle, recv, events = self._handle, sock.recv_multipart, sock.getsockopt
        burst = _transport._BURST
        stopped = loop.create_future()

        def on_readable() -> None:
            # libzmq's FD is edge-triggered: drain until ZMQ_EVENTS says nothing is left.
            try:
                n = 0
                while int(events(_EVENTS)) & _POLLIN:
                    try:
                        frames = recv(_NOBLOCK, copy=False)
                    except zmq.Again:
                        return
                    handle(frames)
                    n += 1
                    if n == burst:  # bounded burst; continue after the others
                        loop.call_soon(on_readable)
                        return
            except zmq.ZMQError as e:  # socket closed under us
                log.debug("transport %s: receive loop stopped: %s", self.name, e)
                if not stopped.done():
                    stopped.set_result(None)

        loop.add_reader(fd, on_readable)
        loop.call_soon(on_readable)
        try:
            await stopped
        finally:
            loop.remove_reader(fd)
