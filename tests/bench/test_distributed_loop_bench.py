"""Tests of bench/distributed_loop.py's measuring logic, with fakes in place of a cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_REPO_ROOT = Path(__file__).resolve().parents[2]
if str(_REPO_ROOT) not in sys.path:  # `bench` lives at the repository root
    sys.path.insert(0, str(_REPO_ROOT))

from bench import distributed_loop  # noqa: E402


class _FakeCase(distributed_loop.DcfCase):
    """A loop at 1 µs an iteration whose first run (building the plans) takes 1 s."""

    def __init__(self) -> None:
        self.runs: list[int] = []

    def run(self, n: int) -> float:
        self.runs.append(n)
        return 1.0 if len(self.runs) == 1 else n * 1e-6


@pytest.mark.parametrize("target_s", [0.1, 0.25])
def test_calibration_leaves_the_first_run_out(target_s: float) -> None:
    n = _FakeCase().calibrate(target_s)
    assert n * 1e-6 == pytest.approx(target_s, rel=0.01)


def test_the_printed_and_plotted_rates_are_the_reported_ones() -> None:
    samples, n = [0.5, 1.0, 1.5, 4.0], 100          # an even count: the median interpolates
    shown = distributed_loop._rates(samples, n)
    row = distributed_loop.Result.rate("dcf", "it/s", distributed_loop.Stats.from_samples(
        samples), n)
    assert shown == {"median": pytest.approx(row.median), "p5": pytest.approx(row.p5),
                     "p95": pytest.approx(row.p95)}


class _Timed(_FakeCase):
    """A case for main(): calibrates to 5,000 iterations, then counts its timed runs."""

    made: list[_Timed] = []

    def __init__(self, cluster: object, num_workers: int, barrier: bool) -> None:
        super().__init__()
        _Timed.made.append(self)

    def calibrate(self, target_s: float) -> int:
        return 5000

    def close(self) -> None:
        pass


class _NoCluster:
    def __enter__(self) -> _NoCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.mark.parametrize("quick", [True, False])
def test_the_config_records_the_runs_made(monkeypatch, quick) -> None:
    _Timed.made.clear()
    monkeypatch.setattr(distributed_loop, "DcfCase", _Timed)
    monkeypatch.setattr(distributed_loop.dcf.Cluster, "local", lambda n: _NoCluster())
    monkeypatch.setattr(distributed_loop, "plot", lambda *a: None)
    payload = distributed_loop.main(["--workers", "1", "--no-peer"] +
                                    (["--quick"] if quick else []))
    assert len(_Timed.made) == 2                                         # the two variants
    for case in _Timed.made:
        assert len(case.runs) - 2 == payload["config"]["dcf_repeat"]     # after 2 warm-ups
    assert payload["config"]["iterations"] == {
        "N=1 no barrier": {"dcf": 5000, "tf1": None}, "N=1 barrier": {"dcf": 5000, "tf1": None}}
