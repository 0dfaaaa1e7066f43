"""What compiling a metadata filter costs, against what a query costs (issue 22: "where mask
compilation dominates a query, cache ... measure first").

1. **SciFact** (5,183 documents, one shard) with synthetic typed fields: ``compile_filter`` of
   each filter on its own (uncached), and one BM25 query (``search_arrays``, k = 10, one thread)
   unfiltered, filtered with the mask cache cold (cleared before every call: compile + search)
   and warm (the Retriever's LRU hit).
2. **1M synthetic rows** (a metadata table of 1,000,000 documents with the same fields, in one
   shard and in 10 shards of 100,000, as ``docs.arrow`` holds them): ``compile_filter`` per filter.

Fields: ``year`` uniform int in [0, 1000), ``cat`` Zipfian category (50 values, s = 1.3),
``flag`` bool, ``ts`` timestamp (one minute per document), ``tags`` 0-3 of 5 tags.

Run:  python -m benchmarks.bench_filters [--rounds 5] [--n-docs 1000000] [--out benchmarks/results/filter_compile.json]
Medians over the rounds with min-max spread (the rounds interleave the filters).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from benchmarks.timing import machine

T0 = dt.datetime(2020, 1, 1)
CATS = [f"c{i}" for i in range(50)]
TAGS = ["red", "green", "blue", "black", "white"]
#: name -> filter (dict form); selectivities from ~0.1 % to 100 %
FILTERS: dict[str, Any] = {
    "int_0.1%": {"year": {"$lt": 1}},
    "int_10%": {"year": {"$lt": 100}},
    "int_range_50%": {"year": {"$gte": 250, "$lt": 750}},
    "zipf_cat_in": {"cat": {"$in": ["c3", "c4", "c5"]}},
    "bool_50%": {"flag": True},
    "timestamp_10%": {"ts": {"$lt": "PLACEHOLDER"}},
    "tags_contains": {"tags": "red"},
    "and_or_not": {"$and": [{"year": {"$lt": 500}}, {"$or": [{"cat": "c0"}, {"$not": {"flag": True}}]}]},
}


def fields(n: int, seed: int) -> dict[str, pa.Array]:
    """The synthetic typed columns of ``n`` documents (Arrow arrays, the types metadata inference gives)."""
    rng = np.random.default_rng(seed)
    year = rng.integers(0, 1000, n)
    cat = np.minimum(rng.zipf(1.3, n) - 1, len(CATS) - 1)
    ts = np.datetime64(T0, "us") + rng.permutation(n).astype("timedelta64[m]").astype("timedelta64[us]")
    counts = rng.integers(0, 4, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    tag_vals = pa.array(np.array(TAGS, dtype=object)[rng.integers(0, len(TAGS), int(offsets[-1]))], pa.large_string())
    return {"year": pa.array(year, pa.int64()),
            "cat": pa.array(np.array(CATS, dtype=object)[cat], pa.large_string()),
            "flag": pa.array(np.arange(n) % 2 == 1),
            "ts": pa.array(ts, pa.timestamp("us")),
            "tags": pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), tag_vals)}


SCHEMA = {"year": "int64", "cat": "string", "flag": "bool", "ts": "timestamp", "tags": "list<string>"}


def synthetic_reader(n: int, n_shards: int, seed: int = 0) -> Any:
    """An object with the two attributes ``compile_filter`` reads (``metadata_schema``, ``shards``),
    whose shards hold ``docs`` tables with a ``metadata`` struct column as ``docs.arrow`` does."""
    from retriever.shards import Shard

    cols = fields(n, seed)
    struct = pa.StructArray.from_arrays(list(cols.values()), names=list(cols))
    shards, base = [], 0
    for part in np.array_split(np.arange(n), n_shards):
        rows = len(part)
        docs = pa.table({"metadata": struct.slice(base, rows)})
        shards.append(Shard(Path(f"synthetic/{len(shards):05d}"), base, rows, docs))
        base += rows
    return SimpleNamespace(metadata_schema=dict(SCHEMA), shards=shards)


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _rounds(fns: dict[str, Callable[[], Any]], rounds: int, reps: int = 1) -> dict[str, dict[str, float]]:
    """ms per call of each function: ``rounds`` interleaved rounds of ``reps`` calls each."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            out[name].append((time.perf_counter() - t0) * 1e3 / reps)
    return {k: _spread(v) for k, v in out.items()}


