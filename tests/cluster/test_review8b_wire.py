"""The wire from review 8b: a client attaching to workers that are all on this host
(ipc or any loopback address) binds to loopback, never to every interface; a parsed
cluster spec does not show its keys."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

import dcf
from dcf.cluster import _client_bind
from tests.cluster.helpers import on, spec_file, start_worker, stop_process

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


@pytest.mark.parametrize("address, bind", [
    ("ipc:///tmp/dcf-x/w0", "tcp://127.0.0.1:*"),
    ("tcp://127.0.0.2:5555", "tcp://127.0.0.1:*"),
    ("tcp://localhost:5555", "tcp://127.0.0.1:*"),
    ("tcp://[::1]:5555", "tcp://127.0.0.1:*"),
    ("tcp://10.0.0.1:5555", "tcp://0.0.0.0:*"),
    # a remote host whose name merely contains "localhost" must be able to reach it
    ("tcp://db-localhost.example.com:5555", "tcp://0.0.0.0:*"),
])
def test_the_default_client_bind_is_loopback_for_local_workers(address, bind):
    assert _client_bind({"worker": [address]}) == bind


def test_a_client_of_an_ipc_worker_binds_to_loopback():
    folder = tempfile.mkdtemp(prefix="dcf-t-")   # (short: sun_path holds ~107 bytes)
    proc = None
    try:
        proc = start_worker(spec_file(folder, [f"ipc://{folder}/w0"]))
        x = dcf.placeholder(dcf.float32, ())
        with on(0):
            y = x * 2.0
        with dcf.Cluster(os.path.join(folder, "cluster.json")) as cluster, \
                dcf.Session(cluster=cluster) as sess:
            assert cluster._client.transport.address.startswith("tcp://127.0.0.1:")
            assert sess.run(y, {x: 3.0}) == 6.0
    finally:
        if proc is not None:
            stop_process(proc)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_parsed_spec_does_not_show_its_keys():
    from dcf.cluster import load_spec

    secret = "5ec7e75ec7e75ec7e75ec7e75ec7e75e"
    spec = load_spec({"worker": ["tcp://127.0.0.1:5555"], "secret": secret,
                      "curve": {"public": "P" * 40, "secret": "S" * 40}})
    assert spec.secret == bytes.fromhex(secret)
    text = repr(spec) + str(spec)
    assert "tcp://127.0.0.1:5555" in text
    assert repr(bytes.fromhex(secret))[2:-1] not in text and "S" * 40 not in text
