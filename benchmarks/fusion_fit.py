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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("quality", "cost", "defaults", "nested", "markdown"))
    ap.add_argument("--only", action="append", choices=COLLECTIONS)
    ap.add_argument("--no-test", action="store_true",
                    help="quality: skip the SciFact test evaluation (development on train / CV only)")
    ap.add_argument("--out", default=None, help="results json (default results/fusion_fit.json or fusion_full_score.json)")
    args = ap.parse_args(argv)
    only = args.only or list(COLLECTIONS)
    if args.what == "markdown":
        print(markdown(RESULTS / "fusion_fit.json", RESULTS / "fusion_full_score.json"))
        return 0
    t0 = time.perf_counter()
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
