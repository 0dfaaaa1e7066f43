"""Diagnostic: per-phase timings of the hybrid query path on the cached benchmark index (not part
of the library; wraps methods of one opened Retriever).

Loads ``benchmarks.run.hybrid_index(N)`` (cached under $RETRIEVER_CACHE), then for each mode in
$MODES (default ``bm25,sparse,dense,hybrid,seq,hybrid``; ``seq`` = hybrid with the legs in
sequence) runs $NQ queries (default 1000) at batch size 1 with 2 threads, nprobe 4 and
``HYBRID_SPARSE_PARAMS``, GC paused, after 5 warm-up queries, and prints p50/p90/p99/mean (ms) of:
end-to-end latency; ``BatchResult.timings_ms`` (``leg:<name>``: prepare + search + shard merge
of that leg; ``fuse``); each leg's ``search`` wall time and thread CPU time (``thread_time``: a
wall > cpu gap is time spent waiting for the GIL or a core); the ``fuse`` call and
``Engine.search``; latency minus the slowest leg; and per pass the major/minor page faults and
voluntary/involuntary context switches (``getrusage``) and process CPU time per query.

Usage: ``N=1000000 PYTHONPATH=. python -m benchmarks.profile_hybrid`` (run it under the shared CPU
lock: it is CPU-heavy).
"""
import os, sys, time, resource, threading, json
from pathlib import Path
import numpy as np
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
import benchmarks.run as br
import retriever.engine as engine
from retriever import Retriever
from retriever.bench import _gc_paused
from retriever.metrics import latency_summary

N = int(os.environ.get("N", "1000000"))
NQ = int(os.environ.get("NQ", "1000"))
MODES = os.environ.get("MODES", "bm25,sparse,dense,hybrid,seq,hybrid").split(",")
t0 = time.time()
built = br.hybrid_index(N, Path("/tmp"), cache_dir=br.CACHE)
print("index", built["path"], "cached", built["cached"], f"{time.time()-t0:.1f}s", flush=True)
col, sq = built["collection"], built["sparse_queries"]
r = Retriever.open(built["path"], n_threads=2)
qs = col.text.queries[:NQ]; qv = np.ascontiguousarray(col.dense.queries[:NQ], np.float32); sv = sq[:NQ]
lp = {"dense": {"nprobe": 4}, "sparse": dict(br.HYBRID_SPARSE_PARAMS)}
import faiss; faiss.omp_set_num_threads(2)

# instrument legs: wall + thread cpu time of each leg.search call
rec = {}
for name, leg in r.engine.legs.items():
    orig = leg.search
    def wrap(*a, _o=orig, _n=name, **kw):
        w0 = time.perf_counter(); c0 = time.thread_time()
        out = _o(*a, **kw)
        rec.setdefault(_n + ".wall", []).append((time.perf_counter() - w0) * 1e3)
        rec.setdefault(_n + ".cpu", []).append((time.thread_time() - c0) * 1e3)
        return out
    leg.search = wrap

_fuse = engine.fuse
def tfuse(*a, **kw):
    w0 = time.perf_counter(); c0 = time.thread_time()
    out = _fuse(*a, **kw)
    rec.setdefault("fusecall.wall", []).append((time.perf_counter() - w0) * 1e3)
    rec.setdefault("fusecall.cpu", []).append((time.thread_time() - c0) * 1e3)
    return out
engine.fuse = tfuse
_es = r.engine.search
def tes(*a, **kw):
    w0 = time.perf_counter()
    out = _es(*a, **kw)
    rec.setdefault("engine.wall", []).append((time.perf_counter() - w0) * 1e3)
    return out
r.engine.search = tes

def call(i, mode):
    return r.search_arrays(qs[i:i+1], 10, mode=mode, n_threads=2, leg_params=lp,
                           query_vectors=qv[i:i+1] if mode in ("dense", "hybrid") else None,
                           sparse_vectors=sv[i:i+1] if mode in ("sparse", "hybrid") else None)

def pct(a):
    s = latency_summary(a, (50, 90, 99))
    return f"p50 {s['p50']:6.2f} p90 {s['p90']:6.2f} p99 {s['p99']:6.2f} mean {s['mean']:6.2f}"

for m in MODES:
    mode = "hybrid" if m == "seq" else m
    r.engine.concurrent_legs = m != "seq"
    for i in range(5): call(i, mode)
    rec.clear(); lat = []; tm = {}
    ru0 = resource.getrusage(resource.RUSAGE_SELF); c0 = time.process_time()
    with _gc_paused(True):
        for i in range(len(qs)):
            t = time.perf_counter(); res = call(i, mode); lat.append((time.perf_counter() - t) * 1e3)
            for key, v in res.timings_ms.items(): tm.setdefault(key, []).append(v)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    print(f"== {m}: lat {pct(lat)}  majflt {ru1.ru_majflt-ru0.ru_majflt} minflt {ru1.ru_minflt-ru0.ru_minflt} "
          f"vcsw {ru1.ru_nvcsw-ru0.ru_nvcsw} ivcsw {ru1.ru_nivcsw-ru0.ru_nivcsw} cpu/q {(time.process_time()-c0)/len(qs)*1e3:.2f}ms", flush=True)
    for key in sorted(tm): print(f"   t.{key:14s} {pct(tm[key])}")
    for key in sorted(rec): print(f"   {key:16s} {pct(rec[key])}")
    if m == "hybrid":
        inner = np.sum([tm[f'leg:{n}'] for n in r.engine.legs], axis=0)
        print("   overhead(lat - max leg)", pct(np.asarray(lat) - np.max([tm[f'leg:{n}'] for n in r.engine.legs], axis=0)))
