"""Build the three-leg (BM25 + dense + learned-sparse) SciFact index without re-encoding.

The SPLADE document vectors come from :mod:`benchmarks.scifact_splade_cache` (bundled model,
default :class:`retriever.index.config.SparseConfig`); the dense vectors are copied from an existing SciFact
index built with ``retriever index build`` and the default dense model (``--dense-from``). The
result is the index ``retriever index build --legs bm25,dense,sparse`` would write (same vectors,
same BM25 postings), built in seconds instead of minutes:

    python3 -m benchmarks.scifact_splade_cache            # once (repeat until "done")
    python3 -m benchmarks.build_scifact_hybrid --dense-from /tmp/idx/scifact --out /tmp/idx/scifact3
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.scifact_splade_cache import CACHE, DATA, load


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dense-from", required=True, help="SciFact index (bm25+dense) built with the default model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default=str(CACHE))
    args = ap.parse_args(argv)
    from retriever.index.pipeline import build_index
    from retriever.legs.dense import load_vectors
    from retriever.shards import IndexReader

    docs, _ = load(Path(args.cache))
    src = IndexReader(args.dense_from)
    if src.manifest.get("models", {}).get("dense", {}).get("precomputed"):
        raise SystemExit(f"{args.dense_from}: its dense vectors are precomputed; need a model-encoded index")
    dim = int(src.manifest["stats"]["dense_dim"])
    dense = np.concatenate([np.asarray(load_vectors(s.dir / "dense.arrow", s.rows, dim)) for s in src.shards])
    ids = src.doc_ids()
    if list(map(str, ids)) != list(map(str, docs["ids"])):
        raise SystemExit("document order differs between the dense index and the SPLADE cache")
    m = build_index(DATA, args.out, overwrite=True, legs=("bm25", "dense", "sparse"), dense_vectors=dense,
                    sparse_vectors=(docs["indptr"], docs["terms"], docs["weights"]),
                    dense=src.config.dense)
    print({**{k: m["stats"][k] for k in ("n_docs", "sparse_nnz", "sparse_scale")}, "build_seconds": m["build"]["build_seconds"]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
