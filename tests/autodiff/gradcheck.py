"""`check_grads`: dcf's gradients against float64 central finite differences.

Modelled on autograd's `check_vjp`: for a random cotangent `ct` (shaped like the
output) and a random direction `v` (shaped like the inputs), the adjoint identity

    <ct, (f(x + eps v) - f(x - eps v)) / (2 eps)>  ==  <J^T ct, v>

is one scalar comparison whatever the shapes; the right side is dcf.gradients with
grad_ys=ct. The forward runs in a dcf.Session from float64 placeholders (the same
session runs the gradient), so the check covers the runtime, not a reference
evaluator. A failure prints both numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import dcf

__all__ = ["OPTS", "check_grads", "run"]

#: Every run in these tests is bounded: a hang fails with DeadlineExceededError.
OPTS = dcf.RunOptions(timeout_s=60.0)


def run(fetches: Any, feed: dict | None = None, config: dcf.SessionConfig | None = None) -> Any:
    """Run `fetches` of the default graph in a fresh Session."""
    with dcf.Session(config=config) as sess:
        return sess.run(fetches, feed, options=OPTS)


def check_grads(build_fn: Callable[..., Any], inputs: list, *,
                config: dcf.SessionConfig | None = None, eps: float = 1e-6,
                rtol: float = 1e-6, atol: float = 1e-9, seed: int = 0) -> float:
    """Check dcf's gradients of `build_fn(*placeholders)` w.r.t. every input.

    build_fn: takes one float64 placeholder per array in `inputs` (static shapes)
    and returns a float tensor of any shape; Variables it makes are initialised once
    and held fixed. config: the SessionConfig to run with.
    Returns the analytic value <J^T ct, v> (so callers can also check it is not 0).
    """
    args = [np.asarray(a, dtype=np.float64) for a in inputs]
    rng = np.random.default_rng(seed)
    g = dcf.Graph()
    with g.as_default():
        xs = [dcf.placeholder(dcf.float64, a.shape, name=f"x{i}") for i, a in enumerate(args)]
        y = dcf.convert_to_tensor(build_fn(*xs))
        ct_t = dcf.placeholder(dcf.float64, y.shape, name="ct")
        grads = dcf.gradients(y, xs, grad_ys=ct_t)
        live = [gr for gr in grads if gr is not None]
        if not live:
            raise AssertionError("check_grads: no input has a path to the output")
        init = dcf.global_variables_initializer()
        with dcf.Session(config=config) as sess:
            sess.run(init, options=OPTS)   # variables build_fn made (e.g. an RNN cell's) keep their values
            y0 = np.asarray(sess.run(y, dict(zip(xs, args)), options=OPTS))
            ct = rng.standard_normal(y0.shape)
            vs = [rng.standard_normal(a.shape) for a in args]
            yp = sess.run(y, {x: a + eps * v for x, a, v in zip(xs, args, vs)}, options=OPTS)
            ym = sess.run(y, {x: a - eps * v for x, a, v in zip(xs, args, vs)}, options=OPTS)
            gvals = sess.run(live, {**dict(zip(xs, args)), ct_t: ct}, options=OPTS)
    numeric = float(np.sum(ct * (np.asarray(yp) - np.asarray(ym))) / (2 * eps))
    it = iter(gvals)
    analytic = float(sum(np.sum(np.asarray(next(it)) * v)
                         for gr, v in zip(grads, vs) if gr is not None))
    assert np.isclose(numeric, analytic, rtol=rtol, atol=atol), (
        f"<ct, J v> = {numeric!r} (finite differences) but <J^T ct, v> = {analytic!r} "
        f"(dcf.gradients); difference {numeric - analytic!r}")
    return analytic
