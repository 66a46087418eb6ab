"""ZmqTransport: exchange over loopback, authentication, rejection, heartbeats, clean close."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
import zmq.asyncio

from dcf.actors.codec import CodecError, encode_tensor, pack_control, pack_tensors
from dcf.actors.transport import ZmqTransport

SECRET = b"s3cret-shared-by-the-session"


class Recorder:
    """Collects everything a transport delivers, in order."""

    def __init__(self, t: ZmqTransport) -> None:
        self.tensors: list[tuple[str, tuple, Any, bool]] = []
        self.controls: list[tuple[str, dict, bytes | None]] = []
        self.lost: list[tuple[str, float]] = []
        t.on_tensor = lambda *m: self.tensors.append(m)
        t.on_control = lambda *m: self.controls.append(m)
        t.on_peer_lost = lambda *m: self.lost.append(m)


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for `cond` itself (checked every few ms), failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def pair(
    a_kw: dict[str, Any] | None = None, b_kw: dict[str, Any] | None = None, **kw: Any
) -> AsyncIterator[tuple[ZmqTransport, ZmqTransport, Recorder, Recorder]]:
    """Two started transports "A" and "B" on tcp loopback, each the other's peer.

    `kw` goes to both constructors, `a_kw`/`b_kw` to one each.
    """
    a, b = ZmqTransport("A", **kw, **(a_kw or {})), ZmqTransport("B", **kw, **(b_kw or {}))
    ra, rb = Recorder(a), Recorder(b)
    try:
        await a.start()
        await b.start()
        a.add_peer("B", b.address)
        b.add_peer("A", a.address)
        yield a, b, ra, rb
    finally:
        await a.close()
        await b.close()


RawDealer = Callable[..., zmq.asyncio.Socket]


@pytest.fixture
def raw_dealer() -> Iterator[RawDealer]:
    """Factory of raw DEALER sockets that play third parties; all closed after the test.

    ``raw_dealer(address=None, routing_id=None, **sockopts)`` connects when given an address.
    """
    ctx = zmq.asyncio.Context()
    sockets: list[zmq.asyncio.Socket] = []  # strong refs: no socket is collected unclosed

    def make(address: str | None = None, routing_id: bytes | None = None, **opts: Any):
        sock = ctx.socket(zmq.DEALER)
        sockets.append(sock)
        sock.linger = 0
        if routing_id is not None:
            sock.routing_id = routing_id
        for name, value in opts.items():
            setattr(sock, name, value)
        if address is not None:
            sock.connect(address)
        return sock

    yield make
    for sock in sockets:
        sock.close(linger=0)
    ctx.destroy(linger=0)


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_tensors_and_control_flow_both_ways_over_tcp_loopback():
    async with pair() as (a, b, ra, rb):
        assert a.address.startswith("tcp://127.0.0.1:") and not a.address.endswith("*")
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        a.send_tensor("B", (1, "e", 0, 0), x)
        a.send_tensor("B", (1, "e", 0, 1), None, is_dead=True)
        b.send_tensor("A", (2, "f"), np.int64(7))
        b.send_control("A", {"type": "done", "step": 2}, blob=b"\x80\x05payload")
        await wait_until(lambda: len(rb.tensors) == 2 and ra.tensors and ra.controls)
        (src, key, value, dead), (_, key2, value2, dead2) = rb.tensors
        assert (src, key, dead) == ("A", (1, "e", 0, 0), False)
        np.testing.assert_array_equal(value, x)
        assert (key2, value2, dead2) == ((1, "e", 0, 1), None, True)
        assert ra.tensors == [("B", (2, "f"), np.int64(7), False)]
        assert ra.controls == [("B", {"type": "done", "step": 2}, b"\x80\x05payload")]
        assert a.stats["sent"] >= 2 and b.stats["received"] >= 2 and b.stats["rejected"] == 0


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_four_mib_tensor_arrives_intact_with_hmac():
    async with pair(secret=SECRET) as (a, b, _ra, rb):
        big = np.random.default_rng(1).standard_normal(1 << 19)  # float64: 4 MiB
        a.send_tensor("B", ("big",), big)
        await wait_until(lambda: rb.tensors)
        _, key, value, _ = rb.tensors[0]
        assert key == ("big",) and value.nbytes == 4 << 20
        np.testing.assert_array_equal(value, big)
        assert b.stats["received_bytes"] >= 4 << 20 and b.stats["rejected"] == 0


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_messages_sent_before_start_and_before_peer_binds_are_delivered():
    a, b = ZmqTransport("A"), ZmqTransport("B", bind="tcp://127.0.0.1:*")
    rb = Recorder(b)
    try:
        await b.start()
        a.add_peer("B", b.address)
        a.send_tensor("B", (0,), np.float32(1.5))  # queued: A is not started yet
        await a.start()
        await wait_until(lambda: rb.tensors)
        assert rb.tensors == [("A", (0,), np.float32(1.5), False)]
    finally:
        await a.close()
        await b.close()


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_ipc_and_inproc_endpoints(tmp_path):
    ctx = zmq.asyncio.Context()
    try:
        for bind in (f"ipc://{tmp_path}/b.sock", "inproc://dcf-test-b"):
            a = ZmqTransport("A", context=ctx, bind="inproc://dcf-test-a")
            b = ZmqTransport("B", context=ctx, bind=bind)
            got = Recorder(b).tensors
            await a.start()
            await b.start()
            assert b.address == bind
            a.add_peer("B", b.address)
            a.send_tensor("B", (1,), np.ones(3, np.bool_))
            await wait_until(got.__len__)
            np.testing.assert_array_equal(got[0][2], np.ones(3, np.bool_))
            await a.close()
            await b.close()
        assert not ctx.closed  # a shared context belongs to its creator
    finally:
        ctx.destroy(linger=0)


# -- authentication and rejection ----------------------------------------------------------


def wire_mac(secret: bytes, src: bytes, dst: bytes, frames: list[bytes]) -> bytes:
    """The MAC as the wire format defines it, computed independently of the transport:
    `frames` are ``kind + body`` and the bulk frame if any."""
    parts = [src, dst, *map(bytes, frames)]
    lengths = b"".join(len(p).to_bytes(8, "little") for p in parts)
    return hmac.new(secret, lengths + b"".join(parts), hashlib.sha256).digest()


@pytest.mark.parametrize("key_len", [1, 28, 32, 64, 65, 200])
def test_mac_is_hmac_sha256_of_the_wire_layout_for_any_secret_length(key_len):
    # the transport hashes HMAC's keyed pads once; the digest must stay RFC 2104's,
    # also for secrets longer than SHA-256's 64-byte block (hashed first)
    secret = bytes(range(256))[:key_len]
    t = ZmqTransport("B", secret=secret)
    frame = b"T" + bytes(range(100))
    bulk = bytes(range(256)) * 300
    assert t._mac(b"A", b"B", frame) == wire_mac(secret, b"A", b"B", [frame])
    assert t._mac(b"A", b"B", memoryview(frame), memoryview(bulk)) == \
        wire_mac(secret, b"A", b"B", [frame, bulk])


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_hmac_rejects_third_party_messages_and_never_delivers_them(raw_dealer):
    async with pair(secret=SECRET) as (a, b, _ra, rb):
        evil = raw_dealer(b.address, routing_id=b"mallory")
        body = b"T" + pack_tensors([((9,), np.float32(666), False)], 1 << 20)[0]
        payload = [body]
        attempts = [
            payload,  # no MAC
            [b"\0" * 32 + body],  # a garbage MAC
            [wire_mac(b"wrong", b"mallory", b"B", payload) + body],  # wrong secret
            [wire_mac(SECRET, b"A", b"B", payload) + body],  # A's valid MAC, replayed
            [wire_mac(SECRET, b"mallory", b"B", payload)],  # a MAC alone
        ]
        for frames in attempts:
            await evil.send_multipart(frames)
        await wait_until(lambda: b.stats["rejected"] == 5)
        assert b.rejections == {"mac": 5}
        a.send_tensor("B", (1,), np.float32(1))  # the real A still gets through
        await wait_until(lambda: rb.tensors)
        assert rb.tensors == [("A", (1,), np.float32(1), False)]
        assert b.stats["rejected"] == 5


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_hmac_wire_format_is_accepted_from_a_raw_socket(raw_dealer):
    async with pair(secret=SECRET) as (_a, b, _ra, rb):
        raw = raw_dealer(b.address, routing_id=b"tool")
        body = b"C" + pack_control({"type": "ping"}, None, 1 << 20)[0]
        await raw.send_multipart([wire_mac(SECRET, b"tool", b"B", [body]) + body])
        # a tensor message with its buffer in the separate bulk frame
        x = np.arange(5, dtype=np.float64)
        body2, bulk = pack_tensors([((3, "e", ()), x, False)], 8)
        frames = [b"T" + body2, bytes(bulk)]
        await raw.send_multipart([wire_mac(SECRET, b"tool", b"B", frames) + frames[0],
                                  frames[1]])
        await wait_until(lambda: rb.controls and rb.tensors)
        assert rb.controls == [("tool", {"type": "ping"}, None)]
        ((src, key, value, dead),) = rb.tensors
        assert (src, key, dead) == ("tool", (3, "e", ()), False)
        np.testing.assert_array_equal(value, x)


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_mac_binds_the_recipient(raw_dealer):
    # A message MAC'd for B is refused by C, even though C shares the secret.
    async with ZmqTransport("C", secret=SECRET) as c:
        rc = Recorder(c)
        body = b"C" + pack_control({"type": "abort"}, None, 1 << 20)[0]
        evil = raw_dealer(c.address, routing_id=b"A")
        await evil.send_multipart([wire_mac(SECRET, b"A", b"B", [body]) + body])
        await wait_until(lambda: c.stats["rejected"] == 1)
        assert c.rejections["mac"] == 1 and rc.controls == []


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_anonymous_identity_and_bad_kind_are_rejected(raw_dealer):
    async with pair() as (_a, b, _ra, _rb):
        anon = raw_dealer(b.address, routing_id=None)  # libzmq makes up b"\0..."
        latin = raw_dealer(b.address, routing_id=b"\xff\xfe")
        named = raw_dealer(b.address, routing_id=b"X")
        await anon.send_multipart([b"H"])
        await latin.send_multipart([b"H"])
        await named.send_multipart([b"Z", b"payload"])
        await named.send_multipart([b"H", b"payload"])
        await named.send_multipart([b"T"] * 6)
        await wait_until(lambda: b.stats["rejected"] == 5)
        assert b.rejections == {
            "identity": 2,
            "kind": 1,
            "heartbeat with payload": 1,
            "frame count": 1,
        }


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_oversized_messages_are_rejected_and_refused_at_send(raw_dealer):
    async with pair(max_message_bytes=10_000) as (a, b, _ra, rb):
        with pytest.raises(
            ValueError, match=r"message to 'B' is \d+ bytes; max_message_bytes is 10000"
        ):
            a.send_tensor("B", (1,), np.zeros(20_000, np.uint8).view(np.float32))
        evil = raw_dealer(b.address, routing_id=b"X")
        # every frame is under the limit, the message is not
        await evil.send_multipart([b"C" + b"x" * 6000, b"x" * 6000])
        await wait_until(lambda: b.stats["rejected"] == 1)
        assert b.rejections["oversized"] == 1
        # a single frame over the limit: libzmq drops the connection; nothing arrives
        await evil.send_multipart([b"C", b"x" * 20_000])
        a.send_control("B", {"after": True})
        await wait_until(lambda: rb.controls)
        assert rb.controls == [("A", {"after": True}, None)]


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_2000_random_multipart_messages_then_normal_exchange(raw_dealer):
    rng = random.Random(1234)
    good_header = encode_tensor((1, "k"), np.zeros(2, np.float32))[0]

    def junk_frame() -> bytes:
        choice = rng.randrange(6)
        if choice == 0:
            return rng.randbytes(rng.randrange(0, 100))
        if choice == 1:
            return rng.choice([b"T", b"C", b"H", b""])
        if choice == 2:
            return good_header
        if choice == 3:  # a valid header with one byte flipped
            pos = rng.randrange(len(good_header))
            return good_header[:pos] + bytes([rng.randrange(256)]) + good_header[pos + 1 :]
        if choice == 4:
            return msgpack.packb(
                {
                    "k": [rng.randrange(5)],
                    "dtype": rng.choice(["<f4", "|O", "<i8"]),
                    "shape": [rng.randrange(-2, 3)],
                }
            )
        return rng.randbytes(rng.choice([0, 4, 8, 16]))

    # No heartbeats during the test, so B's counters count exactly the fuzzer's messages.
    async with pair(heartbeat_interval_s=60.0) as (a, b, ra, rb):
        fuzzer = raw_dealer(b.address, routing_id=b"fuzzer")
        for _ in range(2000):
            kind = [rng.choice([b"T", b"C", b"H"])] if rng.random() < 0.7 else []
            await fuzzer.send_multipart(
                kind + [junk_frame() for _ in range(rng.randrange(0, 5))] or [b""]
            )
        await wait_until(lambda: b.stats["received"] + b.stats["rejected"] == 2000, timeout=20)
        assert b.stats["rejected"] > 1000
        assert b.stats["callback_errors"] == 0
        assert all(src == "fuzzer" for src, *_ in rb.tensors + rb.controls)
        delivered_before = len(rb.tensors)
        a.send_tensor("B", (5, "ok"), np.arange(4, dtype=np.int32))
        b.send_tensor("A", (6, "ok"), np.float16(0.5))
        await wait_until(lambda: len(rb.tensors) > delivered_before and ra.tensors)
        assert rb.tensors[-1][:2] == ("A", (5, "ok"))
        np.testing.assert_array_equal(rb.tensors[-1][2], np.arange(4, dtype=np.int32))
        assert ra.tensors == [("B", (6, "ok"), np.float16(0.5), False)]


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_failing_callback_is_counted_and_receive_loop_goes_on():
    async with pair() as (a, b, _ra, _rb):
        seen = []

        def on_tensor(src, key, value, is_dead):
            seen.append(key)
            if key == (1,):
                raise RuntimeError("consumer bug")

        b.on_tensor = on_tensor
        a.send_tensor("B", (1,), np.float32(1))
        a.send_tensor("B", (2,), np.float32(2))
        await wait_until(lambda: len(seen) == 2)
        assert seen == [(1,), (2,)] and b.stats["callback_errors"] == 1


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_send_errors_name_the_problem():
    async with pair() as (a, b, _ra, _rb):
        with pytest.raises(KeyError, match=r"unknown peer 'C'; add it with add_peer"):
            a.send_tensor("C", (1,), np.float32(1))
        with pytest.raises(CodecError, match=r"dtype uint8 cannot be sent"):
            a.send_tensor("B", (1,), np.uint8(1))
        with pytest.raises(ValueError, match=r"peer 'B' is already at tcp://"):
            a.add_peer("B", "tcp://127.0.0.1:1")
        a.add_peer("B", b.address)  # same address again: no-op
    with pytest.raises(ValueError, match=r"transport name must be"):
        ZmqTransport("\0anon")


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_remove_peer_then_add_it_at_a_new_address():
    async with pair() as (a, _b, _ra, _rb):
        c = ZmqTransport("C")
        rc = Recorder(c)
        await c.start()
        try:
            a.remove_peer("B")
            assert a.peers == {}
            with pytest.raises(KeyError, match=r"unknown peer 'B'"):
                a.send_tensor("B", (1,), np.float32(1))
            a.add_peer("B", c.address)  # "B" now lives where C listens
            a.send_tensor("B", (2,), np.float32(2))
            await wait_until(lambda: rc.tensors)
            assert rc.tensors == [("A", (2,), np.float32(2), False)]
            assert a.peers == {"B": c.address}
            a.remove_peer("nobody")  # unknown names are ignored
        finally:
            await c.close()


# -- heartbeats -----------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_peer_loss_detected_after_heartbeat_timeout():
    async with pair(heartbeat_interval_s=0.02, heartbeat_timeout_s=0.25) as (a, b, ra, _rb):
        await wait_until(lambda: a.stats["received"] >= 3)  # B's heartbeats arrive
        assert ra.lost == []
        closed_at = time.monotonic()
        await b.close()
        await wait_until(lambda: ra.lost, timeout=2.0)
        ((peer, silent),) = ra.lost
        assert peer == "B" and silent >= 0.25
        assert time.monotonic() - closed_at < 1.0
        await asyncio.sleep(0.1)  # several more heartbeat rounds: reported only once
        assert len(ra.lost) == 1


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_peer_lost_once_per_silence_with_fake_clock():
    now = [100.0]
    t = ZmqTransport("A", heartbeat_timeout_s=5.0, clock=lambda: now[0])
    rec = Recorder(t)
    t.add_peer("ghost", "tcp://127.0.0.1:9")  # nobody there; never started, so no sockets
    now[0] = 104.9
    assert t.check_peers() == [] and rec.lost == []
    now[0] = 105.5
    assert t.check_peers() == ["ghost"]
    assert rec.lost == [("ghost", pytest.approx(5.5))]
    now[0] = 200.0
    assert t.check_peers() == [] and len(rec.lost) == 1
    await t.close()


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_heard_peer_is_not_lost_with_fake_clock():
    now = [0.0]
    async with pair(heartbeat_interval_s=0.01, heartbeat_timeout_s=5.0, clock=lambda: now[0]) as (
        a,
        b,
        ra,
        _rb,
    ):
        received = a.stats["received"]
        now[0] = 4.0
        await wait_until(lambda: a.stats["received"] > received)  # a heartbeat at t=4
        now[0] = 8.0
        assert a.check_peers() == []  # silent for 4 s only
        now[0] = 100.0
        await b.close()
        await wait_until(lambda: ra.lost)
        assert ra.lost[0][0] == "B" and ra.lost[0][1] >= 5.0


# -- lifecycle ------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_close_is_idempotent_and_send_after_close_fails():
    a = ZmqTransport("A")
    await a.close()  # never started
    await a.close()
    b = ZmqTransport("B")
    await b.start()
    b.add_peer("A", "tcp://127.0.0.1:9")
    await b.close()
    await b.close()
    with pytest.raises(RuntimeError, match=r"transport 'B' is closed"):
        b.send_tensor("A", (1,), np.float32(1))
    with pytest.raises(RuntimeError, match=r"transport 'B' is closed"):
        await b.start()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.asyncio
@pytest.mark.timeout(30)
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
async def test_100_open_close_cycles_leak_no_fds():
    async def cycle() -> None:
        a, b = ZmqTransport("A", secret=SECRET), ZmqTransport("B", secret=SECRET)
        rb = Recorder(b)
        await a.start()
        await b.start()
        a.add_peer("B", b.address)
        a.send_tensor("B", (1,), np.float32(1))
        await wait_until(lambda: rb.tensors)
        await a.close()
        await b.close()

    await cycle()  # warm up lazily created loop/selector resources
    before = _open_fds()
    for _ in range(100):
        await cycle()
    assert _open_fds() <= before


# -- CurveZMQ -------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(30)
@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq built without CurveZMQ")
async def test_curve_exchange_and_unknown_client_key_refused(raw_dealer):
    a_pub, a_sec = zmq.curve_keypair()
    b_pub, b_sec = zmq.curve_keypair()
    a_kw = {"curve": (a_pub, a_sec, {"B": b_pub})}
    b_kw = {"curve": (b_pub, b_sec, {"A": a_pub})}
    async with pair(a_kw, b_kw) as (a, b, ra, rb):
        a.send_tensor("B", (1,), np.arange(3, dtype=np.float64))
        b.send_control("A", {"ok": True})
        await wait_until(lambda: rb.tensors and ra.controls)
        np.testing.assert_array_equal(rb.tensors[0][2], np.arange(3, dtype=np.float64))

        # A stranger with a valid handshake but an unknown key is refused by ZAP.
        s_pub, s_sec = zmq.curve_keypair()
        evil = raw_dealer(
            routing_id=b"A", curve_publickey=s_pub, curve_secretkey=s_sec, curve_serverkey=b_pub
        )
        monitor = evil.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        evil.connect(b.address)
        await evil.send_multipart([b"T", *[bytes(f) for f in encode_tensor((9,), np.float32(6))]])
        event = await asyncio.wait_for(monitor.recv_multipart(), 10)
        assert int.from_bytes(event[0][:2], "little") == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        evil.disable_monitor()
        monitor.close()
        a.send_tensor("B", (2,), np.float32(2))
        await wait_until(lambda: len(rb.tensors) == 2)
        assert [key for _, key, _, _ in rb.tensors] == [(1,), (2,)]


@pytest.mark.asyncio
@pytest.mark.timeout(30)
@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq built without CurveZMQ")
async def test_curve_transports_close_without_leaking_fds():
    pub, sec = zmq.curve_keypair()  # a cluster sharing one keypair

    async def cycle() -> None:
        async with (
            ZmqTransport("A", curve=(pub, sec)) as a,
            ZmqTransport("B", curve=(pub, sec)) as b,
        ):
            rb = Recorder(b)
            a.add_peer("B", b.address)
            a.send_tensor("B", (1,), np.float32(1))
            await wait_until(lambda: rb.tensors)

    await cycle()
    before = _open_fds()
    for _ in range(10):
        await cycle()
    assert _open_fds() <= before


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_on_burst_brackets_every_delivery_of_a_receive_wake_up():
    async with pair(secret=SECRET) as (a, b, _ra, rb):
        events: list[str] = []
        b.on_burst = (lambda: events.append("begin"), lambda: events.append("end"))
        b.on_tensor = lambda src, key, value, dead: events.append("tensor")
        b.on_control = lambda src, msg, blob: events.append("control")
        for k in range(20):   # sent without yielding: many arrive in one wake-up
            a.send_tensor("B", (k,), np.float32(k))
        a.send_control("B", {"type": "x"})
        await wait_until(lambda: events.count("tensor") == 20 and "control" in events)
        await wait_until(lambda: events[-1] == "end")
        depth = 0
        inside = []   # deliveries per bracket
        for e in events:   # begin, deliveries, end; never nested; a message that
            if e == "begin":   # arrived alone is delivered outside any bracket
                assert depth == 0
                depth = 1
                inside.append(0)
            elif e == "end":
                assert depth == 1
                depth = 0
            elif depth:
                inside[-1] += 1
        assert depth == 0
        assert inside and max(inside) >= 2   # some of the 21 arrived together
        assert max(inside) <= 16             # _BURST_GROUP


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_a_message_that_arrives_alone_is_handled_without_on_burst():
    # no heartbeats during the test: each data message is its wake-up's only message
    async with pair(secret=SECRET, heartbeat_interval_s=60) as (a, b, _ra, rb):
        events: list[str] = []
        b.on_burst = (lambda: events.append("begin"), lambda: events.append("end"))
        b.on_tensor = lambda src, key, value, dead: events.append(f"tensor {float(value)}")
        for k in range(3):   # one at a time, each after the previous one arrived
            a.send_tensor("B", (k,), np.float32(k))
            await wait_until(lambda: f"tensor {float(k)}" in events)
        assert events == ["tensor 0.0", "tensor 1.0", "tensor 2.0"]


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_order_holds_when_the_pipe_fills_and_the_sender_task_takes_over():
    async with pair(secret=SECRET) as (a, b, _ra, rb):
        # sent without yielding, 40 MB: more than libzmq's pipes and the socket buffers
        # take, so the fast path meets a full pipe and the sender task takes over
        n = 20_000
        queued = 0
        for k in range(n):
            a.send_tensor("B", (k,), np.full(512, k, dtype=np.int32))
            queued = max(queued, len(a._peers["B"].queue))
        a.send_tensor("B", ("last",), np.float64(1.5))   # after the queued ones too
        await wait_until(lambda: len(rb.tensors) == n + 1, timeout=50)
        assert queued > 0   # the fast path stopped and the sender task sent the rest
        assert [t[1] for t in rb.tensors] == [(k,) for k in range(n)] + [("last",)]
        assert [int(t[2][0]) for t in rb.tensors[:n]] == list(range(n))
        assert a.stats["sent"] >= n + 1 and b.stats["rejected"] == 0
