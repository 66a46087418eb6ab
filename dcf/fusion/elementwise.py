"""Fuse chains of elementwise GPU kernels of a compiled frame into one cupy kernel.

On a GPU every kernel launch costs the host several microseconds (about 9 µs for a
cupy `a + b` on the lent H200 machines, 10 µs for a generated ElementwiseKernel doing
`tanh(a + b)`), and a loop whose GPU work is pipelined is bound by that host time. So
when the frame compiler meets a tree of elementwise ops on one GPU -- each inner op's
only consumer being the next op of the tree, nothing else looking at its value -- it
emits one call of an ElementwiseKernel computing the whole tree (XLA's loop fusion, in
its simplest form).

The fused call runs only on what it was generated for: every input a device array or
a host scalar of one float dtype. Anything else (host arrays, mixed dtypes, integer
values) runs the ops one by one through their own kernels, as does a call that runs
out of memory (their wrappers know how to make room). Results equal the unfused ops'
up to the last bit of the device's math library.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from dcf.ops.gpu_elementwise import RawElementwise
from dcf.ops.registry import Kind

__all__ = ["fusion_groups", "FusedElementwise", "FUSIBLE"]

# op type -> CUDA expression over its inputs {0}, {1} (type T)
FUSIBLE: dict[str, str] = {
    "Add": "({0} + {1})", "AddV2": "({0} + {1})", "Sub": "({0} - {1})",
    "Mul": "({0} * {1})", "RealDiv": "({0} / {1})", "Neg": "(-{0})",
    "Square": "({0} * {0})", "Tanh": "tanh({0})", "Exp": "exp({0})",
    "Sigmoid": "((T)1 / ((T)1 + exp(-{0})))",
    "TanhGrad": "({1} * ((T)1 - {0} * {0}))",
    "SigmoidGrad": "({1} * {0} * ((T)1 - {0}))",
}
_names = itertools.count()

# Bounds on one fused tree: a longer chain of elementwise ops becomes several kernels,
# so that a chain of thousands of ops compiles in bounded recursion, and an op that
# repeats its input in its expression (Square: "({0} * {0})") cannot double the text
# of a kernel at every link.
MAX_DEPTH = 64
MAX_EXPRESSION = 4096    # characters


def fusion_groups(frame_nodes: list, gpu_of: dict,
                  inputs_of: Any) -> dict[int, tuple[list, list, str, tuple]]:
    """Trees of fusible GPU nodes of one frame: root node id -> (absorbed nodes,
    leaves [(src NodeInfo, output)], expression over the leaves in0, in1, ..., tree).
    The tree is (kernel callable, [leaf index or subtree per input]): the same
    computation op by op. `inputs_of(node)` gives a node's inputs as (NodeInfo,
    output) pairs."""
    ids = {n.id for n in frame_nodes}

    def single_consumer(p: Any) -> Any:
        if p.n_out != 1 or p.fetch or p.ctrl_outs or len(p.outs[0]) != 1:
            return None
        dst, _, is_merge = p.outs[0][0]
        return None if is_merge else dst

    absorbable: dict[int, Any] = {}
    for p in frame_nodes:
        if p.kind == Kind.KERNEL and p.type in FUSIBLE and p.id in gpu_of and \
                not p.pnode.control:
            dst = single_consumer(p)
            if dst is not None and dst.id in ids and dst.type in FUSIBLE and \
                    dst.kind == Kind.KERNEL and gpu_of.get(dst.id) is gpu_of[p.id]:
                absorbable[p.id] = p
    groups: dict[int, tuple[list, list, str, tuple]] = {}
    roots = [n for n in frame_nodes if n.kind == Kind.KERNEL and n.type in FUSIBLE and
             n.id in gpu_of and n.id not in absorbable]
    while roots:
        n = roots.pop()
        absorbed: list = []
        leaves: list = []
        leaf_index: dict[tuple, int] = {}

        def absorb(src: tuple, depth: int) -> tuple[str, tuple] | None:
            """src's tree as part of this one, or None where that would pass the
            bounds: src is then a leaf here and the root of a tree of its own."""
            marks = len(absorbed), len(leaves)
            if depth < MAX_DEPTH:
                absorbed.append(src[0])
                e, t = expr(src[0], depth + 1)
                if len(e) <= MAX_EXPRESSION:
                    return e, t
                del absorbed[marks[0]:], leaves[marks[1]:]
                for key in [k for k, i in leaf_index.items() if i >= marks[1]]:
                    del leaf_index[key]
            del absorbable[src[0].id]
            roots.append(src[0])
            return None

        def expr(node: Any, depth: int = 0) -> tuple[str, tuple]:
            args, sub = [], []
            for src in inputs_of(node):
                tree = None
                if src is not None and src[0] is not None and \
                        absorbable.get(src[0].id) is src[0]:
                    tree = absorb(src, depth)
                if tree is not None:
                    args.append(tree[0])
                    sub.append(tree[1])
                else:
                    if src is None or src[0] is None:
                        leaves.append(None)   # not fusible: refused below
                        args.append("")
                        sub.append(-1)
                        continue
                    key = (src[0].id, src[1])
                    if key not in leaf_index:
                        leaf_index[key] = len(leaves)
                        leaves.append(src)
                    args.append(f"in{leaf_index[key]}")
                    sub.append(leaf_index[key])
            return FUSIBLE[node.type].format(*args), (node.fn, sub)

        e, tree = expr(n)
        if absorbed and all(s is not None for s in leaves):
            groups[n.id] = (absorbed, leaves, e, tree)
    return groups


class FusedElementwise:
    """The callable a fused tree compiles to (see the module docstring)."""

    def __init__(self, gpu: Any, expression: str, n_in: int, tree: tuple) -> None:
        self.gpu = gpu
        self.n_in = n_in
        self.tree = tree
        ins = ", ".join(f"T in{k}" for k in range(n_in))
        self.kernel = gpu.cp.ElementwiseKernel(ins, "T out", f"out = {expression}",
                                               f"dcf_fused_{next(_names)}")
        # the same expression as a raw kernel where the arguments fit (same shapes,
        # bias rows, scalars: the common case), for a third of the host's launch cost
        self.raw = RawElementwise(gpu.cp, expression, n_in, "fused")
        self._nd = gpu.cp.ndarray

    def slow(self, *args: Any) -> Any:
        """The same computation op by op, through each op's own kernel."""
        def ev(t: Any) -> Any:
            if type(t) is int:
                return args[t]
            fn, sub = t
            return fn(*[ev(c) for c in sub])
        return ev(self.tree)

    def __call__(self, *args: Any) -> Any:
        nd = self._nd
        dt = None
        for a in args:
            t = type(a)
            if t is nd:
                if dt is None:
                    dt = a.dtype
                elif a.dtype != dt:
                    return self.slow(*args)
            elif not isinstance(a, np.generic):
                return self.slow(*args)
        if dt is None or dt.kind != "f" or any(
                type(a) is not nd and a.dtype != dt for a in args):
            return self.slow(*args)
        self.gpu.make_current()
        try:
            out = self.raw(args)
            return self.kernel(*args) if out is None else out
        except MemoryError:
            return self.slow(*args)
