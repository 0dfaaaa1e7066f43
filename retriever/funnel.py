"""Funnel-search helper: choosing the smallest Matryoshka prefix that reaches a recall target.

Funnel search (AdANNS, Rege et al., NeurIPS 2023) searches a short prefix of Matryoshka embeddings
(Kusupati et al., NeurIPS 2022) and re-scores a shortlist at full dimension; the search itself is
:meth:`retriever.legs.dense.DenseLeg.search_shard` (``leg_params={"dense": {...}}``). This module
measures it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from retriever.index.errors import QueryError

from .bench import exact_search
from .metrics import recall_at_k


def choose_prefix_dim(retriever: Any, query_vectors: np.ndarray, *, target_recall: float = 0.99, k: int = 10,
                      dims: Sequence[int] | None = None, **dense_params: Any) -> dict[str, Any]:
    """Smallest prefix dimension whose funnel search reaches ``target_recall`` on sample queries.

    Args:
        retriever: an open :class:`retriever.Retriever` with a dense leg.
        query_vectors: float32 (nq, d) sample queries in the model's space.
        target_recall: recall@k (:func:`retriever.metrics.recall_at_k`) against exact
            full-dimension search (:func:`retriever.bench.exact_search`) to reach, in (0, 1].
        k: cut-off.
        dims: candidate prefix dims (default: the index's Matryoshka dims, else 32, 64, ... d).
        **dense_params: other funnel options passed through (``shortlist``, ``index``, ``nprobe``...).

    Returns:
        ``{"dim": chosen dim or None if none reached the target, "recall": {dim: recall}, "k": k,
        "target_recall": target_recall}``; dims are tried in ascending order and the search stops
        at the first that reaches the target.

    Raises:
        QueryError: no dense leg, bad ``target_recall``, bad dims, or an exact search that
            finds no document for any query (an empty index).
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
    exact = exact_search(retriever, names, k=k, mode="dense", query_vectors=qv)["dense"]
    recall: dict[int, float] = {}
    for d in dims:
        got = retriever.search_arrays(names, k, mode="dense", query_vectors=qv,
                                      leg_params={"dense": {**dense_params, "dim": d}}).ids
        r = recall_at_k(got, exact, k)
        if r is None:
            raise QueryError("choose_prefix_dim: exact search found no document for any sample query")
        recall[d] = r
        if recall[d] >= target_recall:
            return {"dim": d, "recall": recall, "k": k, "target_recall": target_recall}
    return {"dim": None, "recall": recall, "k": k, "target_recall": target_recall}
