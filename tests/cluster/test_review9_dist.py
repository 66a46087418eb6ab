"""Review 9 (by use) of distributed runs: py_funcs on workers, their errors, and what
their closures bring along."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import textwrap

import numpy as np
import pytest

import dcf
from tests.cluster.helpers import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

W1 = "/job:worker/task:1/cpu:0"
OPTS = dcf.RunOptions(timeout_s=30)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Import a module from a directory only this process has on its sys.path (a script's
    own directory, when the script is run from elsewhere): the workers cannot import it."""
    name = f"dcf_review9_env_{id(tmp_path)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        import numpy as np

        class Env:
            def __init__(self):
                self.t = 0

            def step(self, a):
                self.t += 1
                return np.float32(a + self.t)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module(name)
    yield mod
    sys.modules.pop(name, None)


def test_py_func_capturing_an_object_of_a_user_module_runs_on_a_worker(cluster3,
                                                                         user_module):
    # The callable is a lambda of this test file; the environment it captured is an
    # instance of a class of a module the worker cannot import. In the client's process
    # the run gives 2.0 then 3.0; on a worker it must too (the class travels by value,
    # as the lambda's own module does), not fail to unpickle on the worker.
    env = user_module.Env()
    with dcf.Graph().as_default():
        with dcf.device(W1):
            a = dcf.placeholder(dcf.float32, ())
            r = dcf.py_func(lambda x: env.step(x), [a], dcf.float32, name="step")
        with dcf.Session(cluster=cluster3) as sess:
            got = [float(sess.run(r, {a: 1.0}, options=OPTS)) for _ in range(2)]
    assert got == [2.0, 3.0]
    assert env.t == 0          # the worker's copy changed, not the client's


_CLIENT_PID = os.getpid()


def _rebuild() -> object:
    if os.getpid() != _CLIENT_PID:
        raise RuntimeError("this object cannot be rebuilt on a worker")
    return object()


class _ClientOnly:
    """Pickles, but unpickles only in the client's process (a handle on a local resource)."""

    def __reduce__(self):
        return _rebuild, ()


def test_py_func_whose_closure_cannot_be_rebuilt_on_the_worker_names_the_op(cluster3):
    # The worker is fine: the error is the graph's, names the py_func (name, type) and
    # keeps the original exception's type and message; the session runs on.
    handle = _ClientOnly()
    with dcf.Graph().as_default():
        with dcf.device(W1):
            bad = dcf.py_func(lambda: (handle, np.float32(1))[1], [], dcf.float32,
                              name="uses_handle")
            good = dcf.constant(2.0) * 3.0
        with dcf.Session(cluster=cluster3) as sess:
            with pytest.raises(dcf.errors.InvalidArgumentError) as ei:
                sess.run(bad, options=OPTS)
            assert sess.run(good, options=OPTS) == 6.0
    msg = str(ei.value)
    assert "PyFunc 'uses_handle'" in msg and "/job:worker/task:1" in msg
    assert "RuntimeError: this object cannot be rebuilt on a worker" in msg


class _BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


@pytest.mark.parametrize("device", [W1, None])
def test_py_func_raising_an_exception_whose_str_fails_is_an_op_error(cluster3, device):
    # It was a bare RuntimeError from the error's formatting (no op, no frame), or on a
    # worker a WorkerError "failed: RuntimeError: no message".
    def f(i):
        if i == 2:
            raise _BadStr()
        return i

    with dcf.Graph().as_default():
        with dcf.device(device):
            r = dcf.while_loop(
                lambda i: i < 5,
                lambda i: dcf.reshape(dcf.py_func(f, [i], dcf.int32, name="f"), []) + 1,
                [dcf.constant(0)], name="L")
        with dcf.Session(cluster=cluster3 if device else None) as sess:
            with pytest.raises(dcf.errors.InvalidArgumentError) as ei:
                sess.run(r, options=OPTS)
    msg = str(ei.value)
    assert "PyFunc 'L/f'" in msg and "frame 'L' iteration 2" in msg
    assert "_BadStr: <its __str__ raised RuntimeError: no message>" in msg


def test_a_plan_that_failed_on_a_worker_is_released_with_its_session(cluster3):
    # A failed plan stayed in the worker for ever (with what its error held), one more
    # for every session closed after such a failure: closing a session frees all of its
    # plans, as it does those that ran.
    def plans() -> int:
        return cluster3._stats(1)[0]["plans"]

    before = plans()
    handle = _ClientOnly()
    with dcf.Graph().as_default():
        with dcf.device(W1):
            bad = dcf.py_func(lambda: (handle, np.float32(1))[1], [], dcf.float32)
        for _ in range(3):
            with dcf.Session(cluster=cluster3) as sess:
                for _ in range(2):
                    with pytest.raises(dcf.errors.InvalidArgumentError):
                        sess.run(bad, options=OPTS)
    wait_for(lambda: plans() == before, 10, "the failed plans to be released")


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def step(self) -> np.int32:
        self.n += 1
        return np.int32(self.n)


