"""Every ```python block of the guide in docs/ runs, each in a fresh default graph and a
temporary working directory.

A block whose first line is `# needs: NAME[, NAME...]` is skipped unless each need is
met: a module name (pytest.importorskip), `gpu` (cupy and a CUDA GPU: the gpu extra), or
`cluster` (`dcf.Cluster` exists).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import dcf

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ("control-flow.md", "gradients.md", "devices-and-clusters.md",
         "gpus-and-swapping.md", "rl.md", "services.md", "variables-and-checkpoints.md")
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def blocks() -> list:
    out = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 2          # first line of the code
            out.append(pytest.param(page.name, line, m.group(1), id=f"{page.name}:{line}"))
    return out


def _check_needs(code: str) -> None:
    first = code.lstrip().splitlines()[0] if code.strip() else ""
    m = re.match(r"#\s*needs:\s*(.+)", first)
    if not m:
        return
    for need in (n.strip() for n in m.group(1).split(",")):
        if need == "gpu":
            pytest.importorskip("cupy")
            from dcf import gpu_devices

            if gpu_devices.count() == 0:
                pytest.skip("needs a CUDA GPU (the gpu extra)")
        elif need == "cluster":
            if not hasattr(dcf, "Cluster"):
                pytest.skip("needs dcf.Cluster")
        else:
            pytest.importorskip(need)


@pytest.mark.parametrize("page,line,code", blocks())
def test_block_runs(page: str, line: int, code: str, tmp_path, monkeypatch) -> None:
    _check_needs(code)
    monkeypatch.chdir(tmp_path)
    dcf.reset_default_graph()
    exec(compile(code, f"docs/{page}:{line}", "exec"), {"__name__": f"docs_{page}"})  # noqa: S102


def test_the_guide_has_its_pages_and_shows_the_tools() -> None:
    for name in PAGES:
        assert (DOCS / name).is_file(), name
    runnable = "\n".join(p.values[2] for p in blocks())
    assert "dcf.trace.plot(" in runnable and "dcf.graph_to_dot(" in runnable
    assert all(any(p.values[0] == name for p in blocks()) for name in PAGES)


def test_readme_block_runs(tmp_path, monkeypatch, capsys) -> None:
    # the first thing a new user runs; no other test ran it
    readme = DOCS.parent / "README.md"
    (code,) = _FENCE.findall(readme.read_text(encoding="utf-8"))
    monkeypatch.chdir(tmp_path)
    dcf.reset_default_graph()
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102
    y, dw = eval(capsys.readouterr().out.replace("np.float32", ""))   # noqa: S307
    assert abs(y - 3.0) < 1e-3 and abs(dw) < 1e-2       # trained: y at its target 3


def test_readme_and_guide_list_every_example() -> None:
    names = {p.name for p in (DOCS.parent / "examples").glob("*.py")}
    for page, start in ((DOCS.parent / "README.md", "- Examples ("),
                        (DOCS / "README.md", "Runnable programs:")):
        text = page.read_text(encoding="utf-8")
        para = text[text.index(start):].split("\n\n")[0]
        assert set(re.findall(r"`(\w+\.py)`", para)) == names, page
