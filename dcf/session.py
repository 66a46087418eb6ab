"""Session and AsyncSession: prune -> place -> partition -> plan (cached per fetch/feed
signature) -> one actor step per device -> numpy results in the fetches' structure."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import os
import threading
import time
from dataclasses import dataclass, field, fields
from collections.abc import Mapping
from typing import Any, Iterator

import numpy as np

from dcf import nest
from dcf.actors.device_actor import DeviceActor
from dcf.actors.rendezvous import LocalRendezvous
from dcf.control_flow import _output_frame, check_frames
from dcf.device import DeviceSpec
from dcf.errors import CancelledError, DeadlineExceededError, InvalidArgumentError
from dcf.executor import check_fetches
from dcf.gil import share_if_due
from dcf.graph import Graph, Operation, Tensor, get_default_graph, upstream_ops
from dcf.interrupts import Interrupt
from dcf.ops.data_ops import STEP_STORES
from dcf.ops.registry import as_value
from dcf.partition import partition
from dcf.placement import place
from dcf.plan import build_plan
from dcf.token import DEAD

__all__ = ["Session", "AsyncSession", "RunOptions", "RunMetadata", "SessionConfig"]


def _number(owner: str, name: str, v: Any) -> bool:
    """True where `v` is a number (not a bool); else a TypeError naming owner(name=)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.number)):
        raise TypeError(f"{owner}({name}=...) takes a number, got {v!r}")
    return True


def _plain_numbers(options: Any) -> None:
    """numpy scalars among a (checked) dataclass's fields become Python's own: those sent
    to cluster workers must be msgpack data."""
    for f in fields(options):
        v = getattr(options, f.name)
        if isinstance(v, np.generic):
            setattr(options, f.name, v.item())


@dataclass
class RunOptions:
    """Per-run options: `trace` records a timeline; `timeout_s` bounds the run."""

    trace: bool = False
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.trace, (bool, np.bool_)):
            raise TypeError(f"RunOptions(trace=...) takes True or False, got {self.trace!r}")
        t = self.timeout_s
        if t is not None and _number("RunOptions", "timeout_s", t) and not t > 0:  # (nan too)
            raise ValueError(f"RunOptions(timeout_s={t!r}): give seconds > 0, or None for "
                             "no limit")
        _plain_numbers(self)    # (a cluster run sends them to its workers)


_NO_OPTIONS = RunOptions()     # (a run without options: made once, not checked per run)


@dataclass
class RunMetadata:
    """Filled by a run: `trace` holds timeline events (see dcf.trace). A run given one
    replaces what an earlier run put there (as TF's RunMetadata)."""

    trace: list = field(default_factory=list)
    step_stats: dict = field(default_factory=dict)

    def _begin(self) -> None:
        """(a run given this starts: what an earlier run left goes -- new containers,
        so that a reference the caller kept to an earlier run's `trace` or `step_stats`
        still holds that run's, as a kept TF step_stats does)"""
        self.trace = []
        self.step_stats = {}

    def write_trace(self, path: str) -> None:
        """Write the timeline as Chrome/Perfetto trace JSON."""
        from dcf.trace import to_chrome_trace

        with open(path, "w") as f:
            json.dump(to_chrome_trace(self.trace), f)


@dataclass
class SessionConfig:
    """Session-wide settings.

    gpu_memory_limit: bytes per GPU past which allocations fail unless swapping or
        throttling makes room. swap_threshold: fraction of that limit past which saved
        loop values start to swap. heartbeat_timeout_s: how long a silent worker may
        stay silent before runs fail with WorkerError (left at its default, the cluster's
        own setting holds: `Cluster.local(..., heartbeat_timeout_s=)`; it is one setting
        per cluster: with several open sessions that set it, the latest one's holds, and
        the cluster's own again once they are closed). compile_frames: run loop frames
        that sit on one device as straight-line Python (same semantics, faster).
        fuse_devices: when every device of a run is in this process, run the whole
        graph as one compiled program with transfers at device boundaries instead of
        partitions exchanging messages (dcf/fused.py; needs compile_frames; traced
        runs stay partitioned). intra_op_threads: BLAS threads, set process-wide when
        the session is made, and in a cluster's workers when it sends them a plan; None
        leaves BLAS's setting alone.
    """

    gpu_memory_limit: int | None = None
    swap_threshold: float = 0.7
    heartbeat_timeout_s: float = 5.0
    compile_frames: bool = True
    fuse_devices: bool = True
    intra_op_threads: int | None = 1  # BLAS threads (process-wide; None leaves it alone)

    def __post_init__(self) -> None:
        def number(name: str, v: Any) -> bool:
            return _number("SessionConfig", name, v)

        lim = self.gpu_memory_limit
        if lim is not None and number("gpu_memory_limit", lim) and not lim > 0:
            raise ValueError(f"SessionConfig(gpu_memory_limit={lim!r}): give a number of "
                             "bytes > 0, or None for no limit")
        number("swap_threshold", self.swap_threshold)
        if not 0.0 <= self.swap_threshold <= 1.0:
            # (0 swaps saved loop values from the start)
            raise ValueError(f"SessionConfig(swap_threshold={self.swap_threshold!r}): it is "
                             "a fraction of gpu_memory_limit, in [0, 1]")
        number("heartbeat_timeout_s", self.heartbeat_timeout_s)
        if not self.heartbeat_timeout_s > 0:
            raise ValueError(f"SessionConfig(heartbeat_timeout_s="
                             f"{self.heartbeat_timeout_s!r}): give seconds > 0")
        for name in ("compile_frames", "fuse_devices"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"SessionConfig({name}=...) takes True or False, got "
                                f"{getattr(self, name)!r}")
        n = self.intra_op_threads
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer))):
            raise TypeError(f"SessionConfig(intra_op_threads=...) takes an int or None, "
                            f"got {n!r}")
        if n is not None and n < 1:
            raise ValueError(f"SessionConfig(intra_op_threads={n!r}): give a number of "
                             "threads >= 1, or None to leave BLAS's setting alone")
        _plain_numbers(self)    # (a cluster session sends them to its workers)


