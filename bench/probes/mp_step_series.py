"""model_parallel's steps one by one, as the bench script runs them: each step's wall ms, the
host thread's CPU ms, the memory pool's growth over the step (new device memory) and its
full (generation 2) garbage collections with their ms. MODE sets the collector for the
timed steps: `on` (as the bench script), `off` (gc.disable()), `freeze` (gc.freeze() after
the warm-up, so that a full collection scans only what was made since).

    python -m bench.probes.mp_step_series DEVICES [STEPS] [MODES]
    python -m bench.probes.mp_step_series 2,1,2 12 on,off,freeze
"""
import gc
import sys
import time

import cupy
import numpy as np

from bench.model_parallel import MultiLayerLSTM
from dcf.actors import gpu as G

_full: list = []
_t0 = [0.0]


def _watch(phase: str, info: dict) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        _t0[0] = time.perf_counter()
    else:
        _full.append((time.perf_counter() - _t0[0]) * 1e3)


def _pool_total(ndev: int) -> int:
    pool, out = cupy.get_default_memory_pool(), 0
    for k in range(ndev):
        with cupy.cuda.Device(k):
            out += pool.total_bytes()
    return out


def series(ndev: int, steps: int, mode: str, xh: np.ndarray) -> str:
    m = MultiLayerLSTM([f"/gpu:{k}" for k in range(ndev)], 8, xh.shape[1], xh.shape[2],
                       xh.shape[2], 32)
    G.GpuDevice.get(0).activate()
    xv = cupy.asarray(xh)
    m.step(xv)
    m.step(xv)
    if mode == "freeze":
        gc.freeze()
    elif mode == "off":
        gc.disable()
    rows = []
    try:
        for _ in range(steps):
            before = _pool_total(ndev)
            G.GpuDevice.get(0).activate()
            _full.clear()
            c0, t0 = time.thread_time(), time.perf_counter()
            m.step(xv)
            wall, cpu = (time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3
            grew = _pool_total(ndev) - before
            rows.append(f"{wall:.0f}/{cpu:.0f}" + (f"+{grew >> 20}M" if grew else "") +
                        "".join(f"[gc2 {ms:.0f}ms]" for ms in _full))
    finally:
        gc.enable()
        gc.unfreeze()
        m.close()
    tracked = len(gc.get_objects())
    del m
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    return f"{mode} devices={ndev} ({tracked} objects tracked) wall/cpu ms: " + " ".join(rows)


def main() -> None:
    devs = [int(a) for a in (sys.argv[1] if len(sys.argv) > 1 else "2,1").split(",")]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    modes = (sys.argv[3] if len(sys.argv) > 3 else "on").split(",")
    gc.callbacks.append(_watch)
    xh = (np.random.default_rng(0).standard_normal((100, 256, 1024)) * 0.1).astype(np.float32)
    for mode in modes:
        for nd in devs:
            print(series(nd, steps, mode, xh), flush=True)


if __name__ == "__main__":
    main()
