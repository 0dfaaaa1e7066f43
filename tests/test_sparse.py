"""Learned-sparse leg: exact kernel vs scipy brute force, Seismic sanity, validation, index round trip."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from retriever.index.sparse_index import build_sparse_index, impact_scale
from retriever import _kernels
from retriever.legs.sparse import _BLOCK_ARGS, csr_batch
from retriever.index.errors import QueryError


def synthetic(n_docs: int, vocab: int, seed: int, nnz_doc: int = 40, nnz_q: int = 12):
    """Topical random CSR collection: docs and queries share popular terms."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / (np.arange(vocab) + 20.0) ** 1.3
    pop /= pop.sum()

    def rows(n, m, sigma):
        out = []
        for _ in range(n):
            t = np.unique(rng.choice(vocab, size=rng.integers(1, m), p=pop))
            out.append((t, rng.lognormal(-0.8, sigma, len(t)).astype(np.float32)))
        return out
    return rows(n_docs, nnz_doc, 1.2), rows(40, nnz_q, 1.2)


def to_csr(rows, vocab):
    indptr = np.zeros(len(rows) + 1, np.int64)
    indptr[1:] = np.cumsum([len(t) for t, _ in rows])
    terms = np.concatenate([t for t, _ in rows]).astype(np.uint32)
    weights = np.concatenate([w for _, w in rows]).astype(np.float32)
    return indptr, terms, weights


def exact_args(ix):
    return tuple(ix[n] for n in ("offsets", "doc_ids", "impacts", "fwd_offsets", "fwd_terms", "fwd_values"))


def brute_topk(ix, scale, qb, vocab, k):
    """Exact scores from the STORED (dequantised) vectors with scipy; returns per-query score lists."""
    n = len(ix["fwd_offsets"]) - 1
    D = sp.csr_matrix((ix["fwd_values"].astype(np.float64) * scale, ix["fwd_terms"], ix["fwd_offsets"].astype(np.int64)),
                      shape=(n, vocab))
    qo, qt, qw = qb
    Q = sp.csr_matrix((qw.astype(np.float64), qt, qo.astype(np.int64)), shape=(len(qo) - 1, vocab))
    S = (Q @ D.T).toarray()
    return S


def check_topk_matches(ids, scores, n_found, S, k, rtol=1e-5):
    for q in range(S.shape[0]):
        row = S[q]
        pos = np.flatnonzero(row > 0)
        want = min(k, len(pos))
        assert n_found[q] == want
        if want == 0:
            continue
        kth = np.sort(row[pos])[::-1][want - 1]
        got = ids[q, :want]
        # every returned doc has a brute-force score >= the k-th (ties aside), and scores agree
        assert np.all(row[got] >= kth * (1 - rtol) - 1e-9)
        np.testing.assert_allclose(scores[q, :want], row[got], rtol=rtol, atol=1e-6)
        strict = np.flatnonzero(row > kth * (1 + rtol) + 1e-9)
        assert set(strict.tolist()) <= set(got.tolist())


@pytest.mark.parametrize("n_threads", [1, 2])
def test_exact_matches_scipy_synthetic(n_threads):
    vocab = 500
    docs, queries = synthetic(2000, vocab, seed=3)
    indptr, terms, weights = to_csr(docs, vocab)
    scale = impact_scale(weights.max())
    ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=scale, n_postings=200, block_size=8,
                            summary_energy=0.4)
    qb = csr_batch(queries, vocab)
    S = brute_topk(ix, scale, qb, vocab, 10)
    for k in (1, 10, 3000):
        ids, scores, n_found = _kernels.sparse_exact_topk(*exact_args(ix), scale, *qb, k,
                                                          n_threads=n_threads)
        check_topk_matches(ids, scores, n_found, S, k)


def test_seismic_recall_and_exact_limit():
    vocab = 500
    docs, queries = synthetic(2000, vocab, seed=5)
    indptr, terms, weights = to_csr(docs, vocab)
    scale = impact_scale(weights.max())
    qb = csr_batch(queries, vocab)
    # every posting kept, full summaries (upper bounds), query_cut >= query length, heap_factor tiny:
    # no block can be wrongly skipped, so the approximate kernel is exact
    ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=scale, n_postings=0, block_size=8,
                            summary_energy=1.0)
    S = brute_topk(ix, scale, qb, vocab, 10)
    ids, scores, n_found = _kernels.sparse_seismic_topk(ix["fwd_offsets"], ix["fwd_terms"], ix["fwd_values"], scale,
                                                        *[ix[n] for n in _BLOCK_ARGS], *qb, 10, query_cut=1000,
                                                        heap_factor=1e-9, n_threads=1)
    check_topk_matches(ids, scores, n_found, S, 10)
    # pruned postings and summaries, default-like knobs: high recall@10
    ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=scale, n_postings=300, block_size=8,
                            summary_energy=0.4)
    ids2, _, _ = _kernels.sparse_seismic_topk(ix["fwd_offsets"], ix["fwd_terms"], ix["fwd_values"], scale,
                                              *[ix[n] for n in _BLOCK_ARGS], *qb, 10, query_cut=8,
                                              heap_factor=0.9, n_threads=2)
    from retriever.metrics import recall_at_k

    assert recall_at_k(ids2, ids, 10) > 0.7


def test_query_vector_validation():
    v = 100
    offs, terms, w = csr_batch([([5, 2, 9], [0.5, 1.0, 0.0]), {3: 1.5}], v)
    assert offs.tolist() == [0, 2, 3] and terms.tolist() == [2, 5, 3]  # sorted, zero dropped
    assert w.dtype == np.float32 and terms.dtype == np.uint32
    with pytest.raises(QueryError, match="duplicate term id 2"):
        csr_batch([([2, 2], [1.0, 1.0])], v)
    with pytest.raises(QueryError, match="2 indices but 1 weights"):
        csr_batch([([1, 2], [1.0])], v)
    with pytest.raises(QueryError, match="outside the vocabulary"):
        csr_batch([([100], [1.0])], v)
    with pytest.raises(QueryError, match="not finite"):
        csr_batch([([1], [np.nan])], v)
    with pytest.raises(QueryError, match="negative weight"):
        csr_batch([([1], [-0.5])], v)
    m = sp.csr_matrix(([1.0, 2.0], ([0, 1], [3, 4])), shape=(2, v))
    assert csr_batch(m, v)[1].tolist() == [3, 4]



def test_csr_batch_array_fast_path_matches_general_path():
    """(indices, weights) pairs of numpy arrays take a batched fast path: same arrays as the
    general per-row path (lists), and the same errors when a row is invalid."""
    from retriever.legs.sparse import _csr_batch_fast
    rng = np.random.default_rng(5)
    v = 1000
    for nq in (1, 3, 8):
        rows = []
        for _ in range(nq):
            n = int(rng.integers(0, 20))
            idx = np.sort(rng.choice(v, n, replace=False)).astype(rng.choice([np.uint32, np.int64, np.int32]))
            w = rng.random(n).astype(rng.choice([np.float32, np.float64]))
            w[rng.random(n) < 0.2] = 0.0
            rows.append((idx, w))
        assert _csr_batch_fast(rows, v) is not None  # sorted, valid: the fast path
        got = csr_batch(rows, v)
        want = csr_batch([(i.tolist(), w.tolist()) for i, w in rows], v)  # lists: the general path
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    # unsorted rows fall back to the general path (which sorts them)
    unsorted = [(np.array([9, 2, 5], np.uint32), np.array([1.0, 2.0, 0.0], np.float32))]
    assert _csr_batch_fast(unsorted, v) is None
    offs, terms, w = csr_batch(unsorted, v)
    assert offs.tolist() == [0, 2] and terms.tolist() == [2, 9] and w.tolist() == [2.0, 1.0]
    bad = {"duplicate term id 2": ([2, 2], [1.0, 1.0]), "2 indices but 1 weights": ([1, 2], [1.0]),
           "outside the vocabulary": ([1000], [1.0]), "not finite": ([1], [np.nan]),
           "negative weight": ([1], [-0.5])}
    for msg, (i, w) in bad.items():
        with pytest.raises(QueryError, match=msg):
            csr_batch([(np.array([0], np.int64), np.array([1.0])), (np.array(i, np.int64), np.array(w))], v)


