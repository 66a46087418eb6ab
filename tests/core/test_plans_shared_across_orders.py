"""The same fetches and feeds in another order share one plan (as TF1's executors): a
service that lists them in each request's order builds one, not one per order, and every
order gets its values in its own places."""

from __future__ import annotations

import itertools

import pytest

import dcf

F64 = dcf.float64


@pytest.mark.parametrize("config", [dcf.SessionConfig(), dcf.SessionConfig(compile_frames=False),
                                    dcf.SessionConfig(fuse_devices=False)],
                         ids=["compiled", "tagged", "unfused"])
def test_fetches_and_feeds_in_every_order_share_one_plan(config):
    a, b, c = (dcf.placeholder(F64, (), name=n) for n in "abc")
    with dcf.device("/cpu:1"):
        y = dcf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * a + b), (0, c))[1]
    z = a - b * c
    vals = {a: 2.0, b: 3.0, c: 5.0}
    want = {"y": ((5 * 2 + 3) * 2 + 3) * 2 + 3, "z": 2.0 - 3.0 * 5.0, "a": 2.0}
    named = {"y": y, "z": z, "a": a}
    with dcf.Session(config=config) as sess:
        for fetch_order in itertools.permutations("yza"):
            for feed_order in itertools.permutations([a, b, c]):
                got = sess.run([named[n] for n in fetch_order], {k: vals[k] for k in feed_order})
                assert got == [want[n] for n in fetch_order]
        plans = {id(part[1]) for rp in sess._async._plans.values() for part in rp.parts}
        assert len(plans) == 2          # the partitions of /cpu:0 and /cpu:1, once each
