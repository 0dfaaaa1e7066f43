"""Cost of the size walk of a ``dense.faiss`` (``retriever.index.faiss_file.check_faiss_bytes``)
next to FAISS's own deserialisation of the same bytes: what opening an index pays for refusing
forged sizes. Usage: ``python -m benchmarks.bench_faiss_walk INDEX_DIR [--rounds N] [--out FILE]``
(the first shard's ``dense.faiss``; medians and ranges over the rounds, interleaved)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np


def main() -> None:
    """Parse arguments, time the walk and the deserialisation interleaved, print (and save) JSON."""
    import faiss

    from retriever.index.faiss_file import check_faiss_bytes
    from retriever.index.format import current_manifest_path

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("index")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    m = json.loads(current_manifest_path(args.index).read_text())
    shard = m["shards"][0]
    p = Path(args.index) / shard["dir"] / "dense.faiss"
    data = p.read_bytes()
    walk, deser = [], []
    for _ in range(args.rounds):
        t = time.perf_counter()
        check_faiss_bytes(p, data, int(m["stats"]["dense_dim"]), int(shard["rows"]))
        walk.append(time.perf_counter() - t)
        t = time.perf_counter()
        faiss.deserialize_index(np.frombuffer(data, np.uint8))
        deser.append(time.perf_counter() - t)
    rep = {"factory": m["build_config"]["dense"]["faiss_factory"], "rows": shard["rows"], "bytes": len(data),
           "rounds": args.rounds,
           "walk_ms_median": round(statistics.median(walk) * 1e3, 2),
           "walk_ms_range": [round(min(walk) * 1e3, 2), round(max(walk) * 1e3, 2)],
           "deserialize_ms_median": round(statistics.median(deser) * 1e3, 2),
           "deserialize_ms_range": [round(min(deser) * 1e3, 2), round(max(deser) * 1e3, 2)]}
    print(json.dumps(rep))
    if args.out:
        Path(args.out).write_text(json.dumps({"command": "python -m benchmarks.bench_faiss_walk INDEX "
                                               f"--rounds {args.rounds}", **rep}, indent=1) + "\n")


if __name__ == "__main__":
    main()
