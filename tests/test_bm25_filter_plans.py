"""BM25 with an allow filter: both plans of ``bm25_topk`` (``filter_plan``) for every algorithm.

``"postings"`` walks the posting lists (each algorithm's own pruning, the filtered single-term
threshold when ``term_kth`` and the block bounds are given); ``"passing"`` scores only the passing
documents (a list walked with the filter tested per posting, or probed per passing document through
its membership bitmap or by galloping seeks); ``"auto"`` picks per query by the cost model. Oracle:
:func:`reference.bm25_topk_ref`, the numpy float32 twin of exhaustive scoring restricted to the
passing documents: every plan and algorithm must equal it bit for bit (ids, scores, counts), at
selectivities 0.1 %, 1 %, 10 %, 50 % and 100 %, for a random and a clustered mask, with k = 10 and
k larger than the number of passing documents.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

try:
    from reference import bm25_topk_ref
except ImportError:  # tests/ imported as a package
    from tests.reference import bm25_topk_ref

from retriever import _kernels as K

ALGORITHMS = ("exhaustive", "maxscore", "bmw", "bmm", "auto")
PLANS = ("auto", "postings", "passing")
SELECTIVITIES = (0.001, 0.01, 0.1, 0.5, 1.0)
BLOCK = 64


def _corpus(rng: np.random.Generator, n_docs: int, n_terms: int) -> dict[str, np.ndarray]:
    """Zipf-like CSR postings: a few lists hold most documents, most are short."""
    docs, tfs = [], []
    for t in range(n_terms):
        p = min(0.9, 0.6 / (t + 1) ** 0.9)
        d = np.flatnonzero(rng.random(n_docs) < p).astype(np.uint32)
        tf = rng.geometric(0.45, len(d)).astype(np.uint32)
        tf[rng.random(len(d)) < 0.03] = 40  # beyond the small-tf tables
        docs.append(d)
        tfs.append(tf)
    offsets = np.zeros(n_terms + 1, np.uint64)
    offsets[1:] = np.cumsum([len(d) for d in docs])
    return dict(offsets=offsets, doc_ids=np.concatenate(docs), tfs=np.concatenate(tfs),
                doc_norm=rng.uniform(0.3, 2.5, n_docs).astype(np.float32))


def _queries(rng: np.random.Generator, n_terms: int, nq: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    terms = [rng.choice(n_terms, rng.integers(1, 7), replace=False) for _ in range(nq)]
    terms.append(np.array([0, 1, 2], np.int64))  # the longest lists together
    q_offsets = np.zeros(len(terms) + 1, np.uint64)
    q_offsets[1:] = np.cumsum([len(t) for t in terms])
    q_terms = np.concatenate(terms).astype(np.uint32)
    return q_offsets, q_terms, rng.uniform(0.2, 5.0, len(q_terms)).astype(np.float32)


def _mask(rng: np.random.Generator, n_docs: int, fraction: float, kind: str) -> np.ndarray:
    """round(fraction * n_docs) passing documents (at least one), random or one contiguous run;
    passing bytes take any nonzero value."""
    n = max(1, round(fraction * n_docs))
    m = np.zeros(n_docs, np.uint8)
    if kind == "random":
        pick = rng.choice(n_docs, n, replace=False)
    else:
        start = int(rng.integers(0, n_docs - n + 1))
        pick = np.arange(start, start + n)
    m[pick] = rng.integers(1, 256, n).astype(np.uint8)
    return m


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(2022)
    n_docs, n_terms = 12_000, 40
    c = _corpus(rng, n_docs, n_terms)
    q = _queries(rng, n_terms, 24)
    term_ub, block_offsets, block_ub = K.bm25_upper_bounds(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"],
                                                           block_size=BLOCK)
    impacts = K.bm25_impacts(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"])
    dense = K.bm25_dense_bitmaps(c["offsets"], c["doc_ids"], n_docs, n_docs // 16)
    assert (dense[0] >= 0).sum() >= 2  # the longest lists have membership bitmaps
    return rng, c, q, (term_ub, block_offsets, block_ub), impacts, dense


def _run(c, q, k, allow, algorithm, plan, bounds, impacts=None, kth=None, dense=None):
    kw = {} if impacts is None else {"impacts": impacts}
    if algorithm != "exhaustive":
        kw.update(term_ub=bounds[0], block_offsets=bounds[1], block_ub=bounds[2], block_size=BLOCK)
        if kth is not None:
            kw.update(term_kth=kth, term_kth_depth=k)
        if dense is not None:
            kw.update(dense_slot=dense[0], dense_bits=dense[1], dense_rank=dense[2])
    return K.bm25_topk(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, k, n_threads=1, allow=allow,
                       algorithm=algorithm, filter_plan=plan, **kw)


@pytest.mark.parametrize("fraction", SELECTIVITIES)
@pytest.mark.parametrize("kind", ["random", "clustered"])
def test_every_plan_and_algorithm_equals_brute_force(setup, fraction, kind):
    rng, c, q, bounds, impacts, dense = setup
    allow = _mask(rng, len(c["doc_norm"]), fraction, kind)
    n_pass = int((allow != 0).sum())
    for k in sorted({10, n_pass + 7}):
        ref = bm25_topk_ref(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, k, allow)
        # the filtered threshold's term_kth is the unfiltered one (an upper bound it starts from)
        kth = K.bm25_term_kth(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"],
                              np.arange(len(c["offsets"]) - 1, dtype=np.uint32), k, impacts=impacts,
                              block_offsets=bounds[1], block_ub=bounds[2], block_size=BLOCK)
        for algorithm, plan, imp, tk, dn in itertools.product(ALGORITHMS, PLANS, (None, impacts), (None, kth),
                                                              (None, dense)):
            if algorithm == "exhaustive" and (tk is not None or dn is not None):
                continue
            got = _run(c, q, k, allow, algorithm, plan, bounds, imp, tk, dn)
            for g, r in zip(got, ref):
                np.testing.assert_array_equal(g, r, err_msg=f"{algorithm} {plan} k={k} {fraction} {kind}")
            assert np.all(allow[got[0][got[0] >= 0]] != 0)


def test_passing_plan_with_threads_and_negative_weights(setup):
    """Several threads (each lists the passing documents once) and negative weights (no pruning
    bound applies) give the exhaustive result."""
    rng, c, q, bounds, impacts, dense = setup
    q_neg = (q[0], q[1], np.where(rng.random(len(q[2])) < 0.4, -q[2], q[2]).astype(np.float32))
    allow = _mask(rng, len(c["doc_norm"]), 0.01, "random")
    for qq in (q, q_neg):
        ref = bm25_topk_ref(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *qq, 25, allow)
        for plan, threads in itertools.product(PLANS, (1, 3)):
            got = K.bm25_topk(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *qq, 25, n_threads=threads,
                              allow=allow, algorithm="maxscore", filter_plan=plan, term_ub=bounds[0],
                              impacts=impacts, dense_slot=dense[0], dense_bits=dense[1], dense_rank=dense[2])
            for g, r in zip(got, ref):
                np.testing.assert_array_equal(g, r)


def test_passing_plan_nothing_passes_and_bad_plan(setup):
    rng, c, q, bounds, impacts, dense = setup
    allow = np.zeros(len(c["doc_norm"]), np.uint8)
    ids, scores, n_found = K.bm25_topk(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, 5, allow=allow,
                                       algorithm="exhaustive", filter_plan="passing")
    assert (n_found == 0).all() and (ids == -1).all()
    with pytest.raises(ValueError, match="filter_plan must be one of 'auto', 'postings', 'passing'; got 'fast'"):
        K.bm25_topk(c["offsets"], c["doc_ids"], c["tfs"], c["doc_norm"], *q, 5, allow=allow,
                    algorithm="exhaustive", filter_plan="fast")


def test_passing_plan_rejects_out_of_range_doc_ids():
    """A doc id >= n_docs raises in the passing plan too, whether the list is walked or probed."""
    offsets = np.array([0, 3, 6], np.uint64)
    doc_ids = np.array([0, 2, 9, 1, 2, 3], np.uint32)  # term 0's last doc id is past n_docs = 5
    tfs = np.ones(6, np.uint32)
    norm = np.ones(5, np.float32)
    allow = np.array([1, 0, 1, 0, 0], np.uint8)
    q = (np.array([0, 1], np.uint64), np.array([0], np.uint32), np.array([1.0], np.float32))
    with pytest.raises(ValueError, match="doc id 9 >= n_docs = 5"):
        K.bm25_topk(offsets, doc_ids, tfs, norm, *q, 3, allow=allow, algorithm="exhaustive", filter_plan="passing")
