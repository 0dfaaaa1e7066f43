"""Metadata filters (issue 22): parsing and validation of both forms, compiled masks against a
numpy oracle, SQL null semantics, and filtered search against brute force over the filtered set.

The oracle of a filtered search is the unfiltered exact search of every matching document
(depth = the corpus size), restricted to the documents whose metadata passes (computed here in
numpy from the same records, not by Arrow), cut at k: ids and scores must be equal exactly."""

from __future__ import annotations

import datetime as dt
import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from conftest import DATA, random_corpus
from retriever import QueryError, Retriever, build_index
from retriever.filters import compile_filter, filter_key, list_contains, parse_filter
from retriever.fusion import RRF, Linear, fuse
from retriever.params import BM25_ALGORITHMS, BM25SearchParams

T0 = dt.datetime(2020, 1, 1)
CATS = [f"c{i}" for i in range(50)]
TAGS = ["red", "green", "blue", "black", "white"]
SELECTIVITIES = (0.001, 0.01, 0.1, 0.5, 1.0)


def add_fields(docs: list[dict], seed: int, *, missing: bool) -> list[dict]:
    """Synthetic typed fields: ``year`` a uniform int in [0, 1000) with exactly ``n·t/1000``
    documents below t (a permutation), ``cat`` a Zipfian category, ``flag`` a bool, ``ts`` a
    timestamp (one minute per rank of a second permutation), ``tags`` a list of 0-3 tags. With
    ``missing``, every 7th document lacks ``year`` and every 11th has an explicit null ``cat``."""
    n = len(docs)
    rng = np.random.default_rng(seed)
    year = rng.permutation(n) * 1000 // n
    minute = rng.permutation(n)
    zipf = np.minimum(rng.zipf(1.3, n) - 1, len(CATS) - 1)
    out = []
    for i, d in enumerate(docs):
        d = dict(d)
        d.pop("meta", None)
        if not (missing and i % 7 == 0):
            d["year"] = int(year[i])
        d["cat"] = None if missing and i % 11 == 0 else CATS[int(zipf[i])]
        d["flag"] = bool(i % 2)
        d["ts"] = T0 + dt.timedelta(minutes=int(minute[i]))
        d["tags"] = [TAGS[j] for j in sorted(rng.choice(len(TAGS), int(rng.integers(0, 4)), replace=False))]
        out.append(d)
    return out


def oracle_mask(docs: list[dict], pred) -> np.ndarray:
    """bool (n,): ``pred(record)`` per record, a Python twin of a filter (``None`` values and
    missing fields handled by ``pred`` itself)."""
    return np.array([bool(pred(d)) for d in docs], dtype=bool)


def restrict(ref, keep: np.ndarray, k: int):
    """The top-k of an unfiltered full-depth result ``ref`` restricted to documents ``keep``
    (bool over global ordinals): (list of id arrays, list of score arrays)."""
    ids, scores = [], []
    for q in range(ref.ids.shape[0]):
        row = ref.ids[q, :ref.n_found[q]]
        sel = keep[row]
        ids.append(row[sel][:k])
        scores.append(ref.scores[q, :ref.n_found[q]][sel][:k])
    return ids, scores


def assert_matches(got, want_ids, want_scores, keep: np.ndarray, k: int) -> None:
    """Filtered result == oracle (ids and float32 scores exactly); no filtered-out document; k
    met whenever k documents pass and match."""
    for q in range(len(want_ids)):
        n = int(got.n_found[q])
        ids = got.ids[q, :n]
        assert keep[ids].all(), f"query {q}: filtered-out documents returned {ids[~keep[ids]]}"
        assert n == min(k, len(want_ids[q])), (q, n, len(want_ids[q]))
        np.testing.assert_array_equal(ids, want_ids[q])
        np.testing.assert_array_equal(got.scores[q, :n], want_scores[q])
        assert (got.ids[q, n:] == -1).all()


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def small_docs() -> list[dict]:
    return add_fields(random_corpus(300, seed=5, min_len=1), seed=3, missing=True)


@pytest.fixture(scope="module", params=[1, 3], ids=["1shard", "3shards"])
def small_index(request, tmp_path_factory, small_docs):
    out = tmp_path_factory.mktemp("filt") / f"s{request.param}"
    build_index(small_docs, out, legs=("bm25",), show_progress=False,
                shard_size=10_000 if request.param == 1 else 120)
    return Retriever.open(out, n_threads=1)


QUERIES = ["vitamin bone", "heart cell sleep", "gene", "protein protein dose", "brain memory diet sugar",
           "insulin liver kidney virus immune", "the", "zzz-nothing", "blood pressure"]


