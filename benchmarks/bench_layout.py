"""The cost of the shard layout and of the public API, measured in one run.

Two questions (issue: architecture v2, items 8 and 9):

1. **Shard layout** — the 1M synthetic BM25 corpus (:func:`benchmarks.datasets.synthetic_bm25`)
   built with the default shard size (``BuildConfig().shard_size``: 10 shards) and as one shard;
   QPS of 1,000-query batches and of one query at a time (k = 10, BM25, one thread), in
   interleaved rounds (one pass of each layout per round), and whether both layouts return
   identical ids and scores. Target: default layout >= 0.9x the one-shard QPS.
2. **API cost** — SciFact (300 test queries, k = 10, BM25, one thread): ``search_batch`` (Hits
   with title, text and metadata) against ``search_arrays`` on the same batch, and ``search()`` of
   one query against ``search_arrays`` of one query (per-call latency, p50). Targets:
   ``search_batch`` >= 50,000 QPS; ``search()`` p50 <= 80 µs.

Run:  python -m benchmarks.bench_layout [--rounds 7] [--n-docs 1000000] [--out benchmarks/results/layout.json]
(``--skip-layout`` / ``--skip-api`` run one half; ``--cache-dir DIR`` builds the layout part's two
indexes there once, a minute or two each at 1M, and reuses them in later runs). Medians are quoted
with min-max spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.datasets import beir, synthetic_bm25
from benchmarks.timing import machine, timed_pass


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _interleaved(fns: dict[str, Callable[[], Any]], rounds: int, min_seconds: float) -> dict[str, list[float]]:
    """Seconds per call of each function, one pass of each per round (round order rotates)."""
    names = list(fns)
    for f in fns.values():  # warm-up
        f()
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            out[n].append(timed_pass(fns[n], min_seconds)[0])
    return out


def layout(n_docs: int, rounds: int, tmp: Path, one_at_a_time: int, reuse: bool = False) -> dict[str, Any]:
    """Default shard layout vs one shard on the synthetic BM25 corpus (indexes under ``tmp``;
    with ``reuse``, an index already there is searched instead of built again)."""
    from retriever import BuildConfig, Retriever, build_index

    col = synthetic_bm25(n_docs)
    paths = {"default": tmp / f"synthetic-bm25-{n_docs}-default", "one_shard": tmp / f"synthetic-bm25-{n_docs}-one"}
    build_s: dict[str, float | None] = {}
    for name, path in paths.items():
        if reuse and (path / "CURRENT").exists():
            build_s[name] = None  # built by an earlier run
            continue
        t0 = time.perf_counter()
        build_index(col.docs(), path, legs=("bm25",), show_progress=False, overwrite=True,
                    shard_size=BuildConfig().shard_size if name == "default" else max(1, n_docs))
        build_s[name] = time.perf_counter() - t0
    rs = {name: Retriever.open(path, n_threads=1) for name, path in paths.items()}
    qs = col.queries
    got = {n: r.search_arrays(qs, k=10, mode="bm25", n_threads=1) for n, r in rs.items()}
    identical = bool(np.array_equal(got["default"].ids, got["one_shard"].ids)
                     and np.array_equal(got["default"].scores, got["one_shard"].scores))
    batch = _interleaved({n: (lambda r=r: r.search_arrays(qs, k=10, mode="bm25", n_threads=1)) for n, r in rs.items()},
                         rounds, 0.5)
    single_q = qs[:one_at_a_time]

    def singles(r):
        return lambda: [r.search_arrays([q], k=10, mode="bm25", n_threads=1) for q in single_q]

    single = _interleaved({n: singles(r) for n, r in rs.items()}, rounds, 0.5)
    out: dict[str, Any] = {"n_docs": n_docs, "n_queries": len(qs), "identical_results": identical,
                           "shards": {n: len(r.reader.shards) for n, r in rs.items()}, "build_seconds": build_s}
    for label, runs, nq in (("batch", batch, len(qs)), ("one_at_a_time", single, len(single_q))):
        qps = {n: [nq / s for s in v] for n, v in runs.items()}
        ratio = [a / b for a, b in zip(qps["default"], qps["one_shard"])]
        out[label] = {"qps": {n: _spread(v) for n, v in qps.items()}, "default_over_one_shard": _spread(ratio)}
    return out


def api_cost(rounds: int) -> dict[str, Any]:
    """search_batch / search() against search_arrays on SciFact (BM25, one thread)."""
    from retriever import Retriever, build_index

    col = beir("scifact")
    qids = [q for q in col.qids if q in (col.qrels or {})]
    qs = [col.queries[col.qids.index(q)] for q in qids]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "scifact"
        build_index(col.docs(), path, legs=("bm25",), show_progress=False)
        r = Retriever.open(path, n_threads=1)
        hits = r.search_batch(qs, k=10, mode="bm25")
        arr = r.search_arrays(qs, k=10, mode="bm25")
        same = all([h.id for h in hs] == list(r.doc_ids(arr.ids[i, :arr.n_found[i]])) for i, hs in enumerate(hits))
        runs = _interleaved({"search_arrays": lambda: r.search_arrays(qs, k=10, mode="bm25"),
                             "search_batch": lambda: r.search_batch(qs, k=10, mode="bm25")}, rounds, 0.5)
        batch = {n: _spread([len(qs) / s for s in v]) for n, v in runs.items()}

        lat: dict[str, list[float]] = {"search_arrays": [], "search": []}
        fns = {"search_arrays": lambda q: r.search_arrays([q], k=10, mode="bm25"),
               "search": lambda q: r.search(q, k=10, mode="bm25")}
        for f in fns.values():
            for q in qs[:50]:
                f(q)
        for _ in range(rounds):
            for n, f in fns.items():
                for q in qs:
                    t0 = time.perf_counter()
                    f(q)
                    lat[n].append((time.perf_counter() - t0) * 1e6)
    return {"n_queries": len(qs), "hits_equal_arrays": same, "batch_qps": batch,
            "single_query_us": {n: {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                                    "n": len(v)} for n, v in lat.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n-docs", type=int, default=1_000_000)
    ap.add_argument("--one-at-a-time", type=int, default=300, help="queries timed one call each")
    ap.add_argument("--skip-layout", action="store_true")
    ap.add_argument("--skip-api", action="store_true")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print only)")
    ap.add_argument("--cache-dir", default=None,
                    help="build the layout part's two 1M indexes here once and reuse them in later runs "
                         "(default: a temporary directory, built every run)")
    args = ap.parse_args(argv)
    words = list(argv if argv is not None else sys.argv[1:])
    for i, w in enumerate(words):  # the command as recorded: no local paths
        if w == "--cache-dir" and i + 1 < len(words):
            words[i + 1] = "DIR"
        elif w.startswith("--cache-dir="):
            words[i] = "--cache-dir=DIR"
    res: dict[str, Any] = {"machine": machine(), "command": "python -m benchmarks.bench_layout " + " ".join(words)}
    if not args.skip_api:
        res["api"] = api_cost(args.rounds)
        print(json.dumps(res["api"], indent=1), flush=True)
    if not args.skip_layout:
        if args.cache_dir:
            Path(args.cache_dir).mkdir(parents=True, exist_ok=True)
            res["layout"] = layout(args.n_docs, args.rounds, Path(args.cache_dir), args.one_at_a_time, reuse=True)
        else:
            with tempfile.TemporaryDirectory() as d:
                res["layout"] = layout(args.n_docs, args.rounds, Path(d), args.one_at_a_time)
        print(json.dumps(res["layout"], indent=1), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
