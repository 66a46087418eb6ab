"""Kernel calls per loop iteration by op type, on stand-in GPUs (CPU): static_vs_dynamic's
dynamic and static LSTM steps (per time step) and model_parallel's 2-GPU step (per layer
and time step). Fused calls count under `fused:`; under the stand-in they also run their
ops one by one, so those ops are counted too. `python -m bench.probes.op_counts`."""
import os, collections
os.environ["DCF_FAKE_GPUS"] = "2"
import numpy as np
from dcf.actors import gpu_actor as A
from dcf.fusion import accumulate as accumulate_fusion, gates_grad as gates_grad_fusion, \
    split_matmul as split_matmul_fusion

cnt = collections.Counter()
orig = A._kernel_fn


def counted(gpu, name, typ, frame, dev, host, pure, on_device=False):
    f = orig(gpu, name, typ, frame, dev, host, pure, on_device)

    def w(*a):
        cnt[typ] += 1
        return f(*a)
    return w


A._kernel_fn = counted
orig_bind = A._bind


def bind(gpu, p, kw):      # ops bound directly (stack pushes and pops, variable reads)
    f = orig_bind(gpu, p, kw)
    t = p.type
    if f is None or t not in ("StackPushV2", "StackPopV2", "ReadVariableOp"):
        return f           # the others come back through _kernel_fn, counted there

    def w(*a, **k):
        cnt["bound:" + t] += 1
        return f(*a, **k)
    return w


A._bind = bind
for mod, cls in ((gates_grad_fusion, "FusedGatesGrad"), (accumulate_fusion, "FusedAccumulate"),
                 (split_matmul_fusion, "FusedSplitMatMul")):
    C = getattr(mod, cls)

    def mk(oc, cls):
        def call(self, *a):
            cnt["fused:" + cls] += 1
            return oc(self, *a)
        return call
    C.__call__ = mk(C.__call__, cls)

from bench.model_parallel import MultiLayerLSTM          # noqa: E402
from bench.static_vs_dynamic_gpu import GpuLstm          # noqa: E402


def show(label, per):
    print(f"{label}: {sum(cnt.values()) / per:.1f} calls per iteration")
    print("   " + ", ".join(f"{k} {v / per:.2f}" for k, v in cnt.most_common()))


xv = np.random.default_rng(0).standard_normal((200, 4, 16)).astype(np.float32)
for kind in ("dynamic", "static"):
    m = GpuLstm(kind, 200, 4, 16, 16)
    m.step(xv); cnt.clear(); m.step(xv)
    show(f"static_vs_dynamic {kind} (per time step)", 200)
    m.close()
m = MultiLayerLSTM(["/gpu:0", "/gpu:1"], 8, 4, 16, 16, 32)
xv = xv[:20]
m.step(xv); cnt.clear(); m.step(xv)
show("model_parallel 2 GPUs (per layer and time step)", 20 * 8)
