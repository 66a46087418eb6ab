"""One compiled program over several devices of this process.

When every device of a run lives in this process (CPU devices and local GPUs), the
partitioned form of the run -- one actor per device, Send/Recv through the rendezvous,
a control-loop state machine per device and frame -- is one legal way to run it, not
the only one. Here the whole placed graph becomes one plan instead: every node keeps
its device (its kernel is bound to that device's resources: its variables, its GPU
and streams), and every edge that crosses devices gets a transfer node in the frame of
the value it moves:

- to a GPU: `import_value` (host arrays staged in pinned memory and copied on the h2d
  stream; another GPU's array copied peer to peer after that GPU's compute event);
- to a CPU from a GPU: a device-to-host copy on the d2h stream; the generated code
  yields until the copy's event has completed (the host looks at the value, so it must
  wait, but it never blocks the event loop);
- a loop constant (`Enter(is_constant)`) read on another device is moved once per
  frame instance, before the loop, by a copy of the Enter on the reading device.

The plan compiles (dcf/frame_compiler.py) into one generated function, so a step needs
no messages and no executor. GPU kernels are enqueued on each device's compute
stream; since the host only enqueues, iteration t+1's kernels on GPU 0 run while GPU 1
still computes iteration t. `parallel_iterations` bounds how many iterations' GPU work
may be in flight (the compiled loop waits for the events of iteration
t - parallel_iterations before it enqueues more), which is the paper's meaning of the
knob for asynchronous devices.

A fetched device value made by an op that always writes a new array (a reduction, an
elementwise op, a product: FRESH_OUTPUT_OPS) is copied to the host where the compiled
code makes it, on the d2h stream after an event there, and the generated code emits it
as early as its inputs allow. So a run that fetches its loss returns once the host has
enqueued the whole step and that copy is done, without waiting for the GPUs to finish
the rest (the backward loop's tail, the weight updates); the next run's kernels queue
behind them on the same streams, and its host work overlaps them (JAX's asynchronous
dispatch does the same). Other fetched values (a variable's read, a view, a loop's
result) are copied after the whole step, as before: a later op of the step may still
write them in place.

A run uses this form when it is not traced and `SessionConfig(compile_frames=True,
fuse_devices=True)`; otherwise, or when the graph does not compile (a waiting op such
as a queue dequeue, a frame shape the compiler refuses), it runs partitioned.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from dcf.actors.device_actor import DeviceActor
from dcf.actors.gpu import GpuDevice
from dcf.actors.gpu_actor import end_fetches, fetch_results, start_fetches, transfer_oom
from dcf.device import DeviceSpec
from dcf.executor import Executor
from dcf.fusion.matmul_gates import x_concat
from dcf.graph import Operation, Tensor
from dcf.ops.registry import Kind
from dcf.partition import _value_frame
from dcf.plan import TRANSFER, ExecPlan, PNode, build_plan, nodes_from_ops

__all__ = ["build_fused", "FusedActor", "FUSED"]

FUSED = "<fused>"    # the actor key of a session's fused plans


# Ops whose output is always a new array (never an input, a view of one, or a variable's
# buffer), so that its copy to the host may start where it is made (see above), in every
# plan with GPU nodes (read when the plan compiles). Off: every fetch is copied after the
# step (`python -m bench.probes.switch_ab
# dcf.fused:EARLY_FETCH ...` compares the two in one process).
EARLY_FETCH = True
FRESH_OUTPUT_OPS = frozenset({
    "Sum", "Mean", "Max", "Min", "Prod", "ArgMax", "ArgMin",
    "Add", "Sub", "Mul", "RealDiv", "FloorDiv", "FloorMod", "Pow", "Maximum", "Minimum",
    "Abs", "Neg", "Sign", "Square", "Sqrt", "Rsqrt", "Exp", "Log", "Log1p", "Sin", "Cos",
    "Tanh", "Sigmoid", "Relu", "Softplus",
    "Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual",
    "MatMul", "BatchMatMulV2", "Softmax", "LogSoftmax",
    "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits",
})


def _gpu_index(dev: str) -> int | None:
    spec = DeviceSpec.parse(dev)
    return (spec.index or 0) if spec.device_type == "gpu" else None


def build_fused(ops: list[Operation], device_of: dict[Operation, str],
                fetches: list[tuple[Operation, int]], feeds: list[Tensor],
                resources_of: Callable[[str], Any]) -> ExecPlan | None:
    """One plan for all of `ops` on their devices, compiled into one function; None when
    the compiler cannot take the whole graph (the run stays partitioned)."""
    from dcf.frame_compiler import compile_frames

    pn = nodes_from_ops(ops)
    for op, p in pn.items():
        p.device = device_of[op]
    feed_nodes: list[PNode] = []
    feed_of: dict[Tensor, PNode] = {}
    for k, t in enumerate(feeds):
        fnode = PNode(f"_feed/{t.name}", "_Feed", Kind.KERNEL, "", n_out=1,
                      attrs={"feed": k}, device="/cpu:0")
        feed_nodes.append(fnode)
        feed_of[t] = fnode
    for op, p in pn.items():
        for k, t in enumerate(op.inputs):
            if t in feed_of:
                p.inputs[k] = (feed_of[t], 0)

    extra: list[PNode] = []
    moved: dict[tuple, tuple[PNode, int]] = {}

    def move(src: PNode, idx: int, dst_dev: str) -> tuple[PNode, int]:
        """(src, idx) as a value on `dst_dev`: itself or a transfer node's output."""
        s_gpu, d_gpu = _gpu_index(src.device), _gpu_index(dst_dev)
        if s_gpu == d_gpu:          # same GPU, or host memory on both sides
            return (src, idx)
        key = (id(src), idx, d_gpu)
        hit = moved.get(key)
        if hit is not None:
            return hit
        if src.kind == Kind.ENTER and src.attrs.get("is_constant") and src.inputs[0]:
            # a loop constant: move it once, before the loop, and enter the copy
            inner = move(src.inputs[0][0], src.inputs[0][1], dst_dev)
            out = PNode(f"{src.name}/on{dst_dev}", "Enter", Kind.ENTER, src.frame,
                        inputs=[inner], control=list(src.control), attrs=src.attrs,
                        n_out=1, op=src.op, device=dst_dev)
        elif d_gpu is not None:
            gpu = GpuDevice.get(d_gpu)
            out = PNode(f"_xfer/{src.name}:{idx}->{dst_dev}", TRANSFER, Kind.KERNEL,
                        _value_frame(src), inputs=[(src, idx)],
                        attrs={"_bound": _ToDevice(gpu, f"{src.name}:{idx}")},
                        device=dst_dev)
        else:
            out = PNode(f"_xfer/{src.name}:{idx}->{dst_dev}", "_ToHost", Kind.KERNEL,
                        _value_frame(src), inputs=[(src, idx)],
                        attrs={"_bound": _to_host_fn(f"{src.name}:{idx}")}, device=dst_dev)
        extra.append(out)
        moved[key] = (out, 0)
        return (out, 0)

    for p in list(pn.values()):
        for k, inp in enumerate(p.inputs):
            if inp is not None:
                p.inputs[k] = move(inp[0], inp[1], p.device)
    nodes = list(pn.values()) + extra   # feed nodes stand for the fed values only
    plan = build_plan(nodes, [(f, 0) for f in feed_nodes],
                      [(pn[op], idx) for op, idx in fetches], xp=np,
                      resources_of=resources_of)
    gpus: dict[int, Any] = {}
    for n in plan.nodes:
        g = _gpu_index(n.pnode.device)
        if g is not None:
            if g not in gpus:
                gpus[g] = GpuDevice.get(g)
            plan.gpu_of[n.id] = gpus[g]
    for n in plan.nodes:
        fn = n.pnode.attrs.get("_bound")
        if type(fn) is _ToDevice and n.pnode.inputs and \
                _gpu_index(n.pnode.inputs[0][0].device) is not None:
            fn.x_concat = x_concat(n, plan.gpu_of, out=0)
    compile_frames(plan)
    return plan if plan.compiled_root is not None else None


