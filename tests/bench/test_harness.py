"""Tests of the benchmark harness (bench/harness.py); no peer framework needed."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

_REPO_ROOT = Path(__file__).resolve().parents[2]
if str(_REPO_ROOT) not in sys.path:  # `bench` lives at the repository root
    sys.path.insert(0, str(_REPO_ROOT))

from bench import harness
from bench.harness import Result, Stats, base_argparser, percentile, report, time_call


def test_time_call_counts_warmup_and_repeats() -> None:
    calls = []
    stats = time_call(lambda: calls.append(1), repeat=5, warmup=3, number=2)
    assert len(calls) == 3 + 5 * 2
    assert len(stats.samples) == 5
    assert stats.number == 2
    assert stats.min <= stats.p5 <= stats.median <= stats.p95 <= stats.max
    assert all(s >= 0 for s in stats.samples)
    assert stats.extra == {}


def test_time_call_measures_seconds_per_call() -> None:
    import time

    stats = time_call(lambda: time.sleep(0.01), repeat=3, warmup=0, number=2)
    assert 0.009 <= stats.median < 0.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"repeat": 0, "warmup": 0},
        {"repeat": 1, "warmup": -1},
        {"repeat": 1, "warmup": 0, "number": 0},
    ],
)
def test_time_call_rejects_bad_counts(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        time_call(lambda: None, **kwargs)


def test_stats_from_samples_and_percentiles() -> None:
    st = Stats.from_samples([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (st.median, st.min, st.max) == (3.0, 1.0, 5.0)
    assert st.p5 == pytest.approx(1.2)
    assert st.p95 == pytest.approx(4.8)
    assert st.mean == pytest.approx(3.0)
    assert percentile([7.0], 50) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_result_rate_inverts_time_and_swaps_extremes() -> None:
    st = Stats.from_samples([0.5, 1.0, 2.0])
    r = Result.rate("tf1", "loop", st, 100)
    assert r.unit == "it/s"
    assert r.median == pytest.approx(100.0)
    assert r.min == pytest.approx(50.0)  # slowest call -> lowest rate
    assert r.max == pytest.approx(200.0)
    assert r.p5 is not None and r.p95 is not None and r.p5 <= r.median <= r.p95
    ms = Result.from_stats("torch", "step", st)
    assert (ms.median, ms.unit) == (pytest.approx(1000.0), "ms")


def _sample_results() -> list[Result]:
    return [
        Result("dcf", "loop_rate", 1234.5, 1000.0, 1500.0, "it/s", p5=1010.0, p95=1490.0),
        Result("tf1", "loop_rate", 2000.0, 1900.0, 2100.0, "it/s"),
    ]


def test_report_last_line_is_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "sub" / "result.json"
    config = {"n": 1000, "quick": True}
    ratios = {"dcf/tf1": 0.61725, "missing": None}
    report("loop_rate", config, _sample_results(), ratios, str(out))
    printed = capsys.readouterr().out.rstrip("\n").splitlines()
    assert len(printed) > 3  # a table comes first
    assert "dcf" in "\n".join(printed[:-1]) and "it/s" in "\n".join(printed[:-1])
    payload = json.loads(printed[-1])
    assert set(payload) == {"bench", "config", "results", "ratios"}
    assert payload["bench"] == "loop_rate"
    assert payload["config"] == config
    assert payload["ratios"] == ratios
    first = payload["results"][0]
    for key in ("system", "metric", "median", "min", "max", "unit"):
        assert key in first
    assert first["system"] == "dcf" and first["median"] == 1234.5 and first["p5"] == 1010.0
    assert json.loads(out.read_text()) == payload


def test_report_handles_numpy_and_non_finite_values() -> None:
    np = pytest.importorskip("numpy")
    buf = io.StringIO()
    results = [Result("dcf", "m", np.float64(2.5), np.float32(1.0), float("inf"), "ms")]
    payload = report(
        "b",
        {"shape": np.array([2, 3]), "n": np.int64(4)},
        results,
        {"r": float("nan")},
        None,
        stream=buf,
    )
    last = json.loads(buf.getvalue().rstrip("\n").splitlines()[-1])
    assert last == payload
    assert last["config"] == {"shape": [2, 3], "n": 4}
    assert last["results"][0]["median"] == 2.5 and last["results"][0]["max"] is None
    assert last["ratios"] == {"r": None}


def test_base_argparser_options() -> None:
    parser = base_argparser("demo")
    args = parser.parse_args([])
    assert args.quick is False and args.out is None
    args = parser.parse_args(["--quick", "--out", "x.json"])
    assert args.quick is True and args.out == "x.json"


def test_peer_available_never_raises_and_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    assert harness.peer_available("no-such-peer") is False

    def boom(name: str) -> bool:
        raise ImportError(name)

    monkeypatch.setattr(harness, "_peer_cache", {})
    monkeypatch.setattr(harness, "_check_peer", boom)
    assert harness.peer_available("torch") is False
    monkeypatch.setattr(harness, "_check_peer", lambda name: True)
    assert harness.peer_available("torch") is False  # cached answer


def test_results_in_own_process_returns_the_childs_results_or_names_its_failure() -> None:
    rows = harness.results_in_own_process(
        "bench.parallel_iterations",
        ["--cpu", "--pis", "1", "--repeat", "1", "--iterations", "3", "--size", "8",
         "--no-torch"], "the chain", timeout=300)
    assert [r["metric"] for r in rows] == ["iterations/s pi=1", "python loop us"]
    assert all(r["median"] > 0 for r in rows)
    with pytest.raises(RuntimeError, match="no such bench in its own process failed"):
        harness.results_in_own_process("bench.no_such_module", [], "no such bench",
                                       timeout=60)
