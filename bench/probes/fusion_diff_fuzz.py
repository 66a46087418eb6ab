"""Random float64 programs that set up the frame compiler's GPU fusions (dcf/fusion/) and
their near-misses, each run with every op on /cpu:0 (no fusions: the reference), with
every op on /gpu:0 (`gpu`), with its ops spread over /gpu:0 and /gpu:1 at random
(`gpu2`), and on /gpu:0 under a memory limit that swaps saved loop values at once
(`swap`): the loss, the fetched intermediates (values, and the gradient of the loss
w.r.t. one of them) and the first-order gradients w.r.t. x, y ([N, N]) and r ([N]) must
agree at rtol 1e-10.

The grammar (MAT, VEC, and the loops and conds of Gen) aims at the patterns each fusion
looks for and at what should keep it off:
- slice_add: the gradient of x[key] (strides, negative indices, an ellipsis, a new
  axis, shrunk axes down to one element, two slices of one value) added to x's other
  gradients, and explicit add_n([m, StridedSliceGrad(dy)]) / m + StridedSliceGrad(dy)
  (AddN of 2 and of 3 terms, broadcasting Adds both ways, two StridedSliceGrads in one
  sum, dy read from m itself) whose other addend m may also be read by a later op,
  fetched, read in a cond branch, or carried to the next iteration;
- accumulate: loop-invariant matrices, vectors, stacks of matrices (and slices of them)
  read inside while_loops (acc + MatMul, with transpose_a and thin operands so that terms
  are held and flushed in chunks; acc + Sum(axis 0); acc + BatchMatMulV2; acc + a slice's
  gradient), and forward loops whose carried value only adds a product or a column sum;
- gates_grad / matmul_gates: lstm_gates(z = A @ B, c) with h read once or twice, with and
  without a bias;
- split_matmul: concat([stop_gradient(A)[:, :2], B[:, 2:]], 1) @ C;
- control flow around all of it: cond, while_loop (parallel_iterations 1 or 32,
  swap_memory, maximum_iterations, one or two carried values), scan, nested 1-3 deep.

The stand-in GPUs (DCF_FAKE_GPUS=2, dcf/actors/_fake_cuda.py) take the fused calls that
need no raw kernel (slice_add, split_matmul, accumulate's fallback that adds the term in
place, the gates' fallbacks); elementwise trees, in_place, the gates' raw kernels,
gemm_accumulate (cuBLAS) and the column-sum kernel (rows of 512 columns and more: --n 512)
need a real GPU, where the same command runs them. The summary counts the fused callables
built and what their counters say they did.

    DCF_FAKE_GPUS=2 python -m bench.probes.fusion_diff_fuzz --seeds A:B [--depth D]
        [--ops K] [--n N] [--modes gpu,gpu2,swap] [--unknown] [--show] [--min]

prints one line per seed (OK, or BAD with the first value that differs) and, with
--show, a failing program's source (a function build(T, D) over the module T and the
devices D[k]; SG, LSTM and LSTM2 are in PRELUDE; SHAPES are the inputs' static shapes,
partly unknown by seed with --unknown): its own repro; --min replaces its
statements' values by inputs one at a time while the difference stays, and prints what
is left.
"""
from __future__ import annotations

import argparse
import collections
import random
import re
import sys
import traceback
from typing import Any

import numpy as np

import dcf

RTOL, ATOL = 1e-10, 1e-12

