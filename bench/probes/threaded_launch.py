"""Would one host thread per GPU issue an LSTM layer's forward step faster than one thread
for both? Host us per layer-step of what the 2-GPU model_parallel forward issues per layer
(concatenation, GEMM, gates written over the product: dcf's own GPU bodies) at batch 8, so
the GPUs never limit: one thread alternating between two GPUs, against two threads, one
per GPU, each on its own stream (how much of the launch path runs without the GIL).
`python -m bench.probes.threaded_launch [n_steps]`."""
import sys, threading, time
import numpy as np
import cupy as cp
from dcf.ops.array_ops import _concat
from dcf.ops.gpu_kernels import concat_gpu, gemm
from dcf.ops.rnn_ops import gates_into

N = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
B, U = 8, 1024
concat = concat_gpu(_concat)


def setup(dev):
    with cp.cuda.Device(dev):
        rng = np.random.default_rng(dev)
        x, h, c = (cp.asarray(rng.standard_normal((B, U)).astype(np.float32)) for _ in range(3))
        w = cp.asarray(rng.standard_normal((2 * U, 4 * U)).astype(np.float32) * 0.02)
        b = cp.zeros(4 * U, np.float32)
        s = cp.cuda.Stream(non_blocking=True)
    return dict(x=x, h=h, c=c, w=w, b=b, s=s, dev=dev)


def layer_step(st):
    xh = concat(cp, st["x"], st["h"], axis=1)
    z = gemm(cp, xh, st["w"], False, False)
    return gates_into(cp, z, st["c"], st["b"], 1.0)


def serial(states, n):
    for _ in range(n):
        for st in states:
            cp.cuda.Device(st["dev"]).use()
            st["s"].use()
            layer_step(st)


def worker(st, n, barrier):
    cp.cuda.Device(st["dev"]).use()
    st["s"].use()
    barrier.wait()
    for _ in range(n):
        layer_step(st)


def threaded(states, n):
    barrier = threading.Barrier(len(states) + 1)
    ts = [threading.Thread(target=worker, args=(st, n, barrier)) for st in states]
    for t in ts:
        t.start()
    barrier.wait()
    for t in ts:
        t.join()


def sync(states):
    for st in states:
        st["s"].synchronize()


ngpu = min(2, cp.cuda.runtime.getDeviceCount())
states = [setup(d) for d in range(ngpu)]
for st in states:
    with cp.cuda.Device(st["dev"]):
        with st["s"]:
            layer_step(st)          # compile the gates kernel on each device
for rnd in range(3):
    for name, fn in (("one thread, both GPUs", serial), (f"{ngpu} threads, one per GPU", threaded)):
        sync(states)
        t0 = time.perf_counter()
        fn(states, N)
        wall = time.perf_counter() - t0
        sync(states)
        per = wall / (N * ngpu) * 1e6
        print(f"round {rnd}: {name:28s} {per:6.2f} us per layer-step "
              f"({N * ngpu / wall:,.0f} layer-steps/s)", flush=True)
