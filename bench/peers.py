"""Peer-system workloads for dcf's benchmarks.

Each ``tf1_*``, ``torch_*`` and ``jax_*`` function builds one workload in its
framework, times it with :func:`bench.harness.time_call`, and returns a
:class:`~bench.harness.Stats` in **seconds per call** (callers turn it into a
rate with :meth:`bench.harness.Result.rate`). Workload-specific facts (graph op
counts, build and compile times, a checksum of the result) go in
``Stats.extra``. Frameworks are imported lazily inside each function, so dcf's
benchmarks import this module without any peer installed; check
:func:`bench.harness.peer_available` first.

The inputs are shared with dcf's side of each benchmark through the
``*_data`` helpers below (plain numpy, seeded), so both sides compute the
same thing.

TF1 means TensorFlow's ``tf.compat.v1`` graph mode with eager execution and
control flow v2 disabled (the Switch/Merge/Enter/Exit/NextIteration
implementation the dcf design reproduces). Those switches are process-wide:
after a ``tf1_*`` call, TF2 ``tf.function`` code in the same process also runs
with control flow v1. Every ``tf1_*`` call builds a fresh ``tf.Graph`` and
``Session`` with default threading and closes it afterwards.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from bench.harness import Stats, time_call

__all__ = [
    "DEFAULT_PARALLEL_ITERATIONS",
    "grad_chain_data",
    "jax_grad_chain",
    "jax_lstm_step",
    "lstm_data",
    "matmul64_data",
    "tf1_distributed_loop",
    "tf1_grad_chain",
    "tf1_loop_rate",
    "tf1_lstm_step",
    "torch_grad_chain",
    "torch_lstm_step",
]

#: dcf's ``while_loop`` default, used for every TF1 loop here (TF1's own
#: default is 10) so the two sides run with the same bound.
DEFAULT_PARALLEL_ITERATIONS = 32

#: Learning rate of every LSTM training step.
LSTM_LEARNING_RATE = 0.01


# --------------------------------------------------------------------------
# Shared inputs (numpy; dcf's benchmarks use the same helpers)
# --------------------------------------------------------------------------


def matmul64_data(size: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(a0, w)`` float32 ``size x size`` matrices for the matmul loop body.

    ``a0`` is uniform in [-1, 1); ``w`` is normal with std ``1/sqrt(size)``
    so ``a = tanh(a @ w)`` stays in a stable range over many iterations.
    """
    rng = np.random.default_rng(seed)
    a0 = rng.uniform(-1.0, 1.0, size=(size, size)).astype(np.float32)
    w = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
    return a0, w


