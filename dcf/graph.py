"""Graph, Operation, Tensor and the scopes that shape how ops are built.

A Graph only grows: ops are appended, and nothing rewrites an existing op except the
one re-pointing of a loop Merge's back edge that while_loop lowering does while the
loop is being built.
"""

from __future__ import annotations

import contextlib
import operator
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from dcf import device as device_lib
from dcf.dtypes import DType

Shape = tuple  # tuple[int | None, ...]; None for an unknown rank


@dataclass(frozen=True, slots=True)
class TensorType:
    """Static type of a tensor: dtype and (possibly partial) shape."""

    dtype: DType
    shape: Shape | None

    def __str__(self) -> str:
        return f"{self.dtype}{shape_str(self.shape)}"

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)


def shape_str(shape: Shape | None) -> str:
    """`[?,3]` for a partly known shape; an unknown rank is not `[?]` (a vector's)."""
    if shape is None:
        return "[unknown rank]"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def as_shape(shape: Any, what: str) -> Shape | None:
    """The static shape a user gives (a placeholder's, an element shape): None for an
    unknown rank, a sequence of dimensions (None or -1 for an unknown one), or an int for
    a vector of that length (TF1's TensorShape(3)). `what` names the op in errors."""
    if shape is None:
        return None
    one = hasattr(shape, "__index__") and getattr(shape, "ndim", 0) == 0   # (numpy's too)
    dims = [shape] if one else list(shape)
    out = []
    for d in dims:
        if d is None:
            out.append(None)
            continue
        try:
            d = operator.index(d)
        except TypeError:
            raise TypeError(f"{what}: shape {shape!r} has a dimension {d!r} that is not an "
                            "int (None or -1 is an unknown one)") from None
        if d < -1:
            raise ValueError(f"{what}: shape {dims} has a negative dimension (None or -1 is "
                             "an unknown one)")
        out.append(None if d == -1 else d)
    return tuple(out)


def shapes_compatible(a: Shape | None, b: Shape | None) -> bool:
    """Whether static shapes a and b may be one shape: None is an unknown rank, a None
    dimension an unknown size."""
    if a is None or b is None:
        return True
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


class Tensor:
    """Symbolic value: output `index` of `op`. Equality and hash are identity."""

    __slots__ = ("op", "index", "type", "__weakref__")
    __array_ufunc__ = None  # numpy defers to our reflected operators

    def __init__(self, op: Operation, index: int, ttype: TensorType) -> None:
        self.op = op
        self.index = index
        self.type = ttype

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self) -> Shape | None:
        return self.type.shape

    @property
    def name(self) -> str:
        return f"{self.op.name}:{self.index}"

    @property
    def graph(self) -> Graph:
        return self.op.graph

    @property
    def device(self) -> str:
        return self.op.device

    @property
    def ctx(self) -> ControlFlowContext | None:
        return self.op.ctx

    def consumers(self) -> list[Operation]:
        return [op for op in self.op.graph._consumers.get(self, ())]

    def get_shape(self) -> Shape | None:
        return self.type.shape

    def _refine_shape(self, shape: Shape | None) -> None:
        """Merge a more specific static shape into this tensor's (TF's set_shape), for a
        builder that knows more than its op's inference: a stacked TensorArray of known
        size, a map_fn over elems of known length. An incompatible shape is a bug there."""
        cur = self.type.shape
        if shape is None:
            return
        shape = tuple(shape)
        if cur is None:
            self.type = TensorType(self.type.dtype, shape)
            return
        if len(cur) != len(shape) or any(a is not None and b is not None and a != b
                                         for a, b in zip(cur, shape)):
            raise ValueError(f"{self.op.type} '{self.op.name}': static shape {shape_str(cur)} "
                             f"is not compatible with {shape_str(shape)}")
        self.type = TensorType(self.type.dtype,
                               tuple(a if a is not None else b for a, b in zip(cur, shape)))

    def __repr__(self) -> str:
        return f"<dcf.Tensor '{self.name}' {self.type}>"

    def __bool__(self) -> bool:
        raise TypeError(
            f"using the tensor '{self.name}' as a Python bool is not allowed: its value is only "
            "known when the graph runs. Use dcf.cond / dcf.while_loop, or dcf.logical_and/or."
        )

    def __iter__(self) -> Iterator:
        raise TypeError(
            f"tensor '{self.name}' is not iterable; use dcf.unstack or index it with t[i]"
        )

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        raise TypeError(
            f"cannot convert the symbolic tensor '{self.name}' to a numpy array: its value is "
            "only known when the graph runs (fetch it with Session.run; dcf.stack makes one "
            "tensor of a list of tensors)"
        )

    def __len__(self) -> int:
        if self.shape and self.shape[0] is not None:
            return self.shape[0]
        if self.shape:
            raise TypeError(f"len() of tensor '{self.name}' with unknown first dimension; "
                            "dcf.shape(t)[0] is its size at run time")
        why = "a scalar" if self.shape == () else "of unknown shape"
        raise TypeError(f"len() of tensor '{self.name}' {why}")

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:  # identity, so tensors can be dict keys
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other


