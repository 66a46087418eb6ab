"""Control flow and data ops: a cond returning two different
TensorArrays is a build-time error, maximum_iterations may be an int64 tensor, empty
TensorArrays keep their element shape (stack/gather/concat, map_fn over an empty
batch), and py_func's StopIteration and None results. Each on every execution path."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError, OutOfRangeError

PATHS = ["compiled", "partitioned", "tagged", "traced"]


def _session(path: str) -> dcf.Session:
    return dcf.Session(config=dcf.SessionConfig(compile_frames=path != "tagged",
                                                fuse_devices=path != "partitioned"))


def _opts(path: str) -> dcf.RunOptions:
    return dcf.RunOptions(trace=path == "traced", timeout_s=60.0)


def _run(path: str, fetches, feed=None):
    with _session(path) as sess:
        return sess.run(fetches, feed, options=_opts(path))


# ----------------------------------------------------------- cond of two arrays
def test_cond_of_two_different_tensor_arrays_is_a_build_error():
    p = dcf.placeholder(dcf.bool, ())
    ta1 = dcf.TensorArray(dcf.float32, size=2).unstack(dcf.constant([1.0, 2.0]))
    ta2 = dcf.TensorArray(dcf.float32, size=2).unstack(dcf.constant([10.0, 20.0]))
    with pytest.raises(ValueError, match=r"cond 'pick': .*different TensorArrays at "
                                         r"output\[1\]"):
        dcf.cond(p, lambda: (1.0, ta1), lambda: (2.0, ta2), name="pick")


def test_cond_of_arrays_made_in_its_branches_is_a_build_error():
    p = dcf.placeholder(dcf.bool, ())
    x = dcf.placeholder(dcf.float64, (3,))
    with pytest.raises(ValueError, match=r"cond 'cond': .*different TensorArrays"):
        dcf.cond(p, lambda: dcf.TensorArray(dcf.float64, size=3).unstack(x),
                 lambda: dcf.TensorArray(dcf.float64, size=3).unstack(x * x))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("pred", [True, False])
def test_cond_of_one_array_written_in_either_branch(path, pred):
    # still fine: both branches return the same array
    p = dcf.placeholder(dcf.bool, ())
    x = dcf.placeholder(dcf.float64, (2,))
    ta = dcf.TensorArray(dcf.float64, size=2).write(0, x[0])
    out = dcf.cond(p, lambda: ta.write(1, x[1] * 2.0), lambda: ta.write(1, x[1] * 3.0)).stack()
    g, = dcf.gradients(dcf.reduce_sum(out), [x])
    got, got_g = _run(path, [out, g], {p: pred, x: np.array([1.5, -2.0])})
    k = 2.0 if pred else 3.0
    np.testing.assert_allclose(got, [1.5, -2.0 * k])
    np.testing.assert_allclose(got_g, [1.0, k])


# ------------------------------------------------------- maximum_iterations dtype
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dt", [dcf.int64, dcf.int32])
def test_maximum_iterations_tensor_of_either_int_dtype(path, dt):
    n = dcf.placeholder(dt, ())
    x = dcf.placeholder(dcf.float64, ())
    i, t = dcf.while_loop(lambda i, t: i < 10, lambda i, t: (i + 1, t * x), (0, 1.0 + 0 * x),
                          maximum_iterations=n)
    g, = dcf.gradients(t, [x])
    got_i, got_t, got_g = _run(path, [i, t, g], {n: 3, x: 1.5})
    assert got_i == 3
    np.testing.assert_allclose(got_t, 1.5 ** 3)
    np.testing.assert_allclose(got_g, 3 * 1.5 ** 2)


@pytest.mark.parametrize("path", PATHS)
def test_maximum_iterations_int64_in_nested_loop(path):
    n = dcf.placeholder(dcf.int64, ())

    def outer(j, acc):
        _, s = dcf.while_loop(lambda i, s: i < 100, lambda i, s: (i + 1, s + 1.0), (0, 0.0),
                              maximum_iterations=n + dcf.cast(j, dcf.int64))
        return j + 1, acc + s

    _, acc = dcf.while_loop(lambda j, a: j < 3, outer, (0, 0.0))
    assert _run(path, acc, {n: 2}) == 2 + 3 + 4


@pytest.mark.parametrize("bad", [2.5, "3", [3], True])
def test_maximum_iterations_of_a_wrong_type_names_the_argument(bad):
    with pytest.raises(TypeError, match=r"while_loop 'w': maximum_iterations"):
        dcf.while_loop(lambda i: i < 10, lambda i: i + 1, 0, maximum_iterations=bad, name="w")


@pytest.mark.parametrize("bad", [dcf.float32, dcf.bool])
def test_maximum_iterations_tensor_of_a_wrong_dtype_names_the_argument(bad):
    m = dcf.placeholder(bad, ())
    with pytest.raises(TypeError, match=r"while_loop 'w': maximum_iterations must be a scalar "
                                        r"int32 or int64"):
        dcf.while_loop(lambda i: i < 10, lambda i: i + 1, 0, maximum_iterations=m, name="w")


# ---------------------------------------------------- empty arrays keep their shape
@pytest.mark.parametrize("path", PATHS)
def test_map_fn_over_an_empty_batch_keeps_the_element_shape(path):
    x = dcf.placeholder(dcf.float32, (None, 3))
    m = dcf.map_fn(lambda r: r * 2.0, x)
    md = dcf.map_fn(lambda r: r * 2.0, x, dtype=dcf.float32)
    prod = m @ dcf.ones((3, 4))
    got, got_d, got_p = _run(path, [m, md, prod], {x: np.zeros((0, 3), np.float32)})
    assert got.shape == (0, 3) and got_d.shape == (0, 3) and got_p.shape == (0, 4)


@pytest.mark.parametrize("path", PATHS)
def test_stack_gather_concat_of_an_empty_array(path):
    x = dcf.placeholder(dcf.float32, (None, 2, 3))
    ta = dcf.TensorArray(dcf.float32, size=dcf.shape(x)[0]).unstack(x)
    ta_static = dcf.TensorArray(dcf.float32, size=0, element_shape=(None, 5),
                                infer_shape=False)
    ta_known = dcf.TensorArray(dcf.float32, size=0, element_shape=(4, 5))
    fetch = [ta.stack(), ta.gather(dcf.zeros((0,), dcf.int32)), ta.concat(),
             ta_static.concat(), ta_known.stack(), ta_known.concat()]
    got = _run(path, fetch, {x: np.zeros((0, 2, 3), np.float32)})
    assert [v.shape for v in got] == [(0, 2, 3), (0, 2, 3), (0, 3), (0, 5), (0, 4, 5), (0, 5)]
    assert all(v.dtype == np.float32 for v in got)


@pytest.mark.parametrize("path", PATHS)
def test_nonempty_stack_and_concat_unchanged(path):
    xv = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    x = dcf.placeholder(dcf.float32, (None, 2, 3))
    ta = dcf.TensorArray(dcf.float32, size=dcf.shape(x)[0], clear_after_read=False).unstack(x)
    s, c = _run(path, [ta.stack(), ta.concat()], {x: xv})
    np.testing.assert_array_equal(s, xv)
    np.testing.assert_array_equal(c, xv.reshape(4, 3))


# ------------------------------------------------------------------- py_func
def _feeder(where: str):
    it = iter([] if where == "root" else [np.float32(1), np.float32(2)])
    nb = lambda *a: next(it)   # noqa: E731
    if where == "root":
        return dcf.py_func(nb, [], dcf.float32, name="next_batch")
    return dcf.while_loop(lambda i, s: i < 5, lambda i, s: (i + 1, s + dcf.reshape(
        dcf.py_func(nb, [i], dcf.float32, name="next_batch"), [])), (0, 0.0), name="feeder")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("where", ["root", "loop"])
def test_py_func_stop_iteration_is_out_of_range_naming_the_op(path, where):
    out = _feeder(where)
    with _session(path) as sess:
        with pytest.raises(OutOfRangeError) as ei:
            sess.run(out, options=_opts(path))
    msg = str(ei.value)
    assert "PyFunc '" in msg and "next_batch'" in msg and "StopIteration" in msg, msg
    if where == "loop":
        assert "frame 'feeder' iteration 2" in msg, msg
    # the session is still usable: py_func errors are ordinary run errors


@pytest.mark.parametrize("path", PATHS)
def test_py_func_returning_none(path):
    log = []
    x = dcf.constant([1.0, 2.0])
    side = dcf.py_func(lambda v: log.append(float(v.sum())), [x], [], name="logger")
    forgot = dcf.py_func(lambda v: None, [x], dcf.float32, name="forgot")
    two = dcf.py_func(lambda v: None, [x], [dcf.float32, dcf.int32], name="forgot_two")
    ok = dcf.py_func(lambda v: v * 2, [x], dcf.float32, name="ok")
    with _session(path) as sess:
        sess.run(side, options=_opts(path))
        assert log == [3.0]
        for op, n in ((forgot, "forgot"), (two[0], "forgot_two")):
            with pytest.raises(InvalidArgumentError,
                               match=rf"PyFunc '{n}': py_func <lambda> returned None, Tout "
                                     r"declares \d value"):
                sess.run(op, options=_opts(path))
        np.testing.assert_array_equal(sess.run(ok, options=_opts(path)), [2.0, 4.0])


@pytest.mark.parametrize("path", PATHS)
def test_py_func_outputs_that_converting_to_tout_would_change_are_errors(path):
    """A complex number's imaginary part, an unsigned int past the signed range (it
    wrapped to -2**63), text parsed as a number or a date taken as its day count were
    converted silently; TF1's py_func refuses all of them (it checks the dtype)."""
    bad = [(lambda: np.complex128(1 + 2j), dcf.float32, "change its value"),
           (lambda: np.array([1 + 0j, 2j]), dcf.int32, "change its value"),
           (lambda: np.uint64(2**63), dcf.int64, "change its value"),
           (lambda: np.array([2**64 - 1], np.uint64), dcf.int64, "change its value"),
           (lambda: "12", dcf.int64, "a str is not a number"),
           (lambda: np.array(["1.5", "2"]), dcf.float32, "a str is not a number"),
           (lambda: b"12", dcf.int32, "a bytes value is not a number"),
           (lambda: np.datetime64("2020-01-01"), dcf.int64, "a datetime64 is not a number")]
    ok = [(lambda: np.complex64(3 + 0j), dcf.float32, 3.0),
          (lambda: np.uint64(2**40), dcf.int64, 2**40),
          (lambda: np.array([1, 2], dtype=object), dcf.int32, [1, 2])]
    outs = [dcf.py_func(f, [], dt, name=f"bad{k}") for k, (f, dt, _) in enumerate(bad)]
    goods = [dcf.py_func(f, [], dt) for f, dt, _ in ok]
    with _session(path) as sess:
        for k, (out, (_, _, match)) in enumerate(zip(outs, bad)):
            with pytest.raises(InvalidArgumentError, match=rf"PyFunc 'bad{k}'.*{match}"):
                sess.run(out, options=_opts(path))
        for out, (_, _, want) in zip(goods, ok):
            np.testing.assert_array_equal(sess.run(out, options=_opts(path)), want)
