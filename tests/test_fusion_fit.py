"""Fusion fitting: the figures of the re-fusion in numpy equal a real search's (pytrec_eval), a
fitted setting round-trips through the index and is used when no fusion is given, bad labels
are refused naming the queries."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retriever import CorpusError, Retriever
from retriever.evaluation import evaluate, make_run
from retriever.fusion import DEFAULT_FUSION, RRF, Linear, fusion_from_dict
from retriever import QueryError
from retriever.fusion_fit import (FitData, FitGrid, chooser, collect, cross_validate, evaluate_settings, fit_fusion,
                                  select_smooth, simplex_weights, weight_neighbours)
from tests.conftest import cli_error
from tests.test_fusion_methods import syn  # noqa: F401  (the three-leg synthetic index fixture)


def _labels(r, qs, qv, sv):
    """Deterministic graded qrels: for each query, a few documents from the legs' lists."""
    queries = {f"q{i}": q for i, q in enumerate(qs)}
    qrels = {}
    rng = np.random.default_rng(5)
    for name in r.legs:
        res = r.search_arrays(qs, k=40, mode=name, query_vectors=qv, sparse_vectors=sv)
        for i in range(len(qs)):
            found = res.ids[i, :res.n_found[i]]
            for d in rng.choice(found, size=min(3, len(found)), replace=False) if len(found) else []:
                qrels.setdefault(f"q{i}", {})[r.reader.doc_ids()[d]] = int(rng.integers(1, 3))
    return queries, qrels


def test_simplex_weights():
    w = simplex_weights(3, 2)
    assert w[0] == (1.0, 1.0, 1.0) and len(w) == 1 + 6 and all(abs(sum(x) - 1) < 1e-12 for x in w[1:])