def filters_for(n: int) -> dict[str, Any]:
    """:data:`FILTERS` with the timestamp bound at a tenth of the documents."""
    fl = json.loads(json.dumps(FILTERS))
    fl["timestamp_10%"] = {"ts": {"$lt": (T0 + dt.timedelta(minutes=n // 10)).isoformat()}}
    return fl


def bench_synthetic(n: int, rounds: int) -> dict[str, Any]:
    from retriever.filters import compile_filter

    out: dict[str, Any] = {"n_docs": n}
    for n_shards in (1, 10):
        reader = synthetic_reader(n, n_shards)
        fl = filters_for(n)
        sids = list(range(n_shards))
        sel = {name: float(np.mean(np.concatenate([np.ones(s.rows, np.uint8) if m is None else m for s, m in
                                                   zip(reader.shards, compile_filter(f, reader, sids))])))
               for name, f in fl.items()}
        ms = _rounds({name: (lambda f=f: compile_filter(f, reader, sids)) for name, f in fl.items()}, rounds)
        out[f"{n_shards}_shards"] = {name: {"compile_ms": ms[name], "selectivity": sel[name]} for name in fl}
    return out


def bench_scifact(data: Path, rounds: int) -> dict[str, Any]:
    from retriever import Retriever, build_index
    from retriever.filters import compile_filter

    with gzip.open(data / "scifact" / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    cols = {k: v.to_pylist() for k, v in fields(len(docs), 1).items()}
    for i, d in enumerate(docs):
        d.update({k: cols[k][i] for k in cols})
    with open(data / "scifact" / "queries.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line)["text"] for line in f]
    fl = filters_for(len(docs))
    with tempfile.TemporaryDirectory() as tmp:
        build_index(docs, Path(tmp) / "ix", legs=("bm25",), show_progress=False)
        r = Retriever.open(Path(tmp) / "ix", n_threads=1)
        sids = list(range(len(r.reader.shards)))
        compile_ms = _rounds({name: (lambda f=f: compile_filter(f, r.reader, sids)) for name, f in fl.items()},
                             rounds, reps=20)
        qs = queries[:300]
        it = iter(range(10 ** 9))

        def one(f: Any, cold: bool) -> Callable[[], Any]:
            def call() -> Any:
                if cold:
                    r._filter_cache.clear()
                q = qs[next(it) % len(qs)]
                return r.search_arrays([q], 10, mode="bm25", filter=f)
            return call

        fns: dict[str, Callable[[], Any]] = {"unfiltered": one(None, False)}
        for name in ("int_10%", "zipf_cat_in", "tags_contains"):
            fns[f"{name}_cold"] = one(fl[name], True)
            fns[f"{name}_warm"] = one(fl[name], False)
        query_ms = _rounds(fns, rounds, reps=200)
        batch_ms = _rounds({"unfiltered": lambda: r.search_arrays(qs, 10, mode="bm25"),
                            "int_10%_cold": lambda: (r._filter_cache.clear(),
                                                     r.search_arrays(qs, 10, mode="bm25", filter=fl["int_10%"])),
                            "int_10%_warm": lambda: r.search_arrays(qs, 10, mode="bm25", filter=fl["int_10%"])},
                           rounds, reps=5)
    return {"n_docs": len(docs), "compile_ms": compile_ms, "one_query_ms": query_ms,
            "batch_300_ms": batch_ms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n-docs", type=int, default=1_000_000)
    ap.add_argument("--data", default=None, help="BEIR collections folder (default: $RETRIEVER_DATA)")
    ap.add_argument("--out", default="benchmarks/results/filter_compile.json")
    args = ap.parse_args(argv)
    import os
    data = Path(args.data or os.environ.get("RETRIEVER_DATA", "data"))
    report = {"command": "python -m benchmarks.bench_filters " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(), "rounds": args.rounds,
              "scifact": bench_scifact(data, args.rounds), "synthetic": bench_synthetic(args.n_docs, args.rounds)}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
