"""An LSTM step's gates write their activations over the product z they read, one call
for the MatMul and the LSTMGates on a GPU (dcf/fusion/matmul_gates.py). GPUs here are the
cupy stand-in, which has no raw kernels, so the fused call runs the gates' own kernel on
the product: these tests check what the compiler fuses, what it leaves alone, the values
against the CPU and float64 numpy, and errors; tests/gpu checks the kernel on a real GPU."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from tests.lstm_gradients import layers_in_one_loop, lstm_gradients


@pytest.fixture
def fused(instances_of):
    """The FusedMatMulGates the compiler built in this test (each counts its calls)."""
    from dcf.fusion import matmul_gates

    return instances_of(matmul_gates.FusedMatMulGates)


def _calls(made):
    return sum(f.calls for f in made)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_stacked_lstm_gradients_with_the_gates_fused_equal_the_cpu(fake_gpus, fused, kind):
    made = fused
    xv = np.random.default_rng(0).standard_normal((5, 3, 2)).astype(np.float32)
    cpu = lstm_gradients("/cpu:0", xv, 4, layers=2, kind=kind, with_x=True)[0]
    assert not made
    gpu = lstm_gradients("/gpu:0", xv, 4, layers=2, kind=kind, with_x=True)[0]
    assert made and _calls(made) >= 2 * 5               # two layers, five steps
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_layers_on_two_gpus_fuse_on_each_gpu(fake_gpus, fused):
    made = fused
    xv = np.random.default_rng(1).standard_normal((4, 2, 3)).astype(np.float32)
    cpu = lstm_gradients("/cpu:0", xv, 4, layers=2, with_x=True)[0]
    gpu = lstm_gradients(["/gpu:0", "/gpu:1"], xv, 4, with_x=True)[0]
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert {f.gpu for f in made} == {dcf.actors.gpu.GpuDevice.get(0),
                                     dcf.actors.gpu.GpuDevice.get(1)} and _calls(made) >= 8


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _gates_loop(a, w, c0, b, read_z=False, bad_from=None, n=3):
    """c_t, h_t = LSTMGates(z_t, c_{t-1}, b) with z_t = (a * (t + 1)) @ w each iteration;
    `read_z`: the product is also summed by another op (not fused); `bad_from`: from
    that iteration on (against the fed k) a loses a column, so the product fails."""
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        k = dcf.placeholder(dcf.int32, [])
        A, W, B = dcf.constant(a), dcf.constant(w), dcf.constant(b)

        def body(i, c, h, seen):
            aa = A if bad_from is None else A[:, : dcf.where(i < k, a.shape[1], a.shape[1] - 1)]
            z = dcf.matmul(aa * dcf.cast(i + 1, dcf.float32), W, name="product")
            c2, h2 = dcf.nn.lstm_gates(z, c, 0.5, b=B, name="gates")
            if read_z:
                seen = seen + dcf.reduce_sum(z)
            return i + 1, c2, h2, seen

        out = dcf.while_loop(lambda i, *_: i < n, body,
                             (0, dcf.constant(c0), dcf.zeros(list(c0.shape)),
                              dcf.constant(0.0)), name="gloop")
    return g, k, out[1:]


def _reference(a, w, c0, b, n=3):
    a, w, c, b = (v.astype(np.float64) for v in (a, w, c0, b))
    u = c.shape[1]
    seen = 0.0
    for t in range(n):
        z = (a * (t + 1)) @ w
        seen += z.sum()
        z = z + b
        i, j, f, o = (z[:, q * u:(q + 1) * u] for q in range(4))
        c = c * _sig(f + 0.5) + _sig(i) * np.tanh(j)
        h = np.tanh(c) * _sig(o)
    return c, h, seen


def _values(batch=2, d=3, u=4, seed=2):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, d)).astype(np.float32),
            rng.standard_normal((d, 4 * u)).astype(np.float32),
            rng.standard_normal((batch, u)).astype(np.float32),
            rng.standard_normal(4 * u).astype(np.float32))


@pytest.mark.parametrize("read_z", [False, True])
def test_a_loops_gates_equal_float64_numpy(fake_gpus, fused, read_z):
    made = fused
    vals = _values()
    g, k, (c, h, seen) = _gates_loop(*vals, read_z=read_z)
    with dcf.Session(graph=g) as sess:
        got_c, got_h, got_seen = sess.run([c, h, seen], {k: 5})
    want_c, want_h, want_seen = _reference(*vals)
    np.testing.assert_allclose(got_c, want_c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_h, want_h, rtol=1e-5, atol=1e-6)
    if read_z:       # the product is read by the reduce_sum too: the ops run one by one
        assert not made
        np.testing.assert_allclose(got_seen, want_seen, rtol=1e-5)
    else:
        assert made and _calls(made) == 3


def test_a_failing_product_names_the_matmul_frame_and_iteration(fake_gpus, fused):
    made = fused
    g, k, (c, _, _) = _gates_loop(*_values(), bad_from=1)
    with dcf.Session(graph=g) as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError) as e:
            sess.run(c, {k: 1})
    msg = str(e.value)
    assert made
    assert "product" in msg and "MatMul" in msg and "iteration 1" in msg and "gloop" in msg


# ----------------------------------------------- h written into the next concatenation
@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_the_gates_plan_h_into_the_next_steps_concatenation(fake_gpus, fused, kind):
    """Each layer's h is next read as the last part of a concatenation [x, h] (the next
    step's, through the loop's NextIteration, Merge, Switch and Identity when dynamic):
    the fused call knows how wide x is there (the input's 2 columns, the lower layer's 4
    units); the last static step's h has no such reader."""
    xv = np.random.default_rng(2).standard_normal((3, 2, 2)).astype(np.float32)
    lstm_gradients("/gpu:0", xv, 4, layers=2, kind=kind, with_x=True)
    leads = sorted({(f.gates.name, f.h_lead) for f in fused})
    assert {lead for _, lead in leads} <= {0, 2, 4} and {2, 4} <= {lead for _, lead in leads}
    if kind == "static":            # 3 steps x 2 layers; the last step's h goes nowhere
        assert sorted(lead for _, lead in leads) == [0, 0, 2, 2, 4, 4]
    # static: the lower layer's h is the upper's x in the same step (its gates fill that
    # offer); dynamic: each layer is a loop of its own, so no h is another layer's x there
    lower = [f for f in fused if f.gates.name.startswith("rnn0/")]
    upper = [f for f in fused if f.gates.name.startswith("rnn1/")]
    assert lower and upper and all(f.x_concat == -1 for f in upper)
    if kind == "static":
        assert all(f.x_concat >= 0 for f in lower)
        # steps 1 and 2 of the upper layer take offers (step 0's h is the zero state)
        assert len({f.x_concat for f in lower} & {f.h_concat for f in upper}) == 2
    else:
        assert all(f.x_concat == -1 for f in lower)


