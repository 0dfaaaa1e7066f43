"""``retriever bench`` and the benchmark harness pieces, on tiny inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retriever.cli import main

QUERIES = ["vitamin bone", "cancer therapy trial", "heart blood pressure", "sleep memory brain",
           "insulin sugar diet", "virus immune cell", "kidney", "gene protein dose"]


@pytest.fixture()
def queries_tsv(tmp_path):
    p = tmp_path / "queries.tsv"
    p.write_text("".join(f"q{i}\t{q}\n" for i, q in enumerate(QUERIES)))
    return p


def test_bench_cli_bm25_json(bm25_index, queries_tsv, capsys):
    rc = main(["bench", str(bm25_index), "--queries", str(queries_tsv), "--mode", "bm25", "-k", "10",
               "--threads", "1", "--json"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["settings"]["k"] == 10 and rep["settings"]["batch_size"] == 1
    assert rep["settings"]["n_queries"] == len(QUERIES)
    assert rep["index"]["n_docs"] == 300 and rep["index"]["bytes_on_disk"] > 0
    assert rep["peak_rss_bytes"] > 0
    e = rep["modes"]["bm25"]
    for key in ("qps", "qps_excluding_encode", "latency_ms", "encode_ms", "search_ms", "fuse_ms",
                "latency_excluding_encode_ms", "recall@10", "peak_rss_bytes"):
        assert key in e, key
    for key in ("p50", "p95", "p99"):
        assert e["latency_ms"][key] > 0
    assert e["latency_ms"]["p50"] <= e["latency_ms"]["p95"] <= e["latency_ms"]["p99"]
    assert e["recall@10"] == {"bm25": 1.0}


def test_bench_cli_text_batches(bm25_index, queries_tsv, capsys):
    rc = main(["bench", str(bm25_index), "--queries", str(queries_tsv), "--batch-size", "3", "-k", "5"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "bm25" in out and "recall@5" in out and "bm25=1.0000" in out


def _unit(rng, n, d):
    v = rng.standard_normal((n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_build_index_precomputed_vectors(tmp_path, small_corpus):
    """Precomputed vectors are stored like encoded ones; array and iterable inputs agree; the
    dense and hybrid legs are exact (recall 1.0) against flat search."""
    from retriever import ConfigError, DenseConfig, Retriever, build_index
    from retriever.bench import bench_index

    rng = np.random.default_rng(0)
    vecs = _unit(rng, len(small_corpus), 16)
    a, b = tmp_path / "a", tmp_path / "b"
    m = build_index(small_corpus, a, legs=("bm25", "dense"), dense_vectors=vecs, show_progress=False,
                    shard_size=128, batch_size=50)
    assert m["stats"]["dense_dim"] == 16 and m["models"]["dense"]["precomputed"]
    blocks = (vecs[i:i + 7] for i in range(0, len(vecs), 7))
    build_index(small_corpus, b, legs=("dense",), dense_vectors=blocks, show_progress=False,
                dense=DenseConfig(dtype="float32"))
    ra, rb = Retriever.open(a), Retriever.open(b)
    stored_a = np.concatenate(ra.engine.legs["dense"].vectors)
    stored_b = np.concatenate(rb.engine.legs["dense"].vectors)
    assert stored_a.dtype == np.float16 and np.array_equal(stored_a, vecs.astype(np.float16))
    assert stored_b.dtype == np.float32 and np.array_equal(stored_b, vecs)
    qv = _unit(rng, len(QUERIES), 16)
    hits = ra.search("vitamin bone", k=3, mode="dense", query_vectors=qv[0])
    assert len(hits) == 3
    rep = bench_index(ra, QUERIES, modes=["dense", "hybrid"], k=5, query_vectors=qv, n_threads=1)
    assert rep["modes"]["dense"]["recall@5"] == {"dense": 1.0}
    assert rep["modes"]["hybrid"]["recall@5"] == {"bm25": 1.0, "dense": 1.0, "fused": 1.0}
    with pytest.raises(ConfigError, match="fewer rows"):
        build_index(small_corpus, tmp_path / "c", legs=("dense",), dense_vectors=vecs[:10], show_progress=False)
    with pytest.raises(ConfigError, match="more rows"):
        build_index(small_corpus, tmp_path / "d", legs=("dense",), dense_vectors=np.vstack([vecs, vecs[:1]]),
                    show_progress=False)
    with pytest.raises(ConfigError, match="not in legs"):
        build_index(small_corpus, tmp_path / "e", legs=("bm25",), dense_vectors=vecs, show_progress=False)
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_run_pieces_tiny(tmp_path):
    """benchmarks/run.py pieces on tiny inputs: hybrid section, non-model indexing, peer guard,
    summary, plots and the README generator (markers added once, other text untouched)."""
    import importlib.util

    from benchmarks import run
    from benchmarks.datasets import synthetic_bm25
    from benchmarks.report import write_plots, write_summary
    from benchmarks.update_readme import END, START, update_readme

    e = run.bench_hybrid(1500, tmp_path, threads=2, n_queries=20, nprobes=(1, 64), passes=2, sparse_cuts=(3,))
    assert e["n_docs"] == 1500 and e["dense_factory"].startswith("IVF") and len(e["points"]) == 2
    assert e["bm25"]["recall@10"] == {"bm25": 1.0} and len(e["bm25"]["passes"]) == 2
    assert e["legs"] == ["bm25", "dense", "sparse"] and e["sparse_params"] == run.HYBRID_SPARSE_PARAMS
    assert not e["index_cached"] and not (tmp_path / "synthetic-hybrid-1500").exists()
    assert [v["label"] for v in e["variants"]] == ["legs in sequence", "sparse query_cut 3"]
    assert e["variants"][1]["sparse_params"]["query_cut"] == 3 and not e["variants"][0]["concurrent_legs"]
    # the sequential variant returns the same lists as the concurrent point at that nprobe
    same = next(p for p in e["points"] if p["nprobe"] == e["headline"]["nprobe"])
    assert e["variants"][0]["hybrid"]["recall@10"] == same["hybrid"]["recall@10"]
    assert 0 < e["sparse_leg"]["recall@10"]["sparse"] <= 1.0
    for p in e["points"]:
        assert set(p["hybrid"]["recall@10"]) == {"bm25", "dense", "sparse", "fused"}
        assert p["hybrid"]["latency_ms"]["p99"] > 0
    assert e["points"][1]["dense"]["recall@10"]["dense"] == 1.0  # nprobe >= nlist: exhaustive
    assert {"p99_ms", "meets_target", "recall@10"} <= set(e["headline"])
    syn = synthetic_bm25(500, n_queries=1)
    ix = run._nonmodel(syn.docs, syn.n_docs, tmp_path, "syn")
    assert ix["docs_per_s"] > 0 and len(ix["seconds_runs"]) == 3 and len(ix["breakdown_seconds"]) == 4
    assert ix["n_terms"] > 0 and ix["n_tokens"] > 0 and ix["bm25s"]["docs_per_s"] > 0
    if importlib.util.find_spec("benchmarks.bench_sparse") is None:
        assert run._peer_section("sparse", True)["_status"] == "not available"
    out = tmp_path / "results"
    out.mkdir()
    doc = {"section": "hybrid", "status": "ok", "quick": True, "command": "python -m benchmarks.run --quick",
           "machine": run._machine(), "seconds": 1.0, "results": {"sizes": {"1500": e}}}
    (out / "run_hybrid.json").write_text(__import__("json").dumps(doc, default=run._json_default))
    summary = write_summary(out).read_text()
    assert "Hybrid end to end" in summary and "| 1,500 |" in summary
    pngs = write_plots(out)
    assert [p.name for p in pngs] == ["hybrid_recall_qps.png"] and pngs[0].stat().st_size > 1000
    readme = tmp_path / "README.md"
    readme.write_text("# title\n\nkeep me\n")
    assert update_readme(readme, out)
    text = readme.read_text()
    assert text.startswith("# title\n\nkeep me\n") and START in text and END in text and "1,500" in text
    assert not update_readme(readme, out)  # idempotent
    readme.write_text(text.replace("keep me", "edited") + "tail\n")
    update_readme(readme, out)
    assert "edited" in readme.read_text() and readme.read_text().endswith("tail\n")
    assert readme.read_text().count(START) == 1


def test_run_quick(tmp_path):
    """The whole quick run (CI's smoke test, about 2 minutes on 2 cores); asserts nothing about speed."""
    from benchmarks import run

    assert run.main(["--quick", "--out", str(tmp_path), "--no-readme"]) == 0
    for name in run.SECTIONS:
        doc = __import__("json").loads((tmp_path / f"run_{name}.json").read_text())
        assert doc["status"] in ("ok", "not available"), (name, doc["results"])
    assert (tmp_path / "SUMMARY.md").is_file() and (tmp_path / "hybrid_recall_qps.png").is_file()


def test_bench_cli_query_vectors(tmp_path, small_corpus, queries_tsv, capsys):
    from retriever import build_index

    rng = np.random.default_rng(3)
    build_index(small_corpus, tmp_path / "h", legs=("bm25", "dense"), dense_vectors=_unit(rng, 300, 8),
                show_progress=False)
    np.save(tmp_path / "qv.npy", _unit(rng, len(QUERIES), 8))
    rc = main(["bench", str(tmp_path / "h"), "--queries", str(queries_tsv), "--query-vectors",
               str(tmp_path / "qv.npy"), "--threads", "2", "--max-queries", "5", "--json"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert list(rep["modes"]) == ["bm25", "dense", "hybrid"] and rep["settings"]["n_queries"] == 5
    assert rep["modes"]["hybrid"]["recall@10"] == {"bm25": 1.0, "dense": 1.0, "fused": 1.0}
    assert rep["settings"]["query_vectors"] is True


def test_bench_index_passes(tmp_path, small_corpus):
    """passes > 1: per-pass figures kept, reported statistics are their medians; passes < 1 refused."""
    from retriever import Retriever, build_index
    from retriever.bench import bench_index
    from retriever.index.errors import QueryError

    build_index(small_corpus, tmp_path / "ix", legs=("bm25",), show_progress=False)
    r = Retriever.open(tmp_path / "ix", n_threads=1)
    qs = ["vitamin bone", "heart", "gene cell", "sleep"]
    rep = bench_index(r, qs, modes=["bm25"], k=5, passes=3)
    e = rep["modes"]["bm25"]
    assert len(e["passes"]) == 3
    assert e["qps"] == float(np.median([p["qps"] for p in e["passes"]]))
    assert e["latency_ms"]["p99"] == float(np.median([p["latency_ms"]["p99"] for p in e["passes"]]))
    assert e["recall@5"] == {"bm25": 1.0}
    assert "passes" not in bench_index(r, qs, modes=["bm25"], k=5)["modes"]["bm25"]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(QueryError, match="passes"):
            bench_index(r, qs, modes=["bm25"], passes=bad)


def test_hybrid_index_cache(tmp_path, monkeypatch):
    """benchmarks.run.hybrid_index: built once into the cache folder, then reused (same path, build
    time and sparse query vectors); an entry without its record is rebuilt."""
    from benchmarks import bench_sparse, run

    monkeypatch.setattr(bench_sparse, "CACHE", tmp_path / "vectors")
    kw = dict(n_queries=10, cache_dir=tmp_path / "c")
    a = run.hybrid_index(900, tmp_path, **kw)
    b = run.hybrid_index(900, tmp_path, **kw)
    assert not a["cached"] and b["cached"] and a["path"] == b["path"] and a["path"].parent == tmp_path / "c"
    assert b["build_seconds"] == a["build_seconds"] and b["factory"] == a["factory"] == "IVF32,Flat"
    assert len(a["sparse_queries"]) == len(b["sparse_queries"]) == 10
    for (t1, w1), (t2, w2) in zip(a["sparse_queries"], b["sparse_queries"]):
        np.testing.assert_array_equal(t1, t2)
        np.testing.assert_array_equal(w1, w2)
    assert run.hybrid_index(900, tmp_path, n_queries=10, cache_dir=tmp_path / "c", sparse=False)["path"] != a["path"]
    a["path"].with_name(a["path"].name + ".json").unlink()
    c = run.hybrid_index(900, tmp_path, **kw)
    assert not c["cached"] and c["path"] == a["path"] and (c["path"] / "manifest.json").is_file()
    with pytest.raises(ValueError, match="n_docs"):
        run.hybrid_index(0, tmp_path, **kw)


def test_run_hybrid_sizes_merge(tmp_path, monkeypatch):
    """``--hybrid-sizes``: each size runs on its own and lands in one run_hybrid.json."""
    import json

    from benchmarks import bench_sparse, run

    monkeypatch.setattr(run, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(bench_sparse, "CACHE", tmp_path / "cache")
    out = tmp_path / "res"
    for n in ("700", "600", "700"):
        assert run.main(["--quick", "--only", "hybrid", "--hybrid-sizes", n, "--out", str(out), "--no-readme"]) == 0
    doc = json.loads((out / "run_hybrid.json").read_text())
    assert doc["status"] == "ok" and list(doc["results"]["sizes"]) == ["600", "700"]
    assert doc["results"]["sizes"]["700"]["index_cached"]  # second 700 run reused the cached index
    assert all("load_avg_1m" in e["machine"] for e in doc["results"]["sizes"].values())
    with pytest.raises(SystemExit):
        run.main(["--only", "hybrid", "--hybrid-sizes", "x", "--out", str(out)])
    assert run._peer_args("sparse", True, out)[-1][-2:] == ["--out", str(out / "sparse_quick.json")]
    full = run._peer_args("sparse", False, out)
    assert full[0] == ["--collections", "scifact"] and "bmp" not in full[0]  # SciFact: default sweep, bmp in
    assert full[1][:2] == ["--collections", "synthetic"] and "--skip" not in full[1]  # 1M: every engine
    assert run._peer_args("dense", False, out) == [[]]


def test_bench_index_gc_paused_and_restored(tmp_path, small_corpus):
    """Timed passes run with the cyclic collector off; its state (enabled, nothing frozen) is
    restored afterwards, also when it was off before; ``gc_pause=False`` leaves it on."""
    import gc

    from retriever import Retriever, build_index
    from retriever.bench import bench_index

    build_index(small_corpus, tmp_path / "ix", legs=("bm25",), show_progress=False)
    r = Retriever.open(tmp_path / "ix", n_threads=1)
    seen = []
    orig = r.search_arrays

    def spy(*a, **kw):
        seen.append((gc.isenabled(), gc.get_freeze_count() > 0))
        return orig(*a, **kw)

    r.search_arrays = spy
    qs = ["vitamin bone", "heart", "gene cell", "sleep"]
    assert gc.isenabled()
    rep = bench_index(r, qs, modes=["bm25"], k=5, passes=2, warmup_batches=0, recall=False)
    assert rep["settings"]["gc_paused"] is True
    assert seen == [(False, True)] * 8
    assert gc.isenabled() and gc.get_freeze_count() == 0
    seen.clear()
    bench_index(r, qs, modes=["bm25"], k=5, warmup_batches=0, recall=False, gc_pause=False)
    assert seen == [(True, False)] * 4
    gc.disable()
    try:
        bench_index(r, qs, modes=["bm25"], k=5, recall=False)
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_omp_threads_worker_cache_and_restore():
    """The calling thread's FAISS OpenMP setting is restored after a leg group; a pool worker's is
    left set and not touched again while it already has the wanted value."""
    import threading

    faiss = pytest.importorskip("faiss")
    import retriever.threads as threads

    before = faiss.omp_get_max_threads()
    with threads.omp_threads(1):
        assert faiss.omp_get_max_threads() == 1
    assert faiss.omp_get_max_threads() == before
    calls = []

    class Spy:
        def __getattr__(self, name):
            def f(*a):
                calls.append(name)
                return getattr(faiss, name)(*a)
            return f

    def worker():
        for _ in range(3):
            ctx = threads.omp_threads(1, restore=False)
            ctx.faiss = Spy()
            with ctx:
                assert faiss.omp_get_max_threads() == 1
        calls.append(("after", faiss.omp_get_max_threads()))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert calls == ["omp_set_num_threads", ("after", 1)]
    assert faiss.omp_get_max_threads() == before


def test_budget_record_and_summary(tmp_path):
    """cache_state sees an empty vs a filled cache; the budget record becomes SUMMARY's "Time
    budget" lines with the verdict against the limit and the partial/complete flag."""
    from benchmarks import report, run

    cache = tmp_path / "cache"
    assert run.cache_state(cache) == {"dir": str(cache), "entries": 0, "bytes": 0, "cold": True}
    (cache / "sub").mkdir(parents=True)
    (cache / "sub" / "a.bin").write_bytes(b"x" * 10)
    (cache / "b.npz").write_bytes(b"y" * 5)
    st = run.cache_state(cache)
    assert st["entries"] == 2 and st["bytes"] == 15 and not st["cold"]
    out = tmp_path / "res"
    out.mkdir()
    assert "no invocation recorded" in "\n".join(report.budget_markdown(out))
    base = {"command": "python -m benchmarks.run", "quick": False, "started": {"time": "t", "load_avg_1m": 1.0},
            "section_seconds": {"hybrid": 600.0, "bm25": 300.0}, "limit_minutes": 60.0, "aim_minutes": 45.0,
            "cache_at_start": run.cache_state(tmp_path / "none")}
    run.write_budget(out, {**base, "complete": True, "sections_run": ["hybrid", "bm25"], "wall_seconds": 3000.0,
                           "within_limit": True})
    text = "\n".join(report.budget_markdown(out))
    assert "50.0 min wall" in text and "under 60 min" in text and "aim ≤ 45 min missed" in text
    assert "cold cache" in text and "all sections" in text
    run.write_budget(out, {**base, "complete": False, "sections_run": ["hybrid"], "wall_seconds": 4000.0,
                           "within_limit": False, "cache_at_start": st})
    assert (out / "budget.json").is_file() and (out / "budget_partial.json").is_file()
    text = "\n".join(report.budget_markdown(out))
    full, partial = [l for l in text.splitlines() if l.startswith("- Full run")], \
        [l for l in text.splitlines() if l.startswith("- Latest partial run")]
    # the partial invocation never replaces the complete run's record: both lines, each its own figures
    assert len(full) == 1 and "50.0 min wall" in full[0] and "all sections" in full[0]
    assert len(partial) == 1 and "NOT under 60 min" in partial[0] and "partial: only hybrid" in partial[0]
    assert "warm cache (2 entries" in partial[0] and "66.7 min wall" in partial[0]


def test_run_fresh_section_in_child_process(tmp_path):
    """run_fresh runs a section in a child process (``--child-section``) and returns its results;
    the child's own entry point writes exactly the section function's results."""
    from benchmarks import run

    res = run.run_fresh("encode", quick=True)
    assert res["process"] == "fresh subprocess"
    assert res["n_queries"] == 20 and "dense:all-MiniLM-L6-v2" in res["models"]
    lat = res["models"]["dense:all-MiniLM-L6-v2"]["batch1_latency_ms"]
    assert 0 < lat["p50"] <= lat["p99"]
    out = tmp_path / "child.json"
    assert run.main(["--child-section", "encode", "--quick", "--child-out", str(out)]) == 0
    child = __import__("json").loads(out.read_text())
    assert child["n_queries"] == 20 and set(child["models"]) == set(res["models"])


def test_exact_search_is_the_engines_exhaustive_search(tmp_path, small_corpus):
    """exact_search goes through search_arrays with each leg's exhaustive mode: on an IVF index
    the dense reference equals a brute-force inner product (not the IVF's own approximate lists),
    BM25's equals the default algorithm's, and the fused list is the hybrid search of those legs."""
    from retriever import DenseConfig, Retriever, build_index
    from retriever.bench import EXACT_LEG_PARAMS, exact_search

    rng = np.random.default_rng(7)
    vecs = _unit(rng, len(small_corpus), 16)
    build_index(small_corpus, tmp_path / "ivf", legs=("bm25", "dense"), dense_vectors=vecs, show_progress=False,
                dense=DenseConfig(dtype="float32", faiss_factory="IVF8,Flat"))
    r = Retriever.open(tmp_path / "ivf", n_threads=1)
    qv = _unit(rng, len(QUERIES), 16)
    ex = exact_search(r, QUERIES, k=10, mode="hybrid", query_vectors=qv)
    s = qv @ vecs.T
    brute = np.array([np.lexsort((np.arange(len(row)), -row))[:10] for row in s])
    np.testing.assert_array_equal(ex["dense"], brute)
    own = r.search_arrays(QUERIES, 10, mode="dense", query_vectors=qv, leg_params={"dense": {"nprobe": 1}}).ids
    assert not np.array_equal(own, brute)  # the index's own search at nprobe 1 is approximate here
    np.testing.assert_array_equal(ex["bm25"], r.search_arrays(QUERIES, 10, mode="bm25").ids)
    fused = r.search_arrays(QUERIES, 10, mode="hybrid", query_vectors=qv,
                            leg_params={n: dict(EXACT_LEG_PARAMS[n]) for n in ("bm25", "dense")}).ids
    np.testing.assert_array_equal(ex["fused"], fused)
    assert set(ex) == {"bm25", "dense", "fused"}
