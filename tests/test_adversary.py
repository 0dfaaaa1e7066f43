"""Regressions found by adversarial input testing (each test failed before its fix): concurrent
model loads, unbounded depth, unchecked leg_params / fusion weight names, lone surrogates, byte
order marks, non-iterable inputs, and CLI errors that used to end in a traceback."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import cli_error as _cli_error, random_corpus
from retriever.index.config import BuildConfig
from retriever.index.errors import CorpusError, IndexFormatError, QueryError
from retriever.index.readers import read_corpus, read_qrels, read_queries
from retriever import RRF, Linear, Retriever, build_index
from retriever.cli import main


# ----------------------------------------------------------------------------- model loading
def test_concurrent_encoder_loads_are_serialised(monkeypatch):
    """A hybrid query's legs run side by side and load their query encoders on first use.
    transformers' ``from_pretrained`` temporarily replaces process-wide init functions with
    no-ops; two loads at once left them disabled for good ("Cannot copy out of meta tensor" on
    every later SPLADE load, and torch.nn.init.* silently broken for the whole process)."""
    import torch
    import transformers

    from retriever.index.encoders.dense import DenseEncoder
    from retriever.index.encoders.sparse import SparseEncoder

    state = {"active": 0, "max": 0}
    guard = threading.Lock()

    def tracked(orig):
        def load(*args, **kwargs):
            with guard:
                state["active"] += 1
                state["max"] = max(state["max"], state["active"])
            try:
                time.sleep(0.3)  # widen the window a parallel load would fall into
                return orig(*args, **kwargs)
            finally:
                with guard:
                    state["active"] -= 1
        return load

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", tracked(transformers.AutoModel.from_pretrained))
    monkeypatch.setattr(transformers.AutoModelForMaskedLM, "from_pretrained",
                        tracked(transformers.AutoModelForMaskedLM.from_pretrained))
    normal_before = torch.nn.init.normal_
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(make):
        try:
            barrier.wait()
            make()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(f,)) for f in (DenseEncoder, SparseEncoder)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert state["max"] == 1, "two checkpoints were loaded at the same time"
    assert torch.nn.init.normal_ is normal_before


# ----------------------------------------------------------------------------- search arguments
@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Retriever:
    out = tmp_path_factory.mktemp("adv") / "bm25"
    build_index(random_corpus(200, seed=7), out, legs=("bm25",), show_progress=False)
    return Retriever.open(out)


def test_huge_depth_is_clamped_to_the_corpus(tmp_path):
    # hybrid depth=10**9 used to allocate (nq, depth) per-leg arrays until the process was killed
    rng = np.random.default_rng(3)
    dv = rng.standard_normal((200, 8)).astype(np.float32)
    dv /= np.linalg.norm(dv, axis=1, keepdims=True)
    build_index(random_corpus(200, seed=7), tmp_path / "h", legs=("bm25", "dense"), dense_vectors=dv,
                show_progress=False)
    r = Retriever.open(tmp_path / "h")
    qv = rng.standard_normal((2, 8)).astype(np.float32)
    a = r.search_arrays(["vitamin bone", "heart"], k=5, depth=10**12, query_vectors=qv)
    b = r.search_arrays(["vitamin bone", "heart"], k=5, depth=200, query_vectors=qv)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.scores, b.scores)


@pytest.mark.parametrize("queries", [None, 5, b"vitamin", {"q1": "vitamin"}])
def test_non_list_queries(small, queries):
    with pytest.raises(QueryError, match="queries must be a list of strings"):
        small.search_batch(queries)


@pytest.mark.parametrize("n_threads", [True, 0, -1, 2.0])
def test_bad_n_threads(small, n_threads):
    with pytest.raises(QueryError, match="n_threads"):
        small.search("vitamin", n_threads=n_threads)


@pytest.mark.parametrize("leg_params, msg", [
    ({"bm25": {"nope": 1}}, r"unknown bm25 leg_params \['nope'\]"),
    ({"bmm25": {}}, r"unknown leg 'bmm25'"),
    ({"bm25": 5}, r"leg_params\['bm25'\] must be a dict"),
    ([1], r"leg_params must be a dict"),
])
def test_bad_leg_params(small, leg_params, msg):
    with pytest.raises(QueryError, match=msg):
        small.search("vitamin", mode="bm25", leg_params=leg_params)


def test_good_leg_params_still_accepted(small):
    a = small.search("vitamin bone", mode="bm25", leg_params={"bm25": {"algorithm": "maxscore", "k1": 1.2}})
    b = small.search("vitamin bone", mode="bm25", leg_params={"bm25": {"algorithm": "exhaustive", "k1": 1.2}})
    assert [h.id for h in a] == [h.id for h in b] and a


def test_fusion_weight_for_unknown_leg(small, capsys):
    with pytest.raises(QueryError, match="unknown leg 'dnse'"):
        small.search("vitamin", fusion=RRF(weights={"dnse": 2.0}))
    err = _cli_error(capsys, ["search", str(small.reader.path), "vitamin", "--weights", "dnse=2"])
    assert "dnse" in err


@pytest.mark.parametrize("kwargs, what", [
    ({"fusion": RRF(weights={"dense": 2.0})}, "fusion weights"),
    ({"fusion": RRF(leg_k={"sparse": 20})}, "fusion leg_k"),
    ({"fusion": Linear("minmax", depths={"dense": 50})}, "fusion depths"),
    ({"leg_params": {"sparse": {"algorithm": "seismic"}}}, "leg_params"),
])
def test_settings_for_a_leg_the_index_lacks(small, kwargs, what):
    # a BM25-only index: a setting for a real leg it does not hold is an error, not silently ignored
    with pytest.raises(QueryError) as e:
        small.search("vitamin", **kwargs)
    assert what in str(e.value) and "no '" in str(e.value) and "its legs: bm25" in str(e.value)


def test_setting_for_a_missing_leg_through_cli(small, capsys):
    err = _cli_error(capsys, ["search", str(small.reader.path), "vitamin", "--weights", "dense=2"])
    assert "no 'dense' leg" in err


def test_leg_params_errors_through_cli(small, capsys):
    err = _cli_error(capsys, ["search", str(small.reader.path), "vitamin", "--mode", "bm25",
                              "--leg-params", '{"bm25": {"nope": 1}}'])
    assert "nope" in err


# ----------------------------------------------------------------------------- corpus readers
def test_lone_surrogates_are_corpus_errors(tmp_path):
    # JSON "\ud800" escapes decode to a lone surrogate; the build used to fail at shard write
    # time with a raw UnicodeEncodeError after reading the whole corpus
    p = tmp_path / "c.jsonl"
    p.write_text('{"_id": "a", "text": "ok"}\n{"_id": "b", "text": "x \\ud800 y"}\n')
    with pytest.raises(CorpusError, match=r"line 2.*'text'.*unpaired surrogate"):
        build_index(p, tmp_path / "i", legs=("bm25",), show_progress=False)
    assert not (tmp_path / "i").exists()
    for rec, field in (({"_id": "\udc80", "text": "x"}, "_id"), ({"_id": "a", "text": "x", "title": "\ud800"}, "title"),
                       ({"_id": "a", "text": "x", "m": "\udcff"}, "metadata")):
        with pytest.raises(CorpusError, match=f"'{field}'.*unpaired surrogate"):
            list(read_corpus([rec]))


def test_byte_order_marks_are_not_data(tmp_path):
    bom = b"\xef\xbb\xbf"
    (tmp_path / "c.jsonl").write_bytes(bom + b'{"_id": "a", "text": "vitamin"}\n{"_id": "b", "text": "bone"}\n')
    assert [d.id for d in read_corpus(tmp_path / "c.jsonl")] == ["a", "b"]
    (tmp_path / "c.csv").write_bytes(bom + b"_id,text\na,vitamin\n")
    assert [d.id for d in read_corpus(tmp_path / "c.csv")] == ["a"]
    (tmp_path / "q.tsv").write_bytes(bom + b"q1\tvitamin\n")
    assert read_queries(tmp_path / "q.tsv") == {"q1": "vitamin"}  # was '\ufeffq1': never judged
    (tmp_path / "qrels.tsv").write_bytes(bom + b"query-id\tcorpus-id\tscore\nq1\ta\t1\n")
    assert read_qrels(tmp_path / "qrels.tsv") == {"q1": {"a": 1}}


@pytest.mark.parametrize("source", [None, 5, {"_id": "a", "text": "x"}])
def test_non_iterable_corpus(tmp_path, source):
    with pytest.raises(CorpusError, match="corpus must be a path or an iterable of dicts"):
        build_index(source, tmp_path / "i", legs=("bm25",), show_progress=False)


def test_legs_as_comma_string():
    assert BuildConfig(legs="bm25").legs == ("bm25",)
    assert BuildConfig(legs="bm25, dense").legs == ("bm25", "dense")


# ----------------------------------------------------------------------------- index and CLI
def test_manifest_models_must_be_a_dict(small, tmp_path):
    import shutil

    from retriever.index.format import current_manifest_path, manifest_digest

    d = tmp_path / "i"
    shutil.copytree(small.reader.path, d)
    m = json.loads(current_manifest_path(d).read_text())
    m["models"] = 5
    m["manifest_sha256"] = manifest_digest(m)
    current_manifest_path(d).write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match="'models'"):
        Retriever.open(d)


def _eval_files(tmp_path: Path, qrels: str) -> tuple[Path, Path]:
    q = tmp_path / "q.tsv"
    q.write_text("q1\tvitamin bone\n")
    r = tmp_path / "qrels.tsv"
    r.write_text(qrels)
    return q, r


def test_eval_without_judged_queries_is_an_error(small, tmp_path, capsys):
    q, r = _eval_files(tmp_path, "query-id\tcorpus-id\tscore\nq9\td1\t1\n")
    err = _cli_error(capsys, ["eval", str(small.reader.path), "--queries", str(q), "--qrels", str(r)])
    assert "none of the 1 queries has a judgement" in err
    (tmp_path / "empty.tsv").write_text("")
    err = _cli_error(capsys, ["eval", str(small.reader.path), "--queries", str(tmp_path / "empty.tsv"),
                              "--qrels", str(r)])
    assert "no queries" in err


def test_eval_run_out_unwritable(small, tmp_path, capsys):
    q, r = _eval_files(tmp_path, "query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    base = ["eval", str(small.reader.path), "--queries", str(q), "--qrels", str(r)]
    assert "does not exist" in _cli_error(capsys, base + ["--run-out", str(tmp_path / "nope" / "run")])
    assert "cannot write" in _cli_error(capsys, base + ["--run-out", str(tmp_path)])


def test_bench_query_vectors_file_errors(small, tmp_path, capsys):
    q, _ = _eval_files(tmp_path, "")
    base = ["bench", str(small.reader.path), "--queries", str(q), "--mode", "bm25", "--no-recall"]
    assert "file not found" in _cli_error(capsys, base + ["--query-vectors", str(tmp_path / "none.npy")])
    assert "not a .npy array file" in _cli_error(capsys, base + ["--query-vectors", str(q)])


def test_query_vectors_that_are_not_numbers(tmp_path):
    from retriever.legs.dense import DenseLeg

    leg = DenseLeg.__new__(DenseLeg)
    leg.dim = 4
    for bad in ("abc", [["a", "b", "c", "d"]], [[1, 2], [3]]):
        with pytest.raises(QueryError, match="query vectors"):
            leg.check_vectors(bad)


# ----------------------------------------------------------------------------- CSV and TREC runs
def test_csv_field_longer_than_128k(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text("_id,text\na," + "word " * 60_000 + "\n")  # 300 KB field; csv's default limit is 128 KiB
    [d] = list(read_corpus(p))
    assert d.id == "a" and len(d.text.split()) == 60_000


@pytest.mark.parametrize("name, data, msg", [
    # an unterminated quote used to swallow every following row into one document's text
    ("c.csv", '_id,text\na,"open quote\nb,second doc\nc,third\n', r"line 2: malformed CSV.*unterminated"),
    ("c.tsv", '_id\ttext\na\t"quoted" start\n', r"line 2: malformed CSV"),
    ("c.csv", "_id,text,text\na,x,y\n", r"line 1: header names column\(s\) \['text'\] more than once"),
    ("c.csv", "_id,title,text\na,only title\n", r"line 2: row has fewer fields than the header"),
])
def test_malformed_csv_is_an_error(tmp_path, name, data, msg):
    p = tmp_path / name
    p.write_text(data)
    with pytest.raises(CorpusError, match=msg):
        list(read_corpus(p))


def test_trec_run_refuses_ids_with_whitespace(tmp_path):
    from retriever.evaluation import write_trec_run

    write_trec_run(tmp_path / "ok", {"q1": {"d1": 2.0, "d2": 1.0}})
    assert (tmp_path / "ok").read_text().split("\n")[0] == "q1 Q0 d1 1 2.0 retriever"
    for run in ({"q1": {"d 1": 1.0}}, {"q\t1": {"d1": 1.0}}, {"q1": {"d1\n": 1.0}}, {"": {"d1": 1.0}}):
        with pytest.raises(QueryError, match="cannot write a TREC run"):
            write_trec_run(tmp_path / "bad", run)
        assert not (tmp_path / "bad").exists()


def test_doc_ids_padding_and_range(small):
    res = small.search_arrays(["vitamin", "zzzz-no-match"], k=5, mode="bm25")
    assert res.n_found[1] == 0
    ids = small.doc_ids(res.ids)  # the whole padded (nq, k) matrix
    assert ids.shape == (2, 5)
    assert ids[1].tolist() == [None] * 5  # -1 padding used to map to the last document's id
    n = int(res.n_found[0])
    assert ids[0, :n].tolist() == small.doc_ids(res.ids[0, :n]).tolist()
    assert all(isinstance(x, str) for x in ids[0, :n])
    for bad in (np.array([small.reader.n_docs]), np.array([-2]), np.array([0.5])):
        with pytest.raises(QueryError, match="ordinal"):
            small.doc_ids(bad)


@pytest.mark.parametrize("make, msg", [
    (lambda: BuildConfig(bm25=[("k1", 2)]), "bm25 must be a BM25Params"),
    (lambda: BuildConfig(dense={"dtype": "float64"}), "dense dtype must be 'float16' or 'float32'"),
    (lambda: BuildConfig(dense={"dtyp": "float32"}), "dense: .*unexpected keyword argument 'dtyp'"),
    (lambda: __import__("retriever.index.config", fromlist=["config"]).DenseConfig(max_length="x"), "max_length must be an integer"),
    (lambda: __import__("retriever.index.config", fromlist=["config"]).DenseConfig(batch_size=2.5), "batch_size must be an integer"),
    (lambda: __import__("retriever.index.config", fromlist=["config"]).AnalyzerConfig(max_token_length="x"), "max_token_length must be an integer"),
    (lambda: __import__("retriever.index.config", fromlist=["config"]).BM25Params(lucene_norms="no"), "lucene_norms must be True or False"),
])
def test_config_types(make, msg):
    from retriever.index.errors import ConfigError

    with pytest.raises(ConfigError, match=msg):
        make()


def test_config_sections_as_dicts():
    c = BuildConfig(bm25={"k1": 1.2}, dense={"dtype": "float32"})
    assert c.bm25.k1 == 1.2 and c.bm25.b == 0.4 and c.dense.dtype == "float32"
    assert BuildConfig.from_dict(c.to_dict()) == c


def test_cli_os_errors_are_one_line(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "vitamin"}\n')
    (tmp_path / "f").write_text("a file")
    # the output's parent is a file: was a raw FileExistsError traceback from the writer
    err = _cli_error(capsys, ["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "f" / "idx"),
                              "--legs", "bm25", "--no-progress"])
    assert str(tmp_path / "f") in err


def test_tsv_query_ids_are_stripped(tmp_path):
    p = tmp_path / "q.tsv"
    p.write_text("q1 \tvitamin\n")
    assert read_queries(p) == {"q1": "vitamin"}
    p.write_text(" \tvitamin\n")
    with pytest.raises(CorpusError, match="line 1.*empty query id"):
        read_queries(p)


@pytest.mark.parametrize("n_threads", ["2", 0, -3, True, 1.5])
def test_open_bad_n_threads(small, n_threads):
    # "2" used to be stored and fail on the first search with a raw ValueError
    with pytest.raises(QueryError, match="n_threads"):
        Retriever.open(small.reader.path, n_threads=n_threads)


def test_query_with_lone_surrogate(small, capsys):
    # dense / sparse tokenizers raised a raw TypeError on such text (e.g. a Latin-1 command-line
    # argument, which Python decodes with surrogateescape)
    with pytest.raises(QueryError, match=r"query #1 holds an unpaired surrogate '\\udce9'"):
        small.search_batch(["vitamin", "caf\udce9"], mode="bm25")
    assert small.search("café bone", mode="bm25") is not None  # non-ASCII text is fine
    err = _cli_error(capsys, ["search", str(small.reader.path), "caf\udce9", "--mode", "bm25"])
    assert "unpaired surrogate" in err


@pytest.mark.parametrize("kw, msg", [({"device": "tpu"}, "device must be"), ({"device": 5}, "device must be"),
                                     ({"use_gpu": "yes"}, "use_gpu must be")])
def test_open_bad_device(small, kw, msg):
    # device="tpu" used to fail at the first text query with a raw torch RuntimeError
    from retriever.index.errors import ConfigError

    with pytest.raises(ConfigError, match=msg):
        Retriever.open(small.reader.path, **kw)


def test_huge_n_threads_is_capped(small, monkeypatch):
    import retriever.api as api

    seen = []
    real = small.engine.search

    def spy(*a, **kw):
        seen.append(kw["n_threads"])
        return real(*a, **kw)

    monkeypatch.setattr(small.engine, "search", spy)
    qs = ["vitamin bone", "heart gene"] * 50
    a = small.search_arrays(qs, k=5, mode="bm25", n_threads=10**6)
    b = small.search_arrays(qs, k=5, mode="bm25", n_threads=1)
    assert seen[0] == api.MAX_THREADS and seen[1] == 1
    np.testing.assert_array_equal(a.ids, b.ids)


# ------------------------------------------------------------ precomputed vectors and output paths

def _docs50() -> list[dict]:
    return [{"_id": f"d{i}", "text": f"word{i} common text"} for i in range(50)]


@pytest.mark.parametrize("vectors, message", [
    ("abc", "dense_vectors must be a 2-D array or an iterable of rows/blocks, got str"),
    (np.zeros((50, 0), np.float32), r"rows have shape \(0,\), expected \(dim >= 1,\)"),
    (np.ones((49, 8), np.float32), "ran out at document 'd49', position 49"),
    (np.array([["a"] * 8] * 50), "must hold numbers, got dtype <U1"),
])
def test_bad_precomputed_dense_vectors(tmp_path, vectors, message):
    from retriever.index.errors import ConfigError
    with pytest.raises(ConfigError, match=message):
        build_index(_docs50(), tmp_path / "ix", BuildConfig(legs=("bm25", "dense")), dense_vectors=vectors,
                    show_progress=False)
    assert not (tmp_path / "ix").exists()


def test_matryoshka_dims_wider_than_precomputed_vectors(tmp_path):
    from retriever.index.config import DenseConfig
    from retriever.index.errors import ConfigError
    with pytest.raises(ConfigError, match=r"matryoshka_dims \(4, 16\) exceed the dimension 8"):
        build_index(_docs50(), tmp_path / "ix", BuildConfig(legs=("bm25", "dense"), dense=DenseConfig(matryoshka_dims=(4, 16))),
                    dense_vectors=np.ones((50, 8), np.float32), show_progress=False)


def test_output_under_a_file_and_symlinked_output(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(IndexFormatError, match="parent path .*f is a file"):
        build_index(_docs50(), tmp_path / "f" / "ix", show_progress=False)
    build_index(_docs50(), tmp_path / "real", show_progress=False)
    (tmp_path / "ln").symlink_to(tmp_path / "real")
    with pytest.raises(IndexFormatError, match="is a symbolic link; give the real directory"):
        build_index(_docs50(), tmp_path / "ln", show_progress=False, overwrite=True)
    assert Retriever.open(tmp_path / "real").search("word3", k=1)[0].id == "d3"


@pytest.mark.parametrize("weights, message", [
    ([1], "must be a mapping of leg name to weight, got list"),
    ({"bm25": 1e308, "dense": 1e308}, r"\|weight\| must be <= 1e\+30"),
    ({"bm25": True}, "must be a finite number, got True"),
])
def test_fusion_weight_types_and_range(weights, message):
    from retriever.fusion import Linear
    for cls in (RRF, Linear):
        with pytest.raises(QueryError, match=message):
            cls(weights=weights)


def test_unknown_bm25_algorithm_is_a_query_error(tmp_path):
    build_index(_docs50(), tmp_path / "ix", show_progress=False)
    r = Retriever.open(tmp_path / "ix")
    for q in ("word3", "zzzz-not-a-term"):  # with and without known terms
        with pytest.raises(QueryError, match="bm25 algorithm must be one of auto, exhaustive.*got 'x'"):
            r.search(q, leg_params={"bm25": {"algorithm": "x"}})
