"""Smoke run of the main job through the CLI on a real collection (MED, 1,033 docs):
build a hybrid index (sharded), query it, evaluate it, write a run file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from retriever.cli import main
from retriever.index.format import current_manifest_path


def test_index_info(medline_index, capsys):
    assert main(["index", "info", str(medline_index)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_docs"] == 1033 and info["legs"] == ["bm25", "dense"] and info["n_shards"] == 3
    assert main(["index", "verify", str(medline_index)]) == 0


def test_index_info_shows_only_built_legs_config(medline_index, capsys):
    """A BM25 + dense index's summary carries no sparse settings (the manifest keeps them all)."""
    assert main(["index", "info", str(medline_index)]) == 0
    cfg = json.loads(capsys.readouterr().out)["build_config"]
    assert {"bm25", "analyzer", "dense"} <= set(cfg) and "sparse" not in cfg
    m = json.loads(current_manifest_path(medline_index).read_text())
    assert "sparse" in m["build_config"]


@pytest.mark.parametrize("argv, shown", [
    (["index", "build"], ["(default: 100000)", "(default: 1024)", "(default: cpu)", "(default: float16)",
                          "(default bm25,dense)"]),
    (["search"], ["(default: 10)", "(default: hybrid)", "default 60 with --fusion rrf, 40 for the default fusion"]),
    (["bench"], ["(default 10)"]),
])
def test_help_shows_defaults(argv, shown, capsys):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for s in shown:
        assert s in out, s
    assert "(default: None)" not in out and "(default: False)" not in out and "(default: )" not in out


