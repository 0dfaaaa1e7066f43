"""BM25 query and indexing throughput: this engine vs bm25s (Lucene method) vs rank-bm25.

Same run, same settings for every engine: lower-casing, English stop words (Lucene's 33), Porter
stemming, k1 = 0.9, b = 0.4, top-10, one thread (plus this engine on two threads).
Collections: SciFact (../shared/data/scifact, 300 queries) and a seeded synthetic corpus
(benchmarks/datasets.py: 1,000,000 documents, Zipfian vocabulary of ~1M terms, mean length 60,
queries of 2–10 terms). rank-bm25 is scored on a sample of queries (it scores every document).
Also checks that this engine's pruned top-10 equals exhaustive scoring for every query.

Usage:
    python -m benchmarks.bench_bm25                 # SciFact + 1M synthetic (several minutes)
    python -m benchmarks.bench_bm25 --quick         # SciFact + 100k synthetic
Writes benchmarks/results/bm25.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.datasets import TextCollection, beir, synthetic_bm25
from benchmarks.timing import machine, qps, timed_runs

RESULTS = Path(__file__).resolve().parent / "results"


def bench_ours(col: TextCollection, tmp: Path, repeats: int) -> dict:
    from retriever import Retriever, build_index

    out = tmp / col.name
    t0 = time.perf_counter()
    build_index(col.docs(), out, legs=("bm25",), show_progress=False, shard_size=10_000_000,
                batch_size=8192)
    build_s = time.perf_counter() - t0
    r = Retriever.open(out)
    qs = col.queries
    res = {"index_seconds": build_s, "index_docs_per_s": col.n_docs / build_s}
    # Exactness: pruned top-10 == exhaustive top-10 for every query (ids and scores).
    exh = r.search_arrays(qs, k=10, mode="bm25", n_threads=1, leg_params={"bm25": {"algorithm": "exhaustive"}})
    for algo in ("maxscore", "bmw"):
        got = r.search_arrays(qs, k=10, mode="bm25", n_threads=1, leg_params={"bm25": {"algorithm": algo}})
        same = bool(np.array_equal(got.ids, exh.ids) and np.array_equal(got.scores, exh.scores))
        res[f"{algo}_equals_exhaustive"] = same
    leg = r.engine.legs["bm25"]
    batch = leg.query_terms(qs)
    for algo in ("exhaustive", "maxscore", "bmw"):
        for threads in (1, 2):
            if threads == 2 and algo == "exhaustive":
                continue
            secs = timed_runs(lambda: leg.search(batch, 10, threads, algorithm=algo), repeats)
            res[f"kernel_{algo}_t{threads}"] = qps(len(qs), secs)
    secs = timed_runs(lambda: r.search_arrays(qs, k=10, mode="bm25", n_threads=1), repeats)
    res["end_to_end_t1"] = qps(len(qs), secs)
    secs = timed_runs(lambda: r.search_arrays(qs, k=10, mode="bm25", n_threads=2), repeats)
    res["end_to_end_t2"] = qps(len(qs), secs)
    secs = timed_runs(lambda: leg.query_terms(qs), repeats)
    res["analysis_qps"] = qps(len(qs), secs)
    res["bytes_on_disk"] = r.info()["bytes_on_disk"]
    return res


def bench_bm25s(col: TextCollection, repeats: int) -> dict:
    import bm25s
    import Stemmer

    from index.analyzer import LUCENE_ENGLISH_STOP_WORDS

    stem = Stemmer.Stemmer("porter")
    stop = sorted(LUCENE_ENGLISH_STOP_WORDS)
    texts = [f"{d.get('title', '')} {d['text']}" for d in col.docs()]
    t0 = time.perf_counter()
    tok = bm25s.tokenize(texts, stopwords=stop, stemmer=stem, show_progress=False)
    model = bm25s.BM25(k1=0.9, b=0.4, method="lucene", backend="numba")
    model.index(tok, show_progress=False)
    build_s = time.perf_counter() - t0
    del texts
    res = {"index_seconds": build_s, "index_docs_per_s": col.n_docs / build_s}
    qtok = bm25s.tokenize(col.queries, stopwords=stop, stemmer=stem, show_progress=False,
                          return_ids=False)
    qtok = [q if q else ["__empty__"] for q in qtok]

    def run():
        model.retrieve(qtok, k=10, n_threads=1, show_progress=False)

    res["retrieve_t1"] = qps(len(col.queries), timed_runs(run, repeats))

    def run_with_tok():
        q = bm25s.tokenize(col.queries, stopwords=stop, stemmer=stem, show_progress=False, return_ids=False)
        model.retrieve([x if x else ["__empty__"] for x in q], k=10, n_threads=1, show_progress=False)

    res["end_to_end_t1"] = qps(len(col.queries), timed_runs(run_with_tok, repeats))
    return res


def bench_rank_bm25(col: TextCollection, n_sample: int) -> dict:
    from rank_bm25 import BM25Okapi

    from index.analyzer import Analyzer

    an = Analyzer()
    t0 = time.perf_counter()
    corpus = [an.analyze(f"{d.get('title', '')} {d['text']}") for d in col.docs()]
    model = BM25Okapi(corpus, k1=0.9, b=0.4)
    build_s = time.perf_counter() - t0
    del corpus
    sample = [an.analyze(q) for q in col.queries[:n_sample]]
    times = []
    for q in sample:
        t = time.perf_counter()
        s = model.get_scores(q)
        np.argpartition(-s, min(10, len(s) - 1))[:10]
        times.append(time.perf_counter() - t)
    return {"index_seconds": build_s, "index_docs_per_s": col.n_docs / build_s, "queries_sampled": len(sample),
            "qps_median": 1.0 / statistics.median(times)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k synthetic documents instead of 1M")
    ap.add_argument("--synthetic-docs", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-rank-bm25", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "bm25.json"))
    args = ap.parse_args(argv)
    n_syn = args.synthetic_docs or (100_000 if args.quick else 1_000_000)
    report = {"machine": machine(), "command": "python -m benchmarks.bench_bm25 " + " ".join(argv or sys.argv[1:]),
              "collections": {}}
    cols = [beir("scifact"), synthetic_bm25(n_syn)]
    with tempfile.TemporaryDirectory() as tmp:
        for col in cols:
            print(f"== {col.name}: {col.n_docs} docs, {len(col.queries)} queries", flush=True)
            entry = {"n_docs": col.n_docs, "n_queries": len(col.queries)}
            entry["retriever"] = bench_ours(col, Path(tmp), args.repeats)
            print(" retriever", json.dumps(entry["retriever"]), flush=True)
            entry["bm25s"] = bench_bm25s(col, args.repeats)
            print(" bm25s", json.dumps(entry["bm25s"]), flush=True)
            if not args.skip_rank_bm25:
                entry["rank_bm25"] = bench_rank_bm25(col, 50 if col.n_docs < 100_000 else 10)
                print(" rank_bm25", json.dumps(entry["rank_bm25"]), flush=True)
            ours = entry["retriever"]
            best_kernel = max(ours[f"kernel_{a}_t1"]["qps_median"] for a in ("maxscore", "bmw"))
            entry["ratios"] = {
                "vs_bm25s_end_to_end": ours["end_to_end_t1"]["qps_median"] / entry["bm25s"]["end_to_end_t1"]["qps_median"],
                "vs_bm25s_retrieve_only": best_kernel / entry["bm25s"]["retrieve_t1"]["qps_median"],
                "two_threads_vs_one": ours["end_to_end_t2"]["qps_median"] / ours["end_to_end_t1"]["qps_median"],
                "indexing_vs_bm25s": ours["index_docs_per_s"] / entry["bm25s"]["index_docs_per_s"],
            }
            if "rank_bm25" in entry:
                entry["ratios"]["vs_rank_bm25"] = ours["end_to_end_t1"]["qps_median"] / entry["rank_bm25"]["qps_median"]
            report["collections"][col.name] = entry
            print(" ratios", json.dumps(entry["ratios"]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(markdown(report))
    return 0


def markdown(report: dict) -> str:
    lines = ["| collection | engine | QPS (1 thread, top-10) | indexing docs/s |", "|---|---|---:|---:|"]
    for name, e in report["collections"].items():
        o = e["retriever"]
        lines.append(f"| {name} | retriever (end to end) | {o['end_to_end_t1']['qps_median']:,.0f} | {o['index_docs_per_s']:,.0f} |")
        lines.append(f"| {name} | retriever, 2 threads | {o['end_to_end_t2']['qps_median']:,.0f} | |")
        lines.append(f"| {name} | bm25s (numba, end to end) | {e['bm25s']['end_to_end_t1']['qps_median']:,.0f} | {e['bm25s']['index_docs_per_s']:,.0f} |")
        if "rank_bm25" in e:
            lines.append(f"| {name} | rank-bm25 ({e['rank_bm25']['queries_sampled']} queries) | {e['rank_bm25']['qps_median']:,.2f} | {e['rank_bm25']['index_docs_per_s']:,.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