# ----------------------------------------------------------------------- parsing and validation
def test_dict_form_operators_equal_numpy_oracle(small_index, small_docs):
    """Every operator of the dict form, compiled per shard, equals a Python twin of it over the
    records (the null semantics included: a missing / null field fails every comparison, under
    $not, $ne and $nin too; $exists looks at the nulls)."""
    yr = lambda d: d.get("year")  # noqa: E731
    cases = [
        ({"year": 500}, lambda d: yr(d) == 500),
        ({"year": {"$eq": 500}}, lambda d: yr(d) == 500),
        ({"year": {"$ne": 500}}, lambda d: yr(d) is not None and yr(d) != 500),
        ({"year": {"$gt": 700}}, lambda d: yr(d) is not None and yr(d) > 700),
        ({"year": {"$gte": 700, "$lt": 800}}, lambda d: yr(d) is not None and 700 <= yr(d) < 800),
        ({"year": {"$lte": 99.5}}, lambda d: yr(d) is not None and yr(d) <= 99.5),
        ({"year": {"$in": [1, 2, 3, 500]}}, lambda d: yr(d) in (1, 2, 3, 500)),
        ({"year": {"$nin": [1, 2, 3]}}, lambda d: yr(d) is not None and yr(d) not in (1, 2, 3)),
        ({"$not": {"year": {"$gt": 700}}}, lambda d: yr(d) is not None and not yr(d) > 700),
        ({"year": {"$not": {"$in": [5, 6]}}}, lambda d: yr(d) is not None and yr(d) not in (5, 6)),
        ({"$not": {"year": {"$ne": 500}}}, lambda d: yr(d) == 500),
        ({"year": {"$exists": True}}, lambda d: yr(d) is not None),
        ({"year": {"$exists": False}}, lambda d: yr(d) is None),
        ({"$not": {"year": {"$exists": True}}}, lambda d: yr(d) is None),
        ({"cat": {"$exists": False}}, lambda d: d["cat"] is None),
        ({"cat": "c0"}, lambda d: d["cat"] == "c0"),
        ({"cat": {"$nin": ["c0", "c1"]}}, lambda d: d["cat"] is not None and d["cat"] not in ("c0", "c1")),
        ({"flag": True}, lambda d: d["flag"]),
        ({"flag": {"$ne": True}}, lambda d: not d["flag"]),
        ({"ts": {"$lt": "2020-01-01T01:00:00"}}, lambda d: d["ts"] < dt.datetime(2020, 1, 1, 1)),
        ({"ts": {"$gte": "2020-01-01T02:30"}}, lambda d: d["ts"] >= dt.datetime(2020, 1, 1, 2, 30)),
        ({"ts": {"$gte": dt.datetime(2020, 1, 1, 2, 30)}}, lambda d: d["ts"] >= dt.datetime(2020, 1, 1, 2, 30)),
        ({"ts": {"$lt": "2020-01-01T02:00:00+01:00"}}, lambda d: d["ts"] < dt.datetime(2020, 1, 1, 1)),
        ({"tags": "red"}, lambda d: "red" in d["tags"]),
        ({"tags": {"$in": ["red", "blue"]}}, lambda d: bool({"red", "blue"} & set(d["tags"]))),
        ({"tags": {"$nin": ["red", "blue"]}}, lambda d: not {"red", "blue"} & set(d["tags"])),
        ({"tags": {"$ne": "red"}}, lambda d: "red" not in d["tags"]),
        ({"$and": [{"flag": True}, {"year": {"$lt": 300}}]}, lambda d: d["flag"] and yr(d) is not None and yr(d) < 300),
        ({"$or": [{"year": {"$lt": 100}}, {"cat": "c1"}]},
         lambda d: (yr(d) is not None and yr(d) < 100) or d["cat"] == "c1"),
        ({"$not": {"$or": [{"year": {"$lt": 100}}, {"flag": True}]}},  # Kleene: null or false is null: fails
         lambda d: yr(d) is not None and not yr(d) < 100 and not d["flag"]),
        ({"year": {"$in": []}}, lambda d: False),
        ({}, lambda d: True),
    ]
    r = small_index
    sids = range(len(r.reader.shards))
    for f, pred in cases:
        masks = compile_filter(f, r.reader, sids)
        got = np.concatenate([np.ones(r.reader.shards[i].rows, np.uint8) if m is None else m
                              for i, m in zip(sids, masks)]).astype(bool)
        want = oracle_mask(small_docs, pred)
        np.testing.assert_array_equal(got, want, err_msg=str(f))
        for i, m in zip(sids, masks):  # None exactly when every row of the shard passes
            assert (m is None) == bool(want[r.reader.shards[i].base:][:r.reader.shards[i].rows].all())
            assert m is None or (m.dtype == np.uint8 and len(m) == r.reader.shards[i].rows)


def test_expression_form_equals_dict_form(small_index):
    """The two forms compile to the same masks and give the same hits."""
    r = small_index
    pairs = [
        ({"year": {"$gte": 200, "$lt": 700}}, (pc.field("year") >= 200) & (pc.field("year") < 700)),
        ({"cat": {"$in": ["c0", "c2"]}, "flag": False}, pc.field("cat").isin(["c0", "c2"]) & (pc.field("flag") == False)),  # noqa: E712
        ({"$or": [{"year": {"$lt": 50}}, {"tags": "red"}]}, (pc.field("year") < 50) | list_contains("tags", "red")),
        ({"ts": {"$lt": "2020-01-01T03:00:00"}}, pc.field("ts") < pa.scalar(dt.datetime(2020, 1, 1, 3), pa.timestamp("us"))),
        ({"$not": {"year": {"$gt": 500}}}, ~(pc.field("year") > 500)),
    ]
    sids = range(len(r.reader.shards))
    for d, e in pairs:
        md, me = compile_filter(d, r.reader, sids), compile_filter(e, r.reader, sids)
        for a, b in zip(md, me):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_array_equal(a, b, err_msg=str(d))
        ra = r.search_arrays(QUERIES, 10, mode="bm25", filter=d)
        rb = r.search_arrays(QUERIES, 10, mode="bm25", filter=e)
        np.testing.assert_array_equal(ra.ids, rb.ids)
        np.testing.assert_array_equal(ra.scores, rb.scores)
    assert isinstance(parse_filter({"year": 5}), pc.Expression)
    e = pc.field("year") > 3
    assert parse_filter(e) is e
    assert filter_key({"a": 1, "b": 2}) == filter_key({"b": 2, "a": 1})
    assert filter_key(pc.field("a") > 1) == filter_key(pc.field("a") > 1) != filter_key(pc.field("a") > 2)


