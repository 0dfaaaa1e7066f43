"""Index format 2: generations and the CURRENT pointer, per-shard statistics, typed metadata columns,
format-1 read refusal and ``retriever index upgrade``, and the batched document fetch."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from conftest import ROOT, random_corpus
from retriever import CorpusError, Retriever, build_index
from retriever.cli import main as cli_main
from retriever.index.errors import IndexFormatError, IndexLockedError
from retriever.index.format import (CURRENT, current_manifest_path, read_current, read_manifest, verify_checksums,
                                    write_arrays)
from retriever.index.generations import commit_generation, file_entry, writer_lock
from retriever.shards import IndexReader

FIXTURES = Path(__file__).parent / "fixtures"
V1 = FIXTURES / "index_v1"


def _json_roundtrip(extra: dict) -> dict:
    """What format 1 returned for a record's extra fields: one JSON string per record."""
    def default(v):
        if hasattr(v, "isoformat"):
            return v.isoformat()
        if isinstance(v, (bytes, bytearray)):
            return v.decode("utf-8", errors="replace")
        if hasattr(v, "tolist"):
            return v.tolist()
        return str(v)
    return json.loads(json.dumps(extra, ensure_ascii=False, allow_nan=False, default=default))


# ------------------------------------------------------------------------------- typed metadata
RECORDS = [
    {"_id": "a", "text": "cats and dogs", "year": 2001, "score": 1.5, "ok": True, "lang": "en",
     "tags": ["x", "y"], "when": dt.datetime(2020, 1, 2, 3, 4, 5, 6), "day": dt.date(2021, 5, 6),
     "nested": {"k": [1, 2, {"z": None}]}, "maybe": None, "big": np.int64(7), "f32": np.float32(0.5),
     "tup": ("p", "q"), "raw": b"bytes", "ints": [1, 2]},
    {"_id": "b", "text": "dogs", "year": 2002, "score": -0.0, "ok": False, "lang": "", "tags": [],
     "when": dt.datetime(1999, 12, 31), "nested": {}, "ints": [], "maybe": "here",
     "aware": dt.datetime(2020, 1, 1, 12, tzinfo=dt.timezone.utc)},
    {"_id": "c", "text": "birds", "tags": ["z", None], "nested": [], "score": 1e300,
     "aware": dt.datetime(2020, 6, 1, 8, tzinfo=dt.timezone(dt.timedelta(hours=2)))},
]


def test_metadata_types_inferred_and_read_back_as_before(tmp_path):
    m = build_index(RECORDS, tmp_path / "i", legs=("bm25",), shard_size=2, show_progress=False)
    assert m["metadata_schema"] == {
        "year": "int64", "score": "float64", "ok": "bool", "lang": "string", "tags": "list<string>",
        "when": "timestamp", "day": "date", "nested": "json", "maybe": "string", "big": "int64", "f32": "float64",
        "tup": "list<string>", "raw": "string", "ints": "json", "aware": "timestamp[UTC]"}
    r = IndexReader(tmp_path / "i")
    typ = r.shards[0].docs.schema.field("metadata").type
    assert typ.field("year").type == pa.int64() and typ.field("when").type == pa.timestamp("us")
    assert typ.field("tags").type == pa.large_list(pa.large_string())
    assert str(typ.field("nested").type) == "extension<arrow.json>"
    got = [d["metadata"] for d in r.fetch([0, 1, 2])]
    for rec, md in zip(RECORDS, got):
        extra = {k: v for k, v in rec.items() if k not in ("_id", "text")}
        want = _json_roundtrip(extra)
        if "aware" in extra:  # aware datetimes come back in UTC (same instant)
            assert dt.datetime.fromisoformat(md.pop("aware")) == extra["aware"]
            want.pop("aware")
        assert md == want, (rec["_id"], md, want)
        assert all(type(md[k]) is type(want[k]) for k in want)  # int stays int, float stays float
    assert got[0]["year"] == 2001 and type(got[0]["big"]) is int and got[0]["when"] == "2020-01-02T03:04:05.000006"
    assert "maybe" in got[0] and got[0]["maybe"] is None and "maybe" not in got[2]  # None kept, missing absent
    # each call gives new dicts
    a, b = r.fetch([0]), r.fetch([0])
    a[0]["metadata"]["nested"]["k"].append(9)
    assert b[0]["metadata"]["nested"] == {"k": [1, 2, {"z": None}]}


