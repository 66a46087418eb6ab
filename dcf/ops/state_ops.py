"""Variables: mutable state that lives on its device across runs."""

from __future__ import annotations

import sys
import weakref
from typing import Any

import numpy as np

from dcf import dtypes
from dcf.errors import InvalidArgumentError
from dcf.graph import (
    Operation, Tensor, TensorType, get_default_graph, shapes_compatible, upstream_ops,
)
from dcf.ops.registry import (
    Kind, OpDef, apply, constant_value, convert_in, convert_to_tensor, not_differentiable,
    register,
)

__all__ = ["Variable", "global_variables_initializer", "trainable_variables",
           "global_variables", "variables_initializer", "scatter_update", "scatter_add"]

_RESOURCE = TensorType(dtypes.resource, ())


def _handle_kernel(xp, *, res, node_name, var_name, dtype, shape):
    return res.variable(var_name)


def _bind_handle(xp, *, res, node_name, var_name, dtype, shape):
    get, make = res.variables.get, res.variable

    def handle():
        return get(var_name) or make(var_name)
    return handle


_handle_kernel.bind = _bind_handle  # type: ignore[attr-defined]


def _uninitialized(handle) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"variable '{handle.name}' was read before it was initialized; "
        "run dcf.global_variables_initializer() first")


def _read_kernel(xp, handle, *, dtype, shape=None):
    v = handle.value
    if v is None:
        raise _uninitialized(handle)
    return v


def _bind_read(xp, *, dtype, shape=None):
    def read(handle):
        v = handle.value
        if v is None:
            raise _uninitialized(handle)
        return v
    return read


_read_kernel.bind = _bind_read  # type: ignore[attr-defined]


def _is_initialized_kernel(xp, handle):
    return xp.asarray(handle.value is not None)


# A variable keeps the shape it was created with (its reads carry it as their static
# shape): an assign of another shape, or an update whose delta broadcasts the value to
# a larger shape, is refused and leaves the variable as it was (TensorFlow's Assign with
# validate_shape, and its AssignAdd/AssignSub, refuse them too). `shape` is the
# variable's static shape; None, or a None dimension, accepts any size there.
def _fits(got: tuple, want: tuple) -> bool:
    return len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want))


def _shape_of(value: Any) -> tuple:
    s = getattr(value, "shape", None)
    return s if s is not None else np.shape(value)


def _shape_error(handle, what: str, got: tuple, want: Any) -> InvalidArgumentError:
    want = "?" if want is None else list(want)
    return InvalidArgumentError(
        f"cannot {what} variable '{handle.name}' of shape {want}: the value has shape "
        f"{list(got)} (a variable keeps the shape it was created with)")


# An assign takes the variable's lock too (as TF's AssignVariableOp does): else one
# that lands while an update holds the lock (between its read of the old value and its
# store of the new one) is overwritten by that store, and is lost -- a restore, or a
# reset, run alongside another thread's training steps.
def _assign_kernel(xp, handle, value, *, dtype, shape=None):
    if shape is not None and not _fits(_shape_of(value), shape):
        raise _shape_error(handle, "assign to", _shape_of(value), shape)
    with handle.lock:
        handle.value = value
    return value


def _bind_assign(xp, *, dtype, shape=None):
    if shape is None:
        def assign(handle, value):
            with handle.lock:
                handle.value = value
            return value
    elif None not in shape:
        want = tuple(shape)

        def assign(handle, value):
            got = getattr(value, "shape", None)
            if got != want:
                got = _shape_of(value)
                if got != want:
                    raise _shape_error(handle, "assign to", got, want)
            with handle.lock:
                handle.value = value
            return value
    else:
        def assign(handle, value):
            if not _fits(_shape_of(value), shape):
                raise _shape_error(handle, "assign to", _shape_of(value), shape)
            with handle.lock:
                handle.value = value
            return value
    return assign


_assign_kernel.bind = _bind_assign  # type: ignore[attr-defined]


def _updated(handle, new, old, what: str):
    """`new` as the variable's value, where it has the shape of `old`."""
    if _shape_of(new) != _shape_of(old):
        raise _shape_error(handle, what, _shape_of(new), _shape_of(old))
    handle.value = new
    return new


