"""Review 9 (checkpoints by use): a Saver's save and restore used as a TF1 user would."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import dcf
from dcf import train


def test_an_async_restore_reads_the_checkpoint_off_the_event_loop(tmp_path, monkeypatch):
    # An AsyncSession's save wrote its file on a worker thread, but restore read and
    # checked the whole checkpoint on the event loop's own thread before it returned
    # its awaitable: a 100 MB checkpoint stalled every other task of the service for
    # ~0.4 s (no tick of a 5 ms timer task came meanwhile)
    v = dcf.Variable(np.arange(4.0), name="v")
    saver = dcf.train.Saver()
    read_in = []
    read = train._read_checkpoint

    def recording(path, keys):
        read_in.append(threading.current_thread())
        return read(path, keys)

    monkeypatch.setattr(train, "_read_checkpoint", recording)

    async def main():
        async with dcf.AsyncSession() as sess:
            await sess.run(v.initializer)
            path = await saver.save(sess, str(tmp_path / "service-state"))
            await sess.run(v.assign(np.zeros(4)))
            pending = saver.restore(sess, path)
            assert read_in == []            # (nothing read before the awaitable runs)
            await pending
            return await sess.run(v)

    np.testing.assert_array_equal(asyncio.run(main()), np.arange(4.0))
    assert len(read_in) == 1 and read_in[0] is not threading.main_thread()


def test_a_variable_named_like_a_member_file_restores_its_own_value(tmp_path):
    # a checkpoint stores variable "x" as the member "x.npy" and "x.npy" as
    # "x.npy.npy"; numpy's NpzFile looks a key up as a member name first, so the
    # restore gave the variable "x.npy" the value of "x", silently
    x = dcf.Variable(np.float32(1.0), name="x")
    x_npy = dcf.Variable(np.float32(2.0), name="x.npy")
    saver = dcf.train.Saver()
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        path = saver.save(sess, str(tmp_path / "model"))
        sess.run([x.assign(0.0), x_npy.assign(0.0)])
        saver.restore(sess, path)
        assert sess.run([x, x_npy]) == [1.0, 2.0]
    # and a checkpoint that holds only "x" has no value for "x.npy"
    only_x = dcf.train.Saver([x]).save
    with dcf.Session() as sess:
        sess.run(x.initializer)
        path = only_x(sess, str(tmp_path / "only_x"))
        with pytest.raises(KeyError, match=r"no values for \['x.npy'\]"):
            dcf.train.Saver({"x.npy": x_npy}).restore(sess, path)


def test_a_saver_made_under_control_dependencies_runs_none_of_them(tmp_path):
    # a Saver made inside `control_dependencies([train_step])` (a model built in such a
    # block) took the step as a control input of its reads and its restore: every save
    # and every restore ran a training step. (TF1's does so too; a save that trains is
    # no one's intent.) Made inside a while_loop body, its reads were in the loop's frame.
    v = dcf.Variable(5.0, name="v")
    steps = dcf.Variable(0.0, name="steps")
    train_step = steps.assign_add(1.0)
    with dcf.control_dependencies([train_step]):
        saver = dcf.train.Saver([v])

    def body(i):
        body_saver.append(dcf.train.Saver([steps]))
        return i + 1

    body_saver = []
    dcf.while_loop(lambda i: i < 2, body, [dcf.constant(0)])
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        path = saver.save(sess, str(tmp_path / "model"))
        saver.restore(sess, path)
        assert sess.run([v, steps]) == [5.0, 0.0]
        path = body_saver[0].save(sess, str(tmp_path / "steps"))
        body_saver[0].restore(sess, path)
        assert sess.run(steps) == 0.0


def test_an_assign_alongside_another_threads_update_is_not_lost(monkeypatch):
    # assign_add holds the variable's lock from its read of the old value to its store
    # of the new one, but assign took no lock: an assign (a restore, a reset) that landed
    # in between was overwritten by the update's store, and lost -- 17 of 30 restores
    # run alongside a thread's assign_add steps were (TF's AssignVariableOp takes the
    # lock: none is lost there). Here the update is held at that point.
    from dcf.ops import state_ops

    v = dcf.Variable(np.zeros(3), name="v")
    step = v.assign_add(np.ones(3))
    value = dcf.placeholder(dcf.float64, [3])
    reset = v.assign(value)
    in_update, go_on = threading.Event(), threading.Event()
    updated = state_ops._updated

    def held(handle, new, old, what):
        in_update.set()
        go_on.wait(10.0)
        return updated(handle, new, old, what)

    monkeypatch.setattr(state_ops, "_updated", held)
    with dcf.Session() as sess:
        sess.run(v.initializer)
        stepping = threading.Thread(target=sess.run, args=(step,))
        stepping.start()
        assert in_update.wait(10.0)
        resetting = threading.Thread(target=sess.run, args=(reset, {value: np.full(3, 7.0)}))
        resetting.start()
        resetting.join(0.2)         # (it waits for the update's lock, where it takes it)
        go_on.set()
        stepping.join(10.0)
        resetting.join(10.0)
        # the update, then the assign: the assign's value stays
        np.testing.assert_array_equal(sess.run(v), [7.0, 7.0, 7.0])
