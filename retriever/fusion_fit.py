"""Fitting a fusion setting from labelled queries, with k-fold cross-validation, and storing it
in the index as a new generation.

The search space (:class:`FitGrid`): method (RRF with a grid of k, or a linear combination with
each normalisation of :data:`retriever.fusion.NORMALISERS` except ``none``) × per-leg weights (the
points of the simplex with a step of ``1 / weight_steps``, plus equal weights) × candidate depth ×
full-score fusion on / off. Bruch, Gai & Ingber (ACM TOIS 2023) find that a convex combination
fitted on a few labelled queries beats RRF; OpenSearch's and Qdrant's tuning guides sweep the same
knobs with held-out checks.

Fitting is fast because every leg searches each query once, at the largest depth of the grid,
and scores the union of the candidates once (``score_docs``); every setting is then re-fused in
numpy from these arrays (:class:`FitData`): the same arithmetic as :func:`retriever.fusion.fuse`
(float64 contributions added leg by leg, ties to the smaller ordinal), so a setting's figure here
is the figure a search with it gives. Metrics (nDCG@k with linear gain, Recall@k, MRR@k; relevant
= grade >= 1) follow trec_eval's conventions, over the judged queries of the queries file.

Selection (:func:`select_smooth`, the default rule ``"smooth"``): the setting whose
neighbourhood on the weight simplex — the settings of the same method, normalisation or k, depth,
full-score and gap power whose normalised weights are within one grid step (L1 distance
``2 / weight_steps``) — has the best mean training score. A plain arg-max over thousands of
settings picks a weight point that wins on a few queries by chance (it overfits collections of a
few dozen queries); a neighbourhood that is good as a whole is a flat optimum that carries over.
The earlier rule (:func:`select`, ``"lcb"``: the best equal-weight setting unless another beats it
by more than one standard error of the paired per-query gain) and the plain arg-max
(``"argmax"``) remain selectable, and ``"combined"`` (:func:`fit_combined`) fits a
:class:`retriever.fusion.Combined` model (per-leg features weighted by coordinate ascent on
nDCG) instead of picking a grid point. Cross-validation: the judged queries are shuffled once (seed 0)
and cut into ``folds`` parts; each part is scored by the setting selected on the other parts. The
CV figure is the mean ± population standard deviation of the per-fold scores; the default setting
is scored on the same folds. The stored setting is selected by the same rule on all judged
queries.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import itertools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from retriever.index.errors import CorpusError, QueryError

from .fusion import DEFAULT_FUSION, MAX_GAP_POWER, NORMALISERS, RRF, Linear, gap_factor, tie_ranks
from .full_score import score_union, union_rows
from .legs.base import SearchContext

#: metric names accepted by :func:`fit_fusion` (``name@cutoff``)
METRICS = ("ndcg", "recall", "mrr")
#: the confidence multiplier of the ``"lcb"`` rule (:func:`select`): one standard error
LCB = 1.0
#: selection rules :func:`chooser` accepts (module docstring); ``"smooth"`` is the default
RULES = ("smooth", "lcb", "argmax")
#: every rule :func:`fit_fusion` accepts: the grid rules of :data:`RULES`, ``"combined"``
#: (:func:`fit_combined`: a linear model over per-leg features by coordinate ascent; nDCG only) and
#: ``"combined_depths"`` (the same with each leg's candidate depth a fitted dimension under full scoring)
#: and ``"combined_depths_mix"`` (that, fitted on the mean of nDCG@cutoff and nDCG@:data:`SURROGATE_CUTOFF`)
FIT_RULES = (*RULES, "combined", "combined_depths", "combined_depths_mix")
#: the rules that fit a :class:`retriever.fusion.Combined` model
COMBINED_RULES = ("combined", "combined_depths", "combined_depths_mix")
#: the second cutoff of the ``"combined_depths_mix"`` objective (nDCG@20: a smoother surrogate)
SURROGATE_CUTOFF = 20


@dataclass(frozen=True)
class FitGrid:
    """The settings :func:`fit_fusion` searches.

    Attributes:
        rrf_k: RRF constants tried (every leg the same k).
        norms: linear normalisations tried.
        weight_steps: weights are the points of the simplex with step ``1 / weight_steps`` (a leg
            may weigh 0), plus equal weights (stored as 1.0 per leg).
        depths: candidate depths per leg tried (each raised to the search's k, as the engine does).
        full_score: full-score fusion off / on.
        gap_powers: γ of the per-query adaptive weights tried for linear settings
            (:attr:`retriever.fusion.Linear.gap_power`; 0 = fixed weights).
    """

    rrf_k: tuple[float, ...] = (5.0, 10.0, 20.0, 40.0, 60.0, 100.0)
    norms: tuple[str, ...] = ("minmax", "zscore", "dbsf", "tmm", "theoretical")
    weight_steps: int = 10
    depths: tuple[int, ...] = (100, 200)
    full_score: tuple[bool, ...] = (False, True)
    gap_powers: tuple[float, ...] = (0.0, 1.0)

    def __post_init__(self) -> None:
        bad = [n for n in self.norms if n not in NORMALISERS]
        if bad:
            raise QueryError(f"FitGrid: unknown normalisations {bad}; expected some of {', '.join(NORMALISERS)}")
        if not self.depths or any(isinstance(d, bool) or int(d) < 1 for d in self.depths):
            raise QueryError(f"FitGrid: depths must be integers >= 1, got {self.depths!r}")
        if int(self.weight_steps) < 1:
            raise QueryError(f"FitGrid: weight_steps must be >= 1, got {self.weight_steps!r}")
        if any(not (k >= 0 and math.isfinite(k)) for k in self.rrf_k):
            raise QueryError(f"FitGrid: rrf_k values must be finite and >= 0, got {self.rrf_k!r}")
        if not self.gap_powers or any(not (0 <= g <= MAX_GAP_POWER) for g in self.gap_powers):
            raise QueryError(f"FitGrid: gap_powers must be non-empty, each in [0, {MAX_GAP_POWER:g}], "
                             f"got {self.gap_powers!r}")


def simplex_weights(n_legs: int, steps: int) -> list[tuple[float, ...]]:
    """Equal weights (1.0 each) first, then every weight vector with entries ``i / steps`` summing
    to 1 (a leg may weigh 0), in lexicographic order of the integer compositions."""
    out: list[tuple[float, ...]] = [(1.0,) * n_legs]
    for comp in itertools.product(range(steps + 1), repeat=n_legs):
        if sum(comp) == steps:
            out.append(tuple(c / steps for c in comp))
    return out


def parse_metric(metric: str) -> tuple[str, int]:
    """``"ndcg@10"`` → ``("ndcg", 10)``.

    Raises:
        QueryError: an unknown measure or a cutoff that is not an integer >= 1.
    """
    name, sep, cut = str(metric).lower().partition("@")
    if name not in METRICS or not sep or not cut.isdigit() or int(cut) < 1:
        raise QueryError(f"unknown metric {metric!r}; expected ndcg@N, recall@N or mrr@N")
    return name, int(cut)


def labels_hash(queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]]) -> str:
    """SHA-256 (hex) of the judged queries and their judgements, canonically ordered (what the
    stored setting was fitted on)."""
    h = hashlib.sha256()
    for q in sorted(qrels):
        if q in queries:
            h.update(f"Q\t{q}\t{queries[q]}\n".encode("utf-8", "surrogatepass"))
            for d in sorted(qrels[q]):
                h.update(f"J\t{d}\t{int(qrels[q][d])}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def check_labels(queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], *,
                 queries_path: str | None = None, qrels_path: str | None = None) -> list[str]:
    """The judged query ids in queries-file order.

    Raises:
        CorpusError: qrels naming queries that the queries file lacks (names up to ten of them and
            how many), no judged query at all, or no relevant judgement (grade >= 1) at all.
    """
    missing = sorted(q for q in qrels if q not in queries)
    if missing:
        shown = ", ".join(repr(q) for q in missing[:10])
        raise CorpusError(f"qrels{f' {qrels_path}' if qrels_path else ''} judge {len(missing)} queries that are "
                          f"not in the queries file{f' {queries_path}' if queries_path else ''}: {shown}"
                          f"{' ...' if len(missing) > 10 else ''}", path=qrels_path)
    judged = [q for q in queries if q in qrels]
    if not judged:
        raise CorpusError("no query of the queries file has a judgement", path=queries_path)
    if not any(g >= 1 for q in judged for g in qrels[q].values()):  # every setting would score 0
        raise CorpusError(f"qrels{f' {qrels_path}' if qrels_path else ''} judge no document relevant (every "
                          f"grade of the {len(judged)} judged queries is 0 or below): nothing to fit on",
                          path=qrels_path)
    return judged


@dataclass
class FitData:
    """Every leg's candidates and exact scores for the judged queries, searched once.

    Attributes:
        legs: leg names (the index's order).
        qids: judged query ids.
        union: int64 (nq, U) per query the union of the legs' top-``max_depth`` candidates, ordinals
            ascending, -1 padding.
        n_union: int32 (nq,).
        pos: int32 (L, nq, U) each candidate's position (0-based) in each leg's own top list
            (``max_depth`` = not in it).
        scores: float32 (L, nq, U) every leg's exact score of every candidate.
        bounds: float64 (L, 2, nq) each leg's theoretical range per query.
        gains: float64 (nq, U) each candidate's grade (0 unjudged).
        ideal: float64 (nq, cutoff) the query's ideal gains, best first (for nDCG).
        n_rel: int (nq,) relevant documents (grade >= 1) per query.
        max_depth: the depth every leg was searched at.
        k: the search's k (depths below it are raised to it).
        search_ms: time of the leg searches; full_ms: time of scoring the union (both totals).
        exhaustive: ``max_depth`` is the index's size (a smaller index than the depths or k
            asked for): every deeper setting sees the same candidates, so it is evaluated too.
    """

    legs: list[str]
    qids: list[str]
    union: np.ndarray
    n_union: np.ndarray
    pos: np.ndarray
    scores: np.ndarray
    bounds: np.ndarray
    gains: np.ndarray
    ideal: np.ndarray
    n_rel: np.ndarray
    max_depth: int
    k: int
    search_ms: float = 0.0
    full_ms: float = 0.0
    exhaustive: bool = False


def collect(retriever: Any, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], qids: Sequence[str],
            *, max_depth: int, k: int, cutoff: int, leg_params: Mapping[str, Any] | None = None,
            query_vectors: np.ndarray | None = None, sparse_vectors: Any = None,
            n_threads: int | None = None) -> FitData:
    """Search the judged queries once with every leg at ``max_depth`` and score the union
    (see :class:`FitData`). ``query_vectors`` / ``sparse_vectors`` (rows in ``qids`` order) replace
    encoding, as in :meth:`retriever.Retriever.search_arrays`."""
    from .engine import _and_masks, search_leg
    from .params import defaults_for, parse_leg_params

    eng = retriever.engine
    names = list(eng.legs)
    if len(names) < 2:
        raise QueryError(f"fusion needs two or more legs; this index has {names}")
    params = parse_leg_params(leg_params)
    threads = int(n_threads or retriever.n_threads)
    texts = [queries[q] for q in qids]
    depth = int(min(max(max_depth, k), max(retriever.reader.n_docs, 1)))
    masks = _and_masks(eng.live, None)
    shards = [eng.reader.shards[i] for i in eng.shard_ids]
    bases = np.array([s.base for s in shards], np.int64), np.array([s.rows for s in shards], np.int64)
    t0 = time.perf_counter()
    preps, tops = {}, {}
    for name in names:
        leg = eng.legs[name]
        p = params.get(name) or defaults_for(name)
        given = {"dense": query_vectors, "sparse": sparse_vectors}.get(name)
        preps[name] = leg.prepare(texts, p, threads) if given is None else leg.prepare_vectors(given, p, threads)
        tops[name] = search_leg(leg, preps[name], SearchContext(depth=depth, n_threads=threads, allow=masks))
    t1 = time.perf_counter()
    union, n_union = union_rows([tops[n] for n in names])
    nq, width = union.shape
    rows = np.arange(nq, dtype=np.int64)
    scores = np.stack([score_union(eng.legs[n], preps[n], rows, union, n_union, *bases) for n in names])
    t2 = time.perf_counter()
    pos = np.full((len(names), nq, width), depth, dtype=np.int32)
    for li, n in enumerate(names):
        ids, _, nf = tops[n]
        for q in range(nq):
            m = int(nf[q])
            col = np.searchsorted(union[q, :n_union[q]], ids[q, :m])
            pos[li, q, col] = np.arange(m)
    bounds = np.stack([np.stack(eng.bounds.bounds(n, preps[n])) for n in names])
    doc_ids = retriever.reader.doc_ids()
    gains = np.zeros((nq, width))
    ideal = np.zeros((nq, cutoff))
    n_rel = np.zeros(nq, dtype=np.int64)
    for q, qid in enumerate(qids):
        judged = qrels[qid]
        m = int(n_union[q])
        gains[q, :m] = [max(int(judged.get(d, 0)), 0) for d in doc_ids[union[q, :m]].tolist()]
        g = sorted((max(int(v), 0) for v in judged.values()), reverse=True)[:cutoff]
        ideal[q, :len(g)] = g
        n_rel[q] = sum(1 for v in judged.values() if int(v) >= 1)
    return FitData(names, list(qids), union, n_union, pos, scores, bounds, gains, ideal, n_rel, depth, int(k),
                   (t1 - t0) * 1e3, (t2 - t1) * 1e3, exhaustive=depth >= retriever.reader.n_docs)


def _leg_depths(data: FitData, depth: "int | Sequence[int]") -> np.ndarray:
    """int64 (L,) each leg's candidate depth (one int: every leg the same), raised to the search's
    k as the engine does.

    Raises:
        QueryError: a sequence whose length is not the number of legs.
    """
    L = len(data.legs)
    d = np.full(L, int(depth), dtype=np.int64) if np.ndim(depth) == 0 else np.asarray(depth, dtype=np.int64)
    if d.shape != (L,):
        raise QueryError(f"per-leg depths must give one depth per leg ({L}), got {depth!r}")
    return np.maximum(d, data.k)


def _contributions(data: FitData, depth: "int | Sequence[int]", full: bool, norms: Sequence[str],
                   rrf_ks: Sequence[float]) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """For one (depth, full-score) pair: the candidate mask (nq, U), per normalisation the
    normalised scores (L, nq, U) (0 where a leg does not see a candidate), the RRF ranks
    (L, nq, U) (0 = not seen) and each leg's :func:`retriever.fusion.gap_factor` per query
    (float64 (L, nq)), each computed exactly as :func:`retriever.fusion.fuse_loop` does on the
    lists the engine would fuse. ``depth``: one depth for every leg, or one per leg (the legs'
    order; :func:`_leg_depths`)."""
    L, nq, width = data.scores.shape
    d = _leg_depths(data, depth)
    seen = data.pos < d[:, None, None]  # (L, nq, U): in the leg's own top-d
    present = seen.any(axis=0)
    normed = {n: np.zeros((L, nq, width)) for n in norms}
    ranks = np.zeros((L, nq, width), dtype=np.int64)
    gaps = np.ones((L, nq))
    for li in range(L):
        for q in range(nq):
            if full:
                cols = np.flatnonzero(present[q])
                s = data.scores[li, q, cols]
                order = np.lexsort((data.union[q, cols], -s.astype(np.float64)))
            else:
                cols = np.flatnonzero(seen[li, q])
                s = data.scores[li, q, cols]
                order = np.argsort(data.pos[li, q, cols], kind="stable")
            cols, s = cols[order], s[order]
            if not len(cols):
                continue
            ranks[li, q, cols] = tie_ranks(s, len(s))
            ls = s.astype(np.float64)
            gaps[li, q] = gap_factor(ls)
            bound = (data.bounds[li, 0, q], data.bounds[li, 1, q])
            for n in norms:
                normed[n][li, q, cols] = NORMALISERS[n](ls, bound)
    return present, normed, ranks, gaps


def _per_query_metric(total: np.ndarray, present: np.ndarray, data: FitData, measure: str, cutoff: int) -> np.ndarray:
    """float64 (nq,) the metric of the ranking by ``total`` (descending, ties to the smaller
    ordinal = the earlier column), candidates outside ``present`` excluded."""
    t = np.where(present, total, -np.inf)
    nq, width = t.shape
    c = min(cutoff, width)
    kth = np.partition(t, width - c, axis=1)[:, width - c][:, None]
    gt = t > kth
    eq = t == kth
    need = c - gt.sum(axis=1, keepdims=True)
    sel = gt | (eq & (np.cumsum(eq, axis=1) <= need))
    idx = np.nonzero(sel)[1].reshape(nq, c)
    vals = np.take_along_axis(t, idx, axis=1)
    order = np.lexsort((idx, -vals), axis=-1)
    idx = np.take_along_axis(idx, order, axis=1)
    ok = np.isfinite(np.take_along_axis(t, idx, axis=1))
    g = np.where(ok, np.take_along_axis(data.gains, idx, axis=1), 0.0)
    if measure == "ndcg":
        disc = 1.0 / np.log2(np.arange(2, c + 2))
        ideal = data.ideal[:, :c] @ (1.0 / np.log2(np.arange(2, data.ideal[:, :c].shape[1] + 2)))
        dcg = g @ disc
        return np.divide(dcg, ideal, out=np.zeros(nq), where=ideal > 0)
    rel = g >= 1
    if measure == "recall":
        return np.divide(rel.sum(axis=1), data.n_rel, out=np.zeros(nq), where=data.n_rel > 0)
    first = np.where(rel.any(axis=1), rel.argmax(axis=1) + 1, 0)
    return np.divide(1.0, first, out=np.zeros(nq), where=first > 0)


def _weights_dict(names: Sequence[str], w: tuple[float, ...]) -> dict[str, float]:
    return {} if all(x == 1.0 for x in w) else {n: float(x) for n, x in zip(names, w)}


def evaluate_settings(data: FitData, grid: FitGrid | None, metric: str, extra: Sequence[Any] = ()
                      ) -> tuple[list[Any], np.ndarray]:
    """Every setting of ``grid`` (after the ``extra`` settings, e.g. the default) and its
    per-query metric (``grid=None``: the ``extra`` settings only).

    Returns:
        ``(settings, values float64 (n_settings, nq))``; settings are :class:`RRF` /
        :class:`Linear` objects (depth stored in ``depths`` for every leg).
    """
    measure, cutoff = parse_metric(metric)
    names = data.legs
    if grid is None:
        grid = FitGrid(rrf_k=(), norms=(), depths=(data.max_depth,), full_score=())
    weights = simplex_weights(len(names), int(grid.weight_steps))
    settings: list[Any] = []
    rows: list[np.ndarray] = []
    wanted: dict[tuple[int, bool], list[Any]] = {}
    from .api import DEFAULT_DEPTH

    for s in extra:
        if s.depths and len(set(s.depths.values())) > 1:
            raise QueryError(f"fit: a comparison setting with different per-leg depths is not supported: {s!r}")
        d = next(iter(s.depths.values())) if s.depths else DEFAULT_DEPTH
        if max(int(d), data.k) > data.max_depth and not data.exhaustive:
            raise QueryError(f"fit: setting {s.to_dict()} needs depth {d}, more than the searched {data.max_depth}")
        wanted.setdefault((int(d), bool(s.full_score)), []).append(s)
    for d in grid.depths:
        for full in grid.full_score:
            wanted.setdefault((int(d), bool(full)), [])
    extra_vals: dict[int, np.ndarray] = {}
    grid_out: list[tuple[Any, np.ndarray]] = []
    for (d, full), ext in wanted.items():
        norms = sorted(set(grid.norms) | {s.norm for s in ext if isinstance(s, Linear)})
        present, normed, ranks, gaps = _contributions(data, d, full, norms, grid.rrf_k)
        in_grid = d in grid.depths and full in grid.full_score
        depths = {n: int(d) for n in names}

        def value(f: Any) -> np.ndarray:
            total = np.zeros(present.shape)
            for li, n in enumerate(names):
                w = float(f.weights.get(n, 1.0))
                if isinstance(f, RRF):
                    c = np.where(ranks[li] > 0, w / (f.k_of(n) + np.maximum(ranks[li], 1)), 0.0)
                else:
                    wq = w * gaps[li] ** f.gap_power if f.gap_power else np.full(len(gaps[li]), w)
                    c = wq[:, None] * normed[f.norm][li]
                total = total + c
            return _per_query_metric(total, present, data, measure, cutoff)

        for s in ext:
            extra_vals[id(s)] = value(s)
        if not in_grid:
            continue
        for w in weights:
            wd = _weights_dict(names, w)
            for k in grid.rrf_k:
                f = RRF(k=float(k), weights=wd, depths=depths, full_score=full)
                grid_out.append((f, value(f)))
            for n in grid.norms:
                for g in grid.gap_powers:
                    f = Linear(norm=n, weights=wd, depths=depths, full_score=full, gap_power=float(g))
                    grid_out.append((f, value(f)))
    for s in extra:
        settings.append(s)
        rows.append(extra_vals[id(s)])
    for f, v in grid_out:
        settings.append(f)
        rows.append(v)
    return settings, np.array(rows)


def folds_of(n: int, folds: int, seed: int = 0) -> list[np.ndarray]:
    """``folds`` disjoint index arrays covering ``range(n)`` (a seeded shuffle cut into near-equal
    parts).

    Raises:
        QueryError: fewer than 2 folds or more folds than queries.
    """
    if n < 2:
        raise QueryError(f"cross-validation needs at least 2 judged queries, got {n}")
    if folds < 2 or folds > n:
        raise QueryError(f"folds must be in [2, {n}] (the judged queries), got {folds}")
    perm = np.random.default_rng(seed).permutation(n)
    return [np.sort(p) for p in np.array_split(perm, folds)]


def select(values: np.ndarray, rows: np.ndarray, baselines: Sequence[int], lcb: float) -> int:
    """The setting chosen on the queries ``rows``.

    First the best of the ``baselines`` (indices of fixed, equal-weight settings; the first on
    ties); then the best other setting by the lower confidence bound of its paired gain over that
    baseline, ``mean(v_s − v_b) − lcb · SE(v_s − v_b)`` (SE the standard error of the per-query
    differences), which replaces the baseline only when positive. With ``lcb = 0`` and no
    baselines this is the plain argmax of the mean. The bound keeps a setting that wins on a few
    queries by chance (the grid holds thousands) from displacing a robust one.
    """
    v = values[:, rows]
    means = v.mean(axis=1)
    if not len(baselines):
        return int(np.argmax(means))
    b = int(baselines[int(np.argmax(means[list(baselines)]))])
    if lcb <= 0:
        best = int(np.argmax(means))
        return best if means[best] > means[b] else b
    diff = v - v[b]
    n = v.shape[1]
    se = diff.std(axis=1, ddof=1) / np.sqrt(n) if n > 1 else np.zeros(len(v))
    score = diff.mean(axis=1) - lcb * se
    score[b] = 0.0
    best = int(np.argmax(score))
    return best if score[best] > 0 else b


def baseline_rows(settings: Sequence[Any]) -> list[int]:
    """Indices of the equal-weight, fixed-weight settings (no per-leg weights, no gap power)
    among ``settings``: the baselines of :func:`select`."""
    return [i for i, s in enumerate(settings) if not s.weights and not getattr(s, "gap_power", 0.0)]


def weight_neighbours(settings: Sequence[Any], legs: Sequence[str], radius: float) -> list[np.ndarray]:
    """Per setting, the indices of its neighbourhood for :func:`select_smooth`: the settings that
    differ from it in the weights only (same method, k / per-leg k, normalisation, depths,
    full-score and gap power) whose weight vectors, each divided by its sum, are within L1
    distance ``radius`` of its own (itself included). Weights default to 1.0 per leg; a weight
    vector summing to 0 or less is its own only neighbour."""
    groups: dict[str, list[int]] = {}
    vec = np.zeros((len(settings), len(legs)))
    for i, s in enumerate(settings):
        d = s.to_dict()
        d.pop("weights", None)
        groups.setdefault(repr(sorted(d.items())), []).append(i)
        w = np.array([float(s.weights.get(n, 1.0)) for n in legs])
        vec[i] = w / w.sum() if w.sum() > 0 else np.nan
    out: list[np.ndarray] = [np.array([i]) for i in range(len(settings))]
    for idx in groups.values():
        ix = np.array(idx)
        v = vec[ix]
        dist = np.abs(v[:, None, :] - v[None, :, :]).sum(axis=2)
        for j, i in enumerate(ix):
            near = ix[dist[j] <= radius + 1e-9]
            out[i] = near if len(near) else np.array([i])
    return out


def select_smooth(values: np.ndarray, rows: np.ndarray, neighbours: Sequence[np.ndarray]) -> int:
    """The setting chosen on the queries ``rows`` by the ``"smooth"`` rule: the arg-max (first
    on ties) of the neighbourhood mean, ``mean_{s' ∈ N(s)} mean_{q ∈ rows} v[s', q]`` with
    ``N(s)`` from :func:`weight_neighbours`. Prefers a weight region that is good as a whole to an
    isolated winning point (the arg-max's overfitting on a few dozen queries)."""
    means = values[:, rows].mean(axis=1)
    smooth = np.array([means[nb].mean() for nb in neighbours])
    return int(np.argmax(smooth))


def chooser(rule: str, values: np.ndarray, settings: Sequence[Any], legs: Sequence[str],
            weight_steps: int) -> Callable[[np.ndarray], int]:
    """``rows -> chosen setting index`` for a selection rule of :data:`RULES` over ``settings``
    (their per-query ``values``): ``"smooth"`` (:func:`select_smooth`, neighbours within one
    simplex step, L1 ``2 / weight_steps``), ``"lcb"`` (:func:`select` with the equal-weight
    baselines and :data:`LCB`) or ``"argmax"`` (the best training mean).

    Raises:
        QueryError: an unknown rule.
    """
    if rule == "smooth":
        nb = weight_neighbours(settings, legs, 2.0 / int(weight_steps))
        return lambda rows: select_smooth(values, rows, nb)
    if rule == "lcb":
        base = baseline_rows(settings)
        return lambda rows: select(values, rows, base, LCB)
    if rule == "argmax":
        return lambda rows: select(values, rows, (), 0.0)
    raise QueryError(f"unknown selection rule {rule!r}; expected one of {', '.join(RULES)}")


def cross_validate(values: np.ndarray, folds: Sequence[np.ndarray], fixed: int | None = None,
                   baselines: Sequence[int] = (), lcb: float = 0.0,
                   choose: Callable[[np.ndarray], int] | None = None) -> dict[str, Any]:
    """Per fold: the setting chosen on the other folds (by ``choose(rows)``, else by
    :func:`select` with ``baselines`` and ``lcb``), scored on the fold; or, with ``fixed``, that
    setting on every fold. Returns ``{"mean", "std", "folds": [...], "chosen": [setting index per
    fold]}`` (std: population, over the folds)."""
    scores, chosen = [], []
    n = values.shape[1]
    for f in folds:
        train = np.ones(n, dtype=bool)
        train[f] = False
        rows = np.flatnonzero(train)
        best = fixed if fixed is not None else choose(rows) if choose is not None else select(
            values, rows, baselines, lcb)
        chosen.append(best)
        scores.append(float(values[best, f].mean()))
    return {"mean": float(np.mean(scores)), "std": float(np.std(scores)), "folds": scores, "chosen": chosen}


@dataclass
class FitReport:
    """What :func:`fit_fusion` found.

    Attributes:
        setting: the chosen fusion (fitted on every judged query).
        metric: e.g. ``"ndcg@10"``.
        cv: cross-validated figure of the fitting procedure (``{"mean", "std", "folds"}``).
        default_cv: the default fusion's figure on the same folds.
        default: the default fusion's description.
        train_score: the chosen setting's mean over all judged queries (in-sample).
        n_queries: judged queries; n_settings: settings searched; labels_sha256: :func:`labels_hash`.
        split: the name of the labelled split (e.g. ``"train"``), as given.
        seconds: wall time of collecting, of evaluating the grid, of the whole fit.
        full_score_ms_per_query: time of scoring the union once per query at the largest depth.
        generation: the generation the setting was stored in (None when not stored).
        folds: the CV folds; rule: the selection rule (:data:`RULES`).
    """

    setting: Any
    metric: str
    cv: dict[str, Any]
    default_cv: dict[str, Any]
    default: dict[str, Any]
    train_score: float
    n_queries: int
    n_settings: int
    labels_sha256: str
    split: str | None
    seconds: dict[str, float]
    full_score_ms_per_query: float
    generation: int | None = None
    folds: int = 5
    rule: str = "smooth"

    def stored(self) -> dict[str, Any]:
        """The manifest's ``fusion`` field: the setting's description plus ``fitted`` (metric, CV
        figures, labels' hash, split, queries, date)."""
        return {**self.setting.to_dict(), "fitted": {
            "metric": self.metric, "folds": self.folds, "rule": self.rule, "cv_mean": round(self.cv["mean"], 6),
            "cv_std": round(self.cv["std"], 6), "default_cv_mean": round(self.default_cv["mean"], 6),
            "default_cv_std": round(self.default_cv["std"], 6), "default": self.default,
            "train_score": round(self.train_score, 6), "n_queries": self.n_queries, "n_settings": self.n_settings,
            "labels_sha256": self.labels_sha256, "split": self.split,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}}

    def summary(self) -> str:
        """Human-readable lines (what ``retriever fusion fit`` prints)."""
        return "\n".join([
            f"fitted on {self.n_queries} judged queries of split {self.split or '(unnamed)'}; "
            f"{self.n_settings} settings, {self.folds}-fold CV, metric {self.metric}, rule {self.rule}",
            f"  fitted (CV)  {self.cv['mean']:.4f} ± {self.cv['std']:.4f}",
            f"  default (CV) {self.default_cv['mean']:.4f} ± {self.default_cv['std']:.4f}   [{self.default}]",
            f"  chosen: {self.setting.to_dict()}  (in-sample {self.train_score:.4f})",
            *([f"  stored as generation {self.generation}"] if self.generation is not None else []),
        ])


def fit_fusion(retriever: Any, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], *,
               metric: str = "ndcg@10", folds: int = 5, grid: FitGrid | None = None, k: int = 100,
               split: str | None = None, store: bool = False, default: Any = None,
               leg_params: Mapping[str, Any] | None = None, query_vectors: np.ndarray | None = None,
               sparse_vectors: Any = None, n_threads: int | None = None, seed: int = 0,
               queries_path: str | None = None, qrels_path: str | None = None, rule: str = "smooth") -> FitReport:
    """Fit a fusion setting on labelled queries (module docstring) and optionally store it.

    Args:
        retriever: an open :class:`~retriever.Retriever` of an index with two or more legs.
        queries: ``{qid: text}``; qrels: ``{qid: {doc_id: grade}}`` (every judged query must be in
            ``queries``).
        metric: ``ndcg@N``, ``recall@N`` or ``mrr@N``.
        folds: cross-validation folds (>= 2).
        grid: the search space (default :class:`FitGrid`).
        k: the search k the setting is fitted for (depths below it are raised to it, as in a
            search); default 100, as ``retriever eval``.
        split: the labelled split's name, recorded and printed (never fit on the split you report).
        store: commit the chosen setting as a new generation of the index (the manifest's
            ``fusion``); later searches without ``fusion=`` use it.
        default: the setting to compare with (default :data:`retriever.fusion.DEFAULT_FUSION`).
        leg_params, query_vectors, sparse_vectors, n_threads: as in ``search_arrays``;
            vectors in judged-query order (the queries file's order, judged ones only).
        seed: of the fold shuffle.
        rule: the selection rule, one of :data:`FIT_RULES` (module docstring; default ``"smooth"``;
            ``"combined"``: :func:`fit_combined`, nDCG only).

    Returns:
        a :class:`FitReport` (``generation`` set when stored).

    Raises:
        CorpusError: qrels naming queries that ``queries`` lacks (names them), or nothing judged.
        QueryError: bad metric, folds, grid, rule, or an index with fewer than two legs.
        IndexLockedError / IndexFormatError: storing while another writer holds the index, or
            after another generation was committed.
    """
    t0 = time.perf_counter()
    grid = grid or FitGrid()
    measure, cutoff = parse_metric(metric)
    if rule not in FIT_RULES:
        raise QueryError(f"unknown selection rule {rule!r}; expected one of {', '.join(FIT_RULES)}")
    if rule in COMBINED_RULES and measure != "ndcg":
        raise QueryError(f"rule {rule!r} fits nDCG only, got metric {metric!r}")
    qids = check_labels(queries, qrels, queries_path=queries_path, qrels_path=qrels_path)
    parts = folds_of(len(qids), int(folds), seed)
    default = DEFAULT_FUSION if default is None else default
    mix = rule == "combined_depths_mix"
    from .api import DEFAULT_DEPTH

    need = max(int(d) for d in (*grid.depths, *default.depths.values())) if default.depths else max(
        max(grid.depths), DEFAULT_DEPTH)
    data = collect(retriever, queries, qrels, qids, max_depth=need, k=k,
                   cutoff=max(cutoff, SURROGATE_CUTOFF) if mix else cutoff,
                   leg_params=leg_params, query_vectors=query_vectors, sparse_vectors=sparse_vectors,
                   n_threads=n_threads)
    t1 = time.perf_counter()
    if rule in COMBINED_RULES:
        return _fit_combined_report(retriever, data, grid, parts, default, queries, qrels, qids, measure, cutoff,
                                    split, store, int(folds), t0, t1, per_leg_depth=rule != "combined",
                                    surrogate_cutoff=SURROGATE_CUTOFF if mix else None)
    settings, values = evaluate_settings(data, grid, metric, extra=[default])
    t2 = time.perf_counter()
    pick = chooser(rule, values[1:], settings[1:], data.legs, grid.weight_steps)  # the grid, not the default

    def choose(rows: np.ndarray) -> int:
        return 1 + pick(rows)

    cv = cross_validate(values, parts, choose=choose)
    dcv = cross_validate(values, parts, fixed=0)
    best = choose(np.arange(values.shape[1]))
    rep = FitReport(settings[best], f"{measure}@{cutoff}", cv, dcv, default.to_dict(), float(values[best].mean()),
                    len(qids), len(settings) - 1, labels_hash(queries, qrels), split,
                    {"collect": t1 - t0, "grid": t2 - t1}, data.full_ms / max(1, len(qids)), folds=int(folds),
                    rule=rule)
    if store:
        rep.generation = store_fusion(retriever.reader.path, retriever.reader.generation, rep.stored())
    rep.seconds["total"] = time.perf_counter() - t0
    return rep


def _fit_combined_report(retriever: Any, data: FitData, grid: FitGrid, parts: Sequence[np.ndarray], default: Any,
                         queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], qids: Sequence[str],
                         measure: str, cutoff: int, split: str | None, store: bool, folds: int, t0: float,
                         t1: float, per_leg_depth: bool = False, surrogate_cutoff: int | None = None) -> FitReport:
    """:func:`fit_fusion` with rule ``"combined"`` / ``"combined_depths"``: each fold scored by
    the model fitted on the other folds (:func:`fit_combined`), the stored model fitted on every
    judged query."""
    cache: dict = {}
    n = len(qids)
    scores = []
    for f in parts:
        s, _ = fit_combined(data, np.setdiff1d(np.arange(n), f), grid, cutoff, cache, per_leg_depth=per_leg_depth,
                            surrogate_cutoff=surrogate_cutoff)
        scores.append(float(combined_values(data, s, *cache[_config_of(s, data.legs)], cutoff=cutoff)[f].mean()))
    cv = {"mean": float(np.mean(scores)), "std": float(np.std(scores)), "folds": scores}
    _, dv = evaluate_settings(data, None, f"{measure}@{cutoff}", extra=[default])
    dcv = cross_validate(dv, parts, fixed=0)
    best, _ = fit_combined(data, np.arange(n), grid, cutoff, cache, per_leg_depth=per_leg_depth,
                           surrogate_cutoff=surrogate_cutoff)
    train = float(combined_values(data, best, *cache[_config_of(best, data.legs)], cutoff=cutoff).mean())
    rep = FitReport(best, f"{measure}@{cutoff}", cv, dcv, default.to_dict(), train, n,
                    len(combined_configs(len(data.legs), grid, per_leg_depth)), labels_hash(queries, qrels), split,
                    {"collect": t1 - t0, "grid": time.perf_counter() - t1}, data.full_ms / max(1, n), folds=folds,
                    rule=("combined_depths_mix" if surrogate_cutoff else "combined_depths") if per_leg_depth
                    else "combined")
    if store:
        rep.generation = store_fusion(retriever.reader.path, retriever.reader.generation, rep.stored())
    rep.seconds["total"] = time.perf_counter() - t0
    return rep


