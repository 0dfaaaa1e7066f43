"""Corpus readers: every supported format yields the same documents; provenance in errors."""

from __future__ import annotations

import csv
import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retriever.index.readers import read_corpus, read_qrels, read_queries
from retriever import CorpusError, Retriever, build_index

DOCS = [{"_id": "a", "title": "Alpha", "text": "first document about cats", "year": 2001},
        {"_id": "b", "title": "", "text": "second document about dogs", "year": 2002},
        {"_id": "c", "title": "Gamma", "text": "third, with ünïcödé and 日本", "year": 2003}]


def _expect(docs):
    return [(d.id, d.title, d.text, d.metadata) for d in docs]


WANT = [(d["_id"], d["title"], d["text"], {"year": d["year"]}) for d in DOCS]


def test_jsonl_gz_parquet_csv_iterable_agree(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text("\n".join(json.dumps(d, ensure_ascii=False) for d in DOCS) + "\n\n", encoding="utf-8")
    g = tmp_path / "c.jsonl.gz"
    g.write_bytes(gzip.compress(p.read_bytes()))
    pq.write_table(pa.Table.from_pylist(DOCS), tmp_path / "c.parquet")
    with open(tmp_path / "c.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["_id", "title", "text", "year"])
        w.writeheader()
        w.writerows(DOCS)
    assert _expect(read_corpus(p)) == WANT
    assert _expect(read_corpus(g)) == WANT
    assert _expect(read_corpus(tmp_path / "c.parquet")) == WANT
    csv_docs = _expect(read_corpus(tmp_path / "c.csv"))
    assert [(i, t, x) for i, t, x, _ in csv_docs] == [(i, t, x) for i, t, x, _ in WANT]
    assert _expect(read_corpus(iter(DOCS))) == WANT


def test_beir_folder_and_queries_qrels(data_dir):
    n = sum(1 for _ in read_corpus(data_dir / "cranfield"))
    assert n == 1400
    q = read_queries(data_dir / "cranfield" / "queries.jsonl")
    assert len(q) == 225
    qrels = read_qrels(data_dir / "cranfield" / "qrels.tsv")
    assert sum(len(v) for v in qrels.values()) == 1837


def test_metadata_roundtrip_through_index(tmp_path):
    build_index(DOCS, tmp_path / "i", legs=("bm25",), show_progress=False)
    hits = Retriever.open(tmp_path / "i").search("cats", k=3, mode="bm25")
    assert hits[0].id == "a" and hits[0].metadata == {"year": 2001} and hits[0].title == "Alpha"


@pytest.mark.parametrize("content, match", [
    (b'{"_id": "a", "text": "x"}\nnot json\n', "line 2"),
    (b'{"_id": "a", "text": "x"}\n{"text": "no id"}\n', "line 2.*_id"),
    (b'{"_id": "a", "text": "x"}\n{"_id": "b", "text": "\xff\xfe"}\n', "line 2.*UTF-8"),
    (b'[1, 2]\n', "line 1.*JSON object"),
    (b'{"_id": "a", "text": 5}\n', "line 1.*text"),
])
def test_bad_lines_name_file_and_line(tmp_path, content, match):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(content)
    with pytest.raises(CorpusError, match=match) as e:
        list(read_corpus(p))
    assert "bad.jsonl" in str(e.value)


def test_unknown_format_and_missing(tmp_path):
    (tmp_path / "c.xml").write_text("<x/>")
    with pytest.raises(CorpusError, match="unknown corpus format"):
        read_corpus(tmp_path / "c.xml")
    with pytest.raises(CorpusError, match="not found"):
        read_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(CorpusError, match="corpus.jsonl"):
        read_corpus(tmp_path)


@pytest.mark.parametrize("ext,sep", [("csv", ","), ("tsv", "\t")])
@pytest.mark.parametrize("bad_line", [2, 3, 151, 5000])
def test_csv_non_utf8_is_named_at_its_own_line(tmp_path, ext, sep, bad_line):
    """A bad byte in a CSV / TSV is named at its physical line and column (the text wrapper decoded
    ahead in 8 KiB chunks: the error named the row after the last one parsed, up to ~60 lines
    early, line 2 as the header's line 1)."""
    from retriever.index.errors import CorpusError
    from retriever.index.readers import read_corpus

    rows = [f"d{i}{sep}hello {i} {'y' * 100}\n".encode() for i in range(2, 6000)]
    rows[bad_line - 2] = f"d{bad_line}{sep}h".encode() + b"\xff" + b"llo\n"
    p = tmp_path / f"c.{ext}"
    p.write_bytes(b"\xef\xbb\xbf" + f"_id{sep}text\n".encode() + b"".join(rows))
    with pytest.raises(CorpusError, match=rf"line {bad_line}: not valid UTF-8 \(byte b'\\xff' at column "
                                          rf"{len(f'd{bad_line}') + 3}\)") as ei:
        for _ in read_corpus(p):
            pass
    assert ei.value.line == bad_line
    p.write_bytes(b"\xef\xbb\xbf" + f"_id{sep}text\n".encode() + b"".join(rows[:bad_line - 2] + rows[bad_line - 1:]))
    assert sum(1 for _ in read_corpus(p)) == 5997  # a byte-order mark and every good row read
