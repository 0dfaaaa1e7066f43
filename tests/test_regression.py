"""Regression pins (tests/regression/expected.yaml, runner ``python -m tests.regression.run``):
the fast pins (BM25 on every collection) run in the default suite, the encoder-heavy ones are slow."""

from __future__ import annotations

import pytest

from tests.regression.run import PinFileError, check, load_pins, main

PIN = """
pins:
  - name: medline.bm25
    collection: medline
    legs: [bm25]
    mode: bm25
    metrics: {{ndcg@10: {ndcg}, recall@100: 0.765461}}
"""


def test_pins_cover_every_collection(data_dir):
    """Every collection in the data folder has a fast BM25 pin; the SciFact BM25 pin is Pyserini's
    published BM25-flat figure to the fourth decimal; dense and hybrid SciFact pins exist."""
    pins = load_pins()
    on_disk = {d.name for d in data_dir.iterdir() if (d / "qrels.tsv").is_file()}
    fast_bm25 = {p.collection for p in pins if not p.slow and p.mode == "bm25"}
    assert on_disk and on_disk <= fast_bm25
    by_name = {p.name: p for p in pins}
    assert by_name["scifact.bm25"].metrics == pytest.approx({"ndcg@10": 0.6789, "recall@100": 0.9253}, abs=5e-5)
    assert by_name["scifact.dense"].slow and by_name["scifact.hybrid-rrf"].slow
    assert by_name["scifact.hybrid-rrf"].mode == "hybrid" and by_name["scifact.hybrid-rrf"].fusion == "rrf"


def test_fast_pins(data_dir):
    """The non-slow pins measured now equal the pinned values (within each pin's tolerance)."""
    pins = load_pins()
    report = check(pins, data=data_dir, echo=None)
    assert report.ok, "\n".join(line.format() for line in report.lines if line.status != "OK")
    fast = sum(len(p.metrics) for p in pins if not p.slow)
    assert [line.status for line in report.lines].count("OK") == fast
    assert all(line.status == "SKIP" for line in report.lines if line.status != "OK")


@pytest.mark.slow
def test_slow_pins(data_dir):
    """Every pin, the dense encoding of SciFact included (minutes on two cores)."""
    report = check(load_pins(), slow=True, data=data_dir, echo=None)
    assert report.ok, "\n".join(line.format() for line in report.lines if line.status != "OK")
    assert all(line.status == "OK" for line in report.lines)


def test_runner_prints_ok_and_fail(tmp_path, data_dir, capsys, monkeypatch):
    """A wrong expected value gives a FAIL line with expected and measured values and exit 1."""
    monkeypatch.setenv("RETRIEVER_DATA", str(data_dir))
    f = tmp_path / "pins.yaml"
    f.write_text(PIN.format(ndcg=0.5))
    assert main(["--file", str(f)]) == 1
    out = capsys.readouterr().out.splitlines()
    fail = next(line for line in out if line.startswith("FAIL"))
    assert "medline.bm25" in fail and "ndcg@10" in fail and "expected 0.500000" in fail and "measured 0.662238" in fail
    assert any(line.startswith("OK") and "recall@100" in line for line in out)
    assert "1 OK, 1 FAIL, 0 skipped" in out[-1]
    f.write_text(PIN.format(ndcg=0.662238))
    assert main(["--file", str(f), "--index-dir", str(tmp_path / "ix")]) == 0
    assert (tmp_path / "ix" / "medline-bm25" / "CURRENT").is_file()
    assert main(["--file", str(f), "--index-dir", str(tmp_path / "ix")]) == 0  # reused index
    assert "2 OK, 0 FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.replace("ndcg@10:", "ndcg@20:"), "unknown metric 'ndcg@20'"),
    (lambda t: t.replace("0.765461", "1.5"), "metrics recall@100: expected a number in \\[0, 1\\]"),
    (lambda t: t.replace("    mode: bm25\n", ""), "pin 'medline.bm25': missing field 'mode'"),
    (lambda t: t.replace("    mode: bm25\n", "    mode: bm25\n    modes: x\n"), "unknown field\\(s\\) \\['modes'\\]"),
    (lambda t: t + t.split("pins:\n")[1], "pin 'medline.bm25': duplicate pin name"),
    (lambda t: t.replace("[bm25]", "bm25"), "legs: expected a list of leg names"),
    (lambda t: "pins: 3", "expected a mapping with a 'pins' list"),
])
def test_pin_file_errors(tmp_path, capsys, edit, match):
    f = tmp_path / "pins.yaml"
    f.write_text(edit(PIN.format(ndcg=0.66)))
    with pytest.raises(PinFileError, match=match):
        load_pins(f)
    assert main(["--file", str(f)]) == 2
    assert str(f) in capsys.readouterr().err


def test_missing_collection_is_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RETRIEVER_DATA", str(tmp_path / "nowhere"))
    f = tmp_path / "pins.yaml"
    f.write_text(PIN.format(ndcg=0.66))
    assert main(["--file", str(f)]) == 2
    assert "collection 'medline' not found" in capsys.readouterr().err
