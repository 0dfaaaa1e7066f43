"""Brute-force numpy twins of the C++ kernels in ``retriever._kernels``.

These are the oracles of the kernel tests: slow, obviously correct, and written
from the contracts in ``retriever/_kernels.pyi`` rather than from the C++ code.

Two flavours of scoring are provided:

* ``exact=True`` reproduces the kernels' float32 arithmetic step by step
  (``w * (tf / (tf + doc_norm))`` in float32, summed in query-term order starting
  at 0.0), so results can be compared bit for bit, tie-breaking included.
* ``exact=False`` scores in float64; compare it with a tolerance and a
  tie-tolerant id check (:func:`assert_topk_close`).

All top-k outputs follow the kernels' layout: ``ids int64 (nq, k)`` padded with
-1, ``scores float32 (nq, k)`` padded with -inf (float64 for ``exact=False``),
``n_found int32 (nq,)``; rows sorted by score descending, ties by smaller doc id.
Only documents with at least one posting among the query's terms are
candidates, and documents disallowed by ``allow`` are never returned.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "check_csr_ref",
    "bm25_upper_bounds_ref",
    "bm25_scores_ref",
    "bm25_topk_ref",
    "impact_scores_ref",
    "impact_topk_ref",
    "topk_from_scores",
    "assert_topk_close",
]


def check_csr_ref(offsets: np.ndarray, doc_ids: np.ndarray, n_docs: int) -> None:
    """Raise ValueError when the CSR postings violate the structural contract."""
    offsets = np.asarray(offsets, dtype=np.int64)
    doc_ids = np.asarray(doc_ids, dtype=np.int64)
    if len(offsets) == 0 or offsets[0] != 0:
        raise ValueError("offsets[0] must be 0")
    if np.any(np.diff(offsets) < 0):
        raise ValueError("offsets must be non-decreasing")
    if offsets[-1] != len(doc_ids):
        raise ValueError("offsets[-1] must equal len(doc_ids)")
    if len(doc_ids) and (doc_ids.min() < 0 or doc_ids.max() >= n_docs):
        raise ValueError("doc ids must be < n_docs")
    for t in range(len(offsets) - 1):
        seg = doc_ids[offsets[t] : offsets[t + 1]]
        if np.any(np.diff(seg) <= 0):
            raise ValueError(f"doc_ids of term {t} must be strictly increasing")


def _tf_part32(tfs: np.ndarray, norms: np.ndarray) -> np.ndarray:
    f = tfs.astype(np.float32)
    return f / (f + norms.astype(np.float32))


def bm25_upper_bounds_ref(offsets, doc_ids, tfs, doc_norm, block_size: int = 128):
    """(term_ub f32[T], block_offsets u64[T+1], block_ub f32[n_blocks]), bit-exact."""
    T = len(offsets) - 1
    term_ub = np.zeros(T, dtype=np.float32)
    block_offsets = np.zeros(T + 1, dtype=np.uint64)
    block_ub: list[np.float32] = []
    for t in range(T):
        b, e = int(offsets[t]), int(offsets[t + 1])
        block_offsets[t] = len(block_ub)
        parts = _tf_part32(tfs[b:e], doc_norm[doc_ids[b:e]])
        for s in range(0, e - b, block_size):
            block_ub.append(np.float32(parts[s : s + block_size].max()))
        term_ub[t] = parts.max() if e > b else np.float32(0.0)
    block_offsets[T] = len(block_ub)
    return term_ub, block_offsets, np.asarray(block_ub, dtype=np.float32)


def bm25_scores_ref(offsets, doc_ids, tfs, doc_norm, terms, weights, *, exact: bool = True):
    """Scores of every document for one query and the candidate mask.

    Returns (scores (n_docs,), candidate bool (n_docs,)); float32 with the
    kernels' exact operation order when ``exact``, float64 otherwise.
    """
    n_docs = len(doc_norm)
    dtype = np.float32 if exact else np.float64
    acc = np.zeros(n_docs, dtype=dtype)
    cand = np.zeros(n_docs, dtype=bool)
    for t, w in zip(terms, weights):
        b, e = int(offsets[t]), int(offsets[t + 1])
        d = doc_ids[b:e].astype(np.int64)
        if exact:
            contrib = np.float32(w) * _tf_part32(tfs[b:e], doc_norm[d])
        else:
            f = tfs[b:e].astype(np.float64)
            contrib = float(w) * (f / (f + doc_norm[d].astype(np.float64)))
        acc[d] = acc[d] + contrib  # doc ids are unique within one term
        cand[d] = True
    return acc, cand


def impact_scores_ref(offsets, doc_ids, impacts, n_docs, terms, weights, *, exact: bool = True):
    """Impact scores of every document for one query and the candidate mask."""
    dtype = np.float32 if exact else np.float64
    acc = np.zeros(n_docs, dtype=dtype)
    cand = np.zeros(n_docs, dtype=bool)
    for t, w in zip(terms, weights):
        b, e = int(offsets[t]), int(offsets[t + 1])
        d = doc_ids[b:e].astype(np.int64)
        acc[d] = acc[d] + dtype(w) * impacts[b:e].astype(dtype)
        cand[d] = True
    return acc, cand


def topk_from_scores(scores: np.ndarray, cand: np.ndarray, k: int):
    """Top-k of the candidate docs: score descending, ties by smaller doc id.

    NaN scores are never returned. Returns (ids int64 (k,), scores (k,), n_found).
    """
    docs = np.flatnonzero(cand & ~np.isnan(scores))
    s = scores[docs]
    order = np.lexsort((docs, -s))[:k]
    n = len(order)
    ids = np.full(k, -1, dtype=np.int64)
    out = np.full(k, -np.inf, dtype=scores.dtype)
    ids[:n] = docs[order]
    out[:n] = s[order]
    return ids, out, n


def _batch_topk(score_fn, q_offsets, q_terms, q_weights, k, allow, n_docs, exact):
    nq = len(q_offsets) - 1
    ids = np.full((nq, k), -1, dtype=np.int64)
    scores = np.full((nq, k), -np.inf, dtype=np.float32 if exact else np.float64)
    n_found = np.zeros(nq, dtype=np.int32)
    for q in range(nq):
        b, e = int(q_offsets[q]), int(q_offsets[q + 1])
        if e == b:
            continue
        s, cand = score_fn(q_terms[b:e], q_weights[b:e])
        if allow is not None:
            cand &= np.asarray(allow[:n_docs]) != 0
        ids[q], scores[q], n_found[q] = topk_from_scores(s, cand, k)
    return ids, scores, n_found


def bm25_topk_ref(offsets, doc_ids, tfs, doc_norm, q_offsets, q_terms, q_weights, k,
                  allow=None, *, exact: bool = True):
    """Numpy twin of ``bm25_topk`` (any algorithm)."""
    if k < 1:
        raise ValueError("k must be >= 1")
    return _batch_topk(
        lambda terms, w: bm25_scores_ref(offsets, doc_ids, tfs, doc_norm, terms, w, exact=exact),
        q_offsets, q_terms, q_weights, k, allow, len(doc_norm), exact)


def impact_topk_ref(offsets, doc_ids, impacts, q_offsets, q_terms, q_weights, k,
                    allow=None, *, n_docs: int | None = None, exact: bool = True):
    """Numpy twin of ``impact_topk``."""
    if k < 1:
        raise ValueError("k must be >= 1")
    if n_docs is None:
        n_docs = int(doc_ids.max()) + 1 if len(doc_ids) else 0
        if allow is not None:
            n_docs = max(n_docs, len(allow))
    return _batch_topk(
        lambda terms, w: impact_scores_ref(offsets, doc_ids, impacts, n_docs, terms, w,
                                           exact=exact),
        q_offsets, q_terms, q_weights, k, allow, n_docs, exact)


def assert_topk_close(ids, scores, n_found, ref_ids, ref_scores, ref_n_found, *,
                      rel: float = 1e-5, abs_tol: float = 1e-6) -> None:
    """Tie-tolerant comparison of kernel output with a (float64) oracle.

    Per query: n_found must match; the k scores must match within tolerance;
    every id whose oracle score is clearly above the k-th oracle score must be
    returned, and every returned id's oracle rank slot must hold a close score.
    """
    np.testing.assert_array_equal(n_found, ref_n_found)
    for q in range(len(n_found)):
        n = int(n_found[q])
        got_s = scores[q, :n].astype(np.float64)
        ref_s = ref_scores[q, :n].astype(np.float64)
        np.testing.assert_allclose(got_s, ref_s, rtol=rel, atol=abs_tol)
        assert np.all(ids[q, n:] == -1)
        assert np.all(np.isneginf(scores[q, n:]))
        if n == 0:
            continue
        kth = ref_s[-1]
        tol = rel * abs(kth) + abs_tol
        must = set(ref_ids[q, :n][ref_s > kth + tol].tolist())
        got = set(ids[q, :n].tolist())
        assert len(got) == n, "duplicate ids in a row"
        assert must <= got, f"query {q}: missing ids {sorted(must - got)}"
