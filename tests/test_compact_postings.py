"""A living index's segments list only their own BM25 terms (``terms`` + compact ``offsets`` in
``bm25.arrow``, ``bm25_terms`` in the manifest entry): the compact form round-trips to the dense
one, searches over such segments equal a fresh build's, and forged compact arrays are refused
with an error naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from conftest import random_corpus
from retriever import IndexUpdater, Retriever, build_index
from retriever.index.analyzer_kernels import CountScratch, CsrScratch, count_terms, csr_by_term, csr_by_term_compact
from retriever.index.arrow_io import write_table
from retriever.index.bm25_build import check_compact_offsets, compact_is_smaller, compact_offsets, dense_offsets
from retriever.index.errors import IndexFormatError
from retriever.index.format import current_manifest_path, manifest_digest, sha256_file
from retriever.legs.base import SearchContext
from retriever.params import BM25SearchParams
from retriever.topk import merge_topk

BM25_ALGOS = ("exhaustive", "maxscore", "bmw", "bmm", "auto")


def _dense(rng: np.random.Generator, n_terms: int, empty: float) -> np.ndarray:
    counts = rng.integers(1, 6, size=n_terms)
    counts[rng.random(n_terms) < empty] = 0
    out = np.zeros(n_terms + 1, dtype=np.uint64)
    np.cumsum(counts, out=out[1:])
    return out


@pytest.mark.parametrize("n_terms,empty", [(0, 0.0), (1, 0.0), (1, 1.0), (50, 0.0), (50, 0.9), (3000, 0.97),
                                           (3000, 1.0)])
def test_compact_round_trip(n_terms, empty):
    rng = np.random.default_rng(n_terms + int(empty * 100))
    dense = _dense(rng, n_terms, empty)
    terms, compact = compact_offsets(dense)
    assert terms.dtype == np.uint32 and compact.dtype == np.uint64
    np.testing.assert_array_equal(terms, np.flatnonzero(np.diff(dense.astype(np.int64))))
    assert len(compact) == len(terms) + 1 and compact[-1] == dense[-1]
    back = dense_offsets(terms, compact, n_terms, int(dense[-1]))
    np.testing.assert_array_equal(back, dense)
    # list i of the compact form is the list of term terms[i]
    for i, t in enumerate(terms[:20]):
        assert (compact[i], compact[i + 1]) == (dense[t], dense[t + 1])


def test_compact_is_smaller_counts_bytes():
    assert compact_is_smaller(0, 10) and compact_is_smaller(5, 10)
    assert not compact_is_smaller(7, 10)  # 12 * 7 + 8 = 92 > 88
    assert not compact_is_smaller(10, 10)


@pytest.mark.parametrize("terms,offsets,n_terms,nnz,msg", [
    ([0, 2], [0, 1], 5, 1, "offsets for 2 listed terms"),
    ([2, 1], [0, 1, 2], 5, 2, "strictly ascending"),
    ([1, 1], [0, 1, 2], 5, 2, "strictly ascending"),
    ([1, 5], [0, 1, 2], 5, 2, "below 5"),
    ([0, 1], [1, 1, 2], 5, 2, "from 0 to 2"),
    ([0, 1], [0, 2, 1], 5, 1, "non-decreasing"),
    ([0, 1], [0, 1, 2], 5, 3, "from 0 to 3"),
])
def test_check_compact_offsets_refuses(terms, offsets, n_terms, nnz, msg):
    with pytest.raises(ValueError, match=msg):
        check_compact_offsets(np.array(terms, np.uint32), np.array(offsets, np.uint64), n_terms, nnz)


def _manifest(root: Path) -> dict:
    return json.loads(current_manifest_path(root).read_text())


def _live_index(tmp_path: Path) -> tuple[Path, list[dict]]:
    """An index of 60 documents plus an add of 4 (new terms: a compact segment) and an add of 40,
    with deletes from the compact segment and from the first shard."""
    docs = random_corpus(104, seed=11, min_len=0)
    for i, d in enumerate(docs[60:64]):  # few terms of the vocabulary, and new ones
        d["title"], d["text"] = "", " ".join(d["text"].split()[:2] + [f"novel{i}", f"novel{i}", "zzterm"])
    root = tmp_path / "live"
    build_index(docs[:60], root, legs=("bm25",), show_progress=False)
    with IndexUpdater.open(root) as u:
        u.add(docs[60:64])
        u.commit()
        u.add(docs[64:])
        u.commit()
        gone = {docs[61]["_id"], docs[3]["_id"], docs[70]["_id"]}
        u.delete(sorted(gone))
        u.commit()
    return root, [d for d in docs if d["_id"] not in gone]


def _triples(rng: np.random.Generator, n_docs: int, n_terms: int, nnz: int):
    doc = np.sort(rng.integers(0, max(n_docs, 1), nnz)).astype(np.uint32)
    tid = np.minimum(rng.zipf(1.3, nnz) - 1, n_terms - 1).astype(np.uint32) if n_terms else np.zeros(0, np.uint32)
    tf = rng.integers(1, 9, nnz).astype(np.uint32)
    return doc, tid[:nnz], tf


def test_csr_by_term_compact_equals_the_dense_counting_sort_compacted():
    """The compact kernel = csr_by_term then compact_offsets, over calls of growing and shrinking
    vocabularies sharing one scratch, which is left all zero after each."""
    rng = np.random.default_rng(11)
    scratch = CsrScratch()
    for n_terms, nnz in [(1, 0), (1, 5), (70, 300), (3000, 40), (64, 1000), (129, 129), (5000, 20000), (10, 7)]:
        doc, tid, tf = _triples(rng, 50, n_terms, nnz)
        terms, offsets, d, f = csr_by_term_compact(doc, tid, tf, n_terms, scratch)
        dense, d_ref, f_ref = csr_by_term(doc, tid, tf, n_terms)
        t_ref, o_ref = compact_offsets(dense)
        assert terms.dtype == np.uint32 and offsets.dtype == np.uint64
        np.testing.assert_array_equal(terms, t_ref)
        np.testing.assert_array_equal(offsets, o_ref)
        np.testing.assert_array_equal(d, d_ref)
        np.testing.assert_array_equal(f, f_ref)
        np.testing.assert_array_equal(dense_offsets(terms, offsets, n_terms, nnz), dense)
        assert not scratch.count.any() and not scratch.bits.any()


def _count_reference(local_ids, counts, lmap, first_doc):
    """Per-document (doc, term, tf) in first-occurrence order and document lengths, in Python."""
    out, lens, p = [], [], 0
    for d, c in enumerate(counts):
        tf: dict[int, int] = {}
        for x in local_ids[p:p + c]:
            g = int(x) if lmap is None else int(lmap[x])
            if g >= 0:
                tf[g] = tf.get(g, 0) + 1
        p += c
        out += [(first_doc + d, g, f) for g, f in tf.items()]
        lens.append(sum(tf.values()))
    return out, lens


def test_count_terms_with_a_kept_scratch_equals_the_reference():
    """One CountScratch over calls of growing vocabularies whose document numbers restart (a new
    shard) and whose neighbouring documents share terms: the same pairs as counting each call
    afresh, and as a plain Python count."""
    rng = np.random.default_rng(3)
    scratch = CountScratch()
    for n_terms, n_docs, first_doc, identity in [(5, 4, 0, True), (5, 4, 4, True), (40, 30, 0, False),
                                                 (3000, 12, 0, True), (3000, 0, 12, True), (7, 9, 12, False),
                                                 (9000, 50, 0, False), (9000, 1, 0, True)]:
        counts = rng.integers(0, 12, n_docs).astype(np.int64)
        if identity:
            lmap, local = None, np.minimum(rng.zipf(1.4, int(counts.sum())) - 1, n_terms - 1).astype(np.int32)
        else:
            lmap = rng.integers(-1, n_terms, 60).astype(np.int64)
            local = rng.integers(0, 60, int(counts.sum())).astype(np.int32)
        got = count_terms(local, counts, lmap, n_terms, first_doc, scratch)
        fresh = count_terms(local, counts, lmap, n_terms, first_doc)
        for a, b in zip(got, fresh):
            np.testing.assert_array_equal(a, b)
        ref, lens = _count_reference(local, counts, lmap, first_doc)
        assert list(zip(got[0].tolist(), got[1].tolist(), got[2].tolist())) == ref
        assert got[3].tolist() == lens
    assert len(scratch.last) >= 9000 and scratch.stamp == 4 + 4 + 30 + 12 + 0 + 9 + 50 + 1


def test_csr_by_term_compact_errors_leave_the_scratch_clean():
    rng = np.random.default_rng(5)
    scratch = CsrScratch()
    doc, tid, tf = _triples(rng, 20, 100, 200)
    with pytest.raises(ValueError, match="ascending"):
        csr_by_term_compact(doc[::-1].copy(), tid, tf, 100, scratch)
    with pytest.raises(ValueError, match="out of range"):
        csr_by_term_compact(doc, tid, tf, int(tid.max()), scratch)
    with pytest.raises(ValueError, match="lengths differ"):
        csr_by_term_compact(doc, tid[:-1], tf, 100, scratch)
    assert not scratch.count.any() and not scratch.bits.any()
    terms, offsets, d, f = csr_by_term_compact(doc, tid, tf, 100, scratch)
    dense, _, _ = csr_by_term(doc, tid, tf, 100)
    np.testing.assert_array_equal(terms, compact_offsets(dense)[0])


def test_added_segment_is_compact_and_searches_equal_a_fresh_build(tmp_path):
    root, live = _live_index(tmp_path)
    entries = _manifest(root)["shards"]
    compact = [e for e in entries if "bm25_terms" in e]
    assert compact, entries  # the 4-document segment lists only its own terms
    for e in compact:
        cols = pa.ipc.open_file(str(root / e["dir"] / "bm25.arrow")).schema.names
        assert "terms" in cols and e["bm25_terms"] < e["n_terms"]
    fresh = tmp_path / "fresh"
    build_index(live, fresh, legs=("bm25",), show_progress=False)
    a, b = Retriever.open(root), Retriever.open(fresh)
    queries = ["novel0 zzterm", "novel2", *[" ".join(d["text"].split()[:3]) for d in live[::9] if d["text"]]]
    for algo in BM25_ALGOS:
        for q in queries:
            ha = a.search(q, k=7, mode="bm25", leg_params={"bm25": {"algorithm": algo}})
            hb = b.search(q, k=7, mode="bm25", leg_params={"bm25": {"algorithm": algo}})
            assert [h.id for h in ha] == [h.id for h in hb], (algo, q)
            np.testing.assert_allclose([h.score for h in ha], [h.score for h in hb], rtol=0, atol=1e-6)
    assert a.search("novel1", k=3, mode="bm25") == []  # docs[61] deleted: its only holder


def test_compact_segments_are_searched_in_their_own_term_ids(tmp_path):
    """A segment that lists only its own terms stays in that form in a reader: every per-term
    array derived at open (offsets, bounds, bitmap slots, thresholds, df) is as long as its own
    term list, not the vocabulary, and every path through it (one shard at a time per algorithm
    and with an allow mask, all shards in one call, exact scores of given documents for
    full-score fusion, the statistics) gives what the fresh build of the live documents gives."""
    root, live = _live_index(tmp_path)
    fresh = tmp_path / "fresh"
    build_index(live, fresh, legs=("bm25",), show_progress=False)
    a, b = Retriever.open(root), Retriever.open(fresh)
    leg, ref = a.engine.legs["bm25"], b.engine.legs["bm25"]
    mapped = [i for i, ks in enumerate(leg.kernel_shards) if ks["terms"] is not None]
    assert mapped
    vocab = len(leg.idf)
    for i in mapped:
        ks = leg.kernel_shards[i]
        n = len(ks["terms"])
        assert n < vocab and ks["n_terms"] == n and len(ks["offsets"]) == n + 1
        assert len(ks["term_ub"]) == n and len(ks["block_offsets"]) == n + 1 and len(ks["dense"]["dense_slot"]) == n
        assert len(leg._segs[i].stats.df) == n
    # the statistics: df of every term as the fresh build counts it (0 for a term whose
    # documents were all deleted: the living vocabulary is append-only)
    df_fresh = {t: int(ref.df[i]) for t, i in ref.vocab.items()}
    assert {t: int(leg.df[i]) for t, i in leg.vocab.items() if leg.df[i] or t in df_fresh} == df_fresh
    assert (leg.N, leg.avgdl) == (ref.N, ref.avgdl)
    queries = ["novel0 zzterm", "novel2 novel3", "zzterm", *[" ".join(d["text"].split()[:3]) for d in live[::7]]]
    # one shard at a time, through the protocol: the union of the shards' hits = the fresh build's
    for algo in BM25_ALGOS:
        prep = leg.prepare(queries, BM25SearchParams(algorithm=algo))
        for half in (False, True):  # the live documents (as the engine masks them), or half of them
            masks = []
            for sh in a.reader.shards:
                m = np.ones(sh.rows, np.uint8) if not half else (np.arange(sh.rows) % 2).astype(np.uint8)
                if sh.deleted is not None:
                    m[np.asarray(sh.deleted, np.int64)] = 0
                masks.append(m)
            ctx = SearchContext(depth=5, n_threads=1, allow=masks)
            got = merge_topk([leg.search_shard(prep, s, ctx) for s in range(leg.n_shards)], 5)
            whole = leg.search_shards(prep, list(range(leg.n_shards)), ctx)
            for g in (got, whole):
                if not half:
                    ids_a = [[str(x) for x in a.doc_ids(row[row >= 0])] for row in g[0]]
                    hits = [b.search(q, k=5, mode="bm25", leg_params={"bm25": {"algorithm": algo}}) for q in queries]
                    assert ids_a == [[h.id for h in hs] for hs in hits], algo
                    np.testing.assert_allclose(g[1][g[0] >= 0], [h.score for hs in hits for h in hs], rtol=0, atol=1e-6)
            np.testing.assert_array_equal(got[0], whole[0])
            np.testing.assert_array_equal(got[1].view(np.uint32), whole[1].view(np.uint32))
    # exact scores of given documents (full-score fusion): every live document of each such shard
    prep, rprep = leg.prepare(queries), ref.prepare(queries)
    assert len(b.reader.shards) == 1
    fresh_ord = {str(d): j for j, d in enumerate(b.reader.doc_ids())}
    all_ids = [str(d) for d in a.reader.doc_ids()]
    for i in mapped:
        sh = a.reader.shards[i]
        ids = all_ids[sh.base:sh.base + sh.rows]
        rows = np.array([j for j, d in enumerate(ids) if d in fresh_ord], np.int64)
        other = np.array([fresh_ord[ids[j]] for j in rows], np.int64)
        offs = np.arange(len(queries) + 1, dtype=np.int64) * len(rows)
        got = leg.score_docs(prep, i, offs, np.tile(rows, len(queries)))
        want = ref.score_docs(rprep, 0, offs, np.tile(other, len(queries)))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        assert got.max() > 0


def _forge(root: Path, rel: str, edit) -> None:
    """Rewrite the arrays file ``rel`` (a segment's ``bm25.arrow``, a tombstone file) with ``edit``
    applied to its arrays and re-hash it (a forger's step: checksums match, content does not)."""
    p = root / rel
    t = pa.ipc.open_file(pa.py_buffer(p.read_bytes())).read_all()
    arrays = {n: t.column(n)[0].values.to_numpy().copy() for n in t.column_names}
    edit(arrays)
    cols = {n: pa.LargeListArray.from_arrays(pa.array([0, len(v)], pa.int64()), pa.array(v)) for n, v in arrays.items()}
    write_table(p, pa.table(cols))
    m = _manifest(root)
    m["files"][rel]["bytes"] = p.stat().st_size
    m["files"][rel]["sha256"] = sha256_file(p)
    m["manifest_sha256"] = manifest_digest(m)
    current_manifest_path(root).write_text(json.dumps(m))


def _swap_terms(a):
    a["terms"][[0, 1]] = a["terms"][[1, 0]]


def _term_past_vocab(a):
    a["terms"][-1] = 10**6


def _short_offsets(a):
    a["offsets"] = a["offsets"][:-1]


def _drop_terms(a):
    del a["terms"]


@pytest.mark.parametrize("edit,msg", [(_swap_terms, "strictly ascending"), (_term_past_vocab, "below"),
                                      (_short_offsets, "offsets for"), (_drop_terms, "missing array 'terms'")])
def test_forged_compact_postings_are_refused(tmp_path, edit, msg):
    root, _ = _live_index(tmp_path)
    shard = next(e["dir"] for e in _manifest(root)["shards"] if "bm25_terms" in e)
    _forge(root, f"{shard}/bm25.arrow", edit)
    with pytest.raises(IndexFormatError, match=msg) as err:
        Retriever.open(root).search("novel0 zzterm", k=3, mode="bm25")
    assert f"{shard}/bm25.arrow" in str(err.value)


def test_deleted_df_of_a_term_the_segment_does_not_list_is_refused(tmp_path):
    """A tombstone's deleted df names index term ids; for a segment that lists only its own terms
    each must be one of them (else it would be charged to another term's df)."""
    root, _ = _live_index(tmp_path)
    e = next(e for e in _manifest(root)["shards"] if "bm25_terms" in e and e.get("deletes"))
    listed = pa.ipc.open_file(str(root / e["dir"] / "bm25.arrow")).read_all().column("terms")[0].values.to_numpy()
    absent = next(t for t in range(int(listed.max()) + 2) if t not in set(listed.tolist()))

    def edit(arrays):
        arrays["bm25_terms"][0] = absent
        order = np.argsort(arrays["bm25_terms"], kind="stable")
        arrays["bm25_terms"], arrays["bm25_df"] = arrays["bm25_terms"][order], arrays["bm25_df"][order]

    _forge(root, e["deletes"], edit)
    with pytest.raises(IndexFormatError, match="names a term the shard does not list") as err:
        Retriever.open(root).search("novel0", k=3, mode="bm25")
    assert e["deletes"] in str(err.value)


def _fewer_counts(a):
    a["bm25_df"] = a["bm25_df"][:-1]


def _more_counts(a):
    a["bm25_df"] = np.append(a["bm25_df"], a["bm25_df"][-1])


def _repeated_term(a):
    a["bm25_terms"][1] = a["bm25_terms"][0]


def _descending_terms(a):
    a["bm25_terms"], a["bm25_df"] = a["bm25_terms"][::-1].copy(), a["bm25_df"][::-1].copy()


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("edit,msg", [(_fewer_counts, "counts for"), (_more_counts, "counts for"),
                                      (_repeated_term, "strictly ascending"), (_descending_terms, "strictly ascending")])
def test_deleted_df_terms_and_counts_must_align(tmp_path, compact, edit, msg):
    """A tombstone's deleted df (``bm25_terms`` u32 strictly ascending, one ``bm25_df`` count
    each, as the updater writes them) that does not have that form is refused with an error
    naming the file: counts of another length than the terms (numpy's shape error before), or a
    term listed twice or out of order (one of its counts silently dropped: df and scores off)."""
    root, _ = _live_index(tmp_path)
    e = next(e for e in _manifest(root)["shards"] if ("bm25_terms" in e) == compact and e.get("deletes"))
    t = pa.ipc.open_file(str(root / e["deletes"])).read_all()
    assert len(t.column("bm25_terms")[0]) >= 2
    _forge(root, e["deletes"], edit)
    with pytest.raises(IndexFormatError, match=msg) as err:
        Retriever.open(root).search("novel0", k=3, mode="bm25")
    assert e["deletes"] in str(err.value)


def test_listed_term_count_must_match_the_manifest(tmp_path):
    root, _ = _live_index(tmp_path)
    m = _manifest(root)
    e = next(e for e in m["shards"] if "bm25_terms" in e)
    e["bm25_terms"] += 1
    m["manifest_sha256"] = manifest_digest(m)
    current_manifest_path(root).write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match="manifest says") as err:
        Retriever.open(root).search("novel0", k=3, mode="bm25")
    assert "bm25.arrow" in str(err.value)


def test_generations_carry_the_lowest_format_version_that_holds_them(tmp_path):
    """A build is version 2 (readable by builds that know only 2); the first generation with a
    segment listing its own terms is version 3, so such builds refuse it instead of misreading
    its bm25.arrow; this build reads both."""
    root, _ = _live_index(tmp_path)
    assert any("bm25_terms" in e for e in _manifest(root)["shards"])
    assert _manifest(root)["format_version"] == 3
    assert Retriever.open(root).info()["format_version"] == 3
    fresh = tmp_path / "fresh"
    build_index(random_corpus(20, seed=2), fresh, legs=("bm25",), show_progress=False)
    assert _manifest(fresh)["format_version"] == 2
    with IndexUpdater.open(fresh) as u:  # a delete-only commit lists no compact segment: stays 2
        u.delete([_manifest_first_id(fresh)])
        u.commit()
    assert _manifest(fresh)["format_version"] == 2


def _manifest_first_id(root: Path) -> str:
    return Retriever.open(root).doc_ids([0])[0]


@pytest.mark.parametrize("version,msg", [(2, "format_version 2 but its shards need 3"),
                                         (4, "unsupported format_version 4"), (1, "unsupported format_version 1")])
def test_a_manifest_claiming_another_version_is_refused(tmp_path, version, msg):
    root, _ = _live_index(tmp_path)
    m = _manifest(root)
    m["format_version"] = version
    m["manifest_sha256"] = manifest_digest(m)
    current_manifest_path(root).write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match=msg):
        Retriever.open(root)
    with pytest.raises(IndexFormatError, match=msg):
        IndexUpdater.open(root)


