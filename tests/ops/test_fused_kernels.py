"""Faster CPU kernels for small dense models (issue #6): each must compute what the op did
before, bit for bit.

- Relu: np.maximum against a cached read-only zeros array of the input's shape
  (numpy's SIMD loop runs only when both operands are arrays of one shape) instead of
  a Python 0 (ReluGrad, whose kernel is unchanged, is checked alongside);
- Max / Min over a short last axis (k <= 4) column by column (Sum, Mean and Prod keep
  numpy's reduction; checked alongside);
- OneHot along the last axis as one `take` from an on/off table;
- ResourceApplyAdam: AdamOptimizer's update of one variable as one op, the moments
  updated in place when nothing else refers to their buffers.

The generic kernels (checked against numpy in the other tests of this folder) are the
reference for the bound ones; Adam is checked against the op-by-op graph it replaces
(bit for bit) and against float64 numpy (float32 tolerance).
"""

from __future__ import annotations

import functools
import itertools
from types import SimpleNamespace

import numpy as np
import pytest

import dcf
from dcf.ops import math_ops
from dcf.ops.registry import OPS
from dcf.resources import DeviceResources

from tests.autodiff.gradcheck import check_grads

SPECIALS = np.array([-0.0, 0.0, np.nan, 1.0, -1.0, np.inf, -np.inf, 3.5, 1e-45, 6e4],
                    np.float64)
RNG = np.random.default_rng(11)


def _bound(op_type: str, **attrs):
    kernel = OPS[op_type].kernel
    fn = DeviceResources().bind_kernel(SimpleNamespace(kernel=kernel), dict(attrs))
    return fn, functools.partial(kernel, np, **attrs)


def _same(a, b) -> None:
    """Same type, dtype, shape and bytes (NaN payloads and signed zeros included)."""
    assert type(a) is type(b), (type(a), type(b))
    assert a.dtype == b.dtype and np.shape(a) == np.shape(b), (a.dtype, b.dtype)
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), (a, b)


def _values(shape, dt):
    if np.dtype(dt).kind in "iu":
        return RNG.integers(-5, 6, size=shape).astype(dt)
    with np.errstate(all="ignore"):
        v = np.resize(SPECIALS, shape).astype(dt)
    return v[()] if shape == () else v


# --------------------------------------------------------------------- Relu
@pytest.mark.parametrize("dt", [np.float16, np.float32, np.float64, np.int32, np.int64,
                                np.int8])
@pytest.mark.parametrize("shape", [(), (1,), (7,), (64, 64), (1, 64), (3, 4, 5)])
def test_relu_and_relu_grad_bit_for_bit(dt, shape):
    relu, relu_ref = _bound("Relu")
    grad, grad_ref = _bound("ReluGrad")
    x = _values(shape, dt)
    with np.errstate(all="ignore"):
        _same(relu(x), relu_ref(x))
        y = relu_ref(x)
        dy = _values(shape, dt) * (dt(2) if np.dtype(dt).kind in "iu" else dt(-3.0))
        _same(grad(dy, y), grad_ref(dy, y))
        _same(grad(dy, x), grad_ref(dy, x))        # negative and NaN "outputs" too
        if np.ndim(x) == 2:                        # transposed (non-contiguous) inputs
            _same(relu(x.T), relu_ref(x.T))
            _same(grad(dy.T, y.T), grad_ref(dy.T, y.T))


def test_relu_grad_broadcasting_and_the_shared_zeros():
    grad, grad_ref = _bound("ReluGrad")
    dy = RNG.standard_normal((4, 3)).astype(np.float32)
    y = np.maximum(RNG.standard_normal(3).astype(np.float32), 0)
    _same(grad(dy, y), grad_ref(dy, y))              # y broadcasts: the generic path
    relu, _ = _bound("Relu")
    x = RNG.standard_normal((5, 6)).astype(np.float32)
    out = relu(x)
    out[...] = 7.0                                   # the result is the caller's own
    z = math_ops._zeros_for(x)
    assert not z.flags.writeable and not z.any()
    with pytest.raises(ValueError):
        z[0, 0] = 1.0


def test_relu_in_a_session_and_its_gradient():
    x = RNG.standard_normal((6, 5))
    w = RNG.standard_normal((5, 4))
    check_grads(lambda a, b: dcf.reduce_sum(dcf.nn.relu(dcf.matmul(a, b)) *
                                            dcf.nn.relu(dcf.matmul(a, b) + 0.3)), [x, w])


