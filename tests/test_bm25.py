"""BM25 leg: scores against an independent computation of Lucene's formula, exact top-k against
brute force, shard-layout independence, and save → open in a fresh process."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from conftest import ROOT, random_corpus
from retriever.index.analyzer import Analyzer
from retriever import BM25Params, BuildConfig, Retriever, build_index
from retriever.legs.base import SearchContext
from retriever.legs.bm25 import BM25Prepared
from retriever.params import BM25SearchParams


def lucene_len(dl: int) -> int:
    """Lucene's SmallFloat.intToByte4 / byte4ToInt round trip, written from its definition."""
    def long_to_int4(i: int) -> int:
        nbits = i.bit_length()
        if nbits < 4:
            return i
        shift = nbits - 4
        return ((i >> shift) & 0x07) | ((shift + 1) << 3)

    def int4_to_long(i: int) -> int:
        bits, shift = i & 0x07, (i >> 3) - 1
        return bits if shift == -1 else (bits | 0x08) << shift

    free = 255 - long_to_int4(2**31 - 1)
    return dl if dl < free else free + int4_to_long(long_to_int4(dl - free))


def brute_force(docs: list[dict], query: str, k1=0.9, b=0.4, lucene_norms=True) -> dict[str, float]:
    """Score every document with the formula in plain Python (float64)."""
    an = Analyzer()
    toks = [an.analyze(f"{d['title']} {d['text']}" if d.get("title") else d["text"]) for d in docs]
    N = len(docs)
    avgdl = sum(len(t) for t in toks) / N
    df = Counter(t for ts in toks for t in set(ts))
    q = Counter(an.analyze(query))
    out = {}
    for d, ts in zip(docs, toks):
        tf = Counter(ts)
        dl = lucene_len(len(ts)) if lucene_norms else len(ts)
        s, hit = 0.0, False
        for t, c in q.items():
            if tf[t]:
                hit = True
                idf = math.log(1 + (N - df[t] + 0.5) / (df[t] + 0.5))
                s += c * idf * tf[t] / (tf[t] + k1 * (1 - b + b * dl / avgdl))
        if hit:
            out[d["_id"]] = s
    return out


QUERIES = ["vitamin bone fracture risk", "gene gene therapy", "heart", "insulin liver kidney virus immune sugar",
           "nothingmatches", "the of and", "Patient's BLOOD pressure!"]


@pytest.mark.parametrize("lucene_norms", [True, False])
def test_scores_equal_formula_and_topk_equals_brute_force(tmp_path, lucene_norms):
    docs = random_corpus(400, seed=3, max_len=80)
    cfg = BuildConfig(legs=("bm25",), bm25=BM25Params(lucene_norms=lucene_norms))
    build_index(docs, tmp_path / "i", cfg, show_progress=False)
    r = Retriever.open(tmp_path / "i")
    for q in QUERIES:
        ref = brute_force(docs, q, lucene_norms=lucene_norms)
        hits = r.search(q, k=len(docs), mode="bm25")
        assert {h.id for h in hits} == set(ref), q
        for h in hits:
            assert h.score == pytest.approx(ref[h.id], rel=1e-5)
        # top-10 equals brute force up to exact ties at the boundary
        k = 10
        top = r.search(q, k=k, mode="bm25")
        want = sorted(ref.items(), key=lambda x: -x[1])[:k]
        if want:
            kth = want[-1][1]
            strictly_above = {d for d, s in ref.items() if s > kth * (1 + 1e-6)}
            assert strictly_above <= {h.id for h in top}
            assert [h.score for h in top] == pytest.approx([s for _, s in want], rel=1e-5)


def test_algorithms_identical(bm25_index):
    r = Retriever.open(bm25_index)
    for algo in ("maxscore", "bmw", "bmm", "auto"):
        a = r.search_arrays(QUERIES, k=7, mode="bm25", leg_params={"bm25": {"algorithm": "exhaustive"}})
        b = r.search_arrays(QUERIES, k=7, mode="bm25", leg_params={"bm25": {"algorithm": algo}})
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.scores, b.scores)


