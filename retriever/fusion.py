"""Rank fusion over per-leg candidate lists (numpy, and a numba kernel for RRF; no I/O).

- RRF (Cormack, Clarke & Büttcher, SIGIR 2009): score(d) = Σ_legs w_leg / (k + rank_leg(d)),
  ranks start at 1; documents with exactly equal scores in a leg share that leg's rank (the best
  of their positions); a document absent from a leg adds nothing for that leg.
  Each leg may have its own k (``RRF.leg_k``).
- Linear: score(d) = Σ_legs w_leg · norm(score_leg(d)), the normalisation computed over the leg's
  candidate list: ``minmax`` ((s − min) / (max − min)), ``zscore`` ((s − mean) / σ, population σ),
  ``dbsf`` (Qdrant's distribution-based score fusion: (s − (μ − 3σ)) / 6σ, sample σ), ``tmm``
  (theoretical min-max of Bruch, Gai & Ingber, "An Analysis of Fusion Functions for Hybrid
  Retrieval", ACM TOIS 2023: (s − inf_leg) / (max − inf_leg), the leg's theoretical minimum for
  the query and the list's maximum), ``theoretical`` ((s − inf_leg) / (sup_leg − inf_leg), both
  ends the leg's theoretical range for the query; :mod:`retriever.fusion_bounds` derives them) or
  ``none``. A degenerate list (max == min, zero σ, fewer than two scores for ``dbsf``, an empty
  range) normalises to 1.0, never NaN; absent legs contribute nothing.
  Per-query adaptive weights (``Linear.gap_power`` = γ > 0): each leg's weight is multiplied, per
  query, by g^γ, g = (max − mean) / σ of the leg's list (how far its top score stands above the
  rest, in the list's population σ; 1.0 for fewer than two scores or σ = 0): a leg whose top
  result stands out counts more for that query (a score-distribution confidence in the spirit of
  score-based query-performance predictors). Fitted or not by cross-validation
  (:mod:`retriever.fusion_fit`), never on by default.
- Combined (:class:`Combined`): a linear model over several per-leg features (normalisations,
  the same times the gap factor, reciprocal rank, presence), fitted by coordinate ascent
  (:func:`retriever.fusion_fit.fit_combined`).
- Every method: per-leg candidate depth (``depths``: leg → depth, at least the call's k) and
  full-score fusion (``full_score``: the union of the legs' candidates scored exactly by every leg
  before fusing, see :mod:`retriever.full_score`).

Ties in the fused score go to the smaller global document ordinal (corpus order).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from retriever.index.errors import QueryError

from . import _kernels
from .results import LegArrays


@dataclass(frozen=True)
class RRF:
    """Reciprocal rank fusion parameters (``k`` = 60 as in the paper).

    Attributes:
        k: the RRF constant of every leg without its own (finite, >= 0).
        weights: leg → weight (default 1.0 per leg).
        leg_k: leg → its own RRF constant (overrides ``k`` for that leg).
        depths: leg → candidates taken from that leg (at least the call's k; default the call's
            depth).
        full_score: score the union of the legs' candidates with every leg before fusing
            (ranks then come from complete score lists; :mod:`retriever.full_score`).
    """

    k: float = 60.0
    weights: Mapping[str, float] = field(default_factory=dict)
    leg_k: Mapping[str, float] = field(default_factory=dict)
    depths: Mapping[str, int] = field(default_factory=dict)
    full_score: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.k, (int, float)) and self.k >= 0 and np.isfinite(self.k)):
            raise QueryError(f"RRF k must be a finite number >= 0, got {self.k!r}")
        _check_weights(self.weights)
        if not isinstance(self.leg_k, Mapping):
            raise QueryError(f"RRF leg_k must be a mapping of leg name to k, got {type(self.leg_k).__name__}")
        for leg, v in self.leg_k.items():
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not (
                    np.isfinite(v) and v >= 0):
                raise QueryError(f"RRF k for leg {leg!r} must be a finite number >= 0, got {v!r}")
        _check_common(self.depths, self.full_score)

    def k_of(self, leg: str) -> float:
        """The RRF constant of ``leg`` (``leg_k`` or ``k``)."""
        return float(self.leg_k.get(leg, self.k))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (``{"method": "rrf", "k", "weights"}``, plus ``leg_k`` / ``depths`` /
        ``full_score`` when set), as stored in results, benchmarks and the manifest."""
        return _with_common({"method": "rrf", "k": self.k, "weights": dict(self.weights),
                             **({"leg_k": dict(self.leg_k)} if self.leg_k else {})}, self)


