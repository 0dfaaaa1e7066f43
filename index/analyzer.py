"""English analyzer for BM25: tokenise, possessive strip, case fold, stop words, Porter stemming.

Mirrors Lucene's ``EnglishAnalyzer`` (StandardTokenizer → EnglishPossessiveFilter →
LowerCaseFilter → StopFilter → PorterStemFilter), which is what Pyserini's BM25-flat uses:

- Tokens follow the word rules of Unicode UAX #29 closely enough for English text: runs of word
  characters, joined across ``.`` / apostrophes between word characters (``u.s.a``, ``don't``,
  ``3.5``) and across ``,`` between digits (``1,000``); each Han ideograph or Hiragana character is
  its own token, as in StandardTokenizer. Tokens longer than ``max_token_length`` are dropped.
- Case folding is Unicode ``str.casefold``; stop words are Lucene's 33-word English set;
  stemming is the original Porter (1980) algorithm as implemented by Snowball/PyStemmer.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, NamedTuple, Sequence

import numpy as np
import Stemmer

from .config import AnalyzerConfig

#: Lucene's ``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`` (33 words).
LUCENE_ENGLISH_STOP_WORDS: frozenset[str] = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)

_IDEO = "\u3040-\u309f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"
_TOKEN_RE = re.compile(
    rf"[{_IDEO}]"
    rf"|(?:[^\W{_IDEO}]+(?:(?:[.'\u2019]|(?<=\d),(?=\d))[^\W{_IDEO}]+)*)"
)
_POSSESSIVE_RE = re.compile(r"(?<=\w)['\u2019][sS]\b")


#: Batches with fewer characters than this are tokenised in Python (the compiled scanner's fixed
#: cost, Arrow conversion and the dispatch, exceeds the regex's below about this size).
BATCH_MIN_CHARS = 2000


class TokenBatch(NamedTuple):
    """Tokens of a batch of texts, each distinct token once.

    Attributes:
        tokens: the batch's distinct tokens (as :meth:`Analyzer.tokenize` returns them), in
            first-occurrence order.
        token_ids: int32[m]: every token occurrence as an index into ``tokens``, texts in order.
        offsets: int64[n+1]: text i's occurrences are ``token_ids[offsets[i]:offsets[i+1]]``.
    """

    tokens: list[str]
    token_ids: np.ndarray
    offsets: np.ndarray


class Analyzer:
    """Turns text into BM25 terms.

    Args:
        config: analyzer settings (stored in the manifest so queries are analysed like documents).

    Example:
        >>> Analyzer().analyze("The cat's running quickly.")
        ['cat', 'run', 'quickli']
    """

    def __init__(self, config: AnalyzerConfig | None = None) -> None:
        self.config = config or AnalyzerConfig()
        self._stop = LUCENE_ENGLISH_STOP_WORDS if self.config.stopwords == "lucene" else frozenset()
        self._stemmer = Stemmer.Stemmer("porter") if self.config.stemmer == "porter" else None
        if self._stemmer is not None:
            self._stemmer.maxCacheSize = 1_000_000
        self._stem_one = lru_cache(maxsize=1_000_000)(self._stem_uncached)
        # for batches of distinct tokens PyStemmer's own cache only costs (measured 7x slower)
        self._batch_stemmer = Stemmer.Stemmer("porter") if self.config.stemmer == "porter" else None
        if self._batch_stemmer is not None:
            self._batch_stemmer.maxCacheSize = 0

    def _stem_uncached(self, token: str) -> str:
        return self._stemmer.stemWord(token) if self._stemmer is not None else token

    def tokenize(self, text: str) -> list[str]:
        """Split ``text`` into tokens (before stop words and stemming), case-folded and with
        possessive ``'s`` removed. Over-long tokens are kept here and dropped by :meth:`term`."""
        if self.config.lowercase:
            text = text.casefold()
        if "'" in text or "\u2019" in text:
            text = _POSSESSIVE_RE.sub("", text)
        return _TOKEN_RE.findall(text)

    def term(self, token: str) -> str | None:
        """The index term of one token, or ``None`` for a stop word or an over-long token."""
        if token in self._stop or len(token) > self.config.max_token_length:
            return None
        return self._stem_one(token)

    @property
    def stop_words(self) -> frozenset[str]:
        """The stop words in force (empty when ``config.stopwords`` is ``"none"``)."""
        return self._stop

    def stem_many(self, tokens: Sequence[str]) -> list[str]:
        """Stems of ``tokens`` (all of them: no stop word or length filter), in one PyStemmer call
        without caching; the tokens themselves when the analyzer has no stemmer.

        Args:
            tokens: m tokens as :meth:`tokenize` returns them.

        Returns:
            m stems, in order (Porter 1980 as implemented by Snowball / PyStemmer).
        """
        if self._batch_stemmer is None:
            return list(tokens)
        return self._batch_stemmer.stemWords(tokens)

    def terms(self, tokens: Sequence[str]) -> list[str | None]:
        """:meth:`term` of many tokens (stemmed in one PyStemmer call, without caching).

        Returns:
            one entry per token, in order: the index term, or ``None`` for a stop word or an
            over-long token.
        """
        stop, longest = self._stop, self.config.max_token_length
        keep = [t for t in tokens if t not in stop and len(t) <= longest]
        stems = self._batch_stemmer.stemWords(keep) if self._batch_stemmer is not None else keep
        if len(keep) == len(tokens):
            return stems
        it = iter(stems)
        return [None if t in stop or len(t) > longest else next(it) for t in tokens]

    def tokenize_batch(self, texts: Sequence[str]) -> TokenBatch:
        """:meth:`tokenize` of a batch of texts, each distinct token returned once.

        ``[batch.tokens[i] for i in batch.token_ids[batch.offsets[j]:batch.offsets[j + 1]]]``
        equals ``self.tokenize(texts[j])`` exactly. Large batches go through the compiled scanner of
        :mod:`retriever.index.analyzer_kernels` (same definition, tables built from Python's ``re`` and
        ``str.casefold``); texts it does not handle (code points above U+FFFF, lone surrogates) and
        small batches are tokenised here in Python.

        Args:
            texts: n strings.

        Returns:
            a :class:`TokenBatch`.
        """
        texts = texts if isinstance(texts, list) else list(texts)
        n = len(texts)
        if sum(map(len, texts)) < BATCH_MIN_CHARS:
            return self._tokenize_batch_py(texts)
        from .analyzer_kernels import tokenize_utf8, utf8_arrays

        try:
            data, offsets = utf8_arrays(texts)
        except UnicodeError:  # lone surrogates
            return self._tokenize_batch_py(texts)
        local, counts, tokens = tokenize_utf8(data, offsets, lowercase=self.config.lowercase, ideo_class=_IDEO)
        todo = np.flatnonzero(counts < 0)
        if len(todo) == 0:
            off = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(counts, out=off[1:])
            return TokenBatch(tokens, local, off)
        # texts the scanner left to Python: merge their tokens in, keeping first-occurrence order
        pos = {t: i for i, t in enumerate(tokens)}
        extra = {j: np.fromiter((pos.setdefault(t, len(pos)) for t in self.tokenize(texts[j])), dtype=np.int64)
                 for j in todo.tolist()}
        for j, ids in extra.items():
            counts[j] = len(ids)
        bounds = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=bounds[1:])
        stream = np.empty(int(bounds[-1]), dtype=np.int64)
        handled = np.ones(int(bounds[-1]), dtype=bool)
        for j, ids in extra.items():
            stream[bounds[j]:bounds[j + 1]] = ids
            handled[bounds[j]:bounds[j + 1]] = False
        stream[handled] = local
        all_tokens = list(pos)
        uniq, first = np.unique(stream, return_index=True)
        order = uniq[np.argsort(first, kind="stable")]
        rank = np.empty(len(all_tokens), dtype=np.int32)
        rank[order] = np.arange(len(order), dtype=np.int32)
        return TokenBatch([all_tokens[i] for i in order.tolist()], rank[stream], bounds)

    def _tokenize_batch_py(self, texts: Sequence[str]) -> TokenBatch:
        """Python :meth:`tokenize_batch` (the reference)."""
        pos: dict[str, int] = {}
        ids: list[int] = []
        offsets = [0]
        for text in texts:
            ids.extend(pos.setdefault(t, len(pos)) for t in self.tokenize(text))
            offsets.append(len(ids))
        return TokenBatch(list(pos), np.asarray(ids, dtype=np.int32), np.asarray(offsets, dtype=np.int64))

    def analyze(self, text: str) -> list[str]:
        """Terms of ``text`` in order, repeats kept (a term occurring n times counts n times)."""
        out = []
        for tok in self.tokenize(text):
            t = self.term(tok)
            if t is not None:
                out.append(t)
        return out

    def analyze_batch(self, texts: Sequence[str] | Iterable[str]) -> list[list[str]]:
        """:meth:`analyze` over many texts."""
        return [self.analyze(t) for t in texts]
