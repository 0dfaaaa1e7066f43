"""BM25 over several shards in one call (``_kernels.bm25_topk_shards``, ``BM25Leg.search_shards``):
one top-k heap per query carried from shard to shard must give exactly the per-shard top-k merged
(ids identical, scores bit for bit) for every algorithm, shard layout, filter, depth and k1/b; bad
arguments raise errors naming the argument."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import random_corpus
from retriever import Retriever, _kernels, build_index
from retriever.engine import search_leg
from retriever.legs.base import SearchContext
from retriever.legs.bm25 import BM25Prepared, drop_terms
from retriever.params import BM25SearchParams
from retriever.topk import merge_topk

ALGORITHMS = ("exhaustive", "maxscore", "bmw", "bmm", "auto")


# ---------------------------------------------------------------- kernel level: random postings
def _random_shard(rng: np.random.Generator, n_docs: int, n_terms: int) -> dict:
    """One shard's bm25_topk_shards bundle: random postings over n_docs documents and n_terms
    terms (long and short lists, tfs above the kernel's tf table), few distinct doc_norm values
    (many tied scores), with every optional structure the leg passes."""
    offsets = [0]
    doc_ids, tfs = [], []
    for t in range(n_terms):
        p = [0.0, 0.02, 0.2, 0.7][t % 4] if n_docs else 0.0
        docs = np.flatnonzero(rng.random(n_docs) < p).astype(np.uint32)
        doc_ids.append(docs)
        tfs.append(np.where(rng.random(len(docs)) < 0.05, 40, rng.integers(1, 4, len(docs))).astype(np.uint32))
        offsets.append(offsets[-1] + len(docs))
    offsets = np.asarray(offsets, np.uint64)
    doc_ids = np.concatenate(doc_ids) if doc_ids else np.zeros(0, np.uint32)
    tfs = np.concatenate(tfs) if tfs else np.zeros(0, np.uint32)
    doc_norm = rng.choice(np.float32([0.5, 0.9, 1.3]), n_docs).astype(np.float32)
    term_ub, block_offsets, block_ub = _kernels.bm25_upper_bounds(offsets, doc_ids, tfs, doc_norm, block_size=8)
    impacts = _kernels.bm25_impacts(offsets, doc_ids, tfs, doc_norm)
    slot, bits, rank = _kernels.bm25_dense_bitmaps(offsets, doc_ids, n_docs, max(1, n_docs // 8))
    b = {"offsets": offsets, "doc_ids": doc_ids, "tfs": tfs, "doc_norm": doc_norm, "impacts": impacts,
         "term_ub": term_ub, "block_offsets": block_offsets, "block_ub": block_ub, "block_size": 8,
         "dense_slot": slot, "dense_bits": bits, "dense_rank": rank}
    if n_docs:
        rslot, rows = _kernels.bm25_impact_rows(offsets, doc_ids, impacts, n_docs, min_df=max(1, n_docs // 2),
                                                max_rows=2)
        if len(rows):
            b["impact_rows"], b["impact_row_slot"] = rows, rslot
    return b


def _random_queries(rng: np.random.Generator, nq: int, n_terms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A ragged batch of distinct terms per query (some queries empty), weights in a few values."""
    offs, terms = [0], []
    for i in range(nq):
        n = 0 if i % 7 == 3 else int(rng.integers(1, 6))
        terms.append(rng.choice(n_terms, size=min(n, n_terms), replace=False))
        offs.append(offs[-1] + len(terms[-1]))
    q_terms = np.concatenate(terms).astype(np.uint32)
    q_weights = rng.choice(np.float32([0.5, 1.0, 2.25]), len(q_terms)).astype(np.float32)
    return np.asarray(offs, np.uint64), q_terms, q_weights


def _reference(bundles, bases, batch, depth, algorithm, n_threads=1):
    """bm25_topk on each shard (terms beyond its vocabulary dropped), global ordinals, merge_topk."""
    q_offsets, q_terms, q_weights = batch
    parts = []
    for b, base in zip(bundles, bases):
        n_terms = len(b["offsets"]) - 1
        offs, terms, weights = drop_terms(q_offsets, q_terms, q_weights, q_terms < n_terms)
        kw = {key: v for key, v in b.items() if key not in ("offsets", "doc_ids", "tfs", "doc_norm")}
        ids, scores, n_found = _kernels.bm25_topk(b["offsets"], b["doc_ids"], b["tfs"], b["doc_norm"], offs,
                                                  terms, weights, depth, n_threads=n_threads,
                                                  algorithm=algorithm, **kw)
        parts.append((np.where(ids >= 0, ids + base, -1), scores, n_found))
    return merge_topk(parts, depth)


def _assert_same(got, want) -> None:
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1].view(np.uint32), want[1].view(np.uint32))  # bit for bit
    np.testing.assert_array_equal(got[2], want[2])


