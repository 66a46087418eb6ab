"""In a backward loop over two GPUs (a model-parallel LSTM, layers 0-1 on /gpu:0 and 2-3
on /gpu:1), the held gradient accumulations of a GPU are emitted after the transfer of
that GPU's value to the other GPU (frame_compiler.DEFER_ACCUMULATIONS): a chunk of held
terms added on /gpu:1 then runs after the d[x, h] block /gpu:0 waits for, not before it.
The order changes nothing computed: the loss and every gradient are the same bits with
and without the rule, and equal the CPU's. On the stand-in GPUs;
tests/gpu/test_gpu_deferred_accumulations.py runs it on two real GPUs."""

from __future__ import annotations

import numpy as np

from dcf import frame_compiler as fc
from tests.lstm_gradients import layers_in_one_loop

GPUS = ["/gpu:0", "/gpu:0", "/gpu:1", "/gpu:1"]


def _run(defer, monkeypatch, steps, batch, calls=None, devices=GPUS):
    monkeypatch.setattr(fc, "DEFER_ACCUMULATIONS", defer)
    if calls is not None:
        real = fc._device_grouped

        def spy(items, gpu_of, name, late=(), sent_from=None):
            out = real(items, gpu_of, name, late, sent_from)
            calls.append((name, out, gpu_of, set(late), dict(sent_from or {})))
            return out
        monkeypatch.setattr(fc, "_device_grouped", spy)
    xv = np.random.default_rng(3).standard_normal((steps, batch, 4)).astype(np.float32)
    return [np.asarray(o) for o in layers_in_one_loop(devices, xv, 4)]


def check_order(monkeypatch, steps=5, batch=3, devices=GPUS) -> dict:
    """Every accumulation of a GPU that sends a value to another comes after the
    transfer; returns {sending GPU's index: transfers checked}."""
    calls: list = []
    _run(True, monkeypatch, steps, batch, calls, devices)
    sends: dict = {}
    for name, order, gpu_of, late, sent_from in calls:
        pos = {id(k): i for i, k in enumerate(order)}
        for k in order:
            src = sent_from.get(getattr(k, "id", None))
            if src is None or "grad" not in name:
                continue
            mine = [j for j in order if getattr(j, "id", None) in late and
                    gpu_of.get(j.id) is src]
            assert mine, name            # the sending GPU holds accumulations
            early = [j.id for j in mine if pos[id(j)] < pos[id(k)]]
            assert not early, (name, k.id, early)
            sends[src.index] = sends.get(src.index, 0) + 1
    assert sends
    return sends


def check_values(monkeypatch, steps=5, batch=3, devices=GPUS):
    on = _run(True, monkeypatch, steps, batch, devices=devices)
    off = _run(False, monkeypatch, steps, batch, devices=devices)
    cpu = _run(True, monkeypatch, steps, batch, devices=["/cpu:0"] * len(devices))
    assert len(on) == len(off) == len(cpu) == 1 + 2 * len(devices)
    for a, b, c in zip(on, off, cpu):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=2e-4, atol=2e-5)


def test_accumulations_follow_the_transfer_out_of_their_gpu(fake_gpus, monkeypatch):
    check_order(monkeypatch)


def test_without_the_rule_an_accumulation_comes_before_the_transfer(fake_gpus,
                                                                    monkeypatch):
    # the rule's reason: the frame's node order puts a layer's accumulation before the
    # transfer that the lower layers' GPU waits for
    calls: list = []
    _run(False, monkeypatch, 5, 3, calls)
    found = False
    for name, order, gpu_of, late, sent_from in calls:
        assert not late
        if "grad" not in name:
            continue
        adds = [k for k in order if getattr(k, "type", None) in ("Add", "AddV2")]
        for i, k in enumerate(order):
            src = sent_from.get(getattr(k, "id", None))
            if src is not None and any(order.index(a) < i and gpu_of.get(a.id) is src
                                       for a in adds):
                found = True
    assert found


def test_the_same_bits_with_and_without_the_rule(fake_gpus, monkeypatch):
    check_values(monkeypatch)


def test_a_pipeline_of_three_gpus(three_fake_gpus, monkeypatch):
    # /gpu:2 -> /gpu:1 -> /gpu:0 in the backward: the middle GPU both receives and sends
    devs = ["/gpu:0", "/gpu:1", "/gpu:2", "/gpu:2"]
    assert sorted(check_order(monkeypatch, devices=devs)) == [1, 2]
    check_values(monkeypatch, devices=devs)


def _node(i: int, name: str):
    from dcf.plan import NodeInfo

    return NodeInfo(i, i, name, "Add", 0, None, 2, 0, 0, 1, None)


def test_switching_gpus_passes_over_the_other_gpus_late_work():
    """When the current GPU has nothing ready, the order moves to the next ready item of
    another GPU -- not to a held accumulation while that GPU has other ready work (the
    accumulation waits, as it would on its own GPU)."""
    a, b = object(), object()                  # two GPUs
    a1, b_late, b_work = _node(0, "a1"), _node(1, "b_late"), _node(2, "b_work")
    items = {a1: [], b_late: [], b_work: []}   # all ready; node order a1, b_late, b_work
    gpu_of = {0: a, 1: b, 2: b}
    order = fc._device_grouped(items, gpu_of, "f", late={1})
    assert [k.name for k in order] == ["a1", "b_work", "b_late"]
    # without late work the node order stands
    order = fc._device_grouped(items, gpu_of, "f")
    assert [k.name for k in order] == ["a1", "b_late", "b_work"]
