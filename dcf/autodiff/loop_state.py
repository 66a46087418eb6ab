"""The contexts gradient conds and loops are built in, and the forward-loop side of
loop gradients: a trip counter, and one stack per saved value.

A gradient loop B mirrors a forward loop W. When a gradient function inside B uses
a value of W, B's capture pushes that value on a stack in W (one push per
iteration, in W's iteration order) and pops it in B (one pop per iteration, in
reverse). A value used only through its shape is reduced to the shape inside W and
only the shape is saved. Loop constants are not saved: B enters them once. Every
push is a control input of W's `sync` trigger, which the trip counter waits on, so
the backward loop starts only after every push, without serialising W's compute.
"""

from __future__ import annotations

from typing import Any

from dcf import dtypes
from dcf.autodiff.gradients import _value_ctx
from dcf.control_flow import CondContext, WhileContext
from dcf.graph import Operation, Tensor
from dcf.ops.registry import OPS, apply

__all__ = ["GradWhileContext", "GradCondContext", "forward_counter", "saved_stacks"]


def _belongs(t: Tensor, fwd: Any) -> bool:
    """t's value lives directly in forward context `fwd` (not in one nested in it)."""
    return t.op.ctx is fwd or t in fwd._internal


class _GradMixin:
    """Capture rules shared by gradient conds and loops."""

    forward: Any = None

    def _check_external(self, t: Tensor) -> None:
        pass  # forward values are legitimately used by gradient code

    def _mirror_while(self) -> GradWhileContext | None:
        c: Any = self
        while c is not None:
            if isinstance(c, GradWhileContext):
                return c
            c = c.outer
        return None

    def _loop_for(self, t: Tensor) -> GradWhileContext | None:
        """The gradient loop (this one or an outer one) that mirrors t's forward loop."""
        w = t.op.ctx.while_ctx if t.op.ctx is not None else None
        if w is None:
            return None
        c: Any = self
        while c is not None:
            if isinstance(c, GradWhileContext) and c.forward is w:
                return c
            c = c.outer
        return None

    def shape_only_hook(self, op_type: str, tensors: list, name: Any, attrs: dict) -> Any:
        t = tensors[0]
        if self._is_inside(t) or t.op.ctx is None:
            return None
        b = self._loop_for(t)
        if b is None:
            return None
        g = t.graph
        from dcf.ops import array_ops

        # the shape is taken where t is a value: for a branch's view of an input (a
        # Switch output) inside that branch, so that it is saved (pushed and popped)
        # exactly when the branch runs. Taken next to the Switch, outside the branch, it
        # would be dead when the branch is not taken, its push skipped, and the pop of
        # the gradient loop would find an empty stack.
        with g._control_flow_context(_value_ctx(t)):
            if op_type == "Shape":
                fwd = array_ops.shape(t, **({"out_type": attrs["out_type"]}
                                            if "out_type" in attrs else {}))
            elif op_type == "Size":
                fwd = array_ops.size(t)
            elif op_type == "Rank":
                fwd = array_ops.rank(t)
            else:
                fwd = array_ops.shape(t)
        saved = self.capture(fwd)
        if op_type in ("ZerosLike", "OnesLike"):
            with g._control_flow_context(self):
                value = 0 if op_type == "ZerosLike" else 1
                from dcf.ops.registry import constant

                return array_ops.fill(saved, constant(value, dtype=t.dtype))
        return saved


class GradCondContext(_GradMixin, CondContext):
    """A branch of a gradient cond; it mirrors the forward branch `forward`."""

    def __init__(self, pred: Tensor, branch: int, name: str, outer: Any, forward: Any) -> None:
        super().__init__(pred, branch, name, outer)
        self.forward = forward

    def capture(self, t: Tensor) -> Tensor:
        if self._is_inside(t):
            return t
        got = self._captured.get(t)
        if got is not None:
            return got
        if _belongs(t, self.forward):
            loop = self._loop_for(t)
            # a forward branch value is live exactly when this gradient branch runs; it
            # still enters through its own Switch so the gradient cond is differentiable
            got = self._raw_switch(t) if loop is None else loop.saved_value(t, pop_ctx=self)
        elif t.op.ctx is not None and t.op.ctx.while_ctx is None and \
                self.while_ctx is None and \
                t.op.ctx not in (self.outer.chain() if self.outer is not None else []):
            # a value of another forward branch (second order): dead exactly when that
            # branch was not taken, which is when nothing here needs it live. (Not from
            # inside a loop: a value from outside it enters it first, below -- read
            # directly, it would cross into the loop's frame without an Enter.)
            got = self._raw_switch(t)
        else:
            got = self._route_in(t)
        self._captured[t] = got
        self._internal.add(got)
        return got


    def _raw_switch(self, t: Tensor) -> Tensor:
        """Switch(t, pred) in the outer context although t lives in a forward branch
        (no capture checks: t is dead exactly when this branch is not taken); through
        the outer gradient cond's own capture where this one is nested in one."""
        if isinstance(self.outer, GradCondContext) and not self.outer._is_inside(t):
            # a gradient cond nested in another: t reaches it through the outer one's
            # capture, so that at second order the outer gradient cond is a unit with t
            # among its inputs and t's gradient leaves it (read directly, t would be a
            # leaf of the outer branch's reverse walk and its gradient lost)
            t = self.outer.capture(t)
        g = t.graph
        with g._control_flow_context(self.outer), g.control_dependencies(None):
            op = g.create_op("Switch", [t, self.pred], [t.type, t.type], name="Switch",
                             opdef=OPS["Switch"], ctx=self.outer)
        g._cond_of_switch[op] = self.info
        return op.outputs[self.branch]


