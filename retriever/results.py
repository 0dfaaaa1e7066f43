"""Result types: per-hit objects for users, and array results for evaluation and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

import numpy as np


class LegHit(NamedTuple):
    """One leg's view of a hit (an immutable named tuple).

    Attributes:
        score: the leg's raw score (BM25 score, impact dot product, inner product).
        rank: 1-based rank in that leg's merged candidate list; documents with exactly equal
            scores share the best of their positions (the rank RRF uses).
    """

    score: float
    rank: int


class Hit(NamedTuple):
    """One search result (an immutable named tuple: cheap to make, a few thousand per batch).

    Attributes:
        id: document id from the corpus.
        score: fused score in hybrid mode, otherwise the leg's raw score.
        rank: 1-based position in the result list.
        title, text: stored document fields.
        metadata: the record's other fields (parsed JSON object).
        legs: ``{leg: LegHit}`` for the legs that returned this document.
    """

    id: str
    score: float
    rank: int
    title: str | None
    text: str | None
    metadata: Mapping[str, Any]
    legs: Mapping[str, LegHit]


@dataclass(frozen=True)
class LegArrays:
    """Per-leg scores and ranks aligned with a :class:`BatchResult`'s ``ids``.

    Attributes:
        scores: float32 (nq, k); NaN where the leg did not return that document.
        ranks: int32 (nq, k); 1-based tie-shared rank, 0 where absent.
    """

    scores: np.ndarray
    ranks: np.ndarray


@dataclass(frozen=True)
class BatchResult:
    """Array form of a batch of searches.

    Attributes:
        ids: int64 (nq, k) global document ordinals (corpus order), padded with -1 past ``n_found``.
        scores: float32 (nq, k), padded with -inf past ``n_found``.
        n_found: int32 (nq,) number of real hits per query.
        legs: ``{leg: LegArrays}`` for every leg that ran.
        mode: ``"hybrid"``, ``"bm25"``, ``"dense"`` or ``"sparse"``.
        fusion: the fusion configuration used (``None`` for a single leg), with ``legs`` and the
            depth the legs were searched at: ``depths`` per leg when the fusion sets them (they
            override the call's depth), else ``depth``.
        timings_ms: wall time per stage in milliseconds (``encode``, ``search``, ``fuse``; ``encode``
            and ``search`` are summed over the legs, also when they ran side by side) and, for
            several legs, ``leg:<name>`` (that leg's encode + search wall time). BM25 query
            analysis counts as ``search`` where it runs in one compiled pass with the scoring
            (``BM25Leg.prepare`` plans it for a batch of 16 or more queries on a one-shard index scored
            exhaustively).
        generation: the index generation searched (its ordinals name that generation's
            documents; :meth:`retriever.Retriever.to_hits` checks it), or ``None``.
    """

    ids: np.ndarray
    scores: np.ndarray
    n_found: np.ndarray
    legs: Mapping[str, LegArrays]
    mode: str
    fusion: Mapping[str, Any] | None = None
    timings_ms: Mapping[str, float] = field(default_factory=dict)
    generation: int | None = None
