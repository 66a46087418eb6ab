"""One behaviour test per evaluation rule of the tagged-token executor (paper section 4,
figure "evaluation rules"), on small graphs built with cond / while_loop.

Values are checked on both execution paths (the `compiled` fixture). Timeline
assertions use `RunOptions(trace=True)`, which always runs the tagged-token executor
and records `(device, op name, op type, frame, iteration, t0, t1)` per fired node.
"""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError
from dcf.executor import Executor
from dcf.ops.control_ops import merge, switch


def _events(trace, *, name=None, type_=None, frame=None, device=None):
    return [
        e
        for e in trace
        if (name is None or e[1] == name)
        and (type_ is None or e[2] == type_)
        and (frame is None or e[3] == frame)
        and (device is None or e[0] == device)
    ]


def _names(trace):
    return [e[1] for e in trace]


def _py_scalar(fn, inputs, dtype, name=None):
    """A py_func computing a scalar of `dtype`, with a static scalar shape."""
    return dcf.reshape(dcf.py_func(fn, list(inputs), dtype, name=name), [])


def _counting_py_func(calls: list, tag: str):
    """A py_func passing its float32 scalar input through and recording each call."""

    def fn(x):
        calls.append(tag)
        return x

    return lambda x: _py_scalar(fn, [x], dcf.float32, name=f"count_{tag}")