# An update that reads the value it replaces holds the variable's lock (VarStore.lock):
# runs of one session in several threads then lose none of each other's updates, as
# with TF's resource variables. Reads take no lock (TF's take a shared one): a read
# alongside an in-place update may see it half done, as TF1's ref variables without
# use_locking (docs/variables-and-checkpoints.md).
def _assign_add_kernel(xp, handle, delta, *, dtype, shape=None):
    with handle.lock:
        old = _read_kernel(xp, handle, dtype=dtype)
        return _updated(handle, old + delta, old, "add to")


def _assign_sub_kernel(xp, handle, delta, *, dtype, shape=None):
    with handle.lock:
        old = _read_kernel(xp, handle, dtype=dtype)
        return _updated(handle, old - delta, old, "subtract from")


# ------------------------------------------------------------------ scatter
# A read of a Variable returns its buffer itself (no copy), so a value read earlier
# must not change when the variable is written later: writes make a new buffer. A
# scatter writes a few rows of what may be a large table, and copying the whole table
# for that (10,000 x 11 floats: ~10-20 us) is most of its cost. As in TF (a resource
# update copies the buffer only when someone else holds a reference to it, see
# `PrepareToUpdateVariable`), the scatter writes into the buffer in place when the
# variable's reference is the only one: no earlier read of it is alive anywhere (no
# value in this run, no fetched result, no view of it, no feed). Otherwise it copies.
_getrefcount = sys.getrefcount


def _refs(value: Any) -> int:
    return _getrefcount(value)


def _calibrate_refs() -> int:
    """What `_refs(old)` gives inside a kernel whose only references to `old` are the
    VarStore's and the kernel's own local `old` (same call shape as the kernels)."""
    from dcf.resources import VarStore

    handle = VarStore("probe", np.zeros(2, np.float32))
    old = handle.value
    return _refs(old)


_EXCLUSIVE_REFS = _calibrate_refs()


def _own_buffer(handle) -> Any:
    """The variable's current buffer when it may be written in place (a numpy array
    that owns its writable data and that nothing but the variable refers to); else a
    copy of it, which becomes the variable's new buffer once written."""
    w = _writable(handle)
    return w if w is not None else handle.value.copy()


def _writable(handle) -> Any:
    """The variable's buffer when it may be overwritten in place (see _own_buffer), else
    None (the caller then computes into a new array). The caller must hold no other
    reference to the buffer when it calls this."""
    old = handle.value
    if old is None:
        raise _uninitialized(handle)
    if type(old) is np.ndarray and old.base is None and _refs(old) <= _EXCLUSIVE_REFS:
        # (stored read-only, see VarStore; it owns its data, so it may be reopened)
        old.flags.writeable = True
        return old
    return None


# ------------------------------------------------------------------ Adam
# One op per variable for Adam's update (TF's ResourceApplyAdam): the moments are
# updated in their own buffers when nothing else refers to them, and the same float
# operations run in the same order as the op-by-op graph AdamOptimizer used to build
# (so the results are the same bits):
#     m <- m * beta1 + g * (1 - beta1);  v <- v * beta2 + (g * g) * (1 - beta2)
#     var <- var - (lr_t * m) / (sqrt(v) + epsilon)
# lr_t (the bias-corrected rate, a scalar of var's dtype) is an input. Each constant
# is rounded to var's dtype from the Python float, as the graph's constants were.
# On a CPU the moments' subnormal elements are set to zero every FLUSH_EVERY updates of
# the op (see _flush_subnormals).
FLUSH_EVERY = 8


