"""An index directory from an untrusted source (issue 27): a seeded fuzz test of the reader, and
one regression test per finding.

The attacker rewrites any file and the manifest, then recomputes every checksum the manifest holds
(so the integrity hashes prove nothing). Every case runs in a child process
(``tests/fuzz_reader.py``) under a memory cap (RLIMIT_AS) and a timeout, and must end in success
or a RetrieverError naming a file of the index: never a signal, a hang, an out-of-memory, another
exception, or an open of a file outside the index (an audit hook and inotify watch the targets of
the cases' symlinks).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from conftest import ROOT, random_corpus
from retriever import BuildConfig, DenseConfig, IndexFormatError, ModelError, Retriever, build_index
from retriever.cli import main as cli_main
from retriever.index.format import current_manifest_path, manifest_digest, sha256_file, write_table

HERE = Path(__file__).parent
DIM = 16
#: address space a fuzz child may add after its imports and a warm-up search (a forged size field
#: used to cost 12.6 GB)
MEMORY_CAP = 1 << 30


def _build(out: Path, factory: str = "IVF4,Flat") -> Path:
    docs = random_corpus(80, seed=3, min_len=2)
    for i, d in enumerate(docs):
        d["meta"] = {"year": 2000 + i % 7}
    v = np.random.default_rng(1).standard_normal((80, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    cfg = BuildConfig(legs=("bm25", "dense"), shard_size=40,
                      dense=DenseConfig(faiss_factory=factory, dtype="float32", matryoshka_dims=(4, 8, 16)))
    build_index(docs, out, cfg, dense_vectors=v, show_progress=False)
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("untrusted") / "base")


@pytest.fixture(scope="module")
def base_hnsw(tmp_path_factory) -> Path:
    """The same corpus with an HNSW graph in dense.faiss (its graph arrays are fuzzed too)."""
    return _build(tmp_path_factory.mktemp("untrusted") / "hnsw", factory="HNSW8")


def _manifest(root: Path) -> dict:
    return json.loads(current_manifest_path(root).read_text())


def _write_manifest(root: Path, m: dict, *, rehash: bool = True) -> None:
    """Write ``m`` as the current manifest with every file's size and SHA-256 recomputed (the
    attacker's step) and the manifest's own digest."""
    if rehash:
        for rel, info in m["files"].items():
            p = root / rel
            if os.path.isfile(p) and not os.path.islink(p):
                info["bytes"] = p.stat().st_size
                info["sha256"] = sha256_file(p)
    m["manifest_sha256"] = manifest_digest(m)
    current_manifest_path(root).write_text(json.dumps(m))


def _rehash(root: Path) -> None:
    _write_manifest(root, _manifest(root))


# ---------------------------------------------------------------------------------------------
# mutations: each takes (case dir, rng, canary dir) and edits the copy in place

def _files(root: Path) -> list[str]:
    return sorted(_manifest(root)["files"])


def m_flip(root, rng, canary):
    rel = rng.choice(_files(root))
    p = root / rel
    b = bytearray(p.read_bytes())
    for _ in range(rng.randint(1, 4)):
        if b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    p.write_bytes(bytes(b))
    _rehash(root)


def m_truncate(root, rng, canary):
    p = root / rng.choice(_files(root))
    b = p.read_bytes()
    p.write_bytes(b[:rng.randrange(max(1, len(b)))])
    _rehash(root)


def m_zero(root, rng, canary):
    p = root / rng.choice(_files(root))
    b = bytearray(p.read_bytes())
    a = rng.randrange(max(1, len(b)))
    n = rng.choice([1, 8, 64, 4096])
    b[a:a + n] = bytes(len(b[a:a + n]))
    p.write_bytes(bytes(b))
    _rehash(root)


def m_append(root, rng, canary):
    p = root / rng.choice(_files(root))
    with open(p, "ab") as f:
        f.write(bytes(rng.randrange(256) for _ in range(rng.choice([1, 7, 100, 5000]))))
    _rehash(root)


def m_swap(root, rng, canary):
    files = _files(root)
    a, b = rng.sample(files, 2)
    da, db = (root / a).read_bytes(), (root / b).read_bytes()
    (root / a).write_bytes(db)
    (root / b).write_bytes(da)
    _rehash(root)


def m_faiss_field(root, rng, canary):
    """An 8-byte or 4-byte field of a dense.faiss set to a huge or random value."""
    rels = [r for r in _files(root) if r.endswith("dense.faiss")]
    p = root / rng.choice(rels)
    b = bytearray(p.read_bytes())
    width = rng.choice([4, 8])
    off = rng.randrange(0, min(len(b) - width, 400))
    val = rng.choice([3 << 30, 2**40 - 1, 2**31 - 1, 2**63 - 1, 0, 1, 7, rng.getrandbits(width * 8 - 1)])
    b[off:off + width] = (val % (1 << (width * 8))).to_bytes(width, "little")
    p.write_bytes(bytes(b))
    _rehash(root)


def _rewrite_table(root: Path, rel: str, edit) -> None:
    t = pa.ipc.open_file(pa.py_buffer((root / rel).read_bytes())).read_all()  # in memory: the file is rewritten
    write_table(root / rel, edit(t))
    _rehash(root)


def m_arrow(root, rng, canary):
    """Crafted Arrow content: wrong types, missing columns, invalid UTF-8 ids, other dims/dtypes,
    forged postings offsets."""
    shard = rng.choice(["shards/00000", "shards/00001"])
    kind = rng.randrange(9)
    if kind == 0:  # invalid UTF-8 in an id (binary buffer relabelled as string)
        def edit(t):
            ids = [b"d1", b"\xff\xfe", *[s.encode() for s in t.column("id").to_pylist()[2:]]]
            arr = pa.array(ids, pa.binary()).view(pa.string())
            return t.set_column(0, "id", arr)
        _rewrite_table(root, f"{shard}/docs.arrow", edit)
    elif kind == 1:  # id as int
        _rewrite_table(root, f"{shard}/docs.arrow", lambda t: t.set_column(0, "id", pa.array(range(t.num_rows))))
    elif kind == 2:  # metadata as an int column
        _rewrite_table(root, f"{shard}/docs.arrow", lambda t: t.set_column(3, "metadata", pa.array(range(t.num_rows))))
    elif kind == 3:  # a missing column
        col = rng.choice(["id", "title", "text", "metadata", "metadata_nulls"])
        _rewrite_table(root, f"{shard}/docs.arrow", lambda t: t.drop_columns([col]))
    elif kind == 4:  # vocabulary without its term column / with ints
        _rewrite_table(root, "vocab.arrow", lambda t: pa.table({"x": pa.array(range(t.num_rows))})
                       if rng.random() < 0.5 else pa.table({"term": pa.array(range(t.num_rows))}))
    elif kind == 5:  # dense vectors of another dim or dtype
        def edit(t):
            v = np.asarray(t.column("vector").combine_chunks().values.to_numpy()).reshape(t.num_rows, -1)
            if rng.random() < 0.5:
                v = v[:, : v.shape[1] // 2].astype(np.float32)
                return pa.table({"vector": pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), v.shape[1])})
            return pa.table({"vector": pa.FixedSizeListArray.from_arrays(pa.array(v.ravel().astype(np.float64)),
                                                                         v.shape[1])})
        _rewrite_table(root, f"{shard}/dense.arrow", edit)
    elif kind == 6:  # postings offsets forged
        def edit(t):
            off = np.asarray(t.column("offsets")[0].values.to_numpy()).copy()
            off[rng.randrange(len(off))] = rng.choice([2**40, 0, 2**64 - 1, 7])
            return t.set_column(t.column_names.index("offsets"), "offsets",
                                pa.LargeListArray.from_arrays(pa.array([0, len(off)], pa.int64()), pa.array(off)))
        _rewrite_table(root, f"{shard}/bm25.arrow", edit)
    elif kind == 7:  # a dtype change of a postings array
        def edit(t):
            name = rng.choice(t.column_names)
            vals = t.column(name)[0].values.to_numpy().astype(np.float64)
            return t.set_column(t.column_names.index(name), name,
                                pa.LargeListArray.from_arrays(pa.array([0, len(vals)], pa.int64()), pa.array(vals)))
        _rewrite_table(root, f"{shard}/bm25.arrow", edit)
    else:  # rotation of the wrong size
        _rewrite_table(root, "matryoshka.arrow", lambda t: t.set_column(
            t.column_names.index("rotation"), "rotation",
            pa.LargeListArray.from_arrays(pa.array([0, 9], pa.int64()), pa.array(np.ones(9, np.float32)))))


_WEIRD = [None, -1, 0, 2**31, 2**64, 10**30, 1e308, -1e308, 0.5, True, "x", "a" * 100_000, [], [1, 2], {},
          {"a": {"b": 1}}, "../../etc/passwd", "/etc/passwd"]
_FIELDS = [("stats", "n_docs"), ("stats", "n_terms"), ("stats", "dense_dim"), ("stats", "dense_dtype"),
           ("stats", "sum_dl"), ("build_config", "dense", "query_prefix"), ("build_config", "dense", "matryoshka_dims"),
           ("build_config", "bm25", "k1"), ("build_config", "bm25", "b"), ("build_config", "legs"),
           ("build_config", "shard_size"), ("build_config", "analyzer", "max_token_length"), ("models", "dense"),
           ("models", "dense", "path"), ("models", "dense", "sha256"), ("matryoshka", "dims"),
           ("matryoshka", "rotation"), ("matryoshka",), ("shards", 0, "rows"), ("shards", 1, "dir"),
           ("shards", 0, "stats"), ("shards", 0, "deletes"), ("shards", 0, "n_terms"), ("metadata_schema",),
           ("fusion",), ("files",), ("shards",), ("generation",), ("parent_generation",)]


def m_manifest_value(root, rng, canary):
    m = _manifest(root)
    path = rng.choice(_FIELDS)
    obj = m
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = rng.choice(_WEIRD)
    _write_manifest(root, m, rehash=False)


def m_manifest_json(root, rng, canary):
    """Raw JSON the parser must refuse or bound (its digest cannot be recomputed for most)."""
    mp = current_manifest_path(root)
    text = mp.read_text()
    kind = rng.randrange(6)
    if kind == 0:
        text = text[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}"
    elif kind == 1:
        text = text.replace('"generation": 1', '"generation": 1' + "0" * 4300, 1)
    elif kind == 2:
        text = text[:-1] + ', "x": NaN}'
    elif kind == 3:
        text = text[:-1] + ', "x": 1e400}'
    elif kind == 4:
        text = text[: rng.randrange(len(text))]
    else:
        text = text[:-1] + ', "x": "\\ud800"}'
    mp.write_text(text)


def m_symlink(root, rng, canary):
    """Listed and unlisted symlinks to outside files and directories (the canary), and a
    symlinked manifest / CURRENT."""
    kind = rng.randrange(5)
    files = _files(root)
    if kind == 0:  # a listed file replaced by a symlink to an outside copy
        rel = rng.choice(files)
        (root / rel).unlink()
        os.symlink(canary / rel, root / rel)
        _rehash(root)
    elif kind == 1:  # the same plus the manifest entry dropped (read by a fixed name)
        rel = rng.choice(["vocab.arrow", "shards/00000/bm25.arrow", "shards/00001/dense.arrow",
                          "shards/00000/dense.faiss", "matryoshka.arrow"])
        (root / rel).unlink()
        os.symlink(canary / rel, root / rel)
        m = _manifest(root)
        m["files"].pop(rel, None)
        _write_manifest(root, m)
    elif kind == 2:  # a shard directory symlinked outside
        d = rng.choice(["shards/00000", "shards/00001"])
        shutil.rmtree(root / d)
        os.symlink(canary / d, root / d)
    elif kind == 3:  # the manifest itself
        rel = current_manifest_path(root).relative_to(root)
        (root / rel).unlink()
        os.symlink(canary / rel, root / rel)
    else:  # CURRENT, or the shards folder
        name = rng.choice(["CURRENT", "shards"])
        p = root / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        os.symlink(canary / name, p)


def m_special(root, rng, canary):
    """A FIFO or a directory in place of a file (the manifest and CURRENT included)."""
    rel = rng.choice(_files(root) + ["CURRENT", str(current_manifest_path(root).relative_to(root))])
    p = root / rel
    p.unlink()
    if rng.random() < 0.5:
        os.mkfifo(p)
    else:
        p.mkdir()


MUTATIONS = [m_flip, m_truncate, m_zero, m_append, m_swap, m_faiss_field, m_arrow, m_manifest_value,
             m_manifest_json, m_symlink, m_special]


def _make_cases(bases: list[Path], tmp: Path, n: int, seed: int) -> tuple[Path, list[tuple[Path, str]]]:
    """``n`` mutated copies of the indexes ``bases`` (taken in turn), every mutation kind in turn,
    and the canary folder (a copy of ``bases[0]``) that the symlinks point to."""
    canary = tmp / "canary"  # outside every case: the targets of the symlinks
    shutil.copytree(bases[0], canary)
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        fn = MUTATIONS[i % len(MUTATIONS)]
        d = tmp / f"c{i:04d}"
        shutil.copytree(bases[(i // len(MUTATIONS)) % len(bases)], d)
        fn(d, rng, canary)
        cases.append((d, fn.__name__))
    return canary, cases


def _run_children(canary: Path, warmup: Path, cases: list[tuple[Path, str]], per_child: int,
                  timeout: float) -> list[dict]:
    """Run the cases in child processes of ``per_child`` cases each; a child that dies by a
    signal or passes ``timeout`` seconds marks its unfinished case."""
    results = []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    todo = list(cases)
    while todo:
        chunk, todo = todo[:per_child], todo[per_child:]
        names = {str(d): name for d, name in chunk}
        try:
            r = subprocess.run([sys.executable, str(HERE / "fuzz_reader.py"), str(canary), str(warmup), str(MEMORY_CAP),
                                *names], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
            out, code = r.stdout, r.returncode
        except subprocess.TimeoutExpired as e:
            out, code = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
        done = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if code not in (0, "timeout") and not done and "WARMUP OK" not in out:  # the harness, not a case
            raise AssertionError(f"fuzz child failed before its first case: {r.stderr[-2000:]}")
        for res in done:
            res["mutation"] = names[res["case"]]
        results += done
        if len(done) < len(chunk):  # the next case killed or hung the child: record it, go on after it
            bad = chunk[len(done)]
            results.append({"case": str(bad[0]), "mutation": bad[1], "outcome": f"child {code}",
                            "detail": (r.stderr[-500:] if code != "timeout" else "hang")})
            todo = chunk[len(done) + 1:] + todo
    return results


def _fuzz(bases: list[Path], tmp: Path, n: int, seed: int) -> None:
    canary, cases = _make_cases(bases, tmp, n, seed)
    results = _run_children(canary, bases[0], cases, per_child=100, timeout=240)
    assert len(results) == n
    bad = [r for r in results if r["outcome"] not in ("ok", "error")]
    assert not bad, f"{len(bad)} of {n} cases failed, e.g. {bad[:3]}"
    errors = sum(r["outcome"] == "error" for r in results)
    assert errors > n // 2, f"only {errors} of {n} mutations were refused"  # the fuzz reaches the checks


def test_fuzz_reader(base, base_hnsw, tmp_path):
    """A few hundred seeded mutations of every kind (the default suite)."""
    _fuzz([base, base_hnsw], tmp_path, 264, seed=27)


@pytest.mark.slow
def test_fuzz_reader_long(base, base_hnsw, tmp_path):
    _fuzz([base, base_hnsw], tmp_path, 2200, seed=2027)


# ---------------------------------------------------------------------------------------------
# regression tests, one per finding of the issue

def _copy(base: Path, tmp: Path, name: str = "i") -> Path:
    d = tmp / name
    shutil.copytree(base, d)
    return d


def test_forged_faiss_vector_size_refused_before_faiss_allocates(base, tmp_path):
    """A 75 KB dense.faiss whose quantizer's codes size was set to 3·2^30 (12.6 GB of RSS and 33 s
    inside open before): refused by the size walk, at once, naming the file."""
    d = _copy(base, tmp_path)
    p = d / "shards" / "00000" / "dense.faiss"
    b = bytearray(p.read_bytes())
    # "IwFl" + header (d i32, ntotal i64, 2 x i64, is_trained u8, metric i32: 37 bytes in all),
    # nlist, nprobe (u64); then the quantizer "IxFI" + header; then its codes length (u64)
    q = 37 + 16
    assert bytes(b[:4]) == b"IwFl" and bytes(b[q:q + 4]) == b"IxFI"
    off = q + 37
    b[off:off + 8] = (3 << 30).to_bytes(8, "little")
    p.write_bytes(bytes(b))
    _rehash(d)
    with pytest.raises(IndexFormatError, match=r"dense\.faiss: FAISS index refused.*codes of 3221225472"):
        Retriever.open(d)
    # in a fresh process: the refusal costs neither memory nor time
    code = ("import sys, time; from retriever import Retriever, IndexFormatError\n"
            "def hwm():\n    return int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])\n"
            "Retriever.open(sys.argv[1])\n"  # warm-up: the legs' imports and compiled kernels load
            "b = hwm(); t = time.perf_counter()\n"
            "try:\n    Retriever.open(sys.argv[2])\nexcept IndexFormatError:\n    pass\n"
            "print(hwm() - b, time.perf_counter() - t)\n")
    r = subprocess.run([sys.executable, "-c", code, str(base), str(d)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    grown_kib, seconds = r.stdout.split()
    assert int(grown_kib) < 200 * 1024 and float(seconds) < 10, (grown_kib, seconds, r.stderr[-500:])


def test_symlink_to_outside_with_manifest_entry_dropped(base, tmp_path):
    """vocab.arrow (read by a fixed name) replaced by a symlink to an outside file and dropped
    from the manifest: refused; verify reports the symlink."""
    outside = _copy(base, tmp_path, "outside")
    d = _copy(base, tmp_path)
    (d / "vocab.arrow").unlink()
    os.symlink(outside / "vocab.arrow", d / "vocab.arrow")
    m = _manifest(d)
    del m["files"]["vocab.arrow"]
    _write_manifest(d, m)
    with pytest.raises(IndexFormatError, match="vocab.arrow"):
        Retriever.open(d)
    # verify: the symlink and an unlisted file are errors
    d2 = _copy(base, tmp_path, "j")
    (d2 / "shards" / "00000" / "extra.bin").write_bytes(b"x")
    os.symlink(outside / "vocab.arrow", d2 / "shards" / "link.arrow")
    assert cli_main(["index", "verify", str(d2)]) == 1


def test_verify_lists_unlisted_files_and_symlinks(base, tmp_path, capsys):
    outside = _copy(base, tmp_path, "outside")
    d = _copy(base, tmp_path)
    assert cli_main(["index", "verify", str(d)]) == 0
    capsys.readouterr()
    (d / "shards" / "00000" / "extra.bin").write_bytes(b"x")
    os.symlink(outside / "shards", d / "more")
    assert cli_main(["index", "verify", str(d)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert any("extra.bin" in e and "not listed" in e for e in err), err
    assert any("more" in e and "symlink" in e for e in err), err


@pytest.mark.parametrize("rel", ["shards/00000/docs.arrow", "vocab.arrow", "manifests/000001.json", "CURRENT"])
def test_fifo_in_place_of_a_file_does_not_block(base, tmp_path, rel):
    d = _copy(base, tmp_path)
    (d / rel).unlink()
    os.mkfifo(d / rel)
    m = _manifest(d) if rel != "CURRENT" and not rel.startswith("manifests") else None
    if m is not None:  # the attacker lists it with the FIFO's size (0) and the empty digest
        m["files"][rel] = {"bytes": 0, "sha256": sha256_file(Path(os.devnull))}
        _write_manifest(d, m, rehash=False)
    code = ("import sys; from retriever import Retriever, IndexFormatError\n"
            "try:\n    Retriever.open(sys.argv[1])\nexcept IndexFormatError as e:\n    print('REFUSED', e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(d)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.stdout.startswith("REFUSED") and Path(rel).name in r.stdout, r.stdout + r.stderr[-500:]


def test_manifest_does_not_choose_the_model(base, tmp_path):
    """models.dense.path pointing at a directory with a pickled checkpoint is never opened: the
    query model is the caller's or the bundled one, and the manifest's record is a fingerprint
    whose mismatch names both models."""
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "config.json").write_text("{}")
    (evil / "pytorch_model.bin").write_bytes(b"\x80\x04not a checkpoint")
    d = _copy(base, tmp_path)
    m = _manifest(d)
    m["models"]["dense"] = {"path": str(evil), "name": "evil-model", "sha256": {"model.safetensors": "ab" * 32},
                            "dim": DIM}
    _write_manifest(d, m)
    r = Retriever.open(d)
    leg = r.engine.legs["dense"]
    assert leg.model_path is None  # nothing taken from the manifest
    with pytest.raises(ModelError, match="evil-model") as e:
        r.search("vitamin", mode="dense")
    assert str(evil) not in str(e.value) and "model.safetensors" in str(e.value)
    # a caller's model directory is compared too, and a pickle-only one is never loaded
    r2 = Retriever.open(d, dense_model=evil)
    with pytest.raises(ModelError, match="evil-model"):
        r2.search("vitamin", mode="dense")


def test_pickle_only_checkpoint_is_a_model_error(tmp_path):
    from retriever.index.encoders.dense import DenseEncoder, resolve_model_path

    src = resolve_model_path(None)
    d = tmp_path / "m"
    shutil.copytree(src, d)
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not a checkpoint")
    with pytest.raises(ModelError, match="only safetensors"):
        DenseEncoder(str(d))


@pytest.mark.parametrize("path, value, field", [
    (("build_config", "dense", "query_prefix"), "q" * (16 << 20), "query_prefix"),
    (("build_config", "dense", "query_prefix"), 5, "query_prefix"),
    (("models", "dense"), "x", "models.dense"),
    (("stats", "dense_dim"), "16", "stats.dense_dim"),
    (("matryoshka", "dims"), [4, "8"], "matryoshka.dims"),
    (("matryoshka", "rotation"), 5, "matryoshka.rotation"),
    (("build_config", "bm25", "k1"), 1e308, "k1"),
    (("build_config", "dense", "matryoshka_dims"), [32], "matryoshka_dims"),
])
def test_manifest_values_of_the_wrong_type_or_range(base, tmp_path, path, value, field):
    d = _copy(base, tmp_path)
    m = _manifest(d)
    obj = m
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value
    _write_manifest(d, m, rehash=False)
    t = time.perf_counter()
    with pytest.raises(IndexFormatError, match=f"000001.json: field .*{field}"):
        Retriever.open(d)
    assert time.perf_counter() - t < 10


@pytest.mark.parametrize("edit, msg", [
    (lambda t: t[:-1] + ', "deep": ' + "[" * 5000 + "]" * 5000 + "}", "nested more than"),
    (lambda t: t.replace('"generation": 1', '"generation": 1' + "0" * 4300, 1), "integer of"),
    (lambda t: t[:-1] + ', "x": NaN}', "NaN"),
    (lambda t: t[:-1] + ', "x": 1e400}', "overflows"),
])
def test_manifest_json_limits(base, tmp_path, edit, msg):
    d = _copy(base, tmp_path)
    mp = current_manifest_path(d)
    mp.write_text(edit(mp.read_text()))
    with pytest.raises(IndexFormatError, match=msg):
        Retriever.open(d)


def test_directory_named_like_the_manifest(base, tmp_path):
    d = _copy(base, tmp_path)
    mp = current_manifest_path(d)
    mp.unlink()
    mp.mkdir()
    with pytest.raises(IndexFormatError, match="000001.json: is a directory"):
        Retriever.open(d)


def test_arrow_content_errors_name_the_file(base, tmp_path):
    # vocab.arrow without its term column
    d = _copy(base, tmp_path, "a")
    _rewrite_table(d, "vocab.arrow", lambda t: pa.table({"x": pa.array(range(t.num_rows))}))
    with pytest.raises(IndexFormatError, match="vocab.arrow.*'term'"):
        Retriever.open(d)
    # invalid UTF-8 in an id
    d = _copy(base, tmp_path, "b")

    def bad_id(t):
        ids = [b"\xff\xfe", *[s.encode() for s in t.column("id").to_pylist()[1:]]]
        return t.set_column(0, "id", pa.array(ids, pa.binary()).view(pa.string()))
    _rewrite_table(d, "shards/00001/docs.arrow", bad_id)
    with pytest.raises(IndexFormatError, match="00001/docs.arrow: column 'id'"):
        Retriever.open(d)
    # an int metadata column
    d = _copy(base, tmp_path, "c")
    _rewrite_table(d, "shards/00000/docs.arrow", lambda t: t.set_column(3, "metadata", pa.array(range(t.num_rows))))
    with pytest.raises(IndexFormatError, match="docs.arrow: column 'metadata'"):
        Retriever.open(d)


def test_refine_flat_factory_builds_and_searches_exactly(tmp_path):
    """``IVF4,Flat,RFlat`` used to build and then fail every dense search inside FAISS."""
    rng = np.random.default_rng(0)
    docs = [{"_id": f"d{i}", "text": f"doc {i}"} for i in range(300)]
    v = rng.standard_normal((300, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    build_index(docs, tmp_path / "i", BuildConfig(legs=("dense",), dense=DenseConfig(
        faiss_factory="IVF4,Flat,RFlat", dtype="float32")), dense_vectors=v, show_progress=False)
    r = Retriever.open(tmp_path / "i")
    q = v[:3] + 0.01
    res = r.search_arrays(["a", "b", "c"], k=5, mode="dense", query_vectors=q, leg_params={"dense": {"nprobe": 4}})
    exact = np.argsort(-(q @ v.T), axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(res.ids, exact)


def test_unsupported_faiss_types_refused_at_build(tmp_path):
    from retriever import ConfigError

    v = np.random.default_rng(0).standard_normal((300, DIM)).astype(np.float32)
    docs = [{"_id": f"d{i}", "text": "x"} for i in range(300)]
    with pytest.raises(ConfigError, match="IVF4_HNSW8,Flat"):
        build_index(docs, tmp_path / "i", BuildConfig(legs=("dense",), dense=DenseConfig(
            faiss_factory="IVF4_HNSW8,Flat", dtype="float32")), dense_vectors=v, show_progress=False)
