"""Shared benchmark harness: timing, results, reporting and peer detection.

Every benchmark in ``bench/`` measures with :func:`time_call`, collects
:class:`Result` rows, and ends with :func:`report`, whose last printed line is
one JSON object (the contract in ``BENCHMARKS.md``)::

    {"bench": NAME, "config": {...}, "results": [...], "ratios": {...}}

Nothing here imports a peer framework at module import time.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = [
    "PEERS",
    "Result",
    "Stats",
    "base_argparser",
    "format_table",
    "peer_available",
    "peer_versions",
    "percentile",
    "report",
    "time_call",
]


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def percentile(samples: list[float], q: float) -> float:
    """Return the ``q``-th percentile (0..100) of ``samples``, linearly interpolated.

    Same definition as ``numpy.percentile(..., method="linear")``.
    """
    if not samples:
        raise ValueError("percentile of an empty sample list")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must lie in [0, 100], got {q}")
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return xs[lo]
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Stats:
    """Timing statistics, in seconds per call.

    ``samples`` holds every measured sample (each already divided by
    ``number``). ``extra`` carries workload-specific facts (op counts, build
    times, final values) that a benchmark may want to report.
    """

    median: float
    min: float
    max: float
    p5: float
    p95: float
    samples: list[float]
    number: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        """Arithmetic mean of the samples."""
        return statistics.fmean(self.samples)

    @classmethod
    def from_samples(
        cls, samples: list[float], *, number: int = 1, extra: dict[str, Any] | None = None
    ) -> Stats:
        """Build statistics from per-call samples in seconds."""
        if not samples:
            raise ValueError("Stats need at least one sample")
        xs = [float(s) for s in samples]
        return cls(
            median=statistics.median(xs),
            min=min(xs),
            max=max(xs),
            p5=percentile(xs, 5.0),
            p95=percentile(xs, 95.0),
            samples=xs,
            number=number,
            extra=dict(extra or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-serialisable if ``extra`` is)."""
        return dataclasses.asdict(self)


