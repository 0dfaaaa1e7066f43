"""On-disk index format (version 2): Arrow IPC files, generation manifests, checksums, validation.

Layout of an index directory (all Arrow files are uncompressed IPC *file* format, memory-mappable,
readable by plain pyarrow / DuckDB / Polars; ``docs/FORMAT.md`` is the full description)::

    CURRENT                       one line: the current generation's manifest, "manifests/NNNNNN.json"
    manifests/NNNNNN.json         generation N (immutable): format version, build config, shard list,
                                  per-file size + SHA-256, corpus statistics, build info, fusion
    vocab.arrow                   BM25 terms; row i is term id i (global across shards)
    shards/NNNNN/docs.arrow       id, title, text, metadata (struct of typed columns), metadata_nulls
    shards/NNNNN/stats.json       per-shard statistics (BM25 n_docs / sum_dl, dense count / dim, sparse
                                  max weight ...), what corpus-wide statistics are combined from
    shards/NNNNN/bm25.arrow       CSR postings: offsets u64[T_s+1], doc_ids u32, tfs u32; doc_len u32
                                  (a living index's added segment may list its terms: terms u32[T'],
                                  offsets u64[T'+1]; manifest entry "bm25_terms": T')
    shards/NNNNN/dense.arrow      vector: fixed_size_list<float16|float32>[dim]
    shards/NNNNN/dense.faiss      FAISS index (only for factory strings other than "Flat")

Files are never modified once a manifest lists them: a later generation shares them, or lists new
files under new names (tombstones ``shards/NNNNN/deletes.GGGGGG.arrow``, ...), and switches
``CURRENT`` atomically (written beside it, fsynced, renamed over it).

"Array files" (``bm25.arrow``) hold one row whose columns are ``large_list`` arrays, one per
named numpy array, so each array is read back zero-copy from the memory map.
Loading an index executes no code: only Arrow buffers, JSON and FAISS files are read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from .errors import IndexFormatError
from .manifest_schema import parse_json_limited, validate_manifest
from .arrow_io import (ARROW_MAGIC, arrays_of_table, table_from_map, write_arrays,  # noqa: F401 (re-exported)
                       write_table)
from .safe_open import IndexFiles, check_rel, open_regular

FORMAT_NAME = "retriever-index"
#: the newest format version this build reads and writes
FORMAT_VERSION = 3
#: the versions this build reads: 2, and 3 = 2 plus segments that list their own BM25 terms
#: (``bm25_terms``); a generation is written with the lowest version that holds it
#: (:func:`format_version_of`), so builds stay readable by builds that know only version 2
READ_FORMAT_VERSIONS = (2, 3)
#: the pointer file naming the current generation's manifest
CURRENT = "CURRENT"
#: folder of the generation manifests
MANIFEST_DIR = "manifests"
#: the single manifest of a format-1 index (read only to say how to upgrade it)
MANIFEST_V1 = "manifest.json"
#: a generation manifest's name, relative to the index root
MANIFEST_NAME_RE = re.compile(r"^manifests/([0-9]{6,12})\.json$")
MAX_GENERATION = 10**12 - 1
#: per-shard statistics file (JSON), beside the shard's other files
SHARD_STATS = "stats.json"
MAX_STATS_BYTES = 1 << 20
MAX_MANIFEST_BYTES = 64 << 20
#: Names of a build's temporary directories (index/writer.py); never opened as an index.
TEMP_DIR_RE = re.compile(r"^\..+\.(tmp|old)-[0-9a-f-]+$")

#: the fixed leading columns of ``docs.arrow``; ``metadata`` (a struct of typed columns, see
#: :mod:`retriever.index.metadata`) and ``metadata_nulls`` follow
DOCS_COLUMNS = ("id", "title", "text", "metadata", "metadata_nulls")


def manifest_name(generation: int) -> str:
    """Relative path of generation ``generation``'s manifest, e.g. ``manifests/000001.json``."""
    if isinstance(generation, bool) or not isinstance(generation, int) or not 1 <= generation <= MAX_GENERATION:
        raise ValueError(f"generation must be an integer in [1, {MAX_GENERATION}], got {generation!r}")
    return f"{MANIFEST_DIR}/{generation:06d}.json"


