"""Retriever.refresh carries BM25 state from one generation to the next (retriever.legs.bm25_carry):
no pass over the postings of segments it already scored, results bit-identical to a fresh open of
the same generation (every algorithm, with and without deletes and filters), carried bounds and
thresholds safe against the exact ones, statistics equal to a full combine, query token caches
carried without hiding new terms."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from retriever import IndexUpdater, Retriever, _kernels, build_index
from retriever.legs import bm25_carry

ALGOS = ("auto", "exhaustive", "maxscore", "bmw", "bmm")
WORDS = [f"w{i}" for i in range(400)]
ZIPF = np.array([1.0 / (i + 1) for i in range(len(WORDS))])
ZIPF /= ZIPF.sum()


def doc(i: int, rng: np.random.Generator, long: bool = False) -> dict:
    n = int(rng.integers(150, 300)) if long else int(rng.integers(3, 60))
    return {"_id": f"d{i}", "text": " ".join(rng.choice(WORDS, size=n, p=ZIPF)), "year": int(rng.integers(1990, 2021))}


def queries(n: int = 40) -> list[str]:
    rnd = random.Random(3)
    return [" ".join(rnd.choice(WORDS[:120]) for _ in range(rnd.randint(1, 5))) for _ in range(n)]


def build(tmp_path, n: int = 1600, shard_size: int = 400):
    rng = np.random.default_rng(0)
    path = tmp_path / "idx"
    build_index([doc(i, rng) for i in range(n)], path, legs=("bm25",), shard_size=shard_size, show_progress=False)
    return path, rng


def assert_same_as_fresh_open(r: Retriever, qs: list[str], filt=None) -> None:
    fresh = Retriever.open(r.reader.path)
    assert fresh.reader.generation == r.reader.generation
    for algo in ALGOS:
        for k in (1, 10, 100):
            p = {"bm25": {"algorithm": algo}}
            a = r.search_arrays(qs, k=k, mode="bm25", leg_params=p, filter=filt)
            b = fresh.search_arrays(qs, k=k, mode="bm25", leg_params=p, filter=filt)
            assert np.array_equal(a.n_found, b.n_found), (algo, k)
            assert np.array_equal(a.ids, b.ids), (algo, k)
            assert np.array_equal(a.scores, b.scores), (algo, k)  # bit for bit
    la, lb = r.engine.legs["bm25"], fresh.engine.legs["bm25"]
    assert (la.N, la.stats.sum_dl) == (lb.N, lb.stats.sum_dl) and np.array_equal(la.df, lb.df)
    assert np.array_equal(la.idf, lb.idf)


class Counting:
    """Counts calls of a kernel (wrapped on the module, where the leg looks it up)."""

    def __init__(self, monkeypatch, name: str) -> None:
        self.calls = 0
        real = getattr(_kernels, name)

        def wrapped(*a, **kw):
            self.calls += 1
            return real(*a, **kw)

        monkeypatch.setattr(_kernels, name, wrapped)


def test_refresh_scores_old_segments_without_a_pass_over_their_postings(tmp_path, monkeypatch):
    path, rng = build(tmp_path)
    qs = queries()
    r = Retriever.open(path)
    for algo in ALGOS:  # thresholds filled at two depths
        r.search_arrays(qs, k=10, mode="bm25", leg_params={"bm25": {"algorithm": algo}})
        r.search_arrays(qs, k=100, mode="bm25", leg_params={"bm25": {"algorithm": algo}})
    old = r.engine.legs["bm25"]
    n_old = len(old.shards)
    # a multi-shard search starts from thresholds over the union of the shards, so fill each
    # shard's own single-term thresholds (what a one-shard search uses and a refresh carries)
    terms = np.unique(old.query_terms(qs, 1)[1])
    for ks in old.kernel_shards:
        for depth in (10, 100):
            old._term_kth(ks, terms[terms < ks["n_terms"]], depth, 1)
    with IndexUpdater.open(path) as u:
        u.add([doc(10_000 + j, rng) for j in range(30)])
        u.delete(["d5", "d401"])  # tombstones in segments 0 and 1; 2 and 3 stay clean
        u.commit()
    bounds, impacts = Counting(monkeypatch, "bm25_upper_bounds"), Counting(monkeypatch, "bm25_impacts")
    assert r.refresh()
    leg = r.engine.legs["bm25"]
    assert leg.avgdl != old.avgdl
    assert bounds.calls == impacts.calls == len(leg.shards) - n_old == 1  # the new segment only
    for i, ks in enumerate(leg.kernel_shards):
        assert (ks["impacts"] is None) == (i < n_old)
    assert_same_as_fresh_open(r, qs)
    assert_same_as_fresh_open(r, qs[:10], filt={"year": {"$gte": 2005}})
    # the carried bounds are upper bounds of the exact ones, and close to them
    for ks in leg.kernel_shards[:n_old]:
        term_ub, block_offsets, block_ub = _kernels.bm25_upper_bounds(
            ks["offsets"], ks["doc_ids"], ks["tfs"], ks["doc_norm"], block_size=128, n_threads=1)
        assert np.array_equal(block_offsets, ks["block_offsets"])
        assert (ks["term_ub"] >= term_ub).all() and (ks["block_ub"] >= block_ub).all()
        # within the avgdl drift and one step of the factor's grid
        loose = bm25_carry.drift(ks["exact"][0], leg.avgdl) ** 2 * (1 + bm25_carry.UB_GRID) * (1 + 1e-5)
        assert (ks["block_ub"] <= block_ub.astype(np.float64) * loose).all()
    # the carried single-term thresholds are at most the exact ones (clean segments only use them)
    checked = 0
    for ks in leg.kernel_shards[2:n_old]:
        for depth in (10, 100):  # filled from the carried thresholds where they exist
            leg._term_kth(ks, terms[terms < ks["n_terms"]], depth, 1)
        for depth, arr in ks["kth"].items():
            have = np.flatnonzero(~np.isnan(arr))
            if not len(have):
                continue
            exact = _kernels.bm25_term_kth(ks["offsets"], ks["doc_ids"], ks["tfs"], ks["doc_norm"],
                                           have.astype(np.uint32), depth, n_threads=1)
            assert (arr[have] <= exact).all()
            checked += len(have)
    assert checked > 0


def test_carried_scores_of_given_documents_are_the_kernels(tmp_path):
    path, rng = build(tmp_path, n=800)
    r = Retriever.open(path)
    with IndexUpdater.open(path) as u:
        u.add([doc(10_000 + j, rng) for j in range(10)])
        u.commit()
    assert r.refresh()
    leg = r.engine.legs["bm25"]
    qs = queries(12)
    prep = leg.prepare(qs)
    res = r.search_arrays(qs, k=50, mode="bm25", leg_params={"bm25": {"algorithm": "exhaustive"}})
    base = leg.kernel_shards[0]["base"]
    rows = leg.shards[0][0].rows
    for q in range(len(qs)):
        ids = res.ids[q, :res.n_found[q]]
        inside = (ids >= base) & (ids < base + rows)
        offs = np.array([0, int(inside.sum())], dtype=np.int64)
        one = leg.prepare([qs[q]])
        got = leg.score_docs(one, 0, offs, (ids[inside] - base).astype(np.int64))
        assert np.array_equal(got, res.scores[q, :res.n_found[q]][inside])
    assert prep.n_queries == len(qs)


def test_past_the_drift_the_exact_state_is_recomputed(tmp_path):
    path, rng = build(tmp_path, n=800)
    r = Retriever.open(path)
    avg0 = r.engine.legs["bm25"].avgdl
    with IndexUpdater.open(path) as u:
        u.add([doc(20_000 + j, rng, long=True) for j in range(200)])  # avgdl grows far past 5 %
        u.commit()
    assert r.refresh()
    leg = r.engine.legs["bm25"]
    assert bm25_carry.drift(avg0, leg.avgdl) > bm25_carry.MAX_DRIFT
    assert all(ks["impacts"] is not None and ks["exact"][0] == leg.avgdl for ks in leg.kernel_shards)
    assert_same_as_fresh_open(r, queries(20))


def test_many_refreshes_stay_identical_to_a_fresh_open(tmp_path):
    path, rng = build(tmp_path, n=1200, shard_size=300)
    qs = queries(30)
    r = Retriever.open(path)
    r.search_arrays(qs, k=10, mode="bm25", leg_params={"bm25": {"algorithm": "maxscore"}})
    nxt = 30_000
    with IndexUpdater.open(path) as u:
        for step in range(5):
            u.add([doc(nxt + j, rng) for j in range(15)])
            u.delete([f"d{step * 7 + 900}", f"d{nxt - 3}"] if step else [f"d{step + 1}"])
            nxt += 15
            u.commit()
            assert r.refresh()
            r.search_arrays(qs, k=10, mode="bm25", leg_params={"bm25": {"algorithm": "bmw"}})
        u.compact()
    assert r.refresh()
    assert_same_as_fresh_open(r, qs)
    assert_same_as_fresh_open(r, qs[:10], filt={"year": {"$lt": 2000}})


@pytest.mark.parametrize("batch", [1, 20])
def test_carried_token_caches_find_terms_added_later(tmp_path, batch):
    path, rng = build(tmp_path, n=400)
    r = Retriever.open(path)
    qs = ["brandnewterm w1"] + [f"w{i} w{i + 1}" for i in range(batch - 1)]
    before = r.search_batch(qs, k=5, mode="bm25")
    assert "x" not in [h.id for h in before[0]]
    with IndexUpdater.open(path) as u:
        u.add([{"_id": "x", "text": "brandnewterm", "year": 2000}])
        u.commit()
    assert r.refresh()
    leg = r.engine.legs["bm25"]
    assert leg._token_ids or leg._table is not None  # something was carried
    after = r.search_batch(qs, k=5, mode="bm25")
    assert after[0][0].id == "x"
    fresh = Retriever.open(path).search_batch(qs, k=5, mode="bm25")
    assert [[(h.id, h.score) for h in hs] for hs in after] == [[(h.id, h.score) for h in hs] for hs in fresh]


def test_scaled_bounds_bracket_the_exact_products():
    rng = np.random.default_rng(5)
    a = np.concatenate([rng.random(3000, dtype=np.float32) * rng.choice([1e-30, 1e-3, 1.0, 7.0, 3e30], 3000),
                        np.array([0.0, np.inf, -np.inf, np.nan, np.finfo(np.float32).tiny,
                                  np.finfo(np.float32).max / 2], dtype=np.float32)]).astype(np.float32)
    for g in (1.0, 1.0 + 2.0 ** -30, 1.0009765625, 1.0437, 1.05 * (1 + 4 * bm25_carry.SLACK)):
        up = bm25_carry.scaled_up(a, g)
        assert up.dtype == np.float32 and up.shape == a.shape
        for x, y in zip(a.tolist(), up.tolist()):
            if np.isnan(x):
                assert np.isnan(y)
            elif np.isinf(x):
                assert y == x
            else:
                assert Fraction(y) >= Fraction(x) * Fraction(g), (x, g, y)
                assert y <= x * g * (1 + 2.0 ** -19) + 1e-45  # and tight
    for f in (1.0, 1.0 - 2.0 ** -30, 0.97, 0.95 * (1 - 4 * bm25_carry.SLACK)):
        down = bm25_carry.scaled_down(a, f)
        for x, y in zip(a.tolist(), down.tolist()):
            if np.isnan(x):
                assert np.isnan(y)
            elif np.isinf(x):
                assert y == x
            else:
                assert Fraction(y) <= Fraction(x) * Fraction(f), (x, f, y)
                assert y >= x * f * (1 - 2.0 ** -19) - 1e-45


def test_ub_factor_is_on_its_grid_and_above_the_drift():
    step = 1 + bm25_carry.UB_GRID
    for then, now in ((100.0, 100.0), (100.0, 99.0), (100.0, 100.0001), (60.2, 60.9), (60.0, 63.0), (1.0, 1.05)):
        g = bm25_carry.ub_factor(then, now)
        raw = max(1.0, now / then) * (1 + 4 * bm25_carry.SLACK)
        assert g >= raw and g < raw * step * (1 + 1e-12)
        j = round(np.log(g) / np.log(step))
        assert j >= 1 and g == step ** j
    # nearby avgdl values (a small commit) give the same factor
    assert bm25_carry.ub_factor(100.0, 100.001) == bm25_carry.ub_factor(100.0, 100.002) == bm25_carry.ub_factor(100.0, 99.0)


def test_small_commits_share_the_scaled_bounds_of_the_previous_generation(tmp_path, monkeypatch):
    path, rng = build(tmp_path, n=1600, shard_size=400)
    qs = queries()
    r = Retriever.open(path)
    nxt = 40_000
    with IndexUpdater.open(path) as u:
        u.add([doc(nxt + j, rng) for j in range(4)])
        u.commit()
        assert r.refresh()  # the first carry scales every old segment's exact bounds once
        first = r.engine.legs["bm25"]
        avg0 = first.kernel_shards[0]["exact"][0]
        for step in range(3):
            nxt += 4
            u.add([doc(nxt + j, rng) for j in range(2)])
            u.delete([f"d{10 + step}"])
            u.commit()
            prev = r.engine.legs["bm25"]
            scale = Counting(monkeypatch, "bm25_upper_bounds")
            assert r.refresh()
            leg = r.engine.legs["bm25"]
            assert leg.avgdl != prev.avgdl
            assert scale.calls == 1  # the new segment only
            for ks, pk in zip(leg.kernel_shards[:4], prev.kernel_shards[:4]):
                assert ks["exact"][0] == avg0
                if bm25_carry.ub_factor(avg0, leg.avgdl) == pk["ub_g"]:
                    # the same grid factor: the very same arrays, nothing rescaled
                    assert ks["block_ub"] is pk["block_ub"] and ks["term_ub"] is pk["term_ub"]
            assert_same_as_fresh_open(r, qs)
    shared = sum(ks["block_ub"] is pk["block_ub"] for ks, pk in zip(leg.kernel_shards[:4], first.kernel_shards[:4]))
    assert shared == 4  # avgdl moved by far less than a grid step: every old segment shares them


def test_union_thresholds_are_carried_across_a_refresh_and_stay_below_the_exact_ones(tmp_path):
    path, rng = build(tmp_path, n=1600, shard_size=400)  # no tombstones: union thresholds in use
    qs = queries()
    r = Retriever.open(path)
    r.search_arrays(qs, k=10, mode="bm25", leg_params={"bm25": {"algorithm": "maxscore"}})
    old = r.engine.legs["bm25"]
    (okey, old_arr), = [(k, v) for k, v in old.kernel_shards[0]["shared"]["union_kth"].items() if k[1] == 10]
    filled = np.flatnonzero(~np.isnan(old_arr))
    assert len(filled) > 0
    with IndexUpdater.open(path) as u:
        u.add([doc(50_000 + j, rng, long=True) for j in range(12)])  # avgdl grows: the factor is < 1
        u.commit()
    assert r.refresh()
    leg = r.engine.legs["bm25"]
    assert leg.avgdl > old.avgdl
    r.search_arrays(qs, k=10, mode="bm25", leg_params={"bm25": {"algorithm": "maxscore"}})
    key = (tuple(range(len(leg.kernel_shards))), 10)  # the old shards plus the new one
    arr = leg.kernel_shards[0]["shared"]["union_kth"][key]
    want = bm25_carry.scaled_down(old_arr[filled], bm25_carry.kth_factor(old.avgdl, leg.avgdl))
    assert np.array_equal(arr[filled], want, equal_nan=True)  # carried, not recomputed
    # a fresh open's exact union thresholds over the same segments are at least the carried ones
    fresh = Retriever.open(path)
    fresh.search_arrays(qs, k=10, mode="bm25", leg_params={"bm25": {"algorithm": "maxscore"}})
    exact = fresh.engine.legs["bm25"].kernel_shards[0]["shared"]["union_kth"][key]
    finite = np.isfinite(arr[filled])
    assert finite.sum() > 0
    assert (arr[filled][finite] <= exact[filled][finite]).all()
    assert (arr[filled][finite] < exact[filled][finite]).any()  # really carried (avgdl moved)
    assert_same_as_fresh_open(r, qs)
    # a compaction replaces the segments: nothing carried from a union over segments now gone
    with IndexUpdater.open(path) as u:
        u.compact(full=True)
    assert r.refresh()
    leg = r.engine.legs["bm25"]
    assert not leg.kernel_shards[0]["shared"].get("union_prior")
    assert_same_as_fresh_open(r, qs)
