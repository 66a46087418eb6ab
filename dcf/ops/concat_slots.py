"""Concatenation buffers made early by the producers of their parts (GPU).

An LSTM step concatenates its input with the previous step's h, `[x, h] @ W`, and keeps
the concatenation for the backward pass: per layer and step one [batch, d + u] array
and two strided copies into it. Where the graph shows that h is next read as the last
part of such a concatenation (`dcf.fusion.matmul_gates`), the fused product-and-gates
call allocates that buffer itself, has the gates' kernel write h into its last u
columns, returns h as a view of them and *offers* the buffer here, under the
concatenation's node. Where the layer below (same GPU) computes that concatenation's x
afterwards, its gates' kernel writes its h into the offered buffer's first columns as
well and *fills* the offer with that value. The concatenation, when it finds its last
input offered, *claims* the buffer and copies only the parts not already in it: in a
stack of layers on one GPU, no copy at all. One allocation and one or two strided copies
fewer per layer and step, on a host that paces multi-GPU loops (bench/NOTES.md, "GPU,
session 11").

An offer is claimed at most once (a second concatenation of the same h copies as
usual), a producer withdraws its previous offer when it makes a new one, and a device's
offers are dropped at the end of each step and when memory is short, so no buffer
outlives its step here. Nothing writes into a buffer on offer but its filler, into
columns the view does not cover; a claim copies every part whose value is not the one
the filler wrote."""

from __future__ import annotations

from typing import Any

__all__ = ["Offer", "offer", "withdraw", "claim", "open_offer", "clear", "pending"]


class Offer:
    """A buffer whose columns from `lead` on hold `view` (= buf[:, lead:]), for the
    concatenation whose key (its plan node's id()) is `concat`; `filled`: the value
    written into its first columns by the layer below, if any."""

    __slots__ = ("view", "buf", "lead", "device", "concat", "filled")

    def __init__(self, view: Any, buf: Any, lead: int, device: int, concat: int) -> None:
        self.view, self.buf, self.lead = view, buf, lead
        self.device, self.concat = device, concat
        self.filled = None


_offers: dict[int, Offer] = {}          # id(view) -> its offer
_by_concat: dict[int, Offer] = {}       # concatenation key -> its open offer
claims = [0]                            # offers claimed so far (tests read this)


def offer(device: int, view: Any, buf: Any, lead: int, concat: int = -1) -> int:
    """`view` is buf[:, lead:]: a concatenation (key `concat`) whose last input it is
    may take `buf`. Returns the offer's key (for `withdraw`)."""
    key = id(view)
    o = _offers[key] = Offer(view, buf, lead, device, concat)
    if concat >= 0:
        _by_concat[concat] = o
    return key


def _end(o: Offer) -> None:
    if _by_concat.get(o.concat) is o:
        _by_concat.pop(o.concat, None)


def withdraw(key: int) -> None:
    """End an offer if it is still open (it may have been claimed: then nothing)."""
    o = _offers.pop(key, None)
    if o is not None:
        _end(o)


def open_offer(concat: int) -> Offer | None:
    """The open offer for the concatenation keyed `concat` (for the layer below to
    fill)."""
    return _by_concat.get(concat)


def claim(view: Any) -> Offer | None:
    """The offer of `view`, if it is open (the offer ends), else None."""
    o = _offers.pop(id(view), None)
    if o is None:
        return None
    _end(o)
    if o.view is not view:        # (not reachable while the entry holds its view)
        return None
    claims[0] += 1
    return o


def clear(device: int) -> None:
    """Drop the device's open offers (end of a step, memory short)."""
    if _offers:
        for k, o in list(_offers.items()):    # (other threads may offer meanwhile)
            if o.device == device and _offers.pop(k, None) is not None:
                _end(o)


def pending(device: int) -> int:
    """The device's open offers (tests read this)."""
    return sum(1 for o in list(_offers.values()) if o.device == device)
