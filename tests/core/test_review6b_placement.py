"""Device specs and placement against TF1's rules (review round 6): an index left out
or written `*` comes from the enclosing scope, device types in any case, specs TF
refuses (or that name no device dcf has) fail at build time naming the spec, a task
without a job is not a device of this process, and every spelling of one device is one
device (one actor). TF1's answers were taken from tensorflow.compat.v1 2.x."""

from __future__ import annotations

import numpy as np
import pytest

import dcf
from dcf.placement import place


def _device_under(*specs: str | None) -> str:
    g = dcf.Graph()
    with g.as_default():
        scopes = [g.device(s) for s in specs]
        for s in scopes:
            s.__enter__()
        c = dcf.constant(1.0)
        for s in reversed(scopes):
            s.__exit__(None, None, None)
    return c.device


@pytest.mark.parametrize("specs, want", [
    (("/gpu:1", "/cpu"), "/cpu:1"),             # TF1: /device:CPU:1
    (("/gpu:1", "/device:CPU:*"), "/cpu:1"),    # TF1: /device:CPU:1
    (("/job:worker/task:2/gpu:3", "/cpu:*"), "/job:worker/task:2/cpu:3"),
    (("/cpu:*",), "/cpu:0"),                    # any CPU: the first
    (("/Gpu:0",), "/gpu:0"),                    # TF1 accepts any case of cpu/gpu
    (("/gpu:1", "/CPU"), "/cpu:1"),
])
def test_an_index_left_out_comes_from_the_enclosing_scope_as_in_tf(specs, want):
    assert _device_under(*specs) == want


@pytest.mark.parametrize("spec", [
    "/cpu:0/gpu:1",                  # TF1: "Multiple device types are not allowed"
    "/device:GPU:0/device:CPU:0",
    "/device:",                      # was accepted as "/:0"
    "/device:XLA_CPU:0",             # was accepted, then failed at run without the op
    "/cpu:-1",                       # was a device of its own
    "/gpu:-1",                       # was "GPU -1" (Python's last GPU, or no cupy)
    "/task:-2",
    "/cpu:",                         # TF1: invalid literal for int()
    "/job:",                         # a job with no name
    "/replica:1",                    # was dropped: ran on replica 0
    "/job:worker/replica:1/task:0",
])
def test_a_spec_that_names_no_device_fails_at_build_time_naming_it(spec):
    with pytest.raises(ValueError, match="invalid device spec") as e:
        with dcf.device(spec):
            pass
    assert repr(spec) in str(e.value)


@pytest.mark.parametrize("spec", ["/task:1", "/task:2/cpu:1", "/job:localhost/task:1"])
def test_a_task_without_a_job_is_no_device_of_a_plain_session(spec):
    """It ran on a device of its own in this process; TF1 finds no such device."""
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (), name="x")
        with dcf.device(spec):
            y = dcf.multiply(x, x, name="twice")
    with dcf.Session(graph=g) as sess:
        with pytest.raises(dcf.errors.InvalidArgumentError,
                           match=r"Mul 'twice' is placed on .*task:\d.*/job:worker/task:\d"):
            sess.run(y, {x: 1.0})


def test_every_spelling_of_one_device_is_one_device():
    """`/task:0` is this process (TF1's /job:localhost/task:0), and a job without a task
    is its task 0: before, each spelling was a device (an actor) of its own."""
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, (), name="x")
        spellings = ["/task:0", "/job:localhost/replica:0/task:0/device:CPU:0", "/cpu:0"]
        here = []
        for s in spellings:
            with dcf.device(s):
                here.append(x * float(len(here) + 1))
        there = []
        for s in ["/job:worker", "/job:worker/task:0/cpu:0", "/job:worker/replica:0/task:0"]:
            with dcf.device(s):
                there.append(x + float(len(there) + 1))
    dev = place(g.get_operations(), "/cpu:0", lambda d: True)
    assert {dev[t.op] for t in here} == {"/cpu:0"}
    assert {dev[t.op] for t in there} == {"/job:worker/task:0/cpu:0"}
    with dcf.Session(graph=g) as sess:
        assert sess.run(here, {x: 2.0}) == [2.0, 4.0, 6.0]
        assert sorted(sess._async._actors) == ["/cpu:0"]


