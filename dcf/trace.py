"""Timeline events -> Chrome/Perfetto trace JSON, and a PNG drawing of them.

An event is (device, op name, op type, frame, iteration, t0, t1[, track]) with times
in seconds from time.perf_counter; GPU devices add a track per stream.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["to_chrome_trace", "plot"]


def to_chrome_trace(events: list) -> dict:
    """Chrome trace-event JSON: one process per device, one thread per track."""
    if not events:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    t_origin = min(e[5] for e in events)
    pids: dict[str, int] = {}
    tids: dict[tuple, int] = {}
    out: list[dict] = []
    for e in events:
        dev, name, type_, frame, it, t0, t1 = e[:7]
        track = e[7] if len(e) > 7 else "compute"
        pid = pids.setdefault(dev, len(pids) + 1)
        if (dev, track) not in tids:
            tids[(dev, track)] = len([k for k in tids if k[0] == dev]) + 1
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[(dev, track)],
                        "ts": 0, "args": {"name": track}})
        # (the end from t1 as the start from t0: an op that starts as the one before it
        # ends does not overlap it, which would nest the two wrongly on their track)
        ts, end = (t0 - t_origin) * 1e6, (t1 - t_origin) * 1e6
        out.append({"ph": "X", "name": name, "cat": type_, "pid": pid, "tid": tids[(dev, track)],
                    "ts": ts, "dur": max(end - ts, 0.0),
                    "args": {"type": type_, "frame": frame or "<root>", "iteration": it}})
    for dev, pid in pids.items():
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
                    "args": {"name": dev}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def plot(run_metadata: Any, path: str, *, title: str | None = None) -> str:
    """Draw the timeline of `run_metadata.trace` as a PNG (needs matplotlib); another
    extension of `path` (.svg, .pdf) picks that format, and a path without one gets
    ".png" added. Returns the path written.

    The figure is a `matplotlib.figure.Figure` on its own Agg canvas: pyplot's backend,
    its current figure and the caller's open figures are left alone (a notebook's inline
    backend keeps working)."""
    try:
        from matplotlib import colormaps
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("dcf.trace.plot needs matplotlib: pip install 'dcf[plot]'") from e

    events = run_metadata.trace if hasattr(run_metadata, "trace") else run_metadata
    if not events:
        raise ValueError("the trace is empty: nothing to plot (run with RunOptions(trace=True) "
                         "and a RunMetadata; a run that failed or computed nothing records "
                         "no events)")
    if isinstance(path, (str, os.PathLike)):      # (a file object is written as a PNG)
        path = os.fspath(path)
        if not os.path.splitext(path)[1]:
            path += ".png"                           # what savefig would write; say so
    t_origin = min(e[5] for e in events)
    tracks = sorted({(e[0], e[7] if len(e) > 7 else "compute") for e in events})
    row = {t: i for i, t in enumerate(tracks)}
    fig = Figure(figsize=(12, 1 + 0.6 * len(tracks)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = colormaps["tab20"]
    types = {t: k for k, t in enumerate(sorted({e[2] for e in events}))}
    bars: dict[tuple, list] = {}      # (one collection per track and op type, not per
    for e in events:                  # event: thousands of artists take minutes to draw)
        r = row[(e[0], e[7] if len(e) > 7 else "compute")]
        bars.setdefault((r, e[2]), []).append(
            ((e[5] - t_origin) * 1e3, max((e[6] - e[5]) * 1e3, 1e-4)))
    for (r, type_), spans in bars.items():
        ax.broken_barh(spans, (r - 0.4, 0.8), color=colors(types[type_] % 20))
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([f"{d} {t}" for d, t in tracks])
    ax.set_xlabel("time (ms)")
    ax.set_title(title or f"{len(events)} op executions")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
