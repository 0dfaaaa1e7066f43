"""Fusion figures of issue 24: fitted fusion (cross-validated), fixed methods, single legs, the
no-label default and the cost of full-score fusion, on the four shared collections.

Indexes are built from the stored document vectors of the regression suite
(``tests/regression/vectors``: the bundled all-MiniLM-L6-v2 and 2-layer SPLADE, no model runs at
build time), three legs (BM25 + dense + SPLADE) and two legs (BM25 + dense). Test-split query
vectors are the stored ones; SciFact's train queries (``queries_train.jsonl`` / ``qrels_train.tsv``)
are encoded once with the same models, as the legs encode queries, and cached.

    python -m benchmarks.fusion_fit quality [--only scifact]   # fits, CV, fixed methods -> results/fusion_fit.json
    python -m benchmarks.fusion_fit cost                       # full-score ms/query -> results/fusion_full_score.json
    python -m benchmarks.fusion_fit defaults                   # the no-label default -> results/fusion_defaults.json
    python -m benchmarks.fusion_fit nested                     # nested CV of the rule choice (after quality)
    python -m benchmarks.fusion_fit models [--procs ...] [--seeds 10]  # fourth pass: models on CV only (after quality --no-test)
    python -m benchmarks.fusion_fit combined-test              # rule "combined": fit on SciFact train, test once

Protocol: SciFact is fitted on train only (5-fold CV on train reported beside) and the chosen
setting is evaluated once on test with a real search (pytrec_eval). Cranfield, CISI and MED have
no train split: 5-fold CV over their judged queries (each query scored once by a setting fitted
on the other four folds). Fixed methods use equal weights at depth 100.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from retriever.fusion_fit import folds_of

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("RETRIEVER_CACHE", Path.home() / ".cache" / "retriever")) / "fusion_fit"
RESULTS = ROOT / "benchmarks" / "results"
COLLECTIONS = ("scifact", "cranfield", "cisi", "medline")
LEG_SETS = {"3leg": ("bm25", "dense", "sparse"), "2leg": ("bm25", "dense")}


def index_for(collection: str, legs: str) -> Path:
    """The collection's index of ``legs`` (built once from the stored vectors)."""
    from retriever import build_index
    from tests.regression import golden_cases as G

    out = CACHE / f"{collection}-{legs}"
    if not (out / "CURRENT").is_file():
        vec = G.load_vectors(collection)
        kw = {"sparse_vectors": vec["sparse_docs"]} if "sparse" in LEG_SETS[legs] else {}
        build_index(G.DATA / collection, out, legs=LEG_SETS[legs], show_progress=False, overwrite=True,
                    dense_vectors=vec["dense_docs"], **kw)
    return out


def split_queries(collection: str, split: str) -> tuple[dict, dict, list[str], np.ndarray, Any]:
    """``(queries, qrels, judged qids, dense float32 (nq, d), sparse csr (nq, vocab))`` of a split."""
    import scipy.sparse

    from retriever.index.readers import read_qrels, read_queries
    from tests.regression import golden_cases as G

    folder = G.DATA / collection
    suffix = "" if split == "test" else f"_{split}"
    queries = read_queries(folder / f"queries{suffix}.jsonl")
    qrels = read_qrels(folder / f"qrels{suffix}.tsv")
    qids = [q for q in queries if q in qrels]
    if split == "test":
        vec = G.load_vectors(collection)
        assert list(vec["query_ids"]) == qids, collection
        dense, (ip, t, w) = vec["dense_queries"], vec["sparse_queries"]
    else:
        cache = CACHE / f"{collection}_{split}_queries.npz"
        if not cache.is_file():
            from retriever.index.config import DenseConfig, SparseConfig
            from retriever.index.encoders.dense import DenseEncoder
            from retriever.index.encoders.sparse import SparseEncoder

            dc, sc = DenseConfig(), SparseConfig()
            texts = [queries[q] for q in qids]
            dense = DenseEncoder(dc.model, max_length=dc.max_length, batch_size=dc.batch_size,
                                 normalize=dc.normalize).encode([dc.query_prefix + x for x in texts]).astype(np.float32)
            enc = SparseEncoder(sc.model, doc_max_length=sc.doc_max_length, query_max_length=sc.query_max_length,
                                batch_size=sc.batch_size)
            ip, t, w = enc.encode_queries(texts)
            CACHE.mkdir(parents=True, exist_ok=True)
            np.savez(cache, qids=np.array(qids), dense=dense, indptr=ip, terms=t, weights=w)
        with np.load(cache) as z:
            assert list(z["qids"]) == qids
            dense, ip, t, w = z["dense"], z["indptr"], z["terms"], z["weights"]
    sparse = scipy.sparse.csr_matrix((np.asarray(w, np.float32), np.asarray(t, np.int64), np.asarray(ip, np.int64)),
                                     shape=(len(qids), 30522))
    return queries, qrels, qids, dense, sparse


def fixed_settings(legs: tuple[str, ...]) -> dict[str, Any]:
    """Equal-weight methods at depth 100 (full-score off / on) and each leg alone."""
    from retriever.fusion import RRF, Linear

    out: dict[str, Any] = {}
    for full in (False, True):
        tag = "+full" if full else ""
        out[f"rrf60{tag}"] = RRF(full_score=full)
        for n in ("minmax", "zscore", "dbsf", "tmm", "theoretical"):
            out[f"{n}{tag}"] = Linear(n, full_score=full)
    for leg in legs:  # one leg alone: RRF with the others at weight 0 keeps the leg's own order first
        out[f"only:{leg}"] = RRF(weights={n: float(n == leg) for n in legs})
    return out