def store_fusion(path: str | Path, parent: int, setting: Mapping[str, Any] | None) -> int:
    """Commit ``setting`` (a fusion description, or None to remove it) as the manifest's ``fusion``
    of a new generation (:func:`retriever.index.generations.commit_generation`); returns it.

    Raises:
        QueryError: a setting that does not parse (:func:`retriever.fusion.fusion_from_dict`).
        IndexLockedError / IndexFormatError: as ``commit_generation``.
    """
    from retriever.index.generations import commit_generation

    from .fusion import fusion_from_dict

    if setting is not None:
        fusion_from_dict(setting)
    m = commit_generation(path, parent=int(parent), changes={"fusion": None if setting is None else dict(setting)})
    return int(m["generation"])


# --- "combined": a linear model over per-leg features, fitted by coordinate ascent ------------------------

#: the features :func:`fit_combined` weighs per leg (:data:`retriever.fusion.COMBINED_FEATURES`); ``present``
#: is left out under full scoring (a constant there)
COMBINED_FIT_FEATURES = ("zscore", "theoretical", "rrf", "zscore_g", "theoretical_g", "present")
#: coordinate-ascent steps of :func:`coordinate_ascent`
CA_STEPS = (-0.5, -0.2, -0.1, -0.05, 0.05, 0.1, 0.2, 0.5)

