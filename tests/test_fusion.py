"""Fusion semantics (DESIGN.md): RRF with tie-shared ranks, linear with min-max / z-score / none,
absent legs contribute nothing, degenerate lists normalise to 1.0, deterministic tie order."""

from __future__ import annotations

import numpy as np
import pytest

from retriever.fusion import RRF, Linear, fuse, parse_fusion, tie_ranks
from retriever import QueryError


def leg(rows):
    """rows: list of [(id, score), ...] per query, already sorted desc → padded arrays."""
    depth = max(len(r) for r in rows) or 1
    ids = np.full((len(rows), depth), -1, np.int64)
    scores = np.full((len(rows), depth), -np.inf, np.float32)
    for i, r in enumerate(rows):
        for j, (d, s) in enumerate(r):
            ids[i, j], scores[i, j] = d, s
    return ids, scores, np.array([len(r) for r in rows], np.int32)


def test_tie_ranks_share_best_position():
    s = np.array([5, 4, 4, 4, 1, -np.inf], np.float32)
    assert tie_ranks(s, 5).tolist() == [1, 2, 2, 2, 5]


def test_rrf_formula_and_absent_legs():
    a = leg([[(10, 3.0), (11, 2.0), (12, 1.0)]])
    b = leg([[(12, 0.9), (13, 0.8)]])
    ids, scores, n, legs = fuse({"bm25": a, "dense": b}, 10, RRF(k=60))
    expect = {10: 1 / 61, 11: 1 / 62, 12: 1 / 63 + 1 / 61, 13: 1 / 62}
    got = dict(zip(ids[0, :n[0]].tolist(), scores[0, :n[0]].tolist()))
    assert got.keys() == expect.keys()
    for d in expect:
        assert got[d] == pytest.approx(expect[d], rel=1e-6)
    assert ids[0, 0] == 12
    # 11 and 13 tie at 1/62: smaller ordinal first
    assert ids[0, 1:4].tolist() == [10, 11, 13]
    j13 = ids[0].tolist().index(13)
    assert np.isnan(legs["bm25"].scores[0, j13]) and legs["bm25"].ranks[0, j13] == 0
    assert legs["dense"].ranks[0, j13] == 2


def test_rrf_ties_share_rank_and_weights():
    a = leg([[(1, 2.0), (2, 2.0), (3, 1.0)]])
    ids, scores, n, legs = fuse({"bm25": a}, 3, RRF(k=10, weights={"bm25": 2.0}))
    assert scores[0].tolist() == pytest.approx([2 / 11, 2 / 11, 2 / 13])
    assert legs["bm25"].ranks[0].tolist() == [1, 1, 3]


def test_linear_minmax_zscore_none():
    a = leg([[(1, 10.0), (2, 5.0), (3, 0.0)]])
    b = leg([[(3, 0.5), (4, 0.25)]])
    ids, scores, n, _ = fuse({"a": a, "b": b}, 4, Linear("minmax"))
    got = dict(zip(ids[0].tolist(), scores[0].tolist()))
    assert got == pytest.approx({1: 1.0, 2: 0.5, 3: 0.0 + 1.0, 4: 0.0})
    ids, scores, n, _ = fuse({"a": a}, 3, Linear("zscore"))
    z = (np.array([10, 5, 0]) - 5) / np.std([10, 5, 0])
    assert scores[0].tolist() == pytest.approx(z.tolist(), rel=1e-6)
    ids, scores, n, _ = fuse({"a": a, "b": b}, 4, Linear("none", weights={"b": 10}))
    got = dict(zip(ids[0].tolist(), scores[0].tolist()))
    assert got == pytest.approx({1: 10.0, 2: 5.0, 3: 5.0, 4: 2.5})


def test_degenerate_list_normalises_to_one_never_nan():
    a = leg([[(1, 3.0), (2, 3.0)], [(5, 7.0)]])
    for norm in ("minmax", "zscore"):
        ids, scores, n, _ = fuse({"a": a}, 2, Linear(norm))
        assert np.all(np.isfinite(scores[0, :2])) and scores[0, :2].tolist() == [1.0, 1.0]
        assert scores[1, 0] == 1.0 and n.tolist() == [2, 1]


def test_empty_legs_and_padding():
    a = leg([[], [(3, 1.0)]])
    b = leg([[], []])
    ids, scores, n, _ = fuse({"a": a, "b": b}, 5, RRF())
    assert n.tolist() == [0, 1]
    assert ids[0].tolist() == [-1] * 5 and np.all(np.isneginf(scores[0]))
    assert ids[1, 1:].tolist() == [-1] * 4