def test_per_call_k1_b_equal_an_index_built_with_them(tmp_path, small_corpus, bm25_index):
    """k1/b given per call (impacts and bounds built on demand) score like an index built with
    those parameters; the index's own parameters are unaffected afterwards."""
    cfg = BuildConfig(legs=("bm25",), bm25=BM25Params(k1=1.2, b=0.75))
    build_index(small_corpus, tmp_path / "kb", cfg, show_progress=False)
    want = Retriever.open(tmp_path / "kb").search_arrays(QUERIES, k=10, mode="bm25")
    r = Retriever.open(bm25_index)
    default = r.search_arrays(QUERIES, k=10, mode="bm25")
    for algo in ("exhaustive", "maxscore", "bmw"):
        got = r.search_arrays(QUERIES, k=10, mode="bm25", leg_params={"bm25": {"k1": 1.2, "b": 0.75, "algorithm": algo}})
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.scores, want.scores)
    assert not np.array_equal(default.scores, want.scores)
    again = r.search_arrays(QUERIES, k=10, mode="bm25")
    np.testing.assert_array_equal(again.scores, default.scores)
    from retriever.index.errors import QueryError
    with pytest.raises(QueryError, match="b must be"):
        r.search_arrays(QUERIES, k=10, mode="bm25", leg_params={"bm25": {"b": 1.5}})


def test_ties_broken_by_corpus_order(tmp_path):
    docs = [{"_id": f"x{i}", "text": "alpha beta"} for i in range(5)] + [{"_id": "y", "text": "alpha"}]
    build_index(docs, tmp_path / "i", legs=("bm25",), show_progress=False)
    hits = Retriever.open(tmp_path / "i").search("alpha beta", k=3, mode="bm25")
    assert [h.id for h in hits] == ["x0", "x1", "x2"]
    assert hits[0].score == hits[1].score == hits[2].score
    assert [h.legs["bm25"].rank for h in hits] == [1, 1, 1]


@pytest.mark.parametrize("shard_size", [1, 7, 64])
def test_shard_layout_does_not_change_results(tmp_path, small_corpus, bm25_index, shard_size):
    build_index(small_corpus, tmp_path / "s", legs=("bm25",), shard_size=shard_size, show_progress=False)
    a = Retriever.open(bm25_index).search_arrays(QUERIES, k=20, mode="bm25")
    b = Retriever.open(tmp_path / "s").search_arrays(QUERIES, k=20, mode="bm25")
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.n_found, b.n_found)


def test_thread_counts_and_batching_identical(bm25_index):
    r = Retriever.open(bm25_index)
    one = r.search_arrays(QUERIES * 5, k=10, mode="bm25", n_threads=1)
    four = r.search_arrays(QUERIES * 5, k=10, mode="bm25", n_threads=4)
    np.testing.assert_array_equal(one.ids, four.ids)
    np.testing.assert_array_equal(one.scores, four.scores)
    for i, q in enumerate(QUERIES):
        single = r.search_arrays([q], k=10, mode="bm25")
        np.testing.assert_array_equal(single.ids[0], one.ids[i])


def test_topk_is_prefix(bm25_index):
    r = Retriever.open(bm25_index)
    big = r.search_arrays(QUERIES, k=50, mode="bm25")
    small = r.search_arrays(QUERIES, k=5, mode="bm25")
    np.testing.assert_array_equal(big.ids[:, :5], small.ids)


def test_save_open_in_fresh_process_identical(bm25_index):
    r = Retriever.open(bm25_index)
    here = [[(h.id, h.score) for h in hits] for hits in r.search_batch(QUERIES, k=15, mode="bm25")]
    code = ("import json,sys; from retriever import Retriever; r=Retriever.open(sys.argv[1]);"
            "q=json.loads(sys.argv[2]);"
            "print(json.dumps([[(h.id,h.score) for h in hs] for hs in r.search_batch(q,k=15,mode='bm25')]))")
    out = subprocess.run([sys.executable, "-c", code, str(bm25_index), json.dumps(QUERIES)], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    there = json.loads(out.stdout)
    assert [[tuple(x) for x in hs] for hs in there] == here


def test_query_terms_vectorised_equals_loop(bm25_index):
    """Batches counted with numpy give the same ragged arrays as the per-query loop."""
    leg = Retriever.open(bm25_index).engine.legs["bm25"]
    qs = (QUERIES + ["", "gene gene GENE genes therapy gene", "zzzunknown heart"]) * 3
    assert len(qs) >= leg.VECTORISE_MIN
    got = leg.query_terms(qs)
    want = leg._query_terms_loop([leg.analyzer.tokenize(q) for q in qs])
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert len(got[1]) > 0


def test_query_terms_compiled_equals_loop_across_calls(bm25_index):
    """The compiled path (scanner + token table kept across calls + compiled dedupe) gives the
    per-query loop's arrays for texts with case folding, possessives, joiners, astral characters
    (Python fallback inside the batch), repeats and unknown words, on a first call (table empty)
    and on later calls that mix known and new tokens."""
    import random

    leg = Retriever.open(bm25_index).engine.legs["bm25"]
    words = (" ".join(QUERIES)).split() + ["GENE", "Gene's", "heart’s", "U.S.", "3,5", "x😀y", "𠀀gene",
                                           "the", "and", "zzzunknown", "straße", "ΣΊΣΥΦΟΣ", "", "  "]
    rng = random.Random(7)
    for call in range(4):
        qs = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(40)]
        assert leg._query_terms_compiled(qs) is not None
        got = leg.query_terms(qs)
        want = leg._query_terms_loop([leg.analyzer.tokenize(q) for q in qs])
        for a, b in zip(got, want):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    assert leg._table.n > 0 and (leg._slot == -1).all()


