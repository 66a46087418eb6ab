"""tests/core/test_executor_rules.py with /gpu:0 as the default device (see on_gpu.py)."""

from tests.gpu.on_gpu import default_device_is_gpu0  # noqa: F401
from tests.core.test_executor_rules import *  # noqa: F401,F403

# These check CPU placement ("/cpu:0" in the device set, one partition per loop)
# or the CPU trace layout (7-tuples; GPU events add a track): not GPU results.
del test_next_iteration_moves_values_to_iteration_n_plus_1  # noqa: F821
del test_parallel_iterations_bounds_live_iterations  # noqa: F821
