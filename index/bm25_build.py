"""Build-time BM25 structures: analysed batches → (doc, term, tf) triples → per-shard CSR postings.

Postings hold raw term frequencies and document lengths only; idf and length normalisation are
computed from corpus-wide N, df and avgdl when an index is opened, so scores do not depend on how
documents were split into shards. Term ids are global (one vocabulary for the index, append-only);
a shard's ``offsets`` cover the terms known when it was written.
"""

from __future__ import annotations

from itertools import repeat
from typing import Sequence

import numpy as np

from .analyzer import _IDEO, Analyzer
from .analyzer_kernels import TokenTable, count_terms, csr_by_term, scan_tokens


class PostingsBuilder:
    """Accumulates analysed documents of the current shard and emits its CSR postings.

    Args:
        analyzer: the index's analyzer.
    """

    def __init__(self, analyzer: Analyzer) -> None:
        self.analyzer = analyzer
        self.vocab: dict[str, int] = {}
        self.terms: list[str] = []
        self._table = TokenTable()  # token -> term id (-1: not indexed), every token seen so far
        self._docs: list[np.ndarray] = []
        self._term_ids: list[np.ndarray] = []
        self._tfs: list[np.ndarray] = []
        self._lens: list[np.ndarray] = []
        self._n = 0
        self.sum_dl = 0

    def add(self, texts: Sequence[str]) -> None:
        """Analyse and add a batch of documents (in shard order).

        Tokens are scanned and looked up in a token table by :func:`index.analyzer_kernels.scan_tokens`
        (the same token streams as :meth:`Analyzer.tokenize`); tokens never seen before are
        resolved to terms (stop words, length limit, stemming) in first-occurrence order, so term
        ids are those of analysing the documents one by one. A text the scanner does not handle
        (a code point above U+FFFF) is tokenised in Python, in its place in the order.
        """
        import pyarrow as pa

        texts = texts if isinstance(texts, list) else list(texts)
        n = len(texts)
        cfg = self.analyzer.config
        try:
            arr = pa.array(texts, type=pa.large_string())
        except (pa.ArrowException, UnicodeError):  # lone surrogates: whole batch in Python
            arr = None
        vals: list[np.ndarray] = []
        counts = np.zeros(n, dtype=np.int64)
        start = 0
        if arr is not None:
            bufs = arr.buffers()
            offsets = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1)
            data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(1, np.uint8)
        while start < n:
            if arr is not None:
                done, v, cnt, first_new = scan_tokens(data, offsets[start:], self._table, lowercase=cfg.lowercase,
                                                      ideo_class=_IDEO, stop_on_astral=True)
                vals.append(self._resolve(v, first_new))
                counts[start:start + done] = cnt
                start += done
                if start == n:
                    break
            # text `start` in Python, its tokens looked up as whole tokens
            toks = self.analyzer.tokenize(texts[start])
            if toks:
                tarr = pa.array(toks, type=pa.large_string())
                tb = tarr.buffers()
                _, v, _, first_new = scan_tokens(np.frombuffer(tb[2], dtype=np.uint8),
                                                 np.frombuffer(tb[1], dtype=np.int64, count=len(toks) + 1),
                                                 self._table, lowercase=False, ideo_class=_IDEO, verbatim=True)
                vals.append(self._resolve(v, first_new))
            counts[start] = len(toks)
            start += 1
        tids = np.concatenate(vals) if vals else np.zeros(0, dtype=np.int64)
        doc, tid, tf, lens = count_terms(tids, counts, None, len(self.terms), self._n)
        self._docs.append(doc)
        self._term_ids.append(tid)
        self._tfs.append(tf)
        self._lens.append(lens)
        self._n += n
        self.sum_dl += int(lens.sum(dtype=np.int64))

    def _resolve(self, values: np.ndarray, first_new: int) -> np.ndarray:
        """Give the table entries added since ``first_new`` their term ids (in order) and replace
        their placeholders in ``values``."""
        table = self._table
        if table.n > first_new:
            new_tokens = table.tokens(first_new, table.n)
            vocab = self.vocab
            new_terms = self.analyzer.terms(new_tokens)  # None: not indexed
            fresh = [t for t in dict.fromkeys(new_terms) if t is not None and t not in vocab]
            vocab.update(zip(fresh, range(len(self.terms), len(self.terms) + len(fresh))))
            self.terms.extend(fresh)
            ids = list(map(vocab.get, new_terms, repeat(-1, len(new_terms))))
            new_ids = np.asarray(ids, dtype=np.int64)
            table.set_values(first_new, new_ids)
            pending = values < -1
            values[pending] = new_ids[-2 - values[pending]]
        return values

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