_NDCG_KERNEL: list[Callable[..., np.ndarray]] = []


def ndcg_kernel() -> Callable[..., np.ndarray]:
    """The compiled (numba) ``ndcg_rows(base, x, delta, present, gains, idcg, cutoff, out)``:
    per query the nDCG@cutoff of the ranking by ``base + delta * x`` (float64 (nq, U)) over the
    ``present`` candidates, ties to the earlier column (the smaller ordinal, as
    :func:`_per_query_metric` and the engine), ``idcg`` float64 (nq,) the ideal DCG; writes and
    returns ``out`` float64 (nq,). Compiled on first use."""
    if not _NDCG_KERNEL:
        import numba as nb

        @nb.njit(nogil=True)
        def ndcg_rows(base, x, delta, present, gains, idcg, cutoff, out):  # pragma: no cover (compiled)
            nq, width = base.shape
            topv = np.empty(cutoff)
            topi = np.empty(cutoff, np.int64)
            for q in range(nq):
                m = 0
                for u in range(width):
                    if not present[q, u]:
                        continue
                    s = base[q, u] + delta * x[q, u]
                    if m < cutoff:
                        j = m
                        m += 1
                    elif s > topv[m - 1]:
                        j = m - 1
                    else:
                        continue
                    while j > 0 and topv[j - 1] < s:
                        topv[j] = topv[j - 1]
                        topi[j] = topi[j - 1]
                        j -= 1
                    topv[j] = s
                    topi[j] = u
                d = 0.0
                for r in range(m):
                    d += gains[q, topi[r]] / np.log2(r + 2.0)
                out[q] = d / idcg[q] if idcg[q] > 0 else 0.0
            return out

        _NDCG_KERNEL.append(ndcg_rows)
    return _NDCG_KERNEL[0]


