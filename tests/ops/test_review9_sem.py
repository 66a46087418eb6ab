"""Semantics a TF1 user relies on where numpy's differ (review 9, by use): float floor
division, ..."""

from __future__ import annotations

import numpy as np
import pytest

import dcf


@pytest.mark.filterwarnings("ignore:.*encountered in divide:RuntimeWarning")
@pytest.mark.parametrize("dt", [np.float16, np.float32, np.float64])
def test_float_floordiv_is_the_floor_of_the_quotient_as_in_tf1(dt):
    # numpy's 1.0 // 0.1 floors the exact quotient of the two binary values (9.0), and
    # gives nan for inf // 2; TF1's FloorDiv is floor(x / y): 10.0 and inf
    vals = np.array([1.0, -1.0, 0.1, -0.1, 0.0, 7.5, -7.5, 3.0, np.inf, -np.inf, np.nan], dt)
    x, y = np.meshgrid(vals, vals, indexing="ij")
    with np.errstate(all="ignore"):
        want = np.floor(x / y)
    with dcf.Session() as sess:
        got, one, inf = sess.run([dcf.constant(x) // dcf.constant(y),
                                  dcf.floordiv(dt(1.0), dt(0.1)),
                                  dcf.floordiv(dt(np.inf), dt(2.0))])
    np.testing.assert_array_equal(got, want)
    assert got.dtype == dt and np.array_equal(np.signbit(got), np.signbit(want))
    assert one == 10.0 and inf == np.inf


