"""gradients(ys, xs): reverse-mode differentiation of a graph, through control flow.

The reverse walk works on *units* at one level of nesting: an op of that level, a
whole cond (its Merges are the outputs, the tensors it captured the inputs), or a
whole while_loop (Exits out, Enters in). A unit's gradient is built by its own rule:
ops by their registered gradient function, conds by a gradient cond on the forward
predicate (control_flow_grad.py), loops by a backward loop that runs the forward
trip count in reverse (loop_state.py). Building gradients only adds ops.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from dcf import dtypes, nest
from dcf.control_flow import CondInfo, WhileContext
from dcf.graph import (
    Graph, Operation, Tensor, get_default_graph, shape_str, shapes_compatible,
)
from dcf.ops.registry import GRADIENTS, broadcast_shape, convert_in, convert_to_tensor

__all__ = ["gradients", "GradState", "vjp", "differentiable", "sum_grads"]

_call_ids = itertools.count()


def differentiable(t: Tensor) -> bool:
    dt = t.dtype
    return dt.is_floating or dt is dtypes.variant


class GradState:
    """Bookkeeping of one gradients() call."""

    def __init__(self, graph: Graph, source: str, targets: dict[Tensor, None],
                 stops: set[Tensor] | None = None) -> None:
        self.graph = graph
        self.source = source          # names this call's gradient TensorArrays
        # every x asked for (also those inside loops), in the order asked: a dict as an
        # ordered set -- a loop's gradient makes its targets' accumulators in this order,
        # and a set of tensors (hashed by identity) would order them differently in every
        # process, giving the same graph different names and node orders
        self.targets = targets
        # stop_gradients: they pass no gradient on, at any level (also inside a cond
        # branch or a loop body)
        self.stops = stops or set()
        # second order: forward tensor -> stacks holding gradients of its saved copies
        self.stack_grads: dict[Tensor, list[Tensor]] = {}
        self.stack_grad_loops: dict[Any, list[Operation]] = {}
        # ... and the value pushed on each of those stacks (its handle -> the gradient)
        self.stack_grad_values: dict[Tensor, Tensor] = {}


_ACTIVE: list[GradState] = []


def active_state() -> GradState:
    if not _ACTIVE:
        raise RuntimeError("no gradients() call is being built")
    return _ACTIVE[-1]


def gradients(ys: Any, xs: Any, grad_ys: Any = None, name: str | None = None,
              stop_gradients: Any = None) -> list[Tensor | None]:
    """d(sum(ys))/d(x) for each x in xs, as graph tensors.

    ys, xs: tensors (or Variables among xs) or lists of them. grad_ys: the incoming
    gradient of each y (default: ones). Returns one tensor per x: None only where no
    path leads from x to any y; an x used only in a branch that was not taken gets
    zeros. Each x gets its total gradient, also where another x is computed from it.
    Works through cond, case, while_loop, TensorArray, map_fn/foldl/foldr/scan.
    Raises ValueError for an x made inside a while_loop body (a value per iteration).
    """
    g = get_default_graph()
    ys_l = [convert_to_tensor(y) for y in nest.flatten(ys)]
    xs_in = nest.flatten(xs) if isinstance(xs, (list, tuple)) else [xs]
    if ys_l:
        g = ys_l[0].graph
    _check_one_graph(g, ys_l, xs_in, [] if grad_ys is None else nest.flatten(grad_ys))
    if grad_ys is None:
        gy_l: list = [None] * len(ys_l)
    else:
        from dcf.ops.array_ops import _is_tensorlike

        # a Python or numpy value takes the dtype of its y (as an operand takes the dtype
        # of the tensor it meets), and becomes a Const of ys' graph
        gy_l = [None if v is None else convert_in(v, g, None if _is_tensorlike(v) else y.dtype)
                for y, v in zip(ys_l, _grad_y_values(ys, len(ys_l), grad_ys))]
    stops = set() if stop_gradients is None else \
        {convert_to_tensor(s) for s in nest.flatten(stop_gradients)}
    with g.as_default(), g.name_scope(name or "gradients"):
        # (before the xs are checked: an x made in this body would be refused as made
        # in a loop "and ys are outside the loop", which they are not)
        if g._ctx is not None:
            raise ValueError(
                f"gradients() called inside {g._ctx.describe()}: call it outside "
                "cond/while_loop bodies (map_fn, scan, foldl and foldr bodies are "
                "while_loop bodies); to update only on one branch, compute the "
                "gradients outside (opt.compute_gradients) and apply them inside "
                "(opt.apply_gradients)")
        x_groups = [_resolve_x(x) for x in xs_in]
        for x in xs_in:
            if isinstance(x, Tensor):
                _check_not_in_loop(x)
        targets = dict.fromkeys(t for grp in x_groups for t in grp)
        state = GradState(g, f"{g._scope}grad{next(_call_ids)}", targets, stops)
        _ACTIVE.append(state)
        try:
            gy_full = []
            for i, (y, gy) in enumerate(zip(ys_l, gy_l)):
                if gy is None:
                    from dcf.ops.array_ops import ones_like
                    with colocated(y.op):
                        gy = ones_like(y) if differentiable(y) else None
                else:
                    gy = _checked_grad_y(i, y, gy)
                gy_full.append(gy)
            flat_x = [t for grp in x_groups for t in grp]
            # every x is also walked through: an x computed from another x passes its
            # gradient on, and each gets its total derivative (TF's rule)
            grads = vjp(state, ys_l, flat_x, gy_full, level=None, through=set(flat_x))
        finally:
            _ACTIVE.pop()
        out: list[Tensor | None] = []
        k = 0
        for x, grp in zip(xs_in, x_groups):
            parts = [grads[k + i] for i in range(len(grp)) if grads[k + i] is not None]
            k += len(grp)
            if not parts:
                out.append(None)
                continue
            # a variable's gradient is summed where the variable lives (its reads run there)
            handle = getattr(x, "handle", None)
            with colocated(handle.op if isinstance(handle, Tensor) else grp[0].op):
                out.append(sum_grads(parts))
        return out


def _check_one_graph(g: Graph, ys: list[Tensor], xs: list, grad_ys: list) -> None:
    """ys, xs and grad_ys must come from one graph (TF1 raises too): no path leads to or
    from a tensor of another graph, so its gradient would be None, as if x did not
    matter to ys, where the call is wrong."""
    where = f"ys[0] ('{ys[0].name}')" if ys else "the default graph"
    for what, items in (("ys", ys), ("xs", xs), ("grad_ys", grad_ys)):
        for i, t in enumerate(items):
            tg = getattr(t, "graph", None)
            if isinstance(tg, Graph) and tg is not g:
                raise ValueError(
                    f"gradients: {what}[{i}] ('{t.name}') is from another graph than "
                    f"{where}; ys, xs and grad_ys must all come from one graph")


def _grad_y_values(ys: Any, n: int, grad_ys: Any) -> list:
    """grad_ys as one value per y: flattened as ys is, or (where that gives another count)
    only as deep as ys is nested, so that a list of numbers is one y's value."""
    flat = nest.flatten(grad_ys)
    if len(flat) != n:
        flat = _flatten_up_to(ys, grad_ys)
    if len(flat) != n:
        raise ValueError(f"gradients: {n} ys but {len(flat)} grad_ys")
    return flat


