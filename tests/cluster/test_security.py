"""Only the owning client controls a worker; garbage never takes one down; workers
started elsewhere (spec file, HMAC secret or CurveZMQ keys) accept only their clients."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import socket
import subprocess
import time

import msgpack
import numpy as np
import pytest
import zmq
import zmq.asyncio

import dcf
from dcf.actors.codec import pack_tensors
from dcf.actors.graphdef import decode_parts, encode_parts
from dcf.actors.transport import ZmqTransport
from dcf.errors import WorkerError
from tests.cluster.helpers import alive, on, start_worker, stop_process, task

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


def _pipeline():
    """x on worker 0, doubled on worker 1: worker 1 receives one value per run."""
    x = dcf.placeholder(dcf.float32, (), name="x")
    with on(0):
        a = x + 1.0
    with on(1):
        b = a * 2.0
    return x, b


async def _send_as(name: str, secret: bytes | None, worker: str, address: str,
                   messages: list, arrived) -> None:
    """Send `messages` to `worker` as `name`, and keep the connection open until
    `arrived()` says the worker has them (a closing socket drops what it still holds)."""
    t = ZmqTransport(name, secret=secret, heartbeat_interval_s=60)
    await t.start()
    t.add_peer(worker, address)
    for kind, *rest in messages:
        if kind == "T":
            t.send_tensor(worker, *rest)
        else:
            t.send_control(worker, *rest)
    deadline = time.monotonic() + 20
    while not arrived():
        assert time.monotonic() < deadline, "the worker never got the messages"
        await asyncio.sleep(0.05)
    await t.close()


def _next_step(cluster) -> int:
    n = int(re.search(r"\d+", repr(cluster._client._step_ids)).group())
    return cluster._client._step_base + n


def test_without_the_secret_no_one_runs_ops_or_injects_tensors(cluster3, tmp_path):
    x, b = _pipeline()
    w1 = task(1)
    address = cluster3.spec["worker"][1]
    marker = tmp_path / "pwned"
    with dcf.Session(cluster=cluster3) as sess:
        _, keys = cluster3._stats(1, record_keys=True)
        assert sess.run(b, {x: 1.0}) == 4.0
        info, keys = cluster3._stats(1, record_keys=False)
        data = [k for k in keys if not k[1].startswith("!")]
        assert data, "worker 1 received a's value"
        rejected = info["rejections"].get("mac", 0)

        # 1) forged control: a plan whose py_func would write a file, a run, a shutdown
        g = dcf.Graph()
        with g.as_default(), on(1):
            dcf.py_func(lambda: marker.write_text("x") and np.int32(0), [], dcf.int32)
        from dcf.partition import partition
        from dcf.placement import place
        ops = g.get_operations()
        parts = partition(ops, place(ops, "/cpu:0", lambda d: True), [], [])
        blob = encode_parts([{"device": d, "nodes": p.nodes, "feeds": p.feeds,
                              "fetches": [], "frame_parents": p.frame_parents}
                             for d, p in parts.items()])
        forged = [("C", {"type": "plan", "plan": 999, "session": 1}, blob),
                  ("C", {"type": "run", "step": 1, "plan": 999, "session": 1}),
                  ("C", {"type": "shutdown"}), ("C", {"type": "attach", "address": "x"})]
        # 2) forged values for the keys of the next run
        step = _next_step(cluster3)
        forged += [("T", (step, edge, tag), np.float32(100.0)) for _, edge, tag in data]
        def mac_rejections() -> int:
            return cluster3._stats(1)[0]["rejections"].get("mac", 0)

        for k, name in enumerate(("intruder", cluster3._client.name)):
            # (the client's own name is taken by its live connection: refused earlier)
            want = rejected + len(forged) * (k + 1)
            asyncio.run(_send_as(name, b"not-the-secret", w1, address, forged,
                                 lambda w=want, k=k: k == 1 or mac_rejections() >= w))
        assert sess.run(b, {x: 1.0}) == 4.0, "injected values were ignored"
        time.sleep(0.2)
        assert not marker.exists(), "the forged plan never ran"
        assert all(alive(p) for p in cluster3.worker_pids)
        assert mac_rejections() >= rejected + len(forged)

        # positive control: the same injection *with* the secret does reach the Recv
        step = _next_step(cluster3)
        injected = [("T", (step, edge, tag), np.float32(100.0)) for _, edge, tag in data]
        asyncio.run(_send_as("intruder", cluster3._test_secret, w1, address, injected,
                             lambda: cluster3._stats(1)[0]["rendezvous"] >= len(injected)))
        assert sess.run(b, {x: 1.0}) == 200.0
        assert sess.run(b, {x: 1.0}) == 4.0


def _local_with_secret(n: int) -> dcf.Cluster:
    """Cluster.local(n), remembering the secret it generates (it keeps it nowhere)."""
    import secrets

    real, seen = secrets.token_bytes, []

    def spy(k=None):
        v = real(k)
        seen.append(v)
        return v

    secrets.token_bytes = spy
    try:
        cluster = dcf.Cluster.local(n)
    finally:
        secrets.token_bytes = real
    cluster._test_secret = next(v for v in seen if len(v) == 32)
    return cluster


@pytest.fixture(scope="module")
def cluster3():
    with _local_with_secret(3) as cluster:
        yield cluster


def test_thousands_of_random_frames_leave_a_worker_working(tmp_path):
    with _local_with_secret(2) as cluster:
        secret = cluster._test_secret
        address = cluster.spec["worker"][1]
        rng = random.Random(0)

        def junk(n: int) -> bytes:
            return bytes(rng.getrandbits(8) for _ in range(n))

        async def fuzz() -> None:
            ctx = zmq.asyncio.Context()
            socks = []
            for k in range(8):   # unauthenticated: random identities, random frames
                s = ctx.socket(zmq.DEALER)
                s.linger = 0
                if k % 2:
                    s.routing_id = junk(rng.randint(1, 20)).replace(b"\0", b"x")
                s.connect(address)
                socks.append(s)
            for i in range(3000):
                frames = [junk(rng.randint(0, 40)) for _ in range(rng.randint(1, 7))]
                if rng.random() < 0.3:
                    frames[0] = rng.choice([b"T", b"C", b"H", junk(32)])
                if rng.random() < 0.2:
                    frames[-1] = msgpack.packb({"type": rng.choice(["run", "plan", "batch"]),
                                                "step": rng.randint(0, 9)})
                await socks[i % len(socks)].send_multipart(frames)
            # authenticated garbage from a stranger: bad keys, bad batches, bad tensors
            t = ZmqTransport("fuzzer", secret=secret, heartbeat_interval_s=60)
            await t.start()
            t.add_peer(task(1), address)
            for i in range(1000):
                r = rng.random()
                if r < 0.3:
                    t.send_control(task(1), {"type": "batch"}, junk(rng.randint(0, 64)))
                elif r < 0.5:
                    t.send_control(task(1), {"type": rng.choice(["run", "abort", "plan",
                                                                 "stats", "x"]),
                                             "step": rng.randint(-5, 5)}, junk(8))
                elif r < 0.7:
                    t.send_tensor(task(1), (rng.randint(0, 3), "e", ()), np.float32(1))
                elif r < 0.85:
                    t.send_tensor(task(1), ("k", 1), np.zeros(3, np.float32))
                else:
                    # a batch of tensors with one byte flipped (MAC'd after the flip)
                    items = [((rng.randint(0, 3), "e", (i,)), np.float32(i), False)
                             for i in range(3)]
                    body = bytearray(pack_tensors(items, 1 << 20)[0])
                    body[rng.randrange(len(body))] ^= 0xFF
                    t._enqueue(task(1), b"T", bytes(body))
            await asyncio.sleep(0.5)
            await t.close()
            for s in socks:
                s.close(0)
            ctx.term()

        asyncio.run(fuzz())
        assert all(alive(p) for p in cluster.worker_pids)
        x, b = _pipeline()
        with dcf.Session(cluster=cluster) as sess:
            assert sess.run(b, {x: 2.0}) == 6.0
        info, _ = cluster._stats(1)
        assert info["transport"]["rejected"] >= 2000


# --------------------------------------------------------- workers started elsewhere
def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _start_workers(spec_path, n: int) -> list[subprocess.Popen]:
    # task 0 named by --task, the others by DCF_TASK_INDEX (the other way to name it)
    return [start_worker(spec_path, k, task_by_env=k > 0) for k in range(n)]


def _stop(procs) -> None:
    for p in procs:
        p.terminate()     # all at once, then each waited for
    for p in procs:
        stop_process(p)


def _spec_roundtrip(spec_path) -> None:
    x, b = _pipeline()
    with dcf.Cluster(spec_path) as cluster, dcf.Session(cluster=cluster) as sess:
        assert sess.run(b, {x: 3.0}) == 8.0
        pids = cluster.worker_pids
    return pids


def test_workers_from_a_spec_file_with_a_secret_file(tmp_path):
    (tmp_path / "secret").write_bytes(os.urandom(32).hex().encode())
    ports = _free_ports(2)
    spec = {"worker": [f"tcp://127.0.0.1:{p}" for p in ports], "secret_file": "secret"}
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(spec))
    procs = _start_workers(path, 2)
    try:
        pids = _spec_roundtrip(path)
        assert sorted(pids) == sorted(p.pid for p in procs)
        assert all(p.poll() is None for p in procs), "detaching leaves workers running"
        dcf.reset_default_graph()
        _spec_roundtrip(path)   # and another client can attach afterwards
        (tmp_path / "wrong").write_bytes(b"wrong-secret")
        bad = dict(spec, secret_file=str(tmp_path / "wrong"))
        with pytest.raises(WorkerError, match="did not answer"):
            dcf.Cluster(bad, connect_timeout_s=1.0)
    finally:
        _stop(procs)


def test_workers_from_a_spec_with_curve_keys(tmp_path):
    if not zmq.has("curve"):
        pytest.skip("libzmq without CurveZMQ")
    public, secret = zmq.curve_keypair()
    ports = _free_ports(2)
    spec = {"worker": [f"tcp://127.0.0.1:{p}" for p in ports],
            "curve": {"public": public.decode(), "secret": secret.decode()}}
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(spec))
    procs = _start_workers(path, 2)
    try:
        _spec_roundtrip(path)
        other_pub, other_sec = zmq.curve_keypair()
        stranger = {"worker": spec["worker"],
                    "curve": {"public": other_pub.decode(), "secret": other_sec.decode()}}
        with pytest.raises(WorkerError, match="did not answer"):
            dcf.Cluster(stranger, connect_timeout_s=1.0)
    finally:
        _stop(procs)


# ---------------------------------------------------------------- wire formats
def test_graph_descriptions_round_trip_attributes():
    from dcf.ops.array_ops import Dyn
    from dcf.plan import nodes_from_ops

    x = dcf.placeholder(dcf.float32, (4, 3))
    i = dcf.placeholder(dcf.int32, ())
    y = x[1:, ...][i]
    z = dcf.py_func(lambda a: a, [y], dcf.float32)
    c = dcf.constant(np.arange(6, dtype=np.int64).reshape(2, 3))
    ops = dcf.get_default_graph().get_operations()
    pn = nodes_from_ops(ops)
    nodes = list(pn.values())
    (back,) = decode_parts(encode_parts([{"device": "/cpu:0", "nodes": nodes, "feeds": [],
                                          "fetches": [], "frame_parents": {}}]))
    for p, q in zip(nodes, back["nodes"]):
        assert (p.name, p.type, p.kind, p.n_out) == (q.name, q.type, q.kind, q.n_out)
        assert q.kernel is p.kernel
        for k, v in p.attrs.items():
            w = q.attrs[k]
            if k == "fn":
                assert callable(w) and w(5) == 5
            elif isinstance(v, np.ndarray):
                np.testing.assert_array_equal(v, w)
                assert v.dtype == w.dtype
            else:
                assert v == w and type(v) is type(w), (k, v, w)
    keys = [q.attrs["key"] for q in back["nodes"] if q.type == "StridedSlice"]
    assert any(isinstance(k, tuple) and Dyn(0) in k for k in keys)
    assert any(Ellipsis in k for k in keys)
    del z, c


def test_graph_descriptions_refuse_what_a_worker_cannot_rebuild():
    from dcf.actors.graphdef import GraphDefError
    from dcf.plan import PNode

    p = PNode("odd", "Const", dcf.ops.registry.Kind.KERNEL, "",
              attrs={"value": object(), "dtype": None})
    with pytest.raises(GraphDefError, match="Const 'odd'"):
        encode_parts([{"device": "/cpu:0", "nodes": [p], "feeds": [], "fetches": [],
                       "frame_parents": {}}])
    with pytest.raises(GraphDefError):
        decode_parts(b"\x93garbage")


def test_transport_keeps_order_under_backpressure():
    async def main():
        got: list = []
        done = asyncio.Event()
        n = 20000

        def on_tensor(src, key, value, is_dead):
            got.append(key[0])
            if len(got) == n:
                done.set()

        a = ZmqTransport("a", secret=b"s")
        b = ZmqTransport("b", secret=b"s", on_tensor=on_tensor)
        await a.start()
        await b.start()
        a.add_peer("b", b.address)
        payload = np.zeros(2048, np.float32)
        queued = 0
        for k in range(n):
            a.send_tensor("b", (k,), payload)   # outruns libzmq's pipe: Again, then queue
            queued = max(queued, len(a._peers["b"].queue))
            if k % 5000 == 0:
                await asyncio.sleep(0)
        assert queued > 0, "the fast path fell back to the queue"
        await asyncio.wait_for(done.wait(), 30)
        await a.close()
        await b.close()
        return got

    got = asyncio.run(main())
    assert got == list(range(len(got)))