@dataclass
class _RunPlan:
    parts: list            # [(device, ExecPlan, feed index list, fetch map)]
    fetch_targets: list    # [Tensor | Operation]
    structure: Any
    feed_tensors: list
    remote: Any = None     # the partitions shipped to cluster workers (dcf.cluster)
    fused: Any = None      # (FUSED, plan, feed index list, fetch map): see dcf/fused.py
    stores: bool = False   # it makes stacks or TensorArrays: a failed run drops them


def _id_order(items: list) -> list[int] | None:
    """The positions of `items` in the order of their ids (the order a plan is built
    in), or None where they are in it already."""
    order = sorted(range(len(items)), key=lambda i: id(items[i]))
    return None if order == list(range(len(items))) else order


def _in_order(items: list, order: list[int] | None) -> list:
    return items if order is None else [items[i] for i in order]


def _reordered(rp: _RunPlan, fetch_targets: list, fetch_order: list[int] | None,
               feed_tensors: list, feed_order: list[int] | None, structure: Any) -> _RunPlan:
    """`rp`, built for the fetches and feeds in id order, for them in the caller's order:
    the same partitions, their feed and fetch positions mapped."""
    def moved(dev: str, plan: Any, feed_idx: list, fetch_idx: list) -> tuple:
        return (dev, plan,
                feed_idx if feed_order is None else [feed_order[k] for k in feed_idx],
                fetch_idx if fetch_order is None else [fetch_order[k] for k in fetch_idx])

    return _RunPlan([moved(*p) for p in rp.parts], fetch_targets, structure, feed_tensors,
                    None, None if rp.fused is None else moved(*rp.fused), rp.stores)


_step_ids = itertools.count(1)
NOT_INLINE = object()  # run_inline's answer when the run needs the actors


