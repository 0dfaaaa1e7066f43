"""Tests of the C++ kernels in retriever._kernels against their numpy twins.

Every kernel is compared with the brute-force oracle in tests/reference.py:
bit for bit against the float32 twin (same operation order), and with a
tolerance plus a tie-tolerant id check against the float64 twin. BM25
algorithms ("exhaustive", "maxscore", "bmw", "bmm") must agree bit for bit with
each other and across thread counts.
"""

from __future__ import annotations

import ast
import itertools
import pathlib
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    from reference import (
        assert_topk_close,
        bm25_topk_ref,
        bm25_upper_bounds_ref,
        check_csr_ref,
        impact_topk_ref,
    )
except ImportError:  # tests/ imported as a package
    from tests.reference import (
        assert_topk_close,
        bm25_topk_ref,
        bm25_upper_bounds_ref,
        check_csr_ref,
        impact_topk_ref,
    )

try:
    from retriever import _kernels as K
except ImportError:  # the package __init__ may need deps that are not installed yet
    import importlib.util
    import pathlib
    import sys

    _so = sorted(pathlib.Path(__file__).resolve().parents[1].glob("retriever/_kernels*.so"))
    if not _so:
        raise
    _spec = importlib.util.spec_from_file_location("retriever._kernels", _so[0])
    K = importlib.util.module_from_spec(_spec)
    sys.modules["retriever._kernels"] = K
    _spec.loader.exec_module(K)

ALGORITHMS = ("exhaustive", "maxscore", "bmw", "bmm", "auto")
PRUNING = ("maxscore", "bmw", "bmm", "auto")


# ---------------------------------------------------------------------------
# Data builders
# ---------------------------------------------------------------------------


def make_corpus(rng, n_docs, n_terms, density=0.3, ties=False, zipf=False):
    """Random CSR postings: dict(offsets, doc_ids, tfs, doc_norm)."""
    lists_d, lists_tf = [], []
    for t in range(n_terms):
        if zipf:
            p = min(1.0, density / (t + 1) ** 0.8)
        else:
            p = density * rng.random()
        docs = np.flatnonzero(rng.random(n_docs) < p).astype(np.uint32)
        if ties:
            tf = rng.choice(np.array([1, 2, 3], dtype=np.uint32), size=len(docs))
        else:
            tf = rng.geometric(0.4, size=len(docs)).astype(np.uint32)
            heavy = rng.random(len(docs)) < 0.05  # some tfs beyond small-tf tables
            tf[heavy] = rng.integers(20, 300, size=int(heavy.sum()))
        lists_d.append(docs)
        lists_tf.append(tf)
    lengths = np.array([len(d) for d in lists_d], dtype=np.uint64)
    offsets = np.zeros(n_terms + 1, dtype=np.uint64)
    offsets[1:] = np.cumsum(lengths)
    doc_ids = np.concatenate(lists_d) if n_terms else np.zeros(0, np.uint32)
    tfs = np.concatenate(lists_tf) if n_terms else np.zeros(0, np.uint32)
    if ties:
        doc_norm = rng.choice(np.array([0.0, 0.5, 1.0, 1.5], dtype=np.float32), size=n_docs)
    else:
        doc_norm = rng.uniform(0.0, 3.0, size=n_docs).astype(np.float32)
    return dict(offsets=offsets, doc_ids=doc_ids.astype(np.uint32), tfs=tfs.astype(np.uint32),
                doc_norm=doc_norm.astype(np.float32))


def make_queries(rng, n_terms, nq, max_len, ties=False, negative=False, repeats=True):
    """Ragged query batch: (q_offsets u64, q_terms u32, q_weights f32)."""
    lens = rng.integers(0, max_len + 1, size=nq) if n_terms else np.zeros(nq, dtype=np.int64)
    terms, weights = [], []
    for n in lens:
        if repeats:
            tq = rng.integers(0, n_terms, size=n)
        else:
            n = min(n, n_terms)
            tq = rng.choice(n_terms, size=n, replace=False)
        if ties:
            w = rng.choice(np.array([0.0, 0.5, 1.0, 2.0], dtype=np.float32), size=len(tq))
        else:
            w = rng.uniform(0.0, 10.0, size=len(tq)).astype(np.float32)
        if negative:
            w = np.where(rng.random(len(tq)) < 0.4, -w, w).astype(np.float32)
        terms.append(tq)
        weights.append(w)
    q_offsets = np.zeros(nq + 1, dtype=np.uint64)
    q_offsets[1:] = np.cumsum([len(t) for t in terms])
    q_terms = np.concatenate(terms).astype(np.uint32) if nq else np.zeros(0, np.uint32)
    q_weights = np.concatenate(weights).astype(np.float32) if nq else np.zeros(0, np.float32)
    return q_offsets, q_terms, q_weights


def make_allow(rng, n_docs, mode):
    if mode == "none":
        return None
    if mode == "all":
        return np.ones(n_docs, dtype=np.uint8)
    if mode == "nothing":
        return np.zeros(n_docs, dtype=np.uint8)
    return (rng.random(n_docs) < 0.5).astype(np.uint8) * rng.integers(1, 256, size=n_docs).astype(
        np.uint8)


def bounds_for(c, block_size):
    return K.bm25_upper_bounds(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"],
                               block_size=block_size)


def term_kth_for(c, k, impacts=None, bounds=None, block_size=128):
    """term_kth f32[n_terms] for depth k over every term (bm25_term_kth)."""
    n_terms = len(c["offsets"]) - 1
    kw = {} if impacts is None else {"impacts": impacts}
    if bounds is not None:
        kw.update(block_offsets=bounds[1], block_ub=bounds[2], block_size=block_size)
    return K.bm25_term_kth(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"],
                           np.arange(n_terms, dtype=np.uint32), k, **kw)


def term_kth_ref(c, depth):
    """Oracle: depth-th largest float32 tf / (tf + doc_norm[d]) per term, -inf if shorter."""
    out = np.full(len(c["offsets"]) - 1, -np.inf, dtype=np.float32)
    for t in range(len(out)):
        b, e = int(c["offsets"][t]), int(c["offsets"][t + 1])
        tf = c["tfs"][b:e].astype(np.float32)
        part = tf / (tf + c["doc_norm"][c["doc_ids"][b:e]])
        if e - b >= depth:
            out[t] = np.sort(part)[::-1][depth - 1]
    return out


def run_bm25(c, q, k, algorithm, n_threads=1, allow=None, bounds=None, block_size=128, impacts=None,
             term_kth=None, dense=None, impl="auto"):
    kw = {} if impacts is None else {"impacts": impacts}
    kw["impl"] = impl
    if algorithm != "exhaustive" and dense is not None:
        kw.update(dense_slot=dense[0], dense_bits=dense[1], dense_rank=dense[2])
    if algorithm != "exhaustive":
        term_ub, block_offsets, block_ub = bounds
        kw.update(term_ub=term_ub, block_offsets=block_offsets, block_ub=block_ub,
                  block_size=block_size)
        if term_kth is not None:
            kw.update(term_kth=term_kth, term_kth_depth=k)
    return K.bm25_topk(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, k,
                       n_threads=n_threads, allow=allow, algorithm=algorithm, **kw)