def real_eval(r: Any, queries: dict, qrels: dict, qids: list[str], dense: np.ndarray, sparse: Any,
              fusion: Any, k: int = 100) -> dict[str, float]:
    """A real search of the split with ``fusion`` evaluated by pytrec_eval (nDCG@10, R@100, RR@10)."""
    from retriever.evaluation import evaluate, make_run

    res = r.search_arrays([queries[q] for q in qids], k=k, fusion=fusion, query_vectors=dense,
                          sparse_vectors=sparse if "sparse" in r.legs else None)
    ids = r.reader.doc_ids()
    run = make_run(qids, [ids[res.ids[i, :res.n_found[i]]].tolist() for i in range(len(qids))],
                   [res.scores[i, :res.n_found[i]].tolist() for i in range(len(qids))])
    return {m: round(v, 4) for m, v in evaluate(run, qrels, qids=qids).items() if m != "queries"}


def save_data(data: Any, path: Path) -> None:
    """Cache a :class:`retriever.fusion_fit.FitData` (the leg runs every setting is re-fused from)."""
    import dataclasses

    d = dataclasses.asdict(data)
    np.savez(path, **{k: (np.array(v) if k in ("legs", "qids") else v) for k, v in d.items()})


def load_data(path: Path) -> Any:
    """The :class:`retriever.fusion_fit.FitData` that :func:`save_data` cached."""
    from retriever.fusion_fit import FitData

    with np.load(path) as z:
        d = {k: z[k] for k in z.files}
    d["legs"], d["qids"] = [str(x) for x in d["legs"]], [str(x) for x in d["qids"]]
    for k in ("max_depth", "k"):
        d[k] = int(d[k])
    for k in ("search_ms", "full_ms"):
        d[k] = float(d[k])
    return FitData(**d)


def quality(only: list[str], test: bool = True) -> dict[str, Any]:
    from retriever import Retriever
    from retriever.fusion import DEFAULT_FUSION
    from retriever.fusion_fit import RULES, FitGrid, chooser, collect, cross_validate, evaluate_settings, folds_of, \
        labels_hash

    grid = FitGrid()
    out: dict[str, Any] = {"grid": {"rrf_k": grid.rrf_k, "norms": grid.norms, "weight_steps": grid.weight_steps,
                                    "depths": grid.depths, "full_score": grid.full_score,
                                    "gap_powers": grid.gap_powers},
                           "metric": "ndcg@10", "folds": 5, "k": 100, "rule": RULES[0], "collections": {}}
    for c in only:
        for legs in LEG_SETS:
            t0 = time.perf_counter()
            r = Retriever.open(index_for(c, legs), n_threads=2)
            fit_split = "train" if c == "scifact" else "test"
            queries, qrels, qids, dense, sparse = split_queries(c, fit_split)
            data = collect(r, queries, qrels, qids, max_depth=max(grid.depths), k=100, cutoff=10,
                           query_vectors=dense, sparse_vectors=sparse)
            CACHE.mkdir(parents=True, exist_ok=True)
            save_data(data, CACHE / f"data_{c}_{legs}.npz")
            fixed = fixed_settings(LEG_SETS[legs])
            settings, values = evaluate_settings(data, grid, "ndcg@10", extra=[DEFAULT_FUSION, *fixed.values()])
            n_extra = 1 + len(fixed)
            parts = folds_of(len(qids), 5, 0)
            rules = {}
            for rule in RULES:  # every rule on the same folds, the grid only (not the fixed comparisons)
                pick = chooser(rule, values[n_extra:], settings[n_extra:], data.legs, grid.weight_steps)
                rules[rule] = (lambda p: lambda rows: n_extra + p(rows))(pick)
            cv = cross_validate(values, parts, choose=rules[RULES[0]])
            np.savez(CACHE / f"values_{c}_{legs}.npz", values=values,
                     names=np.array([json.dumps(s.to_dict()) for s in settings]))
            per_fixed = {name: {"mean": round(float(values[1 + i].mean()), 4),
                                "cv": round(cross_validate(values, parts, fixed=1 + i)["mean"], 4)}
                         for i, name in enumerate(fixed)}
            best = rules[RULES[0]](np.arange(len(qids)))
            row: dict[str, Any] = {
                "fit_split": fit_split, "n_queries": len(qids), "n_settings": len(settings) - n_extra,
                "labels_sha256": labels_hash(queries, qrels),
                "fitted_cv": {"mean": round(cv["mean"], 4), "std": round(cv["std"], 4),
                              "folds": [round(x, 4) for x in cv["folds"]],
                              "chosen": [settings[i].to_dict() for i in cv["chosen"]]},
                "rules_cv": {rule: round(cross_validate(values, parts, choose=ch)["mean"], 4)
                             for rule, ch in rules.items()},
                "default_cv": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in
                               cross_validate(values, parts, fixed=0).items() if k in ("mean", "std")},
                "chosen_all": settings[best].to_dict(), "chosen_in_sample": round(float(values[best].mean()), 4),
                "fixed": per_fixed,
                "best_fixed": max((n for n in per_fixed if not n.startswith("only:")), key=lambda n: per_fixed[n]["cv"]),
                "collect_s": round(time.perf_counter() - t0, 1), "full_ms_per_query_at_depth200":
                    round(data.full_ms / len(qids), 3)}
            if c == "scifact" and test:  # evaluated once on test with a real search
                tq, tr, tids, td, ts = split_queries(c, "test")
                row["test"] = {"fitted": real_eval(r, tq, tr, tids, td, ts, settings[best]),
                               "default": real_eval(r, tq, tr, tids, td, ts, DEFAULT_FUSION),
                               **{name: real_eval(r, tq, tr, tids, td, ts, f) for name, f in fixed.items()
                                  if name in ("rrf60", "zscore", "minmax", "dbsf", "tmm", "tmm+full", "minmax+full")}}
                tdata = collect(r, tq, tr, tids, max_depth=200, k=100, cutoff=10, query_vectors=td, sparse_vectors=ts)
                _, tv = evaluate_settings(tdata, None, "ndcg@10", extra=[DEFAULT_FUSION, *fixed.values()])
                row["test_fixed"] = {name: round(float(tv[1 + i].mean()), 4) for i, name in enumerate(fixed)}
            row["seconds"] = round(time.perf_counter() - t0, 1)
            out["collections"][f"{c}/{legs}"] = row
            print(json.dumps({f"{c}/{legs}": {k: row[k] for k in ("fitted_cv", "default_cv", "best_fixed", "seconds")}
                              | ({"test": row["test"]} if "test" in row else {})}), flush=True)
    return out


