"""Hits (``search_batch`` / ``search`` / ``to_hits``) against ``search_arrays`` and the records the
index was built from: the same ids, scores, ranks and per-leg views, every stored field (title,
text, typed metadata and a JSON-column value) equal to the record's, with a filter, across shards,
for few and many rows per shard (strings decoded from the buffers by the kernel), and after deletes
(tombstoned documents are neither returned nor fetched)."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import numpy as np
import pytest

from retriever import IndexUpdater, Retriever, build_index
from retriever.results import Hit, LegHit
from retriever.shards import SMALL_FETCH

WORDS = ("apple banana cherry date elder fig grape honey iris jam kiwi lemon mango nut olive pear quince "
         "rose sage thyme umber vine walnut yam zest café naïve 漢字 ünïcødé").split()
DIM = 8


def make_records(n: int, seed: int = 3) -> list[dict]:
    """Records with typed metadata (int, float, bool, string, list of strings, naive datetime),
    a JSON-typed field (nested dicts), explicit ``None`` values, missing fields, empty titles
    and non-ASCII text (multi-byte UTF-8, so the buffer slicing must cut at the right bytes)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        rec: dict = {"_id": f"doc-{i}", "title": rng.choice(WORDS) if i % 4 else "",
                     "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))}
        if i % 5:
            rec["year"] = 1990 + i % 37
        rec["score"] = i / 7.0
        rec["ok"] = i % 3 == 0
        rec["lang"] = rng.choice(["en", "fr", "日本語"])
        rec["tags"] = [rng.choice(WORDS) for _ in range(i % 3)]
        rec["when"] = dt.datetime(2000 + i % 20, 1 + i % 12, 1 + i % 28, i % 24)
        rec["nested"] = {"i": i, "path": [i % 2, {"deep": rng.choice(WORDS)}]}
        if i % 7 == 0:
            rec["maybe"] = None
        out.append(rec)
    return out


def stored(rec: dict) -> tuple[str, str, dict]:
    """What a hit must carry for ``rec``: title, text, metadata (datetimes as ISO strings)."""
    meta = {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in rec.items()
            if k not in ("_id", "title", "text")}
    return rec["title"], rec["text"], meta


def dense_vec(i: int) -> np.ndarray:
    v = np.random.default_rng(1000 + i).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def queries(n: int, seed: int = 5) -> list[str]:
    rng = random.Random(seed)
    qs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))) for _ in range(n)]
    return qs + ["", "  ", "nomatchword"]  # blank queries and one that matches nothing: no hits


def check_hits(r: Retriever, by_id: dict[str, dict], qs: list[str], k: int, **kw) -> int:
    """Every hit of ``search_batch`` equals ``search_arrays`` (ids, scores, ranks, per-leg scores
    and ranks) and the record's stored fields; ``search()`` of each query equals its row.
    Returns the number of hits checked."""
    hits = r.search_batch(qs, k=k, **kw)
    arr = r.search_arrays(qs, k=k, **kw)
    assert len(hits) == len(qs)
    n = 0
    for q, row in enumerate(hits):
        nf = int(arr.n_found[q])
        assert [h.id for h in row] == list(r.doc_ids(arr.ids[q, :nf]))
        for j, h in enumerate(row):
            assert type(h) is Hit
            assert h.score == float(arr.scores[q, j]) and h.rank == j + 1
            want_legs = {name: LegHit(float(la.scores[q, j]), int(la.ranks[q, j]))
                         for name, la in arr.legs.items() if la.ranks[q, j] > 0}
            assert h.legs == want_legs and all(type(v) is LegHit for v in h.legs.values())
            title, text, meta = stored(by_id[h.id])
            assert (h.title, h.text) == (title, text)
            assert h.metadata == meta, (h.id, h.metadata, meta)
            assert all(type(h.metadata[f]) is type(v) for f, v in meta.items())  # int stays int, ...
            n += 1
        single_kw = {key: (v[q:q + 1] if key == "query_vectors" else v) for key, v in kw.items()}
        assert r.search(qs[q], k=k, **single_kw) == row
    return n


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return make_records(420)


@pytest.fixture(scope="module")
def index(tmp_path_factory, records) -> Path:
    path = tmp_path_factory.mktemp("hits") / "idx"
    build_index(records, path, legs=("bm25",), shard_size=150, show_progress=False)  # 3 shards
    return path