def test_only_a_callable_is_told_that_device_functions_are_not_supported():
    with pytest.raises(TypeError, match="device functions"):
        with dcf.device(lambda op: "/cpu:1"):
            pass
    with pytest.raises(TypeError) as e:
        with dcf.device(3):
            pass
    assert "device functions" not in str(e.value) and "int 3" in str(e.value)


def _loop(pred_dev: str, devs: tuple[str, str, str]):
    """A loop whose body spans three devices (a cond on the second, an inner loop on the
    third), its predicate on `pred_dev`; the gradient through it."""
    x0 = dcf.placeholder(dcf.float64, (3,), name="x0")
    n = dcf.placeholder(dcf.int32, (), name="n")

    def cond(i, x, y):
        with dcf.device(pred_dev):
            return dcf.logical_and(i < n, dcf.reduce_sum(x) < 1e6)

    def body(i, x, y):
        with dcf.device(devs[0]):
            a = dcf.sin(x) * 1.1 + 0.1
        with dcf.device(devs[1]):
            b = dcf.cond(dcf.reduce_sum(a) > 0.0, lambda: a * y, lambda: a - y)
        with dcf.device(devs[2]):
            c = dcf.tanh(b) + x
            _, s = dcf.while_loop(lambda j, s: j < i % 3,
                                  lambda j, s: (j + 1, s * 0.5 + c), (0, c))
        with dcf.device(pred_dev):
            i1 = i + 1
        return i1, s, y * 0.9 + 0.05

    i, x, y = dcf.while_loop(cond, body, (0, x0, x0 * 2.0))
    (gx,) = dcf.gradients(dcf.reduce_sum(x * y), [x0])
    return x0, n, [i, x, y, gx]


def _loop_in_numpy(x: np.ndarray, trips: int) -> tuple[np.ndarray, np.ndarray]:
    i, y = 0, x * 2.0
    while i < trips and x.sum() < 1e6:
        a = np.sin(x) * 1.1 + 0.1
        c = np.tanh(a * y if a.sum() > 0.0 else a - y) + x
        s = c
        for _ in range(i % 3):
            s = s * 0.5 + c
        i, x, y = i + 1, s, y * 0.9 + 0.05
    return x, y


@pytest.mark.parametrize("pred_dev", ["/cpu:0", "/cpu:1", "/gpu:0"])
def test_a_loop_over_two_cpus_and_a_gpu_equals_the_unplaced_loop_every_way(fake_gpus,
                                                                            pred_dev):
    xv, trips = np.array([0.3, -0.7, 1.2]), 4
    dcf.reset_default_graph()
    x0, n, fetches = _loop("", ("", "", ""))
    with dcf.Session() as sess:
        want = sess.run(fetches, {x0: xv, n: trips})
    np.testing.assert_allclose(want[1:3], _loop_in_numpy(xv, trips), rtol=1e-12)
    ways = [(dcf.SessionConfig(), None),
            (dcf.SessionConfig(compile_frames=False), None),
            (dcf.SessionConfig(fuse_devices=False), None),
            (dcf.SessionConfig(), dcf.RunOptions(trace=True))]
    for config, options in ways:
        dcf.reset_default_graph()
        x0, n, fetches = _loop(pred_dev, ("/cpu:0", "/cpu:1", "/gpu:0"))
        with dcf.Session(config=config) as sess:
            got = sess.run(fetches, {x0: xv, n: trips}, options=options)
            assert {"/cpu:0", "/cpu:1", "/gpu:0"} <= set(sess._async._actors)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{config} {options}")
