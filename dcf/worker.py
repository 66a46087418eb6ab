"""A worker process: hosts the device actors of one task of a cluster.

    python -m dcf.worker --cluster FILE --task N      (or the dcf-worker console script;
                                                      the task may come from $DCF_TASK_INDEX)

`Cluster.local` starts workers itself (``--client ADDR``, the secret on stdin; the worker
exits when that pipe closes, i.e. when the client goes away). A worker runs the
partitions a client ships to it (see `dcf.actors.remote` for the protocol): it rebuilds
each partition's nodes, plans and compiles them once, then runs a step per "run"
message. Resources (variables, TensorArrays, queues) live per client session and device.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import msgpack
import numpy as np
import zmq

from dcf.actors.codec import CodecError
from dcf.actors.device_actor import DeviceActor
from dcf.actors.graphdef import GraphDefError, ShippedObjects, decode_parts
from dcf.actors.remote import (
    FEED,
    FETCH,
    error_to_msg,
    new_event_loop,
    valid_key,
)
from dcf.actors.rendezvous import LocalRendezvous
from dcf.actors.transport import ZmqTransport
from dcf.device import DeviceSpec
from dcf.errors import InvalidArgumentError, WorkerError
from dcf.plan import build_plan
from dcf.token import DEAD

__all__ = ["WorkerHost", "main"]

log = logging.getLogger(__name__)
_MAX_KEYS_RECORDED = 200_000


@dataclass
class _Plan:
    session: int
    parts: list              # [(device, ExecPlan, feed keys, fetch keys)]
    compiled: bool
    error: BaseException | None = None    # why it could not be built (raised by its runs)
    unloaded: int | None = None   # the stream of py_func objects it could not load


@dataclass
class _Client:
    name: str
    address: str
    sessions: dict[int, dict[str, DeviceActor]] = field(default_factory=dict)
    plans: dict[int, _Plan] = field(default_factory=dict)
    steps: set[int] = field(default_factory=set)
    # per session: what its py_funcs brought (their state lives on across its plans)
    shipped: dict[int, ShippedObjects] = field(default_factory=dict)
    heartbeat_timeout_s: float | None = None   # what it asked for (its "peers" message)


class WorkerHost:
    """One task's endpoint: a transport, the clients attached to it, and their steps.

    Args:
        task: this worker's index in its job; its transport name is
            ``/job:{job}/task:{task}``, which is also the prefix of its devices.
        bind: ZeroMQ endpoint of its data plane (tcp://127.0.0.1:* picks a port).
        secret / curve: how messages are authenticated (see `ZmqTransport`).
        client: ``(name, address)`` of the one client of a `Cluster.local` worker; without
            it, any authenticated client may attach.
    """

    def __init__(self, *, task: int, job: str = "worker", bind: str = "tcp://127.0.0.1:*",
                 secret: bytes | None = None, curve: tuple | None = None,
                 heartbeat_timeout_s: float = 5.0,
                 client: tuple[str, str] | None = None) -> None:
        self.job = job
        self.task = task
        self.name = f"/job:{job}/task:{task}"
        self.transport = ZmqTransport(
            self.name, bind=bind, secret=secret, curve=curve,
            heartbeat_interval_s=min(0.5, heartbeat_timeout_s / 4),
            heartbeat_timeout_s=heartbeat_timeout_s,
            on_tensor=self._on_tensor, on_control=self._on_control,
            on_peer_lost=self._on_peer_lost)
        self.transport.on_tensors = self._on_tensors
        self.rendezvous = LocalRendezvous()
        # Messages that arrive together are all delivered before the partitions they
        # feed run (once each), e.g. a barrier's answers from several tasks.
        self.transport.on_burst = (self.rendezvous.hold, self.rendezvous.release)
        self.rendezvous.remote_send = self._remote_send
        self.rendezvous.remote_send_batch = self._remote_send_batch
        self.clients: dict[str, _Client] = {}
        self._fixed_client = client
        self.steps: dict[int, asyncio.Task] = {}
        self.feeds: dict[int, dict[int, Any]] = {}
        self.recorded_keys: list | None = None
        self.stopped: asyncio.Event | None = None
        self._gpus: int | None = None

    @property
    def address(self) -> str:
        return self.transport.address

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.stopped = asyncio.Event()
        await self.transport.start()
        if self._fixed_client is not None:
            name, address = self._fixed_client
            self._attach(name, address)

    async def serve(self) -> None:
        """Start, then run until `stop()` (or a "shutdown" message)."""
        await self.start()
        assert self.stopped is not None
        try:
            await self.stopped.wait()
        finally:
            await self.close()

    def stop(self) -> None:
        if self.stopped is not None:
            self.stopped.set()

    async def close(self) -> None:
        for t in list(self.steps.values()):
            t.cancel()
        if self.steps:
            await asyncio.gather(*self.steps.values(), return_exceptions=True)
        await self.transport.close()

    def gpus(self) -> int:
        if self._gpus is None:
            from dcf import gpu_devices

            self._gpus = gpu_devices.count()
        return self._gpus

    # ------------------------------------------------------------- clients
    def _attach(self, name: str, address: str) -> _Client:
        c = self.clients.get(name)
        if c is None:
            self.transport.add_peer(name, address)
            c = self.clients[name] = _Client(name, address)
        self.transport.send_control(name, {
            "type": "hello", "task": self.task, "job": self.job, "address": self.address,
            "pid": os.getpid(), "gpus": self.gpus(), "clock": time.time() - time.perf_counter()})
        return c

    def _drop_client(self, c: _Client, linger_s: float = 0.0) -> None:
        for step in list(c.steps):
            self._abort(step)
        self.clients.pop(c.name, None)
        self._set_heartbeat()
        if self._fixed_client is None:
            if linger_s > 0:
                # (after what was just sent to it has left)
                def remove(name: str = c.name) -> None:
                    if name not in self.clients:
                        self.transport.remove_peer(name)

                asyncio.get_running_loop().call_later(linger_s, remove)
            else:
                self.transport.remove_peer(c.name)

    def _on_peer_lost(self, name: str, silent: float) -> None:
        c = self.clients.get(name)
        if c is not None:
            log.warning("worker %s: client %s silent for %.1f s; aborting its steps",
                        self.name, name, silent)
            # Tell the client (it may only have been stopped a while): a run of it that
            # waits for one of these steps fails when it hears this, never hangs.
            for step in list(c.steps):
                with contextlib.suppress(Exception):
                    self.transport.send_control(name, error_to_msg(step, WorkerError(
                        f"worker {self.name} aborted step {step}: its client {name} was "
                        f"silent for {silent:.1f} s (past the heartbeat timeout of "
                        f"{self.transport.heartbeat_timeout_s:g} s)")))
            if self._fixed_client is None:
                # Its steps and sessions go; it stays a peer a moment longer so that the
                # errors above reach it (then, silent to it, this worker counts as lost).
                self._drop_client(c, linger_s=max(1.0, 2 * self.transport.heartbeat_interval_s))
            else:
                for step in list(c.steps):
                    self._abort(step)

    # ------------------------------------------------------------ messages
    def _on_tensor(self, src: str, key: Any, value: Any, is_dead: bool) -> None:
        if not valid_key(key):
            self.transport.rejections["key"] += 1
            return
        if self.recorded_keys is not None and len(self.recorded_keys) < _MAX_KEYS_RECORDED:
            self.recorded_keys.append(key)
        step, edge, tag = key
        if edge == FEED:
            if src in self.clients and len(tag) == 1 and type(tag[0]) is int:
                self.feeds.setdefault(step, {})[tag[0]] = DEAD if is_dead else value
            return
        self.rendezvous.send(key, DEAD if is_dead else value)

    def _on_tensors(self, src: str, items: list) -> None:
        """The values of one message: delivered together, then acted on."""
        if len(items) == 1:
            key, value, is_dead = items[0]
            # the common case without a call: one value for a Recv (valid_key inline)
            if type(key) is tuple and len(key) == 3 and type(key[0]) is int and \
                    type(key[1]) is str and key[1] != FEED and type(key[2]) is tuple and \
                    self.recorded_keys is None:
                self.rendezvous.send(key, DEAD if is_dead else value)
            else:
                self._on_tensor(src, key, value, is_dead)
            return
        ok = []
        for key, value, is_dead in items:
            if not valid_key(key) or key[1] == FEED:
                self._on_tensor(src, key, value, is_dead)   # checks, records, feeds
                continue
            if self.recorded_keys is not None and \
                    len(self.recorded_keys) < _MAX_KEYS_RECORDED:
                self.recorded_keys.append(key)
            ok.append((key, DEAD if is_dead else value))
        if ok:
            self.rendezvous.deliver_all(ok)

    def _remote_send(self, peer: str, key: tuple, value: Any) -> None:
        try:
            if type(value) not in _HOST_TYPES:
                value = _host(value)
            if value is DEAD:
                self.transport.send_tensor(peer, key, None, is_dead=True)
            else:
                self.transport.send_tensor(peer, key, value)
        except (CodecError, KeyError, ValueError) as e:
            raise InvalidArgumentError(
                f"cannot send {key[1]!r} to {peer}: {e}") from e

    def _remote_send_batch(self, peer: str, items: list) -> None:
        try:
            self.transport.send_tensors(peer, [(key, None, True) if v is DEAD else
                                               (key, _host(v), False) for key, v in items])
        except (CodecError, KeyError, ValueError) as e:
            raise InvalidArgumentError(f"cannot send {len(items)} values to {peer}: {e}") \
                from e

    def _on_control(self, src: str, msg: dict, blob: bytes | None) -> None:
        # values delivered before this message act first (an abort after data of the
        # same burst must find those partitions run, as it would without the burst)
        if self.rendezvous.deferred:
            self.rendezvous.release()
            self.rendezvous.hold()
        kind = msg.get("type")
        c = self.clients.get(src)
        if c is None:
            if kind == "attach" and self._fixed_client is None and \
                    isinstance(msg.get("address"), str):
                self._attach(src, msg["address"])
            else:
                self.transport.rejections["unknown client"] += 1
            return
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            self.transport.rejections["control type"] += 1
            return
        try:
            handler(self, c, msg, blob)
        except Exception as e:  # noqa: BLE001 - a malformed message: drop it, go on
            self.transport.rejections["control field"] += 1
            log.debug("worker %s: bad %s message from %s: %s", self.name, kind, src, e)

    def _h_attach(self, c: _Client, msg: dict, blob: bytes | None) -> None:
        self._attach(c.name, c.address)

    def _h_peers(self, c: _Client, msg: dict, blob: bytes | None) -> None:
        for name, address in msg["peers"].items():
            if name != self.name and name not in self.clients:
                peers = self.transport.peers
                if peers.get(name) not in (None, address):
                    self.transport.remove_peer(name)
                self.transport.add_peer(name, address)
        hb = msg.get("heartbeat_timeout_s")
        if isinstance(hb, (int, float)) and hb > 0:
            c.heartbeat_timeout_s = float(hb)
            self._set_heartbeat()

    def _set_heartbeat(self) -> None:
        """Heartbeats as every attached client asked: sent often enough for the one with
        the shortest timeout, and silence judged by the longest (one client's short
        timeout must not make this worker drop another, which beats more slowly)."""
        asked = [c.heartbeat_timeout_s for c in self.clients.values()
                 if c.heartbeat_timeout_s is not None]
        if asked:
            self.transport.heartbeat_timeout_s = max(asked)
            self.transport.heartbeat_interval_s = min(0.5, min(asked) / 4)

    def _h_plan(self, c: _Client, msg: dict, blob: bytes | None) -> None:
        pid, sid = int(msg["plan"]), int(msg["session"])
        try:
            if blob is None:
                raise InvalidArgumentError("plan message without its graph")
            threads = msg.get("intra_op_threads")
            if isinstance(threads, int) and threads >= 1:
                # the session's BLAS threads, here too (process-wide, as in the client)
                from dcf import blas

                blas.set_threads(threads)
            actors = c.sessions.setdefault(sid, {})
            built = []
            for prt in decode_parts(blob, c.shipped.setdefault(sid, ShippedObjects())):
                dev = prt["device"]
                actor = actors.get(dev)
                if actor is None:
                    actor = actors[dev] = _make_actor(dev, msg)
                plan = build_plan(prt["nodes"], [(fn, 0) for fn, _ in prt["feeds"]],
                                  [(p, idx) for p, idx, _ in prt["fetches"]],
                                  xp=actor.resources.xp, resources=actor.resources,
                                  frame_parents=prt["frame_parents"])
                if msg.get("compile", True):
                    from dcf.frame_compiler import compile_frames

                    compile_frames(plan)
                built.append((dev, plan, [k for _, k in prt["feeds"]],
                              [k for _, _, k in prt["fetches"]]))
            c.plans[pid] = _Plan(sid, built, bool(msg.get("compile", True)))
        except GraphDefError as e:
            # the graph's fault (a py_func's closure that cannot be rebuilt here), not
            # the worker's: not a WorkerError, which says the worker is gone
            c.plans[pid] = _Plan(sid, [], False,
                                 InvalidArgumentError(f"worker {self.name}: {e}"),
                                 e.stream)
        except Exception as e:  # noqa: BLE001 - reported to the run that uses this plan
            c.plans[pid] = _Plan(sid, [], False, e)

    def _h_run(self, c: _Client, msg: dict, blob: bytes | None) -> None:
        step = int(msg["step"])
        if step in self.steps:
            return
        c.steps.add(step)
        task = asyncio.get_running_loop().create_task(
            self._run_step(c, step, int(msg["plan"]), bool(msg.get("trace", False))))
        self.steps[step] = task

    def _h_abort(self, c: _Client, msg: dict, blob: bytes | None) -> None:
        self._abort(int(msg["step"]))

    def _h_release(self, c: _Client, msg: dict, blob: bytes | None) -> None:
        sid = int(msg["session"])
        c.sessions.pop(sid, None)
        c.shipped.pop(sid, None)
        for pid in [p for p, pl in c.plans.items() if pl.session == sid]:
            del c.plans[pid]

    def _h_detach(self, c: _Client, msg: dict, blob: bytes | None) -> None:
        self._drop_client(c)

    def _h_shutdown(self, c: _Client, msg: dict, blob: bytes | None) -> None:
        self.stop()

    def _h_stats(self, c: _Client, msg: dict, blob: bytes | None) -> None:
        """Counters (and the data-message keys recorded so far) for tests and debugging;
        "record_keys": true/false then starts/stops recording."""
        keys = self.recorded_keys or []
        if "record_keys" in msg:
            self.recorded_keys = [] if msg["record_keys"] else None
        info = {"transport": dict(self.transport.stats),
                "rejections": dict(self.transport.rejections),
                "steps": len(self.steps), "feeds": len(self.feeds),
                "rendezvous": self.rendezvous.pending(),
                "sessions": sum(len(x.sessions) for x in self.clients.values()),
                "plans": sum(len(x.plans) for x in self.clients.values()),
                "pid": os.getpid()}
        self.transport.send_control(c.name, {"type": "stats", "req": msg.get("req"),
                                             "info": info},
                                    msgpack.packb([list(k) for k in keys], use_bin_type=True))

    # ---------------------------------------------------------------- steps
    def _abort(self, step: int) -> None:
        # (forgotten here too: a step aborted before its task started, say by an "abort"
        # in the same burst as its "run", never runs _run_step's finally)
        t = self.steps.pop(step, None)
        if t is not None:
            t.cancel()
        for c in self.clients.values():
            c.steps.discard(step)
        self.feeds.pop(step, None)
        self.rendezvous.abort_step(step, RuntimeError("aborted"))
        self.rendezvous.end_step(step)

    async def _run_step(self, c: _Client, step: int, pid: int, trace: bool) -> None:
        send = self.transport.send_control
        plan = None
        try:
            plan = c.plans.get(pid)
            if plan is None:
                raise InvalidArgumentError(f"worker {self.name} has no plan {pid}")
            if plan.error is not None:
                raise plan.error.with_traceback(None)   # (not each run's on top)
            feeds = self.feeds.pop(step, {})
            actors = c.sessions[plan.session]
            coros = []
            for dev, p, feed_keys, _ in plan.parts:
                missing = [k for k in feed_keys if k not in feeds]
                if missing:
                    raise InvalidArgumentError(f"feeds {missing} of step {step} never arrived")
                coros.append(actors[dev].run_step(p, [feeds[k] for k in feed_keys], step,
                                                  self.rendezvous, trace=trace,
                                                  compiled=plan.compiled))
            exs = await _gather_fail_fast(coros)
            events: list = []
            for ex, (dev, p, _, fetch_keys) in zip(exs, plan.parts):
                for local, k in enumerate(fetch_keys):
                    v = _host(ex.results[local])
                    key = (step, FETCH, (k,))
                    if v is DEAD or v is None:
                        self.transport.send_tensor(c.name, key, None, is_dead=True)
                    else:
                        try:
                            self.transport.send_tensor(c.name, key, v)
                        except (CodecError, ValueError) as e:   # (ValueError: too large)
                            node, idx = p.fetch_refs[local]
                            raise InvalidArgumentError(
                                f"fetch {node.name}:{idx} ({node.type}) on {dev} cannot be "
                                f"sent to the client: {e}") from e
                if trace:
                    events.extend([dev, *ev] for ev in ex.trace)
            send(c.name, {"type": "done", "step": step,
                          "fired": sum(ex.fired_total for ex in exs),
                          "clock": time.time() - time.perf_counter()},
                 msgpack.packb(events, use_bin_type=True, default=_plain) if trace else None)
        except asyncio.CancelledError:
            pass  # aborted by the client: it already knows
        except BaseException as e:
            # any failure is answered (a step that goes silent hangs the client's run):
            # also one that is not an Exception; one that ends the process still does
            log.debug("worker %s: step %s failed", self.name, step, exc_info=True)
            if c.name in self.clients:
                m = error_to_msg(step, e)
                if plan is not None and plan.unloaded is not None:
                    # the client forgets it sent those objects: a later description
                    # (the session's good py_funcs alone) sends them again
                    m["unloaded"] = [plan.session, plan.unloaded]
                send(c.name, m)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self.steps.pop(step, None)
            c.steps.discard(step)
            self.feeds.pop(step, None)
            self.rendezvous.end_step(step)


_HANDLERS = {
    "attach": WorkerHost._h_attach,
    "peers": WorkerHost._h_peers,
    "plan": WorkerHost._h_plan,
    "run": WorkerHost._h_run,
    "abort": WorkerHost._h_abort,
    "release": WorkerHost._h_release,
    "detach": WorkerHost._h_detach,
    "shutdown": WorkerHost._h_shutdown,
    "stats": WorkerHost._h_stats,
}


def _make_actor(device: str, settings: dict) -> DeviceActor:
    """The actor of one of this worker's devices, as a session makes it in-process."""
    if DeviceSpec.parse(device).device_type == "gpu":
        from dcf.actors.gpu_actor import make_gpu_actor

        cfg = SimpleNamespace(gpu_memory_limit=settings.get("gpu_memory_limit"),
                              swap_threshold=settings.get("swap_threshold", 0.7))
        return make_gpu_actor(device, cfg)
    return DeviceActor(device)


async def _gather_fail_fast(coros: list) -> list:
    if len(coros) == 1:
        return [await coros[0]]
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()


# what `_host` returns as is, checked without a call (numpy's scalar types and arrays)
_HOST_TYPES = frozenset([np.ndarray, *(np.dtype(t).type for t in "?efdihlqbBHILQFD")])


def _host(v: Any) -> Any:
    """A device array's host copy (GPU fetches and Sends to other processes)."""
    if isinstance(v, (np.ndarray, np.generic)):
        return v
    if hasattr(v, "__cuda_array_interface__"):
        v = v.get()
        return v if v.ndim else v[()]
    return v


def _plain(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


# ------------------------------------------------------------------- main
def _own_process() -> None:
    """In a process that is a worker and nothing else: a py_func's KeyboardInterrupt is
    its own (SIGINT stops the worker through the loop's handler), so it fails its op
    instead of ending the process (dcf/ops/data_ops.py, _call_py_func)."""
    from dcf.ops import data_ops

    data_ops.KEEP_KEYBOARD_INTERRUPT = False


_client_gone = threading.Event()   # set when stdin closed: the starting client has gone


def _watch_stdin(loop: asyncio.AbstractEventLoop, host: WorkerHost) -> None:
    """Stop when stdin closes: the client that started this worker has gone."""
    try:
        while os.read(0, 4096):   # raw reads: no buffered-reader lock at shutdown
            pass
    except OSError:
        pass
    _client_gone.set()
    loop.call_soon_threadsafe(host.stop)


def _remove_ipc_files(bind: str, client_address: str) -> None:
    """A `Cluster.local` worker bound in the cluster's private socket folder (ipc): its
    socket goes as it stops, and, when its client has gone (killed: its own cleanup never
    ran), the client's socket too; then the folder, which only the last one to stop finds
    empty. (/tmp would otherwise keep a dcf-cluster-* folder per killed client.)"""
    if not bind.startswith("ipc://"):
        return
    path = bind[len("ipc://"):]
    folder = os.path.dirname(path)
    if not os.path.basename(folder).startswith("dcf-cluster-"):
        return
    paths = [path]
    if _client_gone.is_set() and client_address.startswith("ipc://") and \
            os.path.dirname(client_address[len("ipc://"):]) == folder:
        paths.append(client_address[len("ipc://"):])
    for p in paths:
        with contextlib.suppress(OSError):
            os.unlink(p)
    with contextlib.suppress(OSError):
        os.rmdir(folder)     # (not empty: another worker still runs; it removes it)


def _socket_folder_gone(bind: str) -> bool:
    """Whether `bind` is in a `Cluster.local` socket folder (ipc) that no longer exists."""
    if not bind.startswith("ipc://"):
        return False
    folder = os.path.dirname(bind[len("ipc://"):])
    return os.path.basename(folder).startswith("dcf-cluster-") and not os.path.isdir(folder)


async def _watch_parent(host: WorkerHost, ppid: int) -> None:
    while True:
        await asyncio.sleep(1.0)
        if os.getppid() != ppid:
            host.stop()
            return


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m dcf.worker`` and the ``dcf-worker`` console script."""
    ap = argparse.ArgumentParser(
        prog="dcf-worker", description="Run one worker task of a dcf cluster.")
    ap.add_argument("--cluster", metavar="FILE", help="cluster spec JSON (see README)")
    ap.add_argument("--task", type=int, default=None,
                    help="this worker's task index (default: $DCF_TASK_INDEX)")
    ap.add_argument("--job", default="worker", help="job name in the spec (default: worker)")
    ap.add_argument("--bind", default=None,
                    help="ZeroMQ endpoint to bind (default: this task's spec address)")
    ap.add_argument("--client", metavar="ADDR", help=argparse.SUPPRESS)
    ap.add_argument("--client-name", default="client", help=argparse.SUPPRESS)
    ap.add_argument("--heartbeat-timeout", type=float, default=5.0,
                    help="seconds of silence after which a client counts as lost")
    ap.add_argument("--cpus", default=os.environ.get("DCF_WORKER_CPUS"),
                    help="comma-separated CPU ids to pin this worker (and its I/O thread) to")
    ap.add_argument("--log-level", default=os.environ.get("DCF_WORKER_LOG", "WARNING"))
    args = ap.parse_args(argv)
    _own_process()
    if args.cpus:
        # Before any thread starts: libzmq's I/O thread inherits the mask, so its
        # hand-offs with this thread are same-CPU wake-ups (far cheaper than cross-CPU
        # ones, notably in VMs).
        try:
            os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
        except (AttributeError, OSError, ValueError) as e:
            log.warning("cannot pin to CPUs %s: %s", args.cpus, e)
    level = args.log_level.upper()
    if not isinstance(logging.getLevelName(level), int):
        ap.error(f"--log-level (or $DCF_WORKER_LOG) {args.log_level!r} is not a logging level "
                 "(DEBUG, INFO, WARNING, ERROR or CRITICAL)")
    logging.basicConfig(level=level, format="%(asctime)s dcf-worker %(levelname)s %(message)s")
    task = args.task
    if task is None:
        env = os.environ.get("DCF_TASK_INDEX")
        if env is None:
            ap.error("give --task N (or set DCF_TASK_INDEX)")
        try:
            task = int(env)
        except ValueError:
            ap.error(f"$DCF_TASK_INDEX must be a task index (an integer), got {env!r}")
    secret: bytes | None = None
    curve: tuple | None = None
    client = None
    if args.client:
        # Started by Cluster.local: the secret is the first line on stdin, never argv.
        line = sys.stdin.buffer.readline().strip()
        if not line:
            ap.error("--client needs the secret on stdin")
        secret = bytes.fromhex(line.decode("ascii"))
        bind = args.bind or "tcp://127.0.0.1:*"
        client = (args.client_name, args.client)
    else:
        if not args.cluster:
            ap.error("give --cluster FILE")
        from dcf.cluster import load_spec

        try:
            spec = load_spec(args.cluster)
        except (OSError, TypeError, ValueError) as e:   # (JSONDecodeError: a ValueError)
            ap.error(f"cannot use the cluster spec {args.cluster}: {e}")
        addresses = spec.jobs.get(args.job)
        if addresses is None or not 0 <= task < len(addresses):
            ap.error(f"the spec has no task {task} in job {args.job!r}")
        bind = args.bind or addresses[task]
        secret, curve = spec.secret, spec.curve_tuple()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    host = WorkerHost(task=task, job=args.job, bind=bind, secret=secret, curve=curve,
                      heartbeat_timeout_s=args.heartbeat_timeout, client=client)
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, host.stop)
        except (NotImplementedError, RuntimeError):
            pass
    if client is not None:
        threading.Thread(target=_watch_stdin, args=(loop, host), daemon=True,
                         name="dcf-worker-stdin").start()

    async def run() -> None:
        watch = asyncio.ensure_future(_watch_parent(host, os.getppid())) if client else None
        try:
            await host.serve()
        finally:
            if watch is not None:
                watch.cancel()

    prof = _start_profile(task)
    try:
        loop.run_until_complete(run())
    except zmq.ZMQError as e:
        if client is not None and _socket_folder_gone(bind):
            # Its cluster closed while it started (Ctrl-C in Cluster.local), and a worker
            # that stopped first removed their empty socket folder: nothing to serve, and
            # no traceback of the bind that failed.
            return 0
        if host.transport._address is not None:
            raise
        # the bind failed (the port is in use, no such interface): say which task, where
        print(f"dcf-worker: {host.name} cannot bind {bind}: {os.strerror(e.errno)}",
              file=sys.stderr)
        return 1
    except Exception:
        if client is not None and _socket_folder_gone(bind):
            return 0
        raise
    finally:
        loop.close()
        if client is not None:
            _remove_ipc_files(bind, client[1])
        if prof is not None:
            prof()
    return 0


def _start_profile(task: int) -> Any:
    """$DCF_WORKER_PROFILE=PREFIX: profile this worker with cProfile and write
    PREFIX.task<N>.prof when it stops (a debugging aid; it slows the worker)."""
    prefix = os.environ.get("DCF_WORKER_PROFILE")
    if not prefix:
        return None
    import cProfile

    pr = cProfile.Profile()
    pr.enable()

    def dump() -> None:
        pr.disable()
        pr.dump_stats(f"{prefix}.task{task}.prof")

    return dump


def ray_worker_class(ray: Any) -> Any:
    """The Ray actor class `Cluster.ray` starts: a `WorkerHost` on a loop thread of the
    actor's process, bound to 127.0.0.1 (every Ray node on the client's host) or to its
    node's IP. `serve()` returns once the client shuts the worker down; the client keeps
    its reference, so an actor lost to Ray (``ray.kill``, a crash, a lost node) fails
    that reference at once, before heartbeats would tell."""

    class RayWorker:
        def __init__(self, task: int, secret: bytes, heartbeat_timeout_s: float,
                     loopback: bool) -> None:
            from dcf.actors.remote import LoopThread

            _own_process()
            ip = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
            if ":" in ip:
                ip = f"[{ip}]"
            self._io = LoopThread(f"dcf-ray-worker-{task}")
            self._host = WorkerHost(task=task, bind=f"tcp://{ip}:*", secret=secret,
                                    heartbeat_timeout_s=heartbeat_timeout_s)
            self._io.call(self._host.start())

        def address(self) -> str:
            return self._host.address

        def serve(self) -> None:
            host = self._host

            async def until_stopped() -> None:
                assert host.stopped is not None
                await host.stopped.wait()
                await host.close()

            self._io.call(until_stopped())
            self._io.stop()

    # two calls at once: serve() runs for the actor's life, address() beside it
    return ray.remote(max_concurrency=2)(RayWorker)


if __name__ == "__main__":
    sys.exit(main())
