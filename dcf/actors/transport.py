"""ZeroMQ transport between process endpoints: peers, per-peer send queues, heartbeats.

It knows nothing about graphs: it moves `(key, tensor | dead)` pairs and small control
messages between named endpoints and hands them to callbacks.

Topology: each `ZmqTransport` binds one ROUTER socket (its inbox) and connects one DEALER
per peer (its outboxes), whose routing id is the transport's name, so the ROUTER learns who
sent each message from the identity frame. A message on the wire, after that identity, is
one frame and at most one more::

    frame 0   [mac] kind body          kind: b"T" tensors, b"C" control, b"H" heartbeat
    frame 1   bulk                     (optional: a large tensor buffer or control blob)

``body`` is a `codec.pack_tensors` / `codec.pack_control` body (empty for a heartbeat):
several tensors for one peer share a message, and a message without bulk costs one
``zmq_send``. ``mac`` (32 bytes) is present only when a shared `secret` is set: an
HMAC-SHA256 over the lengths (little-endian u64 each) and then the bytes of the sender's
name, the receiver's name, ``kind + body`` and the bulk frame if any, so a message is bound
to its claimed sender and recipient.

Sending: a message to a peer with nothing queued goes out at once with a non-blocking send
from the caller; otherwise (or when the pipe is full) it queues and the peer's sender task
sends it, so per-peer order holds. Receiving: the ROUTER's file descriptor is read from a
plain event-loop reader callback, and each message is handled (callbacks included) in the
loop iteration that sees it arrive.

Heartbeats say "this process is alive", not "its event loop is free": they go out from a
small thread of their own (`_HeartbeatSender`) with a DEALER per peer of its own (ZeroMQ
sockets are never shared between threads), so a kernel that holds the event loop for a
long time (a slow py_func) does not silence its process. That DEALER's routing id is the
name followed by ``\0hb`` (`_heartbeat_ident`), so it never takes the name of the main
connection; a message from it must be a heartbeat. A peer is lost only after a silence
while this end was listening: `check_peers` first reads what waits in the inbox, and after
this end's own loop (or whole process) was held up, nobody is judged until a heartbeat
round has had time to arrive, so the heartbeats that queued meanwhile are not taken for
silence. A process that is really gone (killed, stopped, a lost host) stops both and is
reported after `heartbeat_timeout_s`, as before.

There is no replay protection, and a name is held by one connection at a time, so with only
a secret a party that connects first under a peer's name can block that peer (its own
messages are still rejected); one that recorded a peer's messages can send them again under
its name once that peer has gone (a client's steps run again; a dead peer's heartbeats keep
it "alive"). And a message is checked only once received whole: libzmq bounds each
frame by `max_message_bytes` (MAXMSGSIZE), but a multipart message is held whole until
its last frame, so a stranger that can connect makes this end hold that many bytes per
frame, for as many frames as it sends, before the frame count refuses it. A
deployment on an open network uses CurveZMQ (`curve=`), which encrypts each connection and
refuses unknown keys before any name is taken or any message is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import zmq
import zmq.asyncio
from zmq.utils import z85

if TYPE_CHECKING:
    from typing_extensions import Self

from dcf.actors.codec import (
    CodecError,
    pack_control,
    pack_tensors,
    unpack_control,
    unpack_tensors,
)

__all__ = [
    "BATCH_MAX_BYTES",
    "COPY_THRESHOLD",
    "ControlCallback",
    "PeerLostCallback",
    "TensorCallback",
    "Transport",
    "ZmqTransport",
]

log = logging.getLogger(__name__)

TensorCallback = Callable[[str, tuple, Any, bool], None]  # (src, key, value | None, is_dead)
ControlCallback = Callable[[str, dict, bytes | None], None]  # (src, msg, blob)
PeerLostCallback = Callable[[str, float], None]  # (peer, seconds_silent)

_TENSOR, _CONTROL, _HEARTBEAT = b"T", b"C", b"H"
_KINDS = {_TENSOR[0]: _TENSOR, _CONTROL[0]: _CONTROL, _HEARTBEAT[0]: _HEARTBEAT}
# A buffer this large travels in a frame of its own, without a copy; smaller ones are
# copied into the message's one frame (libzmq would copy them anyway).
COPY_THRESHOLD = 64 * 1024
# Tensors up to this size share a message with others for the same peer (send_tensors).
BATCH_MAX_BYTES = 16 * 1024
_MAC_BYTES = 32
# Messages handled per wake-up before yielding to the event loop.
_BURST = 256
# ... and between the calls of `on_burst` (bounds how long a consumer defers acting).
_BURST_GROUP = 16
# Plain ints: pyzmq's flag enums cost microseconds per operation in the hot path.
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_RCVMORE = int(zmq.RCVMORE)
# identity, frame 0, bulk
_MAX_FRAMES = 3
_LENGTHS = [struct.Struct(f"<{n}Q").pack for n in range(5)]
# libzmq's send as pyzmq's backend has it: the sugar `Socket.send` wraps it in a Python
# call that only adds draft-API arguments (routing_id, group) this transport never uses.
_send = zmq.backend.Socket.send


class Transport(Protocol):
    """What the actors need from a transport; tests substitute in-memory fakes."""

    name: str
    on_tensor: TensorCallback | None
    on_control: ControlCallback | None
    on_peer_lost: PeerLostCallback | None

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    def add_peer(self, name: str, address: str) -> None: ...
    def send_tensor(self, peer: str, key: tuple, value: Any, is_dead: bool = False) -> None: ...
    def send_tensors(self, peer: str, items: list[tuple[tuple, Any, bool]]) -> None: ...
    def send_control(self, peer: str, msg: dict[str, Any], blob: bytes | None = None) -> None: ...


@dataclass(slots=True)
class _Peer:
    name: str
    address: str
    server_key: bytes | None  # the peer ROUTER's CurveZMQ public key (z85), when curve is on
    queue: deque[tuple[list[Any], bool, int]] = field(default_factory=deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    last_heard: float = 0.0
    lost: bool = False
    socket: zmq.asyncio.Socket | None = None
    task: asyncio.Task[None] | None = None
    send_now: Any = None          # a plain (sync) shadow socket, for the fast path
    busy: bool = False            # wakeup is set: the sender task has messages to send
    ident: bytes = b""            # the name as bytes (the MAC's recipient)
    heartbeat: bytes = b""        # the heartbeat frame for it (MAC included), built once


class _Reject(Exception):
    """Internal: the message is dropped and counted under `reason`."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _AllowedKeys:
    """ZAP credentials provider: only known CurveZMQ client keys may connect."""

    def __init__(self) -> None:
        self.keys: set[bytes] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys


