"""Session.run as a TF1 user drives it (review 8c): feed_dict keys that are tuples of
tensors, such as an RNN's state fed back from the previous run."""

from __future__ import annotations

import asyncio
import collections

import numpy as np
import pytest

import dcf

PATHS = [
    pytest.param(dict(), None, id="compiled"),
    pytest.param(dict(compile_frames=False), None, id="tagged"),
    pytest.param(dict(), dcf.RunOptions(trace=True), id="traced"),
]

Pair = collections.namedtuple("Pair", "c h")


@pytest.mark.parametrize("config,options", PATHS)
def test_a_tuple_key_feeds_its_tensors_from_a_value_of_its_structure(config, options):
    g = dcf.Graph()
    with g.as_default():
        a = dcf.placeholder(dcf.float32, [2], name="a")
        b = dcf.placeholder(dcf.float32, [2], name="b")
        k = dcf.placeholder(dcf.int32, [], name="k")
        out = (a - b) * dcf.cast(k, dcf.float32)
    one, two = np.array([1.0, 2.0], np.float32), np.array([5.0, 7.0], np.float32)
    with dcf.Session(graph=g, config=dcf.SessionConfig(**config)) as sess:
        # TF1: "if the key is a nested tuple of Tensors, the value should be a nested
        # tuple with the same structure"; a list leaf is one value, as any feed's
        np.testing.assert_array_equal(
            sess.run(out, {(a, b): (one, [5, 7]), k: 2}, options=options), [-8.0, -10.0])
        np.testing.assert_array_equal(
            sess.run(out, {Pair(a, b): Pair(two, one), k: 1}, options=options), [4.0, 5.0])
        np.testing.assert_array_equal(
            sess.run(out, {((a, b), k): [(one, one), 3]}, options=options), [0.0, 0.0])
        got = sess.run(Pair(a, b), {Pair(a, b): Pair(two, one)}, options=options)
        assert type(got) is Pair
        np.testing.assert_array_equal(got.c, two)
        np.testing.assert_array_equal(got.h, one)
        # a tensor fed again after its tuple: the later value, as for a name
        np.testing.assert_array_equal(
            sess.run(out, {(a, b): (one, one), a: two, k: 1}, options=options), [4.0, 5.0])
        for bad in (np.stack([one, two]), (one,), (one, two, one)):
            with pytest.raises(ValueError, match=r"tuple of 2 tensors: its value must be a "
                                                 r"tuple or list of 2 values"):
                sess.run(out, {(a, b): bad, k: 1}, options=options)


def test_an_lstm_state_fetched_from_one_run_feeds_the_next():
    g = dcf.Graph()
    with g.as_default():
        cell = dcf.nn.LSTMCell(3)
        x = dcf.placeholder(dcf.float32, [1, 2, 4])
        state = dcf.nn.LSTMStateTuple(dcf.placeholder(dcf.float32, [1, 3]),
                                      dcf.placeholder(dcf.float32, [1, 3]))
        out, final = dcf.nn.dynamic_rnn(cell, x, initial_state=state)
        init = dcf.global_variables_initializer()
    xs = np.linspace(-1.0, 1.0, 8, dtype=np.float32).reshape(1, 2, 4)
    zero = np.zeros((1, 3), np.float32)
    with dcf.Session(graph=g) as sess:
        sess.run(init)
        s1 = sess.run(final, {x: xs, state: (zero, zero)})
        assert isinstance(s1, dcf.nn.LSTMStateTuple)
        o2, s2 = sess.run([out, final], {x: xs, state: s1})
        # the same as feeding the state's tensors one by one
        o2_each, s2_each = sess.run([out, final], {x: xs, state.c: s1.c, state.h: s1.h})
        np.testing.assert_array_equal(o2, o2_each)
        np.testing.assert_array_equal(s2.c, s2_each.c)
        assert not np.allclose(s2.h, s1.h)      # (the fed state mattered)


def test_an_async_session_takes_tuple_keys_too():
    g = dcf.Graph()
    with g.as_default():
        a = dcf.placeholder(dcf.float32, [], name="a")
        b = dcf.placeholder(dcf.float32, [], name="b")
        out = a * 10.0 + b

    async def main():
        async with dcf.AsyncSession(g) as sess:
            return await sess.run(out, {(a, b): (2.0, 3.0)})

    assert asyncio.run(main()) == 23.0


def test_a_fetch_dict_keyed_by_tensors_or_variables_adds_no_op_per_run():
    # ({t: t for t in tensors}, {v: v for v in variables}: sorting the keys for the
    # dict's order compared them with `<`, which built a Less op (and reads of the
    # Variables) in the graph on every run)
    g = dcf.Graph()
    with g.as_default():
        a = dcf.constant(1.0, name="a")
        b = dcf.constant([2, 3], name="b")
        v = dcf.Variable(5.0, name="v")
        w = dcf.Variable([6.0, 7.0], name="w")
        init = dcf.global_variables_initializer()
    with dcf.Session(graph=g) as sess:
        sess.run(init)
        fetches = [{b: b, a: a}, {w: w, v: v, a: [a, v]}]
        sess.run(fetches)
        before = len(g.get_operations())
        for _ in range(3):
            got = sess.run(fetches)
        assert len(g.get_operations()) == before
    assert list(got[0]) == [b, a] and list(got[1]) == [w, v, a]
    assert got[0][a] == 1.0 and got[1][v] == 5.0 and got[1][a] == [1.0, 5.0]
    np.testing.assert_array_equal(got[0][b], [2, 3])
    np.testing.assert_array_equal(got[1][w], [6.0, 7.0])
