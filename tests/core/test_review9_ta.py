"""Review 9 by use of TensorArray and map_fn/foldl/foldr/scan, each test against TF1
(tensorflow.compat.v1 with control flow v1) or numpy."""

from __future__ import annotations

import numpy as np
import pytest

import dcf


@pytest.mark.parametrize("call", [
    lambda elems: dcf.map_fn(lambda x: 1.0, elems),
    lambda elems: dcf.scan(lambda a, x: a, elems, initializer=0.0),
    lambda elems: dcf.foldl(lambda a, x: a, elems, initializer=0.0),
    lambda elems: dcf.foldr(lambda a, x: a, elems, initializer=0.0),
])
@pytest.mark.parametrize("elems", [[], (), {}])
def test_elems_with_no_tensor_is_a_value_error_naming_the_function(call, elems):
    # TF's map_fn: "elems must be a Tensor or (possibly nested) sequence of Tensors";
    # here an IndexError from inside the first dimension's look-up
    with pytest.raises(ValueError, match=r"(map_fn|scan|foldl|foldr): elems must be a "
                                         r"tensor or a nested structure"):
        call(elems)


def test_concat_gradient_gives_a_scalar_element_of_a_ragged_array_a_scalar(compiled, run_graph):
    # concat joins a scalar element as one row; with infer_shape=False the elements may
    # differ, and the gradient of a scalar one came back as a [1] row (the slice's
    # gradient then failed: "setting an array element with a sequence")
    x = dcf.placeholder(dcf.float64, [3])
    ta = dcf.TensorArray(dcf.float64, size=3, infer_shape=False)
    ta = ta.write(0, x[0]).write(1, x[1:] * 2.0).write(2, dcf.sin(x[2]))
    (g,) = dcf.gradients(dcf.reduce_sum(ta.concat() ** 3), [x])
    xv = np.array([0.3, -1.2, 2.0])
    got = run_graph(g, {x: xv}, config=compiled)
    # d/dx of x0^3 + (2 x1)^3 + (2 x2)^3 + sin(x2)^3, x2 counted twice
    want = np.array([3 * xv[0] ** 2, 24 * xv[1] ** 2,
                     24 * xv[2] ** 2 + 3 * np.sin(xv[2]) ** 2 * np.cos(xv[2])])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_scan_fn_output_of_another_dtype_than_the_accumulator_names_scan():
    # TF1 fails at run time; here the error named only the internal TensorArray
    # 'scan/result' and a tensor 'scan/while/Identity:0' as the index
    with pytest.raises(TypeError, match=r"scan: fn returned float32 at output\[1\] where the "
                                        r"accumulator .* is int32"):
        dcf.scan(lambda a, x: (a[0] + x, x), dcf.constant([1.0, 2.0]),
                 initializer=(dcf.constant(0.0), dcf.constant(0)))


def test_scan_fn_output_of_another_shape_than_the_accumulator_names_scan():
    # TF1: ValueError "Inconsistent shapes: saw (2,) but expected (1,)"
    with pytest.raises(ValueError, match=r"scan: fn returned shape \[2\] at output\[0\] "
                                         r"where the accumulator .* has shape \[1\]"):
        dcf.scan(lambda a, x: dcf.concat([a, dcf.reshape(x, [1])], 0),
                 dcf.constant([1.0, 2.0]), initializer=dcf.constant([0.0]))
    # a more specific output than an accumulator of unknown length is fine (as TF1)
    out = dcf.scan(lambda a, x: a + x, dcf.ones([2, 3]),
                   initializer=dcf.placeholder(dcf.float32, [None]))
    assert out.shape == (2, 3)


@pytest.mark.parametrize("call", [
    lambda fn: dcf.map_fn(fn, dcf.ones([2, 3])),
    lambda fn: dcf.map_fn(fn, dcf.ones([2, 3]), dtype=dcf.float32),
])
def test_map_fn_returning_a_tensor_array_names_map_fn(call):
    # (TF1 refuses it too); the error named an internal Const 'map/while/Const'
    with pytest.raises(TypeError, match=r"map_fn: fn returned <dcf.TensorArray .*it must "
                                        r"return a tensor"):
        call(lambda x: dcf.TensorArray(dcf.float32, size=1).write(0, x))


def test_while_body_returning_another_tensor_array_is_refused(compiled, run_graph):
    # only the flow is carried, so the loop's result read the array that entered: a body
    # making a new array each step gave [7.0] (the entering array's element) silently,
    # one returning another array outside the loop a run-time "never written" on the
    # entering one (TF1 raises at build time for the first, at run time for the second)
    def fresh(i, ta):
        return i + 1, dcf.TensorArray(dcf.float32, size=1).write(0, dcf.cast(i, dcf.float32))

    start = dcf.TensorArray(dcf.float32, size=1).write(0, 7.0)
    with pytest.raises(ValueError, match=r"while_loop 'while': loop var 1 is TensorArray "
                                         r"'TensorArray' but body returned another "
                                         r"TensorArray 'while/TensorArray'"):
        dcf.while_loop(lambda i, _: i < 3, fresh, (dcf.constant(0), start))
    other = dcf.TensorArray(dcf.float32, size=3, name="other")
    with pytest.raises(ValueError, match=r"body returned another TensorArray 'other'"):
        dcf.while_loop(lambda i, _: i < 3,
                       lambda i, ta: (i + 1, other.write(i, dcf.cast(i, dcf.float32))),
                       (dcf.constant(0), dcf.TensorArray(dcf.float32, size=3)))
    # the array it got, written to (also through identity()), is carried as before
    _, ta = dcf.while_loop(lambda i, _: i < 3,
                           lambda i, ta: (i + 1, ta.identity().write(i, dcf.cast(i, dcf.float32))),
                           (dcf.constant(0), dcf.TensorArray(dcf.float32, size=3)))
    np.testing.assert_array_equal(run_graph(ta.stack(), config=compiled), [0.0, 1.0, 2.0])
