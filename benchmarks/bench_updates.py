"""A living index against a rebuild, LanceDB and bm25s (issue: a living index).

On the synthetic corpus of :func:`benchmarks.datasets.synthetic_bm25` (``--docs`` documents,
Zipf terms, mean length 60) with precomputed 64-d unit dense vectors (so no encoder runs: these
are the non-model rates), legs BM25 + dense flat:

- fresh build rate (docs/s) and the add rate: half the corpus built, the other half added with
  :class:`retriever.IndexUpdater` in batches of ``--batch`` documents, a commit after each;
- commit latency of 1,000 added documents (the add itself and the commit, medians of rounds);
- delete throughput (ids/s of ``delete``) and the commit of 1,000 deletes;
- ``Retriever.refresh`` after a 1,000-document commit, against a full ``Retriever.open``; the
  per-query BM25 time of the refreshed reader against a fresh open of the same generation
  (interleaved passes; results checked identical);
- full compaction time; bytes on disk after the churn and after compaction;
- BM25 query latency (one query at a time, k = 10) p50 / p99 on a static index and while a
  writer process adds and deletes ``--churn-rate`` documents/s (commit every second);
- LanceDB (embedded): add and delete 1,000 rows, full-text (its FTS index) and vector search QPS
  before and after ``optimize``; bm25s: the rebuild that is its only way to change an index;
- with ``--encoder-docs N``: the add rate with the bundled encoders (dense MiniLM + SPLADE) on N
  documents added to a small index, against the raw encoders on the same texts (interleaved).

``--only build-add`` times only the fresh build and the add rate (no cache, no other part: the
figures the add-rate target is about, in a run of a few minutes), then the 1,000-document add
and commit rounds on that index.

``--only reader-memory`` measures a reader's resident memory and open time (a new process
each: open + 20 BM25 queries) on the half-built-then-added index against the fresh build of
the same documents, ``--rounds`` interleaved pairs.

``--cache DIR`` keeps the fresh-build and add figures and the half-built-then-added index in DIR
(outside the repository) and reuses them in a later run of the same ``--docs`` / ``--batch``
(copied, so the cached index stays as built); the JSON says which figures came from the cache.

Run:  flock <lock> python -m benchmarks.bench_updates [--docs 200000] [--out benchmarks/results/updates.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.datasets import synthetic_bm25
from benchmarks.timing import machine

DIM = 64


def _vectors(n: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _add_1000(u: Any, docs: list[dict[str, Any]], k: int) -> tuple[float, float]:
    """Round ``k`` of the 1,000-document add: seconds of ``u.add`` and of the ``u.commit`` after it
    (ids ``x{k}_{j}``, the texts of the first 1,000 documents, fresh vectors)."""
    recs = [{"_id": f"x{k}_{j}", "text": docs[j]["text"]} for j in range(1000)]
    v = _vectors(1000, 1000 + k)
    t0 = time.perf_counter()
    u.add(recs, dense_vectors=v)
    t1 = time.perf_counter()
    u.commit()
    return t1 - t0, time.perf_counter() - t1


def _latencies(r: Any, queries: list[str], seconds: float) -> list[float]:
    out = []
    t_end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < t_end:
        q = queries[i % len(queries)]
        t0 = time.perf_counter()
        r.search_arrays([q], k=10, mode="bm25")
        out.append(time.perf_counter() - t0)
        i += 1
    return out


def _refreshed_vs_open(r: Any, path: Path, qs: list[str], rounds: int = 5) -> dict[str, Any]:
    """Per-query BM25 time (one query at a time, k = 10) of ``r`` refreshed to the current
    generation (segments carried from earlier generations score from tf, bounds carried) against a
    fresh ``Retriever.open`` of the same generation: both warmed with every query once, then
    ``rounds`` interleaved passes over ``qs``; the ratio of each round's total time."""
    from retriever import Retriever

    r.refresh()
    f = Retriever.open(path)
    assert f.reader.generation == r.reader.generation
    a = r.search_arrays(qs, k=10, mode="bm25", n_threads=1)
    b = f.search_arrays(qs, k=10, mode="bm25", n_threads=1)
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.scores, b.scores)
    for x in (r, f):
        for q in qs:
            x.search_arrays([q], k=10, mode="bm25", n_threads=1)

    def one_pass(x: Any) -> float:
        total = 0.0
        for q in qs:
            t0 = time.perf_counter()
            x.search_arrays([q], k=10, mode="bm25", n_threads=1)
            total += time.perf_counter() - t0
        return total

    ratios, rs, fs = [], [], []
    for _ in range(rounds):
        tr, tf = one_pass(r), one_pass(f)
        rs.append(1e3 * tr / len(qs))
        fs.append(1e3 * tf / len(qs))
        ratios.append(tr / tf)
    return {"refreshed_mean_ms": _spread(rs), "fresh_open_mean_ms": _spread(fs), "ratio": _spread(ratios),
            "queries": len(qs), "results_identical": True}