def ideal_dcg(data: FitData, cutoff: int) -> np.ndarray:
    """float64 (nq,) each query's ideal DCG@cutoff (linear gain)."""
    c = min(cutoff, data.ideal.shape[1])
    return data.ideal[:, :c] @ (1.0 / np.log2(np.arange(2, c + 2)))


def coordinate_ascent(X: np.ndarray, present: np.ndarray, gains: np.ndarray, idcg: np.ndarray, rows: np.ndarray,
                      w0: np.ndarray, cutoff: int = 10, steps: Sequence[float] = CA_STEPS,
                      passes: int = 4, surrogate: "tuple[int, np.ndarray] | None" = None) -> tuple[np.ndarray, float]:
    """Coordinate ascent on the mean nDCG@cutoff of the queries ``rows`` (Metzler & Croft,
    "Linear feature-based models for information retrieval", Information Retrieval 2007; RankLib's
    CoorAscent): each weight in turn moves by the step of ``steps`` that raises the mean most (none
    if none does), up to ``passes`` sweeps or until a sweep changes nothing.

    Args:
        X: float64 (F, nq, U) features; present: bool (nq, U) candidates; gains: float64 (nq, U);
        idcg: float64 (nq,) (:func:`ideal_dcg`); rows: the training queries; w0: float64 (F,) start.
        surrogate: ``(cutoff2, idcg2)``: maximise the mean of nDCG@cutoff and nDCG@cutoff2 instead
            (a smoother objective: a step that moves relevant documents within the top cutoff2
            counts too); ``idcg2`` float64 (nq,) the ideal DCG@cutoff2.

    Returns:
        ``(weights float64 (F,), training mean)``.
    """
    ndcg_rows = ndcg_kernel()
    Xr = np.ascontiguousarray(X[:, rows])
    pr = np.ascontiguousarray(present[rows])
    gr = np.ascontiguousarray(gains[rows])
    ir = np.ascontiguousarray(idcg[rows])
    out = np.empty(len(rows))
    w = np.array(w0, dtype=np.float64)
    total = np.tensordot(w, Xr, axes=1)
    if surrogate is None:
        def objective(x: np.ndarray, dl: float) -> float:
            return float(ndcg_rows(total, x, dl, pr, gr, ir, cutoff, out).mean())
    else:  # the mean of nDCG@cutoff and nDCG@(surrogate cutoff): a smoother objective
        c2, i2 = int(surrogate[0]), np.ascontiguousarray(surrogate[1][rows])

        def objective(x: np.ndarray, dl: float) -> float:
            return 0.5 * (float(ndcg_rows(total, x, dl, pr, gr, ir, cutoff, out).mean())
                          + float(ndcg_rows(total, x, dl, pr, gr, i2, c2, out).mean()))
    best = objective(Xr[0], 0.0)
    for _ in range(passes):
        moved = False
        for j in range(len(w)):
            bj, bd = best, 0.0
            for dl in steps:
                m = objective(Xr[j], float(dl))
                if m > bj + 1e-12:
                    bj, bd = m, float(dl)
            if bd:
                w[j] += bd
                total = total + bd * Xr[j]
                best, moved = bj, True
        if not moved:
            break
    return w, float(best)