def grad_chain_data(size: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(x0, w0)`` float32 ``size x size`` for the gradient chain ``x = tanh(x @ W)``.

    ``x0`` is uniform in [-1, 1); ``w0`` (the initial trainable ``W``) is
    normal with std ``1/sqrt(size)``.
    """
    rng = np.random.default_rng(seed + 1)
    x0 = rng.uniform(-1.0, 1.0, size=(size, size)).astype(np.float32)
    w0 = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
    return x0, w0


def lstm_data(seq: int, batch: int, input: int, seed: int = 0) -> np.ndarray:
    """Batch-major LSTM input ``[batch, seq, input]`` float32, uniform in [-1, 1)."""
    rng = np.random.default_rng(seed + 2)
    return rng.uniform(-1.0, 1.0, size=(batch, seq, input)).astype(np.float32)


# --------------------------------------------------------------------------
# Framework set-up
# --------------------------------------------------------------------------


def _tf1() -> tuple[Any, Any]:
    """Import TensorFlow in TF1 graph mode with control flow v1; ``(tf, tf.compat.v1)``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # tf.compat.v1.nn.rnn_cell is served by tf_keras (Keras 2) since TF 2.16;
    # the variable is read when rnn_cell is first touched, not at import.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    v1.disable_control_flow_v2()
    tf.get_logger().setLevel("ERROR")
    v1.logging.set_verbosity(v1.logging.ERROR)
    return tf, v1


def _tf1_lstm_cell_class(v1: Any) -> Any:
    """``tf.compat.v1.nn.rnn_cell.LSTMCell`` (needs the ``tf-keras`` package on TF >= 2.16)."""
    try:
        return v1.nn.rnn_cell.LSTMCell
    except (AttributeError, ImportError):
        pass
    try:  # rnn_cell was already bound to Keras 3 in this process
        from tf_keras.src.layers.rnn.legacy_cells import LSTMCell

        return LSTMCell
    except ImportError as exc:
        raise RuntimeError(
            "tf.compat.v1.nn.rnn_cell.LSTMCell needs the tf-keras package with "
            "TensorFlow >= 2.16 (pip install 'tf-keras==<your TF minor>.*')"
        ) from exc


def _count_types(graph: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for op in graph.get_operations():
        counts[op.type] = counts.get(op.type, 0) + 1
    return counts


_V1_LOOP_OPS = ("Enter", "Exit", "Merge", "Switch", "NextIteration", "LoopCond")


def _assert_v1_loop(graph: Any) -> None:
    """Fail loudly if TF silently built a functional (v2) loop instead of v1."""
    counts = _count_types(graph)
    if any(t in counts for t in ("While", "StatelessWhile")) or "LoopCond" not in counts:
        raise RuntimeError(f"expected a control-flow-v1 loop, graph has op types {sorted(counts)}")


# --------------------------------------------------------------------------
# Loop rate
# --------------------------------------------------------------------------


def tf1_loop_rate(
    n: int,
    parallel_iterations: int = DEFAULT_PARALLEL_ITERATIONS,
    body: Literal["trivial", "matmul64"] = "trivial",
    *,
    repeat: int = 10,
    warmup: int = 2,
) -> Stats:
    """TF1 in-graph loop overhead: time of one ``session.run`` of an ``n``-iteration loop.

    ``body="trivial"``: ``i = 0; while i < n: i += 1`` on int32 scalars.
    ``body="matmul64"``: loop vars ``(i, a)``, cond ``i < n``, body
    ``(i + 1, tanh(a @ w))`` with 64x64 float32 ``a`` (fed through a
    placeholder, ``matmul64_data()[0]``) and ``w`` a graph constant captured
    by the loop (``matmul64_data()[1]``).

    Iterations/s = ``n / stats.median``. ``extra``: ``iterations``,
    ``num_ops``, ``build_s``, ``first_run_s`` and ``final`` (the final ``i``,
    or the sum of the final ``a``).
    """
    if body not in ("trivial", "matmul64"):
        raise ValueError(f"body must be 'trivial' or 'matmul64', got {body!r}")
    tf, v1 = _tf1()
    t0 = time.perf_counter()
    graph = tf.Graph()
    with graph.as_default():
        limit = tf.constant(n, dtype=tf.int32, name="n")
        i0 = tf.constant(0, dtype=tf.int32, name="i0")
        feed: dict[Any, Any] = {}
        if body == "trivial":
            fetch = v1.while_loop(
                lambda i: i < limit,
                lambda i: i + 1,
                [i0],
                parallel_iterations=parallel_iterations,
            )
        else:
            a0_np, w_np = matmul64_data()
            a0 = v1.placeholder(tf.float32, shape=a0_np.shape, name="a0")
            w = tf.constant(w_np, name="w")
            _, a_final = v1.while_loop(
                lambda i, a: i < limit,
                lambda i, a: (i + 1, tf.tanh(tf.matmul(a, w))),
                [i0, a0],
                parallel_iterations=parallel_iterations,
            )
            fetch = tf.reduce_sum(a_final)
            feed = {a0: a0_np}
    _assert_v1_loop(graph)
    build_s = time.perf_counter() - t0
    num_ops = len(graph.get_operations())
    with v1.Session(graph=graph) as sess:
        t1 = time.perf_counter()
        final = sess.run(fetch, feed_dict=feed)
        first_run_s = time.perf_counter() - t1
        if body == "trivial" and int(final) != n:
            raise RuntimeError(f"TF1 trivial loop ended at {final}, expected {n}")
        stats = time_call(lambda: sess.run(fetch, feed_dict=feed), repeat=repeat, warmup=warmup)
    stats.extra.update(
        iterations=n,
        parallel_iterations=parallel_iterations,
        body=body,
        num_ops=num_ops,
        build_s=build_s,
        first_run_s=first_run_s,
        final=float(final),
    )
    return stats


# --------------------------------------------------------------------------
# Gradient of a loop: x = tanh(x @ W), iters times, loss = sum(x)
# --------------------------------------------------------------------------


def tf1_grad_chain(iters: int, *, repeat: int = 10, warmup: int = 2) -> Stats:
    """TF1 forward+backward of ``iters`` steps of ``x = tanh(x @ W)``.

    10x10 float32 (``grad_chain_data()``); ``W`` a trainable variable,
    ``x0`` a constant; the chain is a ``tf.while_loop`` (parallel_iterations
    32, loop vars ``(i, x)``); loss ``reduce_sum(x)``; one call is one
    ``sess.run`` of ``tf.gradients(loss, W)``.
    ``extra``: ``num_ops``, ``build_s``, ``first_run_s``, ``grad_sum``.
    """
    tf, v1 = _tf1()
    x0_np, w0_np = grad_chain_data()
    t0 = time.perf_counter()
    graph = tf.Graph()
    with graph.as_default():
        w = v1.Variable(w0_np, name="W", trainable=True)
        x0 = tf.constant(x0_np, name="x0")
        limit = tf.constant(iters, dtype=tf.int32)
        _, x = v1.while_loop(
            lambda i, x: i < limit,
            lambda i, x: (i + 1, tf.tanh(tf.matmul(x, w))),
            [tf.constant(0, dtype=tf.int32), x0],
            parallel_iterations=DEFAULT_PARALLEL_ITERATIONS,
        )
        loss = tf.reduce_sum(x)
        (grad,) = tf.gradients(loss, [w])
        init = v1.global_variables_initializer()
    _assert_v1_loop(graph)
    build_s = time.perf_counter() - t0
    num_ops = len(graph.get_operations())
    with v1.Session(graph=graph) as sess:
        sess.run(init)
        t1 = time.perf_counter()
        g = sess.run(grad)
        first_run_s = time.perf_counter() - t1
        stats = time_call(lambda: sess.run(grad), repeat=repeat, warmup=warmup)
    stats.extra.update(
        iterations=iters,
        num_ops=num_ops,
        build_s=build_s,
        first_run_s=first_run_s,
        grad_sum=float(np.sum(g)),
    )
    return stats


def torch_grad_chain(iters: int, *, repeat: int = 10, warmup: int = 2) -> Stats:
    """PyTorch eager forward+backward of ``iters`` steps of ``x = tanh(x @ W)``.

    Same data as :func:`tf1_grad_chain`; a Python loop, ``loss = x.sum()``,
    ``loss.backward()``; ``W.grad`` is reset before each call.
    ``extra``: ``grad_sum``.
    """
    import torch

    x0_np, w0_np = grad_chain_data()
    x0 = torch.from_numpy(x0_np.copy())
    w = torch.from_numpy(w0_np.copy()).requires_grad_(True)

    def step() -> Any:
        w.grad = None
        x = x0
        for _ in range(iters):
            x = torch.tanh(x @ w)
        x.sum().backward()
        return w.grad

    g = step()
    stats = time_call(step, repeat=repeat, warmup=warmup)
    stats.extra.update(iterations=iters, grad_sum=float(g.sum()))
    return stats


def jax_grad_chain(iters: int, *, repeat: int = 10, warmup: int = 2) -> Stats:
    """JAX ``jit(grad(...))`` of ``iters`` steps of ``x = tanh(x @ W)`` via ``lax.scan``.

    (JAX cannot reverse-differentiate ``lax.while_loop``.) Same data as
    :func:`tf1_grad_chain`. ``extra``: ``compile_and_first_run_s``, ``grad_sum``.
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    x0_np, w0_np = grad_chain_data()
    x0 = jnp.asarray(x0_np)
    w0 = jnp.asarray(w0_np)

    def loss(w: Any, x: Any) -> Any:
        def step(x: Any, _: Any) -> tuple[Any, None]:
            return jnp.tanh(x @ w), None

        x, _ = lax.scan(step, x, None, length=iters)
        return jnp.sum(x)

    grad_fn = jax.jit(jax.grad(loss))
    t0 = time.perf_counter()
    g = grad_fn(w0, x0).block_until_ready()
    compile_s = time.perf_counter() - t0
    stats = time_call(lambda: grad_fn(w0, x0).block_until_ready(), repeat=repeat, warmup=warmup)
    stats.extra.update(
        iterations=iters, compile_and_first_run_s=compile_s, grad_sum=float(jnp.sum(g))
    )
    return stats


# --------------------------------------------------------------------------
# LSTM training step
# --------------------------------------------------------------------------


def tf1_lstm_step(
    kind: Literal["dynamic", "static"] = "dynamic",
    seq: int = 100,
    batch: int = 32,
    input: int = 64,
    units: int = 128,
    *,
    repeat: int = 5,
    warmup: int = 1,
) -> Stats:
    """TF1 single-layer LSTM training step; time of one ``sess.run(train_op)``.

    Input ``[batch, seq, input]`` (batch-major, fed; ``lstm_data``) into
    ``tf.compat.v1.nn.rnn_cell.LSTMCell(units)`` (forget_bias 1.0, no
    peepholes), unrolled by ``nn.dynamic_rnn`` (a while loop,
    parallel_iterations 32) or ``nn.static_rnn`` (``seq`` copies of the cell);
    loss ``reduce_mean(square(outputs))``; one
    ``GradientDescentOptimizer(0.01).minimize(loss)`` step per call.

    ``extra``: ``num_ops`` (graph size after ``minimize``), ``build_s`` (graph
    construction incl. gradients), ``first_run_s`` (first training step,
    after variable initialisation) and ``build_and_first_run_s`` (build,
    session creation, initialisation and first step), ``loss``.
    """
    if kind not in ("dynamic", "static"):
        raise ValueError(f"kind must be 'dynamic' or 'static', got {kind!r}")
    tf, v1 = _tf1()
    cell_cls = _tf1_lstm_cell_class(v1)
    x_np = lstm_data(seq, batch, input)
    t0 = time.perf_counter()
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(0)
        x = v1.placeholder(tf.float32, shape=(batch, seq, input), name="x")
        cell = cell_cls(units)
        if kind == "dynamic":
            outputs, _ = v1.nn.dynamic_rnn(
                cell, x, dtype=tf.float32, parallel_iterations=DEFAULT_PARALLEL_ITERATIONS
            )
        else:
            outs, _ = v1.nn.static_rnn(cell, tf.unstack(x, axis=1), dtype=tf.float32)
            outputs = tf.stack(outs, axis=1)
        loss = tf.reduce_mean(tf.square(outputs))
        train_op = v1.train.GradientDescentOptimizer(LSTM_LEARNING_RATE).minimize(loss)
        init = v1.global_variables_initializer()
    if kind == "dynamic":
        _assert_v1_loop(graph)
    build_s = time.perf_counter() - t0
    num_ops = len(graph.get_operations())
    feed = {x: x_np}
    with v1.Session(graph=graph) as sess:
        sess.run(init)
        t1 = time.perf_counter()
        _, loss_val = sess.run([train_op, loss], feed_dict=feed)
        t2 = time.perf_counter()
        stats = time_call(lambda: sess.run(train_op, feed_dict=feed), repeat=repeat, warmup=warmup)
    stats.extra.update(
        kind=kind,
        seq=seq,
        batch=batch,
        input=input,
        units=units,
        num_ops=num_ops,
        build_s=build_s,
        first_run_s=t2 - t1,
        build_and_first_run_s=t2 - t0,
        loss=float(loss_val),
    )
    return stats


def torch_lstm_step(
    kind: Literal["cell_loop", "fused"] = "cell_loop",
    seq: int = 100,
    batch: int = 32,
    input: int = 64,
    units: int = 128,
    *,
    repeat: int = 5,
    warmup: int = 1,
) -> Stats:
    """PyTorch eager LSTM training step, same shapes/loss as :func:`tf1_lstm_step`.

    ``kind="cell_loop"``: ``nn.LSTMCell`` stepped by a Python loop over time;
    ``kind="fused"``: one ``nn.LSTM(batch_first=True)`` call. One
    ``torch.optim.SGD(lr=0.01)`` step per call. ``extra``: ``first_run_s``, ``loss``.
    """
    if kind not in ("cell_loop", "fused"):
        raise ValueError(f"kind must be 'cell_loop' or 'fused', got {kind!r}")
    import torch

    torch.manual_seed(0)
    x = torch.from_numpy(lstm_data(seq, batch, input))
    module: torch.nn.Module
    if kind == "cell_loop":
        module = torch.nn.LSTMCell(input, units)
    else:
        module = torch.nn.LSTM(input, units, batch_first=True)
    opt = torch.optim.SGD(module.parameters(), lr=LSTM_LEARNING_RATE)

    def forward() -> Any:
        if kind == "cell_loop":
            h = torch.zeros(batch, units)
            c = torch.zeros(batch, units)
            outs = []
            for t in range(seq):
                h, c = module(x[:, t], (h, c))
                outs.append(h)
            return torch.stack(outs, dim=1)
        out, _ = module(x)
        return out

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = forward().square().mean()
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    loss_val = float(step().detach())
    first_run_s = time.perf_counter() - t0
    stats = time_call(step, repeat=repeat, warmup=warmup)
    stats.extra.update(
        kind=kind,
        seq=seq,
        batch=batch,
        input=input,
        units=units,
        first_run_s=first_run_s,
        loss=loss_val,
    )
    return stats


def jax_lstm_step(
    seq: int = 100,
    batch: int = 32,
    input: int = 64,
    units: int = 128,
    *,
    repeat: int = 5,
    warmup: int = 1,
) -> Stats:
    """JAX LSTM training step: ``lax.scan`` over time, ``jit``'d grad + SGD update.

    The cell is TF1's ``LSTMCell`` (one ``[input+units, 4*units]`` kernel,
    gates i, j, f, o, forget_bias 1.0); same input and loss as
    :func:`tf1_lstm_step`, learning rate 0.01. ``extra``:
    ``compile_and_first_run_s``, ``loss``.
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    x = jnp.asarray(lstm_data(seq, batch, input))
    rng = np.random.default_rng(3)
    limit = np.sqrt(6.0 / (input + units + 4 * units))  # glorot uniform, as TF1
    params = {
        "kernel": jnp.asarray(
            rng.uniform(-limit, limit, size=(input + units, 4 * units)).astype(np.float32)
        ),
        "bias": jnp.zeros((4 * units,), jnp.float32),
    }

    def loss_fn(p: dict[str, Any], x: Any) -> Any:
        def cell(carry: tuple[Any, Any], x_t: Any) -> tuple[tuple[Any, Any], Any]:
            c, h = carry
            z = jnp.concatenate([x_t, h], axis=1) @ p["kernel"] + p["bias"]
            i, j, f, o = jnp.split(z, 4, axis=1)
            c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(j)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (c, h), h

        zeros = jnp.zeros((batch, units), jnp.float32)
        _, hs = lax.scan(cell, (zeros, zeros), jnp.swapaxes(x, 0, 1))
        return jnp.mean(jnp.square(hs))

    @jax.jit
    def train_step(p: dict[str, Any], x: Any) -> tuple[dict[str, Any], Any]:
        loss, grads = jax.value_and_grad(loss_fn)(p, x)
        new_p = jax.tree_util.tree_map(lambda a, g: a - LSTM_LEARNING_RATE * g, p, grads)
        return new_p, loss

    state = {"params": params}

    def step() -> Any:
        new_p, loss = train_step(state["params"], x)
        jax.block_until_ready(new_p)
        state["params"] = new_p
        return loss

    t0 = time.perf_counter()
    loss_val = float(step())
    compile_s = time.perf_counter() - t0
    stats = time_call(step, repeat=repeat, warmup=warmup)
    stats.extra.update(
        seq=seq,
        batch=batch,
        input=input,
        units=units,
        compile_and_first_run_s=compile_s,
        loss=loss_val,
    )
    return stats


# --------------------------------------------------------------------------
# Distributed while loop (TF1 gRPC runtime on loopback)
# --------------------------------------------------------------------------


def _free_loopback_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together, then released)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_TF1_LOOP_VAR_OPS = frozenset(
    {
        "Enter",
        "Merge",
        "Switch",
        "NextIteration",
        "Exit",
        "Identity",
        "RefEnter",
        "RefMerge",
        "RefSwitch",
        "RefNextIteration",
        "RefExit",
        "RefIdentity",
    }
)


