"""Dense search benchmark: full-dimension exact FAISS flat vs Matryoshka funnel search.

One command, one run, two datasets::

    python3 benchmarks/bench_dense.py            # SciFact vectors + 1,000,000 x 384 synthetic
    python3 benchmarks/bench_dense.py --quick    # SciFact vectors + 100,000 x 384 synthetic (< 3 min)
    python3 benchmarks/bench_dense.py --datasets synthetic   # one dataset; merged into the JSON

Datasets: (1) the SciFact corpus' real all-MiniLM-L6-v2 vectors (5,183 x 384; from a cached dense
index, see ``_dense_common.scifact_index``) with its 300 test queries; (2) seeded synthetic
vectors calibrated to SciFact's covariance spectrum (``_dense_common.synthetic``; calibration in
benchmarks/synth_calibration.json), queries near documents.

Each dataset is written as an index with Matryoshka dims 64,128,256,384 and a PCA rotation
(float16 vectors) and searched through the library (``Retriever.search_arrays`` with
``query_vectors`` and ``leg_params={"dense": {...}}``). Baseline: full-dimension exact search
(``IndexFlatIP`` over all 384 dims; the library's default dense search). Ground truth: its top-10.
Funnel configurations: a candidate generator over a prefix (Flat or IVF), shortlist k', exact
full-dimension re-scoring from the stored vectors. QPS = queries / wall seconds of one batched
``search_arrays`` call over the whole query batch (same batch for every row), median of
``--runs`` runs after one warm-up run (which also builds the prefix generator; its time is
reported as ``build_s``). Rows marked ``/int8`` scan int8-quantised prefixes
(``scan_dtype="int8"``, retriever/int8scan.py) instead of float32 ones. Threads: ``--threads`` (default 1) for FAISS (OpenMP), BLAS
(threadpoolctl) and the C++ kernels alike. The baseline and every funnel row are timed the same
way through the same call. A row "raw FAISS IndexFlatIP.search" times FAISS alone on the rotated
queries (no engine overhead), for reference only; speedups are against the library's full-dim
exact search. Bytes per vector: stored full vector (float16, 768 B) + the generator's own bytes.
BLAS: FAISS multiplies with the OpenBLAS bundled in its wheel, the float32 prefix scans with
numpy's; unless ``OPENBLAS_CORETYPE`` is set (or ``--faiss-blas-as-is``), it is set to numpy's
detected core type before FAISS loads, so a bundled OpenBLAS that does not recognise the CPU
does not fall back to slow generic kernels (recorded under ``"blas"`` in the JSON).
FAISS's switch to BLAS: FAISS 1.15 multiplies with BLAS only when the query batch is large enough
(``faiss.cvar.distance_compute_blas_threshold``, 128,000 in 1.15.1, compared with queries x dims:
300 SciFact queries x 384 dims fall below it) and otherwise computes each query-vector inner
product on its own, which is slower (benchmarks/HISTORY.md, "Matryoshka funnel"). So that FAISS
(the baseline and the float32 prefix generators alike) runs at its best, the benchmark sets the
threshold to ``--faiss-blas-threshold`` (default 20, FAISS's classic value: BLAS from 20 queries
on) for the whole run; the value used and FAISS's own default are recorded in the JSON.
Synthetic vectors are cached under ``$RETRIEVER_CACHE`` (default /tmp/cache).
``--datasets`` runs a subset (each dataset is its own run; results are merged by dataset name
into the JSON, so the two datasets of a full run may come from two processes).
Results: benchmarks/results/bench_dense[_quick].json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:  # python3 benchmarks/bench_dense.py (script folder on sys.path) or import benchmarks.bench_dense
    from _dense_common import ROOT, load_model_vectors, scifact_index, scifact_queries, synthetic
except ImportError:
    from benchmarks._dense_common import ROOT, load_model_vectors, scifact_index, scifact_queries, synthetic

K = 10


def generator_bytes(dim: int, index: str, scan_dtype: str = "float32") -> float:
    """Bytes per vector of a prefix candidate generator (codes + ids; centroids amortised away)."""
    if index == "Flat" and scan_dtype == "int8":
        return float(4 * ((dim + 3) // 4))  # uint8 codes, padded to groups of 4 coordinates
    if index == "Flat":
        return 4.0 * dim  # the float32 prefix matrix scanned exactly
    if index.startswith("IVF") and index.endswith(",Flat"):
        return 4.0 * dim + 8
    if index.startswith("HNSW"):
        m = int(index[4:].split(",")[0] or 32)
        return 4.0 * dim + 2 * m * 4  # vectors + ~2M level-0 links of 4 bytes
    return float("nan")


def run_dataset(name: str, ids, x, qv, configs, runs: int, tmp: Path) -> dict:
    from retriever.index.matryoshka import build_vector_index
    from retriever import Retriever
    from retriever.metrics import recall_at_k

    t0 = time.perf_counter()
    build_vector_index(ids, x, tmp / name, dims=(64, 128, 256, 384), dtype="float16", shard_size=len(ids))
    r = Retriever.open(tmp / name)
    setup_s = time.perf_counter() - t0
    names = ["q"] * len(qv)

    def timed(params):
        times, res = [], None
        t = time.perf_counter()
        res = r.search_arrays(names, K, mode="dense", query_vectors=qv, leg_params={"dense": params})
        warm = time.perf_counter() - t
        for _ in range(runs):
            t = time.perf_counter()
            res = r.search_arrays(names, K, mode="dense", query_vectors=qv, leg_params={"dense": params})
            times.append(time.perf_counter() - t)
        return res, warm, times

    truth, _, times = timed({})
    base_qps = len(qv) / statistics.median(times)
    rows = [{"config": "full-dim exact Flat (384-d)", "params": {}, "recall@10": 1.0, "qps": round(base_qps, 1),
             "qps_runs": [round(len(qv) / t, 1) for t in times], "speedup": 1.0,
             "bytes_per_vector": 768 + 4 * 384}]
    print(json.dumps({"dataset": name, **rows[0]}), flush=True)
    # reference only: FAISS alone on the same (rotated) batch, no engine around it
    leg = r.engine.legs["dense"]
    qr = leg.rotate(qv)
    raw = []
    for _ in range(runs + 1):
        t = time.perf_counter()
        leg.cpu_indexes[0].search(qr, K)
        raw.append(time.perf_counter() - t)
    raw_qps = len(qv) / statistics.median(raw[1:])
    rows.append({"config": "raw FAISS IndexFlatIP.search (reference, no engine)", "params": None,
                 "recall@10": 1.0, "qps": round(raw_qps, 1), "qps_runs": [round(len(qv) / t, 1) for t in raw[1:]],
                 "speedup": round(raw_qps / base_qps, 2), "bytes_per_vector": 4 * 384})
    print(json.dumps({"dataset": name, **rows[-1]}), flush=True)
    for p in configs:
        res, warm, times = timed(p)
        qps = len(qv) / statistics.median(times)
        extra = "".join(f" {k}={p[k]}" for k in ("nprobe", "ef_search") if k in p)
        kind = p["index"] + ("/int8" if p.get("scan_dtype") == "int8" else "")
        row = {"config": f"funnel dim={p['dim']} {kind} k'={p['shortlist']}{extra}",
               "params": p, "recall@10": round(recall_at_k(res.ids, truth.ids, K), 4), "qps": round(qps, 1),
               "qps_runs": [round(len(qv) / t, 1) for t in times], "speedup": round(qps / base_qps, 2),
               "build_s": round(warm - statistics.median(times), 2),
               "bytes_per_vector": 768 + generator_bytes(p["dim"], p["index"], p.get("scan_dtype", "float32"))}
        rows.append(row)
        print(json.dumps({"dataset": name, **row}), flush=True)
    ok = [x for x in rows[2:] if x["recall@10"] >= 0.99]
    best = max(ok, key=lambda x: x["qps"]) if ok else None
    return {"dataset": name, "n": len(ids), "dim": int(x.shape[1]), "queries": len(qv), "setup_s": round(setup_s, 1),
            "rows": rows, "best_at_recall_0.99": best, "uptime": uptime(),
            "target_met": bool(best and best["speedup"] >= 4.0)}


def blas_setup(align: bool) -> dict:
    """Give FAISS's bundled OpenBLAS the same CPU kernels as numpy's before FAISS is loaded.

    Both the baseline (FAISS ``IndexFlatIP``, which multiplies with the OpenBLAS shipped in the
    FAISS wheel) and the float32 prefix scans (numpy's OpenBLAS) use BLAS. An OpenBLAS built with
    DYNAMIC_ARCH that does not recognise the CPU model falls back to generic SSE3 ("Prescott")
    kernels; the FAISS wheel's OpenBLAS 0.3.15 does so on recent Xeons, which made the baseline
    several times slower than it can be (benchmarks/HISTORY.md, "Matryoshka funnel"). Unless ``OPENBLAS_CORETYPE`` is already set, it is set to the
    core type numpy's OpenBLAS detected, so both libraries run the same kernel family.

    Returns:
        ``{"OPENBLAS_CORETYPE": value or None, "aligned": bool}`` (recorded in the results).
    """
    import os

    from threadpoolctl import threadpool_info

    aligned = False
    if align and "OPENBLAS_CORETYPE" not in os.environ:
        arch = [i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"]
        if arch and arch[0]:
            os.environ["OPENBLAS_CORETYPE"] = arch[0]
            aligned = True
    return {"OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"), "aligned": aligned}


def synthetic_cached(n: int, nq: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_dense_common.synthetic` vectors, cached as .npy files under ``$RETRIEVER_CACHE``
    (default /tmp/cache; the generator is seeded, so the cache only saves time)."""
    import os

    cache = Path(os.environ.get("RETRIEVER_CACHE", "/tmp/cache"))
    stem = cache / f"bench_dense_synthetic_n{n}_q{nq}_s{seed}"
    xp, qp = stem.with_suffix(".docs.npy"), stem.with_suffix(".queries.npy")
    if xp.is_file() and qp.is_file():
        return np.load(xp), np.load(qp)
    x, qv = synthetic(n, nq, seed=seed)
    cache.mkdir(parents=True, exist_ok=True)
    for path, arr in ((xp, x), (qp, qv)):
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, arr)
        tmp.replace(path)
    return x, qv


