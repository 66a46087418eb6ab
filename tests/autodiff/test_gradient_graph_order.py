"""gradients() builds the same graph in every process: a loop's gradient makes the
accumulators of the variables read inside it in the order the variables were asked for
(it kept them in a set of tensors, hashed by identity, so their order -- and with it the
gradient loop's node names and order, and the compiled frames' order of work -- changed
from process to process; bench/NOTES.md, "GPU, session 25")."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

import dcf

N = 6


def _graph(order):
    g = dcf.Graph()
    with g.as_default():
        ws = [dcf.Variable(np.full((k + 1, 3), 0.1, np.float32), name=f"w{k}")
              for k in range(N)]

        def body(i, x):
            for w in ws:
                x = x * (1.0 + dcf.reduce_sum(w))
            return i + 1, x

        _, y = dcf.while_loop(lambda i, x: i < 3, body, (0, dcf.ones([3])))
        grads = dcf.gradients(dcf.reduce_sum(y), [ws[k] for k in order])
    return g, grads


def _accumulator_rows(g) -> list:
    """The first dimension of each gradient-loop accumulator, in the order made: the
    Enters of the gradient loop fed by zeros of a variable's shape."""
    rows = []
    for op in g.get_operations():
        if op.type == "Enter" and "grad" in op.name and op.inputs and \
                op.inputs[0].op.type in ("Fill", "Const", "ZerosLike") and \
                op.outputs[0].shape is not None and len(op.outputs[0].shape) == 2:
            rows.append(op.outputs[0].shape[0])
    return rows


def test_accumulators_follow_the_order_asked():
    for order in (list(range(N)), list(range(N - 1, -1, -1))):
        g, grads = _graph(order)
        assert _accumulator_rows(g) == [k + 1 for k in order]
        assert [t.shape[0] for t in grads] == [k + 1 for k in order]


_DUMP = """
import tests.autodiff.test_gradient_graph_order as m
g, _ = m._graph(list(range(m.N)))
for op in g.get_operations():
    print(op.name, op.type, [t.name for t in op.inputs])
"""


def test_the_same_graph_in_two_processes():
    outs = [subprocess.run([sys.executable, "-c", _DUMP], capture_output=True, text=True,
                           check=True, timeout=120).stdout for _ in range(2)]
    assert outs[0] and outs[0] == outs[1]