def combined_features(data: FitData, depth: "int | Sequence[int]", full: bool,
                      feats: Sequence[str] = COMBINED_FIT_FEATURES, rrf_k: float = 60.0
                      ) -> tuple[np.ndarray, np.ndarray, list[tuple[str, str]]]:
    """The features of :class:`retriever.fusion.Combined` for every candidate, computed as the
    engine would at ``depth`` (one for every leg, or one per leg in the legs' order) with or
    without full scoring.

    Returns:
        ``(X float64 (F, nq, U), present bool (nq, U), [(leg, feature)] per row of X)``; 0 where a
        leg does not see a candidate; ``present`` features are left out under full scoring.
    """
    norms = sorted({f.removesuffix("_g") for f in feats if f not in ("rrf", "present")})
    present, normed, ranks, gaps = _contributions(data, depth, full, norms, ())
    d = _leg_depths(data, depth)
    X, names = [], []
    for li, leg in enumerate(data.legs):
        for f in feats:
            if f == "rrf":
                x = np.where(ranks[li] > 0, (rrf_k + 1.0) / (rrf_k + np.maximum(ranks[li], 1)), 0.0)
            elif f == "present":
                if full:
                    continue
                x = (data.pos[li] < d[li]).astype(np.float64)
            elif f.endswith("_g"):
                x = normed[f[:-2]][li] * gaps[li][:, None]
            else:
                x = normed[f][li]
            X.append(np.where(present, x, 0.0))
            names.append((leg, f))
    return np.stack(X), present, names


