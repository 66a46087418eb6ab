"""Neural-network helpers: the nn.* ops, RNN cells, dynamic_rnn/static_rnn, dense."""

from __future__ import annotations

import collections
import zlib
from typing import Any

import numpy as np

from dcf import dtypes, nest
from dcf.control_flow import while_loop
from dcf.device import DeviceSpec
from dcf.graph import Tensor, get_default_graph
from dcf.ops import array_ops, math_ops
from dcf.ops.math_ops import softplus  # noqa: F401  (TF1's tf.nn.softplus)
from dcf.ops.nn_ops import (  # noqa: F401
    log_softmax, relu, sigmoid, softmax, softmax_cross_entropy_with_logits,
    sparse_softmax_cross_entropy_with_logits, tanh,
)
from dcf.ops.registry import convert_to_tensor
from dcf.ops.rnn_ops import (
    lstm_gates, project_unstack, rnn_matmul, tie_recorded_inputs, transpose_copy,
    wavefront_inputs,
)
from dcf.ops.state_ops import Variable
from dcf.tensor_array import TensorArray

__all__ = ["LSTMCell", "GRUCell", "LSTMStateTuple", "dynamic_rnn", "static_rnn", "dense",
           "softmax", "log_softmax", "softmax_cross_entropy_with_logits",
           "sparse_softmax_cross_entropy_with_logits", "relu", "sigmoid", "tanh", "softplus"]

