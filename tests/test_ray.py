"""Scale-out on Ray (issue 25): search through Ray actors and builds through Ray equal one process.

One local Ray cluster for the whole module (``ray.init(num_cpus=2)``, no dashboard, worker logs
kept off the terminal), shut down at the end. Actors ask for no CPUs (``num_cpus_per_worker=0``)
so that 1, 2 and 3 actors (and actors of earlier tests that Ray is still reaping) fit on the 2
CPUs of the test cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from conftest import random_corpus  # noqa: E402

from retriever import DistributedError, RayExecutor, Retriever, build_index  # noqa: E402
from retriever.index.errors import ConfigError, QueryError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("bm25", "dense", "sparse", "hybrid")
QUERIES = ["vitamin bone fracture", "heart blood pressure", "", "insulin sugar diet liver",
           "cell gene cancer therapy", "memory sleep brain", "virus immune", "zzz unknown"]


def executor(n: int, **kw) -> RayExecutor:
    return RayExecutor(num_workers=n, num_cpus_per_worker=0, **kw)


@pytest.fixture(scope="module")
def ray_cluster():
    """A local two-CPU Ray cluster for this module's tests, shut down afterwards.

    The GCS declares a raylet dead after ``health_check_failure_threshold`` missed health checks
    (5 x 3 s by default), and a driver whose raylet is declared dead exits at once (exit status 1,
    no report). On a loaded two-core CI machine, where these tests SIGKILL workers while the
    rest of the suite's threads compete for the cores, that must not end the test run: the
    threshold is raised for this test cluster only."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 logging_level="ERROR",
                 _system_config={"health_check_failure_threshold": 100, "health_check_timeout_ms": 30000})
    yield ray
    if started:
        ray.shutdown()


def corpus_records(n: int = 120) -> list[dict]:
    """The synthetic corpus with a metadata field of each type (``year`` int, ``tag`` string)."""
    docs = random_corpus(n, seed=7)
    for i, d in enumerate(docs):
        d.pop("meta")
        if i % 4:
            d["year"] = 1990 + i % 30
        if i % 5 == 0:
            d["tag"] = ["a", "b", "c"][i % 3]
    return docs


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    """The corpus as a BEIR folder (``corpus.jsonl``)."""
    folder = tmp_path_factory.mktemp("beir") / "syn"
    folder.mkdir()
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
        for d in corpus_records():
            f.write(json.dumps(d) + "\n")
    return folder


BUILD = {"legs": ("bm25", "dense", "sparse"), "shard_size": 25, "batch_size": 8}


@pytest.fixture(scope="module")
def local_index(tmp_path_factory, corpus_file) -> Path:
    """The one-process build: 120 documents, 5 shards, every leg."""
    out = tmp_path_factory.mktemp("idx") / "local"
    build_index(corpus_file, out, show_progress=False, **BUILD)
    return out


@pytest.fixture(scope="module")
def local(local_index):
    with Retriever.open(local_index) as r:
        yield r


def same_result(a, b, what: str) -> None:
    """Ids, fused scores and every leg's scores and ranks bit for bit."""
    assert np.array_equal(a.ids, b.ids), what
    assert np.array_equal(a.n_found, b.n_found), what
    assert np.array_equal(a.scores, b.scores, equal_nan=True), what
    assert a.legs.keys() == b.legs.keys(), what
    for leg in a.legs:
        assert np.array_equal(a.legs[leg].scores, b.legs[leg].scores, equal_nan=True), (what, leg)
        assert np.array_equal(a.legs[leg].ranks, b.legs[leg].ranks), (what, leg)


