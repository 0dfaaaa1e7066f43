"""Runs one batch: prepare queries per leg, search every shard (the legs side by side when threads
allow), merge, fuse once."""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from retriever.index.errors import QueryError

from . import _kernels
from .fusion import RRF, Linear, fuse
from .results import BatchResult, LegArrays
from .shards import IndexReader
from .topk import merge_topk

MODES = ("hybrid", "bm25", "dense", "sparse")


def _load_bm25(reader: IndexReader, **kw: Any):
    from .legs.bm25 import BM25Leg
    return BM25Leg(reader)


def _load_dense(reader: IndexReader, **kw: Any):
    from .legs.dense import DenseLeg
    return DenseLeg(reader, use_gpu=kw.get("use_gpu"), device=kw.get("device", "cpu"))


def _load_sparse(reader: IndexReader, **kw: Any):
    from .legs.sparse import SparseLeg
    return SparseLeg(reader, device=kw.get("device", "cpu"))


#: leg name → loader(reader, **options); the library, the CLI and the benchmarks read this table.
LEG_LOADERS: dict[str, Callable[..., Any]] = {"bm25": _load_bm25, "dense": _load_dense, "sparse": _load_sparse}


def _empty(nq: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.full((nq, k), -1, np.int64), np.full((nq, k), -np.inf, np.float32), np.zeros(nq, np.int32)


#: run the legs of a multi-leg batch side by side when ``n_threads >= 2`` (results are identical
#: either way; see :meth:`Engine.search`). Measured with ``python -m benchmarks.run --only hybrid``
#: (1M documents, BM25 + dense IVF + learned sparse, 2 threads, batch 1): the legs in sequence cost
#: the sum of their times, side by side the largest of them plus ~0.1 ms of hand-off.
CONCURRENT_LEGS = True
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
_OMP_LOCAL = threading.local()  # per thread: the OpenMP thread count this module last set there


class _omp_threads:
    """Context manager: OpenMP threads of the *calling* thread (FAISS's OpenMP setting is per
    thread) set to ``n`` while a leg runs beside others, restored afterwards (``restore=False``:
    left set, for the engine's own pool workers). No-op when FAISS has not been imported.

    The value this module set in a thread is remembered (thread-local), so a pool worker that
    already runs with ``n`` OpenMP threads makes no FAISS call at all: every FAISS call releases
    and re-takes the GIL, and with the other leg's thread running Python code at that moment the
    re-take can wait (measured: 1.6 ms mean per ``omp_get_max_threads`` call inside a 1M-document
    hybrid query on 2 busy cores), which showed up in the hybrid p99."""

    def __init__(self, n: int, restore: bool = True) -> None:
        self.n = n
        self.restore = restore
        self.prev: int | None = None
        self.faiss = sys.modules.get("faiss")

    def __enter__(self) -> None:
        if self.faiss is None:
            return
        if not self.restore and getattr(_OMP_LOCAL, "n", None) == self.n:
            return
        if self.restore:
            self.prev = int(self.faiss.omp_get_max_threads())
            if self.prev == self.n:
                self.prev = None
                return
        self.faiss.omp_set_num_threads(self.n)
        _OMP_LOCAL.n = self.n

    def __exit__(self, *exc: Any) -> None:
        if self.faiss is not None and self.prev is not None:
            self.faiss.omp_set_num_threads(self.prev)
            _OMP_LOCAL.n = self.prev


class Engine:
    """Query engine over an opened index: holds one object per leg (loaded at open).

    Args:
        reader: the opened index.
        leg_options: passed to the leg loaders (``use_gpu``, ``device``).
    """

    def __init__(self, reader: IndexReader, **leg_options: Any) -> None:
        self.reader = reader
        self.legs = {name: LEG_LOADERS[name](reader, **leg_options) for name in reader.legs}
        #: running estimate of each leg's search time, ms per query (see :func:`plan_legs`)
        self.leg_cost: dict[str, float] = {}

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
               leg_params: Mapping[str, Mapping[str, Any]] | None = None) -> BatchResult:
        """Search a batch (arguments already validated by the API layer).

        With several legs, ``n_threads`` >= 2 (or <= 0: every core) and :data:`CONCURRENT_LEGS`,
        the legs run side by side: ``min(n_threads, legs)`` threads (the calling thread and pooled
        workers) take legs from one queue, costliest estimate first, each taking the next leg
        when it finishes one (``n_threads // that`` kernel and OpenMP threads per leg).
        Every leg returns the same lists either way, so the fused result does not depend on it.

        Args:
            queries: nq query strings (an empty/blank string yields no hits).
            prepared: per-leg inputs that replace encoding (e.g. user query vectors).
            leg_params: per-leg keyword options for the leg's ``search``.

        Raises:
            QueryError: unknown mode or leg option (from the leg that raised it, also when it ran
                in a worker thread).
        """
        names = self.legs_for(mode)
        nq = len(queries)
        if all(map(str.strip, queries)):  # no blank query (the usual case): no per-query loop
            blank = np.zeros(nq, dtype=bool)
            live = queries if isinstance(queries, list) else list(queries)
        else:
            blank = np.array([not q.strip() for q in queries], dtype=bool)
            live = [q for q, b in zip(queries, blank) if not b]
        timings = {"encode": 0.0, "search": 0.0, "fuse": 0.0}
        leg_depth = k if len(names) == 1 else max(depth, k)
        per_leg: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

        def run_leg(name: str, threads: int) -> tuple[float, float]:
            leg = self.legs[name]
            params = (leg_params or {}).get(name, {})
            t0 = time.perf_counter()
            parts = inp = None
            if prepared and name in prepared:
                inp = prepared[name]  # covers all nq queries, blank text or not
            elif live:
                # analysis and scoring in one compiled pass where the leg has one (its time then
                # counts as search time); None where it does not apply
                search_texts = getattr(leg, "search_texts", None)
                parts = search_texts(live, leg_depth, threads, **params) if search_texts else None
                if parts is None:
                    inp = leg.prepare(live, threads)
            t1 = time.perf_counter() if parts is None else t0
            if parts is None and inp is not None:
                parts = leg.search(inp, leg_depth, threads, **params)
            merged = _empty(len(live), leg_depth) if parts is None else merge_topk(parts, leg_depth)
            t2 = time.perf_counter()
            if prepared and name in prepared:
                per_leg[name] = merged
            else:
                per_leg[name] = _scatter(merged, blank, leg_depth)
            return (t1 - t0) * 1e3, (t2 - t1) * 1e3

        total = n_threads if n_threads > 0 else (os.cpu_count() or 1)
        if len(names) > 1 and total > 1 and CONCURRENT_LEGS:
            # Legs side by side (every leg kernel releases the GIL); each leg's kernels (and FAISS's
            # OpenMP team) get threads // min(threads, legs) threads, so the total stays n_threads.
            # Dynamic list scheduling: the legs in decreasing estimated cost (the order of
            # plan_legs with one group) form a queue; the calling thread and min(threads, legs) - 1
            # pooled workers each take the next leg when they finish their previous one. The costs
            # are running means, but one query's BM25 time can be 5x its mean: a static split would
            # then run the slow leg and another one in one thread while the other thread idles.
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
                        with _omp_threads(share, restore=not worker):
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
            spent = [spent_by[name] for name in names]
        else:
            spent = [run_leg(name, n_threads) for name in names]
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
        if len(names) == 1:
            name = names[0]
            ids, scores, n_found = per_leg[name]
            ranks = _tie_ranks_rows(scores, n_found)
            legs = {name: LegArrays(np.where(ids >= 0, scores, np.nan).astype(np.float32), ranks)}
            fusion_cfg = None
        else:
            ids, scores, n_found, legs = fuse(per_leg, k, fusion)
            fusion_cfg = {**fusion.to_dict(), "depth": leg_depth, "legs": names}
        timings["fuse"] = (time.perf_counter() - t3) * 1e3
        return BatchResult(ids, scores, n_found, legs, mode, fusion_cfg, timings)


def _tie_ranks_rows(scores: np.ndarray, n_found: np.ndarray) -> np.ndarray:
    """:func:`tie_ranks` for every row at once (``_kernels.tie_ranks``): scores float32 (nq, k),
    rows sorted descending, n_found int (nq,) → int32 (nq, k) 1-based ranks, equal scores sharing
    the best position, 0 past n_found."""
    return _kernels.tie_ranks(np.ascontiguousarray(scores, dtype=np.float32),
                              np.ascontiguousarray(n_found, dtype=np.int32))


def _scatter(res: tuple[np.ndarray, np.ndarray, np.ndarray], blank: np.ndarray, k: int):
    if not blank.any():
        return res
    nq = len(blank)
    ids, scores, n_found = _empty(nq, k)
    live = ~blank
    ids[live], scores[live], n_found[live] = res
    return ids, scores, n_found
