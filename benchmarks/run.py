"""One command for every headline figure: ``python -m benchmarks.run [--quick] [--only SECTION]...``.

Sections (each writes ``benchmarks/results/run_<section>.json``; then ``SUMMARY.md``, recall–QPS plots
``benchmarks/results/*.png`` and the README's marked section are regenerated from whatever JSON
files exist, so a section can be rerun alone):

- ``hybrid``: BM25 + dense + learned sparse (Seismic mode, precomputed topical vectors) on the seeded synthetic corpus
  (benchmarks/datasets.py), top-10, RRF, 2 threads, batch size 1, query vectors passed (dense query
  encoding excluded; BM25 query analysis included). Dense leg: IVF (nlist ≈ √N) over precomputed
  vectors, swept over nprobe; recall@10 against flat / exhaustive search and the fused list of the
  exact legs. Full: 100k and 1M documents. Quick: 10k.
- ``encode``: query encoding time of each bundled model, on its own (SciFact queries).
- ``indexing``: documents/s of the non-model part (BM25-only ``build_index`` of in-memory records:
  validation, analysis, postings, Arrow shards, checksums; median of 3, next to bm25s's indexing of
  the same texts), of the dense pipeline (``build_index`` with the model) next to the
  encoder's raw throughput on the same texts, and sentence-transformers' ``encode()`` on the same
  model, texts, max length (256) and machine.
- ``bm25``: this engine vs bm25s vs rank-bm25 (``benchmarks/bench_bm25.py``'s functions).
- ``dense``, ``sparse``: ``benchmarks/bench_dense.py`` / ``benchmarks/bench_sparse.py`` when they
  exist (written on other branches); otherwise a "not available" entry.

Peers come from ``benchmarks/requirements.txt``. ``--quick`` (small sizes, < 5 minutes on 2
cores) asserts nothing about speed. Timing method: see ``retriever/bench.py`` and
``benchmarks/timing.py``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.timing import machine

RESULTS = Path(__file__).resolve().parent / "results"
SECTIONS = ("hybrid", "encode", "indexing", "bm25", "dense", "sparse")


def _machine() -> dict[str, Any]:
    m = machine()
    try:
        m["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    try:
        import psutil
        m["memory_bytes"] = int(psutil.virtual_memory().total)
    except ImportError:
        pass
    m["time"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return m


def _nlist(n: int) -> int:
    return int(2 ** max(4, round(math.log2(max(math.sqrt(n), 1)))))


# ----------------------------------------------------------------------------------------- hybrid

def bench_hybrid(n_docs: int, tmp: Path, *, threads: int = 2, n_queries: int = 1000,
                 nprobes: tuple[int, ...] = (1, 4, 16, 64), k: int = 10, sparse: bool = True) -> dict[str, Any]:
    """Build a BM25 + dense (IVF) [+ learned-sparse] index of the synthetic hybrid corpus and
    benchmark it. The sparse leg (``sparse=True``) takes precomputed vectors from
    ``benchmarks.datasets.synthetic_sparse_topical`` (seeded, calibrated to SciFact SPLADE vectors)
    and is searched in its approximate (Seismic) mode with the leg's default knobs."""
    import faiss

    from benchmarks.datasets import synthetic_hybrid
    from index.config import DenseConfig
    from retriever import Retriever, build_index
    from retriever.bench import bench_index

    col = synthetic_hybrid(n_docs, n_queries=n_queries)
    nlist = _nlist(n_docs)
    factory = f"IVF{nlist},Flat"
    out = tmp / col.name
    t0 = time.perf_counter()
    legs: tuple[str, ...] = ("bm25", "dense")
    extra: dict[str, Any] = {}
    sparse_q = None
    if sparse:
        from benchmarks.datasets import synthetic_sparse_topical

        (ip, terms, weights), (qip, qt, qw) = synthetic_sparse_topical(n_docs, n_queries)
        sparse_q = [(qt[qip[i]:qip[i + 1]], qw[qip[i]:qip[i + 1]]) for i in range(len(qip) - 1)]
        legs += ("sparse",)
        extra["sparse_vectors"] = (ip, terms, weights)
    build_index(col.text.docs(), out, legs=legs, dense_vectors=col.dense.blocks(),
                show_progress=False, shard_size=max(n_docs, 1), batch_size=8192,
                dense=DenseConfig(faiss_factory=factory), **extra)
    build_s = time.perf_counter() - t0
    r = Retriever.open(out, n_threads=threads)
    entry: dict[str, Any] = {"n_docs": n_docs, "n_queries": n_queries, "threads": threads, "k": k,
                             "dense_factory": factory, "dim": col.dense.dim, "build_seconds": build_s,
                             "legs": list(r.legs),
                             "points": []}
    cache: dict[str, Any] = {}
    sp = {"sparse": {"algorithm": "seismic"}} if sparse else {}
    bm25 = bench_index(r, col.text.queries, modes=["bm25"] + (["sparse"] if sparse else []), k=k,
                       n_threads=threads, batch_size=1, exact_cache=cache, leg_params=sp,
                       sparse_vectors=sparse_q)
    entry["bm25"] = bm25["modes"]["bm25"]
    if sparse:
        entry["sparse_leg"] = bm25["modes"]["sparse"]
        entry["sparse_params"] = sp["sparse"]
    entry["bytes_on_disk"] = bm25["index"]["bytes_on_disk"]
    for nprobe in nprobes:
        lp = {"dense": {"nprobe": min(nprobe, nlist)}, **sp}
        rep = bench_index(r, col.text.queries, modes=["dense", "hybrid"], k=k, n_threads=threads, batch_size=1,
                          query_vectors=col.dense.queries, leg_params=lp, exact_cache=cache,
                          sparse_vectors=sparse_q)
        entry["points"].append({"nprobe": nprobe, **rep["modes"]})
        h = rep["modes"]["hybrid"]
        print(f"  hybrid {n_docs} nprobe={nprobe}: p99 {h['latency_ms']['p99']:.2f} ms, "
              f"QPS {h['qps']:.0f}, recall@{k} {h[f'recall@{k}']}", flush=True)
    entry["peak_rss_bytes"] = rep["peak_rss_bytes"]
    ok = [p for p in entry["points"] if (p["hybrid"][f"recall@{k}"].get("fused") or 0) >= 0.95]
    best = min(ok or entry["points"], key=lambda p: p["hybrid"]["latency_ms"]["p99"])
    entry["headline"] = {"nprobe": best["nprobe"], "p99_ms": best["hybrid"]["latency_ms"]["p99"],
                         "p50_ms": best["hybrid"]["latency_ms"]["p50"], "qps": best["hybrid"]["qps"],
                         f"recall@{k}": best["hybrid"][f"recall@{k}"], "target_p99_ms": 10.0,
                         "meets_target": best["hybrid"]["latency_ms"]["p99"] <= 10.0}
    r.close()
    del r
    import shutil
    shutil.rmtree(out, ignore_errors=True)
    return entry


