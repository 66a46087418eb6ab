"""Compile one partition into an ExecPlan: dense node records, slot offsets, out-edge
lists and pending-count templates per frame. Strings and name lookups stop here."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dcf.graph import Operation, Tensor
from dcf.ops.registry import OPS, Kind
from dcf.token import DEAD

__all__ = ["PNode", "ExecPlan", "NodeInfo", "FrameInfo", "nodes_from_ops", "build_plan",
           "TRANSFER"]

# The node type of a transfer between GPUs that a fused plan inserts on a cut edge
# (dcf/fused.py); the frame compiler orders and guards these nodes by it.
TRANSFER = "_ToDevice"


@dataclass(eq=False, slots=True)
class PNode:
    """A node of a partition before planning: a graph op, or a Send/Recv/Feed the
    partitioner added."""

    name: str
    type: str
    kind: Kind
    frame: str                              # the frame it executes in ("" = root)
    inputs: list = field(default_factory=list)      # [(PNode, output index)]
    control: list = field(default_factory=list)     # [PNode]
    attrs: dict = field(default_factory=dict)
    n_out: int = 1
    op: Operation | None = None
    device: str = ""
    stateful: bool = False
    kernel: Any = None
    resource: bool = False


@dataclass(eq=False, slots=True)
class FrameInfo:
    name: str
    parent: FrameInfo | None
    parallel_iterations: int = 1
    nodes: list = field(default_factory=list)
    n_slots: int = 0
    pending: list = field(default_factory=list)     # template per local node id
    num_enters: int = 0                             # Enter nodes into this frame
    exits: list = field(default_factory=list)       # Exit nodes of this frame
    n_ordered: int = 0          # stateful nodes (and ordered child frames) kept in iteration order
    children: list = field(default_factory=list)
    ordered: bool = False       # holds stateful nodes (or a frame nested in it does) and its
                                # parent is a loop: each instance is one ordered node there
    compiled: Any = None                            # CompiledFrame when straight-line


@dataclass(eq=False, slots=True)
class NodeInfo:
    id: int
    local: int
    name: str
    type: str
    kind: int
    fn: Any
    n_in: int
    in_base: int
    ctrl_slot: int
    n_out: int
    frame: FrameInfo
    outs: tuple = ()           # per output: tuple of (dst NodeInfo, abs slot, is_merge)
    ctrl_outs: tuple = ()      # dst NodeInfos
    child: FrameInfo | None = None   # Enter: the frame it enters
    is_constant: bool = False
    ordered: bool = False
    merge_n: int = 0
    fetch: tuple = ()          # (output index, fetch index)
    op: Any = None
    pnode: Any = None
    dead_outs: tuple = ()
    simple: bool = False       # one output, no Merge consumers, no control outs, no fetch

    @property
    def device(self) -> str:
        return self.op.device if self.op is not None else ""


@dataclass(eq=False, slots=True)
class ExecPlan:
    nodes: list
    root: FrameInfo
    frames: dict
    sources: list              # root-frame nodes with nothing pending
    feeds: list                # per feed index: NodeInfo-like edge lists (tuple of edges)
    n_fetch: int
    recv_nodes: list
    xp: Any = np
    feed_pnodes: list = field(default_factory=list)   # the _Feed PNode of each feed index
    fetch_refs: list = field(default_factory=list)    # (NodeInfo, output) per fetch index
    compiled_root: Any = None                         # CompiledRoot when straight-line
    gpu_of: dict = field(default_factory=dict)        # node id -> GpuDevice it runs on


def nodes_from_ops(ops: list[Operation]) -> dict[Operation, PNode]:
    """PNodes for graph ops (inputs/control filled for ops in the set)."""
    pn: dict[Operation, PNode] = {}
    for op in ops:
        d = op.opdef or OPS[op.type]
        pn[op] = PNode(op.name, op.type, d.kind, op.frame_name, attrs=op.attrs,
                       n_out=len(op.outputs), op=op, device=op.device, stateful=d.stateful,
                       kernel=d.kernel, resource=d.resource)
    for op in ops:
        p = pn[op]
        p.inputs = [(pn[t.op], t.index) if t.op in pn else None for t in op.inputs]
        p.control = [pn[c] for c in op.control_inputs if c in pn]
    return pn


def _bind(p: PNode, xp: Any, resources: Any) -> Any:
    bound = p.attrs.get("_bound")
    if bound is not None:   # a node made with its callable (a fused plan's transfers)
        return bound
    if p.kernel is None:
        return None
    kw = dict(p.attrs)
    if p.resource:
        kw["res"] = resources
        kw["node_name"] = p.name
    bind = getattr(resources, "bind_kernel", None)
    if bind is not None:  # a device that wraps its kernels (GPU: dcf/actors/gpu_actor.py)
        return bind(p, kw)
    return functools.partial(p.kernel, xp, **kw) if kw else functools.partial(p.kernel, xp)


def _order_nested_frames(f: FrameInfo) -> bool:
    """Whether `f` or a frame nested in it holds a stateful node. A loop frame keeps
    such a child frame in its iteration order as one stateful node, which ends when the
    child loop instance ends: the stateful ops of a nested loop in iteration k+1 wait for
    those of iteration k, nested loops' included."""
    state = f.n_ordered > 0
    for c in f.children:
        if _order_nested_frames(c):
            state = True
            if f.parent is not None:
                c.ordered = True
                f.n_ordered += 1
    return state


