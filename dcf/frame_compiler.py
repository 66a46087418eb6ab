"""Compile a loop frame whose nodes all sit on one device into straight-line Python.

The generated generator runs the frame's iterations one after another with exactly
the executor's semantics: values may be DEAD where the dead-value analysis says they
can be, Merge takes its first live input, Switch routes, Exit keeps the first live
value, a dead NextIteration ends the loop, nested frames become nested loops.
Running iterations in order is one legal schedule of the tagged-token executor, and
the one every result must equal, since results never depend on parallel_iterations.
It yields every few milliseconds so the event loop stays responsive.
"""

from __future__ import annotations

import collections
import itertools
import re
import sys
import time
import weakref
from typing import Any

import numpy as np

from dcf.dtypes import NUMPY_SCALARS
from dcf.errors import InvalidArgumentError, node_error
from dcf.executor import check_pred
from dcf.ops.data_ops import StackStore
from dcf.ops.registry import Kind
from dcf.plan import TRANSFER, ExecPlan, FrameInfo, NodeInfo
from dcf.token import DEAD

__all__ = ["compile_frames", "CompiledFrame"]

# A compiled frame hands the event loop back at least this often. Each hand-back costs
# ~10 us; 5 ms (Python's thread switch interval) saved ~0.3 % of a host-bound GPU loop but
# slowed a service's /health answers from ~11 to ~17 ms (bench/NOTES.md, "GPU, session 18").
_YIELD_S = 0.002
# A loop on GPUs records an event per GPU this many times per parallel_iterations
# window (every max(1, pi // MARKS_PER_WINDOW) iterations) to bound the work in flight:
# at most pi iterations, and at least pi - pi // MARKS_PER_WINDOW + 1. An event costs the
# host ~5 us, about a launch (bench/NOTES.md, "GPU, sessions 17-18").
MARKS_PER_WINDOW = 2
# In a loop over several GPUs, a held gradient accumulation is emitted after the other
# work of its GPU in the iteration and after the transfers of that GPU's values to the
# others (see _device_grouped); read when a frame is compiled.
DEFER_ACCUMULATIONS = True

# Kernels that are one Python operator (see the op tables in ops/math_ops.py and
# ops/control_ops.py) are emitted inline: same semantics, no call.
_INLINE = {
    "Identity": "{0}", "LoopCond": "{0}", "StopGradient": "{0}",
    "Add": "({0} + {1})", "Sub": "({0} - {1})", "Mul": "({0} * {1})", "RealDiv": "({0} / {1})",
    "Less": "({0} < {1})", "LessEqual": "({0} <= {1})", "Greater": "({0} > {1})",
    "GreaterEqual": "({0} >= {1})", "LogicalAnd": "({0} & {1})", "LogicalOr": "({0} | {1})",
}
# Kernels whose output is their input: in known-guard code their readers read the input.
_ALIAS = {"Identity", "StopGradient", "LoopCond"}
# On a GPU, _INLINE kernels run inline for these argument types (host scalars; see call())
_HOST_SCALARS = NUMPY_SCALARS | {bool, int, float}
_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_counter = itertools.count()
_INT0, _INT1 = np.int32(0), np.int32(1)


def compile_frames(plan: ExecPlan) -> None:
    """Attach a CompiledFrame to every top-level compilable frame of `plan`."""
    info_of = {id(n.pnode): n for n in plan.nodes}
    ok: dict[str, bool] = {}

    def compilable(f: FrameInfo) -> bool:
        if f.name in ok:
            return ok[f.name]
        res = all(n.kind not in (Kind.SEND, Kind.RECV, Kind.ASYNC) for n in f.nodes) and \
            all(compilable(c) for c in f.children) and _enters_feed_merges(f, plan)
        ok[f.name] = res
        return res

    for f in plan.frames.values():
        if f.parent is not None and compilable(f) and (f.parent.parent is None or
                                                       not compilable(f.parent)):
            try:
                f.compiled = CompiledFrame(f, plan, info_of)
            except _NotCompilable as e:
                f.compiled = None  # the tagged-token executor runs it
                if isinstance(e, _TooDeep):
                    ok[f.name] = False  # (and the loops in it are compiled each alone)


    if all(compilable(c) for c in plan.root.children) and \
            all(c.compiled is not None for c in plan.root.children) and \
            all(n.kind not in (Kind.SEND, Kind.RECV, Kind.ASYNC) for n in plan.root.nodes):
        try:
            plan.compiled_root = CompiledRoot(plan, info_of)
        except _NotCompilable:
            plan.compiled_root = None


class _FeedRef:
    """Stands in for the NodeInfo of a fed value in generated code."""

    def __init__(self, k: int) -> None:
        self.id = f"f{k}"
        self.frame = None


class CompiledRoot:
    """The whole root frame of a partition (and its loops) as one generated function:
    for partitions with no Send, Recv or waiting op, a run is one call."""

    def __init__(self, plan: ExecPlan, info_of: dict) -> None:
        self.frame = plan.root
        self.plan = plan
        self.info_of = dict(info_of)
        self.feeds = [_FeedRef(k) for k in range(len(plan.feed_pnodes))]
        for p, ref in zip(plan.feed_pnodes, self.feeds):
            self.info_of[id(p)] = ref
        self.enters: list = []
        self.fn = _Codegen(self, False).build_root()

    def start(self, feed_values: list) -> Any:
        return self.fn(feed_values)


def _enters_feed_merges(f: FrameInfo, plan: ExecPlan) -> bool:
    for n in plan.nodes:
        if n.kind == Kind.ENTER and n.child is f and not n.is_constant:
            if not all(is_merge for edges in n.outs for _, _, is_merge in edges) or n.ctrl_outs:
                return False
    return True


class CompiledFrame:
    """Generated code for one frame (and the frames nested in it)."""

    def __init__(self, frame: FrameInfo, plan: ExecPlan, info_of: dict) -> None:
        self.frame = frame
        self.plan = plan
        self.info_of = info_of
        self.enters = [n for n in plan.nodes if n.kind == Kind.ENTER and n.child is frame]
        self._variants: dict[bool, Any] = {False: _Codegen(self, False).build()}

    def start(self, enter_values: dict, ist: Any, ex: Any) -> Any:
        """A generator running one instance of the frame; its return value is the list
        of (Exit node, value) to propagate into the parent iteration."""
        dead_entry = any(v is DEAD for v in enter_values.values())
        fn = self._variants.get(dead_entry)
        if fn is None:
            fn = self._variants[dead_entry] = _Codegen(self, dead_entry).build()
        return fn(enter_values)