def _tf1_distributed_loop_impl(
    num_tasks: int, barrier: bool, iters: int, parallel_iterations: int, repeat: int, warmup: int
) -> Stats:
    tf, v1 = _tf1()
    ports = _free_loopback_ports(num_tasks)
    cluster = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{p}" for p in ports]})
    servers = [
        tf.distribute.Server(cluster, job_name="worker", task_index=k, start=True)
        for k in range(num_tasks)
    ]

    def task(k: int) -> str:
        return f"/job:worker/task:{k}"

    def loop_var_device(op: Any) -> str:
        # Keep each loop variable's control-flow ops (Enter, Merge, Switch,
        # NextIteration, Exit, Identity) with the value they carry, so a
        # task's state stays on that task; everything else defaults to task 0.
        if op.type in _TF1_LOOP_VAR_OPS and op.inputs and op.inputs[0].device:
            return op.inputs[0].device
        return op.device or task(0)

    t0 = time.perf_counter()
    graph = tf.Graph()
    with graph.as_default():
        with tf.device(task(0)):
            limit = tf.constant(iters, dtype=tf.int32, name="n")
            i0 = tf.constant(0, dtype=tf.int32, name="i0")
        loop_vars: list[Any]
        body: Callable[..., Any]
        if barrier:
            with tf.device(task(0)):
                x0 = tf.constant(0.0, dtype=tf.float32, name="x0")
            scale = 1.0 / num_tasks

            def body(i: Any, x: Any) -> tuple[Any, Any]:
                ys = []
                for k in range(num_tasks):
                    with tf.device(task(k)):
                        ys.append(x + 1.0)
                with tf.device(task(0)):
                    return i + 1, tf.add_n(ys) * scale

            loop_vars = [i0, x0]
        else:
            xs0 = []
            for k in range(num_tasks):
                with tf.device(task(k)):
                    xs0.append(tf.constant(0.0, dtype=tf.float32, name=f"x0_{k}"))

            def body(i: Any, *xs: Any) -> tuple[Any, ...]:
                out = []
                for k, x in enumerate(xs):
                    with tf.device(task(k)):
                        out.append(x + 1.0)
                with tf.device(task(0)):
                    return (i + 1, *out)

            loop_vars = [i0, *xs0]
        with graph.device(loop_var_device):
            final = v1.while_loop(
                lambda i, *_: i < limit, body, loop_vars, parallel_iterations=parallel_iterations
            )
    _assert_v1_loop(graph)
    build_s = time.perf_counter() - t0
    num_ops = len(graph.get_operations())
    sess = v1.Session(servers[0].target, graph=graph)
    try:
        t1 = time.perf_counter()
        values = sess.run(final)
        first_run_s = time.perf_counter() - t1
        if int(values[0]) != iters or any(abs(float(v) - iters) > 1e-3 * iters for v in values[1:]):
            raise RuntimeError(f"distributed loop computed {values}, expected all {iters}")
        stats = time_call(lambda: sess.run(final), repeat=repeat, warmup=warmup)
    finally:
        sess.close()
    stats.extra.update(
        num_tasks=num_tasks,
        barrier=barrier,
        iterations=iters,
        parallel_iterations=parallel_iterations,
        num_ops=num_ops,
        build_s=build_s,
        first_run_s=first_run_s,
    )
    return stats