def combined_setting(names: Sequence[tuple[str, str]], w: np.ndarray, depth: "int | Sequence[int]", full: bool,
                     legs: Sequence[str], rrf_k: float = 60.0) -> Any:
    """The :class:`retriever.fusion.Combined` of feature weights ``w`` (zero weights left out);
    ``depth``: one for every leg or one per leg (``legs``' order)."""
    from .fusion import Combined

    feats: dict[str, dict[str, float]] = {}
    for (leg, f), x in zip(names, w):
        if x != 0.0:
            feats.setdefault(leg, {})[f] = float(x)
    if not feats:  # all weights zero: keep one explicit zero so the setting is valid
        feats = {names[0][0]: {names[0][1]: 0.0}}
    ds = [int(depth)] * len(legs) if np.ndim(depth) == 0 else [int(x) for x in depth]
    return Combined(features=feats, rrf_k=float(rrf_k), depths=dict(zip(legs, ds)), full_score=bool(full))


def combined_values(data: FitData, setting: Any, X: np.ndarray, present: np.ndarray,
                    names: Sequence[tuple[str, str]], cutoff: int = 10) -> np.ndarray:
    """float64 (nq,) per-query nDCG@cutoff of a :class:`retriever.fusion.Combined` over its
    features ``X`` (:func:`combined_features` of its depth and full score), summed in the engine's
    order (per leg its features in stored order, then the legs in order; float64)."""
    row = {nf: i for i, nf in enumerate(names)}
    total = np.zeros(present.shape)
    for leg in data.legs:
        c = np.zeros(present.shape)
        for f, w in setting.features.get(leg, {}).items():
            # ``present`` under full scoring (left out of X there): 1.0 for every candidate
            x = X[row[(leg, f)]] if (leg, f) in row else present.astype(np.float64)
            c = c + float(w) * x
        total = total + c
    return _per_query_metric(total, present, data, "ndcg", cutoff)


