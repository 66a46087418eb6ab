"""FIFOQueue: state on its device that producer and consumer runs share.

A dequeue on an empty queue (or an enqueue on a full one) suspends only that op: its
kernel raises WouldBlock with a future, the device actor awaits it and everything
else in the run keeps going. An enqueue from any run wakes the waiters.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import numpy as np

from dcf import dtypes
from dcf.errors import InvalidArgumentError, OutOfRangeError
from dcf.token import WouldBlock
from dcf.graph import Operation, Tensor, TensorType
from dcf.ops.registry import Kind, OpDef, apply, convert_to_tensor, not_differentiable, register

__all__ = ["FIFOQueue"]


class QueueStore:
    """The elements of one queue and the futures of ops waiting on it."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.items: deque = deque()
        self.closed = False
        self._waiters: list[asyncio.Future] = []

    def _wait(self) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    def put(self, elems: list[tuple]) -> None:
        if self.closed:
            raise InvalidArgumentError(f"enqueue to closed queue '{self.name}'")
        if len(self.items) + len(elems) > self.capacity and self.items:
            raise WouldBlock(self._wait())
        self.items.extend(elems)
        self._wake()

    def take(self, n: int | None) -> list[tuple]:
        want = 1 if n is None else n
        if len(self.items) >= want:
            out = [self.items.popleft() for _ in range(want)]
            self._wake()
            return out
        if self.closed:
            raise OutOfRangeError(f"queue '{self.name}' is closed and has {len(self.items)} "
                                  f"elements, fewer than the {want} requested")
        raise WouldBlock(self._wait())

    def close(self) -> None:
        self.closed = True
        self._wake()


def _handle(xp, *, res, node_name, queue_name, capacity):
    return res.queue(queue_name, lambda: QueueStore(queue_name, capacity))


def _enqueue(xp, q, *vals, many):
    if many:
        n = np.shape(vals[0])[0]
        q.put([tuple(v[i] for v in vals) for i in range(n)])
    else:
        q.put([tuple(vals)])
    return ()


def _dequeue(xp, q, *, n, dtypes_, shapes=None):
    elems = q.take(n)
    if n is None:
        out = elems[0]
    else:
        out = tuple(np.stack([np.asarray(e[k]) for e in elems]) for k in range(len(dtypes_)))
    return out if len(out) > 1 else out[0]


def _size(xp, q):
    return np.int32(len(q.items))


def _close(xp, q):
    q.close()
    return ()


register(OpDef("FIFOQueueV2", infer=lambda **kw: TensorType(dtypes.resource, ()), kernel=_handle,
               resource=True, host_only=True))
register(OpDef("QueueEnqueueV2", infer=lambda q, *v, many: [], kernel=_enqueue, kind=Kind.ASYNC,
               stateful=True))
register(OpDef("QueueDequeueV2", kernel=_dequeue, kind=Kind.ASYNC, stateful=True,
               infer=lambda q, *, n, dtypes_, shapes: [
                   TensorType(dt, None if shp is None else ((n,) if n is not None else ())
                              + tuple(shp)) for dt, shp in zip(dtypes_, shapes)]))
register(OpDef("QueueSizeV2", infer=lambda q: TensorType(dtypes.int32, ()), kernel=_size,
               stateful=True))
register(OpDef("QueueCloseV2", infer=lambda q: [], kernel=_close, stateful=True))
not_differentiable("FIFOQueueV2", "QueueEnqueueV2", "QueueDequeueV2", "QueueSizeV2",
                   "QueueCloseV2")


class FIFOQueue:
    """A first-in first-out queue of tuples of tensors, living on its device.

    `enqueue(vals)` / `enqueue_many(vals)` add elements; `dequeue()` /
    `dequeue_many(n)` take them, waiting (only that op) while the queue is empty;
    `close()` makes waiting and later dequeues fail with OutOfRangeError once empty.
    """

    def __init__(self, capacity: int, dtypes: Any, shapes: Any = None,
                 name: str | None = None) -> None:
        from dcf.graph import get_default_graph
        from dcf.dtypes import as_dtype

        single = not isinstance(dtypes, (list, tuple))
        self.dtypes = [as_dtype(d) for d in ([dtypes] if single else dtypes)]
        self.shapes = [None] * len(self.dtypes) if shapes is None else \
            [tuple(s) for s in ([shapes] if single else shapes)]
        g = get_default_graph()
        with g.name_scope(name or "fifo_queue") as scope:
            self.name = scope.rstrip("/")
            self.handle = apply("FIFOQueueV2", [], name="handle", queue_name=self.name,
                                capacity=int(capacity))

    def _vals(self, vals: Any) -> list[Tensor]:
        vals = list(vals) if isinstance(vals, (list, tuple)) else [vals]
        if len(vals) != len(self.dtypes):
            raise ValueError(f"queue '{self.name}' holds {len(self.dtypes)} components, got "
                             f"{len(vals)}")
        return [convert_to_tensor(v, dtype=d) for v, d in zip(vals, self.dtypes)]

    def enqueue(self, vals: Any, name: str | None = None) -> Operation:
        return apply("QueueEnqueueV2", [self.handle] + self._vals(vals), name=name or "enqueue",
                     many=False)

    def enqueue_many(self, vals: Any, name: str | None = None) -> Operation:
        return apply("QueueEnqueueV2", [self.handle] + self._vals(vals),
                     name=name or "enqueue_many", many=True)

    def _dequeue(self, n: int | None, name: str) -> Any:
        out = apply("QueueDequeueV2", [self.handle], name=name, n=n, dtypes_=self.dtypes,
                    shapes=self.shapes)
        if isinstance(out, tuple) and len(out) == 1:
            return out[0]
        return list(out) if isinstance(out, tuple) else out

    def dequeue(self, name: str | None = None) -> Any:
        return self._dequeue(None, name or "dequeue")

    def dequeue_many(self, n: int, name: str | None = None) -> Any:
        return self._dequeue(int(n), name or "dequeue_many")

    def size(self, name: str | None = None) -> Tensor:
        return apply("QueueSizeV2", [self.handle], name=name or "size")

    def close(self, name: str | None = None) -> Operation:
        return apply("QueueCloseV2", [self.handle], name=name or "close")
