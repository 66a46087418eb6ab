"""Session and py_func edges from review 4: py_func outputs that are copies (not the
function's own buffer) and conversions to Tout that would change a value; py_func
exceptions that are not Exceptions; fetched fed values the caller may write; feeds of
another graph; predicates that are not scalars; what a deadline names; and run/Session
arguments of the wrong kind."""

from __future__ import annotations

import time

import numpy as np
import pytest

import dcf
from dcf.errors import DcfError, DeadlineExceededError, InvalidArgumentError

# ------------------------------------------------------------ py_func outputs


class _Env:
    """A hand-written environment: its state buffer, updated in place and returned."""

    def __init__(self, n: int = 2) -> None:
        self.state = np.zeros(n, np.float32)

    def step(self, a):
        self.state += a
        return self.state


def test_py_func_output_is_a_copy_not_the_functions_buffer(compiled):
    env = _Env()
    a = dcf.py_func(env.step, [dcf.constant(1.0)], dcf.float32)
    with dcf.control_dependencies([a]):
        b = dcf.py_func(env.step, [dcf.constant(10.0)], dcf.float32)
    with dcf.Session(config=compiled) as sess:
        ra, rb = sess.run([a, b])
    np.testing.assert_array_equal(ra, [1.0, 1.0])      # what the op produced
    np.testing.assert_array_equal(rb, [11.0, 11.0])
    assert ra is not env.state and rb is not env.state
    rb[0] = -5.0                                       # the caller's, not env's
    np.testing.assert_array_equal(env.state, [11.0, 11.0])


@pytest.mark.parametrize("as_tuple", [False, True], ids=["bare", "tuple"])
def test_py_func_values_kept_by_a_variable_and_a_tensor_array_do_not_change(as_tuple):
    buf = np.zeros(4, np.float32)

    def step(i):
        buf[:] = float(i)
        return (buf,) if as_tuple else buf

    i = dcf.placeholder(dcf.int32, ())
    o = dcf.py_func(step, [i], dcf.float32)
    v = dcf.Variable(np.zeros(4, np.float32))
    asg = v.assign(dcf.reshape(o, (4,)))

    def body(k, ta):
        return k + 1, ta.write(k, dcf.reshape(dcf.py_func(step, [k], dcf.float32), (4,)))

    _, ta = dcf.while_loop(lambda k, ta: k < 3, body, (0, dcf.TensorArray(dcf.float32, 3)))
    st = ta.stack()
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        sess.run(asg, {i: 1})
        sess.run(o, {i: 7})                 # buf changes again
        np.testing.assert_array_equal(sess.run(v), np.ones(4, np.float32))
        np.testing.assert_array_equal(sess.run(st), np.repeat(np.arange(3.0), 4).reshape(3, 4))


def test_py_func_conversion_that_changes_a_value_is_an_error_naming_the_op(compiled):
    a = dcf.py_func(lambda: np.float64(2.7), [], dcf.int32, name="pf")
    b = dcf.py_func(lambda: np.array([0.5, 1.9]), [], dcf.int32, name="pf2")
    c = dcf.py_func(lambda: np.array([2**40]), [], dcf.int32, name="pf3")
    d = dcf.py_func(lambda: np.array([2]), [], dcf.bool, name="pf4")
    with dcf.Session(config=compiled) as sess:
        for t, name in ((a, "pf"), (b, "pf2"), (c, "pf3"), (d, "pf4")):
            with pytest.raises(InvalidArgumentError, match=rf"PyFunc '{name}'.*Tout declares"):
                sess.run(t)


def test_py_func_exact_and_rounding_conversions_pass(compiled):
    a = dcf.py_func(lambda: np.float64(2.0), [], dcf.int32)
    b = dcf.py_func(lambda: np.array([1.0, -3.0]), [], dcf.int64)
    c = dcf.py_func(lambda: np.array([0.1, 1e-8]), [], dcf.float32)   # rounding: fine
    d = dcf.py_func(lambda: np.array([1, 0]), [], dcf.bool)
    with dcf.Session(config=compiled) as sess:
        ra, rb, rc, rd = sess.run([a, b, c, d])
    assert ra == 2 and ra.dtype == np.int32
    np.testing.assert_array_equal(rb, np.array([1, -3], np.int64))
    np.testing.assert_array_equal(rc, np.array([0.1, 1e-8], np.float64).astype(np.float32))
    np.testing.assert_array_equal(rd, [True, False])


