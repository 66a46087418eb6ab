"""Gradients of whole control-flow constructs.

cond: a gradient cond on the forward predicate; each branch differentiates the
forward branch it mirrors and returns a gradient for every tensor either branch
captured (zeros for one it did not use), so an input used only by the untaken branch
gets zeros.

while_loop: a backward loop that runs the forward trip count in reverse. Its loop
variables are the counter, the gradient of each differentiable loop variable, and an
accumulator per loop constant (and per requested x inside the loop) that gradients
flow to; values it needs from the forward loop come from stacks (loop_state.py).

The primitives themselves (Switch, Merge, Enter, Exit, NextIteration) are never
differentiated one by one: the table below makes that explicit.
"""

from __future__ import annotations

from typing import Any

from dcf.autodiff.gradients import (GradState, _inside, captured_switches, differentiable,
                                    on_device, target_inside, vjp)
from dcf.autodiff.loop_state import GradCondContext, GradWhileContext, forward_counter
from dcf.control_flow import CondInfo, WhileContext, cond, while_loop
from dcf.graph import Operation, Tensor
from dcf.ops.registry import RegisterGradient

__all__ = ["cond_grad", "while_grad"]


def _structural(op_type: str):
    def grad(op: Any, *grads: Any) -> list:
        raise LookupError(
            f"{op_type} '{op.name}' is differentiated as part of its cond/while_loop; it was "
            "reached on its own, which means the graph was not built with dcf.cond / "
            "dcf.while_loop")
    return grad


# Control primitives: their gradients are built per construct (cond_grad/while_grad).
for _t in ("Switch", "Merge", "Enter", "Exit", "NextIteration"):
    RegisterGradient(_t)(_structural(_t))
RegisterGradient("Identity")(lambda op, g: [g])
RegisterGradient("Print")(lambda op, g: [g] + [None] * (len(op.inputs) - 1))


def _zeros_like(t: Tensor) -> Tensor:
    from dcf.ops.array_ops import zeros_like

    return zeros_like(t)


def _grad_classes(g: Any, cond_cls: Any = None, while_cls: Any = None):
    class _Swap:
        def __enter__(self) -> None:
            self.old = (getattr(g, "_cond_ctx_class", None), getattr(g, "_while_ctx_class", None))
            g._cond_ctx_class = cond_cls
            g._while_ctx_class = while_cls

        def __exit__(self, *exc: Any) -> None:
            g._cond_ctx_class, g._while_ctx_class = self.old
    return _Swap()


def _targets_inside(state: GradState, ctx: Any) -> list[Tensor]:
    return [x for x in state.targets if target_inside(x, ctx)]


# ------------------------------------------------------------------------ cond
def cond_grad(state: GradState, info: CondInfo, inputs: list[Tensor],
              out_grads: list, internal: dict | None = None) -> tuple[list, dict]:
    g = state.graph
    branch_ins: dict[int, list[tuple[Tensor, Tensor]]] = {}
    for b in (1, 0):
        branch_ins[b] = [(sw_out.op.inputs[0], sw_out) for sw_out in captured_switches(info, b)]
    ext = inputs  # same order as the unit's inputs: true branch's, then false branch's
    outs = [m.outputs[0] for m in info.merges]
    diff = [k for k, o in enumerate(outs) if differentiable(o) and
            (out_grads[k] is not None or not internal)]
    gy = {}
    for k in diff:
        gy[k] = out_grads[k] if out_grads[k] is not None else _zeros_like(outs[k])
    internal = internal or {}
    inner_of = {b: [t for t in internal if info.branches[b]._is_inside(t)] for b in (0, 1)}
    targets = {b: _targets_inside(state, info.branches[b]) for b in (0, 1)}
    all_targets = targets[1] + [t for t in targets[0] if t not in targets[1]]

    def branch_fn(b: int):
        def fn() -> list:
            ys = [info.results[b][k] for k in diff] + inner_of[b]
            sw = [s for _, s in branch_ins[b]]
            xs = sw + targets[b]
            with _grad_classes(g):
                grads = vjp(state, ys, xs, [gy[k] for k in diff] +
                            [internal[t] for t in inner_of[b]], level=info.branches[b],
                            through=set(targets[b]))
            by_switch = dict(zip(sw, grads[:len(sw)]))
            offset = 0 if b == 1 else len(branch_ins[1])
            res = []
            for k, t in enumerate(ext):
                j = k - offset
                gv = by_switch.get(branch_ins[b][j][1]) if 0 <= j < len(branch_ins[b]) else None
                res.append(gv if gv is not None else _zeros_like(t))
            tg = dict(zip(targets[b], grads[len(sw):]))
            for t in all_targets:
                gv = tg.get(t)
                res.append(gv if gv is not None else _zeros_like_static(t))
            return [r for r, t in zip(res, ext + all_targets)
                    if differentiable(t)]
        return fn

    def factory(pred: Tensor, branch: int, name: str, outer: Any) -> GradCondContext:
        return GradCondContext(pred, branch, name, outer, info.branches[branch])

    keep = [t for t in ext + all_targets if differentiable(t)]
    if not keep:
        return [None] * len(inputs), {}
    with _grad_classes(g, cond_cls=factory):
        res = cond(info.pred, branch_fn(1), branch_fn(0), name=f"{info.name}_grad")
    res = list(res) if isinstance(res, (list, tuple)) else [res]
    it = iter(res)
    full = [next(it) if differentiable(t) else None for t in ext + all_targets]
    return full[:len(ext)], dict(zip(all_targets, full[len(ext):]))


