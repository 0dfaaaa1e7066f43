"""The public API's own cost on SciFact (issue: architecture v2, item 8).

300 SciFact test queries (query texts: BM25 analysis included), k = 10, BM25, one thread:

- **batch**: ``search_batch`` (full :class:`~retriever.results.Hit` objects: id, score, rank,
  title, text, metadata, per-leg view) against ``search_arrays`` of the same batch, in
  interleaved rounds (one timed pass of each per round, the order alternating); QPS from wall
  time and from this process's CPU time (``time.process_time``: less sensitive to other jobs on a
  shared machine).
- **one query**: ``search(q)`` against ``search_arrays([q])``, the two calls alternating query by
  query (which goes first alternates too), every query once per round; p50 / p99 per round.

Before timing, every query's hits are checked against ``search_arrays`` (ids and scores) and
``search(q)`` against its batch row. Medians over rounds are quoted with the min-max spread.
Targets: ``search_batch`` >= 50,000 QPS; ``search()`` p50 <= 80 µs.

Run:  python -m benchmarks.bench_api [--rounds 7] [--index DIR] [--out benchmarks/results/api_cost.json]
      [--code-root CHECKOUT]   (time another checkout's ``retriever`` on the same index, e.g. the
      code before a change, in alternating processes: ``--ab-rounds N`` processes each)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve()
DATA = Path(os.environ.get("RETRIEVER_DATA", HERE.parents[2] / "shared" / "data"))


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _queries() -> list[str]:
    from retriever.index.readers import read_qrels, read_queries

    qrels = read_qrels(DATA / "scifact" / "qrels.tsv")
    return [t for q, t in read_queries(DATA / "scifact" / "queries.jsonl").items() if q in qrels]


def build(path: Path) -> None:
    """A BM25-only SciFact index at ``path`` (the library's defaults)."""
    from retriever import build_index
    from retriever.index.readers import read_corpus

    docs = ({"_id": d.id, "title": d.title, "text": d.text} for d in read_corpus(DATA / "scifact"))
    build_index(docs, path, legs=("bm25",), show_progress=False, overwrite=True)


def _timed(fn: Callable[[], Any], min_seconds: float) -> tuple[float, float]:
    """(wall, CPU) seconds per call over at least ``min_seconds`` of calls (the result of each
    call is kept until the next one returns, as a caller holding its hits would)."""
    calls, keep = 0, None
    t0, c0 = time.perf_counter(), time.process_time()
    while True:
        keep = fn()
        calls += 1
        el = time.perf_counter() - t0
        if el >= min_seconds:
            del keep
            return el / calls, (time.process_time() - c0) / calls


def measure(index: Path, rounds: int, min_seconds: float = 0.5) -> dict[str, Any]:
    """Check, then time the batch and one-query calls (see the module docstring)."""
    import numpy as np

    from retriever import Retriever

    qs = _queries()
    r = Retriever.open(index, n_threads=1)
    kw = {"k": 10, "mode": "bm25"}
    hits = r.search_batch(qs, **kw)
    arr = r.search_arrays(qs, **kw)
    same = all([h.id for h in hs] == list(r.doc_ids(arr.ids[i, :arr.n_found[i]]))
               and [h.score for h in hs] == arr.scores[i, :arr.n_found[i]].tolist() for i, hs in enumerate(hits))
    same_single = all(r.search(q, **kw) == hs for q, hs in zip(qs, hits))
    n_hits = int(arr.n_found.sum())
    fns = {"search_arrays": lambda: r.search_arrays(qs, **kw), "search_batch": lambda: r.search_batch(qs, **kw)}
    for f in fns.values():  # warm-up
        f()
    wall: dict[str, list[float]] = {n: [] for n in fns}
    cpu: dict[str, list[float]] = {n: [] for n in fns}
    names = list(fns)
    for i in range(rounds):
        for n in (names if i % 2 == 0 else names[::-1]):
            w, c = _timed(fns[n], min_seconds)
            wall[n].append(len(qs) / w)
            cpu[n].append(len(qs) / c if c > 0 else float("inf"))
    ratio = [b / a for a, b in zip(wall["search_arrays"], wall["search_batch"])]

    one = {"search_arrays": lambda q: r.search_arrays([q], **kw), "search": lambda q: r.search(q, **kw)}
    for q in qs[:50]:
        for f in one.values():
            f(q)
    p50: dict[str, list[float]] = {n: [] for n in one}
    p99: dict[str, list[float]] = {n: [] for n in one}
    pooled: dict[str, list[float]] = {n: [] for n in one}
    order = list(one)
    for _ in range(rounds):
        lat: dict[str, list[float]] = {n: [] for n in one}
        for j, q in enumerate(qs):
            for n in (order if j % 2 == 0 else order[::-1]):
                f = one[n]
                t0 = time.perf_counter()
                keep = f(q)
                lat[n].append((time.perf_counter() - t0) * 1e6)
                del keep
        for n, v in lat.items():
            p50[n].append(float(np.percentile(v, 50)))
            p99[n].append(float(np.percentile(v, 99)))
            pooled[n] += v
    return {"n_queries": len(qs), "n_hits": n_hits, "hits_equal_arrays": bool(same),
            "search_equals_batch_row": bool(same_single),
            "batch_qps": {n: _spread(v) for n, v in wall.items()},
            "batch_qps_cpu": {n: _spread(v) for n, v in cpu.items()},
            "batch_over_arrays": _spread(ratio),
            "single_query_us": {n: {"p50": _spread(p50[n]), "p99": _spread(p99[n]),
                                    "p50_pooled": float(np.percentile(pooled[n], 50)), "n": len(pooled[n])}
                                for n in one},
            "load_average": os.getloadavg()}


def _child(root: str, index: str, rounds: int) -> dict[str, Any]:
    """One measurement in a fresh process importing ``retriever`` from ``root``."""
    code = (f"import sys, json, importlib.util; sys.path.insert(0, {root!r}); "
            f"spec = importlib.util.spec_from_file_location('bench_api', {str(HERE)!r}); "
            f"m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            f"from pathlib import Path; print(json.dumps(m.measure(Path({index!r}), {rounds})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ""}).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--index", type=Path, default=None, help="a BM25 SciFact index (default: built in a temp folder)")
    ap.add_argument("--code-root", default=None, help="also time this checkout's retriever (alternating processes)")
    ap.add_argument("--ab-rounds", type=int, default=3, help="processes per checkout with --code-root")
    ap.add_argument("--code-root-label", default="BEFORE",
                    help="what the results file says for --code-root and --index (no local paths in it)")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print only)")
    args = ap.parse_args(argv)
    from benchmarks.timing import machine

    given = list(argv if argv is not None else sys.argv[1:])
    for i, a in enumerate(given[:-1]):  # the results file names no local paths
        if a in ("--code-root", "--index"):
            given[i + 1] = args.code_root_label if a == "--code-root" else "INDEX"
    res: dict[str, Any] = {"machine": machine(), "command": "python -m benchmarks.bench_api " + " ".join(given)}
    with tempfile.TemporaryDirectory() as d:
        index = args.index
        if index is None:
            index = Path(d) / "scifact"
            build(index)
        res["api"] = measure(index, args.rounds)
        print(json.dumps(res["api"], indent=1), flush=True)
        if args.code_root:
            runs: dict[str, list[dict[str, Any]]] = {"this": [], "other": []}
            for _ in range(args.ab_rounds):
                runs["other"].append(_child(str(Path(args.code_root).resolve()), str(index), args.rounds))
                runs["this"].append(_child(str(HERE.parents[1]), str(index), args.rounds))

            def summary(rs: list[dict[str, Any]]) -> dict[str, Any]:
                return {"search_batch_qps": _spread([x["batch_qps"]["search_batch"]["median"] for x in rs]),
                        "search_arrays_qps": _spread([x["batch_qps"]["search_arrays"]["median"] for x in rs]),
                        "search_p50_us": _spread([x["single_query_us"]["search"]["p50"]["median"] for x in rs]),
                        "search_arrays_p50_us": _spread([x["single_query_us"]["search_arrays"]["p50"]["median"]
                                                         for x in rs])}
            res["ab"] = {"other": args.code_root_label, "this_code": summary(runs["this"]),
                         "other_code": summary(runs["other"]),
                         "runs": runs}
            print(json.dumps({k: res["ab"][k] for k in ("this_code", "other_code")}, indent=1), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
