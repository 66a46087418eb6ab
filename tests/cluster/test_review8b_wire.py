"""The wire from review 8b: a client attaching to workers that are all on this host
(ipc or any loopback address) binds to loopback, never to every interface; a parsed
cluster spec does not show its keys."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

import dcf
from dcf.cluster import _client_bind
from tests.cluster.helpers import on

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
        with open(os.path.join(folder, "secret"), "w") as f:
            f.write(os.urandom(32).hex())
        path = os.path.join(folder, "cluster.json")
        with open(path, "w") as f:
            json.dump({"worker": [f"ipc://{folder}/w0"], "secret_file": "secret"}, f)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
        proc = subprocess.Popen([sys.executable, "-m", "dcf.worker", "--cluster", path,
                                 "--task", "0"], env=env, stdin=subprocess.DEVNULL)
        x = dcf.placeholder(dcf.float32, ())
        with on(0):
            y = x * 2.0
        with dcf.Cluster(path) as cluster, dcf.Session(cluster=cluster) as sess:
            assert cluster._client.transport.address.startswith("tcp://127.0.0.1:")
            assert sess.run(y, {x: 3.0}) == 6.0
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
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