def _flatten_up_to(structure: Any, values: Any) -> list:
    if not nest.is_nested(structure):
        return [values]
    if not nest.is_nested(values) or len(values) != len(structure):
        return nest.flatten(values)   # (the caller reports the count)
    return [v for s, c in zip(nest._children(structure), nest._children(values))
            for v in _flatten_up_to(s, c)]


def _checked_grad_y(i: int, y: Tensor, gy: Tensor) -> Tensor:
    """grad_ys[i], which must have y's dtype and y's shape or one that broadcasts to it (a
    scalar weighs every entry alike, as in TF1), broadcast to y's shape."""
    what = f"gradients: grad_ys[{i}] ('{gy.name}', {gy.type})"
    if differentiable(y) and gy.dtype is not y.dtype:
        raise TypeError(f"{what} does not have the dtype of ys[{i}] ('{y.name}', {y.type}); "
                        "cast it with dcf.cast")
    try:
        out = broadcast_shape(gy.shape, y.shape)
    except ValueError:
        out = ()   # cannot broadcast: reported below
    if not shapes_compatible(out, y.shape) or (
            out is not None and gy.shape is not None and len(gy.shape) > len(y.shape)):
        raise ValueError(f"{what} does not have the shape of ys[{i}] ('{y.name}', {y.type})")
    if gy.shape == y.shape or not differentiable(y):
        return gy
    from dcf.ops.array_ops import _shape_of, broadcast_to

    return broadcast_to(gy, _shape_of(y))