def _leg_search(leg, prep, depth, n_threads, allow=None):
    """Every shard of the leg through the protocol (``search_shard``), one result per shard."""
    ctx = SearchContext(depth=depth, n_threads=n_threads, allow=allow)
    return [leg.search_shard(prep, s, ctx) for s in range(leg.n_shards)]


def _fused_vs_two_step(leg, qs, depth, n_threads, allow=None):
    """The fused pass (one compiled pass) must equal query_terms + the kernel bit for bit."""
    prep = leg.prepare(qs, BM25SearchParams(), n_threads)
    assert prep.utf8 is not None and prep.batch is None  # the fused pass is planned
    got = _leg_search(leg, prep, depth, n_threads, allow)
    two = BM25Prepared(qs, "auto", leg.kernel_shards, leg.query_terms(qs, n_threads), None)
    want = _leg_search(leg, two, depth, n_threads, allow)
    assert len(got) == len(want) == 1
    for a, b in zip(got[0], want[0]):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    return got[0]


def _prepared(leg, qs, batch, algorithm, **k1b):
    """A prepared batch of an already analysed ``batch`` (no fused pass)."""
    p = BM25SearchParams(algorithm=algorithm, **k1b)
    scoring = leg.kernel_shards if not k1b else leg._scoring(*p.resolve(leg.params))
    return BM25Prepared(qs, algorithm, scoring, batch, None)


def _fused(leg, qs, n_threads, **params):
    return leg.prepare(qs, BM25SearchParams(**params), n_threads).utf8 is not None


@pytest.mark.parametrize("n_threads", [1, 3])
def test_search_texts_equals_query_terms_then_search(bm25_index, n_threads):
    """The fused analysis + scoring pass (``_kernels.bm25_topk_text``) against the two calls: on the
    first call (empty token table: the fused path declines), on calls mixing known tokens and new
    ones (those queries go through the two calls inside it), blank and stop-word-only queries,
    astral characters, an allow filter, depth beyond the matches; and the engine's result through
    it equals the exhaustive algorithm's, which does not take it."""
    import random

    r = Retriever.open(bm25_index)
    leg = r.engine.legs["bm25"]
    words = (" ".join(QUERIES)).split() + ["GENE", "Gene's", "U.S.", "x😀y", "the", "and", "zzzunknown",
                                           "straße", "", "  "]
    rng = random.Random(11)
    first = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 10))) for _ in range(20)]
    if leg._table is None or leg._table.n == 0:
        assert not _fused(leg, first, n_threads)  # nothing to read yet
    leg.query_terms(first, n_threads)
    allow = np.zeros(leg.N, dtype=np.uint8)
    allow[::3] = 1
    for call in range(4):
        qs = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(40)]
        qs += [f"novel{call}x{i} gene" for i in range(3)]  # tokens the table has not seen
        ids, scores, n_found = _fused_vs_two_step(leg, qs, 10, n_threads)
        assert (n_found > 0).any() and (n_found[-3:] > 0).all()
        _fused_vs_two_step(leg, qs, 1000, n_threads)
        _fused_vs_two_step(leg, qs, 5, n_threads, allow=[allow])
    qs = [" ".join(rng.choice(words) for _ in range(6)) for _ in range(30)]
    got = r.search_arrays(qs, k=10, mode="bm25", n_threads=n_threads)
    exh = r.search_arrays(qs, k=10, mode="bm25", n_threads=n_threads, leg_params={"bm25": {"algorithm": "exhaustive"}})
    np.testing.assert_array_equal(got.ids, exh.ids)
    np.testing.assert_array_equal(got.scores, exh.scores)
    # where the fused path does not apply it says so
    assert _fused(leg, qs, n_threads)
    assert not _fused(leg, qs[:3], n_threads)  # a small batch
    assert not _fused(leg, qs, n_threads, algorithm="maxscore")
    assert not _fused(leg, qs, n_threads, k1=1.2)
    assert not _fused(leg, qs[:-1] + ["lone \udc80 surrogate"], n_threads)


