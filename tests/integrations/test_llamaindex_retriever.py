"""LlamaIndexRetriever: nodes, order and scores equal to the engine's own search."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("llama_index.core")
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from integrations.rag_data import QUERIES
from retriever import RRF, QueryError
from retriever.integrations.llamaindex import LlamaIndexRetriever


def _check_equal(nodes, hits, mode):
    assert [n.node.node_id for n in nodes] == [h.id for h in hits]
    for n, h in zip(nodes, hits):
        assert isinstance(n, NodeWithScore) and isinstance(n.node, TextNode)
        assert n.score == h.score
        block = n.node.metadata["retriever"]
        assert block == {"score": h.score, "rank": h.rank, "mode": mode,
                         "legs": {leg: {"score": lh.score, "rank": lh.rank} for leg, lh in h.legs.items()}}
        assert n.node.text == h.text
        assert {k: v for k, v in n.node.metadata.items() if k not in ("retriever", "title")} == dict(h.metadata)
        assert n.node.metadata.get("title", "") == h.title


@pytest.mark.parametrize("mode,fusion", [("hybrid", None), ("hybrid", "linear:zscore"),
                                         ("hybrid", RRF(k=5, weights={"sparse": 3.0})),
                                         ("bm25", None), ("dense", None), ("sparse", None)])
@pytest.mark.parametrize("k", [2, 13])
def test_nodes_equal_the_engine(rag_retriever, mode, fusion, k):
    li = LlamaIndexRetriever(rag_retriever, similarity_top_k=k, mode=mode, fusion=fusion)
    for q in QUERIES[:3]:
        hits = rag_retriever.search(q, k, mode=mode, fusion=fusion)
        assert len(hits) == k
        _check_equal(li.retrieve(q), hits, mode)
        _check_equal(li.retrieve(QueryBundle(query_str=q)), hits, mode)


def test_default_top_k_and_per_leg_scores(rag_retriever):
    nodes = LlamaIndexRetriever(rag_retriever).retrieve(QUERIES[0])
    assert len(nodes) == 2
    wide = LlamaIndexRetriever(rag_retriever, similarity_top_k=10).retrieve(QUERIES[0])
    assert set().union(*(n.node.metadata["retriever"]["legs"] for n in wide)) == {"bm25", "dense", "sparse"}


def test_scores_block_is_hidden_from_llm_and_embedding_text(rag_retriever):
    node = LlamaIndexRetriever(rag_retriever, similarity_top_k=1).retrieve(QUERIES[1])[0].node
    for mode in (MetadataMode.LLM, MetadataMode.EMBED):
        text = node.get_content(metadata_mode=mode)
        assert "rank" not in text and "lang: " in text and node.text in text
    assert "rank" in node.get_content(metadata_mode=MetadataMode.ALL)


def test_async_retrieve(rag_retriever):
    li = LlamaIndexRetriever(rag_retriever, similarity_top_k=5, mode="bm25")

    async def run():
        return await asyncio.gather(*(li.aretrieve(q) for q in QUERIES))

    for q, nodes in zip(QUERIES, asyncio.run(run())):
        _check_equal(nodes, rag_retriever.search(q, 5, mode="bm25"), "bm25")


def test_bad_arguments(rag_retriever, rag_index):
    with pytest.raises(QueryError, match="retriever must be a retriever.Retriever"):
        LlamaIndexRetriever(str(rag_index))
    with pytest.raises(QueryError, match="k must be an integer >= 1"):
        LlamaIndexRetriever(rag_retriever, similarity_top_k=0).retrieve("bone")
    li = LlamaIndexRetriever.from_path(rag_index, similarity_top_k=3, mode="sparse")
    assert [n.node.node_id for n in li.retrieve(QUERIES[2])] == [
        h.id for h in rag_retriever.search(QUERIES[2], 3, mode="sparse")]


@pytest.mark.parametrize("mode", ["hybrid", "bm25", "dense", "sparse"])
def test_filter_equals_the_engine(rag_retriever, mode):
    flt = {"year": {"$gte": 2010}, "lang": {"$in": ["en", "fr"]}}
    li = LlamaIndexRetriever(rag_retriever, similarity_top_k=6, mode=mode, filter=flt)
    for q in QUERIES[:2]:
        hits = rag_retriever.search(q, 6, mode=mode, filter=flt)
        assert len(hits) == 6
        nodes = li.retrieve(q)
        _check_equal(nodes, hits, mode)
        assert all(n.node.metadata["year"] >= 2010 and n.node.metadata["lang"] != "de" for n in nodes)