def test_kernel_boundary_errors():
    vocab = 50
    docs, _ = synthetic(100, vocab, seed=1)
    indptr, terms, weights = to_csr(docs, vocab)
    scale = impact_scale(weights.max())
    ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=scale, n_postings=0, block_size=4,
                            summary_energy=0.5)
    qo, qt, qw = np.array([0, 2], np.uint64), np.array([1, 1], np.uint32), np.array([1, 1], np.float32)
    args = (*exact_args(ix), scale)
    with pytest.raises(ValueError, match="repeats a term"):
        _kernels.sparse_exact_topk(*args, qo, qt, qw, 10)
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        _kernels.sparse_exact_topk(*args, qo, np.array([1, 2], np.uint32), qw, 0)
    with pytest.raises(ValueError, match="must be >= 0"):
        _kernels.sparse_exact_topk(*args, qo, np.array([1, 2], np.uint32), np.array([1, -1], np.float32), 5)
    with pytest.raises(ValueError, match="out of range"):
        _kernels.sparse_exact_topk(*args, qo, np.array([1, 99], np.uint32), qw, 5)
    with pytest.raises(ValueError, match="heap_factor"):
        _kernels.sparse_seismic_topk(ix["fwd_offsets"], ix["fwd_terms"], ix["fwd_values"], scale,
                                     *[ix[n] for n in _BLOCK_ARGS], qo, np.array([1, 2], np.uint32), qw, 5,
                                     heap_factor=1.5)
    with pytest.raises(TypeError):
        _kernels.sparse_exact_topk(ix["offsets"], ix["doc_ids"], ix["impacts"].astype(np.int32), ix["fwd_offsets"],
                                   ix["fwd_terms"], ix["fwd_values"], scale, qo, qt, qw, 5)


def test_exact_is_shard_layout_independent():
    """Same vectors, one shard vs three (global impact scale): identical merged top-k."""
    from retriever.topk import merge_topk

    vocab = 400
    docs, queries = synthetic(900, vocab, seed=11)
    indptr, terms, weights = to_csr(docs, vocab)
    scale = impact_scale(weights.max())
    qb = csr_batch(queries, vocab)

    def run(lo, hi):
        ip = indptr[lo:hi + 1] - indptr[lo]
        ix = build_sparse_index(ip, terms[indptr[lo]:indptr[hi]], weights[indptr[lo]:indptr[hi]], n_terms=vocab,
                                scale=scale, n_postings=0, block_size=8, summary_energy=0.4, blocks=False)
        ids, sc, nf = _kernels.sparse_exact_topk(*exact_args(ix), scale, *qb, 20, n_threads=1)
        return np.where(ids >= 0, ids + lo, -1), sc, nf

    whole = merge_topk([run(0, 900)], 20)
    parts = merge_topk([run(0, 250), run(250, 600), run(600, 900)], 20)
    for a, b in zip(whole, parts):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_sparse_leg_end_to_end(tmp_path):
    """bm25 + sparse index through the library: sparse, hybrid, seismic, user vectors (encodes 40 texts)."""
    from retriever import Retriever, build_index
    from tests.conftest import random_corpus

    docs = random_corpus(40, seed=7, min_len=3)
    m = build_index(docs, tmp_path / "ix", legs=("bm25", "sparse"), shard_size=15, show_progress=False)
    assert "sparse_truncated_docs" in m["build"] and m["stats"]["sparse_scale"] > 0
    qs = ["vitamin bone fracture", "insulin liver sugar", "brain sleep memory"]
    with Retriever.open(tmp_path / "ix") as r1:
        x = r1.search_arrays(qs, k=10, mode="sparse")
        assert (x.n_found > 0).all()
        # hybrid with the sparse leg; Seismic with everything visited equals exact here
        h = r1.search_arrays(qs, k=5, mode="hybrid")
        assert h.ids.shape == (3, 5)
        z = r1.search_arrays(qs, k=10, mode="sparse",
                             leg_params={"sparse": {"algorithm": "seismic", "query_cut": 10_000,
                                                    "heap_factor": 1e-6}})
        assert z.ids.shape == (3, 10)
        # user-supplied vectors go through validation
        vec = [([10, 20, 30], [1.0, 0.5, 0.2])] * 3
        u = r1.search_arrays(qs, k=5, mode="sparse", sparse_vectors=vec)
        assert u.ids.shape == (3, 5)
        with pytest.raises(QueryError, match="duplicate"):
            r1.search_arrays(qs, k=5, mode="sparse", sparse_vectors=[([1, 1], [1.0, 1.0])] * 3)
        with pytest.raises(QueryError, match="algorithm"):
            r1.search_arrays(qs, k=5, mode="sparse", leg_params={"sparse": {"algorithm": "nope"}})


def test_impact_ordered_postings_and_check():
    vocab = 60
    docs, _ = synthetic(300, vocab, seed=2)
    indptr, terms, weights = to_csr(docs, vocab)
    ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=impact_scale(weights.max()), n_postings=0,
                            block_size=4, summary_energy=0.5, blocks=False)
    off, d, imp = ix["offsets"], ix["doc_ids"], ix["impacts"]
    for t in range(vocab):
        seg_i, seg_d = imp[off[t]:off[t + 1]].astype(np.int64), d[off[t]:off[t + 1]].astype(np.int64)
        assert np.all(np.diff(seg_i) <= 0)
        assert np.all((np.diff(seg_i) < 0) | (np.diff(seg_d) > 0))  # ties by doc id
    _kernels.check_impact_postings(off, d, imp, 300)
    with pytest.raises(ValueError, match="doc_ids"):
        _kernels.check_impact_postings(off, d, imp, 10)
    t = int(np.argmax(np.diff(off.astype(np.int64))))
    bad = imp.copy()
    bad[off[t]], bad[off[t] + 1] = bad[off[t] + 1], bad[off[t]] + 1
    with pytest.raises(ValueError, match="non-increasing"):
        _kernels.check_impact_postings(off, d, bad, 300)


def test_check_doc_vectors_policy():
    """Precomputed document vectors: rows sorted, zeros dropped, bad input named."""
    from retriever.index.sparse_index import check_doc_vectors

    ip, t, w = check_doc_vectors(np.array([0, 3, 3, 5]), np.array([7, 2, 5, 1, 0]),
                                 np.array([0.5, 1.0, 0.0, 2.0, 3.0]), 10)
    np.testing.assert_array_equal(ip, [0, 2, 2, 4])
    np.testing.assert_array_equal(t, [2, 7, 0, 1])
    np.testing.assert_array_equal(w, np.array([1.0, 0.5, 3.0, 2.0], np.float32))
    assert t.dtype == np.uint32 and w.dtype == np.float32
    for args, msg in [(([0, 2], [1, 1], [1.0, 1.0]), "row 0: duplicate term id 1"),
                      (([0, 2], [1, 10], [1.0, 1.0]), "term id 10 outside"),
                      (([0, 1, 2], [1, 2], [1.0, np.nan]), "row 1: weight nan"),
                      (([0, 2], [1, 2], [1.0, -1.0]), "negative weight"),
                      (([0, 3], [1, 2], [1.0, 1.0]), "indptr"),
                      (([0, 2], [1, 2], [1.0]), "2 term ids but 1 weights")]:
        with pytest.raises(ValueError, match=msg):
            check_doc_vectors(*(np.asarray(a) for a in args), 10)


def test_build_index_sparse_vectors_errors(tmp_path):
    from retriever.index.errors import ConfigError
    from retriever import build_index
    from tests.conftest import random_corpus

    docs = random_corpus(12, seed=3, min_len=3)
    vec = (np.arange(13, dtype=np.int64), np.arange(12) % 50, np.ones(12, np.float32))
    with pytest.raises(ConfigError, match="'sparse' is not in legs"):
        build_index(docs, tmp_path / "a", legs=("bm25",), sparse_vectors=vec, show_progress=False)
    with pytest.raises(ConfigError, match="fewer rows"):
        build_index(docs, tmp_path / "b", legs=("sparse",), sparse_vectors=(vec[0][:6], vec[1][:5], vec[2][:5]),
                    show_progress=False)
    more = (np.arange(14, dtype=np.int64), np.arange(13) % 50, np.ones(13, np.float32))
    with pytest.raises(ConfigError, match="13 rows, the corpus 12"):
        build_index(docs, tmp_path / "c", legs=("sparse",), sparse_vectors=more, show_progress=False)
    with pytest.raises(ConfigError, match="duplicate term id"):
        build_index(docs, tmp_path / "d", legs=("sparse",), show_progress=False,
                    sparse_vectors=(np.array([0, 2] + [2] * 11), np.array([4, 4]), np.ones(2, np.float32)))
    assert not any((tmp_path / n).exists() for n in "abcd")