def section_hybrid(quick: bool) -> dict[str, Any]:
    sizes = [10_000] if quick else [100_000, 1_000_000]
    out: dict[str, Any] = {"sizes": {}}
    with tempfile.TemporaryDirectory(dir=os.environ.get("RETRIEVER_BENCH_TMP")) as tmp:
        for n in sizes:
            out["sizes"][str(n)] = bench_hybrid(n, Path(tmp), n_queries=200 if quick else 1000,
                                                nprobes=(1, 8) if quick else (1, 4, 16, 64))
    return out


# ----------------------------------------------------------------------------------------- encode

def _scifact_texts(n_docs: int) -> tuple[list[dict], list[str]]:
    from benchmarks.datasets import beir

    col = beir("scifact")
    docs = []
    for d in col.docs():
        docs.append(d)
        if len(docs) >= n_docs:
            break
    return docs, col.queries


def _lat(samples_s: list[float]) -> dict[str, float]:
    a = np.asarray(samples_s) * 1e3
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean())}


def section_encode(quick: bool) -> dict[str, Any]:
    """Query encoding time per bundled model, alone (batch 1 latency and batch-32 throughput)."""
    from index.encoders.dense import DenseEncoder

    _, queries = _scifact_texts(0)
    queries = queries[:20 if quick else 200]
    out: dict[str, Any] = {"n_queries": len(queries), "models": {}}
    enc = DenseEncoder(None, max_length=256, batch_size=32)
    enc.encode(queries[:8])
    times = []
    for q in queries:
        t0 = time.perf_counter()
        enc.encode([q])
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    enc.encode(queries)
    batch_s = time.perf_counter() - t0
    out["models"]["dense:all-MiniLM-L6-v2"] = {"batch1_latency_ms": _lat(times),
                                               "batch32_queries_per_s": len(queries) / batch_s}
    try:
        from index.encoders.sparse import SparseEncoder  # the learned-sparse leg (other branch)
    except ImportError as e:
        out["models"]["sparse:splade-bert-tiny"] = {"status": f"not available ({e})"}
    else:
        senc = SparseEncoder(None)
        senc.encode(queries[:8])
        times = []
        for q in queries:
            t0 = time.perf_counter()
            senc.encode([q])
            times.append(time.perf_counter() - t0)
        out["models"]["sparse:splade-bert-tiny"] = {"batch1_latency_ms": _lat(times)}
    return out


