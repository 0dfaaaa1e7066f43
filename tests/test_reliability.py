"""Reliability: crash-safe builds (SIGKILL at named points), atomic overwrite, temp-dir hygiene,
concurrent searches, and opening an index executing no code."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, random_corpus
from retriever.index.errors import IndexExistsError, IndexFormatError
from retriever.index.format import read_manifest, verify_checksums
from retriever.index.faults import CRASH_POINTS
from retriever.index.writer import clean_stale_temps
from retriever import Retriever, build_index

BM25_POINTS = ("read", "encode_bm25", "shard_docs", "shard_bm25", "shard_done", "vocab", "manifest", "swap")
DENSE_POINTS = ("encode_dense", "faiss", "shard_dense", "shard_faiss")
QUERIES = ["vitamin bone", "heart blood pressure", "gene cell cancer", "sleep memory", "zzz"]


def _write_jsonl(path: Path, docs: list[dict]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    return path


def _cli(args: list[str], crash: dict | None = None) -> subprocess.Popen:
    """``retriever ARGS``, or (``crash``: ``{"point": ..., "job": ...}``) a build that SIGKILLs
    itself at a fault point (tests/crash_build.py)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "retriever", *args] if not crash else \
        [sys.executable, str(ROOT / "tests" / "crash_build.py"), crash["point"], json.dumps(crash["job"])]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _crash(point: str, corpus: Path, out: Path, overwrite: bool = False, **config) -> tuple[list[str], dict]:
    """A job for :func:`_run_all`: build ``corpus`` into ``out``, dying at ``point``."""
    config = {"legs": ["bm25"], "shard_size": 30, "batch_size": 10, **config}
    return ([], {"point": point, "job": {"kind": "build", "corpus": str(corpus), "out": str(out),
                                          "overwrite": overwrite, "config": config}})


def _run_all(jobs: list[tuple[list[str], dict[str, str]]], parallel: int = 3) -> list[tuple[int, str]]:
    def one(job):
        p = _cli(*job)
        out, err = p.communicate(timeout=300)
        return p.returncode, err
    with ThreadPoolExecutor(parallel) as ex:
        return list(ex.map(one, jobs))


def _snapshot(path: Path) -> dict:
    r = Retriever.open(path)
    res = r.search_arrays(QUERIES, k=10, mode="bm25")
    return {"ids": res.ids.tolist(), "scores": res.scores.tolist(), "n": res.n_found.tolist(),
            "doc_ids": r.doc_ids(res.ids[0, :res.n_found[0]]).tolist()}


def _temps(parent: Path, name: str) -> list[Path]:
    return [p for p in parent.iterdir() if p.name.startswith(f".{name}.")]


def test_crash_points_are_documented_and_known():
    src = "".join(p.read_text() for p in (ROOT / "index").glob("*.py") if p.name != "updates.py")
    used = set(re.findall(r'faults\("([a-z_0-9]+)"\)', src))
    assert used == set(CRASH_POINTS)
    from retriever.index.faults import UPDATE_CRASH_POINTS  # the living index's writer: its own points

    upd = set(re.findall(r'faults\("([a-z_0-9]+)"\)', (ROOT / "index" / "updates.py").read_text()))
    assert upd and upd <= set(UPDATE_CRASH_POINTS)
    assert set(BM25_POINTS) | set(DENSE_POINTS) == set(CRASH_POINTS)
    # production modules take the hook as a parameter: none reads the environment for faults
    assert "RETRIEVER_CRASH_AT" not in src and "testhooks" not in src


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("crash")
    a = _write_jsonl(d / "a.jsonl", random_corpus(90, seed=11, min_len=1))
    b = _write_jsonl(d / "b.jsonl", random_corpus(70, seed=12, min_len=1))
    return d, a, b


BUILD = ["index", "build", "--legs", "bm25", "--shard-size", "30", "--batch-size", "10", "--no-progress"]


