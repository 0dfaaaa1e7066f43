"""Encode SciFact once with the bundled SPLADE model and cache the vectors (resumable, in chunks).

Documents are read with :func:`retriever.index.readers.read_corpus` and encoded as the index build does
(``"title text"``, :class:`retriever.index.encoders.sparse.SparseEncoder` with the default
:class:`retriever.index.config.SparseConfig` lengths); test queries (those in ``qrels.tsv``) are encoded with
``encode_queries``. Each call encodes for at most ``--budget-s`` seconds, saving every finished
chunk, so a long encoding can be split over several short jobs:

    python3 -m benchmarks.scifact_splade_cache --budget-s 420     # repeat until it prints "done"

Output (written atomically): ``<cache>/scifact_splade_docs.npz`` and
``<cache>/scifact_splade_queries.npz``, each with ``indptr`` int64 (n+1,), ``terms`` uint32 (nnz,),
``weights`` float32 (nnz,) and ``ids`` (str, n), plus ``truncated`` (documents / queries cut at
the max length).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "scifact"
CACHE = Path(os.environ.get("RETRIEVER_CACHE", "/tmp/cache"))


def _save(path: Path, **arrays) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def _concat(parts: list[dict]) -> dict:
    ptrs, base = [np.zeros(1, np.int64)], 0
    for p in parts:
        ptrs.append(p["indptr"][1:].astype(np.int64) + base)
        base += int(p["indptr"][-1])
    return {"indptr": np.concatenate(ptrs), "terms": np.concatenate([p["terms"] for p in parts]).astype(np.uint32),
            "weights": np.concatenate([p["weights"] for p in parts]).astype(np.float32),
            "ids": np.concatenate([p["ids"] for p in parts]),
            "truncated": np.int64(sum(int(p["truncated"]) for p in parts))}


def load(cache: Path = CACHE) -> tuple[dict, dict]:
    """The cached ``(docs, queries)`` dicts (see the module docstring); FileNotFoundError if absent."""
    out = []
    for kind in ("docs", "queries"):
        with np.load(cache / f"scifact_splade_{kind}.npz") as z:
            out.append({k: z[k] for k in z.files})
    return out[0], out[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new chunks after this")
    ap.add_argument("--chunk", type=int, default=256, help="documents per saved chunk")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--cache", default=str(CACHE))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    from retriever.index.config import SparseConfig
    from retriever.index.encoders.sparse import SparseEncoder
    from retriever.index.readers import read_corpus

    cache = Path(args.cache)
    parts_dir = cache / "scifact_splade_parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    sc = SparseConfig()
    enc = SparseEncoder(sc.model, doc_max_length=sc.doc_max_length, query_max_length=sc.query_max_length,
                        batch_size=sc.batch_size)
    docs = list(read_corpus(DATA))
    n_chunks = (len(docs) + args.chunk - 1) // args.chunk
    for c in range(n_chunks):
        part = parts_dir / f"docs_{args.chunk}_{c:05d}.npz"
        if part.is_file():
            continue
        if time.perf_counter() - t0 > args.budget_s:
            print(f"budget spent; {c}/{n_chunks} chunks done, run again", flush=True)
            return 3
        batch = docs[c * args.chunk:(c + 1) * args.chunk]
        before = enc.n_truncated
        t = time.perf_counter()
        ip, terms, w = enc.encode([f"{d.title} {d.text}" if d.title else d.text for d in batch])
        _save(part, indptr=ip, terms=terms.astype(np.uint32), weights=w, ids=np.array([d.id for d in batch]),
              truncated=np.int64(enc.n_truncated - before))
        print(f"chunk {c + 1}/{n_chunks}: {len(batch) / (time.perf_counter() - t):.1f} docs/s", flush=True)
    parts = []
    for c in range(n_chunks):
        with np.load(parts_dir / f"docs_{args.chunk}_{c:05d}.npz") as z:
            parts.append({k: z[k] for k in z.files})
    _save(cache / "scifact_splade_docs.npz", **_concat(parts))
    qids = {line.split("\t")[0] for line in (DATA / "qrels.tsv").read_text().splitlines()[1:]}
    qs = [json.loads(x) for x in (DATA / "queries.jsonl").read_text().splitlines() if x.strip()]
    qs = [o for o in qs if str(o["_id"]) in qids]
    ip, terms, w = enc.encode_queries([o["text"] for o in qs])
    _save(cache / "scifact_splade_queries.npz", indptr=ip, terms=terms.astype(np.uint32), weights=w,
          ids=np.array([str(o["_id"]) for o in qs]), truncated=np.int64(enc.n_truncated_queries))
    print(f"done: {len(docs)} docs, {len(qs)} queries -> {cache}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
