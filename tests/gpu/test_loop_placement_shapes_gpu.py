"""tests/core/test_loop_placement_shapes.py with the host and the GPUs as the devices
(two GPUs where there are two): loops of random shapes and placement, compiled, on the
partitioned executor and traced, against one device. Here the frame compiler's paths for
loops over GPUs are drawn too: predicate copies read as the predicate, GPU marks, host
scalars inline on a GPU, stacks on GPUs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests.core.test_loop_placement_shapes import DRAWS, run_all_ways


def _devices() -> list[str]:
    from dcf import gpu_devices

    return ["/cpu:0"] + [f"/gpu:{k}" for k in range(min(gpu_devices.count(), 2))]


@given(**DRAWS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_loops_over_the_host_and_gpus_match_one_device(kinds, places, pred_place, fetch_bits,
                                                       trips, grad, x):
    run_all_ways(_devices(), kinds, places, pred_place, fetch_bits, trips, grad, x)