def assert_same(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def check_all_bm25(c, q, k, allow, block_size, threads=(1, 4), algorithms=ALGORITHMS):
    """Every algorithm and thread count must equal the exact float32 twin bit for bit."""
    ref = bm25_topk_ref(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, k, allow)
    ref64 = bm25_topk_ref(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, k, allow,
                          exact=False)
    bounds = bounds_for(c, block_size)
    impacts = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    # the safe initial threshold (term_kth) must change nothing, ties included
    kth = term_kth_for(c, k, impacts, bounds, block_size)
    # membership bitmaps of the long lists (MaxScore's O(1) probes), at two density cut-offs
    n_docs = len(c["doc_norm"])
    dense_sets = [K.bm25_dense_bitmaps(c["offsets"], c["doc_ids"], n_docs, m)
                  for m in (max(1, n_docs // 32), 1)]
    first = None
    for algorithm, n_threads, imp, tk, dense in itertools.product(algorithms, threads, (None, impacts),
                                                                  (None, kth), (None, *dense_sets)):
        if dense is not None and (algorithm not in ("maxscore", "auto") or n_threads != threads[0]):
            continue
        if tk is None or algorithm != "exhaustive":
            got = run_bm25(c, q, k, algorithm, n_threads, allow, bounds, block_size, imp, tk, dense)
            ids, scores, n_found = got
            assert ids.shape == (len(q[0]) - 1, k) and ids.dtype == np.int64
            assert scores.shape == ids.shape and scores.dtype == np.float32
            assert n_found.shape == (len(q[0]) - 1,) and n_found.dtype == np.int32
            assert_same(got, ref)
            if first is None:
                first = got
                assert_topk_close(*got, *ref64)
            else:
                assert_same(got, first)
    return first


# ---------------------------------------------------------------------------
# BM25 vs oracle
# ---------------------------------------------------------------------------


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n_docs=st.integers(1, 60),
    n_terms=st.integers(0, 12),
    density=st.floats(0.0, 1.0),
    ties=st.booleans(),
    nq=st.integers(0, 6),
    max_len=st.integers(0, 7),
    k_extra=st.integers(0, 70),
    allow_mode=st.sampled_from(["none", "all", "nothing", "random"]),
    block_size=st.sampled_from([1, 2, 3, 5, 128]),
)
def test_bm25_matches_reference(seed, n_docs, n_terms, density, ties, nq, max_len, k_extra,
                                allow_mode, block_size):
    rng = np.random.default_rng(seed)
    c = make_corpus(rng, n_docs, n_terms, density, ties)
    q = make_queries(rng, n_terms, nq, max_len, ties=ties)
    k = 1 + k_extra % (n_docs + 5)  # covers k > n_docs
    allow = make_allow(rng, n_docs, allow_mode)
    check_all_bm25(c, q, k, allow, block_size)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_docs=st.integers(1, 40), n_terms=st.integers(1, 8),
       ties=st.booleans(), k=st.integers(1, 50))
def test_bm25_negative_and_zero_weights(seed, n_docs, n_terms, ties, k):
    rng = np.random.default_rng(seed)
    c = make_corpus(rng, n_docs, n_terms, 0.5, ties)
    q = make_queries(rng, n_terms, 5, 6, ties=ties, negative=True)
    # Pruning algorithms fall back to exhaustive for queries with a negative weight.
    check_all_bm25(c, q, k, None, 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ties", [False, True])
def test_bm25_pruning_zipf(seed, ties):
    """Larger Zipfian corpora where MaxScore / block-max actually prune."""
    rng = np.random.default_rng(100 + seed)
    n_docs = 4000 + 1000 * seed
    c = make_corpus(rng, n_docs, 120, density=0.6, ties=ties, zipf=True)
    q = make_queries(rng, 120, 80, 6, ties=ties, repeats=(seed == 2))
    for k, block_size, allow_mode in [(1, 8, "none"), (10, 64, "random"), (100, 16, "none"),
                                      (10, 128, "all")]:
        allow = make_allow(rng, n_docs, allow_mode)
        batch = check_all_bm25(c, q, k, allow, block_size, threads=(1, 4))
        # single-query calls (the kernels choose per-call shortcuts by batch size)
        for i in range(0, 80, 8):
            b, e = int(q[0][i]), int(q[0][i + 1])
            one = (np.array([0, e - b], np.uint64), q[1][b:e].copy(), q[2][b:e].copy())
            got = check_all_bm25(c, one, k, allow, block_size, threads=(1,))
            assert_same(got, tuple(x[i : i + 1] for x in batch))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("weights", ["positive", "ties", "negative"])
def test_bm25_dense_scan_selection(seed, weights):
    """Exhaustive scoring of a small collection by a dense scan (queries whose postings cover a
    good part of the documents): block-max selection with the k-th block maximum as a lower
    bound, its fallbacks (allow filter, zero and negative scores, fewer than k positive blocks)
    and a partial last block, against the oracle; queries of mixed sizes also take the
    touched-list path in the same batch."""
    rng = np.random.default_rng(500 + seed)
    n_docs = 1607  # 100 blocks of 16 and a partial one
    c = make_corpus(rng, n_docs, 40, density=0.9, ties=(weights == "ties"))
    q = make_queries(rng, 40, 60, 9, ties=(weights == "ties"), negative=(weights == "negative"))
    for k, allow_mode in [(1, "none"), (10, "none"), (10, "random"), (64, "none"), (65, "none"),
                          (101, "none"), (150, "all"), (2000, "none")]:
        if weights == "negative" and k > 150:
            continue  # near-cancelling sums deep in the list exceed the float64 twin's tolerance
        check_all_bm25(c, q, k, make_allow(rng, n_docs, allow_mode), 16, threads=(1, 3))


def test_bm25_dense_scan_large_collection():
    """The dense-scan exhaustive path on a collection above 2**18 documents (queries whose
    postings total at least a quarter of the documents), with and without an allow filter,
    against the oracle; every other algorithm must agree."""
    rng = np.random.default_rng(520)
    n_docs = 300_007
    c = make_corpus(rng, n_docs, 8, density=0.9)
    q = make_queries(rng, 8, 6, 6, repeats=False)
    lens = np.diff(c["offsets"].astype(np.int64))
    totals = [int(lens[q[1][int(b):int(e)]].sum()) for b, e in zip(q[0][:-1], q[0][1:])]
    assert max(totals) * 4 >= n_docs  # at least one query takes the dense scan
    for k, allow_mode in [(10, "none"), (100, "random")]:
        check_all_bm25(c, q, k, make_allow(rng, n_docs, allow_mode), 128, threads=(1, 2))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ties", [False, True])
def test_bm25_dense_scatter_implementations(seed, ties):
    """The dense exhaustive path with impacts: every scatter this CPU runs (the default for the
    CPU, scalar with 4 postings a step, AVX2 products with scalar stores, AVX-512 gathers /
    scatters of 16 postings) must each equal the float32 oracle bit for bit, on lists of every length mod 16 (the vector body
    and the scalar tail), odd collection sizes (a partial last selection block), ties, k around
    the number of blocks (the k-th block maximum's pre-filter), one and three threads."""
    rng = np.random.default_rng(900 + seed)
    n_docs = (331, 1601, 5183)[seed]
    n_terms = 48
    c = make_corpus(rng, n_docs, n_terms, density=0.9, ties=ties)
    lens = np.diff(c["offsets"].astype(np.int64))
    assert {int(x) % 16 for x in lens if x >= 16} and lens.max() >= 32  # vector body and tails
    q = make_queries(rng, n_terms, 40, 9, ties=ties)
    impacts = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    bounds = bounds_for(c, 128)
    nb = (n_docs + 15) // 16
    for k in sorted({1, 10, max(1, nb // 4), max(1, nb // 4) + 1, 64, 65}):
        ref = bm25_topk_ref(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, k, None)
        kth = term_kth_for(c, k, impacts, bounds, 128)
        assert (kth > 0).any()  # a real single-term threshold reaches the kernel
        for impl in SCATTER_IMPLS:
            for n_threads in (1, 3):
                assert_same(run_bm25(c, q, k, "exhaustive", n_threads, impacts=impacts, impl=impl), ref)
                # "auto" on a small collection: dense exhaustive, with the single-term threshold
                assert_same(run_bm25(c, q, k, "auto", n_threads, bounds=bounds, impacts=impacts,
                                     term_kth=kth, impl=impl), ref)
    for bad in ("", "AVX2", "sse2", "0"):
        with pytest.raises(ValueError, match="impl must be one of 'auto', 'scalar', 'avx2', 'avx512'"):
            run_bm25(c, q, 10, "exhaustive", impacts=impacts, impl=bad)


@pytest.mark.parametrize("n_high", [1, 39, 40, 63, 64, 65, 200])
def test_bm25_dense_ranked_selection_boundaries(n_high):
    """The dense scan's selection when the k-th largest maximum of 128-document groups bounds the
    k-th score: up to 64 documents reaching it are ranked by counting, more fall back to one
    offer per document. n_high documents (spread over the 40 groups, some groups holding
    several) share the best score and every document shares a lower one, so the tie rule (smaller id
    first) decides, at and around the 64-candidate limit, for k up to and past the number of
    groups; against the float32 oracle, with and without the impact path and on every scatter."""
    n_docs = 5120  # 40 groups of 8 blocks of 16
    rng = np.random.default_rng(950 + n_high)
    high = np.sort(np.concatenate([np.arange(0, n_docs, 128)[:min(n_high, 40)],
                                   rng.choice(np.setdiff1d(np.arange(n_docs), np.arange(0, n_docs, 128)),
                                              max(0, n_high - 40), replace=False)]))
    high = high[:n_high]
    # term 0: every document (tf 1, a dense list); term 1: the n_high documents (tf 3)
    doc_ids = np.concatenate([np.arange(n_docs), high]).astype(np.uint32)
    c = {"offsets": np.array([0, n_docs, n_docs + n_high], np.uint64), "doc_ids": doc_ids,
         "tfs": np.concatenate([np.ones(n_docs), np.full(n_high, 3)]).astype(np.uint32),
         "doc_norm": np.full(n_docs, 0.75, np.float32)}
    q = (np.array([0, 2, 3, 5], np.uint64), np.array([0, 1, 1, 1, 0], np.uint32),
         np.array([1.5, 2.0, 2.0, 2.0, 1.5], np.float32))
    impacts = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    for k in (1, 10, 11, 40, 64, 65):
        ref = bm25_topk_ref(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, k, None)
        want = np.concatenate([high[:k], np.setdiff1d(np.arange(n_docs), high)[:max(0, k - n_high)]])
        np.testing.assert_array_equal(ref[0][0], want)  # the oracle's tie rule, spelled out
        for impl in SCATTER_IMPLS:
            for n_threads in (1, 2):
                assert_same(run_bm25(c, q, k, "exhaustive", n_threads, impacts=impacts, impl=impl), ref)
                assert_same(run_bm25(c, q, k, "exhaustive", n_threads, impl=impl), ref)


def _scatter_impls() -> list[str]:
    """The scatter implementations bm25_topk runs on this CPU ("auto" = the one chosen once per
    process from the CPU, then each explicit one the CPU has); an explicit one it lacks is refused."""
    offsets, doc_ids = np.array([0, 1], np.uint64), np.zeros(1, np.uint32)
    args = (offsets, doc_ids, np.ones(1, np.uint32), np.ones(1, np.float32), np.array([0, 1], np.uint64),
            np.zeros(1, np.uint32), np.ones(1, np.float32), 1)
    ok = []
    for impl in ("auto", "scalar", "avx2", "avx512"):
        try:
            K.bm25_topk(*args, algorithm="exhaustive", impacts=np.ones(1, np.float32), impl=impl)
        except ValueError as e:
            assert f"impl '{impl}' is not supported on this CPU" in str(e) and impl in ("avx2", "avx512")
            continue
        ok.append(impl)
    return ok


SCATTER_IMPLS = _scatter_impls()


@pytest.mark.parametrize("impl", SCATTER_IMPLS)
@pytest.mark.parametrize("bad_at", [0, 5, 16, 31, 37])
def test_bm25_dense_scatter_rejects_a_bad_doc_id(impl, bad_at):
    """A doc id >= n_docs anywhere in a long list (inside a 16-posting vector or in the tail)
    raises on either scatter, and later calls still score from a clean accumulator."""
    n_docs = 40
    doc_ids = np.arange(40, dtype=np.uint32)
    doc_ids[bad_at] = 1000 + bad_at
    offsets = np.array([0, 40], np.uint64)
    tfs = np.ones(40, np.uint32)
    norm = np.ones(n_docs, np.float32)
    impacts = np.full(40, 0.5, np.float32)
    q = (np.array([0, 1], np.uint64), np.zeros(1, np.uint32), np.ones(1, np.float32))
    rng = np.random.default_rng(7)
    c = make_corpus(rng, n_docs, 6, density=0.9)
    qs = make_queries(rng, 6, 16, 4)
    ref = bm25_topk_ref(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *qs, 5, None)
    imp_c = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    with pytest.raises(ValueError, match=f"doc id {1000 + bad_at}"):
        K.bm25_topk(offsets, doc_ids, tfs, norm, *q, 3, n_threads=1, algorithm="exhaustive",
                    impacts=impacts, impl=impl)
    assert_same(run_bm25(c, qs, 5, "exhaustive", impacts=imp_c, impl=impl), ref)


def test_bm25_long_queries_and_many_windows():
    """Queries with more essential lists than the windowed MaxScore handles (DAAT
    fallback), and a corpus spanning many doc-id windows."""
    rng = np.random.default_rng(300)
    c = make_corpus(rng, 3000, 150, density=0.4, zipf=True)
    q = make_queries(rng, 150, 6, 120, repeats=True)
    lens = np.diff(q[0])
    assert lens.max() > 70
    for k in (1, 10, 200):
        check_all_bm25(c, q, k, None, 8, threads=(1, 3))
    rng = np.random.default_rng(301)
    c = make_corpus(rng, 70000, 60, density=0.3, zipf=True)  # 9 windows of 8192 doc ids
    q = make_queries(rng, 60, 30, 8, repeats=False)
    for k, allow_mode in [(10, "none"), (50, "random")]:
        check_all_bm25(c, q, k, make_allow(rng, 70000, allow_mode), 32, threads=(1, 2))


@pytest.mark.parametrize("n_docs", [1, 63, 64, 65, 1000, 4097])
def test_dense_bitmaps_match_numpy(n_docs):
    """bm25_dense_bitmaps: a row per list with >= min_df postings, bit d set iff d is in the
    list, rank[w] = postings below doc 64 * w; -1 for the other lists."""
    rng = np.random.default_rng(n_docs)
    c = make_corpus(rng, n_docs, 30, density=0.5)
    lens = np.diff(c["offsets"].astype(np.int64))
    min_df = max(1, n_docs // 8)
    slot, bits, rank = K.bm25_dense_bitmaps(c["offsets"], c["doc_ids"], n_docs, min_df)
    words = (n_docs + 63) // 64
    assert slot.dtype == np.int32 and bits.dtype == np.uint64 and rank.dtype == np.uint32
    want = np.where(lens >= min_df, np.cumsum(lens >= min_df) - 1, -1)
    np.testing.assert_array_equal(slot, want)
    assert len(bits) == len(rank) == int((lens >= min_df).sum()) * words
    for t in np.flatnonzero(lens >= min_df):
        docs = c["doc_ids"][c["offsets"][t]:c["offsets"][t + 1]]
        member = np.zeros(words * 64, bool)
        member[docs] = True
        row = slice(int(slot[t]) * words, (int(slot[t]) + 1) * words)
        got = np.unpackbits(bits[row].view(np.uint8), bitorder="little").astype(bool)
        np.testing.assert_array_equal(got, member)
        np.testing.assert_array_equal(rank[row], np.searchsorted(docs, np.arange(words) * 64))


def test_dense_bitmaps_argument_checks():
    c = dict(offsets=np.array([0, 2, 3], np.uint64), doc_ids=np.array([0, 5, 2], np.uint32))
    with pytest.raises(ValueError, match="min_df"):
        K.bm25_dense_bitmaps(c["offsets"], c["doc_ids"], 6, 0)
    with pytest.raises(ValueError, match="doc_ids\\[1\\] = 5 >= n_docs = 4"):
        K.bm25_dense_bitmaps(c["offsets"], c["doc_ids"], 4, 1)
    slot, bits, rank = K.bm25_dense_bitmaps(c["offsets"], c["doc_ids"], 6, 1)
    norm = np.ones(6, np.float32)
    tfs = np.ones(3, np.uint32)
    q = (np.array([0, 2], np.uint64), np.array([0, 1], np.uint32), np.array([1.0, 1.0], np.float32))
    ub, bo, bu = K.bm25_upper_bounds(c["offsets"], c["doc_ids"], tfs, norm)
    kw = dict(term_ub=ub, algorithm="maxscore")
    with pytest.raises(ValueError, match="go together"):
        K.bm25_topk(c["offsets"], c["doc_ids"], tfs, norm, *q, 2, dense_slot=slot, **kw)
    with pytest.raises(ValueError, match="len\\(dense_slot\\)"):
        K.bm25_topk(c["offsets"], c["doc_ids"], tfs, norm, *q, 2, dense_slot=slot[:1], dense_bits=bits,
                    dense_rank=rank, **kw)
    with pytest.raises(ValueError, match="dense_slot\\[1\\] = 7"):
        K.bm25_topk(c["offsets"], c["doc_ids"], tfs, norm, *q, 2, dense_slot=np.array([0, 7], np.int32),
                    dense_bits=bits, dense_rank=rank, **kw)
    with pytest.raises(ValueError, match="len\\(dense_rank\\)"):
        K.bm25_topk(c["offsets"], c["doc_ids"], tfs, norm, *q, 2, dense_slot=slot, dense_bits=bits,
                    dense_rank=rank[:1], **kw)
    norm100 = np.ones(100, np.float32)  # 2 words per row
    with pytest.raises(ValueError, match="multiple of ceil"):
        K.bm25_topk(c["offsets"], c["doc_ids"], tfs, norm100, *q, 2, dense_slot=slot,
                    dense_bits=np.zeros(3, np.uint64), dense_rank=np.zeros(3, np.uint32), **kw)


def test_dense_bitmap_probe_refuses_a_rank_past_the_list():
    """A corrupted rank row that would place a posting past its list's end raises instead of
    reading out of bounds (the window MaxScore path, many documents)."""
    rng = np.random.default_rng(5)
    n_docs = 70000
    c = make_corpus(rng, n_docs, 6, density=0.9)
    slot, bits, rank = K.bm25_dense_bitmaps(c["offsets"], c["doc_ids"], n_docs, 1)
    bad = rank.copy()
    bad[:] = np.uint32(2**31)
    bounds = bounds_for(c, 128)
    q = (np.array([0, 6], np.uint64), np.arange(6, dtype=np.uint32),
         np.array([0.1, 0.1, 0.1, 0.1, 0.1, 9.0], np.float32))
    with pytest.raises(ValueError, match="past the end of its list"):
        run_bm25(c, q, 10, "maxscore", 1, None, bounds, dense=(slot, bits, bad))
    # the uncorrupted bitmaps give the exhaustive result
    assert_same(run_bm25(c, q, 10, "maxscore", 1, None, bounds, dense=(slot, bits, rank)),
                run_bm25(c, q, 10, "exhaustive", 1))


@pytest.mark.parametrize("how", ["repeated", "decreasing"])
@pytest.mark.parametrize("algorithm", ["maxscore", "bmw", "bmm", "auto"])
def test_bm25_unsorted_long_list_is_not_a_memory_error(how, algorithm):
    """A list that breaks the strictly-increasing precondition (a doc id repeated more times
    than a MaxScore window holds, or ids going down across windows) gives a ValueError or
    unspecified scores, never a write past the window buffers (it used to abort the process)."""
    n = 20000
    if how == "repeated":
        docs, n_docs = np.zeros(n, np.uint32), 1
    else:
        docs, n_docs = np.arange(n, dtype=np.uint32)[::-1].copy(), n
    c = dict(offsets=np.array([0, n, n + 1], np.uint64), doc_ids=np.concatenate([docs, np.zeros(1, np.uint32)]),
             tfs=np.ones(n + 1, np.uint32), doc_norm=np.ones(n_docs, np.float32))
    imp = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    bounds = bounds_for(c, 128)
    for terms in ([0], [0, 1], [1, 0]):
        q = (np.array([0, len(terms)], np.uint64), np.array(terms, np.uint32), np.ones(len(terms), np.float32))
        for impacts in (None, imp):
            try:
                ids, scores, n_found = run_bm25(c, q, 2, algorithm, 1, None, bounds, impacts=impacts)
            except ValueError as e:
                assert "strictly increasing" in str(e) or "check_csr" in str(e)
            else:
                assert ids.shape == (1, 2) and ((ids[0] >= -1) & (ids[0] < n_docs)).all()


def test_dense_bitmaps_mixed_lists_are_probed_exactly():
    """Queries whose non-essential lists are partly bitmap-probed (dense lists) and partly
    sought (lists below min_df) equal exhaustive scoring; a rank past the lists proves the
    bitmap probes were reached."""
    rng = np.random.default_rng(11)
    n_docs = 40000
    dens = [0.6, 0.5, 0.4, 0.02, 0.015, 0.01, 0.0008, 0.0005]
    lists = [np.flatnonzero(rng.random(n_docs) < p).astype(np.uint32) for p in dens]
    offsets = np.zeros(len(lists) + 1, np.uint64)
    offsets[1:] = np.cumsum([len(x) for x in lists])
    c = dict(offsets=offsets, doc_ids=np.concatenate(lists),
             tfs=np.concatenate([rng.geometric(0.4, len(x)).astype(np.uint32) for x in lists]),
             doc_norm=rng.uniform(0.5, 1.5, n_docs).astype(np.float32))
    min_df = n_docs // 32  # the three dense lists only
    slot, bits, rank = K.bm25_dense_bitmaps(c["offsets"], c["doc_ids"], n_docs, min_df)
    assert (slot >= 0).sum() == 3
    idf = np.log1p((n_docs - np.diff(offsets) + 0.5) / (np.diff(offsets) + 0.5)).astype(np.float32)
    qs = [[6, 0, 3], [7, 6, 0, 1, 2, 4], [3, 4, 5, 0, 1], [6, 7, 5, 2], [0, 1, 2, 3, 4, 5, 6, 7]]
    q_terms = np.concatenate([np.array(t, np.uint32) for t in qs])
    q = (np.array([0, *np.cumsum([len(t) for t in qs])], np.uint64), q_terms, idf[q_terms])
    bounds = bounds_for(c, 128)
    imp = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    for k in (1, 10, 100):
        ref = run_bm25(c, q, k, "exhaustive", 1)
        for impacts in (None, imp):
            assert_same(run_bm25(c, q, k, "maxscore", 1, None, bounds, impacts=impacts, dense=(slot, bits, rank)), ref)
    bad = np.full_like(rank, np.uint32(2**31))
    with pytest.raises(ValueError, match="past the end of its list"):
        run_bm25(c, q, 10, "maxscore", 1, None, bounds, impacts=imp, dense=(slot, bits, bad))


@pytest.mark.parametrize("seed", [0, 1])
def test_bm25_clustered_lists_seek_exactly(seed):
    """Long lists whose doc ids come in dense bursts separated by wide gaps, so the
    interpolating seek of the pruning algorithms (posting_cursor::seek: guess from the doc-id
    gap, then gallop) lands far before and far after its target; every algorithm must still
    equal exhaustive scoring bit for bit."""
    rng = np.random.default_rng(400 + seed)
    n_docs, n_terms = 60000, 12
    lists_d, lists_tf = [], []
    for t in range(n_terms):
        if t < 6:  # bursts: a few hundred consecutive-ish ids, then a long gap
            starts = np.sort(rng.choice(n_docs - 600, size=8 + 6 * t, replace=False))
            docs = np.unique(np.concatenate([s + np.flatnonzero(rng.random(600) < 0.7) for s in starts]))
        elif t < 9:  # dense, uniform
            docs = np.flatnonzero(rng.random(n_docs) < 0.4)
        else:  # short, spread out
            docs = np.sort(rng.choice(n_docs, size=40 + 30 * t, replace=False))
        lists_d.append(docs.astype(np.uint32))
        lists_tf.append(rng.geometric(0.4, size=len(docs)).astype(np.uint32))
    offsets = np.zeros(n_terms + 1, np.uint64)
    offsets[1:] = np.cumsum([len(d) for d in lists_d])
    doc_norm = rng.uniform(0.4, 2.0, n_docs).astype(np.float32)
    c = dict(offsets=offsets, doc_ids=np.concatenate(lists_d), tfs=np.concatenate(lists_tf), doc_norm=doc_norm)
    q = make_queries(rng, n_terms, 40, 6, repeats=False)
    for k, allow_mode in [(1, "none"), (10, "none"), (100, "random")]:
        check_all_bm25(c, q, k, make_allow(rng, n_docs, allow_mode), 32, threads=(1, 2))


@pytest.mark.parametrize("seed", [0, 1])
def test_bm25_block_structured(seed):
    """Dense lists whose scores vary by region, so block bounds differ and
    block-max algorithms skip whole blocks (including at block boundaries)."""
    rng = np.random.default_rng(200 + seed)
    n_docs, n_terms = 3000, 8
    region = (np.arange(n_docs) // 37) % 5  # 0 = region of short documents
    doc_norm = np.where(region == 0, 0.3, 2.5).astype(np.float32)
    doc_norm += rng.uniform(0, 0.05, n_docs).astype(np.float32)
    lists_d, lists_tf = [], []
    for t in range(n_terms):
        docs = np.flatnonzero(rng.random(n_docs) < (0.95 if t < 4 else 0.3)).astype(np.uint32)
        tf = np.where(region[docs] == 0, rng.integers(3, 60, len(docs)), 1).astype(np.uint32)
        lists_d.append(docs)
        lists_tf.append(tf)
    offsets = np.zeros(n_terms + 1, np.uint64)
    offsets[1:] = np.cumsum([len(d) for d in lists_d])
    c = dict(offsets=offsets, doc_ids=np.concatenate(lists_d), tfs=np.concatenate(lists_tf),
             doc_norm=doc_norm)
    q = make_queries(rng, n_terms, 40, 5, repeats=False)
    for k, block_size in [(1, 4), (10, 16), (30, 7)]:
        check_all_bm25(c, q, k, None, block_size, threads=(1, 3))


def test_bm25_hand_example():
    # term 0: docs 0, 2; term 1: docs 1, 2; doc 3 has no posting.
    c = dict(offsets=np.array([0, 2, 4], np.uint64), doc_ids=np.array([0, 2, 1, 2], np.uint32),
             tfs=np.array([1, 3, 2, 1], np.uint32),
             doc_norm=np.array([1.0, 1.0, 0.5, 2.0], np.float32))
    q = (np.array([0, 2, 2, 4], np.uint64), np.array([0, 1, 1, 1], np.uint32),
         np.array([2.0, 1.0, 1.0, 1.0], np.float32))
    ids, scores, n_found = check_all_bm25(c, q, 5, None, 1)
    s0 = np.float32(2.0) * (np.float32(1) / np.float32(2))
    s2 = np.float32(2.0) * (np.float32(3) / np.float32(3.5))
    s2 = s2 + np.float32(1.0) * (np.float32(1) / np.float32(1.5))
    assert n_found.tolist() == [3, 0, 2]
    assert ids[0].tolist() == [2, 0, 1, -1, -1]
    assert scores[0, 0] == s2 and scores[0, 1] == s0
    assert ids[1].tolist() == [-1] * 5 and np.all(np.isneginf(scores[1]))
    # repeated term counts twice: doc 1 = 2 * (2 / 3), doc 2 = 2 * (1 / 1.5)
    one = np.float32(1.0) * (np.float32(2) / np.float32(3.0))
    two = np.float32(1.0) * (np.float32(1) / np.float32(1.5))
    assert ids[2, :2].tolist() == [1, 2]
    assert scores[2, 0] == one + one and scores[2, 1] == two + two


def test_bm25_ties_break_by_doc_id():
    n_docs = 50
    c = dict(offsets=np.array([0, n_docs], np.uint64),
             doc_ids=np.arange(n_docs, dtype=np.uint32), tfs=np.ones(n_docs, np.uint32),
             doc_norm=np.ones(n_docs, np.float32))
    q = (np.array([0, 1], np.uint64), np.array([0], np.uint32), np.array([1.0], np.float32))
    ids, scores, n_found = check_all_bm25(c, q, 7, None, 4)
    assert ids[0].tolist() == list(range(7))
    allow = np.zeros(n_docs, np.uint8)
    allow[[3, 40, 41]] = 1
    ids, scores, n_found = check_all_bm25(c, q, 7, allow, 4)
    assert ids[0].tolist() == [3, 40, 41, -1, -1, -1, -1] and n_found[0] == 3


# (weights, tfs, doc_norm of doc 1, doc_norm of doc 0): doc 1's float32 score rounds
# above the exact sum of its per-term upper bounds, and doc 0's float32 score lands
# between the two. A pruning rule without a rounding margin would stop after doc 0.
ROUNDING_CASES = [
    ([3.221529006958008, 5.160461902618408, 4.835957050323486, 3.7798149585723877,
      0.5682241320610046], [12, 8, 4, 2, 5], 0.480660080909729, 0.4806601107120514),
    ([5.546662330627441, 0.25839993357658386, 9.633015632629395, 0.2927062511444092,
      0.44654399156570435], [13, 13, 4, 15, 16], 0.569732129573822, 0.5697321891784668),
]


@pytest.mark.parametrize("case", ROUNDING_CASES)
def test_bm25_pruning_survives_float_rounding(case):
    w, tf, norm_x, norm_y = case
    n = len(w)
    w = np.array(w, np.float32)
    tf = np.array(tf, np.uint32)
    doc_norm = np.array([norm_y, norm_x], np.float32)
    c = dict(offsets=(2 * np.arange(n + 1)).astype(np.uint64),
             doc_ids=np.tile(np.array([0, 1], np.uint32), n), tfs=np.repeat(tf, 2),
             doc_norm=doc_norm)
    q = (np.array([0, n], np.uint64), np.arange(n, dtype=np.uint32), w)
    ub = bounds_for(c, 128)[0]
    exact_bound = sum(float(w[i]) * float(ub[i]) for i in range(n))
    ref = bm25_topk_ref(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, 2)
    s1, s0 = ref[1][0]
    assert ref[0][0].tolist() == [1, 0] and exact_bound < s0 < s1  # the trap is armed
    check_all_bm25(c, q, 1, None, 1)
    check_all_bm25(c, q, 1, None, 128)


def test_bm25_empty_batch_and_empty_index():
    c = dict(offsets=np.zeros(1, np.uint64), doc_ids=np.zeros(0, np.uint32),
             tfs=np.zeros(0, np.uint32), doc_norm=np.zeros(3, np.float32))
    q = (np.zeros(1, np.uint64), np.zeros(0, np.uint32), np.zeros(0, np.float32))
    for algorithm in ALGORITHMS:
        ids, scores, n_found = run_bm25(c, q, 4, algorithm, 2, None, bounds_for(c, 128))
        assert ids.shape == (0, 4) and scores.shape == (0, 4) and n_found.shape == (0,)


# ---------------------------------------------------------------------------
# Upper bounds
# ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_docs=st.integers(1, 80), n_terms=st.integers(0, 10),
       block_size=st.integers(1, 9), n_threads=st.sampled_from([1, 3]))
def test_upper_bounds_match_reference(seed, n_docs, n_terms, block_size, n_threads):
    rng = np.random.default_rng(seed)
    c = make_corpus(rng, n_docs, n_terms, 0.7)
    got = K.bm25_upper_bounds(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"],
                              block_size=block_size, n_threads=n_threads)
    ref = bm25_upper_bounds_ref(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], block_size)
    assert [a.dtype for a in got] == [np.float32, np.uint64, np.float32]
    assert_same(got, ref)


@pytest.mark.parametrize("seed", range(3))
def test_bm25_impacts_equal_the_float32_formula(seed):
    """impacts[p] == float32(tf) / (float32(tf) + doc_norm[d]), evaluated here in numpy float32."""
    rng = np.random.default_rng(seed)
    c = make_corpus(rng, 300, 40, 0.1, ties=bool(seed % 2))
    imp = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], n_threads=2)
    tf = c["tfs"].astype(np.float32)
    want = tf / (tf + c["doc_norm"][c["doc_ids"]])
    assert imp.dtype == np.float32 and imp.shape == c["doc_ids"].shape
    np.testing.assert_array_equal(imp, want)
    with pytest.raises(ValueError, match="impacts"):
        run_bm25(c, make_queries(rng, 40, 3, 4), 5, "exhaustive", impacts=imp[:-1])


def test_upper_bounds_reject_bad_doc_norm():
    rng = np.random.default_rng(0)
    c = make_corpus(rng, 10, 3, 0.5)
    for bad in (-1.0, np.nan, np.inf):
        dn = c["doc_norm"].copy()
        dn[4] = bad
        with pytest.raises(ValueError, match=r"doc_norm\[4\]"):
            K.bm25_upper_bounds(c["offsets"], c["doc_ids"], c["tfs"], dn)
    with pytest.raises(ValueError, match="block_size"):
        K.bm25_upper_bounds(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], block_size=0)


# ---------------------------------------------------------------------------
# Impacts
# ---------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_docs=st.integers(1, 60), n_terms=st.integers(0, 10),
       ties=st.booleans(), negative=st.booleans(), nq=st.integers(0, 5),
       k_extra=st.integers(0, 70),
       allow_mode=st.sampled_from(["none", "all", "nothing", "random"]))
def test_impact_matches_reference(seed, n_docs, n_terms, ties, negative, nq, k_extra, allow_mode):
    rng = np.random.default_rng(seed)
    c = make_corpus(rng, n_docs, n_terms, 0.5, ties)
    if ties:
        impacts = rng.choice(np.array([0.0, 0.25, 1.0, 3.0], np.float32), size=len(c["doc_ids"]))
    else:
        impacts = rng.uniform(0.0, 5.0, size=len(c["doc_ids"])).astype(np.float32)
    if negative:
        impacts = np.where(rng.random(len(impacts)) < 0.3, -impacts, impacts)
    impacts = impacts.astype(np.float32)
    q = make_queries(rng, n_terms, nq, 6, ties=ties, negative=negative)
    k = 1 + k_extra % (n_docs + 5)
    allow = make_allow(rng, n_docs, allow_mode)
    ref = impact_topk_ref(c["offsets"], c["doc_ids"], impacts, *q, k, allow, n_docs=n_docs)
    ref64 = impact_topk_ref(c["offsets"], c["doc_ids"], impacts, *q, k, allow, n_docs=n_docs,
                            exact=False)
    first = None
    for n_threads in (1, 4):
        got = K.impact_topk(c["offsets"], c["doc_ids"], impacts, *q, k, n_threads=n_threads,
                            allow=allow)
        assert_same(got, ref)
        if first is None:
            first = got
            # float32 sums vs the float64 oracle: with negative contributions the sum can cancel to
            # near zero, so the absolute error bound scales with the summed magnitudes (n terms x
            # max |impact| x max |weight| x float32 epsilon), not with the result.
            q_len = int(np.diff(q[0].astype(np.int64)).max()) if nq else 0
            magnitude = (float(np.abs(impacts).max()) if len(impacts) else 0.0) * \
                (float(np.abs(q[2]).max()) if len(q[2]) else 0.0) * max(q_len, 1)
            assert_topk_close(*got, *ref64, abs_tol=max(1e-6, 4 * float(np.finfo(np.float32).eps) * magnitude))


def test_impact_allow_shorter_than_doc_ids_raises():
    offsets = np.array([0, 2], np.uint64)
    doc_ids = np.array([1, 9], np.uint32)
    impacts = np.ones(2, np.float32)
    q = (np.array([0, 1], np.uint64), np.array([0], np.uint32), np.ones(1, np.float32))
    ids, scores, n_found = K.impact_topk(offsets, doc_ids, impacts, *q, 3)
    assert ids[0].tolist() == [1, 9, -1]
    with pytest.raises(ValueError, match="allow"):
        K.impact_topk(offsets, doc_ids, impacts, *q, 3, allow=np.ones(5, np.uint8))


# ---------------------------------------------------------------------------
# CSR validation
# ---------------------------------------------------------------------------


def test_check_csr():
    offsets = np.array([0, 2, 2, 5], np.uint64)
    doc_ids = np.array([0, 4, 1, 2, 3], np.uint32)
    K.check_csr(offsets, doc_ids, 5)
    check_csr_ref(offsets, doc_ids, 5)
    K.check_csr(np.zeros(1, np.uint64), np.zeros(0, np.uint32), 0)
    cases = [
        (np.array([1, 2, 2, 5], np.uint64), doc_ids, 5, r"offsets\[0\]"),
        (np.array([0, 3, 2, 5], np.uint64), doc_ids, 5, "non-decreasing"),
        (np.array([0, 2, 2, 4], np.uint64), doc_ids, 5, r"offsets\[-1\]"),
        (offsets, np.array([0, 4, 1, 2, 9], np.uint32), 5, "n_docs"),
        (offsets, np.array([0, 4, 2, 2, 3], np.uint32), 5, "strictly increasing"),
        (offsets, np.array([4, 0, 1, 2, 3], np.uint32), 5, "strictly increasing"),
        (offsets, doc_ids, 4, "n_docs"),
    ]
    for off, docs, n_docs, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            K.check_csr(off, docs, n_docs)
        with pytest.raises(ValueError):
            check_csr_ref(off, docs, n_docs)
    with pytest.raises(ValueError, match="n_docs"):
        K.check_csr(offsets, doc_ids, -1)
    with pytest.raises(TypeError):
        K.check_csr(offsets.astype(np.int64), doc_ids, 5)


# ---------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(7)
    c = make_corpus(rng, 30, 6, 0.5)
    q = make_queries(rng, 6, 3, 4, repeats=False)
    bounds = bounds_for(c, 4)
    return c, q, bounds


def call(small, **over):
    c, q, (term_ub, block_offsets, block_ub) = small
    args = dict(offsets=c["offsets"], doc_ids=c["doc_ids"], tfs=c["tfs"], doc_norm=c["doc_norm"],
                q_offsets=q[0], q_terms=q[1], q_weights=q[2], k=5, algorithm="bmw",
                term_ub=term_ub, block_offsets=block_offsets, block_ub=block_ub, block_size=4)
    args.update(over)
    return K.bm25_topk(**args)


@pytest.mark.parametrize("name,dtype", [
    ("offsets", np.int64), ("doc_ids", np.int32), ("doc_ids", np.uint64), ("tfs", np.uint16),
    ("tfs", np.float32), ("doc_norm", np.float64), ("q_offsets", np.int64),
    ("q_terms", np.int64), ("q_weights", np.float64), ("allow", np.bool_), ("allow", np.int8),
    ("term_ub", np.float64), ("block_offsets", np.int64), ("block_ub", np.float64),
])
def test_wrong_dtype_is_type_error(small, name, dtype):
    c, q, b = small
    base = dict(offsets=c["offsets"], doc_ids=c["doc_ids"], tfs=c["tfs"], doc_norm=c["doc_norm"],
                q_offsets=q[0], q_terms=q[1], q_weights=q[2], allow=np.ones(30, np.uint8),
                term_ub=b[0], block_offsets=b[1], block_ub=b[2])
    with pytest.raises(TypeError):
        call(small, **{name: base[name].astype(dtype)})


def test_non_contiguous_and_lists_are_type_errors(small):
    c, q, b = small
    with pytest.raises(TypeError):
        call(small, doc_norm=np.repeat(c["doc_norm"], 2)[::2])
    with pytest.raises(TypeError):
        call(small, q_terms=q[1].tolist())


def test_read_only_inputs_are_accepted(small):
    c, q, b = small
    ro = {}
    for name, arr in [("offsets", c["offsets"]), ("doc_ids", c["doc_ids"]), ("tfs", c["tfs"]),
                      ("doc_norm", c["doc_norm"])]:
        a = arr.copy()
        a.setflags(write=False)
        ro[name] = a
    assert_same(call(small, **ro), call(small))


@pytest.mark.parametrize("k", [0, -3])
def test_bad_k(small, k):
    with pytest.raises(ValueError, match="k must be >= 1"):
        call(small, k=k)
    c, q, _ = small
    with pytest.raises(ValueError, match="k must be >= 1"):
        K.impact_topk(c["offsets"], c["doc_ids"], np.ones(len(c["doc_ids"]), np.float32), *q, k)


def test_q_terms_out_of_range(small):
    c, q, _ = small
    terms = q[1].copy()
    terms[-1] = 6
    with pytest.raises(ValueError, match=r"q_terms\[\d+\] = 6"):
        call(small, q_terms=terms)
    impacts = np.ones(len(c["doc_ids"]), np.float32)
    with pytest.raises(ValueError, match=r"= 6"):
        K.impact_topk(c["offsets"], c["doc_ids"], impacts, q[0], terms, q[2], 3)


def test_mismatched_lengths(small):
    c, q, b = small
    with pytest.raises(ValueError, match="len\\(tfs\\)"):
        call(small, tfs=c["tfs"][:-1].copy())
    with pytest.raises(ValueError, match="offsets\\[-1\\]"):
        call(small, doc_ids=c["doc_ids"][:-1].copy())
    with pytest.raises(ValueError, match="len\\(q_weights\\)"):
        call(small, q_weights=q[2][:-1].copy())
    with pytest.raises(ValueError, match="q_offsets\\[-1\\]"):
        call(small, q_offsets=np.array([0, 1], np.uint64))
    with pytest.raises(ValueError, match="q_offsets\\[0\\]"):
        call(small, q_offsets=np.array([1, len(q[1])], np.uint64))
    bad = q[0].copy()
    bad[1], bad[2] = bad[2] + 1, bad[1]
    if bad[1] > bad[2]:
        with pytest.raises(ValueError, match="non-decreasing"):
            call(small, q_offsets=bad)
    with pytest.raises(ValueError, match="len\\(allow\\)"):
        call(small, allow=np.ones(29, np.uint8))
    with pytest.raises(ValueError, match="len\\(term_ub\\)"):
        call(small, term_ub=b[0][:-1].copy())
    with pytest.raises(ValueError, match="len\\(block_offsets\\)"):
        call(small, block_offsets=b[1][:-1].copy())
    with pytest.raises(ValueError, match="block_offsets\\[-1\\]"):
        call(small, block_ub=b[2][:-1].copy())
    with pytest.raises(ValueError, match="block_offsets"):
        call(small, block_size=8)  # bounds were built with block_size 4
    with pytest.raises(ValueError, match="1-dimensional"):
        call(small, doc_norm=c["doc_norm"].reshape(-1, 1))
    with pytest.raises(ValueError, match="len\\(impacts\\)"):
        K.impact_topk(c["offsets"], c["doc_ids"], np.ones(2, np.float32), *q, 3)


def test_bad_algorithm_bounds_and_weights(small):
    c, q, b = small
    with pytest.raises(ValueError, match="algorithm"):
        call(small, algorithm="wand2")
    for algorithm in PRUNING:
        with pytest.raises(ValueError, match="term_ub"):
            call(small, algorithm=algorithm, term_ub=None)
    for algorithm in ("bmw", "bmm"):
        with pytest.raises(ValueError, match="block_offsets"):
            call(small, algorithm=algorithm, block_ub=None)
    # maxscore needs only term_ub; exhaustive needs nothing
    assert_same(call(small, algorithm="maxscore", block_offsets=None, block_ub=None),
                call(small, algorithm="exhaustive", term_ub=None, block_offsets=None,
                     block_ub=None))
    bad_ub = b[0].copy()
    bad_ub[q[1][0]] = np.nan
    with pytest.raises(ValueError, match="term_ub"):
        call(small, term_ub=bad_ub)
    w = q[2].copy()
    w[0] = np.inf
    with pytest.raises(ValueError, match=r"q_weights\[0\]"):
        call(small, q_weights=w)


# ---------------------------------------------------------------------------
# Threads and the GIL
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big():
    rng = np.random.default_rng(11)
    c = make_corpus(rng, 60000, 40, density=0.5, zipf=True)
    return c, bounds_for(c, 128)


def test_thread_pool_matches_serial(big):
    c, bounds = big
    rng = np.random.default_rng(12)
    batches = [make_queries(rng, 40, 20, 5, repeats=False) for _ in range(8)]
    jobs = [(q, alg) for q in batches for alg in ALGORITHMS]
    serial = [run_bm25(c, q, 10, alg, 1, None, bounds) for q, alg in jobs]
    with ThreadPoolExecutor(max_workers=4) as ex:
        par = list(ex.map(lambda j: run_bm25(c, j[0], 10, j[1], 2, None, bounds), jobs))
    for a, b in zip(serial, par):
        assert_same(a, b)


def test_gil_is_released(big):
    c, bounds = big
    rng = np.random.default_rng(13)
    q = make_queries(rng, 40, 64, 5, repeats=False)
    while True:  # grow the batch until one call takes >= 0.2 s
        t0 = time.perf_counter()
        run_bm25(c, q, 10, "exhaustive", 1)
        elapsed = time.perf_counter() - t0
        if elapsed >= 0.2:
            break
        q = (np.concatenate([q[0], q[0][1:] + q[0][-1]]), np.concatenate([q[1], q[1]]),
             np.concatenate([q[2], q[2]]))
    worker = threading.Thread(target=run_bm25, args=(c, q, 10, "exhaustive", 1))
    last = time.perf_counter()
    max_gap = 0.0
    worker.start()
    while worker.is_alive():
        now = time.perf_counter()
        max_gap = max(max_gap, now - last)
        last = now
    worker.join()
    # With the GIL held for the whole call this thread would stall for ~elapsed.
    assert max_gap < 0.5 * elapsed, (max_gap, elapsed)


def test_worker_exception_reaches_caller():
    # doc id >= n_docs (what check_csr would reject) must raise, not crash,
    # from any worker thread.
    offsets = np.array([0, 3], np.uint64)
    doc_ids = np.array([0, 1, 7], np.uint32)
    tfs = np.ones(3, np.uint32)
    doc_norm = np.ones(4, np.float32)
    q = (np.arange(9, dtype=np.uint64), np.zeros(8, np.uint32), np.ones(8, np.float32))
    with pytest.raises(ValueError, match="doc id 7"):
        K.bm25_topk(offsets, doc_ids, tfs, doc_norm, *q, 2, n_threads=4, algorithm="exhaustive")
    with pytest.raises(ValueError, match="doc_ids"):
        K.bm25_upper_bounds(offsets, doc_ids, tfs, doc_norm)


def test_pooled_accumulators_clean_after_a_throw():
    # A kernel call that throws half-way (bad doc id in the dense scan) must not hand a dirty
    # pooled accumulator to later calls: they score from zero (regression: scores of a later,
    # valid call on a larger collection came out shifted).
    bad = (np.array([0, 4], np.uint64), np.array([0, 1, 2, 9], np.uint32), np.ones(4, np.uint32),
           np.ones(4, np.float32))
    q = (np.arange(17, dtype=np.uint64), np.zeros(16, np.uint32), np.ones(16, np.float32))
    for _ in range(4):
        with pytest.raises(ValueError, match="doc id 9"):
            K.bm25_topk(*bad, *q, 2, n_threads=2, algorithm="exhaustive")
    rng = np.random.default_rng(5)
    c = make_corpus(rng, 40, 6)
    qs = make_queries(rng, 6, 32, 4)
    ref = bm25_topk_ref(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *qs, 10, None)
    for _ in range(3):
        assert_same(run_bm25(c, qs, 10, "exhaustive", n_threads=2), ref)


# ---------------------------------------------------------------------------
# Safe initial threshold (bm25_term_kth / term_kth)
# ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_docs=st.integers(1, 300), n_terms=st.integers(1, 10),
       ties=st.booleans(), depth=st.integers(1, 80), block_size=st.sampled_from([1, 3, 8, 128]))
def test_term_kth_matches_reference(seed, n_docs, n_terms, ties, depth, block_size):
    rng = np.random.default_rng(seed)
    c = make_corpus(rng, n_docs, n_terms, 0.7, ties)
    ref = term_kth_ref(c, depth)
    impacts = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    bounds = bounds_for(c, block_size)
    for imp, bnd in itertools.product((None, impacts), (None, bounds)):
        got = term_kth_for(c, depth, imp, bnd, block_size)
        assert got.dtype == np.float32 and got.shape == ref.shape
        np.testing.assert_array_equal(got, ref)  # -inf where the list is shorter than depth
    # a subset of terms, repeated and out of order
    terms = rng.integers(0, n_terms, size=7).astype(np.uint32)
    got = K.bm25_term_kth(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], terms, depth,
                          n_threads=2)
    np.testing.assert_array_equal(got, ref[terms])