# matrix templates over matrices A, B, C and a vector r; each gives a 4x4 float64 value
MAT = {
    "mm": "T.matmul({A}, {B}) * {s}",
    "mmT": "T.matmul({A}, {B}, transpose_a=True) * {s}",
    "tanh": "T.tanh({A})",
    "mul": "{A} * {B}",
    "add": "{A} + {B}",
    "sub": "{A} - {B} * 0.5",
    "sig": "T.sigmoid({A}) * {B}",
    "sq": "T.square({A}) * 0.3",
    "nexp": "T.exp(-T.square({A}))",
    "div": "{A} / (T.square({B}) + 1.0)",
    "addn2": "T.add_n([{A}, {B}])",
    "addn3": "T.add_n([{A}, {B}, {C}])",
    "bc_add": "{A} + {r}",
    "bc_mul": "{A} * {r}",
    "bc_radd": "{r} + {A}",
    "bc_col": "{A} * {B}[..., 1:2]",
    "sl_row": "{B} + {A}[-1]",
    "sl_tile": "T.tile({A}[1:3, ::2], [{h}, 2]) * 0.5 + {B}",
    "sl_mm": "T.matmul({A}[:, -3:-1], {A}[1:3]) + {B}",
    "sl_rev": "{A}[::-1] * {B}",
    "sl_rev2": "{A}[..., ::-1] + {B}[::-1, ::-1]",
    "sl_cat": "T.concat([{A}[::-2, ::-1], {B}[1:{h1}]], 0)",
    "sl_new": "{B} + {A}[None, 2]",
    "sl_ell": "{A}[..., 2:3] * {B}",
    "sl_two": "T.tile({A}[1:3, 1:3] + {A}[0:2, 2:4], [{h}, {h}]) * {B}",
    "sl_neg": "T.tile({A}[-1:-4:-2, -4:], [{h}, {q}]) * 0.5 + {B}[..., -{n}:]",
    "ssg": "T.add_n([{A}, SG((slice(1, 3), slice(None, None, 2)), T.tanh({B}[1:3, ::2]))])",
    "ssg_r": "T.add_n([SG((Ellipsis, slice(None, None, -2)), {B}[:, :{h}] * 0.5), {A}])",
    "ssg_add": "{A} + SG((slice(None, None, -1), -1), {B}[0])",
    "ssg_radd": "SG((slice(-3, None),), {B}[:3]) + {A}",
    "ssg3": "T.add_n([{A}, SG((slice(-3, None),), {B}[:3]), {C}])",
    "ssg_bc": "SG((slice(1, 3),), {r}[:2], ({n},)) + {A}",
    "ssg_bc2": "SG((slice(1, 3), slice(None, None, 2)), {B}[1:3, ::2]) + {r}",
    "ssg_two": "T.add_n([SG((slice(None, 2),), {A}[-2:]), SG((slice(-2, None),), {B}[:2])])",
    "ssg_new": "{A} + SG((None, 2), {B}[None, 1])",
    "ssg_self": "T.add_n([{A}, SG((slice(1, 3),), {A}[:2])])",
    "sl_pt": "{B} * {A}[1, 2] + {A}[-1, -3] * 0.5",
    "ssg_pt": "T.add_n([{A}, SG((2, -1), T.reduce_sum({B}) * 0.1)])",
    "mm_thin": "{C} + T.matmul({A}[:1], {B}) * {s}",
    "mm_thin2": "{C} * T.matmul({A}[-2:], {B}, transpose_b=True)[1] * {s}",
    "lstm": "LSTM(T.matmul({A}, {B}), {C}[:, :{q}], {A}, None)",
    "lstm_b": "LSTM(T.matmul({A}, {B}) * {s}, {C}[:, -{q}:], {B}, {r})",
    "lstm_h2": "LSTM2(T.matmul({A}, {B}) * {s}, {C}[:, 1:{q1}], {B})",
    "split": "T.matmul(T.concat([T.stop_gradient({A})[:, :2], {B}[:, 2:]], 1), {C}) * {s}",
}
VEC = {
    "v_row": "{A}[1] * {r}",
    "v_sum": "T.reduce_sum({A}, axis=0) * 0.3",
    "v_tanh": "T.tanh({r} + {A}[-2])",
    "v_ssg": "SG((slice(None, None, -1),), {r}, ({n},)) * 0.5 + {A}[0]",
}

PRELUDE = '''
import numpy as np
from dcf.ops.registry import apply
from dcf.ops.rnn_ops import lstm_gates


def SG(key, dy, shape=None):
    return apply("StridedSliceGrad", [dy], key=key, shape=shape or (N, N))


def FIX(v):
    """A loop's value with the static shape [N, N] (where the inputs' are partly unknown)."""
    return T.reshape(v, [N, N]) if UNKNOWN else v


def LSTM(z, c, m, b):
    c_new, h = lstm_gates(z, c, 1.0) if b is None else lstm_gates(z, c, 1.0, b=b)
    u = N // 4
    return T.matmul(h, m[:u]) + T.matmul(c_new, m[-u:]) * 0.5


def LSTM2(z, c, m):
    c_new, h = lstm_gates(z, c, 0.5)
    u = N // 4
    return T.matmul(T.tanh(h) * c_new + h, m[u:2 * u])
'''