def test_prefix_property_and_determinism():
    rng = np.random.default_rng(0)
    rows_a = [[(int(d), float(s)) for d, s in zip(rng.permutation(50)[:30], sorted(rng.integers(0, 5, 30), reverse=True))]]
    rows_b = [[(int(d), float(s)) for d, s in zip(rng.permutation(50)[:30], sorted(rng.random(30), reverse=True))]]
    legs_in = {"a": leg(rows_a), "b": leg(rows_b)}
    big = fuse(legs_in, 40, RRF())
    for k in (1, 5, 17):
        small = fuse(legs_in, k, RRF())
        np.testing.assert_array_equal(small[0][0], big[0][0, :k])
    again = fuse(legs_in, 40, RRF())
    np.testing.assert_array_equal(again[0], big[0])


def test_parse_fusion_errors():
    assert isinstance(parse_fusion("linear:zscore"), Linear)
    with pytest.raises(QueryError, match="unknown fusion"):
        parse_fusion("borda")
    with pytest.raises(QueryError, match="normalisation"):
        Linear("softmax")
    with pytest.raises(QueryError, match="RRF k"):
        RRF(k=-1)
    with pytest.raises(QueryError, match="weight"):
        RRF(weights={"bm25": float("nan")})


def test_tie_ranks_rows_competition_ranks():
    """The one tie rule on whole batches (ties, -inf padding, n_found past the width or negative)
    against a search-sorted oracle; the one-row helper is the same rule."""
    from retriever.fusion import tie_ranks_rows

    rng = np.random.default_rng(0)
    for _ in range(200):
        nq, k = int(rng.integers(0, 5)), int(rng.integers(1, 12))
        s = -np.sort(-rng.choice(np.array([1, 2, 2.5, 3], np.float32), (nq, k)), axis=1)
        nf = rng.integers(-1, k + 2, nq).astype(np.int32)
        for q in range(nq):
            s[q, max(nf[q], 0):] = -np.inf
        got = tie_ranks_rows(s, nf)
        assert got.dtype == np.int32 and got.shape == (nq, k)
        for q in range(nq):
            n = min(max(int(nf[q]), 0), k)
            neg = -s[q, :n].astype(np.float64)
            want = np.zeros(k, np.int32)
            want[:n] = np.searchsorted(neg, neg, side="left") + 1
            np.testing.assert_array_equal(got[q], want)
            np.testing.assert_array_equal(tie_ranks(s[q], n), want[:n])
    with pytest.raises(ValueError):
        tie_ranks_rows(np.zeros((2, 3), np.float32), np.zeros(3, np.int32))


def _fuse_reference(legs, k, fusion):
    """Straightforward per-document fusion (dicts, no numpy tricks): the oracle for :func:`fuse`."""
    names = list(legs)
    nq = next(iter(legs.values()))[0].shape[0]
    out = []
    for q in range(nq):
        total: dict[int, float] = {}
        per: dict[str, dict[int, tuple[float, int]]] = {}
        for n in names:
            ids, scores, nf = legs[n]
            m = int(nf[q])
            w = float(fusion.weights.get(n, 1.0))
            s64 = scores[q, :m].astype(np.float64)
            per[n] = {}
            for j in range(m):
                rank = 1 + next(i for i in range(m) if scores[q, i] == scores[q, j])
                if isinstance(fusion, RRF):
                    c = w / (fusion.k + rank)
                else:
                    if fusion.norm == "minmax":
                        lo, hi = s64.min(), s64.max()
                        v = 1.0 if hi == lo else (s64[j] - lo) / (hi - lo)
                    elif fusion.norm == "zscore":
                        sd = s64.std()
                        v = 1.0 if sd == 0 else (s64[j] - s64.mean()) / sd
                    else:
                        v = s64[j]
                    c = w * v
                d = int(ids[q, j])
                total[d] = total.get(d, 0.0) + c
                per[n][d] = (float(scores[q, j]), rank)
        top = sorted(total, key=lambda d: (-total[d], d))[:k]
        out.append((top, [total[d] for d in top], per))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_fuse_matches_reference(seed):
    """Random leg lists (ties, empty rows, overlapping ids) against the dict-based oracle: ids,
    fused scores (float32 of the float64 sum), per-leg scores and tie-shared ranks."""
    rng = np.random.default_rng(seed)
    nq, depth, n_docs = 5, 25, 40
    legs = {}
    for n in ("bm25", "dense", "sparse"):
        ids = np.full((nq, depth), -1, np.int64)
        sc = np.full((nq, depth), -np.inf, np.float32)
        nf = np.zeros(nq, np.int32)
        for q in range(nq):
            m = int(rng.integers(0, depth + 1))
            d = rng.choice(n_docs, m, replace=False)
            s = rng.integers(0, 6, m).astype(np.float32) if seed % 2 else rng.random(m).astype(np.float32)
            o = np.lexsort((d, -s))
            ids[q, :m], sc[q, :m], nf[q] = d[o], s[o], m
        legs[n] = (ids, sc, nf)
    for fusion in (RRF(), RRF(k=2.0, weights={"dense": 3.0}), Linear("minmax"), Linear("zscore"),
                   Linear("none", weights={"bm25": 0.5})):
        for k in (1, 7, 60):
            ids, scores, n_found, per_leg = fuse(legs, k, fusion)
            for q, (top, tot, per) in enumerate(_fuse_reference(legs, k, fusion)):
                assert n_found[q] == len(top)
                assert ids[q, :len(top)].tolist() == top
                np.testing.assert_array_equal(scores[q, :len(top)], np.float32(tot))
                for n in legs:
                    for j, d in enumerate(top):
                        if d in per[n]:
                            assert per_leg[n].scores[q, j] == np.float32(per[n][d][0])
                            assert per_leg[n].ranks[q, j] == per[n][d][1]
                        else:
                            assert np.isnan(per_leg[n].scores[q, j]) and per_leg[n].ranks[q, j] == 0


