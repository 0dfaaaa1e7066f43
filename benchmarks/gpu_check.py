"""CPU/GPU parity and throughput check for the dense leg; prints one JSON object.

Usage::

    python3 benchmarks/gpu_check.py [--n 200000] [--queries 1000]

Without a GPU (``faiss.get_num_gpus() == 0``) it prints ``{"gpu": false, "message": "no GPU ..."}``
and exits 0. With one it builds a seeded synthetic index (``_dense_common.synthetic``), opens it
twice (``use_gpu=False`` / ``True``) and, for exact full-dimension Flat search and funnel
configurations (Flat and IVF over a 64-d prefix), checks parity: same ids after the canonical
tie order (score descending, then ordinal) and scores within 1e-4 relative. It measures QPS on
both (median of 3 runs) and the dense encoder's throughput (texts/s) on CPU and ``cuda``.
Exit status 1 if parity fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _dense_common import synthetic


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--texts", type=int, default=2000, help="texts for the encoder throughput test")
    args = ap.parse_args()
    import faiss

    if faiss.get_num_gpus() == 0:
        print(json.dumps({"gpu": False, "message": "no GPU: faiss.get_num_gpus() == 0; nothing to check"}))
        return 0
    from retriever.index.matryoshka import build_vector_index
    from retriever import Retriever

    x, qv = synthetic(args.n, args.queries, seed=1)
    out = {"gpu": True, "n_gpus": faiss.get_num_gpus(), "n": args.n, "queries": args.queries, "checks": []}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        build_vector_index([str(i) for i in range(args.n)], x, Path(tmp) / "g", dims=(64, 128, 384))
        cpu = Retriever.open(Path(tmp) / "g", use_gpu=False)
        gpu = Retriever.open(Path(tmp) / "g", use_gpu=True)
        names = ["q"] * len(qv)
        for p in ({}, {"dim": 64, "index": "Flat", "shortlist": 200},
                  {"dim": 64, "index": "IVF1024,Flat", "nprobe": 1024, "shortlist": 200}):
            row = {"params": p}
            res = {}
            for dev, r in (("cpu", cpu), ("gpu", gpu)):
                r.search_arrays(names, 10, mode="dense", query_vectors=qv, leg_params={"dense": p})
                ts = []
                for _ in range(3):
                    t = time.perf_counter()
                    res[dev] = r.search_arrays(names, 10, mode="dense", query_vectors=qv, leg_params={"dense": p})
                    ts.append(time.perf_counter() - t)
                row[f"{dev}_qps"] = round(len(qv) / statistics.median(ts), 1)
            same = np.array_equal(res["cpu"].ids, res["gpu"].ids)
            rel = float(np.max(np.abs(res["cpu"].scores - res["gpu"].scores) / np.maximum(np.abs(res["cpu"].scores), 1e-12)))
            row.update(same_ids=same, max_rel_score_diff=rel, parity=bool(same and rel <= 1e-4))
            ok &= row["parity"]
            out["checks"].append(row)
    try:
        from retriever.index.encoders.dense import DenseEncoder

        texts = [f"sample sentence number {i} about retrieval and matryoshka embeddings" for i in range(args.texts)]
        for dev in ("cpu", "cuda"):
            enc = DenseEncoder(None, device=dev, batch_size=128)
            enc.encode(texts[:64])
            t = time.perf_counter()
            enc.encode(texts)
            out[f"encoder_{dev}_texts_per_s"] = round(len(texts) / (time.perf_counter() - t), 1)
    except Exception as e:  # noqa: BLE001 - report, do not fail the parity check
        out["encoder_error"] = str(e)
    out["parity"] = ok
    print(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
