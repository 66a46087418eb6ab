"""Random STATEFUL programs run by every execution path, compared with each other and with
a plain-Python interpreter of the same program.

What nest_fuzz_gpu does not cover: variables assigned, updated (assign_add,
scatter_update, group) and read inside loops and conds; side effects reached only through
control_dependencies, including ones on tensors from outside the cond or loop; a
FIFOQueue filled and drained under guards; TensorArrays written in one loop and read (or
stacked) in another; py_funcs that append to a Python list (ordered ones must keep their
order exactly; ones that hang on the loop counter alone, or run in map_fn or in a loop's
predicate, may run in any order TF1 allows, but each call happens exactly once); seeded
random ops (the reference draws from numpy's default_rng(seed), as the kernels do);
early loop exits, maximum_iterations, parallel_iterations 1 and 10; errors raised inside
loops (the error class, the op, frame and iteration named, the same first line on every
path, and the state left behind); and d(result)/d(input) from gradients(), against the
reference's forward-mode derivative (nothing flows through variables, py_funcs or random
ops, as in TF1).

Each program threads one float64 value `x` through its statements; every stateful op
waits for `x` (control_dependencies) and feeds its result back into `x`, so the order of
the side effects is defined as in TF1. Each program runs twice in one session (state,
queue and random streams carry over; a run that fails is followed by the next), and the
variables and the queue's size are fetched after each run.

Paths: cf (compiled frames, the default), exec (compile_frames=False), trace (a traced
run), 2cpu / 2cpu_part / 2cpu_exec / 2cpu_trace (statements spread over /cpu:0 and
/cpu:1: fused, fuse_devices=False, compile_frames=False, traced), gpu / gpu_part /
gpu_trace (two stand-in GPUs and the CPU: fused, not, traced), and with --cluster also
Cluster.local(2) (statements on both workers and the client, py_funcs on the client).

    python -m bench.probes.stateful_fuzz [FIRST_SEED] [LAST_SEED] [--cluster] [--show] [--min]

prints one line per disagreement (seed, path, what differs) and the count of programs
with any; --show prints each program, --min a greedily minimised program for each
disagreement (`minimise(prog, paths)`). A seed's program is `gen(random.Random(seed))`.
About 0.3 s a program on one core; 300 seeds pass on every path (bugs found are in
tests/core/test_review5_paths.py).
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import sys
import traceback

import numpy as np

import dcf
from dcf.gpu_devices import stand_in_gpus

LOG: list = []
QCAP = 3
A0, B0, X0 = 0.3, np.array([0.1, 0.2, 0.3, 0.4]), 0.7


class RefError(Exception):
    """The reference interpreter reached an op that fails: (kind, iteration)."""


# ------------------------------------------------------------------ programs
def gen(rng: random.Random, depth: int = 3) -> list:
    """A list of statements; each is a tuple whose first item names its kind."""
    ctr = [0]

    def stmts(depth, in_loop, n=None):
        return [stmt(depth, in_loop) for _ in range(n or rng.randint(1, 3))]

    def stmt(depth, in_loop):
        ctr[0] += 1
        sid, d = ctr[0], rng.randrange(4)
        kinds = ["assign", "add", "scatter", "read", "log", "rand", "ctl", "plog", "grp",
                 "octl", "olog", "map", "enq", "deq"]
        if in_loop:
            kinds += ["ilog", "iadd"] + ["err"] * (rng.random() < 0.15)
        if depth > 0:
            kinds += ["cond", "cond", "while", "while", "while", "ta", "ta"]
        k = rng.choice(kinds)
        var = rng.choice("ab")
        c = round(rng.uniform(-0.9, 0.9), 2)
        if k in ("assign", "add", "read", "ctl", "grp"):
            return (k, sid, d, var, c)
        if k == "scatter":
            return (k, sid, d, rng.randrange(4), c)
        if k in ("log", "plog", "ilog", "octl", "olog", "iadd", "enq", "deq"):
            return (k, sid, d)
        if k == "map":
            return (k, sid, d, rng.randrange(1, 4), c)
        if k == "rand":
            return (k, sid, d, rng.randrange(1000))
        if k == "err":
            return (k, sid, d, rng.choice(["pyfunc", "gather", "ta"]), rng.randrange(3))
        if k == "cond":
            return (k, sid, d, rng.randrange(2), c, stmts(depth - 1, in_loop),
                    stmts(depth - 1, in_loop))
        if k == "while":
            return (k, sid, d, rng.randrange(0, 4), rng.choice([None, None, round(c + 1.5, 2)]),
                    rng.choice([None, None, rng.randrange(0, 3)]), rng.choice([1, 10]),
                    stmts(depth - 1, True), rng.random() < 0.3)
        return (k, sid, d, rng.randrange(1, 4), rng.choice([1, 10]),
                stmts(depth - 1, True), stmts(depth - 1, True), rng.choice(["read", "stack"]),
                rng.random() < 0.3)

    return stmts(depth, False, rng.randint(2, 4))


# ------------------------------------------------------------------ reference
class Dual:
    """A value and its derivative with respect to the program's input (forward mode)."""

    def __init__(self, v, d=0.0):
        self.v, self.d = float(v), float(d)

    def __add__(self, o):
        return Dual(self.v + o.v, self.d + o.d) if isinstance(o, Dual) else Dual(self.v + o,
                                                                                 self.d)

    def __mul__(self, k):
        return Dual(self.v * k, self.d * k)

    def tanh(self):
        t = np.tanh(self.v)
        return Dual(t, self.d * (1.0 - t * t))