def test_sigkill_fresh_build_leaves_nothing_visible(corpora, tmp_path):
    _, a, _ = corpora
    jobs = [_crash(p, a, tmp_path / p) for p in BM25_POINTS]
    # the n-th occurrence form: die in the second shard's postings
    jobs.append(_crash("shard_bm25:2", a, tmp_path / "nth"))
    results = _run_all(jobs)
    for (_, crash), (rc, err) in zip(jobs, results):
        point = crash["point"]
        out = Path(crash["job"]["out"])
        assert rc == -9, (point, rc, err)
        if point == "swap":  # the rename already happened: a complete index
            read_manifest(out)
            verify_checksums(out, read_manifest(out))
        else:
            assert not out.exists(), point
        leftovers = _temps(tmp_path, out.name)
        if point != "swap":
            assert leftovers, point  # the killed build's temp dir is there...
        for t in leftovers:  # ...but is never treated as an index
            with pytest.raises(IndexFormatError, match="temporary directory"):
                Retriever.open(t)
    # A later build of the same target cleans the temp dirs of dead builds and succeeds.
    out = tmp_path / "read"
    build_index(str(a), out, legs=("bm25",), show_progress=False)
    assert not _temps(tmp_path, "read")
    Retriever.open(out).search("vitamin", k=3)


def test_sigkill_overwrite_keeps_previous_index(corpora, tmp_path):
    d, a, b = corpora
    base = tmp_path / "base"
    build_index(str(a), base, legs=("bm25",), shard_size=30, show_progress=False)
    before = _snapshot(base)
    m_before = read_manifest(base)
    newer = tmp_path / "newer"
    build_index(str(b), newer, legs=("bm25",), shard_size=30, show_progress=False)
    after_ok = _snapshot(newer)
    jobs = []
    for p in BM25_POINTS:
        out = tmp_path / f"ow_{p}"
        shutil.copytree(base, out)
        jobs.append(_crash(p, b, out, overwrite=True))
    results = _run_all(jobs)
    for (_, crash), (rc, err) in zip(jobs, results):
        point = crash["point"]
        out = Path(crash["job"]["out"])
        assert rc == -9, (point, rc, err)
        m = read_manifest(out)
        verify_checksums(out, m)
        snap = _snapshot(out)
        if point == "swap":
            assert snap == after_ok  # swapped in completely
        else:
            assert snap == before, point  # previous index intact, identical results
            assert m["files"] == m_before["files"]


def test_overwrite_required_and_atomic(corpora, tmp_path):
    _, a, b = corpora
    out = tmp_path / "idx"
    build_index(str(a), out, legs=("bm25",), show_progress=False)
    before = _snapshot(out)
    with pytest.raises(IndexExistsError, match="--overwrite"):
        build_index(str(b), out, legs=("bm25",), show_progress=False)
    assert _snapshot(out) == before
    rc, err = _run_all([([*BUILD, "--corpus", str(b), "--out", str(out)], None)])[0]
    assert rc == 1 and err.startswith("error: ") and "--overwrite" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert _snapshot(out) == before
    rc, err = _run_all([([*BUILD, "--corpus", str(b), "--out", str(out), "--overwrite"], None)])[0]
    assert rc == 0, err
    assert Retriever.open(out).reader.n_docs == 70
    assert not _temps(tmp_path, "idx")
    # a non-index directory is never overwritten
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "precious.txt").write_text("keep me")
    with pytest.raises(IndexFormatError):
        build_index(str(a), junk, legs=("bm25",), overwrite=True, show_progress=False)
    assert (junk / "precious.txt").read_text() == "keep me"


def test_live_temp_dirs_are_not_cleaned(tmp_path):
    out = tmp_path / "x"
    live = tmp_path / f".x.tmp-{os.getppid()}-abc"  # a running process (our parent)
    live.mkdir()
    dead = tmp_path / ".x.tmp-999999999-abc"
    dead.mkdir()
    other = tmp_path / ".y.tmp-999999999-abc"
    other.mkdir()
    removed = clean_stale_temps(out)
    assert removed == [dead] and live.exists() and other.exists()