# ------------------------------------------------------- py_func BaseExceptions


class _EnvDone(BaseException):
    """A library's control-flow exception (not an Exception)."""


def _raiser(exc):
    def fn(*_):
        raise exc
    return fn


@pytest.mark.parametrize("exc", [_EnvDone("episode over"), GeneratorExit(), SystemExit(3)],
                         ids=["custom", "GeneratorExit", "SystemExit"])
def test_py_func_base_exception_is_an_op_error_naming_op_frame_and_iteration(compiled, exc):
    def body(i, x):
        y = dcf.cond(i < 2, lambda: x,
                     lambda: dcf.reshape(dcf.py_func(_raiser(exc), [x], dcf.float32,
                                                     name="env_step"), []))
        return i + 1, y

    _, out = dcf.while_loop(lambda i, x: i < 5, body, (0, dcf.constant(1.0)), name="L")
    with dcf.Session(config=compiled) as sess:
        with pytest.raises(InvalidArgumentError) as ei:
            sess.run(out)
        msg = str(ei.value)
        assert "PyFunc" in msg and "env_step" in msg and type(exc).__name__ in msg
        assert "frame 'L' iteration 2" in msg
        assert sess.run(dcf.constant(3.0) * 2) == 6.0     # the session is still usable


def test_py_func_keyboard_interrupt_reaches_the_caller_in_the_clients_process():
    y = dcf.py_func(_raiser(KeyboardInterrupt()), [], dcf.float32)
    with dcf.Session() as sess:
        with pytest.raises(KeyboardInterrupt):
            sess.run(y)


def test_py_func_keyboard_interrupt_is_an_op_error_where_the_process_is_a_workers(
        monkeypatch):
    from dcf.ops import data_ops

    monkeypatch.setattr(data_ops, "KEEP_KEYBOARD_INTERRUPT", False)
    y = dcf.py_func(_raiser(KeyboardInterrupt()), [], dcf.float32, name="kbi")
    with dcf.Session() as sess:
        with pytest.raises(InvalidArgumentError, match="PyFunc 'kbi'.*KeyboardInterrupt"):
            sess.run(y)


# ------------------------------------------------------------- feeds, fetches


def test_fetched_fed_value_is_a_writable_copy(compiled):
    p = dcf.placeholder(dcf.float32, (3,))
    x = np.arange(3, dtype=np.float32)
    with dcf.Session(config=compiled) as sess:
        got, y = sess.run([p, p * 2.0], {p: x})
    assert got.flags.writeable
    got[0] = 100.0
    np.testing.assert_array_equal(x, [0.0, 1.0, 2.0])     # the caller's feed is untouched
    np.testing.assert_array_equal(y, [0.0, 2.0, 4.0])


def test_feed_key_of_another_graph_is_a_type_error():
    g = dcf.Graph()
    with g.as_default():
        p = dcf.placeholder(dcf.float32, (2,), name="p")
        y = p * 2.0
        c = dcf.constant(1.0)
    g2 = dcf.Graph()
    with g2.as_default():
        p_other = dcf.placeholder(dcf.float32, (2,), name="p")
    with dcf.Session(g) as sess:
        for fetch in (c, y):
            with pytest.raises(TypeError, match="p:0.*not an element of this session's graph"):
                sess.run(fetch, {p_other: np.ones(2, np.float32)})
        np.testing.assert_array_equal(sess.run(y, {p: np.ones(2, np.float32)}), [2.0, 2.0])


# ------------------------------------------------------------ predicates


@pytest.mark.parametrize("value", [[True, False], [], [True]], ids=["two", "empty", "one"])
def test_cond_predicate_that_is_not_a_scalar_is_an_error_naming_the_switch(compiled, value):
    pb = dcf.placeholder(dcf.bool, None, name="pb")
    r = dcf.cond(pb, lambda: 1.0, lambda: 2.0, name="mycond")
    with dcf.Session(config=compiled) as sess:
        with pytest.raises(InvalidArgumentError,
                           match=rf"Switch 'mycond/.*must be a scalar.*shape \[{len(value)}\]"):
            sess.run(r, {pb: np.array(value, bool)})
        assert sess.run(r, {pb: True}) == 1.0 and sess.run(r, {pb: np.array(False)}) == 2.0


