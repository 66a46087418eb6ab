"""Saver: save/restore round trip, and a save killed with SIGKILL midway leaves the
previous checkpoint loadable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import dcf

_CHILD = textwrap.dedent("""
    import sys, numpy as np, dcf
    path = sys.argv[1]
    v = dcf.Variable(np.zeros((4_000_000,), np.float32), name="big")
    w = dcf.Variable(np.float32(0.0), name="tag")
    k = dcf.placeholder(dcf.float32, ())
    set_all = dcf.group(v.assign(dcf.fill([4_000_000], k)), w.assign(k))
    saver = dcf.train.Saver([v, w])
    with dcf.Session() as s:
        s.run(set_all, {k: 1.0})
        saver.save(s, path)
        print("ready", flush=True)
        i = 2.0
        while True:                      # keep saving new values until killed
            s.run(set_all, {k: i})
            saver.save(s, path)
            i += 1.0
""")


def test_save_restore_round_trip(tmp_path):
    a = dcf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="a")
    b = dcf.Variable(np.int32(7), name="b")
    saver = dcf.train.Saver()
    with dcf.Session() as s:
        s.run(dcf.global_variables_initializer())
        path = saver.save(s, str(tmp_path / "ckpt"))
        s.run([a.assign(a * 0.0), b.assign(0)])
        saver.restore(s, path)
        np.testing.assert_array_equal(s.run(a), np.arange(6, dtype=np.float32).reshape(2, 3))
        assert s.run(b) == 7


def test_restore_names_missing_variables(tmp_path):
    a = dcf.Variable(np.float32(1.0), name="a")
    with dcf.Session() as s:
        s.run(dcf.global_variables_initializer())
        path = dcf.train.Saver([a]).save(s, str(tmp_path / "c"))
    c = dcf.Variable(np.float32(2.0), name="c")
    with dcf.Session() as s, pytest.raises(KeyError, match=r"no values for \['c'\]"):
        dcf.train.Saver([c]).restore(s, path)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("delay", [0.05, 0.2, 0.45])
def test_kill_9_during_save_leaves_previous_checkpoint_loadable(tmp_path, delay):
    path = str(tmp_path / "model")
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, path], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    v = dcf.Variable(np.zeros((4_000_000,), np.float32), name="big")
    w = dcf.Variable(np.float32(0.0), name="tag")
    with dcf.Session() as s:
        dcf.train.Saver([v, w]).restore(s, path + ".npz")
        big, tag = s.run([v, w])
    assert tag >= 1.0
    # whole checkpoint from one save: every element equals the tag written with it
    assert np.all(big == tag)
