"""The public contract (API.md) as a TF1 user relies on it (review 9)."""

from __future__ import annotations

import numpy as np

import dcf


def test_an_update_has_the_static_shape_of_the_variable_it_updates():
    # assign_add/assign_sub return the variable's new value: a [1,2] variable updated by a
    # scalar (or a [2]) delta gave a tensor of the delta's shape, so `new @ w` failed to
    # build and a while_loop carrying the update saw its loop var change shape
    v = dcf.Variable(np.ones((1, 2), np.float32), name="v")
    up = v.assign_add(1.0)
    down = v.assign_sub([1.0, 1.0])
    assert up.shape == (1, 2) and down.shape == (1, 2)
    y = up @ dcf.ones([2, 3])
    assert y.shape == (1, 3)
    _, r = dcf.while_loop(lambda i, x: i < 2, lambda i, x: (i + 1, v.assign_add(1.0)),
                          (0, v.read_value()))
    assert r.shape == (1, 2)
    # an assign of a value of unknown shape has the variable's shape (the run refuses
    # any other)
    p = dcf.placeholder(dcf.float32, None)
    assert v.assign(p).shape == (1, 2)
    u = dcf.Variable(np.ones(3, np.float32), validate_shape=False, name="u")
    assert u.assign_add(1.0).shape is None        # any shape: the delta's says nothing
    with dcf.Session() as s:
        s.run([v.initializer, u.initializer])
        np.testing.assert_array_equal(s.run(y), [[4.0, 4.0, 4.0]])     # v = [[2, 2]]
        np.testing.assert_array_equal(s.run(down), [[1.0, 1.0]])
        np.testing.assert_array_equal(s.run(r), [[3.0, 3.0]])
        np.testing.assert_array_equal(s.run(u.assign_add(1.0)), [2.0, 2.0, 2.0])


def test_a_dtype_equals_the_numpy_type_or_name_that_names_it():
    # API.md: numpy dtypes are accepted; as TF1's tf.float32 == np.float32, a TF1 check
    # `if x.dtype == np.float32:` must not silently take the other branch
    x = dcf.placeholder(dcf.float32, [2])
    assert x.dtype == np.float32 and x.dtype == np.dtype("float32") and x.dtype == "float32"
    assert np.dtype("float32") == x.dtype and not (x.dtype != np.float32)
    assert dcf.constant([1, 2]).dtype == np.int32 and dcf.constant(True).dtype == np.bool_
    assert x.dtype != np.float64 and x.dtype != dcf.float64 and x.dtype != "int32"
    # what names no dtype is unequal, not an error (None would be np.dtype's float64)
    assert dcf.float64 != None and dcf.float32 != 5 and dcf.float32 != "nope"  # noqa: E711
    assert {dcf.float32: 1}[dcf.as_dtype(np.float32)] == 1
