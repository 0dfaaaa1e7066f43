"""BM25 per-segment state carried from one index generation to the next.

A living index (:class:`retriever.index.updates.IndexUpdater`) changes N, df and avgdl with every
commit, and BM25's per-posting tf part ``tf / (tf + k1·(1 − b + b·dl/avgdl))`` changes with
avgdl. Recomputing every segment's impacts and MaxScore / block-max bounds at each
:meth:`retriever.Retriever.refresh` costs a pass over every posting of the index. This module
keeps, per segment, what does not depend on the statistics (:class:`SegmentState`: checked
postings, membership bitmaps, scored lengths, the segment's own statistics) and derives what
does from the previous generation's values with two bounds, both from the monotonicity of the
tf part in the length norm n = k1·(1 − b + b·dl/avgdl):

- n_now / n_then <= max(1, avgdl_then / avgdl_now) and >= min(1, ...) for every document, so a
  tf part changes by at most the factor avgdl_now / avgdl_then (up when avgdl grows, down when
  it shrinks): ``tf/(tf + n_now) <= max(1, avgdl_now / avgdl_then) · tf/(tf + n_then)`` and
  ``>= min(1, avgdl_now / avgdl_then) · tf/(tf + n_then)``.
- Upper bounds (term and block maxima of the tf part) computed exactly at avgdl_0 stay upper
  bounds at avgdl when multiplied by :func:`ub_factor` (avgdl_0, avgdl); a k-th largest tf part of
  an unchanged list computed at avgdl_then stays a safe initial threshold multiplied by
  :func:`kth_factor`. Both include :data:`SLACK` for the float32 rounding of the tf parts.

Scores are never derived: a carried segment is scored from its term frequencies and the new
length norms (the kernels' on-the-fly path, the same float32 arithmetic as precomputed impacts),
so every result is bit-identical to a fresh open's; only the pruning bounds are looser, by the
avgdl drift since the exact ones, which is why exact bounds are recomputed once that drift
passes :data:`MAX_DRIFT`.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Hashable

import numpy as np

from ..stats import BM25Stats

#: relative slack for the float32 rounding of the tf parts (each is within 2^-23 of the exact
#: value, two roundings) applied to carried bounds (up) and thresholds (down); negligible for
#: pruning
SLACK = 2.0 ** -20

#: carried upper bounds are used while avgdl stays within this factor of the avgdl they were
#: computed at; past it a segment's exact bounds are recomputed (one pass over its postings)
MAX_DRIFT = 1.05

#: carried upper-bound factors are rounded up onto the geometric grid (1 + UB_GRID)^j, so
#: generations whose avgdl moved by less than a step share one scaled copy of a segment's bounds
#: (a refresh then does not rescale them: O(blocks) per segment otherwise); looser by < 0.1 %
UB_GRID = 2.0 ** -10


def ub_factor(avgdl_then: float, avgdl_now: float) -> float:
    """g >= 1 with ``tf part at avgdl_now <= g · tf part at avgdl_then`` for every posting,
    float32 rounding included (see the module docstring), rounded up onto the grid
    (1 + :data:`UB_GRID`)^j (j >= 1) so that nearby avgdl values give the same factor."""
    g = max(1.0, avgdl_now / avgdl_then) * (1.0 + 4 * SLACK)
    j = max(1, math.ceil(math.log(g) / math.log1p(UB_GRID)))
    q = (1.0 + UB_GRID) ** j
    while q < g:  # float rounding of log / pow
        j += 1
        q = (1.0 + UB_GRID) ** j
    return q


def kth_factor(avgdl_then: float, avgdl_now: float) -> float:
    """f <= 1 with ``tf part at avgdl_now >= f · tf part at avgdl_then`` for every posting,
    float32 rounding included (see the module docstring)."""
    return min(1.0, avgdl_now / avgdl_then) * (1.0 - 4 * SLACK)


def drift(avgdl_then: float, avgdl_now: float) -> float:
    """How far apart two avgdl values are, as a factor >= 1."""
    return max(avgdl_now / avgdl_then, avgdl_then / avgdl_now)


#: relative margin of the float32 factor in :func:`scaled_up` / :func:`scaled_down`: larger than
#: the float32 product's rounding (2^-24) and the factor's own (2^-24)
_MUL_MARGIN = 2.0 ** -21


def scaled_up(a: np.ndarray, g: float) -> np.ndarray:
    """float32 ``a · g'`` with g' >= g, never below the exact product ``a · g`` for ``a >= 0``
    (0, +-inf and NaN stay): one float32 multiply by ``g · (1 + 2^-21)`` rounded up to float32
    (the product's rounding, at most 2^-24 relative, stays within that margin)."""
    m = g * (1.0 + _MUL_MARGIN)
    g32 = np.float32(m)
    if float(g32) < m:
        g32 = np.nextafter(g32, np.float32(np.inf))
    return np.asarray(a, dtype=np.float32) * g32


def scaled_down(a: np.ndarray, f: float) -> np.ndarray:
    """float32 ``a · f'`` with f' <= f, never above the exact product ``a · f`` for ``a >= 0``
    (0, -inf and NaN stay; ``f > 0``): one float32 multiply by ``f · (1 − 2^-21)`` rounded down."""
    m = f * (1.0 - _MUL_MARGIN)
    f32 = np.float32(m)
    if float(f32) > m:
        f32 = np.nextafter(f32, np.float32(-np.inf))
    return np.asarray(a, dtype=np.float32) * f32


class SegmentState:
    """One segment's BM25 state that does not depend on corpus statistics (kept in a
    :class:`retriever.segcache.SegmentCache`, so every generation that lists the segment shares
    it), plus the scoring state of the newest generation that scored it (:meth:`latest`), from
    which the next generation carries bounds and thresholds.

    Attributes:
        arrays: the checked ``bm25.arrow`` arrays (``offsets``, ``doc_ids``, ``tfs``, ``doc_len``;
            ``terms``, the term map, for a segment that lists only its own terms).
        dense: membership bitmaps of the long lists (``dense_slot``, ``dense_bits``, ``dense_rank``).
        dl: int64 (rows,) lengths as scored (Lucene's decoded norms or the exact lengths).
        stats: the segment's own statistics (every row; df over its own terms only: the
            vocabulary prefix it spans, or the terms of its map).
    """

    def __init__(self, arrays: dict[str, np.ndarray], dense: dict[str, np.ndarray], dl: np.ndarray) -> None:
        self.arrays = arrays
        self.dense = dense
        self.dl = dl
        offsets = arrays["offsets"]
        self.stats = BM25Stats(int(len(dl)), int(arrays["doc_len"].sum(dtype=np.int64)),
                               np.diff(offsets).astype(np.int64), arrays.get("terms"))
        self._lock = threading.Lock()
        self._tf_min: int | None = None
        self._latest: dict[Hashable, dict[str, Any]] = {}

    @property
    def tf_min(self) -> int:
        """The smallest term frequency of any posting (1 when there are none); computed once."""
        if self._tf_min is None:
            tfs = self.arrays["tfs"]
            self._tf_min = int(tfs.min()) if len(tfs) else 1
        return self._tf_min

    def latest(self, key: Hashable) -> dict[str, Any] | None:
        """The scoring state last recorded for ``key`` (``(k1, b)``), or None."""
        with self._lock:
            return self._latest.get(key)

    def record(self, key: Hashable, ks: dict[str, Any]) -> None:
        """Record ``ks`` as the newest scoring state for ``key``."""
        with self._lock:
            self._latest[key] = ks
