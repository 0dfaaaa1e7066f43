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
from .analyzer_kernels import count_terms, csr_by_term


class PostingsBuilder:
    """Accumulates analysed documents of the current shard and emits its CSR postings.

    Args:
        analyzer: the index's analyzer.
    """

    def __init__(self, analyzer: Analyzer) -> None:
        self.analyzer = analyzer
        self.vocab: dict[str, int] = {}
        self._token_ids: dict[str, int] = {}
        self.terms: list[str] = []
        self._docs: list[np.ndarray] = []
        self._term_ids: list[np.ndarray] = []
        self._tfs: list[np.ndarray] = []
        self._lens: list[np.ndarray] = []
        self._n = 0
        self.sum_dl = 0

    def add(self, texts: Sequence[str]) -> None:
        """Analyse and add a batch of documents (in shard order).

        Each distinct token of the batch is looked up once (:meth:`Analyzer.tokenize_batch`);
        tokens never seen before are resolved to terms in first-occurrence order, so term ids
        are those of analysing the documents one by one.
        """
        batch = self.analyzer.tokenize_batch(texts)
        get = self._token_ids.get
        ids = list(map(get, batch.tokens))
        if None in ids:
            new = [t for t, i in zip(batch.tokens, ids) if i is None]
            for tok, term in zip(new, self.analyzer.terms(new)):
                self._assign(tok, term)
            ids = list(map(get, batch.tokens))
        lmap = np.fromiter(ids, dtype=np.int64, count=len(ids))
        doc, tid, tf, lens = count_terms(batch.token_ids, np.diff(batch.offsets), lmap, len(self.terms), self._n)
        self._docs.append(doc)
        self._term_ids.append(tid)
        self._tfs.append(tf)
        self._lens.append(lens)
        self._n += len(texts)
        self.sum_dl += int(lens.sum(dtype=np.int64))

    def _assign(self, token: str, term: str | None) -> int:
        """Record the term id of a new token (-1 for ``term`` None), adding ``term`` to the vocabulary."""
        if term is None:
            i = -1
        else:
            i = self.vocab.get(term)
            if i is None:
                i = len(self.terms)
                self.vocab[term] = i
                self.terms.append(term)
        self._token_ids[token] = i
        return i

    def _token_id(self, token: str) -> int:
        """Term id of a token not seen before (-1 for stop words / over-long tokens); cached."""
        return self._assign(token, self.analyzer.term(token))

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
        offsets, doc_ids, tf_sorted = csr_by_term(doc, tid, tfs, n_terms)
        out = {"offsets": offsets, "doc_ids": doc_ids, "tfs": tf_sorted, "doc_len": lens}
        self._docs, self._term_ids, self._tfs, self._lens = [], [], [], []
        self._n = 0
        return out