def test_term_kth_nan_and_negative_impacts_give_no_bound():
    c = dict(offsets=np.array([0, 3, 6], np.uint64), doc_ids=np.array([0, 1, 2, 0, 1, 2], np.uint32),
             tfs=np.ones(6, np.uint32), doc_norm=np.ones(3, np.float32))
    imp = np.array([0.5, np.nan, 0.5, 0.5, -0.25, 0.5], np.float32)
    got = K.bm25_term_kth(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"],
                          np.array([0, 1], np.uint32), 1, impacts=imp)
    assert np.isneginf(got).all()


def test_term_kth_checks_its_arguments():
    c = dict(offsets=np.array([0, 2], np.uint64), doc_ids=np.array([0, 1], np.uint32),
             tfs=np.ones(2, np.uint32), doc_norm=np.ones(2, np.float32))
    args = (c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    with pytest.raises(ValueError, match="depth"):
        K.bm25_term_kth(*args, np.array([0], np.uint32), 0)
    with pytest.raises(ValueError, match=r"terms\[1\] = 5"):
        K.bm25_term_kth(*args, np.array([0, 5], np.uint32), 1)
    ub, bo, bu = bounds_for(c, 1)
    with pytest.raises(ValueError, match="together"):
        K.bm25_term_kth(*args, np.array([0], np.uint32), 1, block_offsets=bo)
    with pytest.raises(ValueError, match="block_offsets"):  # layout of another block size
        K.bm25_term_kth(*args, np.array([0], np.uint32), 1, block_offsets=bo, block_ub=bu,
                        block_size=128)
    with pytest.raises(ValueError, match="impacts"):
        K.bm25_term_kth(*args, np.array([0], np.uint32), 1, impacts=np.ones(3, np.float32))


def test_bm25_term_kth_argument_checks():
    c = dict(offsets=np.array([0, 3], np.uint64), doc_ids=np.array([0, 1, 2], np.uint32),
             tfs=np.array([1, 2, 3], np.uint32), doc_norm=np.ones(3, np.float32))
    ub, bo, bu = bounds_for(c, 128)
    q = (np.array([0, 1], np.uint64), np.array([0], np.uint32), np.array([1.0], np.float32))
    base = (c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, 2)
    kth = term_kth_for(c, 2)
    with pytest.raises(ValueError, match="term_kth_depth = 3 must equal k = 2"):
        K.bm25_topk(*base, algorithm="maxscore", term_ub=ub, term_kth=kth, term_kth_depth=3)
    with pytest.raises(ValueError, match="len\\(term_kth\\)"):
        K.bm25_topk(*base, algorithm="maxscore", term_ub=ub, term_kth=np.zeros(2, np.float32),
                    term_kth_depth=2)
    for bad in (np.nan, -0.5, float(ub[0]) * 2):
        with pytest.raises(ValueError, match=r"term_kth\[0\]"):
            K.bm25_topk(*base, algorithm="maxscore", term_ub=ub,
                        term_kth=np.array([bad], np.float32), term_kth_depth=2)


@pytest.mark.parametrize("algorithm", PRUNING)
def test_bm25_initial_threshold_equal_to_the_kth_score(algorithm):
    """All postings of a term score the same, so the initial threshold IS the final k-th score:
    documents scoring exactly the threshold must still enter, smallest ids first."""
    n_docs = 5000
    rng = np.random.default_rng(7)
    common = np.arange(0, n_docs, 2, dtype=np.uint32)      # every even doc, tf 1
    rare = np.sort(rng.choice(n_docs, 40, replace=False)).astype(np.uint32)
    c = dict(offsets=np.array([0, len(common), len(common) + len(rare)], np.uint64),
             doc_ids=np.concatenate([common, rare]), tfs=np.ones(len(common) + len(rare), np.uint32),
             doc_norm=np.ones(n_docs, np.float32))
    for terms, weights in [([0], [1.0]), ([0, 1], [1.0, 0.0]), ([1, 0], [0.0, 2.0]), ([0, 1], [1.0, 1.0])]:
        q = (np.array([0, len(terms)], np.uint64), np.array(terms, np.uint32),
             np.array(weights, np.float32))
        for k in (1, 10, 100, 2499, 2500, 2501, 6000):
            ref = run_bm25(c, q, k, "exhaustive")
            bounds = bounds_for(c, 16)
            kth = term_kth_for(c, k)
            got = run_bm25(c, q, k, algorithm, bounds=bounds, block_size=16, term_kth=kth)
            assert_same(got, ref)


@pytest.mark.parametrize("seed", [0, 1])
def test_bm25_initial_threshold_on_window_path(seed):
    """A collection big enough for the window-at-a-time MaxScore (many windows, tie-heavy
    scores), with the initial threshold, k larger than most lists and an allow filter."""
    rng = np.random.default_rng(300 + seed)
    n_docs = 70000
    c = make_corpus(rng, n_docs, 40, density=0.5, ties=True, zipf=True)
    q = make_queries(rng, 40, 30, 8, ties=True)
    for k, allow_mode in [(10, "none"), (1000, "none"), (10, "random")]:
        allow = make_allow(rng, n_docs, allow_mode)
        check_all_bm25(c, q, k, allow, 128, threads=(1, 2), algorithms=("exhaustive", "maxscore", "auto"))


# ---------------------------------------------------------------------------
# Stubs
# ---------------------------------------------------------------------------


def test_stub_matches_extension():
    """Every kernel typed in retriever/_kernels.pyi exists with the same parameters."""
    stub = pathlib.Path(__file__).resolve().parents[1] / "retriever" / "_kernels.pyi"
    tree = ast.parse(stub.read_text())
    funcs = {n.name: n for n in tree.body
             if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    assert {"check_csr", "bm25_upper_bounds", "bm25_topk", "impact_topk"} <= set(funcs)
    # every kernel is typed, the learned-sparse ones included, and nothing falls back to __getattr__
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")}
    public = {n for n in dir(K) if not n.startswith("_") and callable(getattr(K, n))}
    assert public == set(funcs) | set(classes), public ^ (set(funcs) | set(classes))
    for cname, cnode in classes.items():  # a class's typed methods exist with the same parameters
        assert ast.get_docstring(cnode)
        for m in cnode.body:
            if isinstance(m, ast.FunctionDef) and not m.name.startswith("_") and not m.decorator_list:
                first = getattr(getattr(K, cname), m.name).__doc__.splitlines()[0]
                runtime = re.findall(r"(\w+):", first[first.index("(") + 1 : first.rindex(")")])
                runtime = [r for r in runtime if r not in ("numpy", "typing")]
                assert [a.arg for a in m.args.args] == runtime, (cname, m.name)
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)
    for name, node in funcs.items():
        first = getattr(K, name).__doc__.splitlines()[0]
        runtime = re.findall(r"(\w+):", first[first.index("(") + 1 : first.rindex(")")])
        runtime = [r for r in runtime if r not in ("numpy", "typing")]
        assert [a.arg for a in node.args.args] == runtime, name
        assert ast.get_docstring(node)


# ---------------------------------------------------------------------------
# Dense re-scoring (funnel search)
# ---------------------------------------------------------------------------


def _rescore_ref(q, x, cand, k, base):
    """float64 oracle: exact scores of each row's candidates, sorted (score desc, id asc)."""
    ids, scores, found = [], [], []
    for qi, row in zip(q.astype(np.float64), cand):
        c = row[row >= 0]
        s = (x[c].astype(np.float64) @ qi).astype(np.float32)
        order = np.lexsort((c, -s.astype(np.float64)))[:k]
        pad = k - len(order)
        ids.append(np.r_[c[order] + base, -np.ones(pad, np.int64)])
        scores.append(np.r_[s[order], np.full(pad, -np.inf, np.float32)])
        found.append(len(order))
    return np.array(ids), np.array(scores, np.float32), np.array(found)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("d", [1, 7, 64, 384])
def test_rescore_topk_matches_float64_oracle(dtype, d):
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((500, d)) / np.sqrt(d)).astype(dtype)
    x[3] = 0
    x[4] = np.float16(3e-6)  # float16 subnormals
    q = rng.standard_normal((40, d)).astype(np.float32)
    cand = np.stack([rng.permutation(500)[:60] for _ in range(40)]).astype(np.int64)
    cand[:, 0] = 3
    cand[5, 20:] = -1
    cand[6, :] = -1
    cand[7, :] = np.r_[np.full(55, -1), [4, 3, 9, 8, 1]]  # ties at 0 and fewer than k
    ids, scores, found = K.rescore_topk(q, x, cand, 10, 1000, 1)
    r_ids, r_scores, r_found = _rescore_ref(q, x, cand, 10, 1000)
    np.testing.assert_array_equal(found, r_found)
    np.testing.assert_allclose(scores, r_scores, rtol=2e-7, atol=1e-7)
    np.testing.assert_array_equal(ids, r_ids)
    for nt in (2, 3):
        b = K.rescore_topk(q, x, cand, 10, 1000, nt)
        np.testing.assert_array_equal(b[0], ids)
        np.testing.assert_array_equal(b[1], scores)
    for i in (0, 5, 39):  # one query alone: bit-identical to its row in the batch
        one = K.rescore_topk(q[i:i + 1].copy(), x, cand[i:i + 1].copy(), 10, 1000, 1)
        np.testing.assert_array_equal(one[1][0], scores[i])
        np.testing.assert_array_equal(one[0][0], ids[i])


