"""Benchmark datasets: BEIR collections from ``../shared/data`` and seeded synthetic corpora.

Synthetic BM25 corpus (``synthetic_bm25``): a vocabulary of ``vocab`` terms named ``w<rank>``
with Zipfian popularity p(r) ∝ 1/(r + 2.7)^1.07 (Zipf–Mandelbrot, close to English word
frequencies); document lengths log-normal with mean ``mean_len`` (σ = 0.6 in log space, at least
1 term); queries of 2–10 terms (uniform) drawn half from a random source document and half from the
popularity distribution, so most queries have matching documents and some terms are common.
Everything derives from one ``seed``.

Synthetic dense vectors (``synthetic_dense``): ``n_clusters`` (default min(1000, N/1000)) unit-norm centres drawn from a
standard normal; each document is its centre plus isotropic Gaussian noise of expected norm
``spread``, L2-normalised (float32, dim 384 by default, like all-MiniLM-L6-v2); each query is a
random document's centre plus noise of the same size, normalised, so queries have close
neighbours and IVF-style partitions are meaningful. Vectors are produced in blocks of
``block`` rows, each block from its own seeded generator, so 1M x 384 streams without holding
the corpus in memory and any run regenerates the same vectors.

Synthetic learned-sparse vectors (``synthetic_sparse``, a hook for the learned-sparse leg): per
document ``nnz`` distinct term ids from a 30,522-term (BERT WordPiece-sized) vocabulary with
Zipfian popularity, weights log-normal (as SPLADE impacts are, roughly); queries take half their
terms from a random document and half from the popularity distribution.

Calibrated learned-sparse vectors with topics (``synthetic_sparse_topical``, what
``benchmarks/bench_sparse.py`` uses): calibrated to the bundled SPLADE model's SciFact vectors —
term popularity Zipf–Mandelbrot p(r) ∝ (r + 200)^-2.0 over a random permutation of a 30,522-term
vocabulary; ``n_topics`` topics, each favouring ``topic_terms`` terms drawn by popularity; a document
picks one topic and takes ``topic_share`` of its draws from it; Poisson(136) draws per document
(≈ 120 distinct terms after merging duplicates), weights log-normal(−0.83, 1.21); a query takes
20 terms of a random source document plus Poisson(20) draws like a document of the same topic
(≈ 40 terms, about half from the source), weights log-normal(−0.76, 1.23).

``synthetic_hybrid`` pairs the BM25 text corpus with dense (and optionally sparse) vectors for
the same documents and queries (same ``n_docs`` and query count; i-th query text ↔ i-th query
vector).
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
    from retriever.index.readers import read_corpus, read_qrels, read_queries

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


@dataclass
class VectorCollection:
    """Dense vectors: ``blocks()`` yields float32 (rows, dim) blocks in corpus order."""

    name: str
    n_docs: int
    dim: int
    blocks: Callable[[], Iterator[np.ndarray]]
    queries: np.ndarray

    def all(self) -> np.ndarray:
        """Every document vector in one array (n_docs, dim) (small corpora only)."""
        return np.concatenate(list(self.blocks())) if self.n_docs else np.zeros((0, self.dim), np.float32)


def _normalise(v: np.ndarray) -> np.ndarray:
    return (v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def synthetic_dense(n_docs: int, dim: int = 384, *, n_clusters: int | None = None, spread: float = 0.9,
                    n_queries: int = 1000, seed: int = 42, block: int = 50_000) -> VectorCollection:
    """Seeded clustered unit vectors (see the module docstring)."""
    rng = np.random.default_rng([seed, 7])
    if n_clusters is None:  # about 1,000 documents per cluster, at most 1,000 clusters
        n_clusters = min(1000, n_docs // 1000)
    n_clusters = max(1, min(n_clusters, n_docs))
    centres = _normalise(rng.standard_normal((n_clusters, dim)))
    sigma = spread / np.sqrt(dim)

    def blocks() -> Iterator[np.ndarray]:
        for bi, start in enumerate(range(0, n_docs, block)):
            m = min(block, n_docs - start)
            brng = np.random.default_rng([seed, 11, bi])
            c = brng.integers(0, n_clusters, m)
            yield _normalise(centres[c] + sigma * brng.standard_normal((m, dim)).astype(np.float32))

    qrng = np.random.default_rng([seed, 13])
    qc = qrng.integers(0, n_clusters, n_queries)
    queries = _normalise(centres[qc] + sigma * qrng.standard_normal((n_queries, dim)))
    return VectorCollection(f"synthetic-dense-{n_docs}x{dim}", n_docs, dim, blocks, queries)


@dataclass
class SparseCollection:
    """Learned-sparse vectors: ``docs()`` yields ``(term_ids int32, weights float32)`` per document."""

    name: str
    n_docs: int
    vocab: int
    docs: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]
    queries: list[tuple[np.ndarray, np.ndarray]]


def synthetic_sparse(n_docs: int, *, vocab: int = 30522, nnz: int = 120, q_nnz: int = 20,
                     n_queries: int = 1000, seed: int = 42, block: int = 10_000) -> SparseCollection:
    """Seeded SPLADE-like sparse vectors (see the module docstring)."""

    def draw(rng: np.random.Generator, sample, k: int) -> tuple[np.ndarray, np.ndarray]:
        ids = np.unique(sample(int(k * 1.6) + 4))
        rng.shuffle(ids)
        ids = np.sort(ids[:k]).astype(np.int32)
        return ids, rng.lognormal(-0.5, 0.7, len(ids)).astype(np.float32)

    def docs() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for bi, start in enumerate(range(0, n_docs, block)):
            brng = np.random.default_rng([seed, 17, bi])
            sample = _zipf_sampler(vocab, brng)
            for _ in range(min(block, n_docs - start)):
                yield draw(brng, sample, nnz)

    qrng = np.random.default_rng([seed, 19])
    qsample = _zipf_sampler(vocab, qrng)
    queries = []
    for _ in range(n_queries):
        ids, w = draw(qrng, qsample, q_nnz)
        queries.append((ids, w))
    return SparseCollection(f"synthetic-sparse-{n_docs}", n_docs, vocab, docs, queries)


@dataclass
class HybridCollection:
    """Text (BM25), dense vectors and (optionally) sparse vectors for the same documents/queries."""

    text: TextCollection
    dense: VectorCollection
    sparse: SparseCollection | None = None

    @property
    def name(self) -> str:
        return f"synthetic-hybrid-{self.text.n_docs}"


def synthetic_hybrid(n_docs: int, *, n_queries: int = 1000, dim: int = 384, sparse: bool = False,
                     seed: int = 42) -> HybridCollection:
    """Synthetic corpus for every leg at once (100k and 1M are the benchmark sizes)."""
    return HybridCollection(synthetic_bm25(n_docs, n_queries=n_queries, seed=seed),
                            synthetic_dense(n_docs, dim, n_queries=n_queries, seed=seed),
                            synthetic_sparse(n_docs, n_queries=n_queries, seed=seed) if sparse else None)


def synthetic_sparse_topical(n_docs: int, n_queries: int = 1000, *, vocab: int = 30522, seed: int = 0,
                             n_topics: int = 200, topic_terms: int = 1500, topic_share: float = 0.5,
                             doc_draws: float = 136.0, block: int = 100_000):
    """Seeded learned-sparse collection with topical structure (see the module docstring).

    Generated in blocks of ``block`` documents (memory O(block)), each from its own seeded stream,
    so the same arguments always give the same vectors.

    Returns:
        ``(docs, queries)``, each a CSR triple ``(indptr int64 (n+1,), terms uint32 (nnz,) ascending
        per row, weights float32 (nnz,) > 0)``.
    """
    rng = np.random.default_rng([seed, 0])
    perm = rng.permutation(vocab)
    p = (np.arange(vocab) + 200.0) ** -2.0
    p /= p.sum()
    pop = np.empty(vocab)
    pop[perm] = p
    cdf = np.cumsum(pop)
    topics = [np.unique(np.searchsorted(cdf, rng.random(topic_terms * 2) * cdf[-1]))[:topic_terms]
              for _ in range(n_topics)]
    tcdf = [np.cumsum(pop[t]) for t in topics]

    def draw(g, row_topic, counts):
        n = int(counts.sum())
        owner = np.repeat(np.arange(len(counts)), counts)
        terms = np.minimum(np.searchsorted(cdf, g.random(n) * cdf[-1]), vocab - 1).astype(np.int64)
        sel = np.flatnonzero(g.random(n) < topic_share)
        tp = row_topic[owner[sel]]
        order = np.argsort(tp, kind="stable")
        sel, tp = sel[order], tp[order]
        bounds = np.searchsorted(tp, np.arange(n_topics + 1))
        u = g.random(len(sel))
        for t in range(n_topics):
            a, b = bounds[t], bounds[t + 1]
            if b > a:
                c = tcdf[t]
                terms[sel[a:b]] = topics[t][np.minimum(np.searchsorted(c, u[a:b] * c[-1]), len(c) - 1)]
        key = np.sort(owner * vocab + terms)  # np.sort + diff: much faster than np.unique here
        key = key[np.concatenate(([True], key[1:] != key[:-1]))]
        own, term = key // vocab, key % vocab
        indptr = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(np.bincount(own, minlength=len(counts)), out=indptr[1:])
        return indptr, term.astype(np.uint32)

    doc_topic = rng.integers(0, n_topics, n_docs)
    ptrs, terms, weights, base = [np.zeros(1, np.int64)], [], [], 0
    for bi, start in enumerate(range(0, n_docs, block)):
        g = np.random.default_rng([seed, 1, bi])
        m = min(block, n_docs - start)
        ip, t = draw(g, doc_topic[start:start + m], np.maximum(g.poisson(doc_draws, m), 1))
        ptrs.append(ip[1:] + base)
        base += int(ip[-1])
        terms.append(t)
        weights.append(g.lognormal(-0.83, 1.21, len(t)).astype(np.float32))
    d_ptr, d_terms, d_w = np.concatenate(ptrs), np.concatenate(terms), np.concatenate(weights)
    g = np.random.default_rng([seed, 2])
    src = g.integers(0, n_docs, n_queries)
    qb_ptr, qb_terms = draw(g, doc_topic[src], np.maximum(g.poisson(20, n_queries), 1))
    rows = []
    for i, s in enumerate(src):
        own = d_terms[d_ptr[s]:d_ptr[s + 1]]
        pick = g.choice(own, size=min(len(own), 20), replace=False)
        rows.append(np.union1d(pick, qb_terms[qb_ptr[i]:qb_ptr[i + 1]]))
    q_ptr = np.zeros(n_queries + 1, np.int64)
    q_ptr[1:] = np.cumsum([len(r) for r in rows])
    q_terms = np.concatenate(rows).astype(np.uint32)
    q_w = g.lognormal(-0.76, 1.23, len(q_terms)).astype(np.float32)
    return (d_ptr, d_terms, d_w), (q_ptr, q_terms, q_w)