def repeated(v: np.ndarray, values: np.ndarray, fixed_rows: list[int], picks: dict[str, Any], n: int,
             seeds: range = range(10)) -> dict[str, Any]:
    """5-fold CV repeated over fold shuffles ``seeds`` (less split noise than one shuffle): per rule
    and for the fixed method selected on the training folds, the mean over seeds of the CV figure
    and its range."""
    out: dict[str, list[float]] = {r: [] for r in picks} | {"fixed_method_selected": []}
    for seed in seeds:
        parts = folds_of(n, 5, seed)
        for r, pick in picks.items():
            out[r].append(float(np.mean([v[pick(np.setdiff1d(np.arange(n), f)), f].mean() for f in parts])))
        out["fixed_method_selected"].append(float(np.mean([values[fixed_rows[int(np.argmax(
            values[fixed_rows][:, np.setdiff1d(np.arange(n), f)].mean(axis=1)))], f].mean() for f in parts])))
    return {r: {"mean": round(float(np.mean(x)), 4), "range": [round(min(x), 4), round(max(x), 4)]}
            for r, x in out.items()} | {"seeds": len(seeds)}


def nested(only: list[str], inner: int = 5) -> dict[str, Any]:
    """Nested cross-validation of the choice of selection rule, from the per-setting values that
    ``quality`` cached: in each outer fold, every rule of ``RULES`` is scored by an inner
    ``inner``-fold CV on the outer training queries only (inner shuffle seed 1), the best rule is
    applied to all outer training queries and its setting scored on the held-out fold. The rule
    is then itself a fitted choice, so this figure stays held-out even though the default rule was
    chosen by looking at the (outer) CV figures of these collections."""
    from retriever.fusion import fusion_from_dict
    from retriever.fusion_fit import RULES, FitGrid, chooser

    grid = FitGrid()
    out: dict[str, Any] = {"inner_folds": inner, "rules": RULES, "collections": {}}
    for c in only:
        for legs in LEG_SETS:
            with np.load(CACHE / f"values_{c}_{legs}.npz") as z:
                values, names = z["values"], [json.loads(x) for x in z["names"]]
            n_extra = 1 + len(fixed_settings(LEG_SETS[legs]))
            settings = [fusion_from_dict(d) for d in names[n_extra:]]
            v = values[n_extra:]
            picks = {rule: chooser(rule, v, settings, list(LEG_SETS[legs]), grid.weight_steps) for rule in RULES}
            n = v.shape[1]
            scores, chosen = [], []
            for fold in folds_of(n, 5, 0):
                train = np.setdiff1d(np.arange(n), fold)
                inner_cv = {}
                for rule, pick in picks.items():
                    parts = folds_of(len(train), inner, 1)
                    inner_cv[rule] = float(np.mean([v[pick(np.delete(train, p)), train[p]].mean() for p in parts]))
                rule = max(RULES, key=lambda r: inner_cv[r])  # first of RULES on ties
                chosen.append(rule)
                scores.append(float(v[picks[rule](train), fold].mean()))
            # the honest version of "best fixed": the fixed method chosen on the training folds
            fixed_rows = [1 + i for i, name in enumerate(fixed_settings(LEG_SETS[legs])) if not name.startswith("only:")]
            fixed_cv = [float(values[fixed_rows[int(np.argmax(values[fixed_rows][:, np.setdiff1d(np.arange(n), f)]
                                                             .mean(axis=1)))], f].mean()) for f in folds_of(n, 5, 0)]
            # the adaptive weights' share: every rule on the grid without them (gap power 0 only)
            keep = np.array([not getattr(x, "gap_power", 0.0) for x in settings])
            fixed_w = [x for x, k in zip(settings, keep) if k]
            no_gap = {}
            for rule in RULES:
                pick = chooser(rule, v[keep], fixed_w, list(LEG_SETS[legs]), grid.weight_steps)
                no_gap[rule] = round(float(np.mean([v[keep][pick(np.setdiff1d(np.arange(n), f)), f].mean()
                                                    for f in folds_of(n, 5, 0)])), 4)
            out["collections"][f"{c}/{legs}"] = {"mean": round(float(np.mean(scores)), 4),
                                                 "std": round(float(np.std(scores)), 4),
                                                 "folds": [round(x, 4) for x in scores], "rules": chosen,
                                                 "fixed_method_selected_cv": round(float(np.mean(fixed_cv)), 4),
                                                 "rules_cv_without_gap": no_gap,
                                                 "repeated_cv": repeated(v, values, fixed_rows, picks, n)}
            print(json.dumps({f"{c}/{legs}": out["collections"][f"{c}/{legs}"]}), flush=True)
    return out