def test_search_texts_multi_shard_declines(tmp_path, small_corpus):
    """An index of several shards keeps the two-call path (analysis once for all shards)."""
    build_index(small_corpus, tmp_path / "s", legs=("bm25",), shard_size=64, show_progress=False)
    leg = Retriever.open(tmp_path / "s").engine.legs["bm25"]
    leg.query_terms(QUERIES * 5)
    assert leg.n_shards > 1 and not _fused(leg, QUERIES * 5, 1)


def test_search_texts_concurrent_with_new_tokens(bm25_index):
    """Threads searching side by side while others add tokens to the shared token table (readers
    share it, a writer waits for them): every result equals the one computed alone."""
    import threading

    r = Retriever.open(bm25_index)
    words = (" ".join(QUERIES)).split()
    batches = [[f"{words[(i + j) % len(words)]} {words[(3 * i + j) % len(words)]} fresh{i}w{j}" for j in range(24)]
               for i in range(12)]
    alone = [Retriever.open(bm25_index).search_arrays(b, k=10, mode="bm25", n_threads=1) for b in batches]
    got: list = [None] * len(batches)
    errors: list = []

    def work(i: int) -> None:
        try:
            for _ in range(3):
                got[i] = r.search_arrays(batches[i], k=10, mode="bm25", n_threads=2)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for a, b in zip(got, alone):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.scores, b.scores)


def test_token_table_lock_lets_a_waiting_writer_go_first():
    """A reader arriving while a writer waits for the current readers queues behind the writer
    (steady searches cannot keep a batch with new tokens out)."""
    import threading
    import time

    from retriever.legs.bm25 import _ReadWriteLock

    lock = _ReadWriteLock()
    order: list[str] = []
    release = threading.Event()
    holding = threading.Event()

    def first_reader() -> None:
        with lock.read():
            holding.set()
            release.wait(10)

    def writer() -> None:
        with lock.write():
            order.append("writer")

    def late_reader() -> None:
        with lock.read():
            order.append("reader")

    a = threading.Thread(target=first_reader)
    a.start()
    assert holding.wait(10)
    w = threading.Thread(target=writer)
    w.start()
    for _ in range(1000):  # until the writer is waiting
        if lock._writers_waiting:
            break
        time.sleep(0.005)
    assert lock._writers_waiting == 1
    r = threading.Thread(target=late_reader)
    r.start()
    time.sleep(0.05)
    assert order == []  # neither may run while the first reader holds the lock
    release.set()
    for t in (a, w, r):
        t.join(10)
    assert order == ["writer", "reader"]
    assert lock._readers == 0 and not lock._writing and lock._writers_waiting == 0


def test_token_table_dropped_when_adding_tokens_fails(bm25_index):
    """An error while new tokens are being added (here from the analyzer) leaves no token without
    a term id behind: the table is dropped, and later searches equal a fresh Retriever's."""
    r = Retriever.open(bm25_index)
    leg = r.engine.legs["bm25"]
    words = (" ".join(QUERIES)).split()
    known = [" ".join(words[i:i + 3]) for i in range(20)]
    r.search_arrays(known, k=5, mode="bm25")
    fresh = [f"{w} brandnew{i}" for i, w in enumerate(words[:20])]
    orig = leg.analyzer.terms

    def broken(tokens):
        raise RuntimeError("analyzer failed")

    leg.analyzer.terms = broken
    try:
        with pytest.raises(RuntimeError, match="analyzer failed"):
            r.search_arrays(fresh, k=5, mode="bm25")
    finally:
        leg.analyzer.terms = orig
    assert leg._table is None
    got = r.search_arrays(fresh + known, k=5, mode="bm25")
    want = Retriever.open(bm25_index).search_arrays(fresh + known, k=5, mode="bm25")
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.scores, want.scores)
    assert (got.n_found[:len(fresh)] > 0).sum() >= 10  # most fresh queries hold a known word