_CHILD_MARKER = "BENCH_PEERS_RESULT "


def _run_isolated(func_name: str, kwargs: dict[str, Any], timeout_s: float) -> Stats:
    """Run ``bench.peers.<func_name>(**kwargs)`` in a fresh Python process; return its Stats.

    The child is ``python -m bench.peers``; it prints one marker line with the
    Stats as JSON. Unlike ``multiprocessing`` this never re-imports the
    caller's ``__main__``.
    """
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH", "")) if p)
    request = json.dumps({"func": func_name, "kwargs": kwargs})
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.peers", request],
            cwd=repo_root,
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"{func_name}({kwargs}) gave no result within {timeout_s} s") from None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_CHILD_MARKER):
            data = json.loads(line[len(_CHILD_MARKER) :])
            if "error" in data:
                raise RuntimeError(f"{func_name} failed in its subprocess:\n{data['error']}")
            return Stats(**data)
    tail = (proc.stdout + proc.stderr)[-4000:]
    raise RuntimeError(f"{func_name} subprocess exited {proc.returncode} with no result:\n{tail}")


def _child_main(request: str) -> None:
    """Entry point of :func:`_run_isolated`'s child process."""
    spec = json.loads(request)
    try:
        func = {"_tf1_distributed_loop_impl": _tf1_distributed_loop_impl}[spec["func"]]
        stats = func(**spec["kwargs"])
        text = json.dumps(stats.to_dict(), default=float)
    except BaseException:  # noqa: BLE001 - report everything to the parent
        text = json.dumps({"error": traceback.format_exc()})
    sys.stdout.write(_CHILD_MARKER + text + "\n")
    sys.stdout.flush()
    # TF's gRPC servers cannot be stopped and keep threads alive: leave
    # without interpreter shutdown.
    os._exit(0)


