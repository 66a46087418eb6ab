"""bench.static_vs_dynamic --gpu at small sizes: both kinds train the same model (the
same loss from the same initial weights), and the memory search reports what it ran."""

from __future__ import annotations

import pytest

from bench import static_vs_dynamic_gpu as S


def test_dynamic_and_static_steps_compute_the_same_loss():
    xv = S._input(6, 4, 8, False)
    models = {k: S.GpuLstm(k, 6, 4, 8, 16) for k in ("dynamic", "static")}
    try:
        losses = {k: m.step(xv) for k, m in models.items()}
        again = {k: m.step(xv) for k, m in models.items()}     # after one SGD step each
    finally:
        for m in models.values():
            m.close()
    assert losses["dynamic"] == pytest.approx(losses["static"], rel=1e-5)
    assert again["dynamic"] == pytest.approx(again["static"], rel=1e-5)


def test_memory_search_stops_at_the_first_failure():
    results, ratios, facts = S.memory_part(True, 24 << 20)
    for kind, rows in facts["rows"].items():
        statuses = [r["status"] for r in rows]
        assert all(s == "ok" for s in statuses[:-1])
        ok = [r["seq"] for r in rows if r["status"] == "ok"]
        assert facts["longest"][kind] == (ok[-1] if ok else None)
        if statuses[-1] != "ok":
            assert statuses[-1].startswith("OOM") and "gpu_memory_limit" in statuses[-1]
    assert len(results) == sum(len([r for r in rows if r["status"] == "ok"])
                               for rows in facts["rows"].values())
