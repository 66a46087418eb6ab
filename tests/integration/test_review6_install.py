"""Installing and starting dcf as a new user: what the wheel holds, the dependency floors,
a clean `import dcf`, clear messages for features whose extra is missing, the worker's
command line, and workers that run the client's dcf."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dcf
from dcf import worker
from dcf.errors import InvalidArgumentError

try:
    import tomllib
except ImportError:            # Python 3.10: pytest's own dependency there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _floor(requirement: str) -> tuple[int, ...]:
    m = re.search(r">=\s*([0-9.]+)", requirement)
    assert m, requirement
    return tuple(int(p) for p in m.group(1).split("."))


def _requirement(name: str, reqs: list[str]) -> str:
    return next(r for r in reqs if re.match(rf"{re.escape(name)}\b", r))


# ------------------------------------------------------------------ the wheel's contents
def test_the_package_list_covers_every_dcf_subpackage():
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    patterns = [re.compile(p.replace(".", r"\.").replace("*", ".*") + "$")
                for p in find["include"]]
    for d in sorted((ROOT / "dcf").rglob("*")):
        if not d.is_dir() or d.name == "__pycache__" or not any(d.glob("*.py")):
            continue
        name = ".".join(d.relative_to(ROOT).parts)
        # packages.find finds regular packages only: a folder of modules without an
        # __init__.py would be left out of the wheel
        assert (d / "__init__.py").exists(), f"{name} has no __init__.py"
        assert any(p.match(name) for p in patterns), f"{name} is not in packages.find"


def test_dcf_holds_only_python_files_since_no_package_data_is_declared():
    assert "package-data" not in PYPROJECT["tool"]["setuptools"]
    others = [p for p in (ROOT / "dcf").rglob("*")
              if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".py"]
    assert others == []


def test_the_console_script_names_the_worker_main():
    assert PYPROJECT["project"]["scripts"] == {"dcf-worker": "dcf.worker:main"}
    assert callable(worker.main)


# ------------------------------------------------------------------ dependency floors
def test_the_dependency_floors_are_the_versions_the_tests_pass_with():
    deps = PYPROJECT["project"]["dependencies"]
    # numpy 1.x (no NEP 50): reduce_mean of float32 gave a float64 value, and ~18 more op
    # tests failed; pyzmq 25 (libzmq 4.3.4): a second CurveZMQ transport with a keypair
    # used before never connected
    assert _floor(_requirement("numpy", deps)) >= (2, 0)
    assert _floor(_requirement("pyzmq", deps)) >= (26,)
    test = PYPROJECT["project"]["optional-dependencies"]["test"]
    # the asyncio_default_fixture_loop_scope option of [tool.pytest.ini_options]
    assert _floor(_requirement("pytest-asyncio", test)) >= (0, 24)
    assert _floor(_requirement("pytest", test)) >= (8, 2)
    assert _floor(_requirement("hypothesis", test)) >= (6, 100)


def test_reduce_mean_of_float32_is_a_float32_value():
    x = dcf.placeholder(dcf.float32, (None,))
    m = dcf.reduce_mean(x)
    with dcf.Session() as sess:
        v = sess.run(m, {x: np.arange(3, dtype=np.float32)})
    assert m.dtype == dcf.float32
    assert type(v) is np.float32 and v == np.float32(1.0)


# ------------------------------------------------------------------ import dcf
_SNAPSHOT = """
import json, logging, os, signal, sys, threading, warnings
import numpy as np

