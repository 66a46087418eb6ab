"""Device switches (GpuDevice.activate calls) per loop iteration of model_parallel's 8-layer LSTM on
two stand-in GPUs, and where they come from: `python -m bench.probes.device_switches`."""
import os, sys, collections
os.environ["DCF_FAKE_GPUS"] = "2"
import numpy as np
from dcf.actors import gpu as G
from bench.model_parallel import MultiLayerLSTM
seq = []
orig = G.GpuDevice.activate
def act(self):
    # who asked: the calling function's name
    f = sys._getframe(1)
    if f.f_code.co_name == "make_current":
        f = f.f_back
    seq.append((self.index if hasattr(self, "index") else id(self), f.f_code.co_name, f.f_code.co_filename.split("/")[-1]))
    return orig(self)
G.GpuDevice.activate = act
m = MultiLayerLSTM(["/gpu:0", "/gpu:1"], 8, 4, 16, 16, 32)
xv = np.random.default_rng(0).standard_normal((20, 4, 16)).astype(np.float32) * 0.1
m.step(xv); seq.clear(); m.step(xv)
print(len(seq) / 20)
print(collections.Counter((s[1], s[2]) for s in seq).most_common())
