"""tests/autodiff/test_grad_semantics.py with /gpu:0 as the default device (see on_gpu.py)."""

from tests.gpu.on_gpu import default_device_is_gpu0  # noqa: F401
from tests.autodiff.test_grad_semantics import *  # noqa: F401,F403
