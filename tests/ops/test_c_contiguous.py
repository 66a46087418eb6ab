"""gpu_raw.c_contiguous: cupy's `_c_contiguous` attribute where the array has it (no Flags
object built), numpy's and the stand-in's `flags` otherwise."""

from __future__ import annotations

import numpy as np

from dcf.ops.gpu_raw import c_contiguous


def test_numpy_arrays_answer_through_flags():
    a = np.zeros((3, 4), np.float32)
    assert c_contiguous(a) and not c_contiguous(a.T) and not c_contiguous(a[:, 1:3])
    assert c_contiguous(a[1:3])


def test_an_array_with_the_cupy_attribute_is_read_without_flags():
    class Fake:
        _c_contiguous = False

        @property
        def flags(self):          # cupy builds an object here; c_contiguous must not ask
            raise AssertionError("flags read")

    assert c_contiguous(Fake()) is False
