"""State a user relies on, from a review by use: a variable initialized from another one
gets its value whichever initializer runs first (TF1's guard, and initialized_value());
a Saver takes a dict of renamed variables (TF1's), and saves and restores with an
AsyncSession."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import dcf

PATHS = [
    pytest.param(dict(), id="compiled"),
    pytest.param(dict(fuse_devices=False), id="unfused"),
    pytest.param(dict(compile_frames=False), id="tagged"),
]

_A = np.arange(16.0).reshape(4, 4) / 16


def _slow_value():
    """_A, computed through a chain of ops (so its variable's initializer is not the first
    to finish)."""
    x = dcf.constant(_A)
    for _ in range(6):
        x = dcf.matmul(x, dcf.eye(4, dtype=dcf.float64))
    return x


@pytest.mark.parametrize("config", PATHS)
def test_a_variable_initialized_from_another_gets_its_value_in_any_order(config):
    g = dcf.Graph()
    with g.as_default():
        with dcf.device("/cpu:1"):
            v = dcf.Variable(_slow_value(), name="v")
        w = dcf.Variable(v * 2.0, name="w")
        init = dcf.global_variables_initializer()
        set_v = v.assign(np.ones((4, 4)))
    with dcf.Session(g, config=dcf.SessionConfig(**config)) as sess:
        sess.run(init)
        np.testing.assert_array_equal(sess.run(w), 2 * _A)
        sess.run(set_v.op)
        sess.run(w.initializer)       # v is initialized: w's initial value reads it (TF1)
        np.testing.assert_array_equal(sess.run(w), np.full((4, 4), 2.0))


@pytest.mark.parametrize("config", PATHS[::2])
def test_initialized_value_is_the_initial_value_until_the_variable_is_set(config):
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable(_slow_value(), name="v")
        z = dcf.Variable(v.initialized_value() + 1.0, name="z")
        init_z = dcf.variables_initializer([z])
        init_v = v.initializer
    with dcf.Session(g, config=dcf.SessionConfig(**config)) as sess:
        sess.run(init_z)                              # v itself is not initialized
        np.testing.assert_array_equal(sess.run(z), _A + 1)
        with pytest.raises(dcf.errors.InvalidArgumentError, match="variable 'v' was read "
                           "before it was initialized"):
            sess.run(v)
        sess.run(init_v)
        np.testing.assert_array_equal(sess.run(v), _A)


def test_a_saver_takes_a_dict_of_renamed_variables(tmp_path):
    g = dcf.Graph()
    with g.as_default():
        online = dcf.Variable(np.array([1.0, 2.0]), name="online/w")
        step = dcf.Variable(np.int64(7), name="step")
        init = dcf.global_variables_initializer()
        saver = dcf.train.Saver({"q/w": online, "global_step": step})
    with dcf.Session(g) as sess:
        sess.run(init)
        path = saver.save(sess, str(tmp_path / "ck"))
    with np.load(path) as data:
        assert sorted(data.files) == ["global_step", "q/w"]
    g2 = dcf.Graph()
    with g2.as_default():
        target = dcf.Variable(np.zeros(2), name="target/w")
        n = dcf.Variable(np.int64(0), name="n")
        loader = dcf.train.Saver({"q/w": target, "global_step": n})
        with pytest.raises(TypeError, match="'target/w'"):
            dcf.train.Saver(["target/w"])
    with dcf.Session(g2) as sess:
        loader.restore(sess, path)
        got_w, got_n = sess.run([target, n])
    np.testing.assert_array_equal(got_w, [1.0, 2.0])
    assert got_n == 7 and got_n.dtype == np.int64


def test_an_async_session_saves_and_restores(tmp_path):
    g = dcf.Graph()
    with g.as_default():
        v = dcf.Variable(np.array([1.0, 2.0, 3.0]), name="v")
        init = dcf.global_variables_initializer()
        zero = v.assign(np.zeros(3))
        saver = dcf.train.Saver()

    async def main():
        async with dcf.AsyncSession(g) as sess:
            await sess.run(init)
            path = await saver.save(sess, str(tmp_path / "ck"))
            await sess.run(zero)
            await saver.restore(sess, path)
            return path, await sess.run(v)

    path, got = asyncio.run(main())
    np.testing.assert_array_equal(got, [1.0, 2.0, 3.0])
    with np.load(path) as data:
        np.testing.assert_array_equal(data["v"], [1.0, 2.0, 3.0])