def test_validation_errors_name_field_types_and_operators(small_index):
    """Unknown field: names it and the fields that exist; type mismatch: the field and both
    types; unknown operator: it and the valid ones; malformed conditions: what is wrong."""
    r = small_index
    cases = [
        ({"yaer": 2020}, r"unknown field 'yaer'; fields: .*cat \(string\).*year \(int64\)"),
        (pc.field("yaer") > 1, r"unknown field 'yaer'; fields: .*year \(int64\)"),
        ({"year": "2020"}, r"field 'year' is int64, got string value '2020'"),
        ({"year": {"$gt": True}}, r"field 'year' is int64, got bool value True"),
        ({"cat": {"$in": ["c0", 3]}}, r"field 'cat' is string, got int value 3"),
        ({"flag": 1}, r"field 'flag' is bool, got int value 1"),
        ({"ts": {"$lt": "yesterday"}}, r"field 'ts' is timestamp, got 'yesterday': not an ISO-8601"),
        ({"ts": {"$lt": 5}}, r"field 'ts' is timestamp, got int value 5"),
        ({"tags": 3}, r"field 'tags' is list<string>, got int value 3"),
        ({"tags": {"$gt": "a"}}, r"field 'tags' is list<string>: operator \$gt is not supported \(valid: \$eq"),
        ({"year": {"$regex": "x"}}, r"unknown operator '\$regex'; valid: \$eq, \$ne, \$in, \$nin, \$gt, \$gte, "
                                    r"\$lt, \$lte, \$exists, \$not"),
        ({"$nor": [{"year": 1}]}, r"unknown operator '\$nor'; valid at this level: \$and, \$or, \$not"),
        ({"year": {"$in": 5}}, r"\$in takes a list of values, got int 5"),
        ({"year": [1, 2]}, r"\$eq takes one value, got list \[1, 2\] \(use \$in"),
        ({"year": None}, r"null is not a value to compare with .*\$exists"),
        ({"year": {"$exists": 1}}, r"\$exists takes true or false, got 1"),
        ({"$and": []}, r"\$and takes a non-empty list of conditions"),
        ({"$or": {"year": 1}}, r"\$or takes a non-empty list"),
        ({"year": {"gt": 1}}, r"condition dict must hold operators"),
        ({"year": 1 << 70}, r"integer \d+ does not fit int64"),
        ({"year": float("nan")}, r"nan is not a comparable number"),
        (pc.field("year") > "x", r"filter expression \(year > \"x\"\): Function 'greater' has no kernel matching "
                                 r"input types \(int64, string\)"),
        (pc.field("year") + 1, r"yields int64, not booleans"),
        ("year > 5", r"filter must be a dict or a pyarrow.compute.Expression, got str"),
        ([{"year": 1}], r"filter has 1 entries for 2 queries"),
    ]
    for f, msg in cases:
        with pytest.raises(QueryError, match=msg):
            r.search_arrays(["bone", "gene"], 5, mode="bm25", filter=f)
    with pytest.raises(QueryError, match=r"filter #1 is a list"):
        r.search_arrays(["bone", "gene"], 5, mode="bm25", filter=[None, [{"year": 1}]])


def test_list_contains_helper_errors():
    with pytest.raises(QueryError, match="values must be strings, got int 3"):
        list_contains("tags", ["a", 3])


# ------------------------------------------------------------------------------- BM25 filtered
def _bm25_oracle(r: Retriever, qs: list[str], params: BM25SearchParams | None = None):
    lp = {"bm25": params or BM25SearchParams(algorithm="exhaustive")}
    return r.search_arrays(qs, r.reader.n_docs, mode="bm25", leg_params=lp)


@pytest.mark.parametrize("algorithm", BM25_ALGORITHMS)
def test_bm25_filtered_equals_brute_force_small(small_index, small_docs, algorithm):
    """Every BM25 algorithm, on one shard and on three: filtered top-k == the exact top-k of the
    passing documents; k met whenever k pass and match; no filtered-out document."""
    r = small_index
    ref = _bm25_oracle(r, QUERIES)
    filters = [
        ({"year": {"$lt": 1}}, lambda d: d.get("year") is not None and d["year"] < 1),
        ({"year": {"$lt": 100}}, lambda d: d.get("year") is not None and d["year"] < 100),
        ({"cat": {"$in": ["c0", "c3"]}}, lambda d: d["cat"] in ("c0", "c3")),
        ({"$not": {"year": {"$gte": 500}}}, lambda d: d.get("year") is not None and d["year"] < 500),
        ({"tags": "red", "flag": True}, lambda d: "red" in d["tags"] and d["flag"]),
        ({"year": {"$gt": 10_000}}, lambda d: False),
        ({}, lambda d: True),
    ]
    for k in (1, 10, 60):
        for f, pred in filters:
            keep = oracle_mask(small_docs, pred)
            want_ids, want_scores = restrict(ref, keep, k)
            got = r.search_arrays(QUERIES, k, mode="bm25", filter=f,
                                  leg_params={"bm25": {"algorithm": algorithm}})
            assert_matches(got, want_ids, want_scores, keep, k)
            one = r.search_arrays(QUERIES[:1], k, mode="bm25", filter=f, leg_params={"bm25": {"algorithm": algorithm}})
            np.testing.assert_array_equal(one.ids[0], got.ids[0])