# --------------------------------------------------------------------------------------- indexing

def _nonmodel(col_docs, n_docs: int, tmp: Path, name: str, repeats: int = 3) -> dict[str, Any]:
    """BM25-only ``build_index`` from in-memory records (reading/validating the records, analysis,
    postings, Arrow shards, checksums, manifest; corpus generation not timed), median of
    ``repeats``; a stage breakdown (each stage timed alone on one thread: in ``build_index``
    analysis and the postings sort run on a worker thread, overlapping reading and writing, so the
    stages sum to more than the total); and bm25s's indexing (tokenize + index, in memory, no
    files) of the same texts in the same run."""
    import shutil
    import statistics

    from index.analyzer import Analyzer
    from index.bm25_build import PostingsBuilder
    from index.readers import read_corpus
    from retriever import build_index

    docs = list(col_docs())  # materialised so corpus generation is not timed
    build_index(docs[:2000], tmp / f"{name}-warm", legs=("bm25",), show_progress=False)  # numba cache load
    secs = []
    for r in range(repeats):
        t0 = time.perf_counter()
        build_index(docs, tmp / f"{name}-{r}", legs=("bm25",), show_progress=False, shard_size=max(n_docs, 1),
                    batch_size=8192)
        secs.append(time.perf_counter() - t0)
        shutil.rmtree(tmp / f"{name}-{r}", ignore_errors=True)
    total = statistics.median(secs)
    t0 = time.perf_counter()
    recs = list(read_corpus(docs))
    read_s = time.perf_counter() - t0
    texts = [f"{d.title} {d.text}" if d.title else d.text for d in recs]
    del recs
    pb = PostingsBuilder(Analyzer(), background=False)  # each stage alone, on one thread
    t0 = time.perf_counter()
    for i in range(0, len(texts), 8192):
        pb.add(texts[i:i + 8192])
    add_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pb.flush()
    flush_s = time.perf_counter() - t0
    stages = read_s + add_s + flush_s
    res = {"n_docs": n_docs, "seconds": total, "seconds_runs": secs, "docs_per_s": n_docs / total,
           "n_tokens": int(pb.sum_dl), "n_terms": len(pb.terms),
           "breakdown_seconds": {"read + validate records (read_corpus)": read_s,
                                 "analysis + term ids + tf counts (PostingsBuilder.add, alone)": add_s,
                                 "postings CSR (counting sort, flush, alone)": flush_s,
                                 "build_index total (stages overlap: analysis runs on a second thread)": total},
           "sum_of_stages_alone_seconds": stages,
           "target_docs_per_s": 50_000, "meets_target": n_docs / total >= 50_000}
    pb.close()
    del pb
    try:
        import bm25s
        import Stemmer

        from index.analyzer import LUCENE_ENGLISH_STOP_WORDS
    except ImportError as e:
        res["bm25s"] = {"status": f"not available ({e})"}
        return res
    bsecs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tok = bm25s.tokenize(texts, stopwords=sorted(LUCENE_ENGLISH_STOP_WORDS), stemmer=Stemmer.Stemmer("porter"),
                             show_progress=False)
        bm25s.BM25(k1=0.9, b=0.4, method="lucene").index(tok, show_progress=False)
        bsecs.append(time.perf_counter() - t0)
        del tok
    res["bm25s"] = {"seconds_runs": bsecs, "docs_per_s": n_docs / statistics.median(bsecs),
                    "what": "bm25s.tokenize + BM25(method='lucene').index on the same texts (in memory, "
                            "no files written, no record validation)"}
    return res