@pytest.mark.slow
def test_build_index_precomputed_sparse_vectors_equal_encoded(tmp_path):
    """sparse_vectors= from the same encoder gives the same stored vectors and search results."""
    from retriever.index.encoders.sparse import SparseEncoder
    from retriever.index.format import read_arrays
    from retriever.index.sparse_build import SPARSE_FWD
    from retriever import Retriever, build_index
    from tests.conftest import random_corpus

    docs = random_corpus(30, seed=5, min_len=3)
    a = build_index(docs, tmp_path / "enc", legs=("sparse",), shard_size=11, show_progress=False)
    texts = [f"{d['title']} {d['text']}" if d.get("title") else d["text"] for d in docs]
    # encoded as the build does (one call per shard batch), so padding and hence rounding agree
    enc = SparseEncoder()
    parts = [enc.encode(texts[i:i + 11]) for i in range(0, len(texts), 11)]
    ip = np.concatenate([[0]] + [p[0][1:] + sum(int(q[0][-1]) for q in parts[:j]) for j, p in enumerate(parts)])
    t, w = np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])
    rng = np.random.default_rng(0)
    perm_t, perm_w = t.copy(), w.copy()
    for i in range(len(ip) - 1):  # unsorted rows are accepted
        p = rng.permutation(ip[i + 1] - ip[i]) + ip[i]
        perm_t[ip[i]:ip[i + 1]], perm_w[ip[i]:ip[i + 1]] = t[p], w[p]
    b = build_index(docs, tmp_path / "pre", legs=("sparse",), shard_size=11, show_progress=False,
                    sparse_vectors=(ip, perm_t, perm_w))
    assert b["build"]["sparse_precomputed"] and not a["build"]["sparse_precomputed"]
    assert a["stats"]["sparse_scale"] == b["stats"]["sparse_scale"]
    for s in ("00000", "00001", "00002"):
        x = read_arrays(tmp_path / "enc" / "shards" / s / "sparse.arrow", SPARSE_FWD)
        y = read_arrays(tmp_path / "pre" / "shards" / s / "sparse.arrow", SPARSE_FWD)
        for k in SPARSE_FWD:
            np.testing.assert_array_equal(x[k], y[k])
    qs = ["vitamin bone fracture", "insulin liver sugar"]
    with Retriever.open(tmp_path / "enc") as r1, Retriever.open(tmp_path / "pre") as r2:
        x, y = r1.search_arrays(qs, k=10, mode="sparse"), r2.search_arrays(qs, k=10, mode="sparse")
        np.testing.assert_array_equal(x.ids, y.ids)
        np.testing.assert_array_equal(x.scores, y.scores)


def test_exact_both_paths_match_scipy():
    """Queries on either side of the dense-path switch (postings of the query's lists >= 2 per
    document): a few rare terms (score-at-a-time with early termination) and many popular terms
    (dense term-at-a-time), both equal to scipy's top-k."""
    vocab = 300
    docs, _ = synthetic(1500, vocab, seed=21)
    indptr, terms, weights = to_csr(docs, vocab)
    scale = impact_scale(weights.max())
    ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=scale, n_postings=0, block_size=8,
                            summary_energy=0.4, blocks=False)
    df = np.diff(ix["offsets"].astype(np.int64))
    by_df = np.argsort(-df, kind="stable")
    rng = np.random.default_rng(4)
    popular = [(by_df[:25], rng.lognormal(-0.8, 1.0, 25)) for _ in range(10)]
    rare_pool = by_df[150:250][df[by_df[150:250]] > 0]
    rare = [(rng.choice(rare_pool, 3, replace=False), rng.lognormal(-0.8, 1.0, 3)) for _ in range(10)]
    qb = csr_batch(popular + rare, vocab)
    tot = [df[qb[1][qb[0][i]:qb[0][i + 1]].astype(np.int64)].sum() for i in range(20)]
    assert min(tot[:10]) >= 2 * 1500 and max(tot[10:]) < 2 * 1500  # both paths exercised
    S = brute_topk(ix, scale, qb, vocab, 10)
    for k in (1, 10, 100):
        ids, scores, n_found = _kernels.sparse_exact_topk(*exact_args(ix), scale, *qb, k, n_threads=1)
        check_topk_matches(ids, scores, n_found, S, k)


def test_pooled_scratch_single_query_calls_match_brute_force():
    """The kernels reuse pooled per-worker scratch (query weights, accumulator, seen-stamps) across
    calls: one-query calls alternating between two indexes of different sizes and vocabularies
    return exactly what a fresh batch call returns, and the exact kernel matches scipy."""
    big_v, small_v = 500, 120
    big_docs, big_q = synthetic(3000, big_v, seed=11)
    small_docs, small_q = synthetic(300, small_v, seed=12)
    ixs = []
    for docs, queries, vocab in ((big_docs, big_q, big_v), (small_docs, small_q, small_v)):
        indptr, terms, weights = to_csr(docs, vocab)
        scale = impact_scale(weights.max())
        ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=scale, n_postings=0, block_size=8,
                                summary_energy=1.0)
        ixs.append((ix, scale, csr_batch(queries, vocab), vocab))

    def seismic(ix, scale, qb):
        return _kernels.sparse_seismic_topk(ix["fwd_offsets"], ix["fwd_terms"], ix["fwd_values"], scale,
                                            *[ix[n] for n in _BLOCK_ARGS], *qb, 10, query_cut=1000,
                                            heap_factor=1e-9, n_threads=1)

    whole = [(_kernels.sparse_exact_topk(*exact_args(ix), scale, *qb, 10, n_threads=2), seismic(ix, scale, qb))
             for ix, scale, qb, _ in ixs]
    for (ix, scale, qb, vocab), (ex, se) in zip(ixs, whole):
        S = brute_topk(ix, scale, qb, vocab, 10)
        check_topk_matches(*ex, S, 10)
        check_topk_matches(*se, S, 10)
    nq = min(len(ixs[0][2][0]), len(ixs[1][2][0])) - 1
    for q in range(nq):
        for which in (0, 1, 0):
            ix, scale, (qo, qt, qw), _ = ixs[which]
            one = (np.array([0, qo[q + 1] - qo[q]], np.uint64), qt[qo[q]:qo[q + 1]], qw[qo[q]:qo[q + 1]])
            for got, want in ((_kernels.sparse_exact_topk(*exact_args(ix), scale, *one, 10, n_threads=1),
                               whole[which][0]), (seismic(ix, scale, one), whole[which][1])):
                np.testing.assert_array_equal(got[0][0], want[0][q])
                np.testing.assert_array_equal(got[1][0], want[1][q])
                assert got[2][0] == want[2][q]


@pytest.mark.timeout(120)
def test_overflowing_weights_and_caller_matrix(tmp_path):
    """Query weights whose best score overflows float32 are a QueryError in both algorithms (the
    exact kernel used to loop forever on an infinite bound); a caller's CSR matrix is not changed."""
    from retriever import Retriever, build_index
    from tests.conftest import random_corpus

    docs = random_corpus(30, seed=4, min_len=3)
    ip = np.arange(0, 61, 2, dtype=np.int64)
    terms = np.stack([np.arange(30) % 7, 7 + np.arange(30) % 5], axis=1).ravel()
    build_index(docs, tmp_path / "ix", legs=("sparse",), show_progress=False,
                sparse_vectors=(ip, terms, np.linspace(0.5, 2.0, 60).astype(np.float32)))
    with Retriever.open(tmp_path / "ix") as r:
        ok = r.search_arrays(["q"], k=5, mode="sparse", sparse_vectors=[([1], [1e30])])
        assert ok.n_found[0] > 0 and np.isfinite(ok.scores[0, :ok.n_found[0]]).all()
        for algo in ("exact", "seismic"):
            with pytest.raises(QueryError, match="sparse query #1: weights too large"):
                r.search_arrays(["a", "b"], k=5, mode="sparse", leg_params={"sparse": {"algorithm": algo}},
                                sparse_vectors=[([2], [1.0]), ([1, 8], [1e34, 1e34])])
        m = sp.csr_matrix((np.array([1.0, 2.0]), np.array([3, 3]), np.array([0, 2])), shape=(1, 30522))
        before = m.data.copy()
        r.search_arrays(["q"], k=5, mode="sparse", sparse_vectors=m)
        np.testing.assert_array_equal(m.data, before)


