"""A living index (retriever.index.updates): after any sequence of adds, deletes, upserts, commits,
compactions and reopens, every exact-mode search returns what a fresh build of the live documents
returns (same ids in the same order, scores within 1e-6); input rules; one writer at a time;
refresh reuses per-segment state; deleted documents never come back."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np
import pytest

from retriever import IndexUpdater, Retriever, build_index
from retriever.index.errors import ConfigError, CorpusError, IndexFormatError, IndexLockedError, ModelError, QueryError
from retriever.index.updates import CompactPolicy

WORDS = ("apple banana cherry date elder fig grape honey iris jam kiwi lemon mango nut olive pear quince "
         "rose sage thyme umber vine walnut yam zest").split()
DIM = 8
SPARSE_VOCAB = 30522  # the bundled SPLADE model's vocabulary
BM25_ALGOS = ("auto", "exhaustive", "maxscore", "bmw", "bmm")
QUERIES = ["apple banana", "cherry date fig fig", "mango", "zest yam walnut olive", "pear pear pear honey",
           "novelword apple", "kiwi lemon rose sage thyme"]


def make_doc(key: str, version: int = 0) -> dict:
    """A record derived from (key, version) alone, so the model and the index agree."""
    rng = random.Random(f"{key}/{version}")
    n = rng.randint(1, 25)
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.2:
        words.append(f"rare{rng.randint(0, 30)}")
    return {"_id": key, "title": rng.choice(WORDS) if rng.random() < 0.6 else "", "text": " ".join(words),
            "year": rng.randint(1990, 2020)}


def dense_vec(key: str, version: int = 0) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(f"{key}/{version}".encode()).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def sparse_vec(key: str, version: int = 0) -> tuple[np.ndarray, np.ndarray]:
    seed = int.from_bytes(hashlib.sha256(f"s/{key}/{version}".encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    terms = np.sort(rng.choice(200, size=int(rng.integers(1, 12)), replace=False)).astype(np.uint32)
    return terms, rng.uniform(0.05, 3.0, size=len(terms)).astype(np.float32)


def csr(entries: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    indptr = np.zeros(len(entries) + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(t) for t, _ in entries])
    terms = np.concatenate([t for t, _ in entries]) if entries else np.zeros(0, np.uint32)
    weights = np.concatenate([w for _, w in entries]) if entries else np.zeros(0, np.float32)
    return indptr, terms, weights


class Model:
    """The live documents in index order (an add appends, a delete removes, an upsert does both)."""

    def __init__(self, legs: tuple[str, ...]) -> None:
        self.legs = legs
        self.live: list[tuple[str, int]] = []  # (key, version)
        self.override: dict[tuple[str, int], dict] = {}  # records that are not make_doc's

    def records(self, items: list[tuple[str, int]]) -> dict:
        kw: dict = {}
        if "dense" in self.legs:
            kw["dense_vectors"] = np.stack([dense_vec(k, v) for k, v in items]) if items else np.zeros((0, DIM), np.float32)
        if "sparse" in self.legs:
            kw["sparse_vectors"] = csr([sparse_vec(k, v) for k, v in items])
        return kw

    def fresh(self, path: Path, *, sparse_scale: float | None = None, shard_size: int = 1000) -> Retriever:
        """A fresh one-process build of the live documents, with the same data-derived constants."""
        docs = [self.override.get((k, v)) or make_doc(k, v) for k, v in self.live]
        build_index(docs, path, legs=self.legs, shard_size=shard_size, show_progress=False,
                    sparse_scale=sparse_scale, overwrite=True, **self.records(self.live))
        return Retriever.open(path)


def query_kwargs(legs: tuple[str, ...], mode: str) -> dict:
    kw: dict = {}
    if mode in ("dense", "hybrid") and "dense" in legs:
        kw["query_vectors"] = np.stack([dense_vec(f"q{i}") for i in range(len(QUERIES))])
    if mode in ("sparse", "hybrid") and "sparse" in legs:
        kw["sparse_vectors"] = [sparse_vec(f"q{i}") for i in range(len(QUERIES))]
    return kw


def searches(legs: tuple[str, ...]) -> list[tuple[str, dict]]:
    out = []
    if "bm25" in legs:
        out += [("bm25", {"bm25": {"algorithm": a}}) for a in BM25_ALGOS]
    if "dense" in legs:
        out.append(("dense", {}))
    if "sparse" in legs:
        out.append(("sparse", {"sparse": {"algorithm": "exact"}}))
    if len(legs) > 1:
        out.append(("hybrid", {"bm25": {"algorithm": "exhaustive"}}))
    return out


#: filters of the invariant's searches: none, a range passing about half the documents (every
#: document has ``year``), one passing few, and one on the same field passing none
FILTERS = (None, {"year": {"$gte": 2005}}, {"$or": [{"year": 1990}, {"year": {"$gt": 2018}}]}, {"year": {"$lt": 0}})


def assert_same(r: Retriever, fresh: Retriever, legs: tuple[str, ...], ks=(1, 3, 10, 50)) -> int:
    """Every exact-mode search of ``r`` equals ``fresh``'s, without and with each of
    :data:`FILTERS` (k = 50 unfiltered only); returns the number of comparisons."""
    n = 0
    for mode, params in searches(legs):
        for k in ks:
            for flt in FILTERS if k != 50 else (None,):
                kw = query_kwargs(legs, mode)
                a = r.search_arrays(QUERIES, k=k, mode=mode, leg_params=params, filter=flt, **kw)
                b = fresh.search_arrays(QUERIES, k=k, mode=mode, leg_params=params, filter=flt, **kw)
                for q in range(len(QUERIES)):
                    ia = list(r.doc_ids(a.ids[q, :a.n_found[q]]))
                    ib = list(fresh.doc_ids(b.ids[q, :b.n_found[q]]))
                    assert ia == ib, (mode, params, k, flt, QUERIES[q], ia, ib)
                    np.testing.assert_allclose(a.scores[q, :a.n_found[q]], b.scores[q, :b.n_found[q]], rtol=0,
                                               atol=1e-6)
                    n += 1
    return n


def start(tmp_path: Path, legs: tuple[str, ...], n: int = 30, shard_size: int = 12) -> tuple[Path, Model]:
    m = Model(legs)
    m.live = [(f"d{i}", 0) for i in range(n)]
    path = tmp_path / "live"
    build_index([make_doc(k, v) for k, v in m.live], path, legs=legs, shard_size=shard_size, show_progress=False,
                **m.records(m.live))
    return path, m


def sparse_scale_of(path: Path) -> float | None:
    r = Retriever.open(path)
    return r.reader.manifest["stats"].get("sparse_scale")


# ---------------------------------------------------------------------------------- the invariant
@pytest.mark.parametrize("legs", [("bm25",), ("bm25", "dense")])
def test_adds_deletes_upserts_compaction_equal_a_fresh_build(tmp_path, legs):
    path, m = start(tmp_path, legs)
    r = Retriever.open(path)
    with IndexUpdater.open(path) as u:
        new = [(f"n{i}", 0) for i in range(15)]
        u.add([make_doc(k, v) for k, v in new], **m.records(new))
        m.live += new
        rep = u.delete(["d3", "d4", "n2", "nope"])
        assert (rep.deleted, rep.unknown) == (3, ["nope"])
        m.live = [x for x in m.live if x[0] not in ("d3", "d4", "n2")]
        up = [("d7", 1), ("n5", 1)]
        u.upsert([make_doc(k, v) for k, v in up], **m.records(up))
        m.live = [x for x in m.live if x[0] not in ("d7", "n5")] + up
        assert u.commit() == 2
    assert r.reader.generation == 1 and r.refresh() and r.reader.generation == 2
    assert not r.refresh()
    fresh = m.fresh(tmp_path / "fresh")
    assert assert_same(r, fresh, legs) > 0
    assert assert_same(Retriever.open(path), fresh, legs) > 0  # a reopen too
    with IndexUpdater.open(path) as u:
        rep = u.compact(full=True)
    assert rep.dropped_rows == 5 and rep.generation == 3
    assert r.refresh()
    assert all(s.deleted is None for s in r.reader.shards)
    assert r.reader.n_docs == len(m.live)
    assert assert_same(r, fresh, legs) > 0


def test_sparse_leg_keeps_the_creation_scale(tmp_path):
    legs = ("bm25", "sparse")
    path, m = start(tmp_path, legs, n=20, shard_size=8)
    scale = sparse_scale_of(path)
    with IndexUpdater.open(path) as u:
        new = [(f"n{i}", 0) for i in range(9)]
        u.add([make_doc(k, v) for k, v in new], **m.records(new))
        m.live += new
        up = [("d2", 1)]
        u.upsert([make_doc(k, v) for k, v in up], **m.records(up))
        m.live = [x for x in m.live if x[0] != "d2"] + up
        u.commit()
    r = Retriever.open(path)
    assert r.reader.manifest["stats"]["sparse_scale"] == scale
    fresh = m.fresh(tmp_path / "fresh", sparse_scale=scale)
    assert assert_same(r, fresh, legs) > 0
    with IndexUpdater.open(path) as u:
        u.compact(full=True)
    r.refresh()
    assert assert_same(r, fresh, legs) > 0


def test_compaction_policy_merges_adjacent_small_and_heavy_segments(tmp_path):
    path, m = start(tmp_path, ("bm25",), n=40, shard_size=10)  # 4 segments of 10
    with IndexUpdater.open(path) as u:
        for i in range(3):  # three small segments
            new = [(f"n{i}_{j}", 0) for j in range(2)]
            u.add([make_doc(k, v) for k, v in new])
            m.live += new
        u.delete([f"d{i}" for i in range(10, 14)])  # segment 1: 40 % deleted
        m.live = [x for x in m.live if x[0] not in {f"d{i}" for i in range(10, 14)}]
        u.commit()
        rep = u.compact(CompactPolicy(small_rows=5, max_deleted_fraction=0.3))
    r = Retriever.open(path)
    assert rep.merged == ["shards/00001", "shards/00004", "shards/00005", "shards/00006"]
    assert [s.rows for s in r.reader.shards] == [10, 6, 10, 10, 6]  # order kept: segment 1 rewritten in place
    assert assert_same(r, m.fresh(tmp_path / "fresh"), ("bm25",)) > 0


def test_vocabulary_grows_append_only(tmp_path):
    path, m = start(tmp_path, ("bm25",), n=5)
    before = Retriever.open(path).engine.legs["bm25"].vocab
    with IndexUpdater.open(path) as u:
        u.add([{"_id": "x", "text": "brandnewterm apple"}])
        u.commit()
    r = Retriever.open(path)
    vocab = r.engine.legs["bm25"].vocab
    assert all(vocab[t] == i for t, i in before.items()) and len(vocab) == len(before) + 1
    assert r.reader.manifest["vocab"] == ["vocab.arrow", "vocab.000002.arrow"]
    assert [h.id for h in r.search("brandnewterm", k=3, mode="bm25")] == ["x"]


def test_vocabulary_files_of_several_adds_before_one_commit(tmp_path):
    """Each add that brings new terms writes their file with its segments; one commit lists them
    in order; a failed add leaves no file behind, nor do the adds a writer closes uncommitted."""
    path, m = start(tmp_path, ("bm25",), n=5)
    before = Retriever.open(path).engine.legs["bm25"].vocab

    class Boom(Exception):
        pass

    def fault(point: str) -> None:
        if point == "update_segments" and armed:
            raise Boom(point)

    armed = False
    with IndexUpdater.open(path, faults=fault) as u:
        u.add([{"_id": "x", "text": "firstnewterm apple"}])
        armed = True
        with pytest.raises(Boom):
            u.add([{"_id": "z", "text": "failednewterm"}])
        armed = False
        u.add([{"_id": "y", "text": "secondnewterm thirdnewterm firstnewterm"}])
        u.commit()
    r = Retriever.open(path)
    assert r.reader.manifest["vocab"] == ["vocab.arrow", "vocab.000002.arrow", "vocab.000002.1.arrow"]
    vocab = r.engine.legs["bm25"].vocab
    assert all(vocab[t] == i for t, i in before.items())
    n = len(before)
    assert {t: vocab[t] for t in ("firstnewterm", "secondnewterm", "thirdnewterm")} == {
        "firstnewterm": n, "secondnewterm": n + 1, "thirdnewterm": n + 2}
    assert "failednewterm" not in vocab and len(vocab) == n + 3
    assert [h.id for h in r.search("thirdnewterm", k=3, mode="bm25")] == ["y"]
    assert sorted(h.id for h in r.search("firstnewterm", k=3, mode="bm25")) == ["x", "y"]
    assert not r.search("failednewterm", k=3, mode="bm25")
    on_disk = {p.name for p in path.iterdir() if p.name.startswith("vocab.")}
    assert on_disk == {"vocab.arrow", "vocab.000002.arrow", "vocab.000002.1.arrow"}
    with IndexUpdater.open(path) as u:  # closed without a commit: its file goes with its segment
        u.add([{"_id": "w", "text": "uncommittednewterm"}])
        assert (path / "vocab.000003.arrow").is_file()
    assert {p.name for p in path.iterdir() if p.name.startswith("vocab.")} == on_disk


# ---------------------------------------------------------------------------------- deleted stay deleted
def test_deleted_and_superseded_documents_never_come_back(tmp_path):
    docs = [{"_id": f"d{i}", "text": "filler words here"} for i in range(20)]
    docs[0] = {"_id": "d0", "text": "target target target"}
    docs[1] = {"_id": "d1", "text": "target target"}
    path = tmp_path / "ix"
    build_index(docs, path, legs=("bm25",), shard_size=8, show_progress=False)
    with IndexUpdater.open(path) as u:
        u.delete(["d0"])
        u.upsert([{"_id": "d1", "text": "nothing relevant"}])
        u.add([{"_id": "t1", "text": "target words"}, {"_id": "t2", "text": "target"}])
        u.commit()
    r = Retriever.open(path)
    for algo in BM25_ALGOS:
        hits = r.search("target", k=1, mode="bm25", leg_params={"bm25": {"algorithm": algo}})
        assert [h.id for h in hits] in (["t2"], ["t1"])
        hits = r.search("target filler", k=20, mode="bm25", leg_params={"bm25": {"algorithm": algo}})
        ids = [h.id for h in hits]
        assert len(ids) == 20 and "d0" not in ids and ids.count("d1") <= 1
        assert all(h.text != "target target" for h in hits)


# ---------------------------------------------------------------------------------- input rules
def test_input_rules_and_nothing_written_when_rejected(tmp_path):
    path, m = start(tmp_path, ("bm25",), n=6)
    files_before = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != "LOCK")
    with IndexUpdater.open(path) as u:
        with pytest.raises(CorpusError, match=r"'a1' appears twice in this batch: positions 1 and 3"):
            u.add([{"_id": "a0", "text": "x"}, {"_id": "a1", "text": "y"}, {"_id": "a2", "text": "z"},
                   {"_id": "a1", "text": "w"}])
        with pytest.raises(CorpusError, match=r"'d2' is already in the index \(shards/00000, row 2\); use upsert"):
            u.add([{"_id": "new", "text": "x"}, {"_id": "d2", "text": "y"}])
        with pytest.raises(CorpusError, match=r"'year'.*int64.*string"):
            u.add([{"_id": "new", "text": "x", "year": "nineteen"}])
        with pytest.raises(ConfigError, match="not one string"):
            u.delete("d1")
        assert not u.pending
        assert u.commit() == 1  # nothing to commit: no new generation
        rep = u.delete(["zz", "d1", "d1", "yy"])
        assert rep.deleted == 1 and rep.unknown == ["zz", "yy"]
        assert u.delete(["d1"]).unknown == ["d1"]  # already deleted (pending)
    files_after = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != "LOCK")
    assert files_after == files_before  # closed without commit: nothing left behind


def test_existing_id_error_names_segment_and_row_across_deletes_adds_and_commits(tmp_path):
    """The id map (built from the segments' id columns minus their deleted rows, then kept across
    adds, upserts, deletes and commits) names the segment and row of the live document."""
    path, m = start(tmp_path, ("bm25",), n=30, shard_size=12)
    with IndexUpdater.open(path) as u:
        assert u.delete(["d13", "d25"]).deleted == 2
        u.commit()
    with IndexUpdater.open(path) as u:  # map built from segments with tombstones
        with pytest.raises(CorpusError, match=r"'d14' is already in the index \(shards/00001, row 2\)"):
            u.add([{"_id": "d14", "text": "x"}])
        with pytest.raises(CorpusError, match=r"'d26' is already in the index \(shards/00002, row 2\)"):
            u.add([{"_id": "d26", "text": "x"}])
        assert u.add([{"_id": "d13", "text": "back"}, {"_id": "n1", "text": "new"}]) == 2  # deleted ids are free
        with pytest.raises(CorpusError, match=r"'n1' is already in the index \(shards/00003, row 1\)"):
            u.add([{"_id": "n1", "text": "x"}])
        assert u.upsert([{"_id": "d14", "text": "again"}, {"_id": "n2", "text": "y"}]) == 2
        with pytest.raises(CorpusError, match=r"'d14' is already in the index \(shards/00004, row 0\)"):
            u.add([{"_id": "d14", "text": "x"}])
        u.commit()
        with pytest.raises(CorpusError, match=r"'n2' is already in the index \(shards/00004, row 1\)"):
            u.add([{"_id": "n2", "text": "x"}])
        rep = u.delete(["d14", "d14", "n1", "d25", "zz"])
        assert (rep.deleted, rep.unknown) == (2, ["d25", "zz"])
        u.commit()
    with IndexUpdater.open(path) as u:
        assert u.add([{"_id": "d14", "text": "third"}, {"_id": "n1", "text": "again"}]) == 2
        u.commit()
        with pytest.raises(CorpusError, match=r"'n1' is already in the index \(shards/00005, row 1\)"):
            u.add([{"_id": "n1", "text": "x"}])


def test_one_writer_at_a_time_names_the_holder(tmp_path):
    import os

    path, _ = start(tmp_path, ("bm25",), n=4)
    with IndexUpdater.open(path):
        with pytest.raises(IndexLockedError, match=f"pid {os.getpid()}"):
            IndexUpdater.open(path)
        assert Retriever.open(path).search("apple", k=2, mode="bm25") is not None  # readers unaffected
    IndexUpdater.open(path).close()  # released


def test_other_model_is_an_error_naming_both(tmp_path):
    from retriever.index.updates import _check_model

    with pytest.raises(ModelError, match=r"model /m/new \(weights w.bin: bbbbbbbbbbbb\).*/m/old \(weights w.bin: aaaaaaaaaaaa\)"):
        _check_model("dense", {"path": "/m/old", "sha256": {"w.bin": "a" * 64}}, {"path": "/m/new", "sha256": {"w.bin": "b" * 64}})
    _check_model("dense", {"path": "/m/old", "sha256": {"w.bin": "a" * 64}}, {"path": "/m/x", "sha256": {"w.bin": "a" * 64}})


def test_precomputed_dense_index_needs_vectors(tmp_path):
    path, m = start(tmp_path, ("bm25", "dense"), n=5)
    with IndexUpdater.open(path) as u:
        with pytest.raises(ConfigError, match="precomputed.*dense_vectors"):
            u.add([make_doc("z")])
        with pytest.raises(ConfigError, match="fewer rows"):
            u.add([make_doc("z"), make_doc("y")], dense_vectors=np.zeros((1, DIM), np.float32))
        assert not u.pending


# ---------------------------------------------------------------------------------- refresh
def test_refresh_reuses_the_segments_it_shares(tmp_path):
    path, m = start(tmp_path, ("bm25", "dense"), n=40, shard_size=10)
    r = Retriever.open(path)
    with IndexUpdater.open(path) as u:
        new = [("n0", 0)]
        u.add([make_doc(*new[0])], **m.records(new))
        u.commit()
    cache = r._segments
    assert r.refresh()
    # 4 old segments reused per leg, 1 new one built per leg (+ the vocabulary extended)
    assert cache.reused >= 8 and cache.built <= 3
    assert len(r.reader.shards) == 5


# ---------------------------------------------------------------------------------- crash safety
ROOT = Path(__file__).resolve().parents[1]
ADD_POINTS = ("encode_bm25", "shard_docs", "shard_bm25", "shard_done", "update_segments", "update_deletes",
              "update_vocab", "generation_manifest", "generation_current", "update_clean")
COMPACT_POINTS = ("shard_docs", "shard_done", "update_segments", "compact_segment", "generation_manifest",
                  "generation_current", "update_clean")
FAST_POINTS = {("add", "update_deletes"), ("add", "generation_manifest"), ("compact", "compact_segment")}


def _disk_files(path: Path) -> set[str]:
    return {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {"LOCK"}


def _listed(path: Path) -> set[str]:
    from retriever.index.format import read_current, read_manifest

    out = {"CURRENT"}
    cur = read_current(path)
    for g in (cur, cur - 1):
        if g >= 1:
            try:
                m = read_manifest(path, g)
            except Exception:  # noqa: BLE001 - an older generation may be gone
                continue
            out |= set(m["files"]) | {f"manifests/{g:06d}.json"}
    return out


def _crash_cases():
    for job in ("add", "compact"):
        for point in (ADD_POINTS if job == "add" else COMPACT_POINTS):
            marks = () if (job, point) in FAST_POINTS else (pytest.mark.slow,)
            yield pytest.param(job, point, marks=marks, id=f"{job}-{point}")


@pytest.mark.parametrize("job,point", list(_crash_cases()))
def test_sigkill_leaves_the_previous_or_the_new_generation(tmp_path, job, point):
    import json
    import signal
    import subprocess
    import sys

    from retriever.index.format import read_current

    path, m = start(tmp_path, ("bm25",), n=20, shard_size=8)
    before = list(m.live)
    new = [(f"n{i}", 0) for i in range(6)]
    after = [x for x in before if x[0] not in ("d1", "d9")] + new
    spec = {"dir": str(path), "add": [make_doc(k, v) for k, v in new], "delete": ["d1", "d9"]}
    spec["add"][0]["text"] += " neverseenbefore"  # a new term: the commit writes a vocabulary file
    m.override[new[0]] = spec["add"][0]
    if job == "compact":  # first commit the change, then crash inside the compaction
        with IndexUpdater.open(path) as u:
            u.add(spec["add"])
            u.delete(spec["delete"])
            u.commit()
        spec = {"dir": str(path), "compact": True}
        before = after
    gen0 = read_current(path)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "crash_update.py"), point, json.dumps(spec)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr  # every point is reached
    gen = read_current(path)
    assert gen in (gen0, gen0 + 1, gen0 + 2)
    m.live = before if gen == gen0 else after
    fresh = m.fresh(tmp_path / "fresh")
    assert assert_same(Retriever.open(path), fresh, ("bm25",), ks=(5, 50)) > 0
    with IndexUpdater.open(path) as u:  # the next writer removes what the killed one left
        pass
    assert _disk_files(path) <= _listed(path)
    with IndexUpdater.open(path) as u:  # and can go on
        more = [("z0", 0)]
        u.add([make_doc(*more[0])])
        u.commit()
    m.live += more
    assert assert_same(Retriever.open(path), m.fresh(tmp_path / "fresh"), ("bm25",), ks=(5,)) > 0


# ---------------------------------------------------------------------------------- concurrent readers
def test_readers_in_threads_keep_their_snapshot_while_a_writer_commits_and_compacts(tmp_path):
    import threading

    path, m = start(tmp_path, ("bm25",), n=40, shard_size=8)
    r = Retriever.open(path)
    expected = {q: [(h.id, h.score) for h in r.search(q, k=10, mode="bm25")] for q in QUERIES}
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = [0, 0]

    def reader(slot: int) -> None:
        try:
            while not stop.is_set():
                for q in QUERIES:
                    got = [(h.id, h.score) for h in r.search(q, k=10, mode="bm25")]
                    assert got == expected[q], (q, got, expected[q])
                    counts[slot] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        with IndexUpdater.open(path, keep_generations=1) as u:  # old files removed at once
            for i in range(4):
                u.add([make_doc(f"w{i}_{j}") for j in range(5)])
                u.delete([f"d{i}", f"d{i + 10}"])
                u.commit()
            u.compact(full=True)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[0]
    assert min(counts) > 0
    assert r.reader.generation == 1 and r.refresh() and r.reader.generation == 6


def test_refresh_in_another_thread_while_a_search_runs_keeps_its_snapshot(tmp_path):
    """A refresh() that switches generations while a search on the same Retriever is under way
    (forced here: the search waits inside the engine until the other thread's refresh is done)
    leaves that search on the generation it started with: its hits are that generation's
    documents, with their scores (before the fix the hits were made from the new generation's
    documents: other ids, since the compaction shifted every ordinal)."""
    import threading

    path, m = start(tmp_path, ("bm25", "dense"), n=40, shard_size=8)
    r = Retriever.open(path)
    kw = query_kwargs(("bm25", "dense"), "hybrid")
    want_one = [(h.id, h.score) for h in r.search(QUERIES[0], k=10, mode="bm25")]
    want_batch = [[(h.id, h.score) for h in hs] for hs in r.search_batch(QUERIES, k=10, mode="hybrid", **kw)]
    with IndexUpdater.open(path) as u:
        u.delete([f"d{i}" for i in range(0, 40, 3)])
        u.compact(full=True)  # every later document moves to a lower ordinal
    engine = r.engine
    search = engine.search

    def search_while_refreshing(*args, **kwargs):
        t = threading.Thread(target=r.refresh)
        t.start()
        t.join()  # the other thread's refresh() has switched the Retriever to the new generation
        assert r.engine is not engine
        return search(*args, **kwargs)

    engine.search = search_while_refreshing
    got_one = [(h.id, h.score) for h in r.search(QUERIES[0], k=10, mode="bm25")]
    assert got_one == want_one
    old_gen = engine.reader.generation
    r._snap = (engine.reader, engine)  # back to the old generation, for the batch call
    got_batch = [[(h.id, h.score) for h in hs] for hs in r.search_batch(QUERIES, k=10, mode="hybrid", **kw)]
    assert got_batch == want_batch
    assert r.reader.generation > old_gen
    # a result of the old generation turned into hits after the switch: a clear error, not wrong ids
    res = engine.search(QUERIES, k=3, mode="bm25", fusion=r.default_fusion(), depth=10, n_threads=1)
    assert res.generation == old_gen
    with pytest.raises(QueryError, match=f"generation {old_gen}"):
        r.to_hits(res)
    # the new generation answers as a fresh build of the live documents
    m.live = [(k, v) for k, v in m.live if int(k[1:]) % 3 != 0]
    assert assert_same(r, m.fresh(tmp_path / "fresh"), ("bm25", "dense"), ks=(10,)) > 0


def test_a_reader_in_another_process_keeps_its_snapshot(tmp_path):
    import json
    import subprocess
    import sys
    import time

    path, _ = start(tmp_path, ("bm25",), n=40, shard_size=8)
    script = (
        "import json, sys, time\n"
        "from retriever import Retriever\n"
        f"r = Retriever.open({str(path)!r})\n"
        f"qs = {QUERIES!r}\n"
        "exp = [[(h.id, h.score) for h in r.search(q, k=10, mode='bm25')] for q in qs]\n"
        "print('ready', flush=True)\n"
        "n = 0\n"
        "t0 = time.time()\n"
        "while time.time() - t0 < 6:\n"
        "    for q, e in zip(qs, exp):\n"
        "        assert [(h.id, h.score) for h in r.search(q, k=10, mode='bm25')] == e\n"
        "        n += 1\n"
        "print(json.dumps({'n': n, 'gen': r.reader.generation}))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    with IndexUpdater.open(path, keep_generations=1) as u:
        for i in range(3):
            u.add([make_doc(f"p{i}_{j}") for j in range(5)])
            u.delete([f"d{i}"])
            u.commit()
            time.sleep(0.2)
        u.compact(full=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    rep = json.loads(out.strip().splitlines()[-1])
    assert rep["gen"] == 1 and rep["n"] > 0


# ---------------------------------------------------------------------------------- stateful property test
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,  # noqa: E402
                                 run_state_machine_as_test)


class LivingIndexMachine(RuleBasedStateMachine):
    """Random add / delete / upsert / commit / compact / reopen sequences against the fresh-build
    model: after every commit (and reopen) every exact-mode search equals a fresh build's."""

    legs = ("bm25", "dense")
    tmp: Path

    def __init__(self) -> None:
        super().__init__()
        self.counter = 0
        self.versions: dict[str, int] = {}

    @initialize()
    def build(self) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="living-"))
        self.path, self.model = start(self.dir, self.legs, n=12, shard_size=5)
        self.committed = list(self.model.live)
        self.updater = IndexUpdater.open(self.path)
        self.reader = Retriever.open(self.path)

    def teardown(self) -> None:
        import shutil

        if hasattr(self, "updater"):
            self.updater.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _new_keys(self, n: int) -> list[tuple[str, int]]:
        out = []
        for _ in range(n):
            self.counter += 1
            out.append((f"h{self.counter}", 0))
        return out

    @rule(n=st.integers(1, 7))
    def add(self, n: int) -> None:
        items = self._new_keys(n)
        self.updater.add([make_doc(k, v) for k, v in items], **self.model.records(items))
        self.model.live += items

    @rule(data=st.data(), n=st.integers(1, 4))
    def delete(self, data, n: int) -> None:
        if not self.model.live:
            return
        keys = data.draw(st.lists(st.sampled_from([k for k, _ in self.model.live]), min_size=1, max_size=n))
        rep = self.updater.delete(keys + ["never-there"])
        assert rep.deleted == len(set(keys)) and rep.unknown == ["never-there"]
        self.model.live = [x for x in self.model.live if x[0] not in set(keys)]

    @rule(data=st.data(), n_new=st.integers(0, 2))
    def upsert(self, data, n_new: int) -> None:
        old = data.draw(st.lists(st.sampled_from([k for k, _ in self.model.live]), max_size=2, unique=True)) \
            if self.model.live else []
        items = []
        for k in old:
            self.versions[k] = self.versions.get(k, 0) + 1
            items.append((k, self.versions[k]))
        items += self._new_keys(n_new)
        if not items:
            return
        self.updater.upsert([make_doc(k, v) for k, v in items], **self.model.records(items))
        self.model.live = [x for x in self.model.live if x[0] not in set(old)] + items

    @rule()
    def commit(self) -> None:
        self.updater.commit()
        self.committed = list(self.model.live)

    @rule(full=st.booleans())
    def compact(self, full: bool) -> None:
        self.updater.compact(CompactPolicy(small_rows=6, max_deleted_fraction=0.3), full=full)
        self.committed = list(self.model.live)

    @rule()
    def reopen_writer(self) -> None:
        self.updater.close()  # uncommitted changes are dropped
        self.model.live = list(self.committed)
        self.updater = IndexUpdater.open(self.path)

    @precondition(lambda self: hasattr(self, "reader"))
    @rule(reopen=st.booleans())
    def check(self, reopen: bool) -> None:
        if reopen:
            self.reader = Retriever.open(self.path)
        else:
            self.reader.refresh()
        fresh_model = Model(self.legs)
        fresh_model.live = list(self.committed)
        if not fresh_model.live:
            assert self.reader.search("apple", k=5, mode="bm25") == []
            return
        # the same data-derived constants: the sparse quantisation scale fixed at creation
        fresh = fresh_model.fresh(self.dir / "fresh", sparse_scale=sparse_scale_of(self.path))
        assert assert_same(self.reader, fresh, self.legs, ks=(3, 20)) > 0

    @invariant()
    def pending_matches_the_model(self) -> None:
        if hasattr(self, "updater") and self.model.live != self.committed:
            assert self.updater.pending


