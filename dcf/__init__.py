"""dcf: dataflow graphs with in-graph dynamic control flow.

`cond`, `while_loop`, `TensorArray` and `gradients` lowered to Switch, Merge, Enter,
Exit and NextIteration and run by a tagged-token executor, one asyncio actor per
device (the design of "Dynamic Control Flow in Large-Scale Machine Learning").
"""

from dcf import errors  # noqa: F401
from dcf.dtypes import (  # noqa: F401
    DType, as_dtype, bool_ as bool, float16, float32, float64, int32, int64,
)
from dcf.graph import (  # noqa: F401
    Graph, Operation, Tensor, TensorType, control_dependencies, device, get_default_graph,
    name_scope, reset_default_graph,
)
from dcf.ops import *  # noqa: F401,F403
from dcf.ops import RegisterGradient, constant, convert_to_tensor  # noqa: F401
from dcf.control_flow import case, cond, while_loop  # noqa: F401
from dcf.tensor_array import TensorArray  # noqa: F401
from dcf.functional import foldl, foldr, map_fn, scan  # noqa: F401
from dcf.queues import FIFOQueue  # noqa: F401
from dcf.format import format_graph, graph_to_dot  # noqa: F401
from dcf.session import (  # noqa: F401
    AsyncSession, RunMetadata, RunOptions, Session, SessionConfig,
)
from dcf import nn, trace  # noqa: F401,E402
from dcf.autodiff import gradients  # noqa: F401,E402
from dcf import train  # noqa: F401,E402

__version__ = "0.1.0"
from dcf.cluster import Cluster  # noqa: F401,E402
