"""Review 4 of examples/ and docs/: square roots of small x in service.py (and its docs
version), where trace_timeline.py writes, dcf.trace.plot leaving pyplot alone, the
examples' flag checks, and the docs' words against the code."""

from __future__ import annotations

import ast
import asyncio
import hashlib
import inspect
import json
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import dcf

ROOT = Path(__file__).resolve().parents[2]
SMALL_X = np.array([1e-30, 1e-20, 1e-16, 1e-12, 3e-7, 0.25, 1e-300, 5e-324, 2.0, 1e12])


def _rel_err(got: np.ndarray, x: np.ndarray) -> np.ndarray:
    want = np.sqrt(x)                                   # numpy, correctly rounded
    return np.abs(got - want) / want


# ------------------------------------------------------------------ service.py: small x
def test_service_solver_gives_full_precision_for_small_x(example):
    service = example("service")

    async def solve(values: np.ndarray, tol: float):
        s = service.SqrtSolver()
        await s.start()
        try:
            return await s.solve(values, tol)
        finally:
            await s.close()

    for tol in (service.DEFAULT_TOL, 1e-6):
        y, k = asyncio.run(solve(SMALL_X, tol))
        # Newton: e' = e^2 / 2 and the step is ~e, so a last relative step below tol
        # leaves a relative error below tol^2 / 2 (plus rounding)
        assert np.max(_rel_err(y, SMALL_X)) < tol ** 2 + 1e-15, (tol, y)
        assert 0 < k < service.MAX_ITERATIONS
    y, k = asyncio.run(solve(np.array([0.0, 1e-30, 0.0]), service.DEFAULT_TOL))
    assert y[0] == 0.0 and y[2] == 0.0 and abs(y[1] / 1e-15 - 1) < 1e-14
    y, k = asyncio.run(solve(np.zeros(3), service.DEFAULT_TOL))   # x = 0 alone: no spin
    assert np.all(y == 0.0) and k == 1
    with pytest.raises(ValueError, match="concurrency"):
        service.SqrtSolver(concurrency=0)