class LivingSparseIndexMachine(LivingIndexMachine):
    """The same sequences on an index with the learned-sparse leg too (exact sparse search and a
    three-leg hybrid compared with a fresh build at the index's creation scale)."""

    legs = ("bm25", "dense", "sparse")


@pytest.mark.parametrize("machine,examples,steps", [
    (LivingIndexMachine, 4, 12), (LivingSparseIndexMachine, 3, 10),
    pytest.param(LivingIndexMachine, 60, 30, marks=pytest.mark.slow),
    pytest.param(LivingSparseIndexMachine, 40, 30, marks=pytest.mark.slow)])
def test_living_index_state_machine(machine, examples, steps):
    """Random add / delete / upsert / commit / compact / reopen sequences against fresh builds: a
    bounded number in the suite, more in the slow run."""
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, suppress_health_check=list(HealthCheck)))


def test_deleted_documents_never_come_back_through_dense_sparse_and_hybrid(tmp_path):
    """A deleted (or superseded) document whose vectors equal the query's would rank first in
    every vector leg; it never comes back, and a small k still returns k live documents."""
    legs = ("bm25", "dense", "sparse")
    path, m = start(tmp_path, legs, n=24, shard_size=10)
    with IndexUpdater.open(path) as u:
        u.delete(["d0"])
        up = [("d5", 1)]
        u.upsert([make_doc(*up[0])], **m.records(up))
        u.commit()
    r = Retriever.open(path)
    qv = np.stack([dense_vec("d0"), dense_vec("d5")])  # the deleted / superseded vectors
    sv = [sparse_vec("d0"), sparse_vec("d5")]
    cases = [("dense", {}), ("sparse", {"sparse": {"algorithm": "exact"}}),
             ("sparse", {"sparse": {"algorithm": "seismic"}}), ("hybrid", {})]
    for mode, params in cases:
        for k in (1, 3, 23):
            res = r.search_arrays(["d0 words", "d5 words"], k=k, mode=mode, leg_params=params,
                                  query_vectors=qv if mode != "sparse" else None, sparse_vectors=sv)
            for q in range(2):
                ids = list(r.doc_ids(res.ids[q, :res.n_found[q]]))
                assert "d0" not in ids, (mode, params, k, ids)
                assert res.n_found[q] == k or mode == "sparse", (mode, k, res.n_found[q])
                ords = res.ids[q, :res.n_found[q]]
                sh, rows = r.reader.locate(ords)
                for s, row in zip(sh.tolist(), rows.tolist()):  # no deleted row (the old d5 included)
                    dele = r.reader.shards[s].deleted
                    assert dele is None or row not in set(dele.tolist()), (mode, k, ids)
    # the new d5 is found by its own vector
    hits = r.search("x", k=1, mode="dense", query_vectors=dense_vec("d5", 1)[None, :])
    assert [h.id for h in hits] == ["d5"]


