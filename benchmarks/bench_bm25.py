"""BM25 query and indexing throughput: this engine vs bm25s (Lucene method) vs rank-bm25.

Same run, same settings for every engine: lower-casing, English stop words (Lucene's 33), Porter
stemming, k1 = 0.9, b = 0.4, top-10, one thread (plus this engine on two threads).
Collections: SciFact (../shared/data/scifact, 300 queries) and a seeded synthetic corpus
(benchmarks/datasets.py: 1,000,000 documents, Zipfian vocabulary of ~1M terms, log-normal lengths
with mean 60, 1,000 queries of 2–10 terms, seed 42). rank-bm25 indexes the whole collection but is
timed on a sample of queries (the first 50; 20 from 100,000 documents up: it scores every
document in Python, about a second per query at 1M). Also checks that every pruning algorithm's
top-10 equals exhaustive scoring (ids and float32 scores) for every query.

"End to end" = query strings in, top-10 ids and scores out (analysis included) for this engine
(``Retriever.search_arrays(..., mode="bm25")``) and bm25s (``bm25s.tokenize`` + ``retrieve``);
"kernel" = this engine's compiled top-k alone on pre-analysed queries. Each figure is the median
of ``--repeats`` timed passes after one untimed pass; a pass repeats the query set for at least
``MIN_PASS_SECONDS`` (0.25 s). Two-thread figures come with the process's CPU-time / wall-time
ratio: near 1.0 means the second core was busy with other work. When this engine and bm25s run in
the same step, ``--rounds`` interleaved rounds (this engine on 1 thread, bm25s, this engine on 2
threads, one pass each) give the ratios the README quotes first: the median of the per-round
ratios, each taken between passes seconds apart (``head_to_head``).

Usage:
    python -m benchmarks.bench_bm25                          # SciFact + 1M synthetic (~15 min)
    python -m benchmarks.bench_bm25 --collections scifact    # one collection; merged into the JSON
    python -m benchmarks.bench_bm25 --quick                  # SciFact + 100k synthetic
    python -m benchmarks.bench_bm25 --collections synthetic --engines retriever   # a split run:
    python -m benchmarks.bench_bm25 --collections synthetic --engines bm25s       # steps back to back,
    python -m benchmarks.bench_bm25 --collections synthetic --engines rank_bm25   # one entry
Writes benchmarks/results/bm25.json (bm25_quick.json with --quick), adding or replacing the
collections it ran (each with its command, machine, date and load), and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from benchmarks.datasets import TextCollection, beir, synthetic_bm25
from benchmarks.timing import machine, qps, timed_pass, timed_runs
from retriever.engine import search_leg
from retriever.legs.base import SearchContext
from retriever.legs.bm25 import BM25Prepared

RESULTS = Path(__file__).resolve().parent / "results"


ALGORITHMS = ("exhaustive", "maxscore", "bmw", "bmm", "auto")


#: every timed pass of a fast engine repeats the query set for at least this long (seconds)
MIN_PASS_SECONDS = 0.25


def _timed_cpu(fn, repeats: int) -> tuple[list[float], float]:
    """Wall seconds per call in each timed pass (after one untimed call; a pass repeats ``fn`` for
    at least :data:`MIN_PASS_SECONDS` after a ``gc.collect()``) and the median CPU/wall ratio."""
    fn()
    walls, ratios = [], []
    for _ in range(repeats):
        gc.collect()  # as timing.timed_runs
        w, r = timed_pass(fn, MIN_PASS_SECONDS)
        walls.append(w)
        ratios.append(r)
    return walls, statistics.median(ratios)


def head_to_head(n_queries: int, runners: dict[str, Callable[[], object]], rounds: int) -> dict:
    """Interleaved timing: each round times one pass (>= :data:`MIN_PASS_SECONDS`) of every runner
    in turn, so all of a round's figures share the machine's state of that moment; the ratios are
    taken within each round and their median reported. On a shared machine whose speed drifts by
    1.5x within minutes this is the figure to quote; the per-engine medians above are from
    passes minutes apart."""
    for fn in runners.values():
        fn()
    per: dict[str, list[float]] = {name: [] for name in runners}
    gc_ms: dict[str, list[float]] = {name: [] for name in runners}
    started: list[float] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            spent[0] += time.perf_counter() - started.pop()

    spent = [0.0]
    gc.callbacks.append(on_gc)
    try:
        for _ in range(rounds):
            for name, fn in runners.items():
                gc.collect()
                spent[0] = 0.0
                per[name].append(n_queries / timed_runs(fn, 1, 0, MIN_PASS_SECONDS, collect=False)[0])
                gc_ms[name].append(round(spent[0] * 1e3, 2))
    finally:
        gc.callbacks.remove(on_gc)
    # gc_ms: garbage-collector time inside each pass (the gc.collect() before it excluded)
    out: dict = {"rounds": rounds, "qps": per, "gc_ms": gc_ms}
    ours = per["retriever_t1"]
    out["vs_bm25s_end_to_end"] = [a / b for a, b in zip(ours, per["bm25s"])]
    out["two_threads_vs_one"] = [a / b for a, b in zip(per["retriever_t2"], ours)]
    out["vs_bm25s_end_to_end_median"] = statistics.median(out["vs_bm25s_end_to_end"])
    out["two_threads_vs_one_median"] = statistics.median(out["two_threads_vs_one"])
    return out


def bench_ours(col: TextCollection, tmp: Path, repeats: int, keep: dict | None = None) -> dict:
    from retriever import Retriever, build_index

    out = tmp / col.name
    t0 = time.perf_counter()
    build_index(col.docs(), out, legs=("bm25",), show_progress=False, shard_size=10_000_000,
                batch_size=8192)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = Retriever.open(out)
    open_s = time.perf_counter() - t0
    qs = col.queries
    res = {"index_seconds": build_s, "index_docs_per_s": col.n_docs / build_s, "open_seconds": open_s}
    # One-time fill of the safe-initial-threshold cache (k-th single-term scores at depth 10) for
    # the benchmark's query terms; every later (and every timed) search reuses it.
    leg = r.engine.legs["bm25"]
    terms = leg.query_terms(qs)[1]
    t0 = time.perf_counter()
    for ks in leg.kernel_shards:
        leg._term_kth(ks, terms[terms < ks["n_terms"]], 10, 1)
    res["term_kth_fill_seconds"] = time.perf_counter() - t0
    res["term_kth_bytes"] = int(sum(a.nbytes for ks in leg.kernel_shards for a in ks["kth"].values()))
    # Exactness: every algorithm's top-10 == exhaustive top-10 for every query (ids and scores).
    exh = r.search_arrays(qs, k=10, mode="bm25", n_threads=1, leg_params={"bm25": {"algorithm": "exhaustive"}})
    for algo in ALGORITHMS[1:]:
        got = r.search_arrays(qs, k=10, mode="bm25", n_threads=1, leg_params={"bm25": {"algorithm": algo}})
        same = (got.ids == exh.ids).all(axis=1) & (got.scores == exh.scores).all(axis=1)
        res[f"{algo}_equals_exhaustive"] = bool(same.all())
        res[f"{algo}_queries_differing"] = int((~same).sum())
    batch = leg.query_terms(qs)
    res["impacts_bytes_per_posting"] = sum(ks["impacts"].nbytes for ks in leg.kernel_shards) / max(
        1, sum(len(ks["doc_ids"]) for ks in leg.kernel_shards))
    res["postings"] = int(sum(len(ks["doc_ids"]) for ks in leg.kernel_shards))
    def kernel(algo: str, threads: int):  # the engine's shard loop over an analysed batch
        prep = BM25Prepared(list(qs), algo, leg.kernel_shards, batch, None)
        return lambda: search_leg(leg, prep, SearchContext(depth=10, n_threads=threads))

    for algo in ALGORITHMS:
        secs = timed_runs(kernel(algo, 1), repeats, min_seconds=MIN_PASS_SECONDS)
        res[f"kernel_{algo}_t1"] = qps(len(qs), secs)
    for algo in ("auto", "maxscore"):
        secs, ratio = _timed_cpu(kernel(algo, 2), repeats)
        res[f"kernel_{algo}_t2"] = {**qps(len(qs), secs), "cpu_per_wall": ratio}
    secs = timed_runs(lambda: r.search_arrays(qs, k=10, mode="bm25", n_threads=1), repeats,
                      min_seconds=MIN_PASS_SECONDS)
    res["end_to_end_t1"] = qps(len(qs), secs)
    secs, ratio = _timed_cpu(lambda: r.search_arrays(qs, k=10, mode="bm25", n_threads=2), repeats)
    res["end_to_end_t2"] = {**qps(len(qs), secs), "cpu_per_wall": ratio}
    secs = timed_runs(lambda: leg.query_terms(qs), repeats, min_seconds=MIN_PASS_SECONDS)
    res["analysis_qps"] = qps(len(qs), secs)
    if keep is not None:  # for head_to_head
        keep["retriever_t1"] = lambda: r.search_arrays(qs, k=10, mode="bm25", n_threads=1)
        keep["retriever_t2"] = lambda: r.search_arrays(qs, k=10, mode="bm25", n_threads=2)
    res["bytes_on_disk"] = r.info()["bytes_on_disk"]
    return res


def bench_bm25s(col: TextCollection, repeats: int, keep: dict | None = None) -> dict:
    import bm25s
    import Stemmer

    from retriever.index.analyzer import LUCENE_ENGLISH_STOP_WORDS

    stem = Stemmer.Stemmer("porter")
    stop = sorted(LUCENE_ENGLISH_STOP_WORDS)
    texts = [f"{d.get('title', '')} {d['text']}" for d in col.docs()]
    t0 = time.perf_counter()
    tok = bm25s.tokenize(texts, stopwords=stop, stemmer=stem, show_progress=False)
    model = bm25s.BM25(k1=0.9, b=0.4, method="lucene", backend="numba")
    model.index(tok, show_progress=False)
    build_s = time.perf_counter() - t0
    del texts
    res = {"index_seconds": build_s, "index_docs_per_s": col.n_docs / build_s, "version": _version("bm25s")}
    qtok = bm25s.tokenize(col.queries, stopwords=stop, stemmer=stem, show_progress=False,
                          return_ids=False)
    qtok = [q if q else ["__empty__"] for q in qtok]

    def run():
        model.retrieve(qtok, k=10, n_threads=1, show_progress=False)

    res["retrieve_t1"] = qps(len(col.queries), timed_runs(run, repeats, min_seconds=MIN_PASS_SECONDS))

    def run_with_tok():
        q = bm25s.tokenize(col.queries, stopwords=stop, stemmer=stem, show_progress=False, return_ids=False)
        model.retrieve([x if x else ["__empty__"] for x in q], k=10, n_threads=1, show_progress=False)

    res["end_to_end_t1"] = qps(len(col.queries), timed_runs(run_with_tok, repeats, min_seconds=MIN_PASS_SECONDS))
    if keep is not None:  # for head_to_head
        keep["bm25s"] = run_with_tok
    return res


def bench_rank_bm25(col: TextCollection, n_sample: int) -> dict:
    from rank_bm25 import BM25Okapi

    from retriever.index.analyzer import Analyzer

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
            "qps_median": 1.0 / statistics.median(times), "version": _version("rank-bm25")}


def _version(dist: str) -> str | None:
    """Installed version of a peer package (recorded with its figures: peers' speed changes
    between releases), or None when unknown."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k synthetic documents instead of 1M")
    ap.add_argument("--collections", default="scifact,synthetic",
                    help="comma-separated subset of: scifact, synthetic (default both)")
    ap.add_argument("--synthetic-docs", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-rank-bm25", action="store_true")
    ap.add_argument("--rounds", type=int, default=7,
                    help="interleaved head-to-head rounds (retriever 1 thread, bm25s, retriever 2 threads) when "
                         "both engines run in the same step (default 7)")
    ap.add_argument("--engines", default="retriever,bm25s,rank_bm25",
                    help="comma-separated subset of: retriever, bm25s, rank_bm25 (default all). A subset "
                         "replaces only those engines' figures in the collection's existing entry, so a "
                         "long run can be split into steps run back to back (figures older than "
                         "SPLIT_RUN_HOURS are dropped)")
    ap.add_argument("--out", default=None, help="default benchmarks/results/bm25.json (bm25_quick.json with --quick)")
    args = ap.parse_args(argv)
    n_syn = args.synthetic_docs or (100_000 if args.quick else 1_000_000)
    wanted = [c.strip() for c in args.collections.split(",") if c.strip()]
    bad = set(wanted) - {"scifact", "synthetic"}
    if bad:
        ap.error(f"unknown collection(s): {', '.join(sorted(bad))}")
    engines = [x.strip() for x in args.engines.split(",") if x.strip()]
    bad = set(engines) - {"retriever", "bm25s", "rank_bm25"}
    if bad:
        ap.error(f"unknown engine(s): {', '.join(sorted(bad))}")
    if args.skip_rank_bm25 and "rank_bm25" in engines:
        engines.remove("rank_bm25")
    split = any(a == "--engines" or a.startswith("--engines=") for a in (argv if argv is not None else sys.argv[1:]))
    out_path = Path(args.out or RESULTS / ("bm25_quick.json" if args.quick else "bm25.json"))
    command = "python -m benchmarks.bench_bm25 " + " ".join(argv if argv is not None else sys.argv[1:])
    report = {"collections": {}}
    if out_path.exists():  # runs of single collections accumulate in one file
        try:
            report = json.loads(out_path.read_text())
            report.setdefault("collections", {})
        except (OSError, ValueError):
            report = {"collections": {}}
    report["machine"] = machine()
    report["command"] = command
    makers = {"scifact": lambda: beir("scifact"), "synthetic": lambda: synthetic_bm25(n_syn)}
    with tempfile.TemporaryDirectory() as tmp:
        for key in wanted:
            col = makers[key]()
            print(f"== {col.name}: {col.n_docs} docs, {len(col.queries)} queries", flush=True)
            entry = {"n_docs": col.n_docs, "n_queries": len(col.queries), "command": command,
                     "machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                     "load_avg_before": list(os.getloadavg())}
            old = report["collections"].get(col.name)
            if split and old and old.get("n_docs") == col.n_docs:
                # a step of a split run: keep the other engines' figures, note each step
                entry = {**old, "command": command, "machine": machine()}
                entry.setdefault("steps", [])
                for eng in ("retriever", "bm25s", "rank_bm25"):  # only recent steps' figures stay
                    if eng in entry and not _recent(entry[eng].get("measured")):
                        del entry[eng]
                entry.pop("ratios", None)
            else:
                entry["steps"] = []
            step = {"engines": engines, "command": command, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                    "load_avg_before": list(os.getloadavg())}
            keep: dict = {}
            runners = {"retriever": lambda: bench_ours(col, Path(tmp), args.repeats, keep),
                       "bm25s": lambda: bench_bm25s(col, args.repeats, keep),
                       "rank_bm25": lambda: bench_rank_bm25(col, 50 if col.n_docs < 100_000 else 20)}
            for eng in engines:
                entry[eng] = runners[eng]()
                entry[eng]["measured"] = step["started"]
                print(f" {eng}", json.dumps(entry[eng]), flush=True)
            if {"retriever_t1", "retriever_t2", "bm25s"} <= set(keep) and args.rounds > 0:
                h2h = head_to_head(len(col.queries), {k: keep[k] for k in ("retriever_t1", "bm25s", "retriever_t2")},
                                   args.rounds)
                h2h["measured"] = step["started"]
                entry["head_to_head"] = h2h
                print(" head_to_head", json.dumps(h2h), flush=True)
            elif "head_to_head" in entry and not _recent(entry["head_to_head"].get("measured")):
                del entry["head_to_head"]
            keep.clear()
            entry["load_avg_after"] = step["load_avg_after"] = list(os.getloadavg())
            entry["steps"] = [st for st in entry["steps"]
                              if set(st["engines"]) - set(engines) and _recent(st.get("started"))] + [step]
            _describe_steps(entry)
            if "retriever" not in entry or "bm25s" not in entry:
                report["collections"][col.name] = entry
                print(" (ratios need both retriever and bm25s figures: run the other engines next)")
                _write(out_path, report)
                continue
            ours = entry["retriever"]
            entry["ratios"] = {
                "vs_bm25s_end_to_end": ours["end_to_end_t1"]["qps_median"] / entry["bm25s"]["end_to_end_t1"]["qps_median"],
                "kernel_auto_vs_bm25s_retrieve": ours["kernel_auto_t1"]["qps_median"] / entry["bm25s"]["retrieve_t1"]["qps_median"],
                "kernel_two_threads_vs_one": ours["kernel_auto_t2"]["qps_median"] / ours["kernel_auto_t1"]["qps_median"],
                "two_threads_vs_one": ours["end_to_end_t2"]["qps_median"] / ours["end_to_end_t1"]["qps_median"],
                "indexing_vs_bm25s": ours["index_docs_per_s"] / entry["bm25s"]["index_docs_per_s"],
            }
            if "head_to_head" in entry:
                entry["ratios"]["vs_bm25s_end_to_end_interleaved"] = entry["head_to_head"]["vs_bm25s_end_to_end_median"]
                entry["ratios"]["two_threads_vs_one_interleaved"] = entry["head_to_head"]["two_threads_vs_one_median"]
            if "rank_bm25" in entry:
                entry["ratios"]["vs_rank_bm25"] = ours["end_to_end_t1"]["qps_median"] / entry["rank_bm25"]["qps_median"]
            for name in [n for n in report["collections"] if n.split("-")[0] == col.name.split("-")[0]]:
                del report["collections"][name]  # one entry per collection kind (synthetic size may change)
            report["collections"][col.name] = entry
            print(" ratios", json.dumps(entry["ratios"]), flush=True)
            _write(out_path, report)
    print(markdown(report))
    return 0


def _describe_steps(entry: dict) -> None:
    """Make an entry's ``command``, ``started`` and ``load_avg_before`` describe all of its steps
    (a split run's first step starts it; its command is the steps' commands in order)."""
    steps = sorted(entry.get("steps") or [], key=lambda st: st.get("started", ""))
    if not steps:
        return
    entry["started"] = steps[0]["started"]
    entry["load_avg_before"] = steps[0]["load_avg_before"]
    entry["command"] = "; ".join(st["command"] for st in steps)


#: steps of a split run (``--engines``) count as one run when at most this many hours apart.
SPLIT_RUN_HOURS = 3.0


def _recent(stamp: str | None) -> bool:
    """True when ``stamp`` (``time.strftime("%Y-%m-%d %H:%M:%S %Z")``, UTC) is within
    :data:`SPLIT_RUN_HOURS` of now."""
    import calendar

    try:
        t = calendar.timegm(time.strptime(str(stamp).replace(" UTC", ""), "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return False
    return 0 <= time.time() - t <= SPLIT_RUN_HOURS * 3600


def _write(out_path: Path, report: dict) -> None:
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out_path.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(report, indent=1))
    tmp_out.replace(out_path)


def _pair(ratios: dict, key: str) -> str:
    """A ratio as the table shows it: the interleaved median first when there is one, then the
    ratio of the separate passes' medians in brackets."""
    inter = ratios.get(f"{key}_interleaved")
    if inter is None:
        return f"{ratios[key]:.2f}×"
    return f"**{inter:.2f}×** ({ratios[key]:.2f}×)"


def markdown(report: dict) -> str:
    """A Markdown table of a bm25.json report, printed at the end of a run (the README's figures come
    from :func:`benchmarks.report.readme_rows`)."""
    lines = ["| collection | retriever end to end (1 thread) | retriever kernel `auto` | kernel `maxscore` | "
             "retriever end to end, 2 threads | kernel `auto`, 2 threads | bm25s end to end | bm25s retrieve only | "
             "rank-bm25 | retriever / bm25s (end to end) | retriever / rank-bm25 | indexing docs/s: retriever / bm25s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, e in report["collections"].items():
        if "ratios" not in e:  # a split run not finished yet
            continue
        o, b, ra = e["retriever"], e["bm25s"], e["ratios"]
        rk = e.get("rank_bm25")
        lines.append(
            f"| {name} ({e['n_docs']:,} docs, {e['n_queries']:,} queries) | {o['end_to_end_t1']['qps_median']:,.0f} | "
            f"{o['kernel_auto_t1']['qps_median']:,.0f} | {o['kernel_maxscore_t1']['qps_median']:,.0f} | "
            f"{o['end_to_end_t2']['qps_median']:,.0f} ({_pair(ra, 'two_threads_vs_one')}) | "
            f"{o['kernel_auto_t2']['qps_median']:,.0f} ({ra['kernel_two_threads_vs_one']:.2f}×) | "
            f"{b['end_to_end_t1']['qps_median']:,.0f} | {b['retrieve_t1']['qps_median']:,.0f} | "
            + (f"{rk['qps_median']:,.2f} ({rk['queries_sampled']} q) | " if rk else "— | ")
            + f"{_pair(ra, 'vs_bm25s_end_to_end')} | " + (f"{ra['vs_rank_bm25']:,.0f}× | " if rk else "— | ")
            + f"{o['index_docs_per_s']:,.0f} / {b['index_docs_per_s']:,.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
