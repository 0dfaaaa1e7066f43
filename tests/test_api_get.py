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


def test_get_missing_skip_is_the_default(bm25_index):
    """Unknown ids are left out by default (Qdrant / Chroma / LangChain get_by_ids behaviour), and
    the same with missing="skip" spelled out."""
    with Retriever.open(bm25_index) as r:
        want = ["d3", "nope", "d1"]
        assert [g["id"] for g in r.get(want)] == ["d3", "d1"]
        assert r.get(want, missing="skip") == r.get(want)


def test_get_missing_none_keeps_positions(bm25_index):
    with Retriever.open(bm25_index) as r:
        got = r.get(["nope", "d5", "gone", "d2", "d5"], missing="none")
        assert got[0] is None and got[2] is None and len(got) == 5
        assert [g["id"] for g in (got[1], got[3], got[4])] == ["d5", "d2", "d5"]
        assert got[1] == r.get(["d5"])[0]
        assert r.get(["x", "y"], missing="none") == [None, None]
        assert r.get(["d0"], missing="none") == r.get(["d0"])


def test_get_missing_error_names_the_missing_ids_and_their_count(bm25_index):
    with Retriever.open(bm25_index) as r:
        assert r.get(["d0", "d9"], missing="error") == r.get(["d0", "d9"])  # all found: no error
        with pytest.raises(QueryError, match=r"^1 of the 2 ids name no live document of generation \d+: 'zz'$"):
            r.get(["d0", "zz"], missing="error")
        gone = [f"x{i}" for i in range(8)]
        with pytest.raises(QueryError) as e:
            r.get(["d1", *gone], missing="error")
        msg = str(e.value)
        assert msg.startswith("8 of the 9 ids") and msg.endswith("'x0', 'x1', 'x2', 'x3', 'x4' and 3 more")
        assert "'x5'" not in msg


def test_get_missing_option_is_checked(bm25_index):
    with Retriever.open(bm25_index) as r:
        with pytest.raises(QueryError, match="missing must be one of 'skip', 'none', 'error', got 'raise'"):
            r.get(["d0"], missing="raise")


def test_get_deleted_id_is_missing(tmp_path, small_corpus):
    """A deleted document is missing for get() in every mode, as an id never indexed is."""
    from retriever import BuildConfig, IndexUpdater, build_index

    path = tmp_path / "idx"
    build_index(small_corpus[:20], path, BuildConfig(legs=("bm25",)), show_progress=False)
    with IndexUpdater.open(path) as u:
        u.delete(["d4"])
        u.commit()
    with Retriever.open(path) as r:
        assert [g["id"] for g in r.get(["d3", "d4", "d5"])] == ["d3", "d5"]
        assert [None if g is None else g["id"] for g in r.get(["d3", "d4"], missing="none")] == ["d3", None]
        with pytest.raises(QueryError, match="'d4'"):
            r.get(["d4"], missing="error")
