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


def _grad_array_after(op: Any, gflow_out: Any) -> tuple:
    """The gradient array of a write-like op (write, unstack, scatter, split), made after
    that op ran: TF's write barrier. Its gradient flow alone would not wait for it, nor
    keep it in the run where only a dead read follows it (the gradient array then had
    no element shape, and its unwritten elements were not read as zeros)."""
    from dcf.ops.control_ops import stop_gradient

    barrier = apply("TensorArrayFlowJoin", [gflow_out, stop_gradient(op.outputs[0])],
                    name="write_barrier")
    return _grad_array(op, barrier)


def _elem_attrs(op: Any) -> dict:
    return {"dtype": op.attrs.get("dtype", op.inputs[-2].dtype if len(op.inputs) > 2 else None),
            "element_shape": op.attrs.get("element_shape")}


@RegisterGradient("TensorArrayReadV3")
def _read_grad(op: Any, g: Any) -> list:
    handle, index, flow = op.inputs
    gh, gflow = _grad_array(op, flow)
    w = apply("TensorArrayWriteAccumulate", [gh, index, g, gflow], name="ta_grad_write")
    return [None, None, w]


@RegisterGradient("TensorArrayWriteV3")
def _write_grad(op: Any, gflow_out: Any) -> list:
    handle, index, value, flow = op.inputs
    # (no write barrier: a write usually sits in a loop, where waiting for its flow
    # would push that flow every iteration; the unstack, scatter or split that made the
    # array, outside the loop, has one)
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
    """The gradient array's first len(value) elements, stacked (TF's gather: the array
    may have more elements than value has rows)."""
    handle, value, flow = op.inputs
    gh, gflow = _grad_array_after(op, gflow_out)
    from dcf.ops.array_ops import shape
    from dcf.ops.math_ops import range as range_

    rows = value.shape[0] if value.shape is not None and value.shape[0] is not None else \
        shape(value)[0]
    v = apply("TensorArrayGatherV3", [gh, range_(rows), gflow], name="ta_grad_stack",
              dtype=value.dtype,
              element_shape=None if value.shape is None else tuple(value.shape[1:]))
    return [None, _shaped_like(v, value), gflow_out]


def _shaped_like(v: Any, value: Any) -> Any:
    """v reshaped to value's run-time shape where value's element shape is not static:
    a gather of no elements cannot know it (a [0, 0, d] for a [0, batch, d] value)."""
    from dcf.ops.array_ops import reshape, shape

    if value.shape is not None and all(d is not None for d in value.shape[1:]):
        return v
    return reshape(v, shape(value))


@RegisterGradient("TensorArrayScatterV3")
def _scatter_grad(op: Any, gflow_out: Any) -> list:
    handle, indices, value, flow = op.inputs
    gh, gflow = _grad_array_after(op, gflow_out)
    v = apply("TensorArrayGatherV3", [gh, indices, gflow], name="ta_grad_gather",
              dtype=value.dtype,
              element_shape=None if value.shape is None else tuple(value.shape[1:]))
    return [None, None, _shaped_like(v, value), gflow_out]


@RegisterGradient("TensorArrayConcatV3")
def _concat_grad(op: Any, g: Any, g_lengths: Any = None) -> list:
    """The gradient array's split of g by the forward elements' lengths (TF)."""
    handle, flow = op.inputs
    if g is None:
        return [None, None]
    gh, gflow = _grad_array(op, flow)
    f = apply("TensorArraySplitAccumulate", [gh, g, op.outputs[1], gflow],
              name="ta_grad_split")
    return [None, f]


@RegisterGradient("TensorArraySplitV3")
def _split_grad(op: Any, gflow_out: Any) -> list:
    handle, value, lengths, flow = op.inputs
    gh, gflow = _grad_array_after(op, gflow_out)
    v = apply("TensorArrayConcatV3", [gh, gflow], name="ta_grad_concat", dtype=value.dtype,
              element_shape=None if value.shape is None else (None,) + tuple(value.shape[1:]))
    return [None, v[0], None, gflow_out]


# Second order. A gradient array is filled from values (d loss / d stack, ...) that
# themselves depend on the variables, so the ops that make and fill it differentiate
# too: its flow passes through TensorArrayGradV3, and the accumulating writes and
# scatters differentiate like the plain ones (the value's gradient is read back from
# this gradient array's own gradient array).
RegisterGradient("TensorArrayFlowJoin")(lambda op, g: [g] * len(op.inputs))
RegisterGradient("TensorArrayGradV3")(lambda op, g_handle, g_flow: [None, g_flow])
RegisterGradient("TensorArrayWriteAccumulate")(_write_grad)
RegisterGradient("TensorArrayScatterAccumulate")(_scatter_grad)
RegisterGradient("TensorArraySplitAccumulate")(_split_grad)
_ = dtypes