def cost(only: list[str], rounds: int = 3, n_queries: int = 60) -> dict[str, Any]:
    """ms/query of hybrid search with and without full-score fusion (batch of 1, k = 10, depth 100),
    interleaved rounds; medians and spread."""
    from retriever import Retriever
    from retriever.fusion import Linear, RRF

    out: dict[str, Any] = {"k": 10, "depth": 100, "batch": 1, "rounds": rounds, "queries": n_queries, "rows": {}}
    for c in only:
        for legs in LEG_SETS:
            r = Retriever.open(index_for(c, legs), n_threads=1)
            queries, _, qids, dense, sparse = split_queries(c, "test")
            qids = qids[:n_queries]
            sets = {"minmax": Linear("minmax"), "minmax+full": Linear("minmax", full_score=True),
                    "rrf60": RRF(), "rrf60+full": RRF(full_score=True)}
            samples: dict[str, list[float]] = {n: [] for n in sets}
            full_part: list[float] = []
            for _ in range(rounds):
                for name, f in sets.items():
                    t0 = time.perf_counter()
                    for i, q in enumerate(qids):
                        res = r.search_arrays([queries[q]], k=10, fusion=f, query_vectors=dense[i:i + 1],
                                              sparse_vectors=sparse[i:i + 1] if "sparse" in r.legs else None)
                        if f.full_score:
                            full_part.append(res.timings_ms["full_score"])
                    samples[name].append((time.perf_counter() - t0) * 1e3 / len(qids))
            med = {n: float(np.median(v)) for n, v in samples.items()}
            out["rows"][f"{c}/{legs}"] = {
                "ms_per_query": {n: round(v, 3) for n, v in med.items()},
                "spread": {n: [round(min(v), 3), round(max(v), 3)] for n, v in samples.items()},
                "added_ms_minmax": round(med["minmax+full"] - med["minmax"], 3),
                "added_ms_rrf": round(med["rrf60+full"] - med["rrf60"], 3),
                "full_score_step_ms_median": round(float(np.median(full_part)), 3)}
            print(json.dumps({f"{c}/{legs}": out["rows"][f"{c}/{legs}"]}), flush=True)
    return out


def equal_weight_settings(legs: tuple[str, ...]) -> dict[str, Any]:
    """Every no-label candidate: equal weights, each method of the fitting grid, depth 100 / 200,
    full-score off / on."""
    from retriever.fusion import RRF, Linear
    from retriever.fusion_fit import FitGrid

    g = FitGrid()
    out: dict[str, Any] = {}
    for d in g.depths:
        for full in g.full_score:
            tag = f"@{d}{'+full' if full else ''}"
            dd = {n: d for n in legs}
            for k in g.rrf_k:
                out[f"rrf{int(k)}{tag}"] = RRF(k=k, depths=dd, full_score=full)
            for n in g.norms:
                out[f"{n}{tag}"] = Linear(n, depths=dd, full_score=full)
    for leg in legs:
        out[f"only:{leg}"] = RRF(weights={n: float(n == leg) for n in legs}, depths={n: 100 for n in legs})
    return out


def defaults() -> dict[str, Any]:
    """The no-label default by measurement: every equal-weight candidate on the judged (test)
    queries of all four collections, two and three legs. Rule: the best mean nDCG@10 over the eight
    (collection, legs) cases among candidates that reach the best single leg on every case and
    cost no more per query than the old default (depth 100, no full scoring)."""
    from retriever import Retriever
    from retriever.fusion_fit import collect, evaluate_settings

    table: dict[str, dict[str, float]] = {}
    for legs in LEG_SETS:
        cands = equal_weight_settings(LEG_SETS[legs])
        for c in COLLECTIONS:
            r = Retriever.open(index_for(c, legs), n_threads=2)
            queries, qrels, qids, dense, sparse = split_queries(c, "test")
            data = collect(r, queries, qrels, qids, max_depth=200, k=100, cutoff=10, query_vectors=dense,
                           sparse_vectors=sparse)
            _, v = evaluate_settings(data, None, "ndcg@10", extra=list(cands.values()))
            for name, row in zip(cands, v):
                table.setdefault(name.replace(":", "-") if name.startswith("only") else name, {})[f"{c}/{legs}"] = \
                    round(float(row.mean()), 4)
            print(c, legs, flush=True)
    cases = sorted({case for row in table.values() for case in row})
    singles = {case: max(row[case] for n, row in table.items() if n.startswith("only") and case in row)
               for case in cases}
    ok = {n: row for n, row in table.items() if not n.startswith("only")
          and len(row) == len(cases) and all(row[c] >= singles[c] for c in cases)}
    mean = {n: round(float(np.mean(list(row.values()))), 4) for n, row in table.items() if len(row) == len(cases)}
    cheap = [n for n in ok if n.endswith("@100")]  # depth 100, no "+full"
    chosen = max(cheap, key=lambda n: mean[n]) if cheap else None
    quality_winner = max(ok, key=lambda n: mean[n]) if ok else None
    return {"rule": " ".join(defaults.__doc__.split("Rule: ")[1].split()), "cases": cases, "best_single_leg": singles,
            "table": table, "mean": mean, "eligible": sorted(ok), "chosen": chosen,
            "quality_winner_any_cost": quality_winner,
            "chosen_setting": equal_weight_settings(LEG_SETS["3leg"])[chosen].to_dict() if chosen else None}