def _layout(rng: np.random.Generator, sizes: list[int], n_terms: int) -> tuple[list[dict], np.ndarray]:
    """Shards of the given sizes, each with a vocabulary of at most n_terms (shorter for some), and
    their bases (with a gap between some shards: ordinals need only ascend)."""
    bundles, bases, base = [], [], 0
    for i, n in enumerate(sizes):
        t = n_terms if i % 2 == 0 else max(1, n_terms - 3 * i)
        bundles.append(_random_shard(rng, n, t))
        bases.append(base)
        base += n + (5 if i == 1 else 0)
    return bundles, np.asarray(bases, np.int64)


@pytest.mark.parametrize("sizes", [[40, 40, 40], [1, 0, 7, 130, 0, 64], [300, 5], [0, 0], [90]])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_kernel_equals_per_shard_merged(sizes, algorithm):
    rng = np.random.default_rng(len(sizes) * 31 + sum(sizes))
    n_terms = 24
    bundles, bases = _layout(rng, sizes, n_terms)
    batch = _random_queries(rng, 60, n_terms)
    for depth in (1, 3, 10, 500):  # 500: deeper than any query's matches
        want = _reference(bundles, bases, batch, depth, algorithm)
        for n_threads in (1, 3):
            got = _kernels.bm25_topk_shards(bundles, bases, *batch, depth, n_terms=n_terms, n_threads=n_threads,
                                            algorithm=algorithm)
            _assert_same(got, want)
    assert (want[2].max() > 0) == (sum(sizes) > 0)  # the corpora match something


@pytest.mark.parametrize("algorithm", ["auto", "maxscore"])
def test_kernel_auto_over_many_documents(algorithm):
    """Over more than BM25_AUTO_EXHAUSTIVE_DOCS documents in all, "auto" picks per query by the
    postings of all shards together (MaxScore for the long queries, exhaustive for the others)."""
    rng = np.random.default_rng(21)
    sizes = [40000, 0, 30000]
    assert sum(sizes) > _kernels.BM25_AUTO_EXHAUSTIVE_DOCS
    bundles, bases = _layout(rng, sizes, 12)
    batch = _random_queries(rng, 40, 12)
    for depth in (1, 10):
        want = _reference(bundles, bases, batch, depth, "exhaustive")
        _assert_same(_kernels.bm25_topk_shards(bundles, bases, *batch, depth, n_terms=12, n_threads=2,
                                               algorithm=algorithm), want)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_kernel_with_term_kth_and_allow(algorithm):
    """Single-term thresholds (without a filter) and allow masks per shard (some None)."""
    rng = np.random.default_rng(7)
    n_terms, depth = 20, 4
    bundles, bases = _layout(rng, [120, 60, 0, 200], n_terms)
    batch = _random_queries(rng, 50, n_terms)
    with_kth = []
    for b in bundles:
        terms = np.arange(len(b["offsets"]) - 1, dtype=np.uint32)
        kth = _kernels.bm25_term_kth(b["offsets"], b["doc_ids"], b["tfs"], b["doc_norm"], terms, depth,
                                     impacts=b["impacts"])
        with_kth.append({**b, "term_kth": kth, "term_kth_depth": depth})
    want = _reference(bundles, bases, batch, depth, "exhaustive")
    if algorithm != "exhaustive":
        _assert_same(_reference(with_kth, bases, batch, depth, algorithm), want)
    got = _kernels.bm25_topk_shards(with_kth if algorithm != "exhaustive" else bundles, bases, *batch, depth,
                                    n_terms=n_terms, algorithm=algorithm)
    _assert_same(got, want)
    masked = [{**b, "allow": (rng.random(len(b["doc_norm"])) < 0.4).astype(np.uint8)} if i != 1 else b
              for i, b in enumerate(bundles)]
    want = _reference(masked, bases, batch, depth, "exhaustive")
    got = _kernels.bm25_topk_shards(masked, bases, *batch, depth, n_terms=n_terms, algorithm=algorithm)
    _assert_same(got, want)
    allowed = np.concatenate([np.flatnonzero(m.get("allow", np.ones(len(m["doc_norm"]), np.uint8))) + base
                              for m, base in zip(masked, bases)])
    assert np.isin(got[0][got[0] >= 0], allowed).all()