def _churn(path: str, rate: int, start_id: int, texts: list[str], ready: Any, active: Any, stop: Any,
           done: Any = None, nice: int = 0) -> None:
    """Writer process: while ``active`` is set, every second add ``rate // 2`` documents and delete
    ``rate // 2``, one commit; idle otherwise; ends when ``stop`` is set. ``done`` (a shared
    double array of 3: commits, documents added + deleted, seconds spent writing) receives what it
    did; ``nice`` > 0 lowers its CPU priority (``os.nice``) before it opens the index."""
    import os

    from retriever import IndexUpdater

    if nice:
        os.nice(nice)
    per = max(1, rate // 2)
    with IndexUpdater.open(path) as u:
        # the id map of the whole index is built by the first add / delete: not part of the rate
        u.delete(["no-such-id"])
        ready.set()
        nxt, victim = start_id, 0
        while not stop.is_set():
            if not active.is_set():
                time.sleep(0.05)
                continue
            t0 = time.perf_counter()
            recs = [{"_id": f"c{nxt + j}", "text": texts[(nxt + j) % len(texts)]} for j in range(per)]
            u.add(recs, dense_vectors=_vectors(per, nxt))
            gone = u.delete([str(victim + j) for j in range(per)]).deleted
            u.commit()
            nxt += per
            victim += per
            spent = time.perf_counter() - t0
            if done is not None:
                done[0] += 1
                done[1] += per + gone
                done[2] += spent
            time.sleep(max(0.0, 1.0 - spent))


def _built(n_docs: int, batch: int, docs: list[dict], vecs: np.ndarray, tmp: Path, cache: Path | None
           ) -> tuple[Path, dict[str, Any]]:
    """The fresh-build and add figures and the half-built-then-added index (from ``cache`` when it
    holds them for these arguments; stored there otherwise)."""
    from retriever import IndexUpdater, build_index

    path = tmp / "live"
    key = {"docs": n_docs, "batch": batch}
    meta = None if cache is None else cache / f"built-{n_docs}-{batch}.json"
    if meta is not None and meta.exists() and (cache / f"live-{n_docs}-{batch}").exists():
        out = json.loads(meta.read_text())
        if out.get("key") == key:
            shutil.copytree(cache / f"live-{n_docs}-{batch}", path)
            out["from_cache"] = True
            return path, out
    out: dict[str, Any] = {"key": key}
    # fresh build of everything (the non-model rate)
    t0, c0 = time.perf_counter(), time.process_time()
    build_index(docs, tmp / "fresh", legs=("bm25", "dense"), dense_vectors=vecs, show_progress=False)
    fresh_s, fresh_cpu = time.perf_counter() - t0, time.process_time() - c0
    out["fresh_build"] = {"docs": n_docs, "seconds": fresh_s, "docs_per_s": n_docs / fresh_s,
                          "cpu_seconds": fresh_cpu, "docs_per_cpu_s": n_docs / fresh_cpu}
    shutil.rmtree(tmp / "fresh")
    # half built, half added
    half = n_docs // 2
    build_index(docs[:half], path, legs=("bm25", "dense"), dense_vectors=vecs[:half], show_progress=False)
    add_s = commit_s = 0.0
    with IndexUpdater.open(path) as u:
        c0 = time.process_time()
        for lo in range(half, n_docs, batch):
            hi = min(n_docs, lo + batch)
            t0 = time.perf_counter()
            u.add(docs[lo:hi], dense_vectors=vecs[lo:hi])
            t1 = time.perf_counter()
            u.commit()
            add_s += t1 - t0
            commit_s += time.perf_counter() - t1
        add_cpu = time.process_time() - c0
    n_add = n_docs - half
    out["add"] = {"docs": n_add, "batch": batch, "add_seconds": add_s, "commit_seconds": commit_s,
                  "docs_per_s": n_add / (add_s + commit_s),
                  "ratio_to_fresh_build": (n_add / (add_s + commit_s)) / (n_docs / fresh_s),
                  "cpu_seconds": add_cpu, "docs_per_cpu_s": n_add / add_cpu,
                  "cpu_ratio_to_fresh_build": (n_add / add_cpu) / (n_docs / fresh_cpu),
                  "note": "cpu: process CPU time (every thread) of the same spans; on a loaded machine the "
                          "wall-clock ratio also measures the load's changes between the two spans"}
    if meta is not None:
        cache.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(cache / f"live-{n_docs}-{batch}", ignore_errors=True)
        shutil.copytree(path, cache / f"live-{n_docs}-{batch}")
        meta.write_text(json.dumps(out))
    out["from_cache"] = False
    return path, out


def living(n_docs: int, batch: int, rounds: int, churn_rate: int, churn_seconds: float, tmp: Path,
           cache: Path | None = None, writer_nice: int = 0, refresh_thread: bool = False,
           windows: int = 4) -> dict[str, Any]:
    from retriever import IndexUpdater, Retriever

    col = synthetic_bm25(n_docs, n_queries=500)
    docs = list(col.docs())
    vecs = _vectors(n_docs, 0)
    half = n_docs // 2
    _warm_up(docs, vecs, tmp)
    path, built = _built(n_docs, batch, docs, vecs, tmp, cache)
    out: dict[str, Any] = {k: built[k] for k in ("fresh_build", "add", "from_cache")}
    # commit latency of 1,000 added docs, delete throughput, refresh
    r = Retriever.open(path)
    adds, commits, dels, del_commits, refresh_s, open_s = [], [], [], [], [], []
    rng = np.random.default_rng(7)
    victims = [str(i) for i in rng.permutation(half)[: rounds * 1000]]
    with IndexUpdater.open(path) as u:
        for k in range(rounds):
            a, c = _add_1000(u, docs, k)
            adds.append(a)
            commits.append(c)
            t3 = time.perf_counter()
            assert r.refresh()
            refresh_s.append(time.perf_counter() - t3)
            t4 = time.perf_counter()
            Retriever.open(path)
            open_s.append(time.perf_counter() - t4)
            ids = victims[k * 1000:(k + 1) * 1000]
            t5 = time.perf_counter()
            rep = u.delete(ids)
            t6 = time.perf_counter()
            u.commit()
            dels.append(t6 - t5)
            del_commits.append(time.perf_counter() - t6)
            assert rep.deleted == 1000
    out["add_1000"] = {"add_s": _spread(adds), "commit_s": _spread(commits),
                       "add_plus_commit_ms_median": 1e3 * statistics.median([a + c for a, c in zip(adds, commits)])}
    out["delete_1000"] = {"delete_s": _spread(dels), "ids_per_s_median": 1000 / statistics.median(dels),
                          "commit_s": _spread(del_commits)}
    out["refresh_after_1000_s"] = _spread(refresh_s)
    out["full_open_s"] = _spread(open_s)
    out["disk_after_churn_bytes"] = _du(path)
    out["refreshed_vs_fresh_open"] = _refreshed_vs_open(r, path, col.queries[:200])
    # queries: interleaved windows without and with a writer adding and deleting
    out["query_ms"] = query_windows(path, col.queries[:200], [d["text"] for d in docs[:5000]], churn_rate,
                                    churn_seconds, windows, writer_nice, refresh_thread)
    t0 = time.perf_counter()
    with IndexUpdater.open(path) as u:
        rep = u.compact(full=True)
    out["compact_full"] = {"seconds": time.perf_counter() - t0, "segments_in": len(rep.merged),
                           "segments_out": len(rep.written), "dropped_rows": rep.dropped_rows}
    with IndexUpdater.open(path, keep_generations=1):
        pass  # the generations before the compaction removed
    out["disk_after_compact_bytes"] = _du(path)
    return out


def query_windows(path: Path, qs: list[str], texts: list[str], churn_rate: int, churn_seconds: float,
                  windows: int = 4, writer_nice: int = 0, refresh_thread: bool = False) -> dict[str, Any]:
    """BM25 query latencies (one query at a time, k = 10, one thread) in ``windows`` interleaved
    pairs of windows: static, then while a writer process adds and deletes ``churn_rate``
    documents/s with the reader refreshing once a second. Returns the pooled p50 / p99 of each kind,
    their ratio, and each pair's own p99 ratio (median and spread): a pair is measured under the
    same machine load, so the per-pair ratios show how much of the pooled ratio is load drift."""
    from retriever import Retriever

    r = Retriever.open(path, n_threads=1)
    for q in qs:  # warm: every query's lazy per-term state filled once
        r.search_arrays([q], k=10, mode="bm25")
    ctx = mp.get_context("spawn")
    ready, active, stop = ctx.Event(), ctx.Event(), ctx.Event()
    done = ctx.Array("d", 3)
    proc = ctx.Process(target=_churn, args=(str(path), churn_rate, 10 ** 7, texts, ready, active, stop,
                                            done, writer_nice))
    proc.start()
    ready.wait(600)
    load_before = os.getloadavg()
    static: list[float] = []
    busy: list[float] = []
    refreshes: list[float] = []  # the refreshes that found a newer generation
    no_change = 0
    window = churn_seconds / windows
    pairs: list[tuple[float, float]] = []
    active_s = 0.0
    for _ in range(windows):
        s_win = _latencies(r, qs, window)
        static += s_win
        b0 = len(busy)
        active.set()
        t_start = time.perf_counter()
        t_end = t_start + window
        if refresh_thread:  # a background thread refreshes once a second; its time is the queries' too
            halt = threading.Event()

            def refresher() -> None:
                nonlocal no_change
                while not halt.is_set():
                    t0 = time.perf_counter()
                    if r.refresh():
                        refreshes.append(time.perf_counter() - t0)
                    else:
                        no_change += 1
                    halt.wait(max(0.0, 1.0 - (time.perf_counter() - t0)))

            th = threading.Thread(target=refresher)
            th.start()
            busy += _latencies(r, qs, window)
            halt.set()
            th.join()
        while not refresh_thread and time.perf_counter() < t_end:
            t0 = time.perf_counter()
            if r.refresh():
                refreshes.append(time.perf_counter() - t0)
            else:
                no_change += 1
            busy += _latencies(r, qs, 1.0)
        active.clear()
        active_s += time.perf_counter() - t_start
        pairs.append((float(np.percentile(s_win, 99)), float(np.percentile(busy[b0:], 99))))
        time.sleep(1.5)  # the writer's last commit ends
        r.refresh()
        for q in qs:  # the new generation's lazy state, as a static reader would have it
            r.search_arrays([q], k=10, mode="bm25")
    stop.set()
    proc.join()
    q = lambda xs, p: 1e3 * float(np.percentile(xs, p))  # noqa: E731
    ratios = [b / s for s, b in pairs]
    return {"static": {"p50": q(static, 50), "p99": q(static, 99), "n": len(static)},
            "while_writing": {"p50": q(busy, 50), "p99": q(busy, 99), "n": len(busy),
                              "docs_per_s": churn_rate, "refresh_every_s": 1.0,
                              "refresh_in_background_thread": refresh_thread,
                              "refresh_s": _spread(refreshes) if refreshes else None,
                              "refreshes_without_new_generation": no_change,
                              "writer": {"nice": writer_nice, "commits": int(done[0]),
                                         "docs_added_plus_deleted": int(done[1]),
                                         "seconds_writing": done[2], "active_seconds": active_s,
                                         "achieved_docs_per_s": done[1] / active_s}},
            "p99_ratio": q(busy, 99) / q(static, 99),
            "per_pair_p99_ms": [[1e3 * s, 1e3 * b] for s, b in pairs],
            "per_pair_p99_ratio": _spread(ratios),
            "load_avg_before_after": [load_before, os.getloadavg()],
            "note": f"{windows} interleaved pairs of windows (static, then writing); the reader refreshes once "
                    "a second while the writer runs (between queries, refresh time not in the latencies; with "
                    "--refresh-thread in a background thread, so the queries share the process with it); the "
                    "writer's achieved rate is what it committed over the churn windows' length"}


def churn_only(n_docs: int, batch: int, churn_rate: int, churn_seconds: float, tmp: Path, cache: Path | None,
               windows: int, writer_nice: int = 0, refresh_thread: bool = False) -> dict[str, Any]:
    """Only :func:`query_windows`, on a copy of the cached half-built-then-added index (built and
    cached first when missing): repeated p99-under-writes runs without the rest of the bench."""
    col = synthetic_bm25(n_docs, n_queries=500)
    docs = list(col.docs())
    path, built = _built(n_docs, batch, docs, _vectors(n_docs, 0), tmp, cache)
    return {"from_cache": built["from_cache"],
            "query_ms": query_windows(path, col.queries[:200], [d["text"] for d in docs[:5000]], churn_rate,
                                      churn_seconds, windows, writer_nice, refresh_thread)}


def _warm_up(docs: list[dict[str, Any]], vecs: np.ndarray, tmp: Path) -> None:
    """An untimed build of 20,000 documents and two adds to it, so that the first timed fresh
    build does not pay what only a process's first build pays (loading the compiled kernels from
    numba's cache, first-touch memory), which made the first round's ratio ~0.2 higher."""
    from retriever import IndexUpdater, build_index

    n = min(20_000, len(docs))
    half = n // 2
    build_index(docs[:half], tmp / "warm", legs=("bm25", "dense"), dense_vectors=vecs[:half], show_progress=False)
    with IndexUpdater.open(tmp / "warm") as u:
        for lo in (half, (half + n) // 2):
            hi = min(n, lo + (n - half) // 2)
            u.add(docs[lo:hi], dense_vectors=vecs[lo:hi])
            u.commit()
    shutil.rmtree(tmp / "warm")


def build_add(n_docs: int, batch: int, rounds: int, tmp: Path, repeat: int = 1) -> dict[str, Any]:
    """Only the fresh build and the add rate (as :func:`living`, never cached; after
    :func:`_warm_up`), ``repeat`` times
    (each round a fresh build, then the half build + adds: the ratio of a round compares spans a
    few minutes apart; the medians over rounds are reported), then ``rounds`` adds of 1,000
    documents, each committed (the add and the commit timed apart)."""
    from retriever import IndexUpdater

    col = synthetic_bm25(n_docs, n_queries=10)
    docs = list(col.docs())
    vecs = _vectors(n_docs, 0)
    _warm_up(docs, vecs, tmp)
    per_round = []
    for i in range(repeat):
        sub = tmp / f"round{i}"
        sub.mkdir()
        path, built = _built(n_docs, batch, docs, vecs, sub, None)
        per_round.append({k: built[k] for k in ("fresh_build", "add")})
        print(json.dumps(per_round[-1]), flush=True)
        if i + 1 < repeat:
            shutil.rmtree(sub)
    out: dict[str, Any] = dict(per_round[-1]) if repeat == 1 else {"rounds": per_round}
    if repeat > 1:
        med = lambda xs: _spread(xs)  # noqa: E731
        out["median"] = {
            "fresh_docs_per_s": med([r["fresh_build"]["docs_per_s"] for r in per_round]),
            "add_docs_per_s": med([r["add"]["docs_per_s"] for r in per_round]),
            "ratio_to_fresh_build": med([r["add"]["ratio_to_fresh_build"] for r in per_round]),
            "cpu_ratio_to_fresh_build": med([r["add"]["cpu_ratio_to_fresh_build"] for r in per_round]),
            "add_commit_seconds": med([r["add"]["commit_seconds"] for r in per_round])}
    adds, commits = [], []
    with IndexUpdater.open(path) as u:
        for k in range(rounds):
            a, c = _add_1000(u, docs, k)
            adds.append(a)
            commits.append(c)
    out["add_1000"] = {"add_s": _spread(adds), "commit_s": _spread(commits),
                       "add_plus_commit_ms_median": 1e3 * statistics.median([a + c for a, c in zip(adds, commits)])}
    return out


_OPEN_PROBE = """
import json, os, sys, time
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
from retriever import Retriever
before = rss_mb()
t0 = time.perf_counter()
r = Retriever.open(sys.argv[1])
hits = [r.search(q, k=10, mode="bm25") for q in json.loads(sys.argv[2])]
seconds = time.perf_counter() - t0
print(json.dumps({"open_and_query_s": seconds, "rss_mb": rss_mb() - before,
                  "shards": r.info()["n_shards"], "hits": sum(map(len, hits))}))
"""


def reader_memory(n_docs: int, batch: int, rounds: int, tmp: Path, cache: Path | None,
                  code: Path | None = None) -> dict[str, Any]:
    """Resident memory and open time of a reader of the half-built-then-added index (``batch``
    documents a segment, as :func:`living` builds it) against one of the fresh build of the same
    documents: each opened in a new process (``python -c``: ``Retriever.open`` plus 20 BM25
    queries; RSS from ``/proc/self/statm`` after them, less what the process held before the
    open), ``rounds`` interleaved pairs; medians. ``code``: a checkout whose ``retriever`` the
    reader processes import (run from there: the same indexes read by another version)."""
    col = synthetic_bm25(n_docs, n_queries=20)
    docs = list(col.docs())
    vecs = _vectors(n_docs, 0)
    live, _ = _built(n_docs, batch, docs, vecs, tmp, cache)
    fresh = tmp / "fresh-whole"
    from retriever import build_index

    build_index(docs, fresh, legs=("bm25", "dense"), dense_vectors=vecs, show_progress=False)
    qs = json.dumps(list(col.queries)[:20])
    runs: dict[str, list[dict]] = {"living": [], "fresh": []}
    for _ in range(rounds):
        for name, path in (("living", live), ("fresh", fresh)):
            out = subprocess.run([sys.executable, "-c", _OPEN_PROBE, str(path), qs], capture_output=True, text=True,
                                 check=True, cwd=code)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("open_and_query_s", "rss_mb")} for k, v in runs.items()}
    return {"runs": runs, "median": med,
            "rss_ratio": med["living"]["rss_mb"] / med["fresh"]["rss_mb"],
            "open_ratio": med["living"]["open_and_query_s"] / med["fresh"]["open_and_query_s"],
            "segments": runs["living"][0]["shards"], "fresh_shards": runs["fresh"][0]["shards"]}


def lancedb_peer(n_docs: int, tmp: Path, seconds: float) -> dict[str, Any]:
    import lancedb
    import pyarrow as pa

    col = synthetic_bm25(n_docs, n_queries=500)
    docs = list(col.docs())
    vecs = _vectors(n_docs, 0)
    db = lancedb.connect(str(tmp / "lance"))

    def table_of(rows: list[dict], v: np.ndarray) -> pa.Table:
        return pa.table({"id": [d["_id"] for d in rows], "text": [d["text"] for d in rows],
                         "vector": pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), DIM)})

    t0 = time.perf_counter()
    tbl = db.create_table("docs", table_of(docs, vecs))
    with warnings.catch_warnings():  # the deprecated spelling is the one that takes a column name
        warnings.simplefilter("ignore")
        tbl.create_fts_index("text")
    build_s = time.perf_counter() - t0

    def qps(kind: str) -> float:
        n, t_end = 0, time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            if kind == "fts":
                tbl.search(col.queries[n % len(col.queries)], query_type="fts").limit(10).to_arrow()
            else:
                tbl.search(vecs[n % 100]).limit(10).to_arrow()
            n += 1
        return n / seconds

    before = {"fts_qps": qps("fts"), "vector_qps": qps("vector")}
    extra = [{"_id": f"x{j}", "text": docs[j]["text"]} for j in range(1000)]
    t0 = time.perf_counter()
    tbl.add(table_of(extra, _vectors(1000, 5)))
    add_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tbl.delete("id IN (" + ",".join(f"'{i}'" for i in range(1000)) + ")")
    del_s = time.perf_counter() - t0
    after_change = {"fts_qps": qps("fts"), "vector_qps": qps("vector")}
    t0 = time.perf_counter()
    tbl.optimize()
    opt_s = time.perf_counter() - t0
    after_opt = {"fts_qps": qps("fts"), "vector_qps": qps("vector")}
    return {"version": lancedb.__version__, "build_with_fts_s": build_s, "add_1000_s": add_s, "delete_1000_s": del_s,
            "optimize_s": opt_s, "static": before, "after_add_delete": after_change, "after_optimize": after_opt}


