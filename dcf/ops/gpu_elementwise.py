"""Elementwise GPU kernels launched with the least host work.

On a GPU a step of small kernels is bound by the host's cost per launch, and cupy's
general elementwise machinery is the largest part of it for the commonest ops: on the
lent H100 host, `x + y` on two 64x64 float32 arrays costs 16.2 us of host time,
`cupy.tanh(x)` 13.2 us and a generated `ElementwiseKernel` 13.7 us, against 6.4 us for
a `RawKernel` launch plus 2-3.7 us for `cupy.empty` (bench/NOTES.md, "GPU, session 5").
cupy spends the difference on what an elementwise call *may* need -- broadcasting,
type resolution, argument indexers -- so for the shapes dcf's ops mostly meet this
module compiles one raw kernel per expression, dtype and argument layout:

- every device argument has the output's shape and is C-contiguous (``a``), or is the
  output's trailing dimensions, C-contiguous (``r``, a bias row: element ``i % m``),
  or holds one element (``p``, read through its pointer);
- or is a 2-D column block of a wider C-contiguous matrix (``w``: element
  ``(i / cols) * ld + i % cols``, e.g. one output of a SplitV along the last axis);
- a host argument is a numpy scalar of the same dtype, passed by value (``s``);
- one float dtype throughout (float32 or float64), and the output is new.

Anything else (integers, mixed dtypes, other broadcasts, other strided views, and the test
stand-in for cupy, which has no `RawKernel`) returns None and the caller runs its
general kernel. A size that the common layouts launch often gets a kernel with n compiled
in (SIZED_AFTER, below). Kernels are compiled without FMA contraction, so a single op equals
cupy's ufunc bit for bit and a fused expression rounds each operation as the ops one
by one would.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from dcf.ops.gpu_raw import BLOCK, RawLoop, c_contiguous, compile_in_background, row_stride

__all__ = ["RawElementwise", "raw_elementwise", "raw_gpu", "add_n_gpu", "SINGLE"]

_names = itertools.count()

# A size launched this often through one expression's all-"a" kernel (or its kernel over
# an input) gets a kernel of its own with n compiled in: cupy's launch costs the host
# about a microsecond per argument (bench/NOTES.md, "GPU, session 11"), and a loop
# launches the same sizes over and over. At most SIZED_MAX such kernels per expression;
# a launch of one also skips n's numpy scalar and the grid's arithmetic. The copy is
# compiled on a helper thread; launches go on through the general kernel until it is done.
SIZED_AFTER = 32
SIZED_MAX = 8

# Single ops whose GPU body is one raw kernel: the expression over in0, in1 in the
# order the generic body (dcf/ops/math_ops.py, xp = cupy) computes it.
SINGLE: dict[str, str] = {
    "Add": "in0 + in1", "Sub": "in0 - in1", "Mul": "in0 * in1", "RealDiv": "in0 / in1",
    "Neg": "-in0", "Square": "in0 * in0", "Exp": "exp(in0)", "Tanh": "tanh(in0)",
    "Sigmoid": "(T)1 / (exp(-in0) + (T)1)",
    "TanhGrad": "((T)1 - in0 * in0) * in1",
    "SigmoidGrad": "(((T)1 - in0) * in0) * in1",
}


class RawElementwise:
    """One elementwise expression over in0..in{n-1} (type T) as raw CUDA kernels."""

    def __init__(self, cp: Any, expression: str, n_in: int, name: str = "") -> None:
        self.cp = cp
        self.expression = expression
        self.n_in = n_in
        self.name = f"dcf_raw_{name or 'ew'}_{next(_names)}"
        self.available = hasattr(cp, "RawKernel")
        self.nd = cp.ndarray
        self._kernels: dict[tuple, Any] = {}
        self._same: dict[str, Any] = {}   # dtype char -> kernel of all-"a" arguments
        self._same_into: dict[tuple, Any] = {}   # (dtype char, j) -> ... written over in{j}
        self._loops: dict[tuple, RawLoop] = {}   # (dtype char, layout) -> its RawLoop
        # (dtype char, j or -1, size) -> (kernel with n compiled in, grid); launches by size
        self._sized: dict[tuple, tuple] = {}
        self._launches: dict[tuple, int] = {}
        self._pending: dict[tuple, tuple] = {}   # the same key -> (kernel, its compile)

    def __call__(self, args: tuple) -> Any:
        """The result as a new device array, or None when `args` don't fit (above)."""
        # the common case first: every argument a contiguous device array of one shape
        # and dtype, whose kernel exists
        nd = self.nd
        a0 = args[0] if args else None
        if type(a0) is nd:
            shape, dt = a0.shape, a0.dtype
            for a in args:
                if type(a) is not nd or a.shape != shape or a.dtype != dt or \
                        not c_contiguous(a):
                    break
            else:
                k = self._same.get(dt.char)
                size = a0.size
                if k is not None and size and len(args) == self.n_in:
                    ks = self._sized.get((dt.char, -1, size)) or self._count(dt.char, -1, size)
                    if ks is not None:
                        out = self.cp.empty(shape, dt)
                        ks[0](ks[1], BLOCK, (*args, out))
                        return out
                    return self._launch(k, shape, dt, size, args)
        return self._general(args)

    def _count(self, char: str, j: int, size: int) -> tuple | None:
        """One more launch of `size` through the all-"a" kernel (j = -1) or the one over
        in{j}: its own kernel once it has been launched SIZED_AFTER times and compiled on
        the helper thread (gpu_raw.compile_in_background; None before, and once SIZED_MAX
        sizes have one)."""
        key = (char, j, size)
        pending = self._pending.get(key)
        if pending is not None:
            if not pending[1].done():
                return None
            del self._pending[key]
            pending[1].result()              # (a compile error surfaces here)
            ks = self._sized[key] = (pending[0], RawLoop.grid(size))
            return ks
        if len(self._sized) + len(self._pending) >= SIZED_MAX:
            return None
        n = self._launches.get(key, 0) + 1
        if n < SIZED_AFTER:
            if len(self._launches) >= 64 * SIZED_MAX:    # sizes that never come back
                self._launches.clear()
            self._launches[key] = n
            return None
        self._launches.pop(key, None)
        k = self._loops[(char, self._plain(j))].kernel(self.cp, char, size=size)
        self._pending[key] = (k, compile_in_background(self.cp, k))
        return self._count(char, j, size)       # (done at once where nothing compiles)

    def _launch(self, k: Any, shape: tuple, dt: Any, size: int, params: Any,
                out: Any = None) -> Any:
        if out is None:
            out = self.cp.empty(shape, dt)
        RawLoop.launch(k, size, (*params, out))
        return out

    def into(self, args: tuple, j: int) -> Any:
        """The result written over args[j] (returned), or None where the arguments don't
        fit: args[j] must be a C-contiguous device array of the result's shape and dtype.
        Its kernel reads in{j} from the output itself (layout ``o``: no pointer aliases
        another), so each element is read before it is overwritten, by the same thread.
        The caller proves that nothing else reads args[j] (dcf/fusion/in_place.py)."""
        nd = self.nd
        t = args[j] if 0 <= j < len(args) else None
        if type(t) is not nd or not c_contiguous(t):
            return None
        shape, dt = t.shape, t.dtype
        for a in args:          # the common case: every argument like the output
            if type(a) is not nd or a.shape != shape or a.dtype != dt or not c_contiguous(a):
                break
        else:
            k = self._same_into.get((dt.char, j))
            size = t.size
            if k is not None and size:
                ks = self._sized.get((dt.char, j, size)) or self._count(dt.char, j, size)
                if ks is not None:
                    ks[0](ks[1], BLOCK, (*args[:j], *args[j + 1:], t))
                    return t
                return self._launch(k, shape, dt, size, args[:j] + args[j + 1:], t)
        return self._general(args, j)

    def _general(self, args: tuple, into: int | None = None) -> Any:
        if not self.available or len(args) != self.n_in:
            return None
        nd = self.nd
        out_shape = None
        dt = None
        size = 0
        for a in args:               # the output: the largest device argument
            if type(a) is nd:
                if dt is None:
                    dt = a.dtype
                elif a.dtype != dt:
                    return None
                if a.size > size or out_shape is None:
                    out_shape, size = a.shape, a.size
        if dt is None or dt.char not in "fd" or size == 0:
            return None
        if into is not None and args[into].shape != out_shape:
            return None
        layout = []
        params: list = []
        nout = len(out_shape)
        for j, a in enumerate(args):
            if j == into:
                layout.append("o")            # the output's own element, read first
            elif type(a) is nd:
                if not c_contiguous(a):
                    ld = row_stride(a) if a.shape == out_shape else None
                    if ld is None:
                        return None
                    layout.append("w")        # a column block of a wider matrix
                    params.append(a)
                    params.append(np.int64(a.shape[1]))
                    params.append(np.int64(ld))
                elif a.shape == out_shape:
                    layout.append("a")
                    params.append(a)
                elif a.size == 1 and a.ndim <= nout:
                    layout.append("p")
                    params.append(a)
                elif 0 < a.ndim < nout and a.shape == out_shape[nout - a.ndim:]:
                    layout.append("r")
                    params.append(a)
                    params.append(np.int64(a.size))
                else:
                    return None
            elif isinstance(a, np.generic) and a.dtype == dt:
                layout.append("s")
                params.append(a)
            else:
                return None
        key = (dt.char, "".join(layout))
        k = self._kernels.get(key)
        if k is None:
            try:
                k = self._compile(*key)
            except Exception:   # noqa: BLE001 - no compiler here: cupy's kernels do it
                self.available = False
                return None
            self._kernels[key] = k
            if key[1] == self._plain(-1):
                self._same[key[0]] = k
            elif into is not None and key[1] == self._plain(into):
                self._same_into[(key[0], into)] = k
        return self._launch(k, out_shape, dt, size, params,
                            None if into is None else args[into])

    def _plain(self, j: int) -> str:
        """The layout of C-contiguous arguments alike the result: all "a", or (j >= 0)
        with in{j} read from the output it is written over ("o")."""
        return "a" * self.n_in if j < 0 else "a" * j + "o" + "a" * (self.n_in - j - 1)

    def _compile(self, char: str, layout: str) -> Any:
        ps, loads = [], []
        for j, kind in enumerate(layout):
            if kind == "a":
                ps.append(f"const T* __restrict__ p{j}")
                loads.append(f"const T in{j} = p{j}[i];")
            elif kind == "r":
                ps.append(f"const T* __restrict__ p{j}, const long long m{j}")
                loads.append(f"const T in{j} = p{j}[i % m{j}];")
            elif kind == "w":
                ps.append(f"const T* __restrict__ p{j}, const long long c{j}, "
                          f"const long long l{j}")
                loads.append(f"const T in{j} = p{j}[(i / c{j}) * l{j} + i % c{j}];")
            elif kind == "p":
                ps.append(f"const T* __restrict__ p{j}")
                loads.append(f"const T in{j} = p{j}[0];")
            elif kind == "o":
                loads.append(f"const T in{j} = out[i];")
            else:
                ps.append(f"const T in{j}")
        loop = self._loops[(char, layout)] = RawLoop(
            f"{self.name}_{layout}", ", ".join(ps + ["T* __restrict__ out"]),
            f"    {' '.join(loads)}\n    out[i] = {self.expression};", ("--fmad=false",))
        return loop.kernel(self.cp, char)