def _zeros_like_static(t: Tensor) -> Tensor:
    """Zeros shaped like a tensor that lives deeper than here (a variable read)."""
    from dcf.ops.array_ops import zeros

    shape = t.op.attrs.get("shape") if t.op.type == "ReadVariableOp" else t.shape
    if shape is None or any(d is None for d in shape):
        raise ValueError(
            f"gradients: cannot make the gradient accumulator of '{t.name}' inside a "
            "cond/while_loop: its shape is not known statically")
    return zeros(shape, dtype=t.dtype)


# ---------------------------------------------------------------------- while
def while_grad(state: GradState, w: WhileContext, inputs: list[Tensor],
               out_grads: list, need: list | None = None) -> tuple[list, dict]:
    """The gradient loop of `w`. `need[k]`: whether a gradient is wanted for inputs[k]
    (the loop's Enter inputs, then its constants' inputs); constants none is wanted for
    are not differentiated (loop variables always are: their gradients flow on to the
    others through the iterations). A constant or target that only the loop's
    predicate reads (a threshold, a Variable compared with the counter) gets None, as
    in TF1: its accumulator stays zero, but no gradient path leads to it."""
    g = state.graph
    if not w.back_prop:
        raise ValueError(f"gradients: while_loop '{w.frame_name}' was built with "
                         "back_prop=False; it cannot be differentiated")
    n_vars = len(w.enters)
    exits = [x.outputs[0] for x in w.exits]
    diff = [k for k in range(n_vars) if differentiable(exits[k])]
    consts = [ce for j, ce in enumerate(w.const_enters) if differentiable(ce.outputs[0])
              and (need is None or need[n_vars + j])]
    targets = _targets_inside(state, w)
    if not diff and not targets:
        return [None] * len(inputs), {}
    count, sync = forward_counter(w)
    d0 = [out_grads[k] if out_grads[k] is not None else _zeros_like(exits[k]) for k in diff]
    acc0 = [_zeros_like(ce.inputs[0]) for ce in consts]
    tacc0 = [_zeros_like_static(t) for t in targets]

    def factory(frame_name: str, pi: int, back_prop: bool, swap: bool, outer: Any):
        return GradWhileContext(frame_name, pi, back_prop, swap, outer, w, sync)

    # the body inputs of the other loop vars (a counter, a bool mask of finished rows)
    # end the body's walk: past them it would go on through the loop's Merge into the
    # body again, a cycle whose ops never get all their gradients, and an op before it
    # (logits that an argmax reads, say) would then never pass its gradient on
    state.stops.update(w.body_inputs[k].outputs[0] for k in range(n_vars) if k not in diff)
    # which constants and targets the body passes a gradient to (set when it is built)
    reached: dict[str, list[bool]] = {}

    def body(n: Tensor, dvs: list, accs: list, taccs: list) -> tuple:
        ys = [w.body_results[k] for k in diff]
        bins = [w.body_inputs[k].outputs[0] for k in diff]
        cins = [ce.outputs[0] for ce in consts]
        with _grad_classes(g):  # nested constructs inside get their own classes
            grads = vjp(state, ys, bins + cins + targets, list(dvs), level=w,
                        through=set(targets))
        gb = grads[:len(bins)]
        gc = grads[len(bins):len(bins) + len(cins)]
        gt = grads[len(bins) + len(cins):]
        reached["consts"] = [gv is not None for gv in gc]
        reached["targets"] = [gv is not None for gv in gt]
        new_dv = []
        for k, gv, b in zip(diff, gb, bins):
            with on_device(g, _home(w.enters[k])):
                new_dv.append(gv if gv is not None else _zeros_like(b))
        new_acc = []
        for ce, a, gv in zip(consts, accs, gc):
            with on_device(g, _home(ce)):       # accumulate where the constant lives
                new_acc.append(a + gv if gv is not None else a)
        new_tacc = []
        for t, a, gv in zip(targets, taccs, gt):
            with on_device(g, t.op.device):
                new_tacc.append(a + gv if gv is not None else a)
        here = g._ctx.while_ctx
        pushes = getattr(here, "extra_pushes", []) + \
            [x for inner in getattr(here, "pushing_loops", []) for x in inner.exits]
        if pushes:
            # second order: the next iteration waits until this one's pushes are done
            # (and those of the loops in it that push), so the loop that pops them
            # starts after every push
            from dcf.ops.registry import apply as _apply

            trig = _apply("ControlTrigger", [], name="grad_push_sync", control_inputs=pushes)
            with g.control_dependencies([trig]):
                return n - 1, new_dv, new_acc, new_tacc
        return n - 1, new_dv, new_acc, new_tacc

    after = [x for loop in state.stack_grad_loops.get(w, []) for x in loop.exits]
    # second order: a loop nested in this one pops extra gradients from one stack for
    # all its runs (loop_state.push_pop_grad): its runs must come one after another
    nested_pops = any(_inside(t, w) and t.op.ctx is not None and t.op.ctx.while_ctx is not w
                      for t in state.stack_grads)
    invariants = ((), [_grad_invariant(w, k, d) for k, d in zip(diff, d0)],
                  [a.shape for a in acc0], [a.shape for a in tacc0])
    with _grad_classes(g, while_cls=factory), g.control_dependencies(after):
        res = while_loop(lambda n, *_: n > 0, body, (count, d0, acc0, tacc0),
                         shape_invariants=invariants,
                         parallel_iterations=1 if nested_pops else w.parallel_iterations,
                         back_prop=True,
                         swap_memory=w.swap_memory, name=f"{w.frame_name}_grad",
                         _lenient_shapes=True)
    _, dv, acc, tacc = res
    # each gradient loop variable lives where its forward counterpart lives, whatever
    # device scope gradients() was called in (no per-iteration copies between devices)
    for k, gv in zip(diff, dv):
        _colocate_loop_var(gv, _home(w.enters[k]))
    for ce, gv in zip(consts, acc):
        _colocate_loop_var(gv, _home(ce))
    for t, gv in zip(targets, tacc):
        _colocate_loop_var(gv, t.op.device)
    in_grads: list = [None] * len(inputs)
    for k, gv in zip(diff, dv):
        in_grads[k] = gv
    for ce, gv, r in zip(consts, acc, reached["consts"]):
        in_grads[n_vars + w.const_enters.index(ce)] = gv if r else None
    return in_grads, {t: gv for t, gv, r in zip(targets, tacc, reached["targets"]) if r}


