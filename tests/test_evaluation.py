"""Metrics equal pytrec_eval's on the same run; TREC run files have strictly decreasing scores."""

from __future__ import annotations

import json

import pytest

from retriever.index.readers import read_qrels, read_queries
from retriever import CorpusError, Retriever, build_index
from retriever.evaluation import (evaluate, make_run, read_labelled, read_query_file, strictly_decreasing,
                                  write_trec_run)


def read_trec_run(path):
    run = {}
    with open(path) as f:
        for line in f:
            qid, _, did, rank, score, _ = line.split()
            run.setdefault(qid, {})[did] = float(score)
    return run


def test_strictly_decreasing():
    s = strictly_decreasing([3.0, 3.0, 3.0, 2.0, 2.0, 1.0])
    assert all(a > b for a, b in zip(s, s[1:]))
    assert s[0] == 3.0 and s[3] == 2.0


def test_metrics_equal_pytrec_eval(tmp_path, data_dir):
    import pytrec_eval

    build_index(data_dir / "medline", tmp_path / "i", legs=("bm25",), show_progress=False)
    r = Retriever.open(tmp_path / "i")
    queries = read_queries(data_dir / "medline" / "queries.jsonl")
    qrels = read_qrels(data_dir / "medline" / "qrels.tsv")
    qids = list(queries)
    res = r.search_arrays([queries[q] for q in qids], k=100, mode="bm25")
    ids = r.reader.doc_ids()
    run = make_run(qids, [ids[res.ids[i, :res.n_found[i]]].tolist() for i in range(len(qids))],
                   [res.scores[i, :res.n_found[i]].tolist() for i in range(len(qids))])
    ours = evaluate(run, qrels, qids=qids)
    write_trec_run(tmp_path / "run.txt", run)
    file_run = read_trec_run(tmp_path / "run.txt")
    assert file_run == run
    ev = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100", "recip_rank"})
    per_q = ev.evaluate(file_run)
    judged = [q for q in qids if q in qrels]
    assert ours["queries"] == len(judged) == 30
    ref_ndcg = sum(per_q[q]["ndcg_cut_10"] for q in judged) / len(judged)
    ref_recall = sum(per_q[q]["recall_100"] for q in judged) / len(judged)
    assert ours["ndcg@10"] == pytest.approx(ref_ndcg, abs=1e-9)
    assert ours["recall@100"] == pytest.approx(ref_recall, abs=1e-9)
    # MRR@10: reciprocal rank of the first relevant document within the top 10.
    rr = []
    for q in judged:
        ranked = sorted(file_run[q].items(), key=lambda x: -x[1])[:10]
        rr.append(next((1 / (i + 1) for i, (d, _) in enumerate(ranked) if qrels[q].get(d, 0) > 0), 0.0))
    assert ours["mrr@10"] == pytest.approx(sum(rr) / len(rr), abs=1e-9)
    # regression figures for this collection (README of the data: plain BM25 0.6633 / 0.7633)
    assert ours["ndcg@10"] == pytest.approx(0.66, abs=0.02)


def test_missing_queries_score_zero():
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1}}
    run = {"q1": {"d1": 1.0}}
    m = evaluate(run, qrels, qids=["q1", "q2", "q3"])
    assert m["queries"] == 2
    assert m["ndcg@10"] == pytest.approx(0.5)