class ZmqTransport:
    """One process endpoint: a ROUTER inbox and a DEALER per peer, on `zmq.asyncio`.

    Usage::

        t = ZmqTransport("worker0", secret=s)
        t.on_tensor = lambda src, key, value, is_dead: ...
        await t.start()                      # binds; t.address is now known
        t.add_peer("worker1", other_address)
        t.send_tensor("worker1", (step, edge, frame, it), array)
        ...
        await t.close()

    Callbacks run synchronously on the event loop, in arrival order per sender; they must
    not block. An exception in a callback is logged and counted in
    ``stats["callback_errors"]``; it never stops the receive loop. Malformed,
    unauthenticated or oversized messages are dropped and counted in ``stats["rejected"]``
    (``rejections`` breaks the count down by reason). Messages from names never added as
    peers are delivered too (authenticating senders is the job of `secret` or `curve`), but
    only added peers are watched by heartbeats.

    Args:
        name: this endpoint's name; it is the DEALER routing id peers see as the sender.
        bind: ZeroMQ endpoint for the ROUTER (tcp, ipc, or inproc with a shared `context`).
        secret: shared HMAC key (not empty); when set every message carries a MAC and
            unauthenticated messages are rejected.
        curve: ``(public_key, secret_key, *known)`` to turn on CurveZMQ (z85 or raw
            32-byte keys). Each item of `known` is a peer's public key (allowed to connect)
            or a mapping ``{peer_name: public_key}`` (allowed, and used as that peer's
            server key). A peer with no known key is assumed to share this keypair.
        heartbeat_interval_s: how often a heartbeat goes to each idle peer.
        heartbeat_timeout_s: silence after which `on_peer_lost` is called (once per silence).
        max_message_bytes: largest accepted message (all frames together); libzmq also
            drops the connection of a peer that sends a larger single frame.
        clock: monotonic time source in seconds (tests inject a fake one).
        context: a shared ``zmq.asyncio.Context`` (needed for inproc); it is not
            terminated on close. By default the transport owns a private context.
    """

    def __init__(
        self,
        name: str,
        *,
        bind: str = "tcp://127.0.0.1:*",
        secret: bytes | None = None,
        curve: tuple[Any, ...] | None = None,
        heartbeat_interval_s: float = 0.5,
        heartbeat_timeout_s: float = 5.0,
        max_message_bytes: int = 1 << 31,
        clock: Callable[[], float] = time.monotonic,
        on_tensor: TensorCallback | None = None,
        on_control: ControlCallback | None = None,
        on_peer_lost: PeerLostCallback | None = None,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        ident = name.encode("utf-8")
        if not ident or ident[0] == 0 or len(ident) > 255:
            # libzmq reserves identities starting with a zero byte for anonymous peers
            raise ValueError(
                f"transport name must be 1-255 UTF-8 bytes not starting with NUL, got {name!r}"
            )
        if curve is not None and context is not None:
            raise ValueError("curve needs the transport's own context (one ZAP handler each)")
        if secret is not None and not secret:
            # (an empty secret file, say): anyone can compute a MAC under the empty key
            raise ValueError(f"transport {name!r}: the secret is empty, so it would "
                             "authenticate nobody; give random bytes (secrets.token_bytes(32))")
        self.name = name
        self.bind = bind
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.max_message_bytes = max_message_bytes
        self.on_tensor = on_tensor
        # Optional: called with (src, [(key, value | None, is_dead)]) once per tensor
        # message instead of on_tensor per value, for consumers that act on a batch.
        self.on_tensors: Callable[[str, list], None] | None = None
        self.on_control = on_control
        self.on_peer_lost = on_peer_lost
        # Optional (begin, end): called before the first and after the last of several
        # messages that one wake-up of the receive loop handles together (at most
        # _BURST_GROUP in between), so that a consumer can act once on messages that
        # arrived together. A message that arrived alone is handled without them.
        self.on_burst: tuple[Callable[[], None], Callable[[], None]] | None = None
        self.stats: dict[str, int] = dict.fromkeys(
            ("sent", "sent_bytes", "received", "received_bytes", "rejected", "callback_errors"), 0
        )
        self.rejections: Counter[str] = Counter()
        self._ident = ident
        self._clock = clock
        self._secret = secret
        # HMAC-SHA256's keyed inner and outer states, hashed once: a message's MAC is then
        # two copies and three C calls (RFC 2104, same digest as hmac.digest).
        self._mac_pads = _hmac_pads(secret) if secret is not None else None
        self._peers: dict[str, _Peer] = {}
        self._names: dict[bytes, str] = {}  # sender identities seen, decoded
        # heartbeats: this end's heartbeat identity, the peers' ones (-> peer name), the
        # sender thread, and when the inbox was last seen empty (see check_peers)
        self._hb_ident = _heartbeat_ident(ident)
        self._hb_idents: dict[bytes, str] = {}
        self._hb_sender: _HeartbeatSender | None = None
        self._poll_inbox: Callable[[], bool] | None = None
        self._listened_at: float | None = None
        self._context = context
        self._owns_context = context is None
        self._router: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._auth: Any = None
        self._address: str | None = None
        self._started = False
        self._closed = False
        self._curve: tuple[bytes, bytes] | None = None
        self._peer_keys: dict[str, bytes] = {}
        self._allowed = _AllowedKeys()
        if curve is not None:
            self._init_curve(curve)

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """The ROUTER's actual endpoint (wildcard port resolved); known after `start()`."""
        if self._address is None:
            raise RuntimeError(f"transport {self.name!r} has no address until start() binds it")
        return self._address

    async def start(self) -> None:
        """Bind the ROUTER, connect peers added so far, start the receive/heartbeat tasks."""
        if self._closed:
            raise RuntimeError(f"transport {self.name!r} is closed")
        if self._started:
            return
        self._started = True
        try:
            self._open()
        except BaseException:
            await self.close()  # e.g. the bind address is taken: leave nothing open
            raise

    def _open(self) -> None:
        if self._context is None:
            self._context = zmq.asyncio.Context()
        if self._curve is not None:
            # The ZAP handler must be up before the ROUTER accepts a handshake.
            from zmq.auth.asyncio import AsyncioAuthenticator

            self._auth = AsyncioAuthenticator(self._context)
            self._auth.start()
            self._auth.configure_curve_callback("*", self._allowed)
        router = self._context.socket(zmq.ROUTER)
        router.linger = 0
        router.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        # ROUTER_HANDOVER stays off: with it, anyone could connect under a live peer's name
        # and take its route over (messages from the real peer would be lost). A restarted
        # peer's old connection closes with its process, so its name is free again.
        if self._curve is not None:
            router.curve_server = True
            router.curve_publickey, router.curve_secretkey = self._curve
        self._router = router
        if _is_ipv6(self.bind):
            router.ipv6 = True
        router.bind(self.bind)
        self._address = router.getsockopt_string(zmq.LAST_ENDPOINT)
        now = self._clock()
        self._listened_at = now
        for peer in self._peers.values():
            peer.last_heard = now  # silence is counted from start, not from add_peer
            self._connect(peer)
        self._tasks = [
            asyncio.create_task(self._recv_loop(), name=f"dcf-transport-recv-{self.name}"),
            asyncio.create_task(self._heartbeat_loop(), name=f"dcf-transport-hb-{self.name}"),
        ]
        self._hb_sender = _HeartbeatSender(self, zmq.Context.shadow(self._context.underlying))
        self._hb_sender.update(self._peers.values())
        self._hb_sender.start()

    async def close(self) -> None:
        """Stop all tasks, close sockets (linger 0) and the owned context. Idempotent.

        Messages still queued for sending are discarded.
        """
        if self._closed:
            return
        self._closed = True
        tasks = self._tasks + [p.task for p in self._peers.values() if p.task is not None]
        for t in tasks:
            t.cancel()
        if self._hb_sender is not None:
            self._hb_sender.stop()   # it closes its own sockets before the context goes
        await asyncio.gather(*tasks, return_exceptions=True)
        for peer in self._peers.values():
            if peer.socket is not None:
                peer.socket.close(linger=0)
            peer.queue.clear()
        if self._router is not None:
            if self._address is not None:
                # close() frees the endpoint later, on libzmq's reaper thread; unbind frees
                # it now, so the address can be bound again at once in a shared context.
                with contextlib.suppress(zmq.ZMQError):
                    self._router.unbind(self._address)
            self._router.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
            # Let the authenticator's cancelled poll task unwind (it unregisters its reader)
            # before the context goes away.
            for _ in range(3):
                await asyncio.sleep(0)
        if self._owns_context and self._context is not None:
            self._context.destroy(linger=0)  # closes anything left, then terminates

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- peers -----------------------------------------------------------------------------

    def add_peer(self, name: str, address: str, *, public_key: bytes | str | None = None) -> None:
        """Connect a DEALER to peer `name` at `address`; messages to it queue until then.

        Adding the same (name, address) again is a no-op. With CurveZMQ, `public_key` is
        the peer's key (else the one from `curve=`, else this transport's own key), and it
        is also allowed to connect here.

        Raises:
            ValueError: `name` is already a peer at another address.
            RuntimeError: the transport is closed.
        """
        if self._closed:
            raise RuntimeError(f"transport {self.name!r} is closed")
        old = self._peers.get(name)
        if old is not None:
            if old.address != address:
                raise ValueError(
                    f"peer {name!r} is already at {old.address}; remove_peer() it before "
                    f"adding it at {address}"
                )
            return
        server_key = None
        if self._curve is not None:
            server_key = (
                _z85(public_key)
                if public_key is not None
                else self._peer_keys.get(name, self._curve[0])
            )
            self._allowed.keys.add(server_key)
        peer = _Peer(name, address, server_key, last_heard=self._clock(),
                     ident=name.encode("utf-8"))
        peer.heartbeat = _HEARTBEAT
        if self._mac_pads is not None:
            peer.heartbeat = self._mac(self._hb_ident, peer.ident, _HEARTBEAT) + _HEARTBEAT
        self._peers[name] = peer
        hb_ident = _heartbeat_ident(peer.ident)
        self._hb_idents[hb_ident] = name
        # its heartbeats may have come before it was a peer (then decoded as a name)
        self._names.pop(hb_ident, None)
        if self._started:
            self._connect(peer)
            if self._hb_sender is not None:
                self._hb_sender.update(self._peers.values())

    def remove_peer(self, name: str) -> None:
        """Disconnect from peer `name`, dropping its queued messages. Unknown names are ignored."""
        peer = self._peers.pop(name, None)
        if peer is None:
            return
        self._hb_idents.pop(_heartbeat_ident(peer.ident), None)
        if self._hb_sender is not None:
            self._hb_sender.update(self._peers.values())
        if peer.task is not None:
            peer.task.cancel()
        if peer.socket is not None:
            peer.socket.close(linger=0)
        peer.queue.clear()

    @property
    def peers(self) -> dict[str, str]:
        """Peer name -> address."""
        return {p.name: p.address for p in self._peers.values()}

    def is_lost(self, name: str) -> bool | None:
        """Whether peer `name` has been silent past the timeout since it was last heard
        (None when it is not a peer)."""
        peer = self._peers.get(name)
        return None if peer is None else peer.lost

    # -- sending ---------------------------------------------------------------------------

    def send_tensor(self, peer: str, key: tuple, value: Any, is_dead: bool = False) -> None:
        """Queue a tensor (or a dead token) for `peer`; returns without waiting.

        A contiguous array of at least `COPY_THRESHOLD` bytes is sent without a copy, so
        it must not be mutated afterwards.

        Raises:
            CodecError: the key or dtype cannot be encoded (see `codec.encode_tensor`).
            KeyError: `peer` was never added.
            ValueError: the message exceeds `max_message_bytes`.
        """
        self._enqueue(peer, _TENSOR, *pack_tensors(((key, value, is_dead),), COPY_THRESHOLD))

    def send_tensors(self, peer: str, items: list[tuple[tuple, Any, bool]]) -> None:
        """Queue several ``(key, value, is_dead)`` for `peer`, delivered in this order.

        Values up to `BATCH_MAX_BYTES` share one message (one MAC, one send, one wake-up
        of the receiver); larger ones go first, one message each. Errors as `send_tensor`.
        """
        if len(items) == 1:
            self.send_tensor(peer, *items[0])
            return
        small = []
        for item in items:
            if not item[2] and getattr(item[1], "nbytes", 0) > BATCH_MAX_BYTES:
                self.send_tensor(peer, *item)
            else:
                small.append(item)
        if small:
            self._enqueue(peer, _TENSOR, *pack_tensors(small, COPY_THRESHOLD))

    def send_control(self, peer: str, msg: dict[str, Any], blob: bytes | None = None) -> None:
        """Queue a control message (msgpack dict, optional opaque blob) for `peer`.

        Raises:
            CodecError: `msg` is not plain msgpack data or is too large.
            KeyError: `peer` was never added.
            ValueError: the message exceeds `max_message_bytes`.
        """
        self._enqueue(peer, _CONTROL, *pack_control(msg, blob, COPY_THRESHOLD))

    def _enqueue(self, peer_name: str, kind: bytes, body: bytes,
                 bulk: memoryview | None = None) -> None:
        if self._closed:
            raise RuntimeError(f"transport {self.name!r} is closed")
        peer = self._peers.get(peer_name)
        if peer is None:
            raise KeyError(f"unknown peer {peer_name!r}; add it with add_peer(name, address)")
        frame = kind + body
        if self._mac_pads is not None:
            frame = self._mac(self._ident, peer.ident, frame, bulk) + frame
        nbytes = len(frame) if bulk is None else len(frame) + len(bulk)
        if nbytes > self.max_message_bytes:
            raise ValueError(
                f"message to {peer_name!r} is {nbytes} bytes; max_message_bytes is "
                f"{self.max_message_bytes}"
            )
        # Fast path: nothing queued or in flight to this peer (its sender task clears the
        # wakeup flag only once its queue is empty and its last send has completed).
        sock = peer.send_now
        if sock is not None and not peer.busy and not peer.queue:
            try:
                if bulk is None:
                    _send(sock, frame, _NOBLOCK)
                else:
                    # a multipart message is atomic in libzmq: a full pipe refuses the
                    # first frame (Again), never a later one
                    _send(sock, frame, _NOBLOCK_MORE)
                    _send(sock, bulk, _NOBLOCK, False)
            except zmq.Again:
                pass  # full pipe: the sender task takes over
            else:
                self.stats["sent"] += 1
                self.stats["sent_bytes"] += nbytes
                return
        peer.queue.append(([frame] if bulk is None else [frame, bulk], bulk is None, nbytes))
        peer.busy = True
        peer.wakeup.set()

    def _connect(self, peer: _Peer) -> None:
        assert self._context is not None
        sock = self._context.socket(zmq.DEALER)
        sock.linger = 0
        sock.routing_id = self._ident
        if _is_ipv6(peer.address):
            sock.ipv6 = True
        if self._curve is not None:
            sock.curve_publickey, sock.curve_secretkey = self._curve
            sock.curve_serverkey = peer.server_key
        sock.connect(peer.address)
        peer.socket = sock
        peer.send_now = zmq.Socket.shadow(sock.underlying)
        peer.task = asyncio.create_task(
            self._drain(peer, sock), name=f"dcf-transport-send-{self.name}-{peer.name}"
        )

    async def _drain(self, peer: _Peer, sock: zmq.asyncio.Socket) -> None:
        queue, wakeup, stats = peer.queue, peer.wakeup, self.stats
        # A plain (sync) shadow of the same libzmq socket sends without making a future
        # per message; only a full pipe (EAGAIN) falls back to the awaited send.
        send_now = zmq.Socket.shadow(sock.underlying).send_multipart
        try:
            while True:
                burst = 0
                while queue:
                    frames, copy, nbytes = queue.popleft()
                    try:
                        send_now(frames, _NOBLOCK, copy=copy)
                    except zmq.Again:
                        await sock.send_multipart(frames, copy=copy)
                    stats["sent"] += 1
                    stats["sent_bytes"] += nbytes
                    burst += 1
                    if burst == _BURST:  # bounded burst, then let the receiver run
                        burst = 0
                        await asyncio.sleep(0)
                # No await between the emptiness check and clear(): an enqueue cannot be lost.
                peer.busy = False
                wakeup.clear()
                await wakeup.wait()
        except zmq.ZMQError as e:  # socket closed under us (remove_peer/close)
            log.debug("transport %s: sender to %s stopped: %s", self.name, peer.name, e)

    # -- receiving -------------------------------------------------------------------------

    async def _recv_loop(self) -> None:
        assert self._router is not None
        sock: zmq.Socket = zmq.Socket.shadow(self._router.underlying)
        fd = int(sock.getsockopt(zmq.FD))  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        handle, recv, get = self._handle, sock.recv, sock.get
        stopped = loop.create_future()

        def on_readable() -> None:
            # libzmq's FD is edge-triggered: drain until a receive finds nothing (it then
            # has processed libzmq's pending commands) or ZMQ_EVENTS says nothing is left.
            # Frames one by one (not recv_multipart): the identity and a small frame 0
            # as bytes, a bulk frame without a copy.
            n = 0
            burst = self.on_burst
            held = False   # burst's begin called, its end not yet
            try:
                while True:
                    try:
                        ident = recv(_NOBLOCK)
                    except zmq.Again:
                        return
                    # a ROUTER message is the identity and at least one frame
                    frame = recv(_NOBLOCK)
                    bulk = None
                    extra = 0
                    if get(_RCVMORE):
                        bulk = recv(_NOBLOCK, copy=False).buffer
                        while get(_RCVMORE):
                            recv(_NOBLOCK, copy=False)
                            extra += 1
                    # Asked before this message is handled: whether another one is in.
                    # Only messages that came together are bracketed by on_burst (at most
                    # _BURST_GROUP per bracket); a lone one, as in a loop's round trip, is
                    # handled without.
                    more = get(_EVENTS) & _POLLIN
                    if burst is not None:
                        if held and n % _BURST_GROUP == 0:
                            held = False
                            burst[1]()
                        if more and not held:
                            held = True
                            burst[0]()
                    handle(ident, frame, bulk, extra)
                    n += 1
                    if not more:
                        return
                    if n == _BURST:  # bounded burst; continue after the others
                        loop.call_soon(on_readable)
                        return
            except zmq.ZMQError as e:  # socket closed under us
                log.debug("transport %s: receive loop stopped: %s", self.name, e)
                if not stopped.done():
                    stopped.set_result(None)
            finally:
                if held:
                    try:
                        burst[1]()
                    except Exception:
                        self.stats["callback_errors"] += 1
                        log.exception("transport %s: end-of-burst callback failed",
                                      self.name)

        def poll() -> bool:
            """Handle what waits in the inbox now; whether it was all (for check_peers)."""
            if stopped.done():
                return False
            on_readable()
            try:
                return not get(_EVENTS) & _POLLIN
            except zmq.ZMQError:
                return False

        loop.add_reader(fd, on_readable)
        loop.call_soon(on_readable)
        self._poll_inbox = poll
        try:
            await stopped
        finally:
            self._poll_inbox = None
            with contextlib.suppress(Exception):
                loop.remove_reader(fd)

    def _handle(self, ident: bytes, frame: bytes | None, bulk: memoryview | None = None,
                extra: int = 0) -> None:
        """Validate (size, sender identity, MAC), decode and dispatch one message: its
        sender's identity, frame 0, the bulk frame, and how many frames beyond those came.
        Never raises. (One function on purpose: this runs once per message on a loop's
        critical path, where each Python call costs several times its warm cost.)"""
        try:
            if frame is None or extra:
                raise _Reject("frame count")
            # (as the sender counts)
            nbytes = len(frame) if bulk is None else len(frame) + len(bulk)
            if nbytes > self.max_message_bytes:
                raise _Reject("oversized")
            body = memoryview(frame)
            src = self._names.get(ident)
            if src is None:
                hb_of = self._hb_idents.get(ident)
                if hb_of is not None:   # a peer's heartbeat thread
                    self._handle_heartbeat(hb_of, ident, body, bulk, nbytes)
                    return
                src = self._new_name(ident)
            if self._mac_pads is not None:
                body = self._verified(ident, body, bulk)
            if not body:
                raise _Reject("kind")
            kind = _KINDS.get(body[0])
            if kind is _TENSOR:
                items = unpack_tensors(body[1:], bulk)
            elif kind is _CONTROL:
                msg, blob = unpack_control(body[1:], bulk)
            elif kind is None:
                raise _Reject("kind")
            elif len(body) > 1 or bulk is not None:
                raise _Reject("heartbeat with payload")
        except _Reject as r:
            self._reject(r.reason)
            return
        except CodecError as e:
            self._reject("codec", e)
            return
        except Exception as e:  # a bug here must not kill the loop; count it and go on
            log.exception("transport %s: unexpected error handling a message", self.name)
            self._reject("internal", e)
            return
        stats = self.stats
        stats["received"] += 1
        stats["received_bytes"] += nbytes
        peer = self._peers.get(src)
        if peer is not None:
            peer.last_heard = self._clock()
            peer.lost = False
        if kind is _TENSOR:
            if self.on_tensors is not None:
                try:
                    self.on_tensors(src, items)
                except Exception:
                    stats["callback_errors"] += 1
                    log.exception("transport %s: callback failed on a message from %s",
                                  self.name, src)
                return
            on_tensor = self.on_tensor
            if on_tensor is None:
                return
            for key, value, is_dead in items:
                try:
                    on_tensor(src, key, value, is_dead)
                except Exception:
                    stats["callback_errors"] += 1
                    log.exception("transport %s: callback failed on a message from %s",
                                  self.name, src)
        elif kind is _CONTROL and self.on_control is not None:
            try:
                self.on_control(src, msg, blob)
            except Exception:
                stats["callback_errors"] += 1
                log.exception("transport %s: callback failed on a message from %s",
                              self.name, src)

    def _verified(self, ident: bytes, body: memoryview, bulk: memoryview | None) -> memoryview:
        """`body` without its MAC, once the MAC is checked (raises _Reject("mac"))."""
        if len(body) <= _MAC_BYTES:
            raise _Reject("mac")
        mac, body = body[:_MAC_BYTES], body[_MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(ident, self._ident, body, bulk)):
            raise _Reject("mac")
        return body

    def _handle_heartbeat(self, src: str, ident: bytes, body: memoryview,
                          bulk: memoryview | None, nbytes: int) -> None:
        """A message from `src`'s heartbeat identity: a heartbeat and nothing else."""
        if self._mac_pads is not None:
            body = self._verified(ident, body, bulk)
        if bulk is not None or body != _HEARTBEAT:
            raise _Reject("heartbeat with payload" if body[:1] == _HEARTBEAT else "kind")
        self.stats["received"] += 1
        self.stats["received_bytes"] += nbytes
        peer = self._peers.get(src)
        if peer is not None:
            peer.last_heard = self._clock()
            peer.lost = False

    def _new_name(self, ident: bytes) -> str:
        """A sender identity not seen before, decoded (and remembered, up to 4096)."""
        # Zero-led identities are the ones libzmq makes up for a DEALER without a
        # routing id: not a dcf transport.
        if not ident or ident[0] == 0:
            raise _Reject("identity")
        try:
            src = ident.decode("utf-8")
        except UnicodeDecodeError:
            raise _Reject("identity") from None
        if len(self._names) < 4096:
            self._names[ident] = src
        return src

    def _reject(self, reason: str, exc: BaseException | None = None) -> None:
        self.stats["rejected"] += 1
        self.rejections[reason] += 1
        log.debug("transport %s: rejected a message (%s): %s", self.name, reason, exc)

    def _mac(self, src: bytes, dst: bytes, frame: Any, bulk: Any = None) -> bytes:
        assert self._mac_pads is not None
        # HMAC-SHA256 of all lengths first (so the framing is unambiguous), then the bytes;
        # the small parts are joined for one C-level update.
        inner, outer = self._mac_pads  # type: ignore[misc]
        h = inner.copy()
        if bulk is None:
            h.update(b"".join((_LENGTHS[3](len(src), len(dst), len(frame)), src, dst, frame)))
        else:
            h.update(b"".join((_LENGTHS[4](len(src), len(dst), len(frame), len(bulk)),
                               src, dst, frame)))
            h.update(bulk)  # hashed where it lies, without a copy
        o = outer.copy()
        o.update(h.digest())
        return o.digest()

    # -- heartbeats ------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        # (the heartbeats themselves go out from the _HeartbeatSender thread)
        hold = 0
        last = time.monotonic()
        while True:
            interval = self.heartbeat_interval_s
            await asyncio.sleep(interval)
            t = time.monotonic()   # (real time: the injected clock measures silences)
            if t - last > 2 * interval + 0.05:
                # This loop was held up (a long kernel), or the whole process (SIGSTOP,
                # a suspended VM): then libzmq's I/O thread did not read the peers'
                # heartbeats either. Judge nobody until they have had a round to arrive.
                hold = 2
            last = t
            if hold:
                hold -= 1
                if self._poll_inbox is not None:
                    with contextlib.suppress(Exception):
                        self._poll_inbox()
                continue
            self.check_peers()

    def check_peers(self) -> list[str]:
        """Call `on_peer_lost` for each peer silent longer than the timeout; return them.

        Called every heartbeat interval; tests call it directly with a fake clock. A peer
        is reported once per silence: it is reported again only after it has been heard.
        Silence is counted up to when this end last found its inbox empty: what waits
        there is handled first, so an event loop that was held up (a long kernel) does
        not take the heartbeats that queued meanwhile for silence.
        """
        horizon = None
        if self._poll_inbox is not None:
            try:
                drained = self._poll_inbox()
            except Exception:   # (the receive loop's own errors are handled there)
                log.exception("transport %s: reading the inbox failed", self.name)
                drained = False
            if drained:
                horizon = self._listened_at = self._clock()
            else:   # a long backlog: only what was empty at the last check counts
                horizon = self._listened_at
        now = self._clock() if horizon is None else horizon
        lost = []
        for peer in list(self._peers.values()):
            silent = now - peer.last_heard
            if not peer.lost and silent >= self.heartbeat_timeout_s:
                peer.lost = True
                lost.append(peer.name)
                if self.on_peer_lost is not None:
                    try:
                        self.on_peer_lost(peer.name, silent)
                    except Exception:
                        self.stats["callback_errors"] += 1
                        log.exception("transport %s: on_peer_lost failed", self.name)
        return lost

    # -- CurveZMQ --------------------------------------------------------------------------

    def _init_curve(self, curve: tuple[Any, ...]) -> None:
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq was built without CurveZMQ support")
        if len(curve) < 2:
            raise ValueError("curve must be (public_key, secret_key, *known_peer_keys)")
        public, secret = _z85(curve[0]), _z85(curve[1])
        if zmq.curve_public(secret) != public:
            # (else every handshake fails in silence: peers just never answer)
            raise ValueError("curve: the public key is not the secret key's (give the "
                             "two keys of one zmq.curve_keypair())")
        self._curve = (public, secret)
        self._allowed.keys.add(public)
        for known in curve[2:]:
            if isinstance(known, Mapping):
                for peer_name, key in known.items():
                    self._peer_keys[peer_name] = _z85(key)
                    self._allowed.keys.add(self._peer_keys[peer_name])
            else:
                self._allowed.keys.add(_z85(known))


def _is_ipv6(address: str) -> bool:
    """Whether `address` is a tcp endpoint with an IPv6 literal host ("tcp://[::1]:5555"),
    which libzmq binds or connects only on a socket whose ZMQ_IPV6 option is on. (Only
    then: with it on, an IPv4 bind reports a mapped "[::ffff:a.b.c.d]" endpoint, and a
    host name may resolve to an IPv6 address its peer did not bind.)"""
    return address.startswith("tcp://[")


def _heartbeat_ident(ident: bytes) -> bytes:
    """The routing id of the heartbeat DEALERs of the transport named `ident`: the name and
    ``\0hb`` (a long name is cut and a hash of it added, within libzmq's 255 bytes)."""
    if len(ident) <= 252:
        return ident + b"\0hb"
    return ident[:220] + b"\0hb" + hashlib.sha256(ident).digest()[:32]


class _HeartbeatSender:
    """A daemon thread that sends every peer of a transport a heartbeat each interval.

    It owns its sockets (a DEALER per peer, routing id `_heartbeat_ident`, connected to the
    peer's ROUTER as the main DEALER is, CurveZMQ keys included), creates and closes them
    itself, and reads only immutable snapshots of the peers that the loop thread hands
    it through `update` (one attribute store). Sends never block: a heartbeat that finds
    the pipe full is dropped (the ones before it say the same).
    """

    def __init__(self, transport: ZmqTransport, context: zmq.Context) -> None:
        self._t = transport
        self._context = context
        self._stopping = False
        self._wake = threading.Event()   # set by update() and stop()
        # name -> (address, server key, frame)
        self._targets: dict[str, tuple[str, bytes | None, bytes]] = {}
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=f"dcf-heartbeat-{transport.name}")

    def update(self, peers: Any) -> None:
        """Hand the thread the peers now (it connects to new ones at once, and sends them
        their first heartbeat at its next round)."""
        self._targets = {p.name: (p.address, p.server_key, p.heartbeat) for p in peers}
        self._wake.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _socket(self, address: str, server_key: bytes | None) -> zmq.Socket:
        t = self._t
        sock = self._context.socket(zmq.DEALER)
        try:
            sock.linger = 0
            sock.sndhwm = 16
            sock.routing_id = t._hb_ident
            if _is_ipv6(address):
                sock.ipv6 = True
            if t._curve is not None:
                sock.curve_publickey, sock.curve_secretkey = t._curve
                sock.curve_serverkey = server_key
            sock.connect(address)
        except BaseException:
            sock.close(linger=0)
            raise
        return sock

    def _main(self) -> None:
        socks: dict[str, tuple[tuple, zmq.Socket]] = {}
        monotonic = time.monotonic
        due = monotonic() + self._t.heartbeat_interval_s
        try:
            while True:
                self._wake.wait(max(0.0, due - monotonic()))
                self._wake.clear()
                if self._stopping:
                    return
                beat = monotonic() >= due
                if beat:
                    due = monotonic() + self._t.heartbeat_interval_s
                targets = self._targets
                for name in list(socks):
                    target = targets.get(name)
                    if target is None or target[:2] != socks[name][0]:
                        socks.pop(name)[1].close(linger=0)
                for name, (address, server_key, frame) in targets.items():
                    entry = socks.get(name)
                    try:
                        if entry is None:
                            entry = socks[name] = ((address, server_key),
                                                   self._socket(address, server_key))
                        if beat:
                            entry[1].send(frame, _NOBLOCK)
                    except zmq.Again:
                        pass
                    except zmq.ContextTerminated:
                        raise
                    except zmq.ZMQError as e:   # this peer only (say, a bad address)
                        log.debug("transport %s: no heartbeat to %s: %s", self._t.name,
                                  name, e)
        except zmq.ContextTerminated as e:   # the context went away under us
            log.debug("transport %s: heartbeat sender stopped: %s", self._t.name, e)
        except Exception:
            log.exception("transport %s: heartbeat sender failed", self._t.name)
        finally:
            for _, sock in socks.values():
                with contextlib.suppress(Exception):
                    sock.close(linger=0)


def _hmac_pads(secret: bytes) -> tuple[Any, Any]:
    """SHA-256 states after HMAC's inner (key ^ ipad) and outer (key ^ opad) blocks."""
    key = hashlib.sha256(secret).digest() if len(secret) > 64 else secret
    key = key.ljust(64, b"\0")
    return (hashlib.sha256(bytes(b ^ 0x36 for b in key)),
            hashlib.sha256(bytes(b ^ 0x5C for b in key)))


def _z85(key: bytes | str) -> bytes:
    """A CurveZMQ key in the z85 text form libzmq and the ZAP callback use."""
    if isinstance(key, str):
        key = key.encode("ascii")
    if len(key) == 32:
        return z85.encode(key)
    if len(key) == 40:
        return bytes(key)
    raise ValueError(f"a CurveZMQ key is 32 raw bytes or 40 z85 characters, got {len(key)} bytes")
