"""Run the CPU test modules with /gpu:0 as the session's default device.

A module here star-imports a test module of tests/core or tests/autodiff and this
autouse fixture: every op without an explicit device then runs on /gpu:0 (host-only
ops such as py_func still go to the CPU), and the tests' own numpy expectations check
the GPU results.
"""

from __future__ import annotations

import pytest

import dcf.session


@pytest.fixture(autouse=True)
def default_device_is_gpu0(monkeypatch):
    place = dcf.session.place

    def place_on_gpu(ops, default_device, exists, **kw):
        if default_device == "/cpu:0":
            default_device = "/gpu:0"
        return place(ops, default_device, exists, **kw)

    monkeypatch.setattr(dcf.session, "place", place_on_gpu)
