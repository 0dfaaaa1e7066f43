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
    """A local two-CPU Ray cluster for this module's tests, shut down afterwards."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 logging_level="ERROR")
    yield ray
    if started:
        ray.shutdown()


def corpus_records(n: int = 240) -> list[dict]:
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


BUILD = {"legs": ("bm25", "dense", "sparse"), "shard_size": 50, "batch_size": 16}


@pytest.fixture(scope="module")
def local_index(tmp_path_factory, corpus_file) -> Path:
    """The one-process build: 240 documents, 5 shards, every leg."""
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


def test_statistics_are_corpus_wide(ray_cluster, local, local_index):
    """Each actor scores with the whole index's N / df / avgdl, not its own shards'."""
    with Retriever.open(local_index, executor=executor(2)) as remote:
        st = remote.engine.stats
        assert st.n_docs == local.reader.n_docs == 240
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
