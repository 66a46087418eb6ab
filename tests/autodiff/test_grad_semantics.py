"""What gradients() promises besides the numbers: zeros vs None, stop_gradient,
grad_ys, user-registered gradients, error messages, back_prop=False, no
recomputation (one push per saved value per iteration), and that building gradients
only adds ops."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import dcf
from dcf.autodiff.loop_state import saved_stacks
from dcf.ops.registry import GRADIENTS
from tests.autodiff.gradcheck import run

F64 = dcf.float64


def _py_func(fn, inputs, name=None):
    """A float64 py_func (unknown static shape)."""
    return dcf.py_func(fn, list(inputs), F64, name=name)


# ------------------------------------------------------------------ zeros vs None
@pytest.mark.parametrize("pred", [True, False])
def test_x_used_only_in_untaken_branch_gets_zeros_not_none(compiled, pred):
    p = dcf.placeholder(dcf.bool, ())
    x = dcf.placeholder(F64, (2, 3))
    z = dcf.placeholder(F64, (2, 3))
    y = dcf.cond(p, lambda: dcf.sin(z), lambda: x * z)
    gx, gz = dcf.gradients(dcf.reduce_sum(y), [x, z])
    assert gx is not None and gz is not None
    x_np, z_np = np.full((2, 3), 2.0), np.full((2, 3), 0.5)
    a, b = run([gx, gz], {p: pred, x: x_np, z: z_np}, compiled)
    if pred:
        np.testing.assert_array_equal(a, np.zeros((2, 3)))
        np.testing.assert_allclose(b, np.cos(z_np))
    else:
        np.testing.assert_allclose(a, z_np)
        np.testing.assert_allclose(b, x_np)


def test_x_used_only_in_cond_inside_loop_untaken_every_iteration_gets_zeros(compiled):
    x = dcf.placeholder(F64, ())
    w = dcf.placeholder(F64, ())

    def body(i, a):
        return i + 1, dcf.cond(a > -100.0, lambda: a * 2.0, lambda: a * w)
    out = dcf.while_loop(lambda i, a: i < 3, body, (0, x))[1]
    gx, gw = dcf.gradients(out, [x, w])
    assert gw is not None
    a, b = run([gx, gw], {x: 1.0, w: 5.0}, compiled)
    assert a == 8.0 and b == 0.0


def test_gradient_is_none_without_a_path(compiled):
    x = dcf.placeholder(F64, (3,))
    u = dcf.placeholder(F64, (3,))
    i = dcf.placeholder(dcf.int32, ())
    loop = dcf.while_loop(lambda k, a: k < 3, lambda k, a: (k + 1, a * 2.0), (0, x))[1]
    y = dcf.reduce_sum(loop) + dcf.cast(i, F64)
    gx, gu, gi = dcf.gradients(y, [x, u, i])
    assert gu is None      # not connected at all
    assert gi is None      # integer input: no gradient flows through Cast from int
    np.testing.assert_allclose(run(gx, {x: np.ones(3), i: 2}, compiled), np.full(3, 8.0))


def test_value_only_a_loop_predicate_reads_gets_none(compiled):
    # a threshold (a tensor, a Variable) compared with the counter decides the trip
    # count, but a comparison carries no gradient: None, as in TF1, not zeros -- also
    # from a loop nested in another
    limit = dcf.placeholder(F64, ())
    v = dcf.Variable(np.float64(2.0), name="v")
    w = dcf.placeholder(F64, ())

    def inner(a):
        return dcf.while_loop(lambda j, b: dcf.cast(j, F64) < limit + v.read_value(),
                              lambda j, b: (j + 1, b * w), (0, a))[1]
    flat = inner(dcf.constant(1.0, F64))
    nested = dcf.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, inner(a)),
                            (0, dcf.constant(1.0, F64)))[1]
    g_limit, g_v, g_w = dcf.gradients(flat, [limit, v, w])
    n_limit, n_v, n_w = dcf.gradients(nested, [limit, v, w])
    assert g_limit is None and g_v is None and n_limit is None and n_v is None
    with dcf.Session(config=compiled) as sess:
        sess.run(dcf.global_variables_initializer())
        got = sess.run([g_w, n_w], {limit: 1.0, w: 1.5})
    np.testing.assert_allclose(got, [3 * 1.5 ** 2, 6 * 1.5 ** 5])   # w^3, w^6


def test_stop_gradient_blocks_gradient_inside_loop(compiled):
    x = dcf.placeholder(F64, ())
    w = dcf.placeholder(F64, ())

    def body(i, a):
        return i + 1, a * dcf.stop_gradient(w) + dcf.stop_gradient(a) * 0.0 + w
    out = dcf.while_loop(lambda i, a: i < 2, body, (0, x))[1]
    gx, gw = dcf.gradients(out, [x, w])
    # out = (x*w + w)*w + w with the multiplying w constant: d/dw = 1*w + 1, d/dx = w*w
    a, b = run([gx, gw], {x: 1.5, w: 3.0}, compiled)
    assert a == 9.0 and b == 4.0
    assert dcf.gradients(dcf.stop_gradient(x) * 2.0, [x]) == [None]


def test_grad_ys_weights_each_output(compiled, rng):
    x = dcf.placeholder(F64, (2, 2))
    y1 = dcf.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a * a), (0, x))[1]
    y2 = x * 3.0
    c1, c2 = rng.standard_normal((2, 2)), rng.standard_normal((2, 2))
    g1, g2 = dcf.placeholder(F64, (2, 2)), dcf.placeholder(F64, (2, 2))
    (gx,) = dcf.gradients([y1, y2], [x], grad_ys=[g1, g2])
    x_np = rng.uniform(0.5, 1.0, (2, 2))
    got = run(gx, {x: x_np, g1: c1, g2: c2}, compiled)
    np.testing.assert_allclose(got, c1 * 4 * x_np ** 3 + 3 * c2, rtol=1e-12)
    with pytest.raises(ValueError, match="2 ys but 1 grad_ys"):
        dcf.gradients([y1, y2], [x], grad_ys=[g1])


# ------------------------------------------------------------- registered grads
def test_register_gradient_overrides_builtin_inside_loop(compiled):
    old = GRADIENTS["Sin"]
    try:
        @dcf.RegisterGradient("Sin")
        def _doubled(op, g):
            return [g * 2.0]
        x = dcf.placeholder(F64, ())
        out = dcf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, dcf.sin(a)), (0, x))[1]
        (gx,) = dcf.gradients(out, [x])
        assert run(gx, {x: 0.3}, compiled) == 8.0
    finally:
        GRADIENTS["Sin"] = old
    (gx2,) = dcf.gradients(dcf.sin(x), [x])
    np.testing.assert_allclose(run(gx2, {x: 0.3}, compiled), np.cos(0.3))


def test_register_gradient_for_py_func(compiled):
    old = GRADIENTS.get("PyFunc", "absent")
    try:
        @dcf.RegisterGradient("PyFunc")
        def _cube_grad(op, g):
            return [g * 3.0 * op.inputs[0] * op.inputs[0]]
        x = dcf.placeholder(F64, ())

        def body(i, a):
            return i + 1, dcf.reshape(_py_func(lambda v: v ** 3, [a]), [])
        out = dcf.while_loop(lambda i, a: i < 2, body, (0, x))[1]
        (gx,) = dcf.gradients(out, [x])
        np.testing.assert_allclose(run(gx, {x: 0.9}, compiled), 9 * 0.9 ** 8)
    finally:
        if old == "absent":
            del GRADIENTS["PyFunc"]
        else:
            GRADIENTS["PyFunc"] = old


def _no_grad_op(x, name):
    """An op type with a kernel but no registered gradient (unlike PyFunc, which TF 1 and
    dcf declare not differentiable)."""
    from dcf.ops.registry import OPS, OpDef, apply, register

    if "TestNoGradient" not in OPS:
        register(OpDef("TestNoGradient", infer=lambda t: t, kernel=lambda xp, v: v))
    return apply("TestNoGradient", [x], name=name)


def test_op_without_gradient_raises_lookup_error_naming_type_and_op():
    x = dcf.placeholder(F64, ())
    y = _no_grad_op(x, name="my_env_step")
    with pytest.raises(LookupError, match=r"no gradient registered for op type 'TestNoGradient' "
                       r"\(op 'my_env_step'\)\.\n  Wrap its output in dcf\.stop_gradient, "
                       r"or register one with @dcf\.RegisterGradient\(\"TestNoGradient\"\)\."):
        dcf.gradients(y, [x])
    assert dcf.gradients(dcf.stop_gradient(y) * x, [x])[0] is not None


def test_op_without_gradient_inside_loop_raises_lookup_error():
    x = dcf.placeholder(F64, ())

    def body(i, a):
        return i + 1, _no_grad_op(a, name="envstep")
    out = dcf.while_loop(lambda i, a: i < 2, body, (0, x))[1]
    with pytest.raises(LookupError, match=r"op type 'TestNoGradient' \(op 'while/envstep'\)"):
        dcf.gradients(out, [x])


def test_py_func_is_not_differentiable_like_tf1():
    x = dcf.placeholder(F64, ())
    y = dcf.reshape(_py_func(np.sin, [x]), [])
    assert dcf.gradients(y, [x]) == [None]
    (g,) = dcf.gradients(y * x, [x])
    assert g is not None


# ------------------------------------------------------------------ back_prop=False
def test_back_prop_false_loop_raises_when_differentiated_and_saves_nothing():
    g = dcf.get_default_graph()
    x = dcf.placeholder(F64, (2,))
    out = dcf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, dcf.tanh(a) * 2.0), (0, x),
                         back_prop=False, name="nobp")[1]
    n_ops = len(g.get_operations())
    with pytest.raises(ValueError, match=r"while_loop 'nobp' was built with back_prop=False; "
                       r"it cannot be differentiated"):
        dcf.gradients(dcf.reduce_sum(out), [x])
    assert saved_stacks(g) == []
    assert not any(op.type in ("StackPushV2", "StackPopV2")
                   for op in g.get_operations()[:n_ops])


def test_back_prop_false_loop_off_the_gradient_path_is_fine(compiled):
    g = dcf.get_default_graph()
    x = dcf.placeholder(F64, ())
    c = dcf.placeholder(F64, ())
    scale = dcf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * 2.0), (0, c),
                           back_prop=False)[1]
    diff = dcf.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, dcf.sin(a)), (0, x))[1]
    (gx,) = dcf.gradients(diff * scale, [x])
    stacks = saved_stacks(g)
    assert stacks and all(not s.name.startswith("while/") and "while_1" in
                          s.attrs["stack_name"] for s in stacks)
    want = 8.0 * np.cos(np.sin(0.4)) * np.cos(0.4)
    np.testing.assert_allclose(run(gx, {x: 0.4, c: 1.0}, compiled), want)


# ---------------------------------------------------------------- no recompute
N_ITERS = 5


def test_forward_values_are_saved_once_per_iteration_not_recomputed(compiled):
    calls = []

    def counted(a):
        calls.append(1)
        return np.float64(1.5)

    x0 = dcf.placeholder(F64, (3, 3))
    w = dcf.placeholder(F64, (3, 3))

    def body(i, x):
        s = dcf.stop_gradient(dcf.reshape(_py_func(counted, [x], name="counted"), []))
        return i + 1, dcf.tanh(x @ w) * s   # the gradient needs s, tanh(x @ w) and x
    _, x = dcf.while_loop(lambda i, x: i < N_ITERS, body, (0, x0), name="fwd")
    (gw,) = dcf.gradients(dcf.reduce_sum(x), [w])
    g = dcf.get_default_graph()
    pushes = [op for op in g.get_operations() if op.type == "StackPushV2"]
    assert len(pushes) == len(saved_stacks(g)) == 3
    md = dcf.RunMetadata()
    with dcf.Session(config=compiled) as sess:
        sess.run(gw, {x0: np.eye(3) * 0.1, w: np.eye(3) * 0.5},
                 options=dcf.RunOptions(trace=True), run_metadata=md)
    assert len(calls) == N_ITERS                 # the py_func ran once per iteration
    if not md.trace:
        pytest.skip("this execution path records no per-op trace")
    per = collections.Counter((e[1], e[3], e[4]) for e in md.trace)
    # every forward op and every push fires once per iteration: never twice
    assert max(per.values()) == 1, [k for k, v in per.items() if v > 1]
    by_name = collections.defaultdict(list)
    for name, frame, it in per:
        by_name[name].append((frame, it))
    for p in pushes:
        frames_its = sorted(by_name[p.name])
        # iterations 0..N-1 push; iteration N is the dead exit iteration
        assert frames_its == [("fwd", k) for k in range(N_ITERS + 1)], frames_its
    # forward compute never runs in the backward frame
    grad_types = {e[2] for e in md.trace if e[3] and e[3] != "fwd"}
    assert not grad_types & {"Tanh", "PyFunc"}, grad_types
    assert {e[3] for e in md.trace if e[2] in ("Tanh", "PyFunc")} == {"fwd"}


def test_nested_loop_pushes_once_per_inner_iteration(compiled):
    calls = []

    def counted(b):
        calls.append(1)
        return np.float64(1.0)
    x = dcf.placeholder(F64, ())

    def inner_body(j, b, a):
        s = dcf.stop_gradient(dcf.reshape(_py_func(counted, [b], name="counted"), []))
        return j + 1, dcf.sin(b) * a * s

    def outer(i, a):
        inner = dcf.while_loop(lambda j, b: j < 3, lambda j, b: inner_body(j, b, a),
                               (0, a), name="inner")[1]
        return i + 1, inner
    out = dcf.while_loop(lambda i, a: i < 2, outer, (0, x), name="outer")[1]
    (gx,) = dcf.gradients(out, [x])
    g = dcf.get_default_graph()
    md = dcf.RunMetadata()
    with dcf.Session(config=compiled) as sess:
        sess.run(gx, {x: 0.7}, options=dcf.RunOptions(trace=True), run_metadata=md)
    assert len(calls) == 2 * 3       # 2 outer iterations x 3 inner: nothing re-run
    if not md.trace:
        pytest.skip("this execution path records no per-op trace")
    per_name = collections.Counter(e[1] for e in md.trace)
    inner_pushes = [op.name for op in g.get_operations()
                    if op.type == "StackPushV2" and op.ctx.frame_name == "outer/inner"]
    assert inner_pushes
    # a saved inner value is pushed exactly when the op producing it fires
    for name in inner_pushes:
        assert per_name[name] == per_name["outer/inner/Sin"], (name, per_name[name])
    sin_frames = {e[3] for e in md.trace if e[2] in ("Sin", "PyFunc")}
    assert sin_frames == {"outer/inner"}


# ------------------------------------------------------------- only adds ops
def _snapshot(g):
    return [(op, op.type, tuple(op.inputs), tuple(op.control_inputs))
            for op in g.get_operations()]


def test_building_gradients_only_adds_ops(compiled, rng):
    g = dcf.get_default_graph()
    x = dcf.placeholder(F64, (2, 2))
    w = dcf.placeholder(F64, (2, 2))

    def body(i, a):
        a = dcf.cond(dcf.reduce_sum(a) > 0.0, lambda: dcf.tanh(a @ w), lambda: a * 0.5)
        inner = dcf.while_loop(lambda j, b: j < 2, lambda j, b: (j + 1, dcf.sin(b)), (0, a))[1]
        return i + 1, inner
    out = dcf.while_loop(lambda i, a: i < 3, body, (0, x))[1]
    loss = dcf.reduce_sum(out)
    feed = {x: rng.uniform(-1, 1, (2, 2)), w: rng.uniform(-1, 1, (2, 2))}
    before = _snapshot(g)
    with dcf.Session(config=compiled) as sess:
        first = sess.run(loss, feed)
        grads = dcf.gradients(loss, [x, w])
        after = _snapshot(g)
        assert after[:len(before)] == before     # same ops, same inputs, same order
        assert len(after) > len(before)
        assert sess.run(loss, feed) == first     # the session that ran the forward still works
        gv, again = sess.run([grads, loss], feed)
        assert again == first
        assert sess.run(loss, feed) == first
    with dcf.Session(config=compiled) as sess:
        np.testing.assert_allclose(sess.run(grads, feed), gv)


@pytest.mark.parametrize("where", ["while_loop", "cond"])
def test_gradients_called_in_a_body_says_so_even_for_xs_made_there(where):
    # an x made in the body used to be refused first, as "ys are outside the loop"
    x = dcf.placeholder(dcf.float32, ())

    def grad_of_square(v):
        sq = v * v
        (g,) = dcf.gradients(sq * 3.0, [sq])
        return g

    with pytest.raises(ValueError, match=r"gradients\(\) called inside .*call it outside"):
        if where == "while_loop":
            dcf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, grad_of_square(v)), (0, x))
        else:
            dcf.cond(x > 0.0, lambda: grad_of_square(x), lambda: x)
