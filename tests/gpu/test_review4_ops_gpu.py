"""tests/ops/test_review4_ops.py's edges with the ops on /gpu:0: empty index tuples in
gather_nd / scatter_nd (and gather_nd's gradient through scatter_nd), sign's gradient."""
import numpy as np

import dcf


def test_gather_nd_and_scatter_nd_with_empty_index_tuples_on_gpu():
    p = np.arange(12, dtype=np.float32).reshape(3, 4)
    u = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        x = dcf.placeholder(dcf.float32, (3, 4))
        t = dcf.gather_nd(x, np.zeros((2, 0), np.int32))
        (gx,) = dcf.gradients(dcf.reduce_sum(t * t), [x])
        s = dcf.scatter_nd(np.zeros((2, 0), np.int64), u, [3, 4])
    with dcf.Session(g) as sess:
        r, rg, rs = sess.run([t, gx, s], {x: p})
    np.testing.assert_array_equal(r, np.broadcast_to(p, (2, 3, 4)))
    np.testing.assert_allclose(rg, 4 * p)
    np.testing.assert_array_equal(rs, u[0] + u[1])


def test_sign_gradient_on_gpu():
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        x = dcf.placeholder(dcf.float64, (3,))
        (gx,) = dcf.gradients(dcf.reduce_sum(dcf.sign(x) * x), [x])
    with dcf.Session(g) as sess:
        r = sess.run(gx, {x: np.array([-2.0, 0.5, 3.0])})
    np.testing.assert_array_equal(r, [-1.0, 1.0, 1.0])
