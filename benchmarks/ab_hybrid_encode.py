"""Hybrid search with the query encoders running, two checkouts against each other (A/B).

Each round starts one process per checkout (order alternating, working directory the checkout,
so each imports its own ``retriever``), which opens the same three-leg index (BM25 + dense +
learned sparse, built with the bundled encoders), answers the first ``--queries`` queries of
the collection one at a time (``Retriever.search``, k = 10, after a warm-up of 30) and then as
one batch (``search_batch``), and prints p50 / p99 per-query latency and the batch's QPS. The
encoders run inside the timed calls (dense MiniLM and SPLADE, on the legs' worker threads side
by side), which is what ``ab_versions`` leaves out. Medians over rounds and per-round B/A ratios.

Run (A = the code before a change, B = after; each a checkout with its extension built):

    python -m benchmarks.ab_hybrid_encode --index DIR --a /path/to/before --b . --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

_PROBE = """
import json, sys, time
import numpy as np
from retriever import Retriever
from retriever.index.readers import read_queries
qs = list(read_queries(sys.argv[2]).values())[:int(sys.argv[3])]
r = Retriever.open(sys.argv[1])
for q in qs[:30]:
    r.search(q, k=10)
lat = []
for q in qs:
    t = time.perf_counter(); r.search(q, k=10); lat.append(time.perf_counter() - t)
t = time.perf_counter(); r.search_batch(qs, k=10); batch = time.perf_counter() - t
print(json.dumps({"p50_ms": 1e3 * float(np.median(lat)), "p99_ms": 1e3 * float(np.percentile(lat, 99)),
                  "batch_qps": len(qs) / batch}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", required=True, help="a BM25 + dense + sparse index")
    ap.add_argument("--queries", default=None, help="queries.jsonl (default: SciFact's under RETRIEVER_DATA)")
    ap.add_argument("--n-queries", type=int, default=300)
    ap.add_argument("--a", required=True, help="checkout A (before)")
    ap.add_argument("--b", required=True, help="checkout B (after)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from benchmarks.datasets import DATA
    from benchmarks.timing import machine

    queries = args.queries or str(DATA / "scifact" / "queries.jsonl")
    index = str(Path(args.index).resolve())
    runs: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for i in range(args.rounds):
        for side in (("a", "b") if i % 2 == 0 else ("b", "a")):
            code = Path(getattr(args, side)).resolve()
            out = subprocess.run([sys.executable, "-c", _PROBE, index, queries, str(args.n_queries)], cwd=code,
                                 capture_output=True, text=True, check=True)
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(side, runs[side][-1], flush=True)
    keys = ("p50_ms", "p99_ms", "batch_qps")
    rep = {"command": "python -m benchmarks.ab_hybrid_encode " + " ".join(argv or sys.argv[1:]), "machine": machine(),
           "runs": runs, "median": {s: {k: statistics.median(r[k] for r in v) for k in keys} for s, v in runs.items()},
           "ratio_b_over_a": {k: statistics.median(b[k] / a[k] for a, b in zip(runs["a"], runs["b"])) for k in keys}}
    print(json.dumps({k: rep[k] for k in ("median", "ratio_b_over_a")}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