def _overlap(events) -> int:
    """The most iterations whose [first event, last event] spans overlap in trace order."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, e in enumerate(events):
        first.setdefault(e[4], k)
        last[e[4]] = k
    return max(
        (sum(1 for it in first if first[it] <= k <= last[it]) for k in range(len(events))),
        default=0,
    )


# ----------------------------------------------------------------------- Merge
def test_merge_fires_on_first_live_input(compiled, run_graph):
    """Two live inputs (which cond/while lowering never makes): the tagged-token executor
    forwards the one that arrives first. Which arrives first is a matter of schedule,
    so on the straight-line path any live input with its matching index is legal."""
    fast = dcf.constant(1.0, name="fast")
    slow = dcf.constant(2.0, name="slow")
    for k in range(3):
        slow = dcf.identity(slow, name=f"slow_chain_{k}")
    value, index = merge([slow, fast], name="m")
    got = run_graph([value, index], config=compiled)
    assert got in ([1.0, 1], [2.0, 0])
    if not compiled.compile_frames:
        assert got == [1.0, 1]
    (v, i), trace = run_graph([value, index], trace=True)
    assert (v, i) == (1.0, 1)
    names = _names(trace)
    assert names.count("m") == 1, "Merge fires once, on the first live input only"
    assert names.index("m") < names.index("slow_chain_2"), (
        "Merge did not wait for its other (later) live input"
    )


@pytest.mark.parametrize("pred", [True, False])
def test_merge_forwards_the_live_input_of_a_cond_in_a_loop(pred, compiled, run_graph):
    p = dcf.placeholder(dcf.bool, (), name="p")

    def body(i, acc):
        x = dcf.cast(i, dcf.float32)
        return i + 1, acc + dcf.cond(p, lambda: x * 10.0, lambda: -x)

    _, acc = dcf.while_loop(lambda i, a: i < 4, body, (0, 0.0))
    got = run_graph(acc, {p: pred}, config=compiled)
    assert got == (60.0 if pred else -6.0)


@pytest.mark.parametrize("in_loop", [False, True], ids=["root", "in_loop"])
def test_merge_is_dead_only_if_all_inputs_dead(in_loop, compiled, run_graph):
    """A cond nested in the untaken branch of another: both inputs of the inner Merge
    are dead, so it emits dead, and nothing after it in that branch computes."""
    calls: list = []
    after_inner = _counting_py_func(calls, "after_inner")
    p = dcf.placeholder(dcf.bool, (), name="p")
    x = dcf.constant(2.0)

    def outer(v):
        def taken_when_p():
            inner = dcf.cond(v > 0.0, lambda: v + 1.0, lambda: v - 1.0, name="inner")
            return after_inner(inner)

        return dcf.cond(p, taken_when_p, lambda: v * 10.0, name="outer")

    if in_loop:
        _, out = dcf.while_loop(
            lambda i, a: i < 3, lambda i, a: (i + 1, a + outer(a + x)), (0, 0.0)
        )
        want_false, want_true = 20.0 + 220.0 + 2420.0, 3.0 + 6.0 + 12.0
    else:
        out = outer(x)
        want_false, want_true = 20.0, 3.0
    assert run_graph(out, {p: False}, config=compiled) == pytest.approx(want_false)
    assert calls == []
    assert run_graph(out, {p: True}, config=compiled) == pytest.approx(want_true)
    assert len(calls) == (3 if in_loop else 1)

    calls.clear()
    _, trace = run_graph(out, {p: False}, trace=True)
    inner_merge = [e for e in trace if e[2] == "Merge" and "inner" in e[1]]
    assert inner_merge, "the inner Merge fired (dead) in the untaken branch"
    assert _events(trace, type_="PyFunc"), "the py_func after it fired dead ..."
    assert calls == [], "... without being called"


def test_merge_of_dead_inputs_is_dead_and_of_one_live_input_is_live(compiled, run_graph):
    p = dcf.constant(False)
    _, a_true = switch(dcf.constant(1.0), p)
    b_false, b_true = switch(dcf.constant(2.0), p)
    all_dead, _ = merge([a_true, b_true], name="all_dead")
    one_live, idx = merge([a_true, b_false], name="one_live")
    assert run_graph([one_live, idx], config=compiled) == [2.0, 1]
    with pytest.raises(InvalidArgumentError, match=r"fetch all_dead:0 is dead"):
        run_graph(all_dead, config=compiled)


# ------------------------------------------------------------------ dead inputs
@pytest.mark.parametrize("pred", [True, False])
def test_untaken_branch_py_func_is_never_called(pred, compiled, run_graph):
    calls: list = []
    p = dcf.placeholder(dcf.bool, ())
    x = dcf.constant(3.0)
    out = dcf.cond(
        p,
        lambda: _counting_py_func(calls, "t")(x) + 1.0,
        lambda: _counting_py_func(calls, "f")(x) - 1.0,
    )
    loop_out = dcf.while_loop(
        lambda i, a: i < 5,
        lambda i, a: (
            i + 1,
            a
            + dcf.cond(
                p,
                lambda: _counting_py_func(calls, "lt")(a),
                lambda: _counting_py_func(calls, "lf")(a) + 1.0,
            ),
        ),
        (0, 1.0),
    )[1]
    got = run_graph([out, loop_out], {p: pred}, config=compiled)
    if pred:
        assert got == [4.0, 32.0]
        assert sorted(calls) == ["lt"] * 5 + ["t"]
    else:
        assert got == [2.0, 63.0]
        assert sorted(calls) == ["f"] + ["lf"] * 5


def test_op_with_one_dead_input_emits_dead_without_computing(compiled, run_graph):
    calls: list = []

    def add(a, b):
        calls.append((a, b))
        return a + b

    p = dcf.placeholder(dcf.bool, ())
    x_false, x_true = switch(dcf.constant(1.0), p)
    live = dcf.constant(5.0, name="live")
    y = _py_scalar(add, [x_true, live], dcf.float32, name="add_py")
    out, _ = merge([y, x_false], name="out")
    (v,), trace = run_graph([out], {p: False}, trace=True)
    assert v == 1.0
    assert _events(trace, name="add_py"), "the op fired"
    assert calls == [], "but with a dead input it did not compute"
    assert run_graph(out, {p: True}, config=compiled) == 6.0 and calls == [(1.0, 5.0)]


# ------------------------------------------------------------------------ Switch
@pytest.mark.parametrize("pred", [True, False])
def test_switch_routes_data_to_the_output_the_pred_selects(pred, compiled, run_graph):
    p = dcf.placeholder(dcf.bool, ())
    data = dcf.constant([1.0, 2.0])
    out_false, out_true = switch(data, p, name="sw")
    live, dead = (out_true, out_false) if pred else (out_false, out_true)
    np.testing.assert_array_equal(run_graph(live, {p: pred}, config=compiled), [1.0, 2.0])
    with pytest.raises(InvalidArgumentError, match=rf"fetch {dead.name} is dead"):
        run_graph(dead, {p: pred}, config=compiled)


def test_switch_in_a_loop_routes_each_iteration_by_its_own_pred(compiled, run_graph):
    branches: list = []

    def log(tag):
        def fn(x):
            branches.append(tag)
            return x

        return lambda x: _py_scalar(fn, [x], dcf.int32)

    def body(i, acc):
        v = dcf.cond(dcf.equal(i % 2, 0), lambda: log("even")(i), lambda: log("odd")(-i * 10))
        return i + 1, acc + v

    _, acc = dcf.while_loop(lambda i, a: i < 5, body, (0, 0), parallel_iterations=1)
    assert run_graph(acc, config=compiled) == 0 + 2 + 4 - 10 - 30
    assert branches == ["even", "odd", "even", "odd", "even"]


# ------------------------------------------------------------------------ Enter
def test_enter_creates_frame_and_loop_constants_visible_in_every_iteration(compiled, run_graph):
    c = dcf.placeholder(dcf.float32, (), name="c")
    _, acc = dcf.while_loop(
        lambda i, a: i < 5,
        lambda i, a: (i + 1, a + c * dcf.cast(i, dcf.float32)),
        (0, 0.0),
        name="loop",
    )
    assert run_graph(acc, {c: 3.0}, config=compiled) == 3.0 * (0 + 1 + 2 + 3 + 4)

    _, trace = run_graph(acc, {c: 3.0}, trace=True)
    const_enter = [e for e in _events(trace, type_="Enter") if e[1].startswith("loop/Enter")]
    # two loop-variable Enters and one loop-constant Enter, each fired once in the root
    assert len(const_enter) == 3 and {e[3] for e in const_enter} == {""}
    first_in_frame = next(k for k, e in enumerate(trace) if e[3] == "loop")
    first_enter = next(k for k, e in enumerate(trace) if e[2] == "Enter")
    assert first_enter < first_in_frame, "nothing runs in the frame before an Enter creates it"
    muls = _events(trace, type_="Mul", frame="loop")
    # iterations 0-4 compute with the constant; iteration 5 (the exit) fires dead
    assert [e[4] for e in muls] == [0, 1, 2, 3, 4, 5], "the constant reached every iteration"


# ------------------------------------------------------------------ NextIteration
def test_next_iteration_moves_values_to_iteration_n_plus_1(compiled, run_graph):
    seen: list = []

    def rec(i):
        seen.append(int(i))
        return i

    def body(i):
        return _py_scalar(rec, [i], dcf.int32) + 1

    out = dcf.while_loop(lambda i: i < 4, body, 0, name="loop")
    assert run_graph(out, config=compiled) == 4
    assert seen == [0, 1, 2, 3]

    _, trace = run_graph(out, trace=True)
    nexts = _events(trace, type_="NextIteration", frame="loop")
    merges = _events(trace, type_="Merge", frame="loop")
    # iteration 4 is the exit: its NextIteration fires dead and starts nothing
    assert [e[4] for e in nexts] == [0, 1, 2, 3, 4]
    assert [e[4] for e in merges] == [0, 1, 2, 3, 4]
    for n in nexts[:-1]:  # the value sent at iteration k arrives at iteration k + 1
        assert trace.index(n) < trace.index(merges[n[4] + 1])


# --------------------------------------------------------------------------- Exit
def test_dead_exits_of_a_finished_loop_produce_no_outputs(compiled, run_graph):
    calls: list = []
    after = _counting_py_func(calls, "after")
    _, acc = dcf.while_loop(
        lambda i, a: i < 4, lambda i, a: (i + 1, a + 1.0), (0, 0.0), name="loop"
    )
    out = after(acc)
    assert run_graph(out, config=compiled) == 4.0
    assert calls == ["after"]

    calls.clear()
    _, trace = run_graph(out, trace=True)
    exits = _events(trace, name="loop/Exit_1")
    assert [e[4] for e in exits] == [0, 1, 2, 3, 4], "Exit fired in every iteration ..."
    assert calls == ["after"] and len(_events(trace, type_="PyFunc")) == 1, (
        "... but only the last (live) one reached the consumer"
    )


@pytest.mark.parametrize("pred", [True, False])
def test_loop_in_untaken_branch_exits_dead_and_cond_returns_other_branch(pred, compiled, run_graph):
    calls: list = []
    p = dcf.placeholder(dcf.bool, ())
    n = dcf.constant(5)

    def with_loop():
        _, acc = dcf.while_loop(
            lambda i, a: i < n,
            lambda i, a: (i + 1, _counting_py_func(calls, "body")(a) + 2.0),
            (0, 1.0),
        )
        return _counting_py_func(calls, "after")(acc)

    out = dcf.cond(p, with_loop, lambda: dcf.constant(-1.0))
    assert run_graph(out, {p: pred}, config=compiled) == (11.0 if pred else -1.0)
    assert calls == (["body"] * 5 + ["after"] if pred else [])


# ------------------------------------------------------------------ frame lifetime
def _plan_of(sess: dcf.Session, fetch):
    ((_, plan, _, _),) = sess._async._plan([fetch], [], fetch).parts
    return plan


def _live_iterations(frame) -> int:
    return len(frame.iters) + sum(
        _live_iterations(c) for c in frame.children.values() if hasattr(c, "iters")
    )


def test_frames_and_iterations_are_freed_after_a_run(compiled):
    def inner(i, x):
        return dcf.while_loop(lambda j, y: j < i, lambda j, y: (j + 1, y + 1.0), (0, x))[1]

    _, out = dcf.while_loop(lambda i, x: i < 4, lambda i, x: (i + 1, inner(i, x)), (0, 0.0))
    with dcf.Session(config=compiled) as sess:
        plan = _plan_of(sess, out)
    ex = Executor(plan, compiled=compiled.compile_frames)
    ex.start([])
    peak = 0
    while not ex.done:
        assert ex.run(budget=4) > 0, "stalled with nothing ready"
        peak = max(peak, _live_iterations(ex.root))
    assert ex.results == [6.0]
    if not compiled.compile_frames:
        assert peak > 2, "frames and iterations existed while the loops ran"
    assert ex.root.children == {}, "no child frame outlives the run"
    assert list(ex.root.iters) == [0] and ex.root_ist.outstanding == 0
    assert not ex.ready and not ex.outbox


def test_compiled_fixture_really_compiles_single_device_frames(compiled):
    """The `compiled` fixture is not vacuous: frames on one device become CompiledFrames
    under compile_frames=True; frames that hold Send/Recv always stay tagged-token."""
    _, local = dcf.while_loop(
        lambda i, x: i < 3, lambda i, x: (i + 1, x * 2.0), (0, 1.0), name="local"
    )
    with dcf.Session(config=compiled) as sess:
        frames = _plan_of(sess, local).frames
    assert (frames["local"].compiled is not None) == compiled.compile_frames

    def split_body(i, x):
        with dcf.device("/cpu:1"):
            return i + 1, x * 2.0

    _, split = dcf.while_loop(lambda i, x: i < 3, split_body, (0, 1.0), name="split")
    with dcf.Session(config=compiled) as sess:
        parts = sess._async._plan([split], [], split).parts
    assert len(parts) == 2
    assert all(plan.frames["split"].compiled is None for _, plan, _, _ in parts)


@pytest.mark.parametrize("pi", [1, 3])
def test_executor_never_holds_more_than_parallel_iterations(pi):
    def body(i, x):
        y = x
        for _ in range(5):
            y = dcf.sin(y) + 1.0
        return i + 1, y

    _, out = dcf.while_loop(lambda i, x: i < 10, body, (0, 0.5), parallel_iterations=pi)
    with dcf.Session(config=dcf.SessionConfig(compile_frames=False)) as sess:
        plan = _plan_of(sess, out)
    ex = Executor(plan, compiled=False)
    ex.start([])
    peak, parked = 0, 0
    while not ex.done:
        assert ex.run(budget=1) == 1
        for fr in ex.root.children.values():
            peak = max(peak, len(fr.iters))
            parked = max(parked, len(fr.parked))
    assert peak == pi, "iterations ran up to the bound and never past it"
    assert parked > 0, "NextIteration values waited for an iteration to retire"


# ----------------------------------------------------------- parallel_iterations
def _slow_chain_loop(parallel_iterations: int, split: bool):
    def body(i, x):
        with dcf.device("/cpu:1" if split else None):
            y = x
            for _ in range(8):
                y = dcf.sin(y) + 1.0
        return i + 1, y

    return dcf.while_loop(
        lambda i, x: i < 12,
        body,
        (0, dcf.constant(0.5)),
        parallel_iterations=parallel_iterations,
        name="loop",
    )


@pytest.mark.parametrize("split", [False, True], ids=["one_device", "two_devices"])
@pytest.mark.parametrize("pi", [1, 2, 4, 32])
def test_parallel_iterations_bounds_live_iterations(pi, split, run_graph):
    out, trace = run_graph(_slow_chain_loop(pi, split), trace=True)
    assert out[0] == 12
    devices = ["/cpu:0", "/cpu:1"] if split else ["/cpu:0"]
    for dev in devices:
        body = _events(trace, frame="loop", device=dev)
        assert body
        assert _overlap(body) <= pi, f"more than {pi} iterations live on {dev}"
        if pi == 1:
            its = [e[4] for e in body]
            assert its == sorted(its), "with parallel_iterations=1 iterations never interleave"
    if pi == 32:
        assert _overlap(_events(trace, frame="loop", device="/cpu:0")) > 1, (
            "independent loop variables let iterations run ahead"
        )


@pytest.mark.parametrize("split", [False, True], ids=["one_device", "two_devices"])
@pytest.mark.parametrize("pi", [1, 32])
def test_stateful_ops_keep_iteration_order(pi, split, compiled, run_graph):
    """The py_func's input is slow in even iterations (a long chain, on another device
    when split) and immediate in odd ones, yet its calls follow iteration order."""
    log: list = []

    def rec(i, _):
        log.append(int(i))
        return i

    def body(i, x):
        def slow():
            with dcf.device("/cpu:1" if split else None):
                y = x
                for _ in range(6):
                    y = dcf.sin(y) + 1.0
                return y

        v = dcf.cond(dcf.equal(i % 2, 0), slow, lambda: x)
        j = _py_scalar(rec, [i, v], dcf.int32)
        return j + 1, v

    out = dcf.while_loop(lambda i, x: i < 16, body, (0, dcf.constant(0.5)), parallel_iterations=pi)
    assert run_graph(out, config=compiled)[0] == 16
    assert log == list(range(16))


def _nested_counter_loop(outer_pi: int, inner_trips: int, *, dequeue=None):
    """An outer loop of 4 iterations whose body runs an inner loop of assign_adds on one
    counter; each outer iteration records the values its inner loop's assigns returned."""
    w = dcf.Variable(0, name="w")

    def outer(i, ta):
        def inner(j, tb):
            return j + 1, tb.write(j, w.assign_add(1))

        _, tb = dcf.while_loop(lambda j, tb: j < inner_trips, inner,
                               (0, dcf.TensorArray(dcf.int32, size=inner_trips)))
        with dcf.control_dependencies([dequeue()] if dequeue else []):
            return i + 1, ta.write(i, tb.stack())

    _, ta = dcf.while_loop(lambda i, ta: i < 4, outer, (0, dcf.TensorArray(dcf.int32, size=4)),
                           parallel_iterations=outer_pi)
    return ta.stack(), w