class AsyncSession:
    """Runs graphs inside the caller's running asyncio event loop.

    `await sess.run(fetches, feed_dict)`; several runs may be in flight at once.
    """

    def __init__(self, graph: Graph | None = None, cluster: Any = None,
                 config: SessionConfig | None = None) -> None:
        if graph is not None and not isinstance(graph, Graph):
            raise TypeError(f"Session(graph=...) takes a dcf.Graph, got {_short(graph)}")
        if config is not None and not isinstance(config, SessionConfig):
            raise TypeError(f"Session(config=...) takes a dcf.SessionConfig, got "
                            f"{_short(config)}")
        if cluster is not None:
            from dcf.cluster import Cluster

            if not isinstance(cluster, Cluster):
                raise TypeError(f"Session(cluster=...) takes a dcf.Cluster, got "
                                f"{_short(cluster)}")
        self.graph = graph or get_default_graph()
        self.cluster = cluster
        self.config = config or SessionConfig()
        if self.config.intra_op_threads is not None:
            from dcf import blas

            blas.set_threads(self.config.intra_op_threads)
        self._actors: dict[str, DeviceActor] = {}
        self._making_actor = threading.Lock()   # (runs of several threads start devices)
        self._plans: dict[tuple, _RunPlan] = {}
        self._rendezvous = LocalRendezvous()
        self._closed = False
        # runs in flight: the task awaiting each (how many of its runs), so that close()
        # can cancel them; the ones it cancelled
        self._running: dict[asyncio.Task, int] = {}
        self._cancelled_by_close: set[asyncio.Task] = set()
        # inline runs in flight that check as they go (a loop's, or one making stacks):
        # (thread id, its check); one with neither has no point to stop at
        self._inline: set[tuple] = set()
        self._sid = 0
        if cluster is not None:
            # Runs go to the cluster's I/O loop, which also carries the transport.
            hb = self.config.heartbeat_timeout_s
            self._sid = cluster._new_session(None if hb == _DEFAULT_HEARTBEAT_S else hb)
            self._rendezvous.remote_send = cluster._client.send_tensor
            self._rendezvous.remote_send_batch = cluster._client.send_batch

    # ------------------------------------------------------------ devices
    def _device_exists(self, dev: str) -> bool:
        spec = DeviceSpec.parse(dev)
        if spec.job is not None and spec.job != "localhost":
            return self.cluster is not None and self.cluster._has_device(spec)
        if spec.device_type == "cpu":
            return True
        if spec.device_type == "gpu":
            from dcf import gpu_devices

            return spec.index is not None and spec.index < gpu_devices.count()
        return False

    def _actor(self, dev: str) -> DeviceActor:
        a = self._actors.get(dev)
        if a is None:
            with self._making_actor:    # one actor per device, and so one set of variables
                a = self._actors.get(dev)
                if a is None:
                    if self._closed:    # (its devices are gone: close())
                        raise RuntimeError("this session is closed")
                    a = self._actors[dev] = self._new_actor(dev)
        return a

    def _new_actor(self, dev: str) -> DeviceActor:
        if DeviceSpec.parse(dev).device_type == "gpu":
            from dcf.actors.gpu_actor import make_gpu_actor

            return make_gpu_actor(dev, self.config)
        return DeviceActor(dev)

    # -------------------------------------------------------------- plans
    def _plan(self, fetch_targets: list, feed_tensors: list, structure: Any) -> _RunPlan:
        key = (tuple(id(f) for f in fetch_targets), tuple(id(t) for t in feed_tensors))
        rp = self._plans.get(key)
        if rp is not None:
            return rp
        if self.cluster is None:
            fetch_order = _id_order(fetch_targets)
            feed_order = _id_order(feed_tensors)
            if fetch_order is not None or feed_order is not None:
                # the same fetches or feeds in another order share one plan (as TF1's
                # executors): a service that lists them in each request's order would
                # otherwise build a plan per order
                rp = _reordered(self._plan(_in_order(fetch_targets, fetch_order),
                                           _in_order(feed_tensors, feed_order), structure),
                                fetch_targets, fetch_order, feed_tensors, feed_order,
                                structure)
                self._plans[key] = rp
                return rp
        for x in fetch_targets:
            _check_fetchable(x)
        ops = _prune(fetch_targets, feed_tensors)
        check_frames(ops, set(feed_tensors))
        device_of = place(ops, "/cpu:0", self._device_exists,
                          process_of=self.cluster._process_of if self.cluster else None)
        fetches, fetch_pos = [], []   # computed tensor fetches and their target index
        fed = set(feed_tensors)
        for i, f in enumerate(fetch_targets):
            if isinstance(f, Tensor) and f not in fed:
                fetches.append((f.op, f.index))
                fetch_pos.append(i)
        parts = partition(ops, device_of, fetches, feed_tensors)
        remote = None
        if self.cluster is not None:
            # each worker gets its partitions once per plan; the client keeps its own
            parts, remote = self.cluster._ship(self._sid, parts, fetch_pos, self.config)
        fused = None
        if remote is None and len(parts) > 1 and self.config.compile_frames and \
                self.config.fuse_devices:
            fused = self._fused_plan(ops, device_of, fetches, feed_tensors, fetch_pos,
                                     list(parts))
        built = []
        for dev, prt in parts.items():
            actor = self._actor(dev)
            plan = build_plan(prt.nodes, [(fn, 0) for fn, _ in prt.feeds],
                              [(p, idx) for p, idx, _ in prt.fetches],
                              xp=actor.resources.xp, resources=actor.resources,
                              frame_parents=prt.frame_parents)
            gpu = getattr(actor, "gpu", None)
            if gpu is not None:
                plan.gpu_of = dict.fromkeys(range(len(plan.nodes)), gpu)
            if self.config.compile_frames and fused is None:
                # (with a fused plan the partitions serve traced runs only, which take
                # the tagged-token executor: nothing to compile)
                from dcf.frame_compiler import compile_frames

                compile_frames(plan)
            built.append((dev, plan, [k for _, k in prt.feeds],
                          [fetch_pos[k] for _, _, k in prt.fetches]))
        rp = _RunPlan(built, fetch_targets, structure, feed_tensors, remote, fused,
                      any(op.type in ("StackV2", "TensorArrayV3") for op in ops))
        self._plans[key] = rp
        return rp

    def _fused_plan(self, ops: list, device_of: dict, fetches: list, feed_tensors: list,
                    fetch_pos: list, devices: list) -> Any:
        from dcf.fused import FUSED, FusedActor, build_fused

        plan = build_fused(ops, device_of, fetches, feed_tensors,
                           lambda dev: self._actor(dev).resources)
        if plan is None:
            return None
        gpu_actors = [self._actor(d) for d in devices if hasattr(self._actor(d), "gpu")]
        key = FUSED + ",".join(sorted(devices))
        with self._making_actor:
            if key not in self._actors:
                self._actors[key] = FusedActor(gpu_actors)
        return (key, plan, list(range(len(feed_tensors))), list(fetch_pos))

    # ---------------------------------------------------------------- run
    async def run(self, fetches: Any, feed_dict: dict | None = None,
                  options: RunOptions | None = None, run_metadata: RunMetadata | None = None
                  ) -> Any:
        """Run the graph to compute `fetches`; returns numpy values in their structure."""
        try:
            return await self._run(fetches, feed_dict, options, run_metadata)
        except BaseException as e:
            # (from here, where _run's frame has ended and can be cleared too: its feeds'
            # copies and plan; and for a cancelled run as well, whose error -- or the
            # TimeoutError asyncio.wait_for chains to it -- the caller may keep)
            _let_go_of_values(e)
            raise

    async def _run(self, fetches: Any, feed_dict: dict | None, options: RunOptions | None,
                   run_metadata: RunMetadata | None) -> Any:
        if self._closed:
            raise RuntimeError("this session is closed")
        _check_run_args(feed_dict, options, run_metadata)
        if self.cluster is not None and not self.cluster._io.in_loop():
            if self.cluster._closed:
                raise RuntimeError("this session's cluster is closed")
            return await self.cluster._io.wrap(self.run(fetches, feed_dict, options,
                                                        run_metadata))
        options = options or _NO_OPTIONS
        if run_metadata is not None:
            run_metadata._begin()
        targets, structure = _flatten_fetches(fetches, self.graph)
        feed_tensors, feed_values = _convert_feeds(feed_dict, self.graph)
        rp = self._plan(targets, feed_tensors, structure)
        if rp.remote is not None:
            step = self._run_cluster(rp, targets, structure, feed_tensors, feed_values,
                                     options, run_metadata)
        else:
            step = self._run_parts(rp, targets, structure, feed_tensors, feed_values,
                                   options, run_metadata)
        me = asyncio.current_task()
        running = self._running
        running[me] = running.get(me, 0) + 1
        try:
            if not rp.stores:               # (nothing to drop: no bookkeeping per run)
                return await step
            with _dropped_if_failed():      # (the coroutine runs in this context when awaited)
                return await step
        except asyncio.CancelledError:
            if me not in self._cancelled_by_close:
                raise
            self._cancelled_by_close.discard(me)
            uncancel = getattr(me, "uncancel", None)    # (Python 3.11+)
            if uncancel is not None and uncancel() > 0:
                raise       # the caller cancelled it too: its cancel stands
            raise CancelledError("the session was closed while this run was in flight; "
                                 "the run was aborted on every device") from None
        finally:
            left = running.pop(me) - 1
            if left:
                running[me] = left

    async def _cancel_running(self) -> None:
        """Cancel every run in flight and wait until each has unwound (its partitions'
        steps aborted, on workers too); their callers get CancelledError (dcf's)."""
        tasks = [t for t in list(self._running) if t is not None and not t.done()]
        me = asyncio.current_task()
        here = asyncio.get_running_loop()
        for t in tasks:
            if t is not me and t not in self._cancelled_by_close:   # (a second close)
                self._cancelled_by_close.add(t)
                loop = t.get_loop()
                if loop is here:
                    t.cancel()
                elif not loop.is_closed():  # a run in another thread's loop, maybe asleep
                    loop.call_soon_threadsafe(t.cancel)
        deadline = time.monotonic() + 10.0
        while any(t in self._running and not t.done() for t in tasks if t is not me) and \
                time.monotonic() < deadline:
            await asyncio.sleep(0.001)

    async def _run_parts(self, rp: _RunPlan, targets: list, structure: Any,
                         feed_tensors: list, feed_values: list, options: RunOptions,
                         run_metadata: RunMetadata | None) -> Any:
        """One step over this process's partitions (or its fused plan)."""
        step = next(_step_ids)
        coros = []
        ends: list[float] = []      # when each partition's step ended (a run with timeout_s)
        deadline = _deadline(options)
        parts = rp.parts if rp.fused is None or options.trace else [rp.fused]
        for dev, plan, feed_idx, _ in parts:
            coros.append(_noting_end(self._actors[dev].run_step(
                plan, [feed_values[k] for k in feed_idx], step, self._rendezvous,
                trace=options.trace, compiled=self.config.compile_frames, deadline=deadline),
                ends, options))
        try:
            if not coros:
                exs = []                # nothing to compute: fed tensors, or no fetch at all
            elif len(coros) == 1:
                exs = [await _within(coros[0], options, deadline, ends)]
            else:
                exs = await _within(_gather_fail_fast(coros), options, deadline, ends)
        except asyncio.TimeoutError:
            self._rendezvous.abort_step(step, DeadlineExceededError("deadline"))
            raise _late(options) from None
        except BaseException as e:
            self._rendezvous.abort_step(step, e)
            raise
        finally:
            self._rendezvous.end_step(step)
        values: list[Any] = [None] * len(targets)
        fed_value = dict(zip(feed_tensors, feed_values))
        for i, t in enumerate(targets):
            if isinstance(t, Tensor) and t in fed_value:
                values[i] = _to_numpy(fed_value[t])  # a fed tensor's value is what was fed
        for ex, (dev, plan, _, fetch_idx) in zip(exs, parts):
            check_fetches(ex, [targets[k].name for k in fetch_idx])
            for local, k in enumerate(fetch_idx):
                values[k] = _to_numpy(ex.results[local])
            if run_metadata is not None and options.trace:
                run_metadata.trace.extend((dev,) + ev for ev in ex.trace)
        if run_metadata is not None:
            run_metadata.step_stats["nodes_fired"] = sum(ex.fired_total for ex in exs)
        return nest.pack_sequence_as(structure, values)

    def run_inline(self, fetches: Any, feed_dict: dict | None = None,
                   options: RunOptions | None = None,
                   run_metadata: RunMetadata | None = None) -> Any:
        """Run without any event loop when the graph is one partition compiled into a
        single function (nothing to wait for); returns NOT_INLINE otherwise."""
        if self._closed:
            raise RuntimeError("this session is closed")
        _check_run_args(feed_dict, options, run_metadata)
        options = options or _NO_OPTIONS
        if options.trace or not self.config.compile_frames or self.cluster is not None:
            return NOT_INLINE
        if run_metadata is not None:
            run_metadata._begin()
        targets, structure = _flatten_fetches(fetches, self.graph)
        feed_tensors, feed_values = _convert_feeds(feed_dict, self.graph)
        rp = self._plan(targets, feed_tensors, structure)
        deadline = _deadline(options)

        intr = _NEVER_INTERRUPTED     # (a real one below, only where the plan has a loop)

        def check() -> None:
            # every few ms, where the compiled code yields
            if intr.requested:      # Ctrl-C (dcf/interrupts.py): out at this clean point
                raise KeyboardInterrupt
            if self._closed:        # closed by another thread (Session.close)
                raise CancelledError("the session was closed while this run was in flight")
            if deadline is not None and time.monotonic() > deadline:
                raise _late(options)
            share_if_due(time.perf_counter())

        if rp.fused is None and (len(rp.parts) != 1 or rp.parts[0][1].compiled_root is None
                                 or "gpu:" in rp.parts[0][0]):
            return NOT_INLINE       # (GPU actors move feeds and fetches themselves)
        dev, plan, feed_idx, fetch_idx = rp.fused if rp.fused is not None else rp.parts[0]
        feeds = [feed_values[k] for k in feed_idx]
        loops = len(plan.frames) > 1
        if not loops and not rp.stores:
            # nothing to set up: no check to stop at (Ctrl-C stays Python's there, and such
            # a run -- often ~13 us -- does not pay ~2 us for taking SIGINT over), and no
            # stacks or TensorArrays to drop if it fails
            results = self._run_inline_plan(rp.fused is not None, dev, plan, feeds, check)
        else:
            if loops:
                intr = Interrupt()
            in_flight = (threading.get_ident(), check)
            self._inline.add(in_flight)     # (Session.close waits for it)
            try:
                with intr if loops else _NOTHING, \
                        _dropped_if_failed() if rp.stores else _NOTHING:
                    results = self._run_inline_plan(rp.fused is not None, dev, plan, feeds,
                                                    check)
                    if intr.requested:          # it came after the run's last check
                        raise KeyboardInterrupt
            finally:
                self._inline.discard(in_flight)
        if deadline is not None and time.monotonic() > deadline:
            raise _late(options)    # it ended late (a run with no loop has no check)
        values: list[Any] = [None] * len(targets)
        for t, v in zip(feed_tensors, feed_values):
            for i, target in enumerate(targets):
                if target is t:
                    values[i] = _to_numpy(v)
        for local, k in enumerate(fetch_idx):
            v = results[local]
            if v is DEAD:
                raise InvalidArgumentError(
                    f"fetch {targets[k].name} is dead: it lies on a branch that was not taken")
            values[k] = _to_numpy(v)
        if run_metadata is not None:
            run_metadata.step_stats["nodes_fired"] = len(plan.nodes)
        return nest.pack_sequence_as(structure, values)

    def _inline_runs_stopped(self) -> None:
        """Wait (up to 10 s) until the inline runs of other threads in `_inline` have
        stopped: each raises CancelledError at its next check once the session is
        closed."""
        me = threading.get_ident()
        deadline = time.monotonic() + 10.0
        while any(t != me for t, _ in list(self._inline)) and time.monotonic() < deadline:
            time.sleep(0.001)

    def _run_inline_plan(self, fused: bool, dev: str, plan: Any, feeds: list,
                         check: Any) -> list:
        """The fetched values of one inline run (run_inline)."""
        if fused:
            return self._actor(dev).run_sync(plan, feeds, check)
        gen = plan.compiled_root.start(feeds)
        try:
            while True:
                next(gen)  # it yields every few ms: the moment to check the deadline
                try:
                    check()
                except DeadlineExceededError as e:
                    # (where the run stood: known now, cheaply, from the suspended code)
                    from dcf.frame_compiler import where_suspended

                    where = where_suspended(gen)
                    if where is None:
                        raise
                    raise DeadlineExceededError(f"{e} (it stopped in {where})") from None
        except StopIteration as stop:
            return stop.value
        finally:
            gen.close()

    async def _run_cluster(self, rp: _RunPlan, targets: list, structure: Any,
                           feed_tensors: list, feed_values: list, options: RunOptions,
                           run_metadata: RunMetadata | None) -> Any:
        """One step over the client's partitions and the workers' (on the I/O loop)."""
        client = self.cluster._client
        step = client.new_step()
        st = client.start_step(step, rp.remote, feed_values, self._rendezvous, options.trace,
                               feed_tensors)
        ends: list[float] = []
        deadline = _deadline(options)
        coros = [_noting_end(self._actors[dev].run_step(
            plan, [feed_values[k] for k in feed_idx], step, self._rendezvous,
            trace=options.trace, compiled=self.config.compile_frames, deadline=deadline),
            ends, options) for dev, plan, feed_idx, _ in rp.parts]
        coros.append(_noting_end(st.wait(), ends, options))
        try:
            exs = await _within(_gather_fail_fast(coros), options, deadline, ends)
        except asyncio.TimeoutError:
            client.abort_step(step)
            self._rendezvous.abort_step(step, DeadlineExceededError("deadline"))
            raise DeadlineExceededError(
                f"run did not finish within timeout_s={options.timeout_s}; it was aborted on "
                "every worker and the session is still usable") from None
        except BaseException as e:
            client.abort_step(step)
            self._rendezvous.abort_step(step, e)
            raise
        finally:
            client.end_step(step)
            self._rendezvous.end_step(step)
        exs.pop()
        values: list[Any] = [None] * len(targets)
        fed_value = dict(zip(feed_tensors, feed_values))
        for i, t in enumerate(targets):
            if isinstance(t, Tensor) and t in fed_value:
                values[i] = _to_numpy(fed_value[t])  # a fed tensor's value is what was fed
        for ex, (dev, plan, _, fetch_idx) in zip(exs, rp.parts):
            check_fetches(ex, [targets[k].name for k in fetch_idx])
            for local, k in enumerate(fetch_idx):
                values[k] = _to_numpy(ex.results[local])
            if run_metadata is not None and options.trace:
                run_metadata.trace.extend((dev,) + ev for ev in ex.trace)
        for k, v in st.fetches.items():
            if v is DEAD:
                raise InvalidArgumentError(
                    f"fetch {targets[k].name} is dead: it lies on a branch that was not taken")
            values[k] = _to_numpy(v)    # (a received array is read-only: the caller's copy)
        if run_metadata is not None:
            if options.trace:
                run_metadata.trace.extend(st.trace)
            run_metadata.step_stats["nodes_fired"] = \
                sum(ex.fired_total for ex in exs) + st.fired
        return nest.pack_sequence_as(structure, values)

    async def close(self) -> None:
        """Close the session: runs still in flight are cancelled (each raises
        dcf.errors.CancelledError, as a TensorFlow session closed under a run) and have
        unwound on every device before this returns; later runs raise RuntimeError."""
        was_closed, self._closed = self._closed, True
        if self._running:
            if self.cluster is not None and not self.cluster._closed and \
                    not self.cluster._io.in_loop():
                await self.cluster._io.wrap(self._cancel_running())
            else:
                await self._cancel_running()
        if not was_closed and self.cluster is not None:
            self.cluster._release(self._sid)
        if not self._running and not self._inline:
            # its devices' state goes: the variables and the constants a GPU keeps, which
            # a closed session its caller still holds (`with ... as sess` leaves it bound)
            # kept on the device, in use under the next session's gpu_memory_limit
            self._actors = {}
            self._plans = {}

    def __del__(self) -> None:
        # (let go of unclosed, as a TensorFlow session: its workers drop its partitions)
        if not getattr(self, "_closed", True) and self.cluster is not None:
            self.cluster._release(self._sid)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


