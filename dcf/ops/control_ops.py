"""The control primitives (Switch, Merge, Enter, Exit, NextIteration, LoopCond) and the
plumbing ops (Identity, NoOp, Placeholder, StopGradient): types and shape rules only.

The executor runs the primitives itself (see CONTROL_RULES in executor.py); their
semantics are the paper's evaluation rules.
"""

from __future__ import annotations

from typing import Any

from dcf import dtypes, nest
from dcf.errors import InvalidArgumentError
from dcf.graph import Operation, Tensor, TensorType, as_shape, get_default_graph
from dcf.ops.registry import Kind, OpDef, apply, convert_to_tensor, not_differentiable, register

__all__ = ["identity", "stop_gradient", "no_op", "group", "placeholder"]


def _switch_infer(data: TensorType, pred: TensorType) -> list[TensorType]:
    if pred.dtype is not dtypes.bool_ or pred.shape not in (None, ()):
        raise TypeError(f"the predicate must be a scalar bool tensor, got {pred}")
    return [data, data]


def _merge_infer(*inputs: TensorType) -> list[TensorType]:
    first = inputs[0]
    shape = first.shape
    for t in inputs[1:]:
        if t.dtype is not first.dtype:
            raise TypeError(f"Merge inputs must share a dtype: {first} vs {t}")
        shape = _most_specific_common_shape(shape, t.shape)
    return [TensorType(first.dtype, shape), TensorType(dtypes.int32, ())]


def _most_specific_common_shape(a: tuple | None, b: tuple | None) -> tuple | None:
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if x == y else None for x, y in zip(a, b))


def _pass_infer(x: TensorType, **_: Any) -> TensorType:
    return x


def _loop_cond_infer(pred: TensorType) -> TensorType:
    if pred.dtype is not dtypes.bool_ or pred.shape not in (None, ()):
        raise TypeError(f"a while_loop condition must be a scalar bool tensor, got {pred}")
    return TensorType(dtypes.bool_, ())


def _identity(xp, x):
    return x


def _placeholder_kernel(xp, *, dtype, shape):
    raise InvalidArgumentError(
        f"you must feed a value for this placeholder ({dtype}"
        f"{list(shape) if shape is not None else '[?]'}) with feed_dict")


register(OpDef("Switch", infer=_switch_infer, kind=Kind.SWITCH))
register(OpDef("Merge", infer=_merge_infer, kind=Kind.MERGE))
register(OpDef("Enter", infer=_pass_infer, kind=Kind.ENTER))
register(OpDef("Exit", infer=_pass_infer, kind=Kind.EXIT))
register(OpDef("NextIteration", infer=_pass_infer, kind=Kind.NEXT_ITERATION))
register(OpDef("LoopCond", infer=_loop_cond_infer, kernel=_identity))
register(OpDef("Identity", infer=_pass_infer, kernel=_identity))
register(OpDef("StopGradient", infer=_pass_infer, kernel=_identity))
register(OpDef("NoOp", infer=lambda: [], kernel=lambda xp: ()))
register(OpDef("ControlTrigger", infer=lambda: [], kind=Kind.TRIGGER))
register(OpDef("Placeholder", infer=lambda *, dtype, shape:
               TensorType(dtype, shape), kernel=_placeholder_kernel))
not_differentiable("StopGradient", "LoopCond", "NoOp", "Placeholder", "ControlTrigger")


# ------------------------------------------------------------------ wrappers
def switch(data: Tensor, pred: Tensor, name: str | None = None) -> tuple[Tensor, Tensor]:
    """(output_false, output_true): `data` goes live to the output `pred` selects."""
    return apply("Switch", [data, pred], name=name or "Switch")


def merge(inputs: list[Tensor], name: str | None = None) -> tuple[Tensor, Tensor]:
    """(value, value_index) of the first live input."""
    return apply("Merge", list(inputs), name=name or "Merge")


def identity(x: Any, name: str | None = None) -> Tensor:
    """Returns a tensor with the same value as `x`."""
    return apply("Identity", [x], name=name or "Identity")


def stop_gradient(x: Any, name: str | None = None) -> Tensor:
    """Identity in the forward pass; gradients() treats it as a constant."""
    return apply("StopGradient", [x], name=name or "StopGradient")


def no_op(name: str | None = None) -> Operation:
    """An op that does nothing: useful as a target of control dependencies."""
    return apply("NoOp", [], name=name or "NoOp")


def group(*inputs: Any, name: str | None = None) -> Operation:
    """An op that runs after every op (or tensor's op) in `inputs`, which may be nested
    lists, tuples and dicts of them, has run."""
    ops: list[Operation] = []
    for y in nest.flatten(list(inputs)):
        if hasattr(y, "_as_control_op"):
            y = y._as_control_op()
        ops.append(y.op if isinstance(y, Tensor) else y)
    g = ops[0].graph if ops and isinstance(ops[0], Operation) else get_default_graph()
    with g.as_default(), g.control_dependencies(ops):
        return no_op(name=name or "group")


def placeholder(dtype: Any, shape: Any = None, name: str | None = None) -> Tensor:
    """A tensor whose value must be given in `feed_dict` when the graph runs."""
    dt = dtypes.as_dtype(dtype)
    shp = as_shape(shape, f"Placeholder '{name or 'Placeholder'}'")
    return apply("Placeholder", [], name=name or "Placeholder", dtype=dt, shape=shp)


def as_tensor_list(xs: Any) -> list[Tensor]:
    return [convert_to_tensor(x) for x in xs]