@pytest.mark.parametrize("outer_pi", [2, 32])
@pytest.mark.parametrize("traced", [False, True], ids=["untraced", "traced"])
def test_stateful_ops_of_a_nested_loop_keep_the_outer_iteration_order(outer_pi, traced,
                                                                      compiled):
    """An inner loop of outer iteration k+1 ran its assigns between those of iteration k's
    (the tagged-token executor ordered each loop instance's own iterations only)."""
    out, w = _nested_counter_loop(outer_pi, 3)
    opts = dcf.RunOptions(trace=True) if traced else None
    with dcf.Session(config=compiled) as sess:
        sess.run(w.initializer)
        got = sess.run(out, options=opts)
    np.testing.assert_array_equal(got, np.arange(1, 13).reshape(4, 3))


def test_a_compiled_nested_loop_keeps_the_order_of_an_executor_run_outer_loop(monkeypatch):
    """A dequeue keeps the outer frame on the executor; its compiled inner loops ran
    interleaved whenever one handed the event loop back."""
    import dcf.frame_compiler as fc

    monkeypatch.setattr(fc, "_YIELD_S", 0.0)   # hand back at every check
    q = dcf.FIFOQueue(8, [dcf.int32], shapes=[()])
    n = 1000
    out, w = _nested_counter_loop(32, n, dequeue=q.dequeue)
    with dcf.Session() as sess:
        sess.run([w.initializer, q.enqueue_many([np.arange(4, dtype=np.int32)])])
        got = sess.run(out)
    np.testing.assert_array_equal(got, np.arange(1, 4 * n + 1).reshape(4, n))