def _check_not_in_loop(x: Tensor) -> None:
    """An x made inside a while_loop body has one value per iteration: the gradient of
    ys outside the loop w.r.t. "it" is not one tensor (TF1 raises too). A Variable read
    inside a loop is fine: the Variable stands for all its reads (their sum)."""
    c = _value_ctx(x)  # (a loop's Exit lives after the loop)
    w = c.while_ctx if c is not None else None
    if w is not None:
        raise ValueError(
            f"gradients: cannot differentiate with respect to '{x.name}' ({x.op.type} "
            f"'{x.op.name}'): it is created inside while_loop '{w.frame_name}', where it has "
            "one value per iteration, and ys are outside the loop. Differentiate with "
            "respect to a tensor outside the loop (its inputs, or a value it reads)")


def _resolve_x(x: Any) -> list[Tensor]:
    """A Variable stands for every read of it (also reads inside loops)."""
    if isinstance(x, Tensor):
        return [x]
    handle = getattr(x, "handle", None)
    if handle is None:
        return [convert_to_tensor(x)]
    g = handle.graph
    handles = {handle}
    changed = True
    while changed:  # follow the handle through Enter/Identity/Switch into loops and conds
        changed = False
        for op in g._ops:
            if op.type in ("Enter", "Identity", "Switch") and op.inputs and \
                    op.inputs[0] in handles:
                for o in op.outputs:
                    if o not in handles:
                        handles.add(o)
                        changed = True
    return [op.outputs[0] for op in g._ops if op.type == "ReadVariableOp"
            and op.inputs[0] in handles]


@contextlib.contextmanager
def on_device(graph: Graph, device: str) -> Iterator[None]:
    """A device scope naming exactly `device` ("" : unplaced), whatever scopes enclose
    it: a forward op's "/cpu:2" under gradients() in "/job:worker/task:1" stays in this
    process, and an unplaced forward op's gradients go where it goes (TF's colocation)."""
    with graph.device(None), (graph.device(device) if device else contextlib.nullcontext()):
        yield


def colocated(op: Operation) -> Any:
    """A device scope naming `op`'s device when the op names one: gradient ops (and the
    sums of gradients reaching an op's outputs) are built where the forward op runs,
    as TF's colocate_gradients_with_ops, whatever scope gradients() was called in."""
    return on_device(op.graph, op.device)


def sum_grads(parts: list[Tensor]) -> Tensor:
    if len(parts) == 1:
        return parts[0]
    if parts[0].dtype is dtypes.variant:
        # flows order TensorArray work: one that follows all of them. Each is a data
        # input (not a control dependency), so differentiating again reaches every part
        # (a second-order gradient through several reads of one array)
        from dcf.ops.registry import apply

        return apply("TensorArrayFlowJoin", list(parts), name="flow_join")
    from dcf.ops.math_ops import add_n

    return add_n(parts)


# --------------------------------------------------------------------- units
class _Unit:
    __slots__ = ("kind", "obj", "outputs", "inputs")

    def __init__(self, kind: str, obj: Any, outputs: list[Tensor], inputs: list[Tensor]) -> None:
        self.kind = kind
        self.obj = obj
        self.outputs = outputs
        self.inputs = inputs


