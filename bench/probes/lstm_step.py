"""The no-swap LSTM training step on /gpu:0 (512 units, batch 512), ms per loop iteration at
L = 300 and 500 (7 steps after 2 warm, GC off), with the SM clock before and after; `burn` in
the label first keeps the GPU busy 0.5 s: `python -m bench.probes.lstm_step LABEL`."""
import sys, time, gc, subprocess
import cupy as cp
import dcf
from bench.lstm_swap import DcfLSTM, _input
from bench import gpu_common as G
def clock():
    return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
def burn(s=0.5):
    a = cp.ones((4096, 4096), cp.float32); t = time.perf_counter()
    while time.perf_counter() - t < s:
        a @ a
    cp.cuda.runtime.deviceSynchronize()
out = []
for L in (300, 500):
    m = DcfLSTM("/gpu:0", 512, 512, 512, False, 32, dcf.SessionConfig())
    xv = _input(L, 512, 512, False)
    for _ in range(2): m.step(xv)
    c0 = clock()
    if "burn" in sys.argv[1]: burn()
    G.sync_all(); gc.collect(); gc.disable()
    ts = []
    for _ in range(7):
        t0 = time.perf_counter(); m.step(xv); ts.append((time.perf_counter() - t0) / L * 1e3)
    c1 = clock()
    gc.enable(); ts.sort()
    out.append(f"L={L} median {ts[3]:.4f} min {ts[0]:.4f} max {ts[-1]:.4f} ms/iter (sm clock {c0} -> {c1})")
    m.close()
print(sys.argv[1], " | ".join(out), flush=True)
