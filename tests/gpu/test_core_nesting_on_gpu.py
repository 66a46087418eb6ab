"""tests/core/test_nesting.py with /gpu:0 as the default device (see on_gpu.py)."""

from tests.gpu.on_gpu import default_device_is_gpu0  # noqa: F401
from tests.core.test_nesting import *  # noqa: F401,F403