def test_kernel_negative_weights():
    """Negative weights (scored exhaustively by every algorithm) through the carried heap."""
    rng = np.random.default_rng(3)
    bundles, bases = _layout(rng, [50, 80, 30], 16)
    q_offsets, q_terms, q_weights = _random_queries(rng, 30, 16)
    q_weights = np.where(rng.random(len(q_weights)) < 0.3, -q_weights, q_weights).astype(np.float32)
    batch = (q_offsets, q_terms, q_weights)
    want = _reference(bundles, bases, batch, 6, "exhaustive")
    for algorithm in ALGORITHMS:
        _assert_same(_kernels.bm25_topk_shards(bundles, bases, *batch, 6, n_terms=16, algorithm=algorithm), want)


def _concatenated(bundles, bases) -> dict:
    """One shard holding every shard's postings at its global ordinals (the gaps between shards
    as documents without postings): what a one-shard index of the same documents holds."""
    n_docs = int(bases[-1]) + len(bundles[-1]["doc_norm"]) if len(bundles) else 0
    n_terms = max(len(b["offsets"]) - 1 for b in bundles)
    doc_norm = np.full(n_docs, 0.7, np.float32)
    for b, base in zip(bundles, bases):
        doc_norm[base:base + len(b["doc_norm"])] = b["doc_norm"]
    docs, tfs, offsets = [], [], [0]
    for t in range(n_terms):
        for b, base in zip(bundles, bases):
            if t < len(b["offsets"]) - 1:
                lo, hi = int(b["offsets"][t]), int(b["offsets"][t + 1])
                docs.append(b["doc_ids"][lo:hi].astype(np.int64) + base)
                tfs.append(b["tfs"][lo:hi])
        offsets.append(sum(map(len, docs)))
    offsets = np.asarray(offsets, np.uint64)
    doc_ids = np.concatenate(docs).astype(np.uint32)
    tfs = np.concatenate(tfs).astype(np.uint32)
    term_ub, block_offsets, block_ub = _kernels.bm25_upper_bounds(offsets, doc_ids, tfs, doc_norm, block_size=8)
    impacts = _kernels.bm25_impacts(offsets, doc_ids, tfs, doc_norm)
    return {"offsets": offsets, "doc_ids": doc_ids, "tfs": tfs, "doc_norm": doc_norm, "impacts": impacts,
            "term_ub": term_ub, "block_offsets": block_offsets, "block_ub": block_ub, "block_size": 8}


UNION_LAYOUTS = [[120, 60, 0, 200], [1, 0, 7, 130, 0, 64], [0, 90], [300]]


@pytest.mark.parametrize("sizes", UNION_LAYOUTS)
def test_term_kth_over_shards_equals_one_shard(sizes):
    """bm25_term_kth_shards over the shards = bm25_term_kth of one shard holding their postings,
    for every term (also those beyond a shard's vocabulary), with and without impacts and blocks,
    at depths 1 to deeper than any list."""
    rng = np.random.default_rng(sum(sizes) + len(sizes))
    bundles, bases = _layout(rng, sizes, 20)
    one = _concatenated(bundles, bases)
    terms = np.arange(len(one["offsets"]) - 1, dtype=np.uint32)[::-1].copy()
    for depth in (1, 4, 10, 400):
        want = _kernels.bm25_term_kth(one["offsets"], one["doc_ids"], one["tfs"], one["doc_norm"], terms, depth,
                                      impacts=one["impacts"])
        for strip in ((), ("impacts",), ("block_offsets", "block_ub"), ("impacts", "block_offsets", "block_ub")):
            shards = [{k: v for k, v in b.items() if k not in strip} for b in bundles]
            got = _kernels.bm25_term_kth_shards(shards, terms, depth, n_threads=2)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        if depth == 4:
            assert np.isfinite(want).any() and np.isinf(want).any()  # both kinds of answer occur
    assert len(_kernels.bm25_term_kth_shards(bundles, np.zeros(0, np.uint32), 3)) == 0