@pytest.mark.slow
def test_sigkill_dense_points(tmp_path):
    """Dense-leg crash points (model load makes each run ~10 s)."""
    a = _write_jsonl(tmp_path / "a.jsonl", random_corpus(24, seed=3, min_len=1))
    base = tmp_path / "base"
    build_index(str(a), base, legs=("bm25", "dense"), shard_size=12, show_progress=False,
                dense=__import__("retriever.index.config", fromlist=["DenseConfig"]).DenseConfig(faiss_factory="HNSW8"))
    before = _snapshot(base)
    jobs = []
    cfg = {"legs": ["bm25", "dense"], "shard_size": 12, "batch_size": 1024, "dense": {"faiss_factory": "HNSW8"}}
    for p in DENSE_POINTS:
        jobs.append(_crash(p, a, tmp_path / f"fresh_{p}", **cfg))
        out = tmp_path / f"ow_{p}"
        shutil.copytree(base, out)
        jobs.append(_crash(p, a, out, overwrite=True, **cfg))
    for (_, crash), (rc, err) in zip(jobs, _run_all(jobs, parallel=2)):
        out = Path(crash["job"]["out"])
        assert rc == -9, (crash["point"], rc, err)
        if out.name.startswith("fresh_"):
            assert not out.exists()
        else:
            assert _snapshot(out) == before


# ---------------------------------------------------------------------------
# Concurrency
# ---------------------------------------------------------------------------

def test_concurrent_searches_match_serial(bm25_index):
    r = Retriever.open(bm25_index)
    qs = [" ".join(np.random.default_rng(i).choice(
        ["vitamin", "bone", "heart", "gene", "cell", "sleep", "diet", "virus", "the", "risk"], size=1 + i % 6))
        for i in range(60)]
    params = [dict(k=1 + i % 15, n_threads=1 + i % 2,
                   leg_params={"bm25": {"algorithm": ("exhaustive", "maxscore", "bmw", "bmm")[i % 4]}})
              for i in range(len(qs))]
    serial_one = [[(h.id, h.score) for h in r.search(q, **p)] for q, p in zip(qs, params)]
    serial_batch = r.search_arrays(qs, k=10).ids.tolist()

    def one(i):
        return [(h.id, h.score) for h in r.search(qs[i], **params[i])]

    def batch(_):
        return r.search_arrays(qs, k=10).ids.tolist()

    for _ in range(3):
        with ThreadPoolExecutor(8) as ex:
            f1 = ex.map(one, range(len(qs)))
            f2 = ex.map(batch, range(8))
            assert list(f1) == serial_one
            assert all(b == serial_batch for b in f2)


def test_plan_legs_longest_first():
    from retriever.engine import plan_legs

    cost = {"bm25": 1.5, "dense": 1.0, "sparse": 4.0}
    assert plan_legs(["bm25", "dense", "sparse"], 2, cost) == [["sparse"], ["bm25", "dense"]]
    assert plan_legs(["bm25", "dense", "sparse"], 8, cost) == [["sparse"], ["bm25"], ["dense"]]
    assert plan_legs(["bm25", "dense", "sparse"], 1, cost) == [["sparse", "bm25", "dense"]]
    # no estimates yet: every leg counts 1.0, index order among equals
    assert plan_legs(["bm25", "dense", "sparse"], 2, {}) == [["bm25", "sparse"], ["dense"]]
    assert plan_legs(["bm25", "dense"], 2, {"bm25": 9.0, "dense": 9.0}) == [["bm25"], ["dense"]]


