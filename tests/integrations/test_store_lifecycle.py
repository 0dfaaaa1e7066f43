"""The framework stores' life cycle and inputs (found by an adversarial review): who holds the
index's lock, a store made before another created the index, a closed store, delete with one
string, metadata that is not a dict of string keys, an empty store's checks."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_core")
from langchain_core.embeddings import DeterministicFakeEmbedding  # noqa: E402

from retriever import BuildConfig  # noqa: E402
from retriever.index.errors import ConfigError, CorpusError, IndexLockedError, QueryError  # noqa: E402
from retriever.integrations.langchain import LangChainVectorStore  # noqa: E402

BM25 = BuildConfig(legs=("bm25",))


def _store(path):
    return LangChainVectorStore(path, None, config=BM25)


def test_delete_with_one_string_is_refused_not_taken_per_character(tmp_path):
    """delete("doc") deleted the documents "d", "o" and "c" and kept "doc"."""
    with _store(tmp_path / "kb") as s:
        s.add_texts(["x one", "y two", "z three", "whole"], ids=["d", "o", "c", "doc"])
        with pytest.raises(ConfigError, match=r"a list of ids, not one string: delete\(\['doc'\]\)"):
            s.delete("doc")
        assert sorted(s.store.live_ids()) == ["c", "d", "doc", "o"]
        s.delete(["doc"])
        assert sorted(s.store.live_ids()) == ["c", "d", "o"]


def test_the_store_that_creates_the_index_holds_its_lock(tmp_path):
    """The first write creates the index and the store holds LOCK from then on (as after any
    write): a second store's write is refused, naming the holder, until the first is closed."""
    emb = DeterministicFakeEmbedding(size=8)
    a = LangChainVectorStore(tmp_path / "kb", emb)
    a.add_texts(["one two"], ids=["a1"])
    b = LangChainVectorStore(tmp_path / "kb", emb)
    try:
        with pytest.raises(IndexLockedError, match="another writer holds the index"):
            b.add_texts(["three"], ids=["b1"])
        a.add_texts(["four"], ids=["a2"])
        a.close()
        b.add_texts(["three"], ids=["b1"])
        assert sorted(b.store.live_ids()) == ["a1", "a2", "b1"]
    finally:
        b.close()
        a.close()


def test_a_store_made_before_the_index_existed_opens_it_later(tmp_path):
    """A store made while the path held nothing opens the index another store created since
    (its write used to try to build it again: IndexExistsError 'pass overwrite=True')."""
    a, b = _store(tmp_path / "kb"), _store(tmp_path / "kb")
    try:
        a.add_texts(["one"], ids=["a1"])
        a.close()
        assert b.store.live_ids() == ["a1"]
        b.add_texts(["two"], ids=["b1"])
        assert sorted(b.store.live_ids()) == ["a1", "b1"]
    finally:
        b.close()


def test_a_closed_store_says_so(tmp_path):
    """After close(), searches and writes are errors naming the store as closed (a search used to
    return [] as if it were empty)."""
    s = _store(tmp_path / "kb")
    s.add_texts(["alpha beta"], ids=["a"])
    s.close()
    for call in (lambda: s.similarity_search("alpha"), lambda: s.add_texts(["gamma"], ids=["g"]),
                 lambda: s.delete(["a"]), lambda: s.get_by_ids(["a"])):
        with pytest.raises(ConfigError, match="is closed"):
            call()


@pytest.mark.parametrize("meta,msg", [({1: "v"}, "metadata keys are strings, got 1"),
                                      ({None: "v"}, "metadata keys are strings, got None"),
                                      ({("a",): "v"}, r"metadata keys are strings, got \('a',\)"),
                                      ("not-a-dict", "metadata must be a dict, got str")])
def test_metadata_must_be_a_dict_of_string_keys(tmp_path, meta, msg):
    """A non-string key was stored under its JSON text ('1', 'null') or failed in the JSON
    encoder; a non-dict failed with AttributeError: now a CorpusError naming the document."""
    with _store(tmp_path / "kb") as s:
        s.add_texts(["alpha"], ids=["a"])
        with pytest.raises(CorpusError, match=f"document 'b': {msg}"):
            s.add_texts(["beta"], [meta], ids=["b"])
        assert s.store.live_ids() == ["a"]


def test_an_empty_store_checks_k(tmp_path):
    """Before the first add a search has no hits, but a bad k is the same QueryError as later."""
    with _store(tmp_path / "kb") as s:
        with pytest.raises(QueryError, match="k must be an integer >= 1, got 0"):
            s.similarity_search("alpha", k=0)
        assert s.similarity_search("alpha", k=3) == []