@pytest.mark.parametrize("sizes", UNION_LAYOUTS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_kernel_with_union_term_kth_equals_one_shard(sizes, algorithm):
    """bm25_topk_shards with the union's single-term thresholds (term_kth from
    bm25_term_kth_shards) = the per-shard top-k merged = bm25_topk on one shard holding every
    posting (with its own term_kth), ids and scores bit for bit: every algorithm, depths beyond
    a shard's size, empty shards, empty queries and queries of terms no shard has, with allow
    masks (where the thresholds are not used)."""
    rng = np.random.default_rng(5 * sum(sizes) + 1)
    n_terms = 22
    bundles, bases = _layout(rng, sizes, n_terms - 2)  # the last two terms: in no shard
    one = _concatenated(bundles, bases)
    q_offsets, q_terms, q_weights = _random_queries(rng, 70, n_terms)
    batch = (q_offsets, q_terms, q_weights)
    for depth in (1, 3, 10, 150):
        kth = _kernels.bm25_term_kth_shards(bundles, np.arange(n_terms, dtype=np.uint32), depth)
        want = _reference(bundles, bases, batch, depth, "exhaustive")
        got = _kernels.bm25_topk_shards(bundles, bases, *batch, depth, n_terms=n_terms, algorithm=algorithm,
                                        term_kth=kth, term_kth_depth=depth)
        _assert_same(got, want)
        keep = q_terms < len(one["offsets"]) - 1
        offs, terms, weights = drop_terms(q_offsets, q_terms, q_weights, keep)
        one_kth = kth[:len(one["offsets"]) - 1].copy()
        kw = {k: v for k, v in one.items() if k not in ("offsets", "doc_ids", "tfs", "doc_norm")}
        ids, scores, n_found = _kernels.bm25_topk(one["offsets"], one["doc_ids"], one["tfs"], one["doc_norm"], offs,
                                                  terms, weights, depth, algorithm=algorithm, term_kth=one_kth,
                                                  term_kth_depth=depth, **kw)
        _assert_same(got, (ids, scores, n_found))
        masks = [(rng.random(len(b["doc_norm"])) < 0.5).astype(np.uint8) if i % 2 == 0 else None
                 for i, b in enumerate(bundles)]
        masked = [b if m is None else {**b, "allow": m} for b, m in zip(bundles, masks)]
        _assert_same(_kernels.bm25_topk_shards(masked, bases, *batch, depth, n_terms=n_terms, algorithm=algorithm,
                                               term_kth=kth, term_kth_depth=depth),
                     _reference(masked, bases, batch, depth, "exhaustive"))
    assert want[2].max() > 0


def test_union_term_kth_arguments():
    rng = np.random.default_rng(2)
    bundles, bases = _layout(rng, [30, 20], 10)
    batch = _random_queries(rng, 5, 10)
    kth = _kernels.bm25_term_kth_shards(bundles, np.arange(10, dtype=np.uint32), 5)
    with pytest.raises(ValueError, match=r"term_kth_depth = 4 must equal k = 5"):
        _kernels.bm25_topk_shards(bundles, bases, *batch, 5, n_terms=10, term_kth=kth, term_kth_depth=4)
    with pytest.raises(ValueError, match=r"len\(term_kth\) = 9 must equal n_terms = 10"):
        _kernels.bm25_topk_shards(bundles, bases, *batch, 5, n_terms=10, term_kth=kth[:9], term_kth_depth=5)
    with pytest.raises(ValueError, match=r"depth must be >= 1, got 0"):
        _kernels.bm25_term_kth_shards(bundles, np.arange(3, dtype=np.uint32), 0)
    with pytest.raises(ValueError, match=r"shards\[1\]: len\(impacts\)"):
        _kernels.bm25_term_kth_shards([bundles[0], {**bundles[1], "impacts": bundles[1]["impacts"][:-1]}],
                                      np.arange(3, dtype=np.uint32), 2)
    bad = bundles[0]["block_offsets"].copy()
    bad[2:] += 1
    with pytest.raises(ValueError, match=r"shards\[0\]: block_offsets\[1:3\]"):
        _kernels.bm25_term_kth_shards([{**bundles[0], "block_offsets": bad}, bundles[1]],
                                      np.arange(3, dtype=np.uint32), 2)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_shard_set_equals_per_call_kernel(algorithm):
    """BM25ShardSet.topk (shards parsed once) = bm25_topk_shards on the same bundles, with and
    without per-call allow masks and union thresholds; BM25ShardSet.term_kth =
    bm25_term_kth_shards."""
    rng = np.random.default_rng(17)
    n_terms = 20
    bundles, bases = _layout(rng, [120, 0, 60, 200], n_terms)
    batch = _random_queries(rng, 50, n_terms)
    shard_set = _kernels.BM25ShardSet(bundles, bases, n_terms=n_terms)
    assert (shard_set.n_shards, shard_set.n_terms) == (4, n_terms)
    terms = np.arange(n_terms, dtype=np.uint32)
    for depth in (1, 4, 300):
        kth = shard_set.term_kth(terms, depth)
        np.testing.assert_array_equal(kth, _kernels.bm25_term_kth_shards(bundles, terms, depth))
        want = _reference(bundles, bases, batch, depth, "exhaustive")
        _assert_same(shard_set.topk(*batch, depth, algorithm=algorithm), want)
        _assert_same(shard_set.topk(*batch, depth, algorithm=algorithm, term_kth=kth, term_kth_depth=depth), want)
        masks = [(rng.random(len(b["doc_norm"])) < 0.3).astype(np.uint8) if i != 2 else None
                 for i, b in enumerate(bundles)]
        masked = [b if m is None else {**b, "allow": m} for b, m in zip(bundles, masks)]
        _assert_same(shard_set.topk(*batch, depth, n_threads=2, algorithm=algorithm, allow=masks),
                     _reference(masked, bases, batch, depth, "exhaustive"))


def test_shard_set_arguments():
    rng = np.random.default_rng(4)
    bundles, bases = _layout(rng, [30, 20], 10)
    batch = _random_queries(rng, 5, 10)
    shard_set = _kernels.BM25ShardSet(bundles, bases)
    with pytest.raises(ValueError, match=r"len\(allow\) = 1 must equal the set's shards = 2"):
        shard_set.topk(*batch, 5, allow=[None])
    with pytest.raises(ValueError, match=r"allow\[1\]: len\(allow\) = 3"):
        shard_set.topk(*batch, 5, allow=[None, np.ones(3, np.uint8)])
    with pytest.raises(TypeError, match=r"allow\[0\] must be None or a C-contiguous numpy array of dtype uint8"):
        shard_set.topk(*batch, 5, allow=[np.ones(30, np.int64), None])
    with pytest.raises(ValueError, match=r"'allow' is not part of a shard set"):
        _kernels.BM25ShardSet([{**bundles[0], "allow": np.ones(30, np.uint8)}, bundles[1]], bases)
    with pytest.raises(ValueError, match=r"bases\[1\] = 10 must be >= bases\[0\] \+ n_docs"):
        _kernels.BM25ShardSet(bundles, np.int64([0, 10]))
    no_ub = _kernels.BM25ShardSet([bundles[0], {k: v for k, v in bundles[1].items() if k != "term_ub"}], bases)
    no_ub.topk(*batch, 5, algorithm="exhaustive")
    with pytest.raises(ValueError, match=r"shards\[1\]: algorithm 'maxscore' requires term_ub"):
        no_ub.topk(*batch, 5, algorithm="maxscore")
    no_blocks = _kernels.BM25ShardSet([{k: v for k, v in bundles[0].items() if k not in ("block_offsets", "block_ub")},
                                       bundles[1]], bases)
    no_blocks.topk(*batch, 5, algorithm="maxscore")
    with pytest.raises(ValueError, match=r"shards\[0\]: algorithm 'bmw' requires block_offsets"):
        no_blocks.topk(*batch, 5, algorithm="bmw")
    with pytest.raises(ValueError, match=r"q_terms\[0\] = 10"):
        shard_set.topk(batch[0], np.where(batch[1] == batch[1][0], 10, batch[1]).astype(np.uint32), batch[2], 5)


# ---------------------------------------------------------------- kernel level: term maps
def _mapped(b: dict, drop_every: int = 0) -> dict:
    """The bundle of the same shard in its own term ids (a living index's segment): only the
    terms with postings listed (``terms``: their index term ids, ascending), every per-term
    array computed from the shorter offsets as the leg computes it."""
    lens = np.diff(b["offsets"].astype(np.int64))
    terms = np.flatnonzero(lens).astype(np.uint32)
    offsets = np.zeros(len(terms) + 1, np.uint64)
    np.cumsum(lens[terms], out=offsets[1:])
    doc_ids, tfs, doc_norm = b["doc_ids"], b["tfs"], b["doc_norm"]
    term_ub, block_offsets, block_ub = _kernels.bm25_upper_bounds(offsets, doc_ids, tfs, doc_norm, block_size=8)
    impacts = _kernels.bm25_impacts(offsets, doc_ids, tfs, doc_norm)
    n_docs = len(doc_norm)
    slot, bits, rank = _kernels.bm25_dense_bitmaps(offsets, doc_ids, n_docs, max(1, n_docs // 8))
    m = {"offsets": offsets, "doc_ids": doc_ids, "tfs": tfs, "doc_norm": doc_norm, "impacts": impacts,
         "term_ub": term_ub, "block_offsets": block_offsets, "block_ub": block_ub, "block_size": 8,
         "dense_slot": slot, "dense_bits": bits, "dense_rank": rank, "terms": terms}
    if "impact_rows" in b:
        rslot, rows = _kernels.bm25_impact_rows(offsets, doc_ids, impacts, n_docs, min_df=max(1, n_docs // 2),
                                                max_rows=2)
        if len(rows):
            m["impact_rows"], m["impact_row_slot"] = rows, rslot
    return m


@pytest.mark.parametrize("sizes", UNION_LAYOUTS + [[40, 40, 40]])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_term_maps_equal_index_term_ids(sizes, algorithm):
    """Shards given in their own term ids with a term map (every other shard, or all) give
    exactly what the same shards in the index's term ids give: bm25_topk_shards with and
    without union thresholds and allow masks, BM25ShardSet, bm25_term_kth_shards; the map's
    per-term arrays are as long as the shard's own vocabulary."""
    rng = np.random.default_rng(7 * sum(sizes) + 3)
    n_terms = 22
    bundles, bases = _layout(rng, sizes, n_terms - 2)  # the last two terms: in no shard
    batch = _random_queries(rng, 70, n_terms)
    terms = np.arange(n_terms, dtype=np.uint32)
    for pick in (lambda i: i % 2 == 1, lambda i: True):
        mixed = [_mapped(b) if pick(i) else b for i, b in enumerate(bundles)]
        assert any("terms" in b and len(b["offsets"]) - 1 < len(bundles[i]["offsets"]) - 1
                   for i, b in enumerate(mixed)) or sum(sizes) == 0 or len(sizes) == 1
        shard_set = _kernels.BM25ShardSet(mixed, bases, n_terms=n_terms)
        for depth in (1, 3, 10, 150):
            kth = _kernels.bm25_term_kth_shards(bundles, terms, depth)
            np.testing.assert_array_equal(_kernels.bm25_term_kth_shards(mixed, terms, depth).view(np.uint32),
                                          kth.view(np.uint32))
            np.testing.assert_array_equal(shard_set.term_kth(terms, depth).view(np.uint32), kth.view(np.uint32))
            want = _reference(bundles, bases, batch, depth, "exhaustive")
            for n_threads in (1, 3):
                _assert_same(_kernels.bm25_topk_shards(mixed, bases, *batch, depth, n_terms=n_terms,
                                                       n_threads=n_threads, algorithm=algorithm), want)
            _assert_same(_kernels.bm25_topk_shards(mixed, bases, *batch, depth, n_terms=n_terms, algorithm=algorithm,
                                                   term_kth=kth, term_kth_depth=depth), want)
            _assert_same(shard_set.topk(*batch, depth, algorithm=algorithm, term_kth=kth, term_kth_depth=depth), want)
            masks = [(rng.random(len(b["doc_norm"])) < 0.5).astype(np.uint8) if i % 2 == 0 else None
                     for i, b in enumerate(bundles)]
            masked = [b if m is None else {**b, "allow": m} for b, m in zip(bundles, masks)]
            _assert_same(shard_set.topk(*batch, depth, n_threads=2, algorithm=algorithm, allow=masks),
                         _reference(masked, bases, batch, depth, "exhaustive"))
    assert want[2].max() > 0 or sum(sizes) == 0


def test_term_map_arguments():
    bundles, bases, batch = _small_call()
    m = _mapped(bundles[1])
    assert len(m["terms"]) >= 3
    _call([bundles[0], m], bases, batch)
    bad = m["terms"].copy()
    bad[2] = bad[1]
    with pytest.raises(ValueError, match=r"shards\[1\]: terms\[2\] = \d+ is not above terms\[1\]"):
        _call([bundles[0], {**m, "terms": bad}], bases, batch)
    with pytest.raises(ValueError, match=r"shards\[1\]: len\(terms\) = \d+ must equal len\(offsets\) - 1"):
        _call([bundles[0], {**m, "terms": m["terms"][:-1]}], bases, batch)
    with pytest.raises(TypeError, match=r"shards\[1\]\['terms'\] must be a C-contiguous numpy array of dtype uint32"):
        _call([bundles[0], {**m, "terms": m["terms"].astype(np.int64)}], bases, batch)
    with pytest.raises(ValueError, match=r"shards\[1\]: terms\[2\]"):
        _kernels.bm25_term_kth_shards([bundles[0], {**m, "terms": bad}], np.arange(3, dtype=np.uint32), 2)
    with pytest.raises(ValueError, match=r"shards\[1\]: terms\[2\]"):
        _kernels.BM25ShardSet([bundles[0], {**m, "terms": bad}], bases)
    # a map reaching past n_terms: the set spans the map's last term
    far = {**m, "terms": (m["terms"] + 100).astype(np.uint32)}
    assert _kernels.BM25ShardSet([bundles[0], far], bases).n_terms == int(m["terms"][-1]) + 101
    with pytest.raises(ValueError, match=r"n_terms = 10 is below a shard's vocabulary"):
        _call([bundles[0], far], bases, batch, n_terms=10)


# ---------------------------------------------------------------- kernel level: bad arguments
def _small_call():
    rng = np.random.default_rng(11)
    bundles, bases = _layout(rng, [30, 20], 10)
    batch = _random_queries(rng, 5, 10)
    return bundles, bases, batch


def _call(bundles, bases, batch, **kw):
    kw.setdefault("n_terms", 10)
    return _kernels.bm25_topk_shards(bundles, bases, *batch, kw.pop("k", 5), **kw)


@pytest.mark.parametrize("edit, match", [
    (lambda b, s, q: (b, s[:1], q), r"len\(bases\) = 1 must equal len\(shards\) = 2"),
    (lambda b, s, q: (b, np.int64([0, 10]), q), r"bases\[1\] = 10 must be >= bases\[0\] \+ n_docs"),
    (lambda b, s, q: (b, np.int64([-1, 40]), q), r"bases\[0\] = -1"),
    (lambda b, s, q: (b, np.int64([0, 2**32 - 10]), q), r"exceeds the supported maximum"),
    (lambda b, s, q: ([b[0], {**b[1], "tfs": b[1]["tfs"][:-1]}], s, q), r"shards\[1\]: len\(tfs\)"),
    (lambda b, s, q: ([{**b[0], "term_ub": b[0]["term_ub"][:-1]}, b[1]], s, q), r"shards\[0\]: len\(term_ub\)"),
    (lambda b, s, q: ([{**b[0], "allow": np.ones(3, np.uint8)}, b[1]], s, q), r"shards\[0\]: len\(allow\) = 3"),
    (lambda b, s, q: ([{**b[0], "doc_norm": b[0]["doc_norm"][:-1]}, b[1]], s, q), r"shards\[0\]: "),
    (lambda b, s, q: ([{**b[0], "dense_rank": b[0]["dense_rank"][:-1]}, b[1]], s, q), r"shards\[0\]: len\(dense_rank\)"),
    (lambda b, s, q: ([{**b[0], "impacts": b[0]["impacts"][:-1]}, b[1]], s, q), r"shards\[0\]: len\(impacts\)"),
    (lambda b, s, q: ([b[0], {**b[1], "term_kth": b[1]["term_ub"], "term_kth_depth": 3}], s, q),
     r"shards\[1\]: term_kth_depth = 3 must equal k = 5"),
    (lambda b, s, q: ([b[0], {**b[1], "bogus": 1}], s, q), r"shards\[1\] has an unknown key 'bogus'"),
    (lambda b, s, q: ([b[0], {k: v for k, v in b[1].items() if k != "doc_ids"}], s, q),
     r"shards\[1\] lacks the array 'doc_ids'"),
    (lambda b, s, q: ([b[0], {k: v for k, v in b[1].items() if k != "term_ub"}], s, q),
     r"shards\[1\]: algorithm 'maxscore' requires term_ub"),
    (lambda b, s, q: (b, s, (q[0], np.where(q[1] == q[1][0], 10, q[1]).astype(np.uint32), q[2])),
     r"q_terms\[0\] = 10"),
    (lambda b, s, q: (b, s, (q[0], q[1], q[2][:-1])), r"len\(q_weights\)"),
    (lambda b, s, q: (b, s, (q[0][:-1], q[1], q[2])), r"q_offsets\[-1\]"),
])
def test_bad_arguments_raise_value_error_naming_them(edit, match):
    bundles, bases, batch = _small_call()
    _call(bundles, bases, batch)  # the unedited call is fine
    b, s, q = edit(bundles, bases, batch)
    with pytest.raises(ValueError, match=match):
        _call(b, s, q)


def test_bad_argument_types_and_scalars():
    bundles, bases, batch = _small_call()
    with pytest.raises(TypeError, match=r"shards\[0\]\['doc_ids'\] must be a C-contiguous numpy array of dtype uint32"):
        _call([{**bundles[0], "doc_ids": bundles[0]["doc_ids"].astype(np.int64)}, bundles[1]], bases, batch)
    with pytest.raises(TypeError, match=r"shards\[1\] must be a dict"):
        _call([bundles[0], [1, 2]], bases, batch)
    with pytest.raises(TypeError, match=r"shards\[0\]\['block_size'\] must be an int"):
        _call([{**bundles[0], "block_size": 8.0}, bundles[1]], bases, batch, algorithm="bmw")
    with pytest.raises(ValueError, match=r"shards\[0\]: block_offsets\[-1\] = \d+ must equal len\(block_ub\)"):
        _call([{**bundles[0], "block_ub": bundles[0]["block_ub"][:-1]}, bundles[1]], bases, batch, algorithm="bmw")
    with pytest.raises(ValueError, match=r"shards\[0\]: block_size must be in"):
        _call([{**bundles[0], "block_size": 0}, bundles[1]], bases, batch, algorithm="bmm")
    with pytest.raises(ValueError, match=r"k must be >= 1, got 0"):
        _call(bundles, bases, batch, k=0)
    with pytest.raises(ValueError, match=r"n_terms = 4 is below a shard's vocabulary"):
        _call(bundles, bases, batch, n_terms=4)
    with pytest.raises(ValueError, match=r"unknown|algorithm"):
        _call(bundles, bases, batch, algorithm="nope")
    with pytest.raises(TypeError):
        _call(bundles, bases.astype(np.int32), batch)


# ---------------------------------------------------------------- leg level: built indexes
QUERIES = ["alpha beta", "gamma", "the of and", "zzzz", "", "delta epsilon zeta eta theta", "beta beta beta"]


def _corpus() -> list[dict]:
    """A random corpus whose later documents bring new words (earlier shards have shorter
    vocabularies) and repeat a few common ones (ties)."""
    docs = random_corpus(300, seed=4, min_len=1, max_len=30)
    for i, d in enumerate(docs[200:]):
        d["text"] += f" late{i % 13} late{i % 5}"
    return docs


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    docs = _corpus()
    out = {}
    for size in (300, 64, 37, 300 // 7 + 1):
        path = tmp_path_factory.mktemp(f"s{size}")
        build_index(docs, path, legs=("bm25",), shard_size=size, show_progress=False)
        out[size] = Retriever.open(path)
    return docs, out


def _queries(docs) -> list[str]:
    rng = np.random.default_rng(9)
    words = " ".join(d["text"] for d in docs).split()
    return QUERIES + [" ".join(rng.choice(words, int(rng.integers(1, 6)))) for _ in range(40)] + \
        [f"late{i} late{i + 1}" for i in range(6)]


@pytest.mark.parametrize("size", [64, 37, 43])
def test_leg_search_shards_equals_per_shard_merge(indexes, size):
    docs, idx = indexes
    leg = idx[size].engine.legs["bm25"]
    assert leg.n_shards > 1
    assert any(ks["n_terms"] < len(leg.idf) for ks in leg.kernel_shards)  # shorter vocabularies
    queries = _queries(docs)
    batch = leg.query_terms(queries)
    rng = np.random.default_rng(size)
    masks = [None, [(rng.random(len(ks["doc_norm"])) < 0.5).astype(np.uint8) if i % 2 else None
                    for i, ks in enumerate(leg.kernel_shards)]]
    for k1b in ({}, {"k1": 1.6, "b": 0.9}):
        for algorithm in ALGORITHMS:
            p = BM25SearchParams(algorithm=algorithm, **k1b)
            scoring = leg.kernel_shards if not k1b else leg._scoring(*p.resolve(leg.params))
            prep = BM25Prepared(queries, algorithm, scoring, batch, None)
            for depth in (1, 10, 400):
                for allow in masks:
                    ctx = SearchContext(depth=depth, n_threads=2, allow=allow)
                    want = merge_topk([leg.search_shard(prep, s, ctx) for s in range(leg.n_shards)], depth)
                    _assert_same(leg.search_shards(prep, range(leg.n_shards), ctx), want)
                    _assert_same(search_leg(leg, prep, ctx), want)
                    sub = [2, 0] if leg.n_shards > 2 else [1]  # a subset, in any order
                    want = merge_topk([leg.search_shard(prep, s, ctx) for s in sub], depth)
                    _assert_same(leg.search_shards(prep, sub, ctx), want)


@pytest.mark.parametrize("size", [64, 37, 43])
def test_layouts_give_one_shard_results(indexes, size):
    """Through the public API: the multi-shard index answers exactly as the one-shard index."""
    docs, idx = indexes
    queries = _queries(docs)
    for algorithm in ALGORITHMS:
        a = idx[300].search_arrays(queries, k=15, mode="bm25", leg_params={"bm25": {"algorithm": algorithm}})
        b = idx[size].search_arrays(queries, k=15, mode="bm25", leg_params={"bm25": {"algorithm": algorithm}})
        _assert_same((b.ids, b.scores, b.n_found), (a.ids, a.scores, a.n_found))
