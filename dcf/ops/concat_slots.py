"""Concatenation buffers made early by the producer of their last part (GPU).

An LSTM step concatenates its input with the previous step's h, `[x, h] @ W`, and keeps
the concatenation for the backward pass: per layer and step one [batch, d + u] array
and two strided copies into it. Where the graph shows that h is next read as the last
part of such a concatenation (`dcf.fusion.matmul_gates`), the fused product-and-gates
call allocates that buffer itself, has the gates' kernel write h into its last u
columns, returns h as a view of them and *offers* the buffer here. The concatenation,
when it finds its last input offered, *claims* the buffer and copies only the other
parts into it: one copy and one allocation fewer per layer and step, on a host that
paces multi-GPU loops (bench/NOTES.md, "GPU, session 11").

An offer is claimed at most once (a second concatenation of the same h copies as
usual), a producer withdraws its previous offer when it makes a new one, and a device's
offers are dropped at the end of each step and when memory is short, so no buffer
outlives its step here. Nothing writes into a claimed buffer but the claiming
concatenation, into columns the view does not cover."""

from __future__ import annotations

from typing import Any

__all__ = ["offer", "withdraw", "claim", "clear", "pending"]

_offers: dict[int, tuple] = {}      # id(view) -> (view, buf, lead, device)
claims = [0]                        # offers claimed so far (tests read this)


def offer(device: int, view: Any, buf: Any, lead: int) -> int:
    """`view` is buf[:, lead:]: a concatenation whose last input it is may take `buf`.
    Returns the offer's key (for `withdraw`)."""
    key = id(view)
    _offers[key] = (view, buf, lead, device)
    return key


def withdraw(key: int) -> None:
    """End an offer if it is still open (it may have been claimed: then nothing)."""
    _offers.pop(key, None)


def claim(view: Any) -> tuple | None:
    """(buf, lead) if `view` is on offer (the offer ends), else None."""
    e = _offers.pop(id(view), None)
    if e is None:
        return None
    if e[0] is not view:          # (not reachable while the entry holds its view)
        return None
    claims[0] += 1
    return e[1], e[2]


def clear(device: int) -> None:
    """Drop the device's open offers (end of a step, memory short)."""
    if _offers:
        for k in [k for k, e in _offers.items() if e[3] == device]:
            del _offers[k]


def pending(device: int) -> int:
    """The device's open offers (tests read this)."""
    return sum(1 for e in _offers.values() if e[3] == device)