def check_every_mode(local, remote, where: str) -> None:
    for mode in MODES:
        fusions = ("rrf", "linear", "linear:zscore") if mode == "hybrid" else (None,)
        for fz in fusions:
            for k, depth in ((10, None), (3, 7), (60, 200)):
                what = f"{where} mode={mode} fusion={fz} k={k} depth={depth}"
                same_result(local.search_arrays(QUERIES, k, mode=mode, fusion=fz, depth=depth),
                            remote.search_arrays(QUERIES, k, mode=mode, fusion=fz, depth=depth), what)
    params = {"bm25": {"algorithm": "exhaustive", "k1": 1.2, "b": 0.75}, "sparse": {"algorithm": "seismic"}}
    same_result(local.search_arrays(QUERIES, 10, leg_params=params),
                remote.search_arrays(QUERIES, 10, leg_params=params), f"{where} leg_params")
    qv = np.random.default_rng(0).standard_normal((len(QUERIES), 384)).astype(np.float32)
    same_result(local.search_arrays(QUERIES, 10, query_vectors=qv), remote.search_arrays(QUERIES, 10, query_vectors=qv),
                f"{where} query_vectors")
    assert [h.id for h in local.search("vitamin bone", k=5)] == [h.id for h in remote.search("vitamin bone", k=5)]
    for flt in ({"year": {"$gte": 2005}}, {"tag": "a"}, {"$or": [{"tag": "b"}, {"year": {"$lt": 1995}}]}):
        for mode in MODES:
            same_result(local.search_arrays(QUERIES, 10, mode=mode, filter=flt),
                        remote.search_arrays(QUERIES, 10, mode=mode, filter=flt), f"{where} {mode} filter {flt}")
    per_query = [{"tag": "c"} if i % 2 else None for i in range(len(QUERIES))]
    same_result(local.search_arrays(QUERIES, 10, filter=per_query), remote.search_arrays(QUERIES, 10, filter=per_query),
                f"{where} per-query filters")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_search_equals_local(ray_cluster, local, local_index, n):
    with Retriever.open(local_index, executor=executor(n)) as remote:
        assert len(remote.engine.assignment) == n
        assert sorted(s for held in remote.engine.assignment for s in held) == list(range(5))
        check_every_mode(local, remote, f"{n} actors")


def test_search_interleaved_assignment(ray_cluster, local, local_index):
    """Shards dealt alternately, so each leg's top candidates come from both actors (checked) and
    the driver's merge decides the order."""
    with Retriever.open(local_index, executor=executor(2, assignment=[[0, 2, 4], [1, 3]])) as remote:
        res = local.search_arrays(QUERIES, 20, mode="bm25")
        owners = {0: 0, 2: 0, 4: 0, 1: 1, 3: 1}
        shard_of = np.searchsorted([s.base for s in local.reader.shards], res.ids[0, :res.n_found[0]], side="right") - 1
        assert {owners[int(s)] for s in shard_of} == {0, 1}
        check_every_mode(local, remote, "interleaved")


def test_large_batches_go_through_the_object_store(ray_cluster, local, local_index, monkeypatch):
    """Prepared batches above INLINE_BYTES are put in the object store once (counted here) and
    passed by reference; small ones travel inside the calls. Results equal local search both ways."""
    from retriever.distributed import search as dsearch

    puts = []
    real_put = dsearch.ray.put
    monkeypatch.setattr(dsearch.ray, "put", lambda obj, **kw: puts.append(obj) or real_put(obj, **kw))
    qv = np.random.default_rng(1).standard_normal((len(QUERIES), 384)).astype(np.float32)
    with Retriever.open(local_index, executor=executor(2)) as remote:
        puts.clear()
        for mode in ("hybrid", "dense", "bm25"):
            same_result(local.search_arrays(QUERIES, 10, mode=mode), remote.search_arrays(QUERIES, 10, mode=mode), mode)
        assert puts == []  # eight queries: far below INLINE_BYTES
        monkeypatch.setattr(dsearch, "INLINE_BYTES", 0)
        for mode in ("hybrid", "dense", "bm25"):
            same_result(local.search_arrays(QUERIES, 10, mode=mode, query_vectors=qv if mode != "bm25" else None),
                        remote.search_arrays(QUERIES, 10, mode=mode, query_vectors=qv if mode != "bm25" else None),
                        f"{mode} by reference")
        assert len(puts) == 5  # hybrid: 3 legs, dense 1, bm25 1: one put per leg, not per actor
        assert any(isinstance(p, dsearch.TextBatch) for p in puts)


