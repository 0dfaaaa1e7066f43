"""Full-score fusion: every leg scores every candidate of the union of the legs' lists exactly.

Without it, a leg's normalisation (min-max, z-score, ...) sees only the documents that leg
returned, and a document another leg found contributes nothing for it — an implicit score of
"nothing", although the leg does give that document a score. Here, for each query:

1. the union U of the legs' candidate lists (global ordinals, ascending) is formed;
2. every leg scores every document of U with ``leg.score_docs`` (BM25 from the postings, learned
   sparse from the forward index, dense by inner product; bit-identical to what the leg's search
   reports for the documents it returned, 0 for a document a sparse leg does not match);
3. each leg's list becomes U sorted by that leg's exact score (descending, ties by the smaller
   ordinal: the legs' own order), and :func:`retriever.fusion.fuse` fuses these complete lists
   (RRF ranks and every normalisation then see the same documents in every leg).

Its cost is ``score_docs`` over |U| ≤ Σ depths documents per leg and query, reported by the engine
as ``timings["full_score"]``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .legs.base import TopK


def union_rows(lists: Sequence[TopK]) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the union of several candidate lists.

    Args:
        lists: ``(ids int64 (nq, d_i), scores, n_found int32 (nq,))`` per leg (padding -1).

    Returns:
        ``(ids int64 (nq, W), n int32 (nq,))``: each row's distinct ordinals ascending, padded
        with -1 after ``n``; ``W`` the largest union (at least 1).
    """
    nq = lists[0][0].shape[0]
    parts = []
    for ids, _, nf in lists:
        valid = np.arange(ids.shape[1])[None, :] < np.asarray(nf)[:, None]
        parts.append(np.where(valid & (ids >= 0), ids, np.iinfo(np.int64).max))
    cat = np.sort(np.concatenate(parts, axis=1), axis=1)
    big = np.iinfo(np.int64).max
    keep = cat != big
    keep[:, 1:] &= cat[:, 1:] != cat[:, :-1]
    n = keep.sum(axis=1).astype(np.int32)
    width = max(1, int(n.max()) if nq else 1)
    out = np.full((nq, width), -1, dtype=np.int64)
    rows, cols = np.nonzero(keep)
    pos = np.arange(len(rows)) - np.repeat(np.concatenate(([0], np.cumsum(n)[:-1])), n)
    out[rows, pos] = cat[rows, cols]
    return out, n


