"""LocalRendezvous: delivery to waiting Recvs, and consumers woken once per batch."""

from __future__ import annotations

from dcf.actors.rendezvous import LocalRendezvous


class Consumer:
    """Stands in for a device actor's step: registers callbacks, counts wake-ups."""

    def __init__(self, rv: LocalRendezvous) -> None:
        self.rv = rv
        self.got: list = []
        self.woken = 0
        self.queued = False

    def want(self, key: tuple) -> None:
        def cb(value):
            self.got.append((key, value))
            batch = self.rv.deferred
            if batch is not None:
                if not self.queued:
                    self.queued = True
                    batch.append(self)
                return
            self.on_values()
        self.rv.recv(key, cb)

    def on_values(self) -> None:
        self.queued = False
        self.woken += 1


def test_values_of_one_message_wake_their_consumer_once():
    rv = LocalRendezvous()
    c = Consumer(rv)
    c.want((1, "a", ()))
    c.want((1, "b", ()))
    rv.deliver_all([((1, "a", ()), 1.0), ((1, "b", ()), 2.0)])
    assert c.got == [((1, "a", ()), 1.0), ((1, "b", ()), 2.0)] and c.woken == 1


def test_held_deliveries_wake_each_consumer_once_at_release():
    rv = LocalRendezvous()
    c0, c1 = Consumer(rv), Consumer(rv)
    for k in range(3):
        c0.want((1, f"x{k}", ()))
    c1.want((1, "y", ()))
    rv.hold()
    rv.send((1, "x0", ()), 0)                      # one message of one value
    rv.deliver_all([((1, "x1", ()), 1), ((1, "y", ()), 9)])   # one of several
    rv.send((1, "x2", ()), 2)
    assert len(c0.got) == 3 and len(c1.got) == 1   # delivered at once ...
    assert c0.woken == c1.woken == 0               # ... acted on later
    rv.release()
    assert c0.woken == 1 and c1.woken == 1 and rv.deferred is None
    rv.send((1, "late", ()), 5)                     # no waiter: kept for a later recv
    c0.want((1, "late", ()))
    assert c0.woken == 2                            # not held any more: at once


def test_release_without_deliveries_is_harmless():
    rv = LocalRendezvous()
    rv.hold()
    rv.hold()
    rv.release()
    rv.release()
    assert rv.deferred is None
