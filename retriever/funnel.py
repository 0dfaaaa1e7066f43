"""Funnel-search helpers: recall against exact search and choosing the smallest Matryoshka prefix.

Funnel search (AdANNS, Rege et al., NeurIPS 2023) searches a short prefix of Matryoshka embeddings
(Kusupati et al., NeurIPS 2022) and re-scores a shortlist at full dimension; the search itself is
:meth:`retriever.legs.dense.DenseLeg.search_shard` (``leg_params={"dense": {...}}``). This module
measures it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from retriever.index.errors import QueryError


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean recall@k of ``found`` against ``truth`` (e.g. exact full-dimension search).

    Args:
        found: int64 (nq, >= k) result ordinals (-1 padding ignored).
        truth: int64 (nq, >= k) reference ordinals (-1 padding ignored).
        k: cut-off.

    Returns:
        mean over queries of |found[:k] ∩ truth[:k]| / |truth[:k]| (queries with an empty
        reference count 1.0).

    Raises:
        QueryError: shapes that do not match or ``k`` < 1.
    """
    found = np.asarray(found)
    truth = np.asarray(truth)
    if k < 1 or found.ndim != 2 or truth.ndim != 2 or found.shape[0] != truth.shape[0]:
        raise QueryError(f"recall_at_k: need k >= 1 and (nq, k) arrays, got k={k}, {found.shape}, {truth.shape}")
    vals = []
    for f, t in zip(found[:, :k], truth[:, :k]):
        t = set(t[t >= 0].tolist())
        vals.append(1.0 if not t else len(t & set(f[f >= 0].tolist())) / len(t))
    return float(np.mean(vals)) if vals else 1.0


def choose_prefix_dim(retriever: Any, query_vectors: np.ndarray, *, target_recall: float = 0.99, k: int = 10,
                      dims: Sequence[int] | None = None, **dense_params: Any) -> dict[str, Any]:
    """Smallest prefix dimension whose funnel search reaches ``target_recall`` on sample queries.

    Args:
        retriever: an open :class:`retriever.Retriever` with a dense leg.
        query_vectors: float32 (nq, d) sample queries in the model's space.
        target_recall: recall@k against exact full-dimension search to reach, in (0, 1].
        k: cut-off.
        dims: candidate prefix dims (default: the index's Matryoshka dims, else 32, 64, ... d).
        **dense_params: other funnel options passed through (``shortlist``, ``index``, ``nprobe``...).

    Returns:
        ``{"dim": chosen dim or None if none reached the target, "recall": {dim: recall}, "k": k,
        "target_recall": target_recall}``; dims are tried in ascending order and the search stops
        at the first that reaches the target.

    Raises:
        QueryError: no dense leg, bad ``target_recall``, or bad dims.
    """
    if not 0 < target_recall <= 1:
        raise QueryError(f"target_recall must be in (0, 1], got {target_recall!r}")
    if "dense" not in retriever.engine.legs:
        raise QueryError("choose_prefix_dim needs an index with a dense leg")
    leg = retriever.engine.legs["dense"]
    qv = np.asarray(query_vectors, dtype=np.float32)
    if dims is None:
        dims = leg.matryoshka_dims or tuple(d for d in (32, 64, 128, 256, 512, 768, 1024) if d < leg.dim) + (leg.dim,)
    dims = sorted(int(d) for d in dims)
    names = ["q"] * qv.shape[0]
    exact = retriever.search_arrays(names, k, mode="dense", query_vectors=qv).ids
    recall: dict[int, float] = {}
    for d in dims:
        got = retriever.search_arrays(names, k, mode="dense", query_vectors=qv,
                                      leg_params={"dense": {**dense_params, "dim": d}}).ids
        recall[d] = recall_at_k(got, exact, k)
        if recall[d] >= target_recall:
            return {"dim": d, "recall": recall, "k": k, "target_recall": target_recall}
    return {"dim": None, "recall": recall, "k": k, "target_recall": target_recall}
