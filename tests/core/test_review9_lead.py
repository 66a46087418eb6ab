"""Found in review round 9 by the lead. Each test fails without its fix."""

from __future__ import annotations

import numpy as np
import pytest

import dcf


@pytest.mark.parametrize("pi", [2.5, None, True, "3", np.float32(4.0)])
def test_while_loop_refuses_a_parallel_iterations_that_is_not_an_integer(pi):
    # int() cut 2.5 to 2 silently and None gave int()'s own TypeError naming no loop
    # (TF1 refuses both); numpy integers stay welcome
    with pytest.raises(TypeError, match=r"while_loop 'lp': parallel_iterations must be an "
                                        r"integer >= 1"):
        dcf.while_loop(lambda i: i < 3, lambda i: i + 1, [dcf.constant(0)],
                       parallel_iterations=pi, name="lp")


def test_while_loop_takes_a_numpy_integer_parallel_iterations():
    out = dcf.while_loop(lambda i: i < 3, lambda i: i + 1, [dcf.constant(0)],
                         parallel_iterations=np.int64(4))
    with dcf.Session() as sess:
        assert sess.run(out) == 3
