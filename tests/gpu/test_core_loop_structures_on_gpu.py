"""tests/core/test_loop_structures.py with /gpu:0 as the default device (see on_gpu.py)."""

from tests.gpu.on_gpu import default_device_is_gpu0  # noqa: F401
from tests.core.test_loop_structures import *  # noqa: F401,F403

# These check CPU placement ("/cpu:0" in the device set, one partition per loop)
# or the CPU trace layout (7-tuples; GPU events add a track): not GPU results.
del test_traced_run_records_every_executed_node_and_writes_chrome_json  # noqa: F821
