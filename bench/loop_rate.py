"""In-graph loop overhead: iterations/s of one ``Session.run`` of an n-iteration loop.

Two loop bodies, each at parallel_iterations 1 and 32:

* ``trivial``: ``i = 0; while i < n: i += 1`` on int32 scalars (n = 100,000; quick 20,000);
* ``matmul64``: loop vars ``(i, a)``, cond ``i < n``, body ``(i + 1, tanh(a @ w))`` with a
  64x64 float32 ``a`` fed through a placeholder and ``w`` a constant the loop captures
  (``bench.peers.matmul64_data``; n = 5,000; quick 1,000).

Systems, all in this one process and environment:

* ``dcf``: the default ``SessionConfig()`` (loop frames that sit on one device run as
  compiled straight-line Python, ``dcf.frame_compiler``);
* ``dcf-executor``: ``SessionConfig(compile_frames=False)``, the pure tagged-token
  executor (``dcf.executor``), so both paths stay visible;
* ``tf1``: TensorFlow ``tf.compat.v1`` graph mode with control flow v1
  (``bench.peers.tf1_loop_rate``), where importable;
* ``python`` (reference, not a peer): the same loop written directly in Python on the
  same numpy values (``np.int32`` scalars; ``np.tanh(a @ w)``): the floor for any
  runtime whose kernels are numpy calls.

dcf feeds ``n`` through an int32 placeholder (one graph serves every check and size);
TF1's workload has ``n`` as a graph constant. The matmul64 TF1 fetch is
``reduce_sum(a)``, dcf's is ``a`` itself (one 64x64 reduction per run, < 0.01 % of it).
Each dcf result is checked before it is timed (``i == n``; ``a`` against a numpy
reference computed once). The systems are measured in interleaved rounds (3 blocks of 5
runs each, quick 2 of 3), so a burst of outside load on a shared machine hits all alike.
Ratios are dcf / TF1 of the medians (> 1: dcf is faster); ``executor_*`` ratios are
dcf-executor / TF1; ``*_vs_tf1_best`` divides dcf's median by TF1's fastest run (TF1's
matmul64 rate is bimodal per session, about 60k or 100k it/s on the 2-core machine of
bench/NOTES.md, so this is the conservative ratio).

    python -m bench.loop_rate [--quick] [--out FILE]
    python -m bench.loop_rate --profile trivial:dcf-executor:32   # where the time goes
"""

from __future__ import annotations

import functools
import math
import os
import platform
from collections.abc import Callable
from typing import Any

import numpy as np

import dcf
from bench.harness import (
    Result,
    Stats,
    base_argparser,
    cpu_model,
    peer_available,
    peer_versions,
    report,
    source_fingerprint,
    time_call,
)
from bench.peers import matmul64_data

WORKLOADS = ("trivial", "matmul64")
PARALLEL_ITERATIONS = (1, 32)
DCF_SYSTEMS = {"dcf": True, "dcf-executor": False}  # system -> compile_frames


#: The hot-path sources whose content a result depends on (fingerprinted in the config,
#: since the tree may hold uncommitted edits when a benchmark runs).
HOT_PATH_FILES = ("executor.py", "frame_compiler.py", "session.py", "plan.py",
                  "actors/device_actor.py", "ops/registry.py", "ops/math_ops.py",
                  "ops/control_ops.py")


def machine_config() -> dict[str, Any]:
    """Facts about this machine, environment and dcf source for a benchmark's config."""
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dcf": getattr(dcf, "__version__", "?"),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "dcf_source": source_fingerprint(HOT_PATH_FILES),
    }


# --------------------------------------------------------------------------- dcf side
class DcfLoop:
    """One dcf loop graph (a body at one parallel_iterations) and a session per config."""

    def __init__(self, body: str, parallel_iterations: int) -> None:
        self.body = body
        self.graph = dcf.Graph()
        with self.graph.as_default():
            self.n = dcf.placeholder(dcf.int32, shape=[], name="n")
            i0 = dcf.constant(0, dtype=dcf.int32, name="i0")
            if body == "trivial":
                self.fetch = dcf.while_loop(
                    lambda i: i < self.n,
                    lambda i: i + 1,
                    i0,
                    parallel_iterations=parallel_iterations,
                )
                self.a0 = None
            elif body == "matmul64":
                a0_np, w_np = matmul64_data()
                self.a0_np = a0_np
                self.a0 = dcf.placeholder(dcf.float32, shape=a0_np.shape, name="a0")
                w = dcf.constant(w_np, name="w")
                _, self.fetch = dcf.while_loop(
                    lambda i, a: i < self.n,
                    lambda i, a: (i + 1, dcf.tanh(dcf.matmul(a, w))),
                    (i0, self.a0),
                    parallel_iterations=parallel_iterations,
                )
            else:
                raise ValueError(f"unknown body {body!r}")
        self.sessions: dict[str, dcf.Session] = {}

    def session(self, system: str) -> dcf.Session:
        s = self.sessions.get(system)
        if s is None:
            cfg = dcf.SessionConfig(compile_frames=DCF_SYSTEMS[system])
            s = self.sessions[system] = dcf.Session(graph=self.graph, config=cfg)
        return s

    def feed(self, n: int) -> dict:
        fd: dict = {self.n: n}
        if self.a0 is not None:
            fd[self.a0] = self.a0_np
        return fd

    def run(self, system: str, n: int, run_metadata: Any = None) -> Any:
        return self.session(system).run(self.fetch, self.feed(n), run_metadata=run_metadata)

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()


