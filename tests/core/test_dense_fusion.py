"""The frame compiler's CPU dense-layer fusion (dcf/elementwise_fusion.py, dense_groups):
MatMul -> Add(bias) [-> Relu] chains whose inner values nobody else reads run as one
call computing into the product's buffer. Values must equal the unfused execution bit
for bit (compile_frames=False runs every op through the tagged executor, one kernel
each); fetched or shared intermediates stop the fusion; errors still name the op that
failed."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
import dcf.elementwise_fusion as ef
import dcf.frame_compiler as fc
from dcf.errors import InvalidArgumentError

from tests.autodiff.gradcheck import check_grads

RNG = np.random.default_rng(3)
UNFUSED = dcf.SessionConfig(compile_frames=False)


@pytest.fixture
def groups(monkeypatch):
    """The dense groups the frame compiler fused while the test runs: [(root type,
    absorbed op types)]."""
    out: list = []
    orig = ef.dense_groups

    def spy(*args):
        res = orig(*args)
        for root, (absorbed, _, _, _) in res.items():
            out.append(tuple(n.type for n in absorbed))
        return res

    monkeypatch.setattr(ef, "dense_groups", spy)
    return out


def _run(fetches, feed=None, config=None, steps=1):
    init = dcf.global_variables_initializer()
    with dcf.Session(config=config) as s:
        s.run(init)
        for _ in range(steps - 1):
            s.run(fetches, feed)
        return s.run(fetches, feed)


def _same(a, b):
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def _mlp(x, sizes, dt, bias_first=False, relu_last=False, rng=None):
    rng = rng or RNG
    h = x
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        w = dcf.Variable((rng.standard_normal((a, b)) / np.sqrt(a)).astype(dt), name=f"w{i}")
        c = dcf.Variable((rng.standard_normal(b) * 0.1).astype(dt), name=f"b{i}")
        p = dcf.matmul(h, w)
        h = (c + p) if bias_first else (p + c)
        if i < len(sizes) - 2 or relu_last:
            h = dcf.nn.relu(h)
    return h


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("bias_first", [False, True])
def test_mlp_forward_and_gradients_equal_the_unfused_run(groups, dt, bias_first):
    xv = RNG.standard_normal((16, 5)).astype(dt)
    xv[0, :] = np.nan
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.as_dtype(dt), (None, 5))
        y = _mlp(x, [5, 8, 8, 3], dt, bias_first)
        loss = dcf.reduce_sum(y[1:] * y[1:])
        grads = dcf.gradients(loss, dcf.trainable_variables())
        fetches = [y, loss] + grads
        fused = _run(fetches, {x: xv})
        plain = _run(fetches, {x: xv}, UNFUSED)
    _same(fused, plain)
    assert ("MatMul", "Add") in groups and ("MatMul",) in groups


def test_training_steps_equal_the_unfused_run(groups):
    xv = RNG.standard_normal((32, 4)).astype(np.float32)
    results = []
    for config in (None, UNFUSED):
        g = dcf.Graph()
        with g.as_default():
            x = dcf.constant(xv)
            y = _mlp(x, [4, 16, 16, 2], np.float32, relu_last=True,
                     rng=np.random.default_rng(5))
            loss = dcf.reduce_mean(dcf.square(y - 0.5))
            step = dcf.train.AdamOptimizer(0.01).minimize(loss)
            results.append(_run([loss, y, step], steps=5, config=config)[:2])
    _same(results[0], results[1])
    assert groups


def test_shared_or_fetched_intermediates_are_not_fused(groups):
    xv = RNG.standard_normal((4, 3)).astype(np.float32)
    wv = RNG.standard_normal((3, 3)).astype(np.float32)
    bv = RNG.standard_normal(3).astype(np.float32)
    g = dcf.Graph()
    with g.as_default():
        x = dcf.constant(xv)
        p = dcf.matmul(x, wv)
        pre = p + bv
        out = dcf.nn.relu(pre)
        other = p * 2.0                              # p has two consumers
        fetches = [out, pre, other]
        fused = _run(fetches)
        plain = _run(fetches, config=UNFUSED)
    _same(fused, plain)
    assert groups == []
    groups.clear()
    with g.as_default():
        q = dcf.matmul(x, wv)
        pre2 = q + bv
        out2 = dcf.nn.relu(pre2)
        fetches = [out2, pre2]                       # the pre-activation is fetched
        fused = _run(fetches)
        plain = _run(fetches, config=UNFUSED)
    _same(fused, plain)
    assert groups == [("MatMul",)]                   # MatMul + Add only; Relu separate
    np.testing.assert_array_equal(fused[0], np.maximum(fused[1], 0))


def test_bias_that_broadcasts_the_product_and_scalar_bias(groups):
    xv = RNG.standard_normal((1, 3)).astype(np.float32)
    wv = RNG.standard_normal((3, 4)).astype(np.float32)
    big = RNG.standard_normal((5, 4)).astype(np.float32)
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (None, 3))
        b = dcf.placeholder(dcf.float32, None)
        y = dcf.nn.relu(dcf.matmul(x, wv) + b)
        for bv in (big, np.float32(0.25), big[0], big[:1]):
            _same(_run(y, {x: xv, b: bv}), _run(y, {x: xv, b: bv}, UNFUSED))
            assert _run(y, {x: xv, b: bv}).shape == np.broadcast_shapes((1, 4), np.shape(bv))
    assert groups


def test_inputs_are_never_written():
    """The fused call writes only into the product it made: the input, the weights (a
    Variable's buffer) and a fed bias keep their values."""
    xv = RNG.standard_normal((4, 3)).astype(np.float32)
    bv = RNG.standard_normal(3).astype(np.float32)
    xc, bc = xv.copy(), bv.copy()
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (4, 3))
        b = dcf.placeholder(dcf.float32, (3,))
        w = dcf.Variable(np.eye(3, dtype=np.float32))
        y = dcf.nn.relu(dcf.matmul(x, w) + b)
        init = dcf.global_variables_initializer()
    with dcf.Session(g) as s:
        s.run(init)
        out = s.run(y, {x: xv, b: bv})
        np.testing.assert_array_equal(out, np.maximum(xv + bv, 0))
        np.testing.assert_array_equal(xv, xc)
        np.testing.assert_array_equal(bv, bc)
        np.testing.assert_array_equal(s.run(w.read_value()), np.eye(3))


