"""Fuzzing the learned-sparse kernels at the C++ boundary.

Protocol (the same contract the sparse leg follows): structures built by ``retriever.index.sparse_index``
from random vectors, then one array element corrupted at random (or none); the open-time checks
(``check_impact_postings``, ``check_sparse_index``) either reject the structure with ValueError or
accept it, and only accepted structures reach the search kernels, which must return well-formed
results or raise ValueError / TypeError for bad queries — never crash or read out of bounds
(run under AddressSanitizer with ``make -C cpp_ext sanitize``).
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retriever.index.sparse_index import build_sparse_index, impact_scale
from retriever import _kernels as K

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
BLOCK = ("term_blocks", "block_docs_offsets", "block_docs", "summary_comp_offsets", "summary_dir",
         "summary_entry_offsets", "summary_entries", "summary_scale", "fwd_packed", "fwd_term_rank")
EDGE = [0, 1, 2, 7, 255, 65535, 2**31, 2**32 - 1, 2**63, 2**64 - 1]


def _structure(seed: int, n_docs: int, n_terms: int):
    rng = np.random.default_rng(seed)
    rows, indptr = [], [0]
    for _ in range(n_docs):
        nnz = int(rng.integers(0, min(6, n_terms) + 1))
        t = np.sort(rng.choice(n_terms, size=nnz, replace=False)).astype(np.uint32)
        rows.append(t)
        indptr.append(indptr[-1] + nnz)
    terms = np.concatenate(rows) if rows else np.zeros(0, np.uint32)
    weights = rng.lognormal(-0.8, 1.2, len(terms)).astype(np.float32) + np.float32(1e-3)
    scale = impact_scale(float(weights.max(initial=0.0)))
    a = build_sparse_index(np.asarray(indptr, np.int64), terms, weights, n_terms=n_terms, scale=scale,
                           n_postings=int(rng.integers(1, 8)), block_size=int(rng.integers(1, 4)),
                           summary_energy=1.0)
    return a, scale


def _corrupt(data, a):
    name = data.draw(st.sampled_from([None, None, "fwd_offsets", "fwd_terms", "fwd_values", "offsets",
                                      "doc_ids", "impacts", *BLOCK]))
    if name is None or len(a[name]) == 0:
        return a
    arr = a[name].copy()
    i = data.draw(st.integers(0, len(arr) - 1))
    if arr.dtype.kind == "f":
        arr[i] = data.draw(st.sampled_from([np.nan, np.inf, -1.0, 0.0, 3e38]))
    else:
        arr[i] = data.draw(st.sampled_from(EDGE)) % (np.iinfo(arr.dtype).max + 1)
    return {**a, name: arr}


def _queries(data, n_terms):
    nq = data.draw(st.integers(0, 3))
    offs, terms, weights = [0], [], []
    for _ in range(nq):
        m = data.draw(st.integers(0, 4))
        ts = data.draw(st.lists(st.one_of(st.integers(0, n_terms - 1), st.sampled_from([n_terms, 2**32 - 1])),
                                min_size=m, max_size=m))
        terms += ts
        weights += [data.draw(st.sampled_from([0.5, 1.0, 2.0, 0.0, -1.0, float("nan"), float("inf")]))
                    for _ in ts]
        offs.append(len(terms))
    return np.array(offs, np.uint64), np.array(terms, np.uint32), np.array(weights, np.float32)


def _valid(res, nq, k):
    ids, scores, n_found = res
    assert ids.shape == (nq, k) and scores.shape == (nq, k) and n_found.shape == (nq,)
    for q in range(nq):
        n = int(n_found[q])
        assert 0 <= n <= k and (ids[q, n:] == -1).all() and (ids[q, :n] >= 0).all()
        assert np.isfinite(scores[q, :n]).all()


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 10_000), n_docs=st.integers(0, 25), n_terms=st.integers(1, 12))
def test_fuzz_sparse_kernels(data, seed, n_docs, n_terms):
    a, scale = _structure(seed, n_docs, n_terms)
    a0 = a
    a = _corrupt(data, a)
    clean = a is a0  # an uncorrupted structure: the postings and the forward rows agree
    try:
        K.check_impact_postings(a["offsets"], a["doc_ids"], a["impacts"], n_docs)
        K.check_sparse_index(a["fwd_offsets"], a["fwd_terms"], a["fwd_values"], scale, n_terms,
                             *[a[n] for n in BLOCK])
    except ValueError:
        return  # rejected at open: never reaches a search kernel
    q = _queries(data, n_terms)
    k = data.draw(st.sampled_from([1, 3, 50]))
    nq = len(q[0]) - 1
    try:
        res = K.sparse_exact_topk(a["offsets"], a["doc_ids"], a["impacts"], a["fwd_offsets"], a["fwd_terms"],
                                  a["fwd_values"], scale, *q, k, n_threads=data.draw(st.sampled_from([1, 2])),
                                  impl=data.draw(st.sampled_from(["auto", "scalar", "sse2", "avx2"])))
        _valid(res, nq, k)
    except ValueError:
        pass
    # the allow mask and every filter plan (a wrong-length mask or an unknown plan: ValueError);
    # valid calls of every plan agree with each other
    n_allow = data.draw(st.sampled_from([n_docs, n_docs, n_docs, max(n_docs - 1, 0), n_docs + 1]))
    allow = np.array(data.draw(st.lists(st.integers(0, 255), min_size=n_allow, max_size=n_allow)), np.uint8)
    got = []
    for plan in ("auto", "postings", "sentinel", "passing", data.draw(st.sampled_from(["auto", "", "fast"]))):
        try:
            res = K.sparse_exact_topk(a["offsets"], a["doc_ids"], a["impacts"], a["fwd_offsets"], a["fwd_terms"],
                                      a["fwd_values"], scale, *q, k, n_threads=data.draw(st.sampled_from([1, 2])),
                                      allow=allow, filter_plan=plan)
            _valid(res, nq, k)
            assert not (allow[res[0][res[0] >= 0]] == 0).any()
            got.append(res)
        except ValueError:
            pass
    for res in got[1:] if clean else []:
        for x, y in zip(res, got[0]):
            np.testing.assert_array_equal(x, y)
    try:
        res = K.sparse_seismic_topk(a["fwd_offsets"], a["fwd_terms"], a["fwd_values"], scale,
                                    *[a[n] for n in BLOCK], *q, k,
                                    query_cut=data.draw(st.sampled_from([1, 2, 10])),
                                    heap_factor=data.draw(st.sampled_from([0.5, 0.9, 1.0])), n_threads=1,
                                    impl=data.draw(st.sampled_from(["auto", "scalar", "sse2", "avx2"])))
        _valid(res, nq, k)
    except ValueError:
        pass


def test_sparse_kernels_reject_bad_arguments():
    a, scale = _structure(1, 10, 6)
    q = (np.array([0, 1], np.uint64), np.array([0], np.uint32), np.array([1.0], np.float32))
    import pytest

    with pytest.raises(ValueError, match="k"):
        K.sparse_exact_topk(a["offsets"], a["doc_ids"], a["impacts"], a["fwd_offsets"], a["fwd_terms"],
                            a["fwd_values"], scale, *q, 0)
    with pytest.raises(ValueError, match="heap_factor"):
        K.sparse_seismic_topk(a["fwd_offsets"], a["fwd_terms"], a["fwd_values"], scale, *[a[n] for n in BLOCK],
                              *q, 5, heap_factor=1.5)
    with pytest.raises(TypeError):
        K.sparse_exact_topk(a["offsets"].astype(np.int64), a["doc_ids"], a["impacts"], a["fwd_offsets"],
                            a["fwd_terms"], a["fwd_values"], scale, *q, 5)


def test_sparse_exact_huge_finite_query_weight_returns():
    # a weight whose products overflow float32 to inf: the kernel returns (it once looped forever);
    # the documents holding that term come first, with score inf
    a, scale = _structure(1, 30, 6)
    q = (np.array([0, 2], np.uint64), np.array([0, 1], np.uint32), np.array([3e38, 1.0], np.float32))
    ids, scores, n = K.sparse_exact_topk(a["offsets"], a["doc_ids"], a["impacts"], a["fwd_offsets"],
                                         a["fwd_terms"], a["fwd_values"], scale, *q, 5, n_threads=1)
    holders = set(a["doc_ids"][int(a["offsets"][0]):int(a["offsets"][1])].tolist())
    assert 0 < n[0] <= 5
    assert set(ids[0, :n[0]].tolist()) <= holders and np.isinf(scores[0, :n[0]]).all()