_REFERENCE: dict[int, np.ndarray] = {}


def matmul64_reference(n: int) -> np.ndarray:
    """``a`` after ``n`` steps of ``a = tanh(a @ w)`` in numpy float32 (computed once)."""
    ref = _REFERENCE.get(n)
    if ref is None:
        a, w = matmul64_data()
        for _ in range(n):
            a = np.tanh(a @ w)
        ref = _REFERENCE[n] = a
    return ref


def check(loop: DcfLoop, system: str, n: int) -> int:
    """Run once, check the value; return the nodes the run fired."""
    md = dcf.RunMetadata()
    got = loop.run(system, n, md)
    if loop.body == "trivial":
        if int(got) != n or np.asarray(got).dtype != np.int32:
            raise RuntimeError(f"{system} trivial loop returned {got!r}, expected int32 {n}")
    else:
        ref = matmul64_reference(n)
        if got.shape != ref.shape or got.dtype != np.float32 or \
                not np.allclose(got, ref, rtol=1e-5, atol=1e-6):
            err = float(np.max(np.abs(np.asarray(got, np.float64) - ref)))
            raise RuntimeError(f"{system} matmul64 loop differs from numpy (max abs err {err})")
    return int(md.step_stats.get("nodes_fired", -1))


# ------------------------------------------------------------------ python reference
def measure_python(body: str, n: int, repeat: int, warmup: int) -> Stats:
    """The loop written directly in Python on the values dcf's kernels compute with."""
    if body == "trivial":
        limit, one = np.int32(n), np.int32(1)

        def fn() -> Any:
            i = np.int32(0)
            while i < limit:
                i = i + one
            return i

        if int(fn()) != n:
            raise RuntimeError("python reference loop is wrong")
    else:
        a0, w = matmul64_data()

        def fn() -> Any:
            a = a0
            i = 0
            while i < n:
                a = np.tanh(a @ w)
                i += 1
            return a

    return time_call(fn, repeat=repeat, warmup=warmup)


# --------------------------------------------------------------------------- driver
def _time_dcf(loop: DcfLoop, system: str, n: int, repeat: int, warmup: int) -> Stats:
    return time_call(lambda: loop.run(system, n), repeat=repeat, warmup=warmup)


def _time_tf1(body: str, n: int, pi: int, repeat: int, warmup: int) -> Stats:
    from bench.peers import tf1_loop_rate

    return tf1_loop_rate(n, pi, body, repeat=repeat, warmup=warmup)  # type: ignore[arg-type]


def interleaved(measures: dict[str, Callable[[int, int], Stats]], repeat: int, warmup: int,
                rounds: int) -> dict[str, Stats]:
    """Measure every system in ``rounds`` round-robin blocks and pool the samples.

    Each block is ``measure(per_round, warmup)``, ``per_round = ceil(repeat / rounds)``:
    on a shared machine a burst of outside load then lands on every system alike
    instead of on whichever happened to be measured at the time.
    """
    per_round = max(1, math.ceil(repeat / rounds))
    samples: dict[str, list[float]] = {k: [] for k in measures}
    extra: dict[str, dict] = {}
    for _ in range(rounds):
        for k, measure in measures.items():
            st = measure(per_round, warmup)
            samples[k].extend(st.samples)
            extra[k] = st.extra
    return {k: Stats.from_samples(v, extra=extra[k]) for k, v in samples.items()}