def section_indexing(quick: bool) -> dict[str, Any]:
    from benchmarks.datasets import beir, synthetic_bm25

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("RETRIEVER_BENCH_TMP")) as tmp:
        tmp = Path(tmp)
        syn = synthetic_bm25(10_000 if quick else 200_000, n_queries=1)
        out["non_model_synthetic"] = _nonmodel(syn.docs, syn.n_docs, tmp, "syn")
        sf = beir("scifact")
        out["non_model_scifact"] = _nonmodel(sf.docs, sf.n_docs, tmp, "scifact")
        out["dense"] = _dense_indexing(32 if quick else 256, tmp)
    return out


def _dense_indexing(n: int, tmp: Path) -> dict[str, Any]:
    """Same texts, max length 256, batch 64: pipeline vs raw encoder vs sentence-transformers."""
    from index.encoders.dense import DenseEncoder, default_dense_model
    from retriever import build_index

    docs, _ = _scifact_texts(n)
    texts = [f"{d['title']} {d['text']}" if d.get("title") else d["text"] for d in docs]
    path = default_dense_model()
    res: dict[str, Any] = {"n_docs": len(texts), "max_length": 256, "batch_size": 64, "model": path}
    t0 = time.perf_counter()
    enc = DenseEncoder(None, max_length=256, batch_size=64)
    res["model_load_seconds"] = time.perf_counter() - t0
    enc.encode(texts[:16])
    t0 = time.perf_counter()
    enc.encode(texts)
    raw_s = time.perf_counter() - t0
    res["raw_encoder_docs_per_s"] = len(texts) / raw_s
    t0 = time.perf_counter()
    build_index(docs, tmp / "dense", legs=("bm25", "dense"), show_progress=False, batch_size=1024)
    pipe_s = time.perf_counter() - t0
    res["pipeline_docs_per_s"] = len(texts) / pipe_s
    res["pipeline_docs_per_s_excluding_model_load"] = len(texts) / max(pipe_s - res["model_load_seconds"], 1e-9)
    res["pipeline_vs_raw"] = res["pipeline_docs_per_s_excluding_model_load"] / res["raw_encoder_docs_per_s"]
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        res["sentence_transformers"] = f"not available ({e})"
    else:
        st = SentenceTransformer(path, device="cpu")
        st.max_seq_length = 256
        st.encode(texts[:16], batch_size=64)
        t0 = time.perf_counter()
        st_vecs = st.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
        st_s = time.perf_counter() - t0
        res["sentence_transformers_docs_per_s"] = len(texts) / st_s
        res["ours_vs_sentence_transformers"] = res["raw_encoder_docs_per_s"] / res["sentence_transformers_docs_per_s"]
        ours = enc.encode(texts[:32])
        res["max_abs_diff_vs_sentence_transformers"] = float(np.abs(ours - st_vecs[:32]).max())
    res["targets"] = {"pipeline_vs_raw": 0.9, "ours_vs_sentence_transformers": 1.0}
    return res


# ------------------------------------------------------------------------------------------ bm25

