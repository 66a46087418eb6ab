"""Review 10, by use: the examples as a new user meets them from the README (bad flag
values, Ctrl-C, the service's flags)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dcf import gpu_devices

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.mark.parametrize("device, said", [
    ("/gpu:1", "/gpu:1 does not exist here (this process has 1 GPU: /gpu:0)"),
    ("garbage", "invalid device spec 'garbage'"),
    ("/job:worker/task:0", "this session has no cluster"),
])
def test_dqn_refuses_a_device_that_is_not_there_in_one_line(example, capsys, monkeypatch,
                                                            device, said):
    pytest.importorskip("gymnasium")
    dqn = example("dqn_cartpole")
    monkeypatch.setattr(dqn, "CartPole", lambda seed: pytest.fail("an environment was made"))
    with gpu_devices.stand_in_gpus(1), pytest.raises(SystemExit) as ei:
        dqn.main(["--steps", "3", "--device", device])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument --device: " in err and said in err, err
    assert "Traceback" not in err and "device_probe" not in err, err


def _interrupted(args: list[str], started: str) -> tuple[int, str, str, list[int]]:
    """Run examples/ARGS in a child, send it SIGINT once it printed a line starting with
    `started`; (exit status, stdout, stderr, the child's own children then)."""
    proc = subprocess.Popen([sys.executable, "-u", str(EXAMPLES / args[0]), *args[1:]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(started):
                break
        kids = [int(k) for k in subprocess.run(["pgrep", "-P", str(proc.pid)],
                                               capture_output=True, text=True).stdout.split()
                ] if shutil.which("pgrep") else []
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(lines) + out, err, kids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pgrep and /proc")
def test_ctrl_c_in_the_simulation_stops_it_quietly_and_its_workers_too():
    code, out, err, kids = _interrupted(["simulation.py", "--workers", "1", "--rounds",
                                         "100000", "--steps", "2"], "round 0")
    assert code == 130 and err.strip() == "interrupted", (code, err)
    assert "round 0" in out and len(kids) == 1
    assert not os.path.exists(f"/proc/{kids[0]}"), "the worker outlived the example"


@pytest.mark.parametrize("args, started", [
    (["reinforce_rollout.py", "--report-every", "1"], "episode"),
    (["moe_rnn.py", "--steps", "100000", "--batch", "2", "--seq", "2", "--units", "4"],
     "experts on"),
    (["service.py", "--selftest", "--requests", "100", "--values", "100000"], "self test:"),
])
def test_ctrl_c_in_an_example_is_one_line_and_status_130(args, started):
    if args[0] == "reinforce_rollout.py":
        pytest.importorskip("gymnasium")
    if args[0] == "service.py":
        pytest.importorskip("aiohttp")
    code, _, err, kids = _interrupted(args, started)
    assert code == 130 and err.strip() == "interrupted", (code, err)
    assert not [k for k in kids if os.path.exists(f"/proc/{k}")], kids   # (the self test's
                                                                          # server process)


@pytest.mark.parametrize("port", ["70000", "65536", "-1"])
def test_service_refuses_a_port_out_of_range_instead_of_serving_elsewhere(
        example, capsys, monkeypatch, port):
    pytest.importorskip("aiohttp")
    service = example("service")
    served = []

    async def serve(host, port, concurrency):   # (it served 70000 on 70000 % 65536)
        served.append(port)

    monkeypatch.setattr(service, "serve", serve)
    with pytest.raises(SystemExit) as ei:
        service.main(["--port", port])
    assert ei.value.code == 2 and not served
    assert f"argument --port: a port is 0 (any free port) to 65535, got {port}" in \
        capsys.readouterr().err


def test_dqn_plot_without_extension_names_the_file_it_wrote(example, capsys, tmp_path):
    pytest.importorskip("gymnasium")
    pytest.importorskip("matplotlib")
    dqn = example("dqn_cartpole")
    assert dqn.main(["--steps", "3", "--plot", str(tmp_path / "curve")]) == 0
    said = capsys.readouterr().out.strip().splitlines()[-1]
    assert said == f"learning curve: {tmp_path / 'curve.png'}", said
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dqn_plot_in_a_format_matplotlib_cannot_write_is_refused_before_training(
        example, capsys, monkeypatch, tmp_path):
    pytest.importorskip("gymnasium")
    pytest.importorskip("matplotlib")
    dqn = example("dqn_cartpole")
    monkeypatch.setattr(dqn, "CartPole", lambda seed: pytest.fail("it trained first"))
    with pytest.raises(SystemExit) as ei:
        dqn.main(["--steps", "3", "--plot", str(tmp_path / "curve.json")])
    assert ei.value.code == 2
    assert "argument --plot: matplotlib cannot write .json pictures" in capsys.readouterr().err


@pytest.mark.parametrize("name, argv, said", [
    ("dqn_cartpole", ["--seed", "-1"], "argument --seed: a seed is an integer >= 0, got -1"),
    ("moe_rnn", ["--seed", "-1"], "argument --seed: a seed is an integer >= 0, got -1"),
    ("reinforce_rollout", ["--seed", "-2"], "argument --seed: a seed is an integer >= 0"),
    ("reinforce_rollout", ["--lr", "nan"], "argument --lr: must be a finite number > 0"),
    ("reinforce_rollout", ["--lr", "-0.01"], "argument --lr: must be a finite number > 0"),
])
def test_a_negative_seed_or_a_nan_learning_rate_is_refused_up_front(
        example, capsys, monkeypatch, name, argv, said):
    if name != "moe_rnn":
        pytest.importorskip("gymnasium")
    module = example(name)
    for made in ("CartPole", "build"):    # neither an environment nor a graph is made
        if hasattr(module, made):
            monkeypatch.setattr(module, made, lambda *a, _m=made, **k: pytest.fail(_m))
    steps = "--episodes" if name == "reinforce_rollout" else "--steps"
    with pytest.raises(SystemExit) as ei:
        module.main([*argv, steps, "1"])
    assert ei.value.code == 2
    assert said in capsys.readouterr().err


def test_service_answers_400_not_500_to_json_beyond_float64_or_nested_too_deep(example):
    pytest.importorskip("aiohttp")
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    service = example("service")
    huge = "1" + "0" * 400                          # an integer JSON gives Python exactly
    cases = [('{"x": [%s]}' % huge, "x must be finite and >= 0"),
             ('{"x": [1], "tol": %s}' % huge, "tol must be a positive number"),
             ('{"x": %s%s}' % ("[" * 100_000, "]" * 100_000),
              "the JSON body is nested too deeply")]

    async def main() -> None:
        async with TestClient(TestServer(service.make_app(service.SqrtSolver()))) as client:
            for body, said in cases:
                r = await client.post("/sqrt", data=body,
                                      headers={"Content-Type": "application/json"})
                assert r.status == 400, (body[:40], r.status)
                assert (await r.json()) == {"error": said}
            r = await client.post("/sqrt", json={"x": [4.0]})     # and it still serves
            assert r.status == 200 and (await r.json())["sqrt"] == [2.0]

    asyncio.run(main())


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM")
def test_service_on_sigterm_answers_the_requests_in_flight_then_exits_0(example):
    pytest.importorskip("aiohttp")
    import asyncio

    import aiohttp
    import numpy as np

    service = example("service")
    x = np.random.default_rng(0).uniform(0.0, 1e300, 50_000)     # ~500 Newton steps

    async def main(server) -> list:
        async with aiohttp.ClientSession() as client:
            async def one() -> tuple:
                async with client.post(f"{server.url}/sqrt", data=x.tobytes(),
                                       headers={"Content-Type": service.BINARY}) as r:
                    return r.status, await r.read()

            tasks = [asyncio.ensure_future(one()) for _ in range(2)]
            while True:
                async with client.get(f"{server.url}/health") as r:
                    if (await r.json())["in_flight"] == 2:
                        break
                await asyncio.sleep(0.002)
            server.proc.send_signal(signal.SIGTERM)
            return await asyncio.gather(*tasks, return_exceptions=True)

    with service.ServerProcess() as server:
        answers = asyncio.run(main(server))
        assert server.proc.wait(timeout=60) == 0
    for a in answers:
        assert not isinstance(a, BaseException), answers
        assert a[0] == 200
        np.testing.assert_allclose(np.frombuffer(a[1], "<f8"), np.sqrt(x), rtol=1e-9)


def test_service_reads_a_binary_body_whatever_the_case_of_its_media_type(example):
    pytest.importorskip("aiohttp")
    import asyncio

    import numpy as np
    from aiohttp.test_utils import TestClient, TestServer

    service = example("service")
    x = np.array([4.0, 9.0, 2.0])

    async def main() -> None:
        async with TestClient(TestServer(service.make_app(service.SqrtSolver()))) as client:
            for media in ("Application/Octet-Stream", "APPLICATION/OCTET-STREAM; x=1"):
                r = await client.post("/sqrt", data=x.tobytes(), headers={"Content-Type": media})
                assert r.status == 200, (media, await r.text())
                np.testing.assert_allclose(np.frombuffer(await r.read(), "<f8"), np.sqrt(x))
            # JSON sent without a Content-Type (requests.post(url, data=json.dumps(...)))
            r = await client.post("/sqrt", data=b'{"x": [4]}', skip_auto_headers=["Content-Type"])
            assert r.status == 200 and (await r.json())["sqrt"] == [2.0]

    asyncio.run(main())
