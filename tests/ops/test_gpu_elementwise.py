"""The raw elementwise launcher's host side (dcf/ops/gpu_elementwise.py) against a
stand-in cupy whose RawKernel runs the generated kernel's loop with numpy: which
argument layouts it takes, how it packs parameters, the output's shape and dtype, and
what it leaves to the general kernel. (The CUDA side runs on the device:
tests/gpu/test_gpu_raw_elementwise.py.)"""

from __future__ import annotations

import contextlib
import re
import threading
import types

import numpy as np
import pytest

from dcf.ops.gpu_elementwise import SINGLE, RawElementwise, raw_gpu


class _Dev(np.ndarray):
    """A 'device array' of the stand-in: a numpy array of its own type."""


def _dev(a):
    return np.ascontiguousarray(a).view(_Dev)


class _RawKernel:
    compiled: list = []
    launched: list = []

    def __init__(self, code, name, options=()):
        assert "--fmad=false" in options
        self.code, self.name = code, name
        params = re.search(r"\((.*)\) \{", code).group(1).split(", ")
        self.params = [p.split()[-1] for p in params]
        self.expr = re.search(r"out\[i\] = (.*);", code).group(1)
        self.loads = dict(re.findall(r"const T (in\d+) = ([^;]+);", code))
        self.ctype = re.search(r"typedef (\w+) T;", code).group(1)
        _RawKernel.compiled.append(name)

    def __call__(self, grid, block, args):
        assert len(args) == len(self.params)
        _RawKernel.launched.append(self.name)
        env = dict(zip(self.params, args))
        sized = re.search(r"const long long n = \(long long\)(\d+);", self.code)
        out, n = env["out"], int(sized.group(1) if sized else env["n"])
        assert isinstance(out, _Dev) and out.size == n and grid[0] * block[0] >= min(n, 256)
        T = np.float32 if self.ctype == "float" else np.float64
        i = np.arange(n)
        vals = {}
        for j in range(len([p for p in self.params if re.fullmatch(r"(p|in)\d+", p)])):
            src = self.loads.get(f"in{j}")
            if src is None:
                vals[f"in{j}"] = T(env[f"in{j}"])
            elif "/ c" in src:                      # p[(i / c) * l + i % c]
                a = np.asarray(env[f"p{j}"])
                c, ld = int(env[f"c{j}"]), int(env[f"l{j}"])
                flat = np.lib.stride_tricks.as_strided(     # the memory from p on
                    a, shape=((a.shape[0] - 1) * ld + c,), strides=(a.itemsize,))
                vals[f"in{j}"] = flat[(i // c) * ld + i % c]
            else:
                p = np.asarray(env[f"p{j}"]).reshape(-1)
                idx = {"[i]": i, "[0]": 0}.get(src[len(f"p{j}"):])
                if idx is None:                     # p[i % m]
                    idx = i % int(env[f"m{j}"])
                vals[f"in{j}"] = p[idx]
        py = self.expr.replace("(T)1", "T(1)").replace("tanh(", "np.tanh(") \
            .replace("exp(", "np.exp(")
        out.reshape(-1)[:] = eval(py, {"np": np, "T": T}, vals)


def _block(a, left=1):
    """`a` as the columns left..left+n of a wider device matrix: a strided view."""
    wide = np.full((a.shape[0], a.shape[1] + left + 2), np.nan, a.dtype)
    wide[:, left:left + a.shape[1]] = a
    v = _dev(wide)[:, left:left + a.shape[1]]
    assert not v.flags.c_contiguous
    return v


def _stand_in():
    return types.SimpleNamespace(ndarray=_Dev, RawKernel=_RawKernel,
                                 empty=lambda shape, dt: np.empty(shape, dt).view(_Dev))


def _generic(xp, *args, **kw):
    raise AssertionError("the raw kernel should have taken these arguments")


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("op", sorted(SINGLE))
def test_single_ops_match_numpy_for_each_layout(op, dt):
    rng = np.random.default_rng(0)
    cp = _stand_in()
    body = raw_gpu(op, _generic)
    x = rng.uniform(-2, 2, (3, 5)).astype(dt)
    y = rng.uniform(0.5, 2, (3, 5)).astype(dt)
    two_inputs = "in1" in SINGLE[op]
    ref = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "RealDiv": np.divide,
           "Neg": np.negative, "Square": np.square, "Exp": np.exp, "Tanh": np.tanh,
           "Sigmoid": lambda v: 1 / (1 + np.exp(-v)),
           "TanhGrad": lambda v, g: g * (1 - v * v),
           "SigmoidGrad": lambda v, g: g * v * (1 - v)}[op]
    cases = [((x, y), (x, y))] if two_inputs else [((x,), (x,))]
    if two_inputs and op != "SigmoidGrad":   # (that one: same shapes only, below)
        cases += [((x, y[0]), (x, y[0])),                 # a bias row
                  ((x[0], y), (x[0], y)),                 # ... as the first argument
                  ((x, y[:1, :1]), (x, y[:1, :1])),       # one element on the device
                  ((x, dt(1.5)), (x, np.asarray(dt(1.5)))),   # a host scalar
                  ((dt(0.25), y), (np.asarray(dt(0.25)), y)),
                  ((x, _block(y)), (x, y)),               # a SplitV output's columns
                  ((_block(x, 2), _block(y, 0)), (x, y))]
    if not two_inputs:
        cases.append(((_block(x, 4),), (x,)))
    for args, ref_args in cases:
        dev_args = tuple(a if isinstance(a, _Dev) else _dev(a) if isinstance(a, np.ndarray)
                         else a for a in args)
        got = body(cp, *dev_args)
        want = ref(*[np.asarray(a, np.float64) for a in ref_args])
        assert isinstance(got, _Dev) and got.dtype == dt and got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5 if dt == np.float32 else 1e-12)


