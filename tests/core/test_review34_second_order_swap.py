"""A second-order gradient through a `swap_memory=True` loop swaps the gradients its
backward-of-backward loop saves for the first loop's backward pass
(dcf/autodiff/loop_state.py, push_pop_grad): those stacks were made with
swap_memory=False whatever the loops' setting, so the loop kept every iteration's values
on the device and a budget the swapping stacks met failed with ResourceExhaustedError (a
30-step loop of 80 KiB values: 11.2 MB without swapping; it failed at 8 MB, and now runs
in 6 MB). Stand-in GPUs; the values equal the CPU's."""

from __future__ import annotations

import numpy as np

import dcf

R, C, N = 160, 128, 30


def _second_order(device: str, swap: bool):
    rng = np.random.default_rng(0)
    g = dcf.Graph()
    with g.as_default(), dcf.device(device):
        x = dcf.constant(rng.uniform(-1, 1, (R, C)).astype(np.float32))
        w = dcf.Variable((rng.standard_normal((C, C)) / np.sqrt(C)).astype(np.float32))
        out = dcf.while_loop(lambda i, a: i < N, lambda i, a: (i + 1, dcf.tanh(a @ w)),
                             (0, x), swap_memory=swap)[1]
        gw = dcf.gradients(dcf.reduce_sum(out * out), [w])[0]
        grads = dcf.gradients(dcf.reduce_sum(gw * gw), [x, w])
        init = dcf.global_variables_initializer()
    return g, grads, init


def test_the_gradient_stacks_of_a_second_order_gradient_swap_with_the_loop():
    g, _, _ = _second_order("/cpu:0", True)
    stacks = [op for op in g.get_operations() if op.type == "StackV2"]
    assert any(op.name.endswith("grad_stack") for op in stacks)
    assert all(op.attrs["swap_memory"] for op in stacks)
    g, _, _ = _second_order("/cpu:0", False)
    assert not any(op.attrs["swap_memory"] for op in g.get_operations()
                   if op.type == "StackV2")


def test_a_second_order_gradient_through_a_swapping_loop_runs_under_a_budget(fake_gpus):
    g, grads, init = _second_order("/cpu:0", False)
    with dcf.Session(g) as sess:
        sess.run(init)
        want = sess.run(grads)
    g, grads, init = _second_order("/gpu:0", True)
    config = dcf.SessionConfig(gpu_memory_limit=6_000_000, swap_threshold=0.5)
    with dcf.Session(g, config=config) as sess:
        sess.run(init)
        got = sess.run(grads)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
