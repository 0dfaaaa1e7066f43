"""Shared helpers of the dense benchmarks: SciFact MiniLM vectors (cached in an index) and a seeded
synthetic generator calibrated to their covariance spectrum."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("RETRIEVER_DATA", ROOT.parent / "shared" / "data"))
CACHE = Path(os.environ.get("RETRIEVER_BENCH_CACHE", "/tmp/retriever-bench"))
CALIBRATION = ROOT / "benchmarks" / "synth_calibration.json"


def scifact_index(path: Path | None = None) -> Path:
    """A dense-only, unrotated float32 SciFact index (built once with the bundled MiniLM, ~5 min on 2 cores)."""
    from retriever import BuildConfig, DenseConfig, build_index

    path = Path(path) if path else CACHE / "scifact-dense-f32"
    if (path / "manifest.json").is_file() and not (path / "CURRENT").is_file():  # cached at format 1
        from retriever.index.upgrade import upgrade_index
        upgrade_index(path)
    if not (path / "CURRENT").is_file():
        print(f"building {path} (dense encoding of SciFact, a few minutes)...", file=sys.stderr)
        build_index(DATA / "scifact", path, BuildConfig(legs=("dense",), dense=DenseConfig(dtype="float32")),
                    show_progress=False)
    return path


def load_model_vectors(index_dir: Path) -> tuple[list[str], np.ndarray, dict]:
    """(ids, float32 (n, d) model-space vectors, manifest) of an index (rotation undone if any)."""
    from retriever.index.matryoshka import load_rotation
    from retriever.legs.dense import load_vectors
    from retriever.shards import IndexReader

    r = IndexReader(index_dir)
    d = int(r.manifest["stats"]["dense_dim"])
    x = np.concatenate([np.asarray(load_vectors(s.dir / "dense.arrow", s.rows, d), np.float32) for s in r.shards])
    R = load_rotation(r.path, r.manifest, d)
    if R is not None:
        x = (x.astype(np.float64) @ R.T.astype(np.float64)).astype(np.float32)
    return list(r.doc_ids()), x, r.manifest


def scifact_queries(manifest: dict, split: str = "test") -> tuple[list[str], np.ndarray, dict]:
    """(qids, float32 (nq, d) encoded queries, qrels) of SciFact's judged queries."""
    from retriever.index.encoders.dense import DenseEncoder
    from retriever.index.readers import read_qrels, read_queries

    qfile, rfile = ("queries.jsonl", "qrels.tsv") if split == "test" else ("queries_train.jsonl", "qrels_train.tsv")
    queries = read_queries(DATA / "scifact" / qfile)
    qrels = read_qrels(DATA / "scifact" / rfile)
    qids = [q for q in queries if q in qrels]
    enc = DenseEncoder(manifest["models"]["dense"]["path"])
    return qids, enc.encode([queries[q] for q in qids]), qrels


def calibrate(x: np.ndarray) -> dict:
    """Covariance spectrum (descending eigenvalues) and mean norm of real embeddings."""
    x = x.astype(np.float64)
    mu = x.mean(0)
    ev = np.linalg.eigvalsh(np.cov(x - mu, rowvar=False))[::-1]
    return {"source": "SciFact corpus (5,183 docs), all-MiniLM-L6-v2 mean-pooled, L2-normalised",
            "dim": int(x.shape[1]), "mean_norm": float(np.linalg.norm(mu)),
            "eigenvalues": [float(max(v, 0.0)) for v in ev]}


def synthetic(n: int, nq: int, seed: int = 0, *, clusters: int = 2000, between: float = 0.5,
              query_noise: float = 0.35, chunk: int = 100_000) -> tuple[np.ndarray, np.ndarray]:
    """Seeded synthetic unit vectors with the anisotropy of real sentence embeddings.

    Model (calibrated by :data:`CALIBRATION`, the SciFact MiniLM covariance spectrum λ and mean
    norm): a random orthogonal basis Q and a random mean direction μ (|μ| = SciFact's); ``clusters``
    centres c_j = μ + Q·(√(between·λ) ⊙ z_j); documents x = c_j + Q·(√((1−between)·λ) ⊙ z), then
    L2-normalised. So the total covariance matches SciFact's decaying spectrum (a few strong
    directions, a long tail) and documents form topical clusters. Queries are documents drawn at
    random plus Gaussian noise with covariance ``query_noise``·Σ, L2-normalised ("queries near
    documents"). Returns float32 (n, d) documents and (nq, d) queries.
    """
    cal = json.loads(CALIBRATION.read_text())
    lam = np.asarray(cal["eigenvalues"], np.float64)
    d = len(lam)
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    mu = rng.standard_normal(d)
    mu *= cal["mean_norm"] / np.linalg.norm(mu)
    sb, sw = np.sqrt(between * lam), np.sqrt((1 - between) * lam)
    centres = mu + (rng.standard_normal((clusters, d)) * sb) @ Q.T
    x = np.empty((n, d), np.float32)
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        c = rng.integers(0, clusters, b - a)
        v = centres[c] + (rng.standard_normal((b - a, d)) * sw) @ Q.T
        x[a:b] = v / np.linalg.norm(v, axis=1, keepdims=True)
    src = rng.choice(n, nq, replace=False)
    q = x[src].astype(np.float64) + (rng.standard_normal((nq, d)) * np.sqrt(query_noise * lam)) @ Q.T
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return x, q.astype(np.float32)