def test_bm25_filtered_other_k1_b(small_index, small_docs):
    """Per-call k1 / b (a scoring state built on first use) honour the filter too."""
    r = small_index
    p = BM25SearchParams(algorithm="exhaustive", k1=0.7, b=0.3)
    ref = _bm25_oracle(r, QUERIES, p)
    keep = oracle_mask(small_docs, lambda d: d["flag"])
    for algo in BM25_ALGORITHMS:
        got = r.search_arrays(QUERIES, 10, mode="bm25", filter={"flag": True},
                              leg_params={"bm25": BM25SearchParams(algorithm=algo, k1=0.7, b=0.3)})
        assert_matches(got, *restrict(ref, keep, 10), keep, 10)


def test_bm25_fused_text_pass_honours_filter(tmp_path, small_docs):
    """The fused analyse-and-score pass (one shard, >= 16 queries, a token table holding
    tokens) returns the filtered exact top-k."""
    build_index(small_docs, tmp_path / "ix", legs=("bm25",), show_progress=False)
    r = Retriever.open(tmp_path / "ix", n_threads=1)
    qs = (QUERIES * 3)[:20]
    ref = _bm25_oracle(r, qs)  # fills the token table
    leg = r.engine.legs["bm25"]
    assert leg.prepare(qs, BM25SearchParams()).utf8 is not None  # the fused pass applies
    keep = oracle_mask(small_docs, lambda d: d.get("year") is not None and d["year"] < 300)
    for algo in ("auto", "exhaustive"):
        got = r.search_arrays(qs, 10, mode="bm25", filter={"year": {"$lt": 300}},
                              leg_params={"bm25": {"algorithm": algo}})
        assert_matches(got, *restrict(ref, keep, 10), keep, 10)


def test_per_query_filters_equal_one_at_a_time(small_index):
    """A batch with one filter per query (some equal, some None) == each query alone."""
    r = small_index
    fl = [{"year": {"$lt": 300}}, None, {"tags": "red"}, {"year": {"$lt": 300}}, pc.field("flag") == True,  # noqa: E712
          None, {"cat": "c0"}, {"year": {"$gt": 10_000}}, {"tags": "red"}]
    assert len(fl) == len(QUERIES)
    for mode_params in ({"bm25": {"algorithm": "maxscore"}}, None):
        batch = r.search_arrays(QUERIES, 7, mode="bm25", filter=fl, leg_params=mode_params)
        assert "filter" in batch.timings_ms
        for i, (q, f) in enumerate(zip(QUERIES, fl)):
            one = r.search_arrays([q], 7, mode="bm25", filter=f, leg_params=mode_params)
            np.testing.assert_array_equal(batch.ids[i], one.ids[0])
            np.testing.assert_array_equal(batch.scores[i], one.scores[0])
            assert batch.n_found[i] == one.n_found[0]
            np.testing.assert_array_equal(batch.legs["bm25"].ranks[i], one.legs["bm25"].ranks[0])
        hits = r.search_batch(QUERIES, 7, mode="bm25", filter=fl, leg_params=mode_params)
        assert [[h.id for h in hs] for hs in hits] == [
            [h.id for h in r.search(q, 7, mode="bm25", filter=f, leg_params=mode_params)] for q, f in zip(QUERIES, fl)]


def test_filter_matching_nothing_and_search_hits(small_index):
    r = small_index
    assert r.search("vitamin bone", 10, mode="bm25", filter={"year": {"$gt": 5000}}) == []
    res = r.search_arrays(["vitamin", "bone"], 10, mode="bm25", filter={"cat": {"$in": []}})
    assert (res.n_found == 0).all() and (res.ids == -1).all()
    hits = r.search("vitamin bone", 10, mode="bm25", filter={"tags": {"$in": ["red"]}, "year": {"$exists": True}})
    assert hits and all("red" in h.metadata["tags"] and "year" in h.metadata for h in hits)


def test_filter_and_tombstones(small_index, small_docs):
    """The filter is ANDed with the live-documents mask: a deleted document stays out."""
    r = small_index
    saved = r.engine.live
    try:
        dead = np.zeros(r.reader.n_docs, bool)
        dead[::3] = True
        r.engine.live = tuple((~dead[s.base:s.base + s.rows]).astype(np.uint8) for s in r.reader.shards)
        ref = _bm25_oracle(r, QUERIES)  # the live documents only
        keep = oracle_mask(small_docs, lambda d: d["flag"]) & ~dead
        got = r.search_arrays(QUERIES, 10, mode="bm25", filter={"flag": True})
        assert_matches(got, *restrict(ref, keep, 10), keep, 10)
    finally:
        r.engine.live = saved