@pytest.mark.parametrize("n_docs", [5, 37, 64, 130, 1029])
def test_exact_dense_path_odd_sizes_match_scipy(n_docs):
    """Dense path (every query's lists cover the shard >= 2x) with shared float columns, at shard
    sizes around the 16-document column tiles and the 64-document selection blocks (partial last
    tile/block, fewer blocks than k): equal to scipy's top-k for k = 1, 3, 10, 200."""
    vocab = 60
    docs, _ = synthetic(n_docs, vocab, seed=n_docs, nnz_doc=30)
    indptr, terms, weights = to_csr(docs, vocab)
    scale = impact_scale(weights.max())
    ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=scale, n_postings=0, block_size=8,
                            summary_energy=0.4, blocks=False)
    df = np.diff(ix["offsets"].astype(np.int64))
    by_df = np.argsort(-df, kind="stable")
    rng = np.random.default_rng(n_docs)
    qs = [(by_df[:12], rng.lognormal(-0.8, 1.0, 12)) for _ in range(6)]
    qs += [(rng.choice(by_df[:30], 10, replace=False), rng.lognormal(-0.8, 1.0, 10)) for _ in range(6)]
    qb = csr_batch(qs, vocab)
    tot = [df[qb[1][qb[0][i]:qb[0][i + 1]].astype(np.int64)].sum() for i in range(len(qs))]
    assert min(tot[:6]) >= 2 * n_docs  # the shared-term queries take the dense path
    S = brute_topk(ix, scale, qb, vocab, 10)
    for k in (1, 3, 10, 200):
        ids, scores, n_found = _kernels.sparse_exact_topk(*exact_args(ix), scale, *qb, k, n_threads=1)
        check_topk_matches(ids, scores, n_found, S, k)


def test_malformed_vectors_are_named_errors():
    """String weights, 2-D arrays, non-integer dict keys and uint64 ids past int64 are errors naming
    the query/row and the value (they used to be coerced, flattened, or reported wrapped)."""
    from retriever.index.sparse_index import check_doc_vectors
    v = 100
    with pytest.raises(QueryError, match=r"sparse_vectors\[0\].*\('a', 1.0\)"):
        csr_batch([{"a": 1.0}], v)
    with pytest.raises(QueryError, match="weights must be numbers.*'1.0'"):
        csr_batch([([1, 2], ["1.0", "2"])], v)
    with pytest.raises(QueryError, match=r"must be 1-D.*\(1, 2\)"):
        csr_batch([(np.array([[1, 2]]), np.array([[1.0, 2.0]]))], v)
    with pytest.raises(QueryError, match="term id 18446744073709551615 outside"):
        csr_batch([(np.array([2**64 - 1], dtype=np.uint64), [1.0])], v)
    with pytest.raises(ValueError, match="weights must be numbers"):
        check_doc_vectors([0, 2], [1, 2], ["1", "2"], v)
    with pytest.raises(ValueError, match="term ids must be 1-D"):
        check_doc_vectors([0, 2], np.array([[1, 2]]), [1.0, 2.0], v)
    with pytest.raises(ValueError, match="row 0: term id 18446744073709551615 outside"):
        check_doc_vectors([0, 1], np.array([2**64 - 1], dtype=np.uint64), [1.0], v)
    with pytest.raises(ValueError, match="row 1: weight 1e\\+39 is not finite in float32"):
        check_doc_vectors([0, 1, 2], [3, 4], [1.0, 1e39], v)
    ptr, terms, w = check_doc_vectors([0, 2, 3], np.array([5, 1, 2], dtype=np.uint64), [1, 2, 0.5], v)
    assert ptr.tolist() == [0, 2, 3] and terms.tolist() == [1, 5, 2] and w.tolist() == [2.0, 1.0, 0.5]


# -- inverted summaries, forward-score order, Seismic reference -------------------------------------
def _canonical_scores(ix, scale, qo, qt, qw, vocab):
    """float32 reference of the kernels' forward-index score (blocked_topk.cpp, forward_score): per
    document, products q[t] * value in float32; 8-entry chunks alternately to lane groups A and B,
    the last < 8 products to A's lanes 0, 1, ...; lanes A + B, then ((l0 + l4) + (l1 + l5)) +
    ((l2 + l6) + (l3 + l7)), times the float32 scale. Returns (nq, n_docs) float32."""
    fo, ft, fv = ix["fwd_offsets"].astype(np.int64), ix["fwd_terms"], ix["fwd_values"].astype(np.float32)
    n = len(fo) - 1
    out = np.zeros((len(qo) - 1, n), np.float32)
    s32 = np.float32(scale)
    for q in range(len(qo) - 1):
        qd = np.zeros(vocab, np.float32)
        qd[qt[qo[q]:qo[q + 1]]] = qw[qo[q]:qo[q + 1]]
        for d in range(n):
            p = qd[ft[fo[d]:fo[d + 1]]] * fv[fo[d]:fo[d + 1]]
            a, b = np.zeros(8, np.float32), np.zeros(8, np.float32)
            full = len(p) // 8
            for c in range(full):
                if c % 2 == 0:
                    a += p[8 * c:8 * c + 8]
                else:
                    b += p[8 * c:8 * c + 8]
            for j, x in enumerate(p[8 * full:]):
                a[j] += x
            lane = a + b
            s = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]))
            out[q, d] = np.float32(s) * s32
    return out


def _ranked(row, k):
    """(ids, scores) of the k best positive entries, ties by smaller id (the kernels' order)."""
    pos = np.flatnonzero(row > 0)
    order = pos[np.lexsort((pos, -row[pos].astype(np.float64)))][:k]
    return order, row[order]


def _raw_blocks(ix_post, ix, n_postings, block_size, energy, vocab):
    """Per-block summaries as the builder produces them before inversion."""
    from retriever.index.sparse_index import DOC_CUT, _build_blocks

    tb, _, _, sterms, svals, ssizes, _ = _build_blocks(
        ix_post["offsets"].astype(np.int64), ix_post["doc_ids"], ix_post["impacts"],
        ix["fwd_offsets"].astype(np.int64), ix["fwd_terms"], ix["fwd_values"], n_postings, block_size, energy, 0,
        vocab, DOC_CUT)
    so = np.zeros(len(ssizes) + 1, np.int64)
    np.cumsum(ssizes, out=so[1:])
    return tb, so, sterms, svals


@pytest.mark.parametrize("impl", ["auto", "scalar", "sse2", "avx2"])
def test_forward_score_order_all_implementations(impl):
    """Exact and Seismic kernels return bit-exactly the documented float32 forward score, with the
    AVX2 (where available), SSE2 and scalar implementations alike (chosen per call by ``impl``;
    "auto" is fixed once per process from the CPU); rows of every length mod 16."""
    vocab = 300
    docs, queries = synthetic(260, vocab, seed=21, nnz_doc=60, nnz_q=25)
    docs[:40] = [(np.arange(i % 35) * 7 % vocab, np.linspace(0.1, 2.0, i % 35).astype(np.float32)) for i in range(40)]
    indptr, terms, weights = to_csr(docs, vocab)
    scale = impact_scale(weights.max())
    qb = csr_batch(queries, vocab)
    ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=scale, n_postings=0, block_size=4,
                            summary_energy=1.0)
    ref = _canonical_scores(ix, scale, *qb, vocab)
    n = len(indptr) - 1
    try:
        e_ids, e_sc, e_n = _kernels.sparse_exact_topk(*exact_args(ix), scale, *qb, n, n_threads=1, impl=impl)
    except ValueError as e:  # an instruction set this CPU lacks is refused, never silently replaced
        assert impl == "avx2" and "impl 'avx2' is not supported on this CPU" in str(e)
        pytest.skip("no AVX2 on this CPU")
    s_ids, s_sc, s_n = _kernels.sparse_seismic_topk(ix["fwd_offsets"], ix["fwd_terms"], ix["fwd_values"], scale,
                                                    *[ix[k] for k in _BLOCK_ARGS], *qb, n, query_cut=1000,
                                                    heap_factor=1e-9, n_threads=1, impl=impl)
    for q in range(len(queries)):
        ids, sc = _ranked(ref[q], n)
        for got_ids, got_sc, nf in ((e_ids, e_sc, e_n), (s_ids, s_sc, s_n)):
            assert nf[q] == len(ids)
            np.testing.assert_array_equal(got_ids[q, :nf[q]], ids)
            np.testing.assert_array_equal(got_sc[q, :nf[q]], sc)  # bit-exact, not approximate
    for bad in ("", "AVX2", "avx512", "0"):
        with pytest.raises(ValueError, match="impl must be one of 'auto', 'scalar', 'sse2', 'avx2'"):
            _kernels.sparse_exact_topk(*exact_args(ix), scale, *qb, n, n_threads=1, impl=bad)
        with pytest.raises(ValueError, match="impl must be one of"):
            _kernels.sparse_seismic_topk(ix["fwd_offsets"], ix["fwd_terms"], ix["fwd_values"], scale,
                                         *[ix[k] for k in _BLOCK_ARGS], *qb, n, impl=bad)