LSTMStateTuple = collections.namedtuple("LSTMStateTuple", ["c", "h"])
# A cell's hoisted form for dynamic_rnn (see _hoisted_rnn): the projection weights
# ([W_x; b] per TensorArray), step(xws_t, state), and optionally a recurrent weight tied
# to the first projection with the function giving its matmul input from the state.
_Hoist = collections.namedtuple("_Hoist", ["weights", "step", "tied", "tied_input"])


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

    def _check_depth(self, x: Tensor, kernel: Variable) -> None:
        """A built cell takes inputs of the depth it was built for: say so here, at graph
        construction, not as a MatMul failure inside the loop at run time."""
        want = kernel.shape[0] - self.num_units if kernel.shape is not None else None
        got = x.shape[-1] if x.shape is not None else None
        if want is not None and got is not None and int(got) != int(want):
            raise ValueError(f"{type(self).__name__} '{self.scope}': built for inputs of "
                             f"depth {want}, called with depth {got} (its variables are "
                             "shared; make a new cell for other inputs)")

    def _check_graph(self) -> None:
        """A built cell's variables live in the graph it was built in: another graph's
        rnn would fail at an op joining the two graphs; say so here."""
        if self._built and self._vars[0].graph is not get_default_graph():
            raise ValueError(f"{type(self).__name__} '{self.scope}': its variables are in "
                             "another graph than the default graph; make a new cell for "
                             "this graph")

    def _check_inputs(self, x: Tensor) -> None:
        """TF1: "RNN cell only supports floating point inputs" (an integer kernel would
        hold the Glorot values truncated to zeros)."""
        if not x.dtype.is_floating:
            name = self.scope or self._name
            raise TypeError(f"{type(self).__name__}{f' {name!r}' if name else ''}: inputs "
                            f"must be floating point, got {x.type} ('{x.name}'); cast them "
                            "with dcf.cast")

    def _check_state(self, state: Any) -> None:
        """A state of the cell's structure (an LSTM's is LSTMStateTuple(c, h), not one
        concatenated tensor): said here, not as an unpacking failure inside a loop."""
        flat = nest.flatten(state)
        if len(flat) != len(nest.flatten(self.state_size)):
            got = ", ".join(str(getattr(s, "type", type(s).__name__)) for s in flat)
            name = self.scope or self._name
            raise TypeError(f"{type(self).__name__}{f' {name!r}' if name else ''}: the "
                            f"state must be shaped like state_size {self.state_size} "
                            f"(one [batch, n] tensor each), got {got}")

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
        self._check_inputs(x)
        self._check_state(state)
        c, h = state
        if not self._built:
            if x.shape is None or x.shape[-1] is None:
                raise ValueError("LSTMCell: the input's last dimension must be known")
            self._build(int(x.shape[-1]), self._dtype or x.dtype)
        self._check_graph()
        self._check_depth(x, self.kernel)
        z = math_ops.matmul(array_ops.concat([x, h], 1), self.kernel)
        c_new, h_new = lstm_gates(z, c, self.forget_bias, b=self.bias)   # bias in the kernel
        return h_new, LSTMStateTuple(c_new, h_new)

    def _hoist(self, input_dim: int) -> tuple | None:
        """dynamic_rnn's split of the step (see `_hoisted_rnn`): ([W_x; bias'], step).
        `[x, 1] @ [W_x; bias']` is the input projection of all steps, one GEMM before the
        loop (bias' = bias + forget_bias on the f block, so the step adds nothing else);
        step(xw_t, state) does h @ W_h and the gates. W_x, W_h are row blocks of the
        kernel: the variables (names, shapes, checkpoints) stay as they are."""
        u = self.num_units
        if self.kernel.shape != (input_dim + u, 4 * u):
            return None
        w_x, w_h = array_ops.split(self.kernel, [input_dim, u], axis=0)
        w_h_t = transpose_copy(w_h)
        bias = convert_to_tensor(self.bias)
        if self.forget_bias:
            # the forget bias goes into the projection too: one add fewer per step
            fb = np.zeros(4 * u, bias.dtype.np)
            fb[2 * u:3 * u] = self.forget_bias
            bias = bias + fb
        w_aug = _with_bias_row(w_x, bias)

        def step(xw: list, state: Any) -> tuple[Tensor, LSTMStateTuple]:
            c, h = state
            z = rnn_matmul(h, w_h, w_h_t, w_grad=False)   # dW_h: after the backward loop
            c_new, h_new = lstm_gates(z, c, 0.0, b=xw[0])
            return h_new, LSTMStateTuple(c_new, h_new)
        # tied: z_t = h_t @ W_h + xw_t, so dW_h = sum_t h_t^T d(xw_t) is computed with dW_x
        return _Hoist([w_aug], step, w_h, lambda state: state[1])


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
        self._check_inputs(x)
        self._check_state(state)
        h = state
        if not self._built:
            if x.shape is None or x.shape[-1] is None:
                raise ValueError("GRUCell: the input's last dimension must be known")
            self._build(int(x.shape[-1]), self._dtype or x.dtype)
        self._check_graph()
        self._check_depth(x, self.gate_kernel)
        gates = math_ops.sigmoid(math_ops.matmul(array_ops.concat([x, h], 1), self.gate_kernel)
                                 + self.gate_bias)
        r, u = array_ops.split(gates, 2, axis=1)
        c = math_ops.tanh(math_ops.matmul(array_ops.concat([x, r * h], 1), self.cand_kernel)
                          + self.cand_bias)
        h_new = u * h + (1.0 - u) * c
        return h_new, h_new

    def _hoist(self, input_dim: int) -> tuple | None:
        """As LSTMCell._hoist: ([Wg_x; gate_bias], [Wc_x; candidate_bias]) projected
        before the loop; the step does h @ Wg_h and (r * h) @ Wc_h."""
        u = self.num_units
        if self.gate_kernel.shape != (input_dim + u, 2 * u) or \
                self.cand_kernel.shape != (input_dim + u, u):
            return None
        wg_x, wg_h = array_ops.split(self.gate_kernel, [input_dim, u], axis=0)
        wc_x, wc_h = array_ops.split(self.cand_kernel, [input_dim, u], axis=0)
        wg_h_t, wc_h_t = transpose_copy(wg_h), transpose_copy(wc_h)
        wg_aug = _with_bias_row(wg_x, self.gate_bias)
        wc_aug = _with_bias_row(wc_x, self.cand_bias)

        def step(xw: list, h: Tensor) -> tuple[Tensor, Tensor]:
            gates = math_ops.sigmoid(rnn_matmul(h, wg_h, wg_h_t) + xw[0])
            r, uu = array_ops.split(gates, 2, axis=1)
            c = math_ops.tanh(rnn_matmul(r * h, wc_h, wc_h_t) + xw[1])
            h_new = uu * h + (1.0 - uu) * c
            return h_new, h_new
        return _Hoist([wg_aug, wc_aug], step, None, None)