@pytest.mark.parametrize("k", [1, 10, 40])
def test_batch_hits_equal_arrays_and_records(index, records, k):
    r = Retriever.open(index, n_threads=1)
    assert len(r.reader.shards) == 3
    by_id = {rec["_id"]: rec for rec in records}
    qs = queries(60)
    n = check_hits(r, by_id, qs, k, mode="bm25")
    assert n > 0
    if k == 40:  # some shard serves more than SMALL_FETCH rows (the numpy ordinal check)
        arr = r.search_arrays(qs, k=k, mode="bm25")
        sh, _ = r.reader.locate(arr.ids[arr.ids >= 0])
        assert np.bincount(sh).max() > SMALL_FETCH


def test_one_shard_index_and_repeated_documents(tmp_path, records):
    path = tmp_path / "one"
    build_index(records, path, legs=("bm25",), show_progress=False)
    r = Retriever.open(path, n_threads=1)
    assert len(r.reader.shards) == 1
    by_id = {rec["_id"]: rec for rec in records}
    qs = queries(40) + ["apple banana"] * 3  # the same documents for several queries
    assert check_hits(r, by_id, qs, 10, mode="bm25") > 0
    hits = r.search_batch(qs, k=10, mode="bm25")
    a, b = hits[-1][0], hits[-2][0]
    assert a.id == b.id and a.metadata == b.metadata
    assert a.metadata is not b.metadata and a.legs is not b.legs  # new objects per hit
    a.metadata["nested"]["path"].append("changed")
    assert b.metadata["nested"] == stored(by_id[b.id])[2]["nested"]


def test_hits_with_a_filter(index, records):
    r = Retriever.open(index, n_threads=1)
    by_id = {rec["_id"]: rec for rec in records}
    qs = queries(30)
    flt = {"year": {"$gte": 2010}}
    assert check_hits(r, by_id, qs, 10, mode="bm25", filter=flt) > 0
    for row in r.search_batch(qs, k=10, mode="bm25", filter=flt):
        assert all(by_id[h.id].get("year", 0) >= 2010 for h in row)
    # one filter per query: the grouped search scattered back gives the same hits as one at a time
    per_query = [flt if i % 2 else {"ok": True} for i in range(len(qs))]
    got = r.search_batch(qs, k=10, mode="bm25", filter=per_query)
    for q, f in zip(qs, per_query):
        assert got.pop(0) == r.search(q, k=10, mode="bm25", filter=f)


def test_hits_after_deletes_skip_tombstoned_documents(tmp_path, records):
    path = tmp_path / "live"
    build_index(records, path, legs=("bm25",), shard_size=150, show_progress=False)
    r = Retriever.open(path, n_threads=1)
    qs = queries(30)
    before = r.search_batch(qs, k=10, mode="bm25")
    gone = sorted({row[0].id for row in before if row} | {row[-1].id for row in before if row})
    assert len(gone) >= 5
    with IndexUpdater.open(path) as u:
        assert u.delete(gone).deleted == len(gone)
        u.commit()
    assert r.refresh()
    fetched: list[np.ndarray] = []
    fetch = r.reader.fetch_columns

    def spy(ordinals, *a, **kw):  # records what the hits fetch
        fetched.append(np.asarray(ordinals).copy())
        return fetch(ordinals, *a, **kw)

    r.reader.fetch_columns = spy  # type: ignore[method-assign]
    by_id = {rec["_id"]: rec for rec in records}
    assert check_hits(r, by_id, qs, 10, mode="bm25") > 0
    assert check_hits(r, by_id, qs, 10, mode="bm25", filter={"ok": False}) > 0
    deleted = {o for o, i in enumerate(r.reader.doc_ids()) if i in set(gone)}
    assert fetched and not deleted & set(np.concatenate(fetched).tolist())
    for row in r.search_batch(qs, k=10, mode="bm25"):
        assert not {h.id for h in row} & set(gone)


