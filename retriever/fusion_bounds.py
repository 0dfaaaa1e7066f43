"""Each leg's theoretical score range for a query: what the ``tmm`` and ``theoretical``
normalisations of :mod:`retriever.fusion` divide by (Bruch, Gai & Ingber, "An Analysis of Fusion
Functions for Hybrid Retrieval", ACM TOIS 2023, normalise by the scoring function's theoretical
bounds instead of the retrieved list's).

Per leg, for one query q (``inf`` ≤ every document's score ≤ ``sup``):

- **BM25** (Lucene's formula, :mod:`retriever.legs.bm25`): score = Σ_t n_q(t) · idf(t) ·
  tf/(tf + k1·(1 − b + b·dl/avgdl)). The tf part lies in [0, 1) for any k1 > 0, b, tf and dl, so
  ``inf = 0`` (no query term in the document) and ``sup = Σ_t n_q(t) · idf(t)`` (the query's term
  weights, as the leg's analysed batch holds them). The classic Robertson–Spärck Jones form
  multiplies the tf part by (k1 + 1); Lucene's (and ours) does not, so the bound has no (k1 + 1).
- **Learned sparse**: score = scale · Σ_t w_q(t) · impact(t, d) with impacts in [0, max_t], max_t
  the largest stored impact of term t in the held shards: ``sup = scale · Σ_t max(0, w_q(t)·max_t)``
  and ``inf = scale · Σ_t min(0, w_q(t)·max_t)`` (0 for SPLADE's non-negative weights).
- **Dense**: inner product ⟨q, d⟩ ∈ [−‖q‖·max‖d‖, ‖q‖·max‖d‖] (Cauchy–Schwarz), max‖d‖ over the
  held shards' stored vectors (float32 arithmetic on the stored float16 / float32 values); for the
  default normalised embeddings this is cosine's [−1, 1] up to rounding.

Computed in float64 per query from the prepared batch (no document is scored). Per-term and
per-shard maxima are computed once per :class:`LegBounds` (i.e. per opened index).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from retriever.index.errors import QueryError


def _per_query_sums(q_offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """float64 (nq,) sums of ``values`` over each query's slice ``q_offsets[i]:q_offsets[i+1]``."""
    offs = np.asarray(q_offsets, dtype=np.int64)
    nq = len(offs) - 1
    qidx = np.repeat(np.arange(nq), np.diff(offs))
    return np.bincount(qidx, weights=np.asarray(values, np.float64), minlength=nq).astype(np.float64)


class LegBounds:
    """Theoretical score ranges of an engine's legs (see the module docstring).

    Args:
        legs: the engine's leg objects by name.
    """

    def __init__(self, legs: Mapping[str, Any]) -> None:
        self.legs = legs

    def bounds(self, name: str, prepared: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(inf float64 (nq,), sup float64 (nq,))`` of leg ``name`` for the prepared batch.

        Raises:
            QueryError: a leg without known bounds.
        """
        leg = self.legs[name]
        if name == "bm25":
            q_off, _, q_w = leg.batch_of(prepared, 1)
            sup = _per_query_sums(q_off, np.maximum(np.asarray(q_w, np.float64), 0.0))
            inf = _per_query_sums(q_off, np.minimum(np.asarray(q_w, np.float64), 0.0))
            return inf, sup
        if name == "sparse":
            q_off, q_terms, q_w = prepared.batch
            t = np.asarray(q_terms, dtype=np.int64)
            tmax = leg._term_max_impact()  # per-term largest uint16 impact over the held shards
            ok = (t >= 0) & (t < len(tmax))
            c = np.where(ok, np.asarray(q_w, np.float64) * tmax[np.where(ok, t, 0)], 0.0) * float(leg.scale)
            return _per_query_sums(q_off, np.minimum(c, 0.0)), _per_query_sums(q_off, np.maximum(c, 0.0))
        if name == "dense":
            qn = np.linalg.norm(np.asarray(prepared.q, np.float64), axis=1)
            r = qn * self.dense_norm_max()
            return -r, r
        raise QueryError(f"no theoretical score range is known for leg {name!r}")

    def dense_norm_max(self) -> float:
        """The largest L2 norm of the dense leg's stored document vectors over its shards (0.0 for
        no documents; each shard's computed once by :meth:`retriever.legs.dense.DenseLeg.max_norm`)."""
        leg = self.legs["dense"]
        return max((leg.max_norm(i) for i in range(len(leg.vectors))), default=0.0)