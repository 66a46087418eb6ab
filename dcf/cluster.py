"""Clusters of worker processes: start or attach them, ship partitions, run steps.

The session's own process is the client. A `Cluster` owns one I/O thread whose event
loop runs the client's transport, the health watch of its workers and, while a run is
in flight, the client's own device actors; sessions hand their runs to that loop. Only
run start, completion and failure involve the client: partitions on workers exchange
Send/Recv values among themselves (see `dcf.actors.remote` for the protocol).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from dcf.actors.codec import CodecError
from dcf.actors.graphdef import ShippedObjects, encode_parts
from dcf.actors.remote import (
    FEED,
    FETCH,
    LoopThread,
    error_from_msg,
    valid_key,
)
from dcf.actors.transport import ZmqTransport
from dcf.device import DeviceSpec
from dcf.errors import InvalidArgumentError, WorkerError
from dcf.ops.registry import Kind
from dcf.token import DEAD

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Cluster", "ClusterSpec", "load_spec"]

log = logging.getLogger(__name__)

_RESERVED = ("secret_file", "secret", "curve", "client")


# ------------------------------------------------------------------- specs
@dataclass
class ClusterSpec:
    """A parsed cluster spec: job name -> task addresses, and how messages are signed."""

    jobs: dict[str, list[str]]
    # (keys stay out of the repr: a printed spec, or a traceback's locals, shows no secret)
    secret: bytes | None = field(default=None, repr=False)
    # {"public": z85, "secret": z85}
    curve: dict[str, bytes] | None = field(default=None, repr=False)
    client: str | None = None                # the client's bind address, if given

    def curve_tuple(self) -> tuple | None:
        if self.curve is None:
            return None
        return (self.curve["public"], self.curve["secret"])


def load_spec(spec: str | os.PathLike | dict) -> ClusterSpec:
    """Parse a cluster spec (a dict, or the path of a JSON file holding one).

    Format::

        {"worker": ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"],
         "secret_file": "/path/to/secret",            # HMAC key: the file's bytes
         "curve": {"public": "<z85>", "secret": "<z85>"},   # or "secret_file": path
         "client": "tcp://10.0.0.1:*"}                # optional: where the client binds

    At least one of "secret_file" (or "secret", hex) and "curve" is required; without
    both, the file named by $DCF_SECRET_FILE is the secret. Relative paths are relative
    to the spec file.
    """
    base = "."
    if not isinstance(spec, dict):
        path = os.fspath(spec)
        base = os.path.dirname(os.path.abspath(path))
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    if not isinstance(spec, dict):
        raise TypeError("a cluster spec is a JSON object {\"worker\": [addresses], ...}")
    jobs: dict[str, list[str]] = {}
    for k, v in spec.items():
        if k in _RESERVED:
            continue
        if not (isinstance(v, list) and all(isinstance(a, str) for a in v)):
            raise ValueError(f"cluster spec: job {k!r} must be a list of addresses, got {v!r}")
        jobs[k] = [a if "://" in a else f"tcp://{a}" for a in v]
    if not jobs:
        raise ValueError("cluster spec names no job (e.g. {\"worker\": [\"tcp://h:5555\"]})")

    def read(p: str) -> bytes:
        with open(os.path.join(base, p), "rb") as f:
            return f.read().strip()

    secret = None
    if "secret_file" in spec:
        secret = read(spec["secret_file"])
    elif "secret" in spec:
        secret = bytes.fromhex(spec["secret"])
    curve = None
    if "curve" in spec:
        c = spec["curve"]
        pub = c["public"].encode() if isinstance(c["public"], str) else c["public"]
        sec = read(c["secret_file"]) if "secret_file" in c else c["secret"]
        curve = {"public": pub, "secret": sec.encode() if isinstance(sec, str) else sec}
    if secret is None and curve is None and os.environ.get("DCF_SECRET_FILE"):
        with open(os.environ["DCF_SECRET_FILE"], "rb") as sf:
            secret = sf.read().strip()
    if secret is None and curve is None:
        raise ValueError(
            "cluster spec: give a \"secret_file\" or \"curve\" key (or set $DCF_SECRET_FILE "
            "for the client and every worker); workers never accept unauthenticated clients")
    if secret is not None and not secret:
        # an empty key would sign every message in a way anyone can reproduce
        raise ValueError(
            "cluster spec: the secret is empty (an empty \"secret_file\", \"secret\" or "
            "$DCF_SECRET_FILE); write random bytes into it, e.g. python -c \"import secrets; "
            "print(secrets.token_hex(32))\" > secret")
    return ClusterSpec(jobs, secret, curve, spec.get("client"))


# ------------------------------------------------------------------ client
@dataclass(eq=False)
class _Worker:
    name: str
    task: int
    job: str
    address: str
    pid: int | None = None
    proc: subprocess.Popen | None = None
    gpus: int = 0
    alive: bool = True
    exited: bool = False
    reason: str = ""
    clock: float = 0.0       # its time.time() - time.perf_counter()
    hello: asyncio.Future | None = None


@dataclass
class _RemotePlan:
    pid: int
    session: int
    workers: dict[str, dict]   # name -> {"feeds": [k], "fetches": [k]}


@dataclass(eq=False)
class _Step:
    step: int
    workers: set[str]
    rendezvous: Any
    future: asyncio.Future
    pending: set[str] = field(default_factory=set)
    fetches: dict[int, Any] = field(default_factory=dict)
    fired: int = 0
    trace: list = field(default_factory=list)

    def fail(self, e: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(e)

    async def wait(self) -> _Step:
        await self.future
        return self


class _Client:
    """The client's side of the protocol; every method runs on the I/O loop."""

    def __init__(self, name: str, secret: bytes | None, curve: tuple | None, bind: str,
                 heartbeat_timeout_s: float) -> None:
        self.name = name
        self.transport = ZmqTransport(
            name, bind=bind, secret=secret, curve=curve,
            heartbeat_interval_s=min(0.5, heartbeat_timeout_s / 4),
            heartbeat_timeout_s=heartbeat_timeout_s,
            on_tensor=self._on_tensor, on_control=self._on_control,
            on_peer_lost=self._on_peer_lost)
        self.workers: dict[str, _Worker] = {}
        self.steps: dict[int, _Step] = {}
        self._step_base = secrets.randbits(30) << 32
        self._step_ids = itertools.count(1)
        self._plan_ids = itertools.count(1)
        # (session, worker): the objects its py_funcs sent there (dcf/actors/graphdef.py)
        self._shipped: dict[tuple[int, str], ShippedObjects] = {}
        self._stats_waiters: dict[int, asyncio.Future] = {}
        self._req = itertools.count(1)
        self._watch: asyncio.Task | None = None
        self.clock = time.time() - time.perf_counter()

    async def start(self) -> None:
        await self.transport.start()
        self._watch = asyncio.get_running_loop().create_task(self._watch_procs())

    async def close(self, shutdown: bool) -> None:
        for w in self.workers.values():
            if w.alive and w.name in self.transport.peers:
                with contextlib.suppress(Exception):  # best effort on the way out
                    self.transport.send_control(w.name, {"type": "shutdown" if shutdown
                                                         else "detach"})
        for st in list(self.steps.values()):
            st.fail(WorkerError("the cluster was closed during this run"))
        await asyncio.sleep(0.05)   # let the goodbyes leave
        if self._watch is not None:
            self._watch.cancel()
        await self.transport.close()

    # ----------------------------------------------------------- workers
    def set_heartbeat_timeout(self, seconds: float) -> None:
        t = self.transport
        t.heartbeat_timeout_s = seconds
        t.heartbeat_interval_s = min(t.heartbeat_interval_s, seconds / 4)
        self._send_peers()

    def add_worker(self, w: _Worker) -> None:
        self.workers[w.name] = w
        w.hello = asyncio.get_running_loop().create_future()

    async def connect(self, timeout: float, attach: bool) -> None:
        """Wait for every worker's hello (sending "attach" first to workers started
        elsewhere), then tell each worker where the others are."""
        for w in self.workers.values():
            if attach:
                self.transport.add_peer(w.name, w.address)
                self.transport.send_control(w.name, {
                    "type": "attach", "address": _advertised(self.transport.address,
                                                             w.address)})
        deadline = time.monotonic() + timeout
        for w in self.workers.values():
            assert w.hello is not None
            while not w.hello.done():
                if w.proc is not None and w.proc.poll() is not None:
                    raise WorkerError(f"worker {w.name} exited with "
                                      f"{_describe_exit(w.proc.returncode)} while starting")
                if time.monotonic() > deadline:
                    raise WorkerError(f"worker {w.name} ({w.address or 'starting'}) did not "
                                      f"answer within {timeout:.0f} s")
                await asyncio.wait([w.hello], timeout=0.05)
        self._send_peers()

    def _send_peers(self) -> None:
        peers = {w.name: w.address for w in self.workers.values() if w.address}
        for w in self.workers.values():
            if w.alive and w.name in self.transport.peers:
                self.transport.send_control(w.name, {
                    "type": "peers", "peers": peers,
                    "heartbeat_timeout_s": self.transport.heartbeat_timeout_s})

    def lost(self, name: str, reason: str, *, exited: bool = True) -> None:
        """Worker `name` is gone: fail every step that involves it, now.

        A worker that only went silent (not known to have exited) stays connected: if
        it is heard from again (it was stopped a while: SIGSTOP, a suspended host), later
        runs may use it again. (A kernel that holds a worker's loop does not silence it:
        heartbeats go out from a thread of their own.)"""
        w = self.workers.get(name)
        if w is None or not w.alive:
            return
        w.alive = False
        w.reason = reason
        w.exited = exited
        if exited:
            self.transport.remove_peer(name)
        for st in list(self.steps.values()):
            if name in st.workers:
                st.fail(WorkerError(
                    f"worker {name} ({w.address}) {reason} during step {st.step}; "
                    f"the run is aborted on the other workers"))

    def _on_peer_lost(self, name: str, silent: float) -> None:
        if name in self.workers:
            self.lost(name, f"missed heartbeats for {silent:.1f} s", exited=False)

    def lost_for_good(self, w: _Worker) -> None:
        w.exited = True
        w.reason = f"exited with {_describe_exit(w.proc.returncode if w.proc else None)}"
        self.transport.remove_peer(w.name)

    def _heard(self, w: _Worker) -> None:
        if not w.alive and not w.exited and (w.proc is None or w.proc.poll() is None):
            log.warning("worker %s answers again; later runs may use it", w.name)
            w.alive = True
            w.reason = ""

    async def _watch_procs(self) -> None:
        # Popen handles tell a local worker's death at once, before heartbeats would.
        while True:
            await asyncio.sleep(0.05)
            for w in list(self.workers.values()):
                if w.alive and w.proc is not None and w.proc.poll() is not None:
                    self.lost(w.name, f"exited with {_describe_exit(w.proc.returncode)}")
                elif not w.alive and not w.exited:
                    if w.proc is not None and w.proc.poll() is not None:
                        self.lost_for_good(w)
                    elif self.transport.is_lost(w.name) is False:  # heard again (heartbeats)
                        self._heard(w)

    # ---------------------------------------------------------- messages
    def _on_control(self, src: str, msg: dict, blob: bytes | None) -> None:
        kind = msg.get("type")
        w = self.workers.get(src)
        if w is None:
            return
        if not w.alive:
            self._heard(w)
        if kind == "hello":
            # a started worker reports where it bound; a spec's address stays as written
            # (a worker bound to 0.0.0.0 is reached at its host's name)
            w.address = w.address or msg.get("address") or ""
            w.pid = msg.get("pid")
            w.gpus = int(msg.get("gpus") or 0)
            w.clock = float(msg.get("clock") or 0.0)
            if w.name not in self.transport.peers:
                self.transport.add_peer(w.name, w.address)
            if w.hello is not None and not w.hello.done():
                w.hello.set_result(None)
            return
        if kind == "stats":
            req = msg.get("req")
            fut = self._stats_waiters.pop(req, None) if isinstance(req, int) else None
            if fut is not None and not fut.done():
                keys = msgpack.unpackb(blob, use_list=False) if blob else ()
                fut.set_result((msg.get("info"), keys))
            return
        st = self.steps.get(msg.get("step"))  # type: ignore[arg-type]
        if st is None:
            return
        if kind == "done":
            st.pending.discard(src)
            st.fired += int(msg.get("fired") or 0)
            if blob:
                shift = float(msg.get("clock") or 0.0) - self.clock
                for ev in msgpack.unpackb(blob, use_list=True):
                    ev[5] += shift
                    ev[6] += shift
                    st.trace.append(tuple(ev))
            if not st.pending and not st.future.done():
                st.future.set_result(None)
        elif kind == "error":
            unloaded = msg.get("unloaded")
            if isinstance(unloaded, (list, tuple)) and len(unloaded) == 2:
                shipped = self._shipped.get((unloaded[0], src))
                if shipped is not None and isinstance(unloaded[1], int):
                    shipped.forget(unloaded[1])
            st.fail(error_from_msg(msg, src))

    def _on_tensor(self, src: str, key: Any, value: Any, is_dead: bool) -> None:
        if not valid_key(key) or src not in self.workers:
            return
        st = self.steps.get(key[0])
        if st is None:
            return
        if key[1] == FETCH:
            tag = key[2]
            if len(tag) == 1 and type(tag[0]) is int:
                st.fetches[tag[0]] = DEAD if is_dead else value
        else:
            st.rendezvous.send(key, DEAD if is_dead else value)

    def send_tensor(self, peer: str, key: tuple, value: Any) -> None:
        try:
            value = _host(value)
            if value is DEAD:
                self.transport.send_tensor(peer, key, None, is_dead=True)
            else:
                self.transport.send_tensor(peer, key, value)
        except KeyError:
            w = self.workers.get(peer)
            raise WorkerError(f"worker {peer} is unavailable: "
                              f"{w.reason if w is not None else 'unknown worker'}") from None
        except (CodecError, ValueError) as e:
            raise InvalidArgumentError(f"cannot send {key[1]!r} to {peer}: {e}") from e

    def send_batch(self, peer: str, items: list) -> None:
        """Several (key, value | DEAD) for one worker: the small ones in one message."""
        try:
            self.transport.send_tensors(peer, [(key, None, True) if v is DEAD else
                                               (key, _host(v), False) for key, v in items])
        except KeyError:
            w = self.workers.get(peer)
            raise WorkerError(f"worker {peer} is unavailable: "
                              f"{w.reason if w is not None else 'unknown worker'}") from None
        except (CodecError, ValueError) as e:
            raise InvalidArgumentError(f"cannot send {len(items)} values to {peer}: {e}") \
                from e

    # ------------------------------------------------------------- steps
    def new_step(self) -> int:
        return self._step_base + next(self._step_ids)

    def check_alive(self, names: Any) -> None:
        for n in names:
            w = self.workers[n]
            if not w.alive:
                raise WorkerError(f"worker {n} ({w.address}) is unavailable: it {w.reason}")

    def ship(self, session: int, by_worker: dict[str, list[dict]], settings: dict
             ) -> _RemotePlan:
        pid = next(self._plan_ids)
        self.check_alive(by_worker)
        info = {}
        for name, parts in by_worker.items():
            shipped = self._shipped.setdefault((session, name), ShippedObjects())
            first = shipped.streams
            blob = encode_parts(parts, shipped)
            try:
                self.transport.send_control(name, {"type": "plan", "plan": pid,
                                                   "session": session, **settings}, blob)
            except ValueError as e:     # (larger than one message carries)
                for stream in range(first, shipped.streams):   # (never sent)
                    shipped.forget(stream)
                raise _too_large(name, parts, len(blob), e) from e
            info[name] = {"feeds": sorted({k for p in parts for _, k in p["feeds"]}),
                          "fetches": [k for p in parts for _, _, k in p["fetches"]]}
        return _RemotePlan(pid, session, info)

    def start_step(self, step: int, rp: _RemotePlan, feed_values: list, rendezvous: Any,
                   trace: bool, feed_tensors: list) -> _Step:
        self.check_alive(rp.workers)
        fut = asyncio.get_running_loop().create_future()
        st = _Step(step, set(rp.workers), rendezvous, fut, pending=set(rp.workers))
        self.steps[step] = st
        try:
            for name, info in rp.workers.items():
                for k in info["feeds"]:
                    try:
                        self.send_tensor(name, (step, FEED, (k,)), feed_values[k])
                    except InvalidArgumentError as e:   # (too large, say: name the feed)
                        t = feed_tensors[k]
                        raise InvalidArgumentError(
                            f"the value fed to {t.name} ({t.op.type} '{t.op.name}') cannot "
                            f"be sent to {name}: {e.__cause__ or e}") from e
                self.transport.send_control(name, {"type": "run", "step": step,
                                                   "plan": rp.pid, "session": rp.session,
                                                   "trace": trace})
        except BaseException:
            self.abort_step(step)
            self.steps.pop(step, None)
            raise
        return st

    def abort_step(self, step: int) -> None:
        st = self.steps.get(step)
        if st is None:
            return
        for name in st.pending:
            if name in self.transport.peers:   # a silent worker may still come back
                with contextlib.suppress(Exception):  # it is going away anyway
                    self.transport.send_control(name, {"type": "abort", "step": step})

    def end_step(self, step: int) -> None:
        st = self.steps.pop(step, None)
        if st is not None and not st.future.done():
            st.future.cancel()

    def release(self, session: int) -> None:
        for key in [k for k in self._shipped if k[0] == session]:
            del self._shipped[key]
        for w in self.workers.values():
            if w.alive and w.name in self.transport.peers:
                self.transport.send_control(w.name, {"type": "release", "session": session})

    async def stats(self, name: str, record_keys: bool | None = None,
                    timeout: float = 10.0) -> tuple[dict, tuple]:
        req = next(self._req)
        fut = asyncio.get_running_loop().create_future()
        self._stats_waiters[req] = fut
        msg: dict[str, Any] = {"type": "stats", "req": req}
        if record_keys is not None:
            msg["record_keys"] = record_keys
        self.transport.send_control(name, msg)
        return await asyncio.wait_for(fut, timeout)


