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


def test_unwritten_gradient_elements_read_as_one_zeros_array_per_device(gpu_count):
    """A gradient array's unwritten elements (the forward's outputs unused by the loss)
    read as zeros of the element's shape and dtype -- one array per device for all of
    them, not an allocation and a fill per read -- while written elements read as
    written; and a dynamic_rnn trained from its final state alone has the gradients of
    the same graph on the CPU."""
    from dcf.ops.data_ops import TensorArrayStore

    cp = gpu_devices.backend()
    g = TensorArrayStore("outputs@grad", dcf.float32, 4, False, False, (3, 2), True)
    with cp.cuda.Device(0):
        z0, z1 = g.read(0, cp), g.read(1, cp)
        assert z0 is z1 and z0.shape == (3, 2) and z0.dtype == np.float32
        np.testing.assert_array_equal(cp.asnumpy(z0), np.zeros((3, 2), np.float32))
        g.write(2, cp.ones((3, 2), np.float32))
        np.testing.assert_array_equal(cp.asnumpy(g.read(2, cp)), np.ones((3, 2)))
    if gpu_count > 1:
        with cp.cuda.Device(1):
            z = g.read(3, cp)
            assert z is not z0 and z.device.id == 1
    np.testing.assert_array_equal(np.asarray(g.read(0, np)), np.zeros((3, 2)))   # host: its own

    rng = np.random.default_rng(3)
    xv = rng.standard_normal((6, 4, 5)).astype(np.float32)
    grads = {}
    for dev in ("/cpu:0", "/gpu:0"):
        graph = dcf.Graph()
        with graph.as_default(), dcf.device(dev):
            x = dcf.placeholder(dcf.float32, [6, 4, 5])
            cell = dcf.nn.LSTMCell(7, name="cell")
            _, st = dcf.nn.dynamic_rnn(cell, x, dtype=dcf.float32, time_major=True)
            loss = dcf.reduce_sum(st.h * st.h)
            fetch = [loss] + dcf.gradients(loss, [x] + cell.variables)
            init = dcf.global_variables_initializer()
        with dcf.Session(graph) as s:
            s.run(init)
            s.run(fetch, {x: xv})                       # twice: the compiled path too
            grads[dev] = s.run(fetch, {x: xv})
    for a, b in zip(grads["/gpu:0"], grads["/cpu:0"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