class _ToDevice:
    """A transfer node's callable: the value in the form kernels on `gpu` take. From
    another GPU, where the value is the first part of a concatenation `[x, h]` on `gpu`
    (the key `x_concat`, set once the plan is built: matmul_gates.x_concat), it is
    written straight into that concatenation's buffer where the layer's gates have
    offered one (GpuDevice.import_into_offer): the layer above a device boundary of a
    model-parallel LSTM then copies as little as the layers above a layer on its own
    GPU."""

    __slots__ = ("gpu", "what", "x_concat")

    def __init__(self, gpu: Any, what: str) -> None:
        self.gpu, self.what = gpu, what
        self.x_concat = -1

    def __call__(self, v: Any) -> Any:
        if self.x_concat >= 0:
            return self.gpu.import_into_offer(v, self.x_concat, self.what)
        return self.gpu.import_value(v, self.what)


def _to_host_fn(what: str) -> Callable[[Any], tuple]:
    """Start moving a GPU array to the host: (pinned host array, event), or (value, None)
    for a value that is already on the host."""
    def to_host(v: Any) -> tuple:
        dev = getattr(v, "device", None)
        if dev is None or not hasattr(v, "__cuda_array_interface__"):
            return v, None
        return GpuDevice.get(dev.id).to_host_async(v, what)
    return to_host


