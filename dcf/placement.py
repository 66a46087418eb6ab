"""Assign every op of a pruned graph to a device.

Rules, applied until nothing changes:
- an explicit device scope wins, except where a resource must stay put (below);
- a loop variable's Enter that no scope placed goes where its initial value is, and the
  rest of its chain (Merge/Switch/NextIteration/Exit, and the body's Identity of the
  Switch when unplaced) stays with the Enter, as TF colocates them; an unplaced LoopCond
  goes with its predicate;
- an op that consumes a resource handle (variable, TensorArray, stack, queue) runs where
  the handle was made, following Enter/Identity/Switch/Merge chains back to it; a stack
  goes where the value its push saves is computed;
- host-only ops (py_func, print) run on the CPU of their task; anything else unplaced
  goes to the default device.
With `process_of`, a resource edge that still joins two processes is an error: handles
are Python objects of one process and never travel.
"""

from __future__ import annotations

from collections.abc import Callable

from dcf import dtypes, gpu_devices
from dcf.device import DeviceSpec
from dcf.errors import InvalidArgumentError
from dcf.graph import Operation
from dcf.ops.registry import OPS

__all__ = ["place"]

_CHAIN = ("Merge", "Switch", "Exit", "NextIteration")
# Ops that pass a resource handle through unchanged (a handle's "chain").
_PASS = ("Enter", "Identity", "Switch", "Merge", "Exit", "NextIteration", "RefEnter")
_MAX_PASSES = 32


def place(ops: list[Operation], default_device: str, exists: Callable[[str], bool],
          process_of: Callable[[str], str] | None = None) -> dict[Operation, str]:
    """Map each op to a canonical device string; raise for devices that don't exist.

    process_of: device -> the process holding it; when given, a resource handle that
    would cross processes raises InvalidArgumentError naming the op.
    """
    default = DeviceSpec.parse(default_device)
    dev: dict[Operation, str] = {}

    def resolve(op: Operation) -> str:
        spec = _this_process(DeviceSpec.parse(op.device).merged_over(default))
        if spec.device_type is None:
            spec = DeviceSpec(spec.job, spec.task, "cpu", 0)
        d = OPS.get(op.type)
        if d is not None and d.host_only and spec.device_type != "cpu":
            spec = DeviceSpec(spec.job, spec.task, "cpu", 0)
        return spec.to_string()

    for op in ops:
        dev[op] = resolve(op)
    for _ in range(_MAX_PASSES):
        if not _apply_rules(ops, dev):
            break
    for op in ops:
        if not exists(dev[op]) or _names_another_local_task(dev[op]):
            raise InvalidArgumentError(
                f"{op.type} '{op.name}' is placed on {dev[op]}, which does not exist in this "
                "session" + _gpus_seen(dev[op]) + _tasks_seen(dev[op]) +
                _workers_seen(dev[op], process_of is not None))
    if process_of is not None:
        _check_resource_edges(ops, dev, process_of)
    return dev


def _this_process(spec: DeviceSpec) -> DeviceSpec:
    """TF's full name of this process's devices ("/job:localhost/replica:0/task:0/...",
    or "/task:0/...") as the short one, and a job's devices with their task (task 0 where
    the spec names none), so that every spelling names one device (one actor, no copies)."""
    if spec.job in (None, "localhost") and spec.task in (None, 0):
        return DeviceSpec(None, None, spec.device_type, spec.index)
    if spec.task is None:
        return DeviceSpec(spec.job, 0, spec.device_type, spec.index)
    return spec


def _names_another_local_task(device: str) -> bool:
    """A task other than 0 of this process's job: this process is task 0 of job
    localhost, and a task without a job names no worker."""
    spec = DeviceSpec.parse(device)
    return spec.job in (None, "localhost") and spec.task not in (None, 0)


def _tasks_seen(device: str) -> str:
    """What a task without a job (or of job localhost) adds: where its ops can go."""
    spec = DeviceSpec.parse(device)
    if not _names_another_local_task(device):
        return ""
    return (f" (this process is task 0 of job localhost; a worker's devices are named with "
            f"their job, as /job:worker/task:{spec.task}/{spec.device_type}:{spec.index})")


