"""Benchmark datasets: BEIR collections from ``../shared/data`` and seeded synthetic corpora.

Synthetic BM25 corpus (``synthetic_bm25``): a vocabulary of ``vocab`` terms named ``w<rank>``
with Zipfian popularity p(r) ∝ 1/(r + 2.7)^1.07 (Zipf–Mandelbrot, close to English word
frequencies); document lengths log-normal with mean ``mean_len`` (σ = 0.6 in log space, at least
1 term); queries of 2–10 terms (uniform) drawn half from a random source document and half from the
popularity distribution, so most queries have matching documents and some terms are common.
Everything derives from one ``seed``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

DATA = Path(os.environ.get("RETRIEVER_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@dataclass
class TextCollection:
    """A corpus (iterator factory of dicts) with queries (ids, texts) and optional qrels."""

    name: str
    n_docs: int
    docs: Callable[[], Iterator[dict]]
    qids: list[str]
    queries: list[str]
    qrels: dict | None = None


def beir(name: str) -> TextCollection:
    """A BEIR collection from ``$RETRIEVER_DATA/<name>``."""
    from index.readers import read_corpus, read_qrels, read_queries

    folder = DATA / name
    queries = read_queries(folder / "queries.jsonl")
    n = sum(1 for _ in read_corpus(folder))

    def docs() -> Iterator[dict]:
        for d in read_corpus(folder):
            yield {"_id": d.id, "title": d.title, "text": d.text}

    return TextCollection(name, n, docs, list(queries), list(queries.values()), read_qrels(folder / "qrels.tsv"))


def _zipf_sampler(vocab: int, rng: np.random.Generator, s: float = 1.07, q: float = 2.7):
    p = 1.0 / (np.arange(1, vocab + 1, dtype=np.float64) + q) ** s
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    return lambda n: np.searchsorted(cdf, rng.random(n), side="right").astype(np.int64)


def synthetic_bm25(n_docs: int, *, vocab: int = 1_000_000, mean_len: float = 60.0, n_queries: int = 1000,
                   seed: int = 42) -> TextCollection:
    """Seeded synthetic text corpus for BM25 (see the module docstring)."""
    rng = np.random.default_rng(seed)
    sample = _zipf_sampler(vocab, rng)
    sigma = 0.6
    lens = np.maximum(1, rng.lognormal(np.log(mean_len) - sigma ** 2 / 2, sigma, n_docs).astype(np.int64))
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    terms = sample(int(offsets[-1])).astype(np.int32)
    qrng = np.random.default_rng(seed + 1)
    queries = []
    for _ in range(n_queries):
        n = int(qrng.integers(2, 11))
        d = int(qrng.integers(0, n_docs))
        src = terms[offsets[d]:offsets[d + 1]]
        from_doc = qrng.choice(src, size=min(len(src), (n + 1) // 2), replace=False)
        rest = sample(n - len(from_doc))
        queries.append(" ".join(f"w{t}" for t in np.concatenate([from_doc, rest])))

    def docs() -> Iterator[dict]:
        for i in range(n_docs):
            yield {"_id": str(i), "text": " ".join([f"w{t}" for t in terms[offsets[i]:offsets[i + 1]].tolist()])}

    return TextCollection(f"synthetic-{n_docs}", n_docs, docs, [f"q{i}" for i in range(n_queries)], queries)
