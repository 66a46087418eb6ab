"""Device scopes, as in TensorFlow: a nested spec is merged over the enclosing ones (the
fields it leaves out come from them), names are normalised, and `dcf.device(None)`
clears the enclosing scopes (ops inside are unplaced; before, it changed nothing)."""

from __future__ import annotations

import dcf


def test_a_nested_spec_fills_in_what_the_outer_one_leaves_out():
    with dcf.device("/job:worker/task:1"):
        a = dcf.constant(1.0)
        with dcf.device("/gpu:0"):
            b = dcf.constant(1.0)
            with dcf.device("/job:worker/task:2"):
                c = dcf.constant(1.0)
    assert a.device == "/job:worker/task:1"
    assert b.device == "/job:worker/task:1/gpu:0"
    assert c.device == "/job:worker/task:2/gpu:0"


def test_device_none_clears_the_enclosing_scopes_until_it_ends():
    with dcf.device("/job:worker/task:1/gpu:0"):
        with dcf.device(None):
            free = dcf.constant(1.0)
            with dcf.device("/cpu:1"):
                inner = dcf.constant(1.0)
        back = dcf.constant(1.0)
    assert free.device == ""
    assert inner.device == "/cpu:1"
    assert back.device == "/job:worker/task:1/gpu:0"


def test_names_are_normalised():
    for spec, want in [("/CPU:1", "/cpu:1"), ("/device:GPU:0", "/gpu:0"),
                       ("/job:worker/task:0/device:CPU:0", "/job:worker/task:0/cpu:0")]:
        with dcf.device(spec):
            assert dcf.constant(1.0).device == want, spec