def _child_below(ctx: Any, level: Any) -> Any:
    """The context directly below `level` on `ctx`'s chain (None if ctx is level)."""
    prev = None
    c = ctx
    while c is not None and c is not level:
        prev, c = c, c.outer
    if c is not level:
        raise ValueError("tensor is not inside the level being differentiated")
    return prev


class _Units:
    """Unit lookup at one level, memoised."""

    def __init__(self, level: Any, graph: Graph) -> None:
        self.level = level
        self.graph = graph
        self.by_key: dict[Any, _Unit] = {}
        self._popped: dict[int, list[Tensor]] | None = None

    def upstream(self, u: _Unit) -> list[Tensor]:
        """What u is computed from, for the walk's order: its inputs, and the saved
        values that stack pops inside it read (made in another construct here). Such a
        pop reads no tensor, but the gradient reaching it is pushed by u's gradient loop
        and popped by that of the construct holding the value, which must be built
        after it; and a pop can be the only way from ys to that construct (a gradient
        loop of a gradient loop popping what the first one's own gradient pushed: third
        order)."""
        if self._popped is None:
            self._popped = {}
            for pop, source in self.graph._pop_source.items():
                pu, su = self.of(pop.outputs[0]), self.of(source)
                if pu is not None and su is not None and pu is not su and pu.kind != "op":
                    self._popped.setdefault(id(pu), []).append(source)
        return u.inputs + self._popped.get(id(u), [])

    def of(self, t: Tensor) -> _Unit | None:
        op = t.op
        if op.type == "Exit" and op.frame_ctx is not None:
            start = op.frame_ctx
        elif op in self.graph._cond_of_merge and \
                self.graph._cond_of_merge[op].outer is self.level:
            return self._cond(self.graph._cond_of_merge[op])
        elif op in self.graph._cond_of_switch and \
                self.graph._cond_of_switch[op].outer is self.level:
            return self._cond(self.graph._cond_of_switch[op])  # a branch's view of an input
        else:
            start = op.ctx
        try:
            child = _child_below(start, self.level)
        except ValueError:
            return None  # lives outside this level: a leaf here
        if child is None:
            return self._op(op)
        if isinstance(child, WhileContext):
            return self._while(child)
        return self._cond(child.info)

    def _op(self, op: Operation) -> _Unit:
        u = self.by_key.get(op)
        if u is None:
            u = self.by_key[op] = _Unit("op", op, list(op.outputs), list(op.inputs))
        return u

    def _while(self, w: WhileContext) -> _Unit:
        u = self.by_key.get(w)
        if u is None:
            ins = [e.inputs[0] for e in w.enters] + [e.inputs[0] for e in w.const_enters]
            u = self.by_key[w] = _Unit("while", w, [x.outputs[0] for x in w.exits], ins)
        return u

    def _cond(self, info: CondInfo) -> _Unit:
        u = self.by_key.get(info)
        if u is None:
            ins = [sw_out.op.inputs[0] for b in (1, 0) for sw_out in captured_switches(info, b)]
            u = self.by_key[info] = _Unit("cond", info, [m.outputs[0] for m in info.merges], ins)
        return u


def captured_switches(info: CondInfo, branch: int) -> list[Tensor]:
    """The Switch outputs through which `branch` of cond `info` reads outer values: its
    inputs as a unit. A gradient cond in a backward loop also captures a saved forward
    value as a stack pop made inside the branch (whose handle enters through a Switch of
    its own); such a pop is the branch's own op, not an input."""
    sw_of = info.pred.graph._cond_of_switch
    return [sw_out for sw_out in info.branches[branch]._captured.values()
            if sw_out.op.type == "Switch" and sw_of.get(sw_out.op, info) is info]


