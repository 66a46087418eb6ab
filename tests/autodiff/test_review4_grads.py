"""Review 4 of autodiff: Hessian-vector products through a cond whose one branch goes
through a TensorArray (or map_fn / scan) inside a while_loop; gradients w.r.t. xs that
lie on each other's path (each gets its total derivative, as TF1); and the refusal of an
x made inside a while_loop body. Values are checked against closed forms."""

from __future__ import annotations

import numpy as np
import pytest

import dcf

from tests.autodiff.gradcheck import OPTS

f64 = dcf.float64
XV = np.array([0.3, -0.7, 1.1])
V = np.array([1.0, 0.5, -2.0])
N = len(XV)


# ------------------------------------------- second order: TensorArray in a cond branch
# Each "array" branch computes a function of x through a TensorArray-based construct; the
# other branch is nonlinear (sin). Per kind: (build, f'(x), directional f'' applied to v).
def _ta(x):
    return dcf.TensorArray(f64, size=N).unstack(x * x).stack()           # x^2


def _map_fn(x):
    return dcf.map_fn(lambda e: e * e, x)                                  # x^2


def _scan(x):
    # running sums of x^2: the sum over them weighs x_j^2 by (N - j)
    return dcf.scan(lambda a, e: a + e * e, x, initializer=dcf.constant(0.0, f64))


_W = np.arange(N, 0, -1, dtype=np.float64)  # N - j
ARRAY_KINDS = {
    "tensor_array": (_ta, lambda x: 2 * x, lambda x, v: 2 * v),
    "map_fn": (_map_fn, lambda x: 2 * x, lambda x, v: 2 * v),
    "scan": (_scan, lambda x: 2 * _W * x, lambda x, v: 2 * _W * v),
}
SIN = (dcf.sin, np.cos, lambda x, v: -np.sin(x) * v)


@pytest.mark.parametrize("kind", sorted(ARRAY_KINDS))
@pytest.mark.parametrize("schedule", ["array_taken", "sin_taken", "alternating"])
def test_hvp_through_tensor_array_branch_of_cond_in_while(kind, schedule, compiled):
    """The shape a gradient needs of a branch's view of an input (its Switch output) is
    saved inside that branch: pushed and popped only on iterations that take it. (It
    was taken next to the Switch, outside the branch: dead on the other iterations, its
    push skipped, and the unconditional pop then found an empty stack.) x has no static
    length, so the shape is a runtime value that must be saved."""
    arr = ARRAY_KINDS[kind]
    trips = 1 if schedule != "alternating" else 3
    # which branch iteration i takes: the array one iff take(i)
    take = {"array_taken": lambda i: True, "sin_taken": lambda i: False,
            "alternating": lambda i: i % 2 == 0}[schedule]
    x = dcf.placeholder(f64, (None,))

    def body(i, a):
        if schedule == "alternating":
            pred = dcf.equal(i % 2, 0)
        else:
            pred = dcf.greater_equal(i, 0) if take(0) else dcf.less(i, 0)
        r = dcf.cond(pred, lambda: arr[0](x), lambda: SIN[0](x))
        return i + 1, a + dcf.reduce_sum(r)
    _, y = dcf.while_loop(lambda i, a: i < trips, body, (0, dcf.constant(0.0, f64)))
    g, = dcf.gradients(y, [x])
    hv, = dcf.gradients(dcf.reduce_sum(g * dcf.constant(V)), [x])
    want_g = sum(arr[1](XV) if take(i) else SIN[1](XV) for i in range(trips))
    want_hv = sum(arr[2](XV, V) if take(i) else SIN[2](XV, V) for i in range(trips))
    with dcf.Session(config=compiled) as s:
        got_g, got_hv = s.run([g, hv], {x: XV}, options=OPTS)
    np.testing.assert_allclose(got_g, want_g, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_hv, want_hv, rtol=1e-12, atol=1e-12)