# ------------------------------------------------------------ short reductions
@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean", "Prod"])
@pytest.mark.parametrize("dt", [np.float16, np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_reductions_over_a_short_last_axis(op, dt, k):
    if np.dtype(dt).kind == "f":
        with np.errstate(all="ignore"):
            rows = np.array(list(itertools.product(SPECIALS[:7], repeat=min(k, 3))))
            if k > 3:
                rows = np.concatenate([rows, RNG.standard_normal((len(rows), k - 3)) * 1e3],
                                      1)
            rows = rows.astype(dt)
    else:
        rows = RNG.integers(-2**20, 2**20, (200, k)).astype(dt)
    with np.errstate(all="ignore"):
        for axis, keepdims in itertools.product([(1,), (-1,), (0,), None], [False, True]):
            fn, ref = _bound(op, axis=axis, keepdims=keepdims)
            _same(fn(rows), ref(rows))
            t = np.asfortranarray(rows)              # strided columns
            _same(fn(t), ref(t))


def test_short_sums_of_random_floats_and_negative_zeros():
    fn, ref = _bound("Sum", axis=(1,), keepdims=False)
    for dt in (np.float32, np.float64):
        for k in (2, 3, 4):
            x = (RNG.standard_normal((5000, k)) *
                 10.0 ** RNG.integers(-8, 8, (5000, k))).astype(dt)
            _same(fn(x), ref(x))
            z = np.full((3, k), -0.0, dt)            # numpy sums these to +0.0
            _same(fn(z), ref(z))
            assert not np.signbit(fn(z)).any()


def test_max_gradient_through_a_short_axis():
    q = RNG.standard_normal((8, 2))
    check_grads(lambda a: dcf.reduce_max(a, axis=1) * dcf.reduce_sum(a * a, axis=1), [q])


# --------------------------------------------------------------------- OneHot
@pytest.mark.parametrize("idt", [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64])
@pytest.mark.parametrize("depth", [1, 2, 3, 7])
def test_one_hot_by_table(idt, depth):
    lo = -3 if np.dtype(idt).kind == "i" else 0
    for shape in [(64,), (3, 4), (0,), (1,)]:
        idx = RNG.integers(lo, depth + 3, shape).astype(idt)
        for on, off in [(np.float32(1), np.float32(0)), (np.float32(2.5), np.float32(-0.0)),
                        (np.int32(1), np.int32(0)), (np.float64(np.nan), np.float64(-1)),
                        (np.bool_(True), np.bool_(False))]:
            for axis in (-1, 0, len(shape)):
                fn, ref = _bound("OneHot", depth=depth, axis=axis)
                _same(fn(idx, on, off), ref(idx, on, off))
                _same(fn(idx, on, off), ref(idx, on, off))   # the cached table


def test_one_hot_table_follows_new_on_off_values():
    fn, ref = _bound("OneHot", depth=3, axis=-1)
    idx = np.array([0, 2, 5, -1], np.int32)
    for v in (1.0, 2.0, -4.0, 2.0):
        on, off = np.float32(v), np.float32(v / 8)   # new objects each time
        _same(fn(idx, on, off), ref(idx, on, off))


# ----------------------------------------------------------------------- Adam
def _old_adam_graph(opt, var, grad):
    """The op-by-op update AdamOptimizer built before ResourceApplyAdam (as it was)."""
    from dcf.ops.state_ops import Variable

    dt = var.dtype
    b1p = Variable(np.asarray(1.0, dt.np), name="beta1_power", trainable=False)
    b2p = Variable(np.asarray(1.0, dt.np), name="beta2_power", trainable=False)
    nb1 = b1p.assign(b1p * opt.beta1)
    nb2 = b2p.assign(b2p * opt.beta2)
    lr_t = opt.learning_rate * dcf.sqrt(1.0 - nb2) / (1.0 - nb1)
    shape = var.shape
    m = Variable(np.zeros(shape, dt.np), name="m", trainable=False)
    v = Variable(np.zeros(shape, dt.np), name="v", trainable=False)
    m_new = m.assign(m * opt.beta1 + grad * (1.0 - opt.beta1))
    v_new = v.assign(v * opt.beta2 + dcf.square(grad) * (1.0 - opt.beta2))
    step = dcf.cast(lr_t, var.dtype) * m_new / (dcf.sqrt(v_new) + opt.epsilon)
    return var.assign_sub(step), m, v


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (8898,)])
def test_apply_adam_is_the_old_graph_bit_for_bit(dt, shape):
    init = (RNG.standard_normal(shape) * 2).astype(dt)
    feeds = [(RNG.standard_normal(shape) * 10.0 ** RNG.integers(-3, 3)).astype(dt)
             for _ in range(6)]
    feeds[2] = np.zeros(shape, dt)
    results = []
    for fused in (True, False):
        g = dcf.Graph()
        with g.as_default():
            var = dcf.Variable(init, name="w")
            gp = dcf.placeholder(dcf.as_dtype(dt), shape)
            opt = dcf.train.AdamOptimizer(0.01, beta1=0.8, beta2=0.99, epsilon=1e-7)
            if fused:
                upd = opt.apply_gradients([(gp, var)])
                m, v = opt._slots[var]
                assert any(op.type == "ResourceApplyAdam" for op in g.get_operations())
            else:
                upd, m, v = _old_adam_graph(opt, var, gp)
            reads = [var.read_value(), m.read_value(), v.read_value()]
            ini = dcf.global_variables_initializer()
        with dcf.Session(g) as s:
            s.run(ini)
            hist = []
            for f in feeds:
                s.run(upd, {gp: f})
                hist.append([np.array(r) for r in s.run(reads)])
        results.append(hist)
    for a, b in zip(*results):
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_apply_adam_flushes_subnormal_moments_to_zero(dt):
    """Every FLUSH_EVERY-th update, a moment's subnormal elements become 0 (TF's CPU
    kernels run with subnormals flushed to zero; on a CPU every operation on a subnormal
    is slow); the updates between are the update's own float operations bit for bit, and
    every element at or above the smallest normal number always is."""
    from dcf.ops.state_ops import FLUSH_EVERY

    tiny = np.finfo(dt).tiny
    b1, b2 = 0.8, 0.99
    m0 = np.array([0.5 * tiny, 1.05 * tiny, 1.0, -3 * tiny, 0.0, -0.9 * tiny, -2.0], dt)
    v0 = np.array([0.9 * tiny, 2 * tiny, 1e-3, 1.001 * tiny, 0.0, 4.0, 3 * tiny], dt)
    grad = np.zeros(7, dt)
    g = dcf.Graph()
    with g.as_default():
        var = dcf.Variable(np.ones(7, dt), name="w")
        opt = dcf.train.AdamOptimizer(0.01, beta1=b1, beta2=b2, epsilon=1e-7)
        upd = opt.apply_gradients([(dcf.constant(grad), var)])
        m, v = opt._slots[var]
        set_moments = dcf.group(m.assign(m0), v.assign(v0))
        reads = [m.read_value(), v.read_value()]
        ini = dcf.global_variables_initializer()
    assert FLUSH_EVERY > 1
    with dcf.Session(g) as s:
        s.run(ini)
        s.run(set_moments)
        raw_m, raw_v = m0, v0
        for k in range(1, FLUSH_EVERY + 1):
            s.run(upd)
            got_m, got_v = (np.array(r) for r in s.run(reads))
            raw_m = raw_m * dt(b1) + grad * dt(1.0 - b1)   # the update's own float operations
            raw_v = raw_v * dt(b2) + (grad * grad) * dt(1.0 - b2)
            for got, raw in ((got_m, raw_m), (got_v, raw_v)):
                if k < FLUSH_EVERY:
                    assert got.tobytes() == raw.tobytes()
                    continue
                sub = (raw != 0) & (np.abs(raw) < tiny)
                assert sub.any() and (~sub).any()
                assert np.all(got[sub] == 0)
                assert got[~sub].tobytes() == raw[~sub].tobytes()


