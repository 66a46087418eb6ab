"""tests/core/test_concurrent_loop_shapes.py with the host and the GPUs as the devices
(two GPUs where there are two): several runs of a loop of random shape and placement in
flight at once through one AsyncSession, each against the run alone on one device. On
GPUs the runs share each GPU's streams, event pools, memory pool and pinned staging
buffers."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests.core.test_concurrent_loop_shapes import CONCURRENT_DRAWS, run_concurrently


def _devices() -> list[str]:
    from dcf import gpu_devices

    gpus = [f"/gpu:{k}" for k in range(min(gpu_devices.count(), 2))]
    return ["/cpu:0"] + (gpus * 2)[:2]


@given(**CONCURRENT_DRAWS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_concurrent_runs_over_the_host_and_gpus_match_each_run_alone(
        kinds, places, pred_place, fetch_bits, grad, runs, how):
    run_concurrently(_devices(), kinds, places, pred_place, fetch_bits, grad, runs, how)