class Gen:
    """Python source for one program over a module T (dcf), devices D[k]."""

    def __init__(self, rng: random.Random, depth: int, ops: int, n: int = 4) -> None:
        self.rng, self.depth, self.ops = rng, depth, ops
        self.sizes = dict(n=n, h=n // 2, h1=n // 2 + 1, q=n // 4, q1=n // 4 + 1,
                          s=round(1 / n ** 0.5, 6))
        self.lines: list[str] = []
        self.n = 0
        self.dev = 0
        self.roots: list[str] = []       # root-level matrices (fetchable)

    def name(self, p: str = "m") -> str:
        self.n += 1
        return f"{p}{self.n}"

    def devline(self, ind: int) -> str:
        self.dev += 1
        return "    " * ind + f"with T.device(D[{self.dev}]):"

    def pick(self, M: list, recent: bool = True) -> str:
        # prefer recent values, but reread old ones (values read twice, across frames)
        if recent and self.rng.random() < 0.6:
            return self.rng.choice(M[-3:])
        return self.rng.choice(M)

    def block(self, M: list, V: list, depth: int, ind: int, budget: int) -> str:
        """Statements at indentation `ind`; returns the last matrix made."""
        M, V = list(M), list(V)
        last = M[-1]
        for _ in range(budget):
            r = self.rng.random()
            if depth > 0 and r < 0.15:
                last = self.loop(M, V, depth, ind)
            elif depth > 0 and r < 0.19:
                last = self.scan(M, V, depth, ind)
            elif depth > 0 and r < 0.28:
                last = self.cond(M, V, depth, ind)
            elif r < 0.36:
                v = self.name("v")
                t = VEC[self.rng.choice(sorted(VEC))]
                self.lines += [self.devline(ind), "    " * (ind + 1) + f"{v} = " +
                               t.format(A=self.pick(M), r=self.rng.choice(V), **self.sizes)]
                V.append(v)
                continue
            else:
                last = self.name()
                t = MAT[self.rng.choice(sorted(MAT))]
                self.lines += [self.devline(ind), "    " * (ind + 1) + f"{last} = " +
                               t.format(A=self.pick(M), B=self.pick(M), C=self.pick(M, False),
                                        r=self.rng.choice(V), **self.sizes)]
            M.append(last)
            if ind == 1:
                self.roots.append(last)
        return last

    def loop(self, M: list, V: list, depth: int, ind: int) -> str:
        k = self.name("w")
        pad = "    " * ind
        trips = self.rng.randrange(1, 4)
        pi = self.rng.choice([1, 32])
        swap = self.rng.random() < 0.3
        mi = self.rng.choice([None, None, 2])
        two = self.rng.random() < 0.4          # a second carried value
        init = self.pick(M)
        init2 = self.pick(M)
        batched = self.rng.random() < 0.3      # a loop-invariant stack of matrices
        if batched:
            self.lines += [self.devline(ind), pad + f"    {k}w3 = T.reshape({self.pick(M)}, "
                           f"[2, {self.sizes['n']}, {self.sizes['h']}])"]
        self.lines.append(pad + f"def body_{k}(i, {k}v{', ' + k + 'u' if two else ''}):")
        inner = M + ([f"{k}u"] if two else []) + [f"{k}v"]
        if batched:     # acc + BatchMatMulV2 in the backward loop
            n, h = self.sizes["n"], self.sizes["h"]
            self.lines += [self.devline(ind + 1), pad + f"        {k}p = T.matmul(T.reshape("
                           f"{k}v, [2, {h}, {n}]), {k}w3) * {self.sizes['s']}",
                           pad + f"        {k}b = T.reshape(T.concat([{k}p, T.tanh({k}p)], 0), "
                           f"[{n}, {n}])"]
            inner.append(f"{k}b")
        last = self.block(inner, V, depth - 1, ind + 1, self.rng.randrange(1, 4))
        if two and self.rng.random() < 0.5:
            # u is read by its sum alone: a forward acc + MatMul / acc + Sum(axis 0)
            # (the sum broadcasts over u's rows: a near-miss)
            sc = self.sizes["s"]
            term = self.rng.choice([f"T.matmul({last} * {sc}, {self.pick(M, False)})",
                                    f"T.reduce_sum({last} * 0.5, axis=0)",
                                    f"T.matmul({last} * {sc}, {self.pick(M, False)}, "
                                    f"transpose_a=True)"])
            self.lines.append(pad + f"    return i + 1, FIX(T.tanh({last})) * 0.9, "
                                    f"FIX({k}u + {term})")
        elif two:
            self.lines.append(pad + f"    return i + 1, FIX(T.tanh({last})) * 0.9, "
                                    f"FIX({k}v * 0.5 + {k}u * 0.25)")
        else:
            self.lines.append(pad + f"    return i + 1, FIX(T.tanh({last})) * 0.9")
        lv = f"(T.constant(0), FIX({init})" + (f", FIX({init2}))" if two else ",)")
        self.two_last = two
        cond = "lambda i, *_: i < %d" % trips
        self.lines += [self.devline(ind), pad + f"    {k} = T.while_loop({cond}, body_{k}, "
                       f"{lv}, parallel_iterations={pi}, swap_memory={swap}, "
                       f"maximum_iterations={mi})"]
        if two:     # both results read on (the carried sum's through a later op)
            self.lines += [pad + f"    {k} = {k}[1] + {k}[2] * 0.3"]
        else:
            self.lines += [pad + f"    {k} = {k}[1]"]
        return k

    def scan(self, M: list, V: list, depth: int, ind: int) -> str:
        k = self.name("s")
        pad = "    " * ind
        self.lines.append(pad + f"def step_{k}(acc, row):")
        inner = M + [f"{k}a"]
        self.lines.append(pad + f"    {k}a = acc * 0.5 + row")
        last = self.block(inner, V, depth - 1, ind + 1, self.rng.randrange(1, 3))
        self.lines.append(pad + f"    return FIX(T.tanh({last}))")
        pi = self.rng.choice([1, 32])
        self.lines += [self.devline(ind), pad + f"    {k} = T.reduce_mean(T.scan(step_{k}, "
                       f"T.stack([{self.pick(M)}, {self.pick(M)}]), "
                       f"initializer=FIX({self.pick(M)}), parallel_iterations={pi}), axis=0)"]
        return k

    def cond(self, M: list, V: list, depth: int, ind: int) -> str:
        k = self.name("c")
        pad = "    " * ind
        p = self.pick(M)
        outs = []
        for br in ("t", "f"):
            self.lines.append(pad + f"def {br}_{k}():")
            last = self.block(M, V, depth - 1, ind + 1, self.rng.randrange(1, 3))
            self.lines.append(pad + f"    return {last}")
            outs.append(last)
        self.lines += [self.devline(ind), pad + f"    {k} = T.cond(T.reduce_sum({p}) > 0.0, "
                                             f"t_{k}, f_{k})"]
        return k

    def program(self) -> str:
        self.lines = ["def build(T, D):", "    F = T.float64",
                      "    x = T.placeholder(F, SHAPES[0])", "    y = T.placeholder(F, SHAPES[1])",
                      "    r = T.placeholder(F, SHAPES[2])"]
        self.block(["x", "y"], ["r"], self.depth, 1, self.ops)
        outs = self.roots[-3:] or ["x"]
        fetched = self.rng.sample(self.roots, min(len(self.roots), self.rng.randrange(0, 3)))
        self.lines.append("    loss = " + " + ".join(
            f"T.reduce_sum({m} * T.constant(np.random.default_rng({i}).standard_normal("
            f"(N, N)))) / N" for i, m in enumerate(outs)))
        if self.roots and self.rng.random() < 0.4:
            which = self.rng.choice(self.roots)
            self.lines.append(f"    fetched_grad = T.gradients(loss, [{which}])")
            fetched.append("fetched_grad[0] if fetched_grad[0] is not None else loss")
        self.lines.append(f"    return loss, [x, y, r], [{', '.join(fetched)}]")
        return "\n".join(self.lines)


