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
        self._token_ids: dict[str, int] = {}
        self.terms: list[str] = []
        self._docs: list[np.ndarray] = []
        self._term_ids: list[np.ndarray] = []
        self._tfs: list[np.ndarray] = []
        self._lens: list[np.ndarray] = []
        self._n = 0
        self.sum_dl = 0

    def add(self, texts: Sequence[str]) -> None:
        """Analyse and add a batch of documents (in shard order)."""
        cache = self._token_ids
        get = cache.get
        flat: list[int | None] = []
        counts = np.empty(len(texts), dtype=np.int64)
        for j, text in enumerate(texts):
            toks = self.analyzer.tokenize(text)
            counts[j] = len(toks)
            ids = list(map(get, toks))
            if None in ids:
                ids = [self._token_id(t) if i is None else i for t, i in zip(toks, ids)]
            flat.extend(ids)
        tok = np.asarray(flat, dtype=np.int64)
        keep = tok >= 0
        doc = np.repeat(np.arange(self._n, self._n + len(texts), dtype=np.int64), counts)[keep]
        tid = tok[keep]
        lens = np.bincount(doc - self._n, minlength=len(texts)).astype(np.int64)
        n_terms = len(self.terms)
        key = doc * max(n_terms, 1) + tid
        uniq, tf = np.unique(key, return_counts=True)
        self._docs.append((uniq // max(n_terms, 1)).astype(np.uint32))
        self._term_ids.append((uniq % max(n_terms, 1)).astype(np.uint32))
        self._tfs.append(tf.astype(np.uint32))
        self._lens.append(lens.astype(np.uint32))
        self._n += len(texts)
        self.sum_dl += int(lens.sum())

    def _token_id(self, token: str) -> int:
        """Term id of a token not seen before (-1 for stop words / over-long tokens); cached."""
        term = self.analyzer.term(token)
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