class Ref:
    """Runs a program on Python floats and numpy arrays. `x` is a Dual: what reaches it
    through a variable, a py_func or a random op carries no derivative (as gradients())."""

    def __init__(self):
        self.a, self.b, self.c, self.gens, self.log = A0, B0.copy(), 0.0, {}, []
        self.q = []

    def run(self, prog, x):
        return self.block(prog, Dual(x, 1.0), None)

    def block(self, prog, x, it):
        for s in prog:
            x = self.stmt(s, x, it)
        return x

    def stmt(self, s, x, it):
        k, sid, v = s[0], s[1], x.v
        if k == "assign":
            if s[3] == "a":
                self.a = v * s[4]
                return x + self.a * 0.5
            self.b = self.b * 0.5 + v * s[4]
            return x + self.b.sum() * 0.1
        if k == "add":
            if s[3] == "a":
                self.a = self.a + v * s[4]
                return x + self.a * 0.1
            self.b = self.b + v * s[4]
            return x + self.b.sum() * 0.1
        if k == "scatter":
            self.b = self.b.copy()
            self.b[s[3]] = v * s[4]
            return x + self.b.sum() * 0.1
        if k == "read":
            return x + (self.a if s[3] == "a" else self.b.sum()) * s[4]
        if k == "ctl":
            if s[3] == "a":
                self.a = self.a + s[4]
            else:
                self.b = self.b + s[4]
            return x
        if k == "grp":
            self.a, self.b = self.a + s[4], self.b * s[4]
            return x
        if k == "octl":
            self.c += 1.0
            return x
        if k == "iadd":
            self.c += float(it)
            return x
        if k == "enq":
            if len(self.q) < QCAP:
                self.q.append(v)
            return x
        if k == "deq":
            return x + self.q.pop(0) * 0.5 if self.q else x
        if k == "olog":
            self.log.append(("o", sid, 0.0))
            return x
        if k == "map":
            es = [v + e for e in range(s[3])]
            self.log += [("m", sid, e) for e in es]
            return x + sum((e + 1.0) * s[4] for e in es) * 0.1
        if k == "log":
            self.log.append(("s", sid, v))
            return Dual(v + 1.0)
        if k == "plog":
            self.log.append(("p", sid, v))
            self.log.append(("p", -sid, v))
            return Dual(v + 2.0, -x.d)
        if k == "ilog":
            self.log.append(("i", sid, float(it)))
            return x + it * 0.001
        if k == "rand":
            g = self.gens.setdefault(sid, np.random.default_rng(s[3]))
            return x + g.random(dtype=np.float64)
        if k == "err":
            if it == s[4]:
                raise RefError(s[3], it)
            return x
        if k == "cond":
            p = (v > s[4]) if s[3] == 0 else (self.a > s[4])
            return self.block(s[5] if p else s[6], x, it).tanh()
        if k == "while":
            n, early, mi, body, logs = s[3], s[4], s[5], s[7], s[8]
            i = 0
            while True:
                if logs:
                    self.log.append(("i", sid, float(i)))
                if not (i < n and (early is None or x.v < early) and (mi is None or i < mi)):
                    return x
                x = self.block(body, x + i * 0.01, i).tanh()
                i += 1
        n, body1, body2 = s[3], s[5], s[6]
        ta = []
        for i in range(n):
            x = self.block(body1, x, i).tanh()
            ta.append(x)
        if s[7] == "stack":
            for t in ta:
                x = x + t * 0.1
            return x
        for j in range(n):
            x = self.block(body2, x + ta[n - 1 - j] * 0.1, j).tanh()
        return x


