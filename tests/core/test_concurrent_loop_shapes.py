"""Concurrent runs of loops of random shapes and placement (the draws of
tests/core/test_loop_placement_shapes.py) through one AsyncSession: two to eight runs of
the same graph in flight at once, with different trip counts and inputs, compiled, on the
partitioned executor (compiled partitions and the tagged-token executor) and traced, each against the same graph run alone on one device.

What this covers that the single-run draws and the fixed concurrent tests don't: runs
of one plan that overlap on every device (their frames, stacks, Send/Recv tags and
control loops kept apart by run), over graphs whose shape nobody chose."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dcf
from tests.core.test_loop_placement_shapes import DRAWS, build

pytestmark = pytest.mark.timeout(300)

# the execution paths: one fused compiled program, compiled partitions exchanging
# Send/Recv, the tagged-token executor, and traced runs
WAYS = ("compiled", "partitioned", "executor", "traced")
RUNS = st.lists(st.tuples(st.integers(0, 4), st.floats(-2.0, 2.0, allow_nan=False)),
                min_size=2, max_size=8)


def _alone_on_one_device(kinds, places, pred_place, fetch, grad, runs) -> list:
    g = dcf.Graph()
    with g.as_default():
        n, x0, outs = build(kinds, places, pred_place, fetch, grad, ["/cpu:0"] * 3)
    with dcf.Session(g) as sess:
        return [[np.asarray(v) for v in sess.run(outs, {n: t, x0: x})] for t, x in runs]


async def _together(devices, cluster, how, kinds, places, pred_place, fetch, grad, runs):
    g = dcf.Graph()
    with g.as_default():
        n, x0, outs = build(kinds, places, pred_place, fetch, grad, devices)
    cfg = dcf.SessionConfig(compile_frames=how != "executor", fuse_devices=how == "compiled")
    opts = dcf.RunOptions(trace=True) if how == "traced" else None
    async with dcf.AsyncSession(g, cluster=cluster, config=cfg) as sess:
        return await asyncio.wait_for(asyncio.gather(
            *[sess.run(outs, {n: t, x0: x}, options=opts) for t, x in runs]), 120)


def run_concurrently(devices, kinds, places, pred_place, fetch_bits, grad, runs, how,
                     cluster=None) -> None:
    places = [p % len(devices) for p in places]
    pred_place %= len(devices)
    fetch = [bool(fetch_bits >> k & 1) for k in range(len(kinds))]
    want = _alone_on_one_device(kinds, places, pred_place, fetch, grad, runs)
    got = asyncio.run(_together(devices, cluster, how, kinds, places, pred_place, fetch,
                                grad, runs))
    assert len(got) == len(want)
    for k, (gv, wv) in enumerate(zip(got, want)):
        assert len(gv) == len(wv)
        for a, b in zip(gv, wv):
            np.testing.assert_allclose(np.asarray(a), b, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{how}, run {k} of {len(runs)}: {runs[k]}")
        assert gv[0] == runs[k][0]


CONCURRENT_DRAWS = {k: v for k, v in DRAWS.items() if k not in ("trips", "x")}
CONCURRENT_DRAWS.update(runs=RUNS, how=st.sampled_from(WAYS))


@given(**CONCURRENT_DRAWS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_concurrent_runs_of_loops_over_three_devices_match_each_run_alone(
        kinds, places, pred_place, fetch_bits, grad, runs, how):
    run_concurrently(["/cpu:0", "/cpu:1", "/cpu:2"], kinds, places, pred_place, fetch_bits,
                     grad, runs, how)
