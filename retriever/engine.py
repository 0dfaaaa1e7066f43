"""Runs one batch: prepare queries once per leg, search every shard of every leg (the legs side by
side when threads allow), merge each leg's per-shard top-k once, fuse once.

The engine owns the loop over shards (:func:`search_leg`); the legs implement the protocol of
:mod:`retriever.legs.base` (``prepare`` / ``search_shard`` / ``score_docs``).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from retriever.index.errors import QueryError

from .fusion import RRF, Linear, fuse, tie_ranks_rows
from .fusion_bounds import LegBounds
from .legs.base import Leg, SearchContext, TopK, empty_topk
from .params import LegParams, defaults_for
from .results import BatchResult, LegArrays
from .shards import IndexReader
from .stats import CorpusStats
from .threads import thread_limits

MODES = ("hybrid", "bm25", "dense", "sparse")


def _load_bm25(reader: IndexReader, shards: Sequence[int] | None, stats: CorpusStats | None, **kw: Any) -> Leg:
    from .legs.bm25 import BM25Leg
    return BM25Leg(reader, shards=shards, stats=None if stats is None else stats.bm25, cache=kw.get("cache"))


def _load_dense(reader: IndexReader, shards: Sequence[int] | None, stats: CorpusStats | None, **kw: Any) -> Leg:
    from .legs.dense import DenseLeg
    return DenseLeg(reader, shards=shards, use_gpu=kw.get("use_gpu"), device=kw.get("device", "cpu"),
                    cache=kw.get("cache"), model=kw.get("dense_model"))


def _load_sparse(reader: IndexReader, shards: Sequence[int] | None, stats: CorpusStats | None, **kw: Any) -> Leg:
    from .legs.sparse import SparseLeg
    return SparseLeg(reader, shards=shards, device=kw.get("device", "cpu"), cache=kw.get("cache"),
                     model=kw.get("sparse_model"))


#: leg name → loader(reader, shards, stats, **options); the library, the CLI and the benchmarks read this table.
LEG_LOADERS: dict[str, Callable[..., Leg]] = {"bm25": _load_bm25, "dense": _load_dense, "sparse": _load_sparse}

#: weight of the newest sample in each leg's running cost estimate (ms per query), which decides
#: the order in which the threads take the legs.
COST_SMOOTHING = 0.2
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """Process-wide worker threads that run the legs of a hybrid batch concurrently (created on
    first use, kept for the life of the process so a query does not pay thread start-up)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=max(2, len(LEG_LOADERS) - 1), thread_name_prefix="retriever-leg")
        return _POOL


def search_leg(leg: Leg, prepared: Any, ctx: SearchContext) -> TopK:
    """Every shard the leg holds, merged into one top-``ctx.depth`` (score descending, then
    ordinal): ``leg.search_shards`` (the plain one loops ``leg.search_shard`` and merges once with
    :func:`retriever.topk.merge_topk`; the BM25 leg searches its shards in one compiled call).

    Returns:
        ``(ids int64 (nq, depth) global ordinals, scores float32, n_found int32)``.
    """
    if leg.n_shards == 0:
        return empty_topk(prepared.n_queries, ctx.depth)
    return leg.search_shards(prepared, range(leg.n_shards), ctx)


def plan_legs(names: Sequence[str], n_groups: int, cost: Mapping[str, float]) -> list[list[str]]:
    """Split ``names`` into at most ``n_groups`` lists run side by side, by longest processing time
    first (Graham, "Bounds on multiprocessing timing anomalies", SIAM J. Appl. Math. 1969): legs in
    decreasing estimated cost, each to the group with the least total so far (ties: lower group).

    Args:
        names: leg names (in the index's order; ties in cost keep this order).
        n_groups: threads available (>= 1).
        cost: estimated ms per query of each leg; a leg without an estimate counts 1.0.

    Returns:
        non-empty groups of leg names, the costliest group first.
    """
    n_groups = max(1, min(int(n_groups), len(names)))
    order = sorted(names, key=lambda n: -cost.get(n, 1.0))  # stable: index order among equals
    if n_groups == 1:  # the engine's queue order (every query of a multi-leg batch)
        return [order] if order else []
    groups: list[list[str]] = [[] for _ in range(n_groups)]
    loads = [0.0] * n_groups
    for n in order:
        g = min(range(n_groups), key=lambda i: (loads[i], i))
        groups[g].append(n)
        loads[g] += cost.get(n, 1.0)
    return [g for g in groups if g]


#: legs whose search runs FAISS (OpenMP) code; only their groups touch FAISS's OpenMP setting.
OMP_LEGS = frozenset({"dense"})


