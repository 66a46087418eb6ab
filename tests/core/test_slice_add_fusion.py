"""A slice's gradient added into the other addend's slice (dcf/fusion/slice_add.py), on
stand-in GPUs, which take the fused path (it needs no raw kernel): what the compiler fuses
and what it leaves alone, when the other addend is written over and when copied, and the
values against float64 numpy and the CPU."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.ops.registry import apply
from tests.wavefront_gradients import wavefront_and_layers


@pytest.fixture
def slice_adds(instances_of):
    """The FusedSliceAdds the compiler built in this test."""
    from dcf.fusion import slice_add

    return instances_of(slice_add.FusedSliceAdd)


def _counts(made):
    return sum(f.in_place for f in made), sum(f.copied for f in made)


def test_a_slices_gradient_is_added_into_a_products_gradient_in_place(fake_gpus, slice_adds):
    rng = np.random.default_rng(0)
    av, xv, cv, vv = (rng.standard_normal(s) for s in ((5, 4), (4, 3), (5, 3), (3,)))
    with dcf.Graph().as_default(), dcf.device("/gpu:0"):
        a = dcf.constant(av)
        x = dcf.placeholder(dcf.float64, [4, 3])
        loss = dcf.reduce_sum(dcf.matmul(a, x) * cv) + dcf.reduce_sum(x[1] * vv)
        (dx,) = dcf.gradients(loss, [x])
        with dcf.Session() as sess:
            got = sess.run(dx, {x: xv})
    want = av.T @ cv
    want[1] += vv
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    # the product's gradient is a new array the sum alone reads: written over
    assert _counts(slice_adds) == (1, 0)


def _padded_sum(other_reader: bool, key_of=lambda m: m[1:3, ::2]):
    """add_n([m, StridedSliceGrad(dy)]) with m = a @ b, and 2 * m where `other_reader`."""
    rng = np.random.default_rng(1)
    av, bv = rng.standard_normal((4, 5)), rng.standard_normal((5, 3))
    with dcf.Graph().as_default(), dcf.device("/gpu:0"):
        m = dcf.matmul(dcf.constant(av), dcf.constant(bv))
        key = key_of(m).op.attrs["key"]
        dyv = rng.standard_normal(np.zeros((4, 3))[key].shape)
        padded = apply("StridedSliceGrad", [dcf.constant(dyv)], key=key, shape=(4, 3))
        fetches = [dcf.add_n([m, padded])] + ([m * 2.0] if other_reader else [])
        with dcf.Session() as sess:
            got = sess.run(fetches)
    want = av @ bv
    want[key] += dyv
    return got, want, av @ bv


def test_an_addend_another_op_reads_is_copied_and_left_as_it_was(fake_gpus, slice_adds):
    (total, twice), want, m = _padded_sum(other_reader=True)
    np.testing.assert_allclose(total, want, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(twice, 2 * m, rtol=1e-14, atol=1e-14)
    assert _counts(slice_adds) == (0, 1)


def test_a_strided_key_is_added_where_it_points(fake_gpus, slice_adds):
    (total,), want, _ = _padded_sum(other_reader=False)
    np.testing.assert_allclose(total, want, rtol=1e-14, atol=1e-14)
    assert _counts(slice_adds) == (1, 0)


def test_a_broadcasting_add_and_a_slice_gradient_read_twice_run_as_they_are(
        fake_gpus, slice_adds):
    rng = np.random.default_rng(2)
    dyv, row = rng.standard_normal(3), rng.standard_normal(3)
    with dcf.Graph().as_default(), dcf.device("/gpu:0"):
        x = dcf.zeros([4, 3], dcf.float64)
        key = x[2].op.attrs["key"]
        padded = apply("StridedSliceGrad", [dcf.constant(dyv)], key=key, shape=(4, 3))
        broadcast = dcf.add(padded, dcf.constant(row))         # other: [3], not [4, 3]
        padded2 = apply("StridedSliceGrad", [dcf.constant(dyv)], key=key, shape=(4, 3))
        twice_read = dcf.add_n([dcf.constant(np.ones((4, 3))), padded2])
        with dcf.Session() as sess:
            got_b, got_t, got_p = sess.run([broadcast, twice_read, padded2])
    want = np.zeros((4, 3))
    want[2] = dyv
    np.testing.assert_array_equal(got_b, want + row)
    np.testing.assert_array_equal(got_t, want + 1.0)
    np.testing.assert_array_equal(got_p, want)
    # the broadcast sum was fused but ran op by op; the fetched padding kept its AddN apart
    assert _counts(slice_adds) == (0, 0)
    assert len({id(f.total) for f in slice_adds}) <= 1


def test_the_wavefront_lstm_on_two_gpus_adds_the_lower_groups_slice_in_place(
        fake_gpus, slice_adds):
    layers, steps = 4, 7
    x = np.random.default_rng(3).standard_normal((steps, 3, 5))
    la, lb, want_k, got_k = wavefront_and_layers(["/cpu:0"], ["/gpu:0", "/gpu:1"], x, layers)
    assert abs(la - lb) <= 1e-12 * max(1.0, abs(la))
    np.testing.assert_allclose(got_k, want_k, rtol=1e-10, atol=1e-14)
    # group 1 reads group 0's top layer, an iteration behind: the gradient of that slice
    # joins group 0's dh in place in every iteration of the backward loop
    in_place, copied = _counts(slice_adds)
    assert in_place == steps - layers + 1 and copied == 0


def test_an_elements_gradient_is_added_where_the_element_is(fake_gpus, slice_adds):
    # x[1, 2] and v[3] index every axis with an integer: their gradients' keys select
    # one element, and `out[key]` must be a (0-d) view of it, as cupy's is -- the
    # stand-in once gave a copy there, and the element's gradient went missing
    rng = np.random.default_rng(4)
    av, cv, xv = (rng.standard_normal((4, 4)) for _ in range(3))
    vv, wv = rng.standard_normal(4), rng.standard_normal((4, 4))
    with dcf.Graph().as_default(), dcf.device("/gpu:0"):
        a = dcf.constant(av)
        x = dcf.placeholder(dcf.float64, [4, 4])
        v = dcf.placeholder(dcf.float64, [4])
        loss = dcf.reduce_sum(dcf.matmul(a, x) * cv) + x[1, 2] * 3.0 + \
            dcf.reduce_sum(dcf.matmul(dcf.reshape(v, [1, 4]), dcf.constant(wv))) + v[3] * 2.0
        dx, dv = dcf.gradients(loss, [x, v])
        with dcf.Session() as sess:
            got_x, got_v = sess.run([dx, dv], {x: xv, v: vv})
    want_x = av.T @ cv
    want_x[1, 2] += 3.0
    want_v = wv.sum(axis=1)
    want_v[3] += 2.0
    np.testing.assert_allclose(got_x, want_x, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(got_v, want_v, rtol=1e-13, atol=1e-13)
    in_place, copied = _counts(slice_adds)
    assert in_place >= 1 and in_place + copied == 2