class GradWhileContext(_GradMixin, WhileContext):
    """The frame of a backward loop; it mirrors forward loop `forward`."""

    def __init__(self, frame_name: str, parallel_iterations: int, back_prop: bool,
                 swap_memory: bool, outer: Any, forward: WhileContext, sync: Operation) -> None:
        super().__init__(frame_name, parallel_iterations, back_prop, swap_memory, outer)
        self.forward = forward
        self.sync = sync
        self.stacks: list[Operation] = []     # StackV2 ops of the values this loop saves
        self._saved: dict[Tensor, Tensor] = {}

    def _route_in(self, t: Tensor) -> Tensor:
        w = self.forward
        if t.op.type == "Enter" and t.op.attrs.get("is_constant") and t.op.ctx is w:
            return super()._route_in(t.op.inputs[0])  # a loop constant: enter it once
        if _belongs(t, w):
            return self.saved_value(t, pop_ctx=self)
        return super()._route_in(t)

    def saved_value(self, t: Tensor, pop_ctx: Any) -> Tensor:
        """Push `t` on a stack in the forward loop; pop it in `pop_ctx` (this loop, or a
        gradient cond inside it mirroring t's forward branch)."""
        key = (t, id(pop_ctx))
        got = self._saved.get(key)  # type: ignore[call-overload]
        if got is not None:
            return got
        g = t.graph
        if t.op.type == "Const":
            # a constant of the forward loop's body: made again where it is needed (as
            # TF1's backward loops do), not pushed and popped once per iteration
            with g._control_flow_context(pop_ctx), g.control_dependencies(None), \
                    g.device(t.op.device or None):
                c = apply("Const", [], name=t.op.name.rsplit("/", 1)[-1],
                          value=t.op.attrs["value"], dtype=t.dtype)
            self._saved[key] = c  # type: ignore[index]
            return c
        w = self.forward
        with g._control_flow_context(w.outer), g.control_dependencies(None):
            handle = apply("StackV2", [], name="stack", elem_type=t.dtype,
                           stack_name=f"{w.frame_name}/{t.name}",
                           swap_memory=bool(w.swap_memory))
        self.stacks.append(handle.op)
        with g._control_flow_context(t.op.ctx):
            push = apply("StackPushV2", [handle, t], name="stack_push",
                         swap_memory=bool(w.swap_memory))
        self.sync._add_control_input(push.op)
        with g._control_flow_context(pop_ctx):
            # the pivot makes the pop run once per backward iteration that is live
            # (never in the final, dead one) and only where its gradient branch runs
            pop = apply("StackPopV2", [handle], name="stack_pop", elem_type=t.dtype,
                        shape=t.shape, control_inputs=[pop_ctx.pivot()])
        self._saved[key] = pop  # type: ignore[index]
        g._pop_source[pop.op] = t   # second order: the pop's gradient flows back to t
        return pop


def forward_counter(w: WhileContext) -> tuple[Tensor, Operation]:
    """Add a trip counter to forward loop `w` (new ops only) and its sync trigger.

    Returns (the counter's Exit: how many times the body ran, the trigger every push
    of the gradient's saved values becomes a control input of).
    """
    g = w.loop_cond.graph
    from dcf.ops.registry import constant

    with g._control_flow_context(w.outer), g.control_dependencies(None):
        zero = constant(0, dtype=dtypes.int32, name="grad_counter_init")
        enter = w.make_enter(zero, is_constant=False, name="grad_counter_enter", track=False)
    with g._control_flow_context(w):
        from dcf.ops.control_ops import identity, merge, switch

        m = merge([enter, enter], name="grad_counter_merge")[0]
        s = switch(m, w.loop_cond.outputs[0], name="grad_counter_switch")
        body = identity(s[1], name="grad_counter_body")
        sync = apply("ControlTrigger", [], name="grad_sync", control_inputs=[body.op])
        with g.control_dependencies([sync]):
            one = constant(1, dtype=dtypes.int32, name="grad_counter_one")
            inc = apply("Add", [body, one], name="grad_counter_inc")
        nxt = apply("NextIteration", [inc], name="grad_counter_next")
        m.op._set_input(1, nxt)
        exit_op = g.create_op("Exit", [s[0]], [s[0].type], name="grad_counter_exit",
                              opdef=OPS["Exit"], attrs={}, ctx=w.outer, frame_ctx=w)
    return exit_op.outputs[0], sync