@pytest.mark.parametrize("factory,params", [("IVF32,Flat", {"nprobe": 2}), ("HNSW16", {"ef_search": 16}),
                                            ("IVF32,PQ4", {"nprobe": 2})])
def test_approximate_segments_keep_recall(tmp_path, factory, params):
    """Approximate mode: segments added to an IVF / HNSW / IVF-PQ index are filled with the index's
    trained quantiser (IVF, PQ) or built with its template; recall@10 against exact search (1,000
    queries) is not below a fresh build's by more than 0.01. A living index may be above it (each
    segment returns its own k candidates) until a full compaction merges them: then within 0.01 of
    the fresh build's either way."""
    from retriever import DenseConfig

    dim, n_base, n_add = 16, 3000, 1000
    centers = np.random.default_rng(0).standard_normal((32, dim))

    def vecs(n: int, seed: int) -> np.ndarray:
        r = np.random.default_rng(seed)
        x = centers[r.integers(0, len(centers), n)] + 0.5 * r.standard_normal((n, dim))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    base, extra = vecs(n_base, 1), vecs(n_add, 2)
    ids = [f"v{i}" for i in range(n_base + n_add)]
    docs = [{"_id": i, "text": "x"} for i in ids]
    cfg = dict(legs=("dense",), dense=DenseConfig(faiss_factory=factory), shard_size=10 ** 6, show_progress=False)
    path = tmp_path / "live"
    build_index(docs[:n_base], path, dense_vectors=base, **cfg)
    dead = {f"v{i}" for i in range(0, n_base, 7)}
    with IndexUpdater.open(path) as u:
        u.add(docs[n_base:n_base + n_add // 2], dense_vectors=extra[:n_add // 2])
        u.commit()
        u.add(docs[n_base + n_add // 2:], dense_vectors=extra[n_add // 2:])
        u.delete(sorted(dead))
        u.commit()
    keep = [i for i, d in enumerate(ids) if d not in dead]
    allv = np.concatenate([base, extra])
    build_index([docs[i] for i in keep], tmp_path / "fresh", dense_vectors=allv[keep], **cfg)
    q = vecs(1000, 9)
    exact = np.argsort(-(q @ allv[keep].astype(np.float16).astype(np.float32).T), axis=1, kind="stable")[:, :10]
    truth = [{ids[keep[j]] for j in row} for row in exact]

    def recall(path: Path) -> float:
        r = Retriever.open(path)
        assert r.reader.shards[-1].dir.joinpath("dense.faiss").is_file()
        res = r.search_arrays(["x"] * len(q), k=10, mode="dense", query_vectors=q, leg_params={"dense": params})
        return float(np.mean([len(set(r.doc_ids(res.ids[i, :res.n_found[i]])) & truth[i]) / 10 for i in range(len(q))]))

    live, fresh = recall(path), recall(tmp_path / "fresh")
    print(f"{factory}: recall@10 living {live:.3f} fresh {fresh:.3f}")
    assert live > 0.4 and fresh > 0.4
    assert live >= fresh - 0.01, (live, fresh)
    with IndexUpdater.open(path) as u:
        u.compact(full=True)
    compacted = recall(path)
    print(f"{factory}: after a full compaction {compacted:.3f}")
    assert abs(compacted - fresh) <= 0.01, (compacted, fresh)


def _vocab_terms(path: Path) -> list[str]:
    from retriever.index.format import read_manifest, read_table

    m = read_manifest(path)
    terms: list[str] = []
    for rel in m.get("vocab") or ["vocab.arrow"]:
        terms += read_table(path / rel, full=True).column("term").to_pylist()
    return terms


def test_batches_analysed_while_reading_are_dropped_with_a_rejected_batch(tmp_path):
    """With batch_size 4 and shard_size 10, an add analyses its first two batches while it still
    reads the records; a batch rejected after that (a repeat, an existing id, a bad record, a
    metadata type conflict, too few vectors) writes nothing and leaves no term behind; the adds
    that follow equal a fresh build, vocabulary order included."""
    legs = ("bm25", "dense")
    m = Model(legs)
    m.live = [(f"d{i}", 0) for i in range(13)]
    path = tmp_path / "live"
    build_index([make_doc(k, v) for k, v in m.live], path, legs=legs, shard_size=10, batch_size=4,
                show_progress=False, **m.records(m.live))
    files_before = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != "LOCK")
    new = [(f"n{i}", 0) for i in range(27)]

    def batch(**change: dict) -> list[dict]:
        recs = [make_doc(k, v) for k, v in new]
        for r in recs[:12]:
            r["text"] += f" novel{r['_id']}"  # terms that must not survive a rejected batch
        for pos, rec in change.items():
            recs[int(pos[1:])] = rec
        return recs

    with IndexUpdater.open(path) as u:
        with pytest.raises(CorpusError, match=r"'n2' appears twice in this batch: positions 2 and 25"):
            u.add(batch(p25={**make_doc("n2"), "text": "again"}), **m.records(new))
        with pytest.raises(CorpusError, match=r"'d4' is already in the index \(shards/00000, row 4\)"):
            u.add(batch(p20=make_doc("d4")), **m.records(new))
        with pytest.raises(CorpusError, match="text must be a string"):
            u.add(batch(p22={"_id": "bad", "text": 5}), **m.records(new))
        with pytest.raises(CorpusError, match=r"'year'.*int64.*string"):
            u.add(batch(p21={**make_doc("n21"), "year": "nineteen"}), **m.records(new))
        with pytest.raises(ConfigError, match="fewer rows"):
            u.add(batch(), dense_vectors=m.records(new)["dense_vectors"][:20])
        assert not u.pending
    files_after = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != "LOCK")
    assert files_after == files_before
    with IndexUpdater.open(path) as u:
        with pytest.raises(CorpusError, match="appears twice"):  # a rejection in the same session as the adds
            u.add(batch(p25={**make_doc("n2"), "text": "again"}), **m.records(new))
        assert u.add([make_doc(k, v) for k, v in new], **m.records(new)) == 27
        m.live += new
        u.commit()
        fresh = m.fresh(tmp_path / "fresh")
        assert assert_same(Retriever.open(path), fresh, legs) > 0
        # nothing deleted yet: the appended vocabulary is a fresh build's, term for term
        assert _vocab_terms(path) == _vocab_terms(tmp_path / "fresh")
        up = [(f"d{i}", 1) for i in range(11)] + [(f"n{i}", 1) for i in range(3)]
        assert u.upsert([make_doc(k, v) for k, v in up], **m.records(up)) == 14
        keys = {k for k, _ in up}
        m.live = [x for x in m.live if x[0] not in keys] + up
        u.commit()
    assert assert_same(Retriever.open(path), m.fresh(tmp_path / "fresh"), legs) > 0


def test_a_failure_inside_the_first_analysed_batch_leaves_nothing_behind(tmp_path):
    """An add that fails inside the BM25 builder while it takes the first batch it analyses during
    the read (fault point ``encode_bm25``: the builder already holds the batch's documents and
    terms) drops them: the adds that follow equal a fresh build, vocabulary order included."""
    legs = ("bm25",)
    m = Model(legs)
    m.live = [(f"d{i}", 0) for i in range(4)]
    path = tmp_path / "live"
    build_index([make_doc(k, v) for k, v in m.live], path, legs=legs, shard_size=5, batch_size=2,
                show_progress=False)

    class Boom(Exception):
        pass

    armed = True

    def fault(point: str) -> None:
        nonlocal armed
        if point == "encode_bm25" and armed:
            armed = False
            raise Boom(point)

    ghosts = [{"_id": f"g{i}", "text": "ghostterm ghostterm"} for i in range(3)]
    new = [(f"n{i}", 0) for i in range(3)]
    with IndexUpdater.open(path, faults=fault) as u:
        with pytest.raises(Boom):
            u.add(ghosts)
        assert not u.pending
        assert u.add([make_doc(k, v) for k, v in new]) == 3
        m.live += new
        u.commit()
    r = Retriever.open(path)
    assert "ghostterm" not in r.engine.legs["bm25"].vocab
    assert r.search("ghostterm", k=5, mode="bm25") == []
    assert assert_same(r, m.fresh(tmp_path / "fresh"), legs) > 0


def test_precomputed_dense_vectors_of_another_width_are_refused(tmp_path):
    """Vectors of another dimension than the index's are refused before anything is written (a
    segment of such vectors would leave the committed generation unreadable for dense search);
    the adds that follow equal a fresh build."""
    legs = ("bm25", "dense")
    path, m = start(tmp_path, legs, n=10, shard_size=6)
    files_before = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != "LOCK")
    new = [(f"n{i}", 0) for i in range(8)]
    recs = [make_doc(k, v) for k, v in new]
    for r in recs:
        r["text"] += f" novel{r['_id']}"
    with IndexUpdater.open(path) as u:
        for dim in (DIM + 1, DIM - 1):
            vecs = np.random.default_rng(dim).standard_normal((len(new), dim)).astype(np.float32)
            with pytest.raises(ConfigError, match=rf"dense_vectors rows have shape \({dim},\), expected \({DIM},\)"):
                u.add(recs, dense_vectors=vecs)
        assert not u.pending
    files_after = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != "LOCK")
    assert files_after == files_before
    with IndexUpdater.open(path) as u:
        with pytest.raises(ConfigError, match="expected"):
            u.add(recs, dense_vectors=np.ones((len(new), DIM + 3), np.float32))
        u.add([make_doc(k, v) for k, v in new], **m.records(new))
        m.live += new
        u.commit()
    assert assert_same(Retriever.open(path), m.fresh(tmp_path / "fresh"), legs) > 0