def test_concurrent_legs_identical_to_sequential(tmp_path, monkeypatch):
    """Three legs (BM25 + dense IVF + learned sparse, precomputed vectors) side by side or in
    sequence, batch 1 and batched, from several threads at once: same ids, scores, per-leg scores
    and ranks."""
    import retriever.engine as engine

    rng = np.random.default_rng(5)
    docs = random_corpus(400, seed=9, min_len=2)
    dv = rng.standard_normal((400, 16)).astype(np.float32)
    dv /= np.linalg.norm(dv, axis=1, keepdims=True)
    sv = [(np.unique(rng.integers(0, 300, rng.integers(1, 30))), None) for _ in range(400)]
    sv = [(t, rng.random(len(t)).astype(np.float32) + 0.01) for t, _ in sv]
    ptr = np.zeros(401, np.int64)
    ptr[1:] = np.cumsum([len(t) for t, _ in sv])
    from retriever.index.config import DenseConfig
    build_index(docs, tmp_path / "ix", legs=("bm25", "dense", "sparse"), dense_vectors=dv, shard_size=150,
                sparse_vectors=(ptr, np.concatenate([t for t, _ in sv]), np.concatenate([w for _, w in sv])),
                dense=DenseConfig(faiss_factory="IVF4,Flat", dtype="float32"), show_progress=False)
    r = Retriever.open(tmp_path / "ix", n_threads=2)
    nq = 24
    qs = [" ".join(rng.choice(["vitamin", "bone", "heart", "gene", "cell", "sleep"], size=1 + i % 4)) for i in range(nq)]
    qv = rng.standard_normal((nq, 16)).astype(np.float32)
    qsv = [(np.unique(rng.integers(0, 300, 8)), np.ones(len(np.unique(rng.integers(0, 300, 8))), np.float32))
           for _ in range(nq)]
    qsv = [(t, np.linspace(1.0, 0.1, len(t)).astype(np.float32)) for t, _ in qsv]
    lp = {"dense": {"nprobe": 2}, "sparse": {"algorithm": "seismic", "query_cut": 5}}

    def run(i0, i1, threads):
        res = r.search_arrays(qs[i0:i1], 10, query_vectors=qv[i0:i1], sparse_vectors=qsv[i0:i1], leg_params=lp,
                              n_threads=threads)
        return (res.ids.tolist(), res.scores.tolist(),
                {n: (np.nan_to_num(la.scores, nan=-1.0).tolist(), la.ranks.tolist()) for n, la in res.legs.items()})

    r.engine.concurrent_legs = False
    seq_batch = run(0, nq, 1)
    seq_one = [run(i, i + 1, 1) for i in range(nq)]
    r.engine.concurrent_legs = True
    assert run(0, nq, 2) == seq_batch and run(0, nq, 3) == seq_batch
    assert [run(i, i + 1, 2) for i in range(nq)] == seq_one
    assert set(r.engine.leg_cost) == {"bm25", "dense", "sparse"}
    timings = r.search_arrays(qs[:1], 10, query_vectors=qv[:1], sparse_vectors=qsv[:1], leg_params=lp,
                              n_threads=2).timings_ms
    assert {"leg:bm25", "leg:dense", "leg:sparse"} <= set(timings)
    with ThreadPoolExecutor(4) as ex:
        assert list(ex.map(lambda i: run(i, i + 1, 2), range(nq))) == seq_one
    # a failing leg inside a worker reaches the caller
    with pytest.raises(Exception, match="algorithm"):
        r.search_arrays(qs[:2], 10, query_vectors=qv[:2], sparse_vectors=qsv[:2], n_threads=2,
                        leg_params={"sparse": {"algorithm": "nope"}})


