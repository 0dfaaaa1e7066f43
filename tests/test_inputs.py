"""Input matrix through the library and the CLI: accents, Cyrillic, CJK, emoji, combining marks,
right-to-left text, control characters, a 1 MB document, a 10,000-term query, and NaN/inf or
wrong-dimension query vectors. Each gives a correct result or a clear error; none crashes or
corrupts the index. (No learned-sparse leg exists on this branch, so unsorted/duplicate sparse
indices are not tested here.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from retriever.index.errors import QueryError
from retriever import Retriever, build_index
from retriever.cli import main
from test_integrity import build_fake_dense

DOCS = [
    {"_id": "accents", "title": "Crème brûlée", "text": "naïve café façade résumé Ångström"},
    {"_id": "cyrillic", "text": "Привет мир, быстрая коричневая лиса"},
    {"_id": "cjk", "text": "東京大学の研究 北京 서울 대학교"},
    {"_id": "emoji", "text": "rocket launch 🚀🔥 party 🎉 family 👨‍👩‍👧"},
    {"_id": "combining", "text": "decomposed cafe\u0301 and n\u0303o\u0308"},
    {"_id": "rtl", "text": "مرحبا بالعالم שלום עולם \u202eevil\u202c override"},
    {"_id": "control", "text": "bell\x07 back\x08space\x1b[31mred\x1b[0m tab\tform\x0cfeed zero\u200bwidth"},
    {"_id": "plain", "text": "vitamin bone fracture risk"},
]
BIG = " ".join(f"w{i % 5000} filler" for i in range(1_000_000 // 12))  # ~1 MB
DOCS.append({"_id": "big", "text": BIG + " needleword"})

MATRIX = [
    ("café", "accents"), ("CAFÉ", "accents"), ("Ångström", "accents"), ("brûlée", "accents"),
    ("привет", "cyrillic"), ("ЛИСА", "cyrillic"),
    ("東京", "cjk"), ("北京", "cjk"), ("대학교", "cjk"),
    ("rocket 🚀", "emoji"), ("party", "emoji"),
    ("cafe\u0301", "combining"),
    ("שלום", "rtl"), ("مرحبا", "rtl"),
    ("bell\x07", "control"), ("space", "control"), ("\x1b[31mred", "control"),
    ("needleword", "big"),
]


@pytest.fixture(scope="module")
def idx(tmp_path_factory):
    out = tmp_path_factory.mktemp("inputs") / "idx"
    build_index(DOCS, out, legs=("bm25",), show_progress=False)
    return out


@pytest.mark.parametrize("query,expect", MATRIX, ids=[m[1] + ":" + ascii(m[0])[1:-1] for m in MATRIX])
def test_unicode_matrix_library_and_cli(idx, capsys, query, expect):
    r = Retriever.open(idx)
    hits = r.search(query, k=3)
    assert hits and hits[0].id == expect, [(h.id, h.score) for h in hits]
    assert main(["search", str(idx), query, "-k", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hits"][0]["id"] == expect


def test_stored_text_round_trips(idx):
    r = Retriever.open(idx)
    by_id = {d["_id"]: d for d in DOCS}
    for h in r.search_batch([q for q, _ in MATRIX], k=1):
        assert h[0].text == by_id[h[0].id]["text"]


def test_unicode_through_cli_build(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in DOCS[:-1]), encoding="utf-8")
    out = tmp_path / "i"
    assert main(["index", "build", "--corpus", str(corpus), "--out", str(out), "--legs", "bm25", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["search", str(out), "привет", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == "cyrillic"
    assert main(["search", str(out), "東京"]) == 0  # plain text output of non-ASCII does not fail
    assert "cjk" in capsys.readouterr().out
    assert main(["index", "verify", str(out)]) == 0


def test_huge_query(idx):
    r = Retriever.open(idx)
    words = [f"w{i}" for i in range(10_000)]
    hits = r.search(" ".join(words), k=5)
    assert hits and hits[0].id == "big"
    res = r.search_arrays([" ".join(words), "café"] * 3, k=5)
    assert (res.n_found[::2] == 1).all() and (res.n_found[1::2] >= 1).all()  # only "big" has w*
    assert (res.ids[::2] == res.ids[0]).all()  # batched copies of one query agree
    assert Retriever.open(idx, verify=True)  # nothing was modified


def test_huge_query_cli(idx, capsys):
    q = " ".join(f"w{i}" for i in range(10_000))
    assert main(["search", str(idx), q, "-k", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == "big"


@pytest.fixture(scope="module")
def dense_idx(tmp_path_factory):
    out = tmp_path_factory.mktemp("inputs") / "dense"
    build_fake_dense(DOCS[:-1], out)
    return out


@pytest.mark.parametrize("bad,msg", [
    (np.full((1, 16), np.nan, np.float32), "NaN or inf"),
    (np.full((1, 16), np.inf, np.float32), "NaN or inf"),
    (np.concatenate([np.ones((1, 15)), [[-np.inf]]], axis=1), "NaN or inf"),
    (np.ones((1, 15), np.float32), r"shape \(nq, 16\)"),
    (np.ones((1, 17), np.float32), r"shape \(nq, 16\)"),
    (np.ones((1, 2, 16), np.float32), r"shape \(nq, 16\)"),
    (np.ones((2, 16), np.float32), "2 rows for 1 queries"),
    (np.ones((1, 0), np.float32), r"shape \(nq, 16\)"),
])
def test_bad_query_vectors(dense_idx, bad, msg):
    r = Retriever.open(dense_idx)
    with pytest.raises(QueryError, match=msg):
        r.search_arrays(["café"], k=3, mode="dense", query_vectors=bad)
    with pytest.raises(QueryError, match=msg):
        r.search_arrays(["café"], k=3, mode="hybrid", query_vectors=bad)


def test_good_query_vectors_any_float_dtype(dense_idx):
    r = Retriever.open(dense_idx)
    v = np.random.default_rng(1).standard_normal((1, 16))
    a = r.search_arrays(["café"], k=3, mode="dense", query_vectors=v.astype(np.float64))
    b = r.search_arrays(["café"], k=3, mode="dense", query_vectors=v.astype(np.float32))
    assert a.ids.tolist() == b.ids.tolist() and a.n_found[0] == 3
    h = r.search("café", k=3, mode="hybrid", query_vectors=v[0])
    assert h and "accents" in [x.id for x in h]
    assert Retriever.open(dense_idx, verify=True)


def test_concurrent_legs_same_results(dense_idx, monkeypatch):
    """Hybrid legs run side by side (n_threads > 1) give exactly the sequential results."""
    import retriever.engine as engine

    r = Retriever.open(dense_idx)
    qs = ["café", "accents", "", "naïve résumé café"] * 3
    v = np.random.default_rng(2).standard_normal((len(qs), 16)).astype(np.float32)
    got = {}
    for concurrent in (False, True):
        got[concurrent] = r.search_arrays(qs, k=5, mode="hybrid", query_vectors=v, n_threads=2,
                                          concurrent_legs=concurrent)
    a, b = got[False], got[True]
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.scores, b.scores)
    assert np.array_equal(a.n_found, b.n_found) and a.n_found.max() > 0
    assert list(b.legs) == list(a.legs) == r.engine.legs_for("hybrid")
    for name in a.legs:
        assert np.array_equal(a.legs[name].scores, b.legs[name].scores, equal_nan=True)
        assert np.array_equal(a.legs[name].ranks, b.legs[name].ranks)


def test_non_finite_precomputed_document_vectors_name_the_document(tmp_path):
    """NaN / inf in given dense_vectors (a build and an add): a ConfigError that says the vectors
    were given (no encoder ran) and names the first bad row's document; nothing is written."""
    from retriever import ConfigError, IndexUpdater, Retriever, build_index

    docs = [{"_id": f"d{i}", "text": f"apple {i}"} for i in range(5)]
    vecs = np.ones((5, 8), np.float32)
    vecs[3, 2] = np.nan
    vecs[4, 0] = np.inf
    with pytest.raises(ConfigError, match=r"^dense_vectors has NaN or inf in the vector of document 'd3' "
                                          r"\(and 1 more in its batch\)$"):
        build_index(docs, tmp_path / "a", legs=("bm25", "dense"), dense_vectors=vecs, show_progress=False)
    assert not (tmp_path / "a").exists()
    build_index(docs[:3], tmp_path / "a", legs=("bm25", "dense"), dense_vectors=vecs[:3], show_progress=False)
    with IndexUpdater.open(tmp_path / "a") as u:
        with pytest.raises(ConfigError, match=r"document 'd4'$"):
            u.add(docs[4:], dense_vectors=vecs[4:])
        assert not u.pending
    assert Retriever.open(tmp_path / "a").reader.generation == 1
