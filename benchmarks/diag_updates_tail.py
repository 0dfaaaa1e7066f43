"""Usage: python -m benchmarks.diag_updates_tail INDEX_COPY [--nice N].

Writer overlap diagnosis: interleaved windows static / writer-no-refresh / writer+refresh;
writer busy intervals (CLOCK_MONOTONIC, shared across processes) recorded; query latencies split
by whether they overlap a writer burst."""
import argparse
import os
import time
import multiprocessing as mp
import numpy as np
from pathlib import Path
from benchmarks.datasets import synthetic_bm25
from benchmarks.bench_updates import _vectors
from retriever import Retriever

def churn(path, rate, texts, ready, active, stop, spans, nspan, nice):
    from retriever import IndexUpdater
    if nice: os.nice(nice)
    per = rate // 2
    with IndexUpdater.open(path) as u:
        u.delete(["no-such-id"]); ready.set()
        nxt, victim = 5 * 10**7 + int(time.time()) % 10**6 * 100, 1000
        while not stop.is_set():
            if not active.is_set():
                time.sleep(0.05); continue
            t0 = time.monotonic()
            u.add([{"_id": f"w{nxt+j}", "text": texts[(nxt+j) % len(texts)]} for j in range(per)], dense_vectors=_vectors(per, nxt % 10**6))
            u.delete([str(victim + j) for j in range(per)])
            u.commit()
            t1 = time.monotonic()
            i = int(nspan.value); spans[2*i] = t0; spans[2*i+1] = t1; nspan.value = i + 1
            nxt += per; victim += per
            time.sleep(max(0.0, 1.0 - (t1 - t0)))

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("index", help="a COPY of an index built by bench_updates (the writer changes it)")
    ap.add_argument("--nice", type=int, default=0, help="niceness added to the writer process")
    args = ap.parse_args()
    nice, dst = args.nice, args.index
    col = synthetic_bm25(1_000_000, n_queries=500)
    qs = col.queries[:200]
    texts = [d["text"] for _, d in zip(range(5000), col.docs())]
    r = Retriever.open(dst, n_threads=1)
    for q in qs: r.search_arrays([q], k=10, mode="bm25")
    ctx = mp.get_context("spawn")
    ready, active, stop = ctx.Event(), ctx.Event(), ctx.Event()
    spans = ctx.Array("d", 2000); nspan = ctx.Value("i", 0)
    p = ctx.Process(target=churn, args=(dst, 1000, texts, ready, active, stop, spans, nspan, nice)); p.start()
    ready.wait(600)
    print("load", os.getloadavg(), flush=True)
    rec = {"static": [], "w_norefresh": [], "w_refresh": []}  # (t0, t1)
    def run(kind, secs, refresh):
        t_end = time.monotonic() + secs; i = 0; last = 0.0
        while time.monotonic() < t_end:
            if refresh and time.monotonic() - last >= 1.0:
                r.refresh(); last = time.monotonic()
            q = qs[i % len(qs)]; i += 1
            t0 = time.monotonic(); r.search_arrays([q], k=10, mode="bm25"); rec[kind].append((t0, time.monotonic()))
    for _ in range(3):
        run("static", 5, False)
        active.set(); run("w_norefresh", 5, False); active.clear(); time.sleep(1.2)
        r.refresh(); [r.search_arrays([q], k=10, mode="bm25") for q in qs]
        run("static", 5, False)
        active.set(); run("w_refresh", 5, True); active.clear(); time.sleep(1.2)
        r.refresh(); [r.search_arrays([q], k=10, mode="bm25") for q in qs]
    stop.set(); p.join()
    print("load", os.getloadavg(), flush=True)
    sp = np.array(spans[:2*nspan.value]).reshape(-1, 2)
    print("writer bursts", len(sp), "median ms", 1e3*np.median(sp[:,1]-sp[:,0]), "max ms", 1e3*(sp[:,1]-sp[:,0]).max())
    for k, v in rec.items():
        a = np.array(v); lat = (a[:,1]-a[:,0])*1e3
        ov = np.zeros(len(a), bool)
        for s0, s1 in sp: ov |= (a[:,0] < s1) & (a[:,1] > s0)
        line = f"{k:12s} n {len(lat)} p50 {np.percentile(lat,50):.2f} p99 {np.percentile(lat,99):.2f}"
        if ov.any() and k != "static":
            line += f" | overlapping writer: n {ov.sum()} ({100*ov.mean():.1f}%) p50 {np.percentile(lat[ov],50):.2f} p99 {np.percentile(lat[ov],99):.2f}"
            line += f" | not overlapping: p50 {np.percentile(lat[~ov],50):.2f} p99 {np.percentile(lat[~ov],99):.2f}"
            top = lat >= np.percentile(lat, 99)
            line += f" | of the top 1%: {100*ov[top].mean():.0f}% overlap a burst"
        print(line, flush=True)
if __name__ == "__main__":
    main()
