"""Assign every op of a pruned graph to a device.

Rules: an explicit device scope wins; the ops of one loop variable's chain
(Enter/Merge/Switch/NextIteration/Exit) stay with their Enter; an op that consumes a
resource handle (variable, TensorArray, stack) runs where the handle was made; host-only
ops (py_func, print) run on the CPU of their task; anything else unplaced goes to the
default device.
"""

from __future__ import annotations

from typing import Callable

from dcf import dtypes
from dcf.device import DeviceSpec
from dcf.errors import InvalidArgumentError
from dcf.graph import Operation
from dcf.ops.registry import OPS

__all__ = ["place"]

_CHAIN = ("Merge", "Switch", "Exit", "NextIteration")


def place(ops: list[Operation], default_device: str,
          exists: Callable[[str], bool]) -> dict[Operation, str]:
    """Map each op to a canonical device string; raise for devices that don't exist."""
    default = DeviceSpec.parse(default_device)
    dev: dict[Operation, str] = {}

    def resolve(op: Operation) -> str:
        spec = DeviceSpec.parse(op.device).merged_over(default)
        if spec.device_type is None:
            spec = DeviceSpec(spec.job, spec.task, "cpu", 0)
        d = OPS.get(op.type)
        if d is not None and d.host_only and spec.device_type != "cpu":
            spec = DeviceSpec(spec.job, spec.task, "cpu", 0)
        return spec.to_string()

    for op in ops:
        dev[op] = resolve(op)
    # Ops that consume a resource handle follow the handle's producer.
    for op in ops:
        for t in op.inputs:
            if t.dtype is dtypes.resource and t.op in dev and not op.device:
                src = t.op
                while src.type in ("Enter", "Identity", "Switch", "Merge") and src.inputs \
                        and src.inputs[0].dtype is dtypes.resource:
                    src = src.inputs[0].op
                if src in dev:
                    dev[op] = dev[src]
    # A loop variable's chain stays on its Enter's device (colocation, as TF does).
    for op in ops:
        if op.type in ("Merge",) and op.frame_ctx is not None and \
                any(t.op.type == "Enter" for t in op.inputs):
            enter = next(t.op for t in op.inputs if t.op.type == "Enter")
            if enter in dev:
                _colocate_chain(op, dev[enter], dev)
    for op in ops:
        if not exists(dev[op]):
            raise InvalidArgumentError(
                f"{op.type} '{op.name}' is placed on {dev[op]}, which does not exist in this "
                "session" + (" (no GPU is visible)" if "gpu" in dev[op] else ""))
    return dev


def _colocate_chain(merge: Operation, device: str, dev: dict[Operation, str]) -> None:
    dev[merge] = device
    for t in merge.inputs:
        if t.op.type == "NextIteration" and t.op in dev:
            dev[t.op] = device
    for c in merge.outputs[0].consumers():
        if c.type == "Switch" and c in dev:
            dev[c] = device
            for c2 in c.outputs[0].consumers():
                if c2.type == "Exit" and c2 in dev:
                    dev[c2] = device