@pytest.mark.skipif(not K.rescore_has_avx512(), reason="no AVX-512F on this CPU")
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_rescore_topk_avx512_path_is_bit_identical_to_portable(dtype):
    # every d % 8 tail, groups of 4 candidates cut by -1 entries, zero / -0.0 queries, subnormals,
    # wide dynamic range (float32 products that float32 accumulation would round)
    rng = np.random.default_rng(7)
    for d in (1, 3, 7, 8, 9, 15, 16, 17, 63, 100, 384, 385):
        x = (rng.standard_normal((300, d)) * np.exp(rng.uniform(-6, 6, (300, 1)))).astype(dtype)
        x[3] = 0
        if dtype == np.float16:
            x[4] = np.float16(3e-6)
        q = (rng.standard_normal((30, d)) * np.exp(rng.uniform(-20, 20, (30, 1)))).astype(np.float32)
        q[1] = 0
        q[2] = -0.0
        cand = np.stack([rng.permutation(300)[:37] for _ in range(30)]).astype(np.int64)
        cand[5, 20:] = -1
        cand[6] = -1
        cand[7, ::3] = -1
        cand[8, :] = 3
        a = K.rescore_topk(q, x, cand, 13, 5, 1, "portable")
        b = K.rescore_topk(q, x, cand, 13, 5, 1, "avx512")
        c = K.rescore_topk(q, x, cand, 13, 5, 2)  # auto: the AVX-512 path here
        for u, v, w in zip(a, b, c):
            np.testing.assert_array_equal(u, v, err_msg=f"d={d}")
            np.testing.assert_array_equal(u, w, err_msg=f"d={d}")
        # and both are the float64 oracle of the documented lane order, bit for bit
        lanes = np.zeros((30, 37, 8))
        xf = x.astype(np.float64)
        for t in range(d):
            lanes[:, :, t % 8] += q[:, None, t].astype(np.float64) * xf[np.maximum(cand, 0), t]
        ref = (((lanes[..., 0] + lanes[..., 1]) + (lanes[..., 2] + lanes[..., 3]))
               + ((lanes[..., 4] + lanes[..., 5]) + (lanes[..., 6] + lanes[..., 7]))).astype(np.float32)
        for i in range(30):
            ok = b[0][i] >= 0
            pos = [int(np.flatnonzero(cand[i] == j - 5)[0]) for j in b[0][i][ok]]
            np.testing.assert_array_equal(b[1][i][ok], ref[i, pos], err_msg=f"d={d} query {i}")