# ------------------------------------------------------------------ dcf
def _logger(kind, sid):
    def log(v=0.0):
        LOG.append((kind, sid, float(v)))
        return np.float64(v + 1.0)
    log.__name__ = f"log{sid}"
    return log


def _ilogger(sid):
    def ilog(i):
        LOG.append(("i", sid, float(i)))
        return np.float64(i)
    return ilog


def _raiser(at):
    def boom(i):
        if i == at:
            raise ValueError(f"boom at {i}")
        return np.float64(0.0)
    return boom


class Build:
    """Builds a program into the default graph; `devs` maps a statement's device index."""

    def __init__(self, devs, host=None):
        self.devs, self.host = devs, host

    def dev(self, d, host_only=False):
        if host_only and self.host is not None:
            return dcf.device(self.host)
        if not self.devs:
            return contextlib.nullcontext()
        return dcf.device(self.devs[d % len(self.devs)])

    def build(self, prog):
        with self.dev(0):
            self.a = dcf.Variable(np.float64(A0), name="a")
        with self.dev(1):
            self.b = dcf.Variable(B0.copy(), name="b")
        with self.dev(2):
            self.c = dcf.Variable(np.float64(0.0), name="c")
        with self.dev(3):
            self.q = dcf.FIFOQueue(QCAP, [dcf.float64], shapes=[()], name="q")
        self.x0 = dcf.placeholder(dcf.float64, (), name="x0")
        return self.block(prog, self.x0, None)

    def block(self, prog, x, it):
        for s in prog:
            with self.dev(s[2], host_only=s[0] in ("log", "plog", "ilog", "olog", "map", "err")
                          and (s[0] != "err" or s[3] == "pyfunc")):
                x = self.stmt(s, x, it)
        return x

    def var(self, name):
        return self.a if name == "a" else self.b

    def stmt(self, s, x, it):
        k, sid = s[0], s[1]
        cd = dcf.control_dependencies
        if k == "assign":
            with cd([x]):
                if s[3] == "a":
                    t = self.a.assign(x * s[4])
                    return x + t * 0.5
                t = self.b.assign(self.b.read_value() * 0.5 + x * s[4])
            return x + dcf.reduce_sum(t) * 0.1
        if k == "add":
            with cd([x]):
                v = self.var(s[3])
                t = v.assign_add(x * s[4] if s[3] == "a" else x * s[4] * np.ones(4))
            return x + (t * 0.1 if s[3] == "a" else dcf.reduce_sum(t) * 0.1)
        if k == "scatter":
            with cd([x]):
                t = self.b.scatter_update([s[3]], dcf.reshape(x * s[4], (1,)))
            return x + dcf.reduce_sum(t) * 0.1
        if k == "read":
            with cd([x]):
                r = self.var(s[3]).read_value()
            return x + dcf.reduce_sum(r) * s[4]
        if k == "ctl":
            with cd([x]):
                op = self.var(s[3]).assign_add(s[4] if s[3] == "a" else np.full(4, s[4]))
            with cd([op]):
                return dcf.identity(x)
        if k == "enq":           # (never into a full queue: that would wait)
            with cd([x]):
                room = self.q.size() < QCAP
            return dcf.cond(room, lambda: self.enqueue(x), lambda: x)
        if k == "deq":
            with cd([x]):
                some = self.q.size() > 0
            return dcf.cond(some, lambda: x + self.q.dequeue() * 0.5, lambda: x)
        if k == "iadd":          # hangs on the counter only: order free, sum exact
            op = self.c.assign_add(dcf.cast(it, dcf.float64))
            with cd([op]):
                return dcf.identity(x)
        if k == "octl":
            with cd([self.x0]):               # from outside: runs once where it is
                op = self.c.assign_add(1.0)
            with cd([op]):
                return dcf.identity(x)
        if k == "olog":
            with cd([self.x0]):
                y = dcf.py_func(_logger("o", sid), [], dcf.float64)
            return x + dcf.reshape(y, ()) * 0.0
        if k == "map":
            elems = x + dcf.range(0, s[3], dtype=dcf.float64)
            r = dcf.map_fn(lambda e: dcf.reshape(dcf.py_func(_logger("m", sid), [e],
                                                             dcf.float64), ()) * s[4], elems)
            return x + dcf.reduce_sum(r) * 0.1
        if k == "grp":
            with cd([x]):
                both = dcf.group(self.a.assign_add(s[4]), self.b.assign(self.b * s[4]))
            with cd([both]):
                return dcf.identity(x)
        if k == "log":
            return dcf.reshape(dcf.py_func(_logger("s", sid), [x], dcf.float64), ())
        if k == "plog":
            y1 = dcf.py_func(_logger("p", sid), [x], dcf.float64)
            y2 = dcf.py_func(_logger("p", -sid), [x], dcf.float64)
            return dcf.reshape(y1 + y2, ()) - x
        if k == "ilog":
            y = dcf.py_func(_ilogger(sid), [it], dcf.float64)
            return x + dcf.reshape(y, ()) * 0.001
        if k == "rand":
            with cd([x]):
                r = dcf.random_uniform((), dtype=dcf.float64, seed=s[3])
            return x + r
        if k == "err":
            with cd([x]):     # the side effects before it have happened when it fails
                return x + self.err(s[3], s[4], it)
        if k == "cond":
            if s[3] == 0:
                p = x > s[4]
            else:
                with cd([x]):
                    p = self.a.read_value() > s[4]
            return dcf.tanh(dcf.cond(p, lambda: self.block(s[5], x, it),
                                     lambda: self.block(s[6], x, it)))
        if k == "while":
            n, early, mi, pi, body, logs = s[3:9]

            def cond(i, v):
                p = i < n
                if logs:          # a side effect of the predicate: once per evaluation
                    with self.dev(0, host_only=True):
                        seen = dcf.reshape(dcf.py_func(_ilogger(sid), [i], dcf.float64), ())
                    p = dcf.logical_and(p, seen >= 0.0)
                return p if early is None else dcf.logical_and(p, v < early)

            def step(i, v):
                return i + 1, dcf.tanh(self.block(body, v + dcf.cast(i, dcf.float64) * 0.01, i))
            return dcf.while_loop(cond, step, (dcf.constant(0), x), maximum_iterations=mi,
                                  parallel_iterations=pi)[1]
        n, pi, body1, body2, mode, dynamic = s[3:9]
        ta = dcf.TensorArray(dcf.float64, size=0 if dynamic else n, dynamic_size=dynamic,
                             name=f"ta{sid}")

        def write(i, v, ta):
            v = dcf.tanh(self.block(body1, v, i))
            return i + 1, v, ta.write(i, v)
        _, x, ta = dcf.while_loop(lambda i, v, ta: i < n, write, (dcf.constant(0), x, ta),
                                  parallel_iterations=pi)
        if mode == "stack":
            return x + dcf.reduce_sum(ta.stack()) * 0.1

        def read(j, v):
            return j + 1, dcf.tanh(self.block(body2, v + ta.read(n - 1 - j) * 0.1, j))
        return dcf.while_loop(lambda j, v: j < n, read, (dcf.constant(0), x),
                              parallel_iterations=pi)[1]

    def enqueue(self, x):
        with dcf.control_dependencies([self.q.enqueue(x)]):
            return dcf.identity(x)

    def err(self, kind, at, it):
        if kind == "pyfunc":
            return dcf.reshape(dcf.py_func(_raiser(at), [it], dcf.float64), ())
        if kind == "gather":
            idx = dcf.where(dcf.equal(it, at), 7, 0)
            return dcf.gather(dcf.constant([0.0, 0.0], dcf.float64), idx)
        ta = dcf.TensorArray(dcf.float64, size=3, name="bad_ta").write(0, 0.0)
        return ta.read(dcf.where(dcf.equal(it, at), 2, 0))