def snap():
    return {
        "env": sorted(os.environ.items()),
        "threads": sorted(t.name for t in threading.enumerate()),
        "signals": sorted((int(s), repr(signal.getsignal(s))) for s in signal.valid_signals()
                          if s not in (signal.SIGKILL, signal.SIGSTOP)),
        "printoptions": repr(sorted(np.get_printoptions().items())),
        "errstate": sorted(np.geterr().items()),
        "logging": [logging.root.level, len(logging.root.handlers)],
        "warnings": len(warnings.filters),
        "cwd_files": sorted(os.listdir(".")),
        "recursion": sys.getrecursionlimit(),
        "switch": sys.getswitchinterval(),
        "excepthook": repr(sys.excepthook),
        "children": sorted(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task")
                    else [],
    }

before = snap()
import dcf
after = snap()
print(json.dumps({k: [before[k], after[k]] for k in before if before[k] != after[k]}))
print(json.dumps(sorted(m for m in ("uvloop", "cupy", "matplotlib", "tqdm", "ray",
                                    "gymnasium", "aiohttp", "tensorflow")
                        if m in sys.modules)))
"""


def test_import_dcf_changes_no_global_state(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DCF_")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", _SNAPSHOT], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    changed, optional = (json.loads(line) for line in out.splitlines()[-2:])
    assert changed == {}
    assert optional == []          # the extras are imported where they are used
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ missing extras
def test_trace_plot_without_matplotlib_names_the_plot_extra(monkeypatch, tmp_path):
    x = dcf.placeholder(dcf.float32, ())
    y = x * 2.0
    md = dcf.RunMetadata()
    with dcf.Session() as sess:
        sess.run(y, {x: 1.0}, options=dcf.RunOptions(trace=True), run_metadata=md)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'dcf\[plot\]'"):
        dcf.trace.plot(md, str(tmp_path / "t.png"))


def test_cluster_ray_without_ray_names_the_ray_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'dcf\[ray\]'"):
        dcf.Cluster.ray(1)


def test_a_gpu_op_without_cupy_says_to_install_the_gpu_extra(monkeypatch):
    from dcf import gpu_devices

    monkeypatch.delenv("DCF_FAKE_GPUS", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", None)
    gpu_devices.count.cache_clear()
    try:
        x = dcf.placeholder(dcf.float32, ())
        with dcf.device("/gpu:0"):
            y = x * 2.0
        with pytest.raises(InvalidArgumentError,
                           match=r"/gpu:0.*cupy is not installed.*pip install 'dcf\[gpu\]'"):
            with dcf.Session() as sess:
                sess.run(y, {x: 1.0})
    finally:
        gpu_devices.count.cache_clear()


# ------------------------------------------------------------------ the worker's command line
@pytest.fixture
def worker_main(monkeypatch):
    """worker.main without its process-wide settings (this is the test's process)."""
    for name in ("DCF_TASK_INDEX", "DCF_WORKER_CPUS", "DCF_WORKER_LOG", "DCF_SECRET_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(worker, "_own_process", lambda: None)
    monkeypatch.setattr(worker.logging, "basicConfig", lambda **kw: None)
    return worker.main


def _usage_error(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_worker_with_a_missing_spec_file_is_a_usage_error(worker_main, capsys, tmp_path):
    err = _usage_error(worker_main, ["--task", "0", "--cluster", str(tmp_path / "no.json")],
                       capsys)
    assert "cannot use the cluster spec" in err and "no.json" in err


def test_worker_with_a_malformed_spec_is_a_usage_error(worker_main, capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    err = _usage_error(worker_main, ["--task", "0", "--cluster", str(bad)], capsys)
    assert "cannot use the cluster spec" in err and "bad.json" in err
    bad.write_text("[1]")
    err = _usage_error(worker_main, ["--task", "0", "--cluster", str(bad)], capsys)
    assert "JSON object" in err


def test_worker_with_a_non_integer_task_index_is_a_usage_error(worker_main, capsys,
                                                                monkeypatch):
    monkeypatch.setenv("DCF_TASK_INDEX", "x")
    err = _usage_error(worker_main, ["--cluster", "c.json"], capsys)
    assert "$DCF_TASK_INDEX" in err and "'x'" in err


def test_worker_with_an_unknown_log_level_is_a_usage_error(worker_main, capsys):
    err = _usage_error(worker_main, ["--task", "0", "--log-level", "verbose"], capsys)
    assert "'verbose' is not a logging level" in err


# ------------------------------------------------------------------ local workers
@pytest.mark.cluster
def test_local_workers_run_the_clients_dcf_not_a_dcf_in_the_working_directory(
        tmp_path, monkeypatch):
    shadow = tmp_path / "dcf"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('the dcf of the working directory')")
    monkeypatch.chdir(tmp_path)
    with dcf.Cluster.local(1, start_timeout_s=20) as cluster:
        with dcf.device("/job:worker/task:0/cpu:0"):
            y = dcf.constant(2.0) * 3.0
        with dcf.Session(cluster=cluster) as sess:
            assert sess.run(y) == 6.0


# ------------------------------------------------------------------ examples without extras
def _example(name: str, monkeypatch):
    """A fresh examples/NAME.py as a module (registered while the test runs, as its
    dataclasses need)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"review6_{name}",
                                                  ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name, argv, missing, extra", [
    ("dqn_cartpole", ["--steps", "1"], "gymnasium", "rl"),
    ("dqn_cartpole", ["--steps", "1", "--plot", "x.png"], "matplotlib", "plot"),
    ("reinforce_rollout", ["--episodes", "1"], "gymnasium", "rl"),
    ("service", ["--selftest"], "aiohttp", "services"),
])
def test_an_example_without_its_extra_names_the_extra(name, argv, missing, extra,
                                                       monkeypatch, capsys):
    mod = _example(name, monkeypatch)
    monkeypatch.setitem(sys.modules, missing, None)
    err = _usage_error(mod.main, argv, capsys)
    assert f"needs {missing}: pip install -e '.[{extra}]'" in err