def test_concurrent_legs_dynamic_queue(tmp_path, monkeypatch):
    """With 2 threads the legs form one queue (costliest first) that both threads drain: a leg that
    runs long on one thread does not hold up the legs queued behind it (a static split would queue
    dense behind bm25 on one thread; here bm25 waits until dense has finished, which only a second
    thread taking dense can bring about), every leg runs exactly once, and the results equal the
    sequential ones."""
    import threading

    import retriever.engine as engine

    rng = np.random.default_rng(6)
    docs = random_corpus(200, seed=3, min_len=2)
    dv = rng.standard_normal((200, 8)).astype(np.float32)
    sv = [np.unique(rng.integers(0, 100, rng.integers(1, 12))) for _ in range(200)]
    ptr = np.zeros(201, np.int64)
    ptr[1:] = np.cumsum([len(t) for t in sv])
    build_index(docs, tmp_path / "ix", legs=("bm25", "dense", "sparse"), dense_vectors=dv, show_progress=False,
                sparse_vectors=(ptr, np.concatenate(sv).astype(np.uint32),
                                rng.random(int(ptr[-1])).astype(np.float32) + 0.01))
    r = Retriever.open(tmp_path / "ix", n_threads=2)
    qv = rng.standard_normal((1, 8)).astype(np.float32)
    qsv = [(np.array([1, 5, 9], np.uint32), np.array([1.0, 0.5, 0.25], np.float32))]
    want = r.search_arrays(["bone cell"], 10, query_vectors=qv, sparse_vectors=qsv, concurrent_legs=False)
    dense_done = threading.Event()
    calls: list[tuple[str, str]] = []
    for name, leg in r.engine.legs.items():
        def wrapped(*a, _orig=leg.search_shard, _name=name, **kw):
            calls.append((_name, threading.current_thread().name))
            if _name == "bm25":
                assert dense_done.wait(timeout=20), "dense was queued behind the long bm25 leg"
            out = _orig(*a, **kw)
            if _name == "dense":
                dense_done.set()
            return out
        monkeypatch.setattr(leg, "search_shard", wrapped)
    r.engine.leg_cost = {"sparse": 3.0, "bm25": 1.4, "dense": 1.2}  # queue: sparse, bm25, dense
    got = r.search_arrays(["bone cell"], 10, query_vectors=qv, sparse_vectors=qsv, n_threads=2)
    assert sorted(n for n, _ in calls) == ["bm25", "dense", "sparse"]
    threads = dict(calls)
    # dense ran on the other thread while bm25 waited (which thread took sparse depends on when the
    # worker starts: the caller may finish sparse and take bm25 itself before the worker runs)
    assert threads["dense"] != threads["bm25"]
    assert np.array_equal(got.ids, want.ids) and np.array_equal(got.scores, want.scores)
    assert got.n_found[0] > 0


# ---------------------------------------------------------------------------
# Security: loading executes no code
# ---------------------------------------------------------------------------

def test_no_code_execution_in_sources():
    bad = re.compile(r"\bimport pickle\b|\bpickle\.|\bcloudpickle\b|\bdill\b|\bmarshal\.loads|"
                     r"trust_remote_code\s*=\s*True|allow_pickle\s*=\s*True|\btorch\.load\(|(?<![.\w])eval\(|(?<![.\w])exec\(")
    # the Ray build ships its own parts and records between its driver and workers (Ray pickles
    # every task argument anyway); nothing it unpickles was read from an index or a corpus file.
    pickle_ok = {"index/distributed_build.py"}
    pickle_only = re.compile(r"\bimport pickle\b|\bpickle\.")
    hits = []
    for pkg in ("index", "retriever", "benchmarks"):
        for f in (ROOT / pkg).rglob("*.py"):
            rel = f.relative_to(ROOT).as_posix()
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                if bad.search(line) and not (rel in pickle_ok and not bad.search(pickle_only.sub("", line))):
                    hits.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, hits
    src = (ROOT / "index" / "encoders" / "dense.py").read_text()
    calls = [m.start() for m in re.finditer(r"from_pretrained\(", src)]
    assert calls and all("trust_remote_code=False" in src[i:i + 200] for i in calls)


def test_open_and_search_never_unpickle(bm25_index):
    """Open + search in a process where every unpickling entry point raises."""
    code = ("import pickle, sys\n"
            "def boom(*a, **k): raise AssertionError('unpickling attempted')\n"
            "pickle.load = pickle.loads = boom\n"
            "class U:\n    def __init__(self, *a, **k): boom()\n"
            "pickle.Unpickler = U\n"
            "from retriever import Retriever\n"
            "r = Retriever.open(sys.argv[1], verify=True)\n"
            "print(len(r.search('vitamin bone', k=3)))\n")
    p = subprocess.run([sys.executable, "-c", code, str(bm25_index)], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and p.stdout.strip() == "3", p.stderr


@pytest.mark.parametrize("n,batch,shard", [(70, 10, 30), (60, 10, 30), (20, 10, 30), (31, 1, 30), (7, 7, 3)])
def test_every_document_reaches_a_shard(tmp_path, n, batch, shard):
    """Regression: a corpus whose size is a multiple of batch_size lost its last partial shard."""
    out = tmp_path / "i"
    m = build_index(random_corpus(n, seed=n, min_len=1), out, legs=("bm25",), batch_size=batch,
                    shard_size=shard, show_progress=False)
    assert sum(s["rows"] for s in m["shards"]) == n
    assert Retriever.open(out).reader.n_docs == n
