"""Op edges a TF user meets: gradients through slices of a float constant, one_hot's
dtype and Variable values, softmax cross-entropy's shapes, tile's gradient at an
unknown rank, pad's constant of another kind."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError


def _run(fetches, feed=None):
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        return sess.run(fetches, feed)


def test_gradients_reach_a_constant_through_its_slices():
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    x = dcf.constant(a)
    g_row, g_cols = dcf.gradients(dcf.reduce_sum(x[0] * x[0]), x)[0], \
        dcf.gradients(dcf.reduce_sum(x[:, 1:] * 3.0), x)[0]
    got_row, got_cols = _run([g_row, g_cols])
    np.testing.assert_array_equal(got_row, [[2.0, 4.0], [0.0, 0.0]])
    np.testing.assert_array_equal(got_cols, [[0.0, 3.0], [0.0, 3.0]])
    assert dcf.shape(dcf.zeros([5, 3]))[0].op.type == "Const"   # shape arithmetic still folds


def test_one_hot_takes_its_dtype_from_its_values_and_takes_variables():
    idx = dcf.constant([1])
    as_int = dcf.one_hot(idx, 3, on_value=np.int32(5))
    on = dcf.Variable(np.float32(2.5))
    from_var = dcf.one_hot(idx, 3, on_value=on, off_value=-1.0)
    got_int, got_var = _run([as_int, from_var])
    assert got_int.dtype == np.int32
    np.testing.assert_array_equal(got_int, [[0, 5, 0]])
    np.testing.assert_array_equal(got_var, np.array([[-1.0, 2.5, -1.0]], np.float32))
    assert dcf.one_hot(idx, 3).dtype is dcf.float32


def test_cross_entropy_refuses_logits_that_would_broadcast_to_the_labels():
    with pytest.raises(InvalidArgumentError, match=r"logits of shape \[1, 4\]"):
        dcf.nn.softmax_cross_entropy_with_logits(
            labels=dcf.constant(np.full((3, 4), 0.25)), logits=dcf.constant(np.zeros((1, 4))))


def test_tile_gradient_with_an_input_of_unknown_rank():
    x = dcf.placeholder(dcf.float64, None)
    y = dcf.tile(x, [2, 3])
    w = np.arange(24.0).reshape(4, 6)
    g = dcf.gradients(dcf.reduce_sum(y * w), x)[0]
    got = _run(g, {x: np.ones((2, 2))})
    want = w.reshape(2, 2, 3, 2).sum(axis=(0, 2))       # each input cell's tiled copies
    np.testing.assert_array_equal(got, want)


def test_pad_refuses_a_fractional_constant_for_an_integer_tensor():
    x = dcf.constant([1, 2], dtype=dcf.int32)
    with pytest.raises(TypeError, match="constant_values=1.5"):
        dcf.pad(x, [[1, 1]], constant_values=1.5)
    np.testing.assert_array_equal(_run(dcf.pad(x, [[1, 1]], constant_values=7.0)),
                                  [7, 1, 2, 7])