def _batch_size(x: Tensor, axis: int) -> Any:
    d = x.shape[axis] if x.shape is not None else None
    return d if d is not None else array_ops.shape(x)[axis]


def _initial_state(cell: Any, batch: Any, dtype: Any, initial_state: Any, x: Tensor,
                   what: str) -> Any:
    """The rnn's initial state, checked against the inputs `x` (and the cell against its
    graph and x's dtype) before the loop makes any op of its own."""
    if isinstance(cell, _Cell):
        cell._check_graph()
        cell._check_inputs(x)
    if initial_state is not None:
        if hasattr(cell, "_check_state"):
            cell._check_state(initial_state)
        state = nest.map_structure(convert_to_tensor, initial_state)
    elif dtype is None:
        raise ValueError("give initial_state or dtype")
    else:
        state = cell.zero_state(batch, dtype)
    if isinstance(cell, _Cell):
        # a state of another batch, width or dtype than the inputs' fails inside the
        # loop at an op the user did not make (LSTMGates, RNNMatMul): say so here
        for i, (t, n) in enumerate(zip(nest.flatten(state), nest.flatten(cell.state_size))):
            got = t.shape if t.shape is not None else (None, None)
            bad_shape = len(got) != 2 or any(
                a is not None and b is not None and int(a) != int(b)
                for a, b in zip(got, (batch if isinstance(batch, int) else None, n)))
            if bad_shape or (t.dtype != x.dtype and x.dtype.is_floating):
                src = "initial_state" if initial_state is not None else \
                    f"the zero state of dtype={dtypes.as_dtype(dtype).name}"
                raise ValueError(
                    f"{what}: {src} must be [batch_size, {n}] tensors of the inputs' dtype "
                    f"{x.dtype.name} (batch_size {batch}; inputs {x.type}), got {t.type} "
                    f"('{t.name}', part {i} of {type(cell).__name__}'s state)")
    return state


