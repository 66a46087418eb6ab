"""Stateful programs run by every execution path (review 5, found by
bench/probes/stateful_fuzz.py and minimised): side effects ordered by control_dependencies
inside loops spread over two devices, and ops with no data inputs (or only loop
constants) whose control inputs come from outside their cond branch or loop. The values
expected are TF1's (checked by hand against tensorflow.compat.v1) and plain Python's."""

from __future__ import annotations

import numpy as np

import dcf


def _in_loop_read_after_assign(config: dcf.SessionConfig | None,
                               options: dcf.RunOptions | None = None) -> tuple:
    """Loop 1 (on /cpu:0) assigns b := 2v; loop 2 reads b on /cpu:1 under
    control_dependencies on its loop variable, which carries loop 1's result."""
    with dcf.device("/cpu:1"):
        b = dcf.Variable(np.float64(0.1), name="b")
    x = dcf.placeholder(dcf.float64, ())
    with dcf.device("/cpu:0"):
        def assign(i, v):
            with dcf.control_dependencies([v]):
                t = b.assign(v * 2.0)
            return i + 1, v + t

        _, x2 = dcf.while_loop(lambda i, v: i < 1, assign, (0, x))

        def read(j, v):
            with dcf.device("/cpu:1"):
                with dcf.control_dependencies([v]):
                    r = b.read_value()
                return j + 1, v + r

        y = dcf.while_loop(lambda j, v: j < 1, read, (0, x2))[1]
    with dcf.Session(config=config) as sess:
        sess.run(dcf.global_variables_initializer())
        return sess.run(y, {x: 0.7}, options=options), sess.run(b)


def test_read_ordered_by_loop_variable_sees_earlier_assign_across_devices(compiled):
    # x2 = 0.7 + 1.4 = 2.1 after loop 1 (b = 1.4); loop 2 adds the b it reads
    y, b = _in_loop_read_after_assign(compiled)
    assert b == 1.4
    np.testing.assert_allclose(y, 2.1 + 1.4, rtol=1e-12)


def test_read_ordered_by_loop_variable_traced_run():
    y, b = _in_loop_read_after_assign(None, dcf.RunOptions(trace=True))
    assert b == 1.4
    np.testing.assert_allclose(y, 2.1 + 1.4, rtol=1e-12)


def test_assign_under_outside_control_dependency_runs_once_per_iteration(compiled):
    x = dcf.placeholder(dcf.float64, ())
    v = dcf.Variable(np.float64(0.0))

    def body(i):
        with dcf.control_dependencies([x]):      # from outside the loop
            op = v.assign_add(1.0)               # inputs: loop constants only
        with dcf.control_dependencies([op]):
            return i + 1

    n = dcf.while_loop(lambda i: i < 3, body, [0])
    with dcf.Session(config=compiled) as sess:
        sess.run(dcf.global_variables_initializer())
        assert sess.run(n, {x: 1.0}) == 3
        assert sess.run(v) == 3.0                 # TF1: 3.0 (not 4: no exit-iteration run)


def test_py_func_without_inputs_under_outside_control_dependency(compiled):
    calls: list[str] = []

    def log(tag):
        def fn():
            calls.append(tag)
            return np.float64(1.0)
        return fn

    p = dcf.placeholder(dcf.bool, ())
    x = dcf.placeholder(dcf.float64, ())

    def taken():
        with dcf.control_dependencies([x]):
            return x + dcf.py_func(log("branch"), [], dcf.float64)

    y = dcf.cond(p, taken, lambda: x)

    def body(i, v):
        with dcf.control_dependencies([x]):
            r = dcf.py_func(log("body"), [], dcf.float64)
        return i + 1, v + dcf.reshape(r, ())

    _, z = dcf.while_loop(lambda i, v: i < 3, body, (0, x))
    with dcf.Session(config=compiled) as sess:
        assert sess.run(y, {p: False, x: 1.0}) == 1.0
        assert calls == []                        # TF1: the untaken branch never runs
        assert sess.run(y, {p: True, x: 1.0}) == 2.0
        assert calls == ["branch"]
        calls.clear()
        assert sess.run(z, {x: 1.0}) == 4.0
        assert calls == ["body"] * 3              # TF1: once per iteration, 3 in all


def test_seeded_random_in_untaken_branch_draws_nothing(compiled):
    # the fuzzer's repro: a seeded draw under control_dependencies on an outside value
    p = dcf.placeholder(dcf.bool, ())
    x = dcf.placeholder(dcf.float64, ())

    def taken():
        with dcf.control_dependencies([x]):
            return x + dcf.random_uniform((), dtype=dcf.float64, seed=526)

    y = dcf.cond(p, taken, lambda: x)
    first = np.random.default_rng(526).random(dtype=np.float64)
    with dcf.Session(config=compiled) as sess:
        assert sess.run(y, {p: False, x: 0.0}) == 0.0
        assert sess.run(y, {p: True, x: 0.0}) == first


def test_scatter_update_of_fed_rows_into_a_gpu_variable_every_run(fake_gpus):
    # needs /tmp/review5/patches/paths-1.patch (dcf/actors/gpu_actor.py): from the second
    # run on the rows arrive as a host array, and the scatter ran on the host, where it
    # cannot write them into the variable's device buffer
    with dcf.device("/gpu:1"):
        b = dcf.Variable(np.array([0.1, 0.2, 0.3, 0.4]), name="b")
    x = dcf.placeholder(dcf.float64, ())
    with dcf.device("/gpu:1"):
        t = b.scatter_update([1], dcf.reshape(x * 0.5, (1,)))
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        for k in range(3):
            np.testing.assert_allclose(sess.run(t, {x: float(k)}), [0.1, 0.5 * k, 0.3, 0.4])
        np.testing.assert_allclose(sess.run(b), [0.1, 1.0, 0.3, 0.4])
