"""Tests of bench/gradients.py's measuring logic, with fakes in place of the workloads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_REPO_ROOT = Path(__file__).resolve().parents[2]
if str(_REPO_ROOT) not in sys.path:  # `bench` lives at the repository root
    sys.path.insert(0, str(_REPO_ROOT))

from bench import gradients  # noqa: E402
from bench.harness import Stats  # noqa: E402


@pytest.mark.parametrize("quick", [True, False])
def test_dcf_and_its_peers_take_the_same_samples_of_each_chain(monkeypatch, quick) -> None:
    """A dcf sample and a peer's are both one forward+backward call, and as many of them:
    medians (and minimums) of means over a block and of single calls do not compare."""
    calls: dict[int, int] = {}

    class FakeChain:
        def __init__(self, iters: int = 0, **_: object) -> None:
            self.iters = iters
            calls[iters] = 0

        def call(self, system: str) -> None:
            calls[self.iters] += 1

        def close(self) -> None:
            pass

    peer_repeat: dict[int, int] = {}

    def peer_chain(iters: int, *, repeat: int, warmup: int) -> Stats:
        peer_repeat[iters] = repeat
        return Stats.from_samples([1.0] * repeat)

    monkeypatch.setattr(gradients, "DcfChain", FakeChain)
    monkeypatch.setattr(gradients, "DcfLstm", lambda **kw: FakeChain(-1))
    monkeypatch.setattr(gradients.peers, "torch_grad_chain", peer_chain)
    monkeypatch.setattr(gradients.peers, "torch_lstm_step",
                        lambda *a, **k: Stats.from_samples([1.0]))
    mine = gradients.child_measure({"system": "dcf", "quick": quick})
    theirs = gradients.child_measure({"system": "torch", "quick": quick})
    for n in (3, 1000):
        samples = mine[f"dcf|chain{n}"]["samples"]
        assert len(samples) == peer_repeat[n] == len(theirs[f"torch|chain{n}"]["samples"])
        assert calls[n] == 1 + len(samples)      # one warm-up, then one call per sample


def test_the_stack_meter_counts_every_saved_value_of_the_chain() -> None:
    ch = gradients.DcfChain(3)
    try:
        meter = gradients.stack_memory(ch)
    finally:
        ch.close()
    # two stacks, one 10x10 float32 (400 bytes) pushed on each per iteration; the
    # compiled path pushes past StackStore's methods, where the meter saw nothing
    assert (meter.pushes, meter.peak, meter.live) == (6, 6 * 400, 0)
