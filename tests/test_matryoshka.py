"""Matryoshka dense leg: rotation, storage dtypes, funnel search, FAISS edge cases, batch/single
agreement, and CPU/GPU parity (marked ``gpu``)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
import pytest

from retriever.index.config import BuildConfig, DenseConfig
from retriever.index.errors import ConfigError, QueryError
from retriever.index.matryoshka import (ROTATION_FILE, build_vector_index, check_dims, fit_pca_rotation, prefix_normalize,
                              to_storage)
from retriever import Retriever, build_index
from retriever.funnel import choose_prefix_dim
from retriever.metrics import recall_at_k

D = 48


def anisotropic(n: int, d: int = D, seed: int = 0) -> np.ndarray:
    """Unit vectors with a decaying spectrum in a random basis (like sentence embeddings)."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((d, d)))
    x = rng.standard_normal((n, d)) * (1.0 / np.arange(1, d + 1) ** 0.8) @ basis.T + 0.3 * basis[:, 0]
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def exact_top(x: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    s = (q.astype(np.float64) @ x.astype(np.float64).T)
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


@pytest.fixture(scope="module", autouse=True)
def _one_faiss_thread():
    """Tiny indexes: one OpenMP thread avoids oversubscription stalls on a loaded 2-core machine."""
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.fixture(scope="module")
def vecs() -> np.ndarray:
    return anisotropic(1200)


@pytest.fixture(scope="module")
def queries(vecs) -> np.ndarray:
    rng = np.random.default_rng(5)
    q = vecs[rng.choice(len(vecs), 37, replace=False)] + 0.05 * rng.standard_normal((37, D)).astype(np.float32)
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def rot_index(tmp_path_factory, vecs) -> Retriever:
    out = tmp_path_factory.mktemp("mat") / "rot"
    build_vector_index([f"d{i}" for i in range(len(vecs))], vecs, out, dims=(8, 16, 32, D), shard_size=500,
                       dtype="float32")
    return Retriever.open(out)


def search(r: Retriever, q: np.ndarray, k: int, **params):
    return r.search_arrays(["q"] * len(q), k, mode="dense", query_vectors=q, leg_params={"dense": params})


# ---------------------------------------------------------------- config and rotation
def test_check_dims_and_config_round_trip():
    assert check_dims("64, 128,256") == (64, 128, 256)
    assert check_dims(None) == ()
    for bad in ("64,abc", [0], [64, 64], [128, 64], [True]):
        with pytest.raises(ConfigError, match="matryoshka_dims"):
            check_dims(bad)
    cfg = BuildConfig(dense=DenseConfig(matryoshka_dims=[64, 128], mrl_trained=True))
    back = BuildConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and back.dense.matryoshka_dims == (64, 128)
    with pytest.raises(ConfigError, match="rotation_sample"):
        DenseConfig(rotation_sample=0)


def test_rotation_is_orthogonal_preserves_inner_products_and_orders_variance(vecs, queries):
    R, mean = fit_pca_rotation(vecs)
    assert R.dtype == np.float32 and R.shape == (D, D) and mean.shape == (D,)
    np.testing.assert_allclose(R.T @ R, np.eye(D), atol=1e-5)
    ip = queries @ vecs.T
    ip_rot = (queries @ R) @ (vecs @ R).T
    np.testing.assert_allclose(ip_rot, ip, atol=2e-6)
    var = (vecs @ R).var(axis=0)
    assert np.all(np.diff(var) <= 1e-6)  # prefixes carry the most variance
    assert var[:8].sum() > vecs.var(axis=0)[:8].sum()
    R2, _ = fit_pca_rotation(vecs)
    assert np.array_equal(R, R2)  # deterministic


def test_prefix_normalize_zero_rows_and_range():
    x = np.array([[0, 0, 1], [3, 4, 0]], np.float16)
    p = prefix_normalize(x, 2)
    assert p.dtype == np.float32 and np.array_equal(p[0], [0, 0])
    np.testing.assert_allclose(p[1], [0.6, 0.8], rtol=1e-6)
    with pytest.raises(ConfigError, match="prefix dim"):
        prefix_normalize(x, 4)


def test_storage_dtype_never_loses_values(tmp_path, caplog):
    big = np.array([[1e5, 1.0], [0.5, -2.0]], np.float32)
    with caplog.at_level(logging.WARNING):
        assert to_storage(big, "float16").dtype == np.float32
    assert "float16" in caplog.text
    assert to_storage(big / 1e5, "float16").dtype == np.float16
    assert to_storage(big, "float32").dtype == np.float32
    with pytest.raises(ConfigError, match="NaN"):
        to_storage(np.array([[np.nan]]), "float16")
    m = build_vector_index(["a", "b"], big, tmp_path / "i", dtype="float16")
    assert m["stats"]["dense_dtype"] == "float32"
    t = pa.ipc.open_file(pa.memory_map(str(tmp_path / "i/shards/00000/dense.arrow"))).read_all()
    assert t.column("vector").type.value_type == pa.float32()
    np.testing.assert_array_equal(np.stack(t.column("vector").to_numpy(zero_copy_only=False)), big)


def test_rotation_stored_as_arrow_and_listed(rot_index, vecs):
    m = rot_index.reader.manifest
    assert m["matryoshka"]["rotation"] == ROTATION_FILE and ROTATION_FILE in m["files"]
    assert m["build_config"]["dense"]["matryoshka_dims"] == [8, 16, 32, D]
    leg = rot_index.engine.legs["dense"]
    R = leg.rotation
    stored = np.concatenate([np.asarray(v, np.float32) for v in leg.vectors])
    np.testing.assert_allclose(stored, vecs @ R, atol=1e-6)
    t = pa.ipc.open_file(pa.memory_map(str(rot_index.reader.path / ROTATION_FILE))).read_all()
    assert set(t.column_names) == {"rotation", "mean", "dims"}


def test_full_dim_scores_unchanged_by_rotation(tmp_path, rot_index, vecs, queries):
    build_vector_index([f"d{i}" for i in range(len(vecs))], vecs, tmp_path / "plain", dtype="float32")
    plain = Retriever.open(tmp_path / "plain")
    assert plain.engine.legs["dense"].rotation is None
    a, b = search(plain, queries, 10), search(rot_index, queries, 10)
    np.testing.assert_allclose(a.scores, b.scores, atol=1e-5)
    assert recall_at_k(a.ids, b.ids, 10) > 0.99
    assert recall_at_k(a.ids, exact_top(vecs, queries, 10), 10) == 1.0


# ---------------------------------------------------------------- funnel search
def test_funnel_is_exact_when_shortlist_covers_shard(rot_index, queries):
    full = search(rot_index, queries, 10)
    for p in ({"dim": 8, "shortlist": 10_000}, {"dim": 16, "index": "HNSW8", "shortlist": 2000, "ef_search": 4000},
              {"dim": 16, "index": "IVF8,Flat", "nprobe": 8, "shortlist": 600}):
        got = search(rot_index, queries, 10, **p)
        np.testing.assert_array_equal(got.ids, full.ids)
        np.testing.assert_array_equal(got.scores, full.scores)


@pytest.mark.parametrize("index", [None, "Flat", "IVF16,Flat", "HNSW16", "PQ4", "IVF8,PQ4", "PCAR16,IVF8,Flat"])
def test_index_families_return_k_valid_hits(rot_index, queries, vecs, index):
    res = search(rot_index, queries, 10, dim=16, index=index, shortlist=100, nprobe=4)
    assert (res.n_found == 10).all() and (res.ids >= 0).all() and np.isfinite(res.scores).all()
    assert recall_at_k(res.ids, exact_top(vecs, queries, 10), 10) > 0.8
    # rescored scores are exact full-dimension inner products
    ref = np.take_along_axis(queries.astype(np.float64) @ vecs.astype(np.float64).T, res.ids, 1)
    np.testing.assert_allclose(res.scores, ref, atol=1e-5)


def test_prefix_recall_improves_with_dim_and_rescore_flag(rot_index, queries, vecs):
    truth = exact_top(vecs, queries, 10)
    r8 = recall_at_k(search(rot_index, queries, 10, dim=8, shortlist=20).ids, truth, 10)
    r32 = recall_at_k(search(rot_index, queries, 10, dim=32, shortlist=20).ids, truth, 10)
    assert r32 >= r8
    raw = search(rot_index, queries, 10, dim=8, rescore=False)
    assert (raw.scores <= 1.0 + 1e-5).all() and (raw.n_found == 10).all()


# ---------------------------------------------------------------- FAISS edge cases
def test_nprobe_above_nlist_is_capped(rot_index, queries):
    a = search(rot_index, queries, 10, dim=16, index="IVF8,Flat", nprobe=10_000, shortlist=50)
    b = search(rot_index, queries, 10, dim=16, index="IVF8,Flat", nprobe=8, shortlist=50)
    np.testing.assert_array_equal(a.ids, b.ids)


def test_ivf_with_too_few_training_points_falls_back_to_flat(rot_index, queries, caplog):
    with caplog.at_level(logging.WARNING):
        res = search(rot_index, queries, 10, dim=16, index="IVF1024,Flat", shortlist=10_000)
    assert "fewer than" in caplog.text
    np.testing.assert_array_equal(res.ids, search(rot_index, queries, 10).ids)


def test_k_larger_than_corpus_and_low_nprobe_still_complete(tmp_path, queries):
    x = anisotropic(30, seed=2)
    build_vector_index([f"d{i}" for i in range(30)], x, tmp_path / "s", dims=(8, D), shard_size=13)
    r = Retriever.open(tmp_path / "s")
    for p in ({}, {"dim": 8}, {"dim": 8, "index": "HNSW4"}, {"dim": 8, "index": "IVF2,Flat", "nprobe": 1}):
        res = search(r, queries, 100, **p)
        assert res.ids.shape == (37, 30) and (res.n_found == 30).all()
        assert all(sorted(row.tolist()) == list(range(30)) for row in res.ids)
        assert np.isfinite(res.scores).all()
    # IVF with nprobe=1 over 4 lists and k = all rows: rows the lists miss are completed exactly
    res = search(r, queries, 12, dim=8, index="IVF4,Flat", nprobe=1, shortlist=12)
    assert (res.n_found == 12).all() and (res.ids >= 0).all()


def test_empty_shard(tmp_path, queries):
    from retriever.index.writer import IndexWriter

    x = anisotropic(20, seed=3)
    with IndexWriter(tmp_path / "e") as w:
        w.write_shard(ids=[], titles=[], texts=[], metadata=[], dense=np.zeros((0, D), np.float16))
        w.write_shard(ids=[f"d{i}" for i in range(20)], titles=[""] * 20, texts=[""] * 20, metadata=[""] * 20,
                      dense=x.astype(np.float16))
        cfg = BuildConfig(legs=("dense",)).to_dict()
        w.commit(build_config=cfg, stats={"n_docs": 20, "dense_dim": D, "dense_dtype": "float16"})
    r = Retriever.open(tmp_path / "e")
    for p in ({}, {"dim": 8}, {"dim": 8, "index": "IVF2,Flat"}):
        res = search(r, queries, 5, **p)
        assert (res.n_found == 5).all() and (res.ids >= 0).all() and (res.ids < 20).all()


@pytest.mark.parametrize("params", [{}, {"dim": 8}, {"dim": 16, "index": "IVF8,Flat", "nprobe": 3},
                                    {"dim": 16, "index": "HNSW8", "ef_search": 50}, {"dim": 16, "batch_size": 5}])
def test_batch_and_single_queries_agree(rot_index, queries, params):
    batch = search(rot_index, queries, 10, **params)
    for i in (0, 7, 36):
        one = search(rot_index, queries[i:i + 1], 10, **params)
        np.testing.assert_array_equal(one.ids[0], batch.ids[i])
        np.testing.assert_array_equal(one.scores[0], batch.scores[i])
    again = search(rot_index, queries, 10, **{**params, "batch_size": 1})
    np.testing.assert_array_equal(again.ids, batch.ids)


def test_bad_params_raise_query_errors(rot_index, queries):
    with pytest.raises(QueryError, match="unknown dense leg_params"):
        search(rot_index, queries, 10, nprobes=3)
    with pytest.raises(QueryError, match="'dim' must be <= 48, got 49"):
        search(rot_index, queries, 10, dim=49)
    with pytest.raises(QueryError, match="'shortlist'"):
        search(rot_index, queries, 10, shortlist=0)
    with pytest.raises(QueryError, match="'rescore'"):
        search(rot_index, queries, 10, rescore="yes")
    with pytest.raises(ConfigError, match="factory"):
        search(rot_index, queries, 10, dim=8, index="NoSuchIndex")


def test_choose_prefix_dim(rot_index, queries):
    out = choose_prefix_dim(rot_index, queries, target_recall=0.95, k=10, shortlist=50)
    assert out["dim"] in (8, 16, 32, D)
    assert out["recall"][out["dim"]] >= 0.95
    assert all(v < 0.95 for d, v in out["recall"].items() if d < out["dim"])
    with pytest.raises(QueryError, match="target_recall"):
        choose_prefix_dim(rot_index, queries, target_recall=1.5)


# ---------------------------------------------------------------- end to end with the real encoder
def test_build_index_with_rotation_and_text_queries(tmp_path, small_corpus):
    docs = small_corpus[:40]
    cfg = BuildConfig(legs=("dense",), shard_size=25, dense=DenseConfig(matryoshka_dims=(32, 64, 384)))
    m = build_index(docs, tmp_path / "rot", cfg, show_progress=False)
    assert m["matryoshka"]["rotation"] == ROTATION_FILE and m["matryoshka"]["rotation_sample_rows"] == 25
    assert m["stats"]["dense_dtype"] == "float16" and list(m["build_config"]["dense"]["matryoshka_dims"]) == [32, 64, 384]
    r = Retriever.open(tmp_path / "rot")
    leg = r.engine.legs["dense"]
    texts = ["bone fracture vitamin", "heart"]
    res = r.search_arrays(texts, 10, mode="dense")
    qv = leg.encode(texts).astype(np.float64)  # model space
    stored = np.concatenate([np.asarray(v, np.float64) for v in leg.vectors])
    model_space = stored @ leg.rotation.astype(np.float64).T  # undo the document rotation
    ref = qv @ model_space.T
    np.testing.assert_allclose(res.scores, np.take_along_axis(ref, res.ids, 1), atol=1e-5)
    assert recall_at_k(res.ids, np.argsort(-ref, axis=1)[:, :10], 10) == 1.0
    res = r.search_arrays(["heart"], 5, mode="dense", leg_params={"dense": {"dim": 32}})
    assert (res.n_found == 5).all()


def test_mrl_trained_stores_no_rotation(tmp_path, vecs):
    m = build_vector_index([f"d{i}" for i in range(50)], vecs[:50], tmp_path / "m", dims=(16, D), mrl_trained=True)
    assert m["matryoshka"]["rotation"] is None and ROTATION_FILE not in m["files"]
    r = Retriever.open(tmp_path / "m")
    assert r.engine.legs["dense"].rotation is None
    stored = np.asarray(r.engine.legs["dense"].vectors[0], np.float32)
    np.testing.assert_array_equal(stored, vecs[:50].astype(np.float16).astype(np.float32))


def test_cli_rejects_bad_matryoshka_dims(tmp_path, capsys):
    from retriever.cli import main

    rc = main(["index", "build", "--corpus", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "o"),
               "--matryoshka-dims", "64,abc", "--no-progress"])
    assert rc == 1 and "matryoshka_dims" in capsys.readouterr().err


# ---------------------------------------------------------------- GPU parity
@pytest.mark.gpu
def test_cpu_gpu_parity(tmp_path):
    faiss = pytest.importorskip("faiss")
    if faiss.get_num_gpus() == 0:
        pytest.skip("no GPU")
    x = anisotropic(5000, seed=7)
    q = anisotropic(64, seed=8)
    build_vector_index([f"d{i}" for i in range(len(x))], x, tmp_path / "g", dims=(16, D))
    cpu = Retriever.open(tmp_path / "g", use_gpu=False)
    gpu = Retriever.open(tmp_path / "g", use_gpu=True)
    for p in ({}, {"dim": 16}, {"dim": 16, "index": "IVF32,Flat", "nprobe": 32}):
        a, b = search(cpu, q, 10, **p), search(gpu, q, 10, **p)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-4)
