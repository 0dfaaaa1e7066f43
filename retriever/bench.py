"""Query benchmark of an opened index: QPS, latency percentiles, recall@k against exact search,
peak RSS and index size. ``retriever bench`` and ``benchmarks/run.py`` are thin layers over
:func:`bench_index`.

Method (PISA-style): one untimed warm-up pass over the first batches, then every query is run in
batches of ``batch_size`` (1 = per-query latency); each batch's wall time is one latency sample.
With ``passes`` > 1 the timed pass is repeated and every statistic is the median over passes.
Stage times come from :attr:`BatchResult.timings_ms`: ``encode`` (query preparation: dense/sparse
encoding and BM25 analysis), ``search`` (kernels and shard merge; summed over legs, also when the
legs run side by side), ``fuse``. Passing
``query_vectors`` removes dense encoding from the measurement (BM25 analysis stays in).

Timed passes run with Python's cyclic garbage collector paused (``gc_pause``, see :class:`_gc_paused`).

Recall@k follows :func:`retriever.metrics.recall_at_k` (|top-k ∩ exact top-k| / |exact top-k|,
queries without an exact hit left out) against the engine's own exhaustive search of each leg
(:data:`EXACT_LEG_PARAMS`: BM25 scoring every posting, dense a flat scan of the stored vectors,
learned sparse its exact index) and, for hybrid mode, the fused list of the exact legs with the
same fusion and depth.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Mapping, Sequence

import numpy as np

from .fusion import RRF, Linear, parse_fusion
from .metrics import latency_summary, recall_at_k

#: leg → ``leg_params`` that select the leg's exhaustive search in the engine itself
#: (:meth:`Retriever.search_arrays`): BM25 scores every posting of the query terms; learned sparse
#: scans its exact inverted index; dense scans every stored vector with a raw inner product at full
#: dimension (``exhaustive``: BLAS blocks, no re-normalisation, whatever ANN structure the index
#: has) and re-scores exactly. A leg without an entry gets recall ``None``.
EXACT_LEG_PARAMS: dict[str, dict[str, Any]] = {"bm25": {"algorithm": "exhaustive"},
                                               "sparse": {"algorithm": "exact"},
                                               "dense": {"exhaustive": True}}


class _gc_paused:
    """Context manager: with ``on``, collect once, then freeze (``gc.freeze``: existing objects are
    left out of later collections) and disable the cyclic collector; restores both on exit (the
    collector is re-enabled only if it was enabled before). With ``on=False`` it does nothing."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.was_enabled = False

    def __enter__(self) -> None:
        if self.on:
            self.was_enabled = gc.isenabled()
            gc.collect()
            gc.freeze()
            gc.disable()

    def __exit__(self, *exc: Any) -> None:
        if self.on:
            gc.unfreeze()
            if self.was_enabled:
                gc.enable()


