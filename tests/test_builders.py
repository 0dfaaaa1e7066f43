"""The build side's seams: leg builders driven one shard at a time give what ``build_index`` gives,
a sparse builder with a fixed scale completes each shard on its own, fault hooks are passed in,
and the ``index`` package's modules import each other without cycles."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, random_corpus
from retriever import build_index
from retriever.index.builders import Batch
from retriever.index.config import BuildConfig
from retriever.index.format import read_manifest
from retriever.index.metadata import MetadataColumns
from retriever.index.pipeline import make_builders
from retriever.index.readers import read_corpus
from retriever.index.writer import IndexWriter


def _vectors(n: int, d: int = 8, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_builders_shard_by_shard_equal_build_index(tmp_path):
    docs = random_corpus(45, seed=8, min_len=0)
    vecs = _vectors(45)
    config = BuildConfig(legs=("bm25", "dense"), shard_size=20, dense={"matryoshka_dims": (4, 8)})
    want = build_index(docs, tmp_path / "a", config, dense_vectors=vecs, show_progress=False)
    # the protocol by hand: batches of 7, shards of 20 / 20 / 5
    builders = make_builders(config, dense_vectors=vecs)
    records = list(read_corpus(docs))
    meta = MetadataColumns()
    points: list[str] = []
    with IndexWriter(tmp_path / "b", faults=points.append) as w:
        for lo in range(0, 45, 20):
            shard = records[lo:lo + 20]
            for b0 in range(0, len(shard), 7):
                part = shard[b0:b0 + 7]
                batch = Batch(part, [f"{d.title} {d.text}" if d.title else d.text for d in part])
                for b in builders:
                    b.add(batch)
            for b in builders:
                b.end_shard()
            h = w.begin_shard(ids=[d.id for d in shard], titles=[d.title for d in shard],
                              texts=[d.text for d in shard], metadata=meta.columns(shard))
            w.end_shard(h, {b.name: b.finish_shard(w, h) for b in builders})
        outs = {b.name: b.finish(w, 45) for b in builders}
        got = w.commit(build_config=config.to_dict(), stats={"n_docs": 45, **outs["bm25"].stats, **outs["dense"].stats},
                       extra={"matryoshka": outs["dense"].extra["matryoshka"]})
    same = [rel for rel, info in want["files"].items() if got["files"].get(rel, {}).get("sha256") == info["sha256"]]
    assert sorted(same) == sorted(want["files"]), set(want["files"]) - set(same)
    assert got["shards"] == want["shards"] and got["stats"] == want["stats"]
    assert points.count("shard_docs") == 3 and points.count("shard_done") == 3 and points[-2:] == ["manifest", "swap"]
    assert read_manifest(tmp_path / "b")["generation"] == 1


def test_fault_hook_sees_every_point_in_order(tmp_path):
    seen: list[str] = []
    build_index(random_corpus(30, seed=2, min_len=1), tmp_path / "i", legs=("bm25", "dense"), shard_size=20,
                batch_size=10, dense_vectors=_vectors(30), dense={"faiss_factory": "HNSW8"}, show_progress=False,
                faults=seen.append)
    first_shard = seen[:seen.index("shard_done") + 1]
    assert first_shard == ["read", "encode_bm25", "encode_dense", "read", "encode_bm25", "encode_dense",
                           "shard_docs", "shard_bm25", "faiss", "shard_dense", "shard_faiss", "shard_done"]
    assert seen[-3:] == ["vocab", "manifest", "swap"] and seen.count("shard_done") == 2


def test_sparse_builder_with_fixed_scale_completes_each_shard(tmp_path):
    rng = np.random.default_rng(1)
    n = 30
    rows = [np.unique(rng.integers(0, 500, rng.integers(1, 20))) for _ in range(n)]
    ptr = np.zeros(n + 1, np.int64)
    ptr[1:] = np.cumsum([len(r) for r in rows])
    terms = np.concatenate(rows).astype(np.uint32)
    weights = (rng.random(len(terms)) * 3 + 0.01).astype(np.float32)
    docs = random_corpus(n, seed=4, min_len=1)
    try:
        want = build_index(docs, tmp_path / "a", legs=("sparse",), shard_size=12, sparse_vectors=(ptr, terms, weights),
                           show_progress=False)
    except Exception as e:  # noqa: BLE001 - the bundled SPLADE model is optional
        pytest.skip(f"sparse model not available: {e}")
    from retriever.index.sparse_build import SparseBuilder

    config = BuildConfig(legs=("sparse",), shard_size=12)
    sb = SparseBuilder(config, vectors=(ptr, terms, weights), scale=float(want["stats"]["sparse_scale"]))
    records = list(read_corpus(docs))
    with IndexWriter(tmp_path / "b") as w:
        for lo in range(0, n, 12):
            part = records[lo:lo + 12]
            sb.add(Batch(part, [d.text for d in part]))
            h = w.begin_shard(ids=[d.id for d in part], titles=[d.title for d in part], texts=[d.text for d in part])
            out = sb.finish_shard(w, h)
            assert f"{h.dir}/sparse_index.arrow" in out.files  # complete now, not at finish
            assert w.files[f"{h.dir}/sparse_index.arrow"]["sha256"] == want["files"][f"{h.dir}/sparse_index.arrow"]["sha256"]
            w.end_shard(h, {"sparse": out})
        w.abort()


def _intra_imports(path: Path) -> set[str]:
    """Modules of the ``index`` package that ``path`` imports (anywhere in the file)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("retriever.index."):
            out.add(node.module.split(".")[2])
    return out


def test_index_modules_import_without_cycles():
    mods = {p.stem: p for p in (ROOT / "index").glob("*.py")}
    graph = {m: {d for d in _intra_imports(p) if d in mods and d != m} for m, p in mods.items()}
    assert "matryoshka" not in graph["config"]
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in graph[m]:
            if state.get(d) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(stack + [m, d])}")
            if d not in state:
                visit(d, stack + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def test_the_index_folder_is_not_importable_under_a_second_name():
    """From the repository root ``index/`` is on sys.path as ``index``: importing it so would load
    a second copy of every module (and exception class); it refuses, naming retriever.index."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import index"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "import retriever.index" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", "import retriever.index.updates, retriever.index.errors as e; "
                        "print(e.__name__)"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "retriever.index.errors", r.stderr