def test_masked_df_counts_each_subset_document_once_per_term():
    # the delete commit's per-term df of the deleted rows: equal to counting in Python
    from retriever.index.analyzer_kernels import masked_df
    rng = np.random.default_rng(3)
    n_docs, n_terms = 300, 40
    lists = [np.sort(rng.choice(n_docs, int(rng.integers(0, 60)), replace=False)) for _ in range(n_terms)]
    offsets = np.zeros(n_terms + 1, np.uint64)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    doc_ids = np.concatenate(lists).astype(np.uint32)
    rows = rng.integers(0, n_docs, 50)  # repeats allowed
    subset = set(rows.tolist())
    want = [sum(int(d) in subset for d in x) for x in lists]
    assert masked_df(offsets, doc_ids, rows, n_docs).tolist() == want
    assert masked_df(offsets, doc_ids, rows[:0], n_docs).tolist() == [0] * n_terms
    with pytest.raises(ValueError, match="rows out of range"):
        masked_df(offsets, doc_ids, np.array([n_docs]), n_docs)
    with pytest.raises(ValueError, match="doc id"):
        masked_df(offsets, doc_ids, np.array([0]), int(doc_ids.max()))  # a doc id past the shard
    with pytest.raises(ValueError, match="CSR offsets"):
        masked_df(offsets[::-1].copy(), doc_ids, rows, n_docs)