def is_index(path: str | Path) -> bool:
    """True when ``path`` looks like an index directory of any format version (has ``CURRENT``
    or a format-1 ``manifest.json``); nothing is validated."""
    p = Path(path)
    return (p / CURRENT).is_file() or (p / MANIFEST_V1).is_file()


def read_table(path: Path, *, full: bool = False) -> pa.Table:
    """Memory-map an Arrow IPC file (zero-copy) and validate its structure (see
    :func:`table_from_map`). The file is opened with ``O_NOFOLLOW | O_NONBLOCK`` and must be a
    regular file; the query side opens index files through
    :class:`retriever.index.safe_open.IndexFiles` instead (confined, listed, size-checked).

    Raises:
        IndexFormatError: missing, a symlink, not a regular file, unreadable or structurally
            corrupted file (names it).
    """
    with open_regular(path) as f:
        buf = f.map()
    return table_from_map(Path(path), buf, full=full)


def read_arrays(path: Path, expected: Mapping[str, np.dtype]) -> dict[str, np.ndarray]:
    """Read an array file written by :func:`write_arrays` as zero-copy read-only numpy views
    (:func:`read_table`, then :func:`arrays_of_table`).

    Raises:
        IndexFormatError: missing column, wrong dtype, or malformed file (names the file).
    """
    return arrays_of_table(path, read_table(path), expected)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def safe_join(root: Path, rel: str, where: str | None = None) -> Path:
    """Resolve a manifest-relative path, refusing anything that leaves ``root``.

    Args:
        where: the file that names ``rel`` (for the message; default the index root).

    Raises:
        IndexFormatError: absolute path, ``..`` component, or a symlink leading outside ``root``.
    """
    src = where or str(root)
    check_rel(rel, src)
    p = root / rel
    real_root = root.resolve()
    try:
        p.resolve().relative_to(real_root)
    except ValueError:
        raise IndexFormatError(f"{src}: path {rel!r} leaves the index directory") from None
    return p


def manifest_digest(m: Mapping[str, Any]) -> str:
    """SHA-256 of a manifest's canonical JSON without its ``manifest_sha256`` field."""
    body = {k: v for k, v in m.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                     allow_nan=False).encode("utf-8")).hexdigest()


def format_version_of(shards: Any) -> int:
    """The lowest format version that holds a generation of these shard entries: 3 when a segment
    lists its own BM25 terms (``bm25_terms``: a layout of ``bm25.arrow`` that builds knowing only
    version 2 would misread), else 2. Writers stamp it on each manifest, so such builds refuse the
    index (``unsupported format_version``) instead of misreading it."""
    return 3 if any(isinstance(e, dict) and "bm25_terms" in e for e in shards) else 2


def upgrade_hint(root: Path) -> str:
    """The sentence that tells how to convert an older index at ``root``."""
    return f"convert it with 'retriever index upgrade {root}' (atomic; postings and vectors are kept)"


def read_current(root: Path) -> int:
    """The generation that ``root/CURRENT`` points to.

    Raises:
        IndexFormatError: not an index, a format-1 index (the message names
            ``retriever index upgrade``), or a malformed pointer (names ``CURRENT``).
    """
    if TEMP_DIR_RE.match(root.name):
        raise IndexFormatError(f"{root}: temporary directory of an unfinished or replaced build, not an index")
    if not root.is_dir():
        raise IndexFormatError(f"{root}: index directory not found")
    cpath = root / CURRENT
    try:
        raw = IndexFiles(root).read_bytes(CURRENT, listed=False, max_bytes=256)
    except IndexFormatError:
        if not os.path.lexists(cpath):
            if os.path.lexists(root / MANIFEST_V1):
                raise IndexFormatError(f"{root}: index of format version 1 (written by an older retriever; this "
                                       f"build reads versions {', '.join(map(str, READ_FORMAT_VERSIONS))}): {upgrade_hint(root)}") from None
            raise IndexFormatError(f"{root}: not an index (no {CURRENT} file)") from None
        raise
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    m = MANIFEST_NAME_RE.fullmatch(text[:-1]) if text.endswith("\n") else None
    if m is None:
        raise IndexFormatError(f"{cpath}: malformed pointer {raw[:64]!r} (expected one line 'manifests/NNNNNN.json')")
    return int(m.group(1))


