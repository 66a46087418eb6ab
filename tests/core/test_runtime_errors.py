"""Kernel errors at run time: the message leads with the op, says the device and, in a
loop, the frame and iteration, then the cause and the creation site; on both paths."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.errors import DcfError, InvalidArgumentError, OutOfRangeError


def _py_scalar(fn, inputs, dtype, name=None):
    """A py_func computing a scalar of `dtype`, with a static scalar shape."""
    return dcf.reshape(dcf.py_func(fn, list(inputs), dtype, name=name), [])


def _fail_at(k: int, exc: type = ValueError):
    def fn(i):
        if i == k:
            raise exc(f"bad value {i}")
        return i

    return fn


def test_root_kernel_error_names_op_and_site_without_frame(run_graph):
    x = dcf.placeholder(dcf.float32, (None,))
    y = dcf.reshape(x, [2, 2], name="square")
    with pytest.raises(InvalidArgumentError) as info:
        run_graph(y, {x: np.ones(3)})
    msg = str(info.value)
    assert msg.startswith("Reshape 'square': ")
    assert ", frame '" not in msg and "iteration" not in msg
    assert "op created at test_runtime_errors.py:" in msg
    assert "in test_root_kernel_error_names_op_and_site_without_frame()" in msg


def test_kernel_error_in_a_loop_names_frame_and_iteration(compiled, run_graph):
    out = dcf.while_loop(
        lambda i: i < 6,
        lambda i: _py_scalar(_fail_at(3), [i], dcf.int32, name="check") + 1,
        0,
        name="loop",
    )
    with pytest.raises(
        InvalidArgumentError,
        match=r"^PyFunc 'loop/check', frame 'loop' iteration 3: ValueError: "
        r"bad value 3\n  op created at test_runtime_errors.py:\d+ in "
        r"_py_scalar\(\)$",
    ):
        run_graph(out, config=compiled)


def test_index_error_becomes_out_of_range(compiled, run_graph):
    out = dcf.while_loop(
        lambda i: i < 4,
        lambda i: _py_scalar(_fail_at(2, IndexError), [i], dcf.int32, name="lookup") + 1,
        0,
        name="loop",
    )
    with pytest.raises(
        OutOfRangeError,
        match=r"PyFunc 'loop/lookup', frame 'loop' iteration "
        r"2: IndexError: bad value 2",
    ):
        run_graph(out, config=compiled)


def test_kernel_error_in_a_nested_loop_names_the_inner_frame(compiled, run_graph):
    def outer(i):
        def inner(j):
            return (
                _py_scalar(lambda a, b: _fail_at(5)(a * 10 + b), [i, j], dcf.int32, name="cell") * 0
                + j
                + 1
            )

        return i + 1 + dcf.while_loop(lambda j: j < 3, inner, 0, name="inner") * 0

    out = dcf.while_loop(lambda i: i < 4, outer, 0, name="outer")
    assert run_graph(out, config=compiled) == 4  # 10*i + j never equals 5
    out2 = dcf.while_loop(
        lambda i: i < 4,
        lambda i: (
            outer(i)
            + 0
            * dcf.while_loop(
                lambda j: j < 3,
                lambda j: (
                    _py_scalar(_fail_at(12), [i * 10 + j], dcf.int32, name="cell2") * 0 + j + 1
                ),
                0,
                name="in2",
            )
        ),
        0,
        name="out2",
    )
    with pytest.raises(
        InvalidArgumentError,
        match=r"PyFunc 'out2/in2/cell2', frame 'out2/in2' "
        r"iteration 2, inside frame 'out2' iteration 1: ValueError: bad value 12",
    ):
        run_graph(out2, config=compiled)


def test_kernel_error_in_a_cond_inside_a_loop(compiled, run_graph):
    def body(i):
        return (
            dcf.cond(i > 1, lambda: _py_scalar(_fail_at(2), [i], dcf.int32, name="hi"), lambda: i)
            + 1
        )

    out = dcf.while_loop(lambda i: i < 5, body, 0, name="loop")
    with pytest.raises(
        InvalidArgumentError,
        match=r"PyFunc 'loop/cond/hi', frame 'loop' "
        r"iteration 2: ValueError: bad value 2",
    ):
        run_graph(out, config=compiled)


def test_kernel_error_on_another_device_names_device_frame_and_iteration(compiled, run_graph):
    def body(i):
        with dcf.device("/cpu:1"):
            v = _py_scalar(_fail_at(2), [i], dcf.int32, name="remote")
        return v + 1

    out = dcf.while_loop(lambda i: i < 4, body, 0, name="loop")
    with pytest.raises(
        InvalidArgumentError,
        match=r"PyFunc 'loop/remote' on /cpu:1, frame "
        r"'loop' iteration 2: ValueError",
    ):
        run_graph(out, config=compiled)


def test_integer_division_by_zero_names_the_op_frame_and_iteration(compiled, run_graph):
    """As TensorFlow's CPU kernels (numpy alone would give 0 with a warning); a float
    division by zero stays inf."""
    n = dcf.placeholder(dcf.int32, (), name="n")

    def body(i, acc):
        return i + 1, acc + dcf.floordiv(12, 2 - i, name="share") + dcf.mod(7, 3 - i,
                                                                             name="rest")

    out = dcf.while_loop(lambda i, acc: i < n, body, (0, 0), name="loop")[1]
    assert run_graph(out, {n: 2}, config=compiled) == (6 + 1) + (12 + 1)
    with pytest.raises(InvalidArgumentError,
                       match=r"^FloorDiv 'loop/share', frame 'loop' iteration 2: "
                             r"ZeroDivisionError: integer division by zero"):
        run_graph(out, {n: 4}, config=compiled)
    m = dcf.placeholder(dcf.int64, (None,), name="m")
    with pytest.raises(InvalidArgumentError, match=r"^FloorMod 'rem': ZeroDivisionError: "
                                                   r"integer modulo by zero"):
        run_graph(dcf.mod(dcf.constant([5, 6], dcf.int64), m, name="rem"),
                  {m: np.array([2, 0])}, config=compiled)
    with np.errstate(divide="ignore"):
        assert run_graph(dcf.constant(1.0) // 0.0, config=compiled) == np.inf


def test_every_runtime_error_is_a_dcf_error():
    for cls in (
        dcf.errors.InvalidArgumentError,
        dcf.errors.OutOfRangeError,
        dcf.errors.WorkerError,
        dcf.errors.DeadlineExceededError,
        dcf.errors.ResourceExhaustedError,
    ):
        assert issubclass(cls, DcfError)