def _sequence_length(sequence_length: Any, batch: Any) -> Tensor | None:
    """sequence_length as an int32 tensor: int64 (or any other dtype) is cast, as TF's
    dynamic_rnn does. It must be a vector of `batch` lengths (checked here where the
    shapes are static, as TF does, not as a broadcast failure inside the loop)."""
    if sequence_length is None:
        return None
    seq = convert_to_tensor(sequence_length)
    n = seq.shape[0] if seq.shape is not None and len(seq.shape) == 1 else None
    if seq.shape is not None and (len(seq.shape) != 1 or (
            n is not None and isinstance(batch, int) and n != batch)):
        raise ValueError(f"sequence_length must be a vector of batch_size ({batch}) "
                         f"lengths, got {seq.type} ('{seq.name}')")
    seq = seq if seq.dtype == dtypes.int32 else math_ops.cast(seq, dtypes.int32)
    if n is None or not isinstance(batch, int):
        # not known to match until it runs: the masks would broadcast a [1] vector (one
        # length for every example) or fail inside the loop; as TF's runtime shape
        # assert, fail at an op named for the argument
        seq = array_ops.reshape(seq, array_ops.stack([batch]) if isinstance(batch, Tensor)
                                else [batch], name="sequence_length")
    return seq


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

    For LSTMCell and GRUCell on CPU devices the input half of the cell's matmul is
    hoisted out of the loop (`_hoisted_rnn`): the same function and variables, fewer
    and larger GEMMs.
    """
    g = get_default_graph()
    with g.name_scope(scope or "rnn"):
        x = convert_to_tensor(inputs)
        if x.shape is None or len(x.shape) != 3:
            raise ValueError(f"dynamic_rnn: inputs must be rank 3, got {x.type}")
        xt = x if time_major else array_ops.transpose(x, [1, 0, 2])
        steps = _batch_size(xt, 0)
        batch = _batch_size(xt, 1)
        state0 = _initial_state(cell, batch, dtype or x.dtype, initial_state, x,
                                "dynamic_rnn")
        seq = _sequence_length(sequence_length, batch)
        if not getattr(cell, "_built", True) and xt.shape[-1] is not None:
            # variables outside the loop, under this scope: the same names as static_rnn
            # gives them (rnn/lstm_cell/kernel, not rnn/while/...), so checkpoints swap
            cell._build(int(xt.shape[-1]), cell._dtype or xt.dtype)
        hoist = _hoisted_rnn(cell, xt, steps, batch)
        tied_ta = tied_input = None
        if hoist is None:
            in_tas = [TensorArray(xt.dtype, size=steps, element_shape=xt.shape[1:],
                                  name="inputs").unstack(xt)]
            step = cell
        else:
            in_tas, step, tied_ta, tied_input = hoist
        # TF1: outputs of the cell's output_size structure, of dtype= or the state's
        # dtype (a cell may take integer ids and embed them)
        out_struct = getattr(cell, "output_size", None)
        out_struct = out_struct if nest.is_nested(out_struct) else 0
        out_dtype = dtypes.as_dtype(dtype) if dtype is not None else \
            nest.flatten(state0)[0].dtype
        out_tas = tuple(TensorArray(out_dtype, size=steps, name="outputs")
                        for _ in nest.flatten(out_struct))

        def body(t: Tensor, state: Any, *tas: TensorArray) -> tuple:
            out, tied = tas[:len(out_tas)], tas[len(out_tas):]
            xin = [ta.read(t) for ta in in_tas]
            y, new_state = step(xin[0] if hoist is None else xin, state)
            ys = nest.flatten(y)
            if len(ys) != len(out):
                raise ValueError(f"dynamic_rnn: the cell returned {len(ys)} outputs, its "
                                 f"output_size {getattr(cell, 'output_size', None)} says "
                                 f"{len(out)}")
            if seq is not None:
                ys = [_masked(t, seq, v, array_ops.zeros_like(v)) for v in ys]
                new_state = _masked(t, seq, new_state, state)
            # a tied recurrent weight's matmul input, for its gradient after the loop (a
            # record, not a path of the loss; second derivatives flow back through it)
            tied = tuple(ta.write(t, tied_input(state)) for ta in tied)
            return (t + 1, new_state) + tuple(o.write(t, v) for o, v in zip(out, ys)) + tied

        loop_vars = (convert_to_tensor(0), state0) + out_tas + \
            (() if tied_ta is None else (tied_ta,))
        _, final, *tas = while_loop(lambda t, *_: t < steps, body, loop_vars,
                                    parallel_iterations=parallel_iterations,
                                    swap_memory=swap_memory)
        out_tas, tied_out = tas[:len(out_tas)], tas[len(out_tas):]
        if tied_out:
            tie_recorded_inputs(in_tas[0], tied_out[0])
        outs = [ta.stack() for ta in out_tas]
        if not time_major:
            outs = [array_ops.transpose(o, [1, 0, 2]) for o in outs]
        return nest.pack_sequence_as(out_struct, outs), final


def _with_bias_row(w: Tensor, bias: Any) -> Tensor:
    """[[w], [bias]]: `[x, 1] @ it` is `x @ w + bias` in one GEMM (and the bias gradient
    comes out of the weight-gradient GEMM: no separate pass over the large product)."""
    b = convert_to_tensor(bias)
    return array_ops.concat([w, array_ops.reshape(b, [1, -1])], 0)


def _hoisted_rnn(cell: Any, xt: Tensor, steps: Any, batch: Any) -> tuple | None:
    """The input half of the cell's matmul for every step at once, before the loop.

    For cells with `_hoist` (LSTMCell, GRUCell): `[x_t, h] @ W + b = x_t @ W_x + b +
    h @ W_h`, so `[x, 1] @ [W_x; b]` over all T*B rows is one large GEMM before the loop,
    read per step from a TensorArray, and the loop does only `h @ W_h`. The gradient
    follows: the TensorArray's gradient collects every step's d(pre-activation), and
    dW_x, d(bias) (and d(inputs), only when asked for) come from single large GEMMs
    after the backward loop. Returns (input TensorArrays, step(xs_t, state)), or None
    to run the cell as it is."""
    hoist = getattr(cell, "_hoist", None)
    depth = xt.shape[-1] if xt.shape is not None else None
    if hoist is None or depth is None or not getattr(cell, "_built", False):
        return None
    if DeviceSpec.parse(get_default_graph()._current_device()).device_type == "gpu":
        # On a GPU the projection (T x B x 4u, alive while the forward loop runs) and its
        # gradient array are device memory that swap_memory cannot move to the host, and
        # swapping must not change results: GPU loops keep the per-step cell.
        return None
    parts = hoist(int(depth))
    if parts is None:
        return None
    static = isinstance(steps, int) and isinstance(batch, int)
    ones = array_ops.ones((steps, batch, 1) if static else array_ops.stack([steps, batch, 1]),
                          dtype=xt.dtype)
    # one copy: time-major, contiguous, with the ones column for the bias row
    x_aug = array_ops.concat([xt, ones], 2)
    tied_ta = None
    if parts.tied is not None:
        tied_ta = TensorArray(xt.dtype, size=steps, clear_after_read=False,
                              name="tied_inputs")
    tas = []
    for k, w in enumerate(parts.weights):
        ta = TensorArray(xt.dtype, size=steps, name=f"input_projection_{k}")
        tied = parts.tied if k == 0 else None
        tas.append(project_unstack(ta, x_aug, w, tied=tied))
    return tas, parts.step, tied_ta, parts.tied_input


def static_rnn(cell: Any, inputs: list, initial_state: Any = None, dtype: Any = None,
               sequence_length: Any = None, scope: str | None = None) -> tuple[list, Any]:
    """The same recurrence unrolled in the graph: one copy of the cell per time step,
    sharing the cell's variables. inputs: a list of [batch, depth] tensors."""
    g = get_default_graph()
    with g.name_scope(scope or "rnn"):
        xs = [convert_to_tensor(x) for x in inputs]
        if not xs:
            raise ValueError("static_rnn: inputs is empty")
        for t, x in enumerate(xs):
            if x.shape is not None and len(x.shape) != 2:
                # TF1 wants [batch, depth] steps; a [batch, time, depth] tensor here would
                # fail at the cell's ConcatV2
                raise ValueError(f"static_rnn: inputs must be a list of [batch, depth] "
                                 f"tensors (one per step), got {x.type} ('{x.name}') at "
                                 f"step {t}; unstack a [batch, time, depth] tensor on axis 1")
        batch = _batch_size(xs[0], 0)
        state = _initial_state(cell, batch, dtype or xs[0].dtype, initial_state, xs[0],
                               "static_rnn")
        seq = _sequence_length(sequence_length, batch)
        outs = []
        for t, x in enumerate(xs):
            y, new_state = cell(x, state)
            if seq is not None:
                tt = convert_to_tensor(t)
                y = _masked(tt, seq, y, nest.map_structure(array_ops.zeros_like, y))
                new_state = _masked(tt, seq, new_state, state)
            outs.append(y)
            state = new_state
        return outs, state