def _value_ctx(t: Tensor) -> Any:
    """The context where t is read as a value: a cond's Switch output in the branch it
    feeds (the Switch op itself sits outside the cond), anything else where its op was
    made (an Exit's value after its loop)."""
    op = t.op
    if op.type == "Switch":
        info = t.graph._cond_of_switch.get(op)
        if info is not None and t.index in info.branches:
            return info.branches[t.index]
    return op.ctx


def _inside(t: Tensor, ctx: Any) -> bool:
    """Whether t's value lives in ctx or in a context nested in it (an Exit's value
    counts as its loop's; a cond's Switch output as the branch's it feeds)."""
    return _nested_in(t.op.frame_ctx if t.op.type == "Exit" else _value_ctx(t), ctx)


def target_inside(x: Tensor, ctx: Any) -> bool:
    """Whether requested x is inside ctx, so that ctx's gradient rule collects its
    gradient: as _inside, but a loop's Exit is not its loop's (its value lives after the
    loop, where the walk reaches it as any other tensor)."""
    return _nested_in(_value_ctx(x), ctx)


def _nested_in(c: Any, ctx: Any) -> bool:
    """Whether context c is ctx or one nested in it."""
    while c is not None:
        if c is ctx:
            return True
        c = c.outer
    return False


def vjp(state: GradState, ys: list[Tensor], xs: list[Tensor], grad_ys: list,
        level: Any, through: set | None = None) -> list[Tensor | None]:
    """Gradients of ys (weighted by grad_ys) w.r.t. xs, all at nesting `level`.

    Targets of the whole gradients() call that live inside a nested loop/cond are
    collected by that construct's rule and returned with the xs they stand for.
    The walk stops at each x (a construct's rule passes the boundary of its body: a
    branch's Switch outputs, a loop body's inputs), except at those in `through`: a
    requested x whose own inputs may lead to other xs; its gradient is its total one.
    """
    through = through or set()
    units = _Units(level, state.graph)
    xset = set(xs)
    # where the walk ends: an x not walked through, and a stop-gradient (which gets its
    # own gradient, as in TF1, but passes none on to what it is computed from)
    ends = (xset - through) | state.stops
    # Backward reachability from ys over units, stopping at the ends.
    order: list[_Unit] = []
    seen: set[int] = set()
    reaches: dict[int, bool] = {}

    def entered(u: _Unit) -> list:
        """[unit, whether it reaches, its inputs left to walk]: a unit the walk enters."""
        reaches[id(u)] = False  # cycles cannot happen at one level
        r = u.kind == "op" and u.obj in state.graph._pop_source
        if u.kind != "op" and _has_inner_target(u, state):
            r = True
        return [u, r, iter(units.upstream(u))]

    def visit(root: _Unit) -> bool:
        # (with a stack of its own, not Python's: a chain of thousands of ops is walked
        # as any other graph)
        if id(root) in reaches:
            return reaches[id(root)]
        path = [entered(root)]
        while path:
            top = path[-1]
            for t in top[2]:
                if t in xset:
                    top[1] = True
                pu = units.of(t)
                if pu is None or t in ends:
                    continue
                if id(pu) not in reaches:
                    path.append(entered(pu))
                    break
                if reaches[id(pu)]:
                    top[1] = True
            else:
                path.pop()
                u, r, _ = top
                reaches[id(u)] = r
                if r and id(u) not in seen:
                    seen.add(id(u))
                    order.append(u)
                if r and path:
                    path[-1][1] = True
        return reaches[id(root)]

    grads: dict[Tensor, list[Tensor]] = {}
    ys, grad_ys = list(ys), list(grad_ys)
    for t, handles in state.stack_grads.items():
        if _value_ctx(t) is level and level is not None:
            from dcf.autodiff.loop_state import pop_stack_grads

            ys.append(t)
            grad_ys.append(pop_stack_grads(t, handles, state.stack_grad_values))
    for y, gy in zip(ys, grad_ys):
        if gy is None or not differentiable(y):
            continue
        grads.setdefault(y, []).append(gy)
        if y in ends:
            continue
        u = units.of(y)
        if u is not None:
            visit(u)
    for t in state.stack_grads:
        # second order: a construct here holding a saved value whose gradients wait on
        # stacks is differentiated even where no gradient reaches its outputs (a loop
        # in a cond branch whose result the first gradient did not read, say)
        if _value_ctx(t) is not level and (level is None or _inside(t, level)):
            u = units.of(t)
            if u is not None and u.kind != "op":
                visit(u)
    # Pending: how many between-units consume each unit's outputs.
    between = {id(u) for u in order}
    pending: dict[int, int] = {id(u): 0 for u in order}
    producer: dict[Tensor, _Unit] = {}
    for u in order:
        for t in u.outputs:
            producer[t] = u
    for u in order:
        for t in units.upstream(u):
            if t in ends:
                continue
            pu = units.of(t)
            if pu is not None and id(pu) in between:
                pending[id(pu)] += 1
    ready = [u for u in order if pending[id(u)] == 0]
    done: set[int] = set()
    inner: dict[Tensor, list[Tensor]] = {}
    handed_in: set[Tensor] = set()  # gradients passed into a cond as internal ones
    while ready:
        u = ready.pop()
        done.add(id(u))
        out_grads = []
        for t in u.outputs:
            parts = grads.get(t)
            if parts and len(parts) > 1:
                with colocated(t.op):
                    out_grads.append(sum_grads(parts))
                if t in xset:
                    grads[t] = [out_grads[-1]]  # an x walked through: its total, summed once
            else:
                out_grads.append(sum_grads(parts) if parts else None)
        internal = {}
        if u.kind == "cond":
            # second order: a gradient cond used forward-branch values; their gradients
            # flow into this cond's branches as extra outputs
            outs = set(u.outputs)
            for t, parts in grads.items():
                if t not in outs and parts and units.of(t) is u:
                    with colocated(t.op):
                        internal[t] = sum_grads(parts)
            handed_in.update(internal)
        need = None
        if u.kind == "while":
            # which of the loop's inputs a gradient is wanted for: an x, or one computed
            # from an x; the loop's gradient accumulates no others (a loop constant such
            # as an input TensorArray of data would get a gradient TensorArray written
            # every iteration that nothing reads)
            need = []
            for t in u.inputs:
                pu = units.of(t) if t not in ends else None
                need.append(t in xset or (pu is not None and id(pu) in between))
        in_grads, extra = _unit_grad(state, u, out_grads, internal, need)
        for t, gi in zip(u.inputs, in_grads):
            if gi is not None and differentiable(t):
                grads.setdefault(t, []).append(gi)
        for t, gi in extra.items():
            if gi is not None:
                inner.setdefault(t, []).append(gi)
        for t in units.upstream(u):
            if t in ends:
                continue
            pu = units.of(t)
            if pu is not None and id(pu) in between and id(pu) not in done:
                pending[id(pu)] -= 1
                if pending[id(pu)] == 0:
                    ready.append(pu)
    result = []
    for x in xs:
        # an x that a cond took in as an internal gradient comes back out of it in
        # `inner`, that gradient included: counting both counted it twice
        outer_parts = () if x in handed_in and x in inner else grads.get(x, ())
        parts = list(outer_parts) + list(inner.get(x, ()))
        # gradients()' own xs are summed where each x is, not on the scope it is called in
        with colocated(x.op) if level is None else contextlib.nullcontext():
            result.append(sum_grads(parts) if parts else None)
    return result