def time_call(fn: Callable[[], Any], *, repeat: int, warmup: int, number: int = 1) -> Stats:
    """Time ``fn()`` and return per-call statistics in seconds.

    ``fn`` is called ``warmup`` times untimed, then ``repeat`` samples are
    taken; each sample times ``number`` back-to-back calls with
    :func:`time.perf_counter` and is divided by ``number``.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if number < 1:
        raise ValueError(f"number must be >= 1, got {number}")
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    clock = time.perf_counter
    for _ in range(repeat):
        start = clock()
        for _ in range(number):
            fn()
        samples.append((clock() - start) / number)
    return Stats.from_samples(samples, number=number)


# --------------------------------------------------------------------------
# Results and reporting
# --------------------------------------------------------------------------


@dataclass
class Result:
    """One reported figure: a system's median (with spread) for one metric."""

    system: str
    metric: str
    median: float
    min: float
    max: float
    unit: str
    p5: float | None = None
    p95: float | None = None

    @classmethod
    def from_stats(
        cls, system: str, metric: str, stats: Stats, *, unit: str = "ms", scale: float = 1e3
    ) -> Result:
        """A time result: ``stats`` (seconds per call) multiplied by ``scale``.

        The default reports milliseconds per call.
        """
        return cls(
            system=system,
            metric=metric,
            median=stats.median * scale,
            min=stats.min * scale,
            max=stats.max * scale,
            unit=unit,
            p5=stats.p5 * scale,
            p95=stats.p95 * scale,
        )

    @classmethod
    def rate(
        cls, system: str, metric: str, stats: Stats, count: float, *, unit: str = "it/s"
    ) -> Result:
        """A rate result: ``count`` events per call divided by the call time.

        The slowest call gives the minimum rate, so min/max and p5/p95 swap
        sides relative to the time statistics.
        """

        def r(t: float) -> float:
            return count / t if t > 0 else math.inf

        return cls(
            system=system,
            metric=metric,
            median=r(stats.median),
            min=r(stats.max),
            max=r(stats.min),
            unit=unit,
            p5=r(stats.p95),
            p95=r(stats.p5),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form used in the JSON line."""
        return dataclasses.asdict(self)


def _json_default(obj: Any) -> Any:
    """Serialise numpy scalars/arrays and dataclasses without importing numpy."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "tolist"):  # numpy scalar or array
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _clean(value: Any) -> Any:
    """Replace non-finite floats by None so the output is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    if not math.isfinite(x):
        return str(x)
    ax = abs(x)
    if ax != 0 and (ax >= 1e6 or ax < 1e-3):
        return f"{x:.3e}"
    if ax >= 100:
        return f"{x:.1f}"
    return f"{x:.4g}"


def format_table(results: list[Result], ratios: dict[str, Any] | None = None) -> str:
    """Human-readable table of ``results`` followed by the ``ratios``."""
    header = ["system", "metric", "median", "min", "max", "p5", "p95", "unit"]
    rows = [
        [
            r.system,
            r.metric,
            _fmt(r.median),
            _fmt(r.min),
            _fmt(r.max),
            _fmt(r.p5),
            _fmt(r.p95),
            r.unit,
        ]
        for r in results
    ]
    widths = [
        max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
        for i, h in enumerate(header)
    ]
    numeric = {2, 3, 4, 5, 6}

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(widths[i]) if i in numeric else c.ljust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out.extend(line(row) for row in rows)
    if ratios:
        out.append("")
        out.append("ratios:")
        width = max(len(str(k)) for k in ratios)
        for k, v in ratios.items():
            shown = _fmt(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
            out.append(f"  {str(k).ljust(width)}  {shown}")
    return "\n".join(out)


def report(
    bench: str,
    config: dict[str, Any],
    results: list[Result],
    ratios: dict[str, Any],
    out: str | None = None,
    *,
    stream: TextIO | None = None,
) -> dict[str, Any]:
    """Print a table, then the results as one JSON object on the last line.

    The JSON object is ``{"bench", "config", "results", "ratios"}``; with
    ``out`` the same JSON is also written to that file (parent folders are
    created). Non-finite floats become ``null``. Returns the JSON payload.
    """
    stream = stream if stream is not None else sys.stdout
    payload: dict[str, Any] = {
        "bench": bench,
        "config": dict(config),
        "results": [r.to_dict() if isinstance(r, Result) else dict(r) for r in results],
        "ratios": dict(ratios),
    }
    # Round-trip through json with our default so numpy values become plain.
    payload = _clean(json.loads(json.dumps(payload, default=_json_default)))
    text = json.dumps(payload, sort_keys=False, allow_nan=False)

    title = f"== {bench} =="
    cfg = ", ".join(f"{k}={v}" for k, v in payload["config"].items())
    print(title, file=stream)
    if cfg:
        print(f"config: {cfg}", file=stream)
    print(format_table(list(results), ratios), file=stream)
    print(text, file=stream)
    stream.flush()

    if out:
        parent = os.path.dirname(os.path.abspath(out))
        os.makedirs(parent, exist_ok=True)
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.write("\n")
    return payload


def host_python_seconds(repeat: int = 5) -> Stats:
    """Seconds per call of a small pure-Python loop (a dict of 200 tuples of str): the
    speed of the core this process runs on right now. Processes on a shared host can
    run 1.6-1.8x apart for their whole life (bench/NOTES.md, "GPU, session 16"); a
    host-bound figure is read with it."""
    import timeit

    def loop() -> int:
        d = {}
        for i in range(200):
            d[i] = (i, str(i))
        return sum(k for k in d)
    return Stats.from_samples([t / 200 for t in timeit.repeat(loop, number=200,
                                                               repeat=repeat)])


def results_in_own_process(module: str, args: list[str], what: str,
                           timeout: float) -> list[dict[str, Any]]:
    """Run ``python -m module *args --out FILE`` in a fresh process and return its
    report's "results" list (each result as a dict); a failed run raises RuntimeError
    naming `what`, with the end of its stderr."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "child.json")
        res = subprocess.run([sys.executable, "-m", module, *args, "--out", path],
                             capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(f"{what} in its own process failed:\n{res.stderr[-2000:]}")
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)["results"]


def base_argparser(description: str) -> argparse.ArgumentParser:
    """Argument parser with the options every benchmark shares.

    ``--quick``: a reduced configuration that finishes in under 60 s on 2 cores;
    ``--out FILE``: also write the JSON result to FILE.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="reduced sizes and repeats; finishes in under 60 s on 2 CPU cores",
    )
    parser.add_argument(
        "--out", metavar="FILE", default=None, help="also write the JSON result to FILE"
    )
    return parser


# --------------------------------------------------------------------------
# Peer detection
# --------------------------------------------------------------------------

#: Peer names understood by :func:`peer_available`.
PEERS: tuple[str, ...] = ("tf1", "tf1_rnn", "torch", "jax")

_peer_cache: dict[str, bool] = {}
_peer_versions: dict[str, str] = {}


def _quiet_tf_env() -> None:
    # Set before TensorFlow is first imported; harmless afterwards.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # tf.compat.v1.nn.rnn_cell lives in tf_keras (Keras 2) since TF 2.16.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def _check_peer(name: str) -> bool:
    if name == "tf1":
        _quiet_tf_env()
        tf = importlib.import_module("tensorflow")
        v1 = tf.compat.v1
        ok = all(
            hasattr(v1, a)
            for a in ("disable_eager_execution", "disable_control_flow_v2", "while_loop", "Session")
        )
        if ok:
            _peer_versions["tf1"] = str(tf.__version__)
        return ok
    if name == "tf1_rnn":
        if not peer_available("tf1"):
            return False
        if importlib.util.find_spec("tf_keras") is not None:
            return True
        tf = importlib.import_module("tensorflow")
        return hasattr(tf.compat.v1.nn.rnn_cell, "LSTMCell")
    if name == "torch":
        torch = importlib.import_module("torch")
        _peer_versions["torch"] = str(torch.__version__)
        return True
    if name == "jax":
        jax = importlib.import_module("jax")
        importlib.import_module("jax.numpy")
        _peer_versions["jax"] = str(jax.__version__)
        return True
    return False


def peer_available(name: str) -> bool:
    """Whether peer ``name`` ("tf1", "tf1_rnn", "torch", "jax") can be imported.

    "tf1" means TensorFlow with ``tf.compat.v1`` graph mode and control flow v1;
    "tf1_rnn" additionally needs ``tf.compat.v1.nn.rnn_cell`` (the ``tf-keras``
    package on TF >= 2.16). The answer is cached; this never raises.
    """
    if name in _peer_cache:
        return _peer_cache[name]
    try:
        ok = bool(_check_peer(name))
    except (Exception, SystemExit):  # noqa: BLE001 - any import failure means "not available"
        ok = False
    _peer_cache[name] = ok
    return ok


def peer_versions() -> dict[str, str]:
    """Versions of the peers found available so far (after :func:`peer_available`)."""
    return dict(_peer_versions)


# ------------------------------------------------------------------ machine facts
_DCF_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dcf")


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or platform.processor())."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_head() -> str | None:
    """The repository's short HEAD (read-only `git rev-parse`), None outside git."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_DCF_ROOT,
                             capture_output=True, text=True, timeout=10, check=False)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def source_fingerprint(files: tuple[str, ...]) -> dict[str, Any]:
    """git HEAD and a short sha1 of each listed dcf source file (paths relative to dcf/):
    the tree may hold uncommitted edits when a benchmark runs."""
    out: dict[str, Any] = {"git_head": git_head()}
    for rel in files:
        try:
            with open(os.path.join(_DCF_ROOT, rel), "rb") as f:
                out[rel] = hashlib.sha1(f.read()).hexdigest()[:10]
        except OSError:
            out[rel] = None
    return out
