"""Gradients: second-order gradients through a TensorArray
read more than once (the flows of several reads' gradients are joined by an op each
flow is a data input of, not an Identity with control dependencies), the gradient of
TensorArray.concat(), gradients of ragged arrays (infer_shape=False), and gradients of
map_fn whose output structure is inferred (fn traced once, in the loop body).

Every value is checked against numpy (closed forms, or float64 central differences of
a closed-form gradient), on each execution path."""

from __future__ import annotations

import numpy as np
import pytest

import dcf

PATHS = ["compiled", "partitioned", "tagged", "traced"]


def _run(path: str, fetches, feed=None):
    cfg = dcf.SessionConfig(compile_frames=path != "tagged",
                            fuse_devices=path != "partitioned")
    opts = dcf.RunOptions(trace=True, timeout_s=60.0) if path == "traced" else \
        dcf.RunOptions(timeout_s=60.0)
    with dcf.Session(config=cfg) as sess:
        return sess.run(fetches, feed, options=opts)


def _hvp_fd(grad_fn, x: np.ndarray, v: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """H v by float64 central differences of a closed-form gradient."""
    return (grad_fn(x + eps * v) - grad_fn(x - eps * v)) / (2 * eps)


XV = np.array([0.3, -1.2, 0.7, 1.1])
VV = np.array([0.2, -0.5, 1.0, 0.4])


# ----------------------------------------------------- second order, several reads
@pytest.mark.parametrize("path", PATHS)
def test_second_order_three_reads_of_one_array(path):
    xv, v = XV[:3], VV[:3]
    x = dcf.placeholder(dcf.float64, (3,))
    ta = dcf.TensorArray(dcf.float64, size=3).unstack(x)
    y = ta.read(0) * ta.read(1) * ta.read(2)
    g, = dcf.gradients(y, [x])
    hv, = dcf.gradients(dcf.reduce_sum(g * dcf.constant(v)), [x])
    got_g, got_hv = _run(path, [g, hv], {x: xv})
    np.testing.assert_allclose(got_g, [xv[1] * xv[2], xv[0] * xv[2], xv[0] * xv[1]],
                               rtol=1e-12)
    want = [v[1] * xv[2] + v[2] * xv[1], v[0] * xv[2] + v[2] * xv[0],
            v[0] * xv[1] + v[1] * xv[0]]
    np.testing.assert_allclose(got_hv, want, rtol=1e-12)


def _fold_grad(x: np.ndarray) -> np.ndarray:
    """Gradient of x0 * prod_{k>=1} (1 + x_k)."""
    p = np.prod(1 + x[1:])
    return np.array([p] + [x[0] * p / (1 + x[k]) for k in range(1, len(x))])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("how", ["foldl", "foldr", "while"])
def test_second_order_read_outside_and_inside_loop(path, how):
    x = dcf.placeholder(dcf.float64, (4,))
    if how == "foldl":
        y = dcf.foldl(lambda a, e: a * (1.0 + e), x)
        xs = XV
    elif how == "foldr":
        # foldr starts from the last element: x3 * prod_{k<3} (1 + x_k)
        y = dcf.foldr(lambda a, e: a * (1.0 + e), x)
        xs = XV[::-1]
    else:
        ta = dcf.TensorArray(dcf.float64, size=4).unstack(x)
        _, y = dcf.while_loop(lambda i, a: i < 4,
                              lambda i, a: (i + 1, a * (1.0 + ta.read(i))), (1, ta.read(0)))
        xs = XV
    g, = dcf.gradients(y, [x])
    hv, = dcf.gradients(dcf.reduce_sum(g * dcf.constant(VV)), [x])
    got_g, got_hv = _run(path, [g, hv], {x: XV})
    order = slice(None, None, -1) if how == "foldr" else slice(None)
    np.testing.assert_allclose(got_g, _fold_grad(xs)[order], rtol=1e-10)
    np.testing.assert_allclose(got_hv, _hvp_fd(_fold_grad, xs, VV[order])[order],
                               rtol=1e-6, atol=1e-8)


def _scan_grad(x: np.ndarray) -> np.ndarray:
    """Gradient of sum(cumprod(x))."""
    n = len(x)
    return np.array([sum(np.prod(np.delete(x[:k + 1], j)) for k in range(j, n))
                     for j in range(n)])


@pytest.mark.parametrize("path", PATHS)
def test_second_order_scan_without_initializer(path):
    x = dcf.placeholder(dcf.float64, (4,))
    y = dcf.reduce_sum(dcf.scan(lambda a, e: a * e, x))
    g, = dcf.gradients(y, [x])
    hv, = dcf.gradients(dcf.reduce_sum(g * dcf.constant(VV)), [x])
    got_g, got_hv = _run(path, [g, hv], {x: XV})
    np.testing.assert_allclose(got_g, _scan_grad(XV), rtol=1e-10)
    np.testing.assert_allclose(got_hv, _hvp_fd(_scan_grad, XV, VV), rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------------ concat gradient
@pytest.mark.parametrize("path", PATHS)
def test_concat_gradient(path):
    x = dcf.placeholder(dcf.float64, (3, 2))
    c = dcf.TensorArray(dcf.float64, size=3).unstack(x).concat()
    w = np.arange(6.0) - 2.0
    g, = dcf.gradients(dcf.reduce_sum(c * dcf.constant(w)), [x])
    np.testing.assert_allclose(_run(path, g, {x: np.ones((3, 2))}), w.reshape(3, 2))


@pytest.mark.parametrize("path", PATHS)
def test_concat_gradient_ragged_and_second_order(path):
    x = dcf.placeholder(dcf.float64, (5,))
    ta = dcf.TensorArray(dcf.float64, size=3, infer_shape=False)
    ta = ta.write(0, x[:2]).write(1, x[2:3]).write(2, x[3:] * 2.0)
    c = ta.concat()
    y = dcf.reduce_sum(c * c * c)                   # sum x_i^3 (x_3, x_4 doubled)
    g, = dcf.gradients(y, [x])
    v = np.array([0.5, -1.0, 2.0, 0.25, 1.5])
    hv, = dcf.gradients(dcf.reduce_sum(g * dcf.constant(v)), [x])
    xv = np.array([0.3, -1.2, 0.7, 1.1, -0.4])
    scale = np.array([1.0, 1.0, 1.0, 2.0, 2.0])
    got_c, got_g, got_hv = _run(path, [c, g, hv], {x: xv})
    np.testing.assert_allclose(got_c, xv * scale)
    np.testing.assert_allclose(got_g, 3 * scale ** 3 * xv ** 2, rtol=1e-12)
    np.testing.assert_allclose(got_hv, 6 * scale ** 3 * xv * v, rtol=1e-12)


@pytest.mark.parametrize("path", PATHS)
def test_concat_gradient_in_loop(path):
    # concat after a loop wrote rows of different lengths; its gradient reaches each row
    x = dcf.placeholder(dcf.float64, (3,))
    ta = dcf.TensorArray(dcf.float64, size=2, infer_shape=False)

    def body(i, ta):
        return i + 1, ta.write(i, x[:i + 1] * dcf.cast(i + 1, dcf.float64))

    _, ta = dcf.while_loop(lambda i, _: i < 2, body, (0, ta))
    c = ta.concat()                                  # [x0, 2 x0, 2 x1]
    w = np.array([1.0, 10.0, 100.0])
    g, = dcf.gradients(dcf.reduce_sum(c * dcf.constant(w)), [x])
    xv = np.array([0.5, -1.0, 2.0])
    got_c, got_g = _run(path, [c, g], {x: xv})
    np.testing.assert_allclose(got_c, [xv[0], 2 * xv[0], 2 * xv[1]])
    np.testing.assert_allclose(got_g, [1.0 + 20.0, 200.0, 0.0])


# -------------------------------------------------------- ragged array gradients
@pytest.mark.parametrize("path", PATHS)
def test_ragged_array_gradient(path):
    x = dcf.placeholder(dcf.float64, (3,))
    ta = dcf.TensorArray(dcf.float64, size=2, infer_shape=False).write(0, x[:1]).write(1, x[1:])
    r1 = ta.read(1)
    y = dcf.reduce_sum(ta.read(0) * 2.0) + dcf.reduce_sum(r1 * r1 * 3.0)
    g, = dcf.gradients(y, [x])
    xv = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(_run(path, g, {x: xv}), [2.0, 6 * xv[1], 6 * xv[2]])


# ------------------------------------------------- map_fn with an inferred structure
@pytest.mark.parametrize("path", PATHS)
def test_map_fn_inferred_traces_fn_once_and_differentiates(path):
    x = dcf.placeholder(dcf.float64, (5, 3))
    calls = []
    w0 = np.array([[0.5, -1.0], [2.0, 0.25], [-0.75, 1.5]])

    def fn(r):
        calls.append(1)
        w = dcf.Variable(w0, name="w")
        h = dcf.reshape(dcf.matmul(dcf.expand_dims(r, 0), w), [2])
        return {"sq": h * h, "n": dcf.cast(dcf.reduce_sum(r), dcf.int32)}

    m = dcf.map_fn(fn, x)
    assert len(calls) == 1
    variables = dcf.trainable_variables()
    assert [v.name for v in variables] == ["map/while/w"]
    assert m["sq"].dtype is dcf.float64 and m["n"].dtype is dcf.int32
    gw, gx = dcf.gradients(dcf.reduce_sum(m["sq"]), [variables[0], x])
    xv = np.arange(15.0).reshape(5, 3) / 7.0 - 1.0
    with dcf.Session(config=dcf.SessionConfig(compile_frames=path != "tagged",
                                              fuse_devices=path != "partitioned")) as s:
        s.run(dcf.global_variables_initializer())
        opts = dcf.RunOptions(trace=path == "traced", timeout_s=60.0)
        sq, n, got_gw, got_gx = s.run([m["sq"], m["n"], gw, gx], {x: xv}, options=opts)
    h = xv @ w0
    np.testing.assert_allclose(sq, h * h, rtol=1e-12)
    np.testing.assert_array_equal(n, xv.sum(1).astype(np.int32))
    np.testing.assert_allclose(got_gw, xv.T @ (2 * h), rtol=1e-12)
    np.testing.assert_allclose(got_gx, (2 * h) @ w0.T, rtol=1e-12)


@pytest.mark.parametrize("path", PATHS)
def test_map_fn_inferred_second_order(path):
    x = dcf.placeholder(dcf.float64, (4,))
    m1, m2 = dcf.map_fn(lambda e: (e * e * e, dcf.sin(e)), x)
    y = dcf.reduce_sum(m1) + dcf.reduce_sum(m2)
    g, = dcf.gradients(y, [x])
    hv, = dcf.gradients(dcf.reduce_sum(g * dcf.constant(VV)), [x])
    got_g, got_hv = _run(path, [g, hv], {x: XV})
    np.testing.assert_allclose(got_g, 3 * XV ** 2 + np.cos(XV), rtol=1e-12)
    np.testing.assert_allclose(got_hv, (6 * XV - np.sin(XV)) * VV, rtol=1e-12)
