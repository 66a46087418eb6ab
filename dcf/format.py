"""Readable dumps of a graph: one op per line (for golden tests) and Graphviz DOT."""

from __future__ import annotations

from typing import Any

import numpy as np

from dcf.graph import Graph, Operation, get_default_graph

__all__ = ["format_graph", "graph_to_dot"]

_SHOWN_ATTRS = ("frame_name", "is_constant", "parallel_iterations", "transpose_a",
                "transpose_b", "axis", "keepdims", "dtype", "source", "ta_name")


def _attr_text(op: Operation) -> str:
    items = []
    for k in sorted(op.attrs):
        v = op.attrs[k]
        if k == "value":
            arr = np.asarray(v)
            items.append(f"value={arr.tolist()!r}" if arr.size <= 4 else
                         f"value=<{arr.dtype}{list(arr.shape)}>")
        elif k in _SHOWN_ATTRS or isinstance(v, (bool, int, float, str)):
            items.append(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}")
    return f"[{', '.join(items)}]" if items else ""


def format_graph(graph: Graph | None = None, *, devices: bool = False) -> str:
    """One line per op, in creation order:

        while/Merge:0,1 = Merge(while/Enter:0, while/NextIteration:0)  frame=while
    """
    g = graph or get_default_graph()
    lines = []
    for op in g.get_operations():
        outs = ",".join(str(i) for i in range(len(op.outputs)))
        lhs = f"{op.name}:{outs}" if op.outputs else op.name
        args = [t.name for t in op.inputs] + [f"^{c.name}" for c in op.control_inputs]
        line = f"{lhs} = {op.type}{_attr_text(op)}({', '.join(args)})"
        if op.frame_name:
            line += f"  frame={op.frame_name}"
        if devices and op.device:
            line += f"  @{op.device}"
        lines.append(line.replace("\n", "\\n").replace("\r", "\\r"))  # (one line an op)
    return "\n".join(lines) + "\n"


def graph_to_dot(graph: Graph | None = None) -> str:
    """Graphviz DOT text of the graph, each loop frame drawn as a nested cluster."""
    g = graph or get_default_graph()
    ops = g.get_operations()
    ids = {op: f"n{i}" for i, op in enumerate(ops)}
    tree: dict[Any, list] = {}
    for op in ops:
        tree.setdefault(op.frame_ctx, []).append(op)
    children: dict[Any, list] = {}
    for ctx in list(tree):
        c = ctx
        while c is not None:
            parent = c.outer_frame
            lst = children.setdefault(parent, [])
            if c not in lst:
                lst.append(c)
            c = parent
    out = ["digraph dcf {", "  rankdir=TB;", "  node [shape=box, fontsize=10];"]

    def emit(ctx: Any, depth: int) -> None:
        pad = "  " * depth
        for op in tree.get(ctx, []):
            shape = "ellipse" if op.type in ("Switch", "Merge", "Enter", "Exit",
                                             "NextIteration", "LoopCond") else "box"
            out.append(f'{pad}{ids[op]} [label="{_dot(op.name)}\\n{_dot(op.type)}", '
                       f'shape={shape}];')
        for k, child in enumerate(children.get(ctx, [])):
            out.append(f'{pad}subgraph "cluster_{_dot(child.frame_name)}" {{')
            out.append(f'{pad}  label="frame {_dot(child.frame_name)}"; style=rounded;')
            emit(child, depth + 1)
            out.append(f"{pad}}}")

    emit(None, 1)
    for op in ops:
        for t in op.inputs:
            style = ' [style=dashed, label="back"]' if op.type == "Merge" and \
                t.op.type == "NextIteration" else ""
            out.append(f"  {ids[t.op]} -> {ids[op]}{style};")
        for c in op.control_inputs:
            out.append(f"  {ids[c]} -> {ids[op]} [style=dotted];")
    out.append("}")
    return "\n".join(out) + "\n"


def _dot(text: str) -> str:
    """`text` inside a DOT double-quoted string (quotes and backslashes escaped)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