async def _gather_fail_fast(coros: list) -> list:
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if t.exception() is not None:
                raise t.exception()
        return [t.result() for t in tasks]
    finally:
        left = [t for t in tasks if not t.done()]
        for t in left:
            t.cancel()
        if left:        # they unwind (their devices' steps end) before this run ends
            await asyncio.wait(left)
        for t in tasks:
            if not t.cancelled():
                t.exception()     # retrieved (a partition's own interrupt, say): no report


_DCF_CODE = (os.path.dirname(os.path.abspath(__file__)) + os.sep, "<dcf ")


def _let_go_of_values(e: BaseException) -> None:
    """A failed run's values go now, not when the caller lets go of its error: dcf's own
    frames in the error's traceback (and in the errors it chains) hold the run's values
    -- device memory, on a GPU -- for as long as the error lives (kept by the caller, or
    by a notebook as sys.last_value), so their locals are cleared; frames of the
    caller's code (a py_func) keep theirs for debugging."""
    seen: set[int] = set()
    todo: list = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        tb = x.__traceback__
        while tb is not None:
            f = tb.tb_frame
            if f.f_code.co_filename.startswith(_DCF_CODE):
                with contextlib.suppress(RuntimeError):     # (a frame still running)
                    f.clear()
                    _ = f.f_locals  # (empties the copy of the locals an error handler read)
            tb = tb.tb_next
        todo += (x.__cause__, x.__context__)