def score_union(leg: Any, prepared: Any, prep_row: np.ndarray, ids: np.ndarray, n: np.ndarray,
                bases: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Exact scores of leg ``leg`` for the candidates ``ids`` (``score_docs`` shard by shard).

    Args:
        leg: a leg object (:class:`retriever.legs.base.Leg`).
        prepared: its prepared batch.
        prep_row: int64 (nq,) row of each query in ``prepared`` (-1: a query that was not
            prepared, a blank one: every candidate scores 0, the score of an empty query).
        ids: int64 (nq, W) global ordinals ascending per row, -1 after ``n``.
        n: int32 (nq,) candidates per row.
        bases, rows: int64 (leg.n_shards,) first global ordinal and row count of each of the
            leg's shards.

    Returns:
        float32 (nq, W): the scores, NaN at padding.
    """
    nq, width = ids.shape
    out = np.full((nq, width), np.nan, dtype=np.float32)
    valid = np.arange(width)[None, :] < n[:, None]
    unprepared = valid & (prep_row < 0)[:, None]
    out[unprepared] = 0.0
    valid &= ~unprepared
    n_prep = prepared.n_queries
    for s in range(len(bases)):
        inside = valid & (ids >= bases[s]) & (ids < bases[s] + rows[s])
        if not inside.any():
            continue
        qr, qc = np.nonzero(inside)  # row-major: query by query, ordinals ascending
        pr = prep_row[qr]
        counts = np.bincount(pr, minlength=n_prep)
        offsets = np.zeros(n_prep + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        order = np.argsort(pr, kind="stable")  # grouped by prepared row (prep rows ascend with qr)
        local = (ids[qr, qc] - bases[s])[order]
        scores = leg.score_docs(prepared, s, offsets, local)
        out[qr[order], qc[order]] = scores
    return out


def complete_lists(legs: Mapping[str, Any], prepared: Mapping[str, tuple[Any, np.ndarray]],
                   per_leg: Mapping[str, TopK], bases: Mapping[str, tuple[np.ndarray, np.ndarray]]
                   ) -> dict[str, TopK]:
    """Each leg's candidate list replaced by the union of all legs' lists, scored exactly by
    that leg and sorted by its score (descending, ties by the smaller ordinal).

    Args:
        legs: leg objects by name.
        prepared: per leg ``(prepared batch, prep_row int64 (nq,))`` (see :func:`score_union`).
        per_leg: the legs' own top-d lists over the same nq queries.
        bases: per leg ``(bases, rows)`` of its shards (see :func:`score_union`).

    Returns:
        ``{leg: (ids int64 (nq, W), scores float32 (nq, W), n_found int32 (nq,))}`` in the shape
        :func:`retriever.fusion.fuse` takes.
    """
    names = list(per_leg)
    ids, n = union_rows([per_leg[name] for name in names])
    out: dict[str, TopK] = {}
    pad = ids < 0
    for name in names:
        prep, prep_row = prepared[name]
        if prep is None:  # no query was prepared (all blank): every candidate scores 0
            s = np.where(ids >= 0, np.float32(0.0), np.float32(np.nan)).astype(np.float32)
        else:
            s = score_union(legs[name], prep, prep_row, ids, n, *bases[name])
        key = np.where(pad, np.inf, -s.astype(np.float64))  # padding last
        order = np.lexsort((np.where(pad, np.iinfo(np.int64).max, ids), key), axis=-1)
        sid = np.take_along_axis(ids, order, axis=1)
        ss = np.take_along_axis(np.where(pad, -np.inf, s), order, axis=1).astype(np.float32)
        out[name] = (sid, ss, n.copy())
    return out


def prep_rows(blank: np.ndarray, given: bool) -> np.ndarray:
    """int64 (nq,) row of each query in a leg's prepared batch: all rows when the batch was given
    (it covers every query), else the non-blank queries in order and -1 for blank ones."""
    if given or not blank.any():
        return np.arange(len(blank), dtype=np.int64)
    out = np.full(len(blank), -1, dtype=np.int64)
    out[~blank] = np.arange(int((~blank).sum()))
    return out


def fusion_inputs(engine: Any, per_leg: Mapping[str, TopK], preps: Mapping[str, tuple[Any, bool]],
                  blank: np.ndarray, fusion: Any
                  ) -> tuple[dict[str, TopK], dict[str, tuple[np.ndarray, np.ndarray]] | None, float]:
    """What :func:`retriever.fusion.fuse` takes for ``fusion`` after the engine's leg searches.

    Args:
        engine: the :class:`retriever.engine.Engine` (its legs, reader, shard positions and
            :class:`retriever.fusion_bounds.LegBounds`).
        per_leg: the legs' top-d lists over all nq queries.
        preps: per leg ``(prepared batch or None, given)`` (``given``: the batch covers all nq
            queries; otherwise the non-blank ones).
        blank: bool (nq,) blank queries.
        fusion: the :class:`~retriever.fusion.RRF` / :class:`~retriever.fusion.Linear` setting.

    Returns:
        ``(lists, bounds, full_score_ms)``: the legs' lists (complete ones under
        ``fusion.full_score``, :func:`complete_lists`), each leg's theoretical range per query
        when the normalisation needs it (else None), and the milliseconds spent scoring the union.
    """
    import time

    rows = {n: prep_rows(blank, g) for n, (_, g) in preps.items()}
    full_ms = 0.0
    lists = dict(per_leg)
    if fusion.full_score:
        t0 = time.perf_counter()
        bases = {}
        for n in per_leg:
            shards = [engine.reader.shards[i] for i in engine.shard_ids]
            bases[n] = (np.array([s.base for s in shards], np.int64), np.array([s.rows for s in shards], np.int64))
        lists = complete_lists(engine.legs, {n: (preps[n][0], rows[n]) for n in per_leg}, per_leg, bases)
        full_ms = (time.perf_counter() - t0) * 1e3
    bounds = None
    if getattr(fusion, "needs_bounds", False):
        if not getattr(engine, "computes_bounds", True):
            from retriever.index.errors import QueryError

            raise QueryError(f"fusion {fusion.to_dict().get('method')} with normalisation "
                             f"{fusion.to_dict().get('norm', 'tmm')!r} needs each leg's theoretical score range, "
                             f"which an engine on Ray does not compute; use rrf, dbsf, or linear with minmax or zscore")
        bounds = {}
        for n in per_leg:
            prep = preps[n][0]
            nq = len(blank)
            inf, sup = np.zeros(nq), np.zeros(nq)
            if prep is not None:
                lo, hi = engine.bounds.bounds(n, prep)
                ok = rows[n] >= 0
                inf[ok], sup[ok] = lo[rows[n][ok]], hi[rows[n][ok]]
            bounds[n] = (inf, sup)
    return lists, bounds, full_ms