def _adam_update(xp, beta1, beta2, epsilon, dtype, flush_every=None):
    if beta1 is None:
        # beta1, beta2 and epsilon are inputs (tensors, as TF1's may be), known per update
        def apply_adam_hyper(var_h, m_h, v_h, lr, grad, beta1, beta2, epsilon):
            return _adam_update(xp, float(beta1), float(beta2), float(epsilon), dtype,
                                1)(var_h, m_h, v_h, lr, grad)
        return apply_adam_hyper
    t = np.dtype(dtype.np).type
    flush_every = flush_every or FLUSH_EVERY
    b1, c1, b2, c2, eps = (t(beta1), t(1.0 - beta1), t(beta2), t(1.0 - beta2),
                           t(epsilon))
    multiply, add, sqrt = xp.multiply, xp.add, xp.sqrt
    flush = _flush_subnormals(t) if xp is np else None
    updates = 0

    def apply_adam(var_h, m_h, v_h, lr, grad):
        with var_h.lock:        # (m and v are var's own: its lock covers them)
            return update(var_h, m_h, v_h, lr, grad)

    def update(var_h, m_h, v_h, lr, grad):
        nonlocal updates
        for h in (var_h, m_h, v_h):
            if h.value is None:
                raise _uninitialized(h)
        shape = getattr(grad, "shape", ())
        if not shape or var_h.value.shape != shape or m_h.value.shape != shape or \
                v_h.value.shape != shape:
            # scalars, or shapes that broadcast: the graph's expressions as they are
            m_new = m_h.value * b1 + grad * c1
            m_h.value = m_new
            v_new = v_h.value * b2 + (grad * grad) * c2
            v_h.value = v_new
            new = var_h.value - (lr * m_new) / (sqrt(v_new) + eps)
            var_h.value = new
            return new
        # (_writable runs while this frame holds no reference to the buffer it checks)
        updates += 1
        flushing = flush is not None and not updates % flush_every
        buf = _writable(m_h)
        m_new = multiply(m_h.value if buf is None else buf, b1, out=buf)
        tmp = multiply(grad, c1)
        add(m_new, tmp, out=m_new)
        if flushing:
            flush(m_new, tmp)
        m_h.value = m_new
        buf = _writable(v_h)
        v_new = multiply(v_h.value if buf is None else buf, b2, out=buf)
        multiply(grad, grad, out=tmp)
        multiply(tmp, c2, out=tmp)
        add(v_new, tmp, out=v_new)
        if flushing:
            flush(v_new, tmp)
        v_h.value = v_new
        multiply(lr, m_new, out=tmp)
        den = sqrt(v_new)
        add(den, eps, out=den)
        xp.divide(tmp, den, out=tmp)
        buf = _writable(var_h)
        new = xp.subtract(var_h.value if buf is None else buf, tmp, out=buf)
        var_h.value = new
        return new

    return apply_adam


def _flush_subnormals(t: Any) -> Any:
    """flush(x, scratch): x's subnormal elements set to zero, in place (scratch: an
    array of x's shape and dtype it may overwrite). A moment whose gradient stays 0 (a
    dead relu unit's weights) decays geometrically into the subnormal range, where every
    CPU float operation on it takes a slow microcode path: DQN's Adam update went from
    ~15 to ~40 us after a few thousand steps (bench/NOTES.md, "dqn, session 15").
    TensorFlow runs its CPU kernels with subnormals flushed to zero (FTZ/DAZ); numpy
    cannot set that mode, so the moments are flushed here: the same bits as before
    for every element at or above the dtype's smallest normal number. Every
    FLUSH_EVERY-th update (a flush is 3 passes over each moment, ~5 us of DQN's ~30 us
    update): an element that enters the subnormal range stays there for at most
    FLUSH_EVERY - 1 updates, so few are ever subnormal at once (bench/NOTES.md, "dqn,
    session 19")."""
    tiny = t(np.finfo(t).tiny)

    def flush(x: Any, scratch: Any) -> None:
        np.abs(x, out=scratch)
        np.copyto(x, t(0), where=scratch < tiny)

    return flush


def _apply_adam_kernel(xp, var_h, m_h, v_h, lr, grad, *hyper, beta1, beta2, epsilon, dtype):
    # unbound, the kernel keeps no count of its updates: it flushes at every one
    return _adam_update(xp, beta1, beta2, epsilon, dtype, 1)(var_h, m_h, v_h, lr, grad,
                                                             *hyper)


_apply_adam_kernel.bind = _adam_update  # type: ignore[attr-defined]