# ------------------------------------------------------------------------ an index rebuilt in place
def _lang_docs(prefix: str, en: set[int]) -> list[dict]:
    return [{"_id": f"{prefix}{i}", "text": "apple words", "lang": "en" if i in en else "de"} for i in range(6)]


def test_overwrite_is_refused_while_a_writer_has_the_index_open(tmp_path):
    """build_index(overwrite=True) takes the replaced index's writer lock: with an IndexUpdater
    open it is refused (naming the holder) before any work, so the writer's pending delete is
    committed to the index it was made against, never into a new index that reuses the ids'
    rows; once the writer is closed the overwrite goes ahead."""
    import os

    from retriever.index.errors import IndexLockedError

    path = tmp_path / "ix"
    docs = [{"_id": f"d{i}", "text": f"common words number{i}"} for i in range(8)]
    build_index(docs, path, legs=("bm25",), shard_size=3, show_progress=False)
    with IndexUpdater.open(path) as u:
        assert u.delete(["d1"]).deleted == 1
        with pytest.raises(IndexLockedError, match=f"pid {os.getpid()}"):
            build_index([{**d, "_id": "o" + d["_id"][1:]} for d in docs], path, legs=("bm25",), shard_size=3,
                        show_progress=False, overwrite=True)
        assert not [p for p in tmp_path.iterdir() if p.name != "ix"]  # no temporary directory left
        u.commit()
    assert sorted(Retriever.open(path).live_ids()) == sorted(d["_id"] for d in docs if d["_id"] != "d1")
    build_index(docs[:2], path, legs=("bm25",), show_progress=False, overwrite=True)
    assert sorted(Retriever.open(path).live_ids()) == ["d0", "d1"]


