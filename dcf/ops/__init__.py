"""Importing this package registers every op type in OPS and exports the op wrappers."""

from dcf.ops.registry import (  # noqa: F401
    OPS, GRADIENTS, Kind, OpDef, RegisterGradient, apply, constant, constant_value,
    convert_to_tensor, register,
)
from dcf.ops.control_ops import *  # noqa: F401,F403
from dcf.ops.math_ops import *  # noqa: F401,F403
from dcf.ops.array_ops import *  # noqa: F401,F403
from dcf.ops.nn_ops import *  # noqa: F401,F403
from dcf.ops.random_ops import *  # noqa: F401,F403
from dcf.ops.state_ops import *  # noqa: F401,F403
from dcf.ops.data_ops import *  # noqa: F401,F403
from dcf.ops import rnn_ops  # noqa: F401
