"""tests/ops/test_nn_ops.py with every graph also run on /gpu:0 and compared."""

from tests.gpu.ops_on_gpu import oracle_also_runs_on_gpu  # noqa: F401
from tests.ops.test_nn_ops import *  # noqa: F401,F403
