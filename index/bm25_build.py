"""Build-time BM25 structures: analysed batches → (doc, term, tf) triples → per-shard CSR postings.

Postings hold raw term frequencies and document lengths only; idf and length normalisation are
computed from corpus-wide N, df and avgdl when an index is opened, so scores do not depend on how
documents were split into shards. Term ids are global (one vocabulary for the index, append-only);
a shard's ``offsets`` cover the terms known when it was written.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .analyzer import Analyzer


class PostingsBuilder:
    """Accumulates analysed documents of the current shard and emits its CSR postings.

    Args:
        analyzer: the index's analyzer.
    """

    def __init__(self, analyzer: Analyzer) -> None:
        self.analyzer = analyzer
        self.vocab: dict[str, int] = {}
        self.terms: list[str] = []
        self._docs: list[np.ndarray] = []
        self._term_ids: list[np.ndarray] = []
        self._tfs: list[np.ndarray] = []
        self._lens: list[np.ndarray] = []
        self._n = 0
        self.sum_dl = 0

    def add(self, texts: Sequence[str]) -> None:
        """Analyse and add a batch of documents (in shard order)."""
        vocab, terms = self.vocab, self.terms
        flat: list[int] = []
        lens = np.empty(len(texts), dtype=np.int64)
        for j, toks in enumerate(self.analyzer.analyze_batch(texts)):
            lens[j] = len(toks)
            for t in toks:
                i = vocab.get(t)
                if i is None:
                    i = len(terms)
                    vocab[t] = i
                    terms.append(t)
                flat.append(i)
        tid = np.asarray(flat, dtype=np.int64)
        doc = np.repeat(np.arange(self._n, self._n + len(texts), dtype=np.int64), lens)
        key = doc * len(terms) + tid if len(terms) else doc
        uniq, counts = np.unique(key, return_counts=True)
        if len(terms):
            self._docs.append((uniq // len(terms)).astype(np.uint32))
            self._term_ids.append((uniq % len(terms)).astype(np.uint32))
        self._tfs.append(counts.astype(np.uint32))
        self._lens.append(lens.astype(np.uint32))
        self._n += len(texts)
        self.sum_dl += int(lens.sum())

    def flush(self) -> dict[str, np.ndarray]:
        """Return the current shard's arrays and reset for the next shard.

        Returns:
            ``offsets`` u64[T+1] (T = vocabulary size now), ``doc_ids`` u32[nnz] (ascending per
            term), ``tfs`` u32[nnz], ``doc_len`` u32[n_docs] (terms after analysis).
        """
        n_terms = len(self.terms)
        doc = np.concatenate(self._docs) if self._docs else np.zeros(0, np.uint32)
        tid = np.concatenate(self._term_ids) if self._term_ids else np.zeros(0, np.uint32)
        tfs = np.concatenate(self._tfs) if self._tfs else np.zeros(0, np.uint32)
        lens = np.concatenate(self._lens) if self._lens else np.zeros(0, np.uint32)
        order = np.lexsort((doc, tid))
        offsets = np.zeros(n_terms + 1, dtype=np.uint64)
        np.cumsum(np.bincount(tid, minlength=n_terms), out=offsets[1:])
        out = {"offsets": offsets, "doc_ids": doc[order], "tfs": tfs[order], "doc_len": lens}
        self._docs, self._term_ids, self._tfs, self._lens = [], [], [], []
        self._n = 0
        return out