def test_inverted_summaries_round_trip_and_checks():
    """The per-term inverted summaries hold exactly the builder's per-block (block, term, value)
    entries; the open-time check rejects a directory out of order, a bad entry range or block."""
    from retriever.index.sparse_index import invert_summaries

    vocab = 200
    docs, _ = synthetic(700, vocab, seed=8)
    indptr, terms, weights = to_csr(docs, vocab)
    scale = impact_scale(weights.max())
    ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=scale, n_postings=60, block_size=5,
                            summary_energy=0.5)
    tb, so, sterms, svals = _raw_blocks(ix, ix, 60, 5, 0.5, vocab)
    np.testing.assert_array_equal(tb, ix["term_blocks"])
    want = {(b, int(sterms[i]), int(svals[i])) for b in range(len(so) - 1) for i in range(so[b], so[b + 1])}
    got = set()
    co, dr, eo, en = (ix[k] for k in ("summary_comp_offsets", "summary_dir", "summary_entry_offsets",
                                      "summary_entries"))
    for t in range(vocab):
        ne = int(eo[t + 1] - eo[t])
        for c in range(int(co[t]), int(co[t + 1])):
            comp, r = int(dr[c]) >> 32, int(dr[c]) & 0xFFFFFFFF
            r_end = int(dr[c + 1]) & 0xFFFFFFFF if c + 1 < co[t + 1] else ne
            js = [int(x) >> 8 for x in en[eo[t] + r:eo[t] + r_end]]
            assert js == sorted(js) and len(set(js)) == len(js)
            for x in en[eo[t] + r:eo[t] + r_end]:
                got.add((int(tb[t]) + (int(x) >> 8), comp, int(x) & 0xFF))
    assert got == want and len(en) == len(sterms)
    again = invert_summaries(tb, so, sterms, svals)
    for k, v in again.items():
        np.testing.assert_array_equal(v, ix[k])

    def check(**bad):
        a = {**ix, **bad}
        _kernels.check_sparse_index(a["fwd_offsets"], a["fwd_terms"], a["fwd_values"], scale, vocab,
                                    *[a[n] for n in _BLOCK_ARGS])

    check()
    t = int(np.flatnonzero(np.diff(co.astype(np.int64)) >= 2)[0])
    c0 = int(co[t])
    d = dr.copy()
    d[c0], d[c0 + 1] = (d[c0 + 1] & ~np.uint64(0xFFFFFFFF)) | (d[c0] & np.uint64(0xFFFFFFFF)), \
        (d[c0] & ~np.uint64(0xFFFFFFFF)) | (d[c0 + 1] & np.uint64(0xFFFFFFFF))
    with pytest.raises(ValueError, match="strictly ascending"):
        check(summary_dir=d)
    d = dr.copy()
    d[c0 + 1] = (d[c0 + 1] & ~np.uint64(0xFFFFFFFF)) | np.uint64(10**6)
    with pytest.raises(ValueError, match="not a partition"):
        check(summary_dir=d)
    e = en.copy()
    e[eo[t]] = np.uint32((int(tb[t + 1] - tb[t]) << 8) | 1)
    with pytest.raises(ValueError, match=r"summary_entries\[\d+\] names block"):
        check(summary_entries=e)
    with pytest.raises(ValueError, match="len\\(summary_entry_offsets\\)"):
        check(summary_entry_offsets=eo[:-1])


def _seismic_reference(ix, raw, scale, qo, qt, qw, k, query_cut, heap_factor, ref_scores):
    """The Seismic algorithm as documented (blocked_topk.hpp), on the per-block summaries in
    float32 with the kernel's accumulation order; doc scores from ``ref_scores``."""
    tb, so, sterms, svals = raw
    sscale = ix["summary_scale"]
    bo, bd = ix["block_docs_offsets"], ix["block_docs"]
    hf = np.float32(heap_factor)
    out, skipped = [], 0
    for q in range(len(qo) - 1):
        terms_q, w_q = qt[qo[q]:qo[q + 1]], qw[qo[q]:qo[q + 1]]
        asc = sorted((int(t), np.float32(w)) for t, w in zip(terms_q, w_q) if w > 0)
        order = sorted(range(len(terms_q)), key=lambda j: (-float(w_q[j]), int(terms_q[j])))
        heap: list[tuple[float, int]] = []  # kept (score, doc)
        seen: set[int] = set()

        def thr():
            return min(heap, key=lambda x: (x[0], -x[1]))[0] if len(heap) >= k else -np.inf

        for j in order[:query_cut]:
            if not w_q[j] > 0:
                break
            t = int(terms_q[j])
            blocks = []
            for b in range(int(tb[t]), int(tb[t + 1])):
                summ = {int(sterms[i]): int(svals[i]) for i in range(so[b], so[b + 1])}
                u = np.float32(0)
                for qterm, w in asc:
                    if qterm in summ:
                        u = np.float32(u + np.float32(w * np.float32(summ[qterm])))
                blocks.append((np.float32(u * sscale[b]), b))
            cut0 = np.float32(hf * np.float32(thr())) if len(heap) >= k else None
            kept = [x for x in blocks if cut0 is None or not x[0] < cut0]
            skipped += len(blocks) - len(kept)
            kept.sort(key=lambda x: (-float(x[0]), x[1]))
            for i, (bound, b) in enumerate(kept):
                if len(heap) >= k and bound < np.float32(hf * np.float32(thr())):
                    skipped += len(kept) - i
                    break
                for d in bd[bo[b]:bo[b + 1]]:
                    d = int(d)
                    if d in seen:
                        continue
                    seen.add(d)
                    s = ref_scores[q, d]
                    if not s > 0:
                        continue
                    if len(heap) < k:
                        heap.append((s, d))
                    else:
                        worst = min(heap, key=lambda x: (x[0], -x[1]))
                        if s > worst[0] or (s == worst[0] and d < worst[1]):
                            heap.remove(worst)
                            heap.append((s, d))
        heap.sort(key=lambda x: (-float(x[0]), x[1]))
        out.append(heap)
    return out, skipped


@pytest.mark.parametrize("query_cut,heap_factor", [(3, 0.7), (5, 0.9), (8, 1.0)])
def test_seismic_matches_reference_with_pruning(query_cut, heap_factor):
    """With pruned postings and summaries (blocks really skipped), the kernel returns exactly what
    the documented algorithm returns on the builder's per-block summaries."""
    vocab = 250
    docs, queries = synthetic(900, vocab, seed=31)
    indptr, terms, weights = to_csr(docs, vocab)
    scale = impact_scale(weights.max())
    qb = csr_batch(queries, vocab)
    ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=scale, n_postings=40, block_size=4,
                            summary_energy=0.4)
    raw = _raw_blocks(ix, ix, 40, 4, 0.4, vocab)
    ref = _canonical_scores(ix, scale, *qb, vocab)
    ids, sc, nf = _kernels.sparse_seismic_topk(ix["fwd_offsets"], ix["fwd_terms"], ix["fwd_values"], scale,
                                               *[ix[k] for k in _BLOCK_ARGS], *qb, 10, query_cut=query_cut,
                                               heap_factor=heap_factor, n_threads=2)
    want = _seismic_reference(ix, raw, scale, *qb, 10, query_cut, heap_factor, ref)
    want, skipped = want
    assert skipped > 0  # the bounds did prune
    for q, h in enumerate(want):
        assert nf[q] == len(h)
        np.testing.assert_array_equal(ids[q, :nf[q]], [d for _, d in h])
        np.testing.assert_array_equal(sc[q, :nf[q]], np.array([s for s, _ in h], np.float32))


