"""DBSF, theoretical min-max, the theoretical range, RRF with per-leg k, per-leg depth (against
hand-computed values), the legs' theoretical score ranges (against every document's score) and
full-score fusion (against lists built from exhaustive single-leg searches)."""

from __future__ import annotations

import numpy as np
import pytest

from retriever import QueryError, Retriever, build_index
from retriever.fusion import RRF, Linear, fuse, fuse_loop, fusion_from_dict, parse_fusion
from tests.conftest import random_corpus
from tests.test_fusion import leg


def fused(legs, k, fusion, bounds=None):
    ids, scores, n, _ = fuse(legs, k, fusion, bounds)
    return dict(zip(ids[0, :n[0]].tolist(), scores[0, :n[0]].tolist()))


def test_dbsf_hand_computed():
    # leg a: mean 2, sample sigma 1 -> limits -1 .. 5 -> (s + 1) / 6; leg b one hit -> 1.0;
    # leg c no hit -> nothing
    a = leg([[(1, 3.0), (2, 2.0), (3, 1.0)]])
    b = leg([[(3, 7.0)]])
    c = leg([[]])
    got = fused({"a": a, "b": b, "c": c}, 5, Linear("dbsf"))
    assert got == pytest.approx({1: 4 / 6, 2: 3 / 6, 3: 2 / 6 + 1.0})
    # constant scores: sigma 0 -> 1.0 each
    assert fused({"a": leg([[(5, 2.0), (6, 2.0)]])}, 2, Linear("dbsf")) == pytest.approx({5: 1.0, 6: 1.0})
    assert parse_fusion("dbsf") == Linear("dbsf")


def test_tmm_and_theoretical_hand_computed():
    a = leg([[(1, 4.0), (2, 1.0)]])     # bm25-like: range [0, 8]
    b = leg([[(2, 0.5)]])               # cosine-like, one hit: range [-1, 1]
    c = leg([[]])                       # no hits
    bounds = {"a": (np.array([0.0]), np.array([8.0])), "b": (np.array([-1.0]), np.array([1.0])),
              "c": (np.array([0.0]), np.array([3.0]))}
    # tmm: (s - inf) / (max - inf)
    assert fused({"a": a, "b": b, "c": c}, 5, Linear("tmm"), bounds) == pytest.approx({1: 1.0, 2: 0.25 + 1.0})
    # theoretical: (s - inf) / (sup - inf)
    assert fused({"a": a, "b": b, "c": c}, 5, Linear("theoretical"), bounds) == pytest.approx(
        {1: 0.5, 2: 0.125 + 0.75})
    # constant scores: tmm 1.0 (max == every score), theoretical keeps the position in the range
    const = {"a": leg([[(1, 2.0), (2, 2.0)]])}
    assert fused(const, 2, Linear("tmm"), bounds) == pytest.approx({1: 1.0, 2: 1.0})
    assert fused(const, 2, Linear("theoretical"), bounds) == pytest.approx({1: 0.25, 2: 0.25})
    # all scores at the theoretical minimum, or an empty range: 1.0, never NaN
    zero = {"a": leg([[(1, 0.0)]])}
    assert fused(zero, 1, Linear("tmm"), bounds) == {1: 1.0}
    assert fused(zero, 1, Linear("theoretical"), {"a": (np.zeros(1), np.zeros(1))}) == {1: 1.0}
    with pytest.raises(QueryError, match="theoretical score range"):
        fuse(const, 2, Linear("tmm"))


def test_rrf_per_leg_k_and_depths():
    a = leg([[(1, 3.0), (2, 2.0), (3, 1.0)]])
    b = leg([[(3, 0.9), (4, 0.8), (5, 0.7)]])
    f = RRF(k=60, leg_k={"a": 1.0}, weights={"b": 2.0})
    assert fused({"a": a, "b": b}, 5, f) == pytest.approx({1: 1 / 2, 2: 1 / 3, 3: 1 / 4 + 2 / 61, 4: 2 / 62,
                                                            5: 2 / 63})
    # per-leg depth: leg b cut to max(depth, k) = 2 candidates
    got = fused({"a": a, "b": b}, 2, RRF(depths={"b": 1}))
    assert got == pytest.approx({3: 1 / 63 + 1 / 61, 1: 1 / 61})
    # a depth below k is raised to k (every leg can fill the fused top-k)
    assert fuse({"a": a, "b": b}, 5, RRF(depths={"b": 1}))[0].tolist() == fuse({"a": a, "b": b}, 5, RRF())[0].tolist()
    # compiled RRF equals the numpy reference with per-leg k
    for x, y in zip(fuse({"a": a, "b": b}, 5, f)[:3], fuse_loop({"a": a, "b": b}, 5, f)[:3]):
        assert np.array_equal(x, y)
    with pytest.raises(QueryError, match="leg 'a'"):
        RRF(leg_k={"a": -1.0})
    with pytest.raises(QueryError, match="depth for leg 'a'"):
        Linear(depths={"a": 0})


