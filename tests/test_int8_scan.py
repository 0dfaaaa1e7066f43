"""int8-quantised prefix scan (``scan_dtype="int8"``): the C++ kernel against an int64 numpy
oracle (every code path, thread counts, ties, padding), the quantiser, and the dense leg's funnel
search against a float64 brute-force oracle."""

from __future__ import annotations

import numpy as np
import pytest

from retriever.index.errors import ConfigError, QueryError
from retriever.index.matryoshka import build_vector_index
from retriever import Retriever, _kernels
from retriever.metrics import recall_at_k
from retriever.int8scan import BLOCK_DOCS, int8_scan, quantize_prefix, quantize_queries

IMPLS = ["portable"] + (["vnni"] if _kernels.int8_scan_has_vnni() else [])
D = 40


def oracle(q8: np.ndarray, codes_rows: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-kk by (int64 score desc, id asc) from unpacked (n, d) uint8 codes."""
    s = q8[:, : codes_rows.shape[1]].astype(np.int64) @ codes_rows.astype(np.int64).T
    ids = np.stack([np.lexsort((np.arange(s.shape[1]), -row))[:kk] for row in s])
    return np.take_along_axis(s, ids, 1), ids


def unpack(codes: np.ndarray, n: int) -> np.ndarray:
    """Packed (nb, d4, 64) codes -> (n, 4 * d4) rows (inverse of the kernel layout)."""
    nb, d4, _ = codes.shape
    return codes.reshape(nb, d4, BLOCK_DOCS, 4).transpose(0, 2, 1, 3).reshape(nb * BLOCK_DOCS, d4 * 4)[:n]


def random_case(rng, n: int, d: int, nq: int):
    codes = rng.integers(0, 256, (n, d), dtype=np.uint8)
    d4 = (d + 3) // 4
    rows = np.full((-(-n // BLOCK_DOCS)) * BLOCK_DOCS, 0, np.uint8)
    flat = np.full((len(rows), d4 * 4), 128, np.uint8)
    flat[:n, :d] = codes
    packed = np.ascontiguousarray(flat.reshape(-1, BLOCK_DOCS, d4, 4).transpose(0, 2, 1, 3)).reshape(-1, d4, 64)
    q8 = np.zeros((nq, d4 * 4), np.int8)
    q8[:, :d] = rng.integers(-127, 128, (nq, d), dtype=np.int8)
    return codes, packed, q8


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n,d,nq,kk", [(1, 1, 1, 1), (15, 5, 3, 15), (17, 8, 9, 4), (100, 13, 20, 37),
                                       (333, 64, 70, 100), (97, 130, 8, 97),
                                       # reservoirs around the VNNI rank-select limit (160 keys)
                                       (2000, 16, 9, 72), (2000, 16, 9, 73), (2000, 8, 9, 30)])
def test_kernel_matches_int64_oracle(impl, n, d, nq, kk):
    rng = np.random.default_rng(n * 1000 + d)
    codes, packed, q8 = random_case(rng, n, d, nq)
    want_s, want_i = oracle(q8, codes, kk)
    for threads in (1, 2, 3):
        s, i = _kernels.int8_scan_topk(q8, packed, n, kk, threads, impl)
        np.testing.assert_array_equal(i, want_i)
        np.testing.assert_array_equal(s, want_s)


@pytest.mark.parametrize("impl", IMPLS)
def test_kernel_ties_go_to_smaller_id_and_padding_never_returned(impl):
    # 40 identical documents (all ties) and zero queries (every score equal): ids ascending
    packed = np.full((3, 2, 64), 200, np.uint8)
    q8 = np.zeros((5, 8), np.int8)
    q8[1] = 3
    s, i = _kernels.int8_scan_topk(q8, packed, 40, 40, 1, impl)
    np.testing.assert_array_equal(i, np.tile(np.arange(40), (5, 1)))
    assert (s[1] == 200 * 3 * 8).all() and (s[0] == 0).all()


def test_kernel_paths_agree_on_large_shortlists():
    rng = np.random.default_rng(1)
    codes, packed, q8 = random_case(rng, 5000, 24, 67)  # many reservoir compactions
    a = _kernels.int8_scan_topk(q8, packed, 5000, 700, 2, "portable")
    b = _kernels.int8_scan_topk(q8, packed, 5000, 700, 1, "auto")
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], oracle(q8, codes, 700)[1])


def test_kernel_boundary_errors():
    packed = np.full((2, 2, 64), 128, np.uint8)
    q8 = np.zeros((3, 8), np.int8)
    with pytest.raises(ValueError, match="kk must be in"):
        _kernels.int8_scan_topk(q8, packed, 20, 21)
    with pytest.raises(ValueError, match="kk must be in"):
        _kernels.int8_scan_topk(q8, packed, 20, 0)
    with pytest.raises(ValueError, match="codes.shape\\[0\\]"):
        _kernels.int8_scan_topk(q8, packed, 40, 5)
    with pytest.raises(ValueError, match="queries.shape\\[1\\]"):
        _kernels.int8_scan_topk(np.zeros((3, 4), np.int8), packed, 20, 5)
    with pytest.raises(ValueError, match="codes must have shape"):
        _kernels.int8_scan_topk(q8, np.zeros((2, 2, 32), np.uint8), 20, 5)
    with pytest.raises(ValueError, match="n must be in"):
        _kernels.int8_scan_topk(q8, packed, 0, 1)
    with pytest.raises(ValueError, match="impl must be"):
        _kernels.int8_scan_topk(q8, packed, 20, 5, 1, "avx")
    with pytest.raises(TypeError):
        _kernels.int8_scan_topk(q8.astype(np.int16), packed, 20, 5)
    with pytest.raises(TypeError):
        _kernels.int8_scan_topk(q8[:, ::2], packed, 20, 5)


def test_quantize_prefix_layout_and_queries():
    rng = np.random.default_rng(2)
    p = rng.standard_normal((37, 10)).astype(np.float32)
    p[:, 3] = 0.0  # an all-zero column gets scale 0 and code 0
    pref = quantize_prefix(p)
    assert pref.codes.shape == (3, 3, 64) and pref.codes.dtype == np.uint8 and pref.n == 37 and pref.dim == 10
    assert pref.scale[3] == 0.0
    np.testing.assert_allclose(pref.scale, np.abs(p).max(0) / 127, rtol=1e-6)
    rows = unpack(pref.codes, 37).astype(np.int64) - 128
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.clip(np.rint(p / pref.scale), -127, 127)
    want[:, 3] = 0
    np.testing.assert_array_equal(rows[:, :10], want)
    assert (rows[:, 10:] == 0).all() and np.abs(rows).max() <= 127
    q = rng.standard_normal((6, 10)).astype(np.float32)
    q8, a = quantize_queries(q, pref.scale)
    assert q8.shape == (6, 12) and (q8[:, 10:] == 0).all() and (np.abs(q8).max(1) == 127).all()
    one, a1 = quantize_queries(q[2:3], pref.scale)  # a row depends only on its query
    np.testing.assert_array_equal(one[0], q8[2])
    assert a1[0] == a[2]
    # de-quantised scores approximate the float inner products
    approx = a[:, None] * (q8[:, :10].astype(np.int64) @ rows[:, :10].T)
    np.testing.assert_allclose(approx, q @ p.T, atol=0.05 * np.abs(q @ p.T).max())
    with pytest.raises(ConfigError, match="shape"):
        quantize_prefix(np.zeros((0, 4), np.float32))
    with pytest.raises(ConfigError, match="NaN"):
        quantize_prefix(np.full((2, 2), np.nan, np.float32))
    with pytest.raises(QueryError, match="kk must be in"):
        int8_scan(pref, q, 38, 1)
    with pytest.raises(QueryError, match="shape"):
        int8_scan(pref, q[:, :9], 5, 1)


# ---------------------------------------------------------------- the dense leg
def anisotropic(n: int, d: int = D, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((d, d)))
    x = rng.standard_normal((n, d)) * (1.0 / np.arange(1, d + 1) ** 0.8) @ basis.T + 0.3 * basis[:, 0]
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def vecs() -> np.ndarray:
    return anisotropic(900)


@pytest.fixture(scope="module")
def queries(vecs) -> np.ndarray:
    rng = np.random.default_rng(7)
    q = vecs[rng.choice(len(vecs), 29, replace=False)] + 0.05 * rng.standard_normal((29, D)).astype(np.float32)
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def idx(tmp_path_factory, vecs) -> Retriever:
    out = tmp_path_factory.mktemp("i8") / "idx"
    build_vector_index([f"d{i}" for i in range(len(vecs))], vecs, out, dims=(8, 16, D), shard_size=400,
                       dtype="float16")
    return Retriever.open(out)


def search(r: Retriever, q: np.ndarray, k: int, **params):
    return r.search_arrays(["q"] * len(q), k, mode="dense", query_vectors=q, leg_params={"dense": params})


def float64_oracle(r: Retriever, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k over the stored (float16) vectors in float64, ties by ordinal."""
    leg = r.engine.legs["dense"]
    x = np.concatenate([np.asarray(v, np.float64) for v in leg.vectors])
    s = leg.rotate(q).astype(np.float64) @ x.T
    ids = np.stack([np.lexsort((np.arange(len(x)), -row))[:k] for row in s])
    return ids, np.take_along_axis(s, ids, 1)


def test_int8_funnel_exact_when_shortlist_covers_shards(idx, queries):
    want_ids, want_scores = float64_oracle(idx, queries, 10)
    full = search(idx, queries, 10)
    for dim in (8, 16, D):
        got = search(idx, queries, 10, dim=dim, scan_dtype="int8", shortlist=400)
        np.testing.assert_array_equal(got.ids, full.ids)
        np.testing.assert_array_equal(got.scores, full.scores)
        np.testing.assert_array_equal(got.ids, want_ids)
        np.testing.assert_allclose(got.scores, want_scores, atol=1e-6)


def test_int8_funnel_recall_and_rescored_scores(idx, queries):
    want_ids, _ = float64_oracle(idx, queries, 10)
    f32 = search(idx, queries, 10, dim=16, shortlist=60)
    i8 = search(idx, queries, 10, dim=16, shortlist=60, scan_dtype="int8")
    r32, r8 = recall_at_k(f32.ids, want_ids, 10), recall_at_k(i8.ids, want_ids, 10)
    assert r8 >= 0.95 and r8 >= r32 - 0.03
    leg = idx.engine.legs["dense"]
    x = np.concatenate([np.asarray(v, np.float64) for v in leg.vectors])
    ref = np.take_along_axis(leg.rotate(queries).astype(np.float64) @ x.T, i8.ids, 1)
    np.testing.assert_allclose(i8.scores, ref, atol=1e-6)


def test_int8_funnel_batch_single_and_threads_agree(idx, queries):
    leg = idx.engine.legs["dense"]
    batch = search(idx, queries, 10, dim=8, shortlist=30, scan_dtype="int8")
    for i in (0, 5, 28):
        one = search(idx, queries[i:i + 1], 10, dim=8, shortlist=30, scan_dtype="int8")
        np.testing.assert_array_equal(one.ids[0], batch.ids[i])
        np.testing.assert_array_equal(one.scores[0], batch.scores[i])
    from retriever.legs.base import SearchContext
    from retriever.params import DenseSearchParams

    prep = leg.prepare_vectors(queries, DenseSearchParams(dim=8, shortlist=30, scan_dtype="int8"))
    parts = [[leg.search_shard(prep, s, SearchContext(10, t)) for s in range(leg.n_shards)] for t in (1, 2, 4)]
    for p in parts[1:]:
        for (a_ids, a_s, a_n), (b_ids, b_s, b_n) in zip(parts[0], p):
            np.testing.assert_array_equal(a_ids, b_ids)
            np.testing.assert_array_equal(a_s, b_s)
            np.testing.assert_array_equal(a_n, b_n)


def test_int8_funnel_unrescored_scores_approximate_prefix_cosines(idx, queries):
    from retriever.index.matryoshka import prefix_normalize

    raw = search(idx, queries, 10, dim=16, scan_dtype="int8", rescore=False)
    assert (raw.n_found == 10).all() and np.isfinite(raw.scores).all()
    leg = idx.engine.legs["dense"]
    x = np.concatenate([np.asarray(v, np.float32) for v in leg.vectors])
    ref = np.take_along_axis(prefix_normalize(leg.rotate(queries), 16).astype(np.float64)
                             @ prefix_normalize(x, 16).astype(np.float64).T, raw.ids, 1)
    np.testing.assert_allclose(raw.scores, ref, atol=0.03)


def test_int8_k_above_corpus_and_empty_shard(tmp_path, queries):
    from retriever.index.config import BuildConfig
    from retriever.index.writer import IndexWriter

    x = anisotropic(21, seed=3)
    with IndexWriter(tmp_path / "e") as w:
        w.write_shard(ids=[], titles=[], texts=[], metadata=[], dense=np.zeros((0, D), np.float16))
        w.write_shard(ids=[f"d{i}" for i in range(21)], titles=[""] * 21, texts=[""] * 21, metadata=[""] * 21,
                      dense=x.astype(np.float16))
        w.commit(build_config=BuildConfig(legs=("dense",)).to_dict(),
                 stats={"n_docs": 21, "dense_dim": D, "dense_dtype": "float16"})
    r = Retriever.open(tmp_path / "e")
    res = search(r, queries, 50, dim=8, scan_dtype="int8")
    assert res.ids.shape == (len(queries), 21) and (res.n_found == 21).all()
    assert all(sorted(row.tolist()) == list(range(21)) for row in res.ids)
    exact = search(r, queries, 50)
    np.testing.assert_array_equal(res.ids, exact.ids)
    np.testing.assert_array_equal(res.scores, exact.scores)
    empty = search(r, queries[:0], 5, dim=8, scan_dtype="int8")
    assert empty.ids.shape[0] == 0


def test_int8_bad_params(idx, queries):
    with pytest.raises(QueryError, match="'scan_dtype' must be one of float32, int8, got 'int4'"):
        search(idx, queries, 10, dim=8, scan_dtype="int4")
    with pytest.raises(QueryError, match="needs index 'Flat'"):
        search(idx, queries, 10, dim=8, scan_dtype="int8", index="IVF4,Flat")


def test_choose_prefix_dim_passes_scan_dtype(idx, queries):
    from retriever.funnel import choose_prefix_dim

    got = choose_prefix_dim(idx, queries, target_recall=1.0, dims=(8, 16, D), shortlist=400, scan_dtype="int8")
    # a shortlist covering every shard makes the first dim exact
    assert got["dim"] == 8 and got["recall"] == {8: 1.0}


def test_overflowing_query_vectors_are_rejected(idx, queries):
    """Finite vectors whose inner products overflow float32 are a QueryError on every dense path
    (they used to give NaN scores, arbitrary ids, or -1 ids), not garbage results."""
    from retriever.index.errors import QueryError

    q = np.full((1, D), 3e38, np.float32)
    q[0, ::2] = -1.5e38
    for lp in ({}, {"dim": 16, "shortlist": 50}, {"dim": 16, "shortlist": 50, "scan_dtype": "int8"}):
        with pytest.raises(QueryError, match="overflow float32"):
            idx.search_arrays(["q"], k=5, mode="dense", query_vectors=q, leg_params={"dense": lp})
    ok = idx.search_arrays(["q"], k=5, mode="dense", query_vectors=queries[:1] * 1e15)
    assert ok.n_found[0] == 5 and np.isfinite(ok.scores[0]).all()