@pytest.mark.parametrize("second, kinds", [("2001", ("int64", "string")), (2.5, ("int64", "float64")),
                                           (True, ("int64", "bool")), ({"a": 1}, ("int64", "json")),
                                           (["s"], ("int64", "list<string>"))])
def test_mixed_types_name_field_types_and_both_records(tmp_path, second, kinds):
    docs = [{"_id": f"d{i}", "text": "x", "other": i} for i in range(5)]
    docs[1]["year"] = 2000
    docs[3]["year"] = None
    docs[4]["year"] = second
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps(d) + "\n" for d in docs))
    with pytest.raises(CorpusError) as e:
        build_index(p, tmp_path / "i", legs=("bm25",), shard_size=2, show_progress=False)
    msg = str(e.value)
    assert e.value.field == "year" and e.value.line == 5 and "c.jsonl" in msg
    assert f"{kinds[0]} (first in document 'd1' (position 1, " in msg and "line 2)" in msg
    assert f"{kinds[1]} (first in document 'd4' (position 4, " in msg and "line 5)" in msg
    assert not (tmp_path / "i").exists()


def test_metadata_value_errors_name_the_field(tmp_path):
    for bad, match in ((float("nan"), "NaN"), (2**70, "64-bit")):
        with pytest.raises(CorpusError, match=f"'metadata'.*field 'x'.*{match}"):
            build_index([{"_id": "a", "text": "t", "x": bad}], tmp_path / "i", legs=("bm25",), show_progress=False)


# --------------------------------------------------------------------------- per-shard statistics
def test_shard_stats_sum_to_corpus_stats(tmp_path):
    docs = random_corpus(70, seed=3, min_len=0)
    m = build_index(docs, tmp_path / "i", legs=("bm25",), shard_size=25, show_progress=False)
    one = build_index(docs, tmp_path / "one", legs=("bm25",), shard_size=1000, show_progress=False)
    r = IndexReader(tmp_path / "i")
    assert [s.stats["rows"] for s in r.shards] == [25, 25, 20]
    bm = [s.stats["bm25"] for s in r.shards]
    assert sum(b["n_docs"] for b in bm) == m["stats"]["n_docs"] == 70
    assert sum(b["sum_dl"] for b in bm) == m["stats"]["sum_dl"] == one["stats"]["sum_dl"]
    assert max(b["n_terms"] for b in bm) == m["stats"]["n_terms"]
    df = np.zeros(m["stats"]["n_terms"], np.int64)
    for s in r.shards:
        a = r.shard_arrays(s, "bm25.arrow", {"offsets": np.uint64, "doc_ids": np.uint32, "doc_len": np.uint32})
        assert s.stats["bm25"]["nnz"] == len(a["doc_ids"]) and s.stats["bm25"]["sum_dl"] == int(a["doc_len"].sum())
        df[:len(a["offsets"]) - 1] += np.diff(a["offsets"].astype(np.int64))
    r1 = IndexReader(tmp_path / "one")
    a1 = r1.shard_arrays(r1.shards[0], "bm25.arrow", {"offsets": np.uint64})
    np.testing.assert_array_equal(df, np.diff(a1["offsets"].astype(np.int64)))
    assert "build_seconds" in m["build"] and "build_seconds" not in m["stats"]


def test_sparse_and_dense_shard_stats(tmp_path):
    from test_integrity import build_fake_dense

    m = build_fake_dense(random_corpus(30, seed=2, min_len=1), tmp_path / "d", shard_size=12)
    r = IndexReader(tmp_path / "d")
    assert [s.stats["dense"] for s in r.shards] == [{"count": n, "dim": 16, "dtype": "float16"} for n in (12, 12, 6)]
    assert m["stats"]["dense_dim"] == 16
    try:
        sp = build_index(random_corpus(30, seed=2, min_len=1), tmp_path / "s", legs=("sparse",), shard_size=12,
                         show_progress=False)
    except Exception as e:  # noqa: BLE001 - the bundled SPLADE model is optional
        pytest.skip(f"sparse model not available: {e}")
    rs = IndexReader(tmp_path / "s")
    st = [s.stats["sparse"] for s in rs.shards]
    assert sum(x["nnz"] for x in st) == sp["stats"]["sparse_nnz"]
    assert max(x["max_weight"] for x in st) / 65535 == pytest.approx(sp["stats"]["sparse_scale"], rel=1e-12)
    assert all(x["scale"] == sp["stats"]["sparse_scale"] and x["vocab_size"] == sp["stats"]["sparse_vocab_size"]
               for x in st)