_SHARED: dict[tuple, RawElementwise] = {}


def raw_elementwise(cp: Any, op_type: str) -> RawElementwise:
    """The raw kernels of SINGLE op `op_type` on array module `cp`, one set per process
    (the op's GPU body and the ops that write over their input share them)."""
    key = (id(cp), op_type)
    k = _SHARED.get(key)
    if k is None:
        expr = SINGLE[op_type]
        k = _SHARED[key] = RawElementwise(cp, expr, 1 + ("in1" in expr), op_type.lower())
    return k


def raw_gpu(op_type: str, generic: Any) -> Any:
    """The GPU body of a SINGLE op: its raw kernel where the arguments fit, else
    `generic` (the op's kernel with xp = cupy)."""
    kernels: dict[int, RawElementwise] = {}

    # the generic SigmoidGrad associates dy * y * (1 - y) left to right unless y and dy
    # are same-shaped arrays (then in place: (1 - y) * y * dy): the raw kernel only for
    # those, so that both round alike
    same_shape_only = op_type == "SigmoidGrad"

    def body(xp, *args, **kw):
        if same_shape_only and not (len(args) == 2 and getattr(args[0], "ndim", 0) and
                                    args[0].shape == getattr(args[1], "shape", None)):
            return generic(xp, *args, **kw)
        k = kernels.get(id(xp))
        if k is None:
            k = kernels[id(xp)] = raw_elementwise(xp, op_type)
        out = k(args)
        return generic(xp, *args, **kw) if out is None else out
    body.__name__ = f"{op_type.lower()}_gpu"
    return body