def test_a_stack_of_layers_in_one_loop_fills_the_upper_layers_offer(fake_gpus, fused):
    xv = np.random.default_rng(4).standard_normal((4, 3, 2)).astype(np.float32)
    cpu = layers_in_one_loop(["/cpu:0", "/cpu:0"], xv, 4)
    assert not fused
    gpu = layers_in_one_loop(["/gpu:0", "/gpu:0"], xv, 4)
    lower = [f for f in fused if "layer0" in f.gates.name or f.h_lead == 2]
    upper = [f for f in fused if f not in lower]
    assert lower and upper
    assert all(f.x_concat >= 0 and f.x_concat in {u.h_concat for u in upper} for f in lower)
    assert all(f.x_concat == -1 and f.h_lead == 4 for f in upper)
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_no_filling_across_gpus(fake_gpus, fused):
    xv = np.random.default_rng(3).standard_normal((3, 2, 2)).astype(np.float32)
    lstm_gradients(["/gpu:0", "/gpu:1"], xv, 4, with_x=True)
    assert fused and all(f.x_concat == -1 for f in fused)
    assert {f.h_lead for f in fused} == {2, 4}


def _offered(cp, rows, lead, u, seed):
    """A [rows, lead + u] buffer whose last u columns hold h, and h as their view."""
    from dcf.ops import concat_slots

    rng = np.random.default_rng(seed)
    buf = cp.asarray(np.full((rows, lead + u), np.nan, np.float32))
    h = buf[:, lead:]
    h[...] = cp.asarray(rng.standard_normal((rows, u)).astype(np.float32))
    concat_slots.offer(0, h, buf, lead)
    return buf, h


def _concat(cp):
    from dcf.ops import array_ops  # noqa: F401  (registers ConcatV2)
    from dcf.ops.registry import OPS

    return lambda *xs: OPS["ConcatV2"].gpu_kernel(cp, *xs, axis=1)


def test_a_concatenation_takes_the_buffer_offered_for_its_last_part(fake_gpus):
    from dcf.ops import concat_slots

    cp = fake_gpus
    concat = _concat(cp)
    buf, h = _offered(cp, 3, 2, 4, seed=0)
    x = cp.asarray(np.arange(6, dtype=np.float32).reshape(3, 2))
    want = np.concatenate([cp.asnumpy(x), cp.asnumpy(h)], axis=1)
    claims = concat_slots.claims[0]
    out = concat(x, h)
    assert out is buf and concat_slots.claims[0] == claims + 1
    np.testing.assert_array_equal(cp.asnumpy(out), want)
    assert concat_slots.pending(0) == 0
    again = concat(x * 2, h)             # claimed once: a second reader gets its own array
    assert again is not buf
    np.testing.assert_array_equal(cp.asnumpy(again)[:, :2], 2 * cp.asnumpy(x))
    np.testing.assert_array_equal(cp.asnumpy(again)[:, 2:], cp.asnumpy(h))
    np.testing.assert_array_equal(cp.asnumpy(out), want)            # unchanged


