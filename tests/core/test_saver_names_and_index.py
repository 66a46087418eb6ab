"""Saver details a user relies on when a run, a save or the machine fails: a variable
given twice in a dict is refused (a restore would assign it twice in one run, keeping
either value), and the directory's index (checkpoint.json) gets the file mode the umask
gives and is on disk before it is named, as the checkpoint itself."""

from __future__ import annotations

import os

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
