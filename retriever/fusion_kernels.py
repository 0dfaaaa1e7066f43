"""Compiled (numba, GIL released) reciprocal rank fusion of whole batches: the fast path of
:func:`retriever.fusion.fuse` for :class:`~retriever.fusion.RRF`.

Same arithmetic as the numpy reference loop in :mod:`retriever.fusion`, operation for operation, so
the outputs are bit-identical (tested in ``tests/test_fusion.py``): a leg's rank is 1 + the first
position of its score in the (descending) row; a candidate's contribution is
``weight / (k + rank)`` in float64; a document's fused score is the float64 sum of its
contributions in leg order (then position order), starting from 0.0 — the order ``np.bincount``
adds them in; the top k are ordered by fused score descending, ties by smaller ordinal, and the
fused score is rounded to float32 once. A single-query call costs a few microseconds instead of the
reference loop's ~40 numpy calls (~0.3 ms at depth 100 and three legs).
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True, nogil=True)
def rrf_fuse_rows(ids: np.ndarray, scores: np.ndarray, n_found: np.ndarray, leg_start: np.ndarray,
                  weights: np.ndarray, rrf_k: float, k: int, out_ids: np.ndarray, out_scores: np.ndarray,
                  out_n: np.ndarray, leg_scores: np.ndarray, leg_ranks: np.ndarray) -> None:
    """RRF over every query of a batch, writing into preallocated outputs.

    Args:
        ids: int64 (nq, D) every leg's candidate ids side by side (leg l in columns
            ``leg_start[l]:leg_start[l+1]``), global ordinals.
        scores: float32 (nq, D) their leg scores, each leg's row sorted descending.
        n_found: int32 (L, nq) valid candidates of leg l in row q (a prefix of its columns).
        leg_start: int64 (L + 1,) column offsets of the legs.
        weights: float64 (L,) leg weights.
        rrf_k: the RRF constant (>= 0).
        k: fused list length (>= 1).
        out_ids: int64 (nq, k) filled with -1; out_scores: float32 (nq, k) filled with -inf;
            out_n: int32 (nq,) zeros; leg_scores: float32 (L, nq, k) NaN; leg_ranks: int32
            (L, nq, k) zeros — written where the query has hits.
    """
    nq = ids.shape[0]
    n_legs = leg_start.shape[0] - 1
    width = ids.shape[1]
    cand = np.empty(width, np.int64)
    contrib = np.empty(width, np.float64)
    rank = np.empty(width, np.int32)
    col = np.empty(width, np.int64)
    legof = np.empty(width, np.int64)
    group = np.empty(width, np.int64)
    uniq = np.empty(width, np.int64)
    total = np.empty(width, np.float64)
    slot = np.empty(width, np.int64)
    for q in range(nq):
        n = 0
        for leg in range(n_legs):
            c0 = leg_start[leg]
            m = n_found[leg, q]
            w = weights[leg]
            r = 1
            for j in range(m):
                if j > 0 and scores[q, c0 + j] != scores[q, c0 + j - 1]:
                    r = j + 1
                cand[n] = ids[q, c0 + j]
                rank[n] = r
                contrib[n] = w / (rrf_k + r)
                col[n] = c0 + j
                legof[n] = leg
                n += 1
        if n == 0:
            continue
        order = np.argsort(cand[:n], kind="mergesort")  # stable: equal ids keep leg/position order
        nu = -1
        prev = np.int64(0)
        for t in range(n):
            i = order[t]
            if nu < 0 or cand[i] != prev:
                nu += 1
                uniq[nu] = cand[i]
                total[nu] = 0.0
                prev = cand[i]
            total[nu] += contrib[i]
            group[i] = nu
        nu += 1
        neg = np.empty(nu, np.float64)
        for u in range(nu):
            neg[u] = -total[u]
        top = np.argsort(neg, kind="mergesort")  # uniq ascending: ties go to the smaller ordinal
        m = min(k, nu)
        for u in range(nu):
            slot[u] = -1
        for t in range(m):
            u = top[t]
            slot[u] = t
            out_ids[q, t] = uniq[u]
            out_scores[q, t] = total[u]
        out_n[q] = m
        for i in range(n):
            t = slot[group[i]]
            if t >= 0:
                leg_scores[legof[i], q, t] = scores[q, col[i]]
                leg_ranks[legof[i], q, t] = rank[i]