def test_hvp_through_tensor_array_branch_with_static_shape(compiled):
    """The review's form (x of static length), both branches taken in turn."""
    x = dcf.placeholder(f64, (N,))

    def body(i, a):
        r = dcf.cond(dcf.equal(i % 2, 0), lambda: _ta(x), lambda: dcf.sin(x))
        return i + 1, a + dcf.reduce_sum(r)
    _, y = dcf.while_loop(lambda i, a: i < 2, body, (0, dcf.constant(0.0, f64)))
    g, = dcf.gradients(y, [x])
    hv, = dcf.gradients(dcf.reduce_sum(g * dcf.constant(V)), [x])
    with dcf.Session(config=compiled) as s:
        got_g, got_hv = s.run([g, hv], {x: XV}, options=OPTS)
    np.testing.assert_allclose(got_g, 2 * XV + np.cos(XV), rtol=1e-12)
    np.testing.assert_allclose(got_hv, 2 * V - np.sin(XV) * V, rtol=1e-12)


# ----------------------------------------------- xs on each other's path: total gradients
def _run(fetches, feed, config=None):
    with dcf.Session(config=config) as s:
        return s.run(fetches, feed, options=OPTS)


def test_gradients_wrt_x_and_a_tensor_computed_from_it():
    x = dcf.placeholder(f64, (N,))
    h = dcf.sin(x)
    y = dcf.reduce_sum(h * h)
    gx, gh = dcf.gradients(y, [x, h])
    gx_alone, = dcf.gradients(y, [x])
    got_x, got_h, got_alone = _run([gx, gh, gx_alone], {x: XV})
    np.testing.assert_allclose(got_x, 2 * np.sin(XV) * np.cos(XV), rtol=1e-12)
    np.testing.assert_allclose(got_h, 2 * np.sin(XV), rtol=1e-12)
    np.testing.assert_allclose(got_alone, got_x, rtol=1e-12)


def test_gradients_xs_on_each_others_path_in_any_order_and_chains():
    """[h, x] as well as [x, h]; a chain x -> h -> a with y reading all three."""
    x = dcf.placeholder(f64, (N,))
    h = dcf.sin(x)
    a = h * h
    y = dcf.reduce_sum(a * x) + dcf.reduce_sum(h)      # y = sum(sin^2 x * x + sin x)
    gh, gx = dcf.gradients(y, [h, x])
    gx3, gh3, ga3 = dcf.gradients(y, [x, h, a])
    got = _run([gh, gx, gx3, gh3, ga3], {x: XV})
    s, c = np.sin(XV), np.cos(XV)
    want_x = 2 * s * c * XV + s * s + c
    want_h = 2 * s * XV + 1                             # through a = h*h, and directly
    np.testing.assert_allclose(got[0], want_h, rtol=1e-12)
    np.testing.assert_allclose(got[1], want_x, rtol=1e-12)
    np.testing.assert_allclose(got[2], want_x, rtol=1e-12)
    np.testing.assert_allclose(got[3], want_h, rtol=1e-12)
    np.testing.assert_allclose(got[4], XV, rtol=1e-12)


def test_gradients_wrt_y_itself_and_its_input():
    x = dcf.placeholder(f64, (N,))
    h = dcf.sin(x)
    gx, gh = dcf.gradients(h, [x, h])
    got_x, got_h = _run([gx, gh], {x: XV})
    np.testing.assert_allclose(got_x, np.cos(XV), rtol=1e-12)
    np.testing.assert_allclose(got_h, np.ones(N))


def test_gradients_xs_on_each_others_path_through_a_while_loop(compiled):
    """x -> h -> loop (doubles 3 times) -> w -> y: asked for x, h, the loop's output."""
    x = dcf.placeholder(f64, (N,))
    h = dcf.sin(x)
    _, w = dcf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * 2.0), (0, h))
    y = dcf.reduce_sum(w * w)
    gx, gh, gw = dcf.gradients(y, [x, h, w])
    got_x, got_h, got_w = _run([gx, gh, gw], {x: XV}, compiled)
    s = np.sin(XV)
    np.testing.assert_allclose(got_x, 128 * s * np.cos(XV), rtol=1e-12)
    np.testing.assert_allclose(got_h, 128 * s, rtol=1e-12)
    np.testing.assert_allclose(got_w, 16 * s, rtol=1e-12)