def test_refresh_sees_an_index_rebuilt_in_place_at_the_same_generation(tmp_path):
    """An overwrite starts the new index at generation 1 again: refresh() opens it although the
    generation number is the reader's (it compares the manifest file, not only the number), and
    the cached filter masks of the replaced index are not reused (keyed by the manifest's digest
    too)."""
    path = tmp_path / "ix"
    build_index(_lang_docs("a", {0, 1}), path, legs=("bm25",), show_progress=False)
    r = Retriever.open(path)
    assert [h.id for h in r.search("apple", k=10, mode="bm25", filter={"lang": "en"})] == ["a0", "a1"]
    assert not r.refresh()
    build_index(_lang_docs("b", {4, 5}), path, legs=("bm25",), show_progress=False, overwrite=True)
    assert r.reader.generation == 1 and r.refresh()
    assert sorted(h.id for h in r.search("apple", k=10, mode="bm25")) == [f"b{i}" for i in range(6)]
    assert [h.id for h in r.search("apple", k=10, mode="bm25", filter={"lang": "en"})] == ["b4", "b5"]
    assert not r.refresh()


def test_filter_masks_of_a_replaced_index_are_not_reused_after_refreshes(tmp_path):
    """A reader caches masks at generation 1, follows a commit to generation 2, then an overwrite
    back to generation 1: the filter is compiled again for the new index."""
    path = tmp_path / "ix"
    build_index(_lang_docs("a", {0, 1}), path, legs=("bm25",), show_progress=False)
    r = Retriever.open(path)
    assert [h.id for h in r.search("apple", k=10, mode="bm25", filter={"lang": "en"})] == ["a0", "a1"]
    with IndexUpdater.open(path) as u:
        u.add([{"_id": "a9", "text": "pear", "lang": "fr"}])
        u.commit()
    assert r.refresh()
    build_index(_lang_docs("b", {4, 5}), path, legs=("bm25",), show_progress=False, overwrite=True)
    assert r.refresh()
    assert [h.id for h in r.search("apple", k=10, mode="bm25", filter={"lang": "en"})] == ["b4", "b5"]



