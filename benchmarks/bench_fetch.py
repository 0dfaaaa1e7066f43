"""Batched document fetch: ``IndexReader.fetch_batch`` of the 3,000 hits of 300 SciFact queries
(k = 10, BM25), against fetching them query by query with ``IndexReader.fetch``.

Usage: ``python -m benchmarks.bench_fetch [--index DIR] [--repeats N]`` (builds a BM25 index of
SciFact in a temporary folder when ``--index`` is not given). Prints the median time per call of
each path and the per-hit cost; run it under the benchmark lock when other jobs share the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

DATA = Path(os.environ.get("RETRIEVER_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def _median_s(fn, repeats: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds of this process (``time.process_time``: robust
    when other processes share the cores) per call of ``fn``."""
    fn()  # warm
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=Path, help="a SciFact index (default: build a BM25 one)")
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    from retriever import Retriever, build_index
    from retriever.index.readers import read_queries

    tmp = None
    path = args.index
    if path is None:
        tmp = tempfile.TemporaryDirectory()
        path = Path(tmp.name) / "scifact"
        build_index(DATA / "scifact", path, legs=("bm25",), show_progress=False)
    r = Retriever.open(path, n_threads=1)
    queries = list(read_queries(DATA / "scifact" / "queries.jsonl").values())[:300]
    res = r.search_arrays(queries, k=10, mode="bm25")
    ords = np.concatenate([res.ids[q, :res.n_found[q]] for q in range(len(queries))])
    reader = r.reader
    batch = _median_s(lambda: reader.fetch_batch(ords), args.repeats)
    per_query = [res.ids[q, :res.n_found[q]].tolist() for q in range(len(queries))]
    one_by_one = _median_s(lambda: [reader.fetch(o) for o in per_query], max(5, args.repeats // 5))
    print(f"{len(ords)} ordinals, {len(reader.shards)} shard(s); median wall ms / CPU ms per call")
    for name, (wall, cpu) in (("fetch_batch", batch), ("fetch, query by query", one_by_one)):
        print(f"{name:24s} {wall * 1e3:8.3f} ms wall {cpu * 1e3:8.3f} ms CPU  ({cpu / len(ords) * 1e9:6.0f} ns CPU per hit)")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