def test_gap_adaptive_weights_hand_computed():
    """Per-query adaptive weights: each leg's weight × ((max − mean) / σ)^γ of its list."""
    from retriever.fusion import gap_factor

    assert gap_factor(np.array([3.0, 1.0, 1.0, 1.0])) == pytest.approx(np.sqrt(3.0))  # the bound sqrt(n - 1)
    assert gap_factor(np.array([2.0, 0.0])) == 1.0 and gap_factor(np.array([4.0])) == 1.0  # one hit
    assert gap_factor(np.array([2.0, 2.0, 2.0])) == 1.0 and gap_factor(np.array([])) == 1.0  # constant, none
    a = leg([[(1, 3.0), (2, 1.0), (3, 1.0), (4, 1.0)]])  # gap sqrt(3); min-max 1, 0, 0, 0
    b = leg([[(2, 2.0), (3, 0.0)]])                      # gap 1; min-max 1, 0
    c = leg([[(5, 4.0)]])                                # one hit: gap 1, min-max 1
    d = leg([[]])                                        # no hits: nothing
    legs = {"a": a, "b": b, "c": c, "d": d}
    assert fused(legs, 5, Linear("minmax", gap_power=2.0)) == pytest.approx({1: 3.0, 2: 1.0, 3: 0.0, 4: 0.0, 5: 1.0})
    assert fused(legs, 5, Linear("minmax", weights={"a": 0.5}, gap_power=1.0)) == pytest.approx(
        {1: 0.5 * np.sqrt(3.0), 2: 1.0, 3: 0.0, 4: 0.0, 5: 1.0})
    assert fused(legs, 5, Linear("minmax", gap_power=0.0)) == fused(legs, 5, Linear("minmax"))
    for bad in (-1.0, float("nan"), 9.0, True):
        with pytest.raises(QueryError, match="gap_power"):
            Linear(gap_power=bad)


def test_to_dict_round_trip():
    for f in (RRF(), RRF(20.0, {"bm25": 2.0}, {"dense": 5.0}, {"bm25": 50}, True),
              Linear("tmm", {"dense": 0.3}, {"sparse": 200}, True), Linear("dbsf"),
              Linear("zscore", {"bm25": 0.3}, gap_power=1.0)):
        assert fusion_from_dict(f.to_dict()) == f
    assert Linear("dbsf").to_dict() == {"method": "linear", "norm": "dbsf", "weights": {}}
    assert RRF().to_dict() == {"method": "rrf", "k": 60.0, "weights": {}}  # unchanged for old settings


@pytest.fixture(scope="module")
def syn(tmp_path_factory):
    """A three-leg index of a synthetic corpus (random unit dense vectors, random sparse vectors),
    in three shards, with query vectors for both vector legs."""
    rng = np.random.default_rng(0)
    docs = random_corpus(360, seed=3)
    n, dim, vocab = len(docs), 16, 300
    dv = rng.normal(size=(n, dim)).astype(np.float32)
    dv /= np.linalg.norm(dv, axis=1, keepdims=True)
    indptr, terms, weights = [0], [], []
    for _ in range(n):
        t = np.sort(rng.choice(vocab, size=int(rng.integers(1, 12)), replace=False))
        terms += t.tolist()
        weights += rng.uniform(0.1, 3.0, len(t)).tolist()
        indptr.append(len(terms))
    out = tmp_path_factory.mktemp("fz") / "syn"
    build_index(docs, out, legs=("bm25", "dense", "sparse"), dense_vectors=dv, shard_size=130, show_progress=False,
                sparse_vectors=(np.array(indptr, np.int64), np.array(terms, np.int32), np.array(weights, np.float32)))
    import scipy.sparse

    qs = ["vitamin bone risk", "heart heart", "", "cancer cell therapy dose", "sleep"]
    qv = rng.normal(size=(len(qs), dim)).astype(np.float32)
    sv = scipy.sparse.random(len(qs), 30522, density=0.0, format="lil", dtype=np.float32)
    for i in range(len(qs)):
        for t in rng.choice(vocab, size=3, replace=False):
            sv[i, int(t)] = float(rng.uniform(0.2, 2.0))
    sv[4] = 0  # a query with no sparse terms
    sv[4, 7] = 1.5  # ... one term only
    return out, qs, qv, sv.tocsr(), n


def _exhaustive(r, qs, qv, sv, n):
    """Every document's score per leg (exhaustive single-leg searches; absent = 0)."""
    out = {}
    for name in r.legs:
        res = r.search_arrays(qs, k=n, mode=name, query_vectors=qv, sparse_vectors=sv)
        out[name] = [dict(zip(res.ids[i, :res.n_found[i]].tolist(), res.scores[i, :res.n_found[i]].tolist()))
                     for i in range(len(qs))]
    return out