def test_mask_cache_is_bounded_and_keyed_by_generation(small_index):
    r = small_index
    r._filter_cache.clear()
    a = r.filter_masks({"year": {"$lt": 10}})
    assert r.filter_masks({"year": {"$lt": 10}}) is a
    assert all(m is None or not m.flags.writeable for m in a)
    for i in range(r.FILTER_CACHE_ENTRIES + 5):
        r.filter_masks({"year": {"$lt": i}})
    assert len(r._filter_cache) == r.FILTER_CACHE_ENTRIES
    assert all(key[1] == r.reader.generation for key in r._filter_cache)


# ------------------------------------------------------------------- SciFact with typed fields
@pytest.fixture(scope="module", params=[1, 3], ids=["1shard", "3shards"])
def scifact(request, tmp_path_factory):
    path = DATA / "scifact" / "corpus.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"SciFact not found at {path} (set RETRIEVER_DATA)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        docs = add_fields([json.loads(line) for line in f], seed=11, missing=False)
    out = tmp_path_factory.mktemp("scifact") / f"s{request.param}"
    build_index(docs, out, legs=("bm25",), show_progress=False,
                shard_size=100_000 if request.param == 1 else 1800)
    with open(DATA / "scifact" / "queries.jsonl", encoding="utf-8") as f:
        qs = [json.loads(line)["text"] for line in f][:40]
    return Retriever.open(out, n_threads=2), docs, qs