def test_large_filter_masks_reach_each_actor_once(ray_cluster, local, local_index, monkeypatch):
    """Masks above INLINE_BYTES go to the object store once per actor and filter: every leg and a
    later search with the same filter pass the reference; results equal local search."""
    from retriever.distributed import search as dsearch

    puts = []
    real_put = dsearch.ray.put
    monkeypatch.setattr(dsearch.ray, "put", lambda obj, **kw: puts.append(obj) or real_put(obj, **kw))
    monkeypatch.setattr(dsearch, "INLINE_BYTES", 0)
    flt = {"year": {"$gte": 2005}}
    with Retriever.open(local_index, executor=executor(2)) as remote:
        for rep in range(2):
            puts.clear()
            same_result(local.search_arrays(QUERIES, 10, filter=flt), remote.search_arrays(QUERIES, 10, filter=flt),
                        f"filter, search {rep}")
            mask_puts = [p for p in puts if isinstance(p, list)]
            assert len(mask_puts) == (2 if rep == 0 else 0)  # one per actor, then none
            if rep == 0:
                assert [len(p) for p in mask_puts] == [len(h) for h in remote.engine.assignment]
        other = {"tag": "a"}
        puts.clear()
        same_result(local.search_arrays(QUERIES, 10, filter=other), remote.search_arrays(QUERIES, 10, filter=other),
                    "another filter")
        assert len([p for p in puts if isinstance(p, list)]) == 2


