"""LangChainVectorStore: LangChain's standard vector-store suite (sync and async), and searches,
scores and relevance against the engine's own search."""

from __future__ import annotations

from collections.abc import Generator

import pytest

pytest.importorskip("langchain_core")
from langchain_core.vectorstores import VectorStore
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from retriever.integrations.langchain import LangChainVectorStore


class TestLangChainVectorStoreStandard(VectorStoreIntegrationTests):
    """The standard suite, subclassed as langchain-tests documents: a fixture yielding an empty
    store built on the suite's embedding model; sync and async both on, get_by_ids on."""

    @pytest.fixture()
    def vectorstore(self, tmp_path) -> Generator[VectorStore, None, None]:  # type: ignore[override]
        store = LangChainVectorStore(tmp_path / "index", self.get_embeddings())
        try:
            yield store
        finally:
            store.close()


import math

import numpy as np
from langchain_core.embeddings import DeterministicFakeEmbedding

from integrations.rag_data import QUERIES, rag_corpus
from retriever import BuildConfig, CorpusError, QueryError, Retriever, build_index
from retriever.index.config import DenseConfig
from retriever.index.errors import ConfigError
from retriever.integrations._store import unit_rows

EMB = DeterministicFakeEmbedding(size=16)


def _unit(v):
    """A (1, dim) unit vector, normalised as the store normalises (float32 rows)."""
    v = np.asarray(v, dtype=np.float32).reshape(1, -1)
    out = unit_rows(v, 1, normalize=True)
    assert np.allclose(out, v / np.linalg.norm(v), atol=1e-6)
    return out


def _docs(n=60):
    recs = rag_corpus(n, seed=11)
    return [r["text"] for r in recs], [{k: v for k, v in r.items() if k not in ("_id", "text")} for r in recs], \
        [r["_id"] for r in recs]


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    texts, metas, ids = _docs()
    store = LangChainVectorStore.from_texts(texts, EMB, metas, ids=ids, path=tmp_path_factory.mktemp("vs") / "ix")
    yield store
    store.close()


def _engine(store, q, k, **kw):
    kw = dict(kw)
    if kw.get("mode", "hybrid") in ("hybrid", "dense"):
        kw["query_vectors"] = _unit(EMB.embed_query(q))
    return store.retriever.search(q, k, **kw)


@pytest.mark.parametrize("kw", [{}, {"mode": "bm25"}, {"mode": "dense"}, {"fusion": "linear"},
                                {"fusion": "linear:zscore"}, {"filter": {"lang": "en"}},
                                {"mode": "dense", "filter": {"year": {"$gte": 2012}}}])
def test_search_equals_the_engine(filled, kw):
    for q in QUERIES:
        hits = _engine(filled, q, 7, **kw)
        got = filled.similarity_search_with_score(q, k=7, **kw)
        assert [d.id for d, _ in got] == [h.id for h in hits] and len(hits) == 7
        assert [s for _, s in got] == [h.score for h in hits]
        for (d, _), h in zip(got, hits):
            assert d.page_content == h.text
            assert d.metadata == {**h.metadata, **({"title": h.title} if h.title else {})}
        assert [d.id for d in filled.similarity_search(q, k=7, **kw)] == [h.id for h in hits]


