"""The sum that makes an LSTM layer's output gradient (an AddN of the recurrent part and
the part from above) runs inside the layer's LSTMGatesGrad call on a GPU
(dcf/fusion/gates_grad.py). GPUs here are the cupy stand-in, which has no raw kernels,
so the fused call takes its op-by-op path: these tests check what the compiler fuses,
what it leaves alone, the values against the CPU and float64 numpy, and errors;
tests/gpu checks the one kernel on a real GPU."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.ops.registry import apply
from tests.lstm_gradients import lstm_gradients


@pytest.fixture
def fused_gates(instances_of, monkeypatch):
    """The FusedGatesGrads the compiler built in this test, and the calls they took."""
    from dcf.fusion import gates_grad as gates_grad_fusion

    cls = gates_grad_fusion.FusedGatesGrad
    made = instances_of(cls)
    calls = [0]
    call = cls.__call__

    def spy_call(self, *a, **kw):
        calls[0] += 1
        return call(self, *a, **kw)

    monkeypatch.setattr(cls, "__call__", spy_call)
    return made, calls


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_stacked_lstm_gradients_with_the_sum_fused_equal_the_cpu(fake_gpus, fused_gates,
                                                                   kind):
    made, calls = fused_gates
    xv = np.random.default_rng(0).standard_normal((5, 3, 2)).astype(np.float32)
    cpu = lstm_gradients("/cpu:0", xv, 4, layers=2, kind=kind, with_x=True)[0]
    assert not made
    gpu = lstm_gradients("/gpu:0", xv, 4, layers=2, kind=kind, with_x=True)[0]
    # both layers read sum(out^2) of their own outputs' gradient plus the recurrence
    # (the lower one: the upper's input gradient), in every step but the last
    assert made and calls[0] >= 5
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_layers_on_two_gpus_fuse_each_layers_sum_on_its_gpu(fake_gpus,
                                                                        fused_gates):
    made, _ = fused_gates
    xv = np.random.default_rng(1).standard_normal((4, 2, 3)).astype(np.float32)
    cpu = lstm_gradients("/cpu:0", xv, 4, layers=2, with_x=True)[0]
    gpu = lstm_gradients(["/gpu:0", "/gpu:1"], xv, 4, with_x=True)[0]
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert made     # each layer's sum sits with its gates' gradient (a peer copy feeds it)


def _gates_loop(values, read_sum=False, bad_from=None):
    """A loop calling LSTMGatesGrad(c, acts, c_new, dc, AddN(a, b)) each iteration with
    float64 numpy's values; `read_sum`: the sum is also read by another op (not fused);
    `bad_from`: b loses a row from that iteration on (the sum fails)."""
    c, acts, c_new, dc, a, b = values
    n = 3
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        k = dcf.placeholder(dcf.int32, [])
        C, A, CN, DC, AA, BB = (dcf.constant(v) for v in values)

        def body(i, dz_acc, seen):
            bb = BB if bad_from is None else BB[: dcf.where(i < k, b.shape[0], b.shape[0] - 1)]
            scale = dcf.cast(i + 1, dcf.float32)     # values that change each iteration
            dh = dcf.add_n([AA * scale, bb], name="dh_sum")
            dz, _ = apply("LSTMGatesGrad", [C, A, CN, DC, dh], name="gates_grad")
            if read_sum:
                seen = seen + dcf.reduce_sum(dh)
            return i + 1, dz_acc + dz, seen

        out = dcf.while_loop(lambda i, *_: i < n, body,
                             (0, dcf.zeros(list(acts.shape)), dcf.constant(0.0)),
                             name="gloop")
    return g, k, out[1:]


def _values(seed=2, batch=2, u=3):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((batch, u)).astype(np.float32)
    acts = rng.uniform(0.1, 0.9, (batch, 4 * u)).astype(np.float32)
    c_new = rng.standard_normal((batch, u)).astype(np.float32)
    dc = rng.standard_normal((batch, u)).astype(np.float32)
    a = rng.standard_normal((batch, u)).astype(np.float32)
    b = rng.standard_normal((batch, u)).astype(np.float32)
    return c, acts, c_new, dc, a, b


def _reference_dz(values):
    c, acts, c_new, dc, a, b = (v.astype(np.float64) for v in values)
    u = c.shape[1]
    i, j, f, o = (acts[:, q * u:(q + 1) * u] for q in range(4))
    tc = np.tanh(c_new)
    out = 0.0
    for t in range(3):
        dh = a * (t + 1) + b
        dct = dc + dh * o * (1 - tc * tc)
        out = out + np.concatenate([dct * j * i * (1 - i), dct * i * (1 - j * j),
                                    dct * c * f * (1 - f), dh * tc * o * (1 - o)], axis=1)
    return out


@pytest.mark.parametrize("read_sum", [False, True])
def test_a_loops_gates_gradient_equals_float64_numpy(fake_gpus, fused_gates, read_sum):
    made, calls = fused_gates
    vals = _values()
    g, k, (dz, seen) = _gates_loop(vals, read_sum=read_sum)
    with dcf.Session(graph=g) as sess:
        got, s = sess.run([dz, seen], {k: 5})
    np.testing.assert_allclose(got, _reference_dz(vals), rtol=1e-5, atol=1e-6)
    if read_sum:     # the sum is read by the reduce_sum too: the ops run one by one
        assert not made
        np.testing.assert_allclose(s, (6 * vals[4].astype(np.float64) + 3 * vals[5]).sum(),
                                   rtol=1e-5)
    else:
        assert len(made) >= 1 and calls[0] == 3


def test_a_failing_sum_names_the_add_n_frame_and_iteration(fake_gpus, fused_gates):
    made, _ = fused_gates
    g, k, (dz, _) = _gates_loop(_values(batch=3), bad_from=1)
    with dcf.Session(graph=g) as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError) as e:
            sess.run(dz, {k: 1})
    msg = str(e.value)
    assert made
    assert "dh_sum" in msg and "AddN" in msg and "iteration 1" in msg and "gloop" in msg
