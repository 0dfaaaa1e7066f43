"""SciFact nDCG@10 of the dense leg at Matryoshka prefix dims, with and without the PCA rotation.

Usage (from the repository root)::

    python3 benchmarks/matryoshka_quality.py [--index DIR] [--dims 64,128,256,384]

``--index``: an existing dense SciFact index (default: built once under
$RETRIEVER_BENCH_CACHE=/tmp/retriever-bench). Its vectors are reused (no re-encoding); two
float16 indexes are written from them with ``retriever.index.matryoshka.build_vector_index``: one with the
PCA rotation and one without (prefixes of the raw MiniLM vectors). Each is searched through the
library (``Retriever.search_arrays`` with ``leg_params={"dense": {"dim": m, ...}}``) and scored
with ``retriever.evaluation.evaluate`` (trec_eval conventions). Columns:

- ``prefix``: ranking by the re-normalised m-dim prefix alone (exact Flat search, ``rescore=False``);
- ``funnel k'=100``: the m-dim prefix shortlists 100 candidates, re-scored at full dimension.

Writes benchmarks/results/matryoshka_quality.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from _dense_common import ROOT, load_model_vectors, scifact_index, scifact_queries


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=Path, default=None)
    ap.add_argument("--dims", default="64,128,256,384")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()

    from retriever.index.matryoshka import build_vector_index
    from retriever import Retriever
    from retriever.evaluation import evaluate, make_run

    dims = [int(x) for x in args.dims.split(",")]
    ids, x, manifest = load_model_vectors(scifact_index(args.index))
    qids, qv, qrels = scifact_queries(manifest)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        idx = {}
        for name, mrl in (("no_rotation", True), ("pca_rotation", False)):
            build_vector_index(ids, x, Path(tmp) / name, dims=dims, mrl_trained=mrl, dtype="float16",
                               model_info={"path": manifest["models"]["dense"]["path"]})
            idx[name] = Retriever.open(Path(tmp) / name)

        def ndcg(r, params):
            res = r.search_arrays(["q"] * len(qids), 100, mode="dense", query_vectors=qv,
                                  leg_params={"dense": params})
            docs = [r.doc_ids(res.ids[i, :res.n_found[i]]).tolist() for i in range(len(qids))]
            run = make_run(qids, docs, [res.scores[i, :res.n_found[i]].tolist() for i in range(len(qids))])
            m = evaluate(run, qrels, qids=qids)
            return round(m["ndcg@10"], 4), round(m["recall@100"], 4)

        for d in dims:
            row = {"dim": d}
            for name, r in idx.items():
                row[f"{name}_prefix_ndcg@10"], row[f"{name}_prefix_recall@100"] = ndcg(
                    r, {"dim": d, "index": "Flat", "shortlist": 100, "rescore": False})
                row[f"{name}_funnel100_ndcg@10"], _ = ndcg(r, {"dim": d, "index": "Flat", "shortlist": 100})
            rows.append(row)
            print(json.dumps(row))
    out = {"collection": "SciFact (BEIR test, 300 judged queries)", "model": "all-MiniLM-L6-v2 (384-d)",
           "storage": "float16", "metric": "nDCG@10 (trec_eval conventions)", "rows": rows,
           "command": "python3 benchmarks/matryoshka_quality.py", "date": time.strftime("%Y-%m-%d")}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "matryoshka_quality.json").write_text(json.dumps(out, indent=1))
    md = ["| dim | prefix, no rotation | prefix, PCA rotation | funnel k'=100, no rotation | funnel k'=100, PCA rotation |",
          "|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['dim']} | {r['no_rotation_prefix_ndcg@10']:.4f} | {r['pca_rotation_prefix_ndcg@10']:.4f} | "
                  f"{r['no_rotation_funnel100_ndcg@10']:.4f} | {r['pca_rotation_funnel100_ndcg@10']:.4f} |")
    (args.out / "matryoshka_quality.md").write_text(
        "SciFact nDCG@10, dense leg (all-MiniLM-L6-v2, float16 vectors), by Matryoshka prefix dim.\n\n"
        + "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
