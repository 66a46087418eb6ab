"""Shared fixtures: a fresh default graph and a seeded RNG for every test, and the
`compiled` fixture that runs each control-flow test through both execution paths."""

from __future__ import annotations

import random
import signal

import numpy as np
import pytest

import dcf


def pytest_configure(config):
    """The tests that press Ctrl-C (a real SIGINT to the main thread) need Python's own
    handler, which Python does not install where SIGINT starts ignored: a suite started as
    a background job of a non-interactive shell (`bash -c '... &'`) inherits SIG_IGN,
    and those runs then waited for a Ctrl-C that never came."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _fresh_graph_and_seed():
    """Every test builds into its own default graph, with numpy's and Python's RNG seeded."""
    dcf.reset_default_graph()
    np.random.seed(0)
    random.seed(0)
    yield
    dcf.reset_default_graph()


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded numpy Generator for test data."""
    return np.random.default_rng(0)


@pytest.fixture(params=["compiled", "partitioned", "tagged"])
def compiled(request) -> dcf.SessionConfig:
    """SessionConfig for every execution path: the frame compiler's straight-line Python
    with in-process devices fused into one program (the default), the same with one
    compiled partition per device exchanging Send/Recv messages (fuse_devices=False), and
    the tagged-token executor (compile_frames=False). Traced runs
    (RunOptions(trace=True)) always take the tagged-token path."""
    return dcf.SessionConfig(compile_frames=request.param != "tagged",
                             fuse_devices=request.param == "compiled")


@pytest.fixture
def run_graph():
    """`run_graph(fetches, feed_dict=None, config=None, trace=False)`: run in a fresh
    Session; with trace=True returns (values, trace events)."""

    def run(fetches, feed_dict=None, config=None, trace=False):
        with dcf.Session(config=config) as sess:
            if not trace:
                return sess.run(fetches, feed_dict)
            md = dcf.RunMetadata()
            out = sess.run(fetches, feed_dict, options=dcf.RunOptions(trace=True), run_metadata=md)
            return out, md.trace

    return run


@pytest.fixture
def instances_of(monkeypatch):
    """instances_of(cls) -> a list that collects every instance of `cls` made during the
    test (the frame compiler's fused callables: it may build a frame's code more than
    once, so tests read what the instances did)."""
    def spy_on(cls):
        made: list = []
        init = cls.__init__

        def spy(self, *a, **kw):
            init(self, *a, **kw)
            made.append(self)

        monkeypatch.setattr(cls, "__init__", spy)
        return made

    return spy_on


@pytest.fixture
def fused_accumulations(instances_of):
    """The FusedAccumulates (dcf/fusion/accumulate.py) that updated an accumulator in
    place in this test, to read how often each did."""
    from dcf.fusion import accumulate as accumulate_fusion

    made = instances_of(accumulate_fusion.FusedAccumulate)

    class Ran(list):
        def __iter__(self):
            return iter([f for f in made if f.in_place])

        def __bool__(self):
            return any(f.in_place for f in made)

    return Ran()
