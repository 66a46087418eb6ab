"""Saver details a user relies on when a run, a save or the machine fails: a variable
given twice in a dict is refused (a restore would assign it twice in one run, keeping
either value), and the directory's index (checkpoint.json) gets the file mode the umask
gives and is on disk before it is named, as the checkpoint itself; saves from several
threads lose no checkpoint from the index and keep max_to_keep."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

import dcf


def test_a_variable_given_twice_in_a_dict_is_refused_naming_both_names(tmp_path):
    g = dcf.Graph()
    with g.as_default():
        a = dcf.Variable(1.0, name="a")
        b = dcf.Variable(2.0, name="b")
        saver = dcf.train.Saver({"x": a, "y": b})
    with dcf.Session(g) as sess:
        sess.run(dcf.variables_initializer([a, b]))
        path = saver.save(sess, str(tmp_path / "ck"))     # x = 1.0, y = 2.0
    g2 = dcf.Graph()
    with g2.as_default():
        v = dcf.Variable(0.0, name="v")
        # TF1's Saver: "The same saveable will be restored with two names"
        with pytest.raises(ValueError, match=r"'v' is given twice, as 'x' and as 'y'"):
            dcf.train.Saver({"x": v, "y": v})
    with dcf.Session(g2) as sess:
        with g2.as_default():
            dcf.train.Saver({"y": v}).restore(sess, path)
        assert sess.run(v) == 2.0


def _saved_with_step(tmp_path, step: int) -> str:
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable(np.arange(3.0), name="v")
        saver = dcf.train.Saver()
    with dcf.Session(g) as sess:
        sess.run(v.initializer)
        return saver.save(sess, str(tmp_path / "model"), global_step=step)


def test_the_index_gets_the_file_mode_the_umask_gives(tmp_path):
    old = os.umask(0o027)
    try:
        path = _saved_with_step(tmp_path, 3)
    finally:
        os.umask(old)
    index = tmp_path / "checkpoint.json"
    # (a reader under another user of the group finds the latest checkpoint, as it can
    # read the checkpoint itself)
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert os.stat(index).st_mode & 0o777 == 0o640
    assert dcf.train.latest_checkpoint(str(tmp_path)) == path


def test_the_index_is_synced_before_it_is_named_and_its_directory_after(
        tmp_path, monkeypatch):
    events = []
    fsync, replace = os.fsync, os.replace

    def spy_fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync", (st.st_dev, st.st_ino)))
        return fsync(fd)

    def spy_replace(src, dst):
        st = os.stat(src)
        events.append(("rename", (st.st_dev, st.st_ino)))
        return replace(src, dst)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    _saved_with_step(tmp_path, 5)
    st = os.stat(tmp_path / "checkpoint.json")
    index = (st.st_dev, st.st_ino)
    st = os.stat(tmp_path)
    directory = (st.st_dev, st.st_ino)
    # a crash after the rename, the data not yet on disk, left an empty index where
    # the previous one was (a filesystem may write the rename first)
    synced = events.index(("fsync", index))
    named = events.index(("rename", index))
    assert synced < named
    assert ("fsync", directory) in events[named + 1:]


@pytest.mark.parametrize("max_to_keep", [None, 3])
def test_saves_from_several_threads_keep_the_index_and_max_to_keep(tmp_path, max_to_keep):
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable(np.arange(3.0), name="v")
        saver = dcf.train.Saver(max_to_keep=max_to_keep)
    prefix = str(tmp_path / "m")
    with dcf.Session(g) as sess:
        sess.run(v.initializer)

        def work(t):
            for k in range(10):
                saver.save(sess, prefix, global_step=100 * t + k)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    on_disk = sorted(n for n in os.listdir(tmp_path) if n.endswith(".npz"))
    with open(tmp_path / "checkpoint.json") as f:
        listed = sorted(json.load(f)["checkpoints"])
    # each index was written from an older read of it: checkpoints saved meanwhile went
    # missing from it, and the Saver's own list lost track of ones it should remove
    assert len(on_disk) == (40 if max_to_keep is None else 3)
    assert listed == on_disk
    assert dcf.train.latest_checkpoint(str(tmp_path)) in [str(tmp_path / n) for n in on_disk]
