"""An HTTP service answering each request with a graph that holds a data-dependent loop.

Run:  python examples/service.py --port 8080          # serve until Ctrl-C (or SIGTERM)
      curl 'http://127.0.0.1:8080/sqrt?x=2'
      curl -d '{"x": [2, 9, 1e6], "tol": 1e-12}' http://127.0.0.1:8080/sqrt
      (or POST raw float64 values as application/octet-stream: the answer is raw float64)
      python examples/service.py --selftest           # start a server process, fire 50
                                                      # concurrent requests at it, print
                                                      # p50/p99 latency and requests/s
Needs: pip install -e '.[services]' (aiohttp; uvloop is used when installed).

The graph is Newton's method for sqrt(x), elementwise over a vector, iterated inside the
graph until the largest relative step falls below `tol`:

    y = where(x > 1, x, 1)
    while max over x > 0 of |y' - y| / y' >= tol and i < 2000:  # dcf.while_loop: the
        y' = (y + x / y) / 2                                  # trip count depends on
    return where(x > 0, y, 0), i                              # the data

(y' > 0 wherever x > 0; the elements x = 0, whose y only halves, take no part in the
stopping test, and their answer is exactly 0.)

Every request is one `await sess.run(...)` on ONE `dcf.AsyncSession` shared by all
handlers. The session runs its device actors inside the server's own event loop (no
threads), so many requests are in flight at once. Graph runs are CPU work on that loop,
though, and a run may go from start to end without handing the loop back (a short run,
or a few heavy vector ops); if 50 runs were runnable at once, a request arriving behind
them (say `/health`) would wait for all of them. So an `asyncio.Semaphore`
(`--concurrency`, default 2) admits only a few runs at a time, the others waiting
without occupying the loop, and each admitted run first yields once (`sleep(0)`) so the
loop polls its sockets between runs: `/health` answers within about two runs' time
while solver requests are in flight (docs/services.md).

Endpoints:
  GET  /health                      -> {"status": "ok", "in_flight": n}
  GET  /sqrt?x=2&x=3[&tol=1e-10]    -> {"sqrt": [...], "iterations": k}
  POST /sqrt {"x": [...], "tol": t} -> same
  POST /sqrt?tol=t, Content-Type application/octet-stream, body: float64 values
                                    -> float64 square roots; header X-Iterations: k
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import math
import signal
import socket
import sys
import time
from typing import Any

import numpy as np

import dcf

MAX_ITERATIONS = 2000       # from y = max(x, 1), Newton halves y until near sqrt(x):
                            # ~520 steps for 1e308, ~540 for 5e-324
DEFAULT_TOL = 1e-10
MAX_VALUES = 1_000_000


class SqrtSolver:
    """The Newton-iteration graph and the one AsyncSession that runs it for every request."""

    def __init__(self, concurrency: int = 2) -> None:
        if concurrency < 1:          # a Semaphore(0) would admit no run at all
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.concurrency = concurrency
        self.graph = dcf.Graph()
        with self.graph.as_default():
            self.x = dcf.placeholder(dcf.float64, (None,), name="x")
            self.tol = dcf.placeholder(dcf.float64, (), name="tol")
            x = self.x
            y0 = dcf.where(x > 1.0, x, dcf.ones_like(x))

            def body(i, y, _):
                y2 = 0.5 * (y + x / y)
                # The relative step, over the elements x > 0 only: for x = 0, y halves
                # forever (its relative step stays 1/2) and the answer is set to 0 below.
                step = dcf.reduce_max(dcf.where(x > 0.0, dcf.abs(y2 - y) / y2,
                                                dcf.zeros_like(y2)))
                return i + 1, y2, step

            self.iterations, y, _ = dcf.while_loop(
                lambda i, y, step: dcf.logical_and(step >= self.tol, i < MAX_ITERATIONS),
                body, (dcf.constant(0), y0, dcf.constant(math.inf, dtype=dcf.float64)),
                name="newton")
            self.y = dcf.where(x > 0.0, y, dcf.zeros_like(y))      # sqrt(0) is exactly 0
        self.sess: dcf.AsyncSession | None = None
        self.admit: asyncio.Semaphore | None = None
        self.in_flight = 0

    async def start(self) -> None:
        self.sess = dcf.AsyncSession(self.graph)
        self.admit = asyncio.Semaphore(self.concurrency)

    async def close(self) -> None:
        if self.sess is not None:
            await self.sess.close()

    async def solve(self, values: np.ndarray, tol: float) -> tuple[np.ndarray, int]:
        async with self.admit:
            # Hand the loop back once per admitted run, so it polls its sockets between
            # runs even when a run itself never yields (see docs/services.md).
            await asyncio.sleep(0)
            y, k = await self.sess.run([self.y, self.iterations],
                                       {self.x: values, self.tol: tol})
        return y, int(k)


BINARY = "application/octet-stream"


def parse_request(values: Any, tol: Any) -> tuple[np.ndarray, float]:
    """Validate the inputs (a list of numbers or a float64 array); raise ValueError with
    a message for the client."""
    if isinstance(values, np.ndarray):
        x = values
    else:
        if not isinstance(values, list):
            values = [values]
        try:
            x = np.asarray([float(v) for v in values], dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError("x must be numbers") from None
        except OverflowError:       # a JSON integer beyond float64 (1 followed by 400 0s)
            raise ValueError("x must be finite and >= 0") from None
    try:
        t = DEFAULT_TOL if tol is None else float(tol)
    except (TypeError, ValueError):
        raise ValueError("tol must be a number") from None
    except OverflowError:
        raise ValueError("tol must be a positive number") from None
    if x.size == 0:
        raise ValueError("give at least one x")
    if x.size > MAX_VALUES:
        raise ValueError(f"at most {MAX_VALUES} values per request")
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        raise ValueError("x must be finite and >= 0")
    if not (math.isfinite(t) and t > 0):
        raise ValueError("tol must be a positive number")
    return x, t


def make_app(solver: SqrtSolver) -> Any:
    from aiohttp import web

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "in_flight": solver.in_flight})

    async def sqrt(request: web.Request) -> web.Response:
        solver.in_flight += 1          # from the moment the request is being handled
        try:
            return await _sqrt(request)
        finally:
            solver.in_flight -= 1

    async def _sqrt(request: web.Request) -> web.Response:
        # (a media type is case-insensitive; aiohttp's content_type is its lower-case form,
        # and application/octet-stream also where the header is missing: JSON then)
        binary = request.method == "POST" and "Content-Type" in request.headers and \
            request.content_type == BINARY
        try:
            if binary:          # raw little-endian float64 values; tol in the query
                raw = await request.read()
                if len(raw) % 8:
                    raise ValueError("a binary body holds float64 values (8 bytes each)")
                values, tol = np.frombuffer(raw, dtype="<f8").astype(np.float64), \
                    request.query.get("tol")
            elif request.method == "POST":
                try:
                    body = await request.json()
                except RecursionError:      # [[[[...]]]]: json's decoder recurses
                    raise ValueError("the JSON body is nested too deeply") from None
                if not isinstance(body, dict):
                    raise ValueError('send a JSON object {"x": [...]}')
                values, tol = body.get("x"), body.get("tol")
            else:
                values, tol = request.query.getall("x", []), request.query.get("tol")
            x, t = parse_request(values, tol)
        except ValueError as e:  # also JSON decoding errors
            return web.json_response({"error": str(e)}, status=400)
        y, k = await solver.solve(x, t)
        if binary:
            return web.Response(body=y.astype("<f8").tobytes(), content_type=BINARY,
                                headers={"X-Iterations": str(k)})
        return web.json_response({"sqrt": y.tolist(), "iterations": k})

    async def on_startup(app: web.Application) -> None:
        await solver.start()

    async def on_cleanup(app: web.Application) -> None:
        await solver.close()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_get("/sqrt", sqrt)
    app.router.add_post("/sqrt", sqrt)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def start_server(host: str, port: int, concurrency: int = 2) -> tuple[Any, int]:
    """Start the app; returns (runner, bound port). Port 0 picks a free port."""
    from aiohttp import web

    # handler_cancellation: a client that goes away cancels its handler and so its run
    # (aiohttp's default since 3.9 lets the handler, and the run, go on to their end)
    runner = web.AppRunner(make_app(SqrtSolver(concurrency)), access_log=None,
                           handler_cancellation=True)
    await runner.setup()
    sock = None
    try:
        # IPv4 where the host has it ("localhost" as 127.0.0.1), else IPv6 ("::1", "::")
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, _, _, _, address = next((i for i in infos if i[0] == socket.AF_INET),
                                        infos[0])
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:            # (a port in use, an unknown host): nothing left open
        if sock is not None:
            sock.close()
        await runner.cleanup()
        raise OSError(e.errno, f"cannot serve on {host}:{port}: {e.strerror or e}") from None
    site = web.SockSite(runner, sock)
    await site.start()
    return runner, sock.getsockname()[1]


async def serve(host: str, port: int, concurrency: int = 2) -> None:
    runner, bound = await start_server(host, port, concurrency)
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    shown = f"[{host}]" if ":" in host else host          # an IPv6 address in a URL
    print(f"serving on http://{shown}:{bound} (event loop: {loop}); Ctrl-C stops", flush=True)
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError):     # (no signal handlers on Windows)
        # SIGTERM (kill, systemd, docker stop) stops as Ctrl-C does: requests in flight
        # are answered and the session closed, not cut off by the default action
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


# ------------------------------------------------------------------------- self test
def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


class HealthProbe:
    """Polls GET /health from its own thread and event loop (so a busy load generator
    cannot delay it) and records the latency of each answer given while the server had
    solver requests in flight."""

    def __init__(self, base_url: str, every_s: float = 0.005) -> None:
        import threading

        self.base_url, self.every_s = base_url, every_s
        self.latencies: list[float] = []      # answers given with in_flight > 0
        self.all: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._poll()),
                                        name="health-probe", daemon=True)

    async def _poll(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as client:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                async with client.get(f"{self.base_url}/health") as resp:
                    body = await resp.json()
                dt = time.perf_counter() - t0
                self.all.append(dt)
                if body["in_flight"] > 0:
                    self.latencies.append(dt)
                await asyncio.sleep(self.every_s)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        deadline = time.monotonic() + 10.0
        while not self.all and time.monotonic() < deadline:   # polling has begun
            time.sleep(0.001)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


async def load_test(base_url: str, n_requests: int = 50, n_values: int = 1000,
                    seed: int = 0) -> dict:
    """Fire `n_requests` concurrent POST /sqrt requests while a HealthProbe polls /health;
    check every answer against numpy. Returns latency figures in seconds."""
    import aiohttp

    rng = np.random.default_rng(seed)
    inputs = [rng.uniform(0.0, 10.0 ** rng.uniform(0, 8), n_values) for _ in range(n_requests)]
    bodies = [x.astype("<f8").tobytes() for x in inputs]       # binary float64 bodies
    headers = {"Content-Type": BINARY}
    latencies: list[float] = []
    answers: list[bytes] = [b""] * n_requests
    connector = aiohttp.TCPConnector(limit=0)                # one connection per request
    async with aiohttp.ClientSession(connector=connector) as client:
        async def one(k: int) -> None:
            t0 = time.perf_counter()
            async with client.post(f"{base_url}/sqrt", data=bodies[k], headers=headers) as r:
                r.raise_for_status()
                answers[k] = await r.read()
            latencies.append(time.perf_counter() - t0)

        async with client.get(f"{base_url}/health") as resp:      # warm up
            resp.raise_for_status()
        await one(0)
        latencies.clear()
        with HealthProbe(base_url) as probe:
            t0 = time.perf_counter()
            await asyncio.gather(*(one(k) for k in range(n_requests)))
            wall = time.perf_counter() - t0
    for x, a in zip(inputs, answers):
        np.testing.assert_allclose(np.frombuffer(a, "<f8"), np.sqrt(x), rtol=1e-9, atol=1e-12)
    return {"requests": n_requests, "values_per_request": n_values, "wall_s": wall,
            "requests_per_s": n_requests / wall,
            "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99),
            "health_probes_in_flight": len(probe.latencies),
            "health_p50_s": percentile(probe.latencies, 50) if probe.latencies else None,
            "health_max_s": max(probe.latencies) if probe.latencies else None}


class ServerProcess:
    """`python examples/service.py --port 0` in a child process; `.url` once it serves."""

    def __init__(self, *extra: str, timeout_s: float = 30.0) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, "-u", __file__, "--port", "0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout_s
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("serving on "):
                self.url = line.split()[2]
                return
            if not line and self.proc.poll() is not None:
                break
        self.close()
        raise RuntimeError(f"the server did not start: {line!r}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - it must not outlive us
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run(coro: Any) -> Any:
    """Run a coroutine on uvloop when it is installed, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a clear error for 0, negatives and non-integers)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (>= 1), got {value}")
    return value


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 (a free one) to 65535. (The resolver takes 70000 and
    wraps it to 4464, -1 fails with "Servname not supported for ai_socktype".)"""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 (any free port) to 65535, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8080,
                   help="0 picks a free port (default: %(default)s)")
    p.add_argument("--selftest", action="store_true",
                   help="start on a free port, fire concurrent requests, print latencies")
    p.add_argument("--concurrency", type=positive_int, default=2,
                   help="graph runs admitted at once (the rest wait off the event loop)")
    p.add_argument("--requests", type=positive_int, default=50,
                   help="concurrent requests of the self test")
    p.add_argument("--values", type=positive_int, default=100_000,
                   help="float64 values per self-test request")
    args = p.parse_args(argv)
    if importlib.util.find_spec("aiohttp") is None:
        p.error("the service needs aiohttp: pip install -e '.[services]'")
    if args.values > MAX_VALUES:
        p.error(f"argument --values: at most {MAX_VALUES} (the server's limit per request), "
                f"got {args.values}")
    if not args.selftest:
        try:
            run(serve(args.host, args.port, args.concurrency))
        except KeyboardInterrupt:
            pass
        except OSError as e:        # a port in use: say so, without a traceback
            print(f"{p.prog}: {e.strerror or e}", file=sys.stderr)
            return 1
        return 0
    with ServerProcess("--concurrency", str(args.concurrency)) as server:
        print(f"self test: server process {server.proc.pid} at {server.url}")
        r = run(load_test(server.url, args.requests, args.values))
    ms = (lambda v: "-" if v is None else f"{v * 1e3:.1f} ms")
    print(f"{r['requests']} concurrent requests x {r['values_per_request']} values, all "
          f"answers equal numpy's sqrt\n"
          f"  latency p50 {ms(r['p50_s'])}, p99 {ms(r['p99_s'])}; "
          f"{r['requests_per_s']:.0f} requests/s ({r['wall_s'] * 1e3:.0f} ms in all)\n"
          f"  /health while solvers were in flight: {r['health_probes_in_flight']} answers, "
          f"p50 {ms(r['health_p50_s'])}, slowest {ms(r['health_max_s'])}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:       # Ctrl-C in the self test: its server process stops too
        print("interrupted", file=sys.stderr)
        sys.exit(130)