def test_float32_ties_keep_our_order(tmp_path):
    """Scores tied at float32 resolution (exactly equal, or distinct only as float64) are
    exported strictly decreasing as float32, so trec_eval (float scores) cannot re-sort them by
    document id: the relevant document "b" stays at our rank 1 (any id order would put it 2nd)."""
    import numpy as np
    import pytrec_eval

    qrels = {"q1": {"b": 1}, "q2": {"b": 1}}
    exact = [0.5, 0.5, 0.5]
    f64 = [0.5, 0.5 - 1e-12, 0.5 - 2e-12]  # distinct as float64, one value as float32
    run = make_run(["q1", "q2"], [["b", "a", "c"], ["b", "c", "a"]], [exact, f64])
    for q in run:
        s32 = np.array(list(run[q].values()), np.float32)
        assert (np.diff(s32) < 0).all(), run[q]
        assert list(run[q]) == ["b", "a", "c"] if q == "q1" else ["b", "c", "a"]
    m = evaluate(run, qrels, metrics={"ndcg@10": "nDCG@10", "mrr@10": "RR@10"})
    assert m["ndcg@10"] == pytest.approx(1.0) and m["mrr@10"] == pytest.approx(1.0)
    write_trec_run(tmp_path / "run.txt", run)
    per_q = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "ndcg_cut.10"}).evaluate(read_trec_run(tmp_path / "run.txt"))
    assert all(per_q[q]["recip_rank"] == 1.0 and per_q[q]["ndcg_cut_10"] == pytest.approx(1.0) for q in qrels)
    # the float32 nudge: one float32 step below the previous score per tied place
    assert strictly_decreasing([1.0, 1.0]) == [1.0, float(np.nextafter(np.float32(1.0), np.float32(0)))]


def _labelled_files(tmp_path, queries_tsv=False):
    """A small queries file (BEIR JSONL, or qid<TAB>text) and BEIR qrels where query q1 has two
    judgements (so the qrels read as queries give a duplicate id)."""
    q = tmp_path / ("queries.tsv" if queries_tsv else "queries.jsonl")
    rows = [("q1", "lung cancer in smokers"), ("q2", "kidney disease"), ("q3", "vitamin d")]
    q.write_text("".join(f"{i}\t{t}\n" if queries_tsv else json.dumps({"_id": i, "text": t}) + "\n" for i, t in rows))
    r = tmp_path / "qrels.tsv"
    r.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t2\nq2\td3\t1\n")
    return q, r


@pytest.mark.parametrize("queries_tsv", [False, True])
def test_read_labelled_as_given(tmp_path, queries_tsv):
    q, r = _labelled_files(tmp_path, queries_tsv)
    queries, qrels = read_labelled(q, r)
    assert queries == {"q1": "lung cancer in smokers", "q2": "kidney disease", "q3": "vitamin d"}
    assert qrels == {"q1": {"d1": 1, "d2": 2}, "q2": {"d3": 1}}
    assert (queries, qrels) == (read_queries(q), read_qrels(r))


@pytest.mark.parametrize("queries_tsv", [False, True])
def test_read_labelled_swapped_names_both_files(tmp_path, queries_tsv):
    q, r = _labelled_files(tmp_path, queries_tsv)
    with pytest.raises(CorpusError) as e:
        read_labelled(r, q)
    msg = str(e.value)
    assert msg.startswith(f"the queries and qrels files look swapped: the queries file {str(r)!r} looks like qrels "
                          f"and the qrels file {str(q)!r} like queries; reading them as given: {r}, line 3")
    assert "duplicate query id 'q1'" in msg


@pytest.mark.parametrize("name, text, reader_error", [
    ("one.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td3\t1\n",
     r"queries\.jsonl, line 1: expected 3 \(BEIR\) or 4 \(TREC\) columns, got 7"),  # read as queries without error
    ("one.qrels", "q1 0 d1 1\nq2 0 d3 1\n", r"one\.qrels, line 1: not valid JSON"),  # TREC form
])
def test_read_labelled_swapped_whichever_reader_fails(tmp_path, name, text, reader_error):
    """Qrels with one judgement per query can read as queries without error (the qrels reader
    then rejects the queries file), or fail as JSON: either way the error says the files look
    swapped and carries the reader's error."""
    q, _ = _labelled_files(tmp_path)
    r = tmp_path / name
    r.write_text(text)
    with pytest.raises(CorpusError, match=rf"^the queries and qrels files look swapped: the queries file '.*{name}' "
                                          rf"looks like qrels and the qrels file '.*queries\.jsonl' like queries; "
                                          rf"reading them as given: .*{reader_error}"):
        read_labelled(r, q)