# ------------------------------------------------- ops that read only loop constants
@pytest.mark.parametrize("trips", [0, 3])
def test_op_using_only_loop_constants_runs_once_per_iteration(trips, compiled, run_graph):
    """A body op whose inputs are all loop constants is tied to the iteration (TF's
    _MaybeAddControlDependency): it must not also run in the exit iteration."""
    calls: list = []
    c = dcf.constant(1.0)
    n = dcf.placeholder(dcf.int32, ())
    seen = _counting_py_func(calls, "const_only")

    def body(i):
        return i + 1 + dcf.cast(seen(c), dcf.int32) * 0

    assert run_graph(dcf.while_loop(lambda i: i < n, body, 0), {n: trips}, config=compiled) == trips
    assert len(calls) == trips


@pytest.mark.parametrize("mixed", [False, True], ids=["all_constant", "one_constant"])
@pytest.mark.parametrize("trips", [0, 3])
def test_inner_loop_entered_with_loop_constants_runs_once_per_iteration(trips, mixed,
                                                                        compiled):
    """An inner loop whose loop vars start from the outer loop's constants ran in the outer
    loop's exit iteration too (TF ties such an Enter to the outer pivot): its assigns
    counted one outer iteration more than ran."""
    w = dcf.Variable(0, name="w")
    x0 = dcf.constant(0)
    n = dcf.placeholder(dcf.int32, ())

    def outer(i, s):
        def inner(j, t):
            with dcf.control_dependencies([w.assign_add(1)]):
                return j + 1, t + 1
        # with `mixed`, only j (which the inner cond reads) starts from a loop constant
        j, t = dcf.while_loop(lambda j, t: j < 2, inner, (x0, s if mixed else x0))
        return i + 1, s + j + t * 0

    out = dcf.while_loop(lambda i, s: i < n, outer, (0, 0))
    traced = dcf.RunOptions(trace=True)
    for opts in (None, traced):
        with dcf.Session(config=compiled) as sess:
            sess.run(w.initializer)
            assert sess.run(out, {n: trips}, options=opts) == (trips, 2 * trips)
            assert sess.run(w) == 2 * trips


def test_body_returning_a_captured_tensor_as_a_loop_var(compiled):
    """Its NextIteration reads only a loop constant; live in the exit iteration it would
    start an iteration that never ends."""
    c = dcf.constant(5.0)
    out = dcf.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, c), (0, 0.0))
    with dcf.Session(config=compiled) as sess:
        assert sess.run(out, options=dcf.RunOptions(timeout_s=1.0)) == (3, 5.0)
