"""A slice's gradient added into the other addend's slice on a GPU (dcf/fusion/slice_add.py):
one add into a view of the other addend, written over where nothing else reads it, copied
where something does; the values against float64 numpy, and the wavefront LSTM whose
upper group reads the lower group's top layer, against the layer-by-layer model."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.ops.registry import apply
from tests.wavefront_gradients import wavefront_and_layers


@pytest.fixture
def slice_adds(instances_of):
    from dcf.fusion import slice_add

    return instances_of(slice_add.FusedSliceAdd)


def _counts(made):
    return sum(f.in_place for f in made), sum(f.copied for f in made)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("other_reader", [False, True])
def test_the_sum_adds_the_slice_into_the_other_addend(slice_adds, dt, other_reader):
    rng = np.random.default_rng(0)
    av, bv = rng.standard_normal((64, 40)).astype(dt), rng.standard_normal((40, 48)).astype(dt)
    with dcf.Graph().as_default(), dcf.device("/gpu:0"):
        m = dcf.matmul(dcf.constant(av), dcf.constant(bv))
        key = m[3:50:2, 8:].op.attrs["key"]
        dyv = rng.standard_normal(np.zeros((64, 48))[key].shape).astype(dt)
        padded = apply("StridedSliceGrad", [dcf.constant(dyv)], key=key, shape=(64, 48))
        fetches = [dcf.add_n([padded, m])] + ([m * 2.0] if other_reader else [])
        with dcf.Session() as sess:
            got = sess.run(fetches)
    prod = av.astype(np.float64) @ bv.astype(np.float64)
    want = prod.copy()
    want[key] += dyv
    tol = 1e-4 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(got[0], want, rtol=tol, atol=tol)
    if other_reader:
        np.testing.assert_allclose(got[1], 2 * prod, rtol=tol, atol=tol)
    assert _counts(slice_adds) == ((0, 1) if other_reader else (1, 0))


def test_the_wavefront_lstm_with_two_groups_adds_the_top_layers_slice_in_place(
        slice_adds, gpu_count):
    # two groups of layers: on two GPUs where there are, else on GPU 0 spelled twice
    devs = ["/gpu:0", "/gpu:1"] if gpu_count >= 2 else ["/gpu:0", "/device:GPU:0"]
    layers, steps = 4, 9
    x = np.random.default_rng(6).standard_normal((steps, 4, 16))
    la, lb, want_k, got_k = wavefront_and_layers(["/cpu:0"], devs, x, layers)
    assert abs(la - lb) <= 1e-12 * abs(la)
    np.testing.assert_allclose(got_k, want_k, rtol=1e-9, atol=1e-13)
    assert _counts(slice_adds) == (steps - layers + 1, 0)