def test_rescore_topk_impl_argument():
    x = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="impl"):
        K.rescore_topk(np.ones((1, 8), np.float32), x, np.zeros((1, 2), np.int64), 1, 0, 1, "fast")


def test_rescore_topk_checks_its_arguments():
    x = np.ones((10, 4), np.float32)
    q = np.ones((2, 4), np.float32)
    for bad in (-2, 10):
        with pytest.raises(ValueError, match="candidates"):
            K.rescore_topk(q, x, np.full((2, 3), bad, np.int64), 5)
    with pytest.raises(ValueError, match="shape"):
        K.rescore_topk(np.ones((2, 5), np.float32), x, np.zeros((2, 3), np.int64), 5)
    with pytest.raises(ValueError, match="k must"):
        K.rescore_topk(q, x, np.zeros((2, 3), np.int64), 0)
    with pytest.raises(TypeError):
        K.rescore_topk(q, x.astype(np.float64), np.zeros((2, 3), np.int64), 5)
    with pytest.raises(TypeError):
        K.rescore_topk(q, np.ones((10, 8), np.float32)[:, ::2], np.zeros((2, 3), np.int64), 5)
    with pytest.raises(ValueError, match="overflows int64"):
        K.rescore_topk(q, x, np.zeros((2, 3), np.int64), 5, base=2**63 - 5)
    for dt in (">f4", ">f2"):  # the right kind and size, the wrong byte order: refused, not misread
        with pytest.raises(TypeError, match="native byte order"):
            K.rescore_topk(q, x.astype(dt), np.zeros((2, 3), np.int64), 5)