@pytest.mark.parametrize("seed", range(8))
def test_compiled_rrf_bit_identical_to_loop(seed):
    """fuse() for RRF (one compiled call per batch) against fuse_loop (the numpy loop over queries):
    identical ids, fused float32 scores, per-leg scores (NaN where absent) and ranks, for legs of
    different depths, ties in leg scores and in fused scores, empty rows and legs, zero and
    negative weights, k from 1 to past the candidates, batches of 0..6 queries."""
    from retriever.fusion import fuse_loop

    rng = np.random.default_rng(100 + seed)
    for _ in range(40):
        nq = int(rng.integers(0, 7))
        n_docs = int(rng.integers(1, 60))
        legs = {}
        for n in ("bm25", "dense", "sparse")[: int(rng.integers(1, 4))]:
            depth = int(rng.integers(1, 30))
            ids = np.full((nq, depth), -1, np.int64)
            sc = np.full((nq, depth), -np.inf, np.float32)
            nf = np.zeros(nq, np.int32)
            for q in range(nq):
                m = int(rng.integers(0, min(depth, n_docs) + 1))
                d = rng.choice(n_docs, m, replace=False)
                s = (rng.integers(0, 4, m).astype(np.float32) if rng.random() < 0.5
                     else rng.standard_normal(m).astype(np.float32))
                o = np.lexsort((d, -s))
                ids[q, :m], sc[q, :m], nf[q] = d[o], s[o], m
            legs[n] = (ids, sc, nf)
        w = {n: float(rng.choice([1.0, 0.0, -0.5, 2.5, 1e-3])) for n in legs}
        for fusion in (RRF(), RRF(k=0.0), RRF(k=float(rng.integers(1, 100)), weights=w)):
            for k in (1, 3, 10, 200):
                a = fuse(legs, k, fusion)
                b = fuse_loop(legs, k, fusion)
                np.testing.assert_array_equal(a[0], b[0])
                np.testing.assert_array_equal(a[1], b[1])
                np.testing.assert_array_equal(a[2], b[2])
                assert list(a[3]) == list(b[3]) == list(legs)
                for n in legs:
                    np.testing.assert_array_equal(a[3][n].scores, b[3][n].scores)  # NaN == NaN here
                    np.testing.assert_array_equal(a[3][n].ranks, b[3][n].ranks)
                    assert a[3][n].scores.dtype == np.float32 and a[3][n].ranks.dtype == np.int32
                assert a[0].dtype == np.int64 and a[1].dtype == np.float32 and a[2].dtype == np.int32


