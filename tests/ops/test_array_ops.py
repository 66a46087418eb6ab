"""Array ops: kernels against numpy, round trips, inference with unknown shapes, errors,
indexing with static and dynamic keys, gradients."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from dcf import dtypes
from dcf.errors import InvalidArgumentError
from dcf.graph import Graph
from dcf.ops import array_ops as A
from dcf.ops import math_ops as M
from tests.ops.oracle import build, check_grads, placeholder, run_op

SETTINGS = settings(max_examples=20, deadline=None)
SHAPES = ("static", "dims", "rank")


def _ph(x, how="static", name="x"):
    x = np.asarray(x)
    shape = {"static": x.shape, "dims": (None,) * x.ndim, "rank": None}[how]
    return placeholder(x.dtype, shape, name=name)


def _run(f, *arrays, how="static"):
    """Build f(*placeholders) in a fresh graph and evaluate it fed with `arrays`."""
    g = Graph()
    with g.as_default():
        ps = [_ph(a, how, f"x{i}") for i, a in enumerate(arrays)]
        out = f(*ps)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    vals = run_op(outs, dict(zip(ps, arrays)))
    return (outs, vals) if isinstance(out, (tuple, list)) else (out, vals[0])


def _rand(shape, dt=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dt)


# ------------------------------------------------------------------ reshape
@SETTINGS
@given(shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=4), data=st.data())
def test_reshape_to_a_permuted_factorisation_matches_numpy(shape, data):
    target = list(data.draw(st.permutations(list(shape))))
    if target and 0 not in shape and data.draw(st.booleans()):
        target[data.draw(st.integers(0, len(target) - 1))] = -1
    how = data.draw(st.sampled_from(SHAPES + ("dynamic",)))
    x = _rand(shape)
    g = Graph()
    with g.as_default():
        px = _ph(x, "static" if how == "dynamic" else how)
        feed = {px: x}
        if how == "dynamic":
            sh = placeholder(dtypes.int32, (len(target),))
            feed[sh] = np.array(target, np.int32)
            out = A.reshape(px, sh)
        else:
            out = A.reshape(px, target)
    got = run_op(out, feed)
    want = np.reshape(x, target)
    np.testing.assert_array_equal(got, want)
    if how == "static":
        assert out.shape == want.shape


def test_reshape_mixed_static_and_tensor_dims_keeps_the_static_ones():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (None, 3, 4))
        y = A.reshape(x, [A.shape(x)[0], -1])
        z = A.reshape(x, A.shape(x))
    assert y.shape == (None, None) and z.shape == (None, 3, 4)
    xv = _rand((2, 3, 4))
    yv, zv = run_op([y, z], {x: xv})
    np.testing.assert_array_equal(yv, xv.reshape(2, 12))
    np.testing.assert_array_equal(zv, xv)


def test_reshape_errors_name_sizes():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (2, 3))
        with pytest.raises(
            InvalidArgumentError,
            match=r"Reshape 'Reshape': cannot reshape "
            r"float32\[2,3\] \(6 elements\) into "
            r"\[4, 2\] \(8 elements\)",
        ):
            A.reshape(x, [4, 2])
        with pytest.raises(InvalidArgumentError, match=r"6 is not a multiple of 4"):
            A.reshape(x, [4, -1])
        with pytest.raises(InvalidArgumentError, match=r"at most one -1"):
            A.reshape(x, [-1, -1])


# ------------------------------------------------- transpose, expand, squeeze
@SETTINGS
@given(shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=3), data=st.data())
def test_transpose_matches_numpy(shape, data):
    perm = data.draw(st.one_of(st.none(), st.permutations(list(range(len(shape))))))
    how = data.draw(st.sampled_from(SHAPES + ("dynamic",)))
    x = _rand(shape)
    g = Graph()
    with g.as_default():
        px = _ph(x, "static" if how == "dynamic" else how)
        feed = {px: x}
        p = perm
        if how == "dynamic" and perm is not None:
            p = placeholder(dtypes.int32, (len(perm),))
            feed[p] = np.array(perm, np.int32)
        out = A.transpose(px, p)
    np.testing.assert_array_equal(run_op(out, feed), np.transpose(x, perm))


def test_expand_dims_and_squeeze():
    x = _rand((2, 1, 3))
    (e0, e_1, s_all, s1), vals = _run(
        lambda t: (A.expand_dims(t, 0), A.expand_dims(t, -1), A.squeeze(t), A.squeeze(t, [1])), x
    )
    assert (e0.shape, e_1.shape, s_all.shape, s1.shape) == (
        (1, 2, 1, 3),
        (2, 1, 3, 1),
        (2, 3),
        (2, 3),
    )
    for got, want in zip(vals, [x[None], x[..., None], x.squeeze(), x.squeeze(1)]):
        np.testing.assert_array_equal(got, want)
    g = Graph()
    with g.as_default():
        with pytest.raises(
            InvalidArgumentError,
            match=r"Squeeze 'Squeeze': cannot squeeze "
            r"axis 0 of float32\[2,1,3\]",
        ):
            A.squeeze(placeholder(dtypes.float32, (2, 1, 3)), 0)
        with pytest.raises(
            InvalidArgumentError,
            match=r"ExpandDims 'ExpandDims': axis 4 is "
            r"out of range for a tensor of rank 3",
        ):
            A.expand_dims(placeholder(dtypes.float32, (2, 1, 3)), 4)


# ------------------------------------------------ concat / split, stack / unstack
@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=5), data=st.data())
def test_split_then_concat_round_trips(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    d = shape[axis]
    cuts = sorted(data.draw(st.lists(st.integers(0, d), max_size=3)))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [d])]
    how = data.draw(st.sampled_from(SHAPES + ("dynamic",)))
    x = _rand(shape)
    g = Graph()
    with g.as_default():
        px = _ph(x, "static" if how == "dynamic" else how)
        feed = {px: x}
        ss = sizes
        if how == "dynamic":
            ss = placeholder(dtypes.int32, (len(sizes),))
            feed[ss] = np.array(sizes, np.int32)
        parts = A.split(px, ss, axis=axis)
        back = A.concat(list(parts), axis=axis)
    assert len(parts) == len(sizes)
    vals = run_op(list(parts) + [back], feed)
    for got, want in zip(vals, np.split(x, np.cumsum(sizes)[:-1], axis=axis)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(vals[-1], x)


def test_split_into_equal_parts_and_with_a_minus_one():
    x = _rand((6, 4))
    parts, vals = _run(lambda t: A.split(t, 3), x)
    assert [p.shape for p in parts] == [(2, 4)] * 3
    for got, want in zip(vals, np.split(x, 3)):
        np.testing.assert_array_equal(got, want)
    parts, vals = _run(lambda t: A.split(t, [1, -1], axis=1), x)
    assert [p.shape for p in parts] == [(6, 1), (6, 3)]
    np.testing.assert_array_equal(vals[1], x[:, 1:])
    _, val = _run(lambda t: A.split(t, 1, axis=1)[0], x)
    np.testing.assert_array_equal(val, x)
    with (
        Graph().as_default(),
        pytest.raises(
            InvalidArgumentError,
            match=r"SplitV 'SplitV': axis 0 of "
            r"float32\[6,4\] \(size 6\) does not "
            r"split into 4 equal parts",
        ),
    ):
        A.split(placeholder(dtypes.float32, (6, 4)), 4)


@SETTINGS
@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3), n=st.integers(1, 3), data=st.data()
)
def test_stack_then_unstack_round_trips(shape, n, data):
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    xs = [_rand(shape, seed=i) for i in range(n)]
    how = data.draw(st.sampled_from(("static", "dims")))
    _, vals = _run(
        lambda *ts: (
            (A.stack(list(ts), axis),) + tuple(A.unstack(A.stack(list(ts), axis), axis=axis))
        ),
        *xs,
        how=how,
    )
    np.testing.assert_array_equal(vals[0], np.stack(xs, axis))
    for got, want in zip(vals[1:], xs):
        np.testing.assert_array_equal(got, want)


def test_stack_of_python_numbers_takes_constant_dtypes():
    # Python numbers become int32 / float32 as in dcf.constant (and TF), not numpy's
    # int64 / float64; numpy values keep their dtype
    g = Graph()
    with g.as_default():
        f = A.stack([0.5, 1.0])
        i = A.stack([[1, 2], [3, 4]], axis=1)
        mixed = A.stack([1, 2.5])
        wide = A.stack([1, 2**40])
        kept = A.stack([np.float64(1.0), 2.0])
        assert (f.dtype, i.dtype, mixed.dtype) == (dtypes.float32, dtypes.int32, dtypes.float32)
        assert (wide.dtype, kept.dtype) == (dtypes.int64, dtypes.float64)
        # so it meets a float32 tensor without a cast
        y = f * placeholder(dtypes.float32, (2,))
        feed = {y.op.inputs[1]: np.array([2.0, 3.0], np.float32)}
    got = run_op([y, i, mixed], feed)
    np.testing.assert_array_equal(got[0], [1.0, 3.0])
    np.testing.assert_array_equal(got[1], [[1, 3], [2, 4]])
    np.testing.assert_array_equal(got[2], [1.0, 2.5])


def test_concat_errors_name_shapes():
    g = Graph()
    with g.as_default():
        a = placeholder(dtypes.float32, (2, 3))
        b = placeholder(dtypes.float32, (2, 4))
        assert A.concat([a, b], 1).shape == (2, 7)
        assert A.concat([a, placeholder(dtypes.float32, None)], 0).shape == (None, 3)
        with pytest.raises(
            InvalidArgumentError,
            match=r"ConcatV2 'ConcatV2': inputs differ in "
            r"dimension 1 \(other than axis 0\): "
            r"3 vs 4",
        ):
            A.concat([a, b], 0)
        with pytest.raises(TypeError, match=r"ConcatV2 'ConcatV2': inputs differ in dtype"):
            A.concat([a, placeholder(dtypes.int32, (2, 3))], 0)


# -------------------------------------------------------------- slice, pad
def test_slice_static_dynamic_and_errors():
    x = _rand((4, 5))
    out, got = _run(lambda t: A.slice(t, [1, 2], [2, -1]), x)
    assert out.shape == (2, 3)
    np.testing.assert_array_equal(got, x[1:3, 2:])
    g = Graph()
    with g.as_default():
        px = placeholder(dtypes.float32, (4, 5))
        b = placeholder(dtypes.int32, (2,))
        out = A.slice(px, b, [2, 2])
        assert out.shape == (2, 2)
        np.testing.assert_array_equal(run_op(out, {px: x, b: [2, 3]}), x[2:4, 3:5])
        with pytest.raises(InvalidArgumentError, match=r"slice begin 3 size 2 is out of range"):
            run_op(out, {px: x, b: [3, 0]})
        with pytest.raises(
            InvalidArgumentError,
            match=r"Slice 'Slice': slice begin 3 size 3 is "
            r"out of range for dimension 0",
        ):
            A.slice(px, [3, 0], [3, 1])


def test_pad_static_and_dynamic():
    x = _rand((2, 3))
    out, got = _run(lambda t: A.pad(t, [[1, 0], [2, 1]], constant_values=7), x)
    assert out.shape == (3, 6)
    np.testing.assert_array_equal(got, np.pad(x, [[1, 0], [2, 1]], constant_values=7))
    g = Graph()
    with g.as_default():
        px = placeholder(dtypes.float32, (2, 3))
        p = placeholder(dtypes.int32, (2, 2))
        out = A.pad(px, p)
    assert out.shape == (None, None)
    np.testing.assert_array_equal(
        run_op(out, {px: x, p: [[0, 1], [1, 1]]}), np.pad(x, [[0, 1], [1, 1]])
    )


# -------------------------------------------------------------- indexing
@SETTINGS
@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4), data=st.data())
def test_getitem_matches_numpy_basic_indexing(shape, data):
    key = data.draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    how = data.draw(st.sampled_from(SHAPES))
    x = _rand(shape)
    out, got = _run(lambda t: t[key], x, how=how)
    want = x[key]
    assert out.op.type == "StridedSlice"
    np.testing.assert_array_equal(got, want)
    if how == "static":
        assert out.shape == np.shape(want)


@pytest.mark.parametrize(
    "key",
    [
        1,
        -1,
        np.s_[1:3],
        np.s_[::-1],
        np.s_[:, 0],
        np.s_[..., 1],
        None,
        np.s_[:, None, 1:],
        np.s_[1, ..., ::2],
        np.s_[-3:-1, 2],
        np.s_[None, ..., None],
        np.s_[::2, ::-2],
    ],
)
def test_getitem_examples(key):
    x = _rand((4, 5))
    out, got = _run(lambda t: t[key], x)
    np.testing.assert_array_equal(got, x[key])
    assert out.shape == np.shape(x[key])


def test_getitem_with_tensor_indices():
    x = _rand((4, 5))
    g = Graph()
    with g.as_default():
        px = placeholder(dtypes.float32, (4, 5))
        i = placeholder(dtypes.int32, ())
        j = placeholder(dtypes.int64, ())
        a, b, c = px[i], px[:, i : i + 2], px[j, ::-1][i]
        d = px[1]  # plain ints stay static
    assert a.shape == (5,) and b.shape == (4, None) and c.shape == ()
    assert len(a.op.inputs) == 2 and len(d.op.inputs) == 1
    va, vb, vc = run_op([a, b, c], {px: x, i: 2, j: 3})
    np.testing.assert_array_equal(va, x[2])
    np.testing.assert_array_equal(vb, x[:, 2:4])
    assert vc == x[3, ::-1][2] and type(vc) is np.float32
    with pytest.raises(IndexError):
        run_op(a, {px: x, i: 7})


def test_getitem_errors():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (4, 5))
        with pytest.raises(
            IndexError,
            match=r"StridedSlice 'StridedSlice': index 4 is out of "
            r"range for axis 0 of float32\[4,5\]",
        ):
            x[4]
        with pytest.raises(InvalidArgumentError, match=r"too many indices \(3\)"):
            x[1, 2, 3]
        with pytest.raises(TypeError, match=r"use dcf.gather"):
            x[placeholder(dtypes.int32, (2,))]
        with pytest.raises(TypeError, match=r"boolean indices"):
            x[True]
        with pytest.raises(ValueError, match=r"step cannot be zero"):
            x[::0]


# ------------------------------------------------------- gather and scatter
@SETTINGS
@given(
    pshape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4),
    ishape=hnp.array_shapes(min_dims=0, max_dims=2, max_side=3),
    data=st.data(),
)
def test_gather_matches_numpy_take(pshape, ishape, data):
    axis = data.draw(st.integers(-len(pshape), len(pshape) - 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    params = _rand(pshape)
    idx = rng.integers(0, pshape[axis], size=ishape).astype(
        data.draw(st.sampled_from([np.int32, np.int64]))
    )
    how = data.draw(st.sampled_from(SHAPES))
    out, got = _run(lambda p, i: A.gather(p, i, axis=axis), params, idx, how=how)
    want = np.take(params, idx, axis=axis)
    np.testing.assert_array_equal(got, want)
    if how == "static":
        assert out.shape == want.shape


def test_gather_nd_scatter_nd_and_segment_sum():
    params = _rand((3, 4, 2))
    idx = np.array([[0, 1], [2, 3], [0, 1]], np.int32)
    out, got = _run(lambda p, i: A.gather_nd(p, i), params, idx)
    assert out.shape == (3, 2)
    np.testing.assert_array_equal(got, params[idx[:, 0], idx[:, 1]])
    upd = _rand((3, 2), seed=1)
    out, got = _run(lambda i, u: A.scatter_nd(i, u, [3, 4, 2]), idx, upd)
    want = np.zeros((3, 4, 2), np.float32)
    np.add.at(want, (idx[:, 0], idx[:, 1]), upd)  # the duplicate index adds up
    np.testing.assert_allclose(got, want)
    ids = np.array([[0, 2], [2, 2]], np.int32)
    data = _rand((2, 2, 3))
    out, got = _run(lambda d, i: A.unsorted_segment_sum(d, i, 4), data, ids)
    want = np.zeros((4, 3), np.float32)
    np.add.at(want, ids, data)
    assert out.shape == (4, 3)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_one_hot():
    idx = np.array([[0, 2], [1, 5]], np.int32)
    (a, b, c), (va, vb, vc) = _run(
        lambda i: (
            A.one_hot(i, 3),
            A.one_hot(i, 3, on_value=5, off_value=-1, axis=0, dtype=dtypes.int32),
            A.one_hot(i, 4, dtype=dtypes.bool_),
        ),
        idx,
    )
    assert a.shape == (2, 2, 3) and a.dtype is dtypes.float32
    assert b.shape == (3, 2, 2) and b.dtype is dtypes.int32 and c.dtype is dtypes.bool_
    want = (idx[..., None] == np.arange(3)).astype(np.float32)  # 5 is out of range: all off
    np.testing.assert_array_equal(va, want)
    np.testing.assert_array_equal(vb, np.moveaxis(np.where(want > 0, 5, -1), -1, 0))
    np.testing.assert_array_equal(vc, idx[..., None] == np.arange(4))


@SETTINGS
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3), data=st.data()
)
def test_where_selects_with_broadcasting(shapes, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    c = rng.random(shapes.input_shapes[0]) < 0.5
    x, y = _rand(shapes.input_shapes[1]), _rand(shapes.input_shapes[2], seed=1)
    _, got = _run(lambda a, b, d: A.where(a, b, d), c, x, y, how=data.draw(st.sampled_from(SHAPES)))
    np.testing.assert_array_equal(got, np.where(c, x, y))


def test_where_with_one_argument_gives_int64_coordinates_and_select_takes_scalars():
    c = np.array([[True, False], [False, True]])
    out, got = _run(lambda t: A.where(t), c)
    assert out.dtype is dtypes.int64 and out.shape == (None, 2)
    np.testing.assert_array_equal(got, np.argwhere(c))
    out, got = _run(lambda t: A.select(t, 1.0, 0.0), c)
    assert out.dtype is dtypes.float32
    np.testing.assert_array_equal(got, c.astype(np.float32))


# -------------------------------------------------------------------- fills
def test_fills_static_and_dynamic():
    g = Graph()
    with g.as_default():
        n = placeholder(dtypes.int32, ())
        x = placeholder(dtypes.float32, (None, 3))
        outs = [
            A.zeros([2, 3]),
            A.ones((2,), dtypes.int32),
            A.fill([2, 2], 7.5),
            A.zeros([n, 4]),
            A.ones(A.shape(x), dtypes.bool_),
            A.zeros_like(x),
            A.ones_like(x, dtype=dtypes.int64),
            A.eye(3),
            A.eye(2, 3, batch_shape=[2]),
            A.zeros(()),
            A.eye(n, dtype=dtypes.int32),
        ]
    assert [o.shape for o in outs] == [
        (2, 3),
        (2,),
        (2, 2),
        (None, 4),
        (None, 3),
        (None, 3),
        (None, 3),
        (3, 3),
        (2, 2, 3),
        (),
        (None, None),
    ]
    xv = _rand((2, 3))
    vals = run_op(outs, {n: 2, x: xv})
    wants = [
        np.zeros((2, 3)),
        np.ones(2),
        np.full((2, 2), 7.5),
        np.zeros((2, 4)),
        np.ones((2, 3), bool),
        np.zeros((2, 3)),
        np.ones((2, 3)),
        np.eye(3),
        np.broadcast_to(np.eye(2, 3), (2, 2, 3)),
        0.0,
        np.eye(2),
    ]
    for o, got, want in zip(outs, vals, wants):
        np.testing.assert_array_equal(got, want)
        assert np.asarray(got).dtype == o.dtype.np


def test_shape_size_rank_fold_to_constants_when_known():
    g = Graph()
    with g.as_default():
        k = placeholder(dtypes.float32, (2, 3))
        u = placeholder(dtypes.float32, (None, 3))
        r = placeholder(dtypes.float32, None)
        known = [A.shape(k), A.size(k), A.rank(k), A.rank(u)]
        dynamic = [A.shape(u), A.size(u), A.rank(r), A.shape(r, out_type=dtypes.int64)]
    assert all(t.op.type == "Const" for t in known)
    assert [t.op.type for t in dynamic] == ["Shape", "Size", "Rank", "Shape"]
    xv = _rand((4, 3))
    vals = run_op(known + dynamic, {u: xv, r: xv})
    wants = [[2, 3], 6, 2, 2, [4, 3], 12, 2, [4, 3]]
    for got, want in zip(vals, wants):
        np.testing.assert_array_equal(got, want)
    assert vals[-1].dtype == np.int64 and type(vals[5]) is np.int32


def test_tile_broadcast_to_and_broadcast_gradient_args():
    x = _rand((2, 1, 3))
    (t, b, b2), (vt, vb, _) = _run(
        lambda a: (
            A.tile(a, [2, 3, 1]),
            A.broadcast_to(a, [4, 2, 5, 3]),
            A.broadcast_to(a, A.shape(A.zeros([2, 5, 3]))),
        ),
        x,
    )
    assert t.shape == (4, 3, 3) and b.shape == (4, 2, 5, 3) and b2.shape == (2, 5, 3)
    np.testing.assert_array_equal(vt, np.tile(x, [2, 3, 1]))
    np.testing.assert_array_equal(vb, np.broadcast_to(x, (4, 2, 5, 3)))
    _, (r0, r1) = build(
        lambda: A.broadcast_gradient_args(
            np.array([2, 1, 3], np.int32), np.array([4, 1, 5, 1], np.int32)
        )
    )
    v0, v1 = run_op([r0, r1])
    np.testing.assert_array_equal(v0, [0, 2])
    np.testing.assert_array_equal(v1, [1, 3])
    with (
        Graph().as_default(),
        pytest.raises(
            InvalidArgumentError,
            match=r"BroadcastTo 'BroadcastTo': cannot "
            r"broadcast float32\[2,3\] to \[4, 3, 2\]",
        ),
    ):
        A.broadcast_to(placeholder(dtypes.float32, (2, 3)), [4, 3, 2])


# ---------------------------------------------------------------- gradients
def _arg(rng, shape):
    return rng.standard_normal(shape)


# id, function of float64 tensors, argument shapes, shape knowledge to test with
GRAD_CASES = [
    ("reshape", lambda x: A.reshape(x, [3, -1]), [(2, 3, 2)], SHAPES),
    ("transpose", lambda x: A.transpose(x, [2, 0, 1]), [(2, 3, 4)], SHAPES),
    ("transpose_default", A.transpose, [(2, 3)], SHAPES),
    (
        "transpose_dynamic_perm",
        lambda x: A.transpose(x, M.range(A.rank(x))[::-1]),
        [(2, 3)],
        SHAPES,
    ),
    ("expand_dims", lambda x: A.expand_dims(x, 1), [(2, 3)], SHAPES),
    ("squeeze", lambda x: A.squeeze(x, [1]), [(2, 1, 3)], SHAPES),
    ("concat", lambda x, y: A.concat([x, y, x], 1), [(2, 3), (2, 2)], SHAPES),
    ("stack", lambda x, y: A.stack([x, y], 1), [(2, 3), (2, 3)], SHAPES),
    (
        "unstack",
        lambda x: A.unstack(x, num=3, axis=1)[2] * A.unstack(x, num=3, axis=1)[0],
        [(2, 3)],
        SHAPES,
    ),
    ("unstack_one_used", lambda x: A.unstack(x, num=2)[1], [(2, 3)], SHAPES),
    ("split", lambda x: A.split(x, [1, 3], axis=1)[1], [(2, 4)], SHAPES),
    ("split_both", lambda x: A.concat(list(A.split(x, 2, axis=0))[::-1], 1), [(4, 3)], SHAPES),
    ("slice", lambda x: A.slice(x, [1, 0], [2, -1]), [(4, 3)], SHAPES),
    ("slice_dynamic_begin", lambda x: A.slice(x, A.shape(x) - [2, 3], [2, 3]), [(4, 3)], SHAPES),
    ("pad", lambda x: A.pad(x, [[1, 2], [0, 1]]), [(2, 3)], SHAPES),
    ("getitem", lambda x: x[1:, None, ::-2] * x[0, ::2, None, 1], [(3, 4, 2)], SHAPES),
    ("getitem_ellipsis", lambda x: x[..., -1] * x[-1], [(2, 2)], SHAPES),
    ("getitem_dynamic", lambda x: x[A.size(x) // 6, 1:], [(2, 3)], SHAPES),
    ("gather", lambda x: A.gather(x, np.array([[2, 0], [2, 2]], np.int32)), [(3, 2)], SHAPES),
    (
        "gather_axis1",
        lambda x: A.gather(x, np.array([1, 1, 0], np.int32), axis=1),
        [(2, 3, 2)],
        ("static", "dims"),
    ),
    (
        "gather_nd",
        lambda x: A.gather_nd(x, np.array([[0, 1], [0, 1], [1, 2]], np.int32)),
        [(2, 3, 2)],
        SHAPES,
    ),
    (
        "scatter_nd",
        lambda u: A.scatter_nd(np.array([[1], [3], [1]], np.int32), u, [5, 2]),
        [(3, 2)],
        SHAPES,
    ),
    (
        "segment_sum",
        lambda d: A.unsorted_segment_sum(d, np.array([0, 2, 0], np.int32), 3),
        [(3, 2)],
        SHAPES,
    ),
    ("select", lambda x, y: A.where(np.array([True, False, True]), x, y), [(2, 3), (3,)], SHAPES),
    ("fill", lambda v: A.fill([2, 3], v), [()], SHAPES),
    ("tile", lambda x: A.tile(x, [2, 1, 3]), [(2, 3, 1)], ("static", "dims")),
    ("broadcast_to", lambda x: A.broadcast_to(x, [4, 2, 3]), [(2, 1)], SHAPES),
]


@pytest.mark.parametrize("case,f,shapes,hows", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradient_matches_finite_differences(case, f, shapes, hows):
    rng = np.random.default_rng(3)
    args = [_arg(rng, s) for s in shapes]
    for how in hows:
        check_grads(f, args, shapes=how)


@pytest.mark.parametrize(
    "case",
    [
        "getitem",
        "getitem_dynamic",
        "gather",
        "slice",
        "pad",
        "concat",
        "tile",
        "broadcast_to",
        "select",
        "segment_sum",
    ],
)
def test_second_order_gradient_matches_finite_differences(case):
    _, f, shapes, _ = next(c for c in GRAD_CASES if c[0] == case)
    rng = np.random.default_rng(4)
    check_grads(lambda *xs: M.square(f(*xs)), [_arg(rng, s) for s in shapes], order=2)


# ------------------------------------------------------- build-time knowledge
def test_shape_entries_known_at_build_time_stay_static():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (3, 4))
        u = placeholder(dtypes.float32, (None, 4))
        first = A.shape(x)[0]
        a = A.reshape(x, [A.shape(x)[0], -1])
        b = A.zeros([A.shape(u)[0], A.shape(u)[1]])
        c = A.reshape(u, [-1, A.shape(u)[1] * 1, 1])
    assert first.op.type == "Const" and run_op(first) == 3  # folded
    assert a.op.type == "Reshape" and len(a.op.inputs) == 1 and a.shape == (3, 4)
    assert b.shape == (None, 4) and c.shape == (None, 4, 1)  # shape(u)[1] * 1 folded, as TF1
    uv = _rand((2, 4))
    bv, cv = run_op([b, c], {u: uv})
    assert bv.shape == (2, 4) and cv.shape == (2, 4, 1)


def test_split_by_a_scalar_tensor_count_and_concat_of_python_values():
    x = _rand((4, 2), dt=np.float64)
    parts, _ = _run(lambda t: A.split(t, M.cast(2, dtypes.int32)), x)
    assert len(parts) == 2 and parts[0].shape == (2, 2)
    out, got = _run(lambda t: A.concat([t, [[1.0, 2.0]]], 0), x)
    assert out.dtype is dtypes.float64 and out.shape == (5, 2)
    np.testing.assert_array_equal(got, np.concatenate([x, [[1.0, 2.0]]]))


def test_axis_arguments_must_be_known_when_the_graph_is_built():
    g = Graph()
    with g.as_default():
        x = placeholder(dtypes.float32, (2, 3))
        k = placeholder(dtypes.int32, ())
        with pytest.raises(TypeError, match=r"axis must be known when the graph is built"):
            A.expand_dims(x, k)
        with pytest.raises(TypeError, match=r"axis must be known when the graph is built"):
            A.concat([x, x], k)
