"""One asyncio actor per device: owns the device's resources and runs its partition's
executor for each step in bounded bursts, yielding to the event loop between them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from dcf.executor import Executor
from dcf.plan import ExecPlan
from dcf.resources import DeviceResources
from dcf.token import DEAD

__all__ = ["DeviceActor"]

_BURST = 512            # nodes fired between checks of the clock
_YIELD_EVERY_S = 0.002  # hand the event loop back at least this often


class DeviceActor:
    """The actor of one device of one session."""

    def __init__(self, device: str, resources: DeviceResources | None = None) -> None:
        self.device = device
        self.resources = resources or DeviceResources(device)

    async def run_step(self, plan: ExecPlan, feeds: list, step: Any, rendezvous: Any, *,
                       trace: bool = False, compiled: bool = True) -> Executor:
        """Run one step of `plan`; return the finished executor (results, trace)."""
        ex = Executor(plan, trace=trace, step_id=step, compiled=compiled)
        loop = asyncio.get_running_loop()
        wake: list[asyncio.Future | None] = [None]

        def poke() -> None:
            f = wake[0]
            if f is not None and not f.done():
                f.set_result(None)

        def on_value(node: Any, ist: Any):
            def cb(value: Any) -> None:
                ex.deliver_recv(node, ist, value)
                poke()
            return cb

        async def wait_then_resume(node: Any, ist: Any, waitable: Any) -> None:
            await waitable
            ex.resume(node, ist)
            poke()

        waits: list[asyncio.Task] = []
        ex.start(feeds)
        last_yield = time.perf_counter()
        try:
            while True:
                ex.run(_BURST)
                if ex.outbox:
                    out, ex.outbox = ex.outbox, []
                    for item in out:
                        kind = item[0]
                        if kind == "send":
                            _, node, ist, v = item
                            attrs = node.pnode.attrs
                            if attrs.get("ctrl") and v is not DEAD:
                                v = True
                            peer = attrs.get("peer")
                            if peer is None:
                                rendezvous.send((step, attrs["edge"], ist.tag), v)
                            else:  # its Recv lives in another process
                                rendezvous.remote_send(peer, (step, attrs["edge"], ist.tag), v)
                        elif kind == "recv":
                            _, node, ist = item
                            rendezvous.recv((step, node.pnode.attrs["edge"], ist.tag),
                                            on_value(node, ist))
                        else:
                            _, node, ist, waitable = item
                            waits.append(loop.create_task(wait_then_resume(node, ist, waitable)))
                if ex.done:
                    return ex
                if ex.ready:
                    now = time.perf_counter()
                    if now - last_yield > _YIELD_EVERY_S:
                        await asyncio.sleep(0)
                        last_yield = time.perf_counter()
                    continue
                wake[0] = loop.create_future()
                await wake[0]
                wake[0] = None
                last_yield = time.perf_counter()
        finally:
            for t in waits:
                if not t.done():
                    t.cancel()
