"""Fuzzing the C++ boundary: random and malformed CSR / query / bound / vector inputs to every
kernel in ``retriever._kernels``. Each call must return well-formed results or raise
ValueError / TypeError; it must never crash, hang or read out of bounds (run under
AddressSanitizer with ``make -C cpp_ext sanitize``).

``FUZZ_EXAMPLES`` (env) sets hypothesis examples per kernel (default 60; the sanitizer run
uses more). Executions are counted and printed (``-s``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    from retriever import _kernels as K
except ImportError:  # pragma: no cover - sanitizer builds load the module by path
    import importlib

    K = importlib.import_module("_kernels")

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
EXECUTIONS = {"calls": 0, "ok": 0, "ValueError": 0, "TypeError": 0}
KERNELS = {"check_csr", "bm25_upper_bounds", "bm25_impacts", "bm25_topk", "impact_topk", "bm25_term_kth",
           "bm25_dense_bitmaps", "bm25_query_terms", "bm25_impact_rows", "tie_ranks", "bm25_topk_text",
           "bm25_score_docs", "bm25_topk_shards", "bm25_term_kth_shards", "BM25ShardSet",
           # learned-sparse kernels: fuzzed in tests/test_fuzz_sparse.py
           "check_sparse_index", "check_impact_postings", "sparse_exact_topk", "sparse_seismic_topk",
           # dense funnel kernels: fuzzed below
           "rescore_topk", "rescore_has_avx512", "heap_push_block", "int8_scan_topk", "int8_scan_has_vnni",
           # the API's hit-making kernels: fuzzed below
           "decode_strings", "make_hits"}

SMALL = st.integers(0, 12)
U32_EDGE = st.sampled_from([0, 1, 2, 3, 5, 7, 11, 2**31, 2**32 - 1])
U64_EDGE = st.sampled_from([0, 1, 2, 3, 7, 2**32, 2**63, 2**64 - 1])
F32_EDGE = st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 3.0e38, -3.0e38, float("nan"), float("inf"),
                            float("-inf"), 1e-45])


def _u32(draw, n, hi):
    return np.array([draw(st.one_of(st.integers(0, max(hi, 0)), U32_EDGE)) for _ in range(n)], np.uint32)


@st.composite
def csr(draw):
    """Mostly well-formed CSR arrays with occasional corruption."""
    n_docs = draw(st.integers(0, 20))
    n_terms = draw(SMALL)
    lens = [draw(st.integers(0, 6)) for _ in range(n_terms)]
    doc_ids = []
    for ln in lens:
        ids = sorted(draw(st.sets(st.integers(0, max(n_docs - 1, 0)), max_size=ln))) if n_docs else []
        doc_ids.extend(ids)
    lens2 = []  # lens after set dedup
    # recompute offsets from actual per-term counts
    offsets = [0]
    i = 0
    for ln in lens:
        offsets.append(offsets[-1])
    doc_ids = np.array(doc_ids, np.uint32)
    # distribute doc ids over terms in order, monotone
    if n_terms:
        cuts = sorted(draw(st.lists(st.integers(0, len(doc_ids)), min_size=n_terms - 1, max_size=n_terms - 1)))
        offsets = [0, *cuts, len(doc_ids)]
    else:
        offsets = [0] if not len(doc_ids) else [0]
        doc_ids = doc_ids[:0]
    offsets = np.array(offsets, np.uint64)
    corrupt = draw(st.sampled_from(["none"] * 4 + ["offset", "docid", "order", "short", "last", "empty"]))
    if corrupt == "offset" and len(offsets):
        offsets[draw(st.integers(0, len(offsets) - 1))] = draw(U64_EDGE)
    elif corrupt == "docid" and len(doc_ids):
        doc_ids[draw(st.integers(0, len(doc_ids) - 1))] = draw(U32_EDGE)
    elif corrupt == "order" and len(doc_ids) > 1:
        doc_ids = doc_ids[::-1].copy()
    elif corrupt == "short" and len(doc_ids):
        doc_ids = doc_ids[:-1].copy()
    elif corrupt == "last":
        offsets[-1] = offsets[-1] + draw(st.integers(1, 5))
    elif corrupt == "empty":
        offsets = np.zeros(0, np.uint64)
    del lens2, i
    return offsets, doc_ids, n_docs


@st.composite
def queries(draw, n_terms):
    nq = draw(st.integers(0, 4))
    terms, offs = [], [0]
    for _ in range(nq):
        m = draw(st.integers(0, 4))
        for _ in range(m):
            terms.append(draw(st.one_of(st.integers(0, max(n_terms - 1, 0)), U32_EDGE)))
        offs.append(len(terms))
    weights = [draw(st.one_of(st.floats(0, 10, width=32), F32_EDGE)) for _ in terms]
    q_offsets = np.array(offs, np.uint64)
    if draw(st.integers(0, 9)) == 0 and len(q_offsets):
        q_offsets[draw(st.integers(0, len(q_offsets) - 1))] = draw(U64_EDGE)
    return q_offsets, np.array(terms, np.uint32), np.array(weights, np.float32)


def _f32(draw, n):
    return np.array([draw(st.one_of(st.floats(0, 5, width=32), F32_EDGE)) for _ in range(n)], np.float32)


def _call(fn, *args, **kw):
    EXECUTIONS["calls"] += 1
    try:
        out = fn(*args, **kw)
    except (ValueError, TypeError) as e:
        EXECUTIONS[type(e).__name__ if type(e).__name__ in EXECUTIONS else "ValueError"] += 1
        return None
    EXECUTIONS["ok"] += 1
    return out


def _check_topk(res, nq, k):
    ids, scores, n_found = res
    assert ids.shape == (nq, k) and scores.shape == (nq, k) and n_found.shape == (nq,)
    for q in range(nq):
        n = int(n_found[q])
        assert 0 <= n <= k
        assert (ids[q, n:] == -1).all()
        assert (ids[q, :n] >= 0).all()


def test_kernel_list_is_complete():
    names = {n for n in dir(K) if not n.startswith("_") and callable(getattr(K, n))}
    assert names <= KERNELS | {"parse_bm25_algorithm"}, names - KERNELS


@SETTINGS
@given(data=st.data())
def test_fuzz_check_csr(data):
    offsets, doc_ids, n_docs = data.draw(csr())
    n_docs = data.draw(st.sampled_from([n_docs, 0, -1, 2**32, 2**40]))
    _call(K.check_csr, offsets, doc_ids, n_docs)


@SETTINGS
@given(data=st.data())
def test_fuzz_bm25_upper_bounds(data):
    offsets, doc_ids, n_docs = data.draw(csr())
    tfs = _u32(data.draw, len(doc_ids) + data.draw(st.sampled_from([0, 0, 0, -1, 1])), 5)
    norm = _f32(data.draw, n_docs)
    bs = data.draw(st.sampled_from([1, 2, 3, 128, 0, -1, 2**31]))
    res = _call(K.bm25_upper_bounds, offsets, doc_ids, tfs, norm, block_size=bs,
                n_threads=data.draw(st.integers(0, 3)))
    if res is not None:
        term_ub, boff, bub = res
        assert len(term_ub) == len(offsets) - 1 and len(boff) == len(offsets) and len(bub) == int(boff[-1])
    imp = _call(K.bm25_impacts, offsets, doc_ids, tfs, norm, n_threads=data.draw(st.integers(0, 3)))
    if imp is not None:
        assert imp.shape == doc_ids.shape


@SETTINGS
@given(data=st.data())
def test_fuzz_bm25_topk_shards(data):
    """Several shards of (mostly well-formed) postings with optional, sometimes corrupted bounds
    and filters, arbitrary bases and a shared query batch."""
    shards, n_max = [], 0
    for _ in range(data.draw(st.integers(0, 3))):
        offsets, doc_ids, n_docs = data.draw(csr())
        tfs = _u32(data.draw, len(doc_ids), 5)
        norm = _f32(data.draw, n_docs)
        b = {"offsets": offsets, "doc_ids": doc_ids, "tfs": tfs, "doc_norm": norm}
        ub = _call(K.bm25_upper_bounds, offsets, doc_ids, tfs, norm, block_size=4, n_threads=1)
        if ub is not None and data.draw(st.integers(0, 4)) > 0:
            b.update(term_ub=ub[0], block_offsets=ub[1], block_ub=ub[2], block_size=4)
            if data.draw(st.integers(0, 3)) == 0 and len(ub[0]):
                b["term_ub"] = ub[0].copy()
                b["term_ub"][data.draw(st.integers(0, len(ub[0]) - 1))] = data.draw(F32_EDGE)
        if data.draw(st.booleans()):
            imp = _call(K.bm25_impacts, offsets, doc_ids, tfs, norm, n_threads=1)
            if imp is not None:
                b["impacts"] = imp[:-1] if data.draw(st.integers(0, 3)) == 0 and len(imp) else imp
        if data.draw(st.integers(0, 3)) == 0:
            b["allow"] = np.ones(max(n_docs + data.draw(st.sampled_from([0, 0, 1, -1])), 0), np.uint8)
        shards.append(b)
        n_max = max(n_max, len(offsets) - 1)
    n_terms = n_max + data.draw(st.sampled_from([0, 0, 2, -1]))
    q_offsets, q_terms, q_weights = data.draw(queries(max(n_terms, 0)))
    bases = np.cumsum([0] + [len(b["doc_norm"]) + data.draw(st.sampled_from([0, 0, 3, -1]))
                             for b in shards[:-1]]).astype(np.int64)
    if data.draw(st.integers(0, 5)) == 0:
        bases = bases[:-1] if len(bases) else np.int64([2**40])
    k = data.draw(st.sampled_from([1, 2, 5, 0]))
    algo = data.draw(st.sampled_from(["exhaustive", "maxscore", "bmw", "bmm", "auto", "bogus"]))
    res = _call(K.bm25_topk_shards, shards, bases, q_offsets, q_terms, q_weights, k, n_terms=n_terms,
                n_threads=data.draw(st.integers(0, 3)), algorithm=algo)
    if res is not None:
        _check_topk(res, len(q_offsets) - 1, k)
    # the union's single-term thresholds and the shard set (parsed once) over the same shards
    terms = np.asarray(data.draw(st.lists(st.integers(0, n_max + 2), max_size=6)), np.uint32)
    depth = data.draw(st.sampled_from([1, 2, 5, 0]))
    kth = _call(K.bm25_term_kth_shards, shards, terms, depth, n_threads=data.draw(st.integers(0, 2)))
    if kth is not None:
        assert kth.shape == (len(terms),) and kth.dtype == np.float32
    plain = [{key: v for key, v in b.items() if key != "allow"} for b in shards]
    shard_set = _call(K.BM25ShardSet, plain, bases, n_terms=n_terms)
    if shard_set is not None:
        masks = [b.get("allow") for b in shards]
        got = _call(shard_set.topk, q_offsets, q_terms, q_weights, k, n_threads=1, algorithm=algo,
                    allow=masks if any(m is not None for m in masks) else None)
        if got is not None:
            _check_topk(got, len(q_offsets) - 1, k)
            if res is not None:  # the same kernel on the same arrays
                np.testing.assert_array_equal(got[0], res[0])
        union = _call(shard_set.term_kth, np.arange(max(n_terms, 0), dtype=np.uint32), max(k, 1))
        if union is not None:
            got = _call(shard_set.topk, q_offsets, q_terms, q_weights, k, algorithm=algo, term_kth=union,
                        term_kth_depth=data.draw(st.sampled_from([k, k, 3])))
            if got is not None:
                _check_topk(got, len(q_offsets) - 1, k)

@SETTINGS
@given(data=st.data())
def test_fuzz_bm25_topk(data):
    offsets, doc_ids, n_docs = data.draw(csr())
    n_terms = max(len(offsets) - 1, 0)
    tfs = _u32(data.draw, len(doc_ids), 5)
    norm = _f32(data.draw, n_docs)
    q_offsets, q_terms, q_weights = data.draw(queries(n_terms))
    k = data.draw(st.sampled_from([1, 2, 5, 50, 0, -3]))
    algo = data.draw(st.sampled_from(["exhaustive", "maxscore", "bmw", "bmm", "auto", "bogus"]))
    bounds = {}
    if data.draw(st.booleans()):
        ub = _call(K.bm25_upper_bounds, offsets, doc_ids, tfs, norm, block_size=4, n_threads=1)
        if ub is not None:
            bounds = dict(term_ub=ub[0], block_offsets=ub[1], block_ub=ub[2], block_size=4)
            if data.draw(st.integers(0, 3)) == 0:  # corrupt a bound
                which = data.draw(st.sampled_from(["term_ub", "block_offsets", "block_ub"]))
                arr = bounds[which].copy()
                if len(arr):
                    i = data.draw(st.integers(0, len(arr) - 1))
                    arr[i] = data.draw(U64_EDGE) if arr.dtype == np.uint64 else data.draw(F32_EDGE)
                bounds[which] = arr
            if data.draw(st.integers(0, 5)) == 0:
                bounds["block_size"] = data.draw(st.sampled_from([1, 3, 128]))
    if data.draw(st.booleans()):  # impacts: exact, wrong length, or arbitrary values
        how = data.draw(st.sampled_from(["exact", "exact", "short", "random"]))
        if how == "random":
            bounds["impacts"] = _f32(data.draw, len(doc_ids))
        else:
            imp = _call(K.bm25_impacts, offsets, doc_ids, tfs, norm, n_threads=1)
            if imp is not None:
                bounds["impacts"] = imp[:-1] if how == "short" and len(imp) else imp
    if data.draw(st.booleans()):  # term_kth: exact (depth k or another), arbitrary, or wrong length
        how = data.draw(st.sampled_from(["exact", "exact", "random", "short"]))
        depth = data.draw(st.sampled_from([k, k, 1, 3]))
        if how == "exact" and depth >= 1:
            kth = _call(K.bm25_term_kth, offsets, doc_ids, tfs, norm,
                        np.arange(max(len(offsets) - 1, 0), dtype=np.uint32), depth, n_threads=1)
        else:
            kth = _f32(data.draw, max(len(offsets) - 1 - (how == "short"), 0))
        if kth is not None:
            bounds["term_kth"] = kth
            bounds["term_kth_depth"] = depth
    if data.draw(st.booleans()):  # membership bitmaps: exact, arbitrary words / ranks, or mismatched
        how = data.draw(st.sampled_from(["exact", "exact", "random_rank", "random_bits", "short", "bad_slot"]))
        dense = _call(K.bm25_dense_bitmaps, offsets, doc_ids, n_docs, data.draw(st.sampled_from([1, 2, 3, 0])),
                      n_threads=data.draw(st.integers(0, 2)))
        if dense is not None:
            slot, bits, rank = (x.copy() for x in dense)
            if how == "random_rank" and len(rank):
                rank[data.draw(st.integers(0, len(rank) - 1))] = data.draw(U32_EDGE)
            elif how == "random_bits" and len(bits):
                bits[data.draw(st.integers(0, len(bits) - 1))] = data.draw(U64_EDGE)
            elif how == "short":
                bits, rank = bits[:-1], rank[:-1]
            elif how == "bad_slot" and len(slot):
                slot[data.draw(st.integers(0, len(slot) - 1))] = data.draw(st.sampled_from([-2, 5, 2**31 - 1]))
            bounds.update(dense_slot=slot, dense_bits=bits, dense_rank=rank)
    allow = None
    if data.draw(st.integers(0, 3)) == 0:
        allow = np.array([data.draw(st.integers(0, 1)) for _ in range(n_docs + data.draw(st.sampled_from([0, 0, 1, -1])))
                          if True], np.uint8) if n_docs + 1 > 0 else np.zeros(0, np.uint8)
    impl = data.draw(st.sampled_from(["auto", "auto", "scalar", "avx2", "avx512", "bogus"]))
    res = _call(K.bm25_topk, offsets, doc_ids, tfs, norm, q_offsets, q_terms, q_weights, k,
                n_threads=data.draw(st.integers(0, 3)), allow=allow, algorithm=algo, impl=impl, **bounds)
    if res is not None:
        _check_topk(res, len(q_offsets) - 1, k)


@SETTINGS
@given(data=st.data())
def test_fuzz_bm25_score_docs(data):
    offsets, doc_ids, n_docs = data.draw(csr())
    n_terms = max(len(offsets) - 1, 0)
    tfs = _u32(data.draw, len(doc_ids) + data.draw(st.sampled_from([0, 0, 0, 1])), 5)
    norm = _f32(data.draw, n_docs)
    q_offsets, q_terms, q_weights = data.draw(queries(n_terms))
    nq = max(len(q_offsets) - 1, 0)
    counts = [data.draw(st.integers(0, 5)) for _ in range(nq + data.draw(st.sampled_from([0, 0, 0, 1, -1])))]
    cand_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    edge = st.sampled_from([-1, -2**63, n_docs, n_docs + 1, 2**32, 2**63 - 1])
    cand_docs = np.array([data.draw(st.one_of(st.integers(0, max(n_docs - 1, 0)), edge))
                          for _ in range(int(cand_offsets[-1]) + data.draw(st.sampled_from([0, 0, 0, 1, -1])))
                          if True], np.int64) if int(cand_offsets[-1]) + 1 > 0 else np.zeros(0, np.int64)
    if data.draw(st.integers(0, 9)) == 0 and len(cand_offsets):
        cand_offsets[data.draw(st.integers(0, len(cand_offsets) - 1))] = data.draw(st.sampled_from([-1, 2**40]))
    kw = {}
    if data.draw(st.booleans()):
        kw["impacts"] = _f32(data.draw, len(doc_ids) + data.draw(st.sampled_from([0, 0, 0, -1])))
    res = _call(K.bm25_score_docs, offsets, doc_ids, tfs, norm, q_offsets, q_terms, q_weights, cand_offsets,
                cand_docs, n_threads=data.draw(st.integers(0, 3)), **kw)
    if res is not None:
        assert res.shape == cand_docs.shape and res.dtype == np.float32


@SETTINGS
@given(data=st.data())
def test_fuzz_bm25_term_kth(data):
    offsets, doc_ids, n_docs = data.draw(csr())
    n_terms = max(len(offsets) - 1, 0)
    tfs = _u32(data.draw, len(doc_ids) + data.draw(st.sampled_from([0, 0, 0, 1])), 5)
    norm = _f32(data.draw, n_docs)
    terms = _u32(data.draw, data.draw(st.integers(0, 6)), n_terms + 1)
    kw = {}
    if data.draw(st.booleans()):
        kw["impacts"] = _f32(data.draw, len(doc_ids) + data.draw(st.sampled_from([0, 0, 0, -1])))
    if data.draw(st.booleans()):
        ub = _call(K.bm25_upper_bounds, offsets, doc_ids, tfs, norm, block_size=2, n_threads=1)
        if ub is not None:
            kw.update(block_offsets=ub[1], block_ub=ub[2],
                      block_size=data.draw(st.sampled_from([2, 2, 1, 0, 128])))
            if data.draw(st.integers(0, 3)) == 0:
                del kw["block_ub"]
    depth = data.draw(st.sampled_from([1, 2, 7, 0, -1]))
    res = _call(K.bm25_term_kth, offsets, doc_ids, tfs, norm, terms, depth,
                n_threads=data.draw(st.integers(0, 3)), **kw)
    if res is not None:
        assert res.shape == terms.shape and res.dtype == np.float32


@SETTINGS
@given(data=st.data())
def test_fuzz_impact_topk(data):
    offsets, doc_ids, n_docs = data.draw(csr())
    n_terms = max(len(offsets) - 1, 0)
    impacts = _f32(data.draw, len(doc_ids) + data.draw(st.sampled_from([0, 0, 0, 1, -1])))
    q_offsets, q_terms, q_weights = data.draw(queries(n_terms))
    k = data.draw(st.sampled_from([1, 3, 20, 0]))
    allow = None
    if data.draw(st.booleans()):
        allow = np.ones(max(n_docs + data.draw(st.sampled_from([0, -1, 1])), 0), np.uint8)
    res = _call(K.impact_topk, offsets, doc_ids, impacts, q_offsets, q_terms, q_weights, k,
                n_threads=data.draw(st.integers(0, 3)), allow=allow)
    if res is not None:
        _check_topk(res, len(q_offsets) - 1, k)


BAD_ARRAYS = [None, 3, "abc", [1, 2], np.zeros(3, np.int64), np.zeros(3, np.float64), np.zeros((2, 2), np.uint64),
              np.zeros(6, np.uint64)[::2], np.zeros(0, np.uint32), np.zeros((0, 3), np.uint32)]


@pytest.mark.parametrize("pos", range(7))
def test_wrong_types_and_shapes(pos):
    good = [np.array([0, 2, 3], np.uint64), np.array([0, 1, 1], np.uint32), np.array([1, 2, 3], np.uint32),
            np.ones(2, np.float32), np.array([0, 1], np.uint64), np.array([0], np.uint32), np.ones(1, np.float32)]
    for bad in BAD_ARRAYS:
        args = list(good)
        args[pos] = bad
        _call(K.bm25_topk, *args, 3, algorithm="exhaustive")
        if pos < 4:
            _call(K.bm25_upper_bounds, *args[:4])
        if pos < 2:
            _call(K.check_csr, *args[:2], 2)
        imp = [args[0], args[1], np.ones(3, np.float32) if pos != 2 else bad, *args[4:]]
        _call(K.impact_topk, *imp, 2)


def test_report_executions():
    print(f"\nfuzz executions: {EXECUTIONS}")
    assert EXECUTIONS["calls"] > 0


@SETTINGS
@given(data=st.data())
def test_fuzz_rescore_topk(data):
    n, d, nq, kk = (data.draw(SMALL) for _ in range(4))
    dtype = data.draw(st.sampled_from([np.float16, np.float32]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    vec = rng.standard_normal((n, d)).astype(dtype)
    q = rng.standard_normal((nq, data.draw(st.sampled_from([d, d, d + 1])))).astype(np.float32)
    cand = rng.integers(-3, n + 3, (nq, kk)).astype(np.int64)
    k = data.draw(st.sampled_from([1, 3, 10, 0, -1]))
    impl = data.draw(st.sampled_from(["auto", "portable", "avx512", "x"]))
    res = _call(K.rescore_topk, q, vec, cand, k, data.draw(st.sampled_from([0, 5, -1])), data.draw(st.integers(0, 3)),
                impl)
    if res is not None:
        _check_topk(res, nq, k)


@SETTINGS
@given(data=st.data())
def test_fuzz_heap_push_block(data):
    nq, nd, kk = (data.draw(SMALL) for _ in range(3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    scores = rng.standard_normal((nq, nd)).astype(np.float32)
    if nd and nq and data.draw(st.booleans()):
        scores[0, 0] = np.nan
    hs = np.full((data.draw(st.sampled_from([nq, nq, nq + 1])), kk), -np.inf, np.float32)
    hi = np.full((hs.shape[0], kk), -1, np.int64)
    first = data.draw(st.sampled_from([0, 7, -1]))
    _call(K.heap_push_block, scores, first, hs, hi, data.draw(st.integers(0, 3)))
    # whether it ran or raised: only ids of this block enter, never NaN, ids and scores pair up
    kept = hi[hi >= 0]
    assert ((kept >= max(first, 0)) & (kept < max(first, 0) + nd)).all()
    assert not np.isnan(hs).any()
    assert ((hi >= 0) == np.isfinite(hs)).all()


@SETTINGS
@given(data=st.data())
def test_fuzz_bm25_impact_rows(data):
    """Any postings / sizes: rows or a clean error; with rows, exhaustive scoring equals the call
    without them (or both raise), and a corrupted slot is refused."""
    offsets, doc_ids, n_docs = data.draw(csr())
    impacts = _f32(data.draw, len(doc_ids) + data.draw(st.sampled_from([0, 0, 0, -1])))
    n_docs_rows = data.draw(st.sampled_from([n_docs, n_docs, 0, -1, 2**40]))
    res = _call(K.bm25_impact_rows, offsets, doc_ids, impacts, n_docs_rows,
                data.draw(st.sampled_from([1, 2, 0, 2**63 - 1])), data.draw(st.sampled_from([0, 1, 3, 100, -1])),
                n_threads=data.draw(st.integers(0, 3)))
    if res is None or n_docs_rows != n_docs:
        return
    slot, rows = res
    assert len(slot) == len(offsets) - 1 and len(rows) % max(n_docs, 1) == 0
    assert ((slot >= -1) & (slot < max(len(rows) // max(n_docs, 1), 0) + (n_docs == 0))).all()
    tfs = np.ones(len(doc_ids), np.uint32)
    norm = np.ones(n_docs, np.float32)
    nq = data.draw(SMALL)
    n_terms = len(offsets) - 1
    lens = [data.draw(st.integers(0, 4)) for _ in range(nq)] if n_terms else [0] * nq
    q_off = np.zeros(nq + 1, np.uint64)
    q_off[1:] = np.cumsum(lens)
    q_terms = np.array([data.draw(st.integers(0, n_terms - 1)) for _ in range(sum(lens))], np.uint32)
    q_w = _f32(data.draw, len(q_terms))
    k = data.draw(st.integers(1, 6))
    args = (offsets, doc_ids, tfs, norm, q_off, q_terms, q_w, k)
    plain = _call(K.bm25_topk, *args, algorithm="exhaustive", impacts=impacts)
    with_rows = _call(K.bm25_topk, *args, algorithm="exhaustive", impacts=impacts, impact_rows=rows,
                      impact_row_slot=slot)
    assert (plain is None) == (with_rows is None)
    if plain is not None:
        for a, b in zip(plain, with_rows):
            np.testing.assert_array_equal(a, b)
    if len(q_terms):
        bad = slot.copy()
        bad[q_terms[0]] = data.draw(st.sampled_from([-2, len(rows) // max(n_docs, 1), 2**31 - 1]))
        assert _call(K.bm25_topk, *args, algorithm="exhaustive", impacts=impacts, impact_rows=rows,
                     impact_row_slot=bad) is None


@SETTINGS
@given(data=st.data())
def test_fuzz_tie_ranks(data):
    """Sorted rows with ties, -inf padding and any n_found: competition ranks as a plain loop
    computes them; bad shapes are refused."""
    nq, k = data.draw(SMALL), data.draw(SMALL)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    scores = -np.sort(-rng.integers(0, 3, (nq, k)).astype(np.float32), axis=1)
    n_found = np.array([data.draw(st.integers(-2, k + 2)) for _ in range(nq)], np.int32)
    for q in range(nq):
        scores[q, max(n_found[q], 0):] = -np.inf
    if data.draw(st.booleans()):
        n_found = n_found[:max(nq - 1, 0)]  # wrong length unless nq == 0
    got = _call(K.tie_ranks, scores, n_found)
    if got is None:
        assert len(n_found) != nq
        return
    for q in range(nq):
        n = min(max(int(n_found[q]), 0), k)
        want = [0] * k
        for j in range(n):
            want[j] = j + 1 if j == 0 or scores[q, j] != scores[q, j - 1] else want[j - 1]
        assert got[q].tolist() == want


@SETTINGS
@given(data=st.data())
def test_fuzz_int8_scan_topk(data):
    n = data.draw(st.integers(0, 40))
    d4, nq, kk = data.draw(st.integers(0, 4)), data.draw(SMALL), data.draw(st.integers(-1, 42))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    nb = data.draw(st.sampled_from([-(-n // 16), -(-n // 16), -(-n // 16) + 1, max(-(-n // 16) - 1, 0)]))
    codes = rng.integers(0, 256, (nb, d4, data.draw(st.sampled_from([64, 64, 32]))), dtype=np.uint8)
    q = rng.integers(-128, 128, (nq, data.draw(st.sampled_from([4 * d4, 4 * d4, 4 * d4 + 1]))), dtype=np.int8)
    impl = data.draw(st.sampled_from(["auto", "portable", "vnni", "x"]))
    res = _call(K.int8_scan_topk, q, codes, n, kk, data.draw(st.integers(0, 3)), impl)
    if res is None:
        return
    scores, ids = res
    assert scores.shape == ids.shape == (nq, kk)
    # exact against the unpacked codes: score desc, id asc
    rows = codes.reshape(nb, d4, 16, 4).transpose(0, 2, 1, 3).reshape(nb * 16, 4 * d4)[:n].astype(np.int64)
    full = q.astype(np.int64) @ rows.T
    for i in range(nq):
        want = np.lexsort((np.arange(n), -full[i]))[:kk]
        np.testing.assert_array_equal(ids[i], want)
        np.testing.assert_array_equal(scores[i], full[i, want])


@SETTINGS
@given(data=st.data())
def test_fuzz_bm25_query_terms(data):
    """Random bytes (invalid and truncated UTF-8 included), offsets and a token table with corrupted
    slots / offsets / values: results are well formed or ValueError / TypeError, never a crash."""
    from retriever.index.analyzer import _IDEO
    from retriever.index.analyzer_kernels import TokenTable, _ascii_fold, char_tables, scan_tokens

    words = data.draw(st.lists(st.sampled_from(["a", "bb", "ccc", "longer_token_x", "ß", "中", "don't", "1,5"]),
                               max_size=8))
    table = TokenTable()
    text = " ".join(words).encode()
    scan_tokens(np.frombuffer(text or b"\0", np.uint8), np.array([0, len(text)], np.int64), table,
                lowercase=True, ideo_class=_IDEO)
    n_terms = data.draw(st.integers(0, 6))
    table.set_values(0, np.array([data.draw(st.integers(-3, 8)) for _ in range(table.n)], np.int64))
    slots, off, blob, value, n_e = table.slots.copy(), table.off.copy(), table.blob.copy(), table.value.copy(), table.n
    corrupt = data.draw(st.sampled_from(["none"] * 3 + ["slot_entry", "slot_key", "off", "n_entries", "slots_len"]))
    if corrupt == "slot_entry":
        slots[1::2][slots[0::2] != 0] = data.draw(st.integers(-2**40, 2**40))
    elif corrupt == "slot_key":
        slots[0::2] = data.draw(st.integers(-2**63, 2**63 - 1))
    elif corrupt == "off" and n_e:
        off[data.draw(st.integers(0, n_e))] = data.draw(st.integers(-2**40, 2**40))
    elif corrupt == "n_entries":
        n_e = data.draw(st.integers(-3, len(value) + 3))
    elif corrupt == "slots_len":
        slots = slots[:data.draw(st.integers(0, len(slots)))].copy()
    raw = data.draw(st.binary(max_size=40)) + " ".join(words).encode()[:data.draw(st.integers(0, 30))]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=4)))
    offsets = np.array([0, *cuts, len(raw)], np.int64)
    if data.draw(st.integers(0, 5)) == 0:
        offsets[data.draw(st.integers(0, len(offsets) - 1))] = data.draw(st.integers(-5, len(raw) + 5))
    flags, fold_n, fold_cp = char_tables(_IDEO)
    res = _call(K.bm25_query_terms, np.frombuffer(raw or b"\0", np.uint8).copy(), offsets, slots, off, blob, value,
                n_e, flags, fold_n, fold_cp, _ascii_fold(_IDEO, True), True,
                np.ones(n_terms, np.float32), n_threads=data.draw(st.sampled_from([1, 2])))
    if res is not None:
        q_off, q_terms, q_weights, status = res
        assert len(q_off) == len(offsets) and q_off[-1] == len(q_terms) == len(q_weights)
        assert len(status) == len(offsets) - 1 and (q_terms < max(n_terms, 1)).all()


@SETTINGS
@given(data=st.data())
def test_fuzz_bm25_topk_text(data):
    """Analysis + exhaustive scoring in one pass on random texts (invalid UTF-8 included), a token
    table whose values may point past the postings' vocabulary, corrupted postings, NaN / inf idf,
    odd k and allow lengths: well-formed results (status 1 rows empty) or ValueError / TypeError."""
    from retriever.index.analyzer import _IDEO
    from retriever.index.analyzer_kernels import TokenTable, _ascii_fold, char_tables, scan_tokens

    words = data.draw(st.lists(st.sampled_from(["a", "bb", "ccc", "ß", "中", "don't", "1,5"]), max_size=8))
    table = TokenTable()
    text = " ".join(words).encode()
    scan_tokens(np.frombuffer(text or b"\0", np.uint8), np.array([0, len(text)], np.int64), table,
                lowercase=True, ideo_class=_IDEO)
    offsets, doc_ids, n_docs = data.draw(csr())
    n_terms = max(len(offsets) - 1, 0)
    n_idf = data.draw(st.integers(0, n_terms + 2))
    table.set_values(0, np.array([data.draw(st.integers(-2, n_idf + 1)) for _ in range(table.n)], np.int64))
    raw = data.draw(st.binary(max_size=20)) + text[:data.draw(st.integers(0, 30))]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=4)))
    t_off = np.array([0, *cuts, len(raw)], np.int64)
    if data.draw(st.integers(0, 5)) == 0:
        t_off[data.draw(st.integers(0, len(t_off) - 1))] = data.draw(st.integers(-5, len(raw) + 5))
    k = data.draw(st.sampled_from([0, 1, 3, 64, -1]))
    allow = None
    if data.draw(st.booleans()):
        allow = np.array([data.draw(st.integers(0, 1)) for _ in range(data.draw(st.integers(0, n_docs + 1)))], np.uint8)
    flags, fold_n, fold_cp = char_tables(_IDEO)
    res = _call(K.bm25_topk_text, np.frombuffer(raw or b"\0", np.uint8).copy(), t_off, table.slots, table.off,
                table.blob, table.value, table.n, flags, fold_n, fold_cp, _ascii_fold(_IDEO, True), True,
                _f32(data.draw, n_idf), offsets, doc_ids, np.ones(len(doc_ids), np.uint32),
                np.ones(n_docs, np.float32), k, n_threads=data.draw(st.sampled_from([1, 2])), allow=allow)
    if res is not None:
        ids, scores, n_found, status = res
        _check_topk((ids, scores, n_found), len(t_off) - 1, k)
        assert status.shape == (len(t_off) - 1,) and set(status.tolist()) <= {0, 1}
        assert (n_found[status == 1] == 0).all()


@SETTINGS
@given(data=st.data())
def test_fuzz_decode_strings(data):
    """Random (often corrupt) offsets, bytes and rows: the strings of a well-formed column equal
    Python's decode of each row's bytes; anything else is a ValueError / TypeError."""
    words = data.draw(st.lists(st.text(max_size=4), max_size=6))
    raw = [w.encode("utf-8") for w in words]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in raw], dtype=np.int64)]).astype(np.int64)
    blob = b"".join(raw)
    corrupt = data.draw(st.sampled_from(["none", "none", "offset", "bytes", "dtype", "short"]))
    if corrupt == "offset" and len(offsets) > 1:
        offsets[data.draw(st.integers(0, len(offsets) - 1))] = data.draw(st.sampled_from([-1, 2**40, 1, 0]))
    elif corrupt == "bytes" and blob:
        b = bytearray(blob)
        b[data.draw(st.integers(0, len(b) - 1))] = data.draw(st.sampled_from([0x80, 0xFF, 0xC0]))
        blob = bytes(b)
    elif corrupt == "dtype":
        offsets = offsets.astype(data.draw(st.sampled_from([np.float64, np.uint8, np.int16])))
    elif corrupt == "short":
        blob = blob[:-1]
    n_rows = len(offsets) - 1
    rows = np.array(data.draw(st.lists(st.one_of(st.integers(0, max(n_rows - 1, 0)),
                                                 st.sampled_from([-1, n_rows, 2**62])), max_size=8)), np.int64)
    if data.draw(st.booleans()) and len(offsets) > 1 and offsets.dtype == np.int64:
        offsets = offsets.astype(np.int32)
    out = _call(K.decode_strings, offsets, memoryview(blob), rows)
    if out is not None:
        assert len(out) == len(rows)
        for r, got in zip(rows, out):
            assert got == blob[int(offsets[r]):int(offsets[r + 1])].decode("utf-8")


@SETTINGS
@given(data=st.data())
def test_fuzz_make_hits(data):
    """Random shapes, counts and leg lists: a valid batch equals the tuples built in Python;
    anything else is a ValueError / TypeError."""
    from retriever.results import Hit, LegHit

    nq, k = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 4))
    n_found = np.array([data.draw(st.one_of(st.integers(0, k), st.sampled_from([-1, k + 1])))
                        for _ in range(nq + data.draw(st.sampled_from([0, 0, 0, 1, -1])))], np.int32)
    scores = _f32(data.draw, nq * k).reshape(nq, k)
    n_legs = data.draw(st.integers(0, 3))
    names = [f"leg{i}" for i in range(n_legs)]
    leg_scores = [_f32(data.draw, nq * k).reshape(nq, k) for _ in range(n_legs)]
    leg_ranks = [np.array([data.draw(st.integers(0, 5)) for _ in range(nq * k)], np.int32).reshape(nq, k)
                 for _ in range(n_legs)]
    if n_legs and data.draw(st.integers(0, 5)) == 0:
        leg_ranks[0] = leg_ranks[0].astype(np.int64)
    total = int(np.clip(n_found, 0, None).sum())
    n_items = total + data.draw(st.sampled_from([0, 0, 0, 1, -1]))
    ids = [f"d{i}" for i in range(max(n_items, 0))]
    out = _call(K.make_hits, Hit, LegHit, scores, n_found, ids, ids, ids, [{}] * len(ids), names,
                leg_scores, leg_ranks)
    if out is not None:
        assert len(out) == nq
        pos = 0
        for q in range(nq):
            assert len(out[q]) == n_found[q]
            for j, h in enumerate(out[q]):
                legs = {names[i]: LegHit(float(leg_scores[i][q, j]), int(leg_ranks[i][q, j]))
                        for i in range(n_legs) if leg_ranks[i][q, j] > 0}
                want = Hit(ids[pos], float(scores[q, j]), j + 1, ids[pos], ids[pos], {}, legs)
                assert type(h) is Hit
                assert h[:2] == want[:2] or (np.isnan(h.score) and np.isnan(want.score))
                assert h[2:] == want[2:]
                pos += 1