# ------------------------------------------------------------------ running
PATHS = {
    "cf": (None, {}, False),
    "exec": (None, {"compile_frames": False}, False),
    "trace": (None, {}, True),
    "2cpu": (["/cpu:0", "/cpu:1"], {}, False),
    "2cpu_part": (["/cpu:0", "/cpu:1"], {"fuse_devices": False}, False),
    "2cpu_exec": (["/cpu:1", "/cpu:0"], {"compile_frames": False}, False),
    "2cpu_trace": (["/cpu:0", "/cpu:1"], {}, True),
    "gpu": (["/gpu:0", "/gpu:1", "/cpu:0"], {}, False),
    "gpu_part": (["/gpu:1", "/cpu:0", "/gpu:0"], {"fuse_devices": False}, False),
    "gpu_trace": (["/gpu:0", "/cpu:0", "/gpu:1"], {}, True),
}
CLUSTER_DEVS = ["/job:worker/task:0/cpu:0", "/job:worker/task:1/cpu:0", "/cpu:0"]


def run_path(prog, devs, config, trace, cluster=None, host=None):
    """[(x, a, b, log) or ('error', class name, message, a, b, log)] for two runs."""
    g = dcf.Graph()
    with g.as_default():
        b = Build(devs, host)
        out = b.build(prog)
        try:
            fetch = [out] + [t for t in dcf.gradients(out, [b.x0]) if t is not None]
        except Exception:            # (a build error of gradients() is another matter)
            fetch = [out]
        outs = []
        opts = dcf.RunOptions(trace=True) if trace else None
        kw = {"cluster": cluster} if cluster is not None else {}
        with dcf.Session(config=dcf.SessionConfig(**config), **kw) as sess:
            sess.run(dcf.global_variables_initializer())
            for _ in range(2):
                LOG.clear()
                try:
                    got = sess.run(fetch, {b.x0: X0}, options=opts)
                    res = ("ok", float(got[0]), float(got[1]) if len(got) > 1 else None)
                except dcf.errors.DcfError as e:
                    res = ("error", type(e).__name__, str(e))
                av, bv, cv, qn = sess.run([b.a, b.b, b.c, b.q.size()])
                outs.append(res + (float(av), np.asarray(bv).copy(),
                                   list(LOG) + [("o", 0, float(cv)), ("o", -1, float(qn))]))
    return outs


