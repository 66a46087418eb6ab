"""Errors and validation found by a review by use (round 8): each test fails without
its fix."""

from __future__ import annotations

import re

import pytest

import dcf


def test_gradients_refuse_tensors_of_another_graph():
    # (a tensor of another graph has no path to ys: its gradient came back None, as if
    # it did not matter, and minimize() then said no gradient flows; TF1 raises)
    other = dcf.Graph()
    with other.as_default():
        o = dcf.constant(1.0, name="o")
        ov = dcf.Variable(1.0, name="ov")
    a = dcf.constant(2.0, name="a")
    y = a * 2.0
    with pytest.raises(ValueError, match=r"xs\[0\] \('o:0'\) is from another graph"):
        dcf.gradients(y, o)
    with pytest.raises(ValueError, match=r"xs\[1\] \('ov'\) is from another graph"):
        dcf.gradients(y, [a, ov])
    with pytest.raises(ValueError,
                       match=r"ys\[1\] \('Mul:0'\) is from another graph than ys\[0\]"):
        dcf.gradients([y, o * 3.0], a)
    with pytest.raises(ValueError, match=r"grad_ys\[0\] \('o:0'\) is from another graph"):
        dcf.gradients(y, a, grad_ys=o)
    with pytest.raises(ValueError, match="another graph"):
        dcf.train.GradientDescentOptimizer(0.1).minimize(y, var_list=[ov])
    # one graph: unchanged
    with dcf.Session() as sess:
        assert sess.run(dcf.gradients(y, a)) == [2.0]


def test_tensor_array_of_negative_size_is_an_error(compiled):
    # ([None] * -1 made an empty array: stack() gave [] where TF says size must be >= 0)
    n = dcf.placeholder(dcf.int32, [], name="n")
    stacked = dcf.TensorArray(dcf.float32, size=n, name="arr").stack()

    def body(i, acc):
        ta = dcf.TensorArray(dcf.float32, size=n - i, name="inner")
        return i + 1, acc + dcf.cast(ta.size(), dcf.float32)

    _, total = dcf.while_loop(lambda i, acc: i < 3, body, [0, 0.0], name="L")
    with dcf.Session(config=compiled) as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError,
                           match=r"^TensorArrayV3 'arr/TensorArray': TensorArray 'arr': size "
                                 r"must be >= 0, got -1"):
            sess.run(stacked, {n: -1})
        with pytest.raises(dcf.errors.InvalidArgumentError,
                           match=r"frame 'L' iteration 2: TensorArray 'L/inner': size must "
                                 r"be >= 0, got -1"):
            sess.run(total, {n: 1})
        assert sess.run(stacked, {n: 0}).shape == (0,)
        assert sess.run(total, {n: 3}) == 6.0
    with pytest.raises(ValueError, match="TensorArray 'const': size must be >= 0, got -2"):
        dcf.TensorArray(dcf.float32, size=-2, name="const")


def test_non_scalar_predicate_error_suggests_ops_that_exist(compiled):
    # (it suggested dcf.reduce_all / dcf.reduce_any, which dcf does not have)
    b = dcf.placeholder(dcf.bool, None, name="b")
    x = dcf.placeholder(dcf.float32, [], name="x")
    _, out = dcf.while_loop(lambda i, a: b, lambda i, a: (i + 1, a), [0, x], name="W")
    with dcf.Session(config=compiled) as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError) as info:
            sess.run(out, {b: [True, False], x: 1.0})
    msg = str(info.value)
    assert "frame 'W' iteration 0" in msg and "shape [2]" in msg
    suggested = {name for name in re.findall(r"dcf\.(\w+)", msg)}
    assert suggested and all(hasattr(dcf, name) for name in suggested), suggested


def test_a_negative_output_index_names_no_tensor():
    # ('sp:-1' was sp's last output, as Python indexing; TF1 has no such tensor)
    g = dcf.get_default_graph()
    parts = dcf.split(dcf.ones([4]), 2, name="sp")
    assert g.get_tensor_by_name("sp:1") is parts[1]
    for bad in ("sp:-1", "sp:2", "sp:x", "sp:\u00b2"):
        with pytest.raises(KeyError, match="op 'sp' has no output"):
            g.get_tensor_by_name(bad)
    with dcf.Session() as sess:
        with pytest.raises(KeyError, match="op 'sp' has no output '-1'"):
            sess.run("sp:-1")
