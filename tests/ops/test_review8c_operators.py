"""Python operators, indexing and printing of Tensors and Variables, as a TF1 user
writes them."""

from __future__ import annotations

import numpy as np
import pytest

import dcf


def test_an_unknown_rank_prints_apart_from_a_vector_of_unknown_length():
    # both printed float32[?]: an error naming "got float32[?]" could mean either
    g = dcf.Graph()
    with g.as_default():
        vec = dcf.placeholder(dcf.float32, [None], name="vec")
        any_ = dcf.placeholder(dcf.float32, None, name="any")
        mat = dcf.placeholder(dcf.float32, [None, 3], name="mat")
    assert repr(vec) == "<dcf.Tensor 'vec:0' float32[?]>"
    assert repr(any_) == "<dcf.Tensor 'any:0' float32[unknown rank]>"
    assert repr(mat) == "<dcf.Tensor 'mat:0' float32[?,3]>"


def test_a_variable_of_unknown_shape_does_not_print_as_a_scalar():
    # printed float32[] (list(None or [])), a scalar's type; and [2, 2] where a tensor
    # of that variable prints [2,2]
    g = dcf.Graph()
    with g.as_default():
        p = dcf.placeholder(dcf.float32, None)
        grows = dcf.Variable(p, name="grows", validate_shape=False)
        w = dcf.Variable([[1.0, 2.0], [3.0, 4.0]], name="w")
        s = dcf.Variable(0, name="s")
    assert repr(grows) == "<dcf.Variable 'grows' float32[unknown rank]>"
    assert repr(w) == "<dcf.Variable 'w' float32[2,2]>"
    assert str(s) == "<dcf.Variable 's' int32[]>"


def test_a_zero_dim_numpy_int_array_indexes_as_tf1s_does():
    # x[np.array(2)] and x[1:np.array(3)] were "unsupported index array(2)"
    xv = np.arange(5, dtype=np.float32) * 1.5
    g = dcf.Graph()
    with g.as_default():
        x = dcf.constant(xv)
        outs = [x[np.array(2)], x[1:np.array(-1)], x[np.array(-1, np.int64)::np.array(-2)]]
        with pytest.raises(TypeError, match="unsupported index"):
            x[np.array([0, 2])]
        with pytest.raises(TypeError, match="unsupported index"):
            x[np.array(1.0)]
        with dcf.Session(g) as sess:
            got = sess.run(outs)
    for out, want in zip(got, [xv[2], xv[1:-1], xv[-1::-2]]):
        np.testing.assert_array_equal(out, want)
