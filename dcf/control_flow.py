"""cond, case and while_loop, lowered at build time to Switch, Merge, Enter, Exit,
NextIteration and LoopCond exactly as section 4.2 of the paper describes."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from dcf import dtypes, nest
from dcf.graph import (
    ControlFlowContext, Operation, Tensor, TensorType, shape_str, shapes_compatible,
)
from dcf.errors import InvalidArgumentError
from dcf.ops.control_ops import identity, merge, switch
from dcf.ops.data_ops import py_func
from dcf.ops.registry import OPS, apply, convert_to_tensor, graph_of

__all__ = ["cond", "case", "while_loop", "CondContext", "WhileContext"]


def _is_ta(x: Any) -> bool:
    return getattr(x, "_is_tensor_array", False)


class _ContextBase(ControlFlowContext):
    def __init__(self, name: str, outer: ControlFlowContext | None) -> None:
        self.name = name
        self.outer = outer
        self._captured: dict[Tensor, Tensor] = {}
        self._internal: set[Tensor] = set()
        self._pivot: Operation | None = None
        self.ops: list[Operation] = []

    def pivot(self) -> Operation | None:
        return self._pivot

    def add_op(self, op: Operation) -> None:
        self.ops.append(op)
        # An op with no inputs whose control inputs all come from outside (TF's rule)
        # would run whether or not the branch is taken, or in every iteration and the
        # exit one too: tie it to the pivot as well.
        piv = self._pivot
        if piv is not None and op is not piv and not op.inputs and \
                not any(self._fires_here(c) for c in op.control_inputs):
            op._add_control_input(piv)

    def _fires_here(self, op: Operation) -> bool:
        """Whether `op` runs only where this context runs (a branch taken, an iteration)."""
        return op.ctx is not None and self in op.ctx.chain()

    def _is_inside(self, t: Tensor) -> bool:
        if t in self._internal:
            return True
        c = t.op.ctx
        while c is not None:
            if c is self:
                return True
            c = c.outer
        return False

    def _check_external(self, t: Tensor) -> None:
        src = t.op.ctx
        if src is not None and src not in self.chain():
            raise ValueError(
                f"tensor '{t.name}' was created inside {src.describe()} and cannot be used in "
                f"{self.describe()}; pass it out through the outputs of its cond/while_loop")

    def capture(self, t: Tensor) -> Tensor:
        if self._is_inside(t):
            return t
        got = self._captured.get(t)
        if got is None:
            self._check_external(t)
            got = self._route_in(t)
            self._captured[t] = got
            self._internal.add(got)
        return got

    def _route_in(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class CondContext(_ContextBase):
    """One branch of a cond: external tensors enter it through their own Switch."""

    def __init__(self, pred: Tensor, branch: int, name: str,
                 outer: ControlFlowContext | None) -> None:
        super().__init__(name, outer)
        self.pred = pred
        self.branch = branch

    def describe(self) -> str:
        return f"cond '{self.name}' ({'true' if self.branch else 'false'} branch)"

    def _route_in(self, t: Tensor) -> Tensor:
        g = t.graph
        with g._control_flow_context(self.outer):
            outs = switch(t, self.pred, name="Switch")
        info = getattr(self, "info", None)
        if info is not None:
            g._cond_of_switch[outs[0].op] = info
        return outs[self.branch]

    def capture_control(self, op: Operation) -> Operation:
        if op.ctx is not None and self in op.ctx.chain():
            return op
        return self.outer.capture_control(op) if self.outer is not None else op


class WhileContext(_ContextBase):
    """The frame of one while_loop. External tensors become loop constants
    (Enter with is_constant=True), routed in once each."""

    is_while = True

    def __init__(self, frame_name: str, parallel_iterations: int, back_prop: bool,
                 swap_memory: bool, outer: ControlFlowContext | None) -> None:
        super().__init__(frame_name, outer)
        self.frame_name = frame_name
        self.parallel_iterations = parallel_iterations
        self.back_prop = back_prop
        self.swap_memory = swap_memory
        self.enters: list[Operation] = []       # loop-variable Enters
        self.const_enters: list[Operation] = []
        self.merges: list[Operation] = []
        self.switches: list[Operation] = []
        self.exits: list[Operation] = []
        self.next_iterations: list[Operation] = []
        self.loop_cond: Operation | None = None
        self.body_inputs: list[Operation] = []   # Identity(Switch:1) per loop var
        self.body_results: list[Tensor] = []     # what the body returned, per loop var

    def describe(self) -> str:
        return f"while_loop '{self.frame_name}'"

    @property
    def outer_frame(self) -> WhileContext | None:
        return self.outer.while_ctx if self.outer is not None else None

    def make_enter(self, t: Tensor, *, is_constant: bool, ttype: TensorType | None = None,
                   control_inputs: list[Operation] | None = None,
                   name: str = "Enter", track: bool = True) -> Tensor:
        """An Enter of `t` (a tensor of the outer context) into this frame."""
        g = t.graph
        with g._control_flow_context(self.outer):
            if self.outer is not None:
                t = self.outer.capture(t)
                # the Enter runs in the outer frame: its control inputs belong there
                control_inputs = [self.outer.capture_control(c) for c in control_inputs or ()]
                piv = _enclosing_pivot(self.outer)
                if not is_constant and piv is not None and t.op.type == "Enter" and \
                        t.op.attrs.get("is_constant"):
                    # a loop constant of the outer loop holds in its exit iteration too:
                    # without the pivot this loop would run there as well (TF's rule)
                    control_inputs.append(piv)
            op = g.create_op(
                "Enter", [t], [ttype or t.type], name=name, opdef=OPS["Enter"],
                attrs={"frame_name": self.frame_name, "is_constant": is_constant,
                       "parallel_iterations": self.parallel_iterations},
                ctx=self, frame_ctx=self.outer_frame, control_inputs=control_inputs,
                capture_controls=False)
        if track:
            (self.const_enters if is_constant else self.enters).append(op)
        return op.outputs[0]

    def _route_in(self, t: Tensor) -> Tensor:
        return self.make_enter(t, is_constant=True)

    def add_op(self, op: Operation) -> None:
        super().add_op(op)
        # An op whose inputs are all loop constants would otherwise run in the exit
        # iteration too (and before the predicate): tie it to the iteration's pivot,
        # as TF's _MaybeAddControlDependency does.
        piv = self._pivot
        if piv is None or op is piv or op.type == "Enter" or not op.inputs:
            return
        if all(self._is_constant_enter(t.op) for t in op.inputs) and \
                not any(self._fires_here(c) for c in op.control_inputs):
            op._add_control_input(piv)

    def _is_constant_enter(self, op: Operation) -> bool:
        return op.type == "Enter" and op.attrs.get("is_constant") and op.ctx is self

    def _fires_here(self, op: Operation) -> bool:
        # a loop constant (and a control input from outside, which enters as one) holds
        # in every iteration, the exit one too
        return super()._fires_here(op) and not self._is_constant_enter(op)

    def capture_control(self, op: Operation) -> Operation:
        if op.ctx is not None and self in op.ctx.chain():
            return op
        g = op.graph
        with g._control_flow_context(self.outer), g.control_dependencies([op]):
            token = apply("Const", [], name="control_token", value=dtypes.float32.np.type(0),
                          dtype=dtypes.float32)
        return self.capture(token).op


def _enclosing_pivot(ctx: ControlFlowContext | None) -> Operation | None:
    """The pivot of the closest enclosing context that has one."""
    while ctx is not None and ctx.pivot() is None:
        ctx = ctx.outer
    return ctx.pivot() if ctx is not None else None


# ---------------------------------------------------------------------- cond
class CondInfo:
    """What autodiff needs to know about one cond: its predicate, both branch
    contexts, the Switch of each captured tensor and the Merge of each output."""

    def __init__(self, name: str, pred: Tensor, outer: ControlFlowContext | None) -> None:
        self.name = name
        self.pred = pred
        self.outer = outer
        self.branches: dict[int, CondContext] = {}
        self.results: dict[int, list] = {}
        self.merges: list[Operation] = []


def cond(pred: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any],
         name: str | None = None) -> Any:
    """`true_fn() if pred else false_fn()`, decided when the graph runs.

    Only the taken branch executes. Each external tensor a branch uses is guarded by
    its own Switch on `pred`; each output is joined by its own Merge.

    Args:
        pred: a scalar bool tensor.
        true_fn, false_fn: functions of no arguments returning the same nested
            structure of tensors (same dtypes).
    Returns:
        The structure the branches return, holding the taken branch's values.
    Raises:
        TypeError / ValueError at build time when the branches' outputs differ.
    """
    if not callable(true_fn) or not callable(false_fn):
        raise TypeError("cond: true_fn and false_fn must be callables of no arguments")
    _check_name(name, "cond", "strict", "dcf's cond has no strict= (it returns the "
                "branches' structure as they return it, as TF1's strict=True): drop the argument")
    # built in pred's graph (the default one for a Python value), as any op of its inputs
    g = graph_of([pred])
    with g.as_default(), g.name_scope(name or "cond") as scope:
        cname = scope.rstrip("/")
        if isinstance(pred, (bool, np.bool_)):
            raise TypeError(
                f"cond '{cname}': pred is a Python bool ({pred!r}), not a dcf bool tensor.\n  "
                "`==` on tensors is identity; use dcf.equal(a, b), and dcf.logical_and/or "
                "instead of `and`/`or`")
        pred = convert_to_tensor(pred)
        if pred.dtype is not dtypes.bool_ or pred.shape not in (None, ()):
            raise TypeError(f"cond '{cname}': pred must be a scalar bool tensor, got {pred.type}")
        outer = g._ctx
        if outer is not None:
            pred = outer.capture(pred)
        cdeps = g._current_control_inputs()
        info = CondInfo(cname, pred, outer)
        results = []
        for branch, fn in ((1, true_fn), (0, false_fn)):
            ctx = _cond_ctx_factory(g)(pred, branch, cname, outer)
            ctx.info = info
            info.branches[branch] = ctx
            with g.control_dependencies(cdeps):
                p = switch(pred, pred, name="switch_" + ("t" if branch else "f"))[branch]
            with g._control_flow_context(ctx):
                ctx._internal.add(p)
                ctx._pivot = identity(p, name="pivot_" + ("t" if branch else "f")).op
                ctx._internal.add(ctx._pivot.outputs[0])
                out = fn()
                if out is None:
                    raise TypeError(f"cond '{cname}': {'true' if branch else 'false'}_fn "
                                    "returned None; return the tensors the cond produces")
                flat = [_branch_output(ctx, x, k) for k, x in enumerate(nest.flatten(out))]
            results.append((out, flat))
        (t_out, t_flat), (f_out, f_flat) = results
        diff = nest.structure_diff(t_out, f_out)
        if diff:
            raise ValueError(f"cond '{cname}': true_fn and false_fn must return the same "
                             f"structure:\n  * {diff}")
        for i, (a, b) in enumerate(zip(t_flat, f_flat)):
            if _is_ta(a) != _is_ta(b) or a.dtype is not b.dtype:
                raise TypeError(
                    f"cond '{cname}': true_fn and false_fn must return the same structure and "
                    f"types:\n  * at output[{i}]: true_fn returned {_desc(a)}, false_fn "
                    f"returned {_desc(b)}")
            if _is_ta(a) and a.handle is not b.handle:
                # only the flow is merged: the result would be the true branch's array
                # whichever branch ran
                raise ValueError(
                    f"cond '{cname}': true_fn and false_fn return different TensorArrays at "
                    f"output[{i}] ('{a.name}' and '{b.name}'); a cond can return a "
                    "TensorArray only when both branches return the same one (each may "
                    "write to it). Make the array outside the cond and write the branch's "
                    "values into it, or return tensors (e.g. each array's stack()) instead")
        merged = []
        info.results = {1: [a.flow if _is_ta(a) else a for a in t_flat],
                        0: [b.flow if _is_ta(b) else b for b in f_flat]}
        with g.control_dependencies(None):
            for a, b in zip(t_flat, f_flat):
                if _is_ta(a):
                    merged.append(a._with_flow(_join(g, b.flow, a.flow, outer)))
                else:
                    merged.append(_join(g, b, a, outer))
        info.merges = [(m.flow if _is_ta(m) else m).op for m in merged]
        for m in info.merges:
            g._cond_of_merge[m] = info
        return nest.pack_sequence_as(t_out, merged)


def _check_name(name: Any, what: str, tf1_arg: str, hint: str) -> None:
    # the argument after the last positional one dcf shares with TF1 is `name` here but
    # a bool in TF1 (cond's strict, case's exclusive): a ported positional call lands here
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{what}: name must be a string, got {name!r}; TF1's {what} takes "
                        f"{tf1_arg} in that position: {hint}")


def _cond_ctx_factory(g: Any) -> Any:
    """Autodiff swaps in its own context classes while it builds gradient conds/loops."""
    return getattr(g, "_cond_ctx_class", None) or CondContext


def _join(g: Any, false_v: Tensor, true_v: Tensor, outer: Any) -> Tensor:
    """The Merge of a cond output: built in the outer context from both branches."""
    types = OPS["Merge"].infer(false_v.type, true_v.type)
    op = g.create_op("Merge", [false_v, true_v], types, name="Merge", opdef=OPS["Merge"],
                     ctx=outer)
    return op.outputs[0]


def _desc(x: Any) -> str:
    return "a TensorArray" if _is_ta(x) else str(x.type)


def _branch_output(ctx: CondContext, x: Any, k: int) -> Any:
    if x is None:
        raise TypeError(f"{ctx.describe()} returned None at output[{k}]; return a tensor there")
    if _is_ta(x):
        return x._with_flow(ctx.capture(x.flow))
    if isinstance(x, Operation):
        # TF's rule: an op stands as the branch's pivot run after it (a bool tensor whose
        # value is the branch taken), so `cond(p, lambda: opt.apply_gradients(g), no_op)`
        # runs the update only when p holds; an op built before the cond runs on either
        # branch, as in TF1 (the branch only waits for it)
        if x.graph is not ctx._pivot.graph:
            raise ValueError(f"{ctx.describe()}: a branch returned the op '{x.name}' of "
                             "another graph")
        with x.graph.control_dependencies([x]):
            return identity(ctx._pivot.outputs[0], name="op_done")
    return ctx.capture(convert_to_tensor(x))


def case(pred_fn_pairs: list, default: Callable[[], Any] | None = None,
         name: str | None = None, exclusive: bool = False) -> Any:
    """The fn of the first true predicate in list order, else `default()`.

    Built on nested conds: `cond(p0, f0, lambda: cond(p1, f1, ... default))`. With
    `exclusive=True`, more than one true predicate is an InvalidArgumentError when it runs.
    Without a default, the last pair stands in for it, and no true predicate is an
    InvalidArgumentError when it runs (TF's rule: the last fn is not run on a false
    predicate).
    """
    _check_name(name, "case", "exclusive", "pass it by keyword (exclusive=...)")
    pairs = list(pred_fn_pairs.items()) if isinstance(pred_fn_pairs, dict) else \
        list(pred_fn_pairs)
    if not pairs and default is None:
        raise ValueError("case needs at least one (pred, fn) pair or a default")
    for k, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"case: pred_fn_pairs[{k}] must be a (pred, fn) pair, got {pair!r}")
        if not callable(pair[1]):
            raise TypeError(f"case: the fn of pred_fn_pairs[{k}] must be a callable of no "
                            f"arguments, got {pair[1]!r}")
    if default is not None and not callable(default):
        raise TypeError(f"case: default must be a callable of no arguments, got {default!r}")
    g = graph_of([p for p, _ in pairs])
    with g.as_default(), g.name_scope(name or "case") as scope:
        if exclusive and len(pairs) > 1:
            pairs = _checked_exclusive(pairs, scope.rstrip("/"))
        if default is None:
            *pairs, (last_pred, last_fn) = pairs
            default = _checked_last(last_pred, last_fn, scope.rstrip("/"))

        def build(k: int) -> Any:
            if k == len(pairs):
                return default()
            p, fn = pairs[k]
            return cond(p, fn, lambda: build(k + 1), name=f"case_{k}")
        return build(0)


def _checked_exclusive(pairs: list, name: str) -> list:
    """`pairs`, their predicates read after a check that at most one of them is true."""
    def at_most_one_true(*preds: Any) -> Any:
        true = [k for k, p in enumerate(preds) if p]
        if len(true) > 1:
            raise InvalidArgumentError(f"case '{name}' is exclusive, but the predicates at "
                                       f"positions {true} are all true")
        return np.bool_(True)

    check = py_func(at_most_one_true, [p for p, _ in pairs], dtypes.bool_, name="exclusive")
    g = check.graph
    with g.control_dependencies([check]):
        return [(identity(p), fn) for p, fn in pairs]


def _checked_last(pred: Any, fn: Callable[[], Any], name: str) -> Callable[[], Any]:
    """A default for a case without one: the last fn, whose results come after a check
    that its predicate is true (else no predicate was)."""
    def some_true(p: Any) -> Any:
        if not p:
            raise InvalidArgumentError(f"case '{name}' has no default and none of its "
                                       "predicates is true")
        return np.bool_(True)

    def default() -> Any:
        check = py_func(some_true, [pred], dtypes.bool_, name="some_true")
        with check.graph.control_dependencies([check]):
            return nest.map_structure(
                lambda t: t if _is_ta(t) else identity(convert_to_tensor(t)), fn())
    return default


# ---------------------------------------------------------------- while_loop
def while_loop(cond: Callable[..., Any], body: Callable[..., Any], loop_vars: Any,
               shape_invariants: Any = None, parallel_iterations: int = 32,
               back_prop: bool = True, swap_memory: bool = False,
               maximum_iterations: Any = None, name: str | None = None,
               return_same_structure: bool = False, _lenient_shapes: bool = False) -> Any:
    """Run `body` while `cond` holds, inside the graph:

        while cond(*loop_vars):
            loop_vars = body(*loop_vars)
        return loop_vars

    Each loop variable gets its own Enter/Merge/Switch/NextIteration/Exit chain;
    tensors the functions capture from outside become loop constants. Up to
    `parallel_iterations` iterations run at once; results never depend on it.

    Args:
        cond: function of the loop vars returning a scalar bool tensor.
        body: function of the loop vars returning the same structure.
        loop_vars: a tensor, TensorArray, or nested structure of them.
        shape_invariants: same structure of shapes (None dims allowed) where a
            loop var's static shape may change across iterations.
        parallel_iterations: how many iterations may be in flight (1 = sequential).
        back_prop: whether gradients may flow through the loop.
        swap_memory: let saved values for the gradient move to host memory.
        maximum_iterations: stop after this many iterations even if cond holds.
        return_same_structure: return one loop var given in a list or tuple in it too.
    Returns:
        The final loop vars, in loop_vars' structure; a single tensor in gives a single
        tensor out, and so does one tensor in a list or tuple unless
        return_same_structure (TF1's rule; its body may then return the tensor alone).
    Raises:
        ValueError at build time: no loop vars, a body returning another structure, a
        loop var whose static shape changes, or a shape invariant that does not hold
        for the shape a var enters with. TypeError: a dtype that changes.
    """
    if not callable(cond) or not callable(body):
        raise TypeError("while_loop: cond and body must be callables")
    if isinstance(parallel_iterations, (bool, np.bool_)) or \
            not isinstance(parallel_iterations, (int, np.integer)):
        # (int() cut 2.5 to 2, and None gave int()'s own TypeError naming no op; TF1
        # refuses both)
        raise TypeError(f"while_loop{f' {name!r}' if name else ''}: parallel_iterations must "
                        f"be an integer >= 1, got {parallel_iterations!r}")
    if parallel_iterations < 1:
        raise ValueError(f"while_loop{f' {name!r}' if name else ''}: parallel_iterations must "
                         f"be >= 1, got {parallel_iterations}")
    single = not nest.is_nested(loop_vars)
    structure = [loop_vars] if single else loop_vars
    leaves = nest.flatten(structure)
    if not leaves:
        raise ValueError(f"while_loop '{name or 'while'}': loop_vars must be provided (got "
                         f"{loop_vars!r}); pass at least one loop variable")
    # built in the loop vars' graph (the default one if none is a tensor), as TF's
    g = graph_of(leaves)
    with g.as_default(), g.name_scope(name or "while") as scope:
        fname = scope.rstrip("/")
        outer = g._ctx
        cdeps = g._current_control_inputs()
        flat = [x.flow if _is_ta(x) else convert_to_tensor(x) for x in leaves]
        invariants = _flat_invariants(shape_invariants, structure, single, fname, leaves)
        for k, (v, inv) in enumerate(zip(flat, invariants)):
            _check_invariant(fname, k, v, inv)
        counter = maximum_iterations is not None
        if counter:
            # the counter counts in maximum_iterations' dtype (int32 or int64), as TF's
            max_it = _max_iterations(maximum_iterations, fname)
            flat = flat + [convert_to_tensor(0, dtype=max_it.dtype)]
            invariants = invariants + [()]
        ctx_cls = getattr(g, "_while_ctx_class", None) or WhileContext
        ctx = ctx_cls(fname, int(parallel_iterations), back_prop, swap_memory, outer)
        enters = []
        for i, (v, inv) in enumerate(zip(flat, invariants)):
            ttype = v.type if inv is False else TensorType(v.dtype, inv)
            enters.append(ctx.make_enter(v, is_constant=False, ttype=ttype,
                                         control_inputs=cdeps))
        with g._control_flow_context(ctx):
            merges = [merge([e, e], name="Merge")[0] for e in enters]
            ctx.merges = [m.op for m in merges]
            ctx._internal.update(merges)
            ctx._pivot = merges[0].op
            user_vars = _repack(structure, leaves, merges)
            pred = cond(*user_vars)
            if counter:
                from dcf.ops.math_ops import less, logical_and
                pred = logical_and(convert_to_tensor(pred), less(merges[-1], max_it))
            pred = _check_pred(pred, fname)
            lc = apply("LoopCond", [pred], name="LoopCond")
            ctx.loop_cond = lc.op
            switches = [switch(m, lc, name="Switch") for m in merges]
            ctx.switches = [s[0].op for s in switches]
            exits = []
            for s in switches:
                op = g.create_op("Exit", [s[0]], [s[0].type], name="Exit", opdef=OPS["Exit"],
                                 attrs={}, ctx=outer, frame_ctx=ctx)
                exits.append(op.outputs[0])
            ctx.exits = [e.op for e in exits]
            body_in = [identity(s[1], name="Identity") for s in switches]
            ctx.body_inputs = [t.op for t in body_in]
            ctx._internal.update(body_in)
            ctx._pivot = body_in[0].op
            out = body(*_repack(structure, leaves, body_in))
            if out is None:
                raise TypeError(f"while_loop '{fname}': body returned None; it must return the "
                                "loop vars' new values (a missing `return`?)")
            if single and nest.is_nested(out) and len(nest.flatten(out)) == 1:
                out = nest.flatten(out)[0]
            elif not single and len(structure) == 1 and not nest.is_nested(out):
                out = [out]  # TF's `while_loop(c, b, [i])` with b returning one tensor
            out_struct = [out] if single else out
            if isinstance(out_struct, tuple) and isinstance(structure, list) or \
                    isinstance(out_struct, list) and isinstance(structure, tuple):
                out_struct = type(structure)(out_struct)
            diff = nest.structure_diff(structure, out_struct)
            if diff:
                raise ValueError(f"while_loop '{fname}': body must return the same structure as "
                                 f"loop_vars:\n  * {diff}")
            results = []
            for k, (x, leaf) in enumerate(zip(nest.flatten(out_struct), leaves)):
                if x is None:
                    raise TypeError(f"while_loop '{fname}': body returned None for loop var {k}")
                if _is_ta(leaf) != _is_ta(x):
                    raise TypeError(f"while_loop '{fname}': loop var {k} is "
                                    f"{'a TensorArray' if _is_ta(leaf) else 'a tensor'} but body "
                                    f"returned {'a TensorArray' if _is_ta(x) else 'a tensor'}")
                if _is_ta(x) and x.handle is not leaf.handle:
                    # only the flow is carried: the loop's result would be the array that
                    # entered (its elements, not the body's)
                    raise ValueError(
                        f"while_loop '{fname}': loop var {k} is TensorArray '{leaf.name}' but "
                        f"body returned another TensorArray '{x.name}'; a loop carries a "
                        "TensorArray only when the body returns the one it got (written to)")
                results.append(ctx.capture(x.flow if _is_ta(x) else convert_to_tensor(x)))
            if counter:
                from dcf.ops.math_ops import add
                results.append(add(body_in[-1], convert_to_tensor(1, dtype=max_it.dtype)))
            for k, (r, e) in enumerate(zip(results, enters)):
                _check_loop_var(fname, k, leaves, e, r, _lenient_shapes)
            ctx.body_results = list(results)
            nexts = [apply("NextIteration", [r], name="NextIteration") for r in results]
            ctx.next_iterations = [n.op for n in nexts]
            for m, n in zip(merges, nexts):
                m.op._set_input(1, n)
        if counter:
            exits = exits[:-1]
        packed = _repack(structure, leaves, exits)
        if single:
            return packed[0]
        if not return_same_structure and len(leaves) == 1 and \
                isinstance(structure, (list, tuple)):
            return packed[0]  # TF1: one loop var in a list or tuple comes back unwrapped
        return packed


def _max_iterations(maximum_iterations: Any, fname: str) -> Tensor:
    """maximum_iterations as a scalar int32 or int64 tensor (a Python int: int32)."""
    bad = TypeError(f"while_loop '{fname}': maximum_iterations must be an int or a scalar "
                    f"int32/int64 tensor, got {maximum_iterations!r}")
    if isinstance(maximum_iterations, (bool, np.bool_, float, np.floating)):
        raise bad
    if isinstance(maximum_iterations, (int, np.integer)):
        v = int(maximum_iterations)
        t = convert_to_tensor(v, dtype=dtypes.int32 if -2**31 <= v < 2**31 else dtypes.int64)
    else:
        try:
            t = convert_to_tensor(maximum_iterations)
        except (TypeError, ValueError):
            raise bad from None
    if t.dtype not in (dtypes.int32, dtypes.int64) or t.shape not in (None, ()):
        raise TypeError(f"while_loop '{fname}': maximum_iterations must be a scalar int32 or "
                        f"int64 tensor, got {t.type}")
    return t


def _repack(structure: Any, leaves: list, tensors: list[Tensor]) -> Any:
    vals = [leaf._with_flow(t) if _is_ta(leaf) else t for leaf, t in zip(leaves, tensors)]
    return nest.pack_sequence_as(structure, vals)


def _check_pred(pred: Any, fname: str) -> Tensor:
    if isinstance(pred, (bool,)) or pred is None:
        raise TypeError(
            f"while_loop '{fname}': cond returned a Python {type(pred).__name__} ({pred!r}), not "
            "a dcf bool tensor.\n  Probably cond uses `if`, `and` or `or` on tensors; use "
            "dcf.logical_and / dcf.cond instead.")
    pred = convert_to_tensor(pred)
    if pred.dtype is not dtypes.bool_ or pred.shape not in (None, ()):
        raise TypeError(f"while_loop '{fname}': cond must return a scalar bool tensor, got "
                        f"{pred.type}")
    return pred


def _flat_invariants(shape_invariants: Any, structure: Any, single: bool, fname: str,
                     leaves: list) -> list:
    if shape_invariants is None:
        return [False] * len(leaves)
    inv = [shape_invariants] if single else shape_invariants
    # a shape is a leaf here, not a structure to flatten
    flat = _flatten_shapes(inv, structure)
    out = []
    for s in flat:
        out.append(None if s is None else tuple(None if d is None or d == -1 else int(d)
                                                for d in s))
    return out


def _check_invariant(fname: str, k: int, v: Tensor, inv: Any) -> None:
    """A shape invariant may only relax the shape a loop var enters with (TF's rule)."""
    a = v.shape
    if inv is False or inv is None:
        return
    if a is None or len(a) != len(inv) or any(d is not None and d != e for d, e in zip(inv, a)):
        raise ValueError(
            f"while_loop '{fname}': the shape invariant {shape_str(inv)} of loop var {k} "
            f"('{v.name}') is not compatible with the shape "
            f"{'of unknown rank' if a is None else shape_str(a)} it enters the loop with; an "
            "invariant may only relax dimensions (None for one that changes, or a shape of "
            "None for any shape)")


def _flatten_shapes(inv: Any, structure: Any) -> list:
    if not nest.is_nested(structure):
        return [inv]
    if isinstance(structure, dict):
        return [x for k in sorted(structure) for x in _flatten_shapes(inv[k], structure[k])]
    if len(inv) != len(structure):
        raise ValueError(f"shape_invariants has {len(inv)} entries, loop_vars has "
                         f"{len(structure)}")
    return [x for i, s in zip(inv, structure) for x in _flatten_shapes(i, s)]


def _check_loop_var(fname: str, k: int, leaves: list, enter: Tensor, result: Tensor,
                    lenient: bool = False) -> None:
    if result.dtype is not enter.dtype:
        raise TypeError(f"while_loop '{fname}': loop var {k} enters as {enter.dtype} but body "
                        f"returns {result.dtype}")
    a, b = enter.shape, result.shape
    if a is None:
        return
    if lenient and shapes_compatible(a, b):
        return  # gradient loops: values have the forward shapes at run time
    if b is None or len(a) != len(b) or any(x is not None and x != y for x, y in zip(a, b)):
        raise ValueError(
            f"while_loop '{fname}': loop var {k} has shape {shape_str(a)} when it enters the "
            f"loop but {shape_str(b)} after one iteration; pass shape_invariants to allow a "
            "shape that changes across iterations")


def _output_frame(op: Operation) -> Any:
    """The loop frame an op's outputs live in (None: the root): an Enter's in its loop,
    an Exit's in the loop's outer frame, any other op's in the frame it runs in."""
    if op.type == "Enter":
        return op.ctx
    if op.type == "Exit":
        return op.ctx.while_ctx if op.ctx is not None else None
    return op.frame_ctx


def check_frames(ops: list, fed: set) -> None:
    """Raise InvalidArgumentError naming the first edge among `ops` (data or control,
    not from a fed tensor) that crosses into or out of a loop frame without its Enter or
    Exit: the tagged-token executor could never deliver it, and a run would wait
    forever. Graphs built with cond/while_loop/gradients never have one; this turns a
    construction bug into an error at the first run instead of a hang."""

    for op in ops:
        frame = op.frame_ctx
        for t in op.inputs:
            if t not in fed and _output_frame(t.op) is not frame:
                raise InvalidArgumentError(_crossing(t.op, op))
        for c in op.control_inputs:
            if _output_frame(c) is not frame:
                raise InvalidArgumentError(_crossing(c, op))


def _crossing(src: Operation, dst: Operation) -> str:
    def where(f: Any) -> str:
        return f"while_loop frame '{f.frame_name}'" if f is not None else "the root frame"
    return (f"{dst.type} '{dst.name}' (in {where(dst.frame_ctx)}) reads {src.type} "
            f"'{src.name}' (whose value lives in {where(_output_frame(src))}) without an "
            "Enter or Exit between them: the graph is malformed (a value crosses a loop "
            "boundary only through while_loop's own Enter/Exit)")
