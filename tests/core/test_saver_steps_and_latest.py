"""Saver's TF1 conveniences: save(global_step=) appends the step to the path (a number,
or a Variable read in the same run), the directory's index gives latest_checkpoint(), and
a Saver keeps only its newest max_to_keep checkpoints (also from an AsyncSession)."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

import dcf


def _names(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".npz"))


def test_global_step_paths_latest_checkpoint_and_max_to_keep(tmp_path):
    w = dcf.Variable(np.zeros(2), name="w")
    step = dcf.Variable(np.int64(0), name="global_step")
    bump = dcf.group(w.assign_add(np.ones(2)), step.assign_add(np.int64(10)))
    saver = dcf.train.Saver(max_to_keep=2)
    prefix = str(tmp_path / "model")
    assert dcf.train.latest_checkpoint(str(tmp_path)) is None
    with dcf.Session() as sess:
        sess.run(dcf.global_variables_initializer())
        paths = []
        for _ in range(4):
            sess.run(bump)
            paths.append(saver.save(sess, prefix, global_step=step))
        assert paths == [f"{prefix}-{k}.npz" for k in (10, 20, 30, 40)]
        assert _names(tmp_path) == ["model-30.npz", "model-40.npz"]   # the newest two
        assert saver.save(sess, prefix, global_step=7) == f"{prefix}-7.npz"   # a number
        assert _names(tmp_path) == ["model-40.npz", "model-7.npz"]
        assert dcf.train.latest_checkpoint(str(tmp_path)) == f"{prefix}-7.npz"
        saver.restore(sess, f"{prefix}-40")
        assert sess.run(w).tolist() == [4.0, 4.0] and sess.run(step) == 40


def test_max_to_keep_none_keeps_all_and_latest_skips_removed_files(tmp_path):
    v = dcf.Variable(1.0, name="v")
    saver = dcf.train.Saver(max_to_keep=None)
    with dcf.Session() as sess:
        sess.run(v.initializer)
        for k in range(7):
            saver.save(sess, str(tmp_path / "m"), global_step=k)
    assert len(_names(tmp_path)) == 7
    os.remove(tmp_path / "m-6.npz")
    assert dcf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "m-5.npz")


def test_an_async_session_saves_with_a_step_and_keeps_the_newest(tmp_path):
    v = dcf.Variable(np.arange(3.0), name="v")
    saver = dcf.train.Saver(max_to_keep=1)

    async def main():
        async with dcf.AsyncSession() as sess:
            await sess.run(v.initializer)
            for k in (1, 2):
                path = await saver.save(sess, str(tmp_path / "svc"), global_step=k)
            return path

    assert asyncio.run(main()) == str(tmp_path / "svc-2.npz")
    assert _names(tmp_path) == ["svc-2.npz"]


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_max_to_keep_is_refused(bad):
    dcf.Variable(1.0, name="v")
    with pytest.raises(ValueError, match="max_to_keep"):
        dcf.train.Saver(max_to_keep=bad)


def test_a_global_step_that_is_no_integer_is_refused(tmp_path):
    v = dcf.Variable(1.0, name="v")
    saver = dcf.train.Saver()
    with dcf.Session() as sess:
        sess.run(v.initializer)
        with pytest.raises(TypeError, match="global_step"):
            saver.save(sess, str(tmp_path / "m"), global_step=2.5)
        with pytest.raises(TypeError, match="global_step"):
            saver.save(sess, str(tmp_path / "m"), global_step=v)   # a float variable
    assert _names(tmp_path) == []
