"""LlamaIndexVectorStore: a VectorStoreIndex built on it, insert, delete by ref_doc_id, queries in
each mode with MetadataFilters, checked against the engine's own search (same ids and order)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

pytest.importorskip("llama_index.core")
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.types import (FilterCondition, FilterOperator, MetadataFilter, MetadataFilters,
                                                  VectorStoreQuery, VectorStoreQueryMode)

from integrations.rag_data import QUERIES, rag_corpus
from retriever import QueryError
from retriever.integrations._store import unit_rows
from retriever.integrations.llamaindex import LlamaIndexVectorStore, translate_filters

DIM = 16


def _vec(text: str) -> list[float]:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).normal(size=DIM).tolist()


class HashEmbedding(BaseEmbedding):
    """A deterministic offline embedding model (a seeded random vector per text)."""

    def _get_query_embedding(self, query: str) -> list[float]:
        return _vec(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return _vec(text)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return _vec(query)


EMBED = HashEmbedding(model_name="hash")


def _documents(n=40):
    recs = rag_corpus(n, seed=5)
    return [Document(text=r["text"], id_=f"src{r['_id']}", metadata={k: v for k, v in r.items() if k not in
                                                                       ("_id", "text", "title")}) for r in recs]


@pytest.fixture()
def index(tmp_path):
    store = LlamaIndexVectorStore(tmp_path / "ix")
    ctx = StorageContext.from_defaults(vector_store=store)
    # one node per document (chunks bigger than any text), so node and document counts agree
    from llama_index.core.node_parser import SentenceSplitter
    idx = VectorStoreIndex.from_documents(_documents(), storage_context=ctx, embed_model=EMBED,
                                          transformations=[SentenceSplitter(chunk_size=1024)])
    yield idx, store
    store.close()


def _engine(store, q, k, mode, flt=None, **kw):
    extra = {}
    if mode in ("dense", "hybrid"):
        extra["query_vectors"] = unit_rows(np.asarray(_vec(q)).reshape(1, -1), 1, normalize=True)
    return store.client.search(q, k, mode=mode, filter=flt, **kw, **extra)


FILTERS = MetadataFilters(filters=[MetadataFilter(key="lang", value=["en", "fr"], operator=FilterOperator.IN),
                                   MetadataFilter(key="year", value=2005, operator=FilterOperator.GTE)])
FILTER_DICT = {"$and": [{"lang": {"$in": ["en", "fr"]}}, {"year": {"$gte": 2005}}]}


@pytest.mark.parametrize("qmode,mode,k", [(VectorStoreQueryMode.DEFAULT, "dense", 5),
                                          (VectorStoreQueryMode.SPARSE, "bm25", 4),
                                          (VectorStoreQueryMode.HYBRID, "hybrid", 6)])
@pytest.mark.parametrize("filters", [None, FILTERS])
def test_query_modes_equal_the_engine(index, qmode, mode, k, filters):
    idx, store = index
    retr = idx.as_retriever(vector_store_query_mode=qmode, similarity_top_k=k, sparse_top_k=k, filters=filters)
    for q in QUERIES:
        want = _engine(store, q, k, mode, translate_filters(filters),
                       **({"depth": k} if mode == "hybrid" else {}))
        got = retr.retrieve(q)
        assert len(want) == k
        assert [n.node.node_id for n in got] == [h.id for h in want]
        assert [n.score for n in got] == [h.score for h in want]
        assert [n.node.text for n in got] == [h.text for h in want]
        if filters is not None:
            assert all(n.node.metadata["lang"] in ("en", "fr") and n.node.metadata["year"] >= 2005 for n in got)


def test_insert_and_delete_by_ref_doc_id(index):
    idx, store = index
    q = "zebra giraffe savanna"
    assert all(n.node.ref_doc_id != "new-doc" for n in idx.as_retriever(similarity_top_k=3).retrieve(q))
    idx.insert(Document(text="zebra giraffe savanna", id_="new-doc", metadata={"lang": "en", "year": 2024}))
    top = idx.as_retriever(vector_store_query_mode="sparse", similarity_top_k=1).retrieve(q)
    assert top[0].node.ref_doc_id == "new-doc" and top[0].node.metadata == {"lang": "en", "year": 2024}
    # LlamaIndex embeds a node's text with its metadata ("lang: en\nyear: 2024\n\nzebra ...")
    node_text = top[0].node.get_content(metadata_mode="embed")
    dense = idx.as_retriever(similarity_top_k=1).retrieve(node_text)
    assert dense[0].node.ref_doc_id == "new-doc" and dense[0].score == pytest.approx(1.0, abs=1e-6)
    n_before = len(store.client.live_ids())
    idx.delete_ref_doc("new-doc")
    assert len(store.client.live_ids()) == n_before - 1
    for qmode in ("default", "sparse", "hybrid"):
        got = idx.as_retriever(vector_store_query_mode=qmode, similarity_top_k=5).retrieve(q)
        assert all(n.node.ref_doc_id != "new-doc" for n in got)
    idx.delete_ref_doc("srcdoc3")
    assert "srcdoc3" not in {n.ref_doc_id for n in store.get_nodes()}
    assert len(store.get_nodes()) == n_before - 2



def test_nodes_without_a_source_document_delete_and_doc_ids_match_nothing(tmp_path):
    """While no stored node has a source document (no ``ref_doc_id`` field in the index),
    delete(ref_doc_id) is the documented no-op and a query restricted by doc_ids returns nothing
    (not an unknown-field error); once one has, both act on it."""
    store = LlamaIndexVectorStore(tmp_path / "kb")
    try:
        emb = unit_rows([_vec("apple")], 1, normalize=True)[0].tolist()
        store.add([TextNode(id_="n1", text="apple pear", embedding=emb), TextNode(id_="n2", text="apple", embedding=emb)])
        store.delete("doc-that-does-not-exist")
        assert sorted(store.client.live_ids()) == ["n1", "n2"]
        res = store.query(VectorStoreQuery(query_embedding=emb, similarity_top_k=2, doc_ids=["doc-x"]))
        assert res.ids == [] and res.nodes == []
        assert sorted(store.query(VectorStoreQuery(query_embedding=emb, similarity_top_k=2)).ids) == ["n1", "n2"]
        store.add([TextNode(id_="n3", text="apple", embedding=emb, relationships={
            NodeRelationship.SOURCE: RelatedNodeInfo(node_id="doc-y")})])
        assert store.query(VectorStoreQuery(query_embedding=emb, similarity_top_k=3, doc_ids=["doc-y"])).ids == ["n3"]
        store.delete("doc-y")
        assert sorted(store.client.live_ids()) == ["n1", "n2"]
    finally:
        store.close()

def test_translate_filters():
    f = MetadataFilters(filters=[MetadataFilter(key="a", value=1), MetadataFilters(
        filters=[MetadataFilter(key="b", value="x", operator=FilterOperator.NE),
                 MetadataFilter(key="c", value=None, operator=FilterOperator.IS_EMPTY)], condition=FilterCondition.OR)],
        condition=FilterCondition.AND)
    assert translate_filters(f) == {"$and": [{"a": {"$eq": 1}}, {"$or": [{"b": {"$ne": "x"}}, {"c": {"$exists": False}}]}]}
    assert translate_filters(MetadataFilters(filters=[MetadataFilter(key="a", value=1)], condition=FilterCondition.NOT)) \
        == {"$not": {"$and": [{"a": {"$eq": 1}}]}}
    with pytest.raises(QueryError, match="text_match"):
        translate_filters(MetadataFilters(filters=[MetadataFilter(key="a", value="x", operator="text_match")]))


def test_or_and_not_filters_against_the_engine(index):
    _, store = index
    f = MetadataFilters(filters=[MetadataFilter(key="source", value="s1"),
                                 MetadataFilter(key="year", value=2003, operator=FilterOperator.LT)],
                        condition=FilterCondition.OR)
    for filters, flt in [(f, {"$or": [{"source": "s1"}, {"year": {"$lt": 2003}}]}),
                         (MetadataFilters(filters=[MetadataFilter(key="lang", value="de")], condition="not"),
                          {"$not": {"lang": "de"}})]:
        q = VectorStoreQuery(query_str=QUERIES[0], query_embedding=_vec(QUERIES[0]), similarity_top_k=6,
                             filters=filters, mode="hybrid")
        res = store.query(q)
        want = _engine(store, QUERIES[0], 6, "hybrid", flt)
        assert res.ids == [h.id for h in want] and res.similarities == [h.score for h in want]


def test_top_k_honoured_and_no_silent_fallback(index):
    _, store = index
    q = QUERIES[1]
    base = dict(query_str=q, query_embedding=_vec(q))
    assert len(store.query(VectorStoreQuery(**base, similarity_top_k=3, sparse_top_k=7, mode="sparse")).ids) == 7
    assert len(store.query(VectorStoreQuery(**base, similarity_top_k=3, mode="sparse")).ids) == 3
    res = store.query(VectorStoreQuery(**base, similarity_top_k=3, sparse_top_k=8, hybrid_top_k=5, mode="hybrid"))
    assert res.ids == [h.id for h in _engine(store, q, 5, "hybrid", depth=8)]
    for bad in ("text_search", "mmr", "svm", "semantic_hybrid"):
        with pytest.raises(QueryError, match=f"{bad}' is not supported"):
            store.query(VectorStoreQuery(**base, similarity_top_k=3, mode=bad))
    with pytest.raises(QueryError, match="'sparse' leg, which this index does not have"):
        LlamaIndexVectorStore(store.store.path, sparse_leg="sparse").query(
            VectorStoreQuery(**base, similarity_top_k=3, mode="sparse"))
    with pytest.raises(QueryError, match="node_ids"):
        store.query(VectorStoreQuery(**base, node_ids=["doc1"]))
    # alpha: linear fusion, weight alpha on the dense leg
    from retriever import Linear
    res = store.query(VectorStoreQuery(**base, similarity_top_k=4, mode="hybrid", alpha=0.25))
    assert res.ids == [h.id for h in _engine(store, q, 4, "hybrid", fusion=Linear(weights={"dense": 0.25, "bm25": 0.75}))]


def test_nodes_without_embedding_rejected(tmp_path):
    store = LlamaIndexVectorStore(tmp_path / "ix")
    with pytest.raises(Exception, match="has no embedding"):
        store.add([TextNode(id_="a", text="x")])
    assert store.client is None


def test_doc_ids_restrict_the_query(index):
    _, store = index
    q = QUERIES[2]
    docs = ["srcdoc1", "srcdoc2", "srcdoc7", "srcdoc30"]
    res = store.query(VectorStoreQuery(query_str=q, query_embedding=_vec(q), similarity_top_k=3, doc_ids=docs,
                                       mode="hybrid"))
    want = _engine(store, q, 3, "hybrid", {"$and": [{"ref_doc_id": {"$in": docs}}]})
    assert res.ids == [h.id for h in want] and len(res.ids) == 3
    assert {n.ref_doc_id for n in res.nodes} <= set(docs)
