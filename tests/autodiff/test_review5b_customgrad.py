"""Review 5 of extending autodiff, by use: RegisterGradient for new op types and for
py_func, errors of a registered gradient function (naming the op), gradients(...,
stop_gradients=...) against TF1's values, and gradients across devices. Reference values
were computed with TF1 and float64 finite differences when the tests were written; the
tests assert closed forms."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.ops.registry import GRADIENTS, OpDef, apply, register

from tests.autodiff.gradcheck import run

f64 = dcf.float64

for _type in ("Review5bSquare", "Review5bRaises", "Review5bWrongDtype", "Review5bNotTensor",
              "Review5bPythonScalar"):
    register(OpDef(_type, infer=lambda x: x, kernel=lambda xp, x: x * x))


@dcf.RegisterGradient("Review5bSquare")
def _square_grad(op, g):
    return g * 2.0 * op.inputs[0]


@dcf.RegisterGradient("Review5bRaises")
def _raising_grad(op, g):
    raise RuntimeError("my gradient is broken")


@dcf.RegisterGradient("Review5bWrongDtype")
def _wrong_dtype_grad(op, g):
    return dcf.cast(g, dcf.float64)


@dcf.RegisterGradient("Review5bNotTensor")
def _not_tensor_grad(op, g):
    return "abc"


@dcf.RegisterGradient("Review5bPythonScalar")
def _python_scalar_grad(op, g):
    return 2.0   # a Python number: takes the input's dtype


# ------------------------------------------------------------ RegisterGradient
def test_registered_gradient_of_a_new_op_type_inside_a_loop():
    """d/dx of 3 squarings inside a while_loop of a new op type with a registered
    gradient: x**8, so 8 x**7."""
    x = dcf.constant([0.5, 1.1], dtype=f64)
    _, r = dcf.while_loop(lambda i, v: i < 3,
                          lambda i, v: (i + 1, apply("Review5bSquare", [v])), [0, x])
    (gx,) = dcf.gradients(dcf.reduce_sum(r), [x])
    np.testing.assert_allclose(run(gx), 8 * np.array([0.5, 1.1]) ** 7, rtol=1e-12)


def test_registered_gradient_for_py_func_overrides_its_none():
    """py_func has no gradient (None, as TF1); registering one for "PyFunc" gives it one."""
    x = dcf.constant([0.2, 0.9], dtype=f64)
    y = dcf.py_func(np.sin, [x], f64)
    assert dcf.gradients(y, [x]) == [None]
    old = GRADIENTS["PyFunc"]

    @dcf.RegisterGradient("PyFunc")
    def _sin_grad(op, g):
        return g * dcf.cos(op.inputs[0])

    try:
        (gx,) = dcf.gradients(dcf.reduce_sum(y * x), [x])
    finally:
        GRADIENTS["PyFunc"] = old
    xv = np.array([0.2, 0.9])
    np.testing.assert_allclose(run(gx), np.cos(xv) * xv + np.sin(xv), rtol=1e-12)


def test_error_raised_by_a_registered_gradient_names_the_op():
    x = dcf.constant(1.0)
    y = apply("Review5bRaises", [x], name="mine")
    with pytest.raises(RuntimeError, match=r"gradient of Review5bRaises 'mine' .*"
                                           r"'_raising_grad'.*my gradient is broken"):
        dcf.gradients(y, [x])


def test_registered_gradient_of_the_wrong_dtype_is_an_error_naming_the_op():
    """A float64 gradient for a float32 input would make x's gradient float64."""
    x = dcf.constant(1.0)
    y = apply("Review5bWrongDtype", [x], name="wd")
    with pytest.raises(TypeError, match=r"gradient of Review5bWrongDtype 'wd' for input 0 "
                                        r".*float32.* has dtype float64"):
        dcf.gradients(y * 2.0, [x])


