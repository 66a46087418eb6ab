"""Variables' scatter updates write into the variable's buffer in place when nothing else
refers to it, and copy it otherwise: every value read earlier (in this run or returned
by an earlier one, or a view of one) must keep the value it had when it was read. Values
are checked against a numpy model of the table."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import dcf
from dcf.ops import state_ops
from dcf.resources import VarStore


def _table(n=6, m=3):
    return np.arange(n * m, dtype=np.float32).reshape(n, m)


def test_scatter_update_and_add_match_numpy_over_many_runs():
    rng = np.random.default_rng(0)
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable(_table(), name="t")
        idx = dcf.placeholder(dcf.int32, (None,))
        upd = dcf.placeholder(dcf.float32, (None, 3))
        set_ = v.scatter_update(idx, upd)
        add = dcf.scatter_add(v, idx, upd)
    model = _table()
    with dcf.Session(g) as sess:
        sess.run(v.initializer)
        for step in range(60):
            i = rng.integers(0, 6, size=rng.integers(1, 4)).astype(np.int32)
            u = rng.standard_normal((len(i), 3)).astype(np.float32)
            if step % 2:
                model[i] = u
                out = sess.run(set_, {idx: i, upd: u})
            else:
                np.add.at(model, i, u)             # repeated indices add up
                out = sess.run(add, {idx: i, upd: u})
            np.testing.assert_array_equal(out, model)
            np.testing.assert_array_equal(sess.run(v), model)


def test_values_returned_by_earlier_runs_never_change():
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable(_table(), name="t")
        i = dcf.placeholder(dcf.int32, ())
        write = v.scatter_update(dcf.reshape(i, (1,)), dcf.fill((1, 3), dcf.cast(i, dcf.float32)
                                                               + 100.0))
        row0 = v[0]                                  # a view of the buffer
    with dcf.Session(g) as sess:
        sess.run(v.initializer)
        snaps, views, outs, model = [], [], [], _table()
        for k in range(6):
            snaps.append((sess.run(v), model.copy()))
            views.append((sess.run(row0), model[0].copy()))
            model[k] = 100.0 + k
            outs.append((sess.run(write, {i: k}), model.copy()))
        for got, want in snaps + views + outs:
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_read_earlier_in_the_same_run_keeps_its_value(compiled):
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable(_table(), name="t")
        before = v.read_value()
        total_before = dcf.reduce_sum(before)
        with dcf.control_dependencies([total_before]):
            w = v.scatter_update([1, 4], np.full((2, 3), -1, np.float32))
        with dcf.control_dependencies([w]):
            after = v.read_value()
            # `before` is used again after the write: it must still be the old table
            again = dcf.reduce_sum(before) + 0.0
    with dcf.Session(g, config=dcf.SessionConfig(compile_frames=compiled)) as sess:
        sess.run(v.initializer)
        for _ in range(3):   # the first write copies the initial value, later ones may not
            model = sess.run(v).copy()
            b, t0, a, t1 = sess.run([before, total_before, after, again])
            np.testing.assert_array_equal(b, model)
            assert t0 == t1 == model.sum()
            model[[1, 4]] = -1
            np.testing.assert_array_equal(a, model)
            sess.run(v.assign(v + 1.0))


def test_the_users_fed_array_is_not_written():
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (6, 3))
        v = dcf.Variable(_table(), name="t")
        load = v.assign(x)
        w = v.scatter_update([0], np.zeros((1, 3), np.float32))
    mine = np.ones((6, 3), np.float32)
    with dcf.Session(g) as sess:
        sess.run(v.initializer)
        sess.run(load, {x: mine})
        out = sess.run(w)
    np.testing.assert_array_equal(mine, np.ones((6, 3), np.float32))
    assert out[0].tolist() == [0, 0, 0] and out[1:].tolist() == np.ones((5, 3)).tolist()


@pytest.mark.parametrize("compiled", [True, False])
def test_scatter_in_a_loop_reading_the_table_each_iteration(compiled):
    """Each iteration reads the table, then writes row i: the sum of what it read must be
    the sum of the table before that write."""
    n = 6
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable(np.zeros((n, 2), np.float32), name="t")

        def body(i, acc):
            r = v.read_value()
            s = dcf.reduce_sum(r)
            with dcf.control_dependencies([s]):
                w = v.scatter_update(dcf.reshape(i, (1,)),
                                     dcf.fill((1, 2), dcf.cast(i, dcf.float32) + 1.0))
            with dcf.control_dependencies([w]):
                return i + 1, acc + s + 0.0 * dcf.reduce_sum(r)

        _, total = dcf.while_loop(lambda i, acc: i < n, body, (0, 0.0))
    model, want = np.zeros((n, 2), np.float32), 0.0
    for i in range(n):
        want += model.sum()
        model[i] = i + 1
    with dcf.Session(g, config=dcf.SessionConfig(compile_frames=compiled)) as sess:
        sess.run(v.initializer)
        assert sess.run(total) == pytest.approx(want)
        np.testing.assert_array_equal(sess.run(v), model)


def test_own_buffer_writes_in_place_only_when_the_variable_alone_holds_it():
    h = VarStore("t", np.zeros((4, 2), np.float32))
    keep = h.value                                  # someone else holds it: a copy
    out = state_ops._own_buffer(h)
    assert out is not keep and not np.shares_memory(out, keep)
    np.testing.assert_array_equal(out, keep)
    del keep, out
    first = id(h.value)
    out = state_ops._own_buffer(h)                  # only the variable: in place
    assert id(out) == first
    del out
    view = h.value[1:]                              # a view's base counts
    out = state_ops._own_buffer(h)
    assert not np.shares_memory(out, view)
    del view, out
    ro = np.zeros(3, np.float32)
    ro.setflags(write=False)
    h2 = VarStore("r", ro)                          # `ro` held too: a Const's value
    out = state_ops._own_buffer(h2)
    assert out is not ro and out.flags.writeable and not ro.flags.writeable
    del ro, out
    stored = id(h2.value)                           # frozen as stored, held by it alone:
    out = state_ops._own_buffer(h2)                 # reopened and written in place
    assert id(out) == stored and out.flags.writeable
    del out
    h3 = VarStore("v", np.zeros(8, np.float32)[2:])
    assert state_ops._own_buffer(h3) is not h3.value  # a view of some other array
    with pytest.raises(dcf.errors.InvalidArgumentError, match="before it was initialized"):
        state_ops._own_buffer(VarStore("u"))


def test_the_dqn_write_no_longer_copies_the_table():
    """The replay table pattern of examples/dqn_cartpole.py: write a row, then read the
    table after the write; from the second run on the table's buffer stays the same."""
    g = dcf.Graph()
    with g.as_default():
        table = dcf.Variable(np.zeros((1000, 11), np.float32), name="table", trainable=False)
        w = dcf.Variable(np.int32(0), name="w", trainable=False)
        wi = w.read_value()
        write = table.scatter_update(dcf.reshape(wi, (1,)), dcf.fill((1, 11), 1.0))
        with dcf.control_dependencies([write]):
            step = dcf.group(w.assign((wi + 1) % 1000))
            rows = dcf.gather(table.read_value(), [0, 1, 2])
        init = dcf.global_variables_initializer()
    with dcf.Session(g) as sess:
        sess.run(init)
        actors = getattr(getattr(sess, "_async", sess), "_actors", {})   # internals
        res = next(iter(actors.values())).resources
        sess.run([step, rows])
        for k in range(5):
            buf = weakref.ref(res.variables["table"].value)   # does not hold it
            got = sess.run([step, rows])[1]
            np.testing.assert_array_equal(got[: min(k + 2, 3)], 1.0)
            assert buf() is res.variables["table"].value     # written in place
        np.testing.assert_array_equal(sess.run(table)[:6], 1.0)   # 6 runs wrote rows 0-5
        assert not sess.run(table)[6:].any()


@pytest.mark.parametrize("kind,rows", [
    ("update", [9]),            # one row: the replay write's fast path
    ("update", [0, 1, 9]),
    ("add", [0, 1, 9]),
])
def test_a_scatter_that_fails_leaves_the_value_and_fetches_the_callers_own(kind, rows):
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable(_table(), name="t")
        bump = v.assign_add(np.ones((6, 3), np.float32))     # a buffer of its own
        idx = dcf.placeholder(dcf.int32, (None,))
        upd = dcf.placeholder(dcf.float32, (None, 3))
        op = v.scatter_update(idx, upd) if kind == "update" else dcf.scatter_add(v, idx, upd)
    want = _table() + 1.0
    with dcf.Session(g) as sess:
        sess.run(v.initializer)
        sess.run(bump.op)
        with pytest.raises(dcf.errors.DcfError, match="index 9 is out of bounds"):
            sess.run(op.op, {idx: np.array(rows, np.int32),
                             upd: np.full((len(rows), 3), 50.0, np.float32)})
        got = sess.run(v)
        np.testing.assert_array_equal(got, want)
        got[:] = -1.0          # the caller's array: writing it must not reach the variable
        np.testing.assert_array_equal(sess.run(v), want)