def test_query_term_weights_against_counter():
    """index.analyzer_kernels.query_term_weights against collections.Counter, and its input checks."""
    from retriever.index.analyzer_kernels import query_term_weights

    rng = np.random.default_rng(3)
    idf = rng.random(50).astype(np.float32) * 5
    counts = rng.integers(0, 20, 30)
    ids = rng.integers(-1, 50, int(counts.sum()))
    slot = np.full(50, -1, np.int64)
    off, terms, weights = query_term_weights(ids, counts, idf, slot)
    at = 0
    for j, c in enumerate(counts.tolist()):
        cnt = Counter(t for t in ids[at:at + c].tolist() if t >= 0)  # first-occurrence order
        at += c
        assert terms[off[j]:off[j + 1]].tolist() == list(cnt)
        assert weights[off[j]:off[j + 1]].tolist() == [float(np.float32(n * float(idf[t]))) for t, n in cnt.items()]
    assert (slot == -1).all() and off.dtype == np.uint64 and terms.dtype == np.uint32
    with pytest.raises(ValueError, match="sum to"):
        query_term_weights(ids, counts + 1, idf, slot)
    with pytest.raises(ValueError, match="out of range"):
        query_term_weights(np.array([50]), np.array([1]), idf, slot)
    with pytest.raises(ValueError, match="slot has"):
        query_term_weights(ids, counts, idf, slot[:10])



def _tie_corpus(n: int = 3000) -> list[dict]:
    """Few distinct documents repeated (exact score ties everywhere), plus a frequent word."""
    rng = np.random.default_rng(11)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]
    docs = []
    for i in range(n):
        w = [words[j] for j in rng.integers(0, len(words), size=int(rng.integers(1, 4)))]
        docs.append({"_id": f"d{i}", "text": " ".join(w + ["common"] * int(rng.integers(0, 2)))})
    return docs


@pytest.mark.parametrize("shard_size", [700, 100000])
def test_safe_initial_threshold_identical_to_exhaustive(tmp_path, shard_size):
    """The leg passes per-term k-th single-term scores (cached per depth and per k1/b) to the
    pruning kernels; with heavy ties, depths beyond the hits, allow filters and per-call k1/b
    every algorithm must still return exactly the exhaustive ids and scores."""
    docs = _tie_corpus()
    build_index(docs, tmp_path / "t", legs=("bm25",), shard_size=shard_size, show_progress=False)
    r = Retriever.open(tmp_path / "t")
    leg = r.engine.legs["bm25"]
    queries = ["alpha", "alpha beta", "common gamma", "zeta eps delta common", "alpha alpha beta",
               "nothingmatches", "common"]
    batch = leg.query_terms(queries)
    # "exhaustive" adds the long lists from dense impact rows; the pruning algorithms never do
    assert all(len(ks["rows"]["impact_rows"]) for ks in leg.kernel_shards)
    rng = np.random.default_rng(5)
    allows = [None, [(rng.random(ks["doc_norm"].shape[0]) < 0.3).astype(np.uint8) for ks in leg.kernel_shards]]
    for depth in (1, 7, 100, 2999, 5000):
        for params in ({}, {"k1": 1.7, "b": 1.0}, {"k1": 0.0, "b": 0.0}):
            for allow in allows:
                ref = _leg_search(leg, _prepared(leg, queries, batch, "exhaustive", **params), depth, 1, allow)
                for algo in ("maxscore", "bmw", "bmm", "auto"):
                    got = _leg_search(leg, _prepared(leg, queries, batch, algo, **params), depth, 2, allow)
                    for (ri, rs, rn), (gi, gs, gn) in zip(ref, got):
                        np.testing.assert_array_equal(gi, ri)
                        np.testing.assert_array_equal(gs.view(np.uint32), rs.view(np.uint32))
                        np.testing.assert_array_equal(gn, rn)
    # the cache holds one array per depth (most recent KTH_CACHE), filled only for used terms
    cache = leg.kernel_shards[0]["kth"]
    assert 0 < len(cache) <= leg.KTH_CACHE
    arr = cache[5000]
    used = np.unique(batch[1])
    assert not np.isnan(arr[used]).any()