def test_hybrid_hits_carry_each_legs_view(tmp_path, records):
    path = tmp_path / "hy"
    vecs = np.stack([dense_vec(i) for i in range(len(records))])
    build_index(records, path, legs=("bm25", "dense"), shard_size=150, show_progress=False, dense_vectors=vecs)
    r = Retriever.open(path, n_threads=1)
    by_id = {rec["_id"]: rec for rec in records}
    qs = queries(20)
    qv = np.stack([dense_vec(10_000 + i) for i in range(len(qs))])
    assert check_hits(r, by_id, qs, 10, mode="hybrid", query_vectors=qv, depth=20) > 0
    hits = r.search_batch(qs, k=10, mode="hybrid", query_vectors=qv, depth=20)
    assert any(len(h.legs) == 1 for row in hits for h in row)  # some hit only one leg returned


def test_decode_strings_kernel_shares_repeats_and_checks_its_input():
    """_kernels.decode_strings: the exact strings (multi-byte UTF-8), one object per distinct row,
    and a clear error for a bad row, offsets outside the data and invalid UTF-8."""
    from retriever import _kernels as K

    words = ["abc", "", "naïve 漢字", "zest"]
    data = "".join(words).encode()
    off = np.cumsum([0] + [len(w.encode()) for w in words])
    for dtype in (np.int32, np.int64):
        got = K.decode_strings(off.astype(dtype), memoryview(data), np.array([2, 0, 2, 1, 3], np.int64))
        assert got == ["naïve 漢字", "abc", "naïve 漢字", "", "zest"] and got[0] is got[2]
    with pytest.raises(ValueError, match=r"rows\[0\] = 4 is outside \[0, 4\)"):
        K.decode_strings(off.astype(np.int64), memoryview(data), np.array([4], np.int64))
    bad = off.astype(np.int64).copy()
    bad[-1] = len(data) + 5
    with pytest.raises(ValueError, match="not a range inside data"):
        K.decode_strings(bad, memoryview(data), np.array([3], np.int64))
    with pytest.raises(UnicodeDecodeError):
        K.decode_strings(np.array([0, 2], np.int64), memoryview(b"\xff\xfe"), np.array([0], np.int64))
    with pytest.raises(TypeError, match="int32 or int64"):
        K.decode_strings(off.astype(np.float64), memoryview(data), np.array([0], np.int64))


def test_make_hits_kernel_equals_named_tuples():
    """_kernels.make_hits makes the same Hit / LegHit values as the NamedTuple constructors
    (a leg with rank 0 is left out), and rejects inconsistent lengths."""
    from retriever import _kernels as K

    scores = np.array([[3.5, 1.25, -np.inf], [2.0, -np.inf, -np.inf]], np.float32)
    nf = np.array([2, 1], np.int32)
    ls = [np.array([[1.5, 0.5, np.nan], [0.25, np.nan, np.nan]], np.float32), np.full((2, 3), 0.75, np.float32)]
    lr = [np.array([[1, 2, 0], [1, 0, 0]], np.int32), np.array([[0, 1, 0], [2, 0, 0]], np.int32)]
    got = K.make_hits(Hit, LegHit, scores, nf, ["a", "b", "c"], ["ta", None, "tc"], ["x", "y", "z"],
                      [{}, {"k": 1}, {}], ["bm25", "dense"], ls, lr)
    want = [[Hit("a", 3.5, 1, "ta", "x", {}, {"bm25": LegHit(1.5, 1)}),
             Hit("b", 1.25, 2, None, "y", {"k": 1}, {"bm25": LegHit(0.5, 2), "dense": LegHit(0.75, 1)})],
            [Hit("c", 2.0, 1, "tc", "z", {}, {"bm25": LegHit(0.25, 1), "dense": LegHit(0.75, 2)})]]
    assert got == want
    assert all(type(h) is Hit and all(type(v) is LegHit for v in h.legs.values()) for row in got for h in row)
    assert [type(h.rank) for row in got for h in row] == [int, int, int]
    with pytest.raises(ValueError, match=r"len\(ids\) = 2 must equal sum\(n_found\) = 3"):
        K.make_hits(Hit, LegHit, scores, nf, ["a", "b"], ["", "", ""], ["", "", ""], [{}, {}, {}], [], [], [])
    with pytest.raises(TypeError, match="tuple subclass"):
        K.make_hits(dict, LegHit, scores, nf, ["a"] * 3, [""] * 3, [""] * 3, [{}] * 3, [], [], [])