def _apply_adam_infer(var: TensorType, m: TensorType, v: TensorType, lr: TensorType,
                      grad: TensorType, *hyper: TensorType, beta1, beta2, epsilon,
                      dtype) -> TensorType:
    if grad.dtype is not dtype or lr.dtype is not dtype:
        raise TypeError(f"ResourceApplyAdam: gradient and learning rate must be {dtype}, "
                        f"got {grad} and {lr}")
    for what, t in [("the learning rate", lr)] + list(zip(("beta1", "beta2", "epsilon"),
                                                         hyper)):
        if t.dtype is not dtype or t.shape not in ((), None):
            raise InvalidArgumentError(f"ResourceApplyAdam: {what} must be a scalar of "
                                       f"{dtype}, got {t}")
    return TensorType(dtype, grad.shape)


def apply_adam(var: Variable, m: Variable, v: Variable, lr: Any, grad: Any, beta1: Any,
               beta2: Any, epsilon: Any, name: str | None = None) -> Tensor:
    """Adam's update of `var` with moment Variables m and v and bias-corrected rate lr
    (see _apply_adam_kernel); returns var's new value. beta1, beta2 and epsilon are
    numbers (attributes of the op), or else all three scalar tensors of var's dtype
    (inputs, read as the update runs)."""
    grad = convert_in(grad, var.graph, var.dtype)
    lr = convert_in(lr, var.graph, var.dtype)
    hyper = (beta1, beta2, epsilon)
    if all(isinstance(x, (int, float, np.number)) for x in hyper):
        inputs, attrs = [], dict(beta1=float(beta1), beta2=float(beta2), epsilon=float(epsilon))
    else:
        inputs = [convert_in(x, var.graph, var.dtype) for x in hyper]
        attrs = dict(beta1=None, beta2=None, epsilon=None)
    return apply("ResourceApplyAdam", [var.handle, m.handle, v.handle, lr, grad] + inputs,
                 name=name or f"{_leaf(var.name)}/ApplyAdam", dtype=var.dtype, **attrs)


def _scatter_update_kernel(xp, handle, indices, updates, *, dtype, mode, shape=None):
    with handle.lock:
        new = _own_buffer(handle)
        try:
            if mode == "update":
                new[indices] = updates
            else:
                xp.add.at(new, indices, updates)
        except BaseException:
            _refused(new)
            raise
        handle.value = new
        return new


def _refused(new: Any) -> None:
    """A scatter into `new` (the variable's own buffer, reopened by _writable, or a
    copy) raised: numpy checks indices and shapes before it writes, so the variable
    holds its old value, in a buffer that must be read-only again (a fetch hands a
    writable array to the caller as it is: writing it would change the variable)."""
    if type(new) is np.ndarray:
        new.flags.writeable = False


def _bind_scatter(xp, *, dtype, mode, shape=None):
    if mode == "update":
        ndarray = np.ndarray

        def scatter(handle, indices, updates):
            with handle.lock:
                new = _own_buffer(handle)
                try:
                    if type(indices) is ndarray and indices.shape == (1,) and \
                            type(updates) is ndarray and updates.shape[:1] == (1,) and \
                            updates.ndim == new.ndim:
                        # one row (a replay write): basic indexing, ~0.3 us instead of
                        # ~1.2 us for new[indices] = updates; the same row, the same
                        # values, the same IndexError out of range
                        new[indices[0]] = updates[0]
                    else:
                        new[indices] = updates
                except BaseException:
                    _refused(new)
                    raise
                handle.value = new
                return new
    else:
        add_at = xp.add.at

        def scatter(handle, indices, updates):
            with handle.lock:
                new = _own_buffer(handle)
                try:
                    add_at(new, indices, updates)
                except BaseException:
                    _refused(new)
                    raise
                handle.value = new
                return new
    return scatter


_scatter_update_kernel.bind = _bind_scatter  # type: ignore[attr-defined]


# ------------------------------------------------------------ sliced assignment
def _slice_assign_infer(h: TensorType, value: TensorType, *dyn: TensorType, key, dtype,
                        shape) -> TensorType:
    from dcf.ops.array_ops import _key_shape

    want = _key_shape(key, TensorType(dtype, shape))
    if value.dtype is not dtype:
        raise TypeError(f"cannot assign a {value.dtype} value to a slice of a {dtype} variable")
    if not shapes_compatible(value.shape, want):
        raise ValueError(f"cannot assign a value of shape {list(value.shape)} to a slice of "
                         f"shape {list(want)}")
    return TensorType(dtype, shape)


