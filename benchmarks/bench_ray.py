"""Ray scale-out (issue 25): what going through Ray costs on one machine, and a model of N machines.

One run measures, on the same corpus and queries:

1. **Build** docs/s: a one-process ``build_index`` and ``build_index(..., executor=RayExecutor(
   num_workers=w))`` for w = 1 and 2 (local Ray cluster on this machine), legs bm25 + dense, and
   whether each Ray-built index has the one-process index's shard files byte for byte.
2. **Hybrid search**: one process, then 1 and 2 Ray actors holding the shards; QPS of query
   batches and p50 / p99 latency of one query at a time, in interleaved rounds (one pass of each
   engine per round; medians with min-max spread), and whether the results equal (ids and scores).
3. **Per-shard costs** for the model: each leg's search time per shard per query (one process,
   one thread) and the bytes one query sends to and receives from one actor (pickled request and
   per-leg top-depth reply), measured; then the model's predicted latency / QPS for N machines.

Run:  flock /tmp/bench.lock python -m benchmarks.bench_ray [--docs 1500] [--queries 100] [--rounds 3]
      [--out benchmarks/results/ray.json]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.datasets import DATA
from benchmarks.timing import machine


def _corpus(folder: Path, n: int, out: Path) -> tuple[Path, list[str]]:
    from retriever.index.readers import read_corpus, read_queries

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i, d in enumerate(read_corpus(folder)):
            if i >= n:
                break
            f.write(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n")
    return out, list(read_queries(folder / "queries.jsonl").values())


def _med(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def _search_pass(r: Any, queries: list[str], batch: int) -> tuple[float, list[float]]:
    """(batch QPS, per-query latencies in ms of one query at a time)."""
    t0 = time.perf_counter()
    for i in range(0, len(queries), batch):
        r.search_arrays(queries[i:i + batch], 10, mode="hybrid")
    qps = len(queries) / (time.perf_counter() - t0)
    lat = []
    for q in queries:
        t = time.perf_counter()
        r.search_arrays([q], 10, mode="hybrid")
        lat.append((time.perf_counter() - t) * 1e3)
    return qps, lat


def _per_shard_costs(r: Any, queries: list[str]) -> dict[str, Any]:
    """Each leg's search ms per query on each shard (one thread), and the bytes of one query's
    request to / reply from one actor (pickled, as Ray ships them)."""
    from retriever.legs.base import SearchContext
    from retriever.params import defaults_for

    out: dict[str, Any] = {"legs": {}}
    ctx = SearchContext(depth=100, n_threads=1)
    for name, leg in r.engine.legs.items():
        prep = leg.prepare(queries, defaults_for(name), 1)
        ms = []
        for s in range(leg.n_shards):
            leg.search_shard(prep, s, ctx)
            t = time.perf_counter()
            leg.search_shard(prep, s, ctx)
            ms.append((time.perf_counter() - t) * 1e3 / len(queries))
        one = leg.prepare(queries[:1], defaults_for(name), 1)
        shipped = one if name in ("dense", "sparse") else {"texts": queries[:1], "params": None}
        reply = leg.search_shards(one, range(leg.n_shards), ctx)
        out["legs"][name] = {"ms_per_query_per_shard": ms, "request_bytes": len(pickle.dumps(
            shipped if name != "dense" else (one.q, one.qp))), "reply_bytes": sum(a.nbytes for a in reply)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collection", default="scifact")
    ap.add_argument("--docs", type=int, default=1500)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shard-size", type=int, default=300)
    ap.add_argument("--out", default="benchmarks/results/ray.json")
    ap.add_argument("--reuse", default=None, help="a directory of an earlier run (its corpus, indexes and build.json): "
                                                  "skip the builds, measure the search")
    args = ap.parse_args(argv)

    import ray

    from retriever import RayExecutor, Retriever, build_index

    tmp = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="bench_ray_"))
    if args.reuse:
        from retriever.index.readers import read_queries

        folder, queries = tmp / "corpus", list(read_queries(DATA / args.collection / "queries.jsonl").values())
    else:
        folder, queries = _corpus(DATA / args.collection, args.docs, tmp / "corpus")
    queries = queries[:args.queries]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False, logging_level="ERROR")
    cfg = {"legs": ("bm25", "dense"), "shard_size": args.shard_size, "show_progress": False}
    res: dict[str, Any] = {"machine": machine(), "args": vars(args), "build": {}, "search": {}}
    # --- builds
    if args.reuse:
        res["build"] = json.loads((tmp / "build.json").read_text())
        res["build_reused_from_earlier_run"] = True
    else:
        t = time.perf_counter()
        build_index(folder, tmp / "one", **cfg)
        res["build"]["one_process"] = {"seconds": time.perf_counter() - t}
    for w in (() if args.reuse else (1, 2)):
        t = time.perf_counter()
        build_index(folder, tmp / f"ray{w}", executor=RayExecutor(num_workers=w), **cfg)
        res["build"][f"ray_{w}"] = {"seconds": time.perf_counter() - t}
        a, b = tmp / "one" / "shards", tmp / f"ray{w}" / "shards"
        res["build"][f"ray_{w}"]["identical_shard_files"] = all(
            (a / s.name / f.name).read_bytes() == f.read_bytes() for s in b.iterdir() for f in s.iterdir())
    if not args.reuse:
        for v in res["build"].values():
            v["docs_per_s"] = args.docs / v["seconds"]
        (tmp / "build.json").write_text(json.dumps(res["build"], indent=1))
    print(json.dumps(res["build"], indent=1), flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    # --- search, interleaved rounds
    engines = {"one_process": Retriever.open(tmp / "one", n_threads=2)}
    for w in (1, 2):
        engines[f"ray_{w}"] = Retriever.open(tmp / "one", n_threads=2, executor=RayExecutor(num_workers=w))
    ref = engines["one_process"].search_arrays(queries, 10, mode="hybrid")
    for name, r in engines.items():
        got = r.search_arrays(queries, 10, mode="hybrid")
        res["search"][name] = {"identical": bool(np.array_equal(ref.ids, got.ids) and np.array_equal(ref.scores, got.scores)),
                               "qps": [], "p50_ms": [], "p99_ms": []}
        if name != "one_process":
            res["search"][name]["assignment"] = r.engine.assignment
    for _ in range(args.rounds):
        for name, r in engines.items():
            qps, lat = _search_pass(r, queries, args.batch)
            s = res["search"][name]
            s["qps"].append(qps)
            s["p50_ms"].append(float(np.percentile(lat, 50)))
            s["p99_ms"].append(float(np.percentile(lat, 99)))
    for s in res["search"].values():
        for k in ("qps", "p50_ms", "p99_ms"):
            s[k] = _med(s[k])
    print(json.dumps(res["search"], indent=1), flush=True)
    # --- per-shard costs and the N-machine model
    costs = _per_shard_costs(engines["one_process"], queries)
    n_shards = len(engines["one_process"].reader.shards)
    local_p50 = res["search"]["one_process"]["p50_ms"]["median"]
    ray1_p50 = res["search"]["ray_1"]["p50_ms"]["median"]
    shard_ms = sum(statistics.median(c["ms_per_query_per_shard"]) for c in costs["legs"].values())
    costs["shard_ms_all_legs"] = shard_ms
    costs["ray_overhead_ms_per_query"] = ray1_p50 - local_p50
    costs["driver_ms_per_query"] = max(0.0, local_p50 - shard_ms * n_shards)  # encode, merge, fuse, API
    costs["bytes_per_query_per_actor"] = sum(c["request_bytes"] + c["reply_bytes"] for c in costs["legs"].values())
    model = {}
    for machines in (1, 2, 4, 8, 16):
        work = shard_ms * n_shards / machines
        model[machines] = {"latency_ms": costs["driver_ms_per_query"] + costs["ray_overhead_ms_per_query"] + work,
                           "qps_bound_actors": 1e3 * machines / (shard_ms * n_shards),
                           "qps_bound_driver": 1e3 / max(costs["driver_ms_per_query"], 1e-9)}
    res["per_shard"], res["model"] = costs, model
    print(json.dumps({"per_shard": costs, "model": model}, indent=1), flush=True)
    for r in engines.values():
        r.close()
    ray.shutdown()
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
