"""Bad input through the library and the CLI: each gives a clear error naming file / line / field
(CLI: exit 1, one line ``error: ...`` on stderr, no traceback) or a documented defined result;
a failed build leaves no partial index and keeps an existing index intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli_error as _cli_error, random_corpus
from retriever.index.errors import CorpusError, IndexExistsError, IndexFormatError, ModelError, QueryError
from retriever import Retriever, build_index
from retriever.cli import main


def _jsonl(path: Path, lines: list) -> Path:
    with open(path, "wb") as f:
        for x in lines:
            f.write(x if isinstance(x, bytes) else (json.dumps(x) if not isinstance(x, str) else x).encode())
            f.write(b"\n")
    return path


def _no_leftovers(parent: Path, name: str) -> None:
    assert not (parent / name).exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{name}.")]


GOOD = {"_id": "a", "title": "t", "text": "vitamin bone"}
BAD_CORPORA = {
    "not_json": ([GOOD, "{not json", GOOD], r"line 2.*not valid JSON"),
    "missing_id": ([GOOD, {"text": "x"}], r"line 2.*'_id'.*missing document id"),
    "duplicate_id": ([GOOD, {"_id": "b", "text": "y"}, GOOD], r"line 3.*'_id'.*duplicate document id 'a'"),
    "non_utf8": ([GOOD, b'{"_id": "z", "text": "caf\xe9"}'], r"line 2.*not valid UTF-8"),
    "empty_id": ([GOOD, {"_id": "  ", "text": "x"}], r"line 2.*document id is empty"),
    "text_not_string": ([{"_id": "q", "text": 5}], r"line 1.*'text'.*must be a string"),
    "missing_text": ([{"_id": "q", "body": "x"}], r"line 1.*'text'.*no 'text' field"),
    "nul_char": ([{"_id": "q", "text": "a\u0000b"}], r"line 1.*NUL character"),
    "not_object": (["[1, 2]"], r"line 1.*expected a JSON object"),
    "empty_corpus": ([], r"corpus is empty"),
    "only_blank_lines": (["", "   "], r"corpus is empty"),
}


@pytest.mark.parametrize("case", list(BAD_CORPORA))
def test_bad_corpus_library_and_cli(tmp_path, capsys, case):
    lines, pattern = BAD_CORPORA[case]
    corpus = _jsonl(tmp_path / "corpus.jsonl", lines)
    with pytest.raises(CorpusError, match=pattern) as ei:
        build_index(str(corpus), tmp_path / "idx", legs=("bm25",), show_progress=False)
    if case not in ("empty_corpus", "only_blank_lines"):
        assert str(corpus) in str(ei.value)
    _no_leftovers(tmp_path, "idx")
    err = _cli_error(capsys, ["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "idx"),
                              "--legs", "bm25", "--no-progress"])
    assert __import__("re").search(pattern, err)
    _no_leftovers(tmp_path, "idx")


def test_failed_rebuild_keeps_existing_index(tmp_path, capsys):
    good = _jsonl(tmp_path / "good.jsonl", random_corpus(40, seed=2, min_len=1))
    out = tmp_path / "idx"
    build_index(str(good), out, legs=("bm25",), show_progress=False)
    before = Retriever.open(out).search_arrays(["vitamin bone", "heart"], k=10).ids.tolist()
    bad = _jsonl(tmp_path / "bad.jsonl", [*random_corpus(30, seed=3), "{oops"])
    with pytest.raises(CorpusError, match="line 31"):
        build_index(str(bad), out, legs=("bm25",), overwrite=True, show_progress=False)
    _cli_error(capsys, ["index", "build", "--corpus", str(bad), "--out", str(out), "--legs", "bm25",
                        "--no-progress", "--overwrite"])
    assert Retriever.open(out, verify=True).search_arrays(["vitamin bone", "heart"], k=10).ids.tolist() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".idx.")]


def test_missing_corpus_and_bad_format(tmp_path, capsys):
    err = _cli_error(capsys, ["index", "build", "--corpus", str(tmp_path / "nope.jsonl"), "--out",
                              str(tmp_path / "i"), "--legs", "bm25", "--no-progress"])
    assert "nope.jsonl" in err and "not found" in err
    (tmp_path / "x.docx").write_text("hi")
    err = _cli_error(capsys, ["index", "build", "--corpus", str(tmp_path / "x.docx"), "--out",
                              str(tmp_path / "i"), "--legs", "bm25", "--no-progress"])
    assert "unknown corpus format" in err
    _no_leftovers(tmp_path, "i")


def test_dense_model_path_missing(tmp_path, capsys):
    corpus = _jsonl(tmp_path / "c.jsonl", [GOOD])
    missing = tmp_path / "no_such_model"
    with pytest.raises(ModelError, match="no_such_model"):
        build_index(str(corpus), tmp_path / "idx", legs=("bm25", "dense"), show_progress=False,
                    dense=__import__("retriever.index.config", fromlist=["DenseConfig"]).DenseConfig(model=str(missing)))
    err = _cli_error(capsys, ["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "idx"),
                              "--legs", "bm25,dense", "--dense-model", str(missing), "--no-progress"])
    assert "no_such_model" in err
    _no_leftovers(tmp_path, "idx")


def test_bad_index_paths(tmp_path, capsys):
    with pytest.raises(IndexFormatError, match="not found"):
        Retriever.open(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexFormatError, match="not an index"):
        Retriever.open(tmp_path / "empty")
    for cmd in (["search", str(tmp_path / "empty"), "q"], ["index", "info", str(tmp_path / "missing")],
                ["index", "verify", str(tmp_path / "empty")]):
        assert "error: " in _cli_error(capsys, cmd)


def test_output_is_a_file(tmp_path, capsys):
    corpus = _jsonl(tmp_path / "c.jsonl", [GOOD])
    (tmp_path / "f").write_text("x")
    with pytest.raises(IndexFormatError, match="not a directory"):
        build_index(str(corpus), tmp_path / "f", legs=("bm25",), show_progress=False)
    assert (tmp_path / "f").read_text() == "x"


# ---------------------------------------------------------------------------
# Queries
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("err") / "idx"
    docs = random_corpus(30, seed=9, min_len=1) + [{"_id": "empty", "text": ""}, {"_id": "stop", "text": "the and of"}]
    build_index(docs, out, legs=("bm25",), show_progress=False)
    return out


@pytest.mark.parametrize("q", ["", "   ", "!!!", "?.,;:", "\t\n", "the of and", "😀😀"])
def test_blank_or_punctuation_query_gives_no_hits(small, capsys, q):
    r = Retriever.open(small)
    assert r.search(q, k=5) == []
    res = r.search_arrays([q, "vitamin"], k=5)
    assert res.n_found[0] == 0 and res.n_found[1] > 0
    assert main(["search", str(small), q, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"] == []


def test_empty_document_is_indexed_but_never_matches(small):
    r = Retriever.open(small)
    assert r.reader.n_docs == 32
    assert "empty" not in r.doc_ids(r.search_arrays(["vitamin bone heart gene"], k=32).ids[0]).tolist()


def test_k_larger_than_corpus(small):
    r = Retriever.open(small)
    hits = r.search("vitamin", k=10_000)
    assert 0 < len(hits) <= 32
    assert [h.id for h in hits] == [h.id for h in r.search("vitamin", k=len(hits))]


@pytest.mark.parametrize("k", [0, -1, 1.5, "3", True, None])
def test_bad_k(small, capsys, k):
    r = Retriever.open(small)
    with pytest.raises(QueryError, match="k must be"):
        r.search("vitamin", k=k)
    if isinstance(k, int) and not isinstance(k, bool):
        with pytest.raises(SystemExit) as ei:  # argparse usage error: exit 2, one line on stderr
            main(["search", str(small), "vitamin", "-k", str(k)])
        assert ei.value.code == 2
        assert "expected an integer >= 1" in capsys.readouterr().err


def test_bad_query_types_and_modes(small):
    r = Retriever.open(small)
    with pytest.raises(QueryError):
        r.search(None)  # type: ignore[arg-type]
    with pytest.raises(QueryError):
        r.search_batch("not a list")  # type: ignore[arg-type]
    with pytest.raises(QueryError, match="not available"):
        r.search("vitamin", mode="dense")
    with pytest.raises(QueryError, match="unknown mode"):
        r.search("vitamin", mode="magic")
    with pytest.raises(QueryError, match="no dense leg"):
        r.search_arrays(["x"], query_vectors=[[0.0] * 4])


def test_existing_target_without_overwrite_cli(small, tmp_path, capsys):
    corpus = _jsonl(tmp_path / "c.jsonl", [GOOD])
    err = _cli_error(capsys, ["index", "build", "--corpus", str(corpus), "--out", str(small), "--legs", "bm25", "--no-progress"])
    assert "--overwrite" in err
    with pytest.raises(IndexExistsError):
        build_index(str(corpus), small, legs=("bm25",), show_progress=False)
    assert Retriever.open(small).reader.n_docs == 32
