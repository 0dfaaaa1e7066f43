"""The leg protocol (prepare / search_shard / score_docs), typed per-call parameters, the engine's
shard loop with statistics given from outside, and fixes found on the way (cache race, the thread
budget of FAISS and BLAS, the batch bug with terms of later shards, the precomputed-vectors error)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import random_corpus
from retriever import QueryError, Retriever, build_index
from retriever.engine import Engine, search_leg
from retriever.legs.base import SearchContext
from retriever.legs.bm25 import drop_terms
from retriever.params import (BM25SearchParams, DenseSearchParams, SparseSearchParams, parse_leg_params)


@pytest.fixture(scope="module")
def three_leg(tmp_path_factory):
    """A 3-shard index with every leg (dense and sparse vectors given), and matching queries."""
    rng = np.random.default_rng(7)
    docs = random_corpus(240, seed=4, min_len=1)
    dv = rng.standard_normal((240, 12)).astype(np.float32)
    terms = [np.unique(rng.integers(0, 200, rng.integers(1, 25))) for _ in range(240)]
    ptr = np.zeros(241, np.int64)
    ptr[1:] = np.cumsum([len(t) for t in terms])
    out = tmp_path_factory.mktemp("proto") / "ix"
    build_index(docs, out, legs=("bm25", "dense", "sparse"), dense_vectors=dv, shard_size=90, show_progress=False,
                sparse_vectors=(ptr, np.concatenate(terms).astype(np.uint32),
                                (rng.random(int(ptr[-1])) + 0.05).astype(np.float32)))
    qs = ["vitamin bone", "heart cell sleep", "gene", "the", "protein protein dose", "zzz-nothing"]
    qv = rng.standard_normal((len(qs), 12)).astype(np.float32)
    qsv = [(np.unique(rng.integers(0, 200, 6)).astype(np.uint32), None) for _ in qs]
    qsv = [(t, np.linspace(1.0, 0.2, len(t)).astype(np.float32)) for t, _ in qsv]
    return out, qs, qv, qsv


def _prep(leg, qs, qv, qsv, params=None):
    if leg.name == "bm25":
        return leg.prepare(qs, params, 1)
    return leg.prepare_vectors(qv if leg.name == "dense" else qsv, params, 1)


@pytest.mark.parametrize("name", ["bm25", "dense", "sparse"])
def test_score_docs_equals_search_shard_scores(three_leg, name):
    """score_docs of the documents a shard search returned gives the same float32 scores, bit for
    bit; documents the query does not match score 0 (bm25, sparse)."""
    out, qs, qv, qsv = three_leg
    r = Retriever.open(out, n_threads=1)
    leg = r.engine.legs[name]
    prep = _prep(leg, qs, qv, qsv)
    ctx = SearchContext(depth=50, n_threads=1)
    rng = np.random.default_rng(1)
    for shard in range(leg.n_shards):
        base = r.reader.shards[shard].base
        rows = r.reader.shards[shard].rows
        ids, scores, n_found = leg.search_shard(prep, shard, ctx)
        cand = [ids[q, :n_found[q]] - base for q in range(len(qs))]
        offs = np.zeros(len(qs) + 1, np.int64)
        offs[1:] = np.cumsum([len(c) for c in cand])
        got = leg.score_docs(prep, shard, offs, np.concatenate(cand))
        want = np.concatenate([scores[q, :n_found[q]] for q in range(len(qs))])
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        if name != "dense":  # documents outside the hits: 0 exactly when the query shares no term
            others = [np.setdiff1d(rng.choice(rows, 20, replace=False), c) for c in cand]
            o_offs = np.zeros(len(qs) + 1, np.int64)
            o_offs[1:] = np.cumsum([len(c) for c in others])
            o_scores = leg.score_docs(prep, shard, o_offs, np.concatenate(others))
            # every document outside a full top-50 of a shard of <= 90 rows that is not returned
            # has score 0 when fewer than 50 were found
            for q in range(len(qs)):
                if n_found[q] < 50:
                    assert (o_scores[o_offs[q]:o_offs[q + 1]] == 0).all()
    with pytest.raises(QueryError, match="outside the shard"):
        leg.score_docs(prep, 0, np.array([0, 1] + [1] * (len(qs) - 1)), np.array([10_000]))
    with pytest.raises(QueryError, match="candidate offsets"):
        leg.score_docs(prep, 0, np.array([0, 2]), np.array([1]))


def test_engine_on_a_subset_of_shards_with_outside_statistics(three_leg):
    """An engine holding only some shards, given the whole index's statistics, scores exactly as
    the whole index does: its top-k is the whole index's ranking restricted to its shards (what a
    distributed search gathers); with its own statistics the BM25 scores differ."""
    out, qs, qv, qsv = three_leg
    full = Retriever.open(out, n_threads=1)
    n_all = full.reader.n_docs
    for subset in ([1], [0, 2]):
        part = Engine(full.reader, shards=subset, stats=full.engine.stats)
        lo_hi = [(full.reader.shards[s].base, full.reader.shards[s].base + full.reader.shards[s].rows) for s in subset]
        for mode in ("bm25", "sparse", "dense"):
            legs = part.legs[mode]
            prep = _prep(legs, qs, qv, qsv)
            got = search_leg(legs, prep, SearchContext(depth=10, n_threads=1))
            ref = full.search_arrays(qs, k=n_all, mode=mode, query_vectors=qv, sparse_vectors=qsv)
            for q in range(len(qs)):
                ids = ref.ids[q, :ref.n_found[q]]
                keep = np.zeros(len(ids), bool)
                for lo, hi in lo_hi:
                    keep |= (ids >= lo) & (ids < hi)
                want_ids, want_scores = ids[keep][:10], ref.scores[q, :ref.n_found[q]][keep][:10]
                n = got[2][q]
                np.testing.assert_array_equal(got[0][q, :n], want_ids)
                np.testing.assert_array_equal(got[1][q, :n], want_scores)
    own = Engine(full.reader, shards=[1])
    assert own.stats.bm25.n_docs == full.reader.shards[1].rows
    assert not np.array_equal(own.legs["bm25"].idf, full.engine.legs["bm25"].idf)


def test_leg_params_are_typed():
    p = parse_leg_params({"bm25": {"algorithm": "maxscore", "k1": 1.2}, "sparse": SparseSearchParams(query_cut=3)})
    assert p["bm25"] == BM25SearchParams(algorithm="maxscore", k1=1.2) and p["sparse"].query_cut == 3
    with pytest.raises(QueryError, match=r"unknown dense leg_params \['nprob'\]; expected some of dim, shortlist"):
        parse_leg_params({"dense": {"nprob": 4}})
    with pytest.raises(QueryError, match="is a BM25SearchParams; expected DenseSearchParams"):
        parse_leg_params({"dense": BM25SearchParams()})
    with pytest.raises(QueryError, match="unknown leg 'colbert'"):
        parse_leg_params({"colbert": {}})
    with pytest.raises(QueryError, match="'nprobe' must be an integer >= 1, got 0"):
        DenseSearchParams(nprobe=0)
    with pytest.raises(QueryError, match="b must be"):
        BM25SearchParams(b=2.0)
    with pytest.raises(QueryError, match="heap_factor' must be a finite number"):
        SparseSearchParams(heap_factor=float("nan"))


def test_allow_no_longer_leaks_through_leg_params(bm25_index):
    """``allow`` used to reach the BM25 kernel through ``leg_params`` (undocumented); it is not a
    search parameter: the allow mask travels in the SearchContext."""
    r = Retriever.open(bm25_index)
    with pytest.raises(QueryError, match=r"unknown bm25 leg_params \['allow'\]"):
        r.search("vitamin", mode="bm25", leg_params={"bm25": {"allow": [None]}})


def test_terms_of_later_shards_with_an_empty_last_query(tmp_path):
    """A term only a later shard holds, plus a last query of only stop words, in one batch on a
    multi-shard index: the per-shard term filter used ``np.add.reduceat`` over the query offsets,
    which raised IndexError when the last queries were empty (found on a two-shard MED index)."""
    docs = [{"_id": f"a{i}", "text": "bone density vitamin"} for i in range(40)]
    docs += [{"_id": f"b{i}", "text": "oestriol bone" if i % 2 else "heart"} for i in range(40)]
    build_index(docs, tmp_path / "ix", legs=("bm25",), shard_size=40, show_progress=False)
    r = Retriever.open(tmp_path / "ix")
    assert len(r.reader.shards) == 2
    for qs in (["oestriol", "the"], ["oestriol", "the", "and"], ["the", "oestriol", ""], ["oestriol vitamin", "the"]):
        res = r.search_arrays(qs, k=5, mode="bm25")
        one = [r.search_arrays([q], k=5, mode="bm25") for q in qs]
        for i, o in enumerate(one):
            np.testing.assert_array_equal(res.ids[i], o.ids[0])
            np.testing.assert_array_equal(res.scores[i], o.scores[0])
        assert res.n_found[qs.index("the")] == 0
        assert set(r.doc_ids(res.ids[0, :res.n_found[0]])) <= {f"b{i}" for i in range(1, 40, 2)} | {
            f"a{i}" for i in range(40)}
    offs, terms, weights = drop_terms(np.array([0, 2, 2, 3, 3], np.uint64), np.array([5, 1, 9], np.uint32),
                                      np.array([1, 2, 3], np.float32), np.array([True, False, True]))
    assert offs.tolist() == [0, 1, 1, 2, 2] and terms.tolist() == [5, 9] and weights.tolist() == [1, 3]


def test_bm25_caches_under_concurrent_searches(bm25_index):
    """The BM25 leg's LRU caches (single-term thresholds per depth, scoring states per (k1, b))
    are shared by concurrent searches: eight threads cycling through more depths than the cache
    keeps used to raise KeyError from ``move_to_end`` on a key another thread had just evicted."""
    r = Retriever.open(bm25_index, n_threads=1)
    leg = r.engine.legs["bm25"]
    ks = leg.kernel_shards[0]
    terms = leg.query_terms(["vitamin bone heart"])[1]
    errors: list[str] = []
    old = sys.getswitchinterval()

    def thresholds(t: int) -> None:
        try:
            for i in range(40_000):
                leg._term_kth(ks, terms, 1 + (i + t) % (leg.KTH_CACHE * 2), 1)
        except Exception as e:  # noqa: BLE001 - the test collects whatever a thread raises
            errors.append(repr(e))

    def scorings(t: int) -> None:
        try:
            for i in range(300):
                leg._scoring(0.5 + ((i + t) % (leg.SCORING_CACHE * 2)) * 0.1, 0.4)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=thresholds, args=(t,)) for t in range(8)]
        threads += [threading.Thread(target=scorings, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    assert len(ks["kth"]) <= leg.KTH_CACHE and len(leg._scoring_cache) <= leg.SCORING_CACHE


def test_thread_budget_holds_for_faiss_and_blas(three_leg, monkeypatch):
    """``n_threads=1`` holds FAISS's OpenMP team and every BLAS library to one thread inside the
    dense leg's search, in a single-leg search and in a hybrid one (it used to run FAISS on every
    core); afterwards the caller's settings are back."""
    faiss = pytest.importorskip("faiss")
    from threadpoolctl import threadpool_info

    import retriever.legs.dense as dense_mod

    out, qs, qv, qsv = three_leg
    r = Retriever.open(out)
    seen: list[tuple[int, list[int]]] = []
    orig = dense_mod._kernels.rescore_topk

    def spy(*a, **kw):
        seen.append((faiss.omp_get_max_threads(), [i["num_threads"] for i in threadpool_info()
                                                   if i["user_api"] == "blas"]))
        return orig(*a, **kw)

    monkeypatch.setattr(dense_mod._kernels, "rescore_topk", spy)
    before = faiss.omp_get_max_threads()
    for mode in ("dense", "hybrid"):
        for kw in ({}, {"leg_params": {"dense": {"dim": 6}}}):
            seen.clear()
            r.search_arrays(qs, 5, mode=mode, n_threads=1, query_vectors=qv, sparse_vectors=qsv, **kw)
            assert seen and all(omp == 1 and all(b == 1 for b in blas) for omp, blas in seen), seen
    assert faiss.omp_get_max_threads() == before