# ---------------------------------------------------------------------------------- generations
def _bm25(r: Retriever, queries=("vitamin bone", "heart blood pressure", "gene")):
    res = r.search_arrays(list(queries), k=10, mode="bm25")
    return res.ids.tolist(), res.scores.tolist()


def test_reader_keeps_its_generation_and_pointer_switches(tmp_path):
    path = tmp_path / "i"
    build_index(random_corpus(60, seed=4, min_len=1), path, legs=("bm25",), shard_size=20, show_progress=False)
    assert read_current(path) == 1 and (path / CURRENT).read_text() == "manifests/000001.json\n"
    old = Retriever.open(path)
    old_reader = IndexReader(path)
    before = _bm25(old)
    m1 = read_manifest(path)
    # generation 2: the last shard dropped, a tombstone file for shard 0, a fusion setting
    write_arrays(path / "shards/00000/deletes.000002.arrow", {"rows": np.array([1, 5], np.uint32)})
    shards = [dict(s) for s in m1["shards"][:2]]
    shards[0]["deletes"] = "shards/00000/deletes.000002.arrow"
    files = {k: v for k, v in m1["files"].items() if not k.startswith("shards/00002/")}
    files["shards/00000/deletes.000002.arrow"] = file_entry(path, "shards/00000/deletes.000002.arrow")
    m2 = commit_generation(path, parent=1, changes={"shards": shards, "files": files,
                                                    "stats": {**m1["stats"], "n_docs": 40},
                                                    "fusion": {"method": "rrf", "k": 60}})
    assert m2["generation"] == 2 and m2["parent_generation"] == 1 and read_current(path) == 2
    assert (path / "manifests/000001.json").read_bytes() == current_manifest_path(path).with_name("000001.json").read_bytes()
    # the readers opened before keep generation 1: same shards, same results
    assert old_reader.generation == 1 and len(old_reader.shards) == 3 and old_reader.shards[0].deleted is None
    assert _bm25(old) == before and old.reader.n_docs == 60
    new = IndexReader(path)
    assert new.generation == 2 and new.n_docs == 40 and new.fusion == {"method": "rrf", "k": 60}
    np.testing.assert_array_equal(new.shards[0].deleted, [1, 5])
    assert old_reader.reopen().generation == 2
    assert IndexReader(path, generation=1).n_docs == 60
    verify_checksums(path, read_manifest(path))
    info = new.info()
    assert info["generation"] == 2 and info["shards"] == [{"dir": "shards/00000", "rows": 20, "deleted": 2},
                                                          {"dir": "shards/00001", "rows": 20, "deleted": 0}]
    # a writer that lost the race, an unknown field, a missing generation
    with pytest.raises(IndexFormatError, match="generation 2 was committed after 1"):
        commit_generation(path, parent=1, changes={"fusion": None})
    with pytest.raises(IndexFormatError, match="cannot change.*build_config"):
        commit_generation(path, parent=2, changes={"build_config": {}})
    with pytest.raises(IndexFormatError, match="generation 7 does not exist"):
        IndexReader(path, generation=7)
    with writer_lock(path):
        with pytest.raises(IndexLockedError, match=f"pid {os.getpid()}"):
            commit_generation(path, parent=2, changes={"fusion": None})
    # a new generation whose manifest does not validate is not switched to
    with pytest.raises(IndexFormatError, match="missing"):
        commit_generation(path, parent=2, changes={"files": {**m2["files"], "nope.arrow": {"bytes": 1, "sha256": "0"}}})
    assert read_current(path) == 2 and not (path / "manifests/000003.json").exists()


KILL = """
import os, signal, sys
from retriever.index.format import read_manifest
from retriever.index.generations import commit_generation
point = sys.argv[2]
def fault(name):
    if name == point:
        os.kill(os.getpid(), signal.SIGKILL)
commit_generation(sys.argv[1], parent=1, changes={"fusion": {"method": "rrf"}}, fault=fault)
"""