@pytest.mark.parametrize("value", [[1.0, 2.0], [1.0]], ids=["two", "one"])
def test_while_predicate_that_is_not_a_scalar_names_switch_frame_and_iteration(compiled, value):
    x = dcf.placeholder(dcf.float32, None, name="x")
    _, w = dcf.while_loop(lambda i, v: v < 5.0, lambda i, v: (i + 1, v + 1.0), (0, x), name="L")
    with dcf.Session(config=compiled) as sess:
        with pytest.raises(InvalidArgumentError,
                           match=r"Switch 'L/.*frame 'L' iteration 0.*must be a scalar"):
            sess.run(w, {x: np.array(value, np.float32)})
        assert sess.run(w, {x: 1.5}) == 5.5


def test_nested_loop_predicate_from_a_py_func_fails_at_its_iteration(compiled):
    # the inner predicate turns into a vector at outer iteration 2
    def pred(i, j):
        return np.array([j < 2] * (2 if i == 2 else 1)).reshape(() if i != 2 else (2,))

    def outer(i, acc):
        def inner(j, a):
            return j + 1, a + 1.0

        c = lambda j, a: dcf.py_func(pred, [i, j], dcf.bool)
        _, a = dcf.while_loop(c, inner, (0, acc), name="In")
        return i + 1, a

    _, out = dcf.while_loop(lambda i, a: i < 4, outer, (0, dcf.constant(0.0)), name="Out")
    with dcf.Session(config=compiled) as sess:
        with pytest.raises(InvalidArgumentError,
                           match=r"Switch 'Out/In/.*frame 'Out/In' iteration 0.*shape \[2\]"):
            sess.run(out)


# ---------------------------------------------------------------- deadlines


def test_deadline_in_a_compiled_loop_names_the_frame_and_iteration():
    nap = lambda: (time.sleep(0.02), np.float32(1))[1]  # noqa: E731
    _, out = dcf.while_loop(
        lambda i, a: i < 1000,
        lambda i, a: (i + 1, a + dcf.reshape(dcf.py_func(nap, [], dcf.float32), [])),
        (0, 0.0), name="SL")
    with dcf.Session() as sess:
        with pytest.raises(DeadlineExceededError,
                           match=r"timeout_s=0.2.*while_loop frame 'SL' before iteration \d+"):
            sess.run(out, options=dcf.RunOptions(timeout_s=0.2))


# ---------------------------------------------------------------- arguments


def test_session_and_run_arguments_of_the_wrong_kind_are_type_errors():
    c = dcf.constant(1.0)
    with pytest.raises(TypeError, match=r"Session\(graph=...\) takes a dcf.Graph, got str"):
        dcf.Session("foo")
    with pytest.raises(TypeError, match=r"config=...\) takes a dcf.SessionConfig, got dict"):
        dcf.Session(config={"gpu_memory_limit": 1})
    with dcf.Session() as sess:
        with pytest.raises(TypeError, match=r"feed_dict=...\) takes a dict.*got list"):
            sess.run(c, [1])
        with pytest.raises(TypeError, match=r"options=...\) takes a dcf.RunOptions, got str"):
            sess.run(c, options="trace")
        with pytest.raises(TypeError, match=r"run_metadata=...\) takes a dcf.RunMetadata"):
            sess.run(c, options=dcf.RunOptions(trace=True), run_metadata={})
        assert sess.run(c, feed_dict={}, options=dcf.RunOptions()) == 1.0


@pytest.mark.parametrize("kwargs, exc", [
    (dict(swap_threshold=5.0), ValueError), (dict(swap_threshold=-0.1), ValueError),
    (dict(gpu_memory_limit=-5), ValueError), (dict(gpu_memory_limit=0), ValueError),
    (dict(gpu_memory_limit="1G"), TypeError), (dict(heartbeat_timeout_s=0), ValueError),
    (dict(intra_op_threads=0), ValueError), (dict(intra_op_threads=1.5), TypeError),
    (dict(compile_frames="no"), TypeError),
])
def test_session_config_refuses_nonsense(kwargs, exc):
    with pytest.raises(exc, match=next(iter(kwargs))):
        dcf.SessionConfig(**kwargs)


def test_session_config_takes_its_documented_range():
    for cfg in (dcf.SessionConfig(swap_threshold=0.0), dcf.SessionConfig(swap_threshold=1),
                dcf.SessionConfig(gpu_memory_limit=2**30, intra_op_threads=None),
                dcf.SessionConfig(compile_frames=np.bool_(False))):
        assert isinstance(cfg, dcf.SessionConfig)
    assert issubclass(InvalidArgumentError, DcfError)