# ------------------------------------------------------------------ fusion counters
COUNTS: collections.Counter = collections.Counter()


INSTANCES: list = []


def _count_calls() -> None:
    """Keep every fused callable the compiler builds (wrapping __call__ would add
    references to the arguments and turn the reference-count checks off)."""
    from dcf.fusion import accumulate, gates_grad, in_place, matmul_gates, slice_add, \
        split_matmul

    for mod, cls in ((slice_add, "FusedSliceAdd"), (accumulate, "FusedAccumulate"),
                     (gates_grad, "FusedGatesGrad"), (matmul_gates, "FusedMatMulGates"),
                     (split_matmul, "FusedSplitMatMul"), (in_place, "InPlaceElementwise")):
        c = getattr(mod, cls)
        orig = c.__init__

        def init(self, *a, _orig=orig, **k):
            _orig(self, *a, **k)
            INSTANCES.append(self)
        c.__init__ = init


def _tally() -> None:
    for f in INSTANCES:
        COUNTS[type(f).__name__] += 1
        if hasattr(f, "kind"):
            COUNTS[f"{type(f).__name__}[{f.kind}]"] += 1
        for attr in ("in_place", "copied", "flushes", "fused", "into", "narrowed"):
            if isinstance(getattr(f, attr, None), int):
                COUNTS[f"{type(f).__name__}.{attr}"] += getattr(f, attr)
    INSTANCES.clear()