def test_int_floordiv_and_mod_round_toward_minus_infinity_as_in_tf1():
    x = np.array([-7, -7, 7, 7, 0, -8], np.int32)
    y = np.array([2, -2, 2, -2, 3, 3], np.int32)
    with dcf.Session() as sess:
        q, r = sess.run([dcf.constant(x) // y, dcf.constant(x) % y])
    np.testing.assert_array_equal(q, [-4, 3, 3, -4, 0, -3])
    np.testing.assert_array_equal(r, [1, -1, 1, -1, 0, 1])


def test_the_gradient_of_mod_uses_tf1s_floor_of_the_quotient():
    # TF1: d(x % y)/dy = -floor(x / y): -10 at (1.0, 0.1), where numpy's quotient gives -9
    x = dcf.constant([1.0, -1.0, 7.5, 5.0])
    y = dcf.constant([0.1, -0.1, 0.1, -3.0])
    gx, gy = dcf.gradients(dcf.mod(x, y), [x, y], grad_ys=dcf.constant([1.0, 2.0, 3.0, 4.0]))
    with dcf.Session() as sess:
        gx, gy = sess.run([gx, gy])
    np.testing.assert_array_equal(gx, [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(gy, [-10.0, -20.0, -225.0, 8.0])


def test_shape_arithmetic_on_a_partly_known_shape_keeps_the_known_dims_as_tf1():
    # TF1's shape inference reads slices, concats and products of shape(x); dcf read
    # only shape(x) itself and stack([...]): zeros(shape(x)[1:]) was [?, ?], not [3, 4]
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, [None, 3, 4])
        s = dcf.shape(x)
        cases = {
            "zeros(s[1:])": (dcf.zeros(s[1:]), (3, 4)),
            "fill(s[:2])": (dcf.fill(s[:2], 1.0), (None, 3)),
            "zeros(s[-1:])": (dcf.zeros(s[-1:]), (4,)),
            "zeros(s[::-1])": (dcf.zeros(s[::-1]), (4, 3, None)),
            "zeros(concat)": (dcf.zeros(dcf.concat([s[:1], [5]], 0)), (None, 5)),
            "zeros(cast(s))": (dcf.zeros(dcf.cast(s, dcf.int64)[1:]), (3, 4)),
            "zeros([s1*s2])": (dcf.zeros([s[1] * s[2]]), (12,)),
            "reshape flatten": (dcf.reshape(x, [-1, s[1] * s[2]]), (None, 12)),
            "reshape(s[1:])": (dcf.reshape(x, dcf.concat([[-1], s[2:]], 0)), (None, 4)),
            "broadcast_to": (dcf.broadcast_to(x[:, :1], s), (None, 3, 4)),
        }
    got = {k: t.shape for k, (t, _) in cases.items()}
    assert got == {k: want for k, (_, want) in cases.items()}
    with dcf.Session(graph=g) as sess:
        vals = sess.run({k: t for k, (t, _) in cases.items()},
                        {x: np.ones((2, 3, 4), np.float32)})
    assert {k: v.shape for k, v in vals.items()} == {
        "zeros(s[1:])": (3, 4), "fill(s[:2])": (2, 3), "zeros(s[-1:])": (4,),
        "zeros(s[::-1])": (4, 3, 2), "zeros(concat)": (2, 5), "zeros(cast(s))": (3, 4),
        "zeros([s1*s2])": (12,), "reshape flatten": (2, 12), "reshape(s[1:])": (6, 4),
        "broadcast_to": (2, 3, 4)}


def test_gradients_of_tile_pad_and_slice_keep_the_inputs_known_dims_as_tf1():
    # x of shape [?, 3, 4]: TF1 gives these gradients x's static shape [?, 3, 4]; dcf's
    # were [?, ?, ?] (tile's when its multiples are not all known, too)
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float64, [None, 3, 4])
        n = dcf.placeholder(dcf.int32, [])
        w = dcf.constant(np.arange(200, dtype=np.float64) / 7)
        ys = {
            "tile": dcf.tile(x, [2, 1, 3]),
            "tile(n)": dcf.tile(x, dcf.stack([n, 2, 1])),
            "pad": dcf.pad(x, [[1, 0], [0, 2], [3, 1]]),
            "slice": dcf.slice(x, [0, 1, 1], [-1, 2, 2]),
        }
        grads = {}
        for k, y in ys.items():
            r = w[: dcf.size(y)]   # a weight per element of y
            (grads[k],) = dcf.gradients(dcf.reduce_sum(y * dcf.reshape(r, dcf.shape(y))), [x])
    assert {k: t.shape for k, t in grads.items()} == {k: (None, 3, 4) for k in ys}
    xv = np.random.default_rng(0).normal(size=(2, 3, 4))
    wf = np.arange(200, dtype=np.float64) / 7
    with dcf.Session(graph=g) as sess:
        got = sess.run(grads, {x: xv, n: 2})
    # closed forms: the weights of y's elements, summed onto the x element each copies
    def weights(shape):
        return wf[: int(np.prod(shape))].reshape(shape)
    want = {
        "tile": weights((4, 3, 12)).reshape(2, 2, 1, 3, 3, 4).sum(axis=(0, 2, 4)),
        "tile(n)": weights((4, 6, 4)).reshape(2, 2, 2, 3, 1, 4).sum(axis=(0, 2, 4)),
        "pad": weights((3, 5, 8))[1:, :3, 3:7],
        "slice": np.pad(weights((2, 2, 2)), [[0, 0], [1, 0], [1, 1]]),
    }
    for k in ys:
        np.testing.assert_allclose(got[k], want[k], err_msg=k)


def test_tile_by_partly_known_multiples_keeps_the_dims_they_fix_as_tf1():
    # tile(h, [1, T, 1]) with a run-time T: TF1 keeps h's other dims ([?, ?, 8] here),
    # which a dense layer after it needs; dcf gave [?, ?, ?]
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float64, [None, 3, 4])
        n = dcf.placeholder(dcf.int32, [])
        y = dcf.tile(x, dcf.stack([1, n, 2]))
        z = dcf.tile(x, [1, dcf.shape(x)[0], 1])
        (gx,) = dcf.gradients(dcf.reduce_sum(y * y), [x])
    assert (y.shape, z.shape, gx.shape) == ((None, None, 8), (None, None, 4), (None, 3, 4))
    xv = np.random.default_rng(1).normal(size=(2, 3, 4))
    with dcf.Session(graph=g) as sess:
        yv, zv, gv = sess.run([y, z, gx], {x: xv, n: 3})
    np.testing.assert_array_equal(yv, np.tile(xv, [1, 3, 2]))
    np.testing.assert_array_equal(zv, np.tile(xv, [1, 2, 1]))
    np.testing.assert_allclose(gv, 2 * yv.reshape(2, 3, 3, 2, 4).sum(axis=(1, 3)))


def test_a_slice_of_a_variable_can_be_assigned_as_in_tf1():
    # TF1: v[0].assign(7.0), v[1:].assign(...), m[:, 1].assign(...), v[i].assign(...)
    # write into the variable and give its new value; dcf: "'Tensor' object has no
    # attribute 'assign'"
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable([1.0, 2.0, 3.0])
        m = dcf.Variable(np.zeros((2, 3), np.float32))
        i = dcf.placeholder(dcf.int32, [])
        first, rest = v[0].assign(7.0), v[1:].assign([8.0, 9.0])
        column, row = m[:, 1].assign([1.0, 2.0]), m[i].assign(dcf.ones([3]) * 5.0)
        with pytest.raises(ValueError, match=r"^ResourceStridedSliceAssign 'Variable/"
                           r"AssignSlice': cannot assign a value of shape \[2\] to a "
                           r"slice of shape \[\]"):
            v[0].assign([1.0, 2.0])
        with pytest.raises(AttributeError, match="is a value, not a Variable"):
            dcf.constant([1.0, 2.0])[0].assign(1.0)
        p = dcf.placeholder(dcf.float32, None)
        bad = v[1:].assign(p)
    assert first.shape == (3,) and row.shape == (2, 3)
    with dcf.Session(graph=g) as sess:
        sess.run(dcf.variables_initializer([v, m]))
        before = sess.run(v)
        assert sess.run(first).tolist() == [7.0, 2.0, 3.0]
        assert sess.run(rest).tolist() == [7.0, 8.0, 9.0]
        assert before.tolist() == [1.0, 2.0, 3.0]   # a value read earlier stays as it was
        sess.run(column)
        assert sess.run(row, {i: 1}).tolist() == [[0.0, 1.0, 0.0], [5.0, 5.0, 5.0]]
        with pytest.raises(dcf.errors.InvalidArgumentError,
                           match=r"cannot assign a value of shape \[3\] to a slice of "
                                 r"shape \[2\] of variable 'Variable'"):
            sess.run(bad, {p: np.ones(3, np.float32)})
        assert sess.run(v).tolist() == [7.0, 8.0, 9.0]


def test_len_of_a_variable_is_its_tensors():
    # len(t) of a tensor is its static first dim; len(v) of a Variable was Python's
    # "object of type 'Variable' has no len()"
    g = dcf.Graph()
    with g.as_default():
        v, t = dcf.Variable(np.zeros((4, 2))), dcf.zeros([4, 2])
        s, u = dcf.Variable(1.0), dcf.placeholder(dcf.float32, [None, 2])
    assert len(v) == len(t) == 4
    with pytest.raises(TypeError, match=r"len\(\) of variable 'Variable_1' a scalar"):
        len(s)
    with pytest.raises(TypeError, match=r"unknown first dimension; dcf.shape\(t\)\[0\]"):
        len(u)


def test_a_list_holding_tensors_is_packed_as_in_tf1():
    # TF1 packs [[0, n], [0, 0]] with a tensor n into one tensor wherever a tensor is
    # taken (tf.pad(x, [[0, n], [0, 0]]), stack, x + [a, 1.0]); dcf failed with "cannot
    # convert the symbolic tensor ... to a numpy array"
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, [None, 5])
        n = dcf.placeholder(dcf.int32, [])
        f = dcf.placeholder(dcf.float32, [])
        padded = dcf.pad(x, [[0, n - dcf.shape(x)[0]], [1, 0]])
        rows = dcf.stack([[n, 0], [1, 1]])
        shifted = x[0] + [f, f, 1.0, 2, 0.5]
        packed = dcf.convert_to_tensor([[n, 2], [3, n]])
        (gx,) = dcf.gradients(dcf.reduce_sum(padded * padded), [x])
    # static shapes as TF1's: the padding of axis 1 is known, so is the gradient's shape
    assert (padded.shape, rows.shape, shifted.shape, packed.shape, gx.shape) == \
        ((None, 6), (2, 2), (5,), (2, 2), (None, 5))
    xv = np.arange(10, dtype=np.float32).reshape(2, 5)
    with dcf.Session(graph=g) as sess:
        p, r, s, k, gv = sess.run([padded, rows, shifted, packed, gx], {x: xv, n: 4, f: 3.0})
    np.testing.assert_array_equal(p, np.pad(xv, [[0, 2], [1, 0]]))
    assert r.tolist() == [[4, 0], [1, 1]] and k.tolist() == [[4, 2], [3, 4]]
    np.testing.assert_array_equal(s, xv[0] + [3.0, 3.0, 1.0, 2.0, 0.5])
    np.testing.assert_array_equal(gv, 2 * xv)


def test_a_slice_at_a_run_time_begin_keeps_the_dims_it_knows_as_tf1():
    # slice(x, [0, t, 0], [-1, 1, -1]), a time step of [batch, time, features]: TF1
    # gives [?, 1, 4]; dcf gave [?, 1, ?] (a -1 size at an unknown begin)
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, [None, 3, 4])
        t = dcf.placeholder(dcf.int32, [])
        step = dcf.slice(x, [0, t, 0], [-1, 1, -1])
        tail = dcf.slice(x, dcf.stack([t, 1, 2]), [-1, -1, -1])
    assert (step.shape, tail.shape) == ((None, 1, 4), (None, 2, 2))
    xv = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with dcf.Session(graph=g) as sess:
        sv, tv = sess.run([step, tail], {x: xv, t: 1})
    np.testing.assert_array_equal(sv, xv[:, 1:2])
    np.testing.assert_array_equal(tv, xv[1:, 1:, 2:])