def _transfer_text(e: MemoryError) -> str:
    # several GPUs: no one device's memory to describe
    return f"out of GPU memory in a transfer: {e}"


class FusedActor(DeviceActor):
    """Runs a session's fused plans: the GPUs' per-run settings before, fetched device
    arrays to the host after."""

    def __init__(self, gpu_actors: list) -> None:
        super().__init__(FUSED)
        self.gpu_actors = gpu_actors
        self.host_waits = (0, 0.0)

    def begin(self) -> None:
        """Prepare every GPU; where one fails, the ones prepared before it are finished
        (their step counts and settings as before the run) and the error goes on."""
        done = []
        try:
            for a in self.gpu_actors:
                a.prepare()
                done.append(a)
        except BaseException:
            for a in done:
                a.finish()
            raise

    def end(self) -> None:
        for a in self.gpu_actors:
            a.finish()

    def _collect(self) -> None:
        for a in self.gpu_actors:
            a.gpu.collect()
            a.gpu.drop_landing()

    async def run_step(self, plan: ExecPlan, feeds: list, step: Any, rendezvous: Any,
                       **kw: Any) -> Executor:
        self.begin()
        try:
            with transfer_oom(_transfer_text):
                ex = await super().run_step(plan, feeds, step, rendezvous, **kw)
            await fetch_results(ex.results)
            self._collect()
            return ex
        finally:
            self.end()

    def run_sync(self, plan: ExecPlan, feeds: list, check: Callable[[], None]) -> list:
        """The same step with no event loop: `check()` runs whenever the code yields
        (the deadline); a yielded GPU event is waited for in the driver's thread."""
        self.begin()
        try:
            return self._run_sync(plan, feeds, check)
        finally:
            self.end()

    def _run_sync(self, plan: ExecPlan, feeds: list, check: Callable[[], None]) -> list:
        gen = plan.compiled_root.start(feeds)
        waited, n_waits, clock = 0.0, 0, time.perf_counter
        try:
            with transfer_oom(_transfer_text):
                try:
                    while True:
                        ev = next(gen)
                        if ev is not None:
                            t0 = clock()
                            ev.synchronize()
                            waited += clock() - t0
                            n_waits += 1
                        check()
                except StopIteration as stop:
                    results = list(stop.value)
        finally:
            gen.close()
            self.host_waits = (n_waits, waited)   # GPU events the host waited for, seconds
        pending = start_fetches(results)
        for _, _, ev, _ in pending:
            ev.synchronize()
        end_fetches(results, pending)
        self._collect()
        return results