def run_ref(prog):
    r = Ref()
    outs = []
    for _ in range(2):
        r.log = []
        try:
            x = r.run(prog, X0)
            res = ("ok", x.v, x.d)
        except RefError as e:
            res = ("error", e.args[0], str(e.args[1]))
        outs.append(res + (float(r.a), r.b.copy(),
                           list(r.log) + [("o", 0, r.c), ("o", -1, float(len(r.q)))]))
    return outs


# open bugs, reported once per program: a scatter_update of host updates into a
# variable held on a GPU, from the second run on (the GPU actor runs it on the host)
KNOWN = ("Unsupported type <class 'numpy.ndarray'>",)
ERR_CLASS = {"pyfunc": None, "gather": None, "ta": "InvalidArgumentError"}  # gather: IndexError -> OutOfRangeError (dcf.errors)


def _strict(log):
    """The events the program orders: all but counter-only logs, with each parallel pair
    sorted."""
    out = [e[:2] + (round(e[2], 9),) for e in log if e[0] not in UNORDERED]
    i = 0
    while i < len(out) - 1:
        if out[i][0] == "p" and out[i + 1][0] == "p" and out[i][1] == -out[i + 1][1]:
            out[i], out[i + 1] = sorted([out[i], out[i + 1]])
            i += 2
        else:
            i += 1
    return out