def _has_inner_target(u: _Unit, state: GradState) -> bool:
    """Whether a target of the call, or a saved value with second-order gradients on
    stacks (state.stack_grads), lives inside construct u: its gradient rule must run
    even where no gradient reaches u's outputs."""
    ctxs = _contexts(u)
    return any(target_inside(x, c) for x in state.targets for c in ctxs) or \
        any(_inside(t, c) for t in state.stack_grads for c in ctxs)


def _contexts(u: _Unit) -> tuple:
    return (u.obj,) if u.kind == "while" else tuple(u.obj.branches.values())


def _unit_grad(state: GradState, u: _Unit, out_grads: list,
               internal: dict | None = None, need: list | None = None) -> tuple[list, dict]:
    extra = (u.kind != "op" and any(_inside(t, c) for t in state.stack_grads
                                    for c in _contexts(u))) or bool(internal)
    if all(g is None for g in out_grads) and not extra:
        return [None] * len(u.inputs), {}
    if u.kind == "op":
        if u.obj.type == "StackPopV2" and u.obj in state.graph._pop_source:
            from dcf.autodiff.loop_state import push_pop_grad

            push_pop_grad(state, u.obj, out_grads[0])
            return [None], {}
        return _op_grad(u.obj, out_grads), {}
    from dcf.autodiff import control_flow_grad

    if u.kind == "cond":
        return control_flow_grad.cond_grad(state, u.obj, u.inputs, out_grads, internal or {})
    return control_flow_grad.while_grad(state, u.obj, u.inputs, out_grads, need)