def test_search_json(medline_index, capsys):
    assert main(["search", str(medline_index), "cancer of the lung in smokers", "-k", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    hits = out["hits"]
    assert len(hits) == 5 and [h["rank"] for h in hits] == [1, 2, 3, 4, 5]
    assert all(hits[i]["score"] >= hits[i + 1]["score"] for i in range(4))
    assert all(set(h["legs"]) <= {"bm25", "dense"} and h["legs"] for h in hits)


def test_search_modes_text(medline_index, capsys):
    for mode in ("bm25", "dense", "hybrid"):
        assert main(["search", str(medline_index), "kidney disease", "--mode", mode, "-k", "3"]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert len(lines) == 3


def test_eval_json_and_run_file(medline_index, data_dir, tmp_path, capsys):
    run = tmp_path / "run.txt"
    rc = main(["eval", str(medline_index), "--queries", str(data_dir / "medline" / "queries.jsonl"),
               "--qrels", str(data_dir / "medline" / "qrels.tsv"), "--mode", "bm25", "--mode", "dense",
               "--mode", "hybrid", "--json", "--run-out", str(run)])
    assert rc == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [r["mode"] for r in rows] == ["bm25", "dense", "hybrid"]
    for r in rows:
        assert set(r) >= {"mode", "ndcg@10", "recall@100", "mrr@10", "queries"}
        assert r["queries"] == 30 and 0.3 < r["ndcg@10"] <= 1
    by = {r["mode"]: r for r in rows}
    assert by["bm25"]["ndcg@10"] == pytest.approx(0.66, abs=0.02)
    for mode in ("bm25", "dense", "hybrid"):
        lines = (tmp_path / f"run.txt.{mode}").read_text().splitlines()
        per_q: dict[str, list[float]] = {}
        for line in lines:
            qid, q0, did, rank, score, tag = line.split()
            per_q.setdefault(qid, []).append(float(score))
        assert len(per_q) == 30
        for scores in per_q.values():
            assert all(a > b for a, b in zip(scores, scores[1:]))


def test_bad_input_exit_codes(tmp_path, capsys):
    assert main(["search", str(tmp_path / "nope"), "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and "nope" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as e:
        main(["search", str(tmp_path), "x", "-k", "0"])
    assert e.value.code == 2


@pytest.mark.parametrize("argv", [["index", "info"], ["search", None, "vitamin d", "-k", "50"]])
def test_closed_output_pipe_is_quiet(medline_index, argv):
    # `retriever ... | head`: the reader closes the pipe before we write; no 'error:' line, status 141
    argv = [str(medline_index) if a is None else a for a in argv]
    if argv[0] == "index":
        argv.append(str(medline_index))
    p = subprocess.Popen([sys.executable, "-m", "retriever", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # long before the child has imported anything and written
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert "error" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("command", [["eval"], ["fusion", "fit"]])
def test_swapped_queries_and_qrels_say_so(medline_index, data_dir, command, capsys):
    """--queries and --qrels given the other way round: one error line naming both files and
    saying they look swapped (it used to be a bare duplicate-query-id error)."""
    q, r = data_dir / "medline" / "queries.jsonl", data_dir / "medline" / "qrels.tsv"
    assert main([*command, str(medline_index), "--queries", str(r), "--qrels", str(q)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: the queries and qrels files look swapped: the queries file {str(r)!r} looks like "
                          f"qrels and the qrels file {str(q)!r} like queries; reading them as given: {r}, line ")
    assert "duplicate query id" in err and len(err.strip().splitlines()) == 1


def test_bench_given_qrels_for_queries_says_so(medline_index, data_dir, capsys):
    r = data_dir / "medline" / "qrels.tsv"
    assert main(["bench", str(medline_index), "--queries", str(r), "--no-recall"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: the queries file {str(r)!r} looks like qrels (query-id corpus-id grade lines), "
                          f"not queries (queries.jsonl or qid<TAB>text); reading it as given: {r}, line ")


_HEAVY = ("torch", "faiss", "ray", "transformers", "numba", "pandas", "scipy", "pyarrow.dataset", "retriever.api",
          "retriever.engine")


def _modules_after(code: str) -> set[str]:
    """The top modules of _HEAVY (and numpy / pyarrow) loaded after running ``code`` in a fresh
    interpreter whose ``retriever`` is this checkout's."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    probe = (f"{code}\nimport sys, retriever\nprint(retriever.__file__)\n"
             f"print(' '.join(m for m in {[*_HEAVY, 'numpy', 'pyarrow']!r} if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    where, loaded = r.stdout.split("\n")[-3:-1]
    assert Path(where).resolve() == root / "retriever" / "__init__.py"
    return set(loaded.split())


def test_cli_import_and_help_load_no_heavy_module():
    """``import retriever.cli`` and ``retriever --help`` load none of the engine, the encoders'
    libraries, FAISS, Ray, numba, pandas, numpy or Arrow (they used to load the engine, Arrow
    datasets, numba and pandas through the package's eager ``__init__``)."""
    assert _modules_after("import retriever.cli") == set()
    code = ("import contextlib, io\nfrom retriever.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['--help'])\n    except SystemExit as e:\n        assert e.code == 0\n")
    assert _modules_after(code) == set()


def test_index_info_loads_no_engine(medline_index):
    """``retriever index info DIR`` reads the manifest with numpy and Arrow only."""
    code = ("import contextlib, io\nfrom retriever.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n    assert main(['index', 'info', {str(medline_index)!r}]) == 0\n")
    assert _modules_after(code) == {"numpy", "pyarrow"}


def test_public_names_still_import_from_the_package():
    """Every name of ``retriever.__all__`` resolves (lazily) to the object of its module."""
    import retriever
    from retriever.api import Retriever
    from retriever.index.errors import QueryError

    assert retriever.Retriever is Retriever and retriever.QueryError is QueryError
    assert all(getattr(retriever, n) is not None for n in retriever.__all__)
    assert set(retriever.__all__) <= set(dir(retriever))
    from retriever.index import errors  # every error type of the one errors module is public

    public = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.RetrieverError)}
    assert public <= set(retriever.__all__), public - set(retriever.__all__)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        retriever.nope  # noqa: B018


# ------------------------------------------------------------------------------- the living index
def _write_corpus(path, docs: list[dict]) -> str:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    return str(path)


def test_living_index_commands_equal_a_fresh_build(tmp_path, capsys):
    """index add / delete (ids as arguments and an --ids file with a byte-order mark, CRLF line
    ends and blank lines) / upsert / compact / info, each committing once: the index then answers
    every query as a fresh build of the live documents does, and unknown ids are reported."""
    from retriever import Retriever, build_index

    docs = [{"_id": f"d{i}", "text": f"apple pear number{i} " + "kiwi " * (i % 4)} for i in range(12)]
    idx = tmp_path / "idx"
    assert main(["index", "build", "--corpus", _write_corpus(tmp_path / "c.jsonl", docs[:6]), "--out", str(idx),
                 "--legs", "bm25", "--no-progress"]) == 0
    assert main(["index", "add", str(idx), "--corpus", _write_corpus(tmp_path / "a.jsonl", docs[6:])]) == 0
    assert "added 6 documents" in capsys.readouterr().out
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b"\xef\xbb\xbfd1\r\n\r\nd7\r\nnope\r\n")
    assert main(["index", "delete", str(idx), "d3", "--ids", str(ids)]) == 0
    out = capsys.readouterr().out
    assert "deleted 3 documents" in out and "1 ids name no live document: 'nope'" in out
    new = {"_id": "d4", "text": "apple apple replaced"}
    assert main(["index", "upsert", str(idx), "--corpus", _write_corpus(tmp_path / "u.jsonl", [new])]) == 0
    assert main(["index", "compact", str(idx)]) == 0
    capsys.readouterr()
    assert main(["index", "info", str(idx)]) == 0
    info = json.loads(capsys.readouterr().out)
    live = [d for d in docs if d["_id"] not in ("d1", "d3", "d4", "d7")] + [new]
    assert info["n_docs"] - info.get("n_deleted", 0) == len(live)
    build_index(live, tmp_path / "fresh", legs=("bm25",), show_progress=False)
    r, f = Retriever.open(idx), Retriever.open(tmp_path / "fresh")
    assert sorted(r.live_ids()) == sorted(d["_id"] for d in live)
    for q in ("apple", "kiwi pear", "replaced", "number7", "number3 kiwi"):
        got, want = r.search(q, k=20, mode="bm25"), f.search(q, k=20, mode="bm25")
        assert [h.id for h in got] == [h.id for h in want], q
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-6), q


def test_living_index_commands_refuse_bad_files_naming_them(tmp_path, capsys):
    """An ids file that is not UTF-8 (names the file and line) and a --dense-vectors file that is
    not an .npy array: one-line errors, exit 1, nothing committed."""
    import numpy as np

    from retriever import Retriever, build_index
    from tests.conftest import cli_error

    idx = tmp_path / "idx"
    vecs = np.eye(4, 8, dtype=np.float32)
    build_index([{"_id": f"d{i}", "text": f"apple {i}"} for i in range(4)], idx, legs=("bm25", "dense"),
                dense_vectors=vecs, show_progress=False)
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b"d1\n\xff\n")
    err = cli_error(capsys, ["index", "delete", str(idx), "--ids", str(ids)])
    assert "ids.txt" in err and "line 2" in err and "UTF-8" in err
    corpus = _write_corpus(tmp_path / "n.jsonl", [{"_id": "n1", "text": "new"}])
    bad = tmp_path / "v.npy"
    bad.write_text("garbage\n")
    err = cli_error(capsys, ["index", "add", str(idx), "--corpus", corpus, "--dense-vectors", str(bad)])
    assert "--dense-vectors" in err and "v.npy" in err and "not a .npy array file" in err
    np.savez(tmp_path / "v.npz", a=vecs[:1])
    err = cli_error(capsys, ["index", "add", str(idx), "--corpus", corpus, "--dense-vectors", str(tmp_path / "v.npz")])
    assert ".npz archive" in err
    r = Retriever.open(idx)
    assert r.reader.generation == 1 and sorted(r.live_ids()) == ["d0", "d1", "d2", "d3"]


def _tiny_hybrid(tmp_path):
    import numpy as np

    from retriever import build_index

    docs = [{"_id": f"d{i}", "text": f"word{i % 7} common alpha"} for i in range(20)]
    build_index(docs, tmp_path / "idx", legs=("bm25", "dense"), show_progress=False,
                dense_vectors=np.random.default_rng(0).standard_normal((20, 8)).astype("float32"))
    (tmp_path / "q.jsonl").write_text('{"_id": "q0", "text": "word0 alpha"}\n{"_id": "q1", "text": "word1"}\n')
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\nq1\td1\t1\n")
    return tmp_path / "idx"


def test_eval_with_a_mode_given_twice_evaluates_it_once(tmp_path, capsys):
    """--mode bm25 --mode bm25 is one mode: printed once, the run file written under its own name
    (not FILE.bm25 as for several modes)."""
    idx = _tiny_hybrid(tmp_path)
    run = tmp_path / "run.txt"
    assert main(["eval", str(idx), "--queries", str(tmp_path / "q.jsonl"), "--qrels", str(tmp_path / "qrels.tsv"),
                 "--mode", "bm25", "--mode", "bm25", "--run-out", str(run)]) == 0
    assert capsys.readouterr().out.count("bm25") == 1 and run.exists()


def test_bench_query_vectors_of_the_wrong_shape_name_the_file(tmp_path, capsys):
    """A --query-vectors file of the wrong width or row count: one line naming the flag, the file
    and its whole shape (it said the shape of one query, without the file)."""
    import numpy as np

    from tests.conftest import cli_error

    idx = _tiny_hybrid(tmp_path)
    for shape in ((2, 7), (3, 8)):
        qv = tmp_path / "qv.npy"
        np.save(qv, np.ones(shape, dtype="float32"))
        err = cli_error(capsys, ["bench", str(idx), "--queries", str(tmp_path / "q.jsonl"), "--query-vectors", str(qv),
                                 "--mode", "dense", "--no-recall", "--threads", "1"])
        assert "--query-vectors" in err and "qv.npy" in err and f"shape {shape}" in err and "expected (2, 8)" in err
