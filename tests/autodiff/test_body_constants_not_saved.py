"""A constant of a while_loop's body that a gradient needs is made again in the backward
loop (as TF1's), not pushed on a stack once per forward iteration and popped back."""

from __future__ import annotations

import numpy as np
import pytest

import dcf

F64 = dcf.float64


def _reference(a: float, n: int) -> float:
    """d/da of n steps of a -> 2 sin(a) + 3 a^2, by the chain rule in float64."""
    d = 1.0
    for _ in range(n):
        d *= 2.0 * np.cos(a) + 6.0 * a
        a = 2.0 * np.sin(a) + 3.0 * a * a
    return d


@pytest.mark.parametrize("compiled", [True, False])
def test_a_body_constant_is_not_saved_and_the_gradient_is_right(compiled):
    g = dcf.get_default_graph()
    x = dcf.placeholder(F64, ())
    out = dcf.while_loop(lambda i, a: i < 5,
                         lambda i, a: (i + 1, dcf.sin(a) * 2.0 + dcf.square(a) * 3.0),
                         (0, x))[1]
    dx = dcf.gradients(out, x)[0]
    pushed = [op.inputs[1].op.type for op in g.get_operations() if op.type == "StackPushV2"]
    assert pushed and "Const" not in pushed
    with dcf.Session(config=dcf.SessionConfig(compile_frames=compiled)) as sess:
        assert sess.run(dx, {x: 0.1}) == pytest.approx(_reference(0.1, 5), rel=1e-12)


def test_a_constant_in_a_cond_inside_the_loop_is_made_in_its_gradient_branch():
    g = dcf.get_default_graph()
    x = dcf.placeholder(F64, ())

    def body(i, a):
        a = dcf.cond(dcf.equal(i % 2, 0), lambda: a * 3.0, lambda: dcf.sin(a) * 0.5)
        return i + 1, a

    out = dcf.while_loop(lambda i, a: i < 4, body, (0, x))[1]
    dx = dcf.gradients(out, x)[0]
    assert all(op.inputs[1].op.type != "Const"
               for op in g.get_operations() if op.type == "StackPushV2")
    a, d = 0.3, 1.0
    for i in range(4):
        d, a = (d * 3.0, a * 3.0) if i % 2 == 0 else (d * 0.5 * np.cos(a), np.sin(a) * 0.5)
    with dcf.Session() as sess:
        assert sess.run(dx, {x: 0.3}) == pytest.approx(d, rel=1e-12)