UNORDERED = ("i", "o", "m")   # counter-only logs, logs and counts of ops with outside
#                               control inputs only, map_fn's logs


def _counter_logs(log):
    return sorted((e[0], e[1], round(e[2], 9)) for e in log if e[0] in UNORDERED)


def compare(want, got, name):
    """A list of differences between a reference result and a path's result."""
    diffs = []
    if len(want) != len(got) and not (got[-1][0] == "error" and
                                      any(k in got[-1][2] for k in KNOWN)):
        return [f"{name}: {len(got)} runs vs {len(want)}"]
    for r, (w, g) in enumerate(zip(want, got)):
        if g[0] == "error" and any(k in g[2] for k in KNOWN):
            return [f"{name} run {r}: known: {g[2].splitlines()[0]}"]
        if w[0] != g[0]:
            return [f"{name} run {r}: {g[:3]} vs {w[:3]}"]
        if w[0] == "ok":
            if not np.isclose(w[1], g[1], rtol=1e-9, atol=1e-12):
                diffs.append(f"{name} run {r}: x {g[1]!r} vs {w[1]!r}")
            if not np.isclose(w[2], g[2] or 0.0, rtol=1e-7, atol=1e-12):
                diffs.append(f"{name} run {r}: dx/dx0 {g[2]!r} vs {w[2]!r}")
        wa, wb, wl = w[-3:]
        ga, gb, gl = g[-3:]
        if not np.isclose(wa, ga, rtol=1e-9, atol=1e-12):
            diffs.append(f"{name} run {r}: a {ga!r} vs {wa!r}")
        if not np.allclose(wb, gb, rtol=1e-9, atol=1e-12):
            diffs.append(f"{name} run {r}: b {gb} vs {wb}")
        ws, gs = _strict(wl), _strict(gl)
        if len(ws) != len(gs) or any(
                a[:2] != b[:2] or not np.isclose(a[2], b[2], rtol=1e-9, atol=1e-12)
                for a, b in zip(ws, gs)):
            diffs.append(f"{name} run {r}: ordered log {gs} vs {ws}")
        if w[0] == "ok" and _counter_logs(wl) != _counter_logs(gl):
            diffs.append(f"{name} run {r}: counter logs {_counter_logs(gl)} vs "
                         f"{_counter_logs(wl)}")
        if w[0] == "error":
            diffs += _check_error(name, r, w, g)
    return diffs


def _check_error(name, r, w, g):
    kind, it = w[1], w[2]
    want_cls = ERR_CLASS[kind]
    msg = g[2]
    out = []
    if want_cls and g[1] != want_cls:
        out.append(f"{name} run {r}: error class {g[1]} for {kind}, want {want_cls}")
    if f"iteration {it}" not in msg and f"iteration={it}" not in msg:
        out.append(f"{name} run {r}: {kind} error does not name iteration {it}: {msg!r}")
    return out


def check(seed, paths=tuple(PATHS), cluster=None, show=False):
    prog = gen(random.Random(seed))
    if show:
        print(seed, prog)
    return check_prog(prog, paths, cluster)[0]