def test_a_field_of_only_empty_lists_keeps_them_and_equals_a_fresh_build(tmp_path):
    """A field whose only values in a build are [] (and None) was stored as a null column: the []
    read back as a missing field, and after an add of ['x'] the living index disagreed with a
    fresh build on $exists / $nin. It is a list-of-strings column now: [] reads back, and every
    filter on it answers as the fresh build does."""
    docs = [{"_id": "d0", "text": "apple", "tags": []}, {"_id": "d1", "text": "apple pear", "tags": None},
            {"_id": "d2", "text": "pear"}]
    new = [{"_id": "d3", "text": "apple", "tags": ["x"]}]
    build_index(docs, tmp_path / "live", legs=("bm25",), show_progress=False)
    assert Retriever.open(tmp_path / "live").get(["d0"])[0]["metadata"] == {"tags": []}
    with IndexUpdater.open(tmp_path / "live") as u:
        u.add(new)
        u.commit()
    build_index(docs + new, tmp_path / "fresh", legs=("bm25",), show_progress=False)
    r, f = Retriever.open(tmp_path / "live"), Retriever.open(tmp_path / "fresh")
    assert r.reader.metadata_schema == f.reader.metadata_schema == {"tags": "list<string>"}
    assert r.get(["d0", "d1", "d2", "d3"]) == f.get(["d0", "d1", "d2", "d3"])
    for flt, want in (({"tags": {"$exists": True}}, ["d0", "d3"]), ({"tags": {"$nin": ["x"]}}, ["d0"]),
                      ({"tags": "x"}, ["d3"]), ({"tags": {"$exists": False}}, ["d1", "d2"])):
        got = sorted(h.id for h in r.search("apple pear", k=5, mode="bm25", filter=flt))
        assert got == want == sorted(h.id for h in f.search("apple pear", k=5, mode="bm25", filter=flt)), flt


