"""Loops of random shapes and placement (the draws of
tests/core/test_loop_placement_shapes.py) over worker processes: the loop's counter and
predicate on one worker or the client, each loop variable's update on another, branches
and inner loops on a third; run alone and several at once through one AsyncSession,
compiled, on the partitioned executor and traced, each against the same graph on one
device of one process.

The fixed graphs of test_oracle.py cover each kind of crossing once; here every mix of
them is drawn: dead branches sent between processes, control loops driven by another
process's predicate, stacks and TensorArrays on workers, gradients through all of it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cluster.helpers import task
from tests.core.test_concurrent_loop_shapes import CONCURRENT_DRAWS, run_concurrently

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

PLACES = [[task(0), task(1), task(2)], ["/cpu:0", task(0), task(1)]]


@given(places_of=st.sampled_from(PLACES), **CONCURRENT_DRAWS)
@settings(max_examples=30, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_loops_over_workers_match_one_process(cluster3, places_of, kinds, places, pred_place,
                                              fetch_bits, grad, runs, how):
    run_concurrently(places_of, kinds, places, pred_place, fetch_bits, grad, runs[:3], how,
                     cluster=cluster3)