def _slice_assign_kernel(xp, handle, value, *dyn, key, dtype, shape=None):
    from dcf.ops.array_ops import _resolve_key

    with handle.lock:
        new = _own_buffer(handle)
        try:
            k = _resolve_key(key, dyn) if dyn else key
            want = new[k].shape
            if _shape_of(value) != want:   # (TF's: no broadcasting of the value)
                raise InvalidArgumentError(
                    f"cannot assign a value of shape {list(_shape_of(value))} to a slice of "
                    f"shape {list(want)} of variable '{handle.name}'")
            new[k] = value
        except BaseException:
            _refused(new)
            raise
        handle.value = new
        return new


# the tensors v[key] of Variables: (the variable, its StridedSlice) for v[key].assign
_SLICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _slice_assign(self: Tensor) -> Any:
    """``t.assign`` of a tensor: the assign of a Variable's slice v[key]; any other
    tensor has none (an AttributeError saying why, so hasattr(t, "assign") is False)."""
    var = _SLICES.get(self)
    if var is None:
        raise AttributeError(
            f"'Tensor' object has no attribute 'assign': '{self.name}' is a value, not a "
            "Variable; assign to a Variable v (v.assign), or to a slice of one "
            "(v[i].assign, v[1:3].assign)")

    def assign(value: Any, name: str | None = None) -> Tensor:
        return var._assign_slice(self, value, name)
    return assign


# (a property, not a __getattr__, so that other attribute lookups on tensors cost nothing)
setattr(Tensor, "assign", property(_slice_assign))  # noqa: B010


def _var_handle_infer(*, var_name, dtype, shape):
    return _RESOURCE


def _assign_infer(handle: TensorType, value: TensorType, *, dtype, shape=None) -> TensorType:
    """An assign returns the value it stores: its shape, with the variable's dimensions
    where the value's are unknown (the kernel refuses a value that does not fit)."""
    got = value.shape
    if got is None or shape is None:
        return TensorType(dtype, shape if got is None else got)
    return TensorType(dtype, tuple(w if g is None else g for g, w in zip(got, shape)))


def _update_infer(handle: TensorType, delta: TensorType, *, dtype, shape=None) -> TensorType:
    """AssignAdd/AssignSub return the variable's new value, of the variable's shape,
    whatever the shape of the delta that broadcast into it (a scalar)."""
    return TensorType(dtype, shape)


register(OpDef("VarHandleOp", infer=_var_handle_infer, kernel=_handle_kernel, resource=True,
               host_only=False))
register(OpDef("ReadVariableOp", infer=lambda h, *, dtype, shape: TensorType(dtype, shape),
               kernel=_read_kernel, stateful=True))
register(OpDef("VarIsInitializedOp", infer=lambda h: TensorType(dtypes.bool_, ()),
               kernel=_is_initialized_kernel, stateful=True))
register(OpDef("AssignVariableOp", infer=_assign_infer, kernel=_assign_kernel, stateful=True))
register(OpDef("AssignAddVariableOp", infer=_update_infer, kernel=_assign_add_kernel,
               stateful=True))
register(OpDef("AssignSubVariableOp", infer=_update_infer, kernel=_assign_sub_kernel,
               stateful=True))
register(OpDef("ResourceScatter", infer=lambda h, i, u, *, dtype, mode, shape:
               TensorType(dtype, shape), kernel=_scatter_update_kernel, stateful=True))
register(OpDef("ResourceApplyAdam", infer=_apply_adam_infer, kernel=_apply_adam_kernel,
               stateful=True))
register(OpDef("ResourceStridedSliceAssign", infer=_slice_assign_infer,
               kernel=_slice_assign_kernel, stateful=True))
not_differentiable("VarHandleOp", "ReadVariableOp", "VarIsInitializedOp", "AssignVariableOp",
                   "AssignAddVariableOp", "AssignSubVariableOp", "ResourceScatter",
                   "ResourceApplyAdam", "ResourceStridedSliceAssign")