class _Codegen:
    def __init__(self, cf: CompiledFrame, dead_entry: bool) -> None:
        self.cf = cf
        self.dead_entry = dead_entry
        self.lines: list[str] = []
        self.line_node: dict[int, tuple[NodeInfo, str]] = {}
        # line -> (frame, counter, the loops around it as in outer_of)
        self.yield_sites: dict[int, tuple[str, str, tuple]] = {}
        self.loops: list[tuple[str, str]] = []     # (frame, counter) of the loops being emitted
        # loop counter -> (frame, counter) of the loops around it, innermost first
        self.outer_of: dict[str, tuple] = {}
        self.env: dict[str, Any] = {"DEAD": DEAD, "_I0": _INT0, "_I1": _INT1,
                                    "_pc": time.perf_counter, "_YIELD_S": _YIELD_S,
                                    "_err": InvalidArgumentError, "_chkp": check_pred}
        self.mayd: dict[tuple[int, int], bool] = {}
        self.node_dead: dict[int, str | None] = {}
        self.fuse_root: dict[int, tuple] = {}   # elementwise GPU trees (one kernel each)
        self.fuse_skip: set[int] = set()
        # node id -> (leaves, make(gpu, node) -> the callable): nodes that run as one call
        # with the ops they absorb (dcf/fusion/: accumulations in place, the gates'
        # gradient with its dh sum, the gates over their product, the read part of a
        # split product, a slice's gradient added into the other addend)
        self.fused_call: dict[int, tuple[list, Any]] = {}
        self.accumulations: set[int] = set()    # ids of the held gradient accumulations
        self.held: dict[str, list] = {}     # loop counter -> its accumulations' nodes
        # node id -> the input its result may overwrite (dcf/fusion/in_place.py)
        self.in_place: dict[int, int] = {}
        self.vguard: dict[tuple, tuple | None] = {}   # value -> guard (see analyze)
        self.nguard: dict[int, tuple | None] = {}     # node -> guard of its firing
        self.alias: dict[tuple, str] = {}             # value -> variable it shares
        self.alias_src: dict[tuple, tuple] = {}       # value -> the value it shares
        self.pos: dict[Any, int] = {}                 # node -> position in its scope
        self._pos = 0
        self.esc_val: set[tuple] = set()              # known values run-time readers read
        self.esc_flag: set[int] = set()               # known nodes whose dead flag is read
        self.next_expr: dict[int, str] = {}           # NextIteration -> its value's variable
        self.stack_flag: dict[tuple, str] = {}        # (handle variable, on a GPU) -> flag
        self.early: dict[tuple, int] = {}             # root value -> its early fetch index

    def plan_fusion(self, f: FrameInfo) -> None:
        gpu_of = self.cf.plan.gpu_of
        if not gpu_of:
            return
        from dcf.fusion.elementwise import fusion_groups

        for root, grp in fusion_groups(f.nodes, gpu_of, self.inputs).items():
            if not hasattr(gpu_of[root].cp, "ElementwiseKernel"):
                continue
            self.fuse_root[root] = grp
            self.fuse_skip.update(n.id for n in grp[0])
        from dcf.fusion.gates_grad import FusedGatesGrad, gates_grad_groups
        from dcf.fusion.matmul_gates import FusedMatMulGates, matmul_gates_groups
        from dcf.fusion.split_matmul import FusedSplitMatMul, split_matmul_groups

        for gg, (total, leaves) in gates_grad_groups(f.nodes, gpu_of, self.inputs,
                                                     self.taken()).items():
            self.fuse_call(gg, total, leaves,
                           lambda gpu, n, total=total: FusedGatesGrad(gpu, n, total))
        for gt, (mm, leaves, *slots) in matmul_gates_groups(f.nodes, gpu_of, self.inputs,
                                                            self.taken()).items():
            self.fuse_call(gt, mm, leaves, lambda gpu, n, mm=mm, slots=slots:
                           FusedMatMulGates(gpu, n, mm, *slots))
        for sp, (mm, leaves, used, r0, r1) in split_matmul_groups(
                f.nodes, gpu_of, self.inputs, self.taken()).items():
            self.fuse_call(sp, mm, leaves, lambda gpu, n, mm=mm, used=used, r0=r0, r1=r1:
                           FusedSplitMatMul(gpu, n, mm, used, r0, r1))
        from dcf.fusion.slice_add import FusedSliceAdd, slice_add_groups

        for sa, (sg, leaves, j, fresh) in slice_add_groups(f.nodes, gpu_of, self.inputs,
                                                           self.taken()).items():
            self.fuse_call(sa, sg, leaves, lambda gpu, n, sg=sg, j=j, fresh=fresh:
                           FusedSliceAdd(gpu, n, sg, j, fresh))
        if f.parent is not None:
            from dcf.fusion.accumulate import FusedAccumulate, accumulate_groups

            taken = self.taken()
            for add, (term, kind, leaves, pos) in accumulate_groups(f.nodes, gpu_of,
                                                                    self.inputs).items():
                if add not in taken and term.id not in taken:
                    self.fuse_call(add, term, leaves, lambda gpu, n, term=term, kind=kind,
                                   pos=pos: FusedAccumulate(gpu, n, term, kind, pos))
                    self.accumulations.add(add)
        from dcf.fusion.in_place import in_place_groups

        self.in_place.update(in_place_groups(f.nodes, gpu_of, self.inputs, self.taken()))

    def taken(self) -> set:
        """Ids of the nodes already fused into another call, or fused calls themselves."""
        return self.fuse_skip | self.fuse_root.keys() | self.fused_call.keys()

    def fuse_call(self, root: int, absorbed: NodeInfo, leaves: list, make: Any) -> None:
        self.fused_call[root] = (leaves, make)
        self.fuse_skip.add(absorbed.id)

    # ---------------------------------------------------------------- emit
    def emit(self, depth: int, text: str, node: NodeInfo | None = None,
             frame_var: str | None = None) -> None:
        self.lines.append("    " * depth + text)
        if node is not None:
            self.line_node[len(self.lines)] = (node, frame_var or "")

    def fused_inputs(self, n: NodeInfo) -> tuple:
        """(elementwise group, fused call, inputs) of `n`: a fused node reads its
        group's or call's leaves, the others their own inputs."""
        grp = self.fuse_root.get(n.id)
        fc = self.fused_call.get(n.id)
        if grp is not None:
            return grp, fc, grp[1]
        return grp, fc, fc[0] if fc is not None else self.inputs(n)

    def inputs(self, n: NodeInfo) -> list:
        return [None if i is None else (self.cf.info_of.get(id(i[0])), i[1])
                for i in n.pnode.inputs]

    def controls(self, n: NodeInfo) -> list[NodeInfo]:
        return [self.cf.info_of[id(c)] for c in n.pnode.control if id(c) in self.cf.info_of]

    def val(self, src: NodeInfo, k: int) -> str:
        return f"v{src.id}_{k}"

    # ---------------------------------------------------------------- build
    def build(self) -> Any:
        f = self.cf.frame
        self.emit(0, "def frame(_enter):")
        self.emit(1, "_deadline = _last = _pc()")
        self.emit(1, "_deadline += _YIELD_S")
        self.emit(1, "_n = _N = 1")
        self.emit(1, "if False: yield")
        exits = self.frame_loop(f, self.cf.enters, 1, {e.id: f"_enter[{e.id}]"
                                                      for e in self.cf.enters},
                                self.dead_entry)
        self.emit(1, "return [" + ", ".join(f"(_X{x.id}, x{x.id})" for x in exits) + "]")
        for x in exits:
            self.env[f"_X{x.id}"] = x
        src = "\n".join(self.lines)
        fname = f"<dcf frame {f.name} #{next(_counter)}>"
        ns: dict[str, Any] = dict(self.env)
        exec(_compiled(src, fname), ns)
        gen_fn = ns["frame"]
        line_node = self.line_node
        _register_yields(gen_fn, fname, self.yield_sites)
        return _with_errors(gen_fn, fname, line_node, self.outer_of)

    def build_root(self) -> Any:
        root = self.cf.frame
        self.emit(0, "def root(_feeds):")
        self.emit(1, "_deadline = _last = _pc()")
        self.emit(1, "_deadline += _YIELD_S")
        self.emit(1, "_n = _N = 1")
        self.emit(1, "if False: yield")
        for ref in self.cf.feeds:
            self.emit(1, f"v{ref.id}_0 = _feeds[{ref.id[1:]}]")
        self.plan_fusion(root)
        self.plan_early_fetches(root)
        for fi in sorted(set(self.early.values())):
            self.emit(1, f"_ef{fi} = None")
        self.scope(self.order(root, [], {i for i, _ in self.early}), 1, "_root_it", None,
                   reads=list(self.cf.plan.fetch_refs))
        outs = []
        for n, k in self.cf.plan.fetch_refs:
            fi = self.early.get((n.id, k))
            v = self.val(n, k)
            outs.append(v if fi is None else f"(_ef{fi} if _ef{fi} is not None else {v})")
        self.emit(1, "return [" + ", ".join(outs) + "]")
        src = "\n".join(self.lines)
        fname = f"<dcf root #{next(_counter)}>"
        ns: dict[str, Any] = dict(self.env)
        exec(_compiled(src, fname), ns)
        _register_yields(ns["root"], fname, self.yield_sites)
        return _with_errors(ns["root"], fname, self.line_node, self.outer_of)

    def plan_early_fetches(self, root: FrameInfo) -> None:
        """(node id, output) -> fetch index of the root's fetched GPU values whose copy to
        the host may start where they are made (dcf/fused.py, FRESH_OUTPUT_OPS)."""
        plan = self.cf.plan
        if not plan.gpu_of:
            return
        from dcf import fused
        from dcf.actors.gpu_actor import early_fetch

        if not fused.EARLY_FETCH:
            return
        for fi, (n, k) in enumerate(plan.fetch_refs):
            if isinstance(n, NodeInfo) and n.frame is root and n.id in plan.gpu_of and \
                    n.type in fused.FRESH_OUTPUT_OPS and n.id not in self.fuse_skip:
                self.early.setdefault((n.id, k), fi)
        if self.early:
            self.env["_efetch"] = early_fetch

    def start_early_fetches(self, n: NodeInfo, d: int) -> None:
        """Right after root node n's code: start the copies of its early fetches."""
        for k in range(n.n_out):
            fi = self.early.get((n.id, k))
            if fi is not None:
                self.emit(d, f"_ef{fi} = _efetch(v{n.id}_{k}, {fi})")

    def frame_loop(self, f: FrameInfo, enters: list[NodeInfo], d: int,
                   enter_expr: dict[int, str], entry_dead: bool) -> list[NodeInfo]:
        """Emit the loop for frame `f`; return its Exit nodes (values in x{id})."""
        itv = f"it{len(self.lines)}"
        self.outer_of[itv] = tuple(reversed(self.loops))
        self.loops.append((f.name, itv))
        # loop constants and loop-variable entries
        merges_of_enter: dict[int, NodeInfo] = {}
        for e in enters:
            expr = enter_expr[e.id]
            if e.is_constant:
                self.emit(d, f"v{e.id}_0 = {expr}")
                self.stack_flags(e, d)
                self.mayd[(e.id, 0)] = entry_dead
                self.vguard[(e.id, 0)] = None if entry_dead else ()
                self.node_dead[e.id] = f"(v{e.id}_0 is DEAD)" if entry_dead else None
            else:
                for edges in e.outs:
                    for dst, _, _ in edges:
                        merges_of_enter[dst.id] = dst
                        self.emit(d, f"m{dst.id} = {expr}")
        loop_merges = [n for n in f.nodes if n.kind == Kind.MERGE and n.merge_n == 1]
        for m in loop_merges:
            if m.id not in merges_of_enter:
                raise _NotCompilable(f"loop merge {m.name} has no Enter in this partition")
        for x in f.exits:
            self.emit(d, f"x{x.id} = DEAD")
        self.emit(d, f"{itv} = 0")
        self.held[itv] = []
        held_line = len(self.lines)
        self.emit(d, "")         # the held lists of the loop's accumulations, if any
        self.plan_fusion(f)
        gpus = self.frame_gpus(f)
        if gpus:
            # parallel_iterations bounds the iterations whose GPU work is in flight
            self.env[f"_mark{itv}"] = _marker(gpus)
            self.env["_deque"] = collections.deque
            self.emit(d, f"_gq{itv} = _deque()")
        self.emit(d, "while True:")
        b = d + 1
        copies = []
        for m in loop_merges:
            self.mayd[(m.id, 0)] = entry_dead
            self.mayd[(m.id, 1)] = False
            self.vguard[(m.id, 0)] = None if entry_dead else ()
            self.vguard[(m.id, 1)] = ()
            self.node_dead[m.id] = f"(v{m.id}_0 is DEAD)" if entry_dead else None
            self.emit(b, f"v{m.id}_0 = m{m.id}")
            if not entry_dead:       # readers that run where it is live read m{id} itself
                self.alias[(m.id, 0)] = f"m{m.id}"
                self.alias_src[(m.id, 0)] = (m.id, 0)
                copies.append((len(self.lines) - 1, m))
            if (len(m.outs) > 1 and m.outs[1]) or any(
                    n is m and k == 1 for n, k in self.cf.plan.fetch_refs):
                self.emit(b, f"v{m.id}_1 = _I1 if {itv} else _I0")   # value_index, if read
        nexts: list[tuple[NodeInfo, NodeInfo]] = []
        guard, last = self.scope(self.order(f, loop_merges), b, itv, nexts)
        for idx, m in copies:
            if (m.id, 0) not in self.esc_val:
                self.lines[idx] = ""     # no run-time reader needs the copy
        if not nexts:
            raise _NotCompilable(f"frame {f.name} has no NextIteration here")
        if guard:
            # every NextIteration value is live exactly where `guard` holds (the loop's
            # predicate): the loop ends where it fails (capturing the Exits live there),
            # and goes on with those values
            self.emit(b, f"if not ({self.lit_expr(guard)}):")
            for line in last:
                self.emit(b + 1, line)
            self.emit(b + 1, "break")
            # at once: a value may be another loop variable's (x, y -> y, x)
            self.emit(b, ", ".join(f"m{m.id}" for _, m in nexts) + " = " +
                      ", ".join(self.next_expr[n.id] for n, _ in nexts))
        else:
            alive = " or ".join(f"n{n.id} is not DEAD" for n, _ in nexts)
            all_alive = " and ".join(f"n{n.id} is not DEAD" for n, _ in nexts)
            self.emit(b, f"if not ({alive}): break")
            if len(nexts) > 1:
                self.emit(b, f"if not ({all_alive}): raise _err('loop frame {f.name}: some "
                             "loop variables ended while others continued')")
            for n, m in nexts:
                self.emit(b, f"m{m.id} = n{n.id}")
        self.emit(b, f"{itv} += 1")
        if gpus:
            # An event per GPU every `stride` iterations (an event costs the host about
            # as much as a kernel launch); waiting for the one `pi // stride` marks back
            # keeps at most pi iterations in flight, and at least pi - stride + 1.
            q = f"_gq{itv}"
            pi = max(1, int(f.parallel_iterations))
            stride = max(1, pi // MARKS_PER_WINDOW)
            m = b
            if stride > 1:
                self.emit(b, f"if not {itv} % {stride}:")
                m = b + 1
            self.emit(m, f"{q}.append(_mark{itv}())")
            self.emit(m, f"if len({q}) >= {pi // stride}:")
            self.emit(m + 1, f"for _ev in {q}.popleft():")
            self.emit(m + 2, "while not _ev.done: yield _ev")
        swapping, pushing = self.stack_gpus(f)
        if swapping:
            # the swapper of each GPU whose stacks this loop pushes or pops acts here (its
            # pushes and pops are plain list operations)
            from dcf.actors.gpu_swap import TICK_EVERY
            self.env[f"_swt{itv}"] = _ticker(swapping, pushing)
            self.emit(b, f"if not {itv} % {TICK_EVERY}: _swt{itv}()")
        # Look at the clock every _N iterations, _N adapting (1..64) so that checks come
        # about every 0.5 ms whether an iteration takes 100 ns or 10 ms.
        self.emit(b, "_n -= 1")
        self.emit(b, "if not _n:")
        self.emit(b + 1, "_now = _pc()")
        self.emit(b + 1, "_N = _N * 2 if _now - _last < 0.0005 and _N < 64 else (_N // 2 or 1)")
        self.emit(b + 1, "_n = _N; _last = _now")
        self.emit(b + 1, "if _now > _deadline:")
        self.emit(b + 2, "yield")
        self.yield_sites[len(self.lines)] = (f.name, itv, self.outer_of[itv])
        self.emit(b + 2, "_deadline = _pc() + _YIELD_S")
        held = self.held.pop(itv)
        if held:
            self.lines[held_line] = "    " * d + "; ".join(f"_held{n.id} = []" for n in held)
            for n in held:
                self.emit(d, f"f{n.id}.flush(_held{n.id}, {itv})", n, itv)
            from dcf.ops.gpu_kernels import forget_stacks
            self.env["_forget_stacks"] = forget_stacks
            self.emit(d, "_forget_stacks()")     # the last stack shared by the flushes
        if swapping and pushing:
            self.emit(d, f"_swt{itv}(True)")     # at its end: pays all that is owed
        for x in f.exits:
            self.mayd[(x.id, 0)] = entry_dead  # a live loop always ends with live exits
        self.loops.pop()
        return f.exits

    def stack_gpus(self, f: FrameInfo) -> tuple[list, bool]:
        """The GPUs whose saved-value stacks nodes of `f` itself push (swap_memory) or
        pop, and whether it pushes (a forward loop) rather than pops."""
        gpu_of = self.cf.plan.gpu_of
        out: dict[int, Any] = {}
        pushing = False
        for n in f.nodes:
            push = n.type == "StackPushV2" and n.pnode is not None and \
                bool(n.pnode.attrs.get("swap_memory"))
            if push or n.type == "StackPopV2":
                gpu = gpu_of.get(n.id)
                if gpu is not None:
                    out[id(gpu)] = gpu
                    pushing = pushing or push
        return list(out.values()), pushing

    def frame_gpus(self, f: FrameInfo) -> list:
        """The GPUs that nodes of `f` (nested frames included) enqueue work on."""
        gpu_of = self.cf.plan.gpu_of
        if not gpu_of:
            return []
        out: dict[int, Any] = {}
        todo = [f]
        while todo:
            g = todo.pop()
            for n in g.nodes:
                gpu = gpu_of.get(n.id)
                if gpu is not None:
                    out[id(gpu)] = gpu
            todo.extend(g.children)
        return list(out.values())

    def child_block(self, g: FrameInfo, d: int) -> None:
        enters = [n for n in self.cf.plan.nodes if n.kind == Kind.ENTER and n.child is g]
        exprs, entry_dead = {}, False
        for e in enters:
            src, k = self.inputs(e)[0]
            exprs[e.id] = self.val(src, k)
            entry_dead = entry_dead or self.mayd.get((src.id, k), False)
            for c in self.controls(e):
                if self.node_dead.get(c.id):
                    raise _NotCompilable("control input on an Enter")
        exits = self.frame_loop(g, enters, d, exprs, entry_dead)
        for x in exits:
            self.emit(d, f"v{x.id}_0 = x{x.id}")
            self.node_dead[x.id] = f"(v{x.id}_0 is DEAD)"

    def order(self, f: FrameInfo, loop_merges: list[NodeInfo], hoist: Any = ()) -> list:
        """Topological order of one iteration; nested frames appear as one block. The
        nodes whose ids are in `hoist` come right after the last item they need."""
        block_of: dict[int, FrameInfo] = {}
        for g in f.children:
            for n in self.cf.plan.nodes:
                if n.kind == Kind.ENTER and n.child is g:
                    block_of[n.id] = g
                    for x in _all_exits(g):
                        block_of[x.id] = g
        items: dict[Any, set] = {}
        own = [n for n in f.nodes if n not in loop_merges]

        def key(n: NodeInfo) -> Any:
            return block_of.get(n.id, n)

        for n in own:
            items.setdefault(key(n), set())
        for g in f.children:
            items.setdefault(g, set())
        for n in own:
            k = key(n)
            srcs = [i[0] for i in self.inputs(n) if i is not None and i[0] is not None]
            srcs += self.controls(n)
            if n.kind == Kind.MERGE and n.merge_n == 1:
                continue
            for s in srcs:
                if s.frame is f or s.id in block_of:
                    sk = key(s)
                    if sk is not k and s not in loop_merges:
                        items[k].add(sk)
        gpu_of = self.cf.plan.gpu_of
        if len({id(gpu_of[n.id]) for n in own if n.id in gpu_of}) > 1:
            sent_from = {}          # a transfer to a GPU -> the GPU its value comes from
            for n in own:
                if n.type == TRANSFER:
                    src = self.inputs(n)[0]
                    if src is not None and src[0] is not None and src[0].id in gpu_of:
                        sent_from[n.id] = gpu_of[src[0].id]
            late = self.accumulations if DEFER_ACCUMULATIONS else ()
            return _hoisted(_device_grouped(items, gpu_of, f.name, late, sent_from), items,
                            hoist)
        out, done = [], set()
        pending = dict(items)
        while pending:
            progress = False
            for k in list(pending):
                if pending[k] <= done:
                    out.append(k)
                    done.add(k)
                    del pending[k]
                    progress = True
            if not progress:
                raise _NotCompilable(f"cycle in frame {f.name}")
        return _hoisted(out, items, hoist)

    # ---------------------------------------------------------------- guards
    # A value's guard says exactly when it is live: a conjunction of literals
    # (pos, name, polarity), "the predicate held in variable `name` is true/false",
    # sorted by the predicate's position in the scope (so every literal's own
    # predicate is evaluated under the literals before it). () = always live;
    # None = unknown, decided at run time by testing for DEAD as before.
    # Nodes whose guards are known are emitted inside `if <literal>:` blocks
    # and test nothing, so a branch that is not taken costs one test however
    # many ops it holds; only values that a run-time reader needs (a fetch, an
    # Exit, a NextIteration, a node whose guard is unknown) are set to DEAD in
    # the block's `else:`.

    def gget(self, src: Any, k: int) -> tuple | None:
        key = (src.id, k)
        if key in self.vguard:
            return self.vguard[key]
        return None if self.mayd.get(key, False) else ()

    def ngget(self, c: NodeInfo) -> tuple | None:
        if c.id in self.nguard:
            return self.nguard[c.id]
        return None if self.node_dead.get(c.id) else ()

    def kval(self, src: Any, k: int) -> str:
        """The variable holding (src, k) for a reader that runs only where it is live."""
        return self.alias.get((src.id, k)) or self.val(src, k)

    def rt_read(self, src: Any, k: int) -> None:
        """A run-time reader (tests for DEAD) reads (src, k): it must be materialized."""
        g = self.gget(src, k)
        if g is not None and (g or (src.id, k) in self.alias):
            self.esc_val.add((src.id, k))

    def rt_ctrl(self, c: NodeInfo) -> None:
        g = self.ngget(c)
        if g:
            self.esc_flag.add(c.id)

    @staticmethod
    def union(*gs: tuple) -> tuple:
        out: set = set()
        for g in gs:
            out.update(g)
        return tuple(sorted(out))

    @staticmethod
    def lit_expr(lits: Any) -> str:
        return " and ".join(name if pol else f"not {name}" for _, name, pol in lits)

    def set_known(self, n: NodeInfo, g: tuple, n_out: int) -> None:
        for k in range(n_out):
            self.vguard[(n.id, k)] = g
            self.mayd[(n.id, k)] = bool(g)
        self.nguard[n.id] = g
        self.node_dead[n.id] = f"d{n.id}" if g else None

    def analyze(self, items: list, nexts: list | None) -> list:
        """Pass 1 over one scope: decide each item's mode ('known' with a guard, or
        'rt'), set guards, and mark the values run-time readers need."""
        plan: list = []
        known_nexts: list = []      # plan indices of NextIterations with a known guard
        for item in items:
            pos = self._pos = self._pos + 1
            if isinstance(item, FrameInfo):
                plan.append(self.analyze_frame(item, pos))
                continue
            n = item
            if n.kind in (Kind.EXIT, Kind.NEXT_ITERATION) and not self.controls(n):
                src, k = self.inputs(n)[0]
                g = self.gget(src, k)
                if g is not None:    # live exactly where g holds
                    if n.kind == Kind.NEXT_ITERATION:
                        known_nexts.append(len(plan))
                        plan.append(("next", n, g))
                    else:
                        plan.append(("exit", n, g))    # captured there
                    continue
            if n.kind in (Kind.NEXT_ITERATION, Kind.EXIT):
                src, k = self.inputs(n)[0]
                self.rt_read(src, k)
                for c in self.controls(n):
                    self.rt_ctrl(c)
                plan.append(("rt", n, None))
                continue
            grp, _, ins = self.fused_inputs(n)
            gs = [self.gget(src, k) for src, k in ins]
            cgs = [self.ngget(c) for c in self.controls(n)]
            known = all(g is not None for g in gs + cgs)
            if n.id in self.fuse_skip:
                g = self.union(*gs, *cgs) if known else None
                self.vguard[(n.id, 0)] = g
                self.nguard[n.id] = g
                plan.append(("skip", n, None))
                continue
            if known and n.kind == Kind.SWITCH:
                (dsrc, dk), (psrc, pk) = ins
                g = self.union(*gs, *cgs)
                name = self.kval(psrc, pk)
                ppos = self.pos.get(self.alias_src.get((psrc.id, pk), (psrc.id, pk))[0], -1)
                for k, pol in ((0, False), (1, True)):
                    self.vguard[(n.id, k)] = self.union(g, ((ppos, name, pol),))
                    self.mayd[(n.id, k)] = True
                    self.alias[(n.id, k)] = self.kval(dsrc, dk)
                    self.alias_src[(n.id, k)] = self.alias_src.get((dsrc.id, dk),
                                                                   (dsrc.id, dk))
                self.nguard[n.id] = g
                self.node_dead[n.id] = f"d{n.id}" if g else None
                self.pos[n.id] = pos
                plan.append(("switch", n, g))
                continue
            if known and n.kind == Kind.MERGE:
                c = self.merge_guard(gs)
                if c is not None:
                    self.set_known(n, c, 2)
                    self.pos[n.id] = pos
                    plan.append(("merge", n, (c, gs)))
                    continue
            if known and n.kind == Kind.TRIGGER:
                self.nguard[n.id] = ()
                self.node_dead[n.id] = None
                plan.append(("skip", n, None))
                continue
            if known and n.kind == Kind.KERNEL:
                g = self.union(*gs, *cgs)
                self.set_known(n, g, n.n_out)
                self.pos[n.id] = pos
                if n.type == "Const" and not ins and grp is None and n.n_out == 1:
                    # hoisted: readers read the value itself, no line per iteration
                    self.env[f"_C{n.id}"] = n.fn()
                    self.alias[(n.id, 0)] = f"_C{n.id}"
                    self.alias_src[(n.id, 0)] = (n.id, 0)
                if grp is None and n.n_out == 1 and (
                        n.type in _ALIAS and self.cf.plan.xp is np and
                        n.id not in self.cf.plan.gpu_of or
                        n.type == TRANSFER and _only_predicate(n)):
                    src, k = ins[0]
                    self.alias[(n.id, 0)] = self.kval(src, k)
                    self.alias_src[(n.id, 0)] = self.alias_src.get((src.id, k), (src.id, k))
                plan.append(("kernel", n, g))
                continue
            # run time: exactly the tests of node()
            for src, k in ins:
                self.rt_read(src, k)
            for c in self.controls(n):
                self.rt_ctrl(c)
            md = any(self.mayd.get((src.id, k), False) for src, k in ins) or \
                any(self.node_dead.get(c.id) for c in self.controls(n))
            for k in range(n.n_out):
                self.vguard[(n.id, k)] = None
            self.nguard[n.id] = None
            if n.kind == Kind.SWITCH:
                self.mayd[(n.id, 0)] = self.mayd[(n.id, 1)] = True
                self.node_dead[n.id] = f"d{n.id}" if md else None
            elif n.kind == Kind.MERGE:
                all_dead = all(self.mayd.get((src.id, k), False) for src, k in ins)
                self.mayd[(n.id, 0)] = all_dead
                self.mayd[(n.id, 1)] = False
                self.node_dead[n.id] = f"(v{n.id}_0 is DEAD)" if all_dead else None
            elif n.kind == Kind.TRIGGER:
                self.node_dead[n.id] = None
            else:
                for k in range(n.n_out):
                    self.mayd[(n.id, k)] = md
                self.node_dead[n.id] = f"d{n.id}" if md else None
            plan.append(("rt", n, None))
        guards = {plan[i][2] for i in known_nexts}
        next_guard = guards.pop() if len(guards) == 1 and \
            len(known_nexts) == sum(1 for it in items if not isinstance(it, FrameInfo) and
                                    it.kind == Kind.NEXT_ITERATION) else None
        if not next_guard:           # () or mixed: the run-time tests of next_iteration()
            next_guard = None
            for i in known_nexts:
                n = plan[i][1]
                self.rt_read(*self.inputs(n)[0])
                plan[i] = ("rt", n, None)
        return plan, next_guard

    def analyze_frame(self, g: FrameInfo, pos: int) -> tuple:
        enters = [n for n in self.cf.plan.nodes if n.kind == Kind.ENTER and n.child is g]
        ins = [self.inputs(e)[0] for e in enters]
        gs = [self.gget(src, k) for src, k in ins]
        cgs = [self.ngget(c) for e in enters for c in self.controls(e)]
        exits = _all_exits(g)
        if all(x is not None for x in gs + cgs):
            u = self.union(*gs, *cgs)
            if all(x == u for x in gs):
                # every Enter live exactly where u holds: run the loop only there
                for x in exits:
                    self.set_known(x, u, 1)
                    self.pos[x.id] = pos
                return ("frame", g, u)
        for src, k in ins:
            self.rt_read(src, k)
        for e in enters:
            for c in self.controls(e):
                self.rt_ctrl(c)
        entry_dead = any(self.mayd.get((src.id, k), False) for src, k in ins)
        for x in exits:
            self.vguard[(x.id, 0)] = None
            self.nguard[x.id] = None
            self.mayd[(x.id, 0)] = entry_dead
            self.node_dead[x.id] = f"(v{x.id}_0 is DEAD)"
        return ("rtframe", g, None)

    def merge_guard(self, gs: list) -> tuple | None:
        """The guard of a Merge whose inputs' guards are `gs` (its output is live where
        any input is), when that is one conjunction; None otherwise."""
        terms = [frozenset(g) for g in gs if not _contradicts(g)]
        if not terms:
            return None
        changed = True
        while changed and len(terms) > 1:
            changed = False
            terms = list(dict.fromkeys(terms))
            for i, a in enumerate(terms):
                for j, b in enumerate(terms):
                    if i == j:
                        continue
                    if a <= b:                         # b adds nothing to a
                        del terms[j]
                        changed = True
                        break
                    diff = a ^ b
                    if len(diff) == 2:
                        x, y = diff
                        if x[1] == y[1] and x[0] == y[0] and x[2] != y[2]:
                            terms[i] = a & b           # (C and p) or (C and not p) = C
                            del terms[j]
                            changed = True
                            break
                if changed:
                    break
        return tuple(sorted(terms[0])) if len(terms) == 1 else None

    def scope(self, items: list, d: int, itv: str, nexts: list | None,
              reads: list = ()) -> tuple:
        """Emit one scope (the root, or one iteration of a loop frame) at depth d; return
        the guard every NextIteration value shares, where that decides the loop's end,
        and the Exit captures for the loop's end to make (lines), where it makes them."""
        plan, next_guard = self.analyze(items, nexts)
        # In a loop body every value a block defines is reset in its else, so that
        # (as when every op was run dead) no iteration keeps an earlier one's arrays
        # alive; in the root the run's end frees them.
        full = nexts is not None
        for src, k in reads:
            self.rt_read(src, k)
        stack: list = []     # open blocks: [literal, escapes, first line]
        captures: list = []  # Exits with known guards: captured after the body
        checked: set = set()  # (predicate, guard) checked to be a scalar (check_pred)
        for what, n, info in plan:
            if what == "skip":
                continue
            if what == "exit":
                captures.append((n, info))
                continue
            if what == "next":   # the loop's end reads its value (frame_loop)
                src, k = self.inputs(n)[0]
                self.next_expr[n.id] = self.kval(src, k)
                nexts.append((n, next(dst for edges in n.outs for dst, _, _ in edges)))
                continue
            if what == "rt":
                self.goto(stack, (), d)
                if n.kind == Kind.NEXT_ITERATION:
                    self.next_iteration(n, d, nexts)
                elif n.kind == Kind.EXIT:
                    self.exit_(n, d)
                else:
                    self.node(n, d, itv)
                    if self.early and nexts is None:
                        self.start_early_fetches(n, d)
                continue
            if what == "rtframe":
                self.goto(stack, (), d)
                self.child_block(n, d)
                continue
            if what == "frame":
                self.goto(stack, info, d)
                e = d + len(stack)
                g = n
                enters = [x for x in self.cf.plan.nodes if x.kind == Kind.ENTER and x.child is g]
                exprs = {x.id: self.kval(*self.inputs(x)[0]) for x in enters}
                saved = {x.id: (self.mayd.get((x.id, 0)), self.node_dead.get(x.id))
                         for x in _all_exits(g)}
                exits = self.frame_loop(g, enters, e, exprs, False)
                for x in exits:
                    self.mayd[(x.id, 0)], self.node_dead[x.id] = saved[x.id]
                    self.emit(e, f"v{x.id}_0 = x{x.id}")
                    self.defined(stack, e, x, [0], full)
                continue
            if what == "switch":
                ks = [k for k in (0, 1) if (n.id, k) in self.esc_val]
                check = not _scalar_pred(n)
                if not ks and n.id not in self.esc_flag and not check:
                    continue
                self.goto(stack, info, d)
                e = d + len(stack)
                (dsrc, dk), (psrc, pk) = self.inputs(n)
                data, pred = self.kval(dsrc, dk), self.kval(psrc, pk)
                if check and (pred, info) not in checked:
                    # before any block tests it (the nodes it guards come after it); once
                    # per predicate and guard (a loop's Switches share one)
                    checked.add((pred, info))
                    self.emit(e, f"_chkp({pred})", n, itv)
                    if not ks and n.id not in self.esc_flag:
                        continue
                for k in ks:
                    self.emit(e, f"v{n.id}_{k} = {data} if {pred} else DEAD" if k else
                              f"v{n.id}_{k} = DEAD if {pred} else {data}")
                self.defined(stack, e, n, [], full)
                for k in ks:
                    if stack:
                        self.esc_in_block(stack, f"v{n.id}_{k}", "DEAD")
                continue
            if what == "kernel" and (n.id, 0) in self.alias and \
                    (n.id, 0) not in self.esc_val and n.id not in self.esc_flag:
                continue            # an Identity nobody needs materialized
            self.goto(stack, info[0] if what == "merge" else info, d)
            e = d + len(stack)
            if what == "merge":
                self.known_merge(n, e, info)
            else:
                self.known_kernel(n, e, itv)
                if self.early and nexts is None:
                    self.start_early_fetches(n, e)
            self.defined(stack, e, n, range(n.n_out if what == "kernel" else 2), full)
        last = [f"if x{n.id} is DEAD: x{n.id} = {self.kval(*self.inputs(n)[0])}"
                for n, _ in captures]  # (nothing in the iteration reads an Exit's variable)
        if next_guard is not None and len(next_guard) == 1 and all(
                g == ((next_guard[0][0], next_guard[0][1], not next_guard[0][2]),)
                for _, g in captures):
            self.goto(stack, (), d)
            return next_guard, last     # live where the loop ends: captured there
        for (n, g), line in zip(captures, last):
            self.goto(stack, g, d)
            self.emit(d + len(stack), line)
        self.goto(stack, (), d)
        return next_guard, []

    def defined(self, stack: list, e: int, n: NodeInfo, ks: Any, full: bool) -> None:
        """Record the values node n defined inside the open blocks that run-time
        readers need (all of them where `full`), and its dead flag."""
        if n.id in self.esc_flag:
            self.emit(e, f"d{n.id} = False")
            if stack:
                self.esc_in_block(stack, f"d{n.id}", "True")
        for k in ks:
            key = (n.id, k)
            if key in self.esc_val:
                if key in self.alias:
                    self.emit(e, f"v{n.id}_{k} = {self.alias[key]}")
                if stack:
                    self.esc_in_block(stack, f"v{n.id}_{k}", "DEAD")
            elif full and stack and key not in self.alias:
                self.esc_in_block(stack, f"v{n.id}_{k}", "DEAD")

    @staticmethod
    def esc_in_block(stack: list, var: str, dead: str) -> None:
        stack[-1][1].append((var, dead))

    def goto(self, stack: list, g: tuple, d: int) -> None:
        """Close and open `if` blocks so that the code emitted next runs where g holds."""
        i = 0
        while i < len(stack) and i < len(g) and stack[i][0] == g[i]:
            i += 1
        while len(stack) > i:
            lit, esc, first = stack.pop()
            e = d + len(stack)
            if len(self.lines) == first:
                self.emit(e + 1, "pass")
            if esc:
                self.emit(e, "else:")
                by_value: dict[str, list] = {}
                for v, x in esc:
                    by_value.setdefault(x, []).append(v)
                self.emit(e + 1, "; ".join(" = ".join(vs) + f" = {x}"
                                           for x, vs in by_value.items()))
                if stack:
                    stack[-1][1].extend(esc)
        for lit in g[i:]:
            self.emit(d + len(stack), f"if {self.lit_expr([lit])}:")
            stack.append([lit, [], len(self.lines)])

    def known_kernel(self, n: NodeInfo, e: int, itv: str) -> None:
        if (n.id, 0) in self.alias:
            return              # an Identity: its readers read its input
        grp, fc, ins = self.fused_inputs(n)
        args = [self.kval(src, k) for src, k in ins]
        outs = [f"v{n.id}_{k}" for k in range(n.n_out)]
        if n.type == "_ToHost":
            self.env[f"f{n.id}"] = n.fn
            self.emit(e, f"{outs[0]}, _ev = f{n.id}({args[0]})", n, itv)
            self.emit(e, "if _ev is not None:")
            self.emit(e + 1, "while not _ev.done: yield _ev")
            self.emit(e + 1, f"if not {outs[0]}.ndim: {outs[0]} = {outs[0]}[()]")
            return
        call = self.call(n, grp, args, fc, itv)
        if n.n_out == 0:
            self.emit(e, call, n, itv)
        else:
            self.emit(e, f"{', '.join(outs)} = {call}", n, itv)

    def known_merge(self, n: NodeInfo, e: int, info: tuple) -> None:
        c, gs = info
        cs = set(c)
        out, idx = f"v{n.id}_0", f"v{n.id}_1"
        cands = []
        for j, (src, k) in enumerate(self.inputs(n)):
            if _contradicts(gs[j]):
                continue
            rest = [lit for lit in gs[j] if lit not in cs]
            cands.append((j, self.kval(src, k), rest))
            if not rest:
                break
        for m, (j, v, rest) in enumerate(cands):
            self.env[f"_I{j}"] = np.int32(j)
            assign = f"{out} = {v}; {idx} = _I{j}"
            if len(cands) == 1:
                self.emit(e, assign)
            elif m == len(cands) - 1:
                self.emit(e, "else:")
                self.emit(e + 1, assign)
            else:
                self.emit(e, f"{'if' if m == 0 else 'elif'} {self.lit_expr(rest)}:")
                self.emit(e + 1, assign)

    def call(self, n: NodeInfo, grp: Any, args: list, fc: Any = None, itv: str = "") -> str:
        if fc is not None:      # one call for n and what it absorbed, told the iteration
            fn = self.env[f"f{n.id}"] = fc[1](self.cf.plan.gpu_of[n.id], n)
            it = itv if n.frame.parent is not None else "None"     # the root has no counter
            if getattr(fn, "holds_terms", False):
                # it keeps terms for this run of the loop in a list of its own, which it
                # adds up when the loop ends (dcf/fusion/accumulate.py); None: it keeps none
                if itv not in self.held:
                    return f"f{n.id}({', '.join(args)}, {it}, None)"
                self.held[itv].append(n)
                return f"f{n.id}({', '.join(args)}, {it}, _held{n.id})"
            return f"f{n.id}({', '.join(args)}, {it})"
        if n.type == "Const" and not args:
            self.env[f"_C{n.id}"] = n.fn()  # hoisted: the value never changes
            return f"_C{n.id}"
        if n.type in ("StackPushV2", "StackPopV2") and grp is None and \
                all(_NAME.fullmatch(a) for a in args):
            return self.stack_op(n, args)
        if n.type in _INLINE and n.n_out == 1 and self.cf.plan.xp is np and \
                n.id not in self.cf.plan.gpu_of:  # GPU: call fn (it picks device/stream)
            return _INLINE[n.type].format(*args)
        if n.type in _INLINE and n.n_out == 1 and grp is None and \
                all(_NAME.fullmatch(a) for a in args):
            # On a GPU: inline for the values that stay on the host (loop counters and
            # predicates: numpy scalars), where the wrapper would run the same operator;
            # anything else (device arrays; host arrays it may upload) calls it.
            self.env[f"f{n.id}"] = self.kernel_fn(n)
            self.env["_HS"] = _HOST_SCALARS
            self.env["_NPA"] = np.ndarray
            if n.type in _ALIAS:
                return f"({args[0]} if type({args[0]}) is not _NPA else f{n.id}({args[0]}))"
            test = " and ".join(f"type({a}) in _HS" for a in args
                                if type(self.env.get(a)) not in _HOST_SCALARS)  # hoisted
            if not test:
                return _INLINE[n.type].format(*args)
            return f"({_INLINE[n.type].format(*args)} if {test} else f{n.id}({', '.join(args)}))"
        if grp is not None:
            from dcf.fusion.elementwise import FusedElementwise

            self.env[f"f{n.id}"] = FusedElementwise(self.cf.plan.gpu_of[n.id], grp[2],
                                                    len(grp[1]), grp[3])
        else:
            self.env[f"f{n.id}"] = self.kernel_fn(n)
        return f"f{n.id}({', '.join(args)})"

    def kernel_fn(self, n: NodeInfo) -> Any:
        """What the compiled code calls for kernel node n: its kernel, or one that may
        write its result over an input (dcf/fusion/in_place.py)."""
        j = self.in_place.get(n.id)
        if j is None:
            return n.fn
        from dcf.fusion.in_place import InPlaceElementwise

        return InPlaceElementwise(self.cf.plan.gpu_of[n.id], n, j)

    def stack_flags(self, e: NodeInfo, d: int) -> None:
        """For a loop constant that is the handle of stack pushes or pops in the loop:
        test once, before the loop, whether it is a stack whose pushes and pops stack_op
        may inline (a loop constant never changes)."""
        on = {dst.id in self.cf.plan.gpu_of for edges in e.outs for dst, slot, _ in edges
              if dst.type in ("StackPushV2", "StackPopV2") and slot == dst.in_base}
        for gpu in on:
            var = f"v{e.id}_0"
            flag = f"_sk{e.id}" + ("g" if gpu else "")
            self.emit(d, f"{flag} = {self.is_stack(var, gpu)}")
            self.stack_flag[var, gpu] = flag

    def is_stack(self, h: str, gpu: bool) -> str:
        """The test that `h` is a stack whose pushes and pops are a list's."""
        self.env["_SS"] = StackStore
        if not gpu:
            return f"type({h}) is _SS"
        # a GPU's stack, plain or swapping: its pushes and pops are a list's too (the
        # swapper acts on the loop's ticks, see frame_loop); an entry moved to the host
        # (a record) or a host array is popped by the kernel
        from dcf.actors.gpu_swap import GpuStackStore, _Rec
        self.env["_GSS"] = GpuStackStore
        self.env["_HELD"] = (np.ndarray, _Rec)
        return f"(type({h}) is _SS or type({h}) is _GSS)"

    def stack_op(self, n: NodeInfo, args: list) -> str:
        """A push or pop of a gradient stack, inline for a plain StackStore (a list's
        append or pop, where the bound kernel costs a call or two more); the kernel for
        anything else: a GPU stack that may swap, an empty stack's error, a host value
        popped on a GPU (uploaded)."""
        self.env[f"f{n.id}"] = n.fn
        h = args[0]
        gpu = n.id in self.cf.plan.gpu_of
        is_stack = self.stack_flag.get((h, gpu)) or self.is_stack(h, gpu)
        if n.type == "StackPushV2":
            v = args[1]
            return f"({v} if {is_stack} and not {h}.items.append({v}) else f{n.id}({h}, {v}))"
        test = f"{is_stack} and {h}.items"
        if gpu:
            test += f" and type({h}.items[-1]) not in _HELD"
        return f"({h}.items.pop() if {test} else f{n.id}({h}))"

    def next_iteration(self, n: NodeInfo, b: int, nexts: list) -> None:
        src, k = self.inputs(n)[0]
        ctl = [self.node_dead.get(c.id) for c in self.controls(n)]
        ctl = [c for c in ctl if c]
        if ctl:  # a dead control input (the exit iteration's pivot) stops it too
            self.emit(b, f"n{n.id} = DEAD if ({' or '.join(ctl)}) else "
                         f"{self.val(src, k)}")
        else:
            self.emit(b, f"n{n.id} = {self.val(src, k)}")
        merge = next(dst for edges in n.outs for dst, _, _ in edges)
        nexts.append((n, merge))

    def exit_(self, n: NodeInfo, b: int) -> None:
        src, k = self.inputs(n)[0]
        v = self.val(src, k)
        if self.mayd.get((src.id, k), False):
            self.emit(b, f"if x{n.id} is DEAD and {v} is not DEAD: x{n.id} = {v}")
        else:
            self.emit(b, f"if x{n.id} is DEAD: x{n.id} = {v}")

    def node(self, n: NodeInfo, d: int, itv: str) -> None:
        if n.id in self.fuse_skip:
            return       # computed inside the fused kernel of its consumer
        grp, fc, ins = self.fused_inputs(n)
        args, dead_terms = [], []
        for i in ins:
            src, k = i
            v = self.val(src, k)
            args.append(v)
            if self.mayd.get((src.id, k), False):
                dead_terms.append(f"{v} is DEAD")
        for c in self.controls(n):
            de = self.node_dead.get(c.id)
            if de:
                dead_terms.append(de)
        outs = [f"v{n.id}_{k}" for k in range(n.n_out)]
        maybe_dead = bool(dead_terms)
        if n.kind == Kind.SWITCH:
            data, pred = args
            if not _scalar_pred(n):
                self.emit(d, f"_chkp({pred})", n, itv)     # (DEAD passes)
            if maybe_dead:
                self.emit(d, f"if {' or '.join(dead_terms)}:")
                self.emit(d + 1, f"{outs[0]} = {outs[1]} = DEAD; d{n.id} = True")
                self.emit(d, f"elif {pred}:")
            else:
                self.emit(d, f"if {pred}:")
            self.emit(d + 1, f"{outs[0]} = DEAD; {outs[1]} = {data}" +
                      (f"; d{n.id} = False" if maybe_dead else ""))
            self.emit(d, "else:")
            self.emit(d + 1, f"{outs[0]} = {data}; {outs[1]} = DEAD" +
                      (f"; d{n.id} = False" if maybe_dead else ""))
            self.mayd[(n.id, 0)] = self.mayd[(n.id, 1)] = True
            self.node_dead[n.id] = f"d{n.id}" if maybe_dead else None
            return
        if n.kind == Kind.MERGE:
            chain = "DEAD"
            idx = "_I0"
            all_dead = True
            for j in reversed(range(len(args))):
                a = args[j]
                src, k = ins[j]
                if self.mayd.get((src.id, k), False):
                    chain = f"({a} if {a} is not DEAD else {chain})"
                    idx = f"(_I{j} if {a} is not DEAD else {idx})"
                else:
                    chain, idx, all_dead = a, f"_I{j}", False
            for j in range(len(args)):
                self.env[f"_I{j}"] = np.int32(j)
            self.emit(d, f"{outs[0]} = {chain}; {outs[1]} = {idx}")
            self.mayd[(n.id, 0)] = all_dead
            self.mayd[(n.id, 1)] = False
            self.node_dead[n.id] = f"({outs[0]} is DEAD)" if all_dead else None
            return
        if n.kind == Kind.TRIGGER:
            self.node_dead[n.id] = None  # orders only; never dead
            return
        if n.kind != Kind.KERNEL:
            raise _NotCompilable(f"{n.type} in a compiled frame")
        if n.type == "_ToHost":   # a GPU value the host must see: yield until it is here
            self.env[f"f{n.id}"] = n.fn
            e = d
            if maybe_dead:
                self.emit(d, f"if {' or '.join(dead_terms)}:")
                self.emit(d + 1, f"{outs[0]} = DEAD; d{n.id} = True")
                self.emit(d, "else:")
                self.emit(d + 1, f"d{n.id} = False")
                e = d + 1
            self.emit(e, f"{outs[0]}, _ev = f{n.id}({args[0]})", n, itv)
            self.emit(e, "if _ev is not None:")
            self.emit(e + 1, "while not _ev.done: yield _ev")
            self.emit(e + 1, f"if not {outs[0]}.ndim: {outs[0]} = {outs[0]}[()]")
            self.mayd[(n.id, 0)] = maybe_dead
            self.node_dead[n.id] = f"d{n.id}" if maybe_dead else None
            return
        call = self.call(n, grp, args, fc, itv)
        if n.n_out == 0:
            assign = call
        elif n.n_out == 1:
            assign = f"{outs[0]} = {call}"
        else:
            assign = f"{', '.join(outs)} = {call}"
        if maybe_dead:
            self.emit(d, f"if {' or '.join(dead_terms)}:")
            self.emit(d + 1, "; ".join([f"{o} = DEAD" for o in outs] + [f"d{n.id} = True"]))
            self.emit(d, "else:")
            self.emit(d + 1, assign, n, itv)
            self.emit(d + 1, f"d{n.id} = False")
        else:
            self.emit(d, assign, n, itv)
        for k in range(n.n_out):
            self.mayd[(n.id, k)] = maybe_dead
        self.node_dead[n.id] = f"d{n.id}" if maybe_dead else None


def _hoisted(out: list, items: dict, hoist: Any) -> list:
    """`out` (a topological order of `items`) with each node whose id is in `hoist` moved
    right after the last item it needs (still a topological order: nothing it needs
    moves, and what needs it stays after it)."""
    if not hoist:
        return out
    for k in [k for k in out if isinstance(k, NodeInfo) and k.id in hoist]:
        out.remove(k)
        deps = items[k]
        at = max((i for i, x in enumerate(out) if x in deps), default=-1) + 1
        out.insert(at, k)
    return out


def _device_grouped(items: dict, gpu_of: dict, name: str, late: Any = (),
                    sent_from: Any = None) -> list:
    """A topological order of `items` (item -> the items it needs, in the frame's node
    order) that stays on one GPU while it has ready work there: each switch of the
    current GPU costs the host a device and stream change (a frame over several GPUs
    would otherwise alternate between them as ops become ready). Items off the GPUs
    (host ops, nested frames) go first whenever they are ready; among equals, the
    frame's node order decides.

    The ids in `late` (held gradient accumulations: only the next iteration reads them)
    wait until their GPU has nothing else ready and the ready transfers of its values to
    other GPUs (`sent_from`: transfer id -> the GPU it reads) are made: a chunk of held
    terms added on one GPU of a pipeline then runs after the value the next GPU waits
    for, not before it, and the two GPUs add their chunks at the same time instead of
    one after the other (bench/NOTES.md, "GPU, session 24")."""
    sent_from = sent_from or {}
    rank = {k: i for i, k in enumerate(items)}
    need = {k: len(v) for k, v in items.items()}
    users: dict = {k: [] for k in items}
    for k, deps in items.items():
        for d in deps:
            users[d].append(k)
    ready = sorted((k for k, c in need.items() if not c), key=rank.__getitem__)
    out: list = []
    cur = None
    while ready:
        pick = xfer = wait = None
        for i, k in enumerate(ready):     # host work first, then the current GPU's
            g = gpu_of.get(k.id) if isinstance(k, NodeInfo) else None
            if g is None:
                pick = i
                break
            if g is cur:
                if k.id in late:
                    if wait is None:
                        wait = i
                elif pick is None:
                    pick = i
            elif xfer is None and cur is not None and sent_from.get(k.id) is cur:
                xfer = i
        if pick is None and wait is not None:
            pick = wait if xfer is None else xfer
        stay = pick is not None and pick == xfer    # (a transfer out: then cur's late work)
        if pick is None:        # another GPU's turn: its first ready item that is not late
            pick = next((i for i, k in enumerate(ready)
                         if not (isinstance(k, NodeInfo) and k.id in late)), 0)
        k = ready.pop(pick)
        if isinstance(k, NodeInfo) and k.id in gpu_of and not stay:
            cur = gpu_of[k.id]
        out.append(k)
        for u in users[k]:
            need[u] -= 1
            if not need[u]:
                ready.append(u)
                ready.sort(key=rank.__getitem__)
    if len(out) != len(items):
        raise _NotCompilable(f"cycle in frame {name}")
    return out


def _ticker(gpus: list, pushing: bool) -> Any:
    """A function ticking the swapper of each GPU that has something to do (in a loop
    that pushes saved values, or one that pops them)."""
    def tick(end: bool = False) -> None:
        for g in gpus:
            sw = g.swapper
            if sw.out or (sw.stacks if pushing else sw.host):
                g.make_current()
                sw.tick(pushing, end)
    return tick


def _marker(gpus: list) -> Any:
    """A function recording, on each GPU's compute stream, an event for the work
    enqueued so far."""
    def mark() -> list:
        evs = []
        for g in gpus:
            g.make_current()      # an event is recorded with its stream's device current
            evs.append(g.record(g.compute))
        return evs
    return mark


def _only_predicate(n: NodeInfo) -> bool:
    """Whether n's one output is read only as the predicate of Switches: a Switch uses
    only its predicate's truth, which a copy to another GPU keeps, so such a copy may
    read as its source (and the Switches share the source's guard)."""
    return bool(n.outs and n.outs[0]) and not n.fetch and not n.ctrl_outs and all(
        dst.kind == Kind.SWITCH and slot == dst.in_base + 1 for dst, slot, _ in n.outs[0])


def _contradicts(g: tuple) -> bool:
    """A guard that asks one predicate to be both true and false (never live)."""
    seen: dict = {}
    for _, name, pol in g:
        if seen.setdefault(name, pol) != pol:
            return True
    return False


def _scalar_pred(n: NodeInfo) -> bool:
    """Whether Switch n's predicate is statically a scalar (its value then is one: fed
    values are checked against their placeholder's shape), so that the generated code
    need not check it at run time (check_pred)."""
    op = n.op
    inputs = getattr(op, "inputs", None)   # (a worker's RemoteOp knows no inputs: check)
    if inputs is None or getattr(op, "type", None) != "Switch" or len(inputs) != 2:
        return False
    t = inputs[1]
    while t.op.type == "LoopCond" and t.op.inputs:
        t = t.op.inputs[0]      # (LoopCond's static shape is () whatever its input's)
    shape = getattr(t, "shape", None)
    return shape is not None and len(shape) == 0


def _all_exits(g: FrameInfo) -> list[NodeInfo]:
    return list(g.exits)


class _NotCompilable(Exception):
    pass


class _TooDeep(_NotCompilable):
    """Generated code that Python cannot compile: loops nested past its limit on nested
    blocks (20), or an expression nested too deep for its compiler."""


def _compiled(src: str, fname: str) -> Any:
    """The code object of generated source (_TooDeep where Python cannot compile it)."""
    try:
        return compile(src, fname, "exec")
    except SyntaxError as e:
        if "nested blocks" not in str(e):
            raise   # (a fault of the generator's: not to be hidden)
        raise _TooDeep(f"{fname}: {e}") from None
    except (RecursionError, MemoryError) as e:
        raise _TooDeep(f"{fname}: {e!r}") from None


# generated code's file name -> {line of a loop's yield: (frame name, its counter)}
_YIELD_SITES: dict[str, dict[int, tuple[str, str, tuple]]] = {}


def _register_yields(gen_fn: Any, fname: str, sites: dict) -> None:
    if sites:
        _YIELD_SITES[fname] = sites
        weakref.finalize(gen_fn, _YIELD_SITES.pop, fname, None)


def where_suspended(gen: Any) -> str | None:
    """Where a compiled run that yielded stands, for an error that stops it there (a
    deadline): "while_loop frame 'F' before iteration N" (the innermost loop; its
    iterations yield at their end, after the counter's increment), then ", inside frame
    'G' iteration M" for each loop around it, or None."""
    g, hit = gen, None
    while g is not None:
        frame = getattr(g, "gi_frame", None)
        if frame is not None:
            sites = _YIELD_SITES.get(frame.f_code.co_filename)
            site = sites.get(frame.f_lineno) if sites else None
            if site is not None:
                local = frame.f_locals
                hit = (site[0], local.get(site[1]),
                       [(name, local.get(v)) for name, v in site[2]])
        g = getattr(g, "gi_yieldfrom", None)
    if hit is None:
        return None
    return (f"while_loop frame '{hit[0]}' before iteration {hit[1]}"
            + "".join(f", inside frame '{name}' iteration {it}" for name, it in hit[2]))


def _with_errors(gen_fn: Any, fname: str, line_node: dict, outer_of: dict) -> Any:
    """Wrap the generated generator so kernel errors name the op, frame and iteration
    (and the iterations of the loops around it that this code runs)."""

    def run(enter_values: dict) -> Any:
        try:
            return (yield from gen_fn(enter_values))
        except Exception as e:
            tb = sys.exc_info()[2]
            node, itv, it, outer = None, "", None, ()
            while tb is not None:
                if tb.tb_frame.f_code.co_filename == fname:
                    hit = line_node.get(tb.tb_lineno)
                    if hit is not None:
                        node, itv = hit
                        local = tb.tb_frame.f_locals
                        it = local.get(itv)
                        outer = tuple((name, local.get(v)) for name, v in outer_of.get(itv, ()))
                tb = tb.tb_next
            if node is None:
                raise
            raise node_error(node, it, e, outer) from e

    return run