def test_relevance_scores_map_each_mode_into_unit_interval(filled):
    q = QUERIES[0]
    # the engine's default fusion (no fusion=): the index's stored setting, else its DEFAULT_FUSION
    default_k = filled.retriever.search_arrays([q], 1, query_vectors=_unit(EMB.embed_query(q))).fusion["k"]
    for kw, fn in [({"mode": "dense"}, lambda h, legs: (1 + h.score) / 2),
                   ({"mode": "bm25"}, lambda h, legs: h.score / (1 + h.score)),
                   ({}, lambda h, legs: h.score / (len(legs) / (default_k + 1))),
                   ({"fusion": "rrf"}, lambda h, legs: h.score / (len(legs) / 61)),
                   ({"fusion": "linear"}, lambda h, legs: h.score / len(legs)),
                   ({"fusion": "linear:zscore"}, lambda h, legs: 1 / (1 + math.exp(-h.score)))]:
        hits = _engine(filled, q, 10, **kw)
        rel = filled.similarity_search_with_relevance_scores(q, k=10, **kw)
        assert [d.id for d, _ in rel] == [h.id for h in hits]
        values = [r for _, r in rel]
        assert all(0.0 <= r <= 1.0 for r in values)
        assert values == sorted(values, reverse=True)  # never inverted
        legs = filled.retriever.legs
        assert values == pytest.approx([min(max(fn(h, legs), 0), 1) for h in hits], rel=1e-9)
    # an exact match in every leg of RRF has relevance 1
    text = filled.get_by_ids(["doc5"])[0].page_content
    top = filled.similarity_search_with_relevance_scores(text, k=1, fusion="rrf")
    hit = _engine(filled, text, 1, fusion="rrf")[0]
    assert hit.id == "doc5" and hit.legs["dense"].rank == 1 and hit.legs["bm25"].rank == 1
    assert top[0][0].id == "doc5" and top[0][1] == pytest.approx(1.0, rel=1e-6)
    thr = filled.similarity_search_with_relevance_scores(q, k=10, mode="dense", score_threshold=0.6)
    assert all(r >= 0.6 for _, r in thr) and len(thr) == sum(r >= 0.6 for _, r in
                                                             filled.similarity_search_with_relevance_scores(
                                                                 q, k=10, mode="dense"))


def test_search_by_vector(filled):
    v = EMB.embed_query("any vector at all")
    hits = filled.retriever.search("", 5, mode="dense", query_vectors=_unit(v))
    assert [d.id for d in filled.similarity_search_by_vector(v, k=5)] == [h.id for h in hits]
    got = filled.similarity_search_with_score_by_vector(v, k=5, filter={"lang": "de"})
    want = filled.retriever.search("", 5, mode="dense", query_vectors=_unit(v), filter={"lang": "de"})
    assert [(d.id, s) for d, s in got] == [(h.id, h.score) for h in want]
    with pytest.raises(QueryError, match="dense leg alone"):
        filled.similarity_search_by_vector(v, k=5, mode="bm25")


def test_unknown_search_keyword(filled):
    with pytest.raises(QueryError, match="unknown search option 'top_k'"):
        filled.similarity_search("bone", top_k=3)


def test_as_retriever(filled):
    r = filled.as_retriever(search_kwargs={"k": 3, "filter": {"lang": "fr"}})
    assert r.invoke(QUERIES[1]) == filled.similarity_search(QUERIES[1], k=3, filter={"lang": "fr"})
    thr = filled.as_retriever(search_type="similarity_score_threshold",
                              search_kwargs={"k": 8, "score_threshold": 0.5, "mode": "dense"})
    want = [d for d, r in filled.similarity_search_with_relevance_scores(QUERIES[1], k=8, mode="dense") if r >= 0.5]
    assert thr.invoke(QUERIES[1]) == want


def test_generated_ids_get_and_scores_key(tmp_path):
    store = LangChainVectorStore(tmp_path / "ix", EMB, scores_key="retriever")
    ids = store.add_texts(["alpha beta", "gamma delta", "beta gamma"], [{"n": 1}, {"n": 2}, {"title": "T"}])
    assert len(set(ids)) == 3 and all(len(i) == 32 for i in ids)
    more = store.add_texts(["epsilon"], ids=["mine"])
    assert more == ["mine"]
    docs = store.get_by_ids([ids[2], "mine", "nope", ids[0]])
    assert [(d.id, d.page_content, d.metadata) for d in docs] == [
        (ids[2], "beta gamma", {"title": "T"}), ("mine", "epsilon", {}), (ids[0], "alpha beta", {"n": 1})]
    hit = store.similarity_search("beta", k=1, mode="bm25")[0]
    assert hit.metadata["retriever"]["mode"] == "bm25" and set(hit.metadata["retriever"]["legs"]) == {"bm25"}
    store.close()