class Operation:
    """A node of the graph.

    `ctx` is the control-flow context its outputs live in (for capture checks);
    `frame_ctx` is the while-loop context whose frame it executes in (None: the root).
    """

    __slots__ = (
        "graph", "type", "name", "inputs", "control_inputs", "attrs", "device", "outputs",
        "ctx", "frame_ctx", "site", "opdef", "_id", "__weakref__",
    )

    def __init__(self, graph: Graph, type_: str, name: str, inputs: list[Tensor],
                 control_inputs: list[Operation], attrs: dict, device: str,
                 output_types: list[TensorType], ctx: ControlFlowContext | None,
                 frame_ctx: Any, site: str | None, opdef: Any) -> None:
        self.graph = graph
        self.type = type_
        self.name = name
        self.inputs = list(inputs)
        self.control_inputs = list(control_inputs)
        self.attrs = attrs
        self.device = device
        self.outputs = [Tensor(self, i, t) for i, t in enumerate(output_types)]
        self.ctx = ctx
        self.frame_ctx = frame_ctx
        self.site = site
        self.opdef = opdef
        self._id = len(graph._ops)

    def _set_input(self, index: int, tensor: Tensor) -> None:
        """Re-point one input (only while_loop lowering does this, for a Merge's back edge)."""
        old = self.inputs[index]
        self.graph._consumers[old].remove(self)
        self.inputs[index] = tensor
        self.graph._consumers.setdefault(tensor, []).append(self)

    def _add_control_input(self, op: Operation) -> None:
        if op not in self.control_inputs:
            self.control_inputs.append(op)

    def values(self) -> tuple:
        return tuple(self.outputs)

    @property
    def frame_name(self) -> str:
        return self.frame_ctx.frame_name if self.frame_ctx is not None else ""

    def __repr__(self) -> str:
        return f"<dcf.Operation '{self.name}' type={self.type}>"