class Engine:
    """Query engine over an opened index: one leg object per leg (loaded at open).

    Args:
        reader: the opened index.
        shards: positions in ``reader.shards`` to search (default: all). With a subset, pass the
            whole index's ``stats`` so that scores equal a search of the whole index.
        stats: corpus-wide statistics to score with (default: combined from ``shards``).
        concurrent_legs: run the legs of a multi-leg batch side by side when a call has 2 or more
            threads (results are identical either way; see :meth:`search`).
        leg_options: passed to the leg loaders (``use_gpu``, ``device``, ``cache``: a
            :class:`retriever.segcache.SegmentCache` of per-segment state to reuse, ``dense_model``,
            ``sparse_model``).
    """

    def __init__(self, reader: IndexReader, *, shards: Sequence[int] | None = None,
                 stats: CorpusStats | None = None, concurrent_legs: bool = True, **leg_options: Any) -> None:
        self.reader = reader
        self.shard_ids = tuple(range(len(reader.shards)) if shards is None else shards)
        bad = [s for s in self.shard_ids if isinstance(s, bool) or not isinstance(s, (int, np.integer))
               or not 0 <= s < len(reader.shards)]
        if bad or len(set(self.shard_ids)) != len(self.shard_ids):
            raise QueryError(f"shards must be distinct positions in [0, {len(reader.shards)}), got {list(self.shard_ids)}")
        self.legs: dict[str, Leg] = {name: LEG_LOADERS[name](reader, self.shard_ids, stats, **leg_options)
                                     for name in reader.legs}
        #: per held shard, uint8 live-documents mask (0 = deleted) or None (no tombstones): every
        #: search's allow mask, so a deleted document is never returned by any leg
        self.live: tuple[np.ndarray | None, ...] = tuple(_live_mask(reader.shards[i]) for i in self.shard_ids)
        n_held = int(sum(reader.shards[i].rows for i in self.shard_ids))
        self.stats = stats if stats is not None else CorpusStats.of_legs(n_held, self.legs)
        self.concurrent_legs = bool(concurrent_legs)
        #: running estimate of each leg's search time, ms per query (see :func:`plan_legs`)
        self.leg_cost: dict[str, float] = {}
        #: each leg's theoretical score range per query (the ``tmm`` / ``theoretical`` normalisations)
        self.bounds = LegBounds(self.legs)

    def legs_for(self, mode: str) -> list[str]:
        """Legs used by ``mode``.

        Raises:
            QueryError: unknown mode, or a leg this index was not built with.
        """
        if mode not in MODES:
            raise QueryError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        if mode == "hybrid":
            return list(self.legs)
        if mode not in self.legs:
            raise QueryError(f"mode {mode!r} is not available: this index has legs {', '.join(self.legs)}")
        return [mode]

    def search(self, queries: Sequence[str], *, k: int, mode: str, fusion: "RRF | Linear",
               depth: int, n_threads: int, prepared: Mapping[str, Any] | None = None,
               params: Mapping[str, LegParams] | None = None, concurrent_legs: bool | None = None,
               allow: Sequence[np.ndarray | None] | None = None) -> BatchResult:
        """Search a batch (arguments already validated by the API layer).

        For each leg: ``prepare`` the queries once (or take ``prepared``), search every shard
        (:func:`search_leg`), merge once; then fuse once. With several legs, ``n_threads`` >= 2 (or
        <= 0: every core) and concurrent legs on, the legs run side by side: ``min(n_threads,
        legs)`` threads (the calling thread and pooled workers) take legs from one queue, costliest
        estimate first, each taking the next leg when it finishes one (``n_threads // that``
        kernel, OpenMP and BLAS threads per leg). Every leg returns the same lists either way, so
        the fused result does not depend on it.

        Args:
            queries: nq query strings (an empty/blank string yields no hits).
            prepared: per-leg prepared batches covering all nq queries (from the leg's
                ``prepare_vectors``: user query vectors), used instead of preparing the text.
            params: per-leg parameter objects (:mod:`retriever.params`); defaults for the others.
            concurrent_legs: this call's setting (``None``: the engine's).
            allow: per held shard a uint8 allow mask or ``None`` (see :class:`SearchContext`).

        Raises:
            QueryError: unknown mode or a leg's error (from the leg that raised it, also when it
                ran in a worker thread).
        """
        names = self.legs_for(mode)
        nq = len(queries)
        blank: np.ndarray | None  # None: no blank query
        if all(map(str.strip, queries)):  # no blank query (the usual case): no per-query loop
            blank = None
            live = queries if isinstance(queries, list) else list(queries)
        else:
            blank = np.array([not q.strip() for q in queries], dtype=bool)
            live = [q for q, b in zip(queries, blank) if not b]
        timings = {"encode": 0.0, "search": 0.0, "fuse": 0.0}
        one_leg = len(names) == 1
        leg_depth = k if one_leg else max(depth, k)
        # per-leg depths of the fusion (at least k, at most the corpus: deeper means every
        # document, and the depth sizes the per-query arrays); one leg: k
        most = max(int(self.reader.n_docs), 1)
        depth_of = {n: leg_depth if one_leg else min(max(int(fusion.depths.get(n, depth)), k), max(most, k))
                    for n in names}
        per_leg: dict[str, TopK] = {}
        preps: dict[str, tuple[Any, bool]] = {}
        params = params or {}
        # the AND with the tombstones, and whether no document passes (a filter that matches
        # nothing: every leg returns no hits, unsearched), made once per allow mask list
        masks, none_pass = self.allow_masks(allow)

        def run_leg(name: str, threads: int) -> tuple[float, float]:
            leg = self.legs[name]
            p = params.get(name) or defaults_for(name)
            t0 = time.perf_counter()
            given = prepared is not None and name in prepared
            if none_pass:
                prep, rows = None, nq if given else len(live)
            elif given:
                prep, rows = prepared[name], nq  # covers all nq queries, blank text or not
            elif live:
                prep, rows = leg.prepare(live, p, threads), len(live)
            else:
                prep, rows = None, 0
            t1 = time.perf_counter()
            d = depth_of[name]
            ctx = SearchContext(depth=d, n_threads=threads, allow=masks)
            merged = empty_topk(rows, d) if prep is None else search_leg(leg, prep, ctx)
            t2 = time.perf_counter()
            per_leg[name] = merged if given or blank is None else _scatter(merged, blank, d)
            preps[name] = (prep, given)
            return (t1 - t0) * 1e3, (t2 - t1) * 1e3

        total = n_threads if n_threads > 0 else (os.cpu_count() or 1)
        concurrent = self.concurrent_legs if concurrent_legs is None else bool(concurrent_legs)
        if len(names) > 1 and total > 1 and concurrent:
            spent = self._run_side_by_side(names, total, run_leg)
        else:
            spent = []
            for name in names:
                if name in OMP_LEGS:
                    with thread_limits(total):
                        spent.append(run_leg(name, total))
                else:
                    spent.append(run_leg(name, total))
        if len(names) > 1 and nq:
            a = COST_SMOOTHING
            for name, (enc_ms, search_ms) in zip(names, spent):
                c = (enc_ms + search_ms) / nq
                old_c = self.leg_cost.get(name)
                self.leg_cost[name] = c if old_c is None else (1 - a) * old_c + a * c
        per_leg = {name: per_leg[name] for name in names}  # leg order, not completion order
        for name, (enc_ms, search_ms) in zip(names, spent):  # summed over legs, even when side by side
            timings["encode"] += enc_ms
            timings["search"] += search_ms
            if len(names) > 1:
                timings[f"leg:{name}"] = enc_ms + search_ms
        t3 = time.perf_counter()
        if one_leg:
            name = names[0]
            ids, scores, n_found = per_leg[name]
            ranks = tie_ranks_rows(scores, n_found)
            leg_scores = scores.astype(np.float32)  # a copy: NaN where the leg returned nothing
            if min(n_found.tolist(), default=leg_depth) < ids.shape[1]:  # padded rows (python min: no numpy reduction)
                leg_scores[ids < 0] = np.nan
            legs = {name: LegArrays(leg_scores, ranks)}
            fusion_cfg = None
        else:
            from .full_score import fusion_inputs  # full-score fusion and theoretical bounds

            per_leg, bounds, full_ms = fusion_inputs(self, per_leg, preps,
                                                     np.zeros(nq, dtype=bool) if blank is None else blank, fusion)
            if fusion.full_score:
                timings["full_score"] = full_ms
            ids, scores, n_found, legs = fuse(per_leg, k, fusion, bounds)
            # the depths the legs were searched at: per leg when the fusion sets them (they
            # override the call's depth), else the call's depth (at least k)
            fusion_cfg = {**fusion.to_dict(), "legs": names,
                          **({"depths": depth_of} if fusion.depths else {"depth": leg_depth})}
        timings["fuse"] = (time.perf_counter() - t3) * 1e3
        return BatchResult(ids, scores, n_found, legs, mode, fusion_cfg, timings, self.reader.generation)

    #: allow mask lists whose AND with the tombstones is kept (:meth:`allow_masks`) ...
    MASK_CACHE = 8
    #: ... when their masks are read-only and hold at most this many bytes
    MASK_CACHE_BYTES = 64 << 20

    def allow_masks(self, allow: Sequence[np.ndarray | None] | None
                    ) -> tuple[Sequence[np.ndarray | None] | None, bool]:
        """The masks a search hands its legs: per held shard the AND of the live-documents mask
        (:attr:`live`) and ``allow`` (:func:`_and_masks`), and whether no document passes at all.
        Kept for the last :attr:`MASK_CACHE` allow lists by identity (the Retriever hands the
        same list object, of read-only masks, for a cached filter), so a query does not pay an
        O(rows) AND and scan per shard; a list with a writeable mask is never kept (its contents
        could change under the same identity).

        Raises:
            QueryError: ``allow`` has another number of masks than the engine holds shards.
        """
        live = self.live
        if allow is None and all(m is None for m in live):  # no tombstones, no filter: nothing to AND
            return None, False
        cache = self.__dict__.setdefault("_mask_cache", {})
        key = (id(live), id(allow))
        hit = cache.get(key)
        if hit is not None and hit[0] is live and hit[1] is allow:
            return hit[2], hit[3]
        masks = _and_masks(live, allow)
        none_pass = masks is not None and all(m is not None and not m.any() for m in masks)
        given = [m for m in allow or () if m is not None]
        if any(m.flags.writeable for m in given) or sum(m.nbytes for m in given) > self.MASK_CACHE_BYTES:
            return masks, none_pass
        with _POOL_LOCK:
            if len(cache) >= self.MASK_CACHE:
                cache.pop(next(iter(cache)))
            cache[key] = (live, allow, masks, none_pass)
        return masks, none_pass

    def _run_side_by_side(self, names: list[str], total: int,
                          run_leg: Callable[[str, int], tuple[float, float]]) -> list[tuple[float, float]]:
        """Run the legs on ``min(total, legs)`` threads with dynamic list scheduling: the legs in
        decreasing estimated cost (the order of :func:`plan_legs` with one group) form a queue;
        the calling thread and pooled workers each take the next leg when they finish their
        previous one (the costs are running means, but one query's BM25 time can be 5x its mean: a
        static split would then run the slow leg and another one in one thread while the other
        thread idles). Each leg's kernels (and FAISS's OpenMP team, and BLAS) get ``total // that``
        threads, so the total stays ``total``. Returns each leg's (prepare ms, search ms) in
        ``names`` order; re-raises the first error."""
        n_run = max(1, min(total, len(names)))
        share = max(1, total // n_run)
        queue = plan_legs(names, 1, self.leg_cost)[0]
        taken = itertools.count()  # next() is atomic under the GIL: each leg runs exactly once
        spent_by: dict[str, tuple[float, float]] = {}

        def drain(worker: bool = True) -> None:
            while True:
                i = next(taken)
                if i >= len(queue):
                    return
                name = queue[i]
                if name in OMP_LEGS:
                    with thread_limits(share, restore=not worker):
                        spent_by[name] = run_leg(name, share)
                else:
                    spent_by[name] = run_leg(name, share)

        futures = [_pool().submit(drain) for _ in range(n_run - 1)]
        try:
            drain(worker=False)
        finally:
            # the queue is empty (or this thread failed): a worker that has not started (the
            # pool busy with another call's legs) has nothing to do; wait for the others,
            # re-raising the first error
            for f in futures:
                if not f.cancel():
                    f.result()
        return [spent_by[name] for name in names]


def _live_mask(shard: Any) -> np.ndarray | None:
    """uint8 (rows,) 1 for live rows, 0 for the shard's tombstones; None without tombstones."""
    if shard.deleted is None or not len(shard.deleted):
        return None
    mask = np.ones(shard.rows, dtype=np.uint8)
    mask[np.asarray(shard.deleted, dtype=np.int64)] = 0
    return mask


def _and_masks(live: Sequence[np.ndarray | None],
               allow: Sequence[np.ndarray | None] | None) -> Sequence[np.ndarray | None] | None:
    """Per shard the AND of the live-documents mask and the call's allow mask (None = all rows);
    None when no shard has either."""
    if allow is None:
        return None if all(m is None for m in live) else live
    if len(allow) != len(live):
        raise QueryError(f"allow has {len(allow)} masks for {len(live)} shards")
    out = []
    for m, a in zip(live, allow):
        out.append(m if a is None else a if m is None else (m & a).astype(np.uint8))
    return out if any(x is not None for x in out) else None


def _scatter(res: TopK, blank: np.ndarray, k: int) -> TopK:
    """Rows of the non-blank queries placed back among all queries (blank ones: no hits)."""
    if not blank.any():
        return res
    nq = len(blank)
    ids, scores, n_found = empty_topk(nq, k)
    live = ~blank
    ids[live], scores[live], n_found[live] = res
    return ids, scores, n_found