def tf1_distributed_loop(
    num_tasks: int,
    barrier: bool,
    iters: int,
    *,
    parallel_iterations: int = DEFAULT_PARALLEL_ITERATIONS,
    repeat: int = 5,
    warmup: int = 1,
    isolate: bool = True,
    timeout_s: float = 600.0,
) -> Stats:
    """TF1 distributed while loop over ``num_tasks`` gRPC tasks on 127.0.0.1.

    ``num_tasks`` in-process ``tf.distribute.Server``s form the cluster
    ``{"worker": ["127.0.0.1:PORT", ...]}``; the session is task 0's master.
    One ``tf.while_loop`` of ``iters`` iterations, counter ``i`` and cond
    ``i < iters`` on task 0; the body puts one scalar float32 add on each task:

    * ``barrier=True``: loop vars ``(i, x)`` with ``x`` on task 0; task ``k``
      computes ``y_k = x + 1``; the next ``x = add_n(y_0..y_{N-1}) * (1/N)``
      on task 0 (so every iteration waits for all tasks; ``x`` ends at ``iters``).
    * ``barrier=False``: loop vars ``(i, x_0, ..., x_{N-1})``, ``x_k`` and its
      loop machinery on task ``k``, ``x_k = x_k + 1`` there; tasks share only
      the loop predicate (each ``x_k`` ends at ``iters``).

    One call is one ``sess.run`` of the loop; iterations/s = ``iters / median``.
    With ``isolate`` (default) the cluster lives in a fresh Python process
    (TF servers cannot be shut down in-process), so repeated calls don't
    accumulate idle servers. ``extra``: ``num_ops``, ``build_s``, ``first_run_s``.
    """
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    kwargs: dict[str, Any] = {
        "num_tasks": num_tasks,
        "barrier": bool(barrier),
        "iters": iters,
        "parallel_iterations": parallel_iterations,
        "repeat": repeat,
        "warmup": warmup,
    }
    if not isolate:
        return _tf1_distributed_loop_impl(**kwargs)
    return _run_isolated("_tf1_distributed_loop_impl", kwargs, timeout_s)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("bench.peers runs as a script only as the child of tf1_distributed_loop")
    _child_main(sys.argv[1])
