"""The README stays documentation: its figures are the generated table of the committed results
(each row naming its command), its test command is the one CI runs, and it stays short."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.report import RESULTS, readme_rows
from benchmarks.update_readme import END, START, render

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_figures_are_the_generated_table():
    """The block between the markers is exactly what ``python -m benchmarks.update_readme`` writes
    from ``benchmarks/results/`` now (regenerate it after changing a results file)."""
    text = README.read_text()
    assert text.count(START) == 1 and text.count(END) == 1
    block = text[text.index(START) + len(START):text.index(END)].strip("\n")
    assert block == render(RESULTS).strip("\n")


def test_readme_rows_name_their_commands():
    rows = readme_rows(RESULTS)
    assert rows, "no figures rendered from benchmarks/results/"
    for figure, value, where, command in rows:
        assert re.fullmatch(r"`(python3? |retriever )[^`]+`", command), (figure, command)
        assert value and "?" not in where, (figure, where)


def test_readme_test_command_is_ci_command():
    """The README's test command and ``.ci/run`` stay in step (CI pins torch the same way and
    calls the interpreter ``python3``)."""
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    blocks = re.findall(r"```bash\n(.*?)\n```", README.read_text(), re.S)
    test_cmd = next(b for b in blocks if "pytest" in b)
    assert re.sub(r"\bpython3 ", "python ", ci.replace("python3 -m pip install -q", "pip install")) == test_cmd
    main_job = next(b for b in blocks if "retriever index build" in b)
    assert main_job.startswith("pip install torch==2.13.0 && pip install -e . && ")
    assert "retriever eval idx/scifact" in main_job


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 300