def _too_large(name: str, parts: list[dict], size: int, e: Exception
               ) -> InvalidArgumentError:
    """The error of a worker's share of a graph too large to send (`size` bytes): what
    makes it so (the large values built into it, and the py_funcs, whose captures travel
    with it)."""
    sizes, py_funcs = [], []
    for prt in parts:
        for p in prt["nodes"]:
            if p.type in ("PyFunc", "PyFuncStateless"):
                py_funcs.append(f"{p.type} '{p.name}'")
            n = sum(int(getattr(v, "nbytes", 0)) for v in p.attrs.values())
            if n * 100 >= size:
                sizes.append((n, f"{p.type} '{p.name}' ({n} bytes)"))
    sizes.sort(key=lambda x: -x[0])
    what = [f"its largest values: {', '.join(d for _, d in sizes[:3])}"] if sizes else []
    if py_funcs:
        what.append(f"what py_funcs {', '.join(py_funcs[:3])} capture travels in it too")
    return InvalidArgumentError(
        f"the part of this run's graph placed on {name} cannot be sent to it: {e}"
        f"{' (' + '; '.join(what) + ')' if what else ''}; feed large values (a "
        "placeholder) rather than building them into the graph or capturing them")


def _host(v: Any) -> Any:
    """A device array's host copy (a GPU partition's Send to another process)."""
    if hasattr(v, "__cuda_array_interface__"):
        v = v.get()
        return v if v.ndim else v[()]
    return v


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _ray_error_text(e: BaseException, limit: int = 200) -> str:
    """"Type: first line; why" of a Ray error, which runs to many lines, colour codes in
    them: Ray puts what happened on the first line and why on the last (the exception
    an actor's constructor raised; "killed by `ray.kill`"; "its worker process has
    died"), of which the first sentence is kept."""
    lines = [ln.strip() for ln in _ANSI.sub("", str(e)).splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    text = f"{type(e).__name__}: {lines[0]}"
    if len(lines) > 1:
        why = lines[-1].split(". ", 1)[0]
        sep = " " if lines[0].endswith(".") else ": "
        text += f"{sep}{why[:limit]}{'...' if len(why) > limit else ''}"
    return text


def _ray_options(resources: dict | None) -> dict:
    """`Cluster.ray`'s resources_per_worker as Ray actor options."""
    res = dict(resources or {})
    for k, v in res.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < float("inf"):
            raise ValueError(f"resources_per_worker[{k!r}] must be a finite number >= 0, "
                             f"got {v!r}")
    opts: dict[str, Any] = {}
    for key, names in (("num_cpus", ("CPU", "num_cpus")), ("num_gpus", ("GPU", "num_gpus")),
                       ("memory", ("memory",))):
        given = [n for n in names if n in res]
        if len(given) > 1:
            raise ValueError(f"resources_per_worker names {given[0]!r} and {given[1]!r}")
        if given:
            opts[key] = res.pop(given[0])
    opts.setdefault("num_cpus", 1)
    if res:
        opts["resources"] = res
    return opts


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


# ----------------------------------------------------------------- Cluster
class Cluster:
    """Worker processes that sessions place ops on ("/job:worker/task:K/cpu:0").

    `Cluster(spec)` attaches to workers started elsewhere with
    ``python -m dcf.worker --cluster FILE --task N``; `Cluster.local(n)` starts `n`
    workers on this host; `Cluster.ray(n)` starts them as Ray actors. A cluster is a
    context manager; `close()` detaches (or, for workers it started, stops them).

        with dcf.Cluster.local(2) as cluster, dcf.Session(cluster=cluster) as sess:
            with dcf.device("/job:worker/task:1"):
                y = x * 2.0
            sess.run(y, {x: 3.0})

    Attributes:
        spec: ``{"worker": [address, ...]}``, the workers' data-plane addresses.
        worker_pids: the workers' process ids (as they reported them).
    """

    def __init__(self, spec: str | os.PathLike | dict, *, heartbeat_timeout_s: float = 5.0,
                 connect_timeout_s: float = 30.0) -> None:
        cs = load_spec(spec)
        bind = cs.client or _client_bind(cs.jobs)
        self._setup(cs.secret, cs.curve_tuple(), bind, heartbeat_timeout_s)
        try:
            for job, addresses in cs.jobs.items():
                for k, a in enumerate(addresses):
                    self._add_worker(job, k, a)
            self._connect(connect_timeout_s, attach=True)
        except BaseException:
            # (else its I/O and heartbeat threads and sockets outlive it, and a worker
            # that starts later still gets its queued attach)
            self.close()
            raise

    # ---------------------------------------------------------- builders
    @classmethod
    def local(cls, num_workers: int, gpus_per_worker: int = 0, *,
              cpus_per_worker: int | None = None, heartbeat_timeout_s: float = 5.0,
              start_timeout_s: float = 60.0, ipc: bool | None = None) -> Cluster:
        """Start `num_workers` worker processes on this host (each in its own process
        group, signed with a fresh secret passed on their stdin).

        They stop when the cluster closes, at interpreter exit, or when this process
        dies (their stdin pipe closes). Worker K sees GPUs
        K*gpus_per_worker ... (K+1)*gpus_per_worker-1 as its "/gpu:0"...

        ipc: bind the client and the workers to Unix-domain sockets in a fresh private
            directory (mode 0700, removed on close) instead of TCP on 127.0.0.1: a
            message costs less kernel work (no TCP stack) and nobody but this user can
            even connect. The default (None) uses ipc where the platform has it.
        cpus_per_worker: pin each worker to its own set of this many CPUs, round-robin
            over the CPUs this process may use (None or 0: no pinning). A worker's Python
            thread and its ZeroMQ I/O thread then hand messages over on the same CPUs,
            which cuts a message's latency where cross-CPU wake-ups are expensive (VMs)
            on an otherwise idle host; on a busy one, pinned workers cannot move to
            whichever CPU frees up first, so the default leaves placement to the OS.
        """
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self = cls.__new__(cls)
        secret = secrets.token_bytes(32)
        if ipc is None:
            ipc = _ipc_available()
        ipc_dir = tempfile.mkdtemp(prefix="dcf-cluster-") if ipc else None
        if ipc_dir is not None and len(ipc_dir) > 90:  # sun_path holds ~107 bytes
            os.rmdir(ipc_dir)
            ipc_dir = None
        try:
            self._setup(secret, None, f"ipc://{ipc_dir}/client" if ipc_dir else
                        "tcp://127.0.0.1:*", heartbeat_timeout_s)
        except BaseException:
            if ipc_dir:
                shutil.rmtree(ipc_dir, ignore_errors=True)
            raise
        self._ipc_dir = ipc_dir
        address = self._io.call(_get_address(self._client))
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        pins = _cpu_sets(num_workers, cpus_per_worker)
        try:
            for k in range(num_workers):
                env = dict(os.environ)
                env["DCF_TASK_INDEX"] = str(k)
                env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (root, os.getcwd(), env.get("PYTHONPATH", "")) if p)
                if pins:
                    env["DCF_WORKER_CPUS"] = ",".join(map(str, pins[k]))
                if gpus_per_worker:
                    env["CUDA_VISIBLE_DEVICES"] = ",".join(
                        str(k * gpus_per_worker + j) for j in range(gpus_per_worker))
                bind = ["--bind", f"ipc://{ipc_dir}/w{k}"] if ipc_dir else []
                proc = subprocess.Popen(
                    [sys.executable, "-c", _WORKER_MAIN, "--task", str(k), "--client",
                     address, "--client-name", self._client.name,
                     "--heartbeat-timeout", str(heartbeat_timeout_s), *bind],
                    stdin=subprocess.PIPE, env=env, start_new_session=True)
                assert proc.stdin is not None
                proc.stdin.write(secret.hex().encode() + b"\n")
                proc.stdin.flush()
                self._add_worker("worker", k, "", proc=proc)
            self._connect(start_timeout_s, attach=False)
        except BaseException:
            self.close()
            raise
        return self

    @classmethod
    def ray(cls, num_workers: int, resources_per_worker: dict | None = None, *,
            heartbeat_timeout_s: float = 5.0, start_timeout_s: float = 120.0) -> Cluster:
        """Start `num_workers` workers as actors of the current Ray cluster (``ray.init``
        is called if needed): Ray places them on its nodes, schedules and supervises them;
        tensors still travel over ZeroMQ between the workers, never through Ray.

        resources_per_worker: what each actor asks Ray for, ``{"CPU": 1}`` by default;
            "CPU"/"num_cpus", "GPU"/"num_gpus" and "memory" (bytes) are Ray's own, any
            other key a custom resource. Ray sets a GPU worker's CUDA_VISIBLE_DEVICES.

        The control channel is signed with a fresh secret, as for `Cluster.local`; it
        reaches the actors as a constructor argument over Ray's own (authenticated)
        channel. Where every Ray node is this host, the workers and the client bind to
        127.0.0.1, else to their nodes' IPs. An actor that Ray loses (``ray.kill``, a
        crash, a dead node) makes runs raise `WorkerError` naming its task; closing the
        cluster kills the actors. A worker that does not start within `start_timeout_s`
        (e.g. resources the Ray cluster cannot grant) raises `WorkerError`.
        """
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        try:
            import ray
        except ImportError as e:
            raise ImportError("Cluster.ray needs ray: pip install 'dcf[ray]'") from e
        from dcf.worker import ray_worker_class

        options = _ray_options(resources_per_worker)
        if not ray.is_initialized():
            ray.init()
        here = ray.util.get_node_ip_address()
        loopback = all(n.get("NodeManagerAddress") == here
                       for n in ray.nodes() if n.get("Alive"))
        ip = "127.0.0.1" if loopback else (f"[{here}]" if ":" in here else here)
        self = cls.__new__(cls)
        secret = secrets.token_bytes(32)
        self._setup(secret, None, f"tcp://{ip}:*", heartbeat_timeout_s)
        actor_cls = ray_worker_class(ray)
        try:
            for k in range(num_workers):
                self._ray_actors.append(actor_cls.options(**options).remote(
                    k, secret, heartbeat_timeout_s, loopback))
            deadline = time.monotonic() + start_timeout_s
            refs = [a.address.remote() for a in self._ray_actors]
            for k, ref in enumerate(refs):
                try:
                    address = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
                except ray.exceptions.GetTimeoutError:
                    raise WorkerError(
                        f"Ray did not start worker /job:worker/task:{k} within "
                        f"{start_timeout_s:g} s (asked for {options}; does the Ray cluster "
                        f"have them free?)") from None
                except ray.exceptions.RayError as e:
                    raise WorkerError(f"worker /job:worker/task:{k} failed to start as a "
                                      f"Ray actor: {_ray_error_text(e)}") from e
                self._add_worker("worker", k, address)
            self._connect(max(1.0, deadline - time.monotonic()), attach=True)
            for k, a in enumerate(self._ray_actors):
                fut = a.serve.remote().future()
                fut.add_done_callback(
                    lambda f, name=f"/job:worker/task:{k}": self._ray_ended(name, f))
                self._ray_served.append(fut)
        except BaseException:
            self.close()
            raise
        return self

    def _ray_ended(self, name: str, fut: Any) -> None:
        """A Ray worker's serve() ended (on a Ray thread): unless we are closing, Ray lost
        the actor; fail its steps now."""
        if self._closed:
            return
        try:
            fut.result()
            reason = "stopped"
        except BaseException as e:  # noqa: BLE001 - turned into the worker's reason
            reason = f"was lost to Ray ({_ray_error_text(e)})"

        def lost() -> None:
            w = self._client.workers.get(name)
            if w is None:
                return
            if w.alive:
                self._client.lost(name, reason)
            elif not w.exited:   # already silent: now known gone for good
                w.exited = True
                w.reason = reason
                self._client.transport.remove_peer(name)

        with contextlib.suppress(RuntimeError):   # the loop is closed: so are we
            self._io.loop.call_soon_threadsafe(lost)

    # ---------------------------------------------------------- plumbing
    def _setup(self, secret: bytes | None, curve: tuple | None, bind: str,
               heartbeat_timeout_s: float) -> None:
        self._closed = False
        self._ipc_dir: str | None = getattr(self, "_ipc_dir", None)
        self._owns_workers = False
        self._ray_actors: list = []
        self._ray_served: list = []   # serve() futures of Ray workers
        self._io = LoopThread("dcf-cluster-io")
        self._client = _Client(f"client-{secrets.token_hex(4)}", secret, curve, bind,
                               heartbeat_timeout_s)
        self._sessions = itertools.count(1)
        # the heartbeat timeouts that open sessions set (SessionConfig): the latest holds,
        # and the cluster's own once none is left
        self._heartbeat_s = heartbeat_timeout_s
        self._session_heartbeats: dict[int, float] = {}
        try:
            self._io.call(self._client.start())
        except BaseException:
            self._io.stop()     # (the transport closed itself)
            raise
        ref = weakref.ref(self)
        self._atexit = lambda: (ref() is not None and ref().close())  # type: ignore[union-attr]
        atexit.register(self._atexit)

    def _add_worker(self, job: str, task: int, address: str,
                    proc: subprocess.Popen | None = None) -> None:
        w = _Worker(f"/job:{job}/task:{task}", task, job, address, proc=proc)
        if proc is not None:
            self._owns_workers = True

        async def add() -> None:
            self._client.add_worker(w)

        self._io.call(add())

    def _connect(self, timeout: float, attach: bool) -> None:
        self._io.call(self._client.connect(timeout, attach))

    @property
    def spec(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for w in self._client.workers.values():
            out.setdefault(w.job, []).append(w.address)
        return out

    @property
    def worker_pids(self) -> list[int | None]:
        return [w.pid for w in self._client.workers.values()]

    @property
    def devices(self) -> list[str]:
        """Every device of every worker, e.g. "/job:worker/task:1/cpu:0"."""
        out = []
        for w in self._client.workers.values():
            out.append(f"{w.name}/cpu:0")
            out.extend(f"{w.name}/gpu:{j}" for j in range(w.gpus))
        return out

    def __repr__(self) -> str:
        return f"<dcf.Cluster {self.spec}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Detach from the workers; stop the ones this cluster started. Idempotent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        atexit.unregister(self._atexit)
        try:
            if self._ray_actors:
                self._close_ray()
            try:
                self._io.call(self._client.close(shutdown=self._owns_workers or
                                                 bool(self._ray_actors)), timeout=10)
            except Exception as e:  # noqa: BLE001 - carry on tearing down
                log.debug("cluster close: %s", e)
            self._io.stop()
            procs = [w.proc for w in self._client.workers.values() if w.proc is not None]
            for p in procs:
                if p.stdin is not None:
                    try:
                        p.stdin.close()   # EOF: the worker stops on its own
                    except OSError:
                        pass
            _reap(procs)
        finally:
            # also when a second Ctrl-C interrupts the above (the workers still stop: their
            # stdin closes with this process), so that no socket folder stays in /tmp
            if self._ipc_dir:
                shutil.rmtree(self._ipc_dir, ignore_errors=True)

    def _close_ray(self, grace_s: float = 10.0) -> None:
        """Kill the Ray actors and wait (bounded) until Ray reports each one gone (its
        serve() call fails then); steps in flight fail as the client closes."""
        import concurrent.futures

        try:
            import ray

            if not ray.is_initialized():   # ray.shutdown() took the actors with it
                return
            for a in self._ray_actors:
                ray.kill(a, no_restart=True)
        except Exception as e:  # noqa: BLE001 - carry on tearing down
            log.debug("cluster close: %s", e)
            return
        concurrent.futures.wait(self._ray_served, timeout=grace_s)

    # -------------------------------------------------- session interface
    def _process_of(self, device: str) -> str:
        """"" for the client's own devices, else the worker's name."""
        spec = DeviceSpec.parse(device)
        if spec.job is None or spec.job == "localhost":
            return ""
        return f"/job:{spec.job}/task:{spec.task if spec.task is not None else 0}"

    def _has_device(self, spec: DeviceSpec) -> bool:
        w = self._client.workers.get(f"/job:{spec.job}/task:{spec.task or 0}")
        if w is None:
            return False
        if spec.device_type == "cpu":
            return spec.index in (None, 0)
        if spec.device_type == "gpu":
            return spec.index is not None and spec.index < w.gpus
        return False

    def _new_session(self, heartbeat_timeout_s: float | None) -> int:
        if self._closed:
            raise RuntimeError("this cluster is closed")
        sid = next(self._sessions)
        if heartbeat_timeout_s is not None:
            self._session_heartbeats[sid] = heartbeat_timeout_s
            self._set_heartbeat()
        return sid

    def _set_heartbeat(self) -> None:
        """The heartbeat timeout of the latest open session that set one, else the
        cluster's own (a closed session's setting does not outlive it)."""
        def apply() -> None:        # (on the I/O loop: settings made in any thread, in order)
            hbs = list(self._session_heartbeats.values())
            want = hbs[-1] if hbs else self._heartbeat_s
            if want != self._client.transport.heartbeat_timeout_s:
                self._client.set_heartbeat_timeout(want)

        self._io.loop.call_soon_threadsafe(apply)

    def _ship(self, session: int, parts: dict, fetch_pos: list[int], config: Any
              ) -> tuple[dict, _RemotePlan | None]:
        """Route cross-process Sends, send each worker its partitions; return the
        client's own partitions and the handle of the remote ones (on the I/O loop)."""
        if self._closed:
            raise RuntimeError("this cluster is closed")
        proc_of = {dev: self._process_of(dev) for dev in parts}
        client = self._client

        def peer(process: str) -> str:
            return process or client.name

        for dev, prt in parts.items():
            for p in prt.nodes:
                if p.kind == Kind.SEND:
                    dst = self._process_of(p.attrs["dst"])
                    if dst != proc_of[dev]:
                        p.attrs["peer"] = peer(dst)
        local = {dev: prt for dev, prt in parts.items() if proc_of[dev] == ""}
        by_worker: dict[str, list[dict]] = {}
        for dev, prt in parts.items():
            if proc_of[dev] == "":
                continue
            by_worker.setdefault(proc_of[dev], []).append({
                "device": dev, "nodes": prt.nodes, "feeds": prt.feeds,
                "fetches": [(p, idx, fetch_pos[k]) for p, idx, k in prt.fetches],
                "frame_parents": prt.frame_parents})
        if not by_worker:
            return local, None
        settings = {"compile": bool(config.compile_frames),
                    "gpu_memory_limit": config.gpu_memory_limit,
                    "swap_threshold": float(config.swap_threshold),
                    "intra_op_threads": None if config.intra_op_threads is None
                    else int(config.intra_op_threads)}
        return local, client.ship(session, by_worker, settings)

    def _release(self, session: int) -> None:
        if self._closed:
            return
        try:
            self._io.loop.call_soon_threadsafe(self._client.release, session)
            if self._session_heartbeats.pop(session, None) is not None:
                self._set_heartbeat()
        except RuntimeError:
            pass

    def _stats(self, task: int, record_keys: bool | None = None, job: str = "worker"
               ) -> tuple[dict, tuple]:
        """(worker statistics, data-message keys it recorded): for tests and debugging."""
        return self._io.call(self._client.stats(f"/job:{job}/task:{task}", record_keys))


async def _get_address(client: _Client) -> str:
    return client.transport.address


def _ipc_available() -> bool:
    import socket

    import zmq

    return hasattr(socket, "AF_UNIX") and bool(zmq.has("ipc")) and sys.platform != "win32"


def _cpu_sets(num_workers: int, per_worker: int | None) -> list[list[int]]:
    """CPU ids for each worker, round-robin over this process's CPUs ([] = no pinning)."""
    if not per_worker or not hasattr(os, "sched_getaffinity"):
        return []
    cpus = sorted(os.sched_getaffinity(0))
    n = per_worker
    return [[cpus[(k * n + j) % len(cpus)] for j in range(min(n, len(cpus)))]
            for k in range(num_workers)]


def _advertised(address: str, peer: str) -> str:
    """`address` as `peer` can reach it: a wildcard bind becomes the local IP that routes
    to the peer's host."""
    import socket
    from urllib.parse import urlsplit

    if "://0.0.0.0:" not in address and "://*:" not in address:
        return address
    port = address.rsplit(":", 1)[1]
    try:
        u = urlsplit(peer)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((u.hostname or "127.0.0.1", u.port or 9))
            ip = s.getsockname()[0]
    except OSError:
        ip = socket.gethostbyname(socket.gethostname())
    return f"tcp://{ip}:{port}"


def _client_bind(jobs: dict[str, list[str]]) -> str:
    """Where the client binds when the spec says nothing: 127.0.0.1 when every worker is
    on this host (loopback or ipc), else all interfaces, so remote workers reach it."""
    local = all(_is_local(a) for addrs in jobs.values() for a in addrs)
    return "tcp://127.0.0.1:*" if local else "tcp://0.0.0.0:*"


def _is_local(address: str) -> bool:
    """Whether a worker at `address` can only be on this host: an ipc (Unix socket)
    address, or a tcp one whose host is "localhost" or a loopback IP (the whole host
    name compared, not a substring of it)."""
    import ipaddress
    from urllib.parse import urlsplit

    if address.startswith(("ipc://", "inproc://")):
        return True
    try:
        host = urlsplit(address).hostname
    except ValueError:
        return False
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:   # a host name
        return False


# `python -m dcf.worker` would put the working directory first on sys.path, so that a
# checkout's dcf/ there would shadow the installed dcf this client runs; without -c's ""
# entry, PYTHONPATH's come first: this dcf's root, then the working directory (for the
# modules of py_funcs).
_WORKER_MAIN = ("import sys; sys.path = [p for p in sys.path if p]; "
                "from dcf.worker import main; sys.exit(main())")


def _reap(procs: list[subprocess.Popen], grace_s: float = 3.0) -> None:
    """Wait for `procs` to exit; SIGTERM then SIGKILL their process groups if they don't."""
    deadline = time.monotonic() + grace_s
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            for p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        if all(p.poll() is not None for p in procs):
            return