def test_concurrent_legs_put_a_filters_masks_once(ray_cluster, local_index, monkeypatch):
    """The legs of a hybrid search ask for a filter's masks at the same time: they are put once
    per actor, not once per leg that missed the cache (a slow put widens the race window)."""
    import threading
    import time as _time

    from retriever.distributed import search as dsearch

    puts = []
    real_put = dsearch.ray.put

    def slow_put(obj, **kw):
        puts.append(obj)
        _time.sleep(0.05)
        return real_put(obj, **kw)

    monkeypatch.setattr(dsearch.ray, "put", slow_put)
    monkeypatch.setattr(dsearch, "INLINE_BYTES", 0)
    with Retriever.open(local_index, executor=executor(2)) as remote:
        masks = remote.filter_masks({"year": {"$gte": 2005}})
        got: list = []
        threads = [threading.Thread(target=lambda: got.append(remote.engine._masks(masks))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len([p for p in puts if isinstance(p, list)]) == 2
        assert all(g is got[0] for g in got)


def test_payload_bytes_counts_arrays_and_text():
    from retriever.distributed.search import TextBatch, payload_bytes

    a = np.zeros((3, 384), dtype=np.float32)
    assert payload_bytes(a) == 3 * 384 * 4
    assert payload_bytes(TextBatch(["abc", "de"], None)) == 5 + 8
    assert payload_bytes((a, [a, "xy"], {"k": a})) == 3 * a.nbytes + 2


def test_actor_timings_record_every_call(ray_cluster, local_index):
    """Each actor times its search calls: (leg, queries, shards, ms); taking them clears them."""
    with Retriever.open(local_index, executor=executor(2)) as remote:
        eng = remote.engine
        eng.actor_timings()
        remote.search_arrays(QUERIES[:3], 10, mode="hybrid")  # the third is blank: not searched
        got = eng.actor_timings()
        assert len(got) == 2
        for calls, held in zip(got, eng.assignment):
            assert sorted(c[0] for c in calls) == ["bm25", "dense", "sparse"]
            assert all(c[1] == 2 and c[2] == len(held) and c[3] > 0 for c in calls), (calls, held)
        assert eng.actor_timings() == [[], []]


def test_statistics_are_corpus_wide(ray_cluster, local, local_index):
    """Each actor scores with the whole index's N / df / avgdl, not its own shards'."""
    with Retriever.open(local_index, executor=executor(2)) as remote:
        st = remote.engine.stats
        assert st.n_docs == local.reader.n_docs == 120
        assert np.array_equal(st.bm25.df, local.engine.stats.bm25.df)
        assert st.bm25.sum_dl == local.engine.stats.bm25.sum_dl


def test_errors_travel_back(ray_cluster, local_index):
    with Retriever.open(local_index, executor=executor(2)) as remote:
        with pytest.raises(QueryError, match="algorithm"):
            remote.search_arrays(["x"], 5, mode="bm25", leg_params={"bm25": {"algorithm": "nope"}})
        with pytest.raises(QueryError, match="rows"):
            remote.search_arrays(["a", "b"], 5, mode="dense", query_vectors=np.zeros((1, 384), np.float32))
    with pytest.raises(ConfigError, match="assignment"):
        Retriever.open(local_index, executor=executor(2, assignment=[[0, 1], [1, 2, 3, 4]]))
    with pytest.raises(ConfigError, match="num_workers"):
        RayExecutor(num_workers=0)


def _kill_during_searches(remote, local, victim: int) -> tuple[list, BaseException | None]:
    """Search in a loop while actor ``victim``'s process is SIGKILLed after the first round;
    returns the results got after the kill and the error that ended the loop, if any."""
    pid = ray.get(remote.engine.actors[victim].pid.remote())
    expected = local.search_arrays(QUERIES, 10)
    got, err = [], None
    killer = threading.Timer(0.05, os.kill, (pid, signal.SIGKILL))
    same_result(expected, remote.search_arrays(QUERIES, 10), "before the kill")
    killer.start()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and len(got) < 5:
            res = remote.search_arrays(QUERIES, 10)
            same_result(expected, res, "a search around the kill")  # never partial
            if not killer.is_alive():
                got.append(res)
    except DistributedError as e:
        err = e
    killer.join()
    return got, err


def test_killed_actor_is_an_error_naming_its_shards(ray_cluster, local, local_index):
    with Retriever.open(local_index, executor=executor(2, max_restarts=0)) as remote:
        held = remote.engine.assignment[1]
        got, err = _kill_during_searches(remote, local, 1)
        assert err is not None, "searches went on without the killed actor's shards"
        assert f"holding shards {held}" in str(err) and "no partial results" in str(err)
        with pytest.raises(DistributedError, match=r"actor 1 holding shards"):
            remote.search_arrays(QUERIES, 10)


def test_killed_actor_is_restarted_transparently(ray_cluster, local, local_index):
    with Retriever.open(local_index, executor=executor(2, max_restarts=2)) as remote:
        old = ray.get(remote.engine.actors[0].pid.remote())
        got, err = _kill_during_searches(remote, local, 0)
        assert err is None and len(got) == 5
        assert ray.get(remote.engine.actors[0].pid.remote()) != old  # a new process holds the shards


def test_core_library_never_imports_ray(local_index):
    code = ("import sys; import retriever; from retriever import Retriever, RayExecutor, build_index\n"
            f"r = Retriever.open({str(local_index)!r}); r.search('vitamin', k=3, mode='bm25')\n"
            "RayExecutor(num_workers=2).assign([3, 3, 3])\n"
            "assert not any(m == 'ray' or m.startswith('ray.') for m in sys.modules), 'ray imported'\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env, timeout=300)


def test_assignment_balances_documents():
    assert RayExecutor(num_workers=2).assign([50, 50, 50, 50, 40]) == [[0, 1], [2, 3, 4]]
    assert RayExecutor(num_workers=3).assign([10, 10, 10]) == [[0], [1], [2]]
    assert RayExecutor(num_workers=4).assign([5, 5]) == [[0], [1]]
    assert RayExecutor(num_workers=2).assign([1000, 1, 1]) == [[0], [1, 2]]
    assert RayExecutor(num_workers=1).assign([3, 3]) == [[0, 1]]


# ------------------------------------------------------------------------------------- builds

def same_index(a: Path, b: Path) -> None:
    """Two index directories hold the same documents, ordinals, vocabulary, statistics and leg files."""
    ra, rb = Retriever.open(a), Retriever.open(b)
    ma, mb = ra.reader.manifest, rb.reader.manifest
    assert ma["stats"] == mb["stats"]
    assert ma["metadata_schema"] == mb["metadata_schema"]
    assert ma["build_config"] == mb["build_config"]
    assert [s["rows"] for s in ma["shards"]] == [s["rows"] for s in mb["shards"]]
    assert list(ra.reader.doc_ids()) == list(rb.reader.doc_ids())
    assert (a / "vocab.arrow").read_bytes() == (b / "vocab.arrow").read_bytes()
    for sa, sb in zip(ra.reader.shards, rb.reader.shards):
        assert sa.docs.equals(sb.docs), sa.dir
        assert sa.stats == sb.stats, sa.dir
        for f in sorted(p.name for p in sa.dir.iterdir()):
            assert (sa.dir / f).read_bytes() == (sb.dir / f).read_bytes(), (sa.dir.name, f)
    assert sorted(ma["files"]) == sorted(mb["files"])
    assert {k: v["sha256"] for k, v in ma["files"].items() if not k.startswith("manifests/")} == \
        {k: v["sha256"] for k, v in mb["files"].items() if not k.startswith("manifests/")}
    return ra, rb


@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(3, marks=pytest.mark.slow)])
def test_ray_build_equals_one_process(ray_cluster, tmp_path, corpus_file, local_index, local, n):
    """Same documents, ordinals, shard files (byte for byte) and search results as one process."""
    out = tmp_path / "ray"
    m = build_index(corpus_file, out, show_progress=False, executor=executor(n), **BUILD)
    assert m["build"]["executor"]["workers"] == n
    _, built = same_index(local_index, out)
    check_every_mode(local, built, f"built with {n} workers")


@pytest.mark.parametrize("n", [1, 3])
def test_ray_build_from_records_bm25(ray_cluster, tmp_path, n):
    """The fast variant for 1 and 3 workers (every leg: the slow tests above): a Python iterable
    corpus, BM25 only."""
    recs = corpus_records(90)
    build_index(recs, tmp_path / "one", legs=("bm25",), shard_size=20, batch_size=7, show_progress=False)
    build_index(recs, tmp_path / "ray", legs=("bm25",), shard_size=20, batch_size=7, show_progress=False,
                executor=executor(n))
    one, built = same_index(tmp_path / "one", tmp_path / "ray")
    for k, depth in ((10, None), (50, 90)):
        same_result(one.search_arrays(QUERIES, k, mode="bm25", depth=depth),
                    built.search_arrays(QUERIES, k, mode="bm25", depth=depth), f"{n} workers")


def test_ray_build_many_parts(ray_cluster, tmp_path, corpus_file, monkeypatch):
    """A JSONL corpus cut into many byte ranges (parts straddle shards); ordinals stay corpus order."""
    from retriever.index import distributed_build as db

    parts = db.plan_parts(corpus_file, 2, part_bytes=2000)
    assert len(parts) > 10 and parts[0]["start"] == 0
    assert all(p["end"] == q["start"] for p, q in zip(parts, parts[1:]))
    text = (corpus_file / "corpus.jsonl").read_bytes()
    assert all(text[p["start"] - 1:p["start"]] == b"\n" for p in parts[1:])
    assert [p["first_line"] for p in parts] == [text[:p["start"]].count(b"\n") + 1 for p in parts]
    monkeypatch.setattr(db, "PART_BYTES", 2000)
    build_index(corpus_file, tmp_path / "one", legs=("bm25",), shard_size=33, batch_size=10, show_progress=False)
    build_index(corpus_file, tmp_path / "ray", legs=("bm25",), shard_size=33, batch_size=10, show_progress=False,
                executor=executor(3))
    same_index(tmp_path / "one", tmp_path / "ray")


def _build_error(tmp_path, records, **kw) -> str:
    """The error a one-process and a Ray build of ``records`` raise: the same type and message."""
    folder = tmp_path / "bad"
    folder.mkdir(exist_ok=True)
    with open(folder / "corpus.jsonl", "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    errs = []
    for name, ex in (("one", None), ("ray", executor(2))):
        with pytest.raises(Exception) as ei:
            build_index(folder, tmp_path / name, legs=("bm25",), shard_size=10, show_progress=False, executor=ex, **kw)
        errs.append(ei.value)
        assert not (tmp_path / name).exists()
    assert type(errs[0]) is type(errs[1]) and str(errs[0]) == str(errs[1]), errs
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    return str(errs[1])


def test_ray_build_errors_as_one_process(ray_cluster, tmp_path):
    recs = corpus_records(60)
    bad = [json.dumps(r) for r in recs]
    bad[41] = '{"_id": "x", "text": '
    assert "line 42" in _build_error(tmp_path, bad)
    dup = [dict(r) for r in recs]
    dup[37]["_id"] = dup[5]["_id"]
    assert "duplicate document id" in _build_error(tmp_path, dup)
    mixed = [dict(r) for r in recs]
    mixed[23]["year"] = "nineteen"
    assert "mixed types" in _build_error(tmp_path, mixed)
    from retriever import BuildConfig, DenseConfig

    with pytest.raises(ConfigError, match="Matryoshka"):
        build_index(recs, tmp_path / "m", BuildConfig(legs=("dense",), dense=DenseConfig(matryoshka_dims=(64,))),
                    executor=executor(1))
    assert not (tmp_path / "m").exists()


def _killer(marker: Path, point: str, once: bool):
    """A fault hook that SIGKILLs the Ray worker running it at ``point`` (the first time only when
    ``once``: a marker file remembers it across processes)."""
    def hook(p: str) -> None:
        import os as _os
        import signal as _signal

        if p != point:  # shard_bm25 is reached in the Ray workers only (phase 2 of a Ray build)
            return
        if once:
            try:
                fd = _os.open(marker, _os.O_CREAT | _os.O_EXCL | _os.O_WRONLY)
            except FileExistsError:
                return
            _os.close(fd)
        _os.kill(_os.getpid(), _signal.SIGKILL)
    return hook


def test_ray_build_worker_killed_is_retried(ray_cluster, tmp_path):
    recs = corpus_records(60)
    build_index(recs, tmp_path / "one", legs=("bm25",), shard_size=15, show_progress=False)
    hook = _killer(tmp_path / "killed", "shard_bm25", once=True)
    build_index(recs, tmp_path / "ray", legs=("bm25",), shard_size=15, show_progress=False,
                executor=executor(2, max_restarts=1), faults=hook)
    assert (tmp_path / "killed").exists()  # a worker did die mid-build
    same_index(tmp_path / "one", tmp_path / "ray")


def test_ray_build_worker_killed_fails_the_build(ray_cluster, tmp_path):
    recs = corpus_records(60)
    hook = _killer(tmp_path / "killed", "shard_bm25", once=False)
    with pytest.raises(DistributedError, match="shard .* failed|nothing was written"):
        build_index(recs, tmp_path / "ray", legs=("bm25",), shard_size=15, show_progress=False,
                    executor=executor(2, max_restarts=0), faults=hook)
    assert not (tmp_path / "ray").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_build_ray(ray_cluster, tmp_path, corpus_file, capsys):
    from retriever.cli import main

    assert main(["index", "build", "--corpus", str(corpus_file), "--out", str(tmp_path / "cli"), "--legs", "bm25",
                 "--shard-size", "70", "--no-progress", "--ray", "--ray-workers", "2"]) == 0
    assert "120 documents in 2 shard(s)" in capsys.readouterr().out
    build_index(corpus_file, tmp_path / "one", legs=("bm25",), shard_size=70, show_progress=False)
    same_index(tmp_path / "one", tmp_path / "cli")


def test_refresh_reassigns_new_segments(ray_cluster, tmp_path, local_index):
    """After a commit (adds and deletes), refresh() keeps each actor's segments, gives the new
    segment to the actor holding the fewest documents, and searches equal a one-process reader of
    the new generation (tombstones and corpus statistics included)."""
    import shutil

    from retriever import IndexUpdater

    path = tmp_path / "living"
    shutil.copytree(local_index, path)
    with Retriever.open(path, executor=executor(2)) as remote:
        before = [list(h) for h in remote.engine.assignment]
        assert remote.refresh() is False
        with IndexUpdater.open(path) as up:
            up.add([{"_id": f"new{i}", "title": "", "text": f"vitamin bone heart {i}", "year": 2001} for i in range(7)])
            up.delete(["d3", "d40", "d77"])
            up.commit()
        assert remote.refresh() is True
        after = remote.engine.assignment
        assert [h[:len(b)] for h, b in zip(after, before)] == before
        new = [s for h in after for s in h if s >= 5]
        assert len(new) >= 1 and sorted(s for h in after for s in h) == list(range(len(remote.reader.shards)))
        with Retriever.open(path) as fresh:
            assert fresh.reader.generation == remote.reader.generation
            check_every_mode(fresh, remote, "after refresh")
            flt = {"year": {"$gte": 2000}}
            same_result(fresh.search_arrays(QUERIES, 10, filter=flt), remote.search_arrays(QUERIES, 10, filter=flt),
                        "filter after refresh")


QUERIES_REBUILT = ["vitamin bone fracture", "heart blood pressure", "insulin sugar diet liver", "cell gene cancer"]


@pytest.mark.parametrize("distributed", [False, True])
def test_refresh_after_a_rebuild_in_place_equals_a_fresh_open(ray_cluster, tmp_path, distributed):
    """build_index(..., overwrite=True) of another corpus (generation 1 again, a vocab.arrow of the
    same name with other terms), then refresh(): the cached vocabulary is keyed by the files'
    digests and the actors' engines by the driver engine's statistics, so the refreshed reader
    (one process or on Ray) answers as a fresh open, also for the search right after refresh()."""
    idx = tmp_path / "i"
    head = {"_id": "v0", "text": "vitamin fracture bone risk heart blood pressure sugar insulin liver gene cell cancer"}
    a_docs, b_docs = [head] + random_corpus(119, seed=1), [head] + random_corpus(119, seed=2)
    build_index(a_docs, idx, legs=("bm25",), shard_size=30, show_progress=False)
    with Retriever.open(idx, executor=executor(2) if distributed else None) as r:
        for t in range(4):
            build_index(b_docs if t % 2 == 0 else random_corpus(120, seed=3 + t), idx, legs=("bm25",), shard_size=30,
                        show_progress=False, overwrite=True)
            assert r.refresh() is True
            with Retriever.open(idx) as fresh:
                want = fresh.search_arrays(QUERIES_REBUILT, 10, mode="bm25")
            got = r.search_arrays(QUERIES_REBUILT, 10, mode="bm25")
            assert np.array_equal(got.ids, want.ids) and np.array_equal(got.scores, want.scores), t


def test_theoretical_range_fusions_are_refused_on_ray(ray_cluster, tmp_path):
    """tmm and linear:theoretical need each leg's theoretical score range, which the driver (no
    shards) cannot compute: a QueryError naming the alternatives, never another ranking."""
    idx = tmp_path / "i"
    docs = random_corpus(90, seed=4)
    vecs = np.random.default_rng(0).standard_normal((90, 8)).astype(np.float32)
    build_index(docs, idx, legs=("bm25", "dense"), dense_vectors=vecs, shard_size=30, show_progress=False)
    qv = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    with Retriever.open(idx, executor=executor(2)) as r:
        for fz in ("tmm", "linear:theoretical"):
            with pytest.raises(QueryError, match="theoretical score range.*use rrf, dbsf"):
                r.search_arrays(["vitamin", "heart"], 5, fusion=fz, query_vectors=qv)
        assert r.search_arrays(["vitamin", "heart"], 5, fusion="linear:zscore", query_vectors=qv).n_found.tolist() == [5, 5]