@pytest.mark.parametrize("point, visible", [("generation_manifest", 1), ("generation_current", 2)])
def test_sigkill_during_generation_commit(bm25_index, tmp_path, point, visible):
    path = tmp_path / "i"
    shutil.copytree(bm25_index, path)
    before = _bm25(Retriever.open(path))
    r = subprocess.run([sys.executable, "-c", KILL, str(path), point], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == -9, r.stderr
    assert read_current(path) == visible
    m = read_manifest(path)
    verify_checksums(path, m)
    assert m["fusion"] == (None if visible == 1 else {"method": "rrf"})
    assert _bm25(Retriever.open(path)) == before
    # the next writer commits over a killed one's leftovers
    assert commit_generation(path, parent=visible, changes={"fusion": None})["generation"] == visible + 1


# ------------------------------------------------------------------------------ format 1, upgrade
def test_format1_index_is_refused_naming_upgrade(capsys):
    for opener in (IndexReader, Retriever.open):
        with pytest.raises(IndexFormatError, match=r"format version 1.*retriever index upgrade .*index_v1"):
            opener(V1)
    assert cli_main(["search", str(V1), "vitamin"]) == 1
    assert "retriever index upgrade" in capsys.readouterr().err


def test_upgrade_gives_identical_results(tmp_path, capsys):
    want = json.loads((FIXTURES / "index_v1_expected.json").read_text())
    path = tmp_path / "v1"
    shutil.copytree(V1, path)
    v1_bytes = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert cli_main(["index", "upgrade", str(path)]) == 0
    out = capsys.readouterr().out
    assert "format 1 -> 2, 24 documents in 3 shard(s)" in out and "['mixed']" in out
    assert not (path / "manifest.json").exists() and read_current(path) == 1
    verify_checksums(path, read_manifest(path))
    for rel in ("vocab.arrow", "shards/00000/bm25.arrow", "shards/00002/dense.arrow"):
        assert (path / rel).read_bytes() == v1_bytes[rel]
    r = Retriever.open(path, verify=True)
    a = r.search_arrays(want["queries"], k=10, mode="bm25")
    assert a.ids.tolist() == want["bm25"]["ids"] and a.scores.tolist() == want["bm25"]["scores"]
    b = r.search_arrays(want["queries"], k=10, mode="dense", query_vectors=np.array(want["query_vectors"], np.float32))
    assert b.ids.tolist() == want["dense"]["ids"] and b.scores.tolist() == want["dense"]["scores"]
    assert r.reader.fetch(list(range(24))) == want["fetch"]
    m = r.reader.manifest
    assert m["metadata_schema"]["year"] == "int64" and m["metadata_schema"]["mixed"] == "json"
    assert m["metadata_schema"]["when"] == "string"  # format 1 had stored the ISO string
    assert "build_seconds" in m["build"] and "build_seconds" not in m["stats"]
    assert m["upgraded_from"]["format_version"] == 1
    assert sum(s.stats["bm25"]["sum_dl"] for s in r.reader.shards) == m["stats"]["sum_dl"]
    assert cli_main(["index", "upgrade", str(path)]) == 1
    assert "already an index of format version 2" in capsys.readouterr().err


def test_upgrade_killed_leaves_format1_intact(tmp_path):
    path = tmp_path / "v1"
    shutil.copytree(V1, path)
    before = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "crash_build.py"), "manifest",
                        json.dumps({"kind": "upgrade", "out": str(path)})], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert r.returncode == -9, r.stderr
    after = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert after == before
    assert cli_main(["index", "upgrade", str(path)]) == 0  # the next run cleans up and converts
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".v1.")]


def test_upgrade_refuses_a_damaged_index(tmp_path):
    path = tmp_path / "v1"
    shutil.copytree(V1, path)
    p = path / "shards/00001/docs.arrow"
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x20
    p.write_bytes(bytes(b))
    with pytest.raises(IndexFormatError, match="00001/docs.arrow.*SHA-256.*not upgraded"):
        from retriever.index.upgrade import upgrade_index
        upgrade_index(path)
    assert (path / "manifest.json").is_file() and not (path / CURRENT).exists()