def _median_of_passes(per_pass: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over passes of every number in the passes' (equally shaped) dicts."""
    first = per_pass[0]
    out: dict[str, Any] = {}
    for key, v in first.items():
        if isinstance(v, dict):
            out[key] = _median_of_passes([p[key] for p in per_pass])
        else:
            out[key] = float(np.median([p[key] for p in per_pass]))
    return out


def _rows(filter: Any, s: int, e: int) -> Any:
    """The filter of queries ``s:e``: one filter for all, or the slice of a per-query list."""
    return filter[s:e] if isinstance(filter, (list, tuple)) else filter


def exact_search(retriever: Any, queries: Sequence[str], *, k: int, mode: str, fusion: Any = None,
                 depth: int | None = None, n_threads: int = 1, query_vectors: np.ndarray | None = None,
                 sparse_vectors: Any = None, filter: Any = None) -> dict[str, np.ndarray | None]:
    """Exact top-k ids per leg of ``mode`` and, for several legs, the fused list of the exact legs,
    all searched by the engine (:meth:`Retriever.search_arrays` with :data:`EXACT_LEG_PARAMS`).

    Args:
        retriever: an open :class:`~retriever.Retriever`.
        queries: nq query strings.
        k: hits per query.
        mode: a leg name or ``"hybrid"``.
        fusion, depth, n_threads, query_vectors, sparse_vectors, filter: as in ``search_arrays``
            (with a filter: the exact top-k of the passing documents).

    Returns:
        ``{leg: ids int64 (nq, k) | None, ..., "fused": ids int64 (nq, k)}`` (``None`` where the
        leg has no exact mode; ``"fused"`` only for multi-leg modes with every leg exact), ``-1``
        padding.

    Raises:
        QueryError: as ``search_arrays``.
    """
    names = retriever.engine.legs_for(mode)
    qs = list(queries)

    def run(m: str, legs: Sequence[str]) -> np.ndarray:
        res = retriever.search_arrays(
            qs, k, mode=m, fusion=fusion, depth=depth, n_threads=n_threads,
            leg_params={n: dict(EXACT_LEG_PARAMS[n]) for n in legs},
            query_vectors=query_vectors if "dense" in legs else None,
            sparse_vectors=sparse_vectors if "sparse" in legs else None, filter=filter)
        ids = np.full((len(qs), k), -1, np.int64)
        ids[:, :res.ids.shape[1]] = res.ids
        return ids

    out: dict[str, np.ndarray | None] = {n: run(n, [n]) if n in EXACT_LEG_PARAMS else None for n in names}
    if len(names) > 1 and all(n in EXACT_LEG_PARAMS for n in names):
        out["fused"] = run(mode, names)
    return out


def bench_index(retriever: Any, queries: Sequence[str], *, modes: Sequence[str] | None = None, k: int = 10,
                n_threads: int = 1, batch_size: int = 1, query_vectors: np.ndarray | None = None,
                fusion: "str | RRF | Linear | None" = None, depth: int | None = None,
                leg_params: dict[str, dict[str, Any]] | None = None, warmup_batches: int = 5,
                recall: bool = True, exact_cache: dict[str, Any] | None = None,
                sparse_vectors: Any = None, passes: int = 1, gc_pause: bool = True,
                filter: Any = None) -> dict[str, Any]:
    """Benchmark ``modes`` of an opened :class:`~retriever.Retriever` over ``queries``.

    Args:
        queries: query strings (blank ones are dropped).
        modes: search modes (default: every leg of the index, and ``hybrid`` when it has several).
        k: hits per query.
        n_threads: kernel threads (also FAISS's OpenMP threads for the run).
        batch_size: queries per ``search_arrays`` call; one latency sample per batch.
        query_vectors: (nq, dim) dense query vectors aligned with ``queries`` (encoding excluded).
        fusion, depth, leg_params, filter: as in :meth:`Retriever.search_arrays` (one filter for
            every query, or one per query; recall is then against the exact filtered search).
        warmup_batches: untimed batches run first.
        recall: compute recall@k against exact search (costs one exact pass).
        exact_cache: a dict kept across calls with the same queries, k, fusion and depth, so
            parameter sweeps compute the exact lists once per mode (and, in hybrid mode, each leg's
            own recall once per setting of that leg's ``leg_params``).
        sparse_vectors: nq learned-sparse query vectors aligned with ``queries`` (a sequence of
            ``(term_ids, weights)`` pairs; SPLADE encoding excluded).
        passes: timed passes over all the queries (>= 1). Each statistic (QPS, every latency
            percentile) is computed per pass and the median over passes is reported; the per-pass
            values are kept under ``passes``.
        gc_pause: run each timed pass with Python's cyclic garbage collector paused
            (:func:`_gc_paused`: one ``gc.collect()`` before, ``gc.freeze()`` + ``gc.disable()``
            during, restored after), so a collection triggered by the benchmark loop's own
            allocations is not charged to whichever query happens to trigger it. A common
            benchmark practice (pyperf does the same for its timed loops); the search path makes no
            reference cycles, so nothing is left uncollected. ``False`` times with the collector on.

    Returns:
        a JSON-ready dict: ``{"settings": ..., "index": {...}, "modes": {mode: {...}}}`` where each
        mode has ``qps``, ``latency_ms`` (per batch: p50/p95/p99/mean/max), ``encode_ms`` /
        ``search_ms`` / ``fuse_ms`` (per batch percentiles), ``qps_excluding_encode``,
        ``recall@k`` (per leg and ``fused``, from the last pass's ids; every pass returns the
        same ids), ``passes`` (per-pass QPS and latency percentiles) and ``peak_rss_bytes`` after
        the mode ran.

    Raises:
        QueryError: no non-blank query, ``passes`` < 1, or query vectors that do not match the
            queries.
    """
    from retriever.index.errors import QueryError

    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise QueryError(f"passes must be an integer >= 1, got {passes!r}")
    keep = [i for i, q in enumerate(queries) if q.strip()]
    qs = [queries[i] for i in keep]
    if not qs:
        raise QueryError("no non-blank queries to benchmark")
    if isinstance(filter, (list, tuple)):
        if len(filter) != len(queries):
            raise QueryError(f"filter has {len(filter)} entries for {len(queries)} queries")
        filter = [filter[i] for i in keep]
    qv = None
    if query_vectors is not None:
        qv = np.asarray(query_vectors, dtype=np.float32)
        if qv.ndim != 2 or qv.shape[0] != len(queries):
            raise QueryError(f"query_vectors has shape {qv.shape}, expected ({len(queries)}, dim)")
        qv = np.ascontiguousarray(qv[keep])
    sv = None
    if sparse_vectors is not None:
        if len(sparse_vectors) != len(queries):
            raise QueryError(f"sparse_vectors has {len(sparse_vectors)} rows, expected {len(queries)}")
        sv = [sparse_vectors[i] for i in keep]
    legs = list(retriever.legs)
    if not modes:
        modes = legs + (["hybrid"] if len(legs) > 1 else [])
    try:
        import faiss
        faiss.omp_set_num_threads(n_threads)
    except ImportError:  # pragma: no cover - faiss is a dependency
        pass
    info = retriever.info()
    report: dict[str, Any] = {
        "settings": {"k": k, "threads": n_threads, "batch_size": batch_size, "n_queries": len(qs), "gc_paused": gc_pause,
                     "query_vectors": qv is not None, "sparse_vectors": sv is not None, "depth": depth,
                     "fusion": (retriever.default_fusion() if fusion is None else parse_fusion(fusion)).to_dict()},
        "index": {"n_docs": info.get("n_docs"), "legs": legs, "bytes_on_disk": info.get("bytes_on_disk"),
                  "n_shards": info.get("n_shards")},
        "modes": {},
    }
    if filter is not None:  # JSON-ready: the dict form as is, an expression as its text
        report["settings"]["filter"] = (filter if isinstance(filter, Mapping) else
                                        [f if f is None or isinstance(f, Mapping) else str(f) for f in filter]
                                        if isinstance(filter, list) else str(filter))
    batches = [(s, min(s + batch_size, len(qs))) for s in range(0, len(qs), batch_size)]
    for mode in modes:
        uses_dense = "dense" in retriever.engine.legs_for(mode)
        uses_sparse = "sparse" in retriever.engine.legs_for(mode)

        def call(s: int, e: int):
            return retriever.search_arrays(qs[s:e], k, mode=mode, fusion=fusion, depth=depth,
                                           n_threads=n_threads, leg_params=leg_params, filter=_rows(filter, s, e),
                                           query_vectors=qv[s:e] if (qv is not None and uses_dense) else None,
                                           sparse_vectors=sv[s:e] if (sv is not None and uses_sparse) else None)

        for s, e in batches[:warmup_batches]:
            call(s, e)
        per_pass = []
        ids = np.full((len(qs), k), -1, np.int64)
        for _ in range(passes):
            lat, enc, sea, fus = [], [], [], []
            with _gc_paused(gc_pause):
                t_all = time.perf_counter()
                for s, e in batches:
                    t0 = time.perf_counter()
                    res = call(s, e)
                    lat.append((time.perf_counter() - t0) * 1e3)
                    enc.append(res.timings_ms.get("encode", 0.0))
                    sea.append(res.timings_ms.get("search", 0.0))
                    fus.append(res.timings_ms.get("fuse", 0.0))
                    ids[s:e, :res.ids.shape[1]] = res.ids
                total_s = time.perf_counter() - t_all
            per_pass.append({
                "qps": len(qs) / total_s,
                "qps_excluding_encode": len(qs) / max((sum(lat) - sum(enc)) / 1e3, 1e-12),
                "latency_ms": latency_summary(lat), "encode_ms": latency_summary(enc),
                "search_ms": latency_summary(sea), "fuse_ms": latency_summary(fus),
                "latency_excluding_encode_ms": latency_summary(np.subtract(lat, enc)),
            })
        entry: dict[str, Any] = _median_of_passes(per_pass)
        if passes > 1:
            entry["passes"] = [{"qps": p["qps"], "latency_ms": p["latency_ms"]} for p in per_pass]
        if recall:
            ex = None if exact_cache is None else exact_cache.get(mode)
            if ex is None:
                ex = exact_search(retriever, qs, k=k, mode=mode, fusion=fusion, depth=depth,
                                  n_threads=n_threads, query_vectors=qv if uses_dense else None,
                                  sparse_vectors=sv if uses_sparse else None, filter=filter)
                if exact_cache is not None:
                    exact_cache[mode] = ex
            rec: dict[str, float | None] = {}
            names = retriever.engine.legs_for(mode)
            if len(names) == 1:
                rec[names[0]] = recall_at_k(ids, ex[names[0]], k) if ex[names[0]] is not None else None
            else:
                # Each leg's own top-k (searched on its own, as the fused list's inputs are).
                for name in names:
                    if ex.get(name) is None:
                        rec[name] = None
                        continue
                    # a leg's own recall depends only on its own params: computed once per sweep
                    lkey = f"leg-recall:{name}:{sorted((leg_params or {}).get(name, {}).items())!r}"
                    if exact_cache is not None and lkey in exact_cache:
                        rec[name] = exact_cache[lkey]
                        continue
                    got = np.full((len(qs), k), -1, np.int64)
                    for s, e in batches:
                        r1 = retriever.search_arrays(
                            qs[s:e], k, mode=name, n_threads=n_threads, leg_params=leg_params,
                            filter=_rows(filter, s, e),
                            query_vectors=qv[s:e] if (qv is not None and name == "dense") else None,
                            sparse_vectors=sv[s:e] if (sv is not None and name == "sparse") else None)
                        got[s:e, :r1.ids.shape[1]] = r1.ids
                    rec[name] = recall_at_k(got, ex[name], k)
                    if exact_cache is not None:
                        exact_cache[lkey] = rec[name]
                rec["fused"] = recall_at_k(ids, ex["fused"], k) if ex.get("fused") is not None else None
            entry[f"recall@{k}"] = rec
        entry["peak_rss_bytes"] = peak_rss_bytes()
        report["modes"][mode] = entry
    report["peak_rss_bytes"] = peak_rss_bytes()
    return report


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (bytes; Linux ``ru_maxrss`` is in KiB)."""
    import resource
    import sys

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)


def format_report(report: dict[str, Any]) -> str:
    """A short plain-text table of :func:`bench_index`'s report."""
    st = report["settings"]
    k = st["k"]
    lines = [f"{report['index']['n_docs']} docs, {st['n_queries']} queries, k={k}, threads={st['threads']}, "
             f"batch={st['batch_size']}, index {report['index']['bytes_on_disk'] / 1e6:.1f} MB on disk, "
             f"peak RSS {report['peak_rss_bytes'] / 1e6:.0f} MB",
             f"{'mode':<8} {'QPS':>9} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'enc p50':>8}  recall@{k}"]
    for mode, e in report["modes"].items():
        rec = e.get(f"recall@{k}", {})
        rs = " ".join(f"{n}={v:.4f}" if v is not None else f"{n}=n/a" for n, v in rec.items())
        lat = e["latency_ms"]
        lines.append(f"{mode:<8} {e['qps']:>9.1f} {lat['p50']:>8.2f} {lat['p95']:>8.2f} {lat['p99']:>8.2f} "
                     f"{e['encode_ms']['p50']:>8.2f}  {rs}")
    return "\n".join(lines)