class Variable:
    """Mutable state that lives on its device across runs.

    `v` can be used wherever a tensor can (it reads the current value);
    `v.assign(x)`, `v.assign_add(x)`, `v.assign_sub(x)` return the new value;
    `v.initializer` sets the initial value.

    A variable keeps the shape of its initial value: an assign of another shape, or an
    update whose delta would broadcast the value to a larger shape, is refused (a
    ValueError when the graph is built where both shapes are known, else an
    InvalidArgumentError at run time) and the value stays as it was. A delta that
    broadcasts to the variable's shape (a scalar) is an update. A variable made with
    `validate_shape=False`, or whose initial value has no static shape, takes values of
    any shape (its reads have no static shape).
    """

    def __init__(self, initial_value: Any, name: str | None = None, trainable: bool = True,
                 dtype: Any = None, validate_shape: bool = True) -> None:
        g = get_default_graph()
        if g._ctx is not None:
            # Created inside a cond/while body (an RNN cell's first call): the variable
            # itself lives outside any frame; reads inside enter it as a loop constant.
            # Its initializer runs outside too, so an initial value computed inside the
            # body cannot reach it (TF1 refuses it alike): a callable is built outside.
            if isinstance(initial_value, Tensor) and initial_value.op.ctx is not None:
                raise ValueError(
                    f"Variable '{g._scope}{name or 'Variable'}': the initial value "
                    f"'{initial_value.name}' was computed inside "
                    f"{initial_value.op.ctx.describe()}, where the variable's initializer "
                    "cannot use it; to create a variable inside a cond or while_loop body, "
                    "pass its initial value as a lambda (or a Python/numpy value)")
            with g._control_flow_context(None):
                self.__init__(initial_value, name=name, trainable=trainable, dtype=dtype,
                              validate_shape=validate_shape)
            return
        with g.name_scope(name or "Variable") as scope:
            self.name = scope.rstrip("/")
            if callable(initial_value):
                initial_value = initial_value()
            init = _guard_uninitialized_reads(convert_to_tensor(initial_value, dtype=dtype))
            if init.shape is None or any(d is None for d in init.shape):
                static = constant_value(init)
                shape = None if static is None else tuple(static.shape)
            else:
                shape = init.shape
            if not validate_shape:      # (TF's validate_shape=False: a value of any shape)
                shape = None
            self.dtype = init.dtype
            self.shape = shape
            self.graph = g
            self.trainable = trainable
            self.initial_value = init
            self.handle = apply("VarHandleOp", [], name="handle", var_name=self.name,
                                dtype=self.dtype, shape=shape)
            self.initializer = apply("AssignVariableOp", [self.handle, init], name="Assign",
                                     dtype=self.dtype, shape=shape).op
            self._snapshot = None
        g.add_to_collection("variables", self)
        if trainable:
            g.add_to_collection("trainable_variables", self)

    @property
    def op(self) -> Operation:
        return self.handle.op

    @property
    def device(self) -> str:
        return self.handle.op.device

    def read_value(self) -> Tensor:
        """A tensor holding the variable's value when the read op runs."""
        return apply("ReadVariableOp", [self.handle], name=f"{_leaf(self.name)}/read",
                     dtype=self.dtype, shape=self.shape)

    def value(self) -> Tensor:
        return self.read_value()

    def _as_tensor(self) -> Tensor:
        return self.read_value()

    def initialized_value(self) -> Tensor:
        """The variable's value where it is initialized, else its initial value (TF1's):
        what to initialize another variable from, whichever initializer runs first."""
        from dcf.control_flow import cond

        g = self.graph
        with g.as_default(), g._control_flow_context(None), g.device(self.device or None), \
                g.name_scope(None):
            is_set = apply("VarIsInitializedOp", [self.handle],
                           name=f"{self.name}/IsInitialized")
            return cond(is_set, self.read_value, lambda: self.initial_value,
                        name=f"{self.name}/initialized_value")

    def _fetch_tensor(self) -> Tensor:
        """The read that `Session.run(variable)` fetches: made once, at the graph's root
        (TF1's snapshot), so that fetching a Variable adds no op and no plan per run."""
        t = getattr(self, "_fetched_read", None)
        if t is None:
            g = self.graph
            with g.as_default(), g._control_flow_context(None), g.device(None), \
                    g.name_scope(None):
                t = apply("ReadVariableOp", [self.handle], name=f"{self.name}/fetch",
                          dtype=self.dtype, shape=self.shape)
            self._fetched_read = t
        return t

    def _as_control_op(self) -> Operation:
        return self.handle.op

    def _assign(self, type_: str, x: Any, name: str) -> Tensor:
        try:
            # a Python value becomes a Const of the variable's graph, whichever is default
            x = convert_in(x, self.graph, self.dtype)
        except TypeError as e:
            raise TypeError(f"{type_} '{name}' of variable '{self.name}': {e}") from None
        _check_static_shape(self, type_, x.shape, name)
        return apply(type_, [self.handle, x], name=name, dtype=self.dtype, shape=self.shape)

    def assign(self, value: Any, name: str | None = None) -> Tensor:
        return self._assign("AssignVariableOp", value, name or f"{_leaf(self.name)}/Assign")

    def assign_add(self, delta: Any, name: str | None = None) -> Tensor:
        return self._assign("AssignAddVariableOp", delta,
                            name or f"{_leaf(self.name)}/AssignAdd")

    def assign_sub(self, delta: Any, name: str | None = None) -> Tensor:
        return self._assign("AssignSubVariableOp", delta,
                            name or f"{_leaf(self.name)}/AssignSub")

    def __getitem__(self, key: Any) -> Tensor:
        """``v[key]``: the slice of its value, as a tensor's; ``v[key].assign(x)`` writes x
        into that slice of the variable (TF1's sliced assignment)."""
        t = self.read_value()[key]
        if t.op.type == "StridedSlice":
            _SLICES[t] = self
        return t

    def _assign_slice(self, t: Tensor, value: Any, name: str | None) -> Tensor:
        name = name or f"{_leaf(self.name)}/AssignSlice"
        try:
            value = convert_in(value, self.graph, self.dtype)
        except TypeError as e:
            raise TypeError(f"ResourceStridedSliceAssign '{name}' of variable '{self.name}': "
                            f"{e}") from None
        return apply("ResourceStridedSliceAssign", [self.handle, value, *t.op.inputs[1:]],
                     name=name, key=t.op.attrs["key"], dtype=self.dtype, shape=self.shape)

    def __len__(self) -> int:
        # as a tensor's: the static size of the first dimension (TF1 refuses len() of
        # both; numpy and eager TF give it)
        if self.shape:
            if self.shape[0] is not None:
                return self.shape[0]
            raise TypeError(f"len() of variable '{self.name}' with unknown first dimension; "
                            "dcf.shape(v)[0] is its size at run time")
        why = "of unknown shape" if self.shape is None else "a scalar"
        raise TypeError(f"len() of variable '{self.name}' {why}")

    def scatter_update(self, indices: Any, updates: Any, name: str | None = None) -> Tensor:
        """Set rows: `v[indices] = updates` (returns the new value)."""
        return scatter_update(self, indices, updates, name=name)

    def __repr__(self) -> str:
        return f"<dcf.Variable '{self.name}' {TensorType(self.dtype, self.shape)}>"

    # Arithmetic reads the value first, so a Variable behaves like a tensor.
    __array_ufunc__ = None  # numpy defers to the reflected operators (`np_array + v`)

    def __bool__(self) -> bool:
        raise TypeError(f"using the variable '{self.name}' as a Python bool is not allowed: "
                        "its value is only known when the graph runs")

    def __iter__(self) -> Any:
        raise TypeError(f"variable '{self.name}' is not iterable; use dcf.unstack or index it")

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        raise TypeError(f"cannot convert the variable '{self.name}' to a numpy array: its "
                        "value is only known when the graph runs (fetch it with Session.run)")

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__") or item in ("handle", "_snapshot"):
            raise AttributeError(item)
        return getattr(self.read_value(), item)


