"""Allow masks (filters and deletes) inside the dense and learned-sparse legs, every algorithm.

Oracles: brute force over the passing documents only: for the sparse leg the forward-index scores
(:func:`retriever.legs.sparse.forward_scores`, the kernels' summation order, checked here against a
float64 sum too), for the dense leg numpy inner products over the stored vectors. Exact modes must
return the oracle's top-k (ids and scores); approximate modes recall@10 >= 0.95 against it; every
mode returns min(k, passing matches) hits and never a masked document.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import random_corpus
from retriever import QueryError, Retriever, build_index
from retriever.index.config import DenseConfig
from retriever.legs.base import SearchContext
from retriever.legs.sparse import forward_scores
from retriever.fusion import RRF
from retriever.params import parse_leg_params

SELECTIVITIES = (0.001, 0.01, 0.1, 0.5, 1.0)
N_DOCS = 3000
DIM = 16
VOCAB = 300


def _sparse_docs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR document vectors over VOCAB terms, Zipf-like term popularity."""
    pop = 1.0 / np.arange(1, VOCAB + 1) ** 0.8
    pop /= pop.sum()
    terms = [np.unique(rng.choice(VOCAB, rng.integers(3, 30), p=pop)) for _ in range(n)]
    ptr = np.zeros(n + 1, np.int64)
    ptr[1:] = np.cumsum([len(t) for t in terms])
    return ptr, np.concatenate(terms).astype(np.uint32), (rng.random(int(ptr[-1])) + 0.05).astype(np.float32)


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """A 3-shard index with dense (unit, float32) and sparse vectors, plus queries of both kinds."""
    rng = np.random.default_rng(22)
    docs = random_corpus(N_DOCS, seed=22, min_len=1)
    centers = rng.standard_normal((20, DIM))
    dv = centers[rng.integers(0, 20, N_DOCS)] + 0.6 * rng.standard_normal((N_DOCS, DIM))
    dv = (dv / np.linalg.norm(dv, axis=1, keepdims=True)).astype(np.float32)
    out = tmp_path_factory.mktemp("filterlegs") / "ix"
    build_index(docs, out, legs=("dense", "sparse"), dense_vectors=dv, shard_size=1100, show_progress=False,
                sparse_vectors=_sparse_docs(rng, N_DOCS), dense=DenseConfig(dtype="float32"))
    nq = 24
    qv = centers[rng.integers(0, 20, nq + 4)] + 0.6 * rng.standard_normal((nq + 4, DIM))
    qv = (qv / np.linalg.norm(qv, axis=1, keepdims=True)).astype(np.float32)
    qsv = []
    for _ in range(nq):
        t = np.unique(rng.integers(0, VOCAB, rng.integers(2, 12))).astype(np.uint32)
        qsv.append((t, (rng.random(len(t)) + 0.1).astype(np.float32)))
    for _ in range(4):  # long queries over popular terms: the exact kernel's dense path in these shards
        t = np.unique(rng.integers(0, 80, 60)).astype(np.uint32)
        qsv.append((t, (rng.random(len(t)) + 0.1).astype(np.float32)))
    return Retriever.open(out, n_threads=1), qv, qsv


def _masks(r: Retriever, fraction: float, seed: int) -> list[np.ndarray]:
    """Per shard a random uint8 mask passing about ``fraction`` of the rows (at least one row
    index-wide, so 0.1 % of a small index still passes something)."""
    rng = np.random.default_rng(seed)
    out = [(rng.random(s.rows) < fraction).astype(np.uint8) for s in r.reader.shards]
    if not any(m.any() for m in out):
        out[0][rng.integers(0, len(out[0]))] = 1
    return out


