"""Bugs found by bench/probes/tf1_diff_fuzz.py --wide --devices (the probe's grammar widened
to the rest of API.md's ops, float32 programs and ops placed on two devices), each shrunk
to a few ops and checked against values computed independently (numpy, closed forms)."""

from __future__ import annotations

import numpy as np

import dcf

f64 = dcf.float64
XV = np.array([[0.3, -0.7, 1.1], [0.5, 0.2, -0.4]])


def test_unstack_and_split_return_lists_as_tf_does():
    """`tf.unstack(x) + [y]` and `tf.split(...)[::-1] + [...]` are TF1 (and numpy) idioms:
    both return lists. dcf returned tuples, so the program failed while being built
    ('can only concatenate tuple (not "list") to tuple')."""
    with dcf.Graph().as_default():
        x = dcf.placeholder(f64, (2, 3))
        cols = dcf.unstack(x, axis=1)[1:] + [x[:, 0]]
        rows = dcf.split(x, 2)[::-1] + [x[:1]]
        out = dcf.stack(cols, axis=1) * 2.0 + dcf.reduce_sum(dcf.concat(rows, 0))
        gx = dcf.gradients(out, x)[0]
        with dcf.Session() as sess:
            got, g = sess.run([out, gx], {x: XV})
    np.testing.assert_allclose(got, np.roll(XV, -1, axis=1) * 2.0 + XV.sum() + XV[0].sum(),
                               rtol=1e-12)
    np.testing.assert_allclose(g, 2.0 + 6.0 + np.array([[6.0] * 3, [0.0] * 3]), rtol=1e-12)


def test_nested_loop_constant_read_on_another_device_by_an_unused_op():
    """An op on /cpu:1 inside a nested loop reads a root value x (entered twice) and the
    outer loop's variable, and nothing uses it. The inner loop's Enter of x, made under
    that device scope, also serves the body on /cpu:0; the outer Enter of x then had
    readers on /cpu:1 only (its inner twin on /cpu:0 was made after they were counted),
    so it moved there and its value reached /cpu:0 in the outer loop's iteration 0 only:
    the partitioned executors (compile_frames=False, fuse_devices=False) hung. b goes
    1 -> 1.5 -> 1.75 (patch fuzz2-1 to dcf/partition.py)."""
    with dcf.Graph().as_default():
        x = dcf.placeholder(f64, (2, 3))

        def body(i, a):
            def inner(j, b):
                with dcf.device("/cpu:1"):
                    dcf.sigmoid(x) * a          # unused
                return j + 1, b * 0.5 + x
            return i + 1, dcf.while_loop(lambda j, b: j < 2, inner, (0, x))[1]
        out = dcf.while_loop(lambda i, a: i < 2, body, (0, x))[1]
        for kw in (dict(compile_frames=False), dict(fuse_devices=False), dict()):
            with dcf.Session(config=dcf.SessionConfig(**kw)) as sess:
                got = sess.run(out, {x: np.ones((2, 3))}, options=dcf.RunOptions(timeout_s=5))
            np.testing.assert_allclose(got, np.full((2, 3), 1.75), rtol=1e-12)
