"""Control the thread count of the BLAS that numpy calls (OpenBLAS builds).

dcf gets its parallelism between ops from its executor; inside one small matmul,
BLAS threads mostly spin and fight the executor and each other for cores (on the
2-core CI machine a 32x192 @ 192x512 matmul measured 165 us single-threaded and
920 us with two threads under load). Sessions therefore run BLAS with
`SessionConfig.intra_op_threads` threads (default 1); the setting is process-wide.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

__all__ = ["set_threads", "get_threads"]

_SET = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
        "openblas_set_num_threads64_", "openblas_set_num_threads")
_GET = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
        "openblas_get_num_threads64_", "openblas_get_num_threads")


@functools.lru_cache(maxsize=1)
def _lib() -> tuple[Any, Any] | None:
    import numpy  # noqa: F401  (loads its BLAS)

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()
                     and line.rstrip().endswith(".so") or ".so." in line and "openblas" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, s) for s in _SET if hasattr(lib, s)), None)
        getter = next((getattr(lib, s) for s in _GET if hasattr(lib, s)), None)
        if setter is not None and getter is not None:
            return setter, getter
    return None


def set_threads(n: int) -> int | None:
    """Set the BLAS thread count; returns the previous one (None: not controllable)."""
    fns = _lib()
    if fns is None:
        return None
    setter, getter = fns
    prev = int(getter())
    if prev != n:
        setter(int(n))
    return prev


def get_threads() -> int | None:
    fns = _lib()
    return None if fns is None else int(fns[1]())