def _sparse_oracle(r: Retriever, qsv, masks, k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per query the top-k (ids, scores) over passing documents with score > 0: forward-index
    scores of every passing document, sorted by score descending then global ordinal."""
    leg = r.engine.legs["sparse"]
    batch = leg.check_vectors(qsv)
    nq = len(qsv)
    all_ids, all_scores = [[] for _ in range(nq)], [[] for _ in range(nq)]
    for si, (s, a) in enumerate(leg.shards):
        rows = np.flatnonzero(masks[si]).astype(np.int64)
        offs = np.arange(nq + 1, dtype=np.int64) * len(rows)
        sc = forward_scores(a["fwd_offsets"], a["fwd_terms"], a["fwd_values"], leg.scale, leg.vocab_size,
                            *batch, offs, np.tile(rows, nq), s.rows)
        for q in range(nq):
            all_ids[q].append(rows + s.base)
            all_scores[q].append(sc[q * len(rows):(q + 1) * len(rows)])
    ids_out, scores_out = [], []
    for q in range(nq):
        ids, sc = np.concatenate(all_ids[q]), np.concatenate(all_scores[q])
        keep = sc > 0
        ids, sc = ids[keep], sc[keep]
        order = np.lexsort((ids, -sc.astype(np.float64)))[:k]
        ids_out.append(ids[order])
        scores_out.append(sc[order])
    return ids_out, scores_out


def _search(r: Retriever, mode: str, k: int, masks, *, qv=None, qsv=None, params=None, threads: int = 1):
    """The engine's search with an allow mask (what ``filter=`` compiles to), one call."""
    p = parse_leg_params(params)
    prepared = {}
    if qv is not None:
        prepared["dense"] = r.engine.legs["dense"].prepare_vectors(qv, p.get("dense"), threads)
    if qsv is not None:
        prepared["sparse"] = r.engine.legs["sparse"].prepare_vectors(qsv, p.get("sparse"), threads)
    n = len(qv) if qv is not None else len(qsv)
    return r.engine.search(["q"] * n, k=k, mode=mode, fusion=RRF(), depth=max(k, 100), n_threads=threads,
                           prepared=prepared, params=p, allow=masks)


def _allowed(masks, r: Retriever) -> np.ndarray:
    return np.concatenate(masks).astype(bool)


def _check_no_masked(res, masks, r):
    allowed = _allowed(masks, r)
    for q in range(res.ids.shape[0]):
        got = res.ids[q, :res.n_found[q]]
        assert (got >= 0).all() and allowed[got].all(), "a masked document was returned"


def _recall(got_ids, n_found, want_ids) -> float:
    hits = total = 0
    for q, w in enumerate(want_ids):
        if len(w) == 0:
            continue
        hits += len(np.intersect1d(got_ids[q, :n_found[q]], w))
        total += len(w)
    return hits / total if total else 1.0


def test_forward_scores_oracle_is_the_formula(collection):
    """The sparse oracle's float32 scores equal a float64 inner product over the forward index up
    to float32 rounding (so the oracle is the formula, not the kernel)."""
    r, _, qsv = collection
    leg = r.engine.legs["sparse"]
    s, a = leg.shards[0]
    batch = leg.check_vectors(qsv[:3])
    rows = np.arange(s.rows, dtype=np.int64)
    got = forward_scores(a["fwd_offsets"], a["fwd_terms"], a["fwd_values"], leg.scale, leg.vocab_size, *batch,
                         np.arange(4, dtype=np.int64) * s.rows, np.tile(rows, 3), s.rows)
    fo = a["fwd_offsets"].astype(np.int64)
    for q in range(3):
        qd = np.zeros(leg.vocab_size)
        qd[batch[1][batch[0][q]:batch[0][q + 1]]] = batch[2][batch[0][q]:batch[0][q + 1]]
        want = np.array([leg.scale * float(qd[a["fwd_terms"][fo[d]:fo[d + 1]]] @ a["fwd_values"][fo[d]:fo[d + 1]])
                         for d in range(s.rows)])
        np.testing.assert_allclose(got[q * s.rows:(q + 1) * s.rows], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fraction", SELECTIVITIES)
@pytest.mark.parametrize("k", [1, 10, 100])
def test_sparse_exact_equals_brute_force(collection, fraction, k):
    """Exact sparse search with an allow mask returns exactly the oracle's top-k: ids and scores
    bit for bit, min(k, passing matches) of them, none masked."""
    r, _, qsv = collection
    masks = _masks(r, fraction, seed=int(fraction * 1000) + k)
    want_ids, want_scores = _sparse_oracle(r, qsv, masks, k)
    res = _search(r, "sparse", k, masks, qsv=qsv)
    _check_no_masked(res, masks, r)
    for q in range(len(qsv)):
        n = res.n_found[q]
        assert n == len(want_ids[q])
        np.testing.assert_array_equal(res.ids[q, :n], want_ids[q])
        np.testing.assert_array_equal(res.scores[q, :n].view(np.uint32), want_scores[q].view(np.uint32))


@pytest.mark.parametrize("fraction", SELECTIVITIES)
def test_sparse_seismic_recall_and_k(collection, fraction):
    """Seismic with an allow mask: recall@10 >= 0.95 against the exact filtered top-10, k met
    whenever k passing documents match, no masked document; below the planner's threshold it is
    the exact result."""
    r, _, qsv = collection
    masks = _masks(r, fraction, seed=7)
    want_ids, _ = _sparse_oracle(r, qsv, masks, 10)
    res = _search(r, "sparse", 10, masks, qsv=qsv, params={"sparse": {"algorithm": "seismic"}})
    _check_no_masked(res, masks, r)
    assert [int(n) for n in res.n_found] == [len(w) for w in want_ids]
    assert _recall(res.ids, res.n_found, want_ids) >= 0.95
    never = _search(r, "sparse", 10, masks, qsv=qsv,
                    params={"sparse": {"algorithm": "seismic", "filter_exact_below": 0.0}})
    _check_no_masked(never, masks, r)
    assert [int(n) for n in never.n_found] == [len(w) for w in want_ids]  # the exact re-run of short queries


def test_sparse_bad_masks_name_the_shard(collection):
    r, _, qsv = collection
    leg = r.engine.legs["sparse"]
    prep = leg.prepare_vectors(qsv[:2])
    rows = r.reader.shards[0].rows
    name = f"0 \\({r.reader.shards[0].dir.name}\\)"
    for bad, what in ((np.ones(rows - 1, np.uint8), f"shape \\({rows - 1},\\)"),
                      (np.ones(rows, bool), "dtype bool"), (np.ones(rows, np.int64), "dtype int64"),
                      (np.ones((rows, 1), np.uint8), "shape"), ([1] * rows, "list")):
        ctx = SearchContext(depth=5, n_threads=1, allow=[bad] + [None] * (leg.n_shards - 1))
        with pytest.raises(QueryError, match=f"allow mask of shard {name}: expected a uint8 array of the "
                                             f"shard's {rows} rows, got .*{what}"):
            leg.search_shard(prep, 0, ctx)


def test_sparse_kernel_checks_the_mask_length(collection):
    """The kernels check the mask at their boundary too (a caller that bypasses the leg)."""
    from retriever import _kernels

    r, _, qsv = collection
    leg = r.engine.legs["sparse"]
    s, a = leg.shards[0]
    batch = leg.check_vectors(qsv[:2])
    with pytest.raises(ValueError, match=f"len\\(allow\\) = {s.rows + 1} must equal the shard's documents"):
        _kernels.sparse_exact_topk(a["offsets"], a["doc_ids"], a["impacts"], a["fwd_offsets"], a["fwd_terms"],
                                   a["fwd_values"], leg.scale, *batch, 5, allow=np.ones(s.rows + 1, np.uint8))
    with pytest.raises(TypeError):
        _kernels.sparse_exact_topk(a["offsets"], a["doc_ids"], a["impacts"], a["fwd_offsets"], a["fwd_terms"],
                                   a["fwd_values"], leg.scale, *batch, 5, allow=np.ones(s.rows, bool))


SPARSE_PLANS = ("auto", "postings", "sentinel", "passing")


def _shard_oracle(leg, si: int, batch, allow: np.ndarray | None, k: int) -> tuple[list, list]:
    """Per query of ``batch`` the top-k (shard-local ids, float32 scores) of shard ``si``'s passing
    documents with score > 0, by forward-index scores (score descending, then id)."""
    s, a = leg.shards[si]
    nq = len(batch[0]) - 1
    rows = np.flatnonzero(allow).astype(np.int64) if allow is not None else np.arange(s.rows, dtype=np.int64)
    sc = forward_scores(a["fwd_offsets"], a["fwd_terms"], a["fwd_values"], leg.scale, leg.vocab_size, *batch,
                        np.arange(nq + 1, dtype=np.int64) * len(rows), np.tile(rows, nq), s.rows)
    ids_out, sc_out = [], []
    for q in range(nq):
        x = sc[q * len(rows):(q + 1) * len(rows)]
        keep = x > 0
        order = np.lexsort((rows[keep], -x[keep].astype(np.float64)))[:k]
        ids_out.append(rows[keep][order])
        sc_out.append(x[keep][order])
    return ids_out, sc_out


def _exact_kernel(leg, si: int, batch, k: int, allow, plan: str = "auto", threads: int = 1):
    from retriever import _kernels

    _, a = leg.shards[si]
    return _kernels.sparse_exact_topk(a["offsets"], a["doc_ids"], a["impacts"], a["fwd_offsets"], a["fwd_terms"],
                                      a["fwd_values"], leg.scale, *batch, k, n_threads=threads, allow=allow,
                                      filter_plan=plan)


def _assert_oracle(res, want) -> None:
    ids, scores, n_found = res
    for q, (w_ids, w_sc) in enumerate(zip(*want)):
        n = int(n_found[q])
        assert n == len(w_ids), (q, n, len(w_ids))
        np.testing.assert_array_equal(ids[q, :n], w_ids)
        np.testing.assert_array_equal(scores[q, :n].view(np.uint32), w_sc.view(np.uint32))


@pytest.mark.parametrize("fraction", SELECTIVITIES)
@pytest.mark.parametrize("k", [1, 10, 100])
@pytest.mark.parametrize("threads", [1, 2])
def test_sparse_exact_filter_plans_equal_brute_force(collection, fraction, k, threads):
    """Every ``filter_plan`` of ``sparse_exact_topk`` (the per-posting mask test, the -inf
    sentinel accumulator, scoring the passing documents, and the automatic choice) returns the
    brute-force top-k over the passing documents: ids and float32 scores bit for bit, so the plans
    are interchangeable. Covers the score-at-a-time walk and the dense path (the collection's long
    queries), in every shard."""
    r, _, qsv = collection
    leg = r.engine.legs["sparse"]
    batch = leg.check_vectors(qsv)
    masks = _masks(r, fraction, seed=int(fraction * 1000) + 31 * k)
    for si in range(leg.n_shards):
        want = _shard_oracle(leg, si, batch, masks[si], k)
        for plan in SPARSE_PLANS:
            _assert_oracle(_exact_kernel(leg, si, batch, k, masks[si], plan, threads), want)


def test_sparse_sentinel_plan_leaves_the_scratch_clean(collection):
    """The sentinel plan presets masked accumulator entries to -inf in scratch reused by later
    calls: unfiltered and other-mask calls after it, on the same thread, still equal brute force."""
    r, _, qsv = collection
    leg = r.engine.legs["sparse"]
    batch = leg.check_vectors(qsv)
    m1, m2 = _masks(r, 0.5, seed=3), _masks(r, 0.3, seed=4)
    for si in range(leg.n_shards):
        for first in (batch,):
            _exact_kernel(leg, si, first, 10, m1[si], "sentinel")
            _assert_oracle(_exact_kernel(leg, si, batch, 10, None), _shard_oracle(leg, si, batch, None, 10))
            _exact_kernel(leg, si, first, 10, m1[si], "sentinel")
            _assert_oracle(_exact_kernel(leg, si, batch, 10, m2[si], "postings"),
                           _shard_oracle(leg, si, batch, m2[si], 10))
            _exact_kernel(leg, si, first, 10, m1[si], "sentinel")
            _assert_oracle(_exact_kernel(leg, si, batch, 10, m2[si], "sentinel"),
                           _shard_oracle(leg, si, batch, m2[si], 10))


def test_sparse_filter_plan_without_allow_and_bad_names(collection):
    """Without a mask every plan is the unfiltered search; an unknown plan is a ValueError naming
    it and the valid ones."""
    r, _, qsv = collection
    leg = r.engine.legs["sparse"]
    batch = leg.check_vectors(qsv[:6])
    want = _shard_oracle(leg, 0, batch, None, 10)
    for plan in SPARSE_PLANS:
        _assert_oracle(_exact_kernel(leg, 0, batch, 10, None, plan), want)
    allow = np.ones(leg.shards[0][0].rows, np.uint8)
    with pytest.raises(ValueError, match="filter_plan must be one of 'auto', 'postings', 'sentinel', 'passing'; "
                                         "got 'fast'"):
        _exact_kernel(leg, 0, batch, 10, allow, "fast")


# ---------------------------------------------------------------- dense

def _dense_oracle(r: Retriever, qv: np.ndarray, masks, k: int, dim: int | None = None
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per query the top-k (ids, float64 scores) over passing documents: numpy inner products of
    the stored vectors (re-normalised ``dim``-prefixes of both sides when ``dim`` is given)."""
    leg = r.engine.legs["dense"]
    vec = np.concatenate([v.astype(np.float64) for v in leg.vectors])
    q = leg.rotate(qv).astype(np.float64)
    if dim is not None:
        vec = vec[:, :dim] / np.linalg.norm(vec[:, :dim], axis=1, keepdims=True)
        q = q[:, :dim] / np.linalg.norm(q[:, :dim], axis=1, keepdims=True)
    rows = np.flatnonzero(np.concatenate(masks))
    sc = q @ vec[rows].T
    ids_out, scores_out = [], []
    for i in range(len(q)):
        order = np.lexsort((rows, -sc[i]))[:k]
        ids_out.append(rows[order])
        scores_out.append(sc[i, order])
    return ids_out, scores_out


#: dense algorithms whose filtered result must equal the oracle exactly (ids and scores):
#: (leg params, prefix dim of the oracle's scores or None for full dimension)
DENSE_EXACT = {
    "flat": ({}, None),
    "exhaustive": ({"exhaustive": True}, None),
    "prefix-scan": ({"dim": 8, "rescore": False}, 8),
    "flat-index": ({"index": "Flat"}, None),
}
#: approximate dense algorithms (recall@10 >= 0.95 against the exact filtered top-10)
DENSE_APPROX = {
    "funnel": {"dim": 8},
    "funnel-int8": {"dim": 8, "scan_dtype": "int8"},
    "int8-full": {"scan_dtype": "int8"},
    "ivf": {"index": "IVF16,Flat", "nprobe": 2},
    "ivf-no-rescore": {"index": "IVF16,Flat", "nprobe": 2, "rescore": False},
    "hnsw": {"index": "HNSW16"},
    "pq": {"index": "PQ4"},
    "ivfpq": {"index": "IVF16,PQ4", "nprobe": 2},
    "ivf-prefix": {"index": "IVF16,Flat", "dim": 8, "nprobe": 4},
}


@pytest.mark.parametrize("fraction", SELECTIVITIES + (0.99,))  # 0.99: the kernels' own mask path (deletes)
@pytest.mark.parametrize("algo", list(DENSE_EXACT))
def test_dense_exact_equals_brute_force(collection, algo, fraction):
    r, qv, _ = collection
    params, dim = DENSE_EXACT[algo]
    for k in (1, 10, 100):
        masks = _masks(r, fraction, seed=int(fraction * 1000) + k)
        want_ids, want_scores = _dense_oracle(r, qv, masks, k, dim)
        res = _search(r, "dense", k, masks, qv=qv, params={"dense": params})
        _check_no_masked(res, masks, r)
        for q in range(len(qv)):
            n = res.n_found[q]
            assert n == len(want_ids[q]) == min(k, int(sum(m.sum() for m in masks)))
            np.testing.assert_array_equal(res.ids[q, :n], want_ids[q])
            np.testing.assert_allclose(res.scores[q, :n], want_scores[q], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fraction", SELECTIVITIES)
@pytest.mark.parametrize("algo", list(DENSE_APPROX))
def test_dense_approximate_recall_and_k(collection, algo, fraction):
    """Every approximate dense algorithm with a mask: recall@10 >= 0.95 against the exact filtered
    top-10 at every selectivity, exactly min(10, passing) hits, none masked, whether the planner
    scans the passing documents (default threshold) or never does (threshold 0)."""
    r, qv, _ = collection
    masks = _masks(r, fraction, seed=3)
    n_pass = int(sum(m.sum() for m in masks))
    want_ids, _ = _dense_oracle(r, qv, masks, 10)
    for threshold in (None, 0.0):
        params = dict(DENSE_APPROX[algo])
        if threshold is not None:
            params["filter_exact_below"] = threshold
        res = _search(r, "dense", 10, masks, qv=qv, params={"dense": params})
        _check_no_masked(res, masks, r)
        assert (res.n_found == min(10, n_pass)).all(), (algo, threshold, res.n_found)
        assert _recall(res.ids, res.n_found, want_ids) >= 0.95, (algo, threshold)


def test_dense_own_ivf_structure(tmp_path):
    """An index built with an IVF structure searches it at full dimension with the mask through
    FAISS's IDSelector: recall@10 >= 0.95, k met, nothing masked, at every selectivity."""
    rng = np.random.default_rng(5)
    n = 2000
    centers = rng.standard_normal((16, DIM))
    dv = centers[rng.integers(0, 16, n)] + 0.5 * rng.standard_normal((n, DIM))
    dv = (dv / np.linalg.norm(dv, axis=1, keepdims=True)).astype(np.float32)
    build_index(random_corpus(n, seed=5, min_len=1), tmp_path / "ivf", legs=("dense",), dense_vectors=dv,
                shard_size=1000, show_progress=False, dense=DenseConfig(dtype="float32", faiss_factory="IVF16,Flat"))
    r = Retriever.open(tmp_path / "ivf", n_threads=1)
    qv = dv[rng.integers(0, n, 20)] + 0.1 * rng.standard_normal((20, DIM)).astype(np.float32)
    for fraction in SELECTIVITIES:
        masks = _masks(r, fraction, seed=11)
        n_pass = int(sum(m.sum() for m in masks))
        want_ids, _ = _dense_oracle(r, qv, masks, 10)
        for params in ({"nprobe": 2}, {"nprobe": 2, "filter_exact_below": 0.0}):
            res = _search(r, "dense", 10, masks, qv=qv, params={"dense": params})
            _check_no_masked(res, masks, r)
            assert (res.n_found == min(10, n_pass)).all()
            assert _recall(res.ids, res.n_found, want_ids) >= 0.95, (fraction, params)


def test_dense_bad_masks_name_the_shard(collection):
    r, qv, _ = collection
    leg = r.engine.legs["dense"]
    prep = leg.prepare_vectors(qv[:2])
    rows = r.reader.shards[1].rows
    for bad in (np.ones(rows + 3, np.uint8), np.ones(rows, np.float32)):
        ctx = SearchContext(depth=5, n_threads=1, allow=[None, bad, None])
        with pytest.raises(QueryError, match=f"allow mask of shard 1 \\({r.reader.shards[1].dir.name}\\): expected "
                                             f"a uint8 array of the shard's {rows} rows"):
            leg.search_shard(prep, 1, ctx)
    with pytest.raises(QueryError, match="filter_exact_below' must be a number in \\[0, 1\\]"):
        parse_leg_params({"dense": {"filter_exact_below": 1.5}})
    with pytest.raises(QueryError, match="filter_exact_below' must be a number in \\[0, 1\\]"):
        parse_leg_params({"sparse": {"filter_exact_below": "x"}})


def test_dense_kernels_check_the_mask_length():
    from retriever import _kernels
    from retriever.int8scan import int8_scan, quantize_prefix

    hs, hi = np.full((1, 3), -np.inf, np.float32), np.full((1, 3), -1, np.int64)
    with pytest.raises(ValueError, match="len\\(allow\\) = 4 must equal scores.shape\\[1\\] = 5"):
        _kernels.heap_push_block(np.ones((1, 5), np.float32), 0, hs, hi, 1, np.ones(4, np.uint8))
    pref = quantize_prefix(np.eye(8, dtype=np.float32))
    with pytest.raises(ValueError, match="len\\(allow\\) = 7 must equal n"):
        int8_scan(pref, np.eye(8, dtype=np.float32)[:1], 2, 1, allow=np.ones(7, np.uint8))
    # fewer allowed documents than kk: the row ends in -1 / -inf, never a masked document
    D, I = int8_scan(pref, np.eye(8, dtype=np.float32)[:1], 3, 1, allow=np.array([0, 1, 0, 0, 0, 0, 0, 1], np.uint8))
    assert I[0].tolist()[:2] in ([1, 7], [7, 1]) and I[0, 2] == -1 and D[0, 2] == -np.inf


# ---------------------------------------------------------------- tombstones

def test_tombstones_apply_to_dense_and_sparse(collection):
    """Deleted rows (Shard.deleted, the engine's live masks) are never returned by the dense or
    sparse leg, and the results equal the oracle over the live documents."""
    import dataclasses
    from types import SimpleNamespace

    from retriever.engine import Engine

    r, qv, qsv = collection
    rng = np.random.default_rng(9)
    reader = r.reader
    old = list(reader.shards)
    try:
        dels = [np.sort(rng.choice(s.rows, s.rows // 3, replace=False)).astype(np.uint32) for s in old]
        reader.shards[:] = [dataclasses.replace(s, deleted=d) for s, d in zip(old, dels)]
        eng = Engine(reader)
        live = []
        for s, d in zip(old, dels):
            m = np.ones(s.rows, np.uint8)
            m[d] = 0
            live.append(m)
        r2 = SimpleNamespace(engine=eng, reader=reader)  # what the helpers use of a Retriever
        for mode, kw, oracle in (("dense", {"qv": qv}, lambda m: _dense_oracle(r2, qv, m, 10)),
                                 ("sparse", {"qsv": qsv}, lambda m: _sparse_oracle(r2, qsv, m, 10))):
            want_ids, _ = oracle(live)
            res = _search(r2, mode, 10, None, **kw)
            _check_no_masked(res, live, r2)
            for q in range(len(want_ids)):
                np.testing.assert_array_equal(res.ids[q, :res.n_found[q]], want_ids[q])
            # a call's own mask is ANDed with the live mask
            extra = _masks(r2, 0.5, seed=4)
            both = [a & b for a, b in zip(live, extra)]
            want_ids, _ = oracle(both)
            res = _search(r2, mode, 10, extra, **kw)
            _check_no_masked(res, both, r2)
            for q in range(len(want_ids)):
                np.testing.assert_array_equal(res.ids[q, :res.n_found[q]], want_ids[q])
    finally:
        reader.shards[:] = old


# ---------------------------------------------------------------- SciFact (real models)

def _scifact(tmp_path_factory, data_dir, n_docs: int | None, n_queries: int):
    """A dense + sparse index of SciFact (the first ``n_docs`` documents, or all) built with the
    bundled MiniLM and SPLADE models, and ``n_queries`` of its queries prepared by both legs."""
    import gzip
    import json

    path = data_dir / "scifact"
    if not (path / "corpus.jsonl.gz").is_file():
        pytest.skip("SciFact not found")
    with gzip.open(path / "corpus.jsonl.gz", "rt") as f:
        docs = [json.loads(line) for _, line in zip(range(n_docs or 10**9), f)]
    with open(path / "queries.jsonl") as f:
        queries = [json.loads(line)["text"] for _, line in zip(range(n_queries), f)]
    out = tmp_path_factory.mktemp("scifact") / "ix"
    build_index([{"_id": d["_id"], "title": d.get("title", ""), "text": d["text"]} for d in docs], out,
                legs=("dense", "sparse"), shard_size=max(1, len(docs) // 2 + 1), show_progress=False,
                dense=DenseConfig(dtype="float32", matryoshka_dims=(96, 192, 384)))
    r = Retriever.open(out, n_threads=1)
    qv = r.engine.legs["dense"].encode(queries)
    prep = r.engine.legs["sparse"].prepare(queries)
    q_off, q_terms, q_w = prep.batch
    qsv = [(q_terms[q_off[i]:q_off[i + 1]], q_w[q_off[i]:q_off[i + 1]]) for i in range(len(queries))]
    return r, qv, qsv


def _check_scifact(r, qv, qsv):
    for fraction in SELECTIVITIES:
        masks = _masks(r, fraction, seed=int(fraction * 1e4))
        n_pass = int(sum(m.sum() for m in masks))
        for k in (10, 100):  # sparse exact: ids and scores bit for bit
            want_ids, want_scores = _sparse_oracle(r, qsv, masks, k)
            res = _search(r, "sparse", k, masks, qsv=qsv)
            _check_no_masked(res, masks, r)
            for q in range(len(qsv)):
                n = res.n_found[q]
                np.testing.assert_array_equal(res.ids[q, :n], want_ids[q])
                np.testing.assert_array_equal(res.scores[q, :n], want_scores[q])
        want_ids, _ = _sparse_oracle(r, qsv, masks, 10)
        res = _search(r, "sparse", 10, masks, qsv=qsv, params={"sparse": {"algorithm": "seismic"}})
        _check_no_masked(res, masks, r)
        assert [int(n) for n in res.n_found] == [len(w) for w in want_ids]
        assert _recall(res.ids, res.n_found, want_ids) >= 0.95
        want_ids, want_scores = _dense_oracle(r, qv, masks, 10)
        res = _search(r, "dense", 10, masks, qv=qv)  # flat: exact
        _check_no_masked(res, masks, r)
        for q in range(len(qv)):
            np.testing.assert_array_equal(res.ids[q, :res.n_found[q]], want_ids[q])
            np.testing.assert_allclose(res.scores[q, :res.n_found[q]], want_scores[q], rtol=1e-5, atol=1e-6)
        for params in ({"dim": 192}, {"index": "HNSW32"}, {"index": "IVF8,Flat", "nprobe": 4},
                       {"dim": 192, "scan_dtype": "int8"}):
            for extra in ({}, {"filter_exact_below": 0.0}):
                res = _search(r, "dense", 10, masks, qv=qv, params={"dense": {**params, **extra}})
                _check_no_masked(res, masks, r)
                assert (res.n_found == min(10, n_pass)).all(), params
                rec = _recall(res.ids, res.n_found, want_ids)
                assert rec >= 0.95, (fraction, params, extra, rec)


@pytest.mark.slow
def test_scifact_subset_filtered_legs(tmp_path_factory, data_dir):
    """SciFact's first 600 documents with the real models: every dense and sparse algorithm under
    random masks at each selectivity (slow: the models encode the documents; the synthetic
    collection above is the default suite's variant)."""
    _check_scifact(*_scifact(tmp_path_factory, data_dir, 600, 20))


@pytest.mark.slow
def test_scifact_filtered_legs(tmp_path_factory, data_dir):
    """The same on all of SciFact (5,183 documents, 100 queries)."""
    _check_scifact(*_scifact(tmp_path_factory, data_dir, None, 100))
