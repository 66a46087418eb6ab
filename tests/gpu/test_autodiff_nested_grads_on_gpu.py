"""tests/autodiff/test_nested_grads.py with /gpu:0 as the default device (see on_gpu.py):
nested constructs' gradients on a GPU against the plain Python reference's finite
differences."""

from tests.gpu.on_gpu import default_device_is_gpu0  # noqa: F401
from tests.autodiff.test_nested_grads import *  # noqa: F401,F403
