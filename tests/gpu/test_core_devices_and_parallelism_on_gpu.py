"""tests/core/test_devices_and_parallelism.py with /gpu:0 as the default device (see on_gpu.py)."""

from tests.gpu.on_gpu import default_device_is_gpu0  # noqa: F401
from tests.core.test_devices_and_parallelism import *  # noqa: F401,F403

# These check CPU placement ("/cpu:0" in the device set, one partition per loop)
# or the CPU trace layout (7-tuples; GPU events add a track): not GPU results.
del test_nested_split_loops_run_on_every_device  # noqa: F821