def test_store_after_churn_equals_a_fresh_build(tmp_path):
    texts, metas, ids = _docs(40)
    store = LangChainVectorStore.from_texts(texts[:30], EMB, metas[:30], ids=ids[:30], path=tmp_path / "ix")
    store.add_texts(texts[30:], metas[30:], ids=ids[30:])
    store.add_texts(["replaced text bone vitamin"] * 3, [{"lang": "en", "year": 1999}] * 3,
                    ids=["doc3", "doc17", "doc33"])
    store.delete(["doc0", "doc21", "doc38", "not-there"])
    assert store.last_delete.unknown == ["not-there"]
    assert sorted(store.retriever.live_ids()) == sorted(set(ids) - {"doc0", "doc21", "doc38"})
    # the oracle: a fresh build of the live documents in the store's order
    live = store.retriever.get(store.retriever.live_ids())
    recs = [{"_id": d["id"], "title": d["title"], "text": d["text"], **d["metadata"]} for d in live]
    vecs = np.vstack([_unit(EMB.embed_documents([d["text"]])[0]) for d in live])
    cfg = BuildConfig(legs=("bm25", "dense"), dense=DenseConfig(dtype="float32"))
    build_index(recs, tmp_path / "fresh", cfg, dense_vectors=vecs, show_progress=False)
    with Retriever.open(tmp_path / "fresh") as fresh:
        for q in QUERIES + ["replaced text"]:
            for kw in ({}, {"mode": "bm25"}, {"mode": "dense"}):
                got = store.similarity_search_with_score(q, k=10, **kw)
                qv = {"query_vectors": _unit(EMB.embed_query(q))} if kw.get("mode") != "bm25" else {}
                want = fresh.search(q, 10, **kw, **qv)
                assert [d.id for d, _ in got] == [h.id for h in want]
                assert [s for _, s in got] == pytest.approx([h.score for h in want], rel=1e-6, abs=1e-7)
    store.delete()  # None: every document
    assert store.similarity_search("bone", k=3) == [] and store.retriever.live_ids() == []
    store.close()


def test_reopen_and_mismatched_embedding(tmp_path):
    with LangChainVectorStore(tmp_path / "ix", EMB) as store:
        store.add_texts(["one fish", "two fish"], ids=["a", "b"])
    with LangChainVectorStore(tmp_path / "ix", EMB) as again:
        assert [d.id for d in again.get_by_ids(["b", "a"])] == ["b", "a"]
        again.add_texts(["red fish"], ids=["c"])
        assert again.similarity_search("red fish", k=1)[0].id == "c"
    with pytest.raises(ConfigError, match="precomputed"):
        LangChainVectorStore(tmp_path / "ix")


def test_bad_documents(tmp_path):
    with LangChainVectorStore(tmp_path / "ix", EMB) as store:
        with pytest.raises(CorpusError, match="metadata key 'text' is reserved"):
            store.add_texts(["x"], [{"text": "y"}])
        with pytest.raises(CorpusError, match="'title' must be a string"):
            store.add_texts(["x"], [{"title": 3}])
        with pytest.raises(CorpusError, match="duplicate document id 'same'"):
            store.add_texts(["x", "y"], ids=["same", "same"])
        assert store.retriever is None  # nothing was written
        store.add_texts(["x"], [{"year": 2020}], ids=["a"])
        with pytest.raises(CorpusError, match="document id 'b' appears twice in this batch: positions 0 and 1"):
            store.add_texts(["x", "y"], ids=["b", "b"])
        with pytest.raises(CorpusError, match="year"):
            store.add_texts(["y"], [{"year": "2021"}], ids=["b"])
        assert [d.id for d in store.similarity_search("y", k=5)] == ["a"]


def test_own_models(tmp_path):
    """No embedding model: the index's own (bundled) models encode documents and queries."""
    texts, metas, ids = _docs(25)
    with LangChainVectorStore.from_texts(texts, None, metas, ids=ids, path=tmp_path / "own") as store:
        assert store.retriever.legs == ("bm25", "dense")
        store.add_texts(["a new vitamin bone fracture text"], ids=["new"])
        for kw in ({}, {"mode": "dense"}):
            hits = store.retriever.search(QUERIES[0], 5, **kw)
            got = store.similarity_search_with_score(QUERIES[0], k=5, **kw)
            assert [(d.id, s) for d, s in got] == [(h.id, h.score) for h in hits]
        with pytest.raises(QueryError, match="own model"):
            store.similarity_search_by_vector([0.1] * 384)