def saved_stacks(graph: Any) -> list[Operation]:
    """Every stack op that gradient loops of `graph` save forward values on."""
    return [op for op in graph.get_operations() if op.type == "StackV2"]


def push_pop_grad(state: Any, pop: Operation, grad: Tensor) -> None:
    """Second order: the gradient reaching a pop of saved value t is pushed on a new
    stack (in this backward-of-backward loop's order, which is t's forward order); the
    backward loop of t's own loop pops it as an extra gradient of t."""
    t = pop.graph._pop_source[pop]
    g = pop.graph
    ctx = g._ctx
    w = t.op.ctx.while_ctx if t.op.ctx is not None else None
    # the stack outside every loop around the pushes (one stack for the whole run, as
    # the saved-value stacks: in an inner loop's frame there would be one per outer
    # iteration, out of reach of the loop that pops)
    outer = _outermost(ctx.while_ctx).outer if ctx is not None and ctx.while_ctx is not None \
        else None
    loop = ctx.while_ctx if ctx is not None else None
    # the stack swaps where the loop that pushes does, as the stacks of saved values
    # (its pops, in t's backward loop, come in the reverse order of its pushes too)
    swap = bool(loop is not None and loop.swap_memory)
    with g._control_flow_context(outer), g.control_dependencies(None):
        handle = apply("StackV2", [], name="grad_stack", elem_type=grad.dtype,
                       stack_name=f"{t.name}@grad", swap_memory=swap)
    push = apply("StackPushV2", [handle, grad], name="grad_stack_push", swap_memory=swap).op
    state.stack_grads.setdefault(t, []).append(handle)
    state.stack_grad_values[handle] = grad
    if loop is not None:
        # t's backward loop must start only after this loop pushed everything: for
        # nested loops, the outermost backward loop around t waits for the outermost
        # loop around the pushes (the two are in one frame; the inner ones are not)
        state.stack_grad_loops.setdefault(_outermost(w), []).append(_outermost(loop))
        loop.extra_pushes = getattr(loop, "extra_pushes", []) + [push]
        outer_loop = loop.outer
        if outer_loop is not None and outer_loop.is_while and \
                loop not in getattr(outer_loop, "pushing_loops", []):
            # the loop around waits for this one: else, where nothing reads this loop's
            # results (their gradient went only to dead TensorArray reads, say), it is
            # left out of the run and its pushes with it
            outer_loop.pushing_loops = getattr(outer_loop, "pushing_loops", []) + [loop]
        # one stack takes the pushes of every run of this loop: the loops around it run
        # one iteration at a time, so those runs push in their forward order (within
        # one frame, stack ops already run in iteration order)
        c = loop.outer
        while c is not None:
            if c.while_ctx is not None:
                sequential(c.while_ctx)
                c = c.while_ctx.outer
            else:
                c = c.outer


def sequential(w: Any) -> None:
    """Make loop `w` run one iteration at a time (parallel_iterations 1), also the
    Enters already made for it."""
    if w.parallel_iterations == 1:
        return
    w.parallel_iterations = 1
    name = w.frame_name
    for op in w.loop_cond.graph.get_operations():
        if op.type == "Enter" and op.attrs.get("frame_name") == name:
            op.attrs["parallel_iterations"] = 1


def _outermost(w: Any) -> Any:
    """The outermost loop that holds while context `w` (w itself if none does)."""
    c = w.outer
    while c is not None:
        if c.while_ctx is not None:
            w = c.while_ctx
            c = w.outer
        else:
            c = c.outer
    return w


def pop_stack_grads(t: Tensor, handles: list, pushed: dict) -> Tensor:
    """Inside t's backward loop: pop this iteration's extra gradients of t (`pushed`:
    stack handle -> the value push_pop_grad pushes on it)."""
    g = t.graph
    ctx = g._ctx
    parts = []
    for h in handles:
        pop = apply("StackPopV2", [h], name="grad_stack_pop", elem_type=t.dtype, shape=t.shape,
                    control_inputs=[ctx.pivot()])
        # third order: this pop is a saved value as the pops of forward values are (of
        # the gradient that the loop around the push computed), so a gradient reaching
        # it flows back to what was pushed
        g._pop_source[pop.op] = pushed[h]
        parts.append(pop)
    if len(parts) == 1:
        return parts[0]
    from dcf.ops.math_ops import add_n

    return add_n(parts)