def markdown(quality_json: Path, cost_json: Path | None = None) -> str:  # noqa: C901
    """The HISTORY.md tables of the results files."""
    q = json.loads(quality_json.read_text())
    names = ["rrf60", "minmax", "zscore", "dbsf", "tmm", "theoretical", "rrf60+full", "minmax+full", "dbsf+full",
             "tmm+full", "theoretical+full"]
    lines = ["| collection / legs | fit split (queries) | fitted, CV | default, CV | best fixed (CV) | "
             + " | ".join(names) + " | single legs |", "|---" * (6 + len(names)) + "|"]
    for key, row in q["collections"].items():
        fx = row["fixed"]
        singles = ", ".join(f"{n[5:]} {v['cv']:.4f}" for n, v in fx.items() if n.startswith("only:"))
        lines.append(f"| {key} | {row['fit_split']} ({row['n_queries']}) | {row['fitted_cv']['mean']:.4f} ± "
                     f"{row['fitted_cv']['std']:.4f} | {row['default_cv']['mean']:.4f} ± {row['default_cv']['std']:.4f} | "
                     f"{row['best_fixed']} {fx[row['best_fixed']]['cv']:.4f} | "
                     + " | ".join(f"{fx[n]['cv']:.4f}" for n in names) + f" | {singles} |")
    out = "\n".join(lines)
    if all("nested_cv" in row for row in q["collections"].values()):  # the selection rules (second pass)
        rows = ["| collection / legs | fitted (smooth), CV | lcb, CV | argmax, CV | nested, CV | smooth without gap | "
                "best fixed, hindsight | fixed chosen on train folds | 10 shuffles: smooth / lcb / fixed chosen |",
                "|---" * 9 + "|"]
        for key, row in q["collections"].items():
            n, rc, rep10 = row["nested_cv"], row["rules_cv"], row["nested_cv"]["repeated_cv"]
            rows.append(f"| {key} | {row['fitted_cv']['mean']:.4f} ± {row['fitted_cv']['std']:.4f} | {rc['lcb']:.4f} | "
                        f"{rc['argmax']:.4f} | {n['mean']:.4f} | {n['rules_cv_without_gap']['smooth']:.4f} | "
                        f"{row['best_fixed']} {row['fixed'][row['best_fixed']]['cv']:.4f} | "
                        f"{n['fixed_method_selected_cv']:.4f} | {rep10['smooth']['mean']:.4f} / {rep10['lcb']['mean']:.4f}"
                        f" / {rep10['fixed_method_selected']['mean']:.4f} |")
        out += "\n\n" + "\n".join(rows)
    if cost_json is not None and cost_json.is_file():
        c = json.loads(cost_json.read_text())
        rows = ["| collection / legs | minmax ms/q | minmax+full ms/q | added | rrf60 ms/q | rrf60+full ms/q | added | "
                "full-score step (median ms) |", "|---" * 8 + "|"]
        for key, r in c["rows"].items():
            m = r["ms_per_query"]
            rows.append(f"| {key} | {m['minmax']:.2f} | {m['minmax+full']:.2f} | {r['added_ms_minmax']:+.2f} | "
                        f"{m['rrf60']:.2f} | {m['rrf60+full']:.2f} | {r['added_ms_rrf']:+.2f} | "
                        f"{r['full_score_step_ms_median']:.2f} |")
        out += "\n\n" + "\n".join(rows)
    return out


# --- Fourth pass (issue 24): real models instead of more grid points, measured on CV only ------------
#
# Everything below re-fuses the cached leg runs (``data_*.npz``) and per-setting values
# (``values_*.npz``) of ``quality --no-test``; nothing reads the SciFact test split.

MODEL_CONFIGS = ((100, False), (100, True), (200, False), (200, True))
#: per-leg features of the combined-normalisation model: normalised scores under two normalisations,
#: the same times the leg's per-query gap factor g (Linear.gap_power = 1), the leg's reciprocal rank
#: (k + 1) / (k + rank) with k = 60 (1.0 at rank 1, 0 when absent) and, without full scoring, a presence
#: indicator (1 when the leg returned the candidate)
COMBINED_FEATURES = ("zscore", "theoretical", "rrf", "zscore_g", "theoretical_g", "present")
SMALL_FEATURES = ("zscore_g", "theoretical_g", "rrf")


def _ndcg_kernel():
    """numba kernels (compiled on first use): nDCG@c of ``base + delta * x`` per query, ties to the
    earlier column (the smaller ordinal, as the engine and ``fusion_fit._per_query_metric``), and
    the ListNet top-1 cross-entropy with its gradient."""
    import numba as nb

    @nb.njit(nogil=True)
    def listnet(w, X, present, p, grad):  # pragma: no cover (compiled)
        F, nq, width = X.shape
        loss = 0.0
        for f in range(F):
            grad[f] = 0.0
        s = np.empty(width)
        for q in range(nq):
            mx = -np.inf
            for u in range(width):
                if present[q, u]:
                    t = 0.0
                    for f in range(F):
                        t += w[f] * X[f, q, u]
                    s[u] = t
                    mx = max(mx, t)
            z = 0.0
            for u in range(width):
                if present[q, u]:
                    z += np.exp(s[u] - mx)
            lz = np.log(z)
            for u in range(width):
                if present[q, u]:
                    lp = s[u] - mx - lz
                    if p[q, u] > 0:
                        loss -= p[q, u] * lp
                    d = np.exp(lp) - p[q, u]
                    for f in range(F):
                        grad[f] += d * X[f, q, u]
        for f in range(F):
            grad[f] /= nq
        return loss / nq

    from retriever.fusion_fit import ndcg_kernel

    return ndcg_kernel(), listnet