def test_a_build_reading_only_version_2_refuses_a_compact_generation(tmp_path, monkeypatch):
    """What a build of the previous format sees (it read version 2 only): a clear refusal."""
    import retriever.index.format as fmt

    root, _ = _live_index(tmp_path)
    monkeypatch.setattr(fmt, "READ_FORMAT_VERSIONS", (2,))
    with pytest.raises(IndexFormatError, match="unsupported format_version 3"):
        Retriever.open(root)

def _entry_more_terms(e):
    e["bm25_terms"] += 1


def _entry_fewer_terms(e):
    e["bm25_terms"] -= 1


def _entry_not_compact(e):  # the compact file read as dense offsets: positions taken for term ids
    del e["bm25_terms"]


def _entry_more_postings(e):
    e["nnz"] += 1


def _entry_past_vocab(e):
    e["n_terms"] += 1


@pytest.mark.parametrize("edit", [_entry_more_terms, _entry_fewer_terms, _entry_not_compact, _entry_more_postings,
                                  _entry_past_vocab])
def test_delete_commit_refuses_a_segment_that_disagrees_with_its_entry(tmp_path, edit):
    """The delete commit counts the deleted documents' df on the segment's postings: a segment
    whose ``bm25.arrow`` does not match its manifest entry (listed terms, postings, vocabulary) is
    refused with an error naming the file, as readers refuse it, and no generation is written
    (never a tombstone df counted on misread postings)."""
    from retriever.index.format import read_current

    root, _ = _live_index(tmp_path)
    m = _manifest(root)
    e = next(e for e in m["shards"] if "bm25_terms" in e)
    edit(e)
    m["manifest_sha256"] = manifest_digest(m)
    current_manifest_path(root).write_text(json.dumps(m))
    victim = pa.ipc.open_file(str(root / e["dir"] / "docs.arrow")).read_all().column("id")[0].as_py()
    gen = read_current(root)
    with IndexUpdater.open(root) as u:
        u.delete([victim])
        with pytest.raises(IndexFormatError) as err:
            u.commit()
    assert f"{e['dir']}/bm25.arrow" in str(err.value)
    assert read_current(root) == gen