class ControlFlowContext:
    """Base of CondContext and WhileContext (defined in control_flow.py).

    The graph asks the current context to capture each input (route an external
    tensor in through a Switch or an Enter) and gives it every new op.
    """

    outer: ControlFlowContext | None = None
    name: str = ""

    @property
    def while_ctx(self) -> Any:
        """The innermost while context enclosing (or equal to) this one, or None."""
        c: ControlFlowContext | None = self
        while c is not None and not c.is_while:
            c = c.outer
        return c

    is_while = False

    def capture(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def add_op(self, op: Operation) -> None:
        pass

    def pivot(self) -> Operation | None:
        return None

    def chain(self) -> list[ControlFlowContext]:
        out, c = [], self
        while c is not None:
            out.append(c)
            c = c.outer
        return out


_DCF_DIR = os.path.dirname(os.path.abspath(__file__))


def _creation_site() -> str | None:
    """`file:line in func()` of the first frame outside the dcf package."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_DCF_DIR):
        f = f.f_back
    if f is None:
        return None
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} in {f.f_code.co_name}()"


class _BuildingState(threading.local):
    """One thread's scopes while it builds into a graph."""

    def __init__(self) -> None:
        self.scope = ""
        self.device_stack: list[device_lib.DeviceSpec | None] = []
        self.control_stack: list[list[Operation] | None] = []
        self.ctx: ControlFlowContext | None = None


class Graph:
    """A dataflow graph: a list of Operations and the scopes used while building it."""

    def __init__(self) -> None:
        self._ops: list[Operation] = []
        self._names: dict[str, Operation] = {}
        self._name_counts: dict[str, int] = {}
        self._consumers: dict[Tensor, list[Operation]] = {}
        # the name scope, device and control-dependency stacks and the control-flow
        # context being built belong to the building thread (as TF1's)
        self._building = _BuildingState()
        self.collections: dict[str, list] = {}
        self.version = 0  # bumped on every new op; sessions use it to invalidate plans
        self._cond_of_merge: dict = {}  # Merge op -> CondInfo (for autodiff)
        self._pop_source: dict = {}     # StackPopV2 op -> the forward tensor it saved
        self._cond_of_switch: dict = {}  # Switch op guarding a captured tensor -> CondInfo
        self._lock = threading.RLock()

    @property
    def _scope(self) -> str:
        return self._building.scope

    @_scope.setter
    def _scope(self, value: str) -> None:
        self._building.scope = value

    @property
    def _ctx(self) -> ControlFlowContext | None:
        return self._building.ctx

    @_ctx.setter
    def _ctx(self, value: ControlFlowContext | None) -> None:
        self._building.ctx = value

    @property
    def _device_stack(self) -> list[device_lib.DeviceSpec | None]:
        return self._building.device_stack

    @property
    def _control_stack(self) -> list[list[Operation] | None]:
        return self._building.control_stack

    # ----------------------------------------------------------------- queries
    def get_operations(self) -> list[Operation]:
        return list(self._ops)

    def get_operation_by_name(self, name: str) -> Operation:
        try:
            return self._names[name]
        except KeyError:
            raise KeyError(f"no operation named {name!r} in the graph") from None

    def get_tensor_by_name(self, name: str) -> Tensor:
        if not isinstance(name, str):
            raise TypeError(f"tensor names are strings like 'op:0', got {name!r}")
        op_name, _, idx = name.rpartition(":")
        if not op_name:
            raise ValueError(f"tensor names look like 'op:0', got {name!r}")
        op = self.get_operation_by_name(op_name)
        # (digits only: 'op:-1' names no tensor, though outputs[-1] is the last one)
        if not (idx.isascii() and idx.isdigit()) or int(idx) >= len(op.outputs):
            raise KeyError(f"op {op_name!r} has no output {idx!r}")
        return op.outputs[int(idx)]

    def add_to_collection(self, key: str, value: Any) -> None:
        self.collections.setdefault(key, []).append(value)

    def get_collection(self, key: str) -> list:
        return list(self.collections.get(key, ()))

    # ------------------------------------------------------------------ scopes
    def unique_name(self, name: str, *, scoped: bool = True) -> str:
        full = f"{self._scope}{name}" if scoped else name
        if full not in self._name_counts and full not in self._names:
            self._name_counts[full] = 0
            return full
        n = self._name_counts.get(full, 0)
        while True:
            n += 1
            cand = f"{full}_{n}"
            if cand not in self._names and cand not in self._name_counts:
                self._name_counts[full] = n
                self._name_counts[cand] = 0
                return cand

    def _op_name(self, name: str) -> str:
        """A new op's full name: `name` under the current scope, made unique; a name
        ending in "/" (what `name_scope` yields, TF1's `identity(x, name=scope)`) is the
        op's whole name, as it is, and a name already taken is an error (as in TF1)."""
        if not name.endswith("/") or name == "/":
            return self.unique_name(name)
        full = name[:-1]
        if full in self._names:
            raise ValueError(f"an op named {full!r} is already in the graph: a name ending "
                             f"in '/' ({name!r}) is used as it is, not made unique")
        self._name_counts.setdefault(full, 0)
        return full

    @contextlib.contextmanager
    def name_scope(self, name: str | None) -> Iterator[str]:
        """Prefix the names of ops built inside with `name/` (made unique)."""
        old = self._scope
        if name is None or name == "":
            self._scope = ""
        elif name.endswith("/"):
            self._scope = name  # an absolute scope re-entered
        else:
            self._scope = self.unique_name(name) + "/"
        try:
            yield self._scope
        finally:
            self._scope = old

    @contextlib.contextmanager
    def device(self, spec: str | None) -> Iterator[None]:
        """Ops built inside go to `spec`, merged over the enclosing scopes' specs (a
        field it leaves out comes from them); None clears the enclosing scopes (ops
        inside are unplaced), as in TensorFlow."""
        self._device_stack.append(None if spec is None else device_lib.DeviceSpec.parse(spec))
        try:
            yield
        finally:
            self._device_stack.pop()

    def _current_device(self) -> str:
        spec = device_lib.DeviceSpec()
        for s in self._device_stack:
            spec = device_lib.DeviceSpec() if s is None else s.merged_over(spec)
        return spec.to_string()

    @contextlib.contextmanager
    def control_dependencies(self, ops: list | None) -> Iterator[None]:
        """Ops built inside run only after `ops` (None clears the enclosing ones)."""
        if ops is None:
            self._control_stack.append(None)
        else:
            resolved = []
            for o in ops:
                o = o.op if isinstance(o, Tensor) else o
                if hasattr(o, "_as_control_op"):
                    o = o._as_control_op()
                if not isinstance(o, Operation):
                    raise TypeError(f"control_dependencies takes ops or tensors, got {o!r}")
                if o.graph is not self:
                    raise ValueError(
                        f"control_dependencies: {o.type} '{o.name}' belongs to another graph "
                        "than the one ops are being built in; an op's control inputs must "
                        "come from its own graph")
                resolved.append(o)
            self._control_stack.append(resolved)
        try:
            yield
        finally:
            self._control_stack.pop()

    def _current_control_inputs(self) -> list[Operation]:
        out: dict[Operation, None] = {}     # (ordered, and a set: a scope of 20k ops)
        for entry in reversed(self._control_stack):
            if entry is None:
                break
            out.update(dict.fromkeys(entry))
        return list(out)

    @contextlib.contextmanager
    def _control_flow_context(self, ctx: ControlFlowContext | None) -> Iterator[None]:
        old, self._ctx = self._ctx, ctx
        # A body starts with no inherited control dependencies: they are attached to
        # the construct's entry ops instead.
        self._control_stack.append(None)
        try:
            yield
        finally:
            self._control_stack.pop()
            self._ctx = old

    # ---------------------------------------------------------------- building
    def create_op(self, type_: str, inputs: list[Tensor], output_types: list[TensorType],
                  *, name: str | None = None, attrs: dict | None = None, opdef: Any = None,
                  ctx: Any = "current", frame_ctx: Any = "current",
                  control_inputs: list[Operation] | None = None,
                  site: str | None = None, capture_controls: bool = True) -> Operation:
        """Append an op. Inputs must already be captured into the current context."""
        for t in inputs:
            if t.op.graph is not self:
                raise ValueError(
                    f"{type_} '{self._scope}{name or type_}': input '{t.name}' belongs to "
                    "another graph; an op's inputs must all come from the graph it is built in")
        for c in control_inputs or ():
            if c.graph is not self:
                raise ValueError(
                    f"{type_} '{self._scope}{name or type_}': control input '{c.name}' "
                    "belongs to another graph; an op's inputs must all come from the graph it "
                    "is built in")
        with self._lock:
            cur = self._ctx if ctx == "current" else ctx
            fctx = (cur.while_ctx if cur is not None else None) if frame_ctx == "current" \
                else frame_ctx
            cins = list(dict.fromkeys([*(control_inputs or ()),
                                       *self._current_control_inputs()]))
            if cur is not None and cins and capture_controls:
                cins = [cur.capture_control(c) for c in cins]
            if cur is not None and not inputs and not cins:
                piv = cur.pivot()
                if piv is not None:
                    cins.append(piv)  # so the op runs once per iteration / only in its branch
            op = Operation(self, type_, self._op_name(name or type_), inputs, cins,
                           dict(attrs or {}), self._current_device(), output_types, cur, fctx,
                           site if site is not None else _creation_site(), opdef)
            self._ops.append(op)
            self._names[op.name] = op
            for t in inputs:
                self._consumers.setdefault(t, []).append(op)
            self.version += 1
            if cur is not None:
                cur.add_op(op)
            return op

    @contextlib.contextmanager
    def as_default(self) -> Iterator[Graph]:
        _stack().append(self)
        try:
            yield self
        finally:
            _stack().pop()


# ---------------------------------------------------------------- default graph
_local = threading.local()
_global_default: list[Graph] = [Graph()]


def _stack() -> list[Graph]:
    s = getattr(_local, "stack", None)
    if s is None:
        s = _local.stack = []
    return s


def upstream_ops(ops: list, fed: Any = ()) -> set[Operation]:
    """`ops` and every op they depend on, through data and control inputs, not looking
    behind the tensors in `fed` (an op all of whose outputs are fed is not needed)."""
    fed = set(fed)
    fed_ops = {t.op for t in fed if all(o in fed for o in t.op.outputs)}
    seen: set[Operation] = set()
    stack = list(ops)
    while stack:
        op = stack.pop()
        if op in seen or op in fed_ops:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs if t not in fed)
        stack.extend(op.control_inputs)
    return seen


