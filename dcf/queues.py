"""FIFOQueue: state on its device that producer and consumer runs share.

A dequeue on an empty queue (or an enqueue on a full one) suspends only that op: its
kernel raises WouldBlock with a future, the device actor awaits it and everything
else in the run keeps going. An enqueue from any run wakes the waiters.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

import numpy as np

from dcf import dtypes
from dcf.errors import CancelledError, InvalidArgumentError, OutOfRangeError
from dcf.token import WouldBlock
from dcf.graph import (
    Operation, Tensor, TensorType, get_default_graph, shape_str, shapes_compatible,
)
from dcf.ops import state_ops
from dcf.ops.registry import (
    Kind, OpDef, apply, constant_value, convert_in, not_differentiable, register,
)

__all__ = ["FIFOQueue"]


class QueueStore:
    """The elements of one queue and the futures of ops waiting on it.

    Runs of an AsyncSession in several threads' event loops share it: its state changes
    under a lock, and a waiter of another loop is woken through that loop. A put wakes
    the waiting takes, a take the waiting puts (a close both). A waiting take lets puts
    fill the queue past the capacity by as many elements as it waits for: TF's
    dequeue_many(n) takes elements as they come, making room for the rest."""

    _PRUNE_AT = 64      # waiters kept before those given up on (timed out) are dropped

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity if capacity >= 0 else float("inf")    # TF: < 0, no limit
        self.items: deque = deque()
        self.closed = False
        self._waiters: list[tuple[asyncio.Future, int]] = []     # takes: (future, count)
        self._putters: list[tuple[asyncio.Future, int]] = []
        self._lock = threading.Lock()

    def put(self, elems: list[tuple]) -> None:
        with self._lock:
            if self.closed:
                raise CancelledError(f"enqueue to queue '{self.name}': it is closed")
            # (more elements than can ever fit go in whole once the queue is empty)
            n = len(self.items) + len(elems)
            if self.items and n > self.capacity and n > self._limit():
                raise WouldBlock(_wait(self._putters, len(elems)))
            self.items.extend(elems)
            self._waiters = _wake(self._waiters)

    def _limit(self) -> float:
        # (in TF the waiting takes would hold these elements, in turn, and the queue
        # what is left over)
        return self.capacity + sum(n for f, n in self._waiters if not f.done())

    def take(self, n: int | None) -> list[tuple]:
        want = 1 if n is None else n
        with self._lock:
            if len(self.items) >= want:
                if n:
                    self._check_stackable(want)
                out = [self.items.popleft() for _ in range(want)]
                self._putters = _wake(self._putters)
                return out
            if self.closed:
                raise OutOfRangeError(f"queue '{self.name}' is closed and has "
                                      f"{len(self.items)} elements, fewer than the {want} "
                                      "requested")
            fut = _wait(self._waiters, want)
            self._putters = _wake(self._putters)    # (there may be room for them now)
            raise WouldBlock(fut)

    def _check_stackable(self, n: int) -> None:
        """The first n elements stack into one array per component (the queue's shapes
        may leave dimensions open): else an error, and they stay in the queue."""
        first = [self.items[i] for i in range(n)]
        for k in range(len(first[0])):
            shapes = [np.shape(e[k]) for e in first]
            odd = next((s for s in shapes if s != shapes[0]), None)
            if odd is not None:
                raise InvalidArgumentError(
                    f"dequeue_many({n}) from queue '{self.name}': shape mismatch in "
                    f"component {k}: elements of shapes {list(shapes[0])} and {list(odd)} "
                    "cannot be stacked (they stay in the queue)")

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._waiters = _wake(self._waiters)
            self._putters = _wake(self._putters)


def _wait(waiters: list[tuple[asyncio.Future, int]], count: int) -> asyncio.Future:
    """A new future of an op waiting for `count` elements (or room for them), appended
    to `waiters` (from which those given up on are dropped once there are many)."""
    fut = asyncio.get_running_loop().create_future()
    if len(waiters) >= QueueStore._PRUNE_AT:
        waiters[:] = [(f, n) for f, n in waiters if not f.done()]
    waiters.append((fut, count))
    return fut


def _wake(waiters: list[tuple[asyncio.Future, int]]) -> list:
    """Wake the waiting ops (each retries); returns the new, empty list of waiters."""
    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    for f, _ in waiters:
        loop = f.get_loop()
        if loop is here:
            _set_if_waiting(f)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(_set_if_waiting, f)
    return []


def _set_if_waiting(fut: asyncio.Future) -> None:
    if not fut.done():      # (not given up on: a run that timed out cancels it)
        fut.set_result(None)


def _handle(xp, *, res, node_name, queue_name, capacity):
    return res.queue(queue_name, lambda: QueueStore(queue_name, capacity))


def _fits(shape: tuple, want: tuple | None) -> bool:
    """Whether `shape` is one the queue declared (None: any; a None dim: any size)."""
    return want is None or state_ops._fits(shape, want)


def _enqueue(xp, q, *vals, many, shapes=None):
    shapes = shapes or [None] * len(vals)
    if many:
        if any(np.ndim(v) == 0 for v in vals):
            k = next(k for k, v in enumerate(vals) if np.ndim(v) == 0)
            raise InvalidArgumentError(f"enqueue_many to queue '{q.name}': component {k} is a "
                                       "scalar; each component needs a first dimension to split")
        lens = [np.shape(v)[0] for v in vals]
        if len(set(lens)) > 1:
            raise InvalidArgumentError(f"enqueue_many to queue '{q.name}': the components have "
                                       f"different first dimensions {lens}")
        for k, (v, want) in enumerate(zip(vals, shapes)):
            if not _fits(tuple(np.shape(v)[1:]), want):
                raise InvalidArgumentError(
                    f"enqueue_many to queue '{q.name}': shape mismatch in component {k}: "
                    f"expected elements of shape {shape_str(want)}, got a value of shape "
                    f"{list(np.shape(v))}")
        q.put([tuple(v[i] for v in vals) for i in range(lens[0] if lens else 0)])
    else:
        for k, (v, want) in enumerate(zip(vals, shapes)):
            if not _fits(tuple(np.shape(v)), want):
                raise InvalidArgumentError(
                    f"enqueue to queue '{q.name}': shape mismatch in component {k}: expected "
                    f"{shape_str(want)}, got {list(np.shape(v))}")
        q.put([tuple(vals)])
    return ()


def _dequeue(xp, q, *, n, dtypes_, shapes=None):
    elems = q.take(n)
    if n is None:
        out = elems[0]
    elif not elems:     # dequeue_many(0): empty arrays of the declared shapes
        shapes = shapes or [None] * len(dtypes_)
        if any(s is None or None in s for s in shapes):
            raise InvalidArgumentError(f"dequeue_many(0) from queue '{q.name}' needs fully "
                                       "defined component shapes")
        out = tuple(np.zeros((0,) + tuple(s), dt.np) for s, dt in zip(shapes, dtypes_))
    else:
        out = tuple(np.stack([np.asarray(e[k]) for e in elems]) for k in range(len(dtypes_)))
    return out if len(out) > 1 else out[0]


def _dequeue_many(xp, q, n, *, dtypes_, shapes=None):
    """dequeue_many with the count a tensor: known only when the op runs."""
    n = int(n)
    if n < 0:
        raise InvalidArgumentError(f"dequeue_many from queue '{q.name}': n must be >= 0, "
                                   f"got {n}")
    return _dequeue(xp, q, n=n, dtypes_=dtypes_, shapes=shapes)


def _dequeue_many_infer(q: TensorType, n: TensorType, *, dtypes_: list,
                        shapes: list) -> list[TensorType]:
    if not n.dtype.is_integer or n.shape not in (None, ()):
        raise TypeError(f"n must be a scalar int32/int64 tensor, got {n}")
    return [TensorType(dt, None if shp is None else (None,) + tuple(shp))
            for dt, shp in zip(dtypes_, shapes)]


def _size(xp, q):
    return np.int32(len(q.items))


def _close(xp, q):
    q.close()
    return ()


register(OpDef("FIFOQueueV2", infer=lambda **kw: TensorType(dtypes.resource, ()), kernel=_handle,
               resource=True, host_only=True))
register(OpDef("QueueEnqueueV2", infer=lambda q, *v, many, shapes=None: [], kernel=_enqueue,
               kind=Kind.ASYNC, stateful=True))
register(OpDef("QueueDequeueV2", kernel=_dequeue, kind=Kind.ASYNC, stateful=True,
               infer=lambda q, *, n, dtypes_, shapes: [
                   TensorType(dt, None if shp is None else ((n,) if n is not None else ())
                              + tuple(shp)) for dt, shp in zip(dtypes_, shapes)]))
register(OpDef("QueueDequeueManyV2", kernel=_dequeue_many, kind=Kind.ASYNC, stateful=True,
               infer=_dequeue_many_infer))
register(OpDef("QueueSizeV2", infer=lambda q: TensorType(dtypes.int32, ()), kernel=_size,
               stateful=True))
register(OpDef("QueueCloseV2", infer=lambda q: [], kernel=_close, stateful=True))
not_differentiable("FIFOQueueV2", "QueueEnqueueV2", "QueueDequeueV2", "QueueDequeueManyV2",
                   "QueueSizeV2", "QueueCloseV2")


def _one_shape(shapes: Any, single: bool) -> bool:
    """TF's reading of `shapes`: a list of dimensions is one shape (of a one-dtype
    queue), a list of lists (or Nones: any shape) one shape per component."""
    if not isinstance(shapes, (list, tuple)):
        return single
    dims = [d is None or (isinstance(d, (int, np.integer)) and not isinstance(d, bool))
            for d in shapes]
    return all(dims) and (single or any(d is not None for d in shapes))


class FIFOQueue:
    """A first-in first-out queue of tuples of tensors, living on its device.

    `enqueue(vals)` / `enqueue_many(vals)` add elements; `dequeue()` /
    `dequeue_many(n)` take them, waiting (only that op) while the queue is empty;
    `close()` makes waiting and later dequeues fail with OutOfRangeError once empty,
    and enqueues fail with CancelledError.
    With `shapes` (one per component; None for a dimension of any size), an element of
    another shape is refused: a ValueError when the enqueue is built where its shape is
    known, else an InvalidArgumentError when it runs.
    A negative `capacity` is no limit (TF's). A waiting `dequeue_many(n)` lets enqueues
    fill the queue past the capacity by n (TF's takes elements as they come);
    an `enqueue_many` of more elements than the capacity waits for the queue to be empty
    and goes in whole (TF's goes in pieces as room is made). In a while_loop, the
    enqueues and dequeues of the body run in iteration order, whatever
    `parallel_iterations` says.
    """

    def __init__(self, capacity: int, dtypes: Any, shapes: Any = None,
                 name: str | None = None) -> None:
        from dcf.dtypes import as_dtype

        single = not isinstance(dtypes, (list, tuple))
        self.dtypes = [as_dtype(d) for d in ([dtypes] if single else dtypes)]
        g = get_default_graph()
        with g.name_scope(name or "fifo_queue") as scope:
            self.name = scope.rstrip("/")
            self.shapes = self._shapes(shapes, single)
            self.handle = apply("FIFOQueueV2", [], name="handle", queue_name=self.name,
                                capacity=self._capacity(capacity))

    def _capacity(self, capacity: Any) -> int:
        if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity,
                                                                    (int, np.integer)):
            raise TypeError(f"FIFOQueue '{self.name}': capacity must be an int, got "
                            f"{capacity!r}")
        if capacity == 0:
            raise ValueError(f"FIFOQueue '{self.name}': capacity 0 holds nothing (every "
                             "enqueue would wait for good); a negative capacity is no limit")
        return int(capacity)

    def _shapes(self, shapes: Any, single: bool) -> list:
        if shapes is None:
            return [None] * len(self.dtypes)
        shapes = [shapes] if _one_shape(shapes, single) else list(shapes)
        if len(shapes) != len(self.dtypes):
            raise ValueError(f"FIFOQueue '{self.name}': shapes must have one entry per dtype, "
                             f"got {len(shapes)} shapes for {len(self.dtypes)} dtypes")
        out = []
        for k, s in enumerate(shapes):
            if s is None:
                out.append(None)
                continue
            if not isinstance(s, (list, tuple)):
                raise TypeError(f"FIFOQueue '{self.name}': the shape of component {k} must "
                                f"be a list of dimensions, got {s!r}")
            dims = tuple(None if d is None or d == -1 else int(d) for d in s)
            if any(d is not None and d < 0 for d in dims):
                raise ValueError(f"FIFOQueue '{self.name}': invalid shape {list(s)} (dimensions "
                                 "are >= 0, or None for any size)")
            out.append(dims)
        return out

    def _vals(self, vals: Any, op: str, many: bool) -> list[Tensor]:
        vals = list(vals) if isinstance(vals, (list, tuple)) else [vals]
        if len(vals) != len(self.dtypes):
            raise ValueError(f"{op}: queue '{self.name}' holds {len(self.dtypes)} components, "
                             f"got {len(vals)}")
        g = self.handle.graph
        out = []
        for k, (v, d) in enumerate(zip(vals, self.dtypes)):
            try:
                out.append(convert_in(v, g, d))
            except TypeError as e:
                raise TypeError(f"{op}: component {k} of queue '{self.name}': {e}") from None
        self._check_static(out, op, many)
        return out

    def _check_static(self, ts: list[Tensor], op: str, many: bool) -> None:
        """Shapes known at build time must be the declared ones (TF's ValueError)."""
        firsts = set()
        for k, (t, want) in enumerate(zip(ts, self.shapes)):
            s = t.shape
            if s is None:
                continue
            if many:
                if not s:
                    raise ValueError(f"{op}: component {k} is a scalar; enqueue_many needs a "
                                     "first dimension to split into elements")
                if s[0] is not None:
                    firsts.add(s[0])
                s = s[1:]
            if want is not None and not shapes_compatible(s, want):
                raise ValueError(f"{op}: component {k} has {'elements of ' if many else ''}"
                                 f"shape {shape_str(s)}, queue '{self.name}' holds "
                                 f"{shape_str(want)}")
        if len(firsts) > 1:
            raise ValueError(f"{op}: the components have different first dimensions "
                             f"{sorted(firsts)}; enqueue_many needs one element count")

    def _enqueue(self, vals: Any, name: str, many: bool) -> Operation:
        op = f"QueueEnqueueV2 '{self.handle.graph._scope}{name}'"
        return apply("QueueEnqueueV2", [self.handle] + self._vals(vals, op, many), name=name,
                     many=many, shapes=self.shapes)

    def enqueue(self, vals: Any, name: str | None = None) -> Operation:
        return self._enqueue(vals, name or "enqueue", False)

    def enqueue_many(self, vals: Any, name: str | None = None) -> Operation:
        """Enqueue `vals[k][i]` for every i: components split along their first dimension,
        which must be the same for all."""
        return self._enqueue(vals, name or "enqueue_many", True)

    def _dequeue(self, n: int | None, name: str) -> Any:
        out = apply("QueueDequeueV2", [self.handle], name=name, n=n, dtypes_=self.dtypes,
                    shapes=self.shapes)
        return self._unpack(out)

    @staticmethod
    def _unpack(out: Any) -> Any:
        if isinstance(out, tuple) and len(out) == 1:
            return out[0]
        return list(out) if isinstance(out, tuple) else out

    def dequeue(self, name: str | None = None) -> Any:
        return self._dequeue(None, name or "dequeue")

    def dequeue_many(self, n: Any, name: str | None = None) -> Any:
        """`n` elements, each component stacked; n an int, or a scalar int tensor."""
        name = name or "dequeue_many"
        what = f"QueueDequeueManyV2 '{self.handle.graph._scope}{name}'"
        known = constant_value(n) if hasattr(n, "_as_tensor") or isinstance(n, Tensor) else n
        if known is None:       # known only when the op runs
            out = apply("QueueDequeueManyV2", [self.handle, n], name=name,
                        dtypes_=self.dtypes, shapes=self.shapes)
            return self._unpack(out)
        if isinstance(known, (bool, np.bool_)) or np.ndim(known) != 0 or \
                np.asarray(known).dtype.kind not in "iu":
            raise TypeError(f"{what}: n must be an int or a scalar int tensor, got {n!r}")
        if int(known) < 0:
            raise ValueError(f"{what}: n must be >= 0, got {int(known)}")
        return self._dequeue(int(known), name)

    def size(self, name: str | None = None) -> Tensor:
        return apply("QueueSizeV2", [self.handle], name=name or "size")

    def close(self, cancel_pending_enqueues: bool = False, name: str | None = None
              ) -> Operation:
        """Later enqueues fail (CancelledError, as TF's); dequeues take what is left,
        then fail with OutOfRangeError. An enqueue waiting on a full queue fails too,
        whatever `cancel_pending_enqueues` says (TF lets it finish when room is made,
        and its close waits for that: a close that can hang)."""
        if not isinstance(cancel_pending_enqueues, (bool, np.bool_)):
            raise TypeError(f"FIFOQueue '{self.name}'.close(cancel_pending_enqueues=...) "
                            f"takes True or False, got {cancel_pending_enqueues!r}")
        return apply("QueueCloseV2", [self.handle], name=name or "close")