@dataclass(frozen=True)
class Linear:
    """Linear (convex) combination of normalised leg scores.

    Attributes:
        norm: one of :data:`NORMALISERS` (see the module docstring).
        weights: leg → weight (default 1.0 per leg).
        depths, full_score: as in :class:`RRF`.
        gap_power: γ >= 0 of the per-query adaptive weights (module docstring): leg weight ×
            :func:`gap_factor` ^ γ; 0 (default) = fixed weights.
    """

    norm: str = "minmax"
    weights: Mapping[str, float] = field(default_factory=dict)
    depths: Mapping[str, int] = field(default_factory=dict)
    full_score: bool = False
    gap_power: float = 0.0

    def __post_init__(self) -> None:
        if self.norm not in NORMALISERS:
            raise QueryError(f"unknown normalisation {self.norm!r}; expected one of {', '.join(NORMALISERS)}")
        _check_weights(self.weights)
        _check_common(self.depths, self.full_score)
        g = self.gap_power
        if isinstance(g, bool) or not isinstance(g, (int, float, np.integer, np.floating)) or not (
                np.isfinite(g) and 0 <= g <= MAX_GAP_POWER):
            raise QueryError(f"Linear gap_power must be a number in [0, {MAX_GAP_POWER:g}], got {g!r}")

    @property
    def needs_bounds(self) -> bool:
        """True when the normalisation uses each leg's theoretical score range for the query."""
        return self.norm in BOUNDED_NORMS

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (``{"method": "linear", "norm", "weights"}``, plus ``depths`` /
        ``full_score`` when set), as stored in results, benchmarks and the manifest."""
        d = _with_common({"method": "linear", "norm": self.norm, "weights": dict(self.weights)}, self)
        if self.gap_power:
            d["gap_power"] = float(self.gap_power)
        return d


#: largest accepted :attr:`Linear.gap_power` (g^γ must stay finite for any list of float32 scores)
MAX_GAP_POWER = 8.0


def gap_factor(s: np.ndarray) -> float:
    """The per-query confidence of one leg's candidate list: (max − mean) / σ (population σ) of
    ``s`` (float64 (n,)); 1.0 for fewer than two scores or σ = 0 (so a degenerate list keeps the
    leg's weight). Always >= 0; at most sqrt(n − 1)."""
    if len(s) < 2:
        return 1.0
    sd = s.std()
    if sd == 0 or not np.isfinite(sd):
        return 1.0
    return float((s.max() - s.mean()) / sd)


#: per-leg features a :class:`Combined` fusion weighs: each normalisation of :data:`NORMALISERS`
#: but ``none`` on the leg's list; the same times the leg's :func:`gap_factor` for the query
#: (suffix ``_g``); ``rrf``: (k + 1) / (k + rank), 1.0 at rank 1; ``present``: 1.0 for every
#: document of the leg's list. A document absent from a leg's list has every feature 0 for it.
COMBINED_FEATURES = ("minmax", "zscore", "dbsf", "tmm", "theoretical", "minmax_g", "zscore_g", "dbsf_g", "tmm_g",
                     "theoretical_g", "rrf", "present")


@dataclass(frozen=True)
class Combined:
    """A linear model over several per-leg features ("combined normalisations"): score(d) =
    Σ_legs Σ_f w_{leg,f} · φ_f(leg, d) with the features of :data:`COMBINED_FEATURES`, computed
    on each leg's candidate list (the complete list under ``full_score``). Fitted by coordinate
    ascent on a metric (:func:`retriever.fusion_fit.fit_combined`; Metzler & Croft, "Linear
    feature-based models for information retrieval", Information Retrieval 2007).

    Attributes:
        features: leg → {feature: weight} (finite weights, |w| <= 1e30); a leg not named
            contributes nothing.
        rrf_k: k of the ``rrf`` feature (finite, >= 0).
        depths, full_score: as in :class:`RRF`.
    """

    features: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    rrf_k: float = 60.0
    depths: Mapping[str, int] = field(default_factory=dict)
    full_score: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.features, Mapping) or not self.features:
            raise QueryError(f"Combined features must be a non-empty mapping of leg to {{feature: weight}}, "
                             f"got {self.features!r}")
        for leg, fw in self.features.items():
            if not isinstance(fw, Mapping):
                raise QueryError(f"Combined features of leg {leg!r} must be a mapping of feature to weight, got {fw!r}")
            bad = [f for f in fw if f not in COMBINED_FEATURES]
            if bad:
                raise QueryError(f"Combined: unknown features {bad} for leg {leg!r}; expected some of "
                                 f"{', '.join(COMBINED_FEATURES)}")
            _check_weights(fw)
        k = self.rrf_k
        if isinstance(k, bool) or not isinstance(k, (int, float, np.integer, np.floating)) or not (
                np.isfinite(k) and k >= 0):
            raise QueryError(f"Combined rrf_k must be a finite number >= 0, got {k!r}")
        _check_common(self.depths, self.full_score)

    @property
    def weights(self) -> dict[str, float]:
        """Always ``{}``: the per-leg weights live in :attr:`features`."""
        return {}

    @property
    def needs_bounds(self) -> bool:
        """True when a feature uses a leg's theoretical score range for the query."""
        return any(f.removesuffix("_g") in BOUNDED_NORMS for fw in self.features.values() for f in fw)

    def contribution(self, leg: str, s: np.ndarray, ranks: np.ndarray,
                     bound: "tuple[float, float] | None") -> np.ndarray:
        """float64 (n,) leg ``leg``'s part of the fused score of its list: ``s`` float64 (n,) its
        scores (descending), ``ranks`` its tie ranks (from 1), ``bound`` its theoretical range
        for the query (bounded features only). Features are added in the order they are stored."""
        out = np.zeros(len(s))
        if not len(s):
            return out
        g = None
        for f, w in self.features.get(leg, {}).items():
            if f == "rrf":
                x = (self.rrf_k + 1.0) / (self.rrf_k + np.asarray(ranks, np.float64))
            elif f == "present":
                x = np.ones(len(s))
            else:
                x = NORMALISERS[f.removesuffix("_g")](s, bound)
                if f.endswith("_g"):
                    g = gap_factor(s) if g is None else g
                    x = x * g
            out = out + float(w) * x
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (``{"method": "combined", "features", "rrf_k"}``, plus ``depths`` /
        ``full_score`` when set), as stored in the manifest."""
        return _with_common({"method": "combined", "features": {k: {f: float(w) for f, w in v.items()}
                                                                for k, v in self.features.items()},
                             "rrf_k": float(self.rrf_k)}, self)


def _check_common(depths: Mapping[str, int], full_score: bool) -> None:
    """Raises QueryError unless ``depths`` maps leg names to integers >= 1 and ``full_score`` is a bool."""
    if not isinstance(depths, Mapping):
        raise QueryError(f"fusion depths must be a mapping of leg name to depth, got {type(depths).__name__}")
    for leg, d in depths.items():
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise QueryError(f"fusion depth for leg {leg!r} must be an integer >= 1, got {d!r}")
    if not isinstance(full_score, bool):
        raise QueryError(f"fusion full_score must be True or False, got {full_score!r}")


def _with_common(d: dict[str, Any], f: "RRF | Linear | Combined") -> dict[str, Any]:
    if f.depths:
        d["depths"] = {k: int(v) for k, v in f.depths.items()}
    if f.full_score:
        d["full_score"] = True
    return d


def fusion_from_dict(d: Mapping[str, Any]) -> "RRF | Linear":
    """The fusion object of a :meth:`RRF.to_dict` / :meth:`Linear.to_dict` description (as the
    manifest's ``fusion`` field stores it; other keys, such as ``fitted``, are ignored).

    Raises:
        QueryError: not a mapping, an unknown method, or invalid values (names them).
    """
    if not isinstance(d, Mapping) or d.get("method") not in ("rrf", "linear", "combined"):
        raise QueryError(f"a fusion setting must be a mapping with method 'rrf', 'linear' or 'combined', got {d!r}")
    common = {"weights": dict(d.get("weights") or {}), "depths": {k: int(v) for k, v in (d.get("depths") or {}).items()},
              "full_score": bool(d.get("full_score", False))}
    if d["method"] == "combined":
        feats = d.get("features")
        if not isinstance(feats, Mapping):
            raise QueryError(f"a combined fusion setting needs 'features' (leg -> {{feature: weight}}), got {feats!r}")
        return Combined(features={k: dict(v) if isinstance(v, Mapping) else v for k, v in feats.items()},
                        rrf_k=float(d.get("rrf_k", 60.0)), depths=common["depths"], full_score=common["full_score"])
    if d["method"] == "rrf":
        return RRF(k=float(d.get("k", 60.0)), leg_k=dict(d.get("leg_k") or {}), **common)
    return Linear(norm=str(d.get("norm", "minmax")), gap_power=float(d.get("gap_power", 0.0)), **common)


#: largest accepted |fusion weight|: leg scores times weights must stay finite in float64 sums
MAX_FUSION_WEIGHT = 1e30


def _check_weights(w: Mapping[str, float]) -> None:
    """Raises QueryError unless ``w`` maps leg names to finite numbers with |weight| <= 1e30."""
    if not isinstance(w, Mapping):
        raise QueryError(f"fusion weights must be a mapping of leg name to weight, got {type(w).__name__}")
    for leg, v in w.items():
        number = not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))
        try:
            finite = number and math.isfinite(float(v))
        except OverflowError:  # an int past float's range
            finite = False
        if not finite:
            raise QueryError(f"fusion weight for leg {leg!r} must be a finite number, got {str(v)[:40]}")
        if abs(float(v)) > MAX_FUSION_WEIGHT:
            raise QueryError(f"fusion weight for leg {leg!r} is {v!r}; |weight| must be <= {MAX_FUSION_WEIGHT:g}")


#: the fusion names :func:`parse_fusion` accepts (``linear`` optionally ``linear:<norm>``; ``dbsf``
#: and ``tmm`` are short for ``linear:dbsf`` and ``linear:tmm``)
FUSION_NAMES = ("rrf", "linear", "dbsf", "tmm")


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
        spec: ``None`` (:data:`DEFAULT_FUSION`; with ``weights`` / ``rrf_k``: the default's
            method and options with them), ``"rrf"`` (RRF, k = 60, no full scoring), ``"linear"`` (min-max),
            ``"linear:<norm>"`` for any of :data:`NORMALISERS`, ``"dbsf"`` / ``"tmm"`` (short for
            ``linear:dbsf`` / ``linear:tmm``), or an :class:`RRF` / :class:`Linear` object
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
    if isinstance(spec, (RRF, Linear, Combined)):
        if weights is not None or rrf_k is not None:
            raise QueryError(f"fusion {spec!r} is an object: set its weights and k on it, not as separate arguments")
        return spec
    if spec is None:
        if weights is None and rrf_k is None:
            return DEFAULT_FUSION
        # the default's method and options, with these weights / this k
        w = parse_weights(weights) if isinstance(weights, str) else dict(weights or {})
        f = dataclasses.replace(DEFAULT_FUSION, weights=w)
        if rrf_k is not None:
            if not isinstance(f, RRF):
                raise QueryError(f"rrf_k={rrf_k!r} given but the default fusion is {f.to_dict()['method']!r}")
            f = dataclasses.replace(f, k=rrf_k)
        return f
    if not isinstance(spec, str):
        raise QueryError(f"fusion must be a name or an RRF / Linear object, got {type(spec).__name__}")
    w = parse_weights(weights) if isinstance(weights, str) else dict(weights or {})
    name, sep, norm = spec.partition(":")
    if name in ("dbsf", "tmm") and not sep:
        name, sep, norm = "linear", ":", name
    if name == "rrf" and not sep:
        return RRF(weights=w) if rrf_k is None else RRF(k=rrf_k, weights=w)
    if name == "linear":
        if rrf_k is not None:
            raise QueryError(f"rrf_k={rrf_k!r} given with fusion {spec!r}; the RRF constant applies to 'rrf' only")
        if sep and norm not in NORMALISERS:
            raise QueryError(f"unknown normalisation {norm!r} in fusion {spec!r}; expected one of {', '.join(NORMALISERS)}")
        return Linear(norm=norm or "minmax", weights=w)
    raise QueryError(f"unknown fusion {spec!r}; expected 'rrf', 'dbsf', 'tmm' or 'linear[:{'|'.join(NORMALISERS)}]'")


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


def _minmax(s: np.ndarray, bound: "tuple[float, float] | None" = None) -> np.ndarray:
    lo, hi = s.min(), s.max()
    if hi == lo:
        return np.ones_like(s)
    return (s - lo) / (hi - lo)


def _zscore(s: np.ndarray, bound: "tuple[float, float] | None" = None) -> np.ndarray:
    sd = s.std()
    if sd == 0 or not np.isfinite(sd):
        return np.ones_like(s)
    return (s - s.mean()) / sd


def _dbsf(s: np.ndarray, bound: "tuple[float, float] | None" = None) -> np.ndarray:
    """Qdrant's distribution-based score fusion normalisation: (s − (μ − 3σ)) / (6σ) with the
    sample standard deviation (n − 1), as Qdrant's client computes it; 1.0 for fewer than two
    scores or σ = 0."""
    if len(s) < 2:
        return np.ones_like(s)
    sd = s.std(ddof=1)
    if sd == 0 or not np.isfinite(sd):
        return np.ones_like(s)
    return (s - (s.mean() - 3.0 * sd)) / (6.0 * sd)


def _tmm(s: np.ndarray, bound: "tuple[float, float] | None" = None) -> np.ndarray:
    """Bruch et al.'s theoretical min-max: (s − inf) / (max(s) − inf), ``inf`` the leg's
    theoretical minimum for the query; 1.0 when max(s) == inf."""
    lo = _need(bound)[0]
    hi = s.max()
    if hi == lo:
        return np.ones_like(s)
    return (s - lo) / (hi - lo)


def _theoretical(s: np.ndarray, bound: "tuple[float, float] | None" = None) -> np.ndarray:
    """(s − inf) / (sup − inf) over the leg's theoretical range for the query; 1.0 when it is empty."""
    lo, hi = _need(bound)
    if hi == lo:
        return np.ones_like(s)
    return (s - lo) / (hi - lo)


def _need(bound: "tuple[float, float] | None") -> tuple[float, float]:
    if bound is None:
        raise QueryError("this normalisation needs the legs' theoretical score ranges (fuse(..., bounds=...))")
    return float(bound[0]), float(bound[1])


#: normalisation name → function(scores float64 (n,), bound (inf, sup) or None) → float64 (n,)
NORMALISERS: dict[str, Callable[..., np.ndarray]] = {
    "minmax": _minmax,
    "zscore": _zscore,
    "dbsf": _dbsf,
    "tmm": _tmm,
    "theoretical": _theoretical,
    "none": lambda s, bound=None: s,
}
#: normalisations that need each leg's theoretical range (:mod:`retriever.fusion_bounds`)
BOUNDED_NORMS = frozenset({"tmm", "theoretical"})

#: the fusion of a search without ``fusion=`` on an index without a stored (fitted) setting: RRF
#: with k = 40, chosen by measurement on the four shared collections with two and three legs
#: (``python -m benchmarks.fusion_fit defaults``: the best mean nDCG@10 among the equal-weight
#: settings that reach the best single leg everywhere at the old default's cost; see
#: docs/FUSION.md). Until issue 24 the default was ``RRF()`` (k = 60).
DEFAULT_FUSION: "RRF | Linear" = RRF(k=40.0)


def cut_depths(legs: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], k: int,
               fusion: "RRF | Linear") -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each leg's candidate list cut to ``max(fusion.depths[leg], k)`` (legs without a depth as
    given): a prefix of a sorted top-d list is the top-d' list of that leg, so this equals
    searching the leg at the smaller depth."""
    if not fusion.depths:
        return dict(legs)
    out = {}
    for n, (ids, scores, nf) in legs.items():
        d = fusion.depths.get(n)
        if d is None or max(int(d), k) >= ids.shape[1]:
            out[n] = (ids, scores, nf)
        else:
            d = max(int(d), k)
            out[n] = (ids[:, :d], scores[:, :d], np.minimum(nf, d).astype(np.int32))
    return out


def fuse(legs: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], k: int,
         fusion: "RRF | Linear", bounds: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, LegArrays]]:
    """Fuse per-leg candidate lists into one top-k list per query.

    Args:
        legs: ``{leg: (ids int64 (nq, depth), scores float32 (nq, depth), n_found int32 (nq,))}``;
            each row sorted by score descending (ties by smaller id), padded with -1 / -inf.
            Each list is first cut to the fusion's depth for that leg (:func:`cut_depths`), except
            under ``fusion.full_score``, where the lists are the complete ones of
            :func:`retriever.full_score.complete_lists` (the depths applied to the candidate
            searches before; the engine does both).
        k: fused list length (>= 1).
        fusion: :class:`RRF` or :class:`Linear`.
        bounds: ``{leg: (inf float64 (nq,), sup float64 (nq,))}`` each leg's theoretical score
            range per query (:func:`retriever.fusion_bounds.leg_bounds`); needed by the ``tmm``
            and ``theoretical`` normalisations only.

    Returns:
        ``(ids int64 (nq, k), scores float32 (nq, k), n_found int32 (nq,), {leg: LegArrays})``.

    RRF runs as one compiled call over the batch (:mod:`retriever.fusion_kernels`), linear fusion
    as a numpy loop over queries (:func:`fuse_loop`); both give the results described above.

    Raises:
        QueryError: a bounded normalisation without ``bounds`` for a leg.
    """
    if not fusion.full_score:
        legs = cut_depths(legs, k, fusion)
    if isinstance(fusion, RRF) and legs:
        return _fuse_rrf_compiled(legs, k, fusion)
    return fuse_loop(legs, k, fusion, bounds)


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
    rrf_k = np.array([fusion.k_of(n) for n in names], np.float64)
    out_ids = np.empty((nq, k), dtype=np.int64)  # the kernel writes every element
    out_scores = np.empty((nq, k), dtype=np.float32)
    out_n = np.empty(nq, dtype=np.int32)
    leg_scores = np.empty((n_legs, nq, k), dtype=np.float32)
    leg_ranks = np.empty((n_legs, nq, k), dtype=np.int32)
    rrf_fuse_rows(ids, scores, ranks, n_found, leg_start, weights, rrf_k, int(k), out_ids, out_scores,
                  out_n, leg_scores, leg_ranks)
    return out_ids, out_scores, out_n, {n: LegArrays(leg_scores[i], leg_ranks[i]) for i, n in enumerate(names)}


def fuse_loop(legs: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], k: int,
              fusion: "RRF | Linear", bounds: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, LegArrays]]:
    """:func:`fuse` as a numpy loop over queries: the path for :class:`Linear`, and the reference
    that the compiled RRF path is tested against (same arguments and returns as :func:`fuse`)."""
    if not fusion.full_score:
        legs = cut_depths(legs, k, fusion)
    names = list(legs)
    nq = next(iter(legs.values()))[0].shape[0]
    out_ids = np.full((nq, k), -1, dtype=np.int64)
    out_scores = np.full((nq, k), -np.inf, dtype=np.float32)
    n_found = np.zeros(nq, dtype=np.int32)
    leg_scores = {n: np.full((nq, k), np.nan, dtype=np.float32) for n in names}
    leg_ranks = {n: np.zeros((nq, k), dtype=np.int32) for n in names}
    weights = {n: float(fusion.weights.get(n, 1.0)) for n in names}
    rrf = isinstance(fusion, RRF)
    combined = isinstance(fusion, Combined)
    norm = None if rrf or combined else NORMALISERS[fusion.norm]
    if not rrf and fusion.needs_bounds:
        missing = [n for n in names if bounds is None or n not in bounds]
        if missing:
            what = "a combined fusion's bounded features" if combined else f"normalisation {fusion.norm!r}"
            raise QueryError(f"{what} need the theoretical score range of legs {missing}")
    rank_rows = {n: tie_ranks_rows(legs[n][1], legs[n][2]) for n in names}
    for q in range(nq):
        seg_ids, seg_contrib, seg_scores, seg_ranks = [], [], [], []
        for n in names:
            ids, scores, nf = legs[n]
            m = int(nf[q])
            srow = scores[q, :m]
            ranks = rank_rows[n][q, :len(srow)]
            if rrf:
                c = weights[n] / (fusion.k_of(n) + ranks)
            elif combined:
                bound = None if bounds is None or n not in bounds else (bounds[n][0][q], bounds[n][1][q])
                c = fusion.contribution(n, srow.astype(np.float64), ranks, bound)
            else:
                ls = srow.astype(np.float64)
                bound = None if bounds is None or n not in bounds else (bounds[n][0][q], bounds[n][1][q])
                w = weights[n] * gap_factor(ls) ** fusion.gap_power if fusion.gap_power else weights[n]
                c = w * norm(ls, bound) if m else ls
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