def test_registered_gradient_that_is_not_a_tensor_is_an_error_naming_the_op():
    """A string was taken as a list of 3 gradients ("returned 3 values")."""
    x = dcf.constant(1.0)
    y = apply("Review5bNotTensor", [x], name="nt")
    with pytest.raises(TypeError, match=r"gradient of Review5bNotTensor 'nt' for input 0 .*"
                                        r"is not a tensor"):
        dcf.gradients(y, [x])


def test_python_number_returned_as_a_gradient_takes_the_inputs_dtype():
    x = dcf.constant(3.0, dtype=f64)
    y = apply("Review5bPythonScalar", [x])
    (gx,) = dcf.gradients(y, [x])
    assert gx.dtype is f64
    assert run(gx) == 2.0


# ------------------------------------------------------------ stop_gradients
def test_stop_gradients_that_are_xs_get_their_own_gradient():
    """TF1: a stop_gradients tensor passes no gradient on but gets its own. a=1, b=2a,
    c=a+b: with both stopped, dc/da = dc/db = 1; with only a stopped, dc/da = 3 (both
    paths end at a); with b stopped, dc/da = 1. (dcf gave None where an x was stopped.)"""
    a = dcf.constant(1.0, dtype=f64)
    b = 2.0 * a
    c = a + b
    both = dcf.gradients(c, [a, b], stop_gradients=[a, b])
    only_a = dcf.gradients(c, [a], stop_gradients=[a])
    only_b = dcf.gradients(c, [b], stop_gradients=b)
    past_b = dcf.gradients(c, [a], stop_gradients=[b])
    assert run([both, only_a, only_b, past_b]) == [[1.0, 1.0], [3.0], [1.0], [1.0]]


def test_stop_gradients_at_a_loop_input_and_output():
    """x=0.5, h=x*x, r = loop 3 times v -> v*x + h from h, k = 2 r x (TF1's values)."""
    x = dcf.constant(0.5, dtype=f64)
    h = x * x
    _, r = dcf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * x + h), [0, h])
    k = dcf.cond(x > 0.0, lambda: r * 2.0 * x, lambda: r)
    got = run([dcf.gradients(k, [x, h], stop_gradients=[h]),
               dcf.gradients(k, [x, r], stop_gradients=[r])])
    np.testing.assert_allclose(got, [[1.625, 1.875], [0.9375, 1.0]], rtol=1e-12)


# ------------------------------------------------------------ devices
def test_gradients_across_devices_equal_single_device_ones():
    def grads(dev):
        with dcf.Graph().as_default() as g:
            x = dcf.constant([0.3, 0.7], dtype=f64)
            with g.device("/cpu:0"):
                a = dcf.sin(x) * x
            with g.device(dev):
                _, b = dcf.while_loop(lambda i, v: i < 3,
                                      lambda i, v: (i + 1, dcf.tanh(v) * x), [0, a])
            (gx,) = dcf.gradients(dcf.reduce_sum(b * a), [x])
            return run(gx)

    np.testing.assert_allclose(grads("/cpu:1"), grads("/cpu:0"), rtol=1e-12)


def test_stop_gradients_inside_a_cond_branch_and_a_loop_body():
    """A stop_gradients tensor made inside a branch or a body stops there too (it was
    ignored below the top level). Branch: k = h x with h = x*x stopped: dk/dx = h = 2.25
    at x=1.5. Body (TF1's value): v -> h v + x with h = v x stopped, 3 times from x=0.7."""
    x = dcf.constant(1.5, dtype=f64)
    in_branch = []

    def branch():
        in_branch.append(x * x)
        return in_branch[-1] * x

    k = dcf.cond(x > 0.0, branch, lambda: x)
    y = dcf.constant(0.7, dtype=f64)
    in_body = []

    def body(i, v):
        in_body.append(v * y)
        return i + 1, in_body[-1] * v + y

    _, r = dcf.while_loop(lambda i, v: i < 3, body, [0, y])
    got = run([dcf.gradients(k, [x], stop_gradients=in_branch),
               dcf.gradients(r, [y], stop_gradients=in_body)])
    np.testing.assert_allclose(got, [[2.25], [3.1359655889324896]], rtol=1e-12)