def _workers_seen(device: str, cluster: bool) -> str:
    """What a worker's missing device adds: that a plain session has no workers, or that
    a worker has one CPU device."""
    spec = DeviceSpec.parse(device)
    if spec.job in (None, "localhost"):
        return ""
    if not cluster:
        return " (this session has no cluster: workers' devices, /job:worker/task:K/..., " \
            "are in a dcf.Session(cluster=...))"
    if spec.device_type == "cpu" and spec.index != 0:
        return f" (a worker has one CPU device, /job:{spec.job}/task:{spec.task}/cpu:0)"
    return ""


def _gpus_seen(device: str) -> str:
    """What a missing GPU's error adds: the GPUs this process has."""
    spec = DeviceSpec.parse(device)
    if spec.device_type != "gpu" or spec.job is not None:
        return ""
    n = gpu_devices.count()
    if n == 0:
        return f" (no GPU is visible{gpu_devices.why_none()})"
    return " (this process has 1 GPU: /gpu:0)" if n == 1 else \
        f" (this process has {n} GPUs: /gpu:0 to /gpu:{n - 1})"


def _apply_rules(ops: list[Operation], dev: dict[Operation, str]) -> bool:
    """One pass of the colocation rules; True when some op moved."""
    changed = False

    def put(op: Operation, d: str) -> None:
        nonlocal changed
        if op in dev and dev[op] != d:
            dev[op] = d
            changed = True

    for op in ops:
        t = op.type
        if t == "Enter" and not op.device and not op.attrs.get("is_constant") and \
                op.inputs and op.inputs[0].op in dev or t == "LoopCond" and not op.device and op.inputs and op.inputs[0].op in dev:
            put(op, dev[op.inputs[0].op])
        elif t == "Merge" and op.frame_ctx is not None:
            enter = next((i.op for i in op.inputs if i.op.type == "Enter"), None)
            if enter is not None and enter in dev:
                _colocate_chain(op, dev[enter], put)
        elif t == "StackV2":
            v = _pushed_value_op(op)
            if v is not None and v in dev:
                put(op, dev[v])
    # Resource consumers follow the handle's maker (after the moves above).
    for op in ops:
        for t_in in op.inputs:
            if t_in.dtype is dtypes.resource and t_in.op in dev:
                root = _resource_root(t_in.op)
                if root in dev:
                    put(op, dev[root])
    return changed


def _resource_root(op: Operation) -> Operation:
    """The op that made the handle `op` passes on (itself if it makes one)."""
    seen = 0
    while op.type in _PASS and op.inputs and op.inputs[0].dtype is dtypes.resource \
            and seen < 10_000:
        op = op.inputs[0].op
        seen += 1
    return op


def _pushed_value_op(stack: Operation) -> Operation | None:
    """The producer of the value the first StackPushV2 on `stack` saves."""
    todo = [stack.outputs[0]]
    seen: set = set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        for c in t.consumers():
            if c.type == "StackPushV2" and c.inputs[0] is t:
                return c.inputs[1].op
            if c.type in _PASS and c.inputs and c.inputs[0] is t:
                todo.extend(o for o in c.outputs if o.dtype is dtypes.resource)
    return None


def _colocate_chain(merge: Operation, device: str, put: Callable[[Operation, str], None]
                    ) -> None:
    put(merge, device)
    for t in merge.inputs:
        if t.op.type == "NextIteration":
            put(t.op, device)
    for c in merge.outputs[0].consumers():
        if c.type == "Switch" and c.inputs[0] is merge.outputs[0]:
            put(c, device)
            for c2 in c.outputs[0].consumers():
                if c2.type == "Exit":
                    put(c2, device)
            for c2 in c.outputs[1].consumers():
                if c2.type == "Identity" and not c2.device:
                    put(c2, device)


def _check_resource_edges(ops: list[Operation], dev: dict[Operation, str],
                          process_of: Callable[[str], str]) -> None:
    for op in ops:
        for t in op.inputs:
            if t.dtype is dtypes.resource and t.op in dev and \
                    process_of(dev[t.op]) != process_of(dev[op]):
                raise InvalidArgumentError(
                    f"{op.type} '{op.name}' on {dev[op]} uses the resource handle '{t.name}' "
                    f"made on {dev[t.op]}, which is in another process. Variables, "
                    "TensorArrays, stacks and queues live in one process and their handles "
                    "cannot be sent; place the op and the resource on the same task "
                    "(dcf.device)")
