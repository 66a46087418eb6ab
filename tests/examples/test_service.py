"""examples/service.py: the real server in its own process on 127.0.0.1 (a free port),
50 concurrent requests from a real HTTP client (aiohttp), every answer checked against
numpy, and /health answering promptly while the solver requests are in flight."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cluster.helpers import stop_process

aiohttp = pytest.importorskip("aiohttp")

SERVICE = Path(__file__).resolve().parents[2] / "examples" / "service.py"
BINARY = {"Content-Type": "application/octet-stream"}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serving(host: str, port: int):
    """service.py on host:port in its own process: (the process, its first line, printed
    once the socket is listening); stopped on the way out."""
    proc = subprocess.Popen([sys.executable, "-u", str(SERVICE), "--host", host,
                             "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield proc, proc.stdout.readline()
    finally:
        stop_process(proc, wait_s=10)


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    with _serving("127.0.0.1", port) as (_, line):
        assert line.startswith(f"serving on http://127.0.0.1:{port}"), line
        yield f"http://127.0.0.1:{port}"


class Probe:
    """GET /health every few ms from its own thread and event loop."""

    def __init__(self, url: str) -> None:
        self.url, self.busy, self.idle = url, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self.poll()), daemon=True)

    async def poll(self) -> None:
        async with aiohttp.ClientSession() as client:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                async with client.get(f"{self.url}/health",
                                      timeout=aiohttp.ClientTimeout(total=10)) as r:
                    body = await r.json()
                (self.busy if body["in_flight"] else self.idle).append(time.perf_counter() - t0)
                await asyncio.sleep(0.003)


def test_fifty_concurrent_requests_are_right_and_health_stays_responsive(server):
    rng = np.random.default_rng(0)
    xs = [rng.uniform(0, 10.0 ** rng.uniform(0, 9), 100_000 if k % 2 else 300)
          for k in range(50)]
    xs[0][:3] = [0.0, 1.0, 4.0]

    async def main() -> list:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
            async def one(k: int, x: np.ndarray):
                if k % 2:      # binary float64 in and out
                    async with client.post(f"{server}/sqrt?tol=1e-12", data=x.tobytes(),
                                           headers=BINARY) as r:
                        assert r.status == 200
                        return np.frombuffer(await r.read()), int(r.headers["X-Iterations"])
                async with client.post(f"{server}/sqrt", json={"x": x.tolist()}) as r:
                    assert r.status == 200
                    body = await r.json()
                    return np.asarray(body["sqrt"]), body["iterations"]
            return await asyncio.gather(*(one(k, x) for k, x in enumerate(xs)))

    probe = Probe(server)
    probe.thread.start()
    while not probe.idle and not probe.busy:
        time.sleep(0.005)
    try:
        answers = asyncio.run(main())
    finally:
        probe.stop.set()
        probe.thread.join(timeout=10)
    for x, (y, k) in zip(xs, answers):
        np.testing.assert_allclose(y, np.sqrt(x), rtol=1e-9, atol=1e-12)
        assert 1 <= k < 2000
    assert answers[0][0][:3].tolist() == [0.0, 1.0, 2.0]
    # /health kept answering while solver requests were in flight, and quickly
    assert len(probe.busy) >= 3, (probe.busy, probe.idle)
    assert statistics.median(probe.busy) < 0.15 and max(probe.busy) < 1.0, probe.busy


def test_query_form_and_bad_requests(server):
    async def main() -> None:
        async with aiohttp.ClientSession() as client:
            async with client.get(f"{server}/sqrt", params=[("x", "2"), ("x", "1e300")]) as r:
                body = await r.json()
                assert r.status == 200
                np.testing.assert_allclose(body["sqrt"], [2 ** 0.5, 1e150], rtol=1e-12)
            for kwargs in ({"json": {"x": [-1.0]}}, {"json": {"x": []}},
                           {"json": {"x": ["a"]}},
                           {"data": "not json", "headers": {"Content-Type": "application/json"}},
                           {"json": {"x": [1.0], "tol": 0}},
                           {"data": b"1234567", "headers": BINARY}):
                async with client.post(f"{server}/sqrt", **kwargs) as r:
                    assert r.status == 400, kwargs
                    assert "error" in json.loads(await r.text())
            async with client.get(f"{server}/health") as r:
                assert (await r.json())["status"] == "ok"
    asyncio.run(main())


def test_selftest_flag_prints_latency_figures():
    out = subprocess.run([sys.executable, str(SERVICE), "--selftest", "--requests", "10",
                          "--values", "1000"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert "latency p50" in out.stdout and "requests/s" in out.stdout


@pytest.mark.timeout(60)
def test_a_client_that_goes_away_cancels_its_run(monkeypatch):
    """aiohttp (>= 3.9) leaves a handler running when its client disconnects unless the
    runner has handler_cancellation=True: without it an abandoned request's run goes on
    to its end, holding one of the --concurrency slots (docs/services.md promises it is
    cancelled). Here the solve never ends by itself: only cancellation ends it."""
    sys.path.insert(0, str(SERVICE.parent))
    try:
        import service
    finally:
        sys.path.remove(str(SERVICE.parent))

    async def main() -> dict:
        started, stopped = asyncio.Event(), asyncio.Event()
        outcome: dict = {}

        async def solve(self, values, tol):
            started.set()
            try:
                await asyncio.Event().wait()        # a run that lasts until cancelled
            except asyncio.CancelledError:
                outcome["cancelled"] = True
                raise
            finally:
                stopped.set()

        monkeypatch.setattr(service.SqrtSolver, "solve", solve)
        runner, port = await service.start_server("127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as client:
                async def ask() -> None:
                    async with client.post(f"{url}/sqrt", json={"x": [2.0]}) as r:
                        await r.read()

                asking = asyncio.ensure_future(ask())
                await started.wait()
                asking.cancel()                     # the client goes away mid-request
                with pytest.raises(asyncio.CancelledError):
                    await asking
            await stopped.wait()
            async with aiohttp.ClientSession() as client:
                async with client.get(f"{url}/health") as r:
                    outcome["health"] = await r.json()
        finally:
            await runner.cleanup()
        return outcome

    outcome = asyncio.run(main())
    assert outcome["cancelled"] is True
    assert outcome["health"] == {"status": "ok", "in_flight": 0}


def test_serves_on_an_ipv6_host_too():
    # "--host ::1" failed with "Address family for hostname not supported" (an IPv4 socket)
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with _serving("::1", 0) as (proc, line):
        assert line.startswith("serving on http://[::1]:"), line + proc.stdout.read()
        url = line.split()[2]

        async def ask() -> dict:
            async with aiohttp.ClientSession() as client:
                async with client.get(f"{url}/sqrt", params={"x": "9"}) as r:
                    return await r.json()

        assert asyncio.run(ask())["sqrt"] == [3.0]


def test_a_port_in_use_is_one_line_and_exit_status_1(example, capsys):
    # it was a traceback ending in "OSError: [Errno 98] Address already in use"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert example("service").main(["--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot serve on 127.0.0.1:{port}:" in err and "Traceback" not in err, err