def bm25s_peer(n_docs: int) -> dict[str, Any]:
    import bm25s

    col = synthetic_bm25(n_docs, n_queries=500)
    texts = [d["text"] for d in col.docs()]
    t0 = time.perf_counter()
    tok = bm25s.tokenize(texts, stopwords=None, show_progress=False)
    model = bm25s.BM25()
    model.index(tok, show_progress=False)
    s = time.perf_counter() - t0
    return {"version": bm25s.__version__, "rebuild_s": s, "note": "bm25s has no add or delete: any change is a rebuild"}


def encoder_add(n_add: int, rounds: int, tmp: Path) -> dict[str, Any]:
    """Add rate with the bundled encoders (legs bm25 + dense + sparse: the dense MiniLM and the
    SPLADE models run on the added texts) against the raw encoders on the same texts: ``n_add``
    documents added (one commit) to an index of ``n_add`` documents, ``rounds`` interleaved rounds
    of (raw dense + raw sparse encode, add + commit); medians."""
    from retriever import IndexUpdater, build_index
    from retriever.index.encoders.dense import DenseEncoder
    from retriever.index.encoders.sparse import SparseEncoder

    col = synthetic_bm25(n_add * (rounds + 1), n_queries=10)
    docs = list(col.docs())
    path = tmp / "enc"
    build_index(docs[:n_add], path, legs=("bm25", "dense", "sparse"), show_progress=False)
    dense, sparse = DenseEncoder(), SparseEncoder()
    raw, add = [], []
    for k in range(rounds):
        part = docs[(k + 1) * n_add:(k + 2) * n_add]
        texts = [d["text"] for d in part]  # the legs' input: "title text", and these have no title
        t0 = time.perf_counter()
        dense.encode(texts)
        sparse.encode(texts)
        raw.append(time.perf_counter() - t0)
        with IndexUpdater.open(path) as u:
            t0 = time.perf_counter()
            u.add(part)
            u.commit()
            add.append(time.perf_counter() - t0)
    r, a = statistics.median(raw), statistics.median(add)
    return {"docs_per_round": n_add, "rounds": rounds, "raw_encoders_s": _spread(raw), "add_commit_s": _spread(add),
            "raw_docs_per_s": n_add / r, "add_docs_per_s": n_add / a, "add_rate_vs_raw_encoders": r / a,
            "note": "legs bm25 + dense (bundled MiniLM) + sparse (bundled SPLADE), CPU; raw = DenseEncoder.encode "
                    "+ SparseEncoder.encode of the same texts; add = IndexUpdater.add + commit (updater open "
                    "not timed)"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=10_000, help="documents per add + commit in the add-rate run")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the 1,000-document add / delete / refresh")
    ap.add_argument("--churn-rate", type=int, default=1000, help="documents/s the writer adds + deletes")
    ap.add_argument("--churn-seconds", type=float, default=20.0, help="seconds of each kind of query window, in all")
    ap.add_argument("--writer-nice", type=int, default=0, help="CPU niceness increment of the churn writer process "
                                                                  "(0: the reader's priority)")
    ap.add_argument("--refresh-thread", action="store_true", help="refresh from a background thread while the "
                                                                   "queries run (default: between queries)")
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--skip-living", action="store_true", help="only the peers (and --encoder-docs): a run of its own")
    ap.add_argument("--cache", default=None, help="directory (outside the repository) keeping the built index and "
                                                  "its build / add figures for later runs")
    ap.add_argument("--encoder-docs", type=int, default=0, help="documents per round of the encoder add-rate run "
                                                                "(0: skip)")
    ap.add_argument("--encoder-rounds", type=int, default=3)
    ap.add_argument("--only", choices=("build-add", "churn", "reader-memory"), default=None,
                    help="build-add: only the fresh build, the add rate and the 1,000-document add + commit "
                         "rounds (no cache, no peers, no queries, no compaction); churn: only the query "
                         "windows, on a copy of the --cache index (built there first when missing); "
                         "reader-memory: a reader's memory and open time, living index against a fresh "
                         "build (--rounds pairs)")
    ap.add_argument("--reader-code", default=None, help="with --only reader-memory: a checkout whose retriever "
                                                        "the reader processes import (a before / after run)")
    ap.add_argument("--windows", type=int, default=4, help="interleaved pairs of query windows (static, "
                                                           "writing) over --churn-seconds")
    ap.add_argument("--repeat", type=int, default=1, help="with --only build-add: rounds of fresh build + adds "
                                                          "(medians reported)")
    ap.add_argument("--out", default="benchmarks/results/updates.json")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-updates-"))
    try:
        rep: dict[str, Any] = {"command": "python -m benchmarks.bench_updates " + " ".join(argv or sys.argv[1:]),
                               "machine": machine(), "docs": args.docs, "load_avg_start": os.getloadavg()}
        if args.only == "build-add":
            rep["retriever"] = build_add(args.docs, args.batch, args.rounds, tmp, args.repeat)
            print(json.dumps(rep["retriever"], indent=1), flush=True)
        elif args.only == "reader-memory":
            rep["retriever"] = reader_memory(args.docs, args.batch, args.rounds, tmp,
                                             None if args.cache is None else Path(args.cache),
                                             None if args.reader_code is None else Path(args.reader_code).resolve())
            print(json.dumps(rep["retriever"], indent=1), flush=True)
        elif args.only == "churn":
            rep["retriever"] = churn_only(args.docs, args.batch, args.churn_rate, args.churn_seconds, tmp,
                                          None if args.cache is None else Path(args.cache), args.windows,
                                          args.writer_nice, args.refresh_thread)
            print(json.dumps(rep["retriever"], indent=1), flush=True)
        elif not args.skip_living:
            rep["retriever"] = living(args.docs, args.batch, args.rounds, args.churn_rate, args.churn_seconds, tmp,
                                      None if args.cache is None else Path(args.cache), args.writer_nice,
                                      args.refresh_thread, args.windows)
            print(json.dumps(rep["retriever"], indent=1), flush=True)
        if args.encoder_docs and args.only is None:
            rep["encoders"] = encoder_add(args.encoder_docs, args.encoder_rounds, tmp)
            print(json.dumps(rep["encoders"], indent=1), flush=True)
        if not args.skip_peers and args.only is None:
            rep["lancedb"] = lancedb_peer(args.docs, tmp, 3.0)
            rep["bm25s"] = bm25s_peer(args.docs)
        rep["load_avg_end"] = os.getloadavg()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rep, indent=1))
        print(json.dumps({k: v for k, v in rep.items() if k != "retriever"}, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
