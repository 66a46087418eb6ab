"""GPUs in worker processes: `Cluster.local(n, gpus_per_worker=1)`, each worker's
"/job:worker/task:K/gpu:0" its own GPU (worker K sees GPU K), the client's "/gpu:0"
beside them. Values leave a GPU for another process through the GPU actor's pinned
device-to-host copy and travel as raw buffers; a Recv on a worker's GPU copies them in.

On a machine with CUDA GPUs the workers use them (as many workers as GPUs, up to two);
elsewhere every process uses two stand-in GPUs (dcf/actors/_fake_cuda.py, which refuses
implicit host conversions as cupy does), so CI runs the same paths."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dcf
from tests.cluster.helpers import task
from dcf.gpu_devices import stand_in_gpus as _stand_in_gpus
from tests.core.test_concurrent_loop_shapes import CONCURRENT_DRAWS, run_concurrently

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def _real_gpus() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


@pytest.fixture(scope="module")
def gpu_cluster():
    """(cluster, the workers' GPU devices): real GPUs where there are some."""
    real = _real_gpus()
    with contextlib.nullcontext() if real else _stand_in_gpus(2):
        n = min(real, 2) if real else 2
        with dcf.Cluster.local(n, gpus_per_worker=1) as cluster:
            yield cluster, [f"{task(k)}/gpu:0" for k in range(n)]


def _devices(workers: list[str], client: str) -> list[str]:
    return [client] + (workers * 2)[:2]


@given(client=st.sampled_from(["/cpu:0", "/gpu:0"]), **CONCURRENT_DRAWS)
@settings(max_examples=25, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_loops_over_worker_gpus_match_one_process(gpu_cluster, client, kinds, places,
                                                  pred_place, fetch_bits, grad, runs, how):
    cluster, workers = gpu_cluster
    run_concurrently(_devices(workers, client), kinds, places, pred_place, fetch_bits, grad,
                     runs[:3], how, cluster=cluster)


def _mlp(devices: list[str], x: dcf.Tensor, w0: np.ndarray, w1: np.ndarray):
    """Two layers, each on its own device, and their gradients."""
    with dcf.device(devices[0]):
        a = dcf.Variable(w0, name="a")
        h = dcf.tanh(dcf.matmul(x, a))
    with dcf.device(devices[1]):
        b = dcf.Variable(w1, name="b")
        y = dcf.matmul(h, b)
        loss = dcf.reduce_sum(y * y)
    with dcf.device(devices[2]):
        ga, gb = dcf.gradients(loss, [a, b])
    return loss, ga, gb


@pytest.mark.parametrize("client", ["/cpu:0", "/gpu:0"])
def test_a_layer_on_each_worker_gpu_and_its_gradients_equal_numpy(gpu_cluster, client):
    """Megabyte tensors from one worker's GPU to the other's and back to the client,
    forward and backward, against float64 numpy."""
    cluster, workers = gpu_cluster
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((256, 512)).astype(np.float32)
    w0 = (rng.standard_normal((512, 384)) * 0.05).astype(np.float32)
    w1 = (rng.standard_normal((384, 64)) * 0.05).astype(np.float32)
    g = dcf.Graph()
    with g.as_default():
        x = dcf.placeholder(dcf.float32, xv.shape, name="x")
        devs = _devices(workers, client)
        loss, ga, gb = _mlp([devs[1], devs[2], client], x, w0, w1)
        init = dcf.global_variables_initializer()
    with dcf.Session(g, cluster=cluster) as sess:
        sess.run(init)
        got = sess.run([loss, ga, gb], {x: xv})
    X, A, B = (v.astype(np.float64) for v in (xv, w0, w1))
    H = np.tanh(X @ A)
    Y = H @ B
    dY = 2 * Y
    dB = H.T @ dY
    dA = X.T @ ((dY @ B.T) * (1 - H * H))
    np.testing.assert_allclose(got[0], (Y * Y).sum(), rtol=1e-4)
    np.testing.assert_allclose(got[1], dA, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(got[2], dB, rtol=1e-3, atol=1e-4)


def test_values_of_every_dtype_cross_between_worker_gpus(gpu_cluster):
    """Each dtype and a 0-d value from one worker's GPU to the other's and to the
    client, bit for bit."""
    cluster, workers = gpu_cluster
    vals = [np.arange(12, dtype=np.float16).reshape(3, 4) / 7, np.float64(np.pi),
            np.arange(-5, 5, dtype=np.int32), np.array([[1, -2]], np.int64) << 40,
            np.array([True, False, True])]
    g = dcf.Graph()
    with g.as_default():
        outs = []
        for k, v in enumerate(vals):
            with dcf.device(workers[0]):
                c = dcf.identity(dcf.constant(v), name=f"v{k}")
            with dcf.device(workers[-1]):
                outs.append(dcf.identity(c))
    with dcf.Session(g, cluster=cluster) as sess:
        got = sess.run(outs)
    for v, out in zip(vals, got):
        assert np.asarray(out).dtype == v.dtype and np.shape(out) == np.shape(v)
        np.testing.assert_array_equal(out, v)


def test_a_checkpoint_of_variables_on_workers_and_gpus_restores_into_a_new_session(
        gpu_cluster, tmp_path):
    """Variables on a worker's CPU, a worker's GPU and the client's GPU: saved, changed,
    restored in the same session and into a fresh one."""
    cluster, workers = gpu_cluster
    g = dcf.Graph()
    with g.as_default():
        with dcf.device(task(0)):
            a = dcf.Variable(np.arange(4, dtype=np.float32), name="a")
        with dcf.device(workers[-1]):
            b = dcf.Variable(np.ones((2, 3), np.float64), name="b")
        with dcf.device("/gpu:0"):
            c = dcf.Variable(np.int32(5), name="c")
        bump = dcf.group(a.assign(a * 2.0), b.assign_add(b), c.assign_add(1))
        saver = dcf.train.Saver()
        init = dcf.global_variables_initializer()
    with dcf.Session(g, cluster=cluster) as sess:
        sess.run(init)
        sess.run(bump)
        path = saver.save(sess, str(tmp_path / "ckpt"))
        sess.run(bump)
        saver.restore(sess, path)
        got = sess.run([a, b, c])
    with dcf.Session(g, cluster=cluster) as fresh:
        saver.restore(fresh, path)
        again = fresh.run([a, b, c])
    for vals in (got, again):
        np.testing.assert_array_equal(vals[0], [0.0, 2.0, 4.0, 6.0])
        np.testing.assert_array_equal(vals[1], np.full((2, 3), 2.0))
        assert vals[2] == 6