def get_default_graph() -> Graph:
    s = _stack()
    return s[-1] if s else _global_default[0]


def reset_default_graph() -> None:
    if _stack():
        raise RuntimeError("reset_default_graph() called inside a `with g.as_default()` block")
    _global_default[0] = Graph()


@contextlib.contextmanager
def name_scope(name: str | None, default_name: str | None = None,
               values: Any = None) -> Iterator[str]:
    """TF1's `name_scope(name, default_name=None, values=None)`: ops built inside are
    named under `name/`, or `default_name/` where `name` is None (made unique either
    way; a name ending in "/" re-enters that scope, and None or "" with no default is
    the root). `values` are the tensors the ops are built from: their graph is the one
    the scope opens in, and made the default inside."""
    scope_name = default_name if name is None else name
    if scope_name is None and values is not None:
        raise ValueError("name_scope: with values given, name or default_name must be "
                         "given too")
    g = get_default_graph()
    if values:
        from dcf.ops.registry import graph_of
        g = graph_of(list(values))
    with contextlib.ExitStack() as stack:
        if g is not get_default_graph():
            stack.enter_context(g.as_default())
        yield stack.enter_context(g.name_scope(scope_name))


def device(spec: str | None):
    """Place ops built inside on `spec`, e.g. "/cpu:1" or "/job:worker/task:0/gpu:0",
    merged over the enclosing scopes' specs; `device(None)` clears them."""
    return get_default_graph().device(spec)


def control_dependencies(ops: list | None):
    """Ops built inside the block run only after every op in `ops` has run."""
    return get_default_graph().control_dependencies(ops)