def test_what_it_leaves_to_the_general_kernel():
    cp = _stand_in()
    k = RawElementwise(cp, "in0 + in1", 2)
    x = _dev(np.ones((4, 3), np.float32))
    assert k((x, _dev(np.ones((4, 3), np.float64)))) is None          # mixed dtypes
    assert k((x, np.float64(1.0))) is None                            # a scalar of another dtype
    assert k((x, 1.0)) is None                                        # a Python float
    assert k((_dev(np.ones((4, 3), np.int32)),) * 2) is None          # integers
    assert k((x, _dev(np.ones((4, 1), np.float32)))) is None          # a column broadcast
    assert k((x, np.asfortranarray(np.ones((4, 3), np.float32)).view(_Dev))) is None
    assert k((x, _dev(np.ones((4, 6), np.float32))[:, ::2])) is None  # strided columns
    assert k((x, _dev(np.ones((8, 3), np.float32))[::-2])) is None    # rows backwards
    assert k((x, _dev(np.ones((3, 4), np.float32)).T)) is None        # a transpose
    assert k((x, _dev(np.ones((4, 3, 2), np.float32))[:, :, 0])) is None
    rows = _dev(np.arange(24, dtype=np.float32).reshape(8, 3))[::2]   # every other row:
    np.testing.assert_array_equal(np.asarray(k((x, rows))), 1 + np.asarray(rows))  # taken
    assert k((x, _dev(np.ones((1, 1, 1), np.float32)))) is None       # broadcast adds dims
    assert k((_dev(np.ones((0, 3), np.float32)),) * 2) is None        # empty
    assert k((np.float32(1), np.float32(2))) is None                  # nothing on the device
    assert k((x,)) is None                                            # wrong arity
    nocp = types.SimpleNamespace(ndarray=_Dev, empty=cp.empty)        # no RawKernel
    assert RawElementwise(nocp, "in0 + in1", 2)((x, x)) is None


def test_one_kernel_per_dtype_and_layout():
    cp = _stand_in()
    _RawKernel.compiled = []
    k = RawElementwise(cp, "in0 * in1", 2)
    x32, x64 = _dev(np.ones((2, 3), np.float32)), _dev(np.ones((2, 3)))
    a, b = np.random.default_rng(3).standard_normal((2, 2, 3)).astype(np.float32)
    for _ in range(3):      # the first call compiles; the next take the same-shape path
        np.testing.assert_array_equal(np.asarray(k((_dev(a), _dev(b)))), a * b)
        k((x32, x32))
        k((x64, x64))
        k((x32, _dev(np.ones(3, np.float32))))
        k((x32, np.float32(2)))
    assert len(_RawKernel.compiled) == 4
    assert {n.rsplit("_", 2)[1:] == [lay, c] for n, lay, c in
            zip(_RawKernel.compiled, ["aa", "aa", "ar", "as"], "fdff")} == {True}


def _compiling_stand_in(compile_):
    """The stand-in with kernels that compile ahead (`compile_(kernel)`, as cupy's
    RawKernel.compile) and a current GPU (3) that a thread sets with cuda.Device."""
    current = threading.local()

    @contextlib.contextmanager
    def device(d):
        before = getattr(current, "d", 0)
        current.d = d
        yield
        current.d = before

    class Compiling(_RawKernel):
        def compile(self):
            compile_(self, getattr(current, "d", 0))

    cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 3),
                                 Device=device)
    return types.SimpleNamespace(ndarray=_Dev, RawKernel=Compiling, cuda=cuda,
                                 empty=lambda shape, dt: np.empty(shape, dt).view(_Dev))