def test_apply_adam_against_float64():
    shape = (40,)
    init = RNG.standard_normal(shape).astype(np.float32)
    grads = [RNG.standard_normal(shape).astype(np.float32) for _ in range(20)]
    lr, b1, b2, eps = 0.003, 0.9, 0.999, 1e-8
    g = dcf.Graph()
    with g.as_default():
        var = dcf.Variable(init)
        gp = dcf.placeholder(dcf.float32, shape)
        upd = dcf.train.AdamOptimizer(lr, b1, b2, eps).apply_gradients([(gp, var)])
        ini = dcf.global_variables_initializer()
    w, m, v = init.astype(np.float64), np.zeros(shape), np.zeros(shape)
    with dcf.Session(g) as s:
        s.run(ini)
        for t, gr in enumerate(grads, 1):
            out = s.run(upd, {gp: gr})
            g64 = gr.astype(np.float64)
            m = b1 * m + (1 - b1) * g64
            v = b2 * v + (1 - b2) * g64 * g64
            w = w - lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + eps)
        np.testing.assert_allclose(s.run(var.read_value()), w, rtol=2e-5, atol=1e-6)
    del out


def test_apply_adam_never_writes_a_buffer_someone_holds():
    """Reads are snapshots: values read in the same run before the update, fetched
    results, and a fed gradient keep their contents."""
    shape = (6,)
    init = np.arange(6, dtype=np.float32) + 1
    g = dcf.Graph()
    with g.as_default():
        var = dcf.Variable(init)
        gp = dcf.placeholder(dcf.float32, shape)
        opt = dcf.train.AdamOptimizer(0.1)
        m, v = opt._slot(var)
        before = [var.read_value(), m.read_value(), v.read_value()]
        with dcf.control_dependencies(before):
            upd = opt.apply_gradients([(gp, var)])
        with dcf.control_dependencies([upd]):
            after = [var.read_value(), m.read_value(), v.read_value()]
        ini = dcf.global_variables_initializer()
    with dcf.Session(g) as s:
        s.run(ini)
        grad = np.full(shape, 0.5, np.float32)
        grad_copy = grad.copy()
        prev = [init, np.zeros(shape, np.float32), np.zeros(shape, np.float32)]
        fetched = []
        for step in range(4):
            b, _, a = s.run([before, upd, after], {gp: grad * (step + 1)})
            for x, y in zip(b, prev):
                np.testing.assert_array_equal(x, y)        # read before the update
            assert not any(np.array_equal(x, y) for x, y in zip(a, b))
            np.testing.assert_array_equal(grad, grad_copy)  # the feed is untouched
            fetched.append(([x.copy() for x in b + a], b + a))
            prev = [x.copy() for x in a]
        for copies, held in fetched:                      # later updates wrote none of them
            for x, y in zip(copies, held):
                np.testing.assert_array_equal(x, y)


