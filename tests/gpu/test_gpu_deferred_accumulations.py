"""tests/core/test_deferred_accumulations.py on two real GPUs, with a loop long enough
(20 steps, batch 2: the terms are held) that a chunk of held terms is added inside the
backward loop: the accumulations of a GPU come after the transfer of its value to the
other GPU, and the loss and gradients are the same bits with the rule on and off and
equal the CPU's."""

from __future__ import annotations

import pytest

from tests.core.test_deferred_accumulations import check_order, check_values


@pytest.fixture
def two_gpus(gpu_count):
    from dcf import gpu_devices

    if gpu_count < 2 or gpu_devices.is_fake():
        pytest.skip("needs two real GPUs")
    from dcf.actors import gpu as G

    G.GpuDevice.get(0)      # (GPU 0 first, as a model placed from /gpu:0 on makes them)


def test_order_on_two_gpus(two_gpus, monkeypatch):
    check_order(monkeypatch, steps=20, batch=2)


def test_values_on_two_gpus(two_gpus, monkeypatch):
    check_values(monkeypatch, steps=20, batch=2)
