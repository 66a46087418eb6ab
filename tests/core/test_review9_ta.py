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


def test_foldl_and_foldr_take_a_tensor_array_in_the_accumulator(compiled, run_graph):
    # TF1's foldl/foldr hand the initializer to while_loop as it is: a TensorArray (with a
    # tensor beside it) is an accumulator; here it was converted to a tensor and failed
    # ("Const 'foldl/Const': cannot convert <dcf.TensorArray ...>"). TF1 gives these values.
    elems = dcf.constant([1.0, 2.0, 3.0])
    ta = dcf.foldl(lambda t, x: t.write(t.size(), x * 2.0), elems,
                   initializer=dcf.TensorArray(dcf.float32, size=0, dynamic_size=True))
    ta_r, count = dcf.foldr(lambda a, x: (a[0].write(a[1], x * 2.0), a[1] + 1), elems,
                            initializer=(dcf.TensorArray(dcf.float32, size=3), dcf.constant(0)))
    got = run_graph([ta.stack(), ta_r.stack(), count], config=compiled)
    np.testing.assert_array_equal(got[0], [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(got[1], [6.0, 4.0, 2.0])
    assert got[2] == 3
    # scan stacks its accumulators: a TensorArray there is refused naming scan (TF1 too)
    with pytest.raises(TypeError, match=r"scan: initializer holds a TensorArray"):
        dcf.scan(lambda a, x: a, elems, initializer=dcf.TensorArray(dcf.float32, size=1))


def test_foldl_tensor_array_accumulator_gradient_matches_finite_differences():
    x = dcf.placeholder(dcf.float64, [3, 2])
    y = dcf.placeholder(dcf.float64, [2])

    def step(a, e):
        return a[0].write(a[0].size(), dcf.sin(e) * a[1]), a[1] * 0.5 + e

    ta, acc = dcf.foldl(step, x, initializer=(
        dcf.TensorArray(dcf.float64, size=0, dynamic_size=True), y))
    loss = dcf.reduce_sum(ta.stack() ** 2) + dcf.reduce_sum(acc)
    grads = dcf.gradients(loss, [x, y])
    rng = np.random.default_rng(3)
    xv, yv = rng.standard_normal((3, 2)), rng.standard_normal(2)

    def f(xv, yv):                      # the same in numpy
        out, a = 0.0, yv
        for e in xv:
            out, a = out + np.sum((np.sin(e) * a) ** 2), a * 0.5 + e
        return out + np.sum(a)

    with dcf.Session() as sess:
        gx, gy = sess.run(grads, {x: xv, y: yv})
    eps = 1e-6
    for got, v, k in ((gx, xv, 0), (gy, yv, 1)):
        num = np.zeros_like(v)
        for i in np.ndindex(v.shape):
            d = np.zeros_like(v)
            d[i] = eps
            args_p = (xv + d, yv) if k == 0 else (xv, yv + d)
            args_m = (xv - d, yv) if k == 0 else (xv, yv - d)
            num[i] = (f(*args_p) - f(*args_m)) / (2 * eps)
        np.testing.assert_allclose(got, num, rtol=1e-6, atol=1e-8)
