"""A value that would cross a loop boundary without the loop's Enter or Exit is refused
at the first run with an error naming both ops (dcf.control_flow.check_frames), instead
of a run that waits forever on the tagged-token executor. Graphs that cond, while_loop
and gradients build never have such an edge (tests/autodiff/test_nested_grads.py checks
every nesting three deep)."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError
from dcf.ops.registry import OPS


def _loop_reading_outside_directly(into_loop: bool):
    """A while_loop plus one malformed op: inside the loop reading an outer value
    directly (into_loop), or outside it reading a body value."""
    g = dcf.get_default_graph()
    x = dcf.placeholder(dcf.float32, (), name="x")
    outer = x * 2.0
    holder = {}

    def body(i, a):
        if into_loop:
            op = g.create_op("Identity", [outer], [outer.type], name="bad",
                             opdef=OPS["Identity"])    # no Enter: the bug under test
            holder["bad"] = op.outputs[0]
            return i + 1, a + op.outputs[0]
        holder["body"] = a + 1.0
        return i + 1, holder["body"]

    _, y = dcf.while_loop(lambda i, a: i < 3, body, (0, x))
    if into_loop:
        return x, y, "bad"
    with g._control_flow_context(None):
        bad = g.create_op("Identity", [holder["body"]], [holder["body"].type], name="bad_out",
                          opdef=OPS["Identity"], ctx=None, frame_ctx=None)
    return x, bad.outputs[0], "bad_out"


@pytest.mark.parametrize("into_loop", [True, False], ids=["into", "out_of"])
def test_an_edge_across_a_loop_boundary_is_an_error_naming_both_ops(into_loop):
    x, y, name = _loop_reading_outside_directly(into_loop)
    with dcf.Session() as sess:
        with pytest.raises(InvalidArgumentError, match=rf"Identity '(while/)?{name}'.*without an Enter or Exit"):
            sess.run(y, {x: 1.0}, options=dcf.RunOptions(timeout_s=10))


def test_well_formed_loops_and_their_gradients_pass_the_check():
    x = dcf.placeholder(dcf.float64, (), name="x")
    _, y = dcf.while_loop(lambda i, a: i < 3,
                          lambda i, a: (i + 1, dcf.cond(a > 0.0, lambda: a * x, lambda: a - x)),
                          (0, x))
    (g,) = dcf.gradients(y, [x])
    with dcf.Session() as sess:
        got_y, got_g = sess.run([y, g], {x: 1.5})
    np.testing.assert_allclose([got_y, got_g], [1.5 ** 4, 4 * 1.5 ** 3])