@pytest.mark.parametrize("case", ["wider x", "h first", "x rows", "x dtype", "three"])
def test_a_concatenation_that_does_not_fit_the_offer_copies_as_usual(fake_gpus, case):
    cp = fake_gpus
    concat = _concat(cp)
    buf, h = _offered(cp, 3, 2, 4, seed=1)
    x = cp.asarray(np.ones((3, 2), np.float32))
    xs = {"wider x": (cp.asarray(np.ones((3, 3), np.float32)), h),
          "h first": (h, x),
          "x rows": None,
          "x dtype": (cp.asarray(np.ones((3, 2), np.float64)), h),
          "three": (x[:, :1], x[:, 1:], h)}[case]
    if xs is None:                        # rows differ: the concatenation itself fails
        with pytest.raises(Exception):
            concat(cp.asarray(np.ones((2, 2), np.float32)), h)
        return
    want = np.concatenate([cp.asnumpy(a) for a in xs], axis=1)
    out = concat(*xs)
    np.testing.assert_array_equal(cp.asnumpy(out), want)
    if case == "three":                   # two parts of 1 column in front of h: it fits
        assert out is buf
    else:
        assert out is not buf
    assert not np.isnan(cp.asnumpy(out)).any()
    from dcf.ops import concat_slots
    concat_slots.clear(0)                 # (an offer nothing took stays open until then)


def test_a_part_the_layer_below_wrote_in_place_is_not_copied(fake_gpus):
    """An offer filled with the very value the concatenation reads first: nothing is
    copied (the buffer's first columns are left as the filler wrote them); filled with
    another value: x is copied over them."""
    from dcf.ops import concat_slots

    cp = fake_gpus
    concat = _concat(cp)
    x = cp.asarray(np.full((3, 2), 7.0, np.float32))
    for same in (True, False):
        buf, h = _offered(cp, 3, 2, 4, seed=5)
        buf[:, :2] = cp.asarray(np.full((3, 2), -1.0, np.float32))    # the filler's write
        o = concat_slots._by_concat.get(-1) or concat_slots._offers[id(h)]
        o.filled = x if same else cp.asarray(np.ones((3, 2), np.float32))
        out = concat(x, h)
        assert out is buf
        np.testing.assert_array_equal(cp.asnumpy(out)[:, :2], -1.0 if same else 7.0)
        np.testing.assert_array_equal(cp.asnumpy(out)[:, 2:], cp.asnumpy(h))


def test_offers_are_found_by_their_concatenation_until_claimed(fake_gpus):
    from dcf.ops import concat_slots

    cp = fake_gpus
    concat_slots.clear(0)
    buf = cp.asarray(np.zeros((2, 5), np.float32))
    h = buf[:, 2:]
    key = concat_slots.offer(0, h, buf, 2, concat=41)
    assert concat_slots.open_offer(41).buf is buf and concat_slots.open_offer(42) is None
    concat_slots.withdraw(key)
    assert concat_slots.open_offer(41) is None
    concat_slots.offer(0, h, buf, 2, concat=41)
    assert concat_slots.claim(h).buf is buf
    assert concat_slots.open_offer(41) is None and concat_slots.claim(h) is None
    concat_slots.offer(0, h, buf, 2, concat=41)
    concat_slots.clear(0)
    assert concat_slots.open_offer(41) is None and concat_slots.pending(0) == 0


def test_open_offers_end_with_the_step(fake_gpus):
    from dcf.actors.gpu import GpuDevice
    from dcf.ops import concat_slots

    cp = fake_gpus
    concat_slots.clear(0)
    _offered(cp, 2, 1, 3, seed=2)
    buf, h = _offered(cp, 2, 1, 3, seed=3)
    assert concat_slots.pending(0) == 2
    GpuDevice.get(0).drop_landing()       # what a step's end (and an allocation retry) runs
    assert concat_slots.pending(0) == 0
    assert _concat(cp)(cp.asarray(np.ones((2, 1), np.float32)), h) is not buf
    key = concat_slots.offer(0, h, buf, 1)
    concat_slots.withdraw(key)            # the producer's next step: the offer ends
    assert concat_slots.pending(0) == 0
    assert _concat(cp)(cp.asarray(np.ones((2, 1), np.float32)), h) is not buf