def uptime() -> str:
    """`uptime` output (load averages) recorded with each dataset's results."""
    import subprocess

    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (``argv`` without the program name; default ``sys.argv[1:]``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100,000 synthetic vectors instead of 1,000,000")
    ap.add_argument("--n", type=int, default=None, help="synthetic corpus size (overrides --quick)")
    ap.add_argument("--queries", type=int, default=1000, help="synthetic queries")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="FAISS / BLAS / kernel threads (default 1)")
    ap.add_argument("--index", type=Path, default=None, help="cached SciFact dense index")
    ap.add_argument("--datasets", default="scifact,synthetic", help="comma-separated subset of scifact,synthetic")
    ap.add_argument("--faiss-blas-as-is", action="store_true",
                    help="do not align the OpenBLAS kernels bundled with FAISS to numpy's (see blas_setup)")
    ap.add_argument("--faiss-blas-threshold", type=int, default=20,
                    help="faiss.cvar.distance_compute_blas_threshold for the whole run (default 20: FAISS "
                         "multiplies every batch of >= 20 queries with BLAS; -1 keeps FAISS's own default)")
    ap.add_argument("--out", type=Path, default=None,
                    help="results JSON (default benchmarks/results/bench_dense[_quick].json)")
    args = ap.parse_args(argv)

    blas = blas_setup(align=not args.faiss_blas_as_is)
    import faiss
    from threadpoolctl import threadpool_info, threadpool_limits

    faiss.omp_set_num_threads(args.threads)
    faiss_blas = {"default": int(faiss.cvar.distance_compute_blas_threshold)}
    if args.faiss_blas_threshold >= 0:
        faiss.cvar.distance_compute_blas_threshold = args.faiss_blas_threshold
    faiss_blas["used"] = int(faiss.cvar.distance_compute_blas_threshold)
    threadpool_limits(args.threads)
    which = set(args.datasets.split(","))
    n = args.n or (100_000 if args.quick else 1_000_000)
    nlist = 1024 if n >= 500_000 else 256
    syn_cfg = [{"dim": 64, "index": "Flat", "shortlist": 200}, {"dim": 96, "index": "Flat", "shortlist": 100},
               {"dim": 128, "index": "Flat", "shortlist": 50},
               {"dim": 128, "index": f"IVF{nlist},Flat", "nprobe": 32, "shortlist": 100}] + [
        {"dim": d, "index": "Flat", "scan_dtype": "int8", "shortlist": k}
        for d, k in ((64, 200), (64, 400), (96, 100), (96, 200), (128, 50), (128, 100), (192, 50))]
    sf_cfg = [{"dim": 64, "index": "Flat", "shortlist": 100}, {"dim": 64, "index": "Flat", "shortlist": 200},
              {"dim": 96, "index": "Flat", "shortlist": 50}, {"dim": 128, "index": "Flat", "shortlist": 30},
              {"dim": 128, "index": "Flat", "shortlist": 50}, {"dim": 128, "index": "Flat", "shortlist": 100},
              {"dim": 192, "index": "Flat", "shortlist": 30},
              {"dim": 128, "index": "IVF64,Flat", "nprobe": 8, "shortlist": 50},
              {"dim": 128, "index": "IVF64,Flat", "nprobe": 16, "shortlist": 50},
              {"dim": 128, "index": "HNSW32", "ef_search": 48, "shortlist": 48}] + [
        {"dim": d, "index": "Flat", "scan_dtype": "int8", "shortlist": k}
        for d, k in ((64, 100), (96, 50), (128, 30), (128, 50), (192, 30), (256, 30))]
    res_dir = ROOT / "benchmarks" / "results"
    res_dir.mkdir(parents=True, exist_ok=True)
    path = args.out or res_dir / ("bench_dense_quick.json" if args.quick else "bench_dense.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.is_file() else {}
    out = {"command": "python3 benchmarks/bench_dense.py" + (" --quick" if args.quick else ""),
           "threads": args.threads, "k": K, "runs": args.runs, "machine": platform.processor() or platform.machine(),
           "cpus": __import__("os").cpu_count(), "faiss": faiss.__version__,
           "date": time.strftime("%Y-%m-%d", time.gmtime()), "faiss_blas_threshold": faiss_blas, "blas": {
               **blas, "libraries": [{k: i.get(k) for k in ("internal_api", "version", "architecture", "filepath")}
                                     for i in threadpool_info()]},
           "datasets": []}
    with tempfile.TemporaryDirectory() as tmp:
        if "scifact" in which:
            ids, x, manifest = load_model_vectors(scifact_index(args.index))
            _, qv, _ = scifact_queries(manifest)
            out["datasets"].append(run_dataset("scifact-minilm", ids, x, qv, sf_cfg, args.runs, Path(tmp)))
            out["datasets"][-1]["argv"] = " ".join(argv)
            out["datasets"][-1]["faiss_blas_threshold"] = faiss_blas["used"]
        if "synthetic" in which:
            t = time.perf_counter()
            x, qv = synthetic_cached(n, args.queries, seed=0)
            gen_s = time.perf_counter() - t
            ds = run_dataset(f"synthetic-{n}", [str(i) for i in range(n)], x, qv, syn_cfg, args.runs, Path(tmp))
            ds["generate_s"] = round(gen_s, 1)
            ds["argv"] = " ".join(argv)
            ds["faiss_blas_threshold"] = faiss_blas["used"]
            out["datasets"].append(ds)
    done = {d["dataset"] for d in out["datasets"]}
    if old.get("command") == out["command"]:  # keep the other dataset of an earlier partial run
        out["datasets"] = [d for d in old.get("datasets", []) if d["dataset"] not in done] + out["datasets"]
    tmp_path = path.with_suffix(".json.tmp")
    tmp_path.write_text(json.dumps(out, indent=1))
    tmp_path.replace(path)
    print(json.dumps({d["dataset"]: d["best_at_recall_0.99"] for d in out["datasets"]}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
