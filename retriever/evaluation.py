"""Evaluation against qrels (nDCG@10, Recall@100, MRR@10) through ir-measures / pytrec_eval,
and TREC run files.

Conventions (trec_eval's): nDCG uses linear gain; only judged queries are evaluated; a judged
query that returned no hits counts 0 (``trec_eval -c``). Runs list documents with scores that are
strictly decreasing *as float32* (trec_eval, and pytrec_eval which wraps it, hold run scores in
C ``float``): a score that is not below the previous one once both are rounded to float32 is
replaced by the next float32 below the previous one, in our rank order. So an evaluator never
sees a tie and never applies its own tie rule (trec_eval re-sorts tied documents by document id),
and every measure, whichever tool computes it, is computed on our ranking.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

DEFAULT_METRICS = {"ndcg@10": "nDCG@10", "recall@100": "R@100", "mrr@10": "RR@10"}


def strictly_decreasing(scores: Sequence[float]) -> list[float]:
    """Copy of a descending score list that is strictly decreasing at float32 precision.

    Args:
        scores: scores in rank order (best first), any floats.

    Returns:
        floats (each exactly a float32 value), where ``float32(out[i]) < float32(out[i-1])``
        for every i: each score rounded to float32, or, where that is not below the previous
        output, the next float32 below the previous output (``np.nextafter`` in float32). The
        order is ours; values drift below the true score by one float32 step per tied place.
    """
    out: list[float] = []
    prev = np.float32(np.inf)
    low = np.float32(-np.inf)
    for s in scores:
        v = np.float32(s)
        if not v < prev:
            v = np.nextafter(prev, low)
        out.append(float(v))
        prev = v
    return out


def make_run(qids: Sequence[str], doc_ids: Sequence[Sequence[str]], scores: Sequence[Sequence[float]]
             ) -> dict[str, dict[str, float]]:
    """``{qid: {doc_id: score}}`` with scores strictly decreasing at float32 precision per query
    (:func:`strictly_decreasing`), in the given rank order."""
    return {q: dict(zip(d, strictly_decreasing(s))) for q, d, s in zip(qids, doc_ids, scores)}


def write_trec_run(path: str | Path, run: Mapping[str, Mapping[str, float]], tag: str = "retriever") -> None:
    """Write a TREC run file (``qid Q0 docid rank score tag``), ranks from 1.

    Raises:
        QueryError: a query id, document id or tag that is empty or holds whitespace (the format
            is whitespace-separated, so such a line could not be read back); nothing is written.
    """
    from retriever.index.errors import QueryError

    def check(kind: str, value: str) -> None:
        if value.split() != [value]:  # empty, or whitespace inside or around it
            raise QueryError(f"cannot write a TREC run: {kind} {value!r} is empty or contains whitespace")

    check("tag", tag)
    for qid, docs in run.items():
        check("query id", qid)
        for did in docs:
            check("document id", did)
    with open(path, "w", encoding="utf-8") as f:
        for qid, docs in run.items():
            for rank, (did, s) in enumerate(sorted(docs.items(), key=lambda x: -x[1]), start=1):
                f.write(f"{qid} Q0 {did} {rank} {s!r} {tag}\n")


def evaluate(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]],
             metrics: Mapping[str, str] = DEFAULT_METRICS, qids: Iterable[str] | None = None
             ) -> dict[str, float]:
    """Mean metrics over judged queries.

    Args:
        run: ``{qid: {doc_id: score}}``.
        qrels: ``{qid: {doc_id: grade}}``.
        metrics: ``{our_name: ir_measures_name}``.
        qids: the queries that were run (default: the run's keys); judged ones are evaluated,
            a judged query absent from ``run`` or with no hits scores 0.

    Returns:
        ``{our_name: mean, ..., "queries": number of evaluated queries}``.
    """
    import ir_measures

    measures = {name: ir_measures.parse_measure(m) for name, m in metrics.items()}
    asked = list(run) if qids is None else list(qids)
    judged = [q for q in asked if q in qrels]
    out: dict[str, float] = {name: 0.0 for name in measures}
    out["queries"] = len(judged)
    if not judged:
        return out
    sub_qrels = {q: dict(qrels[q]) for q in judged}
    sub_run = {q: dict(run[q]) for q in judged if run.get(q)}
    per_query: dict[str, dict[str, float]] = {name: {} for name in measures}
    by_measure = {m: name for name, m in measures.items()}
    if sub_run:
        for r in ir_measures.iter_calc(list(measures.values()), sub_qrels, sub_run):
            per_query[by_measure[r.measure]][r.query_id] = float(r.value)
    for name in measures:
        out[name] = float(sum(per_query[name].get(q, 0.0) for q in judged) / len(judged))
    return out


def search_run(retriever: Any, queries: Mapping[str, str], *, mode: str, k: int = 100, fusion: Any = None,
               depth: int | None = None, leg_params: Mapping[str, Mapping[str, Any]] | None = None,
               n_threads: int | None = None, filter: Any = None) -> tuple[dict[str, dict[str, float]], Any]:
    """Search every query with :meth:`retriever.Retriever.search_arrays`: the run and the result.

    Args:
        retriever: an open :class:`~retriever.Retriever`.
        queries: ``{qid: text}`` (file order is kept).
        mode, k, fusion, depth, leg_params, n_threads, filter: as in ``search_arrays``.

    Returns:
        ``(run, result)``: the run ``{qid: {doc_id: score}}`` with strictly decreasing scores
        (:func:`make_run`), the top-``k`` of each query in rank order, and the
        :class:`~retriever.results.BatchResult` it came from (ordinals, fusion settings, timings).

    Raises:
        QueryError: as ``search_arrays`` (bad mode, k, fusion, depth, leg_params).
    """
    qids = list(queries)
    res = retriever.search_arrays([queries[q] for q in qids], k=k, mode=mode, fusion=fusion, depth=depth,
                                  leg_params=None if leg_params is None else {n: dict(p) for n, p in leg_params.items()},
                                  n_threads=n_threads, filter=filter)
    ids = retriever.reader.doc_ids()
    docs = [ids[res.ids[i, :res.n_found[i]]].tolist() for i in range(len(qids))]
    scores = [res.scores[i, :res.n_found[i]].tolist() for i in range(len(qids))]
    return make_run(qids, docs, scores), res


def evaluate_index(retriever: Any, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], *,
                   mode: str, k: int = 100, fusion: Any = None, depth: int | None = None,
                   leg_params: Mapping[str, Mapping[str, Any]] | None = None, n_threads: int | None = None,
                   metrics: Mapping[str, str] = DEFAULT_METRICS) -> dict[str, float]:
    """:func:`search_run` then :func:`evaluate` over every query asked (what ``retriever eval``
    prints, unrounded). Returns ``{metric: mean, "queries": judged queries evaluated}``."""
    run, _ = search_run(retriever, queries, mode=mode, k=k, fusion=fusion, depth=depth, leg_params=leg_params,
                     n_threads=n_threads)
    return evaluate(run, qrels, metrics=metrics, qids=list(queries))