def test_precomputed_dense_index_without_query_vectors(three_leg, capsys):
    """An index built from precomputed dense vectors has no query encoder: searching its dense leg
    without query vectors says so (it used to say 'dense model None has dim ...')."""
    out, qs, qv, qsv = three_leg
    r = Retriever.open(out)
    for mode in ("dense", "hybrid"):
        with pytest.raises(QueryError, match="no dense query encoder.*query_vectors="):
            r.search("vitamin", mode=mode, sparse_vectors=qsv[:1])
    from conftest import cli_error
    err = cli_error(capsys, ["search", str(out), "vitamin", "--mode", "dense"])
    assert "no dense query encoder" in err


def test_encoder_dimension_mismatch_is_the_same_error_every_time(three_leg):
    """A query encoder whose dimension differs from the index's is refused on every search (the
    encoder used to be kept after the first refusal, so later searches failed inside FAISS)."""
    from retriever.index.encoders.dense import resolve_model_path
    from retriever import IndexFormatError

    out, qs, qv, qsv = three_leg
    r = Retriever.open(out)
    r.engine.legs["dense"].model_path = str(resolve_model_path(None))  # the bundled 384-d model; index: 12-d
    for _ in range(2):
        with pytest.raises(IndexFormatError, match="has dim 384, index has 12"):
            r.search("vitamin", mode="dense")