def current_manifest_path(root: str | Path) -> Path:
    """Path of the manifest that ``root/CURRENT`` points to (see :func:`read_current`)."""
    root = Path(root)
    return root / manifest_name(read_current(root))


def _check_fields(mpath: Path, m: dict[str, Any]) -> None:
    for key, typ in (("files", dict), ("shards", list), ("build_config", dict), ("stats", dict), ("build", dict),
                     ("metadata_schema", dict)):
        if not isinstance(m.get(key), typ):
            raise IndexFormatError(f"{mpath}: field {key!r} missing or not a {typ.__name__}")
    if not isinstance(m.get("models", {}), dict):
        raise IndexFormatError(f"{mpath}: field 'models' is not a dict")
    if m.get("fusion") is not None and not isinstance(m["fusion"], dict):
        raise IndexFormatError(f"{mpath}: field 'fusion' is not null or an object")
    parent = m.get("parent_generation")
    if parent is not None and (isinstance(parent, bool) or not isinstance(parent, int)
                               or not 1 <= parent < m["generation"]):
        raise IndexFormatError(f"{mpath}: bad parent_generation {parent!r}")


def read_manifest(root: Path, generation: int | None = None, *,
                  checked: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Read and validate the manifest of generation ``generation`` (default: the one ``CURRENT``
    points to) of the index at ``root``.

    Every file the manifest lists must exist with its recorded size (a fast truncation check;
    :func:`verify_checksums` checks content).

    Args:
        checked: the validated manifest of an earlier generation of this index, read by a
            writer that has held the index's lock since (so its files, never modified once
            listed, are still there): a file listed with the same entry there, and a shard
            directory listed there, are not checked on disk again (the writer's commit checks
            only what it added). Everything else is validated as without it.

    Raises:
        IndexFormatError: not an index, a format-1 index (names ``retriever index upgrade``),
            unknown version, malformed manifest, unknown generation, or listed files missing or
            with the wrong size.
    """
    current = read_current(root)
    gen = current if generation is None else generation
    try:
        rel = manifest_name(gen)
    except ValueError as e:
        raise IndexFormatError(f"{root}: {e}") from None
    mpath = root / rel
    if not os.path.lexists(mpath):
        if generation is None:
            raise IndexFormatError(f"{root / CURRENT}: points to {rel}, which does not exist")
        raise IndexFormatError(f"{root}: generation {gen} does not exist (current is {current})")
    raw = IndexFiles(root).read_bytes(rel, listed=False, max_bytes=MAX_MANIFEST_BYTES)
    m = parse_json_limited(mpath, raw)
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
        raise IndexFormatError(f"{mpath}: not a {FORMAT_NAME} manifest")
    if "manifest_sha256" not in m or m["manifest_sha256"] != manifest_digest(m):
        raise IndexFormatError(f"{mpath}: manifest checksum mismatch (manifest corrupted or edited)")
    check_manifest(root, gen, m, checked=checked)
    return m


def check_manifest(root: Path, generation: int, m: Mapping[str, Any], *,
                   checked: Mapping[str, Any] | None = None) -> None:
    """The checks :func:`read_manifest` makes of a parsed manifest ``m`` of generation
    ``generation`` past its checksum: format version, field types and ranges, the listed files
    on disk (present, confined, of the listed size) and the shard entries. A writer runs them on
    the manifest it is about to commit, before writing it.

    Args:
        checked: as for :func:`read_manifest`.

    Raises:
        IndexFormatError: the first violation, naming the manifest file, the field and the value.
    """
    gen = generation
    mpath = root / manifest_name(gen)
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
        raise IndexFormatError(f"{mpath}: not a {FORMAT_NAME} manifest")
    if m.get("format_version") not in READ_FORMAT_VERSIONS:
        raise IndexFormatError(f"{mpath}: unsupported format_version {m.get('format_version')!r} "
                               f"(this build reads {', '.join(map(str, READ_FORMAT_VERSIONS))})")
    if isinstance(m.get("shards"), list) and m["format_version"] < format_version_of(m["shards"]):
        raise IndexFormatError(f"{mpath}: format_version {m['format_version']} but its shards need "
                               f"{format_version_of(m['shards'])} (segments listing their BM25 terms)")
    if m.get("generation") != gen:
        raise IndexFormatError(f"{mpath}: says generation {m.get('generation')!r}, its name says {gen}")
    validate_manifest(mpath, m, known_files=checked["files"] if checked is not None else None)
    _check_fields(mpath, m)
    if len(m["shards"]) > len(m["files"]) or len({str(s.get("dir")) if isinstance(s, dict) else i
                                                  for i, s in enumerate(m["shards"])}) != len(m["shards"]):
        raise IndexFormatError(f"{mpath}: shard list is inconsistent (more shards than files, or a "
                               f"shard directory listed twice)")
    vocab = m.get("vocab") or ()
    unlisted = [v for v in vocab if v not in m["files"]]
    if unlisted:
        raise IndexFormatError(f"{mpath}: vocabulary file {unlisted[0]!r} is not in the file list")
    files = IndexFiles(root, m["files"], str(mpath))
    known_files: Mapping[str, Any] = checked["files"] if checked is not None else {}
    known_dirs = {s["dir"] for s in checked["shards"]} if checked is not None else set()
    for frel, info in m["files"].items():
        if not isinstance(info, dict) or not isinstance(info.get("bytes"), int) or not isinstance(info.get("sha256"), str):
            raise IndexFormatError(f"{mpath}: bad entry for file {frel!r}")
        if known_files.get(frel) != info:
            files.open(frel).close()  # confined, no symlink on the way, a regular file of the listed size
    for i, s in enumerate(m["shards"]):
        if not isinstance(s, dict) or not isinstance(s.get("dir"), str) or not isinstance(s.get("rows"), int) or s["rows"] < 0:
            raise IndexFormatError(f"{mpath}: bad shard entry #{i}")
        for key in ("n_terms", "nnz"):
            if key in s and (not isinstance(s[key], int) or s[key] < 0):
                raise IndexFormatError(f"{mpath}: shard #{i} has a bad {key!r}: {s[key]!r}")
        for key, required in (("docs", True), ("stats", True), ("deletes", False)):
            f = f"{s['dir']}/docs.arrow" if key == "docs" else s.get(key)
            if f is None and not required:
                continue
            if not isinstance(f, str) or f not in m["files"]:
                raise IndexFormatError(f"{mpath}: shard #{i} ({s['dir']!r}) has no {key} file in the file list "
                                       f"(got {f!r})")
        if s["dir"] not in known_dirs:
            safe_join(root, s["dir"], str(mpath))
    n_docs = m["stats"].get("n_docs")
    if n_docs is not None and n_docs != sum(s["rows"] for s in m["shards"]):
        raise IndexFormatError(f"{mpath}: shard rows add up to {sum(s['rows'] for s in m['shards'])}, "
                               f"stats.n_docs is {n_docs}")


def read_shard_stats(path: Path, rows: int, raw: bytes | None = None) -> dict[str, Any]:
    """Read a shard's ``stats.json`` (see :mod:`retriever.index.shard_stats` for the fields).

    Args:
        raw: the file's bytes when the caller read them already (through
            :class:`~retriever.index.safe_open.IndexFiles`); else ``path`` is opened.

    Raises:
        IndexFormatError: unreadable, not a JSON object, or ``rows`` differs from the manifest's.
    """
    if raw is None:
        with open_regular(path) as f:
            if f.size > MAX_STATS_BYTES:
                raise IndexFormatError(f"{path}: statistics file is implausibly large")
            raw = f.read_all()
    if len(raw) > MAX_STATS_BYTES:
        raise IndexFormatError(f"{path}: statistics file is implausibly large")
    st = parse_json_limited(path, raw)
    if not isinstance(st, dict) or st.get("rows") != rows:
        raise IndexFormatError(f"{path}: statistics for {st.get('rows') if isinstance(st, dict) else st!r} rows, "
                               f"the manifest says {rows}")
    return st


def verify_checksums(root: Path, manifest: Mapping[str, Any]) -> None:
    """Recompute every file's SHA-256 (each opened through
    :class:`~retriever.index.safe_open.IndexFiles`) and compare with the manifest.

    Raises:
        IndexFormatError: names the first file whose content does not match.
    """
    files = IndexFiles(root, manifest["files"])
    for rel, info in manifest["files"].items():
        if files.sha256(rel) != info["sha256"]:
            raise IndexFormatError(f"{files.path(rel)}: SHA-256 mismatch (file corrupted or modified)")
