"""A run-time error inside a nested loop names every loop's iteration: the op's own
frame and iteration, then each enclosing loop's frame and iteration, innermost first
(before, only the innermost iteration was named, so "iteration 1" could be any of the
outer loop's iterations). Both execution paths: compiled frames and the tagged-token
executor. The failing iteration is chosen by the test, so the expected numbers are
known independently."""

from __future__ import annotations

import numpy as np
import pytest

import dcf

PATHS = [None, dcf.SessionConfig(compile_frames=False)]


def _fail_at(where):
    """A py_func body that raises at the given (i, j, ...) loop counters."""
    def fn(*counters):
        if tuple(int(c) for c in counters) == where:
            raise ValueError("boom")
        return np.float32(1.0)
    return fn


def _two_level(where):
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, [])

        def outer_body(i, acc):
            def inner_body(j, a):
                one = dcf.py_func(_fail_at(where), [i, j], dcf.float32)
                return j + 1, a + dcf.reshape(one, [])
            _, a = dcf.while_loop(lambda j, a: j < 3, inner_body, (0, acc), name="inner")
            return i + 1, a

        _, out = dcf.while_loop(lambda i, a: i < 4, outer_body, (0, x), name="outer")
    return g, x, out


@pytest.mark.parametrize("config", PATHS, ids=["compiled", "executor"])
def test_error_in_an_inner_loop_names_the_outer_iteration(config):
    g, x, out = _two_level((2, 1))
    with dcf.Session(g, config=config) as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError) as info:
            sess.run(out, {x: 0.0})
        assert "frame 'outer/inner' iteration 1, inside frame 'outer' iteration 2" \
            in str(info.value)
        # the same graph runs when nothing fails: 4 * 3 ones
        g2, x2, out2 = _two_level((-1, -1))
    with dcf.Session(g2, config=config) as sess:
        assert sess.run(out2, {x2: 0.5}) == pytest.approx(12.5)


@pytest.mark.parametrize("config", PATHS, ids=["compiled", "executor"])
def test_three_levels_are_named_innermost_first(config):
    g = dcf.Graph()
    with g.as_default():
        def a_body(i, s):
            def b_body(j, s):
                def c_body(k, s):
                    one = dcf.py_func(_fail_at((1, 0, 2)), [i, j, k], dcf.float32)
                    return k + 1, s + dcf.reshape(one, [])
                return j + 1, dcf.while_loop(lambda k, s: k < 3, c_body, (0, s), name="c")[1]
            return i + 1, dcf.while_loop(lambda j, s: j < 2, b_body, (0, s), name="b")[1]
        out = dcf.while_loop(lambda i, s: i < 3, a_body, (0, dcf.constant(0.0)), name="a")[1]
    with dcf.Session(g, config=config) as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError) as info:
            sess.run(out)
    assert ("frame 'a/b/c' iteration 2, inside frame 'a/b' iteration 0, "
            "inside frame 'a' iteration 1") in str(info.value)


def test_an_error_in_an_outer_loop_names_no_inner_loop():
    g = dcf.Graph()
    with g.as_default():
        def body(i, s):
            one = dcf.py_func(_fail_at((3,)), [i], dcf.float32)
            return i + 1, s + dcf.reshape(one, [])
        out = dcf.while_loop(lambda i, s: i < 5, body, (0, dcf.constant(0.0)), name="solo")[1]
    with dcf.Session(g) as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError) as info:
            sess.run(out)
    first = str(info.value).splitlines()[0]
    assert "frame 'solo' iteration 3:" in first and "inside" not in first


def test_a_deadline_in_an_inner_loop_names_the_outer_iteration():
    g = dcf.Graph()
    with g.as_default():
        n = dcf.placeholder(dcf.int32, [])

        def outer_body(i, s):
            # the inner loop never ends on its own: the deadline stops it in outer
            # iteration 0
            _, s2 = dcf.while_loop(lambda j, s: j >= 0, lambda j, s: (j + 1, s + 1.0),
                                   (0, s), name="spin")
            return i + 1, s2

        out = dcf.while_loop(lambda i, s: i < n, outer_body, (0, dcf.constant(0.0)),
                             name="around")[1]
    with dcf.Session(g) as sess:
        with pytest.raises(dcf.errors.DeadlineExceededError) as info:
            sess.run(out, {n: 2}, options=dcf.RunOptions(timeout_s=0.2))
    assert "frame 'around/spin'" in str(info.value)
    assert "inside frame 'around' iteration 0" in str(info.value)