def test_gradients_wrt_x_and_a_loop_output_that_feeds_back_into_y(compiled):
    """y reads x directly and through the loop; the loop output is asked for too."""
    x = dcf.placeholder(f64, (N,))
    _, w = dcf.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a * x), (0, x))
    y = dcf.reduce_sum(w) + dcf.reduce_sum(x)            # x^3 + x
    gx, gw = dcf.gradients(y, [x, w])
    got_x, got_w = _run([gx, gw], {x: XV}, compiled)
    np.testing.assert_allclose(got_x, 3 * XV ** 2 + 1, rtol=1e-12)
    np.testing.assert_allclose(got_w, np.ones(N))


@pytest.mark.parametrize("taken", [True, False])
def test_gradients_wrt_x_and_a_cond_output(taken, compiled):
    x = dcf.placeholder(f64, (N,))
    p = dcf.placeholder(dcf.bool, ())
    c = dcf.cond(p, lambda: dcf.sin(x), lambda: x * x)
    y = dcf.reduce_sum(c * x)
    gx, gc = dcf.gradients(y, [x, c])
    got_x, got_c = _run([gx, gc], {x: XV, p: taken}, compiled)
    if taken:
        want_x = np.cos(XV) * XV + np.sin(XV)
        want_c = XV
    else:
        want_x = 3 * XV ** 2
        want_c = XV
    np.testing.assert_allclose(got_x, want_x, rtol=1e-12)
    np.testing.assert_allclose(got_c, want_c, rtol=1e-12)


def test_gradients_wrt_tensors_on_each_others_path_inside_a_cond_branch(compiled):
    """Both xs inside the taken branch, one computed from the other."""
    x = dcf.placeholder(f64, (N,))
    box = {}

    def tb():
        t1 = x * 3.0
        t2 = dcf.sin(t1)
        box["t"] = (t1, t2)
        return t2 * t1
    y = dcf.reduce_sum(dcf.cond(dcf.constant(True), tb, lambda: x))
    t1, t2 = box["t"]
    g1, g2 = dcf.gradients(y, [t1, t2])
    got1, got2 = _run([g1, g2], {x: XV}, compiled)
    u = 3 * XV
    np.testing.assert_allclose(got1, np.cos(u) * u + np.sin(u), rtol=1e-12)
    np.testing.assert_allclose(got2, u, rtol=1e-12)


def test_second_order_with_xs_on_each_others_path():
    """The walk through xs also holds for a gradient of a gradient."""
    x = dcf.placeholder(f64, (N,))
    h = x * x
    y = dcf.reduce_sum(dcf.sin(h))
    gx, = dcf.gradients(y, [x])                          # 2x cos(x^2)
    hx, hh = dcf.gradients(dcf.reduce_sum(gx), [x, h])
    got_x, got_h = _run([hx, hh], {x: XV})
    # d/dx sum(2x cos(x^2)) = 2 cos(x^2) - 4 x^2 sin(x^2); d/dh (x held) = -2x sin(h)
    np.testing.assert_allclose(got_x, 2 * np.cos(XV ** 2) - 4 * XV ** 2 * np.sin(XV ** 2),
                               rtol=1e-12)
    np.testing.assert_allclose(got_h, -2 * XV * np.sin(XV ** 2), rtol=1e-12)


# --------------------------------------------------- an x made inside a while_loop body
def test_gradients_wrt_tensor_made_inside_while_body_raises():
    x = dcf.placeholder(f64, (N,))
    box = {}

    def body(i, a):
        t = dcf.sin(a, name="inner_sin")
        box["t"] = t
        return i + 1, t * x
    _, a = dcf.while_loop(lambda i, a: i < 3, body, (0, x), name="myloop")
    with pytest.raises(ValueError, match=r"(?s)myloop/inner_sin:0.*Sin.*while_loop 'myloop'"):
        dcf.gradients(dcf.reduce_sum(a), [box["t"]])