def test_services_doc_newton_block_is_right_for_small_x():
    text = (ROOT / "docs" / "services.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python[ \t]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    code = next(b for b in blocks if "def body(i, y, _)" in b and "root" in b)
    ns: dict = {"__name__": "docs_services"}
    exec(compile(code, "docs/services.md", "exec"), ns)     # noqa: S102 - runs as in test_docs
    with dcf.Session(ns["g"]) as sess:
        y, k = sess.run([ns["root"], ns["iterations"]], {ns["x"]: SMALL_X})
        zeros = sess.run(ns["root"], {ns["x"]: np.array([0.0, 0.0])})
    assert np.max(_rel_err(y, SMALL_X)) < 1e-14 and k < 1000
    assert np.all(zeros == 0.0)


# --------------------------------------------------------- trace_timeline.py: outputs
def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def timeline(example, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    dcf.reset_default_graph()
    yield example("trace_timeline")
    dcf.reset_default_graph()


def test_trace_timeline_default_writes_in_the_current_directory(timeline, tmp_path):
    tracked = [ROOT / "bench" / "results" / f"trace-split-loop.{e}" for e in ("png", "json")]
    before = [_sha(p) for p in tracked if p.exists()]
    timeline.cli([])
    assert [_sha(p) for p in tracked if p.exists()] == before     # README picture untouched
    png, js = tmp_path / "trace-split-loop.png", tmp_path / "trace-split-loop.json"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(js.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names.values()) == ["/cpu:0", "/cpu:1"]
    # what the docstring and README say: the two tracks take turns, never overlap
    spans = {pid: [(e["ts"], e["ts"] + e["dur"]) for e in events
                   if e["ph"] == "X" and e["pid"] == pid] for pid in names}
    (_, sa), (_, sb) = spans.items()
    assert not any(t0 < u1 and u0 < t1 for t0, t1 in sa for u0, u1 in sb)


@pytest.mark.parametrize("arg,picture,trace,magic", [
    ("sub/dir/out.svg", "sub/dir/out.svg", "sub/dir/out.json", b"<?xml"),
    ("noext", "noext.png", "noext.json", b"\x89PNG"),
])
def test_trace_timeline_names_and_folders(timeline, tmp_path, arg, picture, trace, magic):
    timeline.cli([arg])
    assert (tmp_path / picture).read_bytes()[: len(magic)] == magic
    assert "traceEvents" in json.loads((tmp_path / trace).read_text())
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")
                  if p.is_file()) == sorted([picture, trace])


def test_trace_timeline_refuses_a_json_picture(timeline, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        timeline.cli(["t.json"])
    assert e.value.code == 2 and "overwritten by the trace JSON" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------- dcf.trace.plot and pyplot
_EVENTS = [("/cpu:0", "a", "MatMul", "", 0, 10.0, 10.001),
           ("/cpu:1", "b", "Tanh", "while", 1, 10.001, 10.003)]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_trace_plot_leaves_the_callers_pyplot_backend_and_figures_alone(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "t.png"
    code = textwrap.dedent(f"""
        import json, matplotlib
        matplotlib.use("svg")                     # stands in for a notebook's backend
        import matplotlib.pyplot as plt
        import dcf
        fig = plt.figure(); plt.plot([1, 2, 3])
        state = lambda: [matplotlib.get_backend(), plt.get_fignums(), plt.gcf() is fig]
        before = state()
        written = dcf.trace.plot({_EVENTS!r}, {str(out)!r}, title="t")
        print(json.dumps([before, state(), written]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    before, after, written = json.loads(r.stdout.strip().splitlines()[-1])
    assert before == ["svg", [1], True] and after == before
    assert written == str(out)
    assert _png_size(out.read_bytes()) == (1200, round(100 * (1 + 0.6 * 2)))  # 12 in, 100 dpi


def test_trace_plot_path_without_extension_and_file_objects(tmp_path):
    pytest.importorskip("matplotlib")
    import io

    written = dcf.trace.plot(_EVENTS, str(tmp_path / "noext"))
    assert written == str(tmp_path / "noext.png")
    assert _png_size((tmp_path / "noext.png").read_bytes())[0] == 1200
    buf = io.BytesIO()
    assert dcf.trace.plot(_EVENTS, buf) is buf
    assert _png_size(buf.getvalue())[0] == 1200


# --------------------------------------------------------------- flags of the examples
@pytest.mark.parametrize("name,argv,flag", [
    ("service", ["--port", "0", "--concurrency", "0"], "--concurrency"),   # (hung before)
    ("service", ["--selftest", "--requests", "0"], "--requests"),
    ("service", ["--selftest", "--values", "0"], "--values"),
    ("service", ["--selftest", "--values", "-5"], "--values"),
    ("service", ["--selftest", "--values", "many"], "--values"),
    ("service", ["--selftest", "--values", "2000000"], "--values"),
    ("moe_rnn", ["--steps", "0"], "--steps"),
    ("moe_rnn", ["--experts", "2", "--top-k", "3"], "--top-k"),
    ("moe_rnn", ["--workers", "-1"], "--workers"),
    ("moe_rnn", ["--workers", "2", "--devices", "3"], "--devices"),    # (ignored before)
    ("reinforce_rollout", ["--report-every", "0"], "--report-every"),
    ("reinforce_rollout", ["--episodes", "0"], "--episodes"),
    ("simulation", ["--steps", "0"], "--steps"),
    ("dqn_cartpole", ["--steps", "0"], "--steps"),
    ("dqn_cartpole", ["--steps", "-5"], "--steps"),
])
@pytest.mark.timeout(60)
def test_bad_flags_are_refused_with_a_message(example, capsys, name, argv, flag):
    with pytest.raises(SystemExit) as e:
        example(name).main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {flag}:" in err, err


@pytest.mark.parametrize("name,ending", [
    ("moe_rnn", "whose trip count depends on a learned halting probability."),
    ("simulation", "aggregates their results every iteration. One Session.run per round."),
])
def test_help_shows_the_whole_first_paragraph(example, capsys, name, ending):
    with pytest.raises(SystemExit):
        example(name).main(["--help"])
    assert ending in " ".join(capsys.readouterr().out.split())


def test_moe_rnn_prints_rounded_importance(example, capsys):
    moe = example("moe_rnn")
    assert moe.format_floats(np.array([49.15, 16.86, 0.0], np.float32)) == "[49.15, 16.86, 0.00]"
    moe.main(["--steps", "1", "--batch", "2", "--seq", "3", "--units", "4",
              "--experts", "2", "--top-k", "1", "--devices", "1"])
    line = next(ln for ln in capsys.readouterr().out.splitlines()
                if ln.startswith("expert importance"))
    values = re.search(r"\[(.*)\]", line).group(1).split(", ")
    assert all(re.fullmatch(r"\d+\.\d\d", v) for v in values), line
    assert abs(sum(map(float, values)) - 2 * 3) < 0.02     # gates sum to 1 per example, step


# --------------------------------------------------------------- docs against the code
def test_docs_give_cluster_local_its_real_signature():
    if not hasattr(dcf, "Cluster"):
        pytest.skip("needs dcf.Cluster")
    text = " ".join((ROOT / "docs" / "devices-and-clusters.md").read_text().split())
    doc = re.search(r"`Cluster\.local\((.*?)\)`", text).group(1)
    fn = ast.parse(f"def local({doc}): pass").body[0].args
    real = list(inspect.signature(dcf.Cluster.local).parameters.values())
    assert [a.arg for a in fn.args][1:] == [p.name for p in real
                                            if p.kind is p.POSITIONAL_OR_KEYWORD][1:]
    assert [a.arg for a in fn.kwonlyargs] == [p.name for p in real if p.kind is p.KEYWORD_ONLY]
    defaults = [ast.literal_eval(d) for d in fn.defaults + fn.kw_defaults]
    assert defaults == [p.default for p in real[1:]]


def test_readme_caption_and_regenerate_command_match_the_picture():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "named by op" not in text and "coloured by op type" in text
    assert "python examples/trace_timeline.py bench/results/trace-split-loop.png" in text
    doc = " ".join((ROOT / "examples" / "trace_timeline.py").read_text().split())
    assert "iterations overlapping" not in doc and "take turns" in doc


def test_bench_notes_name_files_that_exist_or_say_what_became_of_them():
    text = (ROOT / "bench" / "NOTES.md").read_text(encoding="utf-8")
    for m in re.finditer(r"`(dcf/[\w/]+\.py)`", text):
        if (ROOT / m.group(1)).exists():
            continue
        before, after = text[max(0, m.start() - 12): m.start()], text[m.end(): m.end() + 400]
        assert "then " in before or "not committed" in after, m.group(1)


def test_compare_extra_admits_the_torch_the_bench_results_were_measured_with():
    try:
        import tomllib
    except ImportError:                  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    from packaging.requirements import Requirement
    from packaging.version import Version

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["compare"]
    torch = next(Requirement(r) for r in extras if Requirement(r).name == "torch")
    seen = set()
    for path in (ROOT / "bench" / "results").glob("*.json"):
        seen.update(re.findall(r'"torch": "([0-9][^"]*)"', path.read_text(errors="replace")))
    assert seen, "no bench result records its torch version"
    for v in seen:
        assert torch.specifier.contains(Version(v).public, prereleases=True), (v, str(torch))
