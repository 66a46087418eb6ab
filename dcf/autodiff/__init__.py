"""Automatic differentiation through control flow (paper section 5)."""

from dcf.autodiff.gradients import gradients  # noqa: F401
from dcf.autodiff import control_flow_grad, tensor_array_grad  # noqa: F401  (registers grads)
from dcf.ops.registry import RegisterGradient  # noqa: F401
