"""Integrity and hostile indexes: flipped bytes and truncation in every file type, forged
manifests (paths leaving the index, huge counts), and memory staying small while refusing them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, random_corpus
from retriever.index.errors import IndexFormatError
from retriever.index.format import current_manifest_path, manifest_digest
from retriever import Retriever, build_index
from retriever.cli import main as cli_main

QUERIES = ["vitamin bone risk", "heart blood", "gene cell cancer therapy"]


class FakeDenseEncoder:
    """Stands in for the transformer (CPU encoding is slow): deterministic unit vectors."""

    dim = 16

    def __init__(self, model=None, **kw):
        self.path = Path(__file__).parent  # fingerprinted: no weights there
        self.n_truncated = 0

    def encode(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            out[i] = np.random.default_rng(abs(hash(t)) % 2**32).standard_normal(self.dim)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def build_fake_dense(corpus, out, **kw):
    import retriever.index.encoders.dense as dense_mod

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dense_mod, "DenseEncoder", FakeDenseEncoder)
        return build_index(corpus, out, legs=("bm25", "dense"), show_progress=False, **kw)


@pytest.fixture(scope="module")
def hybrid_index(tmp_path_factory):
    """bm25 + dense index (fake encoder), 2 shards."""
    out = tmp_path_factory.mktemp("integrity") / "idx"
    build_fake_dense(random_corpus(24, seed=5, min_len=3), out, shard_size=12)
    return out


def _results(path: Path, verify: bool = False):
    r = Retriever.open(path, verify=verify)
    dim = r.engine.legs["dense"].dim
    qv = np.random.default_rng(0).standard_normal((len(QUERIES), dim)).astype(np.float32)
    a = r.search_arrays(QUERIES, k=10, mode="bm25")
    b = r.search_arrays(QUERIES, k=10, mode="dense", query_vectors=qv)
    hits = r.search_batch(QUERIES, k=5, mode="bm25")
    return (a.ids.tolist(), a.scores.tolist(), b.ids.tolist(), b.scores.tolist(),
            [[(h.id, h.title, h.text, h.metadata) for h in hs] for hs in hits])


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _offsets(size: int, n: int) -> list[int]:
    fixed = [0, 5, 7, 9, 16, 64, size // 2, size - 1, size - 6, size - 10, size - 16]
    rng = np.random.default_rng(size)
    extra = rng.integers(0, size, n).tolist()
    return sorted({o for o in fixed + extra if 0 <= o < size})


def _check_damaged(copy: Path, rel: str, good) -> str:
    """Open + search a damaged index. Returns 'open' (IndexFormatError at open/search),
    'verify' (opened, verify caught it) or 'same' (the change was harmless, e.g. JSON whitespace)."""
    name = Path(rel).name
    try:
        res = _results(copy)
    except IndexFormatError as e:
        assert name in str(e), (rel, str(e))
        return "open"
    try:
        Retriever.open(copy, verify=True)
    except IndexFormatError as e:
        assert name in str(e), (rel, str(e))
        return "verify"
    assert res == good, f"{rel}: undetected change altered the results"
    return "same"


@pytest.mark.parametrize("n_random", [5, pytest.param(80, marks=pytest.mark.slow)])
def test_flipped_bytes_in_every_file(hybrid_index, tmp_path, n_random):
    good = _results(hybrid_index)
    assert Retriever.open(hybrid_index, verify=True)
    copy = tmp_path / "c"
    shutil.copytree(hybrid_index, copy)
    kinds = {}
    tally = {"open": 0, "verify": 0, "same": 0}
    for f in _files(hybrid_index):
        rel = f.relative_to(hybrid_index).as_posix()
        kinds.setdefault(f.name, 0)
        data = f.read_bytes()
        for off in _offsets(len(data), n_random):
            b = bytearray(data)
            b[off] ^= 0xFF if off % 2 else 0x01
            (copy / rel).write_bytes(bytes(b))
            outcome = _check_damaged(copy, rel, good)
            tally[outcome] += 1
            kinds[f.name] += 1
            if f.parent.name == "manifests" or f.name == "CURRENT":  # checksummed / validated: caught at open
                assert outcome in ("open", "same"), (off, outcome)
        (copy / rel).write_bytes(data)
    assert {"CURRENT", "000001.json", "stats.json", "vocab.arrow", "docs.arrow", "bm25.arrow", "dense.arrow"} <= set(kinds)
    print(f"flip outcomes over {sum(tally.values())} flips: {tally}")
    assert tally["open"] > 0 and tally["verify"] > 0


def test_truncated_files(hybrid_index, tmp_path):
    for f in _files(hybrid_index):
        rel = f.relative_to(hybrid_index).as_posix()
        data = f.read_bytes()
        for cut in sorted({0, 1, 7, len(data) // 3, len(data) // 2, len(data) - 1}):
            copy = tmp_path / "c"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(hybrid_index, copy)
            (copy / rel).write_bytes(data[:cut])
            with pytest.raises(IndexFormatError) as ei:
                _results(copy)
            assert f.name in str(ei.value)


def test_truncated_file_with_forged_size_is_caught_by_structure(hybrid_index, tmp_path):
    """Size check defeated (manifest edited to the new size and re-checksummed): the Arrow
    structure checks still refuse the file at open."""
    for name in ("vocab.arrow", "shards/00000/docs.arrow", "shards/00000/bm25.arrow", "shards/00001/dense.arrow"):
        copy = tmp_path / name.replace("/", "_")
        shutil.copytree(hybrid_index, copy)
        p = copy / name
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])
        _forge(copy, lambda m: m["files"][name].update(bytes=len(data) // 2))
        with pytest.raises(IndexFormatError, match=Path(name).name):
            _results(copy)


def test_verify_cli(hybrid_index, tmp_path, capsys):
    assert cli_main(["index", "verify", str(hybrid_index)]) == 0
    assert capsys.readouterr().out.startswith("ok:")
    copy = tmp_path / "v"
    shutil.copytree(hybrid_index, copy)
    p = copy / "shards" / "00001" / "docs.arrow"
    b = bytearray(p.read_bytes())
    i = b.find(b"vitamin") if b.find(b"vitamin") > 0 else len(b) // 2
    b[i] ^= 0x20  # payload text byte: invisible to size/structure checks
    p.write_bytes(bytes(b))
    assert cli_main(["index", "verify", str(copy)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "docs.arrow" in err and "SHA-256" in err and len(err.splitlines()) == 1


# ---------------------------------------------------------------------------
# Forged manifests
# ---------------------------------------------------------------------------

def _forge(root: Path, edit) -> None:
    mp = current_manifest_path(root)
    m = json.loads(mp.read_text())
    edit(m)
    m["manifest_sha256"] = manifest_digest(m)
    mp.write_text(json.dumps(m))


@pytest.mark.parametrize("evil", ["../outside.arrow", "/etc/passwd", "shards/../../x", "",
                                  "shards/00000/../../../etc/passwd"])
def test_manifest_paths_confined(bm25_index, tmp_path, evil):
    copy = tmp_path / "i"
    shutil.copytree(bm25_index, copy)

    def edit(m):
        m["files"][evil] = {"bytes": 0, "sha256": "0" * 64}
    _forge(copy, edit)
    with pytest.raises(IndexFormatError, match="illegal path|leaves the index"):
        Retriever.open(copy)

    copy2 = tmp_path / "j"
    shutil.copytree(bm25_index, copy2)
    _forge(copy2, lambda m: m["shards"][0].update(dir=evil or "."))
    with pytest.raises(IndexFormatError):
        Retriever.open(copy2)


def test_symlinks_leaving_index_refused(bm25_index, tmp_path):
    outside = tmp_path / "outside"
    shutil.copytree(bm25_index, outside)
    copy = tmp_path / "i"
    shutil.copytree(bm25_index, copy)
    # a symlinked file
    (copy / "vocab.arrow").unlink()
    os.symlink(outside / "vocab.arrow", copy / "vocab.arrow")
    with pytest.raises(IndexFormatError, match="leaves the index|symlink"):
        Retriever.open(copy)
    # a symlinked shard directory
    copy2 = tmp_path / "j"
    shutil.copytree(bm25_index, copy2)
    shutil.rmtree(copy2 / "shards" / "00000")
    os.symlink(outside / "shards" / "00000", copy2 / "shards" / "00000")
    with pytest.raises(IndexFormatError, match="leaves the index|symlink"):
        Retriever.open(copy2)


def test_manifest_edit_without_checksum_update_refused(bm25_index, tmp_path):
    copy = tmp_path / "i"
    shutil.copytree(bm25_index, copy)
    m = json.loads(current_manifest_path(copy).read_text())
    m["build_config"]["bm25"]["k1"] = 2.0
    current_manifest_path(copy).write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match="manifest checksum"):
        Retriever.open(copy)


HUGE = [
    ("rows", lambda m: m["shards"][0].update(rows=10**15)),
    ("n_docs", lambda m: m["stats"].update(n_docs=10**15)),
    ("n_terms", lambda m: m["stats"].update(n_terms=10**15)),
    ("shard n_terms", lambda m: m["shards"][0].update(n_terms=10**15)),
    ("nnz", lambda m: m["shards"][0].update(nnz=2**62)),
    ("bytes", lambda m: next(iter(m["files"].values())).update(bytes=2**62)),
    ("negative rows", lambda m: m["shards"][0].update(rows=-5)),
    ("many shards", lambda m: m.update(shards=m["shards"] * 100000)),
]


PROBE = """
import sys
from retriever import Retriever
from retriever.index.errors import IndexFormatError

