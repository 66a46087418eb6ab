"""Executor hot-path micro-benchmark: nodes/s, µs per loop iteration, µs per Session.run.

(a) **Fired nodes per second** in root-frame graphs of trivial kernels on int32 scalars
    (the root frame always runs on the tagged-token executor, so compile_frames True and
    False should agree):

    * ``chain identity``: ``x`` (fed) through ``W`` chained ``identity`` ops;
    * ``chain add``: ``x`` through ``W`` chained ``+ 1`` ops (one shared Const);
    * ``wide identity``: ``W`` independent ``identity(x)`` joined by one ``group`` (NoOp),
      so the ready queue holds ``W`` nodes at once;

    with ``W = 2,000``. Rate = ``RunMetadata().step_stats["nodes_fired"]`` / median run
    time (includes the fixed cost of one run, (c), about 1-2 % here).
(b) **Cost of one while_loop iteration**, trivial body ``i += 1`` with ``n`` fed, on the
    tagged-token executor (``compile_frames=False``) and on the compiled path (default),
    parallel_iterations 1 and 32: ``(t(n) - t(0)) / n`` from the medians, so the fixed
    cost of a run drops out. Also reported as nodes fired per iteration.
(c) **Fixed cost of one Session.run** of a tiny graph: fetch ``x + 1`` with an int32 ``x``
    fed, and fetch a Const with no feed.

TF1 (``tf.compat.v1`` graph mode, control flow v1), where importable, runs the same
graphs in the same process, with Grappler off (``disable_meta_optimizer``) so that it
fires every node too instead of removing identities or folding the add chain; its
per-iteration figure comes from ``bench.peers.tf1_loop_rate`` at ``n`` and ``1``
(Grappler on, as in bench.loop_rate). Ratios are dcf / TF1 of rates (> 1: dcf faster),
or TF1 / dcf of times, so > 1 always means dcf is faster.

    python -m bench.executor [--quick] [--out FILE]
"""

from __future__ import annotations

import os
from typing import Any

import dcf
from bench.harness import (
    Result,
    Stats,
    base_argparser,
    peer_available,
    peer_versions,
    report,
    time_call,
)
from bench.loop_rate import machine_config

WIDTH = 2_000
SYSTEMS = {"dcf": True, "dcf-executor": False}  # system -> compile_frames


def _scalar(system: str, metric: str, value: float, unit: str) -> Result:
    return Result(system=system, metric=metric, median=value, min=value, max=value, unit=unit)


# --------------------------------------------------------------------------- graphs
def build_graph(kind: str, width: int) -> tuple[dcf.Graph, Any, Any]:
    """(graph, x placeholder or None, fetch) of one workload, in dcf."""
    g = dcf.Graph()
    with g.as_default():
        if kind == "const":
            return g, None, dcf.constant(7, dtype=dcf.int32, name="c")
        x = dcf.placeholder(dcf.int32, shape=[], name="x")
        if kind == "tiny":
            return g, x, x + 1
        if kind == "chain identity":
            y = x
            for _ in range(width):
                y = dcf.identity(y)
            return g, x, y
        if kind == "chain add":
            one = dcf.constant(1, dtype=dcf.int32, name="one")
            y = x
            for _ in range(width):
                y = y + one
            return g, x, y
        if kind == "wide identity":
            ys = [dcf.identity(x) for _ in range(width)]
            return g, x, dcf.group(*ys)
        if kind == "loop":
            raise ValueError("use build_loop")
    raise ValueError(f"unknown graph kind {kind!r}")


def expected(kind: str, x: int, width: int) -> Any:
    return {"const": 7, "tiny": x + 1, "chain identity": x, "chain add": x + width,
            "wide identity": None}[kind]


def build_loop(pi: int) -> tuple[dcf.Graph, Any, Any]:
    g = dcf.Graph()
    with g.as_default():
        n = dcf.placeholder(dcf.int32, shape=[], name="n")
        out = dcf.while_loop(lambda i: i < n, lambda i: i + 1,
                             dcf.constant(0, dtype=dcf.int32), parallel_iterations=pi)
    return g, n, out


