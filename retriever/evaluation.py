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

import gzip
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from retriever.index.errors import CorpusError

DEFAULT_METRICS = {"ndcg@10": "nDCG@10", "recall@100": "R@100", "mrr@10": "RR@10"}
#: how much of a file :func:`read_labelled` looks at to tell queries from qrels (only after a
#: reader rejected one of them)
SNIFF_BYTES = 1 << 16
SNIFF_LINES = 20


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


def _sample_lines(path: Path) -> list[str]:
    """Up to :data:`SNIFF_LINES` non-blank lines from the start of a file (``.gz`` decompressed);
    [] for a folder, a missing or unreadable file, or one that is not UTF-8."""
    try:
        if not path.is_file():
            return []
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            data = f.read(SNIFF_BYTES)
        if len(data) == SNIFF_BYTES:
            data = data[:data.rfind(b"\n") + 1]  # the last line (or character) may be cut short
        lines = data.decode("utf-8-sig").splitlines()
    except (OSError, EOFError, UnicodeDecodeError):
        return []
    return [x for x in lines if x.strip()][:SNIFF_LINES]


def _looks_like_qrels(lines: list[str]) -> bool:
    """Every sampled line is ``qid docid grade`` (BEIR, after an optional ``query-id`` header)
    or ``qid 0 docid grade`` (TREC) with an integer grade."""
    if lines and lines[0].split()[0] in ("query-id", "query_id", "qid"):
        lines = lines[1:]
    if not lines:
        return False
    for line in lines:
        parts = line.split()
        if len(parts) not in (3, 4):
            return False
        try:
            int(parts[-1])
        except ValueError:
            return False
    return True


def _looks_like_queries(lines: list[str]) -> bool:
    """The sampled lines are BEIR query objects (JSON with ``_id`` or ``id``) or ``qid<TAB>text``
    lines, and not qrels."""
    if not lines or _looks_like_qrels(lines):
        return False
    if lines[0].lstrip().startswith("{"):
        try:
            obj = json.loads(lines[0])
        except json.JSONDecodeError:
            return False
        return isinstance(obj, dict) and ("_id" in obj or "id" in obj)
    return all(line.count("\t") == 1 for line in lines)  # qid<TAB>text; qrels TSV lines have 2 or 3 tabs


def _swap_hint(queries_path: Path, qrels_path: Path | None, err: CorpusError) -> CorpusError | None:
    """A clearer error than ``err`` (a reader's) when a file looks like the other kind: the
    queries file like qrels, the qrels file like queries. Both files are named as swapped unless
    the other one looks like its own kind (the same kind of file given twice); None when neither
    looks wrong."""
    q_lines = _sample_lines(queries_path)
    r_lines = [] if qrels_path is None else _sample_lines(qrels_path)
    q_wrong, r_wrong = _looks_like_qrels(q_lines), _looks_like_queries(r_lines)
    if not (q_wrong or r_wrong):
        return None
    q, r = str(queries_path), str(qrels_path)
    if qrels_path is not None and not (q_wrong and _looks_like_qrels(r_lines)) \
            and not (r_wrong and _looks_like_queries(q_lines)):
        what = (f"the queries file {q!r} looks like qrels and the qrels file {r!r} like queries" if q_wrong and r_wrong
                else f"the queries file {q!r} looks like qrels (qrels file: {r!r})" if q_wrong
                else f"the qrels file {r!r} looks like queries (queries file: {q!r})")
        return CorpusError(f"the queries and qrels files look swapped: {what}; reading them as given: {err}")
    if q_wrong:
        return CorpusError(f"the queries file {q!r} looks like qrels (query-id corpus-id grade lines), not queries "
                           f"(queries.jsonl or qid<TAB>text); reading it as given: {err}")
    return CorpusError(f"the qrels file {r!r} looks like queries (queries.jsonl or qid<TAB>text), not qrels "
                       f"(query-id corpus-id grade lines); reading it as given: {err}")


def read_query_file(path: str | Path) -> dict[str, str]:
    """:func:`retriever.index.readers.read_queries`, whose error says so when the file looks like
    qrels (a qrels file given for the queries reads as duplicate query ids).

    Returns:
        ``{query_id: text}`` in file order.

    Raises:
        CorpusError: as ``read_queries``; when the file looks like qrels, the message says that.
    """
    from retriever.index.readers import read_queries

    try:
        return read_queries(path)
    except CorpusError as e:
        hint = _swap_hint(Path(path), None, e)
        if hint is None:
            raise
        raise hint from e


def read_labelled(queries_path: str | Path, qrels_path: str | Path) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """Read a queries file and its qrels (:func:`retriever.index.readers.read_queries`,
    :func:`~retriever.index.readers.read_qrels`), with a clear error for the two given the other
    way round.

    Only when a reader rejects a file are the first lines of both looked at (no cost, and no
    guess, on valid input): a queries file made of ``qid docid grade`` lines (it reads as duplicate
    query ids) and / or a qrels file of JSON objects or ``qid<TAB>text`` lines (wrong column
    count) give an error naming both files and saying they look swapped.

    Returns:
        ``(queries, qrels)``: ``{query_id: text}`` in file order, ``{query_id: {doc_id: grade}}``.

    Raises:
        CorpusError: as the readers (missing file, bad line, duplicate id); the files look swapped,
            or one looks like the other kind (names both, and the reader's error).
    """
    from retriever.index.readers import read_qrels, read_queries

    try:
        queries = read_queries(queries_path)
        qrels = read_qrels(qrels_path)
    except CorpusError as e:
        hint = _swap_hint(Path(queries_path), Path(qrels_path), e)
        if hint is None:
            raise
        raise hint from e
    return queries, qrels