def hwm_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

# the baseline is taken after opening and searching an untouched index, so that modules imported
# lazily by a normal open (numba, and pandas through pyarrow where it is installed) do not count
Retriever.open(sys.argv[1]).search("vitamin bone", k=5)
base = hwm_kib()
for d in sys.argv[2:]:
    try:
        Retriever.open(d, verify=True).search("vitamin bone", k=5)
        print("OPENED", d)
    except IndexFormatError as e:
        print("REFUSED", str(e).replace(chr(10), " "))
print("BASE", base)
print("HWM", hwm_kib())
"""


def _probe(dirs: list[Path], clean: Path) -> tuple[list[str], int]:
    """Open + search each index in a fresh process; return its result lines and the growth of its
    peak RSS (VmHWM, KiB) over the baseline after an open + search of the untouched ``clean``."""
    r = subprocess.run([sys.executable, "-c", PROBE, str(clean), *map(str, dirs)], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    base = int(lines[-2].split()[1])
    hwm = int(lines[-1].split()[1])
    return lines[:-2], hwm - base


def test_forged_huge_counts_refused_without_allocating(bm25_index, tmp_path):
    dirs = []
    for name, edit in HUGE:
        copy = tmp_path / name.replace(" ", "_")
        shutil.copytree(bm25_index, copy)
        _forge(copy, edit)
        dirs.append(copy)
    lines, grown = _probe(dirs, bm25_index)
    assert len(lines) == len(HUGE) and all(line.startswith("REFUSED") for line in lines), lines
    assert grown < 100 * 1024, f"peak RSS grew by {grown} KiB"


def test_forged_huge_manifest_refused(bm25_index, tmp_path):
    copy = tmp_path / "i"
    shutil.copytree(bm25_index, copy)
    with open(current_manifest_path(copy), "r+b") as f:
        f.seek((64 << 20) + 10)
        f.write(b" ")
    with pytest.raises(IndexFormatError, match="implausibly large"):
        Retriever.open(copy)


def test_forged_arrow_array_lengths(bm25_index, tmp_path):
    """bm25.arrow rewritten (valid Arrow, matching checksums) with postings that point outside the
    shard or claim more terms than the vocabulary: refused at open (even with verify=True, the
    checksums being forged too), in a subprocess whose peak RSS stays small."""
    from retriever.index.format import read_arrays, sha256_file, write_arrays
    from retriever.legs.bm25 import BM25_ARRAYS

    src = bm25_index / "shards" / "00000" / "bm25.arrow"
    a = {k: np.array(v) for k, v in read_arrays(src, BM25_ARRAYS).items()}
    cases = {
        "doc id out of range": dict(a, doc_ids=np.where(np.arange(len(a["doc_ids"])) == 3, 2**31, a["doc_ids"]).astype(np.uint32)),
        "offsets past nnz": dict(a, offsets=np.concatenate([a["offsets"][:-1], [2**60]]).astype(np.uint64)),
        "offsets decreasing": dict(a, offsets=a["offsets"][::-1].copy()),
        "tfs short": dict(a, tfs=a["tfs"][:-1].copy()),
        "doc_len short": dict(a, doc_len=a["doc_len"][:-1].copy()),
        "more terms than vocab": dict(a, offsets=np.concatenate([a["offsets"], [a["offsets"][-1]] * 5]).astype(np.uint64)),
    }
    dirs = []
    for what, arrays in cases.items():
        copy = tmp_path / what.replace(" ", "_")
        shutil.copytree(bm25_index, copy)
        p = copy / "shards" / "00000" / "bm25.arrow"
        write_arrays(p, arrays)
        _forge(copy, lambda m: m["files"]["shards/00000/bm25.arrow"].update(
            bytes=p.stat().st_size, sha256=sha256_file(p)))
        dirs.append((what, copy))
    lines, grown = _probe([d for _, d in dirs], bm25_index)
    for (what, _), line in zip(dirs, lines):
        assert line.startswith("REFUSED") and "bm25.arrow" in line, (what, line)
    assert grown < 100 * 1024, f"peak RSS grew by {grown} KiB"
