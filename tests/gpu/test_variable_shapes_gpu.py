"""tests/core/test_variable_shapes.py on a GPU: a variable on /gpu:0 refuses an assign of
another shape and an update that would broadcast it larger, and keeps its value."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError


@pytest.mark.parametrize("compile_frames", [True, False])
def test_a_gpu_variable_keeps_its_shape_and_value(compile_frames):
    with dcf.device("/gpu:0"):
        v = dcf.Variable(np.arange(4, dtype=np.float32), name="v")
        x = dcf.placeholder(dcf.float32, None, name="x")
        put, add = v.assign(x), v.assign_add(x)
    with dcf.Session(config=dcf.SessionConfig(compile_frames=compile_frames)) as sess:
        sess.run(dcf.global_variables_initializer())
        with pytest.raises(InvalidArgumentError, match=r"variable 'v' of shape \[4\]: the "
                                                       r"value has shape \[3, 4\]"):
            sess.run(add, {x: np.ones((3, 4), np.float32)})
        with pytest.raises(InvalidArgumentError, match=r"the value has shape \[5\]"):
            sess.run(put, {x: np.ones(5, np.float32)})
        np.testing.assert_array_equal(sess.run(v.read_value()), np.arange(4))
        np.testing.assert_array_equal(sess.run(add, {x: np.float32(1.0)}), np.arange(4) + 1)
        np.testing.assert_array_equal(sess.run(put, {x: np.zeros(4, np.float32)}), np.zeros(4))
