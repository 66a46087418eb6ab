"""Host cost of the LSTM gates' kernel call (rnn_ops.gates_into) with h into its own
buffer, into a concatenation buffer (`h_lead`) and also into the layer above's offer
(`x_into`), and of the pieces the buffered forms add (a view made from a pointer, the
pointer arithmetic, an offer). `python -m bench.probes.gates_into_cost [B U]`; us per
call, medians of 7 alternating rounds of 400 calls, no synchronisation inside a round."""
import statistics, sys, time

import cupy as cp
import numpy as np

from dcf.ops import concat_slots, rnn_ops

B, U = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (256, 1024)
N = 400
rng = np.random.default_rng(0)
z = cp.asarray(rng.standard_normal((B, 4 * U)).astype(np.float32))
c = cp.asarray(rng.standard_normal((B, U)).astype(np.float32))
b = cp.asarray(rng.standard_normal(4 * U).astype(np.float32))
up = cp.empty((B, 2 * U), np.float32)
o = concat_slots.Offer(up[:, U:], up, U, 0, 1)
buf = cp.empty((B, 2 * U), np.float32)
nd, dt, isz = cp.ndarray, np.dtype(np.float32), 4


def plain():
    rnn_ops.gates_into(cp, z, c, b, 1.0)


def lead():
    rnn_ops.gates_into(cp, z, c, b, 1.0, U)


def lead_x():
    rnn_ops.gates_into(cp, z, c, b, 1.0, U, o)


def alloc():
    nd((B, U), dt)


def view():
    nd((B, U), dt, buf.data + U * isz, (2 * U * isz, isz))


def ptr_add():
    buf.data + U * isz


def offer():
    concat_slots.withdraw(concat_slots.offer(0, c, buf, U, 5))


cases = [plain, lead, lead_x, alloc, view, ptr_add, offer]
for f in cases:
    f()
cp.cuda.Device().synchronize()
res = {f.__name__: [] for f in cases}
for r in range(7):
    for f in (cases if r % 2 == 0 else cases[::-1]):
        t0 = time.perf_counter()
        for _ in range(N):
            f()
        res[f.__name__].append((time.perf_counter() - t0) / N * 1e6)
        cp.cuda.Device().synchronize()
print(f"B={B} U={U}: " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in res.items()) + " us")