def test_gradients_wrt_loop_var_inside_body_and_in_cond_in_body_raise():
    x = dcf.placeholder(f64, (N,))
    box = {}

    def body(i, a):
        box["a"] = a                                      # the body's view of a loop var
        r = dcf.cond(i < 1, lambda: box.setdefault("c", dcf.cos(a)), lambda: a)
        return i + 1, r * x
    _, a = dcf.while_loop(lambda i, a: i < 2, body, (0, x), name="lp")
    y = dcf.reduce_sum(a)
    for t in (box["a"], box["c"]):
        with pytest.raises(ValueError, match=r"while_loop 'lp'"):
            dcf.gradients(y, [t])


def test_variable_read_inside_loop_still_sums_over_iterations():
    """A Variable stands for all its reads: those inside a loop are no error."""
    v = dcf.Variable(np.array([0.5, -1.0, 2.0]))
    _, s = dcf.while_loop(lambda i, s: i < 3, lambda i, s: (i + 1, s + v.read_value() * s),
                          (0, dcf.constant(np.ones(N))))
    gv, = dcf.gradients(dcf.reduce_sum(s), [v])
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        got = sess.run(gv, options=OPTS)
    vv = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(got, 3 * (1 + vv) ** 2, rtol=1e-12)   # d/dv (1+v)^3


def test_gradients_wrt_loop_outputs_of_unknown_shape(compiled):
    """A loop's Exit asked for is a tensor after the loop, not a target inside it (the
    loop's gradient made a zero accumulator for it, which needs a static shape)."""
    x = dcf.placeholder(f64, (None,))
    _, w1, w2 = dcf.while_loop(lambda i, a, b: i < 2,
                               lambda i, a, b: (i + 1, a * x, b + a), (0, x, x))
    y = dcf.reduce_sum(w1 * w2)                    # w1 = x^3, w2 = x + x + x^2
    gx, g1 = dcf.gradients(y, [x, w1])
    g1_alone, = dcf.gradients(y, [w1])
    got_x, got_1, got_1a = _run([gx, g1, g1_alone], {x: XV}, compiled)
    w1v, w2v = XV ** 3, 2 * XV + XV ** 2
    np.testing.assert_allclose(got_x, 3 * XV ** 2 * w2v + w1v * (2 + 2 * XV), rtol=1e-12)
    np.testing.assert_allclose(got_1, w2v, rtol=1e-12)
    np.testing.assert_allclose(got_1a, w2v, rtol=1e-12)


def test_second_order_wrt_x_and_its_first_order_gradient(compiled):
    """gradients(<g, v>, [x, g]) with g = dy/dx out of a backward loop (an Exit of
    unknown shape): Hv for x, v for g."""
    x = dcf.placeholder(f64, (None,))

    def body(i, a):
        r = dcf.cond(dcf.equal(i % 2, 0), lambda: dcf.map_fn(lambda e: e * e, a),
                     lambda: dcf.sin(a))
        return i + 1, r
    _, y = dcf.while_loop(lambda i, a: i < 3, body, (0, x))     # sin(x^2)^2
    g, = dcf.gradients(dcf.reduce_sum(y), [x])
    hx, hg = dcf.gradients(dcf.reduce_sum(g * dcf.constant(V)), [x, g])
    got_g, got_x, got_hg = _run([g, hx, hg], {x: XV}, compiled)
    u = XV ** 2
    # f = sin(u)^2, u = x^2: f' = 2x sin(2u), f'' = 2 sin(2u) + 8x^2 cos(2u)
    np.testing.assert_allclose(got_g, 2 * XV * np.sin(2 * u), rtol=1e-12)
    np.testing.assert_allclose(got_x, (2 * np.sin(2 * u) + 8 * u * np.cos(2 * u)) * V,
                               rtol=1e-10)
    np.testing.assert_allclose(got_hg, V)
