"""Corpus-wide statistics, combined from per-shard statistics.

Scores must not depend on how documents were split into shards, nor on which shards one process
holds: every leg scores with statistics of the whole corpus. They are sums over shards, so they
are combined once at open (or collected on one machine and handed to the processes that each hold
some shards: the ``dfs_query_then_fetch`` of a distributed search, computed once instead of per
query).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class BM25Stats:
    """BM25 statistics of a set of documents.

    Attributes:
        n_docs: N, the number of documents.
        sum_dl: the sum of their lengths (analysed tokens, title and text).
        df: int64: documents containing each term: of the index's vocabulary from term 0
            (``terms`` None; the corpus-wide statistics always), or of the terms ``terms`` lists.
        terms: None, or uint32 (len(df),) strictly ascending term ids that ``df`` is aligned with
            (a living index's segment, whose postings list only its own terms: O(its terms),
            not O(the vocabulary)).
    """

    n_docs: int
    sum_dl: int
    df: np.ndarray
    terms: np.ndarray | None = None

    @property
    def avgdl(self) -> float:
        """Mean document length (0.0 for an empty corpus)."""
        return self.sum_dl / self.n_docs if self.n_docs else 0.0

    @property
    def span(self) -> int:
        """The vocabulary prefix ``df`` covers: its length, or the last listed term + 1."""
        if self.terms is None:
            return len(self.df)
        return int(self.terms[-1]) + 1 if len(self.terms) else 0

    def add_into(self, df: np.ndarray, sign: int = 1) -> None:
        """``df[t] += sign * self.df`` for each term t this covers (``df``: int64, at least
        :attr:`span` long), in place."""
        if self.terms is None:
            df[:len(self.df)] += sign * self.df
        else:
            df[self.terms] += sign * self.df

    def idf(self) -> np.ndarray:
        """float32 (n_terms,): Lucene's idf = ln(1 + (N − df + 0.5) / (df + 0.5)) (Robertson–Spärck
        Jones with Lucene's +1 inside the log, ``BM25Similarity``), computed in float64.

        Raises:
            ValueError: statistics over listed terms only (combine them first)."""
        if self.terms is not None:
            raise ValueError("idf of statistics over listed terms: combine them over the vocabulary first")
        return np.log1p((self.n_docs - self.df + 0.5) / (self.df + 0.5)).astype(np.float32)

    @classmethod
    def combine(cls, parts: Sequence["BM25Stats"], n_terms: int) -> "BM25Stats":
        """The statistics of the union of disjoint document sets (sums of N, lengths and df),
        over the first ``n_terms`` terms of the vocabulary (at least every part's :attr:`span`)."""
        df = np.zeros(n_terms, dtype=np.int64)
        for p in parts:
            p.add_into(df)
        return cls(sum(p.n_docs for p in parts), sum(p.sum_dl for p in parts), df)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (df, and terms when listed, as lists), e.g. to send to a remote worker."""
        out: dict[str, Any] = {"n_docs": self.n_docs, "sum_dl": self.sum_dl, "df": self.df.tolist()}
        if self.terms is not None:
            out["terms"] = self.terms.tolist()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BM25Stats":
        """Inverse of :meth:`to_dict`."""
        terms = d.get("terms")
        return cls(int(d["n_docs"]), int(d["sum_dl"]), np.asarray(d["df"], dtype=np.int64),
                   None if terms is None else np.asarray(terms, dtype=np.uint32))


@dataclass(frozen=True)
class CorpusStats:
    """Statistics every leg scores with, for the whole index.

    Attributes:
        n_docs: documents in the index.
        bm25: BM25 statistics (``None`` when the index has no BM25 leg).

    The learned-sparse leg's quantisation scale and the dense dimension are build-time constants
    of the index (the manifest's ``stats``), the same for every shard, so they need no combining.
    """

    n_docs: int
    bm25: BM25Stats | None = None

    @classmethod
    def of_legs(cls, n_docs: int, legs: Mapping[str, Any]) -> "CorpusStats":
        """The statistics the opened legs combined from the shards they hold."""
        bm25 = legs.get("bm25")
        return cls(n_docs, None if bm25 is None else bm25.stats)

    @classmethod
    def combine(cls, parts: Sequence["CorpusStats"]) -> "CorpusStats":
        """The statistics of the union of disjoint sets of shards (e.g. what each Ray actor holds):
        N summed, BM25 statistics combined with :meth:`BM25Stats.combine` (``None`` when the
        parts have none)."""
        bm = [p.bm25 for p in parts if p.bm25 is not None]
        n_terms = max((b.span for b in bm), default=0)
        return cls(sum(p.n_docs for p in parts), BM25Stats.combine(bm, n_terms) if bm else None)