def test_read_labelled_same_kind_twice(tmp_path):
    """The same kind of file given twice is not called a swap: the error says which one is wrong."""
    q, r = _labelled_files(tmp_path)
    with pytest.raises(CorpusError, match=r"^the queries file .*qrels\.tsv' looks like qrels \(query-id corpus-id "
                                          r"grade lines\), not queries .*duplicate query id 'q1'"):
        read_labelled(r, r)
    with pytest.raises(CorpusError, match=r"^the qrels file .*queries\.jsonl' looks like queries .*not qrels .*"
                                          r"expected 3 \(BEIR\) or 4 \(TREC\) columns"):
        read_labelled(q, q)


def test_read_labelled_other_errors_unchanged(tmp_path):
    """A bad file that looks like neither kind keeps the reader's own error."""
    q, r = _labelled_files(tmp_path)
    bad = tmp_path / "bad.tsv"
    bad.write_text("q1\td1\tx\n")
    with pytest.raises(CorpusError) as e:
        read_labelled(q, bad)
    assert str(e.value) == f"{bad}, line 1: relevance grade is not an integer: 'x'"
    with pytest.raises(CorpusError, match="none.jsonl: file not found$"):
        read_labelled(tmp_path / "none.jsonl", r)


def test_read_query_file_says_qrels(tmp_path):
    q, r = _labelled_files(tmp_path)
    assert read_query_file(q) == read_queries(q)
    with pytest.raises(CorpusError, match=r"^the queries file .*qrels\.tsv' looks like qrels .*duplicate query id"):
        read_query_file(r)


def test_read_labelled_swapped_long_gzipped_lines(tmp_path):
    """The first lines are sampled from a bounded read that may end inside a multi-byte
    character; a .gz queries file is looked at decompressed."""
    import gzip

    import retriever.evaluation as ev

    for pad in ("", "x"):  # one of the two puts the end of the bounded read inside an 'é'
        data = "".join(json.dumps({"_id": f"q{i}", "text": pad * (i == 0) + "é" * 3000}, ensure_ascii=False) + "\n"
                       for i in range(40)).encode()
        try:
            data[:ev.SNIFF_BYTES].decode("utf-8")
        except UnicodeDecodeError:
            break
    else:
        raise AssertionError("no cut inside a character")
    q = tmp_path / "queries.jsonl.gz"
    q.write_bytes(gzip.compress(data))
    r = tmp_path / "qrels.tsv"
    r.write_text("query-id\tcorpus-id\tscore\n" + "q1\td1\t1\n" * 2)
    with pytest.raises(CorpusError, match="^the queries and qrels files look swapped: the queries file .*qrels.tsv' "
                                          "looks like qrels and the qrels file .*queries.jsonl.gz' like queries;"):
        read_labelled(r, q)


def test_read_qrels_splits_tab_separated_lines_on_tabs_only(tmp_path):
    """BEIR's TSV may carry ids with spaces (the index accepts them): a tab-separated line is split
    on tabs, so 'a b' stays one id instead of being read as the TREC line 'q1 a b 1'; TREC lines
    (spaces) read as before; an empty tab-separated column names the line."""
    p = tmp_path / "qrels.tsv"
    p.write_text("query-id\tcorpus-id\tscore\nq1\ta b\t1\nq2\td2\t2\r\n")
    assert read_qrels(p) == {"q1": {"a b": 1}, "q2": {"d2": 2}}
    p.write_text("q1 0 d1 1\nq1 0 d2 0\n")
    assert read_qrels(p) == {"q1": {"d1": 1, "d2": 0}}
    p.write_text("q1\t\t1\n")
    with pytest.raises(CorpusError, match=r"line 1.*empty column|empty column.*line 1"):
        read_qrels(p)
