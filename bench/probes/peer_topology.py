"""How this host's GPUs are linked, as the runtime sees them, and what a peer copy costs:
nvidia-smi's topology matrix; for every ordered pair (src, dst) whether dst can read src's
memory (cudaDeviceCanAccessPeer); the host's time per cudaMemcpyPeerAsync call and the
copy's GB/s (events on dst's stream) before and after peer access is enabled, and the
same bytes staged by hand through pinned host memory (D2H on src's stream, H2D on dst's
after an event). A call that takes about as long as its copy blocks the host thread.
`python -m bench.probes.peer_topology [MiB] [copies]`"""
import subprocess, sys, time

import cupy as cp

MIB = int(sys.argv[1]) if len(sys.argv) > 1 else 4
N = int(sys.argv[2]) if len(sys.argv) > 2 else 40
rt = cp.cuda.runtime
G = rt.getDeviceCount()
nbytes = MIB << 20

try:
    print(subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                         timeout=20).stdout, flush=True)
except Exception as e:  # noqa: BLE001 - a probe: say what failed and go on
    print("nvidia-smi topo failed:", e)

print("can access peer (row dst reads column src):")
for d in range(G):
    print(f"  gpu{d}: " + " ".join(str(int(rt.deviceCanAccessPeer(d, s))) if s != d else "-"
                                  for s in range(G)))

bufs, streams = [], []
for d in range(G):
    with cp.cuda.Device(d):
        bufs.append(cp.ones(nbytes // 4, cp.float32) * d)
        streams.append(cp.cuda.Stream(non_blocking=True))
for d in range(G):
    with cp.cuda.Device(d):
        cp.cuda.Device(d).synchronize()


def peer_copies(src, dst):
    with cp.cuda.Device(dst):
        out = cp.empty(nbytes // 4, cp.float32)
        s = streams[dst]
        rt.memcpyPeerAsync(out.data.ptr, dst, bufs[src].data.ptr, src, nbytes, s.ptr)
        s.synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        t0 = time.perf_counter()
        for _ in range(N):
            rt.memcpyPeerAsync(out.data.ptr, dst, bufs[src].data.ptr, src, nbytes, s.ptr)
        host = (time.perf_counter() - t0) / N
        e1.record(s)
        e1.synchronize()
        gpu = cp.cuda.get_elapsed_time(e0, e1) / 1e3 / N
        ok = bool(out[:4].get().tolist() == [float(src)] * 4)
    return host, gpu, ok


def staged(src, dst):
    host_buf = cp.cuda.alloc_pinned_memory(nbytes)
    with cp.cuda.Device(dst):
        out = cp.empty(nbytes // 4, cp.float32)
    t0 = time.perf_counter()
    evs = []
    for _ in range(N):
        with cp.cuda.Device(src):
            rt.memcpyAsync(host_buf.ptr, bufs[src].data.ptr, nbytes, 2, streams[src].ptr)
            ev = cp.cuda.Event(disable_timing=True)
            ev.record(streams[src])
        with cp.cuda.Device(dst):
            streams[dst].wait_event(ev)
            rt.memcpyAsync(out.data.ptr, host_buf.ptr, nbytes, 1, streams[dst].ptr)
            evs.append(streams[dst].record())
    host = (time.perf_counter() - t0) / N
    evs[-1].synchronize()
    wall = (time.perf_counter() - t0) / N
    return host, wall


for phase in ("without peer access", "with peer access (where possible)"):
    print(f"\n{MIB} MiB peer copies, {phase}: host us per call / GPU us per copy / GB/s / right")
    for src in range(G):
        for dst in range(G):
            if src == dst:
                continue
            if phase.startswith("with") and rt.deviceCanAccessPeer(dst, src):
                with cp.cuda.Device(dst):
                    try:
                        rt.deviceEnablePeerAccess(src)
                    except Exception:  # noqa: BLE001 - already enabled
                        pass
            h, g, ok = peer_copies(src, dst)
            print(f"  {src}->{dst}: {1e6 * h:8.1f} {1e6 * g:8.1f} {nbytes / g / 1e9:6.1f} {ok}",
                  flush=True)

print(f"\n{MIB} MiB staged through pinned host memory by hand: host us / wall us per copy")
for src, dst in [(0, 1)] + ([(0, G - 1), (G - 1, 0)] if G > 2 else []):
    h, w = staged(src, dst)
    print(f"  {src}->{dst}: {1e6 * h:8.1f} {1e6 * w:8.1f}", flush=True)
