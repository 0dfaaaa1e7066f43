"""Retriever.get / live_ids: stored documents by id."""

from __future__ import annotations

import pytest

from retriever import QueryError, Retriever


def test_get_returns_stored_documents_in_the_order_asked(bm25_index, small_corpus):
    by_id = {d["_id"]: d for d in small_corpus}
    with Retriever.open(bm25_index) as r:
        got = r.get(["d7", "d0", "no-such-id", "d299", "d7"])
        assert [g["id"] for g in got] == ["d7", "d0", "d299", "d7"]
        for g in got:
            rec = by_id[g["id"]]
            assert (g["title"], g["text"], g["metadata"]) == (rec["title"], rec["text"], {"meta": rec["meta"]})
        assert r.get([]) == [] and r.get(["nope"]) == []
        assert r.live_ids() == [d["_id"] for d in small_corpus]


def test_get_bad_ids(bm25_index):
    with Retriever.open(bm25_index) as r:
        with pytest.raises(QueryError, match="not one string"):
            r.get("d1")
        with pytest.raises(QueryError, match="got 3"):
            r.get(["d1", 3])
