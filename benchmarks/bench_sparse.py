"""Learned-sparse retrieval benchmark: this engine (exact, Seismic-style sweep) vs pyseismic-lsr,
bmp and scipy exact, on the same vectors, single thread, top-10.

Collections:
  scifact    SPLADE vectors of SciFact from the bundled 2-layer model (cached under
             benchmarks/results/raw/; ``--scifact-index DIR`` reuses the vectors of a built index).
  synthetic  a seeded generator calibrated to those vectors (see :func:`synthetic`); ``--quick``
             uses 20k documents / 100 queries instead of 1,000,000 / 1,000 (``--n-docs`` to choose);
             generated vectors are cached under benchmarks/results/raw/.

Reported per engine / operating point: QPS (median of ``--repeats`` runs), recall@10 against this
engine's exact mode (itself checked against scipy), build seconds, index bytes per posting.

    python3 benchmarks/bench_sparse.py --quick             # a few minutes
    python3 benchmarks/bench_sparse.py --collections synthetic,scifact --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from index.sparse_index import build_sparse_index, impact_scale  # noqa: E402
from retriever import _kernels  # noqa: E402
from retriever.legs.sparse import _BLOCK_ARGS  # noqa: E402

RAW = ROOT / "benchmarks" / "results" / "raw"
K = 10


# -- collections -----------------------------------------------------------------------------------
def synthetic(n_docs: int, n_queries: int = 1000, vocab: int = 30522, seed: int = 0, n_topics: int = 200,
              topic_terms: int = 1500, topic_share: float = 0.5):
    """Seeded learned-sparse collection calibrated to SciFact SPLADE vectors.

    Term popularity: Zipf–Mandelbrot p(r) ∝ (r + 200)^-2.0 over a random permutation of the
    vocabulary. Topics: ``n_topics`` topics, each favouring ``topic_terms`` vocabulary entries drawn
    by popularity; a document picks one topic, and ``topic_share`` of its draws come from that
    topic's subset (the rest from the global distribution). Documents: Poisson(120) draws,
    duplicates merged, weights log-normal(−0.83, 1.21). Queries: a random source document; half of
    ~40 terms sampled from the source's terms, half drawn like a document of the same topic;
    weights log-normal(−0.76, 1.23).

    Returns:
        ``(doc_csr, query_csr)``, each ``(indptr int64, terms uint32, weights float32)``.
    """
    rng = np.random.default_rng(seed)
    perm = rng.permutation(vocab)
    p = (np.arange(vocab) + 200.0) ** -2.0
    p /= p.sum()
    pop = np.empty(vocab)
    pop[perm] = p
    cdf = np.cumsum(pop)
    topics = [np.unique(np.searchsorted(cdf, rng.random(topic_terms * 2) * cdf[-1]))[:topic_terms]
              for _ in range(n_topics)]
    tcdf = [np.cumsum(pop[t]) for t in topics]

    def draw(doc_topic, counts):
        n = int(counts.sum())
        owner = np.repeat(np.arange(len(counts)), counts)
        from_topic = rng.random(n) < topic_share
        terms = np.searchsorted(cdf, rng.random(n) * cdf[-1]).astype(np.int64)
        for tp in np.unique(doc_topic):
            sel = np.flatnonzero(from_topic & (doc_topic[owner] == tp))
            if len(sel):
                c = tcdf[tp]
                terms[sel] = topics[tp][np.minimum(np.searchsorted(c, rng.random(len(sel)) * c[-1]), len(c) - 1)]
        key = np.unique(owner * vocab + np.minimum(terms, vocab - 1))
        own, term = key // vocab, key % vocab
        indptr = np.zeros(len(counts) + 1, np.int64)
        np.add.at(indptr, own + 1, 1)
        return np.cumsum(indptr), term.astype(np.uint32)

    doc_topic = rng.integers(0, n_topics, n_docs)
    d_ptr, d_terms = draw(doc_topic, np.maximum(rng.poisson(120, n_docs), 1))
    d_w = rng.lognormal(-0.83, 1.21, len(d_terms)).astype(np.float32)
    src = rng.integers(0, n_docs, n_queries)
    q_ptr_b, q_terms_b = draw(doc_topic[src], np.maximum(rng.poisson(20, n_queries), 1))
    rows = []
    for i, s in enumerate(src):
        own = d_terms[d_ptr[s]:d_ptr[s + 1]]
        pick = rng.choice(own, size=min(len(own), 20), replace=False)
        rows.append(np.union1d(pick, q_terms_b[q_ptr_b[i]:q_ptr_b[i + 1]]))
    q_ptr = np.zeros(n_queries + 1, np.int64)
    q_ptr[1:] = np.cumsum([len(r) for r in rows])
    q_terms = np.concatenate(rows).astype(np.uint32)
    q_w = rng.lognormal(-0.76, 1.23, len(q_terms)).astype(np.float32)
    return (d_ptr, d_terms, d_w), (q_ptr, q_terms, q_w)


def scifact(index_dir: str | None):
    """SciFact SPLADE vectors (docs from a built index or encoded here; test queries encoded here)."""
    cache = RAW / "scifact_splade.npz"
    if cache.is_file():
        z = np.load(cache)
        return (z["d_ptr"], z["d_terms"], z["d_w"]), (z["q_ptr"], z["q_terms"], z["q_w"])
    import gzip

    from index.encoders.sparse import SparseEncoder

    enc = SparseEncoder()
    data = ROOT.parent / "shared" / "data" / "scifact"
    if index_dir:
        from index.format import read_arrays
        from index.sparse_build import SPARSE_FWD
        from retriever.shards import IndexReader

        r = IndexReader(index_dir)
        parts = [read_arrays(s.dir / "sparse.arrow", SPARSE_FWD) for s in r.shards]
        ptrs, base = [np.zeros(1, np.int64)], 0
        for a in parts:
            ptrs.append(a["indptr"][1:].astype(np.int64) + base)
            base += int(a["indptr"][-1])
        d = (np.concatenate(ptrs), np.concatenate([a["terms"] for a in parts]),
             np.concatenate([a["weights"] for a in parts]))
    else:
        texts = []
        with gzip.open(data / "corpus.jsonl.gz", "rt") as f:
            for line in f:
                o = json.loads(line)
                texts.append(f"{o.get('title', '')} {o['text']}".strip())
        d = enc.encode(texts)
    qids = {line.split("\t")[0] for line in (data / "qrels.tsv").read_text().splitlines()[1:]}
    qs = [json.loads(x) for x in (data / "queries.jsonl").read_text().splitlines()]
    q = enc.encode_queries([o["text"] for o in qs if o["_id"] in qids])
    RAW.mkdir(parents=True, exist_ok=True)
    np.savez(cache, d_ptr=d[0], d_terms=d[1].astype(np.uint32), d_w=d[2], q_ptr=q[0], q_terms=q[1].astype(np.uint32),
             q_w=q[2])
    return (d[0], d[1].astype(np.uint32), d[2]), (q[0], q[1].astype(np.uint32), q[2])


# -- engines -----------------------------------------------------------------------------------------
CPU_TIMES: list[float] = []  # process CPU seconds of the last timed() call (median)


def timed(fn, repeats):
    """Run ``fn`` ``repeats`` times; returns (last output, median wall seconds). The median process
    CPU seconds go to CPU_TIMES[-1] (on a loaded machine CPU time is the fairer single-thread figure)."""
    times, cpu, out = [], [], None
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    CPU_TIMES.append(float(np.median(cpu)))
    return out, float(np.median(times))


def cpu_qps(nq):
    return nq / max(CPU_TIMES[-1], 1e-9)


def recall(ids, truth):
    r = []
    for a, b in zip(ids, truth):
        b = set(int(x) for x in b if x >= 0)
        if b:
            r.append(len(b & set(int(x) for x in a if x >= 0)) / len(b))
    return float(np.mean(r))


def run_collection(name, docs, queries, args, vocab=30522):
    d_ptr, d_terms, d_w = docs
    q_ptr, q_terms, q_w = queries
    n, nq = len(d_ptr) - 1, len(q_ptr) - 1
    rows = []
    print(f"[{name}] {n} docs ({len(d_terms) / n:.1f} nnz/doc), {nq} queries ({len(q_terms) / nq:.1f} nnz/q)",
          flush=True)
    scale = impact_scale(float(d_w.max()))
    t = time.perf_counter()
    ix = build_sparse_index(d_ptr, d_terms, d_w, n_terms=vocab, scale=scale, n_postings=args.n_postings,
                            block_size=args.block_size, summary_energy=args.summary_energy)
    build_s = time.perf_counter() - t
    qb = (q_ptr.astype(np.uint64), q_terms.astype(np.uint32), q_w.astype(np.float32))
    nnz = len(d_terms)
    exact_bytes = sum(ix[k].nbytes for k in ("offsets", "doc_ids", "impacts"))
    seis_bytes = sum(ix[k].nbytes for k in ("fwd_offsets", "fwd_terms", "fwd_values", *_BLOCK_ARGS))

    (ids, _, _), sec = timed(lambda: _kernels.sparse_exact_topk(
        *[ix[k] for k in ("offsets", "doc_ids", "impacts", "fwd_offsets", "fwd_terms", "fwd_values")], scale, *qb, K,
        n_threads=1), args.repeats)
    truth = ids
    rows.append({"engine": "retriever-exact", "qps": nq / sec, "cpu_qps": cpu_qps(nq), "recall@10": 1.0, "build_s": build_s,
                 "bytes_per_posting": exact_bytes / nnz})

    import scipy.sparse as sp

    D = sp.csr_matrix((ix["fwd_values"].astype(np.float32) * np.float32(scale), ix["fwd_terms"],
                       ix["fwd_offsets"].astype(np.int64)), shape=(n, vocab))
    DT = D.T.tocsr()
    Q = sp.csr_matrix((qb[2], qb[1], qb[0].astype(np.int64)), shape=(nq, vocab))
    nq_sc = min(nq, args.scipy_queries)

    def scipy_run():
        out = np.full((nq_sc, K), -1, np.int64)
        for i in range(nq_sc):
            s = (Q[i] @ DT).toarray().ravel()
            top = np.argpartition(-s, K)[:K]
            out[i] = top[np.argsort(-s[top], kind="stable")]
        return out
    sc_ids, sec = timed(scipy_run, args.repeats)
    rows.append({"engine": "scipy-exact", "qps": nq_sc / sec, "cpu_qps": cpu_qps(nq_sc), "recall@10": recall(sc_ids, truth[:nq_sc]),
                 "bytes_per_posting": (D.data.nbytes + D.indices.nbytes) / nnz})

    for qc in args.query_cuts:
        for hf in args.heap_factors:
            (ids, _, _), sec = timed(lambda: _kernels.sparse_seismic_topk(
                ix["fwd_offsets"], ix["fwd_terms"], ix["fwd_values"], scale, *[ix[k] for k in _BLOCK_ARGS], *qb, K,
                query_cut=qc, heap_factor=hf, n_threads=1), args.repeats)
            rows.append({"engine": "retriever-seismic", "query_cut": qc, "heap_factor": hf, "qps": nq / sec, "cpu_qps": cpu_qps(nq),
                         "recall@10": recall(ids, truth), "build_s": build_s,
                         "bytes_per_posting": seis_bytes / nnz, "n_postings": args.n_postings,
                         "block_size": args.block_size})
            print(f"  retriever-seismic qc={qc} hf={hf}: {rows[-1]['qps']:.0f} QPS, recall {rows[-1]['recall@10']:.3f}",
                  flush=True)

    try:
        rows += run_pyseismic(docs, queries, truth, args)
    except Exception as e:  # noqa: BLE001 - report, keep the other figures
        rows.append({"engine": "pyseismic", "error": f"{type(e).__name__}: {e}"})
    try:
        rows += run_bmp(docs, queries, truth, args)
    except Exception as e:  # noqa: BLE001
        rows.append({"engine": "bmp", "error": f"{type(e).__name__}: {e}"})
    for r in rows:
        if "qps" in r:
            print(f"  {r['engine']:<18} {r.get('query_cut', ''):>3} {r.get('heap_factor', r.get('alpha', '')):>4} "
                  f"{r['qps']:9.1f} QPS {r['cpu_qps']:9.1f} cpu-QPS  recall@10 {r['recall@10']:.3f}", flush=True)
        else:
            print(f"  {r['engine']}: {r.get('error')}", flush=True)
    return {"collection": name, "n_docs": n, "n_queries": nq, "nnz_per_doc": len(d_terms) / n,
            "nnz_per_query": len(q_terms) / nq, "rows": rows}


def run_pyseismic(docs, queries, truth, args):
    from seismic import SeismicDataset, SeismicIndex, get_seismic_string

    st = get_seismic_string()
    d_ptr, d_terms, d_w = docs
    q_ptr, q_terms, q_w = queries
    ds = SeismicDataset()
    for i in range(len(d_ptr) - 1):
        a, b = d_ptr[i], d_ptr[i + 1]
        ds.add_document(str(i), d_terms[a:b].astype(str).astype(st), d_w[a:b].astype(np.float32))
    t = time.perf_counter()
    index = SeismicIndex.build_from_dataset(ds, n_postings=args.n_postings, centroid_fraction=1.0 / args.block_size,
                                            summary_energy=args.summary_energy, num_threads=1)
    build_s = time.perf_counter() - t
    nq = len(q_ptr) - 1
    qids = np.array([str(i) for i in range(nq)], dtype=st)
    # terms no document has contribute nothing; pyseismic is given only known tokens
    present = np.zeros(int(max(d_terms.max(), q_terms.max())) + 1, bool)
    present[d_terms] = True
    keep = [present[q_terms[q_ptr[i]:q_ptr[i + 1]]] for i in range(nq)]
    comps = [q_terms[q_ptr[i]:q_ptr[i + 1]][keep[i]].astype(str).astype(st) for i in range(nq)]
    vals = [q_w[q_ptr[i]:q_ptr[i + 1]][keep[i]].astype(np.float32) for i in range(nq)]
    rows = []
    for qc in args.query_cuts:
        for hf in args.heap_factors:
            res, sec = timed(lambda: index.batch_search(qids, comps, vals, k=K, query_cut=qc, heap_factor=hf,
                                                        num_threads=1), args.repeats)
            # batch_search does not keep the input order: rows are matched by query id
            byq = {r[0][0]: [int(h[2]) for h in r] for r in res if r}
            ids = [byq.get(str(i), []) for i in range(nq)]
            rows.append({"engine": "pyseismic", "query_cut": qc, "heap_factor": hf, "qps": nq / sec, "cpu_qps": cpu_qps(nq),
                         "recall@10": recall(ids, truth), "build_s": build_s})
    return rows


def run_bmp(docs, queries, truth, args):
    import bmp

    d_ptr, d_terms, d_w = docs
    q_ptr, q_terms, q_w = queries
    scale = 100.0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "index.bmp")
        t = time.perf_counter()
        ind = bmp.Indexer(path, bsize=32, compress_range=False)
        for i in range(len(d_ptr) - 1):
            a, b = d_ptr[i], d_ptr[i + 1]
            ind.add_document(str(i), {str(int(x)): max(1, int(w * scale)) for x, w in zip(d_terms[a:b], d_w[a:b])})
        ind.finish()
        build_s = time.perf_counter() - t
        size = os.path.getsize(path)
        s = bmp.Searcher(path)
        nq = len(q_ptr) - 1
        qs = [{str(int(x)): float(w * scale) for x, w in zip(q_terms[q_ptr[i]:q_ptr[i + 1]], q_w[q_ptr[i]:q_ptr[i + 1]])}
              for i in range(nq)]
        rows = []
        for alpha in (1.0, 0.9, 0.8, 0.7):
            res, sec = timed(lambda: [s.search(q, k=K, alpha=alpha, beta=1.0)[0] for q in qs], args.repeats)
            ids = [[int(x) for x in r] for r in res]
            rows.append({"engine": "bmp", "alpha": alpha, "qps": nq / sec, "cpu_qps": cpu_qps(nq), "recall@10": recall(ids, truth),
                         "build_s": build_s, "bytes_per_posting": size / len(d_terms)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collections", default="synthetic,scifact")
    ap.add_argument("--quick", action="store_true",
                    help="synthetic with 20k documents and 100 queries, SciFact, short sweep, 1 repeat")
    ap.add_argument("--n-docs", type=int, default=None)
    ap.add_argument("--scifact-index", default=None, help="reuse the vectors of a built index")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-postings", type=int, default=None)
    ap.add_argument("--block-size", type=int, default=10)
    ap.add_argument("--summary-energy", type=float, default=0.4)
    ap.add_argument("--query-cuts", default="1,2,3,5,8,12")
    ap.add_argument("--heap-factors", default="0.7,0.9,1.0")
    ap.add_argument("--scipy-queries", type=int, default=200, help="queries timed for scipy (it is slow)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sparse.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats = 1
        args.query_cuts, args.heap_factors = "2,5,10", "0.9"
    args.query_cuts = [int(x) for x in args.query_cuts.split(",")]
    args.heap_factors = [float(x) for x in args.heap_factors.split(",")]
    results = []
    for coll in args.collections.split(","):
        if coll == "synthetic":
            n = args.n_docs or (20_000 if args.quick else 1_000_000)
            nq = 100 if args.quick else 1000
            cache = RAW / f"synthetic_{n}_{nq}.npz"
            if cache.is_file():
                z = np.load(cache)
                docs, queries = (z["d_ptr"], z["d_terms"], z["d_w"]), (z["q_ptr"], z["q_terms"], z["q_w"])
            else:
                docs, queries = synthetic(n, n_queries=nq)
                RAW.mkdir(parents=True, exist_ok=True)
                np.savez(cache, d_ptr=docs[0], d_terms=docs[1], d_w=docs[2], q_ptr=queries[0], q_terms=queries[1],
                         q_w=queries[2])
            args.n_postings = args.n_postings or max(500, n // 250)
        elif coll == "scifact":
            docs, queries = scifact(args.scifact_index)
            args.n_postings = args.n_postings or 1000
        else:
            raise SystemExit(f"unknown collection {coll!r}")
        results.append(run_collection(coll, docs, queries, args))
        args.n_postings = None if coll == "synthetic" else args.n_postings
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "k": K, "threads": 1,
                                          "repeats": args.repeats, "results": results}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