def test_heap_push_block_keeps_exact_topk_with_ties():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 40, (6, 1000)).astype(np.float32)  # many ties
    scores[2, :] = 1.0
    for kk in (1, 7, 64, 1000):
        hs = np.full((6, kk), -np.inf, np.float32)
        hi = np.full((6, kk), -1, np.int64)
        for a in range(0, 1000, 300):  # blocks of uneven width
            K.heap_push_block(np.ascontiguousarray(scores[:, a:a + 300]), a, hs, hi, 2)
        for i in range(6):
            order = np.lexsort((np.arange(1000), -scores[i]))[:kk]
            got = np.lexsort((hi[i], -hs[i]))
            np.testing.assert_array_equal(hi[i][got], order)
            np.testing.assert_array_equal(hs[i][got], scores[i][order])
    with pytest.raises(ValueError, match="first_id"):
        K.heap_push_block(scores, -1, hs, hi)
    with pytest.raises(ValueError):
        K.heap_push_block(scores, 0, hs[:2].copy(), hi[:2].copy())


def test_prefix_scan_matches_brute_force():
    from retriever.legs.dense import _prefix_scan

    rng = np.random.default_rng(4)
    x = rng.standard_normal((5000, 24)).astype(np.float32)
    q = rng.standard_normal((300, 24)).astype(np.float32)
    s = q.astype(np.float64) @ x.T.astype(np.float64)
    for kk, bs in ((10, None), (137, 7), (5000, 256)):
        D, I = _prefix_scan(x, q, kk, 1, bs)
        truth = np.argsort(-s, axis=1)[:, :kk]
        for i in range(len(q)):
            assert set(I[i].tolist()) == set(truth[i].tolist())
            np.testing.assert_allclose(np.sort(D[i]), np.sort(s[i, truth[i]]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["portable", "avx512", "auto"])
def test_rescore_topk_drops_nan_scores(impl):
    """A NaN row (or query) has no rank: it is dropped, the rest stays sorted, whatever the
    candidate order (it used to enter the sort and break it)."""
    if impl == "avx512":
        try:
            K.rescore_topk(np.ones((1, 1), np.float32), np.ones((1, 1), np.float32), np.zeros((1, 1), np.int64), 1,
                           0, 1, "avx512")
        except ValueError:
            pytest.skip("no AVX-512 on this CPU")
    q = np.ones((1, 1), np.float32)
    v = np.array([[np.nan], [1], [3], [2]], np.float32)
    for order in ([0, 1, 2, 3], [1, 2, 3, 0], [3, 0, 2, 1]):
        ids, scores, n = K.rescore_topk(q, v, np.array([order], np.int64), 4, 0, 1, impl)
        assert n.tolist() == [3] and ids[0].tolist() == [2, 3, 1, -1]
        assert scores[0, :3].tolist() == [3.0, 2.0, 1.0] and scores[0, 3] == -np.inf
    ids, scores, n = K.rescore_topk(np.full((1, 1), np.nan, np.float32), v, np.array([[0, 1, 2]]), 2, 0, 1, impl)
    assert n.tolist() == [0] and ids[0].tolist() == [-1, -1]


@pytest.mark.parametrize("n_docs", [128, 1607])
def test_bm25_dense_scan_skips_nan_scores(n_docs):
    """Block maxima (8 blocks at a time with AVX2, one at a time for the rest) skip NaN scores:
    with some impacts NaN, the dense exhaustive top-k is the top-k of the documents whose float32
    query-order sum is not NaN (ties by smaller id), as a numpy oracle computes it."""
    rng = np.random.default_rng(77)
    c = make_corpus(rng, n_docs, 12, density=0.9)
    impacts = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    impacts[rng.random(len(impacts)) < 0.2] = np.nan
    impacts[c["offsets"][3]:c["offsets"][4]] = np.nan  # a whole list
    q = make_queries(rng, 12, 30, 6, repeats=False)
    k = 10
    ids, scores, n_found = K.bm25_topk(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, k,
                                       algorithm="exhaustive", impacts=impacts)
    offs = c["offsets"].astype(np.int64)
    for qi in range(len(q[0]) - 1):
        acc = np.zeros(n_docs, np.float32)
        hit = np.zeros(n_docs, bool)
        for t, w in zip(q[1][q[0][qi]:q[0][qi + 1]], q[2][q[0][qi]:q[0][qi + 1]]):
            d = c["doc_ids"][offs[t]:offs[t + 1]]
            acc[d] = acc[d] + np.float32(w) * impacts[offs[t]:offs[t + 1]]
            hit[d] = True
        ok = np.flatnonzero(hit & ~np.isnan(acc))
        order = ok[np.lexsort((ok, -acc[ok].astype(np.float64)))][:k]
        assert n_found[qi] == len(order)
        np.testing.assert_array_equal(ids[qi, :len(order)], order)
        np.testing.assert_array_equal(scores[qi, :len(order)], acc[order])


def _impact_rows_numpy(c, impacts, n_docs, min_df, max_rows):
    """Oracle of bm25_impact_rows: the max_rows longest lists with >= min_df postings (equal
    lengths: smaller term id first), rows in term order."""
    lens = np.diff(c["offsets"].astype(np.int64))
    cand = [t for t in range(len(lens)) if lens[t] >= min_df]
    chosen = sorted(sorted(cand, key=lambda t: (-lens[t], t))[:max_rows])
    slot = np.full(len(lens), -1, np.int32)
    rows = np.zeros((len(chosen), n_docs), np.float32)
    offs = c["offsets"].astype(np.int64)
    for r, t in enumerate(chosen):
        slot[t] = r
        rows[r, c["doc_ids"][offs[t]:offs[t + 1]]] = impacts[offs[t]:offs[t + 1]]
    return slot, rows.reshape(-1)


@pytest.mark.parametrize("min_df,max_rows", [(1, 0), (1, 3), (50, 100), (200, 5), (10**6, 5)])
def test_impact_rows_match_numpy(min_df, max_rows):
    """bm25_impact_rows: which lists get a row (the longest reaching min_df, at most max_rows,
    equal lengths by smaller term id) and each row's content (the list's impacts at its doc
    ids, 0 elsewhere), against a numpy oracle."""
    rng = np.random.default_rng(min_df + max_rows)
    n_docs = 701
    c = make_corpus(rng, n_docs, 40, density=0.6, zipf=True)
    impacts = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    slot, rows = K.bm25_impact_rows(c["offsets"], c["doc_ids"], impacts, n_docs, min_df, max_rows)
    want_slot, want_rows = _impact_rows_numpy(c, impacts, n_docs, min_df, max_rows)
    np.testing.assert_array_equal(slot, want_slot)
    np.testing.assert_array_equal(rows, want_rows)
    assert rows.dtype == np.float32 and slot.dtype == np.int32


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("weights", ["positive", "ties", "negative", "huge"])
def test_bm25_impact_rows_give_identical_results(seed, weights):
    """Exhaustive scoring with dense impact rows for the long lists equals the same call without
    them bit for bit (ids, scores, n_found) and the float32 oracle, for every scatter this CPU
    runs, with and without an allow filter, k from 1 to past the collection, 1 and 3 threads;
    huge weights (+-3e38: products overflow to +-inf, sums to inf or NaN) too: a document
    without the term adds weight * 0 = 0 and keeps its score."""
    rng = np.random.default_rng(40 + seed)
    n_docs = (1607, 333)[seed]
    c = make_corpus(rng, n_docs, 30, density=0.9, ties=(weights == "ties"), zipf=True)
    q = make_queries(rng, 30, 40, 8, ties=(weights == "ties"), negative=(weights == "negative"))
    q_w = q[2].copy()
    if weights == "huge":
        q_w[rng.random(len(q_w)) < 0.3] = np.float32(3e38)
        q_w[rng.random(len(q_w)) < 0.1] = np.float32(-3e38)
    q = (q[0], q[1], q_w)
    impacts = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    slot, rows = K.bm25_impact_rows(c["offsets"], c["doc_ids"], impacts, n_docs, max(1, n_docs // 4), 1000)
    assert len(rows) >= 3 * n_docs  # several lists get a row
    for k, allow_mode in [(1, "none"), (10, "none"), (10, "random"), (64, "all"), (n_docs + 5, "none")]:
        allow = make_allow(rng, n_docs, allow_mode)
        ref = bm25_topk_ref(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, k, allow) \
            if weights != "huge" else None
        for impl in SCATTER_IMPLS:
            for n_threads in (1, 3):
                plain = run_bm25(c, q, k, "exhaustive", n_threads, allow=allow, impacts=impacts, impl=impl)
                got = K.bm25_topk(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, k,
                                  n_threads=n_threads, allow=allow, algorithm="exhaustive",
                                  impacts=impacts, impact_rows=rows, impact_row_slot=slot, impl=impl)
                assert_same(got, plain)
                if ref is not None:
                    assert_same(got, ref)


def test_impact_rows_argument_checks():
    """Malformed impact rows are refused with the offending length or slot named, never read
    out of bounds; bm25_impact_rows checks its own inputs."""
    rng = np.random.default_rng(5)
    n_docs = 50
    c = make_corpus(rng, n_docs, 6, density=0.9)
    impacts = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    slot, rows = K.bm25_impact_rows(c["offsets"], c["doc_ids"], impacts, n_docs, 1, 2)
    q = (np.array([0, 6], np.uint64), np.arange(6, dtype=np.uint32), np.ones(6, np.float32))

    def call(**kw):
        return K.bm25_topk(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, 3,
                           algorithm="exhaustive", **kw)

    with pytest.raises(ValueError, match="go together"):
        call(impacts=impacts, impact_rows=rows)
    with pytest.raises(ValueError, match="go together"):
        call(impact_rows=rows, impact_row_slot=slot)  # without impacts
    with pytest.raises(ValueError, match="len\\(impact_row_slot\\)"):
        call(impacts=impacts, impact_rows=rows, impact_row_slot=slot[:-1])
    with pytest.raises(ValueError, match="not a multiple of n_docs"):
        call(impacts=impacts, impact_rows=rows[:-1], impact_row_slot=slot)
    for value in (7, -2, -2**31):
        for at in (int(np.flatnonzero(slot >= 0)[0]), int(np.flatnonzero(slot < 0)[0])):
            bad = slot.copy()
            bad[at] = value
            for algorithm in ("exhaustive", "maxscore"):  # checked up front, whichever path runs
                with pytest.raises(ValueError, match=f"impact_row_slot\\[{at}\\] = {value} is neither -1 nor one "
                                                     "of the 2 rows"):
                    K.bm25_topk(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, 3, algorithm=algorithm,
                                term_ub=bounds_for(c, 128)[0], impacts=impacts, impact_rows=rows,
                                impact_row_slot=bad)
    assert_same(call(impacts=impacts, impact_rows=rows, impact_row_slot=slot), call(impacts=impacts))
    with pytest.raises(ValueError, match="min_df must be >= 1"):
        K.bm25_impact_rows(c["offsets"], c["doc_ids"], impacts, n_docs, 0, 2)
    with pytest.raises(ValueError, match="max_rows must be >= 0"):
        K.bm25_impact_rows(c["offsets"], c["doc_ids"], impacts, n_docs, 1, -1)
    with pytest.raises(ValueError, match="len\\(impacts\\)"):
        K.bm25_impact_rows(c["offsets"], c["doc_ids"], impacts[:-1], n_docs, 1, 2)
    with pytest.raises(ValueError, match=">= n_docs"):
        K.bm25_impact_rows(c["offsets"], c["doc_ids"], impacts, 10, 1, 2)


_FORK_SCRIPT = r"""
import os, sys, time, threading
import numpy as np
from retriever import _kernels as K
rng = np.random.default_rng(0)
n_docs, n_terms = 1000, 50
offsets = np.arange(0, n_terms * 100 + 1, 100, dtype=np.uint64)
doc_ids = np.concatenate([np.sort(rng.choice(n_docs, 100, replace=False)) for _ in range(n_terms)]).astype(np.uint32)
tfs, norm = np.ones(len(doc_ids), np.uint32), np.ones(n_docs, np.float32)
q_off = np.arange(0, 129, 2, dtype=np.uint64)
q_terms, q_w = (np.arange(128) % n_terms).astype(np.uint32), np.ones(128, np.float32)
call = lambda nt: K.bm25_topk(offsets, doc_ids, tfs, norm, q_off, q_terms, q_w, 10, n_threads=nt,
                              algorithm="exhaustive")
want = call(1)
stop = False
def busy():  # another thread keeps the pool (and its lock) busy while the main thread forks
    while not stop:
        call(2)
call(2)
time.sleep(0.05)  # the pool's helper is asleep in its condition variable
th = threading.Thread(target=busy)
th.start()
pids = []
for i in range(8):
    pid = os.fork()
    if pid == 0:
        for nt in (3, 2, 4, 1):
            got = call(nt)
            ok = all((a == b).all() for a, b in zip(got, want))
            if not ok:
                os._exit(3)
            time.sleep(0.002)
        os._exit(0)
    pids.append(pid)
stop = True
th.join()
deadline = time.time() + 60
codes = {}
while len(codes) < len(pids) and time.time() < deadline:
    for pid in pids:
        if pid not in codes:
            p, st = os.waitpid(pid, os.WNOHANG)
            if p:
                codes[pid] = os.waitstatus_to_exitcode(st)
    time.sleep(0.01)
for pid in pids:
    if pid not in codes:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
print("exit codes", sorted(codes.values()), "hung", len(pids) - len(codes))
"""


def test_worker_pool_after_fork():
    """Kernels called in a forked child (after the parent's pool threads exist, one of them asleep,
    and while another parent thread is using the pool) finish with the right results on any
    thread count: the child gets a fresh pool (the parent's threads, lock and queue are gone)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True, timeout=120,
                         cwd=pathlib.Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert "exit codes [0, 0, 0, 0, 0, 0, 0, 0] hung 0" in out.stdout, out.stdout + out.stderr


# ---------------------------------------------------------------------------
# bm25_score_docs: exact scores of given documents (full-score fusion)
# ---------------------------------------------------------------------------


def _score_docs_ref(c, q, cand_offsets, cand_docs, impacts=None):
    """Expected scores: bm25_topk (exhaustive, k past n_docs: every matching document) of each
    candidate, 0.0 for a candidate no query term matches."""
    n_docs = len(c["doc_norm"])
    kw = {} if impacts is None else {"impacts": impacts}
    ids, scores, n_found = K.bm25_topk(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, n_docs + 1,
                                       n_threads=1, algorithm="exhaustive", **kw)
    want = np.zeros(len(cand_docs), np.float32)
    for i in range(len(q[0]) - 1):
        got = dict(zip(ids[i, :n_found[i]].tolist(), scores[i, :n_found[i]].tolist()))
        for j in range(int(cand_offsets[i]), int(cand_offsets[i + 1])):
            want[j] = got.get(int(cand_docs[j]), 0.0)
    return want


def _random_candidates(rng, nq, n_docs, max_c):
    counts = rng.integers(0, max_c + 1, size=nq) if n_docs else np.zeros(nq, np.int64)
    cand_offsets = np.zeros(nq + 1, np.int64)
    cand_offsets[1:] = np.cumsum(counts)
    cand_docs = rng.integers(0, max(n_docs, 1), size=int(cand_offsets[-1])).astype(np.int64)
    return cand_offsets, cand_docs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n_docs=st.integers(1, 300),
    n_terms=st.integers(0, 12),
    density=st.floats(0.0, 1.0),
    ties=st.booleans(),
    negative=st.booleans(),
    nq=st.integers(0, 6),
    max_len=st.integers(0, 8),
    max_c=st.integers(0, 400),
)
def test_bm25_score_docs_equals_topk_scores(seed, n_docs, n_terms, density, ties, negative, nq, max_len, max_c):
    """Every candidate's score is bit for bit the score bm25_topk reports for it (0.0 when no query term
    matches it), with and without impacts, for candidates in any order with repeats, any thread
    count; and the same as every pruning algorithm's top-k scores."""
    rng = np.random.default_rng(seed)
    c = make_corpus(rng, n_docs, n_terms, density=density, ties=ties, zipf=bool(seed % 2))
    q = make_queries(rng, n_terms, nq, max_len, ties=ties, negative=negative)
    cand_offsets, cand_docs = _random_candidates(rng, nq, n_docs, max_c)
    impacts = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    want = _score_docs_ref(c, q, cand_offsets, cand_docs)
    assert want.view(np.uint32).tolist() == _score_docs_ref(c, q, cand_offsets, cand_docs, impacts).view(
        np.uint32).tolist()
    for imp, n_threads in itertools.product((None, impacts), (1, 3)):
        got = K.bm25_score_docs(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, cand_offsets, cand_docs,
                                n_threads=n_threads, impacts=imp)
        assert got.dtype == np.float32 and got.shape == cand_docs.shape
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # bit-identical, -0.0 included
    if not negative and nq:  # the pruning algorithms report the same scores for their top-k
        k = 7
        bounds = bounds_for(c, 4)
        ids, scores, n_found = run_bm25(c, q, k, "maxscore", bounds=bounds, block_size=4, impacts=impacts)
        top_off = np.concatenate([[0], np.cumsum(n_found)]).astype(np.int64)
        top_docs = np.concatenate([ids[i, :n_found[i]] for i in range(nq)]).astype(np.int64)
        got = K.bm25_score_docs(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, top_off, top_docs)
        np.testing.assert_array_equal(got, np.concatenate([scores[i, :n_found[i]] for i in range(nq)]))


def test_bm25_score_docs_long_lists_and_sparse_candidates():
    """Long lists (interpolated seeks) with few candidates spread over them, and many candidates
    against short lists, on a 200k-document collection: equal to the top-k scores."""
    rng = np.random.default_rng(77)
    n_docs = 200_000
    c = make_corpus(rng, n_docs, 20, density=0.5, zipf=True)
    q = make_queries(rng, 20, 8, 6)
    cand_offsets = np.array([0, 3, 3, 50, 2050, 2060, 2061, 12061, 12070], np.int64)
    cand_docs = rng.integers(0, n_docs, size=int(cand_offsets[-1])).astype(np.int64)
    # a candidate block taken from a query's own top list: matched documents for sure
    ids, _, n_found = run_bm25(c, q, 2000, "exhaustive")
    cand_docs[50:50 + int(n_found[3])] = ids[3, :n_found[3]]
    want = _score_docs_ref(c, q, cand_offsets, cand_docs)
    assert (want != 0).sum() > 1000
    got = K.bm25_score_docs(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, cand_offsets, cand_docs)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_bm25_score_docs_argument_checks():
    """Bad candidates name the offending value; the query and postings checks are bm25_topk's."""
    rng = np.random.default_rng(3)
    c = make_corpus(rng, 30, 5, density=0.5)
    q = (np.array([0, 2, 3], np.uint64), np.array([0, 1, 4], np.uint32), np.ones(3, np.float32))
    base = (c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q)
    ok_off, ok_docs = np.array([0, 2, 3], np.int64), np.array([5, 29, 0], np.int64)
    assert K.bm25_score_docs(*base, ok_off, ok_docs).shape == (3,)
    with pytest.raises(ValueError, match=r"cand_docs\[1\] = 30 is not a document of this shard: n_docs = 30"):
        K.bm25_score_docs(*base, ok_off, np.array([5, 30, 0], np.int64))
    with pytest.raises(ValueError, match=r"cand_docs\[2\] = -1"):
        K.bm25_score_docs(*base, ok_off, np.array([5, 3, -1], np.int64))
    with pytest.raises(ValueError, match=r"len\(cand_offsets\) = 2 must equal len\(q_offsets\) = 3"):
        K.bm25_score_docs(*base, np.array([0, 3], np.int64), ok_docs)
    with pytest.raises(ValueError, match=r"cand_offsets\[-1\] = 2 must equal len\(cand_docs\) = 3"):
        K.bm25_score_docs(*base, np.array([0, 1, 2], np.int64), ok_docs)
    with pytest.raises(ValueError, match="cand_offsets must be non-decreasing"):
        K.bm25_score_docs(*base, np.array([0, 3, 2], np.int64), ok_docs[:2])
    with pytest.raises(ValueError, match=r"cand_offsets\[0\] must be 0"):
        K.bm25_score_docs(*base, np.array([1, 2, 3], np.int64), ok_docs)
    with pytest.raises(ValueError, match=r"q_terms\[2\] = 9"):
        K.bm25_score_docs(*base[:5], np.array([0, 1, 9], np.uint32), q[2], ok_off, ok_docs)
    with pytest.raises(ValueError, match=r"len\(impacts\)"):
        K.bm25_score_docs(*base, ok_off, ok_docs, impacts=np.ones(3, np.float32))
    with pytest.raises(TypeError):
        K.bm25_score_docs(*base, ok_off.astype(np.uint64), ok_docs)
    with pytest.raises(TypeError):
        K.bm25_score_docs(*base, ok_off, ok_docs.astype(np.int32))