def test_faiss_ids_outside_the_shard_are_a_format_error(three_leg):
    """A FAISS structure that returns ids past the shard's rows (a crafted file) is an
    IndexFormatError naming the file, never bogus ids or an IndexError later."""
    faiss = pytest.importorskip("faiss")
    from retriever import IndexFormatError

    out, qs, qv, qsv = three_leg
    r = Retriever.open(out)
    leg = r.engine.legs["dense"]
    rows = r.reader.shards[0].rows
    big = faiss.IndexFlatIP(leg.dim)
    big.add(np.random.default_rng(0).standard_normal((rows + 50, leg.dim)).astype(np.float32))
    leg.cpu_indexes[0] = leg.indexes[0] = big
    with pytest.raises(IndexFormatError, match=r"dense.faiss: returned id \d+, outside the shard's"):
        r.search_arrays(qs, 60, mode="dense", query_vectors=qv, leg_params={"dense": {"rescore": False}})


def test_dense_exhaustive_is_the_raw_inner_product(tmp_path):
    """``DenseSearchParams(exhaustive=True)``: the exact top-k by raw inner product over the stored
    vectors (not unit length here), whatever the index's own structure (IVF at nprobe 1 misses)."""
    rng = np.random.default_rng(3)
    n, d = 600, 16
    docs = [{"_id": f"d{i}", "text": "x"} for i in range(n)]
    dv = (rng.standard_normal((n, d)) * rng.uniform(0.5, 2.0, (n, 1))).astype(np.float32)
    from retriever import BuildConfig, DenseConfig
    cfg = BuildConfig(legs=("dense",), dense=DenseConfig(faiss_factory="IVF16,Flat", dtype="float32"))
    build_index(docs, tmp_path / "ix", cfg, dense_vectors=dv, show_progress=False, shard_size=250)
    r = Retriever.open(tmp_path / "ix", n_threads=1)
    qv = rng.standard_normal((20, d)).astype(np.float32)
    got = r.search_arrays(["q"] * 20, 10, mode="dense", query_vectors=qv, leg_params={"dense": {"exhaustive": True}})
    ip = qv.astype(np.float64) @ dv.astype(np.float64).T
    want = np.argsort(-ip, axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(got.ids, want)
    approx = r.search_arrays(["q"] * 20, 10, mode="dense", query_vectors=qv, leg_params={"dense": {"nprobe": 1}})
    assert not np.array_equal(approx.ids, want)
    with pytest.raises(QueryError, match="'exhaustive' scans the full vectors exactly"):
        DenseSearchParams(exhaustive=True, dim=8)


def test_tombstoned_documents_never_come_back(tmp_path):
    """A generation with tombstones (a deletes file on a shard): the engine passes the shard's
    live-documents mask to every leg as its allow mask; BM25 never returns a deleted document, even
    one that would rank first, and still returns k live ones; nor does the dense leg."""
    from retriever.index.format import read_manifest, write_arrays
    from retriever.index.generations import commit_generation, file_entry

    docs = [{"_id": f"d{i}", "text": ("vitamin " * (5 if i in (3, 7) else 1)) + f"bone w{i}"} for i in range(40)]
    dv = np.random.default_rng(2).standard_normal((40, 8)).astype(np.float32)
    path = tmp_path / "ix"
    build_index(docs, path, legs=("bm25", "dense"), dense_vectors=dv, shard_size=20, show_progress=False)
    before = Retriever.open(path).search_arrays(["vitamin"], k=5, mode="bm25")
    assert set(before.ids[0, :2].tolist()) == {3, 7}  # the deleted ones would rank first
    m1 = read_manifest(path)
    rel = "shards/00000/deletes.000002.arrow"
    write_arrays(path / rel, {"rows": np.array([3, 7], np.uint32)})
    shards = [dict(s) for s in m1["shards"]]
    shards[0]["deletes"] = rel
    commit_generation(path, parent=1, changes={"shards": shards, "files": {**m1["files"], rel: file_entry(path, rel)}})
    r = Retriever.open(path)
    for algo in ("exhaustive", "maxscore", "bmw", "bmm", "auto"):
        got = r.search_arrays(["vitamin", "bone w3", "w7"], k=5, mode="bm25", leg_params={"bm25": {"algorithm": algo}})
        returned = set(got.ids[got.ids >= 0].tolist())
        assert not returned & {3, 7}
        assert got.n_found[0] == 5
    hits = r.search("vitamin", k=40, mode="bm25")
    assert {h.id for h in hits} == {f"d{i}" for i in range(40)} - {"d3", "d7"}
    # the dense leg applies the mask too: querying with a deleted document's own vector, it is not
    # returned, and k live documents are (the exact top-k of the live ones)
    for q in (3, 7):
        got = r.search_arrays(["x"], k=5, mode="dense", query_vectors=dv[q:q + 1])
        live = np.setdiff1d(np.arange(40), [3, 7])
        expect = live[np.argsort(-(dv[live] @ dv[q]), kind="stable")[:5]]
        assert got.ids[0].tolist() == expect.tolist()


def test_blas_loaded_after_the_first_limit_is_limited_too():
    """A BLAS library loaded after the first thread limit (scipy's, imported later) is held to the
    call's budget as well, and every library is back to its own setting afterwards (the limiter
    used to keep the libraries it found at its first use)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("BLAS is only limited below the core count")
    code = """
import numpy, sys
from threadpoolctl import threadpool_info
from retriever.threads import thread_limits
assert "scipy.linalg" not in sys.modules
with thread_limits(1):
    pass
before = sorted((i["filepath"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas")
import scipy.linalg
own = sorted((i["filepath"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas")
assert len(own) > len(before), (before, own)
with thread_limits(1):
    held = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
after = sorted((i["filepath"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas")
import json
print(json.dumps(held), after == own)
"""
    pytest.importorskip("scipy.linalg")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]
    held, restored = r.stdout.rsplit(" ", 1)
    assert all(n == 1 for n in json.loads(held)), held
    assert restored.strip() == "True"


def test_blas_loaded_while_another_call_holds_a_limit_is_limited():
    """A BLAS library loaded while another call holds a limit is limited by the next call too (a
    held limit used to cover only the libraries known when it was first applied)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("BLAS is only limited below the core count")
    code = """
import numpy, sys, json
from threadpoolctl import threadpool_info
from retriever.threads import thread_limits
assert "scipy.linalg" not in sys.modules
with thread_limits(1):          # another call's limit, held throughout
    import scipy.linalg
    with thread_limits(1):
        held = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
print(json.dumps(held))
"""
    pytest.importorskip("scipy.linalg")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]
    held = json.loads(r.stdout)
    assert len(held) >= 2 and all(n == 1 for n in held), held


def test_blas_limit_holds_after_a_limit_from_another_live_thread():
    """threadpoolctl lets only the first thread that set a pthreads OpenBLAS's thread count change
    it until that thread releases it: a limit taken on an engine pool thread that stays alive made
    every later limit on the main thread a silent no-op (in a full test run, a BLAS ran with 2
    threads inside an ``n_threads=1`` search), and a limit applied on one thread was not restored
    from another. Both hold now, and the libraries end with their own settings."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("BLAS is only limited below the core count")
    code = """
import json, threading
import numpy
from concurrent.futures import ThreadPoolExecutor
from threadpoolctl import threadpool_info
from retriever.threads import thread_limits

def pthreads_blas():
    return [i["num_threads"] for i in threadpool_info()
            if i["user_api"] == "blas" and i.get("threading_layer") == "pthreads"]

own = pthreads_blas()
pool = ThreadPoolExecutor(1)                     # a worker that stays alive, like the leg pool

def on_worker():
    with thread_limits(1):
        return pthreads_blas()

on_pool = pool.submit(on_worker).result()
with thread_limits(1):
    on_main = pthreads_blas()
after_main = pthreads_blas()
# applied on the main thread, restored by the worker when it is the last holder
from retriever.threads import _BLAS
_BLAS.enter(1)
pool.submit(lambda: None).result()
held_cross = pthreads_blas()
pool.submit(_BLAS.exit, 1).result()
after_cross = pthreads_blas()
print(json.dumps([own, on_pool, on_main, after_main, held_cross, after_cross]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]
    own, on_pool, on_main, after_main, held_cross, after_cross = json.loads(r.stdout)
    if not own:
        pytest.skip("no pthreads OpenBLAS loaded")
    assert all(n == 1 for n in on_pool + on_main + held_cross), (on_pool, on_main, held_cross)
    assert after_main == own and after_cross == own, (own, after_main, after_cross)