def section_bm25(quick: bool) -> dict[str, Any]:
    from benchmarks import bench_bm25
    from benchmarks.datasets import beir, synthetic_bm25

    out: dict[str, Any] = {"collections": {}}
    repeats = 1 if quick else 3
    with tempfile.TemporaryDirectory(dir=os.environ.get("RETRIEVER_BENCH_TMP")) as tmp:
        for col in (beir("scifact"), synthetic_bm25(20_000 if quick else 1_000_000)):
            e: dict[str, Any] = {"n_docs": col.n_docs, "n_queries": len(col.queries)}
            e["retriever"] = bench_bm25.bench_ours(col, Path(tmp), repeats)
            try:
                e["bm25s"] = bench_bm25.bench_bm25s(col, repeats)
            except ImportError as err:
                e["bm25s"] = {"status": f"not available ({err})"}
            if col.n_docs <= 100_000:
                try:
                    e["rank_bm25"] = bench_bm25.bench_rank_bm25(col, 20 if quick else 50)
                except ImportError as err:
                    e["rank_bm25"] = {"status": f"not available ({err})"}
            out["collections"][col.name] = e
            print(f"  bm25 {col.name}: ours {e['retriever']['end_to_end_t1']['qps_median']:.0f} QPS", flush=True)
    return out


# ----------------------------------------------------------------------------- peers' benchmarks

def _peer_section(leg: str, quick: bool) -> dict[str, Any]:
    """Run ``benchmarks/bench_<leg>.py`` (another branch's script) if present."""
    modname = f"benchmarks.bench_{leg}"
    try:
        mod = importlib.import_module(modname)
    except ImportError as e:
        return {"_status": "not available", "reason": f"{modname} is not on this branch ({e})"}
    fn = getattr(mod, "main", None)
    if fn is None:
        return {"_status": "not available", "reason": f"{modname} has no main(argv)"}
    before = {p: p.stat().st_mtime for p in RESULTS.glob("*.json")}
    rc = fn(["--quick"] if quick else [])
    written = [p.name for p in RESULTS.glob("*.json") if before.get(p) != p.stat().st_mtime
               and not p.name.startswith("run_")]
    res: dict[str, Any] = {"module": modname, "rc": rc, "files": written}
    for name in written:
        try:
            res.setdefault("reports", {})[name] = json.loads((RESULTS / name).read_text())
        except ValueError:
            pass
    if rc not in (0, None):
        res["_status"] = "error"
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (< 5 minutes on 2 cores)")
    ap.add_argument("--only", action="append", choices=SECTIONS, help="run only these sections (repeatable)")
    ap.add_argument("--out", default=str(RESULTS), help="results folder")
    ap.add_argument("--no-readme", action="store_true", help="do not regenerate README.md's bench section")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:])
    t_start = time.perf_counter()
    for name in args.only or SECTIONS:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            res = SECTION_FUNCS[name](args.quick)
            status = res.pop("_status", "ok")
        except Exception as e:  # a failing section is recorded, the others still run
            traceback.print_exc()
            res, status = {"error": f"{type(e).__name__}: {e}"}, "error"
        doc = {"section": name, "status": status, "quick": args.quick, "command": cmd, "machine": _machine(),
               "seconds": round(time.perf_counter() - t0, 1), "results": res}
        (out / f"run_{name}.json").write_text(json.dumps(doc, indent=1, default=_json_default))
        print(f"   {name}: {status} in {doc['seconds']} s", flush=True)
    from benchmarks.report import write_plots, write_summary

    write_plots(out)
    write_summary(out)
    if not args.no_readme and out.resolve() == RESULTS.resolve():
        from benchmarks.update_readme import update_readme
        update_readme()
    print(f"done in {time.perf_counter() - t_start:.0f} s; see {out / 'SUMMARY.md'}", flush=True)
    return 0


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


SECTION_FUNCS = {"hybrid": section_hybrid, "encode": section_encode, "indexing": section_indexing,
                 "bm25": section_bm25, "dense": lambda quick: _peer_section("dense", quick),
                 "sparse": lambda quick: _peer_section("sparse", quick)}

if __name__ == "__main__":
    sys.exit(main())
