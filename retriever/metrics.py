"""Measures of a search against a reference search, and latency summaries: the one home of
recall@k (against exact search) and of latency percentiles for the library, the CLI, the
benchmarks and the tests.

Effectiveness against relevance judgements (nDCG@10, Recall@100, MRR@10 against qrels) is not
here: it goes through ir-measures / pytrec_eval in :mod:`retriever.evaluation`.

Recall@k rule (the ANN-benchmarks definition, extended to short reference lists):
for one query, ``|found[:k] ∩ ref[:k]| / |ref[:k]|`` where both lists are document ordinals with
``-1`` padding ignored, so ``|ref[:k]|`` is ``k`` when the exact search found at least ``k``
documents (ANN-benchmarks' ``count / k``) and smaller when it found fewer (a BM25 query that few
documents match). A query whose reference list is empty has nothing to recall: it is left out of
the mean (as trec_eval leaves out queries without relevant documents), neither 1 nor 0. The
result is the mean over the remaining queries, or ``None`` when no query has a reference.
Membership is by ordinal: a found document that ties the exact k-th score but is not in the
exact list does not count (the engine's tie rule, smaller ordinal first, is deterministic, so an
exact mode returns exactly the reference's ordinals).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from retriever.index.errors import QueryError

#: the percentiles :func:`latency_summary` reports
PERCENTILES: tuple[int, ...] = (50, 95, 99)


def _rows(x: "np.ndarray | Sequence[Sequence[int]]", name: str) -> list[np.ndarray]:
    """Rows of a 2-D array, or of a sequence of 1-D id sequences (rows may differ in length)."""
    if isinstance(x, np.ndarray):
        if x.ndim != 2:
            raise QueryError(f"recall_at_k: {name} must be a 2-D (nq, k) array, got shape {x.shape}")
        return list(x)
    rows = [np.asarray(r).ravel() for r in x]
    for i, r in enumerate(rows):
        if r.size and not np.issubdtype(r.dtype, np.integer):
            raise QueryError(f"recall_at_k: {name} row {i} holds {r.dtype} values, expected integer ordinals")
    return rows


def recall_at_k(found: "np.ndarray | Sequence[Sequence[int]]", reference: "np.ndarray | Sequence[Sequence[int]]",
                k: int) -> float | None:
    """Mean recall@k of ``found`` against ``reference`` (rule in the module docstring).

    Args:
        found: result ordinals per query: an int (nq, width) array or nq sequences of ints
            (lengths may differ); ``-1`` padding is ignored, entries beyond the first ``k`` too.
        reference: reference ordinals (e.g. exact search) in the same form, nq rows.
        k: cut-off (>= 1).

    Returns:
        the mean over queries with a non-empty reference, in [0, 1]; ``None`` when every
        reference list is empty (or there are no queries).

    Raises:
        QueryError: ``k`` not an integer >= 1, an array that is not 2-D, a row of non-integers, or
            row counts that differ.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise QueryError(f"recall_at_k: k must be an integer >= 1, got {k!r}")
    got_rows, ref_rows = _rows(found, "found"), _rows(reference, "reference")
    if len(got_rows) != len(ref_rows):
        raise QueryError(f"recall_at_k: found has {len(got_rows)} rows, reference has {len(ref_rows)}")
    vals = []
    for f, r in zip(got_rows, ref_rows):
        r, f = r[:k], f[:k]
        ref = set(r[r >= 0].tolist())
        if ref:
            vals.append(len(ref & set(f[f >= 0].tolist())) / len(ref))
    return float(np.mean(vals)) if vals else None


def latency_summary(samples: Sequence[float] | np.ndarray,
                    percentiles: Sequence[int] = PERCENTILES) -> dict[str, float]:
    """Percentiles, mean and maximum of latency samples (any one unit, e.g. ms; returned in it).

    Percentiles are numpy's default (linear interpolation between closest ranks, the
    "type 7" estimator of Hyndman & Fan 1996).

    Args:
        samples: latencies, one per call (a sequence or 1-D array of numbers).
        percentiles: which percentiles (integers in [0, 100]; default :data:`PERCENTILES`).

    Returns:
        ``{"p50", "p95", "p99", "mean", "max"}`` (one ``pN`` per asked percentile) as floats;
        every value NaN when there is no sample.

    Raises:
        QueryError: a percentile outside [0, 100].
    """
    if any(not 0 <= p <= 100 for p in percentiles):
        raise QueryError(f"latency_summary: percentiles must lie in [0, 100], got {list(percentiles)}")
    a = np.asarray(samples, dtype=np.float64).ravel()
    keys = [f"p{p}" for p in percentiles] + ["mean", "max"]
    if a.size == 0:
        return dict.fromkeys(keys, float("nan"))
    vals = [*np.percentile(a, list(percentiles)).tolist(), float(a.mean()), float(a.max())]
    return {key: float(v) for key, v in zip(keys, vals)}