def _same_as_fresh(r: Retriever, live: list[dict], fresh: Path) -> None:
    """Every BM25 algorithm's top-k of ``r`` equals a fresh build's of ``live`` (ids, scores within 1e-6)."""
    build_index(live, fresh, legs=("bm25",), show_progress=False, overwrite=True)
    b = Retriever.open(fresh)
    queries = ["novel0 zzterm", "later1 later4 zzterm", "vitamin bone", "gene cell cell cancer", "heart later2",
               *[" ".join(d["text"].split()[:3]) for d in live[::11] if d["text"]]]
    for algo in BM25_ALGOS:
        for k in (3, 50):
            got = r.search_arrays(queries, k=k, mode="bm25", leg_params={"bm25": {"algorithm": algo}})
            want = b.search_arrays(queries, k=k, mode="bm25", leg_params={"bm25": {"algorithm": algo}})
            for q in range(len(queries)):
                ia = list(r.doc_ids(got.ids[q, :got.n_found[q]]))
                ib = list(b.doc_ids(want.ids[q, :want.n_found[q]]))
                assert ia == ib, (algo, k, queries[q])
                np.testing.assert_allclose(got.scores[q, :got.n_found[q]], want.scores[q, :want.n_found[q]],
                                           rtol=0, atol=1e-6)