_ADD_N_WIDTH = 8     # inputs one AddN kernel reads at most


def add_n_gpu(generic: Any) -> Any:
    """AddN's GPU body: ((x0 + x1) + x2) + ... in the generic body's order, up to
    _ADD_N_WIDTH inputs per raw kernel (the next kernel starts from that sum) instead of
    a cupy add per input; `generic` where the arguments don't fit."""
    kernels: dict[tuple, RawElementwise] = {}

    def get(xp: Any, n: int) -> RawElementwise:
        k = kernels.get((id(xp), n))
        if k is None:
            expr = "in0"
            for j in range(1, n):
                expr = f"({expr} + in{j})"
            k = kernels[(id(xp), n)] = RawElementwise(xp, expr, n, f"add{n}")
        return k

    def add_n(xp, *xs):
        if len(xs) < 2:
            return generic(xp, *xs)
        first = xs[0]
        shape = getattr(first, "shape", None)
        for x in xs:
            if getattr(x, "shape", None) != shape:
                return generic(xp, *xs)
        rest = xs
        out = None
        while rest:
            take = rest[:_ADD_N_WIDTH - (out is not None)]
            args = take if out is None else (out,) + take
            got = get(xp, len(args))(args)
            if got is None:
                return generic(xp, *xs) if out is None else generic(xp, out, *rest)
            out = got
            rest = rest[len(take):]
        return out
    return add_n
