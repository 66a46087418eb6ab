"""A fetched GPU value made by an op that always writes a new array is copied to the host
where the compiled step makes it (dcf/fused.py, FRESH_OUTPUT_OPS), so a run that fetches
its loss need not wait for the rest of the step's GPU work. GPUs here are the cupy
stand-in, whose copies complete at once: a copy made early is seen by a py_func that runs
after the weight update, one made after the step is not. tests/gpu checks on a real GPU
that such a run returns while the GPU still works."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import dcf
import dcf.fused
from dcf.actors.gpu import GpuDevice

_V = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
_X = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3)
_LR = 0.1


def _model(dev0: str, dev1: str, marker: bool = True):
    """loss = sum((v * x)^2) on dev1 from v * x on dev0; one gradient step on v; a py_func
    after the step reads how many bytes GPU 1 has copied to the host so far."""
    g = dcf.Graph()
    with g.as_default():
        with dcf.device(dev0):
            v = dcf.Variable(_V, name="v")
            x = dcf.placeholder(dcf.float32, (2, 3), name="x")
            y = v.read_value() * x
        with dcf.device(dev1):
            loss = dcf.reduce_sum(dcf.square(y))
            train = dcf.train.GradientDescentOptimizer(_LR).minimize(loss)
        seen = None
        if marker:
            with dcf.device("/cpu:0"), dcf.control_dependencies([train]):
                seen = dcf.py_func(lambda: np.int64(GpuDevice.get(1).stats["d2h_bytes"]),
                                   [], dcf.int64, name="d2h_so_far")
        read = v.read_value()
        init = dcf.global_variables_initializer()
    return g, x, loss, train, seen, read, init


def _expected_losses(steps: int) -> list[float]:
    v, x = _V.astype(np.float64), _X.astype(np.float64)
    out = []
    for _ in range(steps):
        out.append(float(np.sum((v * x) ** 2)))
        v = v - _LR * 2 * v * x * x
    return out


def test_a_fetched_loss_is_copied_before_the_weight_update(fake_gpus, sources):
    g, x, loss, train, seen, _, init = _model("/gpu:0", "/gpu:1")
    with dcf.Session(graph=g) as sess:
        sess.run(init)
        for want in _expected_losses(3):
            got, _, seen_v = sess.run([loss, train, seen], {x: _X})
            np.testing.assert_allclose(got, want, rtol=1e-5)
            # the loss's 4 bytes had left GPU 1 before the py_func after the update ran
            assert GpuDevice.get(1).stats["d2h_bytes"] == seen_v
    root = next(s for s in sources if "_efetch" in s)
    assert root.count("_efetch(") == 1        # the loss; the py_func's value is a host one


def test_without_early_fetches_the_copy_waits_for_the_step(fake_gpus, monkeypatch):
    monkeypatch.setattr(dcf.fused, "EARLY_FETCH", False)
    g, x, loss, train, seen, _, init = _model("/gpu:0", "/gpu:1")
    with dcf.Session(graph=g) as sess:
        sess.run(init)
        got, _, seen_v = sess.run([loss, train, seen], {x: _X})
        np.testing.assert_allclose(got, _expected_losses(1)[0], rtol=1e-5)
        assert GpuDevice.get(1).stats["d2h_bytes"] == seen_v + 4


def test_a_fetched_variable_read_is_copied_after_the_step_as_before(fake_gpus, sources,
                                                                     monkeypatch):
    """A read of a variable that the step updates is not a fresh array (and its order
    against the update is the graph's to give): its fetch is copied after the step, and
    sees what it saw before early fetches existed."""
    results = {}
    for early in (True, False):
        monkeypatch.setattr(dcf.fused, "EARLY_FETCH", early)
        g, x, loss, train, _, read, init = _model("/gpu:0", "/gpu:1", marker=False)
        with dcf.Session(graph=g) as sess:
            sess.run(init)
            results[early] = [sess.run([loss, read, train], {x: _X})[:2] for _ in range(2)]
    for (l_early, r_early), (l_late, r_late) in zip(results[True], results[False]):
        np.testing.assert_array_equal(l_early, l_late)
        np.testing.assert_array_equal(r_early, r_late)
    assert [s.count("_efetch(") for s in sources if "_efetch" in s] == [1]   # the loss


def test_an_async_session_waits_for_the_early_copy(fake_gpus):
    g, x, loss, train, seen, _, init = _model("/gpu:0", "/gpu:1")

    async def main():
        sess = dcf.AsyncSession(graph=g)
        try:
            await sess.run(init)
            out = []
            for _ in range(2):
                got, _, seen_v = await sess.run([loss, train, seen], {x: _X})
                out.append(got)
                assert GpuDevice.get(1).stats["d2h_bytes"] == seen_v
            return out
        finally:
            await sess.close()

    got = asyncio.run(main())
    np.testing.assert_allclose(got, _expected_losses(2), rtol=1e-5)


@pytest.mark.parametrize("dead", [False, True])
def test_a_fetch_on_an_untaken_branch_is_still_an_error(fake_gpus, dead):
    g = dcf.Graph()
    with g.as_default(), dcf.device("/gpu:0"):
        p = dcf.placeholder(dcf.bool, (), name="p")
        a = dcf.constant(np.ones((2, 2), np.float32))
        sw_f, sw_t = dcf.control_flow.switch(a, p)
        s = dcf.reduce_sum(sw_t)
    with dcf.Session(graph=g) as sess:
        if dead:
            with pytest.raises(dcf.errors.InvalidArgumentError, match="dead"):
                sess.run(s, {p: False})
        else:
            assert float(sess.run(s, {p: True})) == 4.0


def test_a_run_on_one_gpu_alone_copies_its_loss_early_too(fake_gpus, sources):
    """A graph wholly on one GPU runs as that GPU's partition (no fused plan): its
    compiled root starts the loss's copy where it makes it as well."""
    g, x, loss, train, _, read, init = _model("/gpu:0", "/gpu:0", marker=False)
    with dcf.Session(graph=g) as sess:
        sess.run(init)
        for want in _expected_losses(3):
            got, _ = sess.run([loss, train], {x: _X})
            np.testing.assert_allclose(got, want, rtol=1e-5)
    root = next(s for s in sources if "_efetch" in s)
    lines = [ln.strip() for ln in root.splitlines()]
    at = next(i for i, ln in enumerate(lines) if ln.startswith("_ef0 = _efetch("))
    made = lines[at - 1].split(" = ")[0]           # the loss's variable, made just before
    assert lines[at] == f"_ef0 = _efetch({made}, 0)"
    assert at < max(i for i, ln in enumerate(lines) if ln.startswith(("v", "f")))