def test_a_size_launched_often_gets_its_own_kernel_compiled_off_the_loop():
    """After SIZED_AFTER launches of one size its own kernel is compiled on a helper
    thread, for the launching GPU; until that is done the launches go on through the
    general kernel (they don't wait), then use the sized one. Same values throughout."""
    from dcf.ops import gpu_elementwise as GE

    started, release, compiles = threading.Event(), threading.Event(), []

    def compile_(kernel, device):
        compiles.append((kernel.name, threading.current_thread().name, device))
        started.set()
        assert release.wait(30)

    k = RawElementwise(_compiling_stand_in(compile_), "in0 + in1", 2, "add")
    x, y = (_dev(np.random.default_rng(5).standard_normal((6, 7)).astype(np.float32))
            for _ in range(2))
    _RawKernel.launched = []
    for _ in range(GE.SIZED_AFTER + 1 + 4):   # (the first launch, general, is not counted)
        np.testing.assert_array_equal(np.asarray(k((x, y))), x + y)
    key = ("f", -1, x.size)
    assert started.wait(30)     # (the helper may first finish compiles queued before)
    assert key in k._pending and key not in k._sized and len(compiles) == 1
    sized_name, thread, device = compiles[0]
    assert thread.startswith("dcf-nvrtc") and device == 3
    assert sized_name not in _RawKernel.launched and len(set(_RawKernel.launched)) == 1
    release.set()
    k._pending[key][1].result(30)
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(k((x, y))), x + y)
    assert key in k._sized and not k._pending
    assert _RawKernel.launched[-2:] == [sized_name] * 2


def test_a_failed_ahead_compile_surfaces_at_the_next_launch():
    from dcf.ops import gpu_elementwise as GE

    release = threading.Event()

    def compile_(kernel, device):
        assert release.wait(30)
        raise RuntimeError("NVRTC rejected the source")

    k = RawElementwise(_compiling_stand_in(compile_), "in0 * in1", 2, "mul")
    x = _dev(np.ones((3, 3), np.float32))
    for _ in range(GE.SIZED_AFTER + 1):
        k((x, x))
    release.set()
    assert isinstance(k._pending[("f", -1, 9)][1].exception(30), RuntimeError)
    with pytest.raises(RuntimeError, match="NVRTC rejected"):
        k((x, x))


def test_sigmoid_grad_takes_the_raw_kernel_only_for_same_shaped_arrays():
    cp = _stand_in()
    calls = []

    def generic(xp, y, dy):
        calls.append(1)
        return dy * y * (1 - y)

    body = raw_gpu("SigmoidGrad", generic)
    y = _dev(np.full((2, 3), 0.25, np.float32))
    body(cp, y, y)
    assert calls == []
    body(cp, y, _dev(np.ones(3, np.float32)))
    body(cp, np.asarray(np.float32(0.5)).view(_Dev), np.asarray(np.float32(1)).view(_Dev))
    assert calls == [1, 1]


@pytest.mark.parametrize("n", [2, 3, 8, 9, 15, 16, 20])
def test_add_n_sums_in_the_generic_order_in_chunks(n):
    from dcf.ops.gpu_elementwise import add_n_gpu
    from dcf.ops.math_ops import _add_n

    cp = _stand_in()
    rng = np.random.default_rng(n)
    xs = [rng.standard_normal((3, 4)).astype(np.float32) * 10.0 ** rng.integers(-3, 4)
          for _ in range(n)]
    _RawKernel.compiled = []
    got = add_n_gpu(_generic)(cp, *[_dev(x) for x in xs])
    want = _add_n(np, *[x.copy() for x in xs])
    np.testing.assert_array_equal(np.asarray(got), want)     # same additions, same order
    last = (n - 9) % 7 + 2 if n > 8 else n       # inputs of the last kernel
    assert len(_RawKernel.compiled) == len({min(8, n), last})


def test_add_n_of_a_split_output_and_an_array_is_one_raw_kernel():
    """An LSTM's hidden-state gradient: the recurrent part is a column block of the
    concatenation's gradient (SplitV's view), the other a plain array."""
    from dcf.ops.gpu_elementwise import add_n_gpu
    from dcf.ops.math_ops import _add_n

    cp = _stand_in()
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((2, 4, 6)).astype(np.float32)
    _RawKernel.compiled = []
    got = add_n_gpu(_generic)(cp, _dev(a), _block(b, 3))
    np.testing.assert_array_equal(np.asarray(got), _add_n(np, a.copy(), b))
    assert [n.rsplit("_", 2)[1] for n in _RawKernel.compiled] == ["aw"]


def test_add_n_leaves_other_arguments_to_the_generic_body():
    from dcf.ops.gpu_elementwise import add_n_gpu

    calls = []
    body = add_n_gpu(lambda xp, *xs: calls.append(len(xs)) or "generic")
    cp = _stand_in()
    x = _dev(np.ones((2, 2), np.float32))
    assert body(cp, x) == "generic"                                     # one input
    assert body(cp, x, _dev(np.ones((2, 2), np.int32))) == "generic"   # integers
    assert body(cp, x, np.float32(1)) == "generic"                      # a host scalar
    assert calls == [1, 2, 2]
