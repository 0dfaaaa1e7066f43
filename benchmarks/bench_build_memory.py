"""Peak memory of an index build versus the size of the index it produces.

Indexes N synthetic documents (BM25 leg only) streamed from a seeded generator, so the corpus
itself is never held in memory, and reports:

* ``peak_rss``   - the process's peak resident set size during the build (``ru_maxrss``,
  sampled also with psutil every 50 ms), minus the RSS before the build started
  (``baseline_rss``: interpreter, numpy, pyarrow...);
* ``index_bytes`` - the in-memory size of the finished index: the sum of the buffer bytes of
  every Arrow array in it (docs, vocabulary, postings), i.e. what opening it maps;
* the ratio and the target ``peak - baseline <= 1.5 * index_bytes + 256 MiB``.

Usage (the 1,000,000-document figure takes several minutes on 2 cores)::

    python3 benchmarks/bench_build_memory.py --docs 1000000 --out /tmp/bench_mem_idx
    python3 benchmarks/bench_build_memory.py --docs 20000      # quick check

Prints one JSON object; exit status 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONST_BYTES = 256 << 20


def synthetic_docs(n: int, seed: int = 0, vocab_size: int = 50_000, mean_len: int = 60):
    """Yield ``n`` documents with Zipf-distributed words from a seeded generator (one at a time)."""
    rng = random.Random(seed)
    # Pronounceable pseudo-words: stable across runs, stemmer-friendly, ASCII.
    syll = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "zi", "pe", "su", "da", "gho", "bri", "ster", "quin"]
    words = []
    for i in range(vocab_size):
        w, x = [], i + 1
        while x:
            x, r = divmod(x, len(syll))
            w.append(syll[r])
        words.append("".join(w))
    cum = []
    acc = 0.0
    for r in range(1, vocab_size + 1):
        acc += 1.0 / r
        cum.append(acc)
    for i in range(n):
        length = max(1, int(rng.expovariate(1.0 / mean_len)))
        toks = rng.choices(words, cum_weights=cum, k=length)
        yield {"_id": f"doc{i:08d}", "title": toks[0], "text": " ".join(toks)}


def index_array_bytes(path: Path) -> int:
    """Sum of the buffer sizes of every Arrow array in the index (what opening it maps)."""
    import pyarrow as pa

    total = 0
    for f in sorted(path.rglob("*.arrow")):
        with pa.memory_map(str(f), "r") as src:
            t = pa.ipc.open_file(src).read_all()
            total += t.nbytes
    return total


class PeakSampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        import psutil

        self.proc = psutil.Process()
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-size", type=int, default=100_000)
    ap.add_argument("--out", default="/tmp/bench_build_memory_idx")
    ap.add_argument("--keep", action="store_true", help="keep the index afterwards")
    args = ap.parse_args()

    import psutil

    from retriever.index.pipeline import build_index

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    baseline = psutil.Process().memory_info().rss
    sampler = PeakSampler()
    sampler.start()
    t0 = time.perf_counter()
    build_index(synthetic_docs(args.docs, args.seed), out, legs=("bm25",), shard_size=args.shard_size,
                show_progress=False)
    secs = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    peak = max(sampler.peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    idx_bytes = index_array_bytes(out)
    disk = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    growth = peak - baseline
    target = 1.5 * idx_bytes + CONST_BYTES
    row = {"docs": args.docs, "seconds": round(secs, 1), "docs_per_s": round(args.docs / secs),
           "baseline_rss_mb": round(baseline / 2**20, 1), "peak_rss_mb": round(peak / 2**20, 1),
           "build_growth_mb": round(growth / 2**20, 1), "index_array_mb": round(idx_bytes / 2**20, 1),
           "index_disk_mb": round(disk / 2**20, 1), "growth_over_index": round(growth / idx_bytes, 3),
           "target_mb": round(target / 2**20, 1), "ok": growth <= target}
    print(json.dumps(row))
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return 0 if row["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