@pytest.mark.parametrize("reader", ["ta", "matmul", "square", "fetch"])
def test_h_stays_an_array_of_its_own_where_a_reader_would_not_take_a_view(fake_gpus, fused,
                                                                         reader):
    """An LSTM loop whose h each step also goes to a TensorArray (takes the view), to an
    output projection (a MatMul), to an elementwise op, or out of the loop only: the
    gates write h into the next concatenation's buffer unless a reader on the GPU other
    than a concatenation, TensorArray write or stack reads it each step."""
    from dcf import nn

    xv = np.random.default_rng(5).standard_normal((3, 2, 2)).astype(np.float32)
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        x = dcf.constant(xv)
        ta_in = dcf.TensorArray(dcf.float32, size=3, element_shape=(2, 2)).unstack(x)
        ta_out = dcf.TensorArray(dcf.float32, size=3, element_shape=(2, 4))
        cell = nn.LSTMCell(4, name="cell")
        w_out = dcf.constant(np.ones((4, 4), np.float32))

        def body(t, c, h, ta):
            h2, st = cell(ta_in.read(t), nn.LSTMStateTuple(c, h))
            y = {"ta": h2, "matmul": dcf.matmul(h2, w_out), "square": dcf.square(h2),
                 "fetch": h2}[reader]
            return t + 1, st.c, st.h, ta.write(t, y)
        _, c_t, h_t, ta_t = dcf.while_loop(lambda t, *_: t < 3, body,
                                           (0, dcf.zeros([2, 4]), dcf.zeros([2, 4]), ta_out))
        out = ta_t.stack() if reader != "fetch" else h_t
        loss = dcf.reduce_sum(dcf.square(out))
        init = dcf.global_variables_initializer()
    with dcf.Session(g) as s:
        s.run(init)
        got = s.run(loss)
    assert np.isfinite(got) and fused
    leads = {f.h_lead for f in fused}
    assert leads == ({2} if reader in ("ta", "fetch") else {0})


def _memcpy2d(dst, dpitch, src, spitch, width, height, kind, stream):
    """cudaMemcpy2DAsync's effect on host memory (the stand-in's arrays live there)."""
    import ctypes

    assert kind == 3 and width <= min(dpitch, spitch)
    for r in range(height):
        ctypes.memmove(dst + r * dpitch, src + r * spitch, width)


def test_the_strided_copies_the_gpu_concatenation_issues(fake_gpus):
    """The GPU concatenation's copy plan (`_pitches`, `_copy_parts`) and its taking of
    an offered buffer with real strided copies (`_into_slot`), run over the stand-in's
    host memory with cudaMemcpy2DAsync emulated row by row: contiguous parts and column
    blocks land where np.concatenate puts them; a part neither (a transpose) is refused."""
    from types import SimpleNamespace

    from dcf.ops import concat_slots, gpu_kernels as K

    cp = fake_gpus
    rng = np.random.default_rng(8)
    wide = cp.asarray(rng.standard_normal((5, 9)).astype(np.float32))
    x = cp.asarray(rng.standard_normal((5, 2)).astype(np.float32))
    parts = (x, wide[:, 3:6], wide[:, :1])              # contiguous, two column blocks
    pitches, total = K._pitches(type(x), parts, 1, (5,), (), np.dtype(np.float32))
    assert pitches == [0, 36, 36] and total == 6
    out = cp.asarray(np.zeros((5, 6), np.float32))
    K._copy_parts(_memcpy2d, 0, out.data.ptr, 24, parts, pitches, 1, 4, 5)
    np.testing.assert_array_equal(cp.asnumpy(out),
                                  np.concatenate([cp.asnumpy(p) for p in parts], axis=1))
    assert K._pitches(type(x), (x, cp.asarray(np.ones((2, 5), np.float32)).T), 1, (5,), (),
                      np.dtype(np.float32)) is None                     # a transpose

    backend = (type(x), _memcpy2d, lambda: SimpleNamespace(ptr=0))
    buf, h = _offered(cp, 5, 3, 4, seed=6)
    o = concat_slots.claim(h)
    got = K._into_slot(cp, backend, (wide[:, 2:5], h), 1, o)
    assert got is buf
    np.testing.assert_array_equal(cp.asnumpy(got)[:, :3], cp.asnumpy(wide)[:, 2:5])
    np.testing.assert_array_equal(cp.asnumpy(got)[:, 3:], cp.asnumpy(h))
    buf, h = _offered(cp, 5, 2, 4, seed=7)
    o = concat_slots.claim(h)
    assert K._into_slot(cp, backend, (cp.asarray(np.ones((2, 5), np.float32)).T, h), 1,
                        o) is None                                      # left to its view
