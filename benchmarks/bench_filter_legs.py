"""Filtered search benchmark: allow masks inside every leg, against FAISS and LanceDB.

Synthetic documents (``benchmarks/datasets.py`` text, clustered unit vectors with a decaying
spectrum and SPLADE-like sparse vectors) carry typed metadata fields: ``num`` (uniform int in [0, 1000)), ``cat`` (Zipfian
category, 100 values), ``flag`` (bool) and ``ts`` (timestamp). One index holds the BM25, dense
(built with an IVF structure) and sparse legs. For each selectivity (0.1 %, 1 %, 10 %, 50 %:
``num < 1 / 10 / 100 / 500``) the benchmark measures, per mode, QPS of a filtered batch and
recall@10 against the exact filtered top-10 (BM25 and sparse exact: recall 1 by construction, the
figure is the filtered / unfiltered QPS ratio), and the mask compilation on its own. In the same
run: FAISS on the same vectors with the same index type and an ``IDSelectorBitmap`` (nprobe raised
until it reaches the recall of ours), FAISS post-filtering (search k', keep the passing ids), and
LanceDB (embedded) pre-filtered vector search and hybrid search (FTS + vector) on the same data.

Masks are compiled with pyarrow compute over the shards' typed metadata columns (or
``retriever.filters.compile_filter`` when present). Timings: medians of interleaved passes (see
``benchmarks/timing.py``); run under ``flock`` so runs do not overlap.

    python -m benchmarks.bench_filter_legs --docs 200000 --out benchmarks/results/filters_200k.json
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.datasets import synthetic_bm25, synthetic_dense, synthetic_sparse
from benchmarks.timing import machine, qps, timed_runs

#: selectivity -> threshold on ``num`` (uniform in [0, 1000))
SELECTIVITIES = {0.001: 1, 0.01: 10, 0.1: 100, 0.5: 500}
K = 10
#: each timed pass repeats its batch for at least this long (sub-ms batches are at the mercy of
#: one scheduler tick on a shared VM)
MIN_S = 0.3
SPECTRUM_DECAY = 0.97


def build(n_docs: int, out: Path, *, dim: int, nlist: int, n_queries: int, seed: int = 42,
          legs: tuple[str, ...] = ("bm25", "dense", "sparse")) -> dict[str, Any]:
    """Build the index of ``n_docs`` synthetic documents with typed fields (the legs ``legs``:
    all three by default); returns the queries and the raw vectors (for the FAISS and LanceDB
    peers; ``vecs`` / ``qv`` are None without the dense leg). An index already at ``out`` (a
    complete earlier build: ``out/BUILD_OK`` holds its settings, the legs included) is reused;
    the data are regenerated from the seed (identical), only the index build is skipped."""
    from retriever import build_index
    from retriever.index.config import DenseConfig

    with_dense = "dense" in legs
    text = synthetic_bm25(n_docs, vocab=200_000, mean_len=24.0, n_queries=n_queries, seed=seed)
    sparse = synthetic_sparse(n_docs, vocab=30522, nnz=40, q_nnz=12, n_queries=n_queries, seed=seed)
    rng = np.random.default_rng([seed, 99])
    num = rng.integers(0, 1000, n_docs)
    zipf = 1.0 / np.arange(1, 101) ** 1.1
    cat = rng.choice(100, n_docs, p=zipf / zipf.sum())
    flag = rng.random(n_docs) < 0.3
    ts = 1_600_000_000 + rng.integers(0, 3 * 365 * 86400, n_docs)
    vecs = qv = None
    if with_dense:
        dense = synthetic_dense(n_docs, dim, n_queries=n_queries, seed=seed)
        # a decaying spectrum (coordinate j scaled by SPECTRUM_DECAY ** j), as real embeddings have
        # after the index's PCA rotation: what makes Matryoshka prefixes (the funnel) meaningful
        decay = (SPECTRUM_DECAY ** np.arange(dim)).astype(np.float32)
        vecs = dense.all() * decay
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        qv = np.ascontiguousarray(dense.queries * decay)
        qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    ids_l, w_l = zip(*sparse.docs())
    ptr = np.zeros(n_docs + 1, np.int64)
    ptr[1:] = np.cumsum([len(i) for i in ids_l])
    texts: list[str] = []

    def docs():
        import datetime as dt
        for i, d in enumerate(text.docs()):
            texts.append(d["text"])
            yield {**d, "num": int(num[i]), "cat": f"c{int(cat[i])}", "flag": bool(flag[i]),
                   "ts": dt.datetime.fromtimestamp(int(ts[i]), dt.timezone.utc)}

    t0 = time.perf_counter()
    stamp = out / "BUILD_OK"
    conf = {"docs": n_docs, "dim": dim, "nlist": nlist, "queries": n_queries, "seed": seed}
    if tuple(legs) != ("bm25", "dense", "sparse"):
        conf["legs"] = list(legs)  # the full build's stamp stays as it was
    settings = json.dumps(conf)
    if stamp.is_file() and stamp.read_text() == settings:
        for _ in docs():  # the texts, for LanceDB
            pass
        build_s, cached = float((out / "BUILD_S").read_text()), True
    else:
        if out.exists():
            import shutil
            shutil.rmtree(out)
        extra: dict[str, Any] = {}
        if with_dense:
            extra = {"dense_vectors": vecs, "dense": DenseConfig(dtype="float32", faiss_factory=f"IVF{nlist},Flat")}
        build_index(docs(), out, legs=tuple(legs), show_progress=False,
                    sparse_vectors=(ptr, np.concatenate(ids_l).astype(np.uint32),
                                    np.concatenate(w_l).astype(np.float32)),
                    shard_size=max(n_docs, 1), **extra)
        build_s, cached = time.perf_counter() - t0, False
        (out / "BUILD_S").write_text(str(build_s))
        stamp.write_text(settings)
    return {"build_s": build_s, "cached": cached, "queries": text.queries, "qv": qv,
            "qsv": sparse.queries, "vecs": vecs, "num": num, "texts": texts}


def compile_masks(reader: Any, threshold: int) -> list[np.ndarray]:
    """Per shard the uint8 mask of ``num < threshold`` (retriever.filters when it exists, else
    pyarrow compute over the typed ``metadata.num`` column)."""
    try:
        from retriever.filters import compile_filter  # the filter branch's compiler
    except ImportError:
        compile_filter = None
    if compile_filter is not None:
        masks = compile_filter(pc.field("num") < threshold, reader, list(range(len(reader.shards))))
        return [np.ones(s.rows, np.uint8) if m is None else m for s, m in zip(reader.shards, masks)]
    out = []
    for s in reader.shards:
        col = pc.struct_field(s.docs.column("metadata"), "num")
        out.append(np.asarray(pc.fill_null(pc.less(col, threshold), False)).astype(np.uint8))
    return out


def recall(got: np.ndarray, n_found: np.ndarray, want: np.ndarray, want_n: np.ndarray) -> float:
    """recall@10 of rows ``got`` against the exact rows ``want`` (both padded with -1)."""
    hits = total = 0
    for q in range(len(want)):
        w = want[q, :want_n[q]]
        hits += len(np.intersect1d(got[q, :n_found[q]], w))
        total += len(w)
    return hits / total if total else 1.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    import faiss

    from retriever import Retriever
    from retriever.fusion import RRF
    from retriever.params import parse_leg_params

    work = args.work if args.work is not None else Path(tempfile.mkdtemp(prefix="bench_filters_"))
    work.mkdir(parents=True, exist_ok=True)
    data = build(args.docs, work / "ix", dim=args.dim, nlist=args.nlist, n_queries=args.queries)
    print(f"built {args.docs} docs in {data['build_s']:.1f}s (cached: {data['cached']})", flush=True)
    r = Retriever.open(work / "ix", n_threads=args.threads)
    qs, qv, qsv, vecs = data["queries"], data["qv"], data["qsv"], data["vecs"]
    nq = len(qs)
    eng = r.engine

    def search(mode: str, masks, params: dict | None = None, k: int = K):
        p = parse_leg_params(params)
        prep = {}
        if mode in ("dense", "hybrid"):
            prep["dense"] = eng.legs["dense"].prepare_vectors(qv, p.get("dense"), args.threads)
        if mode in ("sparse", "hybrid"):
            prep["sparse"] = eng.legs["sparse"].prepare_vectors(qsv, p.get("sparse"), args.threads)
        return eng.search(qs, k=k, mode=mode, fusion=RRF(), depth=100, n_threads=args.threads,
                          prepared=prep, params=p, allow=masks)

    ours = {
        "bm25": ("bm25", {}),
        "sparse-exact": ("sparse", {}),
        "sparse-seismic": ("sparse", {"sparse": {"algorithm": "seismic"}}),
        "dense-flat": ("dense", {"dense": {"index": "Flat"}}),
        "dense-ivf": ("dense", {"dense": {"nprobe": args.nprobe}}),
        "dense-funnel": ("dense", {"dense": {"dim": args.dim // 2, "shortlist": 200}}),
        "hybrid": ("hybrid", {"dense": {"nprobe": args.nprobe}}),
    }
    exact_of = {"sparse-seismic": ("sparse", {}), "dense-ivf": ("dense", {"dense": {"exhaustive": True}}),
                "dense-funnel": ("dense", {"dense": {"exhaustive": True}}),
                "dense-flat": ("dense", {"dense": {"exhaustive": True}}),
                "hybrid": ("hybrid", {"dense": {"exhaustive": True}})}
    # peers: one FAISS IVF index over the same vectors, and LanceDB
    fpath = work / f"faiss_ivf{args.nlist}_{args.docs}.index"
    if fpath.is_file() and data["cached"]:  # cached with the index it was built beside
        fivf = faiss.read_index(str(fpath))
    else:
        quant = faiss.IndexFlatIP(args.dim)
        fivf = faiss.IndexIVFFlat(quant, args.dim, args.nlist, faiss.METRIC_INNER_PRODUCT)
        fivf.train(vecs[np.random.default_rng(1).choice(len(vecs), min(len(vecs), 100 * args.nlist),
                                                        replace=False)])
        fivf.add(vecs)
        faiss.write_index(fivf, str(fpath))
    fflat = faiss.IndexFlatIP(args.dim)
    fflat.add(vecs)
    lance = None
    if not args.no_lancedb:
        import lancedb

        db = lancedb.connect(str(work / "lance"))
        t0 = time.perf_counter()
        name = f"docs_{args.docs}"
        lstamp = work / f"lance_{name}_OK"
        if lstamp.is_file() and data["cached"]:
            tbl = db.open_table(name)
            lance = {"table": tbl, "build_s": float(lstamp.read_text())}
        else:
            tbl = db.create_table(name, pa.table({
                "id": pa.array(np.arange(args.docs)), "num": pa.array(data["num"]), "text": pa.array(data["texts"]),
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), args.dim)}), mode="overwrite")
            tbl.create_fts_index("text", replace=True)
            lance = {"table": tbl, "build_s": time.perf_counter() - t0}
            lstamp.write_text(str(lance["build_s"]))
    if args.build_only:
        return {"build_s": data["build_s"], "cached": data["cached"]}
    faiss.omp_set_num_threads(args.threads)

    result: dict[str, Any] = {"docs": args.docs, "queries": nq, "dim": args.dim, "nlist": args.nlist,
                              "nprobe": args.nprobe, "threads": args.threads, "build_s": data["build_s"],
                              "build_cached": data["cached"],
                              "machine": machine(), "selectivities": {}}
    # unfiltered reference (every mode without a mask: QPS and recall; filtered QPS of BM25 and
    # sparse are compared with it)
    unf: dict[str, Any] = {}
    for name, (mode, params) in ours.items():
        entry = qps(nq, timed_runs(lambda: search(mode, None, params), repeats=args.repeats, min_seconds=MIN_S))
        if name in exact_of:
            res = search(mode, None, params)
            ex = search(*exact_of[name][:1], None, exact_of[name][1])
            entry["recall@10"] = recall(res.ids, res.n_found, ex.ids, ex.n_found)
        unf[name] = entry
        print(f"unfiltered: {name:15s} qps {entry['qps_median']:9.1f} recall {entry.get('recall@10', 1.0):.3f}",
              flush=True)
    result["unfiltered"] = unf
    base = {name: unf[name]["qps_median"] for name in ("bm25", "sparse-exact", "sparse-seismic")}
    for sel, thr in SELECTIVITIES.items():
        t0 = time.perf_counter()
        masks = compile_masks(r.reader, thr)
        compile_ms = (time.perf_counter() - t0) * 1e3
        comp = timed_runs(lambda: compile_masks(r.reader, thr), repeats=args.repeats, min_seconds=MIN_S)
        allow = np.concatenate(masks)
        n_pass = int(allow.sum())
        row: dict[str, Any] = {"threshold": f"num < {thr}", "passing": n_pass,
                               "mask_compile_ms": {"first": compile_ms, "median": float(np.median(comp) * 1e3)}}
        exact_cache: dict[str, Any] = {}
        for name, (mode, params) in ours.items():
            runs = timed_runs(lambda: search(mode, masks, params), repeats=args.repeats, min_seconds=MIN_S)
            res = search(mode, masks, params)
            entry = {**qps(nq, runs)}
            got_ok = allow[res.ids[res.ids >= 0]].all()
            entry["no_masked_doc"] = bool(got_ok)
            entry["k_met"] = bool((res.n_found == min(K, n_pass)).all()) if mode != "bm25" and mode != "sparse" \
                else None
            if name in exact_of:
                em, ep = exact_of[name]
                key = json.dumps([em, ep])
                if key not in exact_cache:
                    exact_cache[key] = search(em, masks, ep)
                ex = exact_cache[key]
                entry["recall@10"] = recall(res.ids, res.n_found, ex.ids, ex.n_found)
            else:
                entry["recall@10"] = 1.0
            if name in base:
                entry["vs_unfiltered"] = entry["qps_median"] / base[name]
            row[name] = entry
            print(f"sel {sel:>6}: {name:15s} qps {entry['qps_median']:9.1f} recall {entry['recall@10']:.3f}",
                  flush=True)
        # FAISS peers on the same vectors (global ordinals = row numbers: one shard)
        ex = exact_cache[json.dumps(list(exact_of["dense-ivf"]))]
        bits = np.packbits(allow, bitorder="little")
        fsel = faiss.IDSelectorBitmap(len(allow), faiss.swig_ptr(bits))
        target = row["dense-ivf"]["recall@10"]
        peer: dict[str, Any] = {}
        for nprobe in sorted({args.nprobe, 2 * args.nprobe, 4 * args.nprobe, 8 * args.nprobe, 16 * args.nprobe,
                              args.nlist} - {0}):
            nprobe = min(nprobe, args.nlist)
            prm = faiss.SearchParametersIVF(nprobe=nprobe, sel=fsel)
            D, I = fivf.search(qv, K, params=prm)
            rc = recall(I, (I >= 0).sum(1), ex.ids, ex.n_found)
            runs = timed_runs(lambda: fivf.search(qv, K, params=prm), repeats=args.repeats, min_seconds=MIN_S)
            peer[str(nprobe)] = {"recall@10": rc, **qps(nq, runs)}
            if rc >= target:
                break
        row["faiss-ivf-idselector"] = peer
        prm = faiss.SearchParameters(sel=fsel)
        nf = min(nq, args.flat_queries)  # FAISS's selector path over every row is slow at 1M
        runs = timed_runs(lambda: fflat.search(qv[:nf], K, params=prm), repeats=args.repeats, min_seconds=MIN_S)
        row["faiss-flat-idselector"] = {**qps(nf, runs), "recall@10": 1.0, "queries": nf}
        # post-filtering: search k' = K / selectivity (capped), keep the passing ids
        kp = int(min(len(allow), max(K, math.ceil(2 * K / sel))))
        prm = faiss.SearchParametersIVF(nprobe=args.nprobe)

        def post() -> tuple[np.ndarray, np.ndarray]:
            D, I = fivf.search(qv, kp, params=prm)
            ok = (I >= 0) & allow[np.maximum(I, 0)].astype(bool)
            rank = np.cumsum(ok, 1) - 1
            out = np.full((nq, K), -1, np.int64)
            rr, cc = np.nonzero(ok & (rank < K))
            out[rr, rank[rr, cc]] = I[rr, cc]
            return out, (out >= 0).sum(1)

        runs = timed_runs(post, repeats=args.repeats, min_seconds=MIN_S)
        pi, pn = post()
        row["faiss-ivf-postfilter"] = {"k_prime": kp, **qps(nq, runs), "recall@10": recall(pi, pn, ex.ids, ex.n_found),
                                       "k_met": bool((pn == min(K, n_pass)).all())}
        if lance is not None:
            tbl = lance["table"]
            lq = min(nq, args.lance_queries)
            where = f"num < {thr}"

            def lvec():
                return [tbl.search(qv[i]).metric("dot").where(where, prefilter=True).limit(K)
                        .to_arrow().column("id").to_numpy() for i in range(lq)]

            def lhyb():
                return [tbl.search(query_type="hybrid").vector(qv[i]).text(qs[i]).where(where, prefilter=True)
                        .limit(K).to_arrow().column("id").to_numpy() for i in range(lq)]

            for name, fn in (("lancedb-vector", lvec), ("lancedb-hybrid", lhyb)):
                runs = timed_runs(fn, repeats=max(1, args.repeats - 1))
                got = fn()
                gi = np.full((lq, K), -1, np.int64)
                for i, g in enumerate(got):
                    gi[i, :len(g)] = g[:K]
                entry = {**qps(lq, runs), "queries": lq}
                if name == "lancedb-vector":
                    entry["recall@10"] = recall(gi, (gi >= 0).sum(1), ex.ids[:lq], ex.n_found[:lq])
                row[name] = entry
                print(f"sel {sel:>6}: {name:15s} qps {entry['qps_median']:9.1f}", flush=True)
        # the targets
        fa = [v for v in peer.values() if v["recall@10"] >= row["dense-ivf"]["recall@10"]]
        row["targets"] = {
            "dense_ivf_vs_faiss_idselector": (row["dense-ivf"]["qps_median"] / fa[0]["qps_median"]) if fa else None,
            "hybrid_vs_lancedb_hybrid": (row["hybrid"]["qps_median"] / row["lancedb-hybrid"]["qps_median"])
            if "lancedb-hybrid" in row else None,
        }
        result["selectivities"][str(sel)] = row
    if lance is not None:
        result["lancedb_build_s"] = lance["build_s"]
    return result


#: the modes ``--legs`` can time on their own (name -> (mode, leg params))
REF_K = 1000  # depth of the reference search that counts the matching passing documents (k-met check)
LEG_MODES = {"bm25": {"bm25": ("bm25", {})},
             "sparse": {"sparse-exact": ("sparse", {}), "sparse-seismic": ("sparse", {"sparse": {"algorithm": "seismic"}})}}


def run_legs(args: argparse.Namespace, legs: list[str]) -> dict[str, Any]:
    """Filtered against unfiltered QPS of the BM25 and / or sparse modes only (no dense leg, no
    peers): an index of the ``bm25`` and ``sparse`` legs (cached under ``--work``), then
    ``--repeats`` interleaved rounds, each timing every mode unfiltered and at every selectivity
    once (a pass of at least ``MIN_S`` seconds each), so load drift on a shared machine hits the
    filtered and unfiltered figures alike. Per mode and selectivity: median QPS with min / max,
    the ratio of the medians, and the median (min / max) of the per-round ratios filtered /
    unfiltered. Checks on the side: no masked document returned, k met whenever k pass, and the
    exact sparse results equal to a brute-force top-k over the passing documents' forward rows
    (ids, and scores to float32 rounding) on the first 10 queries."""
    from retriever import Retriever
    from retriever.fusion import RRF
    from retriever.params import parse_leg_params
    from benchmarks.timing import timed_pass

    work = args.work if args.work is not None else Path(tempfile.mkdtemp(prefix="bench_filters_"))
    work.mkdir(parents=True, exist_ok=True)
    data = build(args.docs, work / "ix_bm25_sparse", dim=args.dim, nlist=args.nlist, n_queries=args.queries,
                 legs=("bm25", "sparse"))
    print(f"built {args.docs} docs in {data['build_s']:.1f}s (cached: {data['cached']})", flush=True)
    if args.build_only:
        return {"build_s": data["build_s"], "cached": data["cached"]}
    r = Retriever.open(work / "ix_bm25_sparse", n_threads=args.threads)
    qs, qsv = data["queries"], data["qsv"]
    nq = len(qs)
    eng = r.engine
    modes = {name: mp for leg in legs for name, mp in LEG_MODES[leg].items()}

    def search(mode: str, masks, params: dict, k: int = K):
        p = parse_leg_params(params)
        prep = {}
        if mode == "sparse":
            prep["sparse"] = eng.legs["sparse"].prepare_vectors(qsv, p.get("sparse"), args.threads)
        return eng.search(qs, k=k, mode=mode, fusion=RRF(), depth=max(100, k), n_threads=args.threads,
                          prepared=prep, params=p, allow=masks)

    sels: dict[str, Any] = {"unfiltered": None}
    info: dict[str, Any] = {}
    for sel, thr in SELECTIVITIES.items():
        t0 = time.perf_counter()
        masks = compile_masks(r.reader, thr)
        allow = np.concatenate(masks)
        sels[str(sel)] = masks
        info[str(sel)] = {"threshold": f"num < {thr}", "passing": int(allow.sum()),
                          "mask_compile_ms_first": (time.perf_counter() - t0) * 1e3}
    checks: dict[str, Any] = {}
    for name, (mode, params) in modes.items():
        for key, masks in sels.items():
            res = search(mode, masks, params)
            allow = None if masks is None else np.concatenate(masks)
            # k met: K hits whenever K passing documents match the query (a BM25 / sparse search
            # returns only matching documents), fewer only when fewer match; how many match is
            # counted by the exact search (BM25: the exhaustive algorithm) at depth REF_K
            ref_params = {"bm25": {"algorithm": "exhaustive"}} if mode == "bm25" else {}
            ref = search(mode, masks, ref_params, k=REF_K)
            c = {"no_masked_doc": bool(allow is None or allow[res.ids[res.ids >= 0]].all()),
                 "k_met": bool((res.n_found == np.minimum(K, ref.n_found)).all()),
                 "queries_with_fewer_than_k_matching": int((ref.n_found < K).sum())}
            if name == "sparse-exact":
                c["brute_force_equal"] = _sparse_brute_force_equal(eng.legs["sparse"], qsv[:10], allow, res)
            checks[f"{name}@{key}"] = c
    times: dict[str, dict[str, list[float]]] = {n: {k: [] for k in sels} for n in modes}
    for rnd in range(args.repeats):
        for name, (mode, params) in modes.items():
            for key, masks in sels.items():
                if rnd == 0:
                    search(mode, masks, params)  # warm-up, untimed
                times[name][key].append(timed_pass(lambda: search(mode, masks, params), MIN_S)[0])
        print(f"round {rnd + 1}/{args.repeats} done", flush=True)
    out: dict[str, Any] = {"docs": args.docs, "queries": nq, "threads": args.threads, "rounds": args.repeats,
                           "build_s": data["build_s"], "build_cached": data["cached"], "machine": machine(),
                           "selectivities": info, "modes": {}}
    for name in modes:
        base = qps(nq, times[name]["unfiltered"])
        row: dict[str, Any] = {"unfiltered": base}
        for key in sels:
            if key == "unfiltered":
                continue
            e = qps(nq, times[name][key])
            ratios = [u / f for u, f in zip(times[name]["unfiltered"], times[name][key])]
            e["vs_unfiltered"] = e["qps_median"] / base["qps_median"]
            e["vs_unfiltered_per_round"] = {"median": float(np.median(ratios)), "min": min(ratios),
                                            "max": max(ratios)}
            e.update(checks[f"{name}@{key}"])
            row[key] = e
            print(f"{name:15s} sel {key:>6}: qps {e['qps_median']:9.1f} ({e['qps_min']:.1f}-{e['qps_max']:.1f}) "
                  f"vs unfiltered {base['qps_median']:.1f}: {e['vs_unfiltered']:.3f}x "
                  f"(per round {min(ratios):.3f}-{max(ratios):.3f})", flush=True)
        out["modes"][name] = row
    return out


def _sparse_brute_force_equal(leg: Any, qsv: list, allow: np.ndarray | None, res: Any) -> bool:
    """True when the exact sparse rows of ``res`` (first ``len(qsv)`` queries) are the top-k of a
    brute-force float64 scoring of every passing document (one shard): equal id sets where the
    float64 k-th and (k+1)-th scores are apart by more than float32 slack, equal counts always."""
    s, a = leg.shards[0]
    fo = a["fwd_offsets"].astype(np.int64)
    doc = np.repeat(np.arange(s.rows), np.diff(fo))
    for q, (ti, w) in enumerate(qsv):
        qd = np.zeros(leg.vocab_size)
        qd[np.asarray(ti)] = w
        sc = np.bincount(doc, weights=qd[a["fwd_terms"]] * a["fwd_values"], minlength=s.rows) * leg.scale
        if allow is not None:
            sc[allow == 0] = 0
        pos = np.flatnonzero(sc > 0)
        want = pos[np.argsort(-sc[pos], kind="stable")][:K]
        got = res.ids[q, :res.n_found[q]]
        if len(got) != len(want):
            return False
        if len(pos) > K:
            kth, nxt = np.sort(sc[pos])[::-1][K - 1:K + 1]
            if kth - nxt <= 1e-5 * kth:
                continue  # a near tie at the boundary: either order is exact to float32
        if set(got.tolist()) != set(want.tolist()):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000, help="synthetic documents (default 1,000,000)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--nlist", type=int, default=1024)
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lance-queries", type=int, default=50, help="queries sent to LanceDB (one call each)")
    ap.add_argument("--no-lancedb", action="store_true")
    ap.add_argument("--flat-queries", type=int, default=200, help="queries sent to FAISS flat + IDSelector")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON result here")
    ap.add_argument("--work", type=Path, default=None,
                    help="scratch folder for the index, the FAISS index and the LanceDB table, reused by a "
                         "later run with the same settings (default: a new temporary folder)")
    ap.add_argument("--build-only", action="store_true", help="build (or check) the cached index and stop")
    ap.add_argument("--legs", default=None,
                    help="comma-separated subset of 'bm25,sparse': time only these legs' modes, filtered "
                         "against unfiltered in interleaved rounds, on an index of the BM25 and sparse legs "
                         "(no dense leg, no FAISS or LanceDB); default: the full benchmark")
    args = ap.parse_args(argv)
    if args.legs is not None:
        legs = [x.strip() for x in args.legs.split(",") if x.strip()]
        bad = [x for x in legs if x not in LEG_MODES]
        if bad or not legs:
            ap.error(f"--legs: unknown leg(s) {bad or args.legs!r}; choose from {sorted(LEG_MODES)}")
        res = run_legs(args, legs)
    else:
        res = run(args)
    res["command"] = "python -m benchmarks.bench_filter_legs " + " ".join(
        a for a in (argv if argv is not None else __import__("sys").argv[1:]))
    text = json.dumps(res, indent=1, default=float)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