class _Case:
    """One (collection, legs) case: its FitData, the grid's per-setting values and the smooth rule."""

    def __init__(self, c: str, legs: str) -> None:
        from retriever.fusion import fusion_from_dict
        from retriever.fusion_fit import FitGrid, chooser

        self.collection = c
        self.data = load_data(CACHE / f"data_{c}_{legs}.npz")
        with np.load(CACHE / f"values_{c}_{legs}.npz") as z:
            values, names = z["values"], [json.loads(x) for x in z["names"]]
        n_extra = 1 + len(fixed_settings(LEG_SETS[legs]))
        self.settings = [fusion_from_dict(d) for d in names[n_extra:]]
        self.values = values[n_extra:]
        self.pick = chooser("smooth", self.values, self.settings, self.data.legs, FitGrid().weight_steps)
        self.n = len(self.data.qids)
        d = self.data
        self.idcg = d.ideal[:, :10] @ (1.0 / np.log2(np.arange(2, d.ideal[:, :10].shape[1] + 2)))
        self._parts: dict[tuple[int, bool], Any] = {}
        self._feats: dict[tuple, Any] = {}
        self.ndcg_rows, self.listnet = _KERNELS()

    def deep_ideal(self, cutoff: int) -> Any:
        """The case's FitData with the ideal gains to ``cutoff`` (the cached runs hold 10), from the
        qrels of the split it was collected on (SciFact: train)."""
        import dataclasses

        from retriever.index.readers import read_qrels
        from tests.regression import golden_cases as G

        qrels = read_qrels(G.DATA / self.collection / ("qrels_train.tsv" if self.collection == "scifact" else "qrels.tsv"))
        ideal = np.zeros((self.n, cutoff))
        for i, q in enumerate(self.data.qids):
            g = sorted((max(int(v), 0) for v in qrels[q].values()), reverse=True)[:cutoff]
            ideal[i, :len(g)] = g
        assert np.array_equal(ideal[:, :self.data.ideal.shape[1]], self.data.ideal)
        return dataclasses.replace(self.data, ideal=ideal)

    def parts(self, depth: int, full: bool) -> Any:
        """``fusion_fit._contributions`` of a (depth, full-score) configuration, cached."""
        from retriever.fusion_fit import _contributions

        key = (int(depth), bool(full))
        if key not in self._parts:
            self._parts[key] = _contributions(self.data, key[0], key[1], ("minmax", "zscore", "dbsf", "tmm",
                                                                          "theoretical"), ())
        return self._parts[key]

    def features(self, depth: int, full: bool, feats: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, list]:
        """``(X float64 (F, nq, U), present bool (nq, U), [(leg, feature)])`` (COMBINED_FEATURES)."""
        key = (depth, full, feats)
        if key not in self._feats:
            from retriever.fusion_fit import combined_features

            self._feats[key] = combined_features(self.data, depth, full, feats)
        return self._feats[key]

    def ndcg(self, X: np.ndarray, present: np.ndarray, w: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Per-query nDCG@10 of the linear score ``w · X`` on ``rows``."""
        total = np.tensordot(w, X[:, rows], axes=1)
        return self.ndcg_rows(total, total, 0.0, np.ascontiguousarray(present[rows]),
                              np.ascontiguousarray(self.data.gains[rows]), self.idcg[rows], 10, np.empty(len(rows)))

    def setting_ndcg(self, s: Any, w: np.ndarray) -> np.ndarray:
        """Per-query nDCG@10 (all queries) of grid setting ``s`` with the per-leg weights ``w``
        (any real values, not only the grid's)."""
        from retriever.fusion import RRF

        present, normed, ranks, gaps = self.parts(int(next(iter(s.depths.values()))), bool(s.full_score))
        total = np.zeros(present.shape)
        for li, leg in enumerate(self.data.legs):
            if isinstance(s, RRF):
                total += np.where(ranks[li] > 0, w[li] / (s.k_of(leg) + np.maximum(ranks[li], 1)), 0.0)
            else:
                wq = w[li] * gaps[li] ** s.gap_power if s.gap_power else np.full(len(gaps[li]), w[li])
                total += wq[:, None] * normed[s.norm][li]
        return self.ndcg_rows(total, total, 0.0, present, self.data.gains, self.idcg, 10, np.empty(self.n))


_KERNEL_CACHE: list[Any] = []


def _KERNELS() -> Any:
    if not _KERNEL_CACHE:
        _KERNEL_CACHE.append(_ndcg_kernel())
    return _KERNEL_CACHE[0]


def coordinate_ascent(case: _Case, X: np.ndarray, present: np.ndarray, rows: np.ndarray, w0: np.ndarray,
                      steps: tuple[float, ...] = (-0.5, -0.2, -0.1, -0.05, 0.05, 0.1, 0.2, 0.5),
                      passes: int = 4) -> tuple[np.ndarray, float]:
    """:func:`retriever.fusion_fit.coordinate_ascent` on a case's data."""
    from retriever.fusion_fit import coordinate_ascent as ca

    return ca(X, present, case.data.gains, case.idcg, rows, w0, steps=steps, passes=passes)


def listwise(case: _Case, X: np.ndarray, present: np.ndarray, rows: np.ndarray, lam: float, w0: np.ndarray
             ) -> np.ndarray:
    """ListNet top-1 cross-entropy (Cao et al., ICML 2007) of the linear score over the candidates,
    target distribution the grades, plus ``lam · ||w − w0||²``; L-BFGS (scipy). Queries without a
    judged candidate are left out."""
    from scipy.optimize import minimize

    pr = present[rows]
    g = case.data.gains[rows] * pr
    tot = g.sum(axis=1)
    keep = tot > 0
    Xr = np.ascontiguousarray(X[:, rows][:, keep])
    pr = np.ascontiguousarray(pr[keep])
    p = np.ascontiguousarray(g[keep] / tot[keep][:, None])
    grad = np.empty(len(w0))

    def f(w: np.ndarray) -> tuple[float, np.ndarray]:
        loss = case.listnet(w, Xr, pr, p, grad)
        return loss + lam * float(((w - w0) ** 2).sum()), grad + 2 * lam * (w - w0)

    return minimize(f, np.asarray(w0, float), jac=True, method="L-BFGS-B", options={"maxiter": 200}).x


def _weights_of(s: Any, legs: list[str]) -> np.ndarray:
    w = np.array([float(s.weights.get(n, 1.0)) for n in legs])
    return w / w.sum()


def _start(names: list, kind: str) -> np.ndarray:
    return np.array([1.0 if f == kind else 0.0 for _, f in names])


def model_procedures() -> dict[str, Any]:
    """``name -> fit(case, train rows) -> per-query nDCG@10 of all queries`` for every procedure of
    the fourth pass (HISTORY "Fusion fitting, fourth pass")."""

    def smooth(case: _Case, tr: np.ndarray) -> np.ndarray:
        return case.values[case.pick(tr)]

    def shrink(case: _Case, tr: np.ndarray, lams: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)) -> np.ndarray:
        # (b) the smooth pick's weights moved toward equal weights, (1 − λ) w* + λ / L, λ by inner 5-fold CV
        L = len(case.data.legs)
        score: dict[float, list[float]] = {x: [] for x in lams}
        for p in folds_of(len(tr), 5, 1):
            itr, ite = np.delete(tr, p), tr[p]
            s = case.settings[case.pick(itr)]
            w = _weights_of(s, case.data.legs)
            for x in lams:
                score[x].append(float(case.setting_ndcg(s, (1 - x) * w + x / L)[ite].mean()))
        lam = max(lams, key=lambda x: (np.mean(score[x]), -x))
        s = case.settings[case.pick(tr)]
        return case.setting_ndcg(s, (1 - lam) * _weights_of(s, case.data.legs) + lam / L)

    def bag(case: _Case, tr: np.ndarray, b: int = 25) -> np.ndarray:
        # (c) the smooth pick on b bootstrap resamples; the most frequent configuration (everything
        # but the weights), its picks' weights averaged
        rng = np.random.default_rng(0)
        picks = [case.settings[case.pick(rng.choice(tr, size=len(tr), replace=True))] for _ in range(b)]
        keys = [json.dumps({k: v for k, v in s.to_dict().items() if k != "weights"}, sort_keys=True) for s in picks]
        vals, counts = np.unique(keys, return_counts=True)
        chosen = [s for s, k in zip(picks, keys) if k == vals[np.argmax(counts)]]
        return case.setting_ndcg(chosen[0], np.mean([_weights_of(s, case.data.legs) for s in chosen], axis=0))

    def ca(feats: tuple[str, ...]) -> Any:
        # (a) combined normalisations, coordinate ascent from equal z-score·g weights in each of the
        # four configurations; the best training nDCG@10 wins
        def fit(case: _Case, tr: np.ndarray) -> np.ndarray:
            best = None
            for cfg in MODEL_CONFIGS:
                X, present, names = case.features(*cfg, feats)
                w, m = coordinate_ascent(case, X, present, tr, _start(names, "zscore_g"))
                if best is None or m > best[0]:
                    best = (m, X, present, w)
            _, X, present, w = best
            return case.ndcg(X, present, w, np.arange(case.n))
        return fit

    def ca_from_smooth(case: _Case, tr: np.ndarray) -> np.ndarray:
        # (a') coordinate ascent started at the smooth pick (its own per-leg columns), in its configuration
        from retriever.fusion import RRF

        s = case.settings[case.pick(tr)]
        cfg = (int(next(iter(s.depths.values()))), bool(s.full_score))
        X2, present, names = case.features(*cfg, COMBINED_FEATURES)
        _, normed, ranks, gaps = case.parts(*cfg)
        ws = _weights_of(s, case.data.legs)
        cols, w0 = [], []
        for li, leg in enumerate(case.data.legs):
            if isinstance(s, RRF):
                k = s.k_of(leg)
                cols.append(np.where(ranks[li] > 0, (k + 1) / (k + np.maximum(ranks[li], 1)), 0.0))
                w0.append(ws[li] / (k + 1))
            else:
                cols.append(normed[s.norm][li] * (gaps[li][:, None] ** s.gap_power if s.gap_power else 1.0))
                w0.append(ws[li])
        X = np.concatenate([np.where(present, np.stack(cols), 0.0), X2])
        w, _ = coordinate_ascent(case, X, present, tr, np.concatenate([w0, np.zeros(len(X2))]),
                                 steps=(-0.2, -0.1, -0.05, -0.02, 0.02, 0.05, 0.1, 0.2))
        return case.ndcg(X, present, w, np.arange(case.n))

    def lw(lam: float) -> Any:
        # (a'') the same features, ListNet loss with L2 toward equal z-score·g, full scoring (depth
        # 100 / 200, the better training nDCG@10)
        def fit(case: _Case, tr: np.ndarray) -> np.ndarray:
            best = None
            for cfg in ((100, True), (200, True)):
                X, present, names = case.features(*cfg, COMBINED_FEATURES)
                w = listwise(case, X, present, tr, lam, _start(names, "zscore_g"))
                m = float(case.ndcg(X, present, w, tr).mean())
                if best is None or m > best[0]:
                    best = (m, X, present, w)
            _, X, present, w = best
            return case.ndcg(X, present, w, np.arange(case.n))
        return fit

    def lib(per_leg_depth: bool, surrogate: int | None = None) -> Any:
        # fifth pass: the library's fit_combined (rules "combined" / "combined_depths" / "combined_depths_mix":
        # per-leg depths under full scoring, the objective's surrogate nDCG@20), features cached per case
        def fit(case: _Case, tr: np.ndarray) -> np.ndarray:
            from retriever.fusion_fit import FitGrid, _config_of, combined_values, fit_combined

            cache = case.__dict__.setdefault("_lib_cache", {})
            data = case.data if surrogate is None else case.deep_ideal(surrogate)
            s, _ = fit_combined(data, tr, FitGrid(), 10, cache, per_leg_depth=per_leg_depth, surrogate_cutoff=surrogate)
            return combined_values(case.data, s, *cache[_config_of(s, case.data.legs)])
        return fit

    return {"smooth": smooth, "shrink": shrink, "bag": bag, "ca": ca(COMBINED_FEATURES), "ca_small": ca(SMALL_FEATURES),
            "ca_from_smooth": ca_from_smooth, "listwise0.1": lw(0.1), "listwise0.03": lw(0.03),
            "combined": lib(False), "combined_depths": lib(True), "combined_mix": lib(False, 20),
            "combined_depths_mix": lib(True, 20)}


def models(only: list[str], procs: list[str], seeds: int) -> dict[str, Any]:
    """5-fold CV (fold shuffles ``0 .. seeds − 1``) of each procedure of :func:`model_procedures`:
    per case and seed the mean over folds of the held-out fold's nDCG@10."""
    table = model_procedures()
    out: dict[str, Any] = {"seeds": seeds, "folds": 5, "metric": "ndcg@10", "collections": {}}
    for c in only:
        for legs in LEG_SETS:
            t0 = time.perf_counter()
            case = _Case(c, legs)
            per: dict[str, list[float]] = {p: [] for p in procs}
            for seed in range(seeds):
                for p in procs:
                    per[p].append(float(np.mean([table[p](case, np.setdiff1d(np.arange(case.n), f))[f].mean()
                                                 for f in folds_of(case.n, 5, seed)])))
            out["collections"][f"{c}/{legs}"] = {
                p: {"seed0": round(v[0], 4), "mean": round(float(np.mean(v)), 4),
                    "range": [round(min(v), 4), round(max(v), 4)], "per_seed": [round(x, 4) for x in v]}
                for p, v in per.items()} | {"seconds": round(time.perf_counter() - t0, 1)}
            print(json.dumps({f"{c}/{legs}": {p: out["collections"][f"{c}/{legs}"][p]["mean"] for p in procs}}),
                  flush=True)
    return out


def combined_test(rule: str = "combined") -> dict[str, Any]:
    """SciFact, a combined rule (``"combined"``, ``"combined_depths"``, ``"combined_depths_mix"``;
    :func:`retriever.fusion_fit.fit_combined`):
    fitted on the train split (5-fold CV on train reported), then evaluated once on test with a real
    search (pytrec_eval), two and three legs."""
    from retriever import Retriever
    from retriever.fusion_fit import fit_fusion

    out: dict[str, Any] = {"rule": rule, "collections": {}}
    for legs in LEG_SETS:
        t0 = time.perf_counter()
        r = Retriever.open(index_for("scifact", legs), n_threads=2)
        queries, qrels, qids, dense, sparse = split_queries("scifact", "train")
        rep = fit_fusion(r, queries, qrels, rule=rule, split="train", k=100, query_vectors=dense,
                         sparse_vectors=sparse)
        tq, tr, tids, td, ts = split_queries("scifact", "test")
        row = {"fit_split": "train", "n_queries": len(qids), "cv_train": {"mean": round(rep.cv["mean"], 4),
               "std": round(rep.cv["std"], 4), "folds": [round(x, 4) for x in rep.cv["folds"]]},
               "train_in_sample": round(rep.train_score, 4), "setting": rep.setting.to_dict(),
               "test": real_eval(r, tq, tr, tids, td, ts, rep.setting), "seconds": round(time.perf_counter() - t0, 1)}
        out["collections"][f"scifact/{legs}"] = row
        print(json.dumps({f"scifact/{legs}": row}), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("quality", "cost", "defaults", "nested", "markdown", "models", "combined-test"))
    ap.add_argument("--only", action="append", choices=COLLECTIONS)
    ap.add_argument("--no-test", action="store_true",
                    help="quality: skip the SciFact test evaluation (development on train / CV only)")
    ap.add_argument("--procs", default="smooth,shrink,bag,ca,ca_small,ca_from_smooth,listwise0.1,listwise0.03",
                    help="models: comma-separated procedures (model_procedures)")
    ap.add_argument("--seeds", type=int, default=10, help="models: fold shuffles 0 .. N-1")
    ap.add_argument("--rule", default="combined", choices=("combined", "combined_depths", "combined_depths_mix"),
                    help="combined-test: the fit rule (fitted on SciFact train, evaluated once on test)")
    ap.add_argument("--out", default=None, help="results json (default results/fusion_fit.json or fusion_full_score.json)")
    args = ap.parse_args(argv)
    only = args.only or list(COLLECTIONS)
    if args.what == "markdown":
        print(markdown(RESULTS / "fusion_fit.json", RESULTS / "fusion_full_score.json"))
        return 0
    t0 = time.perf_counter()
    if args.what == "combined-test":  # once: fit on SciFact train, evaluate on test
        rep = combined_test(args.rule)
        rep["command"] = "python -m benchmarks.fusion_fit combined-test" + (
            f" --rule {args.rule}" if args.rule != "combined" else "")
        rep["seconds"] = round(time.perf_counter() - t0, 1)
        path = Path(args.out) if args.out else RESULTS / "fusion_combined_test.json"
        path.write_text(json.dumps(rep, indent=1) + "\n")
        print(f"wrote {path}")
        return 0
    if args.what == "models":  # CV only, from the cached leg runs of `quality --no-test`
        path = Path(args.out) if args.out else RESULTS / "fusion_models.json"
        res = json.loads(path.read_text()) if path.is_file() else {"collections": {}}
        rep = models(only, args.procs.split(","), args.seeds)
        for key, row in rep["collections"].items():
            res["collections"].setdefault(key, {}).update(row)
        res.update({k: v for k, v in rep.items() if k != "collections"})
        res.setdefault("commands", []).append(f"python -m benchmarks.fusion_fit models --procs {args.procs} "
                                              f"--seeds {args.seeds}" + "".join(f" --only {c}" for c in args.only or []))
        path.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {path}")
        return 0
    if args.what == "nested":  # added to the quality results file, beside the figures it was computed from
        path = Path(args.out) if args.out else RESULTS / "fusion_fit.json"
        res = json.loads(path.read_text())
        nest = nested(only)
        for key, row in nest["collections"].items():
            res["collections"][key]["nested_cv"] = row
        res["nested_command"] = "python -m benchmarks.fusion_fit nested" + "".join(f" --only {c}" for c in args.only or [])
        path.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {path}")
        return 0
    rep = quality(only, test=not args.no_test) if args.what == "quality" else cost(only) if args.what == "cost" else defaults()
    rep["command"] = f"python -m benchmarks.fusion_fit {args.what}" + "".join(f" --only {c}" for c in args.only or [])
    rep["seconds"] = round(time.perf_counter() - t0, 1)
    path = Path(args.out) if args.out else RESULTS / {"quality": "fusion_fit.json", "cost": "fusion_full_score.json",
                                                      "defaults": "fusion_defaults.json"}[args.what]
    if path.is_file() and args.only and args.what != "defaults":
        old = json.loads(path.read_text())
        key = "collections" if args.what == "quality" else "rows"
        rep[key] = {**old.get(key, {}), **rep[key]}
    path.write_text(json.dumps(rep, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
