"""TensorArray gradients (read/write, stack/unstack, gather/scatter, several reads of
one index summed) and map_fn/foldl/foldr/scan gradients, against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from tests.autodiff.gradcheck import check_grads, run

F64 = dcf.float64


def test_write_read_grad(compiled, rng):
    def f(a, b):
        ta = dcf.TensorArray(F64, size=2, element_shape=(3,))
        ta = ta.write(0, a * 2.0).write(1, dcf.sin(b))
        return ta.read(1) * ta.read(0)
    check_grads(f, [rng.standard_normal(3), rng.standard_normal(3)], config=compiled)


def test_unstack_stack_grad(compiled, rng):
    def f(x):
        ta = dcf.TensorArray(F64, size=4, element_shape=(2,)).unstack(x * x)
        return ta.stack() * 3.0
    check_grads(f, [rng.standard_normal((4, 2))], config=compiled)


def test_scatter_gather_grad(compiled, rng):
    def f(x):
        ta = dcf.TensorArray(F64, size=5, element_shape=(2,), clear_after_read=False)
        ta = ta.scatter([4, 0, 2], dcf.tanh(x))
        ta = ta.scatter([1, 3], x[:2] * 2.0)
        return ta.gather([3, 2, 0]) + ta.stack()[4]
    check_grads(f, [rng.standard_normal((3, 2))], config=compiled)


def test_several_reads_of_one_index_sum_their_gradients(compiled, rng):
    x = dcf.placeholder(F64, (2,))
    ta = dcf.TensorArray(F64, size=2, clear_after_read=False, element_shape=(2,))
    ta = ta.write(0, x).write(1, x * 0.0)
    y = ta.read(0) * 2.0 + ta.read(0) * 3.0 + dcf.sin(ta.read(0))
    (gx,) = dcf.gradients(dcf.reduce_sum(y), [x])
    x_np = rng.standard_normal(2)
    np.testing.assert_allclose(run(gx, {x: x_np}, compiled), 5.0 + np.cos(x_np))

    def f(x):
        ta = dcf.TensorArray(F64, size=1, clear_after_read=False, element_shape=(2,))
        ta = ta.write(0, x)
        return ta.read(0) * ta.read(0) + ta.read(0)
    check_grads(f, [x_np], config=compiled)


def test_tensor_array_loop_variable_write_read_grad(compiled, rng):
    """Written in one loop, read (several times per index) in another."""
    def f(x, w):
        n = 4
        ta = dcf.TensorArray(F64, size=n, element_shape=(3,), clear_after_read=False)

        def wbody(i, a, ta):
            a = dcf.tanh(a * w)
            return i + 1, a, ta.write(i, a)
        _, _, ta = dcf.while_loop(lambda i, a, ta: i < n, wbody, (0, x, ta))

        def rbody(i, acc):
            j = (i * 3) % n
            return i + 1, acc + ta.read(j) * ta.read(i) + ta.read(j)
        return dcf.while_loop(lambda i, acc: i < n, rbody, (0, x * 0.0))[1]
    check_grads(f, [rng.standard_normal(3), rng.standard_normal(3)], config=compiled)


def test_tensor_array_grad_of_dynamic_size_array(compiled, rng):
    def f(x):
        ta = dcf.TensorArray(F64, size=0, dynamic_size=True, element_shape=(2,))

        def body(i, ta):
            return i + 1, ta.write(i, x[i] * dcf.cast(i + 1, F64))
        _, ta = dcf.while_loop(lambda i, ta: i < 3, body, (0, ta))
        return ta.stack()
    check_grads(f, [rng.standard_normal((3, 2))], config=compiled)


# -------------------------------------------------------- higher-order functions
def test_map_fn_grad(compiled, rng):
    check_grads(lambda x, w: dcf.map_fn(lambda r: dcf.tanh(r * w) + r, x),
                [rng.standard_normal((4, 3)), rng.standard_normal(3)], config=compiled)


def test_map_fn_nested_structure_grad(compiled, rng):
    def f(a, b):
        s, d = dcf.map_fn(lambda e: (e[0] * e[1], dcf.sin(e[0] - e[1])), (a, b),
                          dtype=(F64, F64))
        return s + 2.0 * d
    check_grads(f, [rng.standard_normal((3, 2)), rng.standard_normal((3, 2))], config=compiled)


def test_foldl_grad(compiled, rng):
    check_grads(lambda x, w: dcf.foldl(lambda acc, e: dcf.tanh(acc * w + e), x,
                                       initializer=dcf.zeros((3,), F64)),
                [rng.standard_normal((4, 3)), rng.standard_normal(3)], config=compiled)


def test_foldr_grad(compiled, rng):
    check_grads(lambda x: dcf.foldr(lambda acc, e: acc * e + 1.0, x),
                [rng.uniform(0.5, 1.5, (4, 2))], config=compiled)


def test_foldl_foldr_differ_and_grads_match_python(compiled, rng):
    x = dcf.placeholder(F64, (3,))
    fl = dcf.foldl(lambda a, e: a * 0.5 + e * e, x, initializer=dcf.constant(1.0, F64))
    fr = dcf.foldr(lambda a, e: a * 0.5 + e * e, x, initializer=dcf.constant(1.0, F64))
    gl, gr = dcf.gradients(fl, [x])[0], dcf.gradients(fr, [x])[0]
    x_np = np.array([0.3, -1.2, 2.0])
    a, b = run([gl, gr], {x: x_np}, compiled)
    np.testing.assert_allclose(a, 2 * x_np * np.array([0.25, 0.5, 1.0]))
    np.testing.assert_allclose(b, 2 * x_np * np.array([1.0, 0.5, 0.25]))


def test_scan_grad(compiled, rng):
    check_grads(lambda x, w: dcf.scan(lambda acc, e: dcf.sin(acc) * w + e, x),
                [rng.standard_normal((5, 2)), rng.standard_normal(2)], config=compiled)


def test_scan_with_initializer_inside_while_grad(compiled, rng):
    def f(x):
        def body(i, a):
            s = dcf.scan(lambda acc, e: acc * e + 0.1, a, initializer=dcf.constant(1.0, F64))
            return i + 1, s * 0.9 + a
        return dcf.while_loop(lambda i, a: i < 2, body, (0, x))[1]
    check_grads(f, [rng.uniform(0.5, 1.0, 4)], config=compiled)


@pytest.mark.parametrize("fn", ["map_fn", "scan"])
def test_higher_order_in_cond_grad(compiled, rng, fn):
    def f(x):
        h = (lambda: dcf.map_fn(dcf.sin, x)) if fn == "map_fn" else \
            (lambda: dcf.scan(lambda a, e: a * e, x))
        return dcf.cond(dcf.reduce_sum(x) > 0.0, h, lambda: x * 2.0)
    for s in (1.0, -1.0):
        check_grads(f, [s * rng.uniform(0.5, 1.0, 3)], config=compiled)