def _op_grad(op: Operation, out_grads: list) -> list:
    if op.type not in GRADIENTS:
        raise LookupError(
            f"no gradient registered for op type '{op.type}' (op '{op.name}').\n  Wrap its "
            f"output in dcf.stop_gradient, or register one with "
            f"@dcf.RegisterGradient(\"{op.type}\").")
    fn = GRADIENTS[op.type]
    if fn is None:
        return [None] * len(op.inputs)
    with colocated(op):
        res = _call_grad_fn(fn, op, out_grads)
    if not isinstance(res, (list, tuple)):
        res = [res]
    if len(res) != len(op.inputs):
        raise ValueError(f"gradient of {op.type} '{op.name}' returned {len(res)} values for "
                         f"{len(op.inputs)} inputs")
    res = [None if r is None else _grad_as_tensor(op, i, r) for i, r in enumerate(res)]
    for i, (t, r) in enumerate(zip(op.inputs, res)):
        if r is not None and differentiable(t) and r.dtype is not t.dtype:
            raise TypeError(
                f"gradient of {op.type} '{op.name}' for input {i} ('{t.name}', {t.type}) has "
                f"dtype {r.dtype}; a gradient has the dtype of its input (check the "
                "registered gradient function)")
        if r is not None and not shapes_compatible(t.shape, r.shape):
            raise ValueError(
                f"gradient of {op.type} '{op.name}' for input {i} ('{t.name}', shape "
                f"{shape_str(t.shape)}) has shape {shape_str(r.shape)}; a gradient has "
                "the shape of its input (check grad_ys, or the registered gradient function)")
    return res


def _call_grad_fn(fn: Any, op: Operation, out_grads: list) -> Any:
    """fn(op, *out_grads), an error it raises naming the op whose gradient it builds (a
    bare error from a user's RegisterGradient function does not say which op it was)."""
    try:
        return fn(op, *out_grads)
    except Exception as e:
        where = f"gradient of {op.type} '{op.name}'"
        if str(e).startswith(where):
            raise
        try:
            err = type(e)(f"{where} (registered function {getattr(fn, '__name__', fn)!r}) "
                          f"raised: {e}")
        except Exception:
            e.add_note(f"while building the {where}")  # (an error type with other arguments)
            raise
        raise err.with_traceback(e.__traceback__) from e


def _grad_as_tensor(op: Operation, i: int, r: Any) -> Tensor:
    """A gradient function's value for input i as a tensor: a Python or numpy value takes
    the input's dtype (0.0 for a float64 input), as grad_ys does."""
    from dcf.ops.array_ops import _is_tensorlike

    t = op.inputs[i]
    try:
        return convert_in(r, op.graph, None if _is_tensorlike(r) else t.dtype)
    except (TypeError, ValueError) as e:
        raise TypeError(f"gradient of {op.type} '{op.name}' for input {i} ('{t.name}', "
                        f"{t.type}) is not a tensor: {e}") from e