def combined_configs(n_legs: int, grid: FitGrid, per_leg_depth: bool = False) -> list[tuple[tuple[int, ...], bool]]:
    """The (per-leg depths, full score) configurations :func:`fit_combined` tries: without
    ``per_leg_depth`` every depth of ``grid`` for all legs × full score off / on (in that order);
    with it, the same without full scoring, then under full scoring every assignment of a grid
    depth to each leg (``len(depths) ** n_legs``; full scoring is where a leg's depth only widens
    the candidates every leg scores)."""
    if not per_leg_depth:
        return [((int(d),) * n_legs, bool(f)) for d in grid.depths for f in grid.full_score]
    out = [((int(d),) * n_legs, False) for d in grid.depths if False in grid.full_score]
    if True in grid.full_score:
        out += [(tuple(int(x) for x in ds), True) for ds in itertools.product(grid.depths, repeat=n_legs)]
    return out


def _config_of(setting: Any, legs: Sequence[str]) -> tuple[tuple[int, ...], bool]:
    """The :func:`combined_configs` key of a fitted :class:`retriever.fusion.Combined`."""
    return tuple(int(setting.depths[n]) for n in legs), bool(setting.full_score)


def fit_combined(data: FitData, rows: np.ndarray, grid: FitGrid, cutoff: int = 10,
                 cache: dict | None = None, per_leg_depth: bool = False,
                 surrogate_cutoff: int | None = None) -> tuple[Any, float]:
    """The ``"combined"`` rule: for each (depth, full score) of ``grid``, coordinate ascent
    (:func:`coordinate_ascent`) over :data:`COMBINED_FIT_FEATURES` on the queries ``rows``, started
    from equal z-score·g weights (the second pass's adaptive linear z-score); the configuration with
    the best training nDCG@cutoff wins (the first on ties). ``per_leg_depth`` (rule
    ``"combined_depths"``): the configurations of :func:`combined_configs` with per-leg depths
    under full scoring. ``surrogate_cutoff`` (rule ``"combined_depths_mix"``): the objective is
    the mean of nDCG@cutoff and nDCG@surrogate_cutoff (the selected configuration too). Returns
    ``(Combined setting, training objective)``. ``cache`` keeps the features between calls on the
    same data (keys: per-leg depths tuple, full score).

    Raises:
        QueryError: ``surrogate_cutoff`` deeper than the ideal gains ``data`` holds (collect with
            ``cutoff`` at least that).
    """
    cache = {} if cache is None else cache
    idcg = ideal_dcg(data, cutoff)
    sur = None
    if surrogate_cutoff is not None:
        if int(surrogate_cutoff) > data.ideal.shape[1]:
            raise QueryError(f"surrogate cutoff {surrogate_cutoff} needs ideal gains to that depth; the data holds "
                             f"{data.ideal.shape[1]} (collect with cutoff >= {surrogate_cutoff})")
        sur = (int(surrogate_cutoff), ideal_dcg(data, int(surrogate_cutoff)))
    best = None
    for key in combined_configs(len(data.legs), grid, per_leg_depth):
        if key not in cache:
            cache[key] = combined_features(data, key[0], key[1])
        X, present, names = cache[key]
        w0 = np.array([1.0 if f == "zscore_g" else 0.0 for _, f in names])
        w, m = coordinate_ascent(X, present, data.gains, idcg, rows, w0, cutoff=cutoff, surrogate=sur)
        if best is None or m > best[0]:
            best = (m, combined_setting(names, w, key[0], key[1], data.legs))
    return best[1], best[0]