def test_a_good_py_func_still_runs_after_a_description_it_was_in_failed_to_load(cluster3):
    # A run fetching a good py_func with one whose closure the worker cannot rebuild
    # fails (as it should); the good one alone must then run, as it does in-process. The
    # client took the good one's objects as sent, so every later description referred to
    # objects the worker never loaded: the good py_func failed for the rest of the session.
    counter, handle = _Counter(), _ClientOnly()
    with dcf.Graph().as_default():
        with dcf.device(W1):
            good = dcf.py_func(counter.step, [], dcf.int32, name="good")
            bad = dcf.py_func(lambda: (handle, np.int32(0))[1], [], dcf.int32, name="bad")
        with dcf.Session(cluster=cluster3) as sess:
            with pytest.raises(dcf.errors.InvalidArgumentError, match="PyFunc 'bad'"):
                sess.run([good, bad], options=OPTS)
            assert [int(sess.run(good, options=OPTS)) for _ in range(2)] == [1, 2]


@pytest.mark.parametrize("device", [W1, None])
def test_py_func_raising_asyncio_cancelled_error_is_an_op_error(cluster3, device):
    # fn's own CancelledError (an asyncio-based environment's) is not the step's
    # cancellation: on a worker it ended the step without a reply and the run hung (until
    # timeout_s); in-process it escaped bare, naming no op (TF1: an op error).
    def f():
        raise asyncio.CancelledError("env cancelled")

    with dcf.Graph().as_default():
        with dcf.device(device):
            y = dcf.py_func(f, [], dcf.float32, name="env_step")
            ok = dcf.constant(2.0) * 3.0
        with dcf.Session(cluster=cluster3 if device else None) as sess:
            with pytest.raises(dcf.errors.InvalidArgumentError,
                               match=r"PyFunc 'env_step'.*CancelledError: env cancelled"):
                sess.run(y, options=dcf.RunOptions(timeout_s=10))
            assert sess.run(ok, options=OPTS) == 6.0


def test_shipping_a_py_func_keeps_the_users_own_pickle_by_value_registration(cluster3,
                                                                             user_module):
    # cloudpickle.register_pickle_by_value is what cloudpickle tells users to call for
    # a module workers cannot import; shipping a py_func of that module unregistered it
    # (dcf registered it again for the dump, then unregistered it).
    import cloudpickle

    cloudpickle.register_pickle_by_value(user_module)
    try:
        env = user_module.Env()
        with dcf.Graph().as_default():
            with dcf.device(W1):
                r = dcf.py_func(env.step, [dcf.constant(1.0)], dcf.float32)
            with dcf.Session(cluster=cluster3) as sess:
                assert sess.run(r, options=OPTS) == 2.0
        assert user_module.__name__ in cloudpickle.list_registry_pickle_by_value()
    finally:
        if user_module.__name__ in cloudpickle.list_registry_pickle_by_value():
            cloudpickle.unregister_pickle_by_value(user_module)


@pytest.fixture
def small_messages(cluster3):
    """The client's messages limited to 1 MB (for the 2 GiB limit, without 2 GiB)."""
    transport = cluster3._client.transport
    old, transport.max_message_bytes = transport.max_message_bytes, 1_000_000
    yield
    transport.max_message_bytes = old


def test_a_graph_too_large_to_send_to_a_worker_names_its_ops(cluster3, small_messages):
    # It was a bare ValueError "message to '/job:worker/task:1' is N bytes" naming no op;
    # and the objects of the py_funcs in it counted as sent, so the good py_func alone
    # then failed ("refers to object ... this worker does not have").
    counter, table = _Counter(), np.ones(500_000)      # 4 MB
    with dcf.Graph().as_default():
        with dcf.device(W1):
            step = dcf.py_func(counter.step, [], dcf.int32, name="step")
            big = dcf.constant(table, name="table") * 2.0
        with dcf.Session(cluster=cluster3) as sess:
            with pytest.raises(dcf.errors.InvalidArgumentError) as ei:
                sess.run([step, big], options=OPTS)
            assert int(sess.run(step, options=OPTS)) == 1
    msg = str(ei.value)
    assert "Const 'table' (4000000 bytes)" in msg and "PyFunc 'step'" in msg
    assert "/job:worker/task:1" in msg