def _to_previous_form(root: Path) -> list[str]:
    """Rewrite the compact segments as the code before them wrote an added segment (dense
    ``offsets`` trimmed at its last term, no ``bm25_terms``); returns their directories."""
    dirs = []
    for e in _manifest(root)["shards"]:
        if "bm25_terms" in e:
            _forge(root, f"{e['dir']}/bm25.arrow", lambda a, n=e["n_terms"]: a.update(
                offsets=dense_offsets(a.pop("terms"), a["offsets"], n, len(a["doc_ids"]))))
            dirs.append(e["dir"])
    m = _manifest(root)
    for e in m["shards"]:
        e.pop("bm25_terms", None)
    m["manifest_sha256"] = manifest_digest(m)
    current_manifest_path(root).write_text(json.dumps(m))
    return dirs


def test_segments_of_the_previous_form_live_on_beside_compact_ones(tmp_path):
    """An index whose added segments have the previous form (trimmed dense offsets, no
    ``bm25_terms``): searches, then adds of compact segments, deletes in both forms, partial and
    full compactions, reopens and a refresh of a reader opened first all equal a fresh build."""
    from retriever.index.updates import CompactPolicy

    root, live = _live_index(tmp_path)
    old_dirs = _to_previous_form(root)
    assert old_dirs and not any("bm25_terms" in e for e in _manifest(root)["shards"])
    first = Retriever.open(root)
    _same_as_fresh(first, live, tmp_path / "fresh")
    adds = [{"_id": f"later{i}", "title": "", "text": f"later{i} zzterm heart later{(i + 1) % 6}"} for i in range(6)]
    victims = [pa.ipc.open_file(str(root / d / "docs.arrow")).read_all().column("id")[-1].as_py() for d in old_dirs]
    with IndexUpdater.open(root) as u:
        u.add(adds)
        u.delete(victims + [live[0]["_id"]])
        u.commit()
        assert any("bm25_terms" in e for e in _manifest(root)["shards"])
        live = [d for d in live if d["_id"] not in {*victims, live[0]["_id"]}] + adds
        _same_as_fresh(Retriever.open(root), live, tmp_path / "fresh")
        u.compact(CompactPolicy(small_rows=8, max_deleted_fraction=0.5))
        _same_as_fresh(Retriever.open(root), live, tmp_path / "fresh")
        u.delete(["later2", live[5]["_id"]])
        live = [d for d in live if d["_id"] not in ("later2", live[5]["_id"])]
        u.commit()
        _same_as_fresh(Retriever.open(root), live, tmp_path / "fresh")
        u.compact(full=True)
    assert first.refresh()
    _same_as_fresh(first, live, tmp_path / "fresh")


