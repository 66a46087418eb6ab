"""Elementwise GPU ops that write their result over an input nothing else reads
(dcf/fusion/in_place.py): the results are the bits of the same graph with the rule off,
the rule picks only products read once, and on a GPU with raw kernels it does write in
place (the test stand-in has none: there the ops run as before and only the values and
the planning are checked)."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf import gpu_devices
from dcf.fusion import in_place as IP


@pytest.fixture
def made(monkeypatch):
    """The InPlaceElementwise callables the compiled frames make, by op name."""
    got: dict = {}
    init = IP.InPlaceElementwise.__init__

    def record(self, gpu, node, j):
        init(self, gpu, node, j)
        got[node.name] = self
    monkeypatch.setattr(IP.InPlaceElementwise, "__init__", record)
    return got


def _run(build, feed_fn, off: bool, monkeypatch):
    with monkeypatch.context() as m:
        if off:
            m.setattr(IP, "in_place_groups", lambda *a, **k: {})
        g = dcf.Graph()
        with g.as_default():
            fetches, feeds = build()
            init = dcf.global_variables_initializer()
        with dcf.Session(g) as s:
            s.run(init)
            s.run(fetches, feed_fn(feeds))
            return s.run(fetches, feed_fn(feeds))


def _chain():
    rng = np.random.default_rng(0)
    w = [dcf.constant((rng.standard_normal((64, 64)) / 8).astype(np.float32)) for _ in range(2)]
    b = dcf.constant(rng.standard_normal(64).astype(np.float32))
    x0 = dcf.placeholder(dcf.float32, (32, 64))
    with dcf.device("/gpu:0"):
        # each op below that may write in place is read by a MatMul or a Relu, which no
        # elementwise fusion absorbs (on a GPU such a tree is one kernel: nothing in place)
        def body(i, x):
            h = dcf.tanh(dcf.matmul(x, w[0], name="mm0"), name="act0")    # over the product
            y = dcf.add(dcf.matmul(h, w[1], name="mm1"), b, name="bias")  # ... a bias row
            r = dcf.nn.relu(y)
            p = dcf.matmul(r, w[0], name="mm2")
            z = dcf.multiply(p, 0.5, name="half")          # p read twice: neither in place
            v = dcf.add(p, 1.0, name="plus")
            return i + 1, dcf.matmul(z, w[1]) + v
        _, out = dcf.while_loop(lambda i, x: i < 5, body, (0, x0))
        loss = dcf.reduce_sum(out * out)
        grads = dcf.gradients(loss, [x0])
    return [out, loss] + grads, x0


def test_results_equal_the_graph_without_the_rule(made, monkeypatch):
    xv = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    feed = lambda x0: {x0: xv}                                     # noqa: E731
    off = _run(_chain, feed, True, monkeypatch)
    on = _run(_chain, feed, False, monkeypatch)
    for a, b in zip(on, off):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    want = {"while/act0", "while/bias"}                 # each input read by that op alone
    assert want <= set(made)
    assert not {"while/half", "while/plus"} & set(made)  # p is read twice
    if not gpu_devices.is_fake():                       # raw kernels: it did write in place
        assert all(made[k].in_place > 0 for k in want), {k: made[k].in_place for k in want}


def test_a_fetched_product_is_not_overwritten(made):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((16, 16)).astype(np.float32)
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        p = dcf.matmul(dcf.constant(a), dcf.constant(a), name="prod")
        t = dcf.tanh(p, name="t")
    with dcf.Session(g) as s:
        got_p, got_t = s.run([p, t])
    np.testing.assert_allclose(got_p, a @ a, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_t, np.tanh(a @ a), rtol=1e-4, atol=1e-5)
    assert not made


def test_a_sum_over_a_value_copied_from_another_gpu(made, monkeypatch, gpu_count):
    """The chain's second layer: s + prev, prev copied from the GPU before (a transfer
    only the add reads), writes over the copy; the same bits as without the rule."""
    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    rng = np.random.default_rng(3)
    w0, w1 = [(rng.standard_normal((64, 64)) / 8).astype(np.float32) for _ in range(2)]
    s0 = rng.standard_normal((32, 64)).astype(np.float32)

    def build():
        with dcf.device("/gpu:0"):
            a0 = dcf.constant(s0)
        with dcf.device("/gpu:1"):
            b0 = dcf.constant(s0)

        def body(i, a, b):
            with dcf.device("/gpu:0"):
                a2 = dcf.tanh(dcf.matmul(a, w0), name="act_a")
            with dcf.device("/gpu:1"):
                x = dcf.add(b, a2, name="sum")              # a2 comes from /gpu:0
                b2 = dcf.tanh(dcf.matmul(x, w1), name="act_b")
            return i + 1, a2, b2
        _, a, b = dcf.while_loop(lambda i, a, b: i < 6, body, (0, a0, b0),
                                 parallel_iterations=4)
        return [a, b], None

    off = _run(build, lambda _: None, True, monkeypatch)
    on = _run(build, lambda _: None, False, monkeypatch)
    for x, y in zip(on, off):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    a, b = s0.astype(np.float64), s0.astype(np.float64)
    for _ in range(6):
        a = np.tanh(a @ w0)
        b = np.tanh((b + a) @ w1)
    np.testing.assert_allclose(on[1], b, rtol=1e-4, atol=1e-5)
    assert {"while/act_a", "while/sum", "while/act_b"} <= set(made)
    if not gpu_devices.is_fake():
        assert made["while/sum"].in_place > 0, made["while/sum"].in_place
