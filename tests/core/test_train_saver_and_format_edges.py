"""Training state and checkpoints a user relies on: a failed Adam step leaves Adam's own
state alone; checkpoints take any variable name, refuse a dtype or shape that does not
fit (naming the variable), and get the usual file mode; DOT text escapes names; a
RunMetadata holds the last run's trace only."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError

PATHS = [
    pytest.param(dict(), id="compiled"),
    pytest.param(dict(fuse_devices=False), id="unfused"),
    pytest.param(dict(compile_frames=False), id="tagged"),
]


def _adam_graph():
    def check(h):
        if h.sum() > 100:
            raise ValueError("the data check failed")
        return h
    g = dcf.Graph()
    with g.as_default():
        w = dcf.Variable(np.array([1.0, 2.0, 3.0]), name="w")
        x = dcf.placeholder(dcf.float64, ())
        _, h = dcf.while_loop(lambda i, h: i < 20, lambda i, h: (i + 1, h * 1.01), (0, w * x))
        checked = dcf.py_func(check, [h], dcf.float64)      # fails late in the loss
        with dcf.control_dependencies([checked.op]):
            h = dcf.identity(h)
        step = dcf.train.AdamOptimizer(0.1).minimize(dcf.reduce_sum(h ** 2))
        init = dcf.global_variables_initializer()
    return g, w, x, step, init


@pytest.mark.parametrize("config", PATHS)
def test_a_failed_adam_step_leaves_the_optimizer_state_as_it_was(config):
    g, w, x, step, init = _adam_graph()
    with dcf.Session(g, config=dcf.SessionConfig(**config)) as sess:
        sess.run(init)
        with pytest.raises(dcf.errors.DcfError, match="the data check failed"):
            sess.run(step, {x: 100.0})
        sess.run(step, {x: 1.0})
        got = sess.run(w)
    # one Adam step from w0 with lr 0.1: the bias-corrected first step moves each
    # weight by lr * sign(gradient) (up to epsilon), whatever the gradient's size
    np.testing.assert_allclose(got, np.array([1.0, 2.0, 3.0]) - 0.1, rtol=0, atol=1e-7)


def test_checkpoints_take_any_variable_name(tmp_path):
    g = dcf.Graph()
    with g.as_default():
        vs = [dcf.Variable(np.float32(k + 1.0), name=n)
              for k, n in enumerate(["file", "allow_pickle", "args"])]
        saver = dcf.train.Saver()
        zero = dcf.group(*[v.assign(0.0) for v in vs])
        init = dcf.global_variables_initializer()
    with dcf.Session(g) as sess:
        sess.run(init)
        path = saver.save(sess, str(tmp_path / "ck"))
        with np.load(path) as data:
            assert sorted(data.files) == ["allow_pickle", "args", "file"]
        sess.run(zero)
        saver.restore(sess, path)
        assert sess.run(vs) == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("dtype,shape,match", [
    (dcf.int32, [2], r"'layer/w' is int32 but the checkpoint holds float32"),
    (dcf.float32, [2, 1], r"'layer/w' has shape \[2, 1\] but the checkpoint holds shape \[2\]"),
])
def test_a_restore_that_does_not_fit_names_the_variable_and_changes_nothing(
        tmp_path, dtype, shape, match):
    path = str(tmp_path / "ck.npz")
    g = dcf.Graph()
    with g.as_default(), dcf.name_scope("layer"):
        w = dcf.Variable(np.array([1.7, -0.6], np.float32), name="w")
        saver = dcf.train.Saver()
    with dcf.Session(g) as sess:
        sess.run(w.initializer)
        saver.save(sess, path)
    g2 = dcf.Graph()
    with g2.as_default(), dcf.name_scope("layer"):
        w2 = dcf.Variable(np.zeros(shape, dtype.np), name="w")
        saver2 = dcf.train.Saver()
    with dcf.Session(g2) as sess:
        sess.run(w2.initializer)
        with pytest.raises(InvalidArgumentError, match=match):
            saver2.restore(sess, path)
        np.testing.assert_array_equal(sess.run(w2), np.zeros(shape, dtype.np))


def test_a_checkpoint_gets_the_file_mode_the_umask_gives(tmp_path):
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable(1.0, name="v")
        saver = dcf.train.Saver()
    old = os.umask(0o027)
    try:
        with dcf.Session(g) as sess:
            sess.run(v.initializer)
            path = saver.save(sess, str(tmp_path / "ck"))
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o640


def test_dot_text_escapes_quotes_in_names():
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, [], name='in"put')
        dcf.while_loop(lambda i, s: i < 3, lambda i, s: (i + 1, s + x), (0, 0.0),
                       name='lo"op')
    dot = dcf.graph_to_dot(g)
    unescaped = re.sub(r'\\.', "", dot)       # what remains must pair its quotes
    assert all(line.count('"') % 2 == 0 for line in unescaped.splitlines())
    assert r'in\"put' in dot and r'subgraph "cluster_lo\"op' in dot


def test_a_run_metadata_holds_the_last_runs_trace_only():
    x = dcf.placeholder(dcf.float32, [])
    y = x * 2.0 + 1.0
    md = dcf.RunMetadata()
    with dcf.Session() as sess:
        sess.run(y, {x: 1.0}, options=dcf.RunOptions(trace=True), run_metadata=md)
        first = len(md.trace)
        sess.run(y, {x: 2.0}, options=dcf.RunOptions(trace=True), run_metadata=md)
        assert first > 0 and len(md.trace) == first
        sess.run(y, {x: 3.0}, run_metadata=md)            # untraced: no events left over
        assert md.trace == []