UNKNOWN = [False]      # --unknown: the inputs' static shapes partly unknown


def _shapes(n: int, seed: int) -> list:
    if not UNKNOWN[0]:
        return [[n, n], [n, n], [n]]
    rng = random.Random(seed * 13 + 5)
    return [rng.choice([[None, n], [n, None], [None, None], None, [n, n]]),
            rng.choice([[None, n], [n, None], [n, n]]), rng.choice([[None], None, [n]])]


def run(src: str, devs: list, feeds: dict, config: Any = None, seed: int = 0) -> list:
    n = feeds["x"].shape[0]
    env = {"T": dcf, "N": n, "SHAPES": _shapes(n, seed), "UNKNOWN": UNKNOWN[0]}
    exec(compile(PRELUDE + src, "<program>", "exec"), env)
    g = dcf.Graph()
    with g.as_default():
        loss, xs, fetched = env["build"](dcf, devs)
        grads = [gr if gr is not None else dcf.zeros_like(v)
                 for gr, v in zip(dcf.gradients(loss, xs), xs)]
        fd = dict(zip(xs, (feeds["x"], feeds["y"], feeds["r"])))
    with dcf.Session(g, config=config) as sess:
        return sess.run([loss] + grads + fetched, fd, options=dcf.RunOptions(timeout_s=60))


def differs(a: list, b: list) -> str:
    for i, (u, v) in enumerate(zip(a, b)):
        if not np.allclose(u, v, rtol=RTOL, atol=ATOL, equal_nan=True):
            what = ["loss", "dx", "dy", "dr"][i] if i < 4 else f"fetch{i - 4}"
            return f"{what}: max |diff| {np.max(np.abs(np.asarray(u) - np.asarray(v))):.3g}"
    return ""


def _feeds(seed: int, n: int) -> dict:
    nrng = np.random.default_rng(seed)
    return {"x": nrng.standard_normal((n, n)) * 0.7, "y": nrng.standard_normal((n, n)),
            "r": nrng.standard_normal(n)}


def _devices(src: str, seed: int) -> dict:
    ndev = src.count("D[") + 1
    drng = random.Random(seed * 7 + 1)
    return {"cpu": ["/cpu:0"] * ndev, "gpu": ["/gpu:0"] * ndev,
            "gpu2": [drng.choice(["/gpu:0", "/gpu:1"]) for _ in range(ndev)]}


