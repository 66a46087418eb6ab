"""Oracles for the op tests: a reference evaluator, a reference gradient walk and an
adjoint check of gradients against finite differences.

`run_op` evaluates graphs of kernel ops (no control flow) by calling each kernel in
topological order, checking every value against its op's inferred static type: dtype,
shape, and that 0-d values are numpy scalars. It stands in for dcf.Session in these tests.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np


def _import_ops() -> None:
    try:
        import dcf.ops
    except ImportError:
        # dcf/ops/__init__.py imports modules that may not exist yet in a partial checkout:
        # load the package without it, then only the op modules these tests need.
        import dcf

        pkg = types.ModuleType("dcf.ops")
        pkg.__path__ = [os.path.join(next(iter(dcf.__path__)), "ops")]
        sys.modules["dcf.ops"] = pkg
        dcf.ops = pkg  # type: ignore[attr-defined]
    import dcf.ops.array_ops
    import dcf.ops.math_ops
    import dcf.ops.nn_ops
    import dcf.ops.random_ops


_import_ops()

from dcf import dtypes
from dcf.graph import Graph, Tensor, TensorType, get_default_graph
from dcf.ops import math_ops
from dcf.ops.registry import GRADIENTS, OPS, apply


class FakeResources:
    """The device resources random kernels see: one Generator per op, kept across runs."""

    def __init__(self) -> None:
        self.rngs: dict[str, np.random.Generator] = {}

    def rng(self, node_name: str, seed: int | None) -> np.random.Generator:
        g = self.rngs.get(node_name)
        if g is None:
            g = self.rngs[node_name] = np.random.default_rng(seed)
        return g


def placeholder(dtype: Any, shape: Any = None, name: str = "Placeholder") -> Tensor:
    dt = dtypes.as_dtype(dtype)
    shp = None if shape is None else tuple(shape)
    if "Placeholder" in OPS:
        return apply("Placeholder", [], name=name, dtype=dt, shape=shp)
    g = get_default_graph()
    return g.create_op("Placeholder", [], [TensorType(dt, shp)], name=name).outputs[0]


def _as_value(v: Any, t: Tensor) -> Any:
    arr = np.array(v, dtype=t.dtype.np)
    return arr[()] if arr.ndim == 0 else _frozen(arr)


def _frozen(v: Any) -> Any:
    """Values are shared between consumers: kernels get them read-only, so a kernel that
    writes into an input fails loudly."""
    if isinstance(v, np.ndarray):
        v.setflags(write=False)
    return v


def check_value(t: Tensor, v: Any) -> None:
    """A runtime value agrees with its tensor's static type."""
    where = f"{t.op.type} '{t.op.name}' output {t.index}"
    assert isinstance(v, (np.ndarray, np.generic)), f"{where}: got {type(v).__name__}"
    if np.ndim(v) == 0:
        assert isinstance(v, np.generic), f"{where}: 0-d values must be numpy scalars"
    assert v.dtype == t.dtype.np, f"{where}: value dtype {v.dtype}, inferred {t.dtype}"
    if t.shape is not None:
        ok = len(t.shape) == np.ndim(v) and all(
            d is None or d == s for d, s in zip(t.shape, np.shape(v))
        )
        assert ok, f"{where}: value shape {np.shape(v)}, inferred {t.type}"


def _topo(tensors: list[Tensor], known: set) -> list:
    order: list = []
    seen: set = set()

    def visit(op):
        if op in seen:
            return
        seen.add(op)
        for t in op.inputs:
            if t not in known:
                visit(t.op)
        for c in op.control_inputs:
            visit(c)
        order.append(op)

    for t in tensors:
        if t not in known:
            visit(t.op)
    return order


def run_op(fetches: Any, feed: dict | None = None, res: FakeResources | None = None) -> Any:
    """Values of a tensor or a list of tensors; `feed` maps tensors to values."""
    single = isinstance(fetches, Tensor)
    fetch_list = [fetches] if single else list(fetches)
    values = {t: _as_value(v, t) for t, v in (feed or {}).items()}
    res = res if res is not None else FakeResources()
    for op in _topo(fetch_list, set(values)):
        if op.type == "Placeholder":
            raise KeyError(f"placeholder {op.name} must be fed")
        opdef = OPS[op.type]
        kw = dict(op.attrs)
        if opdef.resource:
            kw.update(res=res, node_name=op.name)
        out = opdef.kernel(np, *[values[t] for t in op.inputs], **kw)
        outs = (out,) if len(op.outputs) == 1 else out
        assert isinstance(outs, tuple) and len(outs) == len(op.outputs), op
        for t, v in zip(op.outputs, outs):
            check_value(t, v)
            values[t] = _frozen(v)
    out = [values[t] for t in fetch_list]
    if _ALSO_SESSION and not any(OPS[op.type].resource for op in _topo(fetch_list, set())):
        _compare_with_session(fetch_list, feed or {}, out)
    return out[0] if single else out


# DCF_OPS_ORACLE=session also runs every fetch through dcf.Session and compares.
_ALSO_SESSION = os.environ.get("DCF_OPS_ORACLE") == "session"