def _selective(docs: list[dict], s: float):
    """A filter passing a fraction ``s`` of the documents and its Python twin, over a different
    field type per selectivity (int, Zipfian category, timestamp, bool, list of tags)."""
    n = len(docs)
    if s == 0.001:
        return {"year": {"$lt": 1}}, lambda d: d["year"] < 1
    if s == 0.01:  # year < 10 exactly 1 %, narrowed by a frequent category
        return ({"year": {"$lt": 20}, "cat": {"$in": ["c0", "c1"]}},
                lambda d: d["year"] < 20 and d["cat"] in ("c0", "c1"))
    if s == 0.1:
        end = T0 + dt.timedelta(minutes=n // 10)
        return {"ts": {"$lt": end.isoformat()}}, lambda d: d["ts"] < end
    if s == 0.5:
        return {"flag": True}, lambda d: d["flag"]
    return {"$or": [{"tags": {"$exists": True}}, {"year": {"$gte": 0}}]}, lambda d: True


@pytest.mark.parametrize("algorithm", BM25_ALGORITHMS)
def test_bm25_scifact_selectivities(scifact, algorithm):
    """SciFact with synthetic typed fields, every BM25 algorithm, selectivities 0.1 % to 100 %:
    filtered top-k == brute force over the filtered set, k met, nothing filtered out returned;
    the batch run twice (the second one takes the fused text pass where it applies)."""
    r, docs, qs = scifact
    ref = _bm25_oracle(r, qs)
    for s in SELECTIVITIES:
        f, pred = _selective(docs, s)
        keep = oracle_mask(docs, pred)
        frac = keep.mean()
        assert (s / 2 <= frac <= 2 * s) if s < 1 else frac == 1.0, (s, frac)
        for k in (10, 100):
            want = restrict(ref, keep, k)
            for _ in range(2):
                got = r.search_arrays(qs, k, mode="bm25", filter=f, leg_params={"bm25": {"algorithm": algorithm}})
                assert_matches(got, *want, keep, k)


# ------------------------------------------------------------- dense, sparse, hybrid (all legs)
@pytest.fixture(scope="module")
def three_legs(tmp_path_factory, small_docs):
    """BM25 + dense + sparse index (vectors given) of the small typed collection, 3 shards."""
    rng = np.random.default_rng(9)
    n = len(small_docs)
    dv = rng.standard_normal((n, 16)).astype(np.float32)
    terms = [np.unique(rng.integers(0, 300, rng.integers(1, 30))) for _ in range(n)]
    ptr = np.zeros(n + 1, np.int64)
    ptr[1:] = np.cumsum([len(t) for t in terms])
    out = tmp_path_factory.mktemp("filt3") / "ix"
    build_index(small_docs, out, legs=("bm25", "dense", "sparse"), dense_vectors=dv, shard_size=120,
                show_progress=False, sparse_vectors=(ptr, np.concatenate(terms).astype(np.uint32),
                                                     (rng.random(int(ptr[-1])) + 0.05).astype(np.float32)))
    qv = rng.standard_normal((len(QUERIES), 16)).astype(np.float32)
    qsv = [(np.unique(rng.integers(0, 300, 8)).astype(np.uint32), None) for _ in QUERIES]
    qsv = [(t, np.linspace(1.0, 0.2, len(t)).astype(np.float32)) for t, _ in qsv]
    return Retriever.open(out, n_threads=1), qv, qsv


#: exact settings of each leg (the oracle's and the filtered search's)
EXACT = {"bm25": {"algorithm": "exhaustive"}, "dense": {}, "sparse": {"algorithm": "exact"}}
LEG_FILTERS = [({"year": {"$lt": 1}}, lambda d: d.get("year") is not None and d["year"] < 1),
               ({"year": {"$lt": 100}}, lambda d: d.get("year") is not None and d["year"] < 100),
               ({"tags": "red", "flag": True}, lambda d: "red" in d["tags"] and d["flag"]),
               ({"$not": {"year": {"$gte": 500}}}, lambda d: d.get("year") is not None and d["year"] < 500),
               ({}, lambda d: True)]


def _leg_oracle(r: Retriever, mode: str, qs: list[str], qv, qsv):
    return r.search_arrays(qs, r.reader.n_docs, mode=mode, query_vectors=qv, sparse_vectors=qsv,
                           leg_params={mode: EXACT[mode]})


@pytest.mark.parametrize("mode", ["bm25", "dense", "sparse"])
def test_each_leg_filtered_equals_brute_force(three_legs, small_docs, mode):
    r, qv, qsv = three_legs
    ref = _leg_oracle(r, mode, QUERIES, qv, qsv)
    for f, pred in LEG_FILTERS:
        keep = oracle_mask(small_docs, pred)
        for k in (1, 10, 50):
            got = r.search_arrays(QUERIES, k, mode=mode, filter=f, query_vectors=qv, sparse_vectors=qsv,
                                  leg_params={mode: EXACT[mode]})
            assert_matches(got, *restrict(ref, keep, k), keep, k)


@pytest.mark.parametrize("fusion", [RRF(), Linear(), Linear(norm="zscore"), Linear(norm="none", weights={"dense": 2.0})],
                         ids=["rrf", "minmax", "zscore", "none-weighted"])
def test_hybrid_filtered_equals_fusing_filtered_legs(three_legs, small_docs, fusion):
    """Fusion sees only passing documents: the filtered hybrid result (ids, fused scores, per-leg
    scores and ranks) equals fusing each leg's brute-force filtered list."""
    r, qv, qsv = three_legs
    refs = {m: _leg_oracle(r, m, QUERIES, qv, qsv) for m in r.legs}
    for f, pred in LEG_FILTERS:
        assert_hybrid_matches(r, QUERIES, qv, qsv, refs, f, oracle_mask(small_docs, pred), fusion)


def assert_hybrid_matches(r: Retriever, qs: list[str], qv, qsv, refs, f, keep: np.ndarray, fusion,
                          depth: int = 30, k: int = 10) -> None:
    """Filtered hybrid search == fusing each leg's brute-force filtered top-``depth`` (``refs``:
    per leg the unfiltered full-depth exact result): ids, fused scores, per-leg scores and ranks."""
    per_leg = {}
    for m in r.legs:
        ids, scores = restrict(refs[m], keep, depth)
        out_ids = np.full((len(qs), depth), -1, np.int64)
        out_sc = np.full((len(qs), depth), -np.inf, np.float32)
        n_found = np.zeros(len(qs), np.int32)
        for q in range(len(qs)):
            out_ids[q, :len(ids[q])], out_sc[q, :len(ids[q])], n_found[q] = ids[q], scores[q], len(ids[q])
        per_leg[m] = (out_ids, out_sc, n_found)
    w_ids, w_scores, w_n, w_legs = fuse(per_leg, k, fusion)
    got = r.search_arrays(qs, k, mode="hybrid", fusion=fusion, depth=depth, filter=f, query_vectors=qv,
                          sparse_vectors=qsv, leg_params=EXACT)
    np.testing.assert_array_equal(got.ids, w_ids)
    np.testing.assert_array_equal(got.scores, w_scores)
    np.testing.assert_array_equal(got.n_found, w_n)
    for m in r.legs:
        np.testing.assert_array_equal(got.legs[m].ranks, w_legs[m].ranks)
        np.testing.assert_array_equal(got.legs[m].scores, w_legs[m].scores)
    assert keep[got.ids[got.ids >= 0]].all()


@pytest.mark.parametrize("mode", ["bm25", "dense", "sparse", "hybrid"])
def test_each_mode_per_query_filters_equal_one_at_a_time(three_legs, mode):
    r, qv, qsv = three_legs
    fl = [{"year": {"$lt": 300}}, None, {"tags": "red"}, {"year": {"$lt": 300}}, {"flag": True},
          None, {"cat": "c0"}, {"year": {"$gt": 10_000}}, {"tags": "red"}]
    batch = r.search_arrays(QUERIES, 7, mode=mode, filter=fl, query_vectors=qv, sparse_vectors=qsv)
    for i, f in enumerate(fl):
        one = r.search_arrays(QUERIES[i:i + 1], 7, mode=mode, filter=f, query_vectors=qv[i:i + 1],
                              sparse_vectors=qsv[i:i + 1])
        np.testing.assert_array_equal(batch.ids[i], one.ids[0])
        np.testing.assert_array_equal(batch.scores[i], one.scores[0])
        for m in batch.legs:
            np.testing.assert_array_equal(batch.legs[m].ranks[i], one.legs[m].ranks[0])


def _random_vectors(n: int, nq: int, seed: int, dim: int = 16, vocab: int = 300):
    """Seeded dense document / query vectors and sparse ones (CSR triple for the build, (ids,
    weights) pairs for the queries): the legs' inputs without running an encoder."""
    rng = np.random.default_rng(seed)
    dv = rng.standard_normal((n, dim)).astype(np.float32)
    terms = [np.unique(rng.integers(0, vocab, rng.integers(1, 30))) for _ in range(n)]
    ptr = np.zeros(n + 1, np.int64)
    ptr[1:] = np.cumsum([len(t) for t in terms])
    sv = (ptr, np.concatenate(terms).astype(np.uint32), (rng.random(int(ptr[-1])) + 0.05).astype(np.float32))
    qv = rng.standard_normal((nq, dim)).astype(np.float32)
    qsv = [np.unique(rng.integers(0, vocab, 8)).astype(np.uint32) for _ in range(nq)]
    return dv, sv, qv, [(t, np.linspace(1.0, 0.2, len(t)).astype(np.float32)) for t in qsv]


@pytest.fixture(scope="module")
def scifact_legs(tmp_path_factory):
    """SciFact (typed synthetic fields) with all three legs, 3 shards; the dense and sparse
    vectors are seeded random ones (the filter path does not depend on where they came from)."""
    path = DATA / "scifact" / "corpus.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"SciFact not found at {path} (set RETRIEVER_DATA)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        docs = add_fields([json.loads(line) for line in f], seed=11, missing=False)
    with open(DATA / "scifact" / "queries.jsonl", encoding="utf-8") as f:
        qs = [json.loads(line)["text"] for line in f][:30]
    dv, sv, qv, qsv = _random_vectors(len(docs), len(qs), seed=2, dim=32, vocab=2000)
    out = tmp_path_factory.mktemp("scifact3") / "ix"
    build_index(docs, out, legs=("bm25", "dense", "sparse"), dense_vectors=dv, sparse_vectors=sv,
                shard_size=1800, show_progress=False)
    return Retriever.open(out, n_threads=2), docs, qs, qv, qsv


@pytest.mark.parametrize("mode", ["dense", "sparse", "hybrid"])
def test_legs_scifact_selectivities(scifact_legs, mode):
    """Dense (flat) and learned-sparse (exact) legs and their RRF fusion with BM25 on SciFact with
    typed fields, selectivities 0.1 % to 100 %: brute force over the filtered set, k met, nothing
    filtered out."""
    r, docs, qs, qv, qsv = scifact_legs
    refs = {m: _leg_oracle(r, m, qs, qv, qsv) for m in (r.legs if mode == "hybrid" else [mode])}
    for s in SELECTIVITIES:
        f, pred = _selective(docs, s)
        keep = oracle_mask(docs, pred)
        if mode == "hybrid":
            assert_hybrid_matches(r, qs, qv, qsv, refs, f, keep, RRF())
            continue
        for k in (10, 100):
            got = r.search_arrays(qs, k, mode=mode, filter=f, query_vectors=qv, sparse_vectors=qsv,
                                  leg_params={mode: EXACT[mode]})
            assert_matches(got, *restrict(refs[mode], keep, k), keep, k)


# ------------------------------------------------------------------------------------------ CLI
def test_cli_filter_on_search_eval_and_bench(tmp_path, small_docs, capsys):
    """``--filter JSON`` on ``search``, ``eval`` and ``bench``: the same hits as the library, only
    passing documents in the run file; bad JSON and an unknown field are one-line errors."""
    from conftest import cli_error
    from retriever.cli import main

    build_index(small_docs, tmp_path / "ix", legs=("bm25",), show_progress=False)
    r = Retriever.open(tmp_path / "ix", n_threads=1)
    f = {"year": {"$lt": 300}, "tags": {"$in": ["red", "blue"]}}
    passing = {d["_id"] for d in small_docs if d.get("year") is not None and d["year"] < 300
               and {"red", "blue"} & set(d["tags"])}
    assert main(["search", str(tmp_path / "ix"), "vitamin bone", "-k", "8", "--mode", "bm25", "--json",
                 "--filter", json.dumps(f)]) == 0
    got = [h["id"] for h in json.loads(capsys.readouterr().out)["hits"]]
    assert got == [h.id for h in r.search("vitamin bone", 8, mode="bm25", filter=f)] and len(got) == 8
    assert set(got) <= passing

    qfile, qrels = tmp_path / "queries.jsonl", tmp_path / "qrels.tsv"
    qfile.write_text("".join(json.dumps({"_id": f"q{i}", "text": q}) + "\n" for i, q in enumerate(QUERIES)))
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(QUERIES))))
    run = tmp_path / "run.txt"
    assert main(["eval", str(tmp_path / "ix"), "--queries", str(qfile), "--qrels", str(qrels), "--mode", "bm25",
                 "--json", "--run-out", str(run), "--filter", json.dumps(f)]) == 0
    capsys.readouterr()
    docs_in_run = {line.split()[2] for line in run.read_text().splitlines()}
    assert docs_in_run and docs_in_run <= passing

    assert main(["bench", str(tmp_path / "ix"), "--queries", str(qfile), "--mode", "bm25", "--json",
                 "--filter", json.dumps(f)]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["settings"]["filter"] == f
    assert rep["modes"]["bm25"]["recall@10"]["bm25"] == 1.0  # exact algorithms against the exact filtered search

    err = cli_error(capsys, ["search", str(tmp_path / "ix"), "bone", "--filter", '{"yaer": 1}'])
    assert "unknown field 'yaer'; fields: " in err and "year (int64)" in err
    with pytest.raises(SystemExit):
        main(["search", str(tmp_path / "ix"), "bone", "--filter", "{year: 1"])
    assert "--filter: not valid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["search", str(tmp_path / "ix"), "bone", "--filter", "[1]"])
    assert "--filter: expected a JSON object" in capsys.readouterr().err


def test_fields_missing_in_shards_null_only_fields_aware_timestamps_and_dates(tmp_path):
    """A field only later shards hold (earlier ones lack it or have a null-typed child), a field
    that is null everywhere (schema type null), a UTC timestamp column, a date column and a JSON
    column ($exists only)."""
    utc = dt.timezone.utc
    docs = []
    for i in range(90):
        d = {"_id": f"d{i}", "text": "bone vitamin" if i % 2 else "gene", "blank": None,
             "tsu": dt.datetime(2021, 1, 1, tzinfo=utc) + dt.timedelta(hours=i),
             "day": dt.date(2021, 1, 1) + dt.timedelta(days=i)}
        if i >= 60:
            d["late"] = i
        if i % 3 == 0:
            d["obj"] = {"a": i}
        docs.append(d)
    build_index(docs, tmp_path / "ix", legs=("bm25",), show_progress=False, shard_size=30)
    r = Retriever.open(tmp_path / "ix", n_threads=1)
    assert r.reader.metadata_schema["blank"] is None and r.reader.metadata_schema["late"] == "int64"
    assert r.reader.metadata_schema["tsu"] == "timestamp[UTC]" and r.reader.metadata_schema["day"] == "date"
    sids = range(len(r.reader.shards))
    cases = [
        ({"late": {"$gte": 70}}, lambda i: i >= 70),
        ({"late": {"$ne": 70}}, lambda i: i >= 60 and i != 70),
        ({"$not": {"late": {"$lt": 70}}}, lambda i: i >= 70),
        ({"late": {"$exists": False}}, lambda i: i < 60),
        ({"blank": 5}, lambda i: False),
        ({"blank": {"$ne": "x"}}, lambda i: False),
        ({"blank": {"$exists": False}}, lambda i: True),
        ({"tsu": {"$lt": "2021-01-01T10:00:00+00:00"}}, lambda i: i < 10),
        ({"tsu": {"$lt": "2021-01-01T10:00:00"}}, lambda i: i < 10),  # naive: taken as UTC
        ({"tsu": {"$lt": "2021-01-01T12:00:00+02:00"}}, lambda i: i < 10),
        ({"day": {"$gte": "2021-03-01"}}, lambda i: dt.date(2021, 1, 1) + dt.timedelta(days=i) >= dt.date(2021, 3, 1)),
        ({"day": {"$in": ["2021-01-02", dt.date(2021, 1, 5)]}}, lambda i: i in (1, 4)),
        ({"obj": {"$exists": True}}, lambda i: i % 3 == 0),
    ]
    for f, pred in cases:
        masks = compile_filter(f, r.reader, sids)
        got = np.concatenate([np.ones(s.rows, np.uint8) if m is None else m
                              for s, m in zip(r.reader.shards, masks)]).astype(bool)
        np.testing.assert_array_equal(got, [pred(i) for i in range(90)], err_msg=str(f))
    with pytest.raises(QueryError, match=r"field 'day' is date, got '2021-13-01': not an ISO date"):
        r.search("bone", filter={"day": "2021-13-01"})
    with pytest.raises(QueryError, match=r"field 'obj' is json: it takes \$exists only, got \$eq"):
        r.search("bone", filter={"obj": 1})
    with pytest.raises(QueryError, match=r"field 'day' is date, got datetime value"):
        r.search("bone", filter={"day": dt.datetime(2021, 1, 1)})
    hits = r.search("bone vitamin", 50, mode="bm25", filter={"late": {"$gte": 70}})
    assert sorted(int(h.id[1:]) for h in hits) == [i for i in range(70, 90) if i % 2]


def test_filter_after_an_update_and_refresh(tmp_path, small_docs):
    """Masks are cached per generation: after an add, a delete and ``refresh()``, the same filter
    sees the new document and not the deleted one (no stale mask from the older generation)."""
    from retriever import IndexUpdater

    build_index(small_docs, tmp_path / "ix", legs=("bm25",), show_progress=False, shard_size=120)
    r = Retriever.open(tmp_path / "ix", n_threads=1)
    f = {"cat": "c0", "flag": True}
    before = [h.id for h in r.search("vitamin bone", 300, mode="bm25", filter=f)]
    assert before
    with IndexUpdater.open(tmp_path / "ix") as up:
        up.add([{"_id": "new1", "text": "vitamin bone vitamin bone", "year": 5, "cat": "c0", "flag": True,
                 "ts": T0, "tags": ["red"]}])
        up.delete([before[0]])
        up.commit()
    assert r.refresh()
    after = [h.id for h in r.search("vitamin bone", 300, mode="bm25", filter=f)]
    assert "new1" in after and before[0] not in after
    assert set(after) == (set(before) - {before[0]}) | {"new1"}
    assert {key[1] for key in r._filter_cache} == {1, r.reader.generation} and r.reader.generation > 1