def session(graph: dcf.Graph, system: str) -> dcf.Session:
    return dcf.Session(graph=graph, config=dcf.SessionConfig(compile_frames=SYSTEMS[system]))


def run_checked(sess: dcf.Session, fetch: Any, feed: dict, want: Any) -> int:
    """One run; check the value; return the nodes it fired."""
    md = dcf.RunMetadata()
    got = sess.run(fetch, feed, run_metadata=md)
    if want is not None and int(got) != want:
        raise RuntimeError(f"dcf computed {got!r}, expected {want}")
    return int(md.step_stats.get("nodes_fired", -1))


def time_run(sess: dcf.Session, fetch: Any, feed: dict, repeat: int, warmup: int,
             number: int = 1) -> Stats:
    return time_call(lambda: sess.run(fetch, feed), repeat=repeat, warmup=warmup, number=number)


# ------------------------------------------------------------------------ TF1 side
def _tf1_session(graph: Any) -> Any:
    from bench.peers import _tf1

    _, v1 = _tf1()
    from tensorflow.core.protobuf import rewriter_config_pb2

    rw = rewriter_config_pb2.RewriterConfig(disable_meta_optimizer=True)
    cfg = v1.ConfigProto(graph_options=v1.GraphOptions(rewrite_options=rw))
    return v1.Session(graph=graph, config=cfg)


def tf1_graph_stats(kind: str, width: int, repeat: int, warmup: int, number: int) -> Stats:
    """TF1 time of one sess.run of the same graph as :func:`build_graph` (Grappler off)."""
    from bench.peers import _tf1

    tf, v1 = _tf1()
    g = tf.Graph()
    with g.as_default():
        feed: dict = {}
        if kind == "const":
            fetch = tf.constant(7, dtype=tf.int32)
        else:
            x = v1.placeholder(tf.int32, shape=[], name="x")
            feed = {x: 3}
            if kind == "tiny":
                fetch = x + 1
            elif kind == "chain identity":
                fetch = x
                for _ in range(width):
                    fetch = tf.identity(fetch)
            elif kind == "chain add":
                one = tf.constant(1, dtype=tf.int32)
                fetch = x
                for _ in range(width):
                    fetch = fetch + one
            elif kind == "wide identity":
                fetch = tf.group(*[tf.identity(x) for _ in range(width)])
            else:
                raise ValueError(kind)
    num_ops = len(g.get_operations())
    with _tf1_session(g) as sess:
        got = sess.run(fetch, feed)
        want = expected(kind, 3, width)
        if want is not None and int(got) != want:
            raise RuntimeError(f"TF1 {kind} computed {got}, expected {want}")
        stats = time_call(lambda: sess.run(fetch, feed), repeat=repeat, warmup=warmup,
                          number=number)
    stats.extra["num_ops"] = num_ops
    return stats


