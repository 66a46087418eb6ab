"""Raw elementwise kernels on a real GPU (dcf/ops/gpu_elementwise.py): each single op
equals cupy's general kernel bit for bit, for every argument layout the launcher
takes (column blocks of wider matrices included), both float dtypes, and sizes past one
grid's worth of threads, with n as an argument or compiled in; a fused tree equals its
ElementwiseKernel. Skipped with the test stand-in (it has no RawKernel)."""

from __future__ import annotations

import numpy as np
import pytest

from dcf.ops.gpu_elementwise import SINGLE, RawElementwise
from dcf.ops.registry import OPS


@pytest.fixture
def cp():
    from dcf import gpu_devices

    cp = gpu_devices.backend()
    if not hasattr(cp, "RawKernel"):
        pytest.skip("the cupy stand-in has no RawKernel")
    cp.cuda.Device(0).use()
    return cp


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("op", sorted(SINGLE))
def test_single_op_equals_cupy_bit_for_bit(cp, op, dt):
    rng = np.random.default_rng(1)
    generic = OPS[op].kernel
    body = OPS[op].gpu_kernel
    two = "in1" in SINGLE[op]
    shapes = [(257, 300), (3,), ()]
    for shape in shapes:
        x = cp.asarray(rng.uniform(-3, 3, shape).astype(dt))
        y = cp.asarray(rng.uniform(0.5, 2, shape).astype(dt))
        cases = [(x, y)] if two else [(x,)]
        if two and shape:
            cases += [(x, y[-1]) if len(shape) > 1 else (x, y[:1]), (x, dt(1.75)),
                      (dt(0.5), y), (x, cp.asarray(dt(-0.25)))]
            if len(shape) > 1:
                cases.append((x[0], y))
        if len(shape) == 2:          # column blocks of wider matrices (SplitV's outputs)
            wide = cp.asarray(rng.uniform(0.5, 2, (shape[0], shape[1] + 11)).astype(dt))
            block = wide[:, 7:7 + shape[1]]
            cases += [(x, block), (block, y)] if two else [(block,)]
        for args in cases:
            got = body(cp, *args)
            want = generic(cp, *[a.copy() if type(a) is cp.ndarray else a for a in args])
            assert type(got) is cp.ndarray and got.dtype == want.dtype and \
                got.shape == want.shape, (op, shape)
            np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(want))


def test_past_one_grid_of_threads(cp):
    n = 256 * (1 << 16) + 1000          # more elements than blocks x threads
    x = cp.arange(n, dtype=cp.float32) * np.float32(1e-6)
    got = RawElementwise(cp, "in0 * in0 + in1", 2)((x, np.float32(1)))
    np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(x * x + np.float32(1)))


def test_a_fused_tree_equals_its_elementwise_kernel(cp):
    rng = np.random.default_rng(2)
    expr = "(in2 * ((T)1 - tanh((in0 + in1)) * tanh((in0 + in1))))"
    a, b, g = (cp.asarray(rng.standard_normal((64, 128)).astype(np.float32)) for _ in range(3))
    raw = RawElementwise(cp, expr, 3)((a, b, g))
    ek = cp.ElementwiseKernel("T in0, T in1, T in2", "T out", f"out = {expr}", "t_fused")(a, b, g)
    np.testing.assert_allclose(cp.asnumpy(raw), cp.asnumpy(ek), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("n", [2, 5, 8, 9, 200])
def test_add_n_equals_the_generic_body_bit_for_bit(cp, n):
    rng = np.random.default_rng(n)
    xs = [cp.asarray(rng.standard_normal((33, 65)).astype(np.float32)) for _ in range(n)]
    xs[-1] = cp.asarray(rng.standard_normal((33, 130)).astype(np.float32))[:, 65:]
    got = OPS["AddN"].gpu_kernel(cp, *xs)
    want = OPS["AddN"].kernel(cp, *[x.copy() for x in xs])
    np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(want))


@pytest.mark.parametrize("n", [5000, 256 * (1 << 16) + 1000])
def test_a_size_launched_often_gets_its_own_kernel_with_the_same_bits(cp, n):
    """After SIZED_AFTER launches of one size, an expression (new result, or written over
    an input) runs a kernel with n compiled in: the same bits as before and as cupy's,
    past one grid's worth of threads too; at most SIZED_MAX sizes get one."""
    from dcf.ops import gpu_elementwise as GE

    rng = np.random.default_rng(4)
    x = cp.asarray(rng.uniform(-3, 3, n).astype(np.float32))
    y = cp.asarray(rng.uniform(0.5, 2, n).astype(np.float32))
    want_add = cp.asnumpy(x + y)
    want_tanh = cp.asnumpy(cp.tanh(x))
    k = RawElementwise(cp, SINGLE["Add"], 2, "add")
    t = RawElementwise(cp, SINGLE["Tanh"], 1, "tanh")
    for i in range(GE.SIZED_AFTER + 3):
        np.testing.assert_array_equal(cp.asnumpy(k((x, y))), want_add)
        z = x.copy()
        assert t.into((z,), 0) is z
        np.testing.assert_array_equal(cp.asnumpy(z), want_tanh)
        # the first launch compiles (and is not counted); the SIZED_AFTER-th sends the
        # sized kernel to the helper thread (waited for here), the next launches it
        sized = i > GE.SIZED_AFTER
        assert ((("f", -1, n) in k._sized) == sized) and ((("f", 0, n) in t._sized) == sized)
        _compiled(k, t)
    for m in range(1, 2 * GE.SIZED_MAX + 2):            # many sizes, each launched often
        a = x[:m].copy()
        for _ in range(GE.SIZED_AFTER + 1):
            got = k((a, a))
            _compiled(k)
        np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(a) + cp.asnumpy(a))
    assert len(k._sized) == GE.SIZED_MAX


def _compiled(*kernels):
    """Wait for the sized kernels compiling on the helper thread."""
    for k in kernels:
        for _, done in list(k._pending.values()):
            done.result(60)
