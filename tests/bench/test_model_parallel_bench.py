"""bench.model_parallel on CPU devices: the speedup over processes is the median of each
fresh process's own speedup, from the step times each one reported."""

from __future__ import annotations

import numpy as np

from bench import model_parallel


def test_the_speedup_over_processes_is_the_median_of_each_processes_own(capsys) -> None:
    payload = model_parallel.main(["--cpu", "--quick", "--layers", "4", "--units", "8",
                                   "--batch", "4", "--steps", "3",
                                   "--parallel-iterations", "2", "--processes", "3"])
    per = payload["config"]["process_step_ms"]
    assert len(per) == 3
    want = np.median([d["step ms devices=1"] / d["step ms devices=2"] for d in per])
    got = payload["ratios"]["median over 3 processes: speedup devices=2"]
    assert got == want and got > 0
    assert all(d["host python us"] > 0 for d in per)
    assert capsys.readouterr().out.count("  process ") == 3
