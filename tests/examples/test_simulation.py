"""examples/simulation.py: workers step environments in-graph; the learner improves."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_simulation_rounds_improve_the_shared_setting():
    import simulation

    history = simulation.main(["--workers", "2", "--rounds", "3", "--steps", "15"])
    assert len(history) == 3
    assert history[-1] > history[0]       # the learner moved theta toward the optimum
    assert history[-1] > -1.0              # optimum for targets 1, 2 is theta=1.5: reward ~ -0.26
