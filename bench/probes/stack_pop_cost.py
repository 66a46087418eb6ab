"""Host us per StackPopV2 on a (stand-in) GPU partition: bound directly vs through the
generic kernel wrapper: `python -m bench.probes.stack_pop_cost`."""
import os, timeit
os.environ["DCF_FAKE_GPUS"] = "1"
import numpy as np
from dcf.actors import gpu as G
from dcf.actors import gpu_actor as A
from dcf.ops.data_ops import StackStore
from dcf.plan import PNode
from dcf.ops.registry import OPS, Kind
gpu = G.GpuDevice.get(0); gpu.activate()
v = gpu.cp.zeros(4, np.float32)
p = PNode(name="pop", type="StackPopV2", kind=Kind.KERNEL, frame="f", kernel=OPS["StackPopV2"].kernel, stateful=True)
kw = dict(elem_type=None, shape=None)
direct = A._bind(gpu, p, kw)
p2 = PNode(name="pop", type="StackPopX", kind=Kind.KERNEL, frame="f", kernel=OPS["StackPopV2"].kernel, stateful=True)
wrapped = A._kernel_fn(gpu, "pop", "StackPopV2", "f", None, __import__("functools").partial(OPS["StackPopV2"].kernel, np, **kw), pure=False)
st = StackStore("s", False)
def run(fn):
    st.items = [v] * 1000
    for _ in range(1000): fn(st)
for name, fn in (("direct", direct), ("wrapped", wrapped)):
    print(name, min(timeit.repeat(lambda: run(fn), number=20, repeat=5)) / 20000 * 1e6, "us/pop")