def test_bounds_hold_every_document(syn):
    path, qs, qv, sv, n = syn
    r = Retriever.open(path)
    every = _exhaustive(r, qs, qv, sv, n)
    eng = r.engine
    for name in r.legs:
        leg_obj = eng.legs[name]
        if name == "bm25":
            prep = leg_obj.prepare(qs, None, 1)
        elif name == "dense":
            prep = leg_obj.prepare_vectors(qv, None, 1)
        else:
            prep = leg_obj.prepare_vectors(sv, None, 1)
        inf, sup = eng.bounds.bounds(name, prep)
        for i in range(len(qs)):
            vals = list(every[name][i].values()) + ([0.0] if name != "dense" else [])
            assert min(vals) >= inf[i] - 1e-6 and max(vals) <= sup[i] * (1 + 1e-6) + 1e-9, (name, i)
        if name == "dense":
            assert np.allclose(sup, np.linalg.norm(qv, axis=1), rtol=1e-3) and np.allclose(inf, -sup)
        if name == "sparse":  # one-term query: the bound is the best document's score
            assert sup[4] == pytest.approx(max(every["sparse"][4].values()), rel=1e-6)
        if name == "bm25":  # "heart heart": 2 x idf(heart); the tf part stays below 1
            q_off, _, q_w = leg_obj.batch_of(prep, 1)
            assert sup[1] == pytest.approx(float(np.float64(q_w[q_off[1]:q_off[2]]).sum()))
            assert max(every["bm25"][1].values()) < sup[1]
            assert sup[2] == inf[2] == 0.0  # blank query


@pytest.mark.parametrize("fusion", [RRF(full_score=True), Linear("minmax", full_score=True),
                                    Linear("tmm", {"dense": 0.5}, full_score=True),
                                    RRF(k=5, depths={"bm25": 8}, full_score=True)])
def test_full_score_equals_exhaustive_oracle(syn, fusion):
    """Full-score fusion equals fuse_loop over lists made from exhaustive single-leg searches:
    each leg's list = the union of the legs' top-depth candidates, scored with every document's
    exhaustive score (0 where a sparse leg does not match), sorted by score then ordinal."""
    path, qs, qv, sv, n = syn
    r = Retriever.open(path)
    k, depth = 6, 10
    got = r.search_arrays(qs, k=k, fusion=fusion, depth=depth, query_vectors=qv, sparse_vectors=sv)
    assert "full_score" in got.timings_ms
    # the result reports the depths the legs were searched at (a fusion's per-leg depths override the call's)
    assert got.fusion.get("depths") == ({name: max(fusion.depths.get(name, depth), k) for name in r.legs}
                                        if fusion.depths else None)
    assert got.fusion.get("depth") == (None if fusion.depths else depth)
    every = _exhaustive(r, qs, qv, sv, n)
    tops = {name: r.search_arrays(qs, k=max(fusion.depths.get(name, depth), k), mode=name, query_vectors=qv,
                                  sparse_vectors=sv) for name in r.legs}
    width = sum(t.ids.shape[1] for t in tops.values())
    lists = {}
    for name in r.legs:
        ids = np.full((len(qs), width), -1, np.int64)
        scores = np.full((len(qs), width), -np.inf, np.float32)
        nf = np.zeros(len(qs), np.int32)
        for i in range(len(qs)):
            union = sorted({int(d) for t in tops.values() for d in t.ids[i, :t.n_found[i]]})
            pairs = sorted(((every[name][i].get(d, 0.0), d) for d in union), key=lambda p: (-p[0], p[1]))
            nf[i] = len(pairs)
            for j, (s, d) in enumerate(pairs):
                ids[i, j], scores[i, j] = d, s
        lists[name] = (ids, scores, nf)
    bounds = None
    if getattr(fusion, "needs_bounds", False):
        bounds = {}
        for name, prep in (("bm25", r.engine.legs["bm25"].prepare(qs, None, 1)),
                           ("dense", r.engine.legs["dense"].prepare_vectors(qv, None, 1)),
                           ("sparse", r.engine.legs["sparse"].prepare_vectors(sv, None, 1))):
            bounds[name] = r.engine.bounds.bounds(name, prep)
    plain = type(fusion)(**{**{f: getattr(fusion, f) for f in fusion.__dataclass_fields__}, "depths": {},
                            "full_score": False})
    ids, scores, nf, _ = fuse_loop(lists, k, plain, bounds)
    assert np.array_equal(got.ids, ids) and np.array_equal(got.n_found, nf)
    assert np.array_equal(got.scores, scores)


def test_a_weight_past_floats_range_is_a_query_error():
    """An int weight too large for a float is a QueryError naming the leg (was a TypeError from
    numpy); one within range but above the limit names the limit."""
    from retriever.fusion import Linear

    with pytest.raises(QueryError, match="'bm25' must be a finite number"):
        Linear(weights={"bm25": 10**400})
    with pytest.raises(QueryError, match="must be <= 1e"):
        Linear(weights={"bm25": 10**31})