def build_plan(pnodes: list[PNode], feeds: list[tuple[PNode, int]],
               fetches: list[tuple[PNode, int]], *, xp: Any = np, resources: Any = None,
               frame_parents: dict[str, tuple[str, int]] | None = None,
               resources_of: Any = None) -> ExecPlan:
    """Compile `pnodes` into an ExecPlan.

    feeds: (node, output) pairs whose values the run supplies (consumers read the fed
    value instead; the producing node is not in `pnodes` unless otherwise needed).
    fetches: (node, output) pairs whose root-frame values the run returns.
    frame_parents: frame name -> (parent frame name, parallel_iterations) for frames
    this partition holds no Enter of (the partitioner's control loops supply them).
    resources_of: device name -> that device's resources, for a plan whose nodes sit on
    several devices (dcf/fused.py); each node is bound to its own device's resources.
    """
    frames: dict[str, FrameInfo] = {}
    parents = dict(frame_parents or {})
    for p in pnodes:
        if p.kind == Kind.ENTER:
            parents.setdefault(p.attrs["frame_name"], (p.frame, p.attrs["parallel_iterations"]))

    def frame_of(name: str) -> FrameInfo:
        f = frames.get(name)
        if f is None:
            if name == "":
                f = FrameInfo("", None, 1)
            else:
                if name not in parents:
                    raise ValueError(f"plan: frame '{name}' has no Enter and no known parent")
                par, pi = parents[name]
                f = FrameInfo(name, frame_of(par), int(pi))
                f.parent.children.append(f)
            frames[name] = f
        return f

    frame_of("")
    infos: list[NodeInfo] = []
    by_p: dict[PNode, NodeInfo] = {}
    for p in pnodes:
        fr = frame_of(p.frame)
        n_in = len(p.inputs)
        has_ctrl = bool(p.control)
        extra = 2 if p.kind == Kind.MERGE else 0
        res = resources if resources_of is None else resources_of(p.device)
        info = NodeInfo(
            id=len(infos), local=len(fr.nodes), name=p.name, type=p.type, kind=int(p.kind),
            fn=_bind(p, xp if resources_of is None else res.xp, res), n_in=n_in,
            in_base=fr.n_slots,
            ctrl_slot=fr.n_slots + n_in + extra if has_ctrl else -1, n_out=p.n_out, frame=fr,
            op=p.op, pnode=p)
        fr.n_slots += n_in + extra + (1 if has_ctrl else 0)
        fr.nodes.append(info)
        if p.kind == Kind.MERGE:
            is_loop = any(src is not None and src[0].kind == Kind.NEXT_ITERATION
                          for src in p.inputs)
            info.merge_n = 1 if is_loop else n_in
            fr.pending.append(info.merge_n)
        else:
            fr.pending.append(n_in + len(p.control))
        if p.kind == Kind.ENTER:
            info.child = frame_of(p.attrs["frame_name"])
            info.child.num_enters += 1
            info.is_constant = bool(p.attrs.get("is_constant"))
        if p.kind == Kind.EXIT:
            fr.exits.append(info)
        if p.stateful and fr.parent is not None:
            info.ordered = True
            fr.n_ordered += 1
        info.dead_outs = (DEAD,) * p.n_out
        infos.append(info)
        by_p[p] = info

    outs: dict[NodeInfo, list[list]] = {i: [[] for _ in range(i.n_out)] for i in infos}
    ctrl: dict[NodeInfo, list] = {i: [] for i in infos}
    for p in pnodes:
        dst = by_p[p]
        for k, src in enumerate(p.inputs):
            if src is None:
                continue
            s, idx = src
            if s not in by_p:
                continue
            outs[by_p[s]][idx].append((dst, dst.in_base + k, dst.kind == Kind.MERGE))
        for c in p.control:
            if c in by_p:
                ctrl[by_p[c]].append(dst)
    feed_edges = []
    fed = {(id(n), i): k for k, (n, i) in enumerate(feeds)}
    for k in range(len(feeds)):
        feed_edges.append([])
    for p in pnodes:
        dst = by_p[p]
        for slot, src in enumerate(p.inputs):
            if src is None:
                continue
            key = (id(src[0]), src[1])
            if key in fed:
                feed_edges[fed[key]].append((dst, dst.in_base + slot, dst.kind == Kind.MERGE))
    for i in infos:
        i.outs = tuple(tuple(e) for e in outs[i])
        i.ctrl_outs = tuple(ctrl[i])
    fetch_map: dict[NodeInfo, list] = {}
    for k, (p, idx) in enumerate(fetches):
        fetch_map.setdefault(by_p[p], []).append((idx, k))
    for i, lst in fetch_map.items():
        i.fetch = tuple(lst)
    for i in infos:
        i.simple = (i.kind == Kind.KERNEL and i.n_out == 1 and not i.ctrl_outs and not i.fetch
                    and not i.ordered and not any(m for _, _, m in i.outs[0]))
    root = frames[""]
    _order_nested_frames(root)
    # A node is a source when nothing is pending for it, except fed inputs which the run
    # delivers itself.
    n_fed = {}
    for edges in feed_edges:
        for dst, _, _ in edges:
            n_fed[dst] = n_fed.get(dst, 0) + 1
    sources = [i for i in root.nodes if root.pending[i.local] == 0 and i not in n_fed]
    for f in frames.values():
        f.nodes = list(f.nodes)
    recvs = [i for i in infos if i.kind == Kind.RECV]
    return ExecPlan(infos, root, frames, sources, [tuple(e) for e in feed_edges], len(fetches),
                    recvs, xp, feed_pnodes=[p for p, _ in feeds],
                    fetch_refs=[(by_p[p], idx) for p, idx in fetches])