def _grad_invariant(w: WhileContext, k: int, d0: Tensor) -> tuple | None:
    """The static shape of the gradient of loop var k in every iteration: d0's (the
    gradient of its Exit, shaped like the last iteration's value) where the forward var's
    static shape says the dimension never changes, else unknown."""
    fwd = w.merges[k].outputs[0].shape
    if d0.shape is None or fwd is None or len(d0.shape) != len(fwd):
        return None
    return tuple(a if b is not None else None for a, b in zip(d0.shape, fwd))


def _home(enter: Operation) -> str:
    """The device a forward Enter names, else the one its input names ("" if none)."""
    return enter.device or (enter.inputs[0].op.device if enter.inputs else "")


def _colocate_loop_var(exit_value: Tensor, device: str) -> None:
    """Put the Enter/Merge/Switch/NextIteration/Exit chain (and the body's Identity) of
    the loop variable whose Exit gives `exit_value` on `device` ("" : unplaced, as its
    forward counterpart, not on the device scope gradients() was called in)."""
    if exit_value.op.type != "Exit":
        return
    exit_op = exit_value.op
    switch = exit_op.inputs[0].op
    merge = switch.inputs[0].op
    if switch.type != "Switch" or merge.type != "Merge":
        return
    chain = [exit_op, switch, merge] + [t.op for t in merge.inputs]
    chain += [c for c in switch.outputs[1].consumers() if c.type == "Identity"]
    for op in chain:
        if op.type in ("Enter", "Merge", "Switch", "Exit", "NextIteration", "Identity"):
            op.device = device