def test_apply_adam_moments_in_place_when_exclusive():
    from dcf.ops.state_ops import _adam_update
    from dcf.resources import VarStore

    n = 10
    var = VarStore("w", np.ones(n, np.float32))
    m = VarStore("m", np.zeros(n, np.float32))
    v = VarStore("v", np.zeros(n, np.float32))
    f = _adam_update(np, 0.9, 0.999, 1e-8, dcf.float32)
    grad = np.full(n, 0.25, np.float32)
    f(var, m, v, np.float32(0.01), grad)
    ids = id(m.value), id(v.value), id(var.value)
    f(var, m, v, np.float32(0.01), grad)
    assert (id(m.value), id(v.value), id(var.value)) == ids      # nothing else held them
    held = var.value
    snapshot = held.copy()
    f(var, m, v, np.float32(0.01), grad)
    assert var.value is not held                                  # held: a new buffer
    np.testing.assert_array_equal(held, snapshot)
    view = m.value[2:5]
    vs = view.copy()
    f(var, m, v, np.float32(0.01), grad)
    np.testing.assert_array_equal(view, vs)                       # a view pins it too


def test_apply_adam_is_not_differentiable_and_checks_dtypes():
    g = dcf.Graph()
    with g.as_default():
        var = dcf.Variable(np.ones(3, np.float32))
        x = dcf.placeholder(dcf.float32, (3,))
        dcf.train.AdamOptimizer(0.1).apply_gradients([(x * 2.0, var)])
        (adam,) = [op for op in g.get_operations() if op.type == "ResourceApplyAdam"]
        assert dcf.gradients(adam.outputs[0], [x]) == [None]
        from dcf.ops.state_ops import apply_adam

        m = dcf.Variable(np.zeros(3, np.float32))
        with pytest.raises(TypeError):
            apply_adam(var, m, m, np.float32(0.1), dcf.placeholder(dcf.float64, (3,)),
                       0.9, 0.999, 1e-8)


# ---------------------------------------------------------------- one-row scatter
@pytest.mark.parametrize("shape", [(7, 3), (7,), (4, 2, 3)])
@pytest.mark.parametrize("index", [0, 3, -1, -7, 7, -8])
def test_one_row_scatter_update_is_the_fancy_index_write(shape, index):
    from dcf.resources import VarStore

    fn, ref = _bound("ResourceScatter", dtype=dcf.float32, mode="update", shape=shape)
    for idt in (np.int32, np.int64):
        idx = np.array([index], idt)
        upd = RNG.standard_normal((1,) + shape[1:]).astype(np.float32)
        outs = []
        for f in (fn, ref):
            h = VarStore("t", np.arange(np.prod(shape), dtype=np.float32).reshape(shape))
            try:
                outs.append(("ok", f(h, idx, upd).copy(), h.value.copy()))
            except IndexError as e:
                outs.append(("IndexError", type(e), None))
        assert outs[0][0] == outs[1][0]
        if outs[0][0] == "ok":
            _same(outs[0][1], outs[1][1])
            _same(outs[0][2], outs[1][2])
    # a broadcast row and a held buffer (copy-on-write) behave as before
    h = VarStore("t", np.zeros((3, 2), np.float32))
    held = h.value
    out = fn(h, np.array([1], np.int32), np.ones((1, 1), np.float32))
    assert not held.any() and out[1].tolist() == [1.0, 1.0] and out is h.value