def test_sparse_index_file_round_trip(tmp_path):
    """build_index writes each shard's inverted summaries (sparse_index.arrow) exactly as
    build_sparse_index computes them; the opened index passes the open-time checks and its Seismic
    search equals the kernel on the in-memory arrays; a file from an older layout is a named error."""
    import json

    from retriever.index.errors import IndexFormatError
    from retriever.index.format import current_manifest_path, manifest_digest, read_arrays, sha256_file, write_arrays
    from retriever import Retriever, build_index
    from retriever.legs.sparse import SPARSE_INDEX_ARRAYS
    from tests.conftest import random_corpus

    n, vocab = 60, 30522
    docs = random_corpus(n, seed=12, min_len=3)
    rows, _ = synthetic(n, 300, seed=13)
    indptr, terms, weights = to_csr(rows, 300)
    terms = (terms * 101 % vocab).astype(np.uint32)  # spread over the vocabulary, still unique per row
    m = build_index(docs, tmp_path / "ix", legs=("sparse",), shard_size=25, show_progress=False,
                    sparse_vectors=(indptr, terms, weights))
    scale = m["stats"]["sparse_scale"]
    cfg = m["build_config"]["sparse"]
    qs = [([101 * 3 % vocab, 101 * 7 % vocab, 101 * 50 % vocab], [1.0, 0.5, 2.0]),
          ([101 * 1 % vocab, 101 * 2 % vocab], [0.3, 0.9])]
    qb = csr_batch(qs, vocab)
    per_shard = []
    for i, lo in enumerate(range(0, n, 25)):
        hi = min(n, lo + 25)
        ip = indptr[lo:hi + 1] - indptr[lo]
        t, w = terms[indptr[lo]:indptr[hi]], weights[indptr[lo]:indptr[hi]]
        order = np.concatenate([np.argsort(t[a:b], kind="stable") + a for a, b in zip(ip[:-1], ip[1:])])
        want = build_sparse_index(ip, t[order], w[order], n_terms=vocab, scale=scale, n_postings=cfg["n_postings"],
                                  block_size=cfg["block_size"], summary_energy=cfg["summary_energy"])
        got = read_arrays(tmp_path / "ix" / "shards" / f"{i:05d}" / "sparse_index.arrow", SPARSE_INDEX_ARRAYS)
        for k in SPARSE_INDEX_ARRAYS:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
        ids, sc, nf = _kernels.sparse_seismic_topk(want["fwd_offsets"], want["fwd_terms"], want["fwd_values"], scale,
                                                   *[want[k] for k in _BLOCK_ARGS], *qb, 5, query_cut=10,
                                                   heap_factor=0.9, n_threads=1)
        per_shard.append((np.where(ids >= 0, ids + lo, -1), sc, nf))
    with Retriever.open(tmp_path / "ix") as r:
        res = r.search_arrays(["a", "b"], k=5, mode="sparse", sparse_vectors=qs,
                              leg_params={"sparse": {"algorithm": "seismic", "query_cut": 10, "heap_factor": 0.9}})
    best = {}
    for ids, sc, nf in per_shard:
        for q in range(2):
            for d, s in zip(ids[q, :nf[q]], sc[q, :nf[q]]):
                best.setdefault(q, []).append((-float(s), int(d)))
    for q in range(2):
        want_sc = [-s for s, _ in sorted(best[q])[:5]]
        np.testing.assert_allclose(res.scores[q, :res.n_found[q]], want_sc, rtol=1e-6)
    # an older layout (per-block summary rows) is named on open
    path = tmp_path / "ix" / "shards" / "00000" / "sparse_index.arrow"
    old = {k: np.array(v) for k, v in read_arrays(path, SPARSE_INDEX_ARRAYS).items() if not k.startswith("summary_")}
    old.update(summary_offsets=np.zeros(1, np.uint64), summary_terms=np.zeros(0, np.uint32))
    write_arrays(path.with_name("old.arrow"), old)  # the open file is memory-mapped: replace, not overwrite
    path.with_name("old.arrow").replace(path)
    mpath = current_manifest_path(tmp_path / "ix")
    man = json.loads(mpath.read_text())
    entry = man["files"]["shards/00000/sparse_index.arrow"]
    entry.update(bytes=path.stat().st_size, sha256=sha256_file(path))
    man["manifest_sha256"] = manifest_digest(man)
    mpath.write_text(json.dumps(man))
    with pytest.raises(IndexFormatError, match="missing array 'summary_comp_offsets'.*older layout"):
        with Retriever.open(tmp_path / "ix") as r:
            r.search_arrays(["a"], k=5, mode="sparse", sparse_vectors=qs[:1])


def test_packed_forward_copy_and_fallback():
    """The Seismic kernel gives bit-identical results from the packed forward copy and, without it
    (vocabularies over 65,536 terms), from fwd_terms/fwd_values; the open-time check rejects a
    packed copy or rank table that disagrees with the forward index."""
    from retriever.index.sparse_index import pack_forward

    vocab = 400
    docs, queries = synthetic(800, vocab, seed=41)
    indptr, terms, weights = to_csr(docs, vocab)
    scale = impact_scale(weights.max())
    qb = csr_batch(queries, vocab)
    ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=scale, n_postings=50, block_size=4,
                            summary_energy=0.4)
    rank = ix["fwd_term_rank"]
    assert sorted(rank.tolist()) == list(range(vocab))
    df = np.bincount(ix["fwd_terms"].astype(np.int64), minlength=vocab)
    assert np.all(np.diff(df[np.argsort(rank)]) <= 0)  # rank 0 = most frequent term
    np.testing.assert_array_equal(ix["fwd_packed"] >> 16, rank[ix["fwd_terms"]])
    np.testing.assert_array_equal(ix["fwd_packed"] & 0xFFFF, ix["fwd_values"])
    none = {"fwd_packed": np.zeros(0, np.uint32), "fwd_term_rank": np.zeros(0, np.uint32)}
    for k, v in pack_forward(np.array([70_000], np.uint32), np.array([3], np.uint16), 70_001).items():
        np.testing.assert_array_equal(v, none[k])

    def run(a, qc, hf):
        return _kernels.sparse_seismic_topk(a["fwd_offsets"], a["fwd_terms"], a["fwd_values"], scale,
                                           *[a[k] for k in _BLOCK_ARGS], *qb, 10, query_cut=qc, heap_factor=hf,
                                           n_threads=1)

    for qc, hf in ((3, 0.8), (8, 1.0), (1000, 1e-9)):
        for x, y in zip(run(ix, qc, hf), run({**ix, **none}, qc, hf)):
            np.testing.assert_array_equal(x, y)

    def check(**bad):
        a = {**ix, **bad}
        _kernels.check_sparse_index(a["fwd_offsets"], a["fwd_terms"], a["fwd_values"], scale, vocab,
                                    *[a[n] for n in _BLOCK_ARGS])

    check()
    check(**none)
    r = rank.copy()
    r[0] = r[1]
    with pytest.raises(ValueError, match="permutation"):
        check(fwd_term_rank=r)
    p = ix["fwd_packed"].copy()
    p[5] ^= 1
    with pytest.raises(ValueError, match=r"fwd_packed\[5\]"):
        check(fwd_packed=p)
    with pytest.raises(ValueError, match="len\\(fwd_packed\\)"):
        check(fwd_packed=p[:-1])
    with pytest.raises(ValueError, match="len\\(fwd_packed\\)"):
        run({**ix, "fwd_packed": p[:-1]}, 3, 0.9)


def test_scipy_matrix_taken_at_its_value():
    """A non-canonical scipy matrix (repeated entries) is read at its value, as scipy defines it:
    repeated entries are summed, then checked (a sum below zero is a negative weight); pairs with a
    repeated index are still a QueryError."""
    import scipy.sparse as sp

    from retriever.legs.sparse import csr_batch

    dup = sp.csr_matrix((np.array([2.0, -1.0, 0.5]), np.array([5, 5, 9]), np.array([0, 3])), shape=(1, 100))
    off, terms, w = csr_batch(dup, 100)
    assert off.tolist() == [0, 2] and terms.tolist() == [5, 9] and w.tolist() == [1.0, 0.5]
    assert dup.nnz == 3  # the caller's matrix is not changed
    neg = sp.csr_matrix((np.array([1.0, -2.0]), np.array([5, 5]), np.array([0, 2])), shape=(1, 100))
    with pytest.raises(QueryError, match="negative"):
        csr_batch(neg, 100)
    with pytest.raises(QueryError, match="duplicate"):
        csr_batch([([5, 5], [1.0, 2.0])], 100)