def run(quick: bool) -> tuple[dict, list[Result], dict]:
    repeat, warmup, rounds = (6, 1, 2) if quick else (15, 2, 3)
    sizes = {"trivial": 20_000 if quick else 100_000, "matmul64": 1_000 if quick else 5_000}
    have_tf1 = peer_available("tf1")
    results: list[Result] = []
    ratios: dict[str, Any] = {}
    facts: dict[str, Any] = {}
    load_before = os.getloadavg()
    for body in WORKLOADS:
        n = sizes[body]
        for pi in PARALLEL_ITERATIONS:
            key = f"{body}_pi{pi}"
            metric = f"{body} n={n} pi={pi}"
            loop = DcfLoop(body, pi)
            try:
                measures: dict[str, Callable[[int, int], Stats]] = {}
                for system in DCF_SYSTEMS:
                    fired = check(loop, system, n)
                    facts[f"{system} {key} nodes_fired/iteration"] = round(fired / n, 3)
                    measures[system] = functools.partial(_time_dcf, loop, system, n)
                if pi == PARALLEL_ITERATIONS[0]:
                    measures["python"] = functools.partial(measure_python, body, n)
                if have_tf1:
                    measures["tf1"] = functools.partial(_time_tf1, body, n, pi)
                stats = interleaved(measures, repeat, warmup, rounds)
            finally:
                loop.close()
            rows = {k: Result.rate(k, metric if k != "python" else f"{body} n={n}", st, n)
                    for k, st in stats.items()}
            results.extend(rows.values())
            if "tf1" in stats:
                facts[f"tf1 {key} final"] = stats["tf1"].extra.get("final")
            tf1 = rows.get("tf1")
            if tf1 is not None and tf1.median:
                ratios[key] = rows["dcf"].median / tf1.median
                ratios[f"executor_{key}"] = rows["dcf-executor"].median / tf1.median
                # against TF1's fastest run: TF1's matmul64 rate is bimodal per session
                ratios[f"{key}_vs_tf1_best"] = rows["dcf"].median / tf1.max
            else:
                ratios[key] = None
                ratios[f"executor_{key}"] = None
    config: dict[str, Any] = {
        "quick": quick,
        "repeat": repeat,
        "warmup": warmup,
        "rounds": rounds,
        "n": sizes,
        "parallel_iterations": list(PARALLEL_ITERATIONS),
        "tf1": have_tf1,
        **machine_config(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "peers": peer_versions(),
        "facts": facts,
    }
    return config, results, ratios


def profile(spec: str, top: int = 20) -> None:
    """cProfile one dcf run of a loop_rate workload: ``BODY:SYSTEM[:PI]``.

    Prints each function's calls per iteration and its self/cumulative time per
    iteration, scaled so the total matches an unprofiled run (cProfile's own cost per
    call inflates small functions; the shares are indicative, the call counts exact).
    """
    import cProfile
    import pstats

    parts = spec.split(":")
    body, system = parts[0], parts[1]
    pi = int(parts[2]) if len(parts) > 2 else 32
    n = {"trivial": 50_000, "matmul64": 5_000}[body]
    loop = DcfLoop(body, pi)
    try:
        check(loop, system, n)
        st = time_call(lambda: loop.run(system, n), repeat=5, warmup=1)
        prof = cProfile.Profile()
        prof.enable()
        loop.run(system, n)
        prof.disable()
    finally:
        loop.close()
    stats = pstats.Stats(prof)
    rows = []
    for (fname, line, func), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = fname.replace(os.path.dirname(os.path.dirname(dcf.__file__)) + os.sep, "")
        rows.append((tottime, ncalls, cumtime, f"{where}:{line}({func})"))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows) or 1.0
    scale = st.median / total / n * 1e6  # profiled seconds -> unprofiled µs per iteration
    print(f"profile {body} system={system} pi={pi} n={n}: {st.median / n * 1e6:.3f} µs/iteration "
          f"unprofiled, {sum(r[1] for r in rows) / n:.1f} Python calls/iteration")
    print(f"{'share':>6} {'calls/it':>8} {'self µs/it':>10} {'cum µs/it':>9}  function")
    for tottime, ncalls, cumtime, name in rows[:top]:
        print(f"{tottime / total * 100:5.1f}% {ncalls / n:8.2f} {tottime * scale:10.3f} "
              f"{cumtime * scale:9.3f}  {name}")


def main(argv: list[str] | None = None) -> None:
    parser = base_argparser(__doc__.splitlines()[0])
    parser.add_argument(
        "--profile", metavar="BODY:SYSTEM[:PI]", default=None,
        help="instead of benchmarking, cProfile one dcf run, e.g. trivial:dcf-executor:32")
    args = parser.parse_args(argv)
    if args.profile:
        profile(args.profile)
        return
    config, results, ratios = run(args.quick)
    report("loop_rate", config, results, ratios, out=args.out)


if __name__ == "__main__":
    main()