@pytest.mark.parametrize("later", [["x"], [1, 2]])
def test_empty_lists_take_the_type_later_values_give_in_any_layout(tmp_path, later):
    """A shard of only [] types nothing: a later list of strings or JSON value gives the field its
    type, so the build succeeds with one shard per document as in one shard, the [] reads back as []
    and filters answer alike (a build with shard_size=1 failed on [] then [1, 2])."""
    recs = [{"_id": "a", "text": "one", "x": []}, {"_id": "b", "text": "one two", "x": later},
            {"_id": "c", "text": "one three"}]
    build_index(recs, tmp_path / "one", legs=("bm25",), show_progress=False)
    build_index(recs, tmp_path / "each", legs=("bm25",), shard_size=1, show_progress=False)
    r1, r2 = Retriever.open(tmp_path / "one"), Retriever.open(tmp_path / "each")
    assert r1.reader.metadata_schema == r2.reader.metadata_schema
    assert r1.get(["a", "b", "c"]) == r2.get(["a", "b", "c"])
    assert [d["metadata"] for d in r2.get(["a", "b"])] == [{"x": []}, {"x": later}]
    for flt in ({"x": {"$exists": True}}, {"x": {"$exists": False}}):
        assert sorted(h.id for h in r1.search("one", k=5, mode="bm25", filter=flt)) == \
               sorted(h.id for h in r2.search("one", k=5, mode="bm25", filter=flt)), flt


def test_adding_with_another_dense_model_names_both_and_writes_nothing(tmp_path):
    """End to end: an index built with the bundled dense model; a writer opened with a copy of
    it whose weights differ in one byte refuses the add with a ModelError naming both models and
    their weights' hashes, and writes nothing; the same add with the index's model succeeds."""
    pytest.importorskip("torch")
    import shutil

    from retriever.index.encoders.dense import default_dense_model

    try:
        src = Path(default_dense_model())
    except ModelError as e:
        pytest.skip(f"bundled dense model not installed: {e}")
    other = tmp_path / "other-model"
    shutil.copytree(src, other)
    w = other / "model.safetensors"
    raw = bytearray(w.read_bytes())
    raw[-1] ^= 1  # the last byte of a weight: loads the same, hashes differently
    w.write_bytes(bytes(raw))
    path = tmp_path / "idx"
    build_index([make_doc(f"d{i}", i) for i in range(6)], path, legs=("bm25", "dense"), show_progress=False)
    before = sorted(p.relative_to(path) for p in path.rglob("*") if p.name != "LOCK")
    with IndexUpdater.open(path, dense_model=other) as u:
        with pytest.raises(ModelError, match=r"other-model \(weights model\.safetensors: [0-9a-f]{12}\) is not the "
                                             r"index's .*\(weights model\.safetensors: [0-9a-f]{12}\)"):
            u.add([make_doc("n1", 1)])
        assert not u.pending
    assert sorted(p.relative_to(path) for p in path.rglob("*") if p.name != "LOCK") == before
    with IndexUpdater.open(path) as u:
        u.add([make_doc("n1", 1)])
        u.commit()
    assert Retriever.open(path).reader.n_docs == 7


def test_a_delete_commit_with_one_bad_segment_commits_nothing(tmp_path):
    """The tombstones of a commit are written side by side (one job per segment with deletes); when
    one segment's postings are damaged the commit raises that segment's IndexFormatError (naming
    its file) after the other jobs ended, and nothing is committed: the generation and every search
    stay as they were, and a commit after the file is restored applies the deletes."""
    path, m = start(tmp_path, ("bm25",), n=40, shard_size=10)
    before = Retriever.open(path)
    bad = path / "shards" / "00002" / "bm25.arrow"
    good = bad.read_bytes()
    with IndexUpdater.open(path) as u:
        u.delete([f"d{i}" for i in range(0, 40, 3)])  # rows in every segment
        bad.chmod(0o644)
        bad.write_bytes(good[:len(good) // 2])  # truncated: not valid Arrow
        with pytest.raises(IndexFormatError, match="00002"):
            u.commit()
        assert u.generation == 1 and u.pending
        bad.write_bytes(good)
        assert u.commit() == 2
    assert Retriever.open(path).reader.n_docs == 40 and before.reader.generation == 1
    m.live = [(k, v) for k, v in m.live if int(k[1:]) % 3]
    assert assert_same(Retriever.open(path), m.fresh(tmp_path / "fresh"), ("bm25",)) > 0
