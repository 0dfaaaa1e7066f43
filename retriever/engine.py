"""Runs one batch: prepare queries per leg, search every shard, merge, fuse once."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from index.errors import QueryError

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


#: run the legs of a multi-leg batch side by side when ``n_threads`` allows (results are the same
#: either way). Off by default: on 2 cores (1M docs, IVF dense + BM25, batch 1) it did not lower
#: p50 and raised p99, as FAISS's OpenMP threads and the BM25 kernel compete for the cores.
CONCURRENT_LEGS = False
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """Process-wide worker threads that run the legs of a hybrid batch concurrently."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=3, thread_name_prefix="retriever-leg")
        return _POOL


class Engine:
    """Query engine over an opened index: holds one object per leg (loaded at open).

    Args:
        reader: the opened index.
        leg_options: passed to the leg loaders (``use_gpu``, ``device``).
    """

    def __init__(self, reader: IndexReader, **leg_options: Any) -> None:
        self.reader = reader
        self.legs = {name: LEG_LOADERS[name](reader, **leg_options) for name in reader.legs}

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

        Args:
            queries: nq query strings (an empty/blank string yields no hits).
            prepared: per-leg inputs that replace encoding (e.g. user query vectors).
            leg_params: per-leg keyword options for the leg's ``search``.
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
            t0 = time.perf_counter()
            if prepared and name in prepared:
                inp = prepared[name]  # covers all nq queries, blank text or not
            else:
                inp = leg.prepare(live) if live else None
            t1 = time.perf_counter()
            if inp is None:
                merged = _empty(len(live), leg_depth)
            else:
                parts = leg.search(inp, leg_depth, threads, **(leg_params or {}).get(name, {}))
                merged = merge_topk(parts, leg_depth)
            t2 = time.perf_counter()
            if prepared and name in prepared:
                per_leg[name] = merged
            else:
                per_leg[name] = _scatter(merged, blank, leg_depth)
            return (t1 - t0) * 1e3, (t2 - t1) * 1e3

        if len(names) > 1 and n_threads != 1 and CONCURRENT_LEGS:
            # the legs' kernels release the GIL: run them side by side, the threads split between them
            total = n_threads if n_threads > 0 else (os.cpu_count() or 1)
            share = max(1, total // len(names))
            futures = [_pool().submit(run_leg, name, share) for name in names[1:]]
            spent = [run_leg(names[0], share)] + [f.result() for f in futures]
        else:
            spent = [run_leg(name, n_threads) for name in names]
        per_leg = {name: per_leg[name] for name in names}  # leg order, not completion order
        for enc_ms, search_ms in spent:  # summed over legs (CPU time of the stages, as before)
            timings["encode"] += enc_ms
            timings["search"] += search_ms
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
    """:func:`tie_ranks` for every row at once: scores float32 (nq, k), rows sorted descending,
    n_found int (nq,) → int32 (nq, k) 1-based ranks, equal scores sharing the best position,
    0 past n_found."""
    nq, k = scores.shape
    ranks = np.zeros((nq, k), np.int32)
    if nq == 0 or k == 0:
        return ranks
    pos = np.arange(k, dtype=np.int32)
    new = np.ones((nq, k), bool)
    new[:, 1:] = scores[:, 1:] != scores[:, :-1]
    np.maximum.accumulate(np.where(new, pos, 0), axis=1, out=ranks)
    ranks += 1
    ranks[pos[None, :] >= np.asarray(n_found)[:, None]] = 0
    return ranks


def _scatter(res: tuple[np.ndarray, np.ndarray, np.ndarray], blank: np.ndarray, k: int):
    if not blank.any():
        return res
    nq = len(blank)
    ids, scores, n_found = _empty(nq, k)
    live = ~blank
    ids[live], scores[live], n_found[live] = res
    return ids, scores, n_found
