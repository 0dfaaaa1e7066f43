"""LangChainRetriever: LangChain's standard retriever suite, and documents, order and scores equal to
the engine's own search."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_core")
from langchain_tests.integration_tests import RetrieversIntegrationTests

from integrations.rag_data import QUERIES
from retriever import RRF, Linear, QueryError
from retriever.integrations.langchain import LangChainRetriever


class TestLangChainRetrieverStandard(RetrieversIntegrationTests):
    """The standard suite, subclassed as langchain-tests documents (no test skipped or overridden)."""

    @pytest.fixture(autouse=True)
    def _opened(self, rag_retriever) -> None:
        type(self).opened = rag_retriever

    @property
    def retriever_constructor(self) -> type[LangChainRetriever]:
        return LangChainRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"retriever": self.opened}

    @property
    def retriever_query_example(self) -> str:
        return "vitamin bone fracture risk"


def _expected(r, query, k, **kw):
    return r.search(query, k, **kw)


def _check_equal(docs, hits, mode):
    assert [d.id for d in docs] == [h.id for h in hits]
    for d, h in zip(docs, hits):
        block = d.metadata["retriever"]
        assert block["score"] == pytest.approx(h.score, rel=0, abs=0)
        assert block["rank"] == h.rank and block["mode"] == mode
        assert block["legs"] == {leg: {"score": lh.score, "rank": lh.rank} for leg, lh in h.legs.items()}
        assert d.page_content == h.text
        meta = {k: v for k, v in d.metadata.items() if k not in ("retriever", "title")}
        assert meta == dict(h.metadata)
        assert d.metadata.get("title", "") == h.title


@pytest.mark.parametrize("mode,fusion", [("hybrid", None), ("hybrid", "linear"), ("hybrid", "linear:zscore"),
                                         ("hybrid", RRF(k=10, weights={"bm25": 2.0, "dense": 0.5})),
                                         ("bm25", None), ("dense", None), ("sparse", None)])
@pytest.mark.parametrize("k", [1, 17])
def test_scores_and_ranks_equal_the_engine(rag_retriever, mode, fusion, k):
    lc = LangChainRetriever(retriever=rag_retriever, k=k, mode=mode, fusion=fusion)
    for q in QUERIES:
        hits = _expected(rag_retriever, q, k, mode=mode, fusion=fusion)
        assert len(hits) == k
        _check_equal(lc.invoke(q), hits, mode)


def test_per_leg_scores_present_in_hybrid(rag_retriever):
    docs = LangChainRetriever(retriever=rag_retriever, k=10).invoke(QUERIES[0])
    legs = set()
    for d in docs:
        legs |= set(d.metadata["retriever"]["legs"])
    assert legs == {"bm25", "dense", "sparse"}


def test_invoke_keyword_arguments_override_fields(rag_retriever):
    lc = LangChainRetriever(retriever=rag_retriever, k=3)
    q = QUERIES[1]
    _check_equal(lc.invoke(q, k=7, mode="bm25"), _expected(rag_retriever, q, 7, mode="bm25"), "bm25")
    fz = Linear(norm="zscore")
    _check_equal(lc.invoke(q, fusion=fz, depth=20), _expected(rag_retriever, q, 3, fusion=fz, depth=20), "hybrid")
    # the fields are unchanged by a call's overrides
    _check_equal(lc.invoke(q), _expected(rag_retriever, q, 3), "hybrid")


def _same(a, b, rel=0.0):
    """Documents equal, scores within ``rel`` (relative)."""
    assert [d.id for d in a] == [d.id for d in b]
    for x, y in zip(a, b):
        bx, by = x.metadata["retriever"], y.metadata["retriever"]
        assert x.page_content == y.page_content and bx["rank"] == by["rank"] and bx["mode"] == by["mode"]
        assert {k: v for k, v in x.metadata.items() if k != "retriever"} == \
            {k: v for k, v in y.metadata.items() if k != "retriever"}
        assert bx["score"] == pytest.approx(by["score"], rel=rel, abs=0)
        assert bx["legs"].keys() == by["legs"].keys()
        for leg in bx["legs"]:
            assert bx["legs"][leg]["rank"] == by["legs"][leg]["rank"]
            assert bx["legs"][leg]["score"] == pytest.approx(by["legs"][leg]["score"], rel=rel, abs=0)


def test_async_equals_sync(rag_retriever):
    lc = LangChainRetriever(retriever=rag_retriever, k=6, mode="hybrid", fusion="linear")

    async def run():
        return await asyncio.gather(*(lc.ainvoke(q) for q in QUERIES), lc.ainvoke(QUERIES[0], k=2, mode="bm25"))

    got = asyncio.run(run())
    # the worker thread's OpenMP thread count can differ from the caller's, and the SPLADE query
    # encoder's float32 sums depend on it (last digits of the sparse leg's scores): 1e-6 relative
    for q, docs in zip(QUERIES, got):
        _same(docs, lc.invoke(q), rel=1e-6)
    _check_equal(got[-1], _expected(rag_retriever, QUERIES[0], 2, mode="bm25"), "bm25")


def test_batch_equals_invoke(rag_retriever):
    lc = LangChainRetriever(retriever=rag_retriever, k=4)
    assert lc.batch(QUERIES) == [lc.invoke(q) for q in QUERIES]


def test_bad_options_are_clear_errors(rag_retriever):
    lc = LangChainRetriever(retriever=rag_retriever)
    with pytest.raises(QueryError, match="unknown search option 'top_k'"):
        lc.invoke("bone", top_k=3)
    with pytest.raises(QueryError, match="k must be an integer >= 1"):
        lc.invoke("bone", k=0)
    with pytest.raises(QueryError, match="unknown mode 'fuzzy'"):
        LangChainRetriever(retriever=rag_retriever, mode="fuzzy").invoke("bone")
    with pytest.raises(Exception, match="retriever must be a retriever.Retriever"):
        LangChainRetriever(retriever="an/index/path")


def test_metadata_key_collision_names_the_document(rag_retriever):
    lc = LangChainRetriever(retriever=rag_retriever, k=3, metadata_key="lang")
    with pytest.raises(QueryError, match=r"document 'doc\d+' has a metadata field 'lang'"):
        lc.invoke(QUERIES[0])
    docs = LangChainRetriever(retriever=rag_retriever, k=3, metadata_key="_scores").invoke(QUERIES[0])
    assert all("_scores" in d.metadata and "retriever" not in d.metadata for d in docs)


def test_from_path(rag_index):
    lc = LangChainRetriever.from_path(rag_index, k=2, mode="bm25")
    assert [d.id for d in lc.invoke(QUERIES[2])] == [h.id for h in lc.retriever.search(QUERIES[2], 2, mode="bm25")]


FILTERS = [{"lang": "en"}, {"year": {"$gte": 2015}, "lang": {"$in": ["de", "fr"]}},
           {"$or": [{"source": "s1"}, {"year": {"$lt": 2003}}]}, {"source": {"$exists": False}}]


@pytest.mark.parametrize("flt", FILTERS)
@pytest.mark.parametrize("mode", ["hybrid", "bm25", "dense", "sparse"])
def test_filter_equals_the_engine(rag_retriever, flt, mode):
    lc = LangChainRetriever(retriever=rag_retriever, k=8, mode=mode, filter=flt)
    for q in QUERIES[:2]:
        hits = rag_retriever.search(q, 8, mode=mode, filter=flt)
        assert len(hits) == 8
        docs = lc.invoke(q)
        _check_equal(docs, hits, mode)
        # the filter really applied: every document passes it
        assert all(_passes(d.metadata, flt) for d in docs)
        _check_equal(LangChainRetriever(retriever=rag_retriever, k=8, mode=mode).invoke(q, filter=flt), hits, mode)


def _passes(meta, flt):
    """A tiny oracle for the FILTERS above."""
    for key, cond in flt.items():
        if key == "$or":
            if not any(_passes(meta, c) for c in cond):
                return False
        elif not isinstance(cond, dict):
            if meta.get(key) != cond:
                return False
        else:
            for op, val in cond.items():
                v = meta.get(key)
                ok = {"$gte": lambda: v is not None and v >= val, "$lt": lambda: v is not None and v < val,
                      "$in": lambda: v in val, "$exists": lambda: (key in meta) == val}[op]()
                if not ok:
                    return False
    return True


def test_filter_that_matches_nothing_and_bad_filter(rag_retriever):
    lc = LangChainRetriever(retriever=rag_retriever, k=5)
    assert lc.invoke(QUERIES[0], filter={"lang": "xx"}) == []
    with pytest.raises(QueryError, match="nosuchfield"):
        lc.invoke(QUERIES[0], filter={"nosuchfield": 1})
