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
from typing import Iterable, Sequence

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
