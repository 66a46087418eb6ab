"""Neural-network helpers: the nn.* ops, RNN cells, dynamic_rnn/static_rnn, dense."""

from __future__ import annotations

import collections
import zlib
from typing import Any

import numpy as np

from dcf import dtypes, nest
from dcf.control_flow import while_loop
from dcf.graph import Tensor, get_default_graph
from dcf.ops import array_ops, math_ops
from dcf.ops.nn_ops import (  # noqa: F401
    log_softmax, relu, sigmoid, softmax, softmax_cross_entropy_with_logits,
    sparse_softmax_cross_entropy_with_logits, tanh,
)
from dcf.ops.registry import convert_to_tensor
from dcf.ops.rnn_ops import lstm_gates
from dcf.ops.state_ops import Variable
from dcf.tensor_array import TensorArray

__all__ = ["LSTMCell", "GRUCell", "LSTMStateTuple", "dynamic_rnn", "static_rnn", "dense",
           "softmax", "log_softmax", "softmax_cross_entropy_with_logits",
           "sparse_softmax_cross_entropy_with_logits", "relu", "sigmoid", "tanh"]

LSTMStateTuple = collections.namedtuple("LSTMStateTuple", ["c", "h"])


def _glorot(name: str, shape: tuple, dtype: dtypes.DType) -> np.ndarray:
    """Glorot-uniform values, deterministic per variable name (reproducible runs)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    lim = np.sqrt(6.0 / (shape[0] + shape[-1]))
    return rng.uniform(-lim, lim, size=shape).astype(dtype.np)


def _make_var(scope: str, leaf: str, value: np.ndarray) -> Variable:
    return Variable(value, name=f"{scope}/{leaf}" if scope else leaf)


class _Cell:
    """Base of the RNN cells: variables are made on the first call and shared after."""

    def __init__(self, num_units: int, name: str | None, dtype: Any) -> None:
        self.num_units = int(num_units)
        self._name = name
        self._dtype = dtypes.as_dtype(dtype) if dtype is not None else None
        self._built = False
        self.scope = ""

    def _scope(self, default: str) -> str:
        g = get_default_graph()
        if not self.scope:
            with g.name_scope(None):
                with g.name_scope(self._name or default) as s:
                    self.scope = s.rstrip("/")
        return self.scope

    @property
    def variables(self) -> list[Variable]:
        return list(self._vars) if self._built else []


class LSTMCell(_Cell):
    """Long short-term memory cell: state is LSTMStateTuple(c, h), output h.

        z = concat([x, h]) @ kernel + bias
        i, j, f, o = split(z, 4)
        c' = c * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j);  h' = tanh(c') * sigmoid(o)
    """

    def __init__(self, num_units: int, forget_bias: float = 1.0, name: str | None = None,
                 dtype: Any = None) -> None:
        super().__init__(num_units, name, dtype)
        self.forget_bias = forget_bias

    @property
    def state_size(self) -> LSTMStateTuple:
        return LSTMStateTuple(self.num_units, self.num_units)

    @property
    def output_size(self) -> int:
        return self.num_units

    def zero_state(self, batch_size: Any, dtype: Any = dtypes.float32) -> LSTMStateTuple:
        z = array_ops.zeros(array_ops.stack([batch_size, self.num_units])
                            if isinstance(batch_size, Tensor) else (batch_size, self.num_units),
                            dtype=dtype)
        return LSTMStateTuple(z, z)

    def _build(self, input_dim: int, dtype: dtypes.DType) -> None:
        scope = self._scope("lstm_cell")
        u = self.num_units
        self.kernel = _make_var(scope, "kernel", _glorot(f"{scope}/kernel", (input_dim + u, 4 * u),
                                                         dtype))
        self.bias = _make_var(scope, "bias", np.zeros(4 * u, dtype.np))
        self._vars = [self.kernel, self.bias]
        self._built = True

    def __call__(self, inputs: Any, state: Any) -> tuple[Tensor, LSTMStateTuple]:
        x = convert_to_tensor(inputs)
        c, h = state
        if not self._built:
            if x.shape is None or x.shape[-1] is None:
                raise ValueError("LSTMCell: the input's last dimension must be known")
            self._build(int(x.shape[-1]), self._dtype or x.dtype)
        z = math_ops.matmul(array_ops.concat([x, h], 1), self.kernel) + self.bias
        c_new, h_new = lstm_gates(z, c, self.forget_bias)
        return h_new, LSTMStateTuple(c_new, h_new)


class GRUCell(_Cell):
    """Gated recurrent unit: state and output are h.

        r, u = split(sigmoid(concat([x, h]) @ gate_kernel + gate_bias), 2)
        c = tanh(concat([x, r * h]) @ candidate_kernel + candidate_bias)
        h' = u * h + (1 - u) * c
    """

    def __init__(self, num_units: int, name: str | None = None, dtype: Any = None) -> None:
        super().__init__(num_units, name, dtype)

    @property
    def state_size(self) -> int:
        return self.num_units

    @property
    def output_size(self) -> int:
        return self.num_units

    def zero_state(self, batch_size: Any, dtype: Any = dtypes.float32) -> Tensor:
        return array_ops.zeros((batch_size, self.num_units), dtype=dtype)

    def _build(self, input_dim: int, dtype: dtypes.DType) -> None:
        scope = self._scope("gru_cell")
        u = self.num_units
        self.gate_kernel = _make_var(scope, "gates/kernel",
                                     _glorot(f"{scope}/gates", (input_dim + u, 2 * u), dtype))
        self.gate_bias = _make_var(scope, "gates/bias", np.ones(2 * u, dtype.np))
        self.cand_kernel = _make_var(scope, "candidate/kernel",
                                     _glorot(f"{scope}/candidate", (input_dim + u, u), dtype))
        self.cand_bias = _make_var(scope, "candidate/bias", np.zeros(u, dtype.np))
        self._vars = [self.gate_kernel, self.gate_bias, self.cand_kernel, self.cand_bias]
        self._built = True

    def __call__(self, inputs: Any, state: Any) -> tuple[Tensor, Tensor]:
        x = convert_to_tensor(inputs)
        h = state
        if not self._built:
            if x.shape is None or x.shape[-1] is None:
                raise ValueError("GRUCell: the input's last dimension must be known")
            self._build(int(x.shape[-1]), self._dtype or x.dtype)
        gates = math_ops.sigmoid(math_ops.matmul(array_ops.concat([x, h], 1), self.gate_kernel)
                                 + self.gate_bias)
        r, u = array_ops.split(gates, 2, axis=1)
        c = math_ops.tanh(math_ops.matmul(array_ops.concat([x, r * h], 1), self.cand_kernel)
                          + self.cand_bias)
        h_new = u * h + (1.0 - u) * c
        return h_new, h_new


def _batch_size(x: Tensor, axis: int) -> Any:
    d = x.shape[axis] if x.shape is not None else None
    return d if d is not None else array_ops.shape(x)[axis]


def _initial_state(cell: Any, batch: Any, dtype: Any, initial_state: Any) -> Any:
    if initial_state is not None:
        return nest.map_structure(convert_to_tensor, initial_state)
    if dtype is None:
        raise ValueError("give initial_state or dtype")
    return cell.zero_state(batch, dtype)


def _masked(t: Tensor, seq_len: Tensor | None, new: Any, old: Any) -> Any:
    if seq_len is None:
        return new
    keep = math_ops.less(t, seq_len)              # [batch] bool: still inside the sequence
    keep2 = array_ops.expand_dims(keep, 1)

    def pick(n: Tensor, o: Tensor) -> Tensor:
        return array_ops.where(array_ops.broadcast_to(keep2, array_ops.shape(n)), n, o)
    return nest.map_structure(pick, new, old)


def dynamic_rnn(cell: Any, inputs: Any, sequence_length: Any = None, initial_state: Any = None,
                dtype: Any = None, parallel_iterations: int = 32, swap_memory: bool = False,
                time_major: bool = False, scope: str | None = None) -> tuple[Tensor, Any]:
    """Run `cell` over time with a while_loop and TensorArrays:

        state = initial_state
        for t in range(T): output[t], state = cell(inputs[t], state)
        return stack(output), state

    With `sequence_length`, outputs past an example's length are zeros and its state
    is carried through unchanged. inputs: [batch, time, depth] ([time, batch, depth]
    when time_major). Returns (outputs, final_state).
    """
    g = get_default_graph()
    with g.name_scope(scope or "rnn"):
        x = convert_to_tensor(inputs)
        if x.shape is None or len(x.shape) != 3:
            raise ValueError(f"dynamic_rnn: inputs must be rank 3, got {x.type}")
        xt = x if time_major else array_ops.transpose(x, [1, 0, 2])
        steps = _batch_size(xt, 0)
        batch = _batch_size(xt, 1)
        state0 = _initial_state(cell, batch, dtype or x.dtype, initial_state)
        seq = None if sequence_length is None else convert_to_tensor(sequence_length,
                                                                     dtype=dtypes.int32)
        if not getattr(cell, "_built", True) and xt.shape[-1] is not None:
            # variables outside the loop, under this scope: the same names as static_rnn
            # gives them (rnn/lstm_cell/kernel, not rnn/while/...), so checkpoints swap
            cell._build(int(xt.shape[-1]), cell._dtype or xt.dtype)
        in_ta = TensorArray(xt.dtype, size=steps, element_shape=xt.shape[1:],
                            name="inputs").unstack(xt)
        out_ta = TensorArray(xt.dtype, size=steps, name="outputs")

        def body(t: Tensor, state: Any, out: TensorArray) -> tuple:
            xin = in_ta.read(t)
            y, new_state = cell(xin, state)
            if seq is not None:
                y = _masked(t, seq, y, array_ops.zeros_like(y))
                new_state = _masked(t, seq, new_state, state)
            return t + 1, new_state, out.write(t, y)

        _, final, out_ta = while_loop(lambda t, *_: t < steps, body,
                                      (convert_to_tensor(0), state0, out_ta),
                                      parallel_iterations=parallel_iterations,
                                      swap_memory=swap_memory)
        outs = out_ta.stack()
        if not time_major:
            outs = array_ops.transpose(outs, [1, 0, 2])
        return outs, final


def static_rnn(cell: Any, inputs: list, initial_state: Any = None, dtype: Any = None,
               sequence_length: Any = None, scope: str | None = None) -> tuple[list, Any]:
    """The same recurrence unrolled in the graph: one copy of the cell per time step,
    sharing the cell's variables. inputs: a list of [batch, depth] tensors."""
    g = get_default_graph()
    with g.name_scope(scope or "rnn"):
        xs = [convert_to_tensor(x) for x in inputs]
        if not xs:
            raise ValueError("static_rnn: inputs is empty")
        state = _initial_state(cell, _batch_size(xs[0], 0), dtype or xs[0].dtype,
                               initial_state)
        seq = None if sequence_length is None else convert_to_tensor(sequence_length,
                                                                     dtype=dtypes.int32)
        outs = []
        for t, x in enumerate(xs):
            y, new_state = cell(x, state)
            if seq is not None:
                tt = convert_to_tensor(t)
                y = _masked(tt, seq, y, array_ops.zeros_like(y))
                new_state = _masked(tt, seq, new_state, state)
            outs.append(y)
            state = new_state
        return outs, state


def dense(x: Any, units: int, activation: Any = None, use_bias: bool = True,
          name: str | None = None) -> Tensor:
    """`activation(x @ kernel + bias)` with new variables (Glorot-uniform kernel)."""
    x = convert_to_tensor(x)
    if x.shape is None or x.shape[-1] is None:
        raise ValueError("dense: the input's last dimension must be known")
    g = get_default_graph()
    with g.name_scope(None):
        with g.name_scope(name or "dense") as s:
            scope = s.rstrip("/")
    kernel = _make_var(scope, "kernel", _glorot(f"{scope}/kernel", (int(x.shape[-1]), units),
                                                x.dtype))
    y = math_ops.matmul(x, kernel)
    if use_bias:
        bias = _make_var(scope, "bias", np.zeros(units, x.dtype.np))
        y = y + bias
    return activation(y) if activation is not None else y