@pytest.mark.parametrize("point,moved", [("update_deletes", 0), ("generation_current:2", None), ("update_clean:2", 2)])
def test_sigkill_with_compact_segments_leaves_a_whole_generation(tmp_path, point, moved):
    """A writer killed while it deletes from a compact segment and adds compact ones (then
    compacts): the index shows the previous or the new generation whole, and the next writer
    removes what the killed one left and goes on."""
    import signal
    import subprocess
    import sys

    from test_updates import _disk_files, _listed

    from retriever.index.format import read_current

    root, live = _live_index(tmp_path)
    seg = next(e["dir"] for e in _manifest(root)["shards"] if "bm25_terms" in e)
    victim = pa.ipc.open_file(str(root / seg / "docs.arrow")).read_all().column("id")[0].as_py()
    adds = [{"_id": f"later{i}", "title": "", "text": f"later{i} zzterm heart"} for i in range(3)]
    after = [d for d in live if d["_id"] != victim] + adds
    gen0 = read_current(root)
    repo = Path(__file__).resolve().parents[1]
    spec = {"dir": str(root), "add": adds, "delete": [victim], "compact": True}
    proc = subprocess.run([sys.executable, str(repo / "tests" / "crash_update.py"), point, json.dumps(spec)],
                          cwd=repo, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    gen = read_current(root) - gen0
    assert gen in ((moved,) if moved is not None else (1, 2))
    _same_as_fresh(Retriever.open(root), live if gen == 0 else after, tmp_path / "fresh")
    with IndexUpdater.open(root):  # the next writer removes what the killed one left
        pass
    assert _disk_files(root) <= _listed(root)
    with IndexUpdater.open(root) as u:  # and goes on
        u.add([{"_id": "z0", "text": "zzterm later9"}])
        u.commit()
    _same_as_fresh(Retriever.open(root), (live if gen == 0 else after) + [{"_id": "z0", "text": "zzterm later9"}],
                   tmp_path / "fresh")
