"""Transport micro-benchmark: messages/s and GB/s between two ZmqTransports.

One transport streams N tensors to another over inproc, ipc and tcp loopback (and tcp with
the HMAC secret on, as `Cluster.local` runs it); a sample is the time from the first
``send_tensor`` until the receiver's ``on_tensor`` has seen the N-th message, so it
includes encoding, the per-peer send queue, libzmq, decoding and dispatch. Small frames
(64 B of float32) measure per-message overhead; large frames (4 MiB) measure bandwidth.

Both ends run in this one process on one event loop, so a figure is the combined send and
receive cost on one core (two processes would each pay only their half). inproc moves
zero-copy frames between threads of a shared context, so its GB/s is a pointer hand-off,
not a memory copy. With the secret on, each 4 MiB message is hashed twice (send and
verify), so HMAC-SHA256 speed bounds that row.

    python -m bench.transport [--quick] [--out FILE]
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np
import zmq
import zmq.asyncio

from bench.harness import Result, Stats, base_argparser, report
from dcf.actors.transport import ZmqTransport

SMALL_BYTES = 64
LARGE_BYTES = 4 << 20
SECRET = b"bench-secret"


@dataclass(slots=True)
class Workload:
    transport: str  # inproc | ipc | tcp | tcp+hmac
    nbytes: int
    count: int  # messages per sample


class _Counter:
    """on_tensor callback that resolves a future when the target count is reached."""

    def __init__(self) -> None:
        self.seen = 0
        self.target = 0
        self.done: asyncio.Future[None] | None = None

    def expect(self, n: int) -> asyncio.Future[None]:
        self.seen, self.target = 0, n
        self.done = asyncio.get_running_loop().create_future()
        return self.done

    def __call__(self, src: str, key: tuple, value: object, is_dead: bool) -> None:
        self.seen += 1
        if self.seen == self.target and self.done is not None:
            self.done.set_result(None)


async def _measure(w: Workload, repeat: int, warmup: int, tmpdir: str) -> Stats:
    ctx = zmq.asyncio.Context() if w.transport == "inproc" else None
    binds = {
        "inproc": ("inproc://bench-a", "inproc://bench-b"),
        "ipc": (f"ipc://{tmpdir}/a", f"ipc://{tmpdir}/b"),
    }.get(w.transport, ("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
    secret = SECRET if w.transport == "tcp+hmac" else None
    a = ZmqTransport("A", bind=binds[0], secret=secret, context=ctx, heartbeat_interval_s=1.0)
    b = ZmqTransport("B", bind=binds[1], secret=secret, context=ctx, heartbeat_interval_s=1.0)
    counter = _Counter()
    b.on_tensor = counter
    value = np.ones(w.nbytes // 4, dtype=np.float32)
    keys = [(0, "edge", 0, i) for i in range(w.count)]
    loop = asyncio.get_running_loop()
    samples: list[float] = []
    try:
        await a.start()
        await b.start()
        a.add_peer("B", b.address)
        for i in range(warmup + repeat):
            done = counter.expect(w.count)
            start = loop.time()
            for key in keys:
                a.send_tensor("B", key, value)
            await asyncio.wait_for(done, timeout=120)
            if i >= warmup:
                samples.append(loop.time() - start)
    finally:
        await a.close()
        await b.close()
        if ctx is not None:
            ctx.destroy(linger=0)
    return Stats.from_samples(samples)


async def _run(quick: bool) -> tuple[dict, list[Result]]:
    repeat, warmup = (3, 1) if quick else (7, 1)
    n_small, n_large = (20_000, 40) if quick else (100_000, 250)
    workloads = [
        Workload(t, size, n_small if size == SMALL_BYTES else n_large)
        for t in ("inproc", "ipc", "tcp", "tcp+hmac")
        for size in (SMALL_BYTES, LARGE_BYTES)
    ]
    tmpdir = tempfile.mkdtemp(prefix="dcf-bench-")
    results: list[Result] = []
    try:
        for w in workloads:
            stats = await _measure(w, repeat, warmup, tmpdir)
            label = f"{w.transport} {'64B' if w.nbytes == SMALL_BYTES else '4MiB'}"
            results.append(Result.rate("dcf", f"{label} msgs", stats, w.count, unit="msg/s"))
            if w.nbytes == LARGE_BYTES:
                gb = w.count * w.nbytes / 1e9
                results.append(Result.rate("dcf", f"{label} bandwidth", stats, gb, unit="GB/s"))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    config = {
        "quick": quick,
        "repeat": repeat,
        "warmup": warmup,
        "small_bytes": SMALL_BYTES,
        "large_bytes": LARGE_BYTES,
        "small_count": n_small,
        "large_count": n_large,
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    return config, results


def main(argv: list[str] | None = None) -> None:
    args = base_argparser(__doc__.splitlines()[0]).parse_args(argv)
    config, results = asyncio.run(_run(args.quick))
    report("transport", config, results, {}, out=args.out)


if __name__ == "__main__":
    main()