def test_dense_layer_in_a_loop_and_in_a_cond(groups):
    wv = (RNG.standard_normal((6, 6)) * 0.4).astype(np.float32)
    bv = RNG.standard_normal(6).astype(np.float32)
    x0 = RNG.standard_normal((2, 6)).astype(np.float32)
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (2, 6))
        p = dcf.placeholder(dcf.bool, ())
        _, h = dcf.while_loop(lambda i, h: i < 5,
                              lambda i, h: (i + 1, dcf.nn.relu(dcf.matmul(h, wv) + bv)),
                              [dcf.constant(0), x])
        c = dcf.cond(p, lambda: dcf.nn.relu(dcf.matmul(h, wv) + bv),
                     lambda: dcf.matmul(h, wv) + bv)
        gr = dcf.gradients(dcf.reduce_sum(c), [x])[0]
        for pv in (True, False):
            _same(_run([h, c, gr], {x: x0, p: pv}), _run([h, c, gr], {x: x0, p: pv},
                                                         UNFUSED))
    assert groups


def test_errors_name_the_op_that_failed():
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (None, None))
        w = dcf.placeholder(dcf.float32, (None, None))
        b = dcf.placeholder(dcf.float32, None)
        y = dcf.nn.relu(dcf.add(dcf.matmul(x, w, name="the_matmul"), b, name="the_add"))
        with dcf.Session() as s:
            with pytest.raises(InvalidArgumentError, match="the_matmul"):
                s.run(y, {x: np.ones((2, 3), np.float32), w: np.ones((4, 2), np.float32),
                          b: np.ones(2, np.float32)})
            with pytest.raises(InvalidArgumentError, match="the_add"):
                s.run(y, {x: np.ones((2, 3), np.float32), w: np.ones((3, 2), np.float32),
                          b: np.ones(5, np.float32)})
            _same(s.run(y, {x: np.ones((2, 3), np.float32), w: np.ones((3, 2), np.float32),
                            b: np.ones(2, np.float32)}), np.full((2, 2), 4.0, np.float32))


def test_gradient_check_through_fused_layers():
    xv = RNG.standard_normal((5, 4))
    wv = RNG.standard_normal((4, 3))
    bv = RNG.standard_normal(3)
    check_grads(lambda x, w, b: dcf.reduce_sum(dcf.square(dcf.nn.relu(dcf.matmul(x, w) + b))),
                [xv, wv, bv])


def test_the_compiled_code_calls_one_function_per_layer(monkeypatch):
    srcs: list[str] = []
    orig = fc._Codegen.build_root

    def build_root(self):
        fn = orig(self)
        srcs.append("\n".join(self.lines))
        return fn

    monkeypatch.setattr(fc._Codegen, "build_root", build_root)
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (3, 4))
        y = _mlp(x, [4, 5, 5, 2], np.float32)
        _run(y, {x: np.ones((3, 4), np.float32)})
    body = srcs[-1]
    # 3 layers -> 3 fused calls; no inline '+' of a product and a bias remains
    assert body.count(" + ") == 0, body