def _guard_uninitialized_reads(init: Tensor) -> Tensor:
    """An initial value computed from other variables' reads, built again on each one's
    initialized_value() (TF1's guard), so that global_variables_initializer() gives the
    same values whichever variable it initializes first. The ops between the reads and
    `init` are copied (the user's own stay as they are); an initial value whose reads
    reach it through control flow or another stateful op is left as it is."""
    ops = sorted(upstream_ops([init.op]), key=lambda o: o._id)
    if not any(op.type == "ReadVariableOp" for op in ops):
        return init
    g = init.graph
    owners = {v.handle: v for v in g.get_collection("variables")}
    reads = {op for op in ops if op.type == "ReadVariableOp" and op.ctx is None and
             op.inputs[0] in owners}
    between: dict[Operation, None] = {}       # (in order)
    for op in ops:
        if op not in reads and any(t.op in reads or t.op in between for t in op.inputs):
            if op.ctx is not None or op.opdef is None or op.opdef.kind != Kind.KERNEL or \
                    op.opdef.stateful:
                return init
            between[op] = None
    new = {op.outputs[0]: owners[op.inputs[0]].initialized_value() for op in reads}
    for op in between:
        with g.device(op.device or None):
            out = apply(op.type, [new.get(t, t) for t in op.inputs], name=_leaf(op.name),
                        control_inputs=list(op.control_inputs), **op.attrs)
        new.update(zip(op.outputs, out if isinstance(out, tuple) else (out,)))
    return new.get(init, init)


