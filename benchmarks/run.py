"""One command for every headline figure: ``python -m benchmarks.run [--quick] [--only SECTION]...``.

Sections (each writes ``benchmarks/results/<section>.json``; then ``SUMMARY.md``, recall–QPS plots
``benchmarks/results/*.png`` and the README's marked section are regenerated from whatever JSON
files exist, so a section can be rerun alone):

- ``hybrid``: BM25 + dense (+ learned sparse when the leg exists) on the seeded synthetic corpus
  (benchmarks/datasets.py), top-10, RRF, 2 threads, batch size 1, query vectors passed (dense query
  encoding excluded; BM25 query analysis included). Dense leg: IVF (nlist ≈ √N) over precomputed
  vectors, swept over nprobe; recall@10 against flat / exhaustive search and the fused list of the
  exact legs. Full: 100k and 1M documents. Quick: 20k.
- ``encode``: query encoding time of each bundled model, on its own (SciFact queries).
- ``indexing``: documents/s of the non-model part (analyzer + postings + Arrow writing, BM25-only
  build of synthetic text), of the dense pipeline (``build_index`` with the model) next to the
  encoder's raw throughput on the same texts, and sentence-transformers' ``encode()`` on the same
  model, texts, max length (256) and machine.
- ``bm25``: this engine vs bm25s vs rank-bm25 (``benchmarks/bench_bm25.py``'s functions).
- ``dense``, ``sparse``: ``benchmarks/bench_dense.py`` / ``benchmarks/bench_sparse.py`` when they
  exist (written on other branches); otherwise a "not available" entry.

Peers come from ``benchmarks/requirements.txt``. ``--quick`` (small sizes, < 5 minutes on 2
cores) asserts nothing about speed. Timing method: see ``retriever/bench.py`` and
``benchmarks/timing.py``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.timing import machine

RESULTS = Path(__file__).resolve().parent / "results"
SECTIONS = ("hybrid", "encode", "indexing", "bm25", "dense", "sparse")


def _machine() -> dict[str, Any]:
    m = machine()
    try:
        m["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    try:
        import psutil
        m["memory_bytes"] = int(psutil.virtual_memory().total)
    except ImportError:
        pass
    m["time"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return m


def _nlist(n: int) -> int:
    return int(2 ** max(4, round(math.log2(max(math.sqrt(n), 1)))))


# ----------------------------------------------------------------------------------------- hybrid

def bench_hybrid(n_docs: int, tmp: Path, *, threads: int = 2, n_queries: int = 1000,
                 nprobes: tuple[int, ...] = (1, 4, 16, 64), k: int = 10) -> dict[str, Any]:
    """Build a BM25 + dense (IVF) index of the synthetic hybrid corpus and benchmark it."""
    import faiss

    from benchmarks.datasets import synthetic_hybrid
    from index.config import DenseConfig
    from retriever import Retriever, build_index
    from retriever.bench import bench_index

    col = synthetic_hybrid(n_docs, n_queries=n_queries)
    nlist = _nlist(n_docs)
    factory = f"IVF{nlist},Flat"
    out = tmp / col.name
    t0 = time.perf_counter()
    build_index(col.text.docs(), out, legs=("bm25", "dense"), dense_vectors=col.dense.blocks(),
                show_progress=False, shard_size=max(n_docs, 1), batch_size=8192,
                dense=DenseConfig(faiss_factory=factory))
    build_s = time.perf_counter() - t0
    r = Retriever.open(out, n_threads=threads)
    entry: dict[str, Any] = {"n_docs": n_docs, "n_queries": n_queries, "threads": threads, "k": k,
                             "dense_factory": factory, "dim": col.dense.dim, "build_seconds": build_s,
                             "legs": list(r.legs), "sparse": "not available (learned-sparse leg not on this branch)",
                             "points": []}
    cache: dict[str, Any] = {}
    bm25 = bench_index(r, col.text.queries, modes=["bm25"], k=k, n_threads=threads, batch_size=1,
                       exact_cache=cache)
    entry["bm25"] = bm25["modes"]["bm25"]
    entry["bytes_on_disk"] = bm25["index"]["bytes_on_disk"]
    for nprobe in nprobes:
        lp = {"dense": {"params": faiss.SearchParametersIVF(nprobe=min(nprobe, nlist))}}
        rep = bench_index(r, col.text.queries, modes=["dense", "hybrid"], k=k, n_threads=threads, batch_size=1,
                          query_vectors=col.dense.queries, leg_params=lp, exact_cache=cache)
        entry["points"].append({"nprobe": nprobe, **rep["modes"]})
        h = rep["modes"]["hybrid"]
        print(f"  hybrid {n_docs} nprobe={nprobe}: p99 {h['latency_ms']['p99']:.2f} ms, "
              f"QPS {h['qps']:.0f}, recall@{k} {h[f'recall@{k}']}", flush=True)
    entry["peak_rss_bytes"] = rep["peak_rss_bytes"]
    ok = [p for p in entry["points"] if (p["hybrid"][f"recall@{k}"].get("fused") or 0) >= 0.95]
    best = min(ok or entry["points"], key=lambda p: p["hybrid"]["latency_ms"]["p99"])
    entry["headline"] = {"nprobe": best["nprobe"], "p99_ms": best["hybrid"]["latency_ms"]["p99"],
                         "p50_ms": best["hybrid"]["latency_ms"]["p50"], "qps": best["hybrid"]["qps"],
                         f"recall@{k}": best["hybrid"][f"recall@{k}"], "target_p99_ms": 10.0,
                         "meets_target": best["hybrid"]["latency_ms"]["p99"] <= 10.0}
    r.close()
    del r
    import shutil
    shutil.rmtree(out, ignore_errors=True)
    return entry


def section_hybrid(quick: bool) -> dict[str, Any]:
    sizes = [20_000] if quick else [100_000, 1_000_000]
    out: dict[str, Any] = {"sizes": {}}
    with tempfile.TemporaryDirectory(dir=os.environ.get("RETRIEVER_BENCH_TMP")) as tmp:
        for n in sizes:
            out["sizes"][str(n)] = bench_hybrid(n, Path(tmp), n_queries=300 if quick else 1000,
                                                nprobes=(1, 8) if quick else (1, 4, 16, 64))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (< 5 minutes on 2 cores)")
    ap.add_argument("--only", action="append", choices=SECTIONS, help="run only these sections (repeatable)")
    ap.add_argument("--out", default=str(RESULTS), help="results folder")
    ap.add_argument("--no-readme", action="store_true", help="do not regenerate README.md's bench section")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:])
    t_start = time.perf_counter()
    for name in args.only or SECTIONS:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            res = SECTION_FUNCS[name](args.quick)
            status = res.pop("_status", "ok")
        except Exception as e:  # a failing section is recorded, the others still run
            traceback.print_exc()
            res, status = {"error": f"{type(e).__name__}: {e}"}, "error"
        doc = {"section": name, "status": status, "quick": args.quick, "command": cmd, "machine": _machine(),
               "seconds": round(time.perf_counter() - t0, 1), "results": res}
        (out / f"{name}.json").write_text(json.dumps(doc, indent=1, default=_json_default))
        print(f"   {name}: {status} in {doc['seconds']} s", flush=True)
    from benchmarks.report import write_plots, write_summary

    write_plots(out)
    write_summary(out)
    if not args.no_readme and out.resolve() == RESULTS.resolve():
        from benchmarks.update_readme import update_readme
        update_readme()
    print(f"done in {time.perf_counter() - t_start:.0f} s; see {out / 'SUMMARY.md'}", flush=True)
    return 0


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


SECTION_FUNCS = {"hybrid": section_hybrid}

if __name__ == "__main__":
    sys.exit(main())