def check(src: str, seed: int, n: int, modes: list, show: bool = False) -> list | None:
    """What differs from the CPU run in each mode ("mode what"), or None where the CPU
    run itself fails."""
    feeds, devs = _feeds(seed, n), _devices(src, seed)
    try:
        ref = run(src, devs["cpu"], feeds, None, seed)
    except Exception:   # noqa: BLE001 - a program the CPU refuses is no finding
        if show:
            traceback.print_exc()
        return None
    notes = []
    for m in modes:
        try:
            cfg = None
            if m == "swap":     # one GPU, saved loop values swapped out at once
                cfg = dcf.SessionConfig(gpu_memory_limit=8 << 20, swap_threshold=0.001)
            d = differs(ref, run(src, devs["gpu" if m == "swap" else m], feeds, cfg, seed))
        except Exception as e:  # noqa: BLE001 - one program's failure is one finding
            d = f"{type(e).__name__}: {str(e)[:300]}"
            if show:
                traceback.print_exc()
        if d:
            notes.append(f"{m} {d}")
    return notes


_STMT = re.compile(r"^(\s*)(\w+) = (.*)$")


def minimize(src: str, seed: int, n: int, modes: list) -> str:
    """A smaller program that still differs in one of `modes`: each statement's value in
    turn replaced by an input (x, r; a loop's by (0, x, x)), kept where the difference
    stays, until nothing more goes."""
    def bad(text: str) -> bool:
        got = check(text, seed, n, modes)
        _tally()
        return bool(got)

    lines = src.split("\n")
    changed = True
    while changed:
        changed = False
        for i in range(len(lines) - 1, -1, -1):
            m = _STMT.match(lines[i])
            if m is None or m.group(2) in ("F", "x", "y", "r", "loss") or \
                    m.group(3) in ("x", "r", "(0, x, x)"):
                continue
            name, rhs = m.group(2), m.group(3)
            if rhs.startswith("T.while_loop("):
                repl = "(0, x, x)"
            elif name.startswith("v"):
                repl = "r"
            elif rhs.startswith(name + "["):    # a loop's result read off its tuple
                continue
            else:
                repl = "x"
            trial = lines[:i] + [f"{m.group(1)}{name} = {repl}"] + lines[i + 1:]
            if bad("\n".join(trial)):
                lines, changed = trial, True
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0:50")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--ops", type=int, default=6)
    ap.add_argument("--n", type=int, default=4,
                    help="matrix size (a multiple of 4; 512 reaches the raw column sums)")
    ap.add_argument("--show", action="store_true")
    ap.add_argument("--min", action="store_true", help="print a minimized repro of each BAD")
    ap.add_argument("--unknown", action="store_true",
                    help="give x, y and r partly unknown static shapes (SHAPES, by seed)")
    ap.add_argument("--modes", default="gpu,gpu2",
                    help="of gpu (all on /gpu:0), gpu2 (/gpu:0 and /gpu:1 at random), swap "
                         "(/gpu:0 under a memory limit, swapping saved values at once)")
    args = ap.parse_args()
    _count_calls()
    UNKNOWN[0] = args.unknown
    modes = args.modes.split(",")
    a, b = map(int, args.seeds.split(":"))
    bad = refused = 0
    for seed in range(a, b):
        src = Gen(random.Random(seed), args.depth, args.ops, args.n).program()
        notes = check(src, seed, args.n, modes, args.show)
        _tally()
        if notes is None:       # (a program the CPU refuses: no finding, not counted)
            print(f"ERR seed {seed}: the CPU run failed", flush=True)
            refused += 1
            continue
        bad += bool(notes)
        print(f"{'BAD' if notes else 'OK '} seed {seed}: {'; '.join(notes)}", flush=True)
        if notes and args.show:
            print(f"N = {args.n}\n{src}")
        if notes and args.min:
            print(f"minimized (seed {seed}, N = {args.n}):\n"
                  f"{minimize(src, seed, args.n, modes)}", flush=True)
    print(f"{b - a - refused - bad} of {b - a - refused} programs agree ({refused} the CPU "
          f"refused); fused callables built and their "
          f"counters: {dict(COUNTS)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
