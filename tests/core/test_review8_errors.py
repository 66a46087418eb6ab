"""Errors and validation found by a review by use (round 8): each test fails without
its fix."""

from __future__ import annotations

import re

import numpy as np
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


def test_a_float_or_bool_axis_is_a_type_error_not_truncated():
    # (int() made axis=1.7 axis 1 and axis=True axis 1 for reductions, argmax/argmin,
    # transpose, squeeze, stack, unstack, one_hot and softmax; TF refuses both)
    a = dcf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    builds = {
        "reduce_sum": lambda ax: dcf.reduce_sum(a, ax),
        "reduce_max list": lambda ax: dcf.reduce_max(a, [0, ax]),
        "argmax": lambda ax: dcf.argmax(a, ax),
        "argmin tensor": lambda ax: dcf.argmin(a, dcf.constant(ax)),
        "transpose": lambda ax: dcf.transpose(a, [ax, 0]),
        "squeeze": lambda ax: dcf.squeeze(dcf.ones([2, 1]), [ax]),
        "stack": lambda ax: dcf.stack([a, a], axis=ax),
        "unstack": lambda ax: dcf.unstack(a, axis=ax),
        "one_hot": lambda ax: dcf.one_hot([0, 1], 3, axis=ax),
        "softmax": lambda ax: dcf.nn.softmax(a, axis=ax),
        "log_softmax": lambda ax: dcf.nn.log_softmax(a, axis=ax),
    }
    for what, build in builds.items():
        for bad in (1.7, True):
            with pytest.raises(TypeError, match="int"):
                build(bad)
                pytest.fail(f"{what} took axis={bad!r}")
    # ints (Python or numpy) and an empty axis list still work
    with dcf.Session() as sess:
        got = sess.run([dcf.reduce_sum(a, np.int64(1)), dcf.reduce_sum(a, []),
                        dcf.transpose(a, np.array([1, 0])), dcf.argmax(a, -1)])
    np.testing.assert_array_equal(got[0], [6.0, 15.0])
    np.testing.assert_array_equal(got[1], [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(got[2], [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]])
    np.testing.assert_array_equal(got[3], [2, 2])


def test_restoring_a_file_that_is_not_a_checkpoint_names_it(tmp_path):
    # (numpy's errors came through: zipfile.BadZipFile for a truncated checkpoint, and a
    # ValueError suggesting allow_pickle=True, an unsafe load, for a file of another kind)
    v = dcf.Variable(np.ones(3, np.float32), name="v")
    saver = dcf.train.Saver([v])
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        good = saver.save(sess, str(tmp_path / "good"))
        data = open(good, "rb").read()
        (tmp_path / "trunc.npz").write_bytes(data[:len(data) // 2])
        (tmp_path / "text.npz").write_bytes(b"not a checkpoint\n")
        np.save(tmp_path / "one.npy", np.ones(3, np.float32))
        (tmp_path / "one.npy").rename(tmp_path / "one.npz")
        sess.run(v.assign([5.0, 6.0, 7.0]))
        for name in ("trunc", "text", "one"):
            path = str(tmp_path / name)
            with pytest.raises(dcf.errors.InvalidArgumentError,
                               match=f"checkpoint {path}.npz cannot be read as a checkpoint"
                               ) as info:
                saver.restore(sess, path)
            assert "allow_pickle" not in str(info.value)
            np.testing.assert_array_equal(sess.run(v), [5.0, 6.0, 7.0])
        saver.restore(sess, good)
        np.testing.assert_array_equal(sess.run(v), [1.0, 1.0, 1.0])


def test_split_error_shows_the_sizes_as_fed():
    # (a fed [-1, -1] was reported as "size_splits [5, -1]": the first -1 resolved)
    s = dcf.placeholder(dcf.int32, [2], name="s")
    parts = dcf.split(dcf.ones([4]), s, num=2, name="sp")
    with dcf.Session() as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError,
                           match=r"^SplitV 'sp': size_splits \[-1, -1\] do not add up to 4"):
            sess.run(parts, {s: [-1, -1]})
        assert [p.shape for p in sess.run(parts, {s: [-1, 3]})] == [(1,), (3,)]