def _compare_with_session(fetches: list, feed: dict, want: list) -> None:
    from dcf.session import Session

    pairs = [(t, w) for t, w in zip(fetches, want) if t not in feed]
    if not pairs:
        return
    fetches, want = [t for t, _ in pairs], [w for _, w in pairs]
    with Session(graph=fetches[0].graph) as sess:
        got = sess.run(fetches, {t: _as_value(v, t) for t, v in feed.items()})
    for t, a, b in zip(fetches, got, want):
        assert np.shape(a) == np.shape(b) and np.asarray(a).dtype == np.asarray(b).dtype, t
        np.testing.assert_array_equal(a, b, err_msg=f"Session and reference differ on {t}")


# ------------------------------------------------------------------ gradients
def _total(gs: list | None) -> Tensor | None:
    if not gs:
        return None
    return gs[0] if len(gs) == 1 else math_ops.add_n(gs)


def gradients(ys: list[Tensor], xs: list[Tensor], grad_ys: list[Tensor]) -> list:
    """Reference reverse-mode walk over a graph without control flow, using GRADIENTS."""
    order = _topo(ys, set())
    grads: dict[Tensor, list] = {}
    for y, gy in zip(ys, grad_ys):
        grads.setdefault(y, []).append(gy)
    for op in reversed(order):
        out_grads = [_total(grads.get(t)) for t in op.outputs]
        if all(g is None for g in out_grads):
            continue
        if op.type not in GRADIENTS:
            raise LookupError(f"no gradient registered for op type {op.type!r}")
        fn = GRADIENTS[op.type]
        if fn is None:
            continue
        in_grads = fn(op, *out_grads)
        assert len(in_grads) == len(op.inputs), f"{op.type}: {len(in_grads)} grads"
        for t, gi in zip(op.inputs, in_grads):
            if gi is None:
                continue
            assert gi.dtype is t.dtype, f"{op.type}: grad {gi.type} for input {t.type}"
            if gi.shape is not None and t.shape is not None:
                assert len(gi.shape) == len(t.shape) and all(
                    a is None or b is None or a == b for a, b in zip(gi.shape, t.shape)
                ), f"{op.type}: grad {gi.type} for input {t.type}"
            grads.setdefault(t, []).append(gi)
    return [_total(grads.get(x)) for x in xs]


def _placeholders(args: list[np.ndarray], shapes: str) -> list[Tensor]:
    def shp(a):
        return {"static": a.shape, "dims": (None,) * a.ndim, "rank": None}[shapes]

    return [placeholder(dtypes.float64, shp(a), name=f"x{i}") for i, a in enumerate(args)]


def check_grads(
    f: Callable[..., Tensor],
    args: list,
    *,
    shapes: str = "static",
    order: int = 1,
    eps: float = 1e-6,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    seed: int = 0,
) -> None:
    """Adjoint check of the gradient graph of `f` (built from float64 placeholders):
    ``<ct, J v>`` by central differences equals ``<J^T ct, v>`` from the registered
    gradients, for a random cotangent ct and direction v. order=2 checks the gradient
    of the gradient the same way. `shapes` is how much the placeholders know:
    "static", "dims" (rank only) or "rank" (nothing)."""
    args = [np.asarray(a, dtype=np.float64) for a in args]
    rng = np.random.default_rng(seed)
    if order == 2:
        ct0 = rng.standard_normal(np.shape(_eval(f, args, shapes)))

        def f2(*xs):
            *inner, ct = xs
            return gradients([f(*inner)], [inner[0]], [ct])[0]

        return check_grads(
            f2, args + [ct0], shapes=shapes, eps=eps, rtol=rtol * 10, atol=atol * 10, seed=seed + 1
        )
    g = Graph()
    with g.as_default():
        xs = _placeholders(args, shapes)
        y = f(*xs)
        ct_t = placeholder(dtypes.float64, y.shape, name="ct")
    # outside the `with`: gradient functions must build into the graph of their op
    grads = gradients([y], xs, [ct_t])
    assert all(op.graph is g for op in g.get_operations())
    feed = dict(zip(xs, args))
    y0 = run_op(y, feed)
    ct = rng.standard_normal(np.shape(y0))
    vs = [rng.standard_normal(a.shape) for a in args]
    yp = run_op(y, {x: a + eps * v for x, a, v in zip(xs, args, vs)})
    ym = run_op(y, {x: a - eps * v for x, a, v in zip(xs, args, vs)})
    numeric = float(np.sum(ct * (yp - ym)) / (2 * eps))
    live = [gr for gr in grads if gr is not None]
    gvals = iter(run_op(live, {**feed, ct_t: ct}) if live else [])
    analytic = float(sum(np.sum(next(gvals) * v) for gr, v in zip(grads, vs) if gr is not None))
    assert np.isclose(numeric, analytic, rtol=rtol, atol=atol), (
        f"<ct, J v> = {numeric!r} (finite differences) but <J^T ct, v> = {analytic!r} (gradients)"
    )


def _eval(f: Callable[..., Tensor], args: list, shapes: str) -> Any:
    g = Graph()
    with g.as_default():
        xs = _placeholders(args, shapes)
        y = f(*xs)
    return run_op(y, dict(zip(xs, args)))


def build(f: Callable[..., Any]) -> tuple[Graph, Any]:
    """Build `f()` in a fresh graph; returns (graph, f's result)."""
    g = Graph()
    with g.as_default():
        return g, f()
