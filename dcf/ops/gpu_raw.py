"""A CUDA loop body launched as a raw kernel: the host cost of an ElementwiseKernel call
without its argument machinery.

cupy's `ElementwiseKernel` call costs the host 13-16 us on the lent machines (it
resolves types, broadcasts and builds indexers for every argument on every call); a
`RawKernel` launch with its output allocated costs about 6 us (bench/NOTES.md, "GPU,
session 5"). The LSTM gates and the column sums run once per layer and iteration, so
they use this: one kernel per dtype, compiled on first use, a grid-stride loop over
`i` in [0, n), parameters declared in the body's own terms (pointers for arrays, values
for scalars). The caller checks layouts (C-contiguous arrays of the expected shapes)
and keeps its ElementwiseKernel for anything else and for the test stand-in, which has
no RawKernel. Compiled with nvrtc's default options, as ElementwiseKernels are, unless
the caller gives others (the raw elementwise kernels of dcf/ops/gpu_elementwise.py are
built on this too, without FMA contraction).
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["RawLoop", "c_contiguous", "row_stride", "BLOCK", "compile_in_background"]


def c_contiguous(a: Any) -> bool:
    """`a.flags.c_contiguous` without the Flags object cupy builds for each `flags` read
    (about half a microsecond of host time; these tests run several times per kernel)."""
    try:
        return a._c_contiguous
    except AttributeError:        # numpy, the test stand-in
        return a.flags.c_contiguous


def row_stride(a: Any) -> int | None:
    """For a 2-D array whose rows are each contiguous -- C-contiguous, or a column block
    of a wider C-contiguous matrix (a SplitV output) -- the elements from one row's start
    to the next's; None for any other layout."""
    if a.ndim != 2:
        return None
    if c_contiguous(a):
        return a.shape[1]
    s0, s1 = a.strides
    size = a.itemsize
    if s1 != size or s0 % size or s0 < a.shape[1] * size:
        return None
    return s0 // size


_compiler: tuple[int, ThreadPoolExecutor] | None = None    # (pid, its one thread)


def compile_in_background(cp: Any, k: Any) -> Future:
    """Compile raw kernel `k` for the current GPU on a helper thread; the future is done
    once a launch of `k` on this GPU needs no compile. For kernels the host can do
    without for now (a copy with its size compiled in, gpu_elementwise.SIZED_AFTER): NVRTC
    takes ~60 ms of a cold process, and cupy runs it without the GIL, so the loop that
    asked goes on launching the general kernel meanwhile instead of stalling. Kernels
    without `compile` (the test stand-ins) have nothing to compile ahead."""
    global _compiler
    compile_ = getattr(k, "compile", None)
    if compile_ is None:
        done: Future = Future()
        done.set_result(None)
        return done
    device = cp.cuda.runtime.getDevice()

    def work() -> None:
        with cp.cuda.Device(device):      # the thread's current GPU: cupy loads it there
            compile_()

    if _compiler is None or _compiler[0] != os.getpid():     # (none survives a fork)
        _compiler = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="dcf-nvrtc"))
    return _compiler[1].submit(work)


_THREADS = 256
_MAX_BLOCKS = 1 << 16
BLOCK = (_THREADS,)
_CTYPE = {"f": "float", "d": "double"}


class RawLoop:
    """`params`: the kernel's parameters after `typedef T` (type T for the dtype), e.g.
    ``"const T* __restrict__ x, const long long rows, T* __restrict__ y"``; `body`: CUDA
    statements run for each i in [0, n); `options`: nvrtc's."""

    def __init__(self, name: str, params: str, body: str, options: tuple = ()) -> None:
        self.name, self.params, self.body, self.options = name, params, body, options
        self._kernels: dict = {}

    @staticmethod
    def available(cp: Any) -> bool:
        return hasattr(cp, "RawKernel")

    def kernel(self, cp: Any, char: str, consts: tuple = (), size: int | None = None) -> Any:
        """The compiled kernel for dtype character `char` ('f' or 'd'), with `consts`
        ((C type, name, value), ...) as constants of the kernel instead of parameters:
        one kernel per set of values (cupy's launch costs the host about a microsecond
        per argument, so arguments fixed per call site are worth compiling in). With
        `size`, n is one of them too: the kernel takes no n (launch it as
        ``k(RawLoop.grid(size), BLOCK, args)``)."""
        key = (char, consts, size) if consts or size is not None else char
        k = self._kernels.get(key)
        if k is None:
            name = f"{self.name}_{char}"
            if consts or size is not None:
                name += f"_k{len(self._kernels)}"
            if size is not None:
                consts = consts + (("long long", "n", int(size)),)
            defs = "".join(f"  const {t} {n} = ({t}){v!r};\n" for t, n, v in consts)
            n_param = "" if size is not None else ", const long long n"
            code = (f"typedef {_CTYPE[char]} T;\n"
                    f'extern "C" __global__ void {name}({self.params}{n_param}) {{\n'
                    f"{defs}"
                    "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;"
                    " i < n;\n       i += (long long)blockDim.x * gridDim.x) {\n"
                    f"{self.body}\n  }}\n}}\n")
            k = self._kernels[key] = cp.RawKernel(code, name, options=self.options)
        return k

    @staticmethod
    def launch(k: Any, n: int, args: tuple) -> None:
        """Run kernel `k` over i < n (n > 0) with `args`, n appended."""
        k((min((n + _THREADS - 1) // _THREADS, _MAX_BLOCKS),), BLOCK, args + (np.int64(n),))

    @staticmethod
    def grid(n: int) -> tuple:
        """The grid `launch` uses for n elements (for a kernel compiled with its size)."""
        return (min((n + _THREADS - 1) // _THREADS, _MAX_BLOCKS),)

    def __call__(self, cp: Any, dtype: Any, n: int, args: tuple) -> None:
        """Run the body for i < n with `args` (the parameters in order; n is passed
        last)."""
        if n > 0:
            self.launch(self.kernel(cp, np.dtype(dtype).char), n, args)