def check_prog(prog, paths=tuple(PATHS), cluster=None):
    """(differences, {path: results}) of one program."""
    want = run_ref(prog)
    diffs, results = [], {}
    for name in paths:
        devs, config, trace = PATHS[name]
        try:
            ctx = stand_in_gpus() if name.startswith("gpu") else contextlib.nullcontext()
            with ctx:
                results[name] = run_path(prog, devs, config, trace)
        except Exception:
            diffs.append(f"{name}: crashed: {traceback.format_exc(limit=3)}")
            continue
        diffs += compare(want, results[name], name)
    if cluster is not None:
        try:
            got = results["cluster"] = run_path(prog, CLUSTER_DEVS, {}, False,
                                                cluster=cluster,
                                                host="/job:localhost/task:0/cpu:0")
            diffs += compare(want, got, "cluster")
        except Exception:
            diffs.append(f"cluster: crashed: {traceback.format_exc(limit=3)}")
    results = {k: r for k, r in results.items()
               if not (r[-1][0] == "error" and any(m in r[-1][2] for m in KNOWN))}
    grads = {k: [run[2] if run[0] == "ok" else "error" for run in r]
             for k, r in results.items()}
    first = next(iter(grads.values()), None)
    for k, gs in grads.items():
        if not all("error" in (a, b) or (a is None) == (b is None) and
                   (a is None or np.isclose(a, b, rtol=1e-9)) for a, b in zip(gs, first)):
            diffs.append(f"{k}: gradient {gs} vs {first} ({next(iter(grads))})")
    if want[-1][0] == "error":
        firsts = {k: re.sub(r" on (/job:\w+/task:\d+)?/\w+:\d+", "", r[-1][2].splitlines()[0])
                  for k, r in results.items() if r[-1][0] == "error"}
        if len(set(firsts.values())) > 1:
            diffs.append(f"error messages differ: {firsts}")
        names = {r[-1][1] for r in results.values() if r[-1][0] == "error"}
        if len(names) > 1:
            diffs.append(f"error classes differ: "
                         f"{ {k: r[-1][1] for k, r in results.items()} }")
    return diffs, results


def _loop_only(block):
    """Whether `block` holds, outside any loop of its own, a statement that needs one."""
    return any(s[0] in ("ilog", "err") or s[0] == "cond" and (_loop_only(s[5]) or
               _loop_only(s[6])) for s in block)


def _smaller(prog):
    """Programs one step smaller than `prog`: a statement dropped, a compound statement
    replaced by one of its blocks, or a block of it shrunk."""
    for i, s in enumerate(prog):
        if len(prog) > 1:
            yield prog[:i] + prog[i + 1:]
        for j, part in enumerate(s):
            if isinstance(part, list):
                if s[0] == "cond" or not _loop_only(part):
                    yield prog[:i] + part + prog[i + 1:]
                for sub in _smaller(part):
                    yield prog[:i] + [s[:j] + (sub,) + s[j + 1:]] + prog[i + 1:]
        if s[0] in ("while", "ta") and s[3] > 1:
            yield prog[:i] + [s[:3] + (s[3] - 1,) + s[4:]] + prog[i + 1:]


def minimise(prog, paths):
    """The smallest program found (greedily) on which `paths` still disagree with the
    reference."""
    def bad(p):
        diffs = check_prog(p, paths)[0]
        return diffs and not any("crashed" in d for d in diffs)
    assert bad(prog)
    progress = True
    while progress:
        progress = False
        for cand in _smaller(prog):
            if bad(cand):
                prog, progress = cand, True
                break
    return prog


def main(argv):
    flags = [a for a in argv if a.startswith("--")]
    nums = [int(a) for a in argv if not a.startswith("--")]
    first, last = (nums + [0, 49])[:2] if len(nums) != 1 else (nums[0], nums[0])
    cluster = dcf.Cluster.local(2) if "--cluster" in flags else None
    bad = 0
    try:
        for seed in range(first, last + 1):
            diffs = check(seed, cluster=cluster, show="--show" in flags)
            for d in diffs:
                print(f"seed {seed}: {d}", flush=True)
            if diffs and "--min" in flags:
                paths = sorted({d.split(" ")[0].rstrip(":") for d in diffs} & set(PATHS))
                print(f"seed {seed}: minimal on {paths}:",
                      minimise(gen(random.Random(seed)), paths), flush=True)
            bad += bool(diffs)
    finally:
        if cluster is not None:
            cluster.close()
    print(f"{last - first + 1} programs, {bad} with disagreements")


if __name__ == "__main__":
    main(sys.argv[1:])