@contextlib.contextmanager
def _dropped_if_failed() -> Iterator[None]:
    """Around a run whose plan makes stacks or TensorArrays: where it fails, those it made
    let go of their values now, not when the caller lets go of the traceback that holds
    them (dcf/ops/data_ops.py, STEP_STORES)."""
    made: list = []
    token = STEP_STORES.set(made)
    try:
        yield
    except BaseException:
        for store in made:
            store.drop()
        raise
    finally:
        STEP_STORES.reset(token)
        made.clear()


def _to_numpy(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v
    if isinstance(v, np.ndarray):
        # a fetched array is the caller's to write, as in TensorFlow: one the run keeps
        # read-only (a Variable's value, a constant, a feed) comes back as a copy
        return v if v.flags.writeable else v.copy()
    get = getattr(v, "get", None)  # cupy arrays come back to the host
    if get is not None and hasattr(v, "__cuda_array_interface__"):
        return get()
    return v


def _check_fetchable(x: Tensor | Operation) -> None:
    op = x.op if type(x) is Tensor else x
    frame = _output_frame(op) if type(x) is Tensor else op.frame_ctx
    if frame is not None:
        raise InvalidArgumentError(
            f"cannot fetch {x.name} ({op.type} '{op.name}'): it lives inside while_loop "
            f"frame '{frame.frame_name}', where it has a value per iteration; fetch a loop "
            "output, or collect the values in a TensorArray")


def _flatten_fetches(fetches: Any, graph: Graph) -> tuple[list, Any]:
    leaves = nest.flatten(fetches)
    targets: list = []
    for x in leaves:
        if isinstance(x, str):
            x = graph.get_tensor_by_name(x) if ":" in x else graph.get_operation_by_name(x)
        elif hasattr(x, "_as_tensor") and not isinstance(x, Tensor):
            fetch = getattr(x, "_fetch_tensor", None)     # (a Variable: one read for all runs)
            x = fetch() if fetch is not None else x._as_tensor()
        elif getattr(x, "_is_tensor_array", False):
            raise TypeError("fetch a TensorArray's values with .stack() or .read(i)")
        if not isinstance(x, (Tensor, Operation)):
            raise TypeError(f"cannot fetch {x!r}: fetches are tensors, ops, or structures of them")
        if x.graph is not graph:
            raise ValueError(f"fetch {x.name} is not an element of this session's graph")
        targets.append(x)
    return targets, fetches


def _short(x: Any) -> str:
    r = repr(x)
    return f"{type(x).__name__} {r if len(r) <= 60 else r[:57] + '...'}"


def _check_run_args(feed_dict: Any, options: Any, run_metadata: Any) -> None:
    """TypeError for run arguments of the wrong kind (before they fail somewhere deep)."""
    if feed_dict is not None and type(feed_dict) is not dict and \
            not isinstance(feed_dict, Mapping):
        raise TypeError(f"run(feed_dict=...) takes a dict {{tensor: value}}, got "
                        f"{_short(feed_dict)}")
    if options is not None and not isinstance(options, RunOptions):
        raise TypeError(f"run(options=...) takes a dcf.RunOptions, got {_short(options)}")
    if run_metadata is not None and not isinstance(run_metadata, RunMetadata):
        raise TypeError(f"run(run_metadata=...) takes a dcf.RunMetadata, got "
                        f"{_short(run_metadata)}")


def _feed_pairs(k: Any, v: Any, out: list) -> None:
    """A feed_dict item as (key, value) pairs: a key that is a (nested) tuple of tensors,
    such as an LSTMStateTuple of placeholders, pairs leaf by leaf with a value of the same
    structure (the state a run fetched), as in TF1."""
    if not isinstance(k, tuple):
        out.append((k, v))
        return
    if not isinstance(v, (tuple, list)) or len(v) != len(k):
        raise ValueError(f"feed_dict key {_short(k)} is a tuple of {len(k)} tensors: its "
                         f"value must be a tuple or list of {len(k)} values, got {_short(v)}")
    for kk, vv in zip(k, v):
        _feed_pairs(kk, vv, out)


def _convert_feeds(feed_dict: dict | None, graph: Graph) -> tuple[list, list]:
    tensors, values = [], []
    items: list = []
    named = False           # (only a key given by name, or in a tuple, can repeat another)
    for k, v in (feed_dict or {}).items():
        named = named or isinstance(k, tuple)
        _feed_pairs(k, v, items)
    for k, v in items:
        if isinstance(k, str):
            k = graph.get_tensor_by_name(k)
            named = True
        elif hasattr(k, "_as_tensor") and not isinstance(k, Tensor):
            raise TypeError("feed a Variable by assigning to it, not through feed_dict")
        if not isinstance(k, Tensor):
            raise TypeError(f"feed_dict keys must be tensors, got {k!r}")
        if k.graph is not graph:
            # (as TF: a tensor of another graph is no key of this one, not one to ignore)
            raise TypeError(f"Cannot interpret feed_dict key as Tensor: {k.op.type} "
                            f"'{k.op.name}' ({k.name}) is not an element of this session's "
                            "graph")
        if _output_frame(k.op) is not None:
            raise InvalidArgumentError(f"cannot feed '{k.name}': it lives inside a loop frame")
        try:
            if not getattr(v, "__cuda_array_interface__", None):
                val = as_value(v, k.dtype)
            elif v.dtype != k.dtype.np:
                with v.device:      # a GPU array, converted as a host one is, where it is
                    val = v.astype(k.dtype.np)
            else:
                val = v
        except (TypeError, ValueError, OverflowError) as e:
            raise TypeError(f"{k.op.type} '{k.op.name}': cannot feed {type(v).__name__} as "
                            f"{k.dtype} to {k.name}: {e}") from None
        shp = k.shape
        got = tuple(val.shape) if hasattr(val, "shape") else np.shape(val)  # also GPU arrays
        if shp is not None and (len(shp) != len(got) or
                                any(a is not None and a != b for a, b in zip(shp, got))):
            raise InvalidArgumentError(
                f"{k.op.type} '{k.op.name}': fed a value of shape {list(got)}, expected "
                f"{[d if d is not None else None for d in shp]} for {k.name}")
        tensors.append(k)
        values.append(val)
    if named and len(set(tensors)) < len(tensors):
        # a tensor fed twice (as itself and by its name, or in a tuple key): the later
        # value is the one fed, as in TF1, and the one a fetch of it returns
        last = dict(zip(tensors, values))
        tensors, values = list(last), list(last.values())
    return tensors, values


def _prune(targets: list, feeds: list[Tensor]) -> list[Operation]:
    """The ops needed to compute `targets`, not looking behind fed tensors, in the
    graph's order."""
    seen = upstream_ops([t.op if isinstance(t, Tensor) else t for t in targets], feeds)
    g_ops = targets[0].graph._ops if targets else []
    return [op for op in g_ops if op in seen]


class Session:
    """Synchronous session: `sess.run(fetches, feed_dict)` returns numpy values.

    Works from any thread; in a thread whose event loop is already running (a
    Jupyter cell, an async framework's callback) it drives its actors on a private
    loop thread instead.
    """

    def __init__(self, graph: Graph | None = None, cluster: Any = None,
                 config: SessionConfig | None = None) -> None:
        self._async = AsyncSession(graph, cluster, config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._driver: threading.Thread | None = None   # the thread running the loop, if one
        self._guests = False           # another thread's run joined the driver's loop
        self._driven = threading.Condition(self._lock)  # notified when a driver lets go
        self._closing = threading.Lock()    # one close at a time (threads may close at once)

    @property
    def graph(self) -> Graph:
        return self._async.graph

    def _private_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = _new_loop()
        return self._loop

    def _call(self, coro: Any) -> Any:
        cluster = self._async.cluster
        if cluster is not None:
            if cluster._closed:
                coro.close()
                raise RuntimeError("this session's cluster is closed")
            return _call_on_io(cluster._io, coro)  # runs on the cluster's I/O loop
        try:
            asyncio.get_running_loop()
            running = True
        except RuntimeError:
            running = False
        me = threading.current_thread()
        if me is self._driver or me is self._thread:
            coro.close()
            raise RuntimeError("Session.run was called from inside a run of the same session "
                               "(a py_func?): the outer run holds the session's loop, so the "
                               "inner one could never finish; use another Session")
        with self._lock:
            if self._thread is None:
                if self._driver is None and not running:
                    # this thread drives the session's loop for the length of its run
                    self._driver = me
                    loop = self._private_loop()
                    fut = None
                elif self._driver is None:
                    self._start_loop_thread()
                    fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
                else:
                    # another thread drives the loop: this run joins it there (it may be
                    # the one that run waits for: an enqueue for its dequeue), and the loop
                    # gets a thread of its own when that run ends
                    self._guests = True
                    fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
            else:
                fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        if fut is None:
            try:
                return _run_to_end(loop, coro)
            finally:
                with self._lock:
                    self._driver = None
                    if self._guests:
                        self._guests = False
                        self._start_loop_thread()
                    self._driven.notify_all()
        try:
            return fut.result()
        except BaseException:       # Ctrl-C while this thread waits: the run stops too
            fut.cancel()
            raise

    def _start_loop_thread(self) -> None:
        # (under self._lock) from now on the session's loop runs in a thread of its own
        loop = self._private_loop()
        self._thread = threading.Thread(target=_serve, args=(loop,), daemon=True,
                                        name="dcf-session-loop")
        self._thread.start()

    def run(self, fetches: Any, feed_dict: dict | None = None, options: RunOptions | None = None,
            run_metadata: RunMetadata | None = None) -> Any:
        """Run the graph to compute `fetches`; returns numpy values in their structure."""
        try:
            r = self._async.run_inline(fetches, feed_dict, options, run_metadata)
            if r is not NOT_INLINE:
                return r
            return self._call(self._async.run(fetches, feed_dict, options, run_metadata))
        except BaseException as e:
            _let_go_of_values(e)
            raise

    def close(self) -> None:
        """Close the session. A run in flight in another thread is cancelled (it raises
        dcf.errors.CancelledError) and has stopped before this returns; later runs raise
        RuntimeError. Several threads may close it at once: each returns once it is
        closed, except a close from inside one of its runs (a py_func's) while another
        thread closes it, which returns at once (that close waits for the run)."""
        if not self._closing.acquire(blocking=False):
            if self._inside_a_run():
                return
            self._closing.acquire()
        try:
            self._close()
        finally:
            self._closing.release()

    def _inside_a_run(self) -> bool:
        """Whether this thread is running one of this session's runs (a py_func's code)."""
        me = threading.current_thread()
        return me is self._driver or me is self._thread or \
            any(t == me.ident for t, _ in list(self._async._inline))

    def _close(self) -> None:
        a = self._async
        if a.cluster is not None:
            if not a._closed:
                a._closed = True
                if a._running and not a.cluster._closed:
                    # runs of other threads, on the cluster's I/O loop: cancelled there,
                    # each aborted on every worker before this returns
                    a.cluster._io.call(a._cancel_running())
                a.cluster._release(a._sid)
            a._closed = True
        if self._loop is None:
            a._closed = True        # an inline run in flight stops at its next check
            a._inline_runs_stopped()
            return
        if a.cluster is None:
            # runs of other threads on this session's loop: cancelled there now (the loop
            # may be driven by one of them, which lets go of it when its run has unwound)
            a._closed = True
            loop = self._loop
            for t in list(a._running):
                if t is not None and t not in a._cancelled_by_close:
                    a._cancelled_by_close.add(t)
                    loop.call_soon_threadsafe(t.cancel)
        self._call(a.close())
        with self._lock:
            # a run another thread drives (cancelled above) lets go of the loop first
            if self._driver is not threading.current_thread():
                self._driven.wait_for(lambda: self._driver is None, timeout=10)
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._thread = None
        if not self._loop.is_running():
            self._loop.close()
        self._loop = None
        a._inline_runs_stopped()

    def __del__(self) -> None:
        # let go of unclosed (as a TensorFlow session, it is closed then): its loop and
        # the loop's thread go (its AsyncSession, going too, releases its cluster session)
        loop = getattr(self, "_loop", None)
        if loop is None:
            return
        if self._thread is not None:
            with contextlib.suppress(RuntimeError):     # (closed at interpreter exit)
                loop.call_soon_threadsafe(loop.stop)    # the thread closes it (_serve)
        elif not loop.is_running():
            loop.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """A session's loop thread: runs its loop until stopped, then closes it."""
    loop.run_forever()
    loop.close()


def _call_on_io(io: Any, coro: Any) -> Any:
    """io.call(coro) (a cluster's I/O loop, in its own thread), with Ctrl-C handled as in
    _run_to_end, so both paths behave alike: the first SIGINT cancels the run, which
    unwinds on the I/O loop (the step aborted on every worker), and KeyboardInterrupt is
    raised here, once, when it has -- not while the run's client-side py_funcs still run
    in the I/O thread beside the caller's handler; a second raises where it lands."""
    run = io.start(coro)

    def cancel() -> None:
        if run.done.done():         # (over already: the interrupt goes out where it lands)
            raise KeyboardInterrupt
        run.cancel()

    with Interrupt(cancel) as intr:
        try:
            return intr.settle(run.done.result, concurrent.futures.CancelledError)
        except BaseException:
            if not run.done.done():     # (a second interrupt: cancel, without waiting)
                with contextlib.suppress(RuntimeError):
                    run.cancel()
            raise


def _run_to_end(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    """loop.run_until_complete(coro), with Ctrl-C made safe for the loop
    (dcf/interrupts.py): the first SIGINT cancels the run's task, which unwinds at its next
    yield (its partitions cancelled, the step aborted), and KeyboardInterrupt is raised
    here, once, so that the session's next run or close finds no half-run step. A second
    SIGINT before that raises where it lands; the run is then unwound as far as it can
    be."""
    task = loop.create_task(coro)

    def cancel() -> None:
        if task.done():     # (over already: the interrupt goes out where it lands)
            raise KeyboardInterrupt
        task.cancel()
        loop.call_soon_threadsafe(_wake)   # (a loop asleep in select wakes to act on it)

    with Interrupt(cancel) as intr:
        try:
            return intr.settle(lambda: loop.run_until_complete(task), asyncio.CancelledError)
        except BaseException:
            if not task.done():
                task.cancel()
                try:
                    loop.run_until_complete(task)
                except (asyncio.CancelledError, Exception):
                    pass
            elif not task.cancelled():
                task.exception()              # retrieved: no "never retrieved" report
            raise


def _deadline(options: RunOptions) -> float | None:
    return None if options.timeout_s is None else time.monotonic() + options.timeout_s


async def _within(aw: Any, options: RunOptions, deadline: float | None,
                  ends: list[float]) -> Any:
    """`await aw` within options.timeout_s (`deadline`, which its steps also stop at):
    asyncio.TimeoutError past it, also where a step of the run ended late (a kernel held
    the loop past the deadline, and wait_for saw the time only when it got the loop back).
    `ends`: when each step ended (_noting_end), not when this task got the loop back: a
    run whose steps all ended in time is not late because other runs' bursts came before
    its task's turn (its result -- an element it dequeued -- would be lost to its
    caller)."""
    if deadline is None:
        return await aw
    result = await asyncio.wait_for(aw, options.timeout_s)
    if max(ends) > deadline:
        raise asyncio.TimeoutError
    return result


def _noting_end(coro: Any, ends: list[float], options: RunOptions) -> Any:
    """`coro`, noting in `ends` when it ends (only for a run with a timeout_s)."""
    if options.timeout_s is None:
        return coro

    async def noted() -> Any:
        result = await coro
        ends.append(time.monotonic())
        return result

    return noted()


def _late(options: RunOptions) -> DeadlineExceededError:
    """A run that did not end within its timeout_s, stopped at a check or ended late (a
    kernel that ran past the deadline: what it changed, such as a Variable it assigned,
    stays changed, as in TensorFlow)."""
    return DeadlineExceededError(f"run did not finish within timeout_s={options.timeout_s}; "
                                 "the session is still usable")


_DEFAULT_HEARTBEAT_S = SessionConfig.heartbeat_timeout_s

_NOTHING = contextlib.nullcontext()    # (reusable: it keeps no state)
_NEVER_INTERRUPTED = Interrupt()       # (never entered: `requested` stays False)


def _wake() -> None:
    """A no-op callback: scheduling it wakes the loop."""


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()