def test_refit_figures_equal_real_searches(syn):
    """For settings across the grid, the per-query metric computed by re-fusing in numpy equals
    pytrec_eval's on the engine's own search with that setting (k = 10 hits)."""
    path, qs, qv, sv, n = syn
    r = Retriever.open(path)
    queries, qrels = _labels(r, qs, qv, sv)
    qids = [q for q in queries if q in qrels]
    rows = [int(q[1:]) for q in qids]
    grid = FitGrid(rrf_k=(5.0, 60.0), norms=("minmax", "zscore", "dbsf", "tmm", "theoretical"), weight_steps=2,
                   depths=(10, 20), full_score=(False, True))
    data = collect(r, queries, qrels, qids, max_depth=100, k=10, cutoff=10, query_vectors=qv[rows],
                   sparse_vectors=sv[rows])
    for metric in ("ndcg@10", "recall@10", "mrr@10"):
        settings, values = evaluate_settings(data, grid, metric, extra=[DEFAULT_FUSION])
        assert values.shape == (len(settings), len(qids))
        pick = list(range(0, len(settings), max(1, len(settings) // 23)))
        pick += [i for i, f in enumerate(settings) if getattr(f, "gap_power", 0.0)][:: max(1, len(settings) // 12)]
        assert any(getattr(settings[i], "gap_power", 0.0) == 1.0 for i in pick)  # adaptive weights checked too
        name = {"ndcg@10": "nDCG@10", "recall@10": "R@10", "mrr@10": "RR@10"}[metric]
        for i in pick:
            f = settings[i]
            res = r.search_arrays([queries[q] for q in qids], k=10, fusion=f, depth=100 if i == 0 else 10,
                                  query_vectors=qv[rows], sparse_vectors=sv[rows])
            ids = r.reader.doc_ids()
            for j, q in enumerate(qids):
                run = make_run([q], [ids[res.ids[j, :res.n_found[j]]].tolist()],
                               [res.scores[j, :res.n_found[j]].tolist()])
                ref = evaluate(run, {q: qrels[q]}, metrics={"m": name})["m"]
                assert values[i, j] == pytest.approx(ref, abs=1e-12), (metric, f.to_dict(), q)


def test_fit_round_trip_and_default(syn, tmp_path, capsys):
    """A fitted setting is stored as a new generation (with the labels' hash and CV figures),
    ``index info`` shows it, searches without fusion= use it, fusion= overrides it."""
    import shutil

    from retriever.cli import main

    src, qs, qv, sv, n = syn
    path = tmp_path / "ix"
    shutil.copytree(src, path)
    r = Retriever.open(path)
    queries, qrels = _labels(r, qs, qv, sv)
    qids = [q for q in queries if q in qrels]
    rows = [int(q[1:]) for q in qids]
    grid = FitGrid(rrf_k=(10.0,), norms=("minmax", "tmm"), weight_steps=2, depths=(100,), full_score=(False, True))
    rep = fit_fusion(r, queries, qrels, folds=2, grid=grid, split="train", store=True,
                     query_vectors=qv[rows], sparse_vectors=sv[rows])
    assert rep.generation == r.reader.generation + 1
    assert rep.cv["mean"] == pytest.approx(np.mean(rep.cv["folds"])) and len(rep.cv["folds"]) == 2
    r2 = Retriever.open(path)
    stored = r2.reader.fusion
    assert stored["fitted"]["labels_sha256"] == rep.labels_sha256 and stored["fitted"]["split"] == "train"
    assert stored["fitted"]["cv_mean"] == round(rep.cv["mean"], 6) and stored["fitted"]["rule"] == "smooth"
    assert r2.default_fusion() == rep.setting == fusion_from_dict(stored)
    a = r2.search_arrays(qs, k=10, query_vectors=qv, sparse_vectors=sv)
    b = r2.search_arrays(qs, k=10, fusion=rep.setting, query_vectors=qv, sparse_vectors=sv)
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.scores, b.scores)
    assert a.fusion["method"] == rep.setting.to_dict()["method"]
    other = RRF(k=1.0, weights={"bm25": 0.0})
    c = r2.search_arrays(qs, k=10, fusion=other, query_vectors=qv, sparse_vectors=sv)
    d = Retriever.open(src).search_arrays(qs, k=10, fusion=other, query_vectors=qv, sparse_vectors=sv)
    assert np.array_equal(c.ids, d.ids)  # an explicit fusion overrides the stored one
    # the old generation (no stored setting) still searches with the library default
    e = Retriever.open(src).search_arrays(qs, k=10, query_vectors=qv, sparse_vectors=sv)
    f = Retriever.open(src).search_arrays(qs, k=10, fusion=DEFAULT_FUSION, query_vectors=qv, sparse_vectors=sv)
    assert np.array_equal(e.ids, f.ids)
    capsys.readouterr()
    assert main(["index", "info", str(path)]) == 0
    shown = json.loads(capsys.readouterr().out)["fusion"]
    assert shown["fitted"]["labels_sha256"] == rep.labels_sha256 and shown["method"] == rep.setting.to_dict()["method"]
    assert main(["fusion", "clear", str(path)]) == 0
    assert Retriever.open(path).default_fusion() == DEFAULT_FUSION


def test_fit_refuses_qrels_of_unknown_queries(bm25_index, tmp_path, capsys):
    (tmp_path / "q.jsonl").write_text(json.dumps({"_id": "1", "text": "vitamin"}) + "\n")
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n1\td1\t1\nmissing-7\td2\t1\nmissing-3\td3\t1\n")
    msg = cli_error(capsys, ["fusion", "fit", str(bm25_index), "--queries", str(tmp_path / "q.jsonl"),
                             "--qrels", str(tmp_path / "qrels.tsv")])
    assert "'missing-3', 'missing-7'" in msg and "2 queries" in msg
    with pytest.raises(CorpusError, match="missing-3"):
        fit_fusion(Retriever.open(bm25_index), {"1": "vitamin"}, {"1": {"d1": 1}, "missing-3": {"d": 1}})
    with pytest.raises(QueryError, match="selection rule 'best'"):
        fit_fusion(Retriever.open(bm25_index), {"1": "vitamin"}, {"1": {"d1": 1}}, rule="best")


def _two_leg_settings():
    """Linear min-max on the simplex of step 1/4 (plus equal weights first) and one RRF setting."""
    w = simplex_weights(2, 4)  # (1, 1), (0, 1), (.25, .75), (.5, .5), (.75, .25), (1, 0)
    lin = [Linear("minmax", weights={} if x == (1.0, 1.0) else {"a": x[0], "b": x[1]}) for x in w]
    return lin + [RRF(weights={"a": 0.75, "b": 0.25})]


def test_weight_neighbours_and_smooth_selection():
    """An isolated spike on the weight simplex wins the plain arg-max; the smooth rule picks the
    plateau (hand-computed neighbourhood means)."""
    settings = _two_leg_settings()
    nb = weight_neighbours(settings, ["a", "b"], 0.5)
    # equal weights are the point (.5, .5): neighbours (.25, .75), (.5, .5), (.75, .25) and itself
    assert sorted(nb[0].tolist()) == [0, 2, 3, 4] and sorted(nb[3].tolist()) == [0, 2, 3, 4]
    assert sorted(nb[1].tolist()) == [1, 2] and sorted(nb[5].tolist()) == [4, 5]
    assert nb[6].tolist() == [6]  # another method: its own group
    #              eq   (0,1) (.25,.75) (.5,.5) (.75,.25) (1,0)  rrf
    per_setting = [0.6, 0.9, 0.1, 0.6, 0.6, 0.6, 0.95]
    values = np.array([[v, v] for v in per_setting])
    rows = np.arange(2)
    # neighbourhood means: eq .475, (0,1) .5, (.25,.75) .55, (.5,.5) .475, (.75,.25) .6, (1,0) .6, rrf .95
    assert select_smooth(values[:6], rows, nb[:6]) == 4  # the first of the two plateau points
    assert select_smooth(values, rows, nb) == 6
    assert chooser("argmax", values[:6], settings[:6], ["a", "b"], 4)(rows) == 1  # the spike
    assert chooser("smooth", values[:6], settings[:6], ["a", "b"], 4)(rows) == 4
    # the one-SE rule: the spike's gain over equal weights (+0.3 on both queries) has no spread: taken
    assert chooser("lcb", values[:6], settings[:6], ["a", "b"], 4)(rows) == 1
    # ... but not when it comes from one query (mean gain 0.05, SE 0.35)
    spread = values[:6].copy()
    spread[1] = [1.3, -0.2]
    assert chooser("lcb", spread, settings[:6], ["a", "b"], 4)(rows) == 0
    with pytest.raises(QueryError, match="selection rule 'best'"):
        chooser("best", values, settings, ["a", "b"], 4)


def test_cross_validate_scores_each_fold_by_the_others():
    """Fold by fold, the rule sees only the other folds' queries; the figure is the mean of the
    held-out folds' means (hand-computed)."""
    # setting 0 is best on queries 0-1, setting 1 on queries 2-3
    values = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    folds = [np.array([0, 1]), np.array([2, 3])]
    cv = cross_validate(values, folds, choose=lambda rows: int(np.argmax(values[:, rows].mean(axis=1))))
    assert cv["chosen"] == [1, 0] and cv["folds"] == [0.0, 0.0] and cv["mean"] == 0.0
    fixed = cross_validate(values, folds, fixed=0)
    assert fixed["folds"] == [1.0, 0.0] and fixed["mean"] == 0.5


def test_model_benchmark_ndcg_kernel_equals_the_fit_metric():
    """The fourth pass's compiled nDCG@10 (benchmarks.fusion_fit, used for every model figure)
    equals fusion_fit's metric exactly, ties (to the earlier column) and absent candidates
    included; coordinate ascent never lowers the training figure it starts from."""
    from types import SimpleNamespace

    from benchmarks.fusion_fit import _KERNELS, coordinate_ascent
    from retriever.fusion_fit import _per_query_metric

    ndcg_rows, _ = _KERNELS()
    rng = np.random.default_rng(3)
    nq, width = 40, 37
    gains = rng.integers(0, 3, size=(nq, width)).astype(np.float64) * (rng.random((nq, width)) < 0.2)
    ideal = -np.sort(-gains, axis=1)[:, :10]
    data = SimpleNamespace(gains=gains, ideal=ideal, n_rel=(gains >= 1).sum(axis=1))
    present = rng.random((nq, width)) < 0.8
    present[0, :] = False  # a query without candidates scores 0
    idcg = ideal @ (1.0 / np.log2(np.arange(2, 12)))
    for t in range(5):
        base = rng.integers(0, 6, size=(nq, width)).astype(np.float64)  # many exact ties
        x = rng.normal(size=(nq, width)).round(1)
        delta = (0.0, 0.5, -1.0, 2.0, 0.1)[t]
        got = ndcg_rows(base, x, delta, present, gains, idcg, 10, np.empty(nq))
        ref = _per_query_metric(base + delta * x, present, data, "ndcg", 10)
        assert np.allclose(got, ref, rtol=0, atol=1e-12), np.abs(got - ref).max()  # summation order only
    case = SimpleNamespace(data=data, idcg=idcg, ndcg_rows=ndcg_rows)
    X = rng.random((3, nq, width))
    rows = np.arange(5, nq)
    w0 = np.array([1.0, 0.0, 0.0])
    start = ndcg_rows(np.tensordot(w0, X[:, rows], axes=1), X[0, rows], 0.0, present[rows],
                      gains[rows], idcg[rows], 10, np.empty(len(rows))).mean()
    w, best = coordinate_ascent(case, X, present, rows, w0)
    again = ndcg_rows(np.tensordot(w, X[:, rows], axes=1), X[0, rows], 0.0, present[rows],
                      gains[rows], idcg[rows], 10, np.empty(len(rows))).mean()
    assert best >= start and again == pytest.approx(best, abs=1e-12)


def test_combined_fusion_hand_computed():
    """Combined: Σ_legs Σ_features w · φ, each feature on the leg's own list (hand-computed), a
    one-hit leg (min-max and the gap factor degenerate to 1), a leg with no hits, bounds needed
    only for bounded features, and the description round-trips."""
    from retriever.fusion import Combined, fuse

    a = (np.array([[1, 2, 3]]), np.array([[3.0, 2.0, 1.0]], np.float32), np.array([3], np.int32))
    b = (np.array([[2, 4, 5]]), np.array([[0.9, 0.5, 0.4]], np.float32), np.array([3], np.int32))
    c = (np.array([[7, -1, -1]]), np.array([[2.5, -np.inf, -np.inf]], np.float32), np.array([1], np.int32))
    e = (np.array([[-1, -1, -1]]), np.full((1, 3), -np.inf, np.float32), np.array([0], np.int32))
    f = Combined(features={"a": {"minmax": 1.0, "rrf": 0.5}, "b": {"zscore_g": 2.0, "present": 0.25},
                           "c": {"minmax_g": 3.0}, "e": {"zscore": 9.0}}, rrf_k=1.0)
    assert not f.needs_bounds and Combined(features={"a": {"tmm_g": 1.0}}).needs_bounds
    ids, scores, n, _ = fuse({"a": a, "b": b, "c": c, "e": e}, 10, f)
    # leg a: min-max 1, .5, 0; rrf (k + 1) / (k + rank) = 1, 2/3, 1/2, weight .5
    ca = {1: 1.0 + 0.5, 2: 0.5 + 0.5 * 2 / 3, 3: 0.0 + 0.25}
    # leg b (float32 scores as float64): z-score with population σ, gap = (max − mean) / σ
    sb = np.array([0.9, 0.5, 0.4], np.float32).astype(np.float64)
    mu, sd = sb.mean(), sb.std()
    g = (sb.max() - mu) / sd
    cb = {d: 2.0 * (x - mu) / sd * g + 0.25 for d, x in zip((2, 4, 5), sb)}
    # leg c: one hit: min-max 1.0, gap factor 1.0
    want = {1: ca[1], 2: ca[2] + cb[2], 3: ca[3], 4: cb[4], 5: cb[5], 7: 3.0}
    order = sorted(want, key=lambda d: (-want[d], d))
    assert n[0] == 6 and ids[0, :6].tolist() == order
    assert np.array_equal(scores[0, :6], np.array([want[d] for d in order], np.float32))
    assert fusion_from_dict(json.loads(json.dumps(f.to_dict()))) == f
    with pytest.raises(QueryError, match="unknown features"):
        Combined(features={"a": {"bm25": 1.0}})
    with pytest.raises(QueryError, match="need the theoretical score range"):
        fuse({"a": a}, 10, Combined(features={"a": {"theoretical": 1.0}}))


def test_combined_fit_figures_equal_real_searches_and_round_trip(syn, tmp_path):
    """The "combined" rule: the re-fused figures of a fitted model (and of a model using every
    feature) equal pytrec_eval on the engine's own search with it, with and without full scoring;
    the fitted model is stored, used when no fusion= is given, and round-trips."""
    import shutil

    from retriever.fusion import COMBINED_FEATURES, Combined
    from retriever.fusion_fit import combined_features, combined_values, fit_combined

    src, qs, qv, sv, n = syn
    path = tmp_path / "ix"
    shutil.copytree(src, path)
    r = Retriever.open(path)
    queries, qrels = _labels(r, qs, qv, sv)
    qids = [q for q in queries if q in qrels]
    rows = [int(q[1:]) for q in qids]
    data = collect(r, queries, qrels, qids, max_depth=40, k=10, cutoff=10, query_vectors=qv[rows],
                   sparse_vectors=sv[rows])
    grid = FitGrid(depths=(20, 40), full_score=(False, True))
    fitted, _ = fit_combined(data, np.arange(len(qids)), grid)
    fitted_ld, _ = fit_combined(data, np.arange(len(qids)), grid, per_leg_depth=True)
    every = [Combined(features={leg: {x: (j + 1) * (-1) ** j / 7 for j, x in enumerate(COMBINED_FEATURES)}
                                for leg in r.legs}, rrf_k=5.0, depths=depths, full_score=full)
             for full in (False, True)
             for depths in ({leg: 20 for leg in r.legs}, {leg: 20 + 20 * (i % 2) for i, leg in enumerate(r.legs)})]
    assert len({tuple(f.depths.values()) for f in every}) == 2  # one model with different per-leg depths
    for f in [fitted, fitted_ld, *every]:
        d = [f.depths[leg] for leg in r.legs]
        X, present, names = combined_features(data, d, f.full_score, COMBINED_FEATURES, rrf_k=f.rrf_k)
        got = combined_values(data, f, X, present, names)
        res = r.search_arrays([queries[q] for q in qids], k=10, fusion=f, query_vectors=qv[rows],
                              sparse_vectors=sv[rows])
        ids = r.reader.doc_ids()
        for j, q in enumerate(qids):
            run = make_run([q], [ids[res.ids[j, :res.n_found[j]]].tolist()], [res.scores[j, :res.n_found[j]].tolist()])
            ref = evaluate(run, {q: qrels[q]}, metrics={"m": "nDCG@10"})["m"]
            assert got[j] == pytest.approx(ref, abs=1e-12), (f.to_dict(), q)
    rep = fit_fusion(r, queries, qrels, folds=2, grid=grid, k=10, split="train", store=True, rule="combined",
                     query_vectors=qv[rows], sparse_vectors=sv[rows])
    assert isinstance(rep.setting, Combined) and rep.n_settings == 4 and len(rep.cv["folds"]) == 2
    assert rep.cv["mean"] == pytest.approx(np.mean(rep.cv["folds"]))
    r2 = Retriever.open(path)
    assert r2.reader.fusion["fitted"]["rule"] == "combined" and r2.reader.fusion["method"] == "combined"
    assert r2.default_fusion() == rep.setting == fusion_from_dict(r2.reader.fusion)
    a = r2.search_arrays(qs, k=10, query_vectors=qv, sparse_vectors=sv)
    b = r2.search_arrays(qs, k=10, fusion=rep.setting, query_vectors=qv, sparse_vectors=sv)
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.scores, b.scores) and a.fusion["method"] == "combined"
    with pytest.raises(QueryError, match="nDCG only"):
        fit_fusion(r, queries, qrels, metric="mrr@10", rule="combined", query_vectors=qv[rows], sparse_vectors=sv[rows])
    # "combined_depths": per-leg depths under full scoring; stored and used like "combined"
    rep2 = fit_fusion(r2, queries, qrels, folds=2, grid=grid, k=10, split="train", store=True, rule="combined_depths",
                      query_vectors=qv[rows], sparse_vectors=sv[rows])
    assert rep2.n_settings == 2 + 2 ** len(r.legs) and rep2.setting == fitted_ld
    assert rep2.train_score == pytest.approx(float(np.mean(combined_values(
        data, fitted_ld, *combined_features(data, [fitted_ld.depths[x] for x in r.legs], fitted_ld.full_score)))))
    r3 = Retriever.open(path)
    assert r3.reader.fusion["fitted"]["rule"] == "combined_depths" and r3.default_fusion() == rep2.setting
    with pytest.raises(QueryError, match="nDCG only"):
        fit_fusion(r, queries, qrels, metric="recall@10", rule="combined_depths", query_vectors=qv[rows],
                   sparse_vectors=sv[rows])
    # "combined_depths_mix": the objective it reports is the mean of nDCG@10 and nDCG@20 of the fitted
    # model's own search (pytrec_eval), and fit_fusion picks the same model as fit_combined
    data20 = collect(r, queries, qrels, qids, max_depth=40, k=10, cutoff=20, query_vectors=qv[rows],
                     sparse_vectors=sv[rows])
    mixed, objective = fit_combined(data20, np.arange(len(qids)), grid, per_leg_depth=True, surrogate_cutoff=20)
    res = r.search_arrays([queries[q] for q in qids], k=10, fusion=mixed, query_vectors=qv[rows],
                          sparse_vectors=sv[rows])
    res20 = r.search_arrays([queries[q] for q in qids], k=20, fusion=mixed, query_vectors=qv[rows],
                            sparse_vectors=sv[rows])
    ids = r.reader.doc_ids()

    def ndcg(rs, q, j, c):
        run = make_run([q], [ids[rs.ids[j, :rs.n_found[j]]].tolist()], [rs.scores[j, :rs.n_found[j]].tolist()])
        return evaluate(run, {q: qrels[q]}, metrics={"m": f"nDCG@{c}"})["m"]
    want = np.mean([0.5 * (ndcg(res, q, j, 10) + ndcg(res20, q, j, 20)) for j, q in enumerate(qids)])
    assert objective == pytest.approx(want, abs=1e-12)
    rep3 = fit_fusion(r, queries, qrels, folds=2, grid=grid, k=10, split="train", rule="combined_depths_mix",
                      query_vectors=qv[rows], sparse_vectors=sv[rows])
    assert rep3.setting == mixed and rep3.rule == "combined_depths_mix" and rep3.generation is None
    with pytest.raises(QueryError, match="needs ideal gains to that depth"):
        fit_combined(data, np.arange(len(qids)), grid, per_leg_depth=True, surrogate_cutoff=20)


def test_combined_configs_and_per_leg_depths():
    """The configurations each combined rule tries (order included), and the per-leg depth
    argument of the feature builders: raised to k, one per leg or an error naming the count."""
    from retriever.fusion_fit import _leg_depths, combined_configs

    g = FitGrid(depths=(100, 200), full_score=(False, True))
    assert combined_configs(3, g) == [((100,) * 3, False), ((100,) * 3, True), ((200,) * 3, False),
                                      ((200,) * 3, True)]
    assert combined_configs(2, g, per_leg_depth=True) == [
        ((100, 100), False), ((200, 200), False),
        ((100, 100), True), ((100, 200), True), ((200, 100), True), ((200, 200), True)]
    assert combined_configs(2, FitGrid(depths=(50,), full_score=(True,)), per_leg_depth=True) == [((50, 50), True)]
    data = FitData(["a", "b"], ["q"], np.zeros((1, 1), np.int64), np.ones(1, np.int32), np.zeros((2, 1, 1), np.int32),
                   np.zeros((2, 1, 1), np.float32), np.zeros((2, 2, 1)), np.zeros((1, 1)), np.zeros((1, 10)),
                   np.zeros(1, np.int64), 200, 30)
    assert _leg_depths(data, 100).tolist() == [100, 100]
    assert _leg_depths(data, [10, 150]).tolist() == [30, 150]
    with pytest.raises(QueryError, match="one depth per leg"):
        _leg_depths(data, [100, 100, 100])



# ------------------------------------------------------------------ small indexes, degenerate labels
def _small_two_leg(path, n_docs: int, seed: int = 0):
    """A BM25 + dense index of ``n_docs`` random documents (random unit vectors, no encoder), six
    queries of three words of some document and three relevant documents each, query vectors."""
    from retriever import build_index
    from tests.conftest import random_corpus

    docs = random_corpus(n_docs, seed=seed, min_len=3)
    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((n_docs, 16)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    build_index(docs, path, legs=("bm25", "dense"), dense_vectors=vecs, show_progress=False)
    queries = {f"q{i}": " ".join(docs[int(rng.integers(n_docs))]["text"].split()[:3]) for i in range(6)}
    qrels = {q: {docs[int(d)]["_id"]: 1 for d in rng.choice(n_docs, 3, replace=False)} for q in queries}
    qv = rng.standard_normal((6, 16)).astype(np.float32)
    return queries, qrels, qv


@pytest.mark.parametrize("n_docs,k", [(60, 10), (150, 300)])
def test_fit_on_an_index_smaller_than_the_depths_or_k(tmp_path, n_docs, k):
    """Fewer documents than the default depth (100) or than k: the legs are searched over the
    whole index and every deeper setting is evaluated on it (they all see every candidate), so the
    fit runs; its figure for the default equals pytrec_eval on the engine's own search."""
    queries, qrels, qv = _small_two_leg(tmp_path / "idx", n_docs)
    r = Retriever.open(tmp_path / "idx")
    rep = fit_fusion(r, queries, qrels, folds=2, k=k, query_vectors=qv)
    assert rep.n_queries == 6
    res = r.search_arrays(list(queries.values()), k=k, fusion=DEFAULT_FUSION, query_vectors=qv)
    ids = r.reader.doc_ids()
    run = make_run(list(queries), [ids[res.ids[j, :res.n_found[j]]].tolist() for j in range(6)],
                   [res.scores[j, :res.n_found[j]].tolist() for j in range(6)])
    want = evaluate(run, qrels, metrics={"m": "nDCG@10"})["m"]  # two folds of three: the mean of the fold means
    assert rep.default_cv["mean"] == pytest.approx(want, abs=1e-12)


def test_fit_refuses_labels_without_a_relevant_document_and_a_single_judged_query(tmp_path):
    """Every grade 0: every setting would score 0 and an arbitrary one would be stored: refused,
    naming the qrels; nothing is stored. One judged query: a message that says cross-validation
    needs two."""
    queries, qrels, qv = _small_two_leg(tmp_path / "idx", 150)
    r = Retriever.open(tmp_path / "idx")
    zero = {q: {d: 0 for d in j} for q, j in qrels.items()}
    with pytest.raises(CorpusError, match="judge no document relevant"):
        fit_fusion(r, queries, zero, folds=2, query_vectors=qv, store=True, qrels_path="r0.tsv")
    assert Retriever.open(tmp_path / "idx").reader.fusion is None and r.reader.generation == 1
    with pytest.raises(QueryError, match="at least 2 judged queries, got 1"):
        fit_fusion(r, queries, {"q0": qrels["q0"]}, query_vectors=qv)