# ------------------------------------------------------------------------------------ fetch_batch
def test_fetch_batch_equals_fetch_across_shards(tmp_path):
    docs = random_corpus(95, seed=9, min_len=0)
    for i, d in enumerate(docs):
        if i % 4 == 0:
            d["tag"] = ["a", "b"][: i % 3]
        if i % 7 == 0:
            d["none"] = None
        d["info"] = {"i": i} if i % 2 else {}
    build_index(docs, tmp_path / "i", legs=("bm25",), shard_size=20, show_progress=False)
    r = IndexReader(tmp_path / "i")
    assert len(r.shards) == 5
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 300):
        ords = rng.integers(0, 95, n)
        b = r.fetch_batch(ords)
        one = [r.fetch([int(o)])[0] for o in ords]
        assert b["id"] == [d["id"] for d in one] == [docs[o]["_id"] for o in ords]
        assert b["title"] == [d["title"] for d in one] and b["text"] == [d["text"] for d in one]
        assert b["metadata"] == [d["metadata"] for d in one]
        assert b["metadata"] == [_json_roundtrip({k: v for k, v in docs[o].items()
                                                  if k not in ("_id", "title", "text")}) for o in ords]
    grid = rng.integers(0, 95, (30, 10))
    assert r.fetch_batch(grid)["id"] == [docs[o]["_id"] for o in grid.reshape(-1)]
    b = r.fetch_batch(np.array([3, 3]))
    assert b["metadata"][0] == b["metadata"][1] and b["metadata"][0] is not b["metadata"][1]
    part = r.fetch_batch(grid, fields=("id", "metadata"))
    full = r.fetch_batch(grid)
    assert set(part) == {"id", "metadata"} and part["id"] == full["id"] and part["metadata"] == full["metadata"]
    with pytest.raises(ValueError, match="unknown fetch field.*'body'"):
        r.fetch_batch(grid, fields=("id", "body"))
    with pytest.raises(IndexError, match="95"):
        r.fetch_batch(np.array([0, 95]))
    with pytest.raises(IndexError, match="-1"):
        r.fetch([-1])


def test_index_info_cli_shows_generation_and_shard_rows(bm25_index, capsys):
    assert cli_main(["index", "info", str(bm25_index)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format_version"] == 2 and info["generation"] == 1
    assert info["shards"] == [{"dir": "shards/00000", "rows": 300, "deleted": 0}]
    assert info["metadata_schema"] == {"meta": "int64"}


def _nested(n: int) -> dict:
    d: dict = {}
    cur = d
    for _ in range(n):
        cur["a"] = {}
        cur = cur["a"]
    return d


@pytest.mark.parametrize("change", [
    lambda m: {"build": {**m["build"], "x": 10**22}},  # an integer literal longer than readers accept
    lambda m: {"stats": {**m["stats"], "extra": -10**21}},
    lambda m: {"shards": [{**m["shards"][0], "x": 10**30}]},
    lambda m: {"build": _nested(40)},  # nested deeper than readers accept
    lambda m: {"fusion": {"method": "rrf", "fitted": _nested(35)}},
    lambda m: {"stats": {**m["stats"], "extra": {10: 1, 9: 2}}},  # int keys: the checksum a reader computes differs
    lambda m: {"fusion": {"method": "rrf", "k": 60, "note": {10.5: "a", 9.5: "b"}}},
    lambda m: {"stats": {**m["stats"], "extra": np.int64(3)}},  # not JSON: was a TypeError
    lambda m: {"build": {**m["build"], "x": float("nan")}},  # was a ValueError
    lambda m: {"build": {**m["build"], "x": "a\ud800"}},  # a lone surrogate: was a UnicodeEncodeError
    lambda m: {"stats": {**m["stats"], "n_docs": 999}},  # rows add up to 3: every reader refuses it
    lambda m: {"vocab": ["nope.arrow"]},  # a vocabulary file the manifest does not list
])
def test_commit_refuses_a_manifest_readers_would_refuse(tmp_path, change):
    """A generation whose manifest a reader would refuse (limits on integer literals and nesting,
    anywhere in it; a checksum that does not survive the JSON round trip; values JSON cannot hold;
    rows that do not add up; an unlisted vocabulary file) is refused by the commit:
    IndexFormatError, no manifest written, CURRENT unchanged, the index still opens (a commit that
    checked only the schema on its own dict switched CURRENT to a manifest no reader could open)."""
    root = tmp_path / "i"
    build_index([{"_id": f"d{i}", "text": f"apple w{i}"} for i in range(3)], root, legs=("bm25",), show_progress=False)
    before = sorted(p.name for p in (root / "manifests").iterdir())
    with pytest.raises(IndexFormatError):
        commit_generation(root, parent=1, changes=change(read_manifest(root)))
    assert read_current(root) == 1
    assert sorted(p.name for p in (root / "manifests").iterdir()) == before
    assert len(Retriever.open(root).search("apple", k=3)) == 3


def test_commit_takes_tuples_as_lists(tmp_path):
    """``changes`` holding tuples (as JSON writes them: lists) commit, and the returned manifest
    is what a reader reads."""
    root = tmp_path / "i"
    build_index([{"_id": f"d{i}", "text": f"apple w{i}"} for i in range(3)], root, legs=("bm25",), show_progress=False)
    m = read_manifest(root)
    got = commit_generation(root, parent=1, changes={"shards": tuple(m["shards"])})
    assert got == read_manifest(root) and got["generation"] == 2 and isinstance(got["shards"], list)
