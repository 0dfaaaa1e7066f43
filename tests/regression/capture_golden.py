"""Capture the golden search results that ``tests/regression/test_golden.py`` checks.

Two steps, both from the repository root:

    python -m tests.regression.capture_golden encode    # the bundled models, once (minutes of CPU)
    python -m tests.regression.capture_golden capture   # indexes + searches (about a minute)

(``python tests/regression/capture_golden.py ...`` works too.) ``encode`` writes
``tests/regression/vectors/<collection>.npz``: every document and judged query (queries with
qrels) encoded once with the default dense model (``DenseConfig()``: all-MiniLM-L6-v2, documents
stored float16 as the index stores them, queries float32 as the query encoder returns them) and
the default SPLADE model (``SparseConfig()``), as ``build_index`` and the legs would encode them.
``capture`` builds each collection's three-leg index from those vectors in every layout of
:func:`golden_cases.layouts`, runs every case of :data:`golden_cases.CASES` and writes
``golden/<collection>.npz`` and ``golden/manifest.json``. Before writing it checks what the
engine documents: a second run of every case returns the same arrays (the second BM25 call also
takes the compiled analyse-and-score path), two threads return what one does, and every exact case
returns the same arrays in every layout. It prints where approximate cases differ across layouts.

Run ``capture`` on the code whose results are to be pinned (it records ``git rev-parse HEAD``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: import this checkout's packages, not an installed copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "tests.regression"

from tests.regression import golden_cases as G  # noqa: E402


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=G.ROOT, capture_output=True, text=True, check=True).stdout.rstrip()


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)


def _models() -> dict[str, dict[str, str]]:
    """Name and weight-file SHA-256 of each bundled model (no machine paths)."""
    from retriever.index.encoders.dense import resolve_model_path
    from retriever.index.encoders.sparse import resolve_sparse_model
    from retriever.index.format import sha256_file

    out = {}
    for leg, path in (("dense", resolve_model_path(None)), ("sparse", resolve_sparse_model(None))):
        weights = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
        out[leg] = {"name": path.name, "sha256": {p.name: sha256_file(p) for p in weights}}
    return out


class _Encoders:
    """The bundled models, loaded as ``build_index`` (documents) and the legs (queries) load them."""

    def __init__(self) -> None:
        from retriever.index.config import DenseConfig, SparseConfig
        from retriever.index.encoders.dense import DenseEncoder
        from retriever.index.encoders.sparse import SparseEncoder

        self.dc, self.sc = dc, sc = DenseConfig(), SparseConfig()
        if dc.dtype != "float16":
            raise SystemExit(f"DenseConfig().dtype is {dc.dtype!r}; this capture stores float16")
        self.dense_docs = DenseEncoder(dc.model, max_length=dc.max_length, batch_size=dc.batch_size,
                                       normalize=dc.normalize, precision=dc.precision)
        self.dense_queries = DenseEncoder(dc.model, max_length=dc.max_length, batch_size=dc.batch_size,
                                          normalize=dc.normalize)  # the dense leg's query encoder: float32
        self.sparse = SparseEncoder(sc.model, doc_max_length=sc.doc_max_length,
                                    query_max_length=sc.query_max_length, batch_size=sc.batch_size)
        if self.sparse.vocab_size > np.iinfo(np.uint16).max + 1:
            raise SystemExit(f"sparse vocabulary of {self.sparse.vocab_size} terms does not fit uint16 term ids")

    def docs(self, texts: list[str]) -> dict[str, np.ndarray]:
        ip, t, w = self.sparse.encode(texts)
        return {"dense": self.dense_docs.encode([self.dc.document_prefix + x for x in texts]).astype(np.float16),
                "indptr": ip, "terms": t, "weights": w}

    def queries(self, texts: list[str]) -> dict[str, np.ndarray]:
        ip, t, w = self.sparse.encode_queries(texts)
        return {"dense": self.dense_queries.encode([self.dc.query_prefix + x for x in texts]).astype(np.float32),
                "indptr": ip, "terms": t, "weights": w}


def _claim(path: Path) -> bool:
    """Claim a unit of work (a ``.claim`` file holding this process's id); a claim whose process
    has ended is taken over. Lets several ``encode`` processes share one collection."""
    import os

    claim = path.with_name(path.name + ".claim")
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                os.kill(int(claim.read_text() or "0"), 0)
                return False  # held by a live process
            except (ProcessLookupError, ValueError):
                claim.unlink(missing_ok=True)
                continue
            except PermissionError:
                return False
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    nnz = np.concatenate([np.diff(p["indptr"]) for p in parts])
    return {"dense": np.concatenate([p["dense"] for p in parts]), "nnz": nnz,
            "terms": np.concatenate([p["terms"] for p in parts]),
            "weights": np.concatenate([p["weights"] for p in parts])}


def encode(collections: list[str], threads: int, work: Path, chunk: int) -> None:
    """Encode documents and judged queries of ``collections`` and write ``vectors/<c>.npz``.

    Work goes in units (``chunk`` documents, or a collection's queries) saved under ``work``, so
    an interrupted run resumes and several processes can share the work (run the same command
    in each; the last to finish a collection writes its file).
    """
    import torch

    torch.set_num_threads(threads)
    enc: _Encoders | None = None
    for c in collections:
        if (G.VECTORS / f"{c}.npz").is_file():
            print(f"{c}: vectors exist, skipped", flush=True)
            continue
        t0 = time.perf_counter()
        docs = list(G.corpus(c))
        texts = [G.doc_text(d) for d in docs]
        qids, queries = G.judged_queries(c)
        units = [(work / c / f"docs_{chunk}_{i:05d}.npz", texts[i * chunk:(i + 1) * chunk], False)
                 for i in range((len(texts) + chunk - 1) // chunk)]
        units.append((work / c / "queries.npz", queries, True))
        (work / c).mkdir(parents=True, exist_ok=True)
        for path, batch, is_query in units:
            if path.is_file() or not _claim(path):
                continue
            if enc is None:
                enc = _Encoders()
            t = time.perf_counter()
            _save_npz(path, **(enc.queries(batch) if is_query else enc.docs(batch)))
            path.with_name(path.name + ".claim").unlink(missing_ok=True)
            print(f"{c}: {path.name} ({len(batch)} texts) in {time.perf_counter() - t:.0f} s", flush=True)
        if not all(p.is_file() for p, _, _ in units):
            print(f"{c}: other processes hold the remaining units", flush=True)
            continue
        parts = []
        for p, _, _ in units:
            with np.load(p) as z:
                parts.append({k: z[k] for k in z.files})
        d, q = _concat(parts[:-1]), _concat(parts[-1:])
        assert len(d["dense"]) == len(docs) and len(q["dense"]) == len(qids), c
        arrays = {"doc_ids": np.array([x.id for x in docs]), "query_ids": np.array(qids),
                  "dense_docs": d["dense"], "dense_queries": q["dense"]}
        for name, part in (("sparse_docs", d), ("sparse_queries", q)):
            small = part["nnz"].max(initial=0) <= np.iinfo(np.uint16).max
            arrays[f"{name}_nnz"] = part["nnz"].astype(np.uint16 if small else np.int32)
            arrays[f"{name}_terms"] = part["terms"].astype(np.uint16)  # lossless (checked); read back as int32
            arrays[f"{name}_weights"] = part["weights"].astype(np.float32)
        path = G.VECTORS / f"{c}.npz"
        _save_npz(path, **arrays)
        print(f"{c}: {len(docs)} docs, {len(qids)} queries, sparse nnz {int(d['nnz'].sum())}; "
              f"{time.perf_counter() - t0:.0f} s; {path.stat().st_size / 1e6:.2f} MB", flush=True)


def _run_cases(retriever, queries: list[str], vec: dict, vocab_size: int, n_threads: int = G.N_THREADS
               ) -> dict[str, dict]:
    """Every case's result arrays, ``{case name: {field: array}}``."""
    svec = G.sparse_query_matrix(vec["sparse_queries"], vocab_size)
    return {case.name: G.result_arrays(retriever, case.search(retriever, queries, vec["dense_queries"], svec,
                                                               n_threads))
            for case in G.CASES}


def capture(collections: list[str]) -> int:
    """Build, search, check and write the golden files; returns the process exit code."""
    from retriever import Retriever

    problems: list[str] = []
    layout_sizes: dict[str, dict] = {}
    collection_info: dict[str, dict] = {}
    for c in collections:
        t0 = time.perf_counter()
        vec = G.load_vectors(c)
        qids, queries = G.judged_queries(c)
        if list(vec["query_ids"]) != qids:
            raise SystemExit(f"{c}: judged queries differ from the stored vectors' query ids (re-run encode)")
        golden: dict[str, np.ndarray] = {}
        by_layout: dict[str, dict[str, dict]] = {}
        sizes = G.layouts(len(vec["doc_ids"]))
        with tempfile.TemporaryDirectory() as tmp:
            for layout, shard_size in sizes.items():
                manifest = G.build(c, Path(tmp) / layout, shard_size, vec)
                n_shards = len(manifest["shards"])
                layout_sizes.setdefault(c, {})[layout] = {"shard_size": shard_size, "n_shards": n_shards,
                                                          "rows": [s["rows"] for s in manifest["shards"]]}
                vocab = int(manifest["stats"]["sparse_vocab_size"])
                with Retriever.open(Path(tmp) / layout) as r:
                    first = _run_cases(r, queries, vec, vocab)
                    again = _run_cases(r, queries, vec, vocab)
                    two = _run_cases(r, queries, vec, vocab, n_threads=2)
                for name in first:
                    for what, other in (("a second run", again), ("two threads", two)):
                        d = G.differences(first[name], other[name])
                        if d:
                            problems.append(f"{c} {layout} {name}: {what} differs: {d[:3]}")
                by_layout[layout] = first
                for name, arrays in first.items():
                    for f, a in arrays.items():
                        golden[G.key(layout, name, f)] = a
        base = by_layout["one"]
        for case in G.CASES:
            d = G.differences(base[case.name], by_layout["small"][case.name])
            if d and case.exact:
                problems.append(f"{c} {case.name} (exact): layouts differ: {d[:3]}")
            elif d:
                print(f"  {c} {case.name} (approximate): layouts differ in {len(d)} arrays, e.g. {d[0][:160]}")
        golden["query_ids"] = vec["query_ids"]
        _save_npz(G.GOLDEN / f"{c}.npz", **golden)
        collection_info[c] = {"n_docs": len(vec["doc_ids"]), "n_queries": len(qids),
                              "layouts": layout_sizes[c]}
        print(f"{c}: {len(G.CASES)} cases x {len(sizes)} layouts in {time.perf_counter() - t0:.0f} s; "
              f"{(G.GOLDEN / f'{c}.npz').stat().st_size / 1e6:.2f} MB", flush=True)
    for p in problems:
        print("PROBLEM:", p, flush=True)
    dirty = [ln for ln in _git("status", "--porcelain").splitlines() if not ln[3:].startswith("tests/")]
    manifest = {"what": "top-k ids and scores of every case on every collection and layout; see "
                        "tests/regression/golden_cases.py",
                "commit": _git("rev-parse", "HEAD"),
                # the last commit that changed anything outside tests/ (the code the results come from)
                "code_commit": _git("log", "-1", "--format=%H", "--", ".", ":(exclude)tests"),
                "code_modified_outside_tests": bool(dirty),
                "captured_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
                "k": G.K, "legs": list(G.LEGS), "n_threads": G.N_THREADS,
                "cases": [case.describe() for case in G.CASES], "collections": collection_info,
                "models": _models(), "problems": problems}
    if set(collections) != set(G.COLLECTIONS) and G.MANIFEST.is_file():  # keep the other collections' entries
        old = G.load_manifest()
        manifest["collections"] = {**old.get("collections", {}), **collection_info}
    G.MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=("encode", "capture"))
    ap.add_argument("--collections", default=",".join(G.COLLECTIONS), help="comma list (default: all four)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads while encoding")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "retriever-golden-encode"),
                    help="folder of the encode step's resumable units (default: in the temp folder)")
    ap.add_argument("--chunk", type=int, default=256, help="documents per encode unit")
    args = ap.parse_args(argv)
    collections = [c.strip() for c in args.collections.split(",") if c.strip()]
    unknown = sorted(set(collections) - set(G.COLLECTIONS))
    if unknown:
        ap.error(f"unknown collections {unknown}; expected some of {', '.join(G.COLLECTIONS)}")
    if args.step == "encode":
        encode(collections, args.threads, Path(args.work), args.chunk)
        return 0
    return capture(collections)


if __name__ == "__main__":
    raise SystemExit(main())
