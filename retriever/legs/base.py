"""The leg protocol: what the engine asks of every retrieval leg (BM25, learned sparse, dense).

The engine owns the loop over shards (:func:`retriever.engine.search_leg`); a leg only knows how
to prepare a batch of queries once and how to search, or score documents of, one shard::

    prepared = leg.prepare(queries, params, n_threads)       # analyse / encode once
    for shard in range(leg.n_shards):                        # the engine's loop
        ids, scores, n_found = leg.search_shard(prepared, shard, ctx)
    merged = leg.search_shards(prepared, range(leg.n_shards), ctx)   # ... or all at once
    scores = leg.score_docs(prepared, shard, offsets, ordinals)   # exact scores of given documents

Per-shard results carry *global* ordinals (the shard's base added), rows sorted by score
descending then ordinal ascending, padded with -1 / -inf after ``n_found``: the shape FAISS's
``merge_knn_results`` merges. Corpus-wide statistics come from a :class:`~retriever.stats.CorpusStats`
given to the leg at construction, so one shard's search does not depend on which other shards
this process holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np

from retriever.index.errors import QueryError

from ..topk import merge_topk

#: one shard's (or a merged) top-k: ids int64 (nq, k) global ordinals, scores float32 (nq, k),
#: n_found int32 (nq,)
TopK = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class SearchContext:
    """What every shard search of one call needs besides the prepared queries.

    Attributes:
        depth: hits wanted per query from each shard (the leg's candidate depth, >= 1).
        n_threads: kernel threads of this call (>= 1); FAISS's OpenMP team and BLAS are held to it.
        allow: per shard (indexed like the index's shards) a uint8 array of the shard's rows
            (1 = may be returned) or ``None`` for "every row"; ``None`` for no mask at all.
            Filters and deletes are applied through it, before top-k.
    """

    depth: int
    n_threads: int
    allow: Sequence[np.ndarray | None] | None = None

    def allow_for(self, shard: int) -> np.ndarray | None:
        """The allow mask of shard ``shard`` (``None``: every row may be returned)."""
        return None if self.allow is None else self.allow[shard]


@dataclass(frozen=True)
class ShardMask:
    """One shard's allow mask as a leg uses it (:func:`shard_mask`).

    Attributes:
        allow: uint8 C-contiguous (rows,) mask (1 = may be returned), or ``None`` when every row
            passes (the leg then runs its unfiltered path: same results, no per-row test).
        n_pass: rows that pass (``rows`` when ``allow`` is None).
        rows: the shard's rows.
    """

    allow: np.ndarray | None
    n_pass: int
    rows: int

    @property
    def fraction(self) -> float:
        """Passing fraction of the shard's rows (1.0 for an empty shard)."""
        return self.n_pass / self.rows if self.rows else 1.0

    def passing(self) -> np.ndarray:
        """int64 shard-local rows that pass, ascending."""
        return np.arange(self.rows, dtype=np.int64) if self.allow is None else np.flatnonzero(self.allow)


def shard_mask(ctx: "SearchContext", shard: int, rows: int, label: str) -> ShardMask:
    """``ctx``'s allow mask of shard position ``shard``, checked at the leg boundary.

    Args:
        ctx: the call's context.
        shard: the shard's position in the leg.
        rows: the shard's rows (the mask's required length).
        label: how errors name the shard (e.g. its directory name).

    Returns:
        a :class:`ShardMask`; a mask in which every row passes is returned as ``allow=None``.

    Raises:
        QueryError: a mask that is not a 1-D uint8 array of exactly ``rows`` entries (names the
            shard, the expected and the given length and dtype).
    """
    m = ctx.allow_for(shard)
    if m is None:
        return ShardMask(None, rows, rows)
    if not isinstance(m, np.ndarray) or m.dtype != np.uint8 or m.ndim != 1 or len(m) != rows:
        got = (f"dtype {m.dtype}, shape {m.shape}" if isinstance(m, np.ndarray) else type(m).__name__)
        raise QueryError(f"allow mask of shard {label}: expected a uint8 array of the shard's {rows} rows, "
                         f"got {got}")
    m = np.ascontiguousarray(m)
    n_pass = int(np.count_nonzero(m))
    return ShardMask(None if n_pass == rows else m, n_pass, rows)


def check_candidates(offsets: np.ndarray, ordinals: np.ndarray, nq: int, n_docs: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``score_docs``' candidate lists, checked: int64 ``offsets`` (nq + 1 non-decreasing values
    from 0 to ``len(ordinals)``) and int64 ``ordinals`` in ``[0, n_docs)``.

    Raises:
        QueryError: offsets that do not fit, or an ordinal outside the shard (names it).
    """
    offs = np.asarray(offsets, dtype=np.int64)
    ords = np.asarray(ordinals, dtype=np.int64)
    if len(offs) != nq + 1 or offs[0] != 0 or offs[-1] != len(ords) or (np.diff(offs) < 0).any():
        raise QueryError(f"candidate offsets must be {nq + 1} non-decreasing values from 0 to {len(ords)}")
    if len(ords) and (ords.min() < 0 or ords.max() >= n_docs):
        bad = int(ords.min()) if ords.min() < 0 else int(ords.max())
        raise QueryError(f"document ordinal {bad} is outside the shard's [0, {n_docs})")
    return offs, ords


def empty_topk(nq: int, k: int) -> TopK:
    """A top-k with no hits: ids -1, scores -inf, n_found 0."""
    return np.full((nq, k), -1, np.int64), np.full((nq, k), -np.inf, np.float32), np.zeros(nq, np.int32)


@runtime_checkable
class Leg(Protocol):
    """A retrieval leg over the shards of one opened index.

    Attributes:
        name: ``"bm25"``, ``"dense"`` or ``"sparse"``.
        n_shards: shards this leg holds (the index's, in order).
    """

    name: ClassVar[str]
    n_shards: int

    def prepare(self, queries: Sequence[str], params: Any, n_threads: int) -> Any:
        """Analyse or encode ``queries`` once for every shard; ``params`` is the leg's parameter
        object (:mod:`retriever.params`). Returns a leg-specific prepared batch, which has an
        ``n_queries`` attribute."""

    def prepare_vectors(self, vectors: Any, params: Any, n_threads: int) -> Any:
        """A prepared batch from user-supplied query representations (query vectors) instead of
        text (legs without such an input raise QueryError)."""

    def search_shard(self, prepared: Any, shard: int, ctx: SearchContext) -> TopK:
        """Top-``ctx.depth`` of shard ``shard`` for every prepared query (global ordinals)."""

    def search_shards(self, prepared: Any, shards: Sequence[int], ctx: SearchContext) -> TopK:
        """Top-``ctx.depth`` of the union of shards ``shards``, merged: equal to :meth:`search_shard`
        on each merged by :func:`retriever.topk.merge_topk` (:func:`search_each_shard` is that
        default; a leg may search its shards together, e.g. with one threshold across them)."""

    def score_docs(self, prepared: Any, shard: int, offsets: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
        """Exact scores of given documents of shard ``shard``: for query i the shard-local
        ordinals ``ordinals[offsets[i]:offsets[i+1]]`` (int64); float32 scores aligned with
        ``ordinals`` (what :meth:`search_shard` would report for them; 0 for a document the query
        does not match in a sparse leg)."""


def search_each_shard(leg: Leg, prepared: Any, shards: Sequence[int], ctx: SearchContext, nq: int) -> TopK:
    """``leg.search_shard`` on each of ``shards``, merged once (:func:`retriever.topk.merge_topk`:
    score descending, then ordinal); ``empty_topk(nq, ctx.depth)`` for no shards. The plain
    :meth:`Leg.search_shards`."""
    parts = [leg.search_shard(prepared, shard, ctx) for shard in shards]
    return merge_topk(parts, ctx.depth) if parts else empty_topk(nq, ctx.depth)