def _reference_summary(docs: list[int], fwd_offsets: np.ndarray, fwd_terms: np.ndarray, fwd_values: np.ndarray,
                       energy: float) -> tuple[dict[int, int], float]:
    """Pure-Python summary of one block: coordinate-wise max, shortest prefix of the values sorted
    descending (ties in first-touched order: documents ascending, terms ascending) holding
    ``energy`` of the L1 mass, uint8 with ceil rounding. Returns ({term: u8}, block scale)."""
    mx: dict[int, float] = {}
    for d in sorted(docs):
        for p in range(int(fwd_offsets[d]), int(fwd_offsets[d + 1])):
            t = int(fwd_terms[p])
            mx[t] = max(mx.get(t, 0.0), float(fwd_values[p]))  # dict keeps first-touch order
    items = sorted(mx.items(), key=lambda kv: -kv[1])  # stable
    target = energy * sum(mx.values())
    kept, mass = [], 0.0
    for t, v in items:
        if kept and mass >= target:
            break
        kept.append((t, v))
        mass += v
    bscale = float(np.float32(max(mx.values()))) / 255.0
    return {t: int(min(255.0, max(1.0, np.ceil(v / bscale - 1e-6)))) for t, v in kept}, bscale


@pytest.mark.parametrize("energy", [0.1, 0.4, 1.0])
def test_block_summaries_match_reference(energy: float) -> None:
    """Every block's summary (decoded from the inverted layout) equals the pure-Python rule; values
    with many ties (a few distinct weights) exercise the first-touched tie order."""
    rng = np.random.default_rng(7)
    n, vocab = 120, 60
    lens = rng.integers(1, 25, n)
    indptr = np.zeros(n + 1, np.int64)
    indptr[1:] = np.cumsum(lens)
    terms = np.concatenate([np.sort(rng.choice(vocab, k, replace=False)) for k in lens]).astype(np.uint32)
    weights = rng.choice(np.array([0.5, 1.0, 2.0, 3.0], np.float32), int(indptr[-1]))
    scale = impact_scale(float(weights.max()))
    ix = build_sparse_index(indptr, terms, weights, n_terms=vocab, scale=scale, n_postings=30, block_size=4,
                            summary_energy=energy)
    tb, bo = ix["term_blocks"].astype(np.int64), ix["block_docs_offsets"].astype(np.int64)
    decoded: list[dict[int, int]] = [{} for _ in range(len(bo) - 1)]
    co, eo = ix["summary_comp_offsets"].astype(np.int64), ix["summary_entry_offsets"].astype(np.int64)
    for t in range(vocab):
        dirs = ix["summary_dir"][co[t]:co[t + 1]].astype(np.int64)
        ents = ix["summary_entries"][eo[t]:eo[t + 1]].astype(np.int64)
        starts = list(dirs & 0xFFFFFFFF) + [len(ents)]
        for k, c in enumerate(dirs >> 32):
            for e in ents[starts[k]:starts[k + 1]]:
                decoded[tb[t] + (e >> 8)][int(c)] = int(e & 255)
    assert len(bo) - 1 > vocab  # several blocks per term
    for b in range(len(bo) - 1):
        docs = ix["block_docs"][bo[b]:bo[b + 1]].astype(np.int64).tolist()
        want, bscale = _reference_summary(docs, ix["fwd_offsets"], ix["fwd_terms"], ix["fwd_values"], energy)
        assert decoded[b] == want
        assert ix["summary_scale"][b] == np.float32(float(np.float32(bscale)) * scale)


# -- block build: the faster term-range kernels vs the frozen first implementation ----------------
def _splade_like(n_docs: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SPLADE-like CSR: Zipf-popular terms, 0-160 entries per document (some empty rows), log-normal
    weights rounded to a coarse grid so that summaries have many tied values."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / (np.arange(vocab) + 5.0) ** 1.1
    pop /= pop.sum()
    rows = []
    for i in range(n_docs):
        k = 0 if i % 97 == 5 else int(rng.integers(1, 160))
        t = np.unique(rng.choice(vocab, size=k, p=pop)) if k else np.zeros(0, np.int64)
        w = np.round(rng.lognormal(-0.5, 0.8, len(t)) * 8) / 8 + 0.125
        rows.append((t, w.astype(np.float32)))
    return to_csr(rows, vocab)


@pytest.mark.parametrize("vocab,n_postings,block_size,energy", [
    (3000, 0, 10, 0.4), (3000, 40, 4, 0.1), (3000, 0, 1, 1.0), (70_000, 25, 7, 0.4)])
def test_block_build_matches_first_implementation(vocab, n_postings, block_size, energy):
    """Blocks, raw summaries and the inverted summaries are byte-identical to the first (serial,
    allocating, sorting) implementation, with 1, 2 and 3 threads; a vocabulary above 2**16 takes a
    third radix pass over the term ids."""
    from retriever.index import sparse_index as S
    from tests import _blocks_reference as R

    indptr, terms, weights = _splade_like(700, vocab, seed=vocab + n_postings)
    if vocab > 1 << 16:  # spread the ids over the whole range
        terms = (terms.astype(np.int64) * 23 % vocab).astype(np.uint32)
        for d in range(len(indptr) - 1):
            lo, hi = indptr[d], indptr[d + 1]
            o = np.argsort(terms[lo:hi])
            terms[lo:hi], weights[lo:hi] = terms[lo:hi][o], weights[lo:hi][o]
    scale = impact_scale(float(weights.max()))
    fo = indptr.astype(np.int64)
    fv = S.quantise(weights, scale)
    post = S.invert(fo.astype(np.uint64), terms, fv, vocab)
    args = (post["offsets"].astype(np.int64), post["doc_ids"], post["impacts"], fo, terms, fv, n_postings,
            block_size, energy, 0, vocab, S.DOC_CUT)
    want = R._build_blocks(*args)
    assert len(want[2]) > vocab // 10 and (want[2] > 1).any()  # many blocks, some with several documents
    so = np.zeros(len(want[5]) + 1, np.int64)
    np.cumsum(want[5], out=so[1:])
    want_inv = R._invert_summaries(want[0].astype(np.int64), so, want[3], want[4])
    kept = np.minimum(np.diff(args[0]), n_postings) if n_postings else np.diff(args[0])
    assert len(S._term_ranges(kept.astype(np.float64), 2)) > 2  # the threaded path really splits
    for n_threads in (1, 2, 3):
        got = S._build_blocks(*args, n_threads=n_threads)
        for name, g, w in zip(("term_blocks", "block_docs", "block_sizes", "summary_terms", "summary_values",
                               "summary_sizes", "summary_scale"), got, want):
            assert g.dtype == w.dtype and np.array_equal(g, w), (name, n_threads)
        inv = S.invert_summaries(got[0], so, got[3], got[4], n_threads=n_threads)
        for name, w in zip(("summary_comp_offsets", "summary_dir", "summary_entry_offsets", "summary_entries"),
                           want_inv):
            assert inv[name].dtype == w.dtype and np.array_equal(inv[name], w), (name, n_threads)


def test_doc_cut_matches_stable_sort():
    """Each document's cut: its DOC_CUT largest impacts, ties by smaller term (a stable sort)."""
    from retriever.index.sparse_index import _doc_cut

    indptr, terms, weights = _splade_like(300, 500, seed=3)
    vals = np.minimum(np.round(weights * 4), 9).astype(np.uint16)  # few distinct values: many ties
    off, ct, cv = _doc_cut(indptr.astype(np.int64), terms, vals, 15)
    for d in range(len(indptr) - 1):
        lo, hi = indptr[d], indptr[d + 1]
        o = np.argsort(-vals[lo:hi].astype(np.int64), kind="stable")[:15]
        assert ct[off[d]:off[d + 1]].tolist() == terms[lo:hi][o].tolist()
        assert cv[off[d]:off[d + 1]].tolist() == vals[lo:hi][o].astype(np.float32).tolist()


def test_build_sparse_index_threads():
    """The whole index is the same for any thread count; a bad count is named."""
    indptr, terms, weights = _splade_like(400, 2000, seed=11)
    scale = impact_scale(float(weights.max()))
    kw = dict(n_terms=2000, scale=scale, n_postings=50, block_size=5, summary_energy=0.4)
    one = build_sparse_index(indptr, terms, weights, n_threads=1, **kw)
    for n_threads in (2, 4, None):
        other = build_sparse_index(indptr, terms, weights, n_threads=n_threads, **kw)
        assert set(other) == set(one)
        for k in one:
            assert np.array_equal(other[k], one[k]) and other[k].dtype == one[k].dtype, k
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=f"n_threads must be .* got {bad!r}"):
            build_sparse_index(indptr, terms, weights, n_threads=bad, **kw)