def _leaf(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def _check_static_shape(var: Variable, type_: str, got: Any, name: str) -> None:
    """At build time, where both shapes are known: an assign whose value has another
    shape than the variable's, or an update whose delta does not broadcast to it, is a
    ValueError naming the op and both shapes (as TensorFlow's validate_shape)."""
    want = var.shape
    if want is None or got is None:
        return
    if type_ == "AssignVariableOp":
        if shapes_compatible(got, want):
            return
        what = "assign a value of shape"
    else:
        if None in got or None in want:
            return
        try:
            if np.broadcast_shapes(tuple(want), tuple(got)) == tuple(want):
                return
        except ValueError:
            pass
        what = "update it by a delta of shape"
    raise ValueError(f"{type_} '{name}': cannot {what} {list(got)} to variable "
                     f"'{var.name}' of shape {list(want)}")


def _delegate(method: str):
    def fn(self, *args):
        return getattr(self.read_value(), method)(*args)
    fn.__name__ = method
    return fn


for _m in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
           "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
           "__rpow__", "__matmul__", "__rmatmul__", "__neg__", "__lt__", "__le__", "__gt__",
           "__ge__", "__abs__", "__and__", "__rand__", "__or__", "__ror__",
           "__xor__", "__rxor__", "__invert__"):
    setattr(Variable, _m, _delegate(_m))


def scatter_update(ref: Variable, indices: Any, updates: Any, name: str | None = None) -> Tensor:
    """`ref[indices] = updates` on a Variable; returns the new value."""
    return _scatter(ref, indices, updates, "update", name or "ScatterUpdate")


def scatter_add(ref: Variable, indices: Any, updates: Any, name: str | None = None) -> Tensor:
    """`ref[indices] += updates` (repeated indices add up); returns the new value."""
    return _scatter(ref, indices, updates, "add", name or "ScatterAdd")


def _scatter(ref: Variable, indices: Any, updates: Any, mode: str, name: str) -> Tensor:
    updates = convert_in(updates, ref.graph, ref.dtype)
    return apply("ResourceScatter", [ref.handle, indices, updates], name=name, dtype=ref.dtype,
                 mode=mode, shape=ref.shape)


def global_variables() -> list[Variable]:
    return get_default_graph().get_collection("variables")


def trainable_variables() -> list[Variable]:
    """Variables created with trainable=True in the default graph."""
    return get_default_graph().get_collection("trainable_variables")


def variables_initializer(var_list: list[Variable], name: str = "init") -> Operation:
    from dcf.ops.control_ops import group

    return group(*[v.initializer for v in var_list], name=name)


def global_variables_initializer() -> Operation:
    """An op that initializes every variable of the default graph."""
    return variables_initializer(global_variables())
