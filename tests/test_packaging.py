"""Packaging: the build side (the ``index/`` folder) is installed as ``retriever.index``, never as a
top-level import package named ``index`` (which would collide with a user's own ``index`` module)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_index_is_a_subpackage_and_not_top_level(tmp_path: Path) -> None:
    # outside the repository (no repo root on sys.path), as a user's program runs
    res = _run("import retriever, retriever.index.pipeline as p, retriever.index.config as c\n"
               "print(p.__file__)\n"
               "try:\n    import index\nexcept ModuleNotFoundError:\n    print('no top-level index')\n"
               "else:\n    print('top-level index at', index.__file__)\n", tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert Path(lines[0]).resolve() == (REPO / "index" / "pipeline.py").resolve()
    assert lines[1] == "no top-level index"


def test_a_user_module_named_index_does_not_collide(tmp_path: Path) -> None:
    (tmp_path / "index.py").write_text("VALUE = 'the user module'\n")
    res = _run("import index\nimport retriever\nfrom retriever import build_index\n"
               "print(index.VALUE, build_index.__module__)\n", tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "the user module retriever.index.pipeline"


def test_no_module_imports_the_top_level_name() -> None:
    offenders = []
    for folder in ("retriever", "index", "benchmarks", "tests"):
        for path in (REPO / folder).rglob("*.py"):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                s = line.strip()
                if s.startswith(("from index.", "from index import", "import index")):
                    offenders.append(f"{path.relative_to(REPO)}:{i}: {s}")
    assert not offenders, offenders
