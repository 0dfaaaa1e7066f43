"""Rank fusion over per-leg candidate lists (numpy, and a numba kernel for RRF; no I/O).

- RRF (Cormack, Clarke & Büttcher, SIGIR 2009): score(d) = Σ_legs w_leg / (k + rank_leg(d)),
  ranks start at 1; documents with exactly equal scores in a leg share that leg's rank (the best
  of their positions); a document absent from a leg adds nothing for that leg.
- Linear: score(d) = Σ_legs w_leg · norm(score_leg(d)) with ``minmax``, ``zscore`` or ``none``
  normalisation computed over the leg's candidate list; a degenerate list (max == min, or zero
  standard deviation) normalises to 1.0, never NaN; absent legs contribute nothing.

Ties in the fused score go to the smaller global document ordinal (corpus order).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from retriever.index.errors import QueryError

from . import _kernels
from .results import LegArrays


@dataclass(frozen=True)
class RRF:
    """Reciprocal rank fusion parameters (``k`` = 60 as in the paper)."""

    k: float = 60.0
    weights: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.k, (int, float)) and self.k >= 0 and np.isfinite(self.k)):
            raise QueryError(f"RRF k must be a finite number >= 0, got {self.k!r}")
        _check_weights(self.weights)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (``{"method": "rrf", "k", "weights"}``), as stored in results and benchmarks."""
        return {"method": "rrf", "k": self.k, "weights": dict(self.weights)}