def dense(x: Any, units: int, activation: Any = None, use_bias: bool = True,
          name: str | None = None) -> Tensor:
    """`activation(x @ kernel + bias)` with new variables (Glorot-uniform kernel)."""
    x = convert_to_tensor(x)
    g = get_default_graph()
    with g.name_scope(None):
        with g.name_scope(name or "dense") as s:
            scope = s.rstrip("/")
    if not x.dtype.is_floating:
        # TF: "A Dense layer can only be built with a floating-point dtype" (an integer
        # kernel would hold the Glorot values truncated to zeros)
        raise TypeError(f"dense '{scope}': inputs must be floating point, got {x.type} "
                        f"('{x.name}'); cast them with dcf.cast")
    if x.shape is None or x.shape[-1] is None:
        raise ValueError(f"dense '{scope}': the last dimension of the input {x.type} "
                         f"('{x.name}') must be known")
    if len(x.shape) < 2:
        # TF1: "expected min_ndim=2"; it failed at the layer's BatchMatMulV2
        raise ValueError(f"dense '{scope}': the input must have rank >= 2 ([..., "
                         f"features]), got {x.type} ('{x.name}')")
    kernel = _make_var(scope, "kernel", _glorot(f"{scope}/kernel", (int(x.shape[-1]), units),
                                                x.dtype))
    y = math_ops.matmul(x, kernel)
    if use_bias:
        bias = _make_var(scope, "bias", np.zeros(units, x.dtype.np))
        y = y + bias
    return activation(y) if activation is not None else y
