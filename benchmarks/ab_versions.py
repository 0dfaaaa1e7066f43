"""Two checkouts of this project timed against each other in alternating processes (A/B).

Each round starts one process per checkout (order alternating), which opens that checkout's own
index of the same collection and times ``search_arrays`` for BM25, learned sparse (exact), the
dense funnel (a 64-dim prefix re-scored at full dimension) and hybrid RRF over the three legs
(k = 10, one thread, the whole query batch per call, passes of >= 0.3 s, median of 3 passes).
Dense and sparse query vectors (and the documents' vectors) are given precomputed, so the
encoders are not timed. Per-round ratios B/A are reported as median (min-max).

Run (A = the code before a change, B = after; each a checkout with its extension built):

    python -m benchmarks.ab_versions --a /path/to/before --b . --collection scifact --rounds 5

``--vectors`` is an ``.npz`` as ``tests/regression/capture_golden.py`` writes them: ``dense_docs``
(n, d), ``dense_queries`` (nq, d), ``sparse_docs_{nnz,terms,weights}`` and
``sparse_queries_{nnz,terms,weights}`` (per-row counts, term ids, weights) in corpus / query order,
and ``query_ids`` (the query texts come from the collection's ``queries.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: the measurement a child process runs inside one checkout (its own ``retriever``)
CHILD = r'''
import json, sys, time, gc
import numpy as np
from pathlib import Path
from retriever import Retriever, build_index
corpus, vec_path, idx = sys.argv[1], sys.argv[2], Path(sys.argv[3])
v = np.load(vec_path, allow_pickle=False)
def csr(prefix):
    ptr = np.zeros(len(v[prefix + "_nnz"]) + 1, np.int64)
    np.cumsum(v[prefix + "_nnz"].astype(np.int64), out=ptr[1:])
    return ptr, v[prefix + "_terms"].astype(np.uint32), v[prefix + "_weights"].astype(np.float32)
if not (idx / "manifest.json").exists() and not (idx / "CURRENT").exists():
    build_index(corpus, idx, legs=("bm25", "dense", "sparse"), dense_vectors=v["dense_docs"].astype(np.float32),
                sparse_vectors=csr("sparse_docs"), show_progress=False)
r = Retriever.open(idx, n_threads=1)
text = {}
with open(Path(corpus) / "queries.jsonl", encoding="utf-8") as fh:
    for line in fh:
        q = json.loads(line)
        text[str(q["_id"])] = q["text"]
qs = [text[str(i)] for i in v["query_ids"]]
qv = v["dense_queries"].astype(np.float32)
qp, qi, qd = csr("sparse_queries")
qsv = [(qi[qp[i]:qp[i + 1]], qd[qp[i]:qp[i + 1]]) for i in range(len(qs))]
calls = {
    "bm25": lambda: r.search_arrays(qs, 10, mode="bm25", n_threads=1),
    "sparse": lambda: r.search_arrays(qs, 10, mode="sparse", sparse_vectors=qsv, n_threads=1),
    "dense_funnel": lambda: r.search_arrays(qs, 10, mode="dense", query_vectors=qv, n_threads=1,
                                            leg_params={"dense": {"dim": 64}}),
    "hybrid_rrf": lambda: r.search_arrays(qs, 10, mode="hybrid", fusion="rrf", query_vectors=qv, sparse_vectors=qsv, n_threads=1),
}
out = {}
for name, f in calls.items():
    f(); f()
    passes = []
    for _ in range(3):
        gc.collect()
        n, t0 = 0, time.perf_counter()
        while True:
            f(); n += 1
            el = time.perf_counter() - t0
            if el >= 0.3:
                break
        passes.append(len(qs) * n / el)
    out[name] = sorted(passes)[1]
print(json.dumps(out))
'''


def run_child(checkout: Path, corpus: str, vectors: str, idx: Path, pin: bool = False) -> dict[str, float]:
    """One measurement in ``checkout`` (its own interpreter process and working directory);
    ``pin``: OpenMP and BLAS held to one thread by the environment, so a version that does not
    bound them by ``n_threads`` is compared on the same budget."""
    import os

    env = dict(os.environ)
    if pin:
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", CHILD, corpus, vectors, str(idx)], cwd=checkout, env=env,
                         capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"{checkout}: measurement failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="checkout A (before)")
    ap.add_argument("--b", required=True, help="checkout B (after)")
    ap.add_argument("--collection", default="scifact", help="a folder of $RETRIEVER_DATA")
    ap.add_argument("--vectors", default=None, help="vectors .npz (default tests/regression/vectors/<collection>.npz)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pin-threads", action="store_true",
                    help="OMP/OPENBLAS/MKL_NUM_THREADS=1 in both children (the same thread budget for FAISS and BLAS)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import os

    data = Path(os.environ.get("RETRIEVER_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    corpus = str(data / args.collection)
    vectors = str(Path(args.vectors or Path(__file__).resolve().parents[1] / "tests" / "regression" / "vectors"
                       / f"{args.collection}.npz").resolve())
    runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        idx = {"a": Path(tmp) / "a", "b": Path(tmp) / "b"}
        for r in range(args.rounds):
            for side in (("a", "b") if r % 2 == 0 else ("b", "a")):
                path = Path(getattr(args, side)).resolve()
                runs[side].append(run_child(path, corpus, vectors, idx[side], args.pin_threads))
                print(f"round {r} {side}: " + ", ".join(f"{k} {v:,.0f}" for k, v in runs[side][-1].items()),
                      flush=True)
    report: dict[str, Any] = {"command": "python -m benchmarks.ab_versions " + " ".join(argv or sys.argv[1:]),
                              "qps": {}, "ratio_b_over_a": {}}
    for mode in runs["a"][0]:
        a = [x[mode] for x in runs["a"]]
        b = [x[mode] for x in runs["b"]]
        ratios = [y / x for x, y in zip(a, b)]
        report["qps"][mode] = {"a_median": statistics.median(a), "b_median": statistics.median(b)}
        report["ratio_b_over_a"][mode] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        print(f"{mode:14s} A {statistics.median(a):10,.0f} QPS  B {statistics.median(b):10,.0f} QPS  "
              f"B/A {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