@dataclass(frozen=True)
class Linear:
    """Linear (convex) combination of normalised leg scores."""

    norm: str = "minmax"
    weights: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.norm not in NORMALISERS:
            raise QueryError(f"unknown normalisation {self.norm!r}; expected one of {', '.join(NORMALISERS)}")
        _check_weights(self.weights)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (``{"method": "linear", "norm", "weights"}``), as stored in results and benchmarks."""
        return {"method": "linear", "norm": self.norm, "weights": dict(self.weights)}


#: largest accepted |fusion weight|: leg scores times weights must stay finite in float64 sums
MAX_FUSION_WEIGHT = 1e30


def _check_weights(w: Mapping[str, float]) -> None:
    """Raises QueryError unless ``w`` maps leg names to finite numbers with |weight| <= 1e30."""
    if not isinstance(w, Mapping):
        raise QueryError(f"fusion weights must be a mapping of leg name to weight, got {type(w).__name__}")
    for leg, v in w.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v):
            raise QueryError(f"fusion weight for leg {leg!r} must be a finite number, got {v!r}")
        if abs(float(v)) > MAX_FUSION_WEIGHT:
            raise QueryError(f"fusion weight for leg {leg!r} is {v!r}; |weight| must be <= {MAX_FUSION_WEIGHT:g}")


#: the fusion names :func:`parse_fusion` accepts (``linear`` optionally ``linear:<norm>``)
FUSION_NAMES = ("rrf", "linear")


def parse_weights(text: str) -> dict[str, float]:
    """``"bm25=1,dense=1.5"`` → ``{"bm25": 1.0, "dense": 1.5}`` (the CLI's ``--weights``).

    Raises:
        QueryError: a part that is not ``leg=number`` (names the part), or a leg given twice.
        Weight values are checked by :class:`RRF` / :class:`Linear`.
    """
    weights: dict[str, float] = {}
    for part in text.split(","):
        leg, sep, val = part.partition("=")
        leg = leg.strip()
        try:
            w = float(val)
        except ValueError:
            w = None
        if not sep or not leg or w is None:
            raise QueryError(f"fusion weights: expected leg=number, got {part!r} in {text!r}")
        if leg in weights:
            raise QueryError(f"fusion weights: leg {leg!r} given twice in {text!r}")
        weights[leg] = w
    return weights


def parse_fusion(spec: "str | RRF | Linear | None", *, weights: "Mapping[str, float] | str | None" = None,
                 rrf_k: float | None = None) -> "RRF | Linear":
    """The one fusion parser (library calls and the CLI's ``--fusion`` / ``--weights`` / ``--rrf-k``).

    Args:
        spec: ``None`` or ``"rrf"`` (RRF, k = 60), ``"linear"`` (min-max), ``"linear:minmax"``,
            ``"linear:zscore"``, ``"linear:none"``, or an :class:`RRF` / :class:`Linear` object
            (returned as it is).
        weights: per-leg weights for a named fusion: a mapping or ``"leg=number,..."``
            (:func:`parse_weights`); default 1.0 per leg.
        rrf_k: the RRF constant for ``"rrf"`` (default 60).

    Returns:
        an :class:`RRF` or :class:`Linear`.

    Raises:
        QueryError: an unknown name or normalisation (names it and the valid ones), bad weights,
            ``rrf_k`` with a linear fusion, or ``weights`` / ``rrf_k`` next to a fusion object
            (set them on the object instead).
    """
    if isinstance(spec, (RRF, Linear)):
        if weights is not None or rrf_k is not None:
            raise QueryError(f"fusion {spec!r} is an object: set its weights and k on it, not as separate arguments")
        return spec
    if spec is None:
        spec = "rrf"
    if not isinstance(spec, str):
        raise QueryError(f"fusion must be a name or an RRF / Linear object, got {type(spec).__name__}")
    w = parse_weights(weights) if isinstance(weights, str) else dict(weights or {})
    name, sep, norm = spec.partition(":")
    if name == "rrf" and not sep:
        return RRF(weights=w) if rrf_k is None else RRF(k=rrf_k, weights=w)
    if name == "linear":
        if rrf_k is not None:
            raise QueryError(f"rrf_k={rrf_k!r} given with fusion {spec!r}; the RRF constant applies to 'rrf' only")
        if sep and norm not in NORMALISERS:
            raise QueryError(f"unknown normalisation {norm!r} in fusion {spec!r}; expected one of {', '.join(NORMALISERS)}")
        return Linear(norm=norm or "minmax", weights=w)
    raise QueryError(f"unknown fusion {spec!r}; expected 'rrf' or 'linear[:{'|'.join(NORMALISERS)}]'")


def tie_ranks_rows(scores: np.ndarray, n_found: np.ndarray) -> np.ndarray:
    """The one tie-rank rule (fusion, hits' per-leg ranks): 1-based competition ranks of sorted rows.

    Args:
        scores: float32 (nq, k), each row sorted descending (converted to C-contiguous float32
            if needed; padding after ``n_found`` is ignored).
        n_found: int (nq,) valid entries per row (clipped to [0, k]).

    Returns:
        int32 (nq, k): ``ranks[q, j]`` = 1 + the first position of row ``q`` holding
        ``scores[q, j]``, so exactly equal scores share the best of their positions (an arbitrary
        tie order never adds signal); 0 at and after ``n_found[q]``. Computed by the compiled
        kernel ``retriever._kernels.tie_ranks`` (one pass per row).

    Raises:
        ValueError: ``scores`` not 2-D or ``len(n_found) != scores.shape[0]``.
    """
    return _kernels.tie_ranks(np.ascontiguousarray(scores, dtype=np.float32),
                              np.ascontiguousarray(n_found, dtype=np.int32))


def tie_ranks(scores: np.ndarray, n: int) -> np.ndarray:
    """:func:`tie_ranks_rows` of one descending score list: int32 (n,) ranks of ``scores[:n]``."""
    s = np.asarray(scores, dtype=np.float32)[:n]
    return tie_ranks_rows(s[None, :], np.array([len(s)], np.int32))[0]


def _minmax(s: np.ndarray) -> np.ndarray:
    lo, hi = s.min(), s.max()
    if hi == lo:
        return np.ones_like(s)
    return (s - lo) / (hi - lo)


def _zscore(s: np.ndarray) -> np.ndarray:
    sd = s.std()
    if sd == 0 or not np.isfinite(sd):
        return np.ones_like(s)
    return (s - s.mean()) / sd


NORMALISERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "minmax": _minmax,
    "zscore": _zscore,
    "none": lambda s: s,
}


def fuse(legs: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], k: int,
         fusion: "RRF | Linear") -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, LegArrays]]:
    """Fuse per-leg candidate lists into one top-k list per query.

    Args:
        legs: ``{leg: (ids int64 (nq, depth), scores float32 (nq, depth), n_found int32 (nq,))}``;
            each row sorted by score descending (ties by smaller id), padded with -1 / -inf.
        k: fused list length (>= 1).
        fusion: :class:`RRF` or :class:`Linear`.

    Returns:
        ``(ids int64 (nq, k), scores float32 (nq, k), n_found int32 (nq,), {leg: LegArrays})``.

    RRF runs as one compiled call over the batch (:mod:`retriever.fusion_kernels`), linear fusion
    as a numpy loop over queries (:func:`fuse_loop`); both give the results described above.
    """
    if isinstance(fusion, RRF) and legs:
        return _fuse_rrf_compiled(legs, k, fusion)
    return fuse_loop(legs, k, fusion)


def _fuse_rrf_compiled(legs: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], k: int,
                       fusion: RRF) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, LegArrays]]:
    """:func:`fuse` for RRF by :func:`retriever.fusion_kernels.rrf_fuse_rows` (one compiled call
    for the whole batch, GIL released; bit-identical to :func:`fuse_loop`)."""
    from .fusion_kernels import rrf_fuse_rows

    names = list(legs)
    parts = [legs[n] for n in names]
    nq = parts[0][0].shape[0]
    n_legs = len(names)
    leg_start = np.zeros(n_legs + 1, np.int64)
    for i, p in enumerate(parts):
        leg_start[i + 1] = leg_start[i] + p[0].shape[1]
    ids = np.concatenate([p[0] for p in parts], axis=1, dtype=np.int64, casting="unsafe")
    scores = np.concatenate([p[1] for p in parts], axis=1, dtype=np.float32, casting="unsafe")
    # each leg's count, clipped to the leg's width in the kernel as the loop's slices are
    n_found = np.array([p[2] for p in parts], np.int64).reshape(n_legs, nq)
    ranks = np.concatenate([tie_ranks_rows(p[1], p[2]) for p in parts], axis=1)
    weights = np.array([float(fusion.weights.get(n, 1.0)) for n in names], np.float64)
    out_ids = np.empty((nq, k), dtype=np.int64)  # the kernel writes every element
    out_scores = np.empty((nq, k), dtype=np.float32)
    out_n = np.empty(nq, dtype=np.int32)
    leg_scores = np.empty((n_legs, nq, k), dtype=np.float32)
    leg_ranks = np.empty((n_legs, nq, k), dtype=np.int32)
    rrf_fuse_rows(ids, scores, ranks, n_found, leg_start, weights, float(fusion.k), int(k), out_ids, out_scores,
                  out_n, leg_scores, leg_ranks)
    return out_ids, out_scores, out_n, {n: LegArrays(leg_scores[i], leg_ranks[i]) for i, n in enumerate(names)}


def fuse_loop(legs: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], k: int,
              fusion: "RRF | Linear") -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, LegArrays]]:
    """:func:`fuse` as a numpy loop over queries: the path for :class:`Linear`, and the reference
    that the compiled RRF path is tested against (same arguments and returns as :func:`fuse`)."""
    names = list(legs)
    nq = next(iter(legs.values()))[0].shape[0]
    out_ids = np.full((nq, k), -1, dtype=np.int64)
    out_scores = np.full((nq, k), -np.inf, dtype=np.float32)
    n_found = np.zeros(nq, dtype=np.int32)
    leg_scores = {n: np.full((nq, k), np.nan, dtype=np.float32) for n in names}
    leg_ranks = {n: np.zeros((nq, k), dtype=np.int32) for n in names}
    weights = {n: float(fusion.weights.get(n, 1.0)) for n in names}
    rrf = isinstance(fusion, RRF)
    norm = None if rrf else NORMALISERS[fusion.norm]
    rank_rows = {n: tie_ranks_rows(legs[n][1], legs[n][2]) for n in names}
    for q in range(nq):
        seg_ids, seg_contrib, seg_scores, seg_ranks = [], [], [], []
        for n in names:
            ids, scores, nf = legs[n]
            m = int(nf[q])
            srow = scores[q, :m]
            ranks = rank_rows[n][q, :len(srow)]
            if rrf:
                c = weights[n] / (fusion.k + ranks)
            else:
                ls = srow.astype(np.float64)
                c = weights[n] * norm(ls) if m else ls
            seg_ids.append(ids[q, :m])
            seg_contrib.append(c)
            seg_scores.append(srow)
            seg_ranks.append(ranks)
        cat_ids = np.concatenate(seg_ids)
        if cat_ids.size == 0:
            continue
        uniq, inv = np.unique(cat_ids, return_inverse=True)
        # np.bincount adds the weights in input order (legs in a fixed order), one float64 sum per
        # document: identical across runs and to a sequential loop over the legs.
        total = np.bincount(inv, weights=np.concatenate(seg_contrib), minlength=len(uniq))
        order = np.lexsort((uniq, -total))[:k]
        m = len(order)
        out_ids[q, :m] = uniq[order]
        out_scores[q, :m] = total[order]
        n_found[q] = m
        # position in the fused list of every candidate (-1: not in the top-k)
        slot = np.full(len(uniq), -1, dtype=np.int64)
        slot[order] = np.arange(m)
        pos = slot[inv]
        start = 0
        for n, ls, lr in zip(names, seg_scores, seg_ranks):
            j = pos[start:start + len(ls)]
            start += len(ls)
            hit = j >= 0
            leg_scores[n][q, j[hit]] = ls[hit]
            leg_ranks[n][q, j[hit]] = lr[hit]
    return out_ids, out_scores, n_found, {n: LegArrays(leg_scores[n], leg_ranks[n]) for n in names}
