"""The BM25 counting step with and without kept work arrays (issue: a living index).

:func:`retriever.index.analyzer_kernels.count_terms` turns a tokenised batch into (doc, term, tf)
triples. Without a :class:`~retriever.index.analyzer_kernels.CountScratch` each call makes two
int64 arrays of the whole vocabulary (``scratch=None``, the code before the scratch); with one
kept between calls a call costs O(tokens of the batch). A living index's adds count against the
index's whole vocabulary (~0.93M terms at 1M synthetic documents), so the difference is what each
1,024-document batch of an add paid before.

Input: ``--batches`` batches of ``--batch`` documents of ``--len`` Zipf-distributed term ids below
``--terms`` (already term ids: no token map), the same for both variants. Timed: one pass over all
batches (wall seconds), variants alternating over ``--rounds`` rounds after one untimed pass each;
medians and spreads reported, per batch.

Run:  flock <lock> python -m benchmarks.bench_count_terms [--terms 930000] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.timing import machine


def _batches(n_batches: int, batch: int, length: int, n_terms: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        ids = (rng.zipf(1.2, batch * length) - 1) % n_terms  # a heavy head and a long tail, as in text
        out.append((ids.astype(np.int32), np.full(batch, length, dtype=np.int64)))
    return out


def main(argv: list[str] | None = None) -> int:  # noqa: D103
    from retriever.index.analyzer_kernels import CountScratch, count_terms

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--terms", type=int, default=930_000, help="vocabulary size")
    ap.add_argument("--batch", type=int, default=1024, help="documents per batch (the pipeline's default)")
    ap.add_argument("--len", type=int, default=60, help="tokens per document")
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    data = _batches(args.batches, args.batch, args.len, args.terms, 0)

    def run(kept: bool) -> tuple[float, list[np.ndarray]]:
        scratch = CountScratch() if kept else None
        t0 = time.perf_counter()
        out = [count_terms(ids, counts, None, args.terms, k * args.batch, scratch)[2] for k, (ids, counts) in
               enumerate(data)]
        return time.perf_counter() - t0, out

    _, ref = run(False)  # untimed: compiles / loads the kernel
    _, kept = run(True)
    if any(not np.array_equal(a, b) for a, b in zip(ref, kept)):
        raise SystemExit("the two variants count differently")
    times: dict[str, list[float]] = {"fresh_arrays": [], "kept_scratch": []}
    for _ in range(args.rounds):
        for name, k in (("fresh_arrays", False), ("kept_scratch", True)):
            times[name].append(run(k)[0] / args.batches)
    med = {k: statistics.median(v) for k, v in times.items()}
    rep = {"command": "python -m benchmarks.bench_count_terms " + " ".join(argv or []), "machine": machine(),
           "args": vars(args),
           "ms_per_batch": {k: {"median": 1e3 * med[k], "min": 1e3 * min(v), "max": 1e3 * max(v)}
                            for k, v in times.items()},
           "ratio_fresh_to_kept": med["fresh_arrays"] / med["kept_scratch"],
           "saved_ms_per_10k_docs": 1e3 * (med["fresh_arrays"] - med["kept_scratch"]) * 10_000 / args.batch}
    print(json.dumps(rep, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(rep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