# --------------------------------------------------------------------------- driver
def run(quick: bool) -> tuple[dict, list[Result], dict]:
    repeat, warmup = (5, 1) if quick else (15, 2)
    width = WIDTH
    n_exec = 10_000 if quick else 50_000       # loop iterations, tagged-token executor
    n_comp = 100_000 if quick else 500_000     # loop iterations, compiled path
    have_tf1 = peer_available("tf1")
    load_before = os.getloadavg()
    results: list[Result] = []
    ratios: dict[str, Any] = {}
    facts: dict[str, Any] = {}

    # (c) fixed cost of one run -------------------------------------------------------
    fixed: dict[tuple[str, str], float] = {}
    for kind in ("tiny", "const"):
        g, x, fetch = build_graph(kind, width)
        feed = {x: 3} if x is not None else {}
        for system in SYSTEMS:
            with session(g, system) as s:
                fired = run_checked(s, fetch, feed, expected(kind, 3, width))
                st = time_run(s, fetch, feed, repeat, warmup, 200 if not quick else 50)
            fixed[(system, kind)] = st.median
            results.append(Result.from_stats(system, f"run {kind}", st, unit="µs", scale=1e6))
            facts[f"{system} run {kind} nodes_fired"] = fired
        if have_tf1:
            st = tf1_graph_stats(kind, width, repeat, warmup, 200 if not quick else 50)
            results.append(Result.from_stats("tf1", f"run {kind}", st, unit="µs", scale=1e6))
            ratios[f"run {kind} (tf1 time / dcf time)"] = st.median / fixed[("dcf", kind)]

    # (a) nodes per second in the root frame --------------------------------------------
    for kind in ("chain identity", "chain add", "wide identity"):
        g, x, fetch = build_graph(kind, width)
        feed = {x: 3}
        rate: dict[str, float] = {}
        for system in SYSTEMS:
            with session(g, system) as s:
                fired = run_checked(s, fetch, feed, expected(kind, 3, width))
                st = time_run(s, fetch, feed, repeat, warmup)
            res = Result.rate(system, f"{kind} W={width} nodes/s", st, fired, unit="nodes/s")
            results.append(res)
            rate[system] = res.median
            net = (st.median - fixed[(system, "tiny")]) / max(fired - 1, 1)
            facts[f"{system} {kind} nodes_fired"] = fired
            facts[f"{system} {kind} µs/node (net of run cost)"] = round(net * 1e6, 4)
        if have_tf1:
            st = tf1_graph_stats(kind, width, repeat, warmup, 1)
            # TF1 executes every op of the graph except the fed placeholder
            nodes = st.extra["num_ops"] - 1
            res = Result.rate("tf1", f"{kind} W={width} nodes/s", st, nodes, unit="nodes/s")
            results.append(res)
            ratios[f"{kind} nodes/s (dcf / tf1)"] = rate["dcf"] / res.median

    # (b) one while_loop iteration ------------------------------------------------------
    per_iter: dict[tuple[str, int], float] = {}
    for pi in (1, 32):
        g, n_ph, out = build_loop(pi)
        for system, compiled in SYSTEMS.items():
            n = n_comp if compiled else n_exec
            with session(g, system) as s:
                fired0 = run_checked(s, out, {n_ph: 0}, 0)
                fired = run_checked(s, out, {n_ph: n}, n)
                st0 = time_run(s, out, {n_ph: 0}, repeat, warmup, 50)
                st = time_run(s, out, {n_ph: n}, repeat, warmup)
            samples = [(t - st0.median) / n for t in st.samples]
            it_st = Stats.from_samples(samples)
            per_iter[(system, pi)] = it_st.median
            results.append(Result.from_stats(system, f"loop iteration pi={pi}", it_st,
                                             unit="µs", scale=1e6))
            facts[f"{system} loop pi={pi} n"] = n
            facts[f"{system} loop pi={pi} nodes_fired/iteration"] = round((fired - fired0) / n, 3)
            facts[f"{system} loop pi={pi} run n=0 µs"] = round(st0.median * 1e6, 2)
        if have_tf1:
            from bench.peers import tf1_loop_rate

            n_tf = 20_000 if quick else 100_000
            st_n = tf1_loop_rate(n_tf, pi, "trivial", repeat=repeat, warmup=warmup)
            st_1 = tf1_loop_rate(1, pi, "trivial", repeat=repeat, warmup=warmup)
            samples = [(t - st_1.median) / (n_tf - 1) for t in st_n.samples]
            it_st = Stats.from_samples(samples)
            results.append(Result.from_stats("tf1", f"loop iteration pi={pi}", it_st,
                                             unit="µs", scale=1e6))
            facts[f"tf1 loop pi={pi} run n=1 µs"] = round(st_1.median * 1e6, 2)
            for system in SYSTEMS:
                ratios[f"{system} loop iteration pi={pi} (tf1 time / dcf time)"] = (
                    it_st.median / per_iter[(system, pi)])

    config: dict[str, Any] = {
        "quick": quick,
        "repeat": repeat,
        "warmup": warmup,
        "width": width,
        "loop_n": {"dcf": n_comp, "dcf-executor": n_exec},
        "tf1": have_tf1,
        **machine_config(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "peers": peer_versions(),
        "facts": facts,
    }
    return config, results, ratios


def main(argv: list[str] | None = None) -> None:
    args = base_argparser(__doc__.splitlines()[0]).parse_args(argv)
    config, results, ratios = run(args.quick)
    report("executor", config, results, ratios, out=args.out)


if __name__ == "__main__":
    main()
