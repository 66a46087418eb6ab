"""Host us per LSTM layer-step for the ways a GPU's share of a model-parallel loop
iteration could be launched (bench/NOTES.md, "GPU, session 27"): what fewer launches
would save the host, measured before anything is built.

  per layer      the fused call's kernels as dcf launches them today, without the
                 executor around them: one GEMM (dcf's cuBLAS path) and the in-place gates
                 kernel (rnn_ops.gates_into), for each of L layers
  batched        L layers' products as one strided-batched GEMM and their gates as one
                 kernel over [L*B, 4U] (the layers of one wavefront diagonal: layer l at
                 time t - l, independent of each other)
  graph replay   the per-layer kernels of L layers captured once as a CUDA graph
                 (stream capture) and replayed: what an iteration's launches would cost
                 if its addresses were fixed

Small batch (the GPU never limits; host cost only). Also each primitive alone. With
`gpu`, instead the GPU's own time per layer-step of "per layer" and "batched" (events
around 200 rounds; use the model's batch, 256).

    python -m bench.probes.launch_batching [L] [B] [U] [gpu]
"""
import sys
import time

import cupy as cp
import numpy as np

from bench.harness import host_python_seconds
from dcf.ops.gpu_kernels import _cublas, _handle, gemm
from dcf.ops.rnn_ops import gates_into


def main() -> None:
    L = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    B = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    U = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
    s = cp.cuda.Stream(non_blocking=True)
    s.use()
    rng = np.random.default_rng(0)
    a = [cp.asarray(rng.standard_normal((B, 2 * U)).astype(np.float32) * 0.1) for _ in range(L)]
    w = [cp.asarray(rng.standard_normal((2 * U, 4 * U)).astype(np.float32) * 0.02)
         for _ in range(L)]
    c = [cp.zeros((B, U), cp.float32) for _ in range(L)]
    a3 = cp.stack(a)                     # [L, B, 2U]
    w3 = cp.stack(w)                     # [L, 2U, 4U]
    cL = cp.concatenate(c)               # [L*B, U]

    def per_layer():
        for k in range(L):
            z = gemm(cp, a[k], w[k], False, False)
            gates_into(cp, z, c[k], None, 1.0)

    lib = _cublas(cp)
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    h = _handle(cp, lib, 0)

    def batched():
        z = cp.ndarray((L, B, 4 * U), cp.float32)
        lib.setStream(h, s.ptr)
        # row-major [L, B, 2U] @ [L, 2U, 4U]: column-major C^T = W^T @ A^T per batch entry
        lib.sgemmStridedBatched(h, 0, 0, 4 * U, B, 2 * U, one.ctypes.data,
                                w3.data.ptr, 4 * U, 2 * U * 4 * U,
                                a3.data.ptr, 2 * U, B * 2 * U, zero.ctypes.data,
                                z.data.ptr, 4 * U, B * 4 * U, L)
        gates_into(cp, z.reshape(L * B, 4 * U), cL, None, 1.0)

    def gemm_only():
        gemm(cp, a[0], w[0], False, False)

    z0 = gemm(cp, a[0], w[0], False, False)

    def gates_only():
        gates_into(cp, z0, c[0], None, 1.0)

    def t(name, f, per, n=400):
        for _ in range(20):
            f()
        s.synchronize()
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            best = min(best, (time.perf_counter() - t0) / n / per * 1e6)
            s.synchronize()
        print(f"  {name:44s} {best:8.2f} us per layer-step", flush=True)
        return best

    if len(sys.argv) > 4 and sys.argv[4] == "gpu":
        for name, f in [("per layer", per_layer), ("batched", batched)] * 2:
            for _ in range(50):
                f()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(s)
            for _ in range(200):
                f()
            e1.record(s)
            e1.synchronize()
            print(f"GPU time B={B}: {name:10s} "
                  f"{cp.cuda.get_elapsed_time(e0, e1) / 200 / L * 1e3:8.1f} us per layer-step",
                  flush=True)
        return
    print(f"L={L} B={B} U={U}; plain Python loop {host_python_seconds().median * 1e6:.1f} us",
          flush=True)
    t("GEMM alone (dcf's cuBLAS path)", gemm_only, 1)
    t("gates kernel alone (gates_into)", gates_only, 1)
    base = t(f"per layer: {L} x (GEMM + gates)", per_layer, L)
    bat = t(f"batched: 1 strided-batched GEMM + 1 gates", batched, L)
    try:
        per_layer()                      # the pool holds the blocks the capture will use
        s.synchronize()
        s.begin_capture()
        per_layer()
        graph = s.end_capture()
        gr = t(f"graph replay of {L} x (GEMM + gates)", graph.launch, L)
    except Exception as e:  # noqa: BLE001 - a probe: report what failed
        gr = None
        print(f"  graph capture failed: {type(e).__name__}: {e}", flush=True)
    print(f"  batched / per layer {bat / base:.3f}" +
          (f"; graph replay / per layer {gr / base:.3f}" if gr else ""), flush=True)


if __name__ == "__main__":
    main()