def test_compiled_rrf_large_ids_and_out_of_range_counts():
    """The compiled RRF groups candidates with a hash table: ids that collide in it (multiples of
    the table size, values near 2**63) and n_found past the depth (clipped, as the loop's
    slices are) give the same result as fuse_loop."""
    from retriever.fusion import fuse_loop

    rng = np.random.default_rng(7)
    big = np.iinfo(np.int64).max
    pool = np.unique(np.concatenate([np.arange(0, 1 << 20, 1024), big - np.arange(50), rng.integers(0, big, 200)]))
    for _ in range(30):
        nq, depth = 3, 40
        legs = {}
        for n in ("bm25", "dense", "sparse"):
            ids = np.full((nq, depth), -1, np.int64)
            sc = np.full((nq, depth), -np.inf, np.float32)
            for q in range(nq):
                d = rng.choice(pool, depth, replace=False)
                s = rng.integers(0, 5, depth).astype(np.float32)
                o = np.lexsort((d, -s))
                ids[q], sc[q] = d[o], s[o]
            legs[n] = (ids, sc, rng.choice([0, 5, depth, depth + 7], nq).astype(np.int32))
        for k in (1, 10, 150):
            a, b = fuse(legs, k, RRF()), fuse_loop(legs, k, RRF())
            for x, y in zip(a[:3], b[:3]):
                np.testing.assert_array_equal(x, y)
            for n in legs:
                np.testing.assert_array_equal(a[3][n].scores, b[3][n].scores)
                np.testing.assert_array_equal(a[3][n].ranks, b[3][n].ranks)


def test_fusion_to_dict_is_exact():
    """The JSON description stored in results and benchmark files (a docstring once spliced into
    the "method" value by string concatenation)."""
    assert RRF(k=30, weights={"bm25": 2.0}).to_dict() == {"method": "rrf", "k": 30, "weights": {"bm25": 2.0}}
    assert Linear(norm="zscore").to_dict() == {"method": "linear", "norm": "zscore", "weights": {}}
    assert parse_fusion("linear:none").to_dict()["method"] == "linear"


def test_parse_fusion_one_parser_for_library_and_cli(bm25_index, capsys):
    """Names, weights (mapping or "leg=number" text) and the RRF k through the one parser; the
    CLI's --fusion/--weights/--rrf-k land on the same objects and errors."""
    import argparse

    from retriever.cli import _fusion, main
    from retriever.fusion import parse_weights

    from retriever.fusion import DEFAULT_FUSION

    assert parse_fusion(None) == DEFAULT_FUSION == RRF(k=40.0)  # the default since issue 24
    assert parse_fusion("rrf") == RRF()
    assert parse_fusion(None, weights="bm25=2") == RRF(k=40.0, weights={"bm25": 2.0})
    assert parse_fusion(None, rrf_k=7.0) == RRF(k=7.0)
    assert parse_fusion("linear") == Linear("minmax")
    assert parse_fusion("linear:none", weights="bm25=2, dense=0.5") == Linear("none", {"bm25": 2.0, "dense": 0.5})
    assert parse_fusion("rrf", weights={"bm25": 3}, rrf_k=10.0) == RRF(10.0, {"bm25": 3})
    obj = Linear("zscore", {"dense": 2.0})
    assert parse_fusion(obj) is obj
    assert parse_weights("bm25=1,dense=1.5") == {"bm25": 1.0, "dense": 1.5}
    for spec, kw, match in [("linearx", {}, "unknown fusion 'linearx'"), ("rrf:zscore", {}, "unknown fusion"),
                            ("linear:softmax", {}, "unknown normalisation 'softmax'"),
                            ("linear", {"rrf_k": 5.0}, "applies to 'rrf' only"),
                            (obj, {"weights": "bm25=1"}, "is an object"), (7, {}, "got int"),
                            ("rrf", {"weights": "bm25"}, "expected leg=number, got 'bm25'"),
                            ("rrf", {"weights": "bm25=1,bm25=2"}, "given twice"),
                            ("rrf", {"weights": "=1"}, "expected leg=number")]:
        with pytest.raises(QueryError, match=match):
            parse_fusion(spec, **kw)
    ns = argparse.Namespace(fusion="linear:zscore", weights="bm25=2", rrf_k=None)
    assert _fusion(ns) == Linear("zscore", {"bm25": 2.0})
    assert _fusion(argparse.Namespace(fusion="rrf", weights=None, rrf_k=20.0)) == RRF(20.0)
    rc = main(["search", str(bm25_index), "vitamin", "--mode", "bm25", "--fusion", "linear", "--rrf-k", "5"])
    assert rc == 1 and "applies to 'rrf' only" in capsys.readouterr().err
