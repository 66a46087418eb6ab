"""Review 10, by use: the examples as a new user meets them from the README (bad flag
values, Ctrl-C, the service's flags)."""

from __future__ import annotations

import pytest

from dcf import gpu_devices


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
