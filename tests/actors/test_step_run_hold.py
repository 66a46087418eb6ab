"""_StepRun.hold: when a value for another process leaves. A value of the oldest live
iteration leaves at the end of the pump if the partition waits for answers by then,
even when the Recv that makes it wait registered after the Send fired (the hold timer
would otherwise keep it for _HOLD_S); values of iterations running ahead still wait."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace as NS

from dcf.actors import device_actor as da

PEER = "/job:worker/task:1"


class _Rendezvous:
    def __init__(self) -> None:
        self.sent: list = []
        self.waiting_on: list = []
        self.remote_send_batch = None

    def remote_send(self, peer, key, value) -> None:
        self.sent.append((peer, key, value))

    def recv(self, key, callback) -> None:
        self.waiting_on.append(key)


class _Executor:
    """Hands the step run one burst: the given outbox items, then nothing is ready."""

    def __init__(self, items: list) -> None:
        self.items = items
        self.outbox: list = []
        self.done = False
        self.ready = False
        self.break_on_send = False

    def run(self, budget) -> None:
        self.outbox, self.items = self.items, []


def _ist(it: int, start: int = 0):
    frame = NS(parent_ist=NS(), start_iter=start)      # a loop frame
    return NS(it=it, frame=frame, tag=("loop", it))


def _send(it: int, start: int = 0):
    node = NS(pnode=NS(attrs={"edge": f"x{it}", "peer": PEER}))
    return ("send", node, _ist(it, start), float(it))


def _recv(it: int):
    node = NS(pnode=NS(attrs={"edge": f"y{it}"}))
    return ("recv", node, _ist(it))


def _pump(items: list):
    async def go():
        rz = _Rendezvous()
        run = da._StepRun(_Executor(items), 7, rz, remote=True)
        run.pump(1.0)
        timer = run.timer
        if timer is not None:
            timer.cancel()
        return rz, run, timer
    return asyncio.run(go())


def test_a_send_of_the_oldest_iteration_before_its_recv_leaves_at_the_pump_end():
    rz, run, timer = _pump([_send(0), _recv(1)])
    assert rz.sent == [(PEER, (7, "x0", ("loop", 0)), 0.0)]
    assert run.held_n == 0 and timer is None and rz.waiting_on


def test_a_send_of_a_later_iteration_still_waits_for_company():
    rz, run, timer = _pump([_send(3, start=0), _recv(1)])   # iteration 3 runs ahead of 0
    assert rz.sent == [] and run.held_n == 1 and timer is not None


def test_a_send_while_nothing_is_awaited_leaves_at_once():
    rz, run, timer = _pump([_send(3, start=0)])
    assert len(rz.sent) == 1 and run.held_n == 0 and timer is None
