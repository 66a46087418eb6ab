"""What the fusions' pattern finders share: the nodes a pattern may start from, a node's
inputs when all are known, and the test that a producer's value is seen by one reader
alone (so that the fused call may absorb the producer)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dcf.ops.registry import Kind

__all__ = ["candidates", "known_inputs", "feeds_only", "output_read_by_only"]


def candidates(frame_nodes: list, op_types: Any, gpu_of: dict, taken: Any = ()) -> Iterator:
    """The frame's kernel nodes of one of `op_types` that run on a GPU, have no control
    inputs and are not fused elsewhere (in `taken`)."""
    for n in frame_nodes:
        if n.kind == Kind.KERNEL and n.type in op_types and n.id in gpu_of and \
                not n.pnode.control and n.id not in taken:
            yield n


def known_inputs(inputs_of: Any, n: Any, counts: tuple) -> list | None:
    """n's inputs [(node, output), ...], or None where their number is not in `counts`
    or one of them is no node of the plan (a feed, a pruned input)."""
    ins = inputs_of(n)
    if len(ins) not in counts or None in ins or any(i[0] is None for i in ins):
        return None
    return ins


def output_read_by_only(src: Any, k: int, dst: Any, gpu_of: dict, taken: Any) -> bool:
    """Whether output k of `src` is a kernel's value on `dst`'s GPU that `dst` alone
    reads, through one input: `src` has no control inputs and is not fused elsewhere,
    and that output is not fetched."""
    return getattr(src, "kind", None) == Kind.KERNEL and src.id not in taken and \
        not src.pnode.control and not any(i == k for i, _ in src.fetch) and \
        [d for d, _, _ in src.outs[k]] == [dst] and gpu_of.get(src.id) is gpu_of[dst.id]


def feeds_only(src: Any, dst: Any, gpu_of: dict, taken: Any) -> bool:
    """Whether `src` is a kernel node on `dst`'s GPU whose one output `dst` alone reads:
    no control inputs or outputs, not fetched, not fused elsewhere."""
    return getattr(src, "kind", None) == Kind.KERNEL and src.n_out == 1 and \
        not src.fetch and not src.ctrl_outs and output_read_by_only(src, 0, dst, gpu_of, taken)
