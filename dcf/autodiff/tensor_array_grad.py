"""Gradient TensorArrays: the gradient of a read is a write into the array's gradient
array (several reads of one index add up), of a write a read from it; stack and
unstack, gather and scatter are each other's gradients."""

from __future__ import annotations

from typing import Any

from dcf import dtypes
from dcf.autodiff.gradients import active_state
from dcf.ops.registry import RegisterGradient, apply


def _grad_array(op: Any, flow: Any) -> tuple:
    handle = op.inputs[0]
    return apply("TensorArrayGradV3", [handle, flow], name="ta_grad",
                 source=active_state().source)


def _elem_attrs(op: Any) -> dict:
    return {"dtype": op.attrs.get("dtype", op.inputs[-2].dtype if len(op.inputs) > 2 else None),
            "element_shape": op.attrs.get("element_shape")}


def _refuse_second_order_in_loop(op: Any) -> None:
    """A read of a *gradient* TensorArray inside a loop is part of a backward loop;
    differentiating it again (second order through a loop that writes a TensorArray)
    gave wrong values (found against finite differences), so it is refused instead."""
    if op.frame_ctx is None:
        return
    from dcf.placement import _resource_root

    if _resource_root(op.inputs[0].op).type == "TensorArrayGradV3":
        raise NotImplementedError(
            f"gradients: {op.type} '{op.name}' reads a gradient TensorArray inside a loop; "
            "second-order gradients through a while_loop that writes a TensorArray "
            "(e.g. dynamic_rnn's outputs) are not supported. Second order through loops "
            "that only read TensorArrays, or write none, and through static_rnn, is.")


@RegisterGradient("TensorArrayReadV3")
def _read_grad(op: Any, g: Any) -> list:
    _refuse_second_order_in_loop(op)
    handle, index, flow = op.inputs
    gh, gflow = _grad_array(op, flow)
    w = apply("TensorArrayWriteAccumulate", [gh, index, g, gflow], name="ta_grad_write")
    return [None, None, w]


@RegisterGradient("TensorArrayWriteV3")
def _write_grad(op: Any, gflow_out: Any) -> list:
    handle, index, value, flow = op.inputs
    gh, gflow = _grad_array(op, gflow_out)
    v = apply("TensorArrayReadV3", [gh, index, gflow], name="ta_grad_read",
              dtype=value.dtype, element_shape=value.shape)
    return [None, None, v, gflow_out]


@RegisterGradient("TensorArrayStack")
def _stack_grad(op: Any, g: Any) -> list:
    handle, flow = op.inputs
    gh, gflow = _grad_array(op, flow)
    from dcf.ops.math_ops import range as range_

    n = apply("TensorArraySizeV3", [handle, flow], name="ta_size")
    idx = range_(n)
    f = apply("TensorArrayScatterAccumulate", [gh, idx, g, gflow], name="ta_grad_unstack")
    return [None, f]


@RegisterGradient("TensorArrayGatherV3")
def _gather_grad(op: Any, g: Any) -> list:
    handle, indices, flow = op.inputs
    gh, gflow = _grad_array(op, flow)
    f = apply("TensorArrayScatterAccumulate", [gh, indices, g, gflow], name="ta_grad_scatter")
    return [None, None, f]


@RegisterGradient("TensorArrayUnstack")
def _unstack_grad(op: Any, gflow_out: Any) -> list:
    handle, value, flow = op.inputs
    gh, gflow = _grad_array(op, gflow_out)
    v = apply("TensorArrayStack", [gh, gflow], name="ta_grad_stack", dtype=value.dtype,
              element_shape=None if value.shape is None else tuple(value.shape[1:]))
    return [None, v, gflow_out]


@RegisterGradient("TensorArrayScatterV3")
def _scatter_grad(op: Any, gflow_out: Any) -> list:
    handle, indices, value, flow = op.inputs
    gh, gflow = _grad_array(op, gflow_out)
    v = apply("TensorArrayGatherV3", [gh, indices, gflow], name="ta_grad_gather",
              dtype=value.dtype,
              element_shape=None if value.shape is None else tuple(value.shape[1:]))
    return [None, None, v, gflow_out]


RegisterGradient("TensorArrayWriteAccumulate")(lambda op, g: [None, None, None, g])
RegisterGradient("TensorArrayScatterAccumulate")(lambda op, g: [None, None, None, g])
_ = dtypes
