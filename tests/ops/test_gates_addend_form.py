"""How the LSTM gates' GPU kernels take their addend (rnn_ops._addend_form), which both the
gates' own GPU body and the in-place form over the product (gates_into) use; on numpy
arrays, since the stand-in GPUs of CI decline the raw kernels before asking it."""

from __future__ import annotations

import numpy as np

from dcf.ops.rnn_ops import _addend_form


def test_the_addend_forms():
    z = np.zeros((3, 8), np.float32)
    assert _addend_form(z, None, 2) == ""
    assert _addend_form(z, np.zeros(8, np.float32), 2) == "_row"
    assert _addend_form(z, np.zeros((3, 8), np.float32), 2) == "_full"


def test_what_no_form_takes():
    z = np.zeros((3, 8), np.float32)
    assert _addend_form(z, np.zeros(4, np.float32), 2) is None            # neither shape
    assert _addend_form(z, np.zeros((1, 8), np.float32), 2) is None       # a 2-D row
    assert _addend_form(z, np.zeros(8, np.float64), 2) is None            # dtype
    assert _addend_form(z, [0.0] * 8, 2) is None                          # not an array
