"""Every op on the GPU equals the CPU: the op tests of tests/ops, with each graph their
numpy oracle evaluates also run by a Session with every op placed on /gpu:0 and
compared (exactly for integers and booleans, to float rounding for floats)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ops import oracle

_TOL = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-12}


def compare_on_gpu(fetches: list, feed: dict, want: list) -> None:
    from dcf.session import Session

    pairs = [(t, w) for t, w in zip(fetches, want) if t not in feed]
    if not pairs:
        return
    fetches, want = [t for t, _ in pairs], [w for _, w in pairs]
    g = fetches[0].graph
    ops = g.get_operations()
    saved = [op.device for op in ops]
    for op in ops:
        op.device = "/gpu:0"
    try:
        with Session(graph=g) as sess:
            got = sess.run(fetches, {t: oracle._as_value(v, t) for t, v in feed.items()})
    finally:
        for op, d in zip(ops, saved):
            op.device = d
    for t, a, b in zip(fetches, got, want):
        a, b = np.asarray(a), np.asarray(b)
        assert type(a) is np.ndarray, f"{t}: GPU fetch gave {type(a)}"
        assert a.shape == b.shape and a.dtype == b.dtype, \
            f"{t}: GPU {a.dtype}{list(a.shape)} vs CPU {b.dtype}{list(b.shape)}"
        if b.dtype.kind in "fc":
            tol = _TOL.get(b.dtype, 1e-6)
            scale = float(np.max(np.abs(b[np.isfinite(b)]), initial=1.0))
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale, equal_nan=True,
                                       err_msg=f"GPU and CPU differ on {t}")
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"GPU and CPU differ on {t}")


@pytest.fixture(autouse=True)
def oracle_also_runs_on_gpu(monkeypatch):
    """Autouse in the modules that import it: run_op also runs each graph on /gpu:0."""
    monkeypatch.setattr(oracle, "_ALSO_SESSION", True)
    monkeypatch.setattr(oracle, "_compare_with_session", compare_on_gpu)
