"""A TensorArray unstacked on the GPU: its elements are row views made from a pointer
into the value (data_ops._rows) and read back as the value's rows, for the layouts an
unstack meets (contiguous, transposed, strided, an offset into a larger array); a
dynamic_rnn on the GPU reads its inputs and writes its gradients through them."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf import gpu_devices
from dcf.ops.data_ops import _rows


@pytest.mark.parametrize("layout", ["c", "transposed", "strided", "offset"])
def test_rows_of_a_device_array_are_its_rows(layout):
    cp = gpu_devices.backend()
    base = np.arange(8 * 4 * 5, dtype=np.float32).reshape(8, 4, 5)
    dev = cp.asarray(base)
    pick = {"c": lambda a: a[:3], "transposed": lambda a: a[:3].transpose(0, 2, 1),
            "strided": lambda a: a[::3], "offset": lambda a: a[5:]}[layout]
    v, want = pick(dev), pick(base)
    rows = _rows(v)
    assert len(rows) == want.shape[0]
    for k, r in enumerate(rows):
        assert r.shape == want.shape[1:] and r.dtype == want.dtype
        np.testing.assert_array_equal(cp.asnumpy(r), want[k])
    if gpu_devices.is_fake():                  # the stand-in's arrays copy on `+=`
        return
    dev += 1                                   # views: they see the array's memory
    np.testing.assert_array_equal(cp.asnumpy(rows[-1]), want[-1] + 1)


def test_dynamic_rnn_on_the_gpu_unstacks_inputs_and_gradients_as_on_the_cpu():
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((7, 3, 4)).astype(np.float32)

    def build(dev):
        g = dcf.Graph()
        with g.as_default(), dcf.device(dev):
            x = dcf.placeholder(dcf.float32, [7, 3, 4])
            cell = dcf.nn.LSTMCell(5, name="lstm")
            out, _ = dcf.nn.dynamic_rnn(cell, x, dtype=dcf.float32, time_major=True)
            loss = dcf.reduce_sum(dcf.square(out))
            grads = dcf.gradients(loss, [x] + cell._vars)
            init = dcf.global_variables_initializer()
        s = dcf.Session(g)
        s.run(init)
        return s, x, [out] + grads

    got = {}
    for dev in ("/cpu:0", "/gpu:0"):
        s, x, outs = build(dev)
        with s:
            got[dev] = s.run(outs, {x: xv})
    for a, b in zip(got["/cpu:0"], got["/gpu:0"]):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