def test_query_encoding_does_not_depend_on_the_callers_torch_threads(tmp_path, data_dir):
    """The same queries (one at a time) encoded by each leg from threads whose torch intra-op
    counts differ (the main thread on 2, another on 1) give bit-identical SPLADE weights and dense
    vectors: torch's float32 reductions
    split by thread count (SciFact queries differed in the last digit of some SPLADE and dense
    weights), so queries are encoded on a fixed thread count."""
    import json
    import threading

    torch = pytest.importorskip("torch")
    from retriever import Retriever, build_index
    from tests.conftest import random_corpus

    with open(data_dir / "scifact" / "queries.jsonl", encoding="utf-8") as f:
        qs = [json.loads(line)["text"] for line in f][:64]
    docs = random_corpus(30, seed=3, min_len=3)
    build_index(docs, tmp_path / "ix", legs=("bm25", "sparse", "dense"), show_progress=False)

    r = Retriever.open(tmp_path / "ix")
    legs = r.engine.legs

    def run(n: int) -> dict:
        # each leg's own query encoding, on the calling thread (a search may run it on a pool thread)
        torch.set_num_threads(n)
        return {"sparse": np.concatenate([legs["sparse"].prepare([q]).batch[2] for q in qs]),
                "dense": np.concatenate([legs["dense"].prepare([q]).q for q in qs])}

    prev = torch.get_num_threads()
    try:
        a = run(2)
        box: dict = {}
        t = threading.Thread(target=lambda: box.setdefault("b", run(1)))
        t.start()
        t.join()
    finally:
        torch.set_num_threads(prev)
        r.close()
    for m in ("sparse", "dense"):
        assert a[m].tobytes() == box["b"][m].tobytes(), m


def test_torch_thread_blocks_keep_their_count_until_all_end():
    """:class:`retriever.threads._TorchThreads` on a stand-in torch whose setting has a per-thread
    part and a shared part (as OpenMP's and MKL's): a block that ends while another runs waits
    for it before restoring, so the shared part holds the block's count throughout; a block of
    another count waits for the running ones; each thread gets its own count back. (Without it,
    legs encoding side by side on an AMD EPYC VM got SPLADE weights differing in the last digit
    between a one-process and a Ray search: tests/test_ray.py.)"""
    import threading

    from retriever.threads import _TorchThreads

    class FakeTorch:
        def __init__(self) -> None:
            self.local = threading.local()
            self.shared = 4
            self.seen: list[int] = []

        def get_num_threads(self) -> int:
            return getattr(self.local, "n", 4)

        def set_num_threads(self, n: int) -> None:
            self.local.n = n
            self.shared = n

    torch, tt = FakeTorch(), _TorchThreads()
    a_in, b_in, a_done, b_go = threading.Event(), threading.Event(), threading.Event(), threading.Event()

    def a() -> None:
        torch.set_num_threads(3)
        with tt.hold(torch, 1):
            a_in.set()
            b_in.wait()
        a_done.set()
        torch.seen.append(torch.get_num_threads())

    def b() -> None:
        a_in.wait()
        with tt.hold(torch, 1):
            b_in.set()
            b_go.wait()
            torch.seen.append(torch.shared)  # a's block ended meanwhile: the shared part is still 1

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start(), tb.start()
    b_in.wait()
    assert not a_done.wait(0.2)  # a's block ended but waits for b's before restoring
    other: list = []

    def c() -> None:
        with tt.hold(torch, 2):
            other.append(torch.shared)

    tc = threading.Thread(target=c)
    tc.start()
    tc.join(0.2)
    assert tc.is_alive()  # a block of another count waits for the running ones
    b_go.set()
    ta.join(), tb.join(), tc.join()
    assert torch.seen[0] == 1 and torch.seen[1] == 3  # b saw 1 throughout; a got its 3 back
    assert other == [2]


def test_torch_thread_blocks_nest():
    """A block inside another block of the same thread runs on the outer count and ends at once
    (it must not wait for the outer block, which cannot end before it)."""
    import threading

    from retriever.threads import _TorchThreads

    class FakeTorch:
        n = 4

        def get_num_threads(self) -> int:
            return self.n

        def set_num_threads(self, n: int) -> None:
            self.n = n

    torch, tt, seen = FakeTorch(), _TorchThreads(), []

    def nested() -> None:
        with tt.hold(torch, 1):
            with tt.hold(torch, 1):
                seen.append(torch.n)
            with tt.hold(torch, 2):
                seen.append(torch.n)
        seen.append(torch.n)

    t = threading.Thread(target=nested, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive() and seen == [1, 1, 4]


def test_torch_thread_blocks_survive_errors_while_starting_and_restoring():
    """An error or interrupt from torch while a block starts (here KeyboardInterrupt from
    set_num_threads) still ends the block, and one while the last block restores still wakes
    the block waiting to restore: later blocks of either count run (an error after a block was
    counted skipped its end, so every later block waited for it forever, and a skipped notify
    left the waiting one stuck)."""
    import threading

    from retriever.threads import _TorchThreads

    class FakeTorch:
        def __init__(self) -> None:
            self.local = threading.local()
            self.fail: BaseException | None = None

        def get_num_threads(self) -> int:
            return getattr(self.local, "n", 4)

        def set_num_threads(self, n: int) -> None:
            if self.fail is not None:
                e, self.fail = self.fail, None
                raise e
            self.local.n = n

    def runs(tt: _TorchThreads, torch: FakeTorch, n: int) -> bool:
        done: list = []

        def block() -> None:
            with tt.hold(torch, n):
                pass
            done.append(torch.get_num_threads())

        t = threading.Thread(target=block, daemon=True)
        t.start()
        t.join(5)
        return done == [4]

    torch, tt = FakeTorch(), _TorchThreads()
    torch.fail = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        with tt.hold(torch, 1):
            pass
    assert torch.get_num_threads() == 4 and tt._active == 0
    assert runs(tt, torch, 1) and runs(tt, torch, 2)

    torch, tt = FakeTorch(), _TorchThreads()
    a_in, b_in, b_ended = threading.Event(), threading.Event(), threading.Event()
    a_back: list = []

    def a() -> None:
        with tt.hold(torch, 1):
            a_in.set()
            b_in.wait()
        a_back.append(torch.get_num_threads())

    ta = threading.Thread(target=a, daemon=True)
    ta.start()
    a_in.wait()
    with pytest.raises(RuntimeError, match="restore failed"):
        with tt.hold(torch, 1):
            b_in.set()
            # a's block ends and waits for this one; this one's restore then raises
            while tt._active != 1:
                threading.Event().wait(0.01)
            torch.fail = RuntimeError("restore failed")
    ta.join(5)
    assert not ta.is_alive() and a_back == [4]
    assert runs(tt, torch, 1) and runs(tt, torch, 2)


def test_torch_thread_block_interrupted_while_waiting_still_restores():
    """A KeyboardInterrupt (a real SIGINT) reaching the main thread while its ended block waits
    for another thread's block is raised once that block ended and the main thread's count is
    back (it was left on the block's count, so later torch work there ran on one thread)."""
    import signal
    import threading

    from retriever.threads import _TorchThreads

    class FakeTorch:
        def __init__(self) -> None:
            self.local = threading.local()

        def get_num_threads(self) -> int:
            return getattr(self.local, "n", 4)

        def set_num_threads(self, n: int) -> None:
            self.local.n = n

    torch, tt = FakeTorch(), _TorchThreads()
    a_in, a_go, a_ended, main_in = threading.Event(), threading.Event(), threading.Event(), threading.Event()

    def a() -> None:
        with tt.hold(torch, 1):
            a_in.set()
            a_go.wait()
        a_ended.set()

    def interrupt() -> None:
        # only once the main thread is inside pytest.raises and its block (a's block cannot end
        # before the signal: a_go is set after it), so the signal never lands outside
        main_in.wait()
        while tt._active != 1:  # the main thread's block ended: it waits for a's
            threading.Event().wait(0.01)
        threading.Event().wait(0.05)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        threading.Event().wait(0.2)
        a_go.set()

    ta, ti = threading.Thread(target=a, daemon=True), threading.Thread(target=interrupt, daemon=True)
    ta.start()
    a_in.wait()
    torch.set_num_threads(3)
    # Python's own SIGINT handler (raises KeyboardInterrupt), whatever an earlier test (Ray's
    # driver) installed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        ti.start()
        with pytest.raises(KeyboardInterrupt):
            with tt.hold(torch, 1):
                assert torch.get_num_threads() == 1
                main_in.set()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert a_ended.wait(5) and torch.get_num_threads() == 3
    ti.join(5), ta.join(5)
    assert tt._active == 0
