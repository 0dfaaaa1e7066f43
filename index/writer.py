"""Index writer: shards into a temporary directory, then one atomic rename (or swap) into place.

A build never exposes a partial index: everything is written under a hidden sibling directory
``.<name>.tmp-<random>``, every file is fsynced, the per-shard statistics files, the generation-1
manifest (with each file's size and SHA-256) and the ``CURRENT`` pointer are written last, and
the directory is renamed onto the target. With ``overwrite=True`` an existing
index is swapped atomically (Linux ``renameat2(RENAME_EXCHANGE)``) and the old one deleted after;
without it, an existing non-empty target is refused before any work starts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime as _dt
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import pyarrow as pa

from .errors import IndexExistsError, IndexFormatError
from .testhooks import crash_point
from .format import (CURRENT, FORMAT_NAME, FORMAT_VERSION, SHARD_STATS, is_index, manifest_digest, manifest_name,
                     sha256_file, write_arrays, write_table)
from .metadata import MetadataColumns, combine_schema, normalize_metadata, type_name

_RENAME_EXCHANGE = 2


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two directory entries; False where the OS cannot."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD = -100
    rc = fn(AT_FDCWD, os.fsencode(str(a)), AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE)
    return rc == 0


def check_target(out: Path, overwrite: bool) -> None:
    """Refuse an existing non-empty ``out`` unless ``overwrite``; refuse a non-directory always.

    Raises:
        IndexExistsError: ``out`` exists and is not empty, and ``overwrite`` is False.
        IndexFormatError: ``out`` exists and is a file, or ``overwrite`` would replace a
            non-empty directory that is not an index.
    """
    if out.is_symlink():
        raise IndexFormatError(f"{out}: is a symbolic link; give the real directory "
                               f"({os.path.realpath(out)}) so the atomic replace does not break the link")
    if out.exists() and not out.is_dir():
        raise IndexFormatError(f"{out}: exists and is not a directory")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise IndexFormatError(f"{out}: the parent path {parent} is a file, not a directory")
            break
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise IndexExistsError(f"{out}: already exists and is not empty (pass overwrite=True, or --overwrite on the CLI, to replace it)")
        if not is_index(out):
            raise IndexFormatError(f"{out}: refusing to overwrite a non-empty directory that is not an index")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_temps(out: Path) -> list[Path]:
    """Delete temporary directories (``.<name>.tmp-<pid>-<hex>`` / ``.<name>.old-<pid>-<hex>``)
    that builds of ``out`` left behind when they died (their pid is no longer running on this
    host). Temporaries of live builds, and names without a pid, are left alone. They are never
    an index: :func:`retriever.index.format.read_manifest` refuses such a directory.

    Returns:
        the directories removed.
    """
    removed = []
    prefix_tmp, prefix_old = f".{out.name}.tmp-", f".{out.name}.old-"
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        name = p.name
        if not (name.startswith(prefix_tmp) or name.startswith(prefix_old)) or p.is_symlink() or not p.is_dir():
            continue
        pid_s = name[len(prefix_tmp):].split("-", 1)[0]
        if not pid_s.isdigit() or int(pid_s) == os.getpid() or _pid_alive(int(pid_s)):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


class _Rec(NamedTuple):
    id: str
    path: str | None
    line: int
    metadata: dict[str, Any]


def _shard_metadata(ids: list[str], metadata: list[Any] | None) -> tuple[pa.Array, pa.Array]:
    """Metadata columns of one shard from per-document dicts or JSON strings (None: none)."""
    recs = []
    for i, doc_id in enumerate(ids):
        md = metadata[i] if metadata is not None else None
        if isinstance(md, str):
            md = json.loads(md) if md else None
        recs.append(_Rec(doc_id, None, i + 1, normalize_metadata(md) if md else {}))
    return MetadataColumns().columns(recs)


class IndexWriter:
    """Writes shards and the manifest of one index build.

    Args:
        out: final index directory.
        overwrite: replace an existing index at ``out`` (atomically).

    Use as a context manager: leaving the block with an exception removes the temporary
    directory and leaves ``out`` untouched.
    """

    def __init__(self, out: str | Path, *, overwrite: bool = False) -> None:
        self.out = Path(out)
        self.overwrite = overwrite
        check_target(self.out, overwrite)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(self.out)
        self.tmp = self.out.parent / f".{self.out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.tmp.mkdir()
        self.files: dict[str, dict[str, Any]] = {}
        self.shards: list[dict[str, Any]] = []
        self.shard_stats: dict[str, dict[str, Any]] = {}
        self._committed = False

    def __enter__(self) -> "IndexWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._committed:
            self.abort()

    def _record(self, path: Path) -> None:
        rel = path.relative_to(self.tmp).as_posix()
        self.files[rel] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}

    def write_shard(self, *, ids: list[str], titles: list[str], texts: list[str],
                    metadata: tuple[pa.Array, pa.Array] | list[Any] | None = None,
                    bm25: dict[str, np.ndarray] | Callable[[], dict[str, np.ndarray]] | None = None, dense: np.ndarray | None = None,
                    dense_index: bytes | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write one immutable shard.

        Args:
            ids, titles, texts: n documents' columns.
            metadata: the ``metadata`` struct and ``metadata_nulls`` columns
                (:meth:`retriever.index.metadata.MetadataColumns.columns`, types over the whole
                build); or a list of per-document metadata (dicts, or JSON object strings, ``""``
                for none), typed for this shard alone; None: no metadata.
            bm25: ``offsets`` u64[T+1], ``doc_ids`` u32[nnz], ``tfs`` u32[nnz], ``doc_len`` u32[n];
                or a function returning them, called after the docs table is written (so the
                caller can compute the postings meanwhile, e.g. on another thread).
            dense: (n, dim) float16 or float32 vectors.
            dense_index: serialised FAISS index bytes (``faiss.serialize_index``), if any.
            extra: more fields for the shard's manifest entry.

        Returns:
            the shard's manifest entry. Its statistics (``bm25``, ``dense`` sections) are kept
            for the shard's ``stats.json``, written at :meth:`commit` (leg builders add theirs
            with :meth:`add_shard_stats`).
        """
        sdir = self.tmp / "shards" / f"{len(self.shards):05d}"
        sdir.mkdir(parents=True)
        n = len(ids)
        if metadata is None or isinstance(metadata, list):
            metadata = _shard_metadata(ids, metadata)
        struct, nulls = metadata
        if len(struct) != n or len(nulls) != n:
            raise ValueError(f"metadata columns have {len(struct)} / {len(nulls)} rows, expected {n}")
        table = pa.table({"id": pa.array(ids, pa.string()), "title": pa.array(titles, pa.large_string()),
                          "text": pa.array(texts, pa.large_string()), "metadata": struct, "metadata_nulls": nulls})
        write_table(sdir / "docs.arrow", table)
        self._record(sdir / "docs.arrow")
        crash_point("shard_docs")
        rel_dir = sdir.relative_to(self.tmp).as_posix()
        entry: dict[str, Any] = {"dir": rel_dir, "rows": n}
        stats: dict[str, Any] = {"rows": n, "metadata_fields": {f.name: type_name(f.type) for f in struct.type}}
        if callable(bm25):
            bm25 = bm25()
        if bm25 is not None:
            write_arrays(sdir / "bm25.arrow", bm25)
            self._record(sdir / "bm25.arrow")
            crash_point("shard_bm25")
            entry["n_terms"] = int(len(bm25["offsets"]) - 1)
            entry["nnz"] = int(len(bm25["doc_ids"]))
            stats["bm25"] = {"n_docs": n, "sum_dl": int(np.asarray(bm25["doc_len"]).sum(dtype=np.int64)),
                             "n_terms": entry["n_terms"], "nnz": entry["nnz"]}
        if dense is not None:
            if dense.ndim != 2 or dense.shape[0] != n:
                raise ValueError(f"dense vectors have shape {dense.shape}, expected ({n}, dim)")
            dim = dense.shape[1]
            flat = pa.array(np.ascontiguousarray(dense).reshape(-1))
            vec = pa.FixedSizeListArray.from_arrays(flat, dim)
            write_table(sdir / "dense.arrow", pa.table({"vector": vec}))
            self._record(sdir / "dense.arrow")
            crash_point("shard_dense")
            stats["dense"] = {"count": n, "dim": int(dim), "dtype": str(dense.dtype)}
        if dense_index is not None:
            p = sdir / "dense.faiss"
            with open(p, "wb") as f:
                f.write(dense_index)
                f.flush()
                os.fsync(f.fileno())
            self._record(p)
            crash_point("shard_faiss")
        if extra:
            entry.update(extra)
        _fsync_dir(sdir)
        crash_point("shard_done")
        self.shards.append(entry)
        self.shard_stats[rel_dir] = stats
        return entry

    def add_shard_stats(self, shard_dir: str, section: str, values: dict[str, Any]) -> None:
        """Add (or replace) one section of a written shard's statistics (e.g. ``"sparse"``)."""
        self.shard_stats[shard_dir][section] = values

    def write_file_arrays(self, rel: str, arrays: dict[str, np.ndarray]) -> None:
        """Write an index-level array file (e.g. the Matryoshka rotation)."""
        p = self.tmp / rel
        write_arrays(p, arrays)
        self._record(p)

    def write_vocab(self, terms: list[str]) -> None:
        """Write the global BM25 vocabulary (row i = term id i)."""
        p = self.tmp / "vocab.arrow"
        write_table(p, pa.table({"term": pa.array(terms, pa.large_string())}))
        self._record(p)
        crash_point("vocab")

    def _write_json(self, rel: str, obj: Any) -> None:
        p = self.tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        self._record(p)

    def commit(self, *, build_config: dict[str, Any], stats: dict[str, Any], build: dict[str, Any] | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write every shard's ``stats.json``, the generation-1 manifest and ``CURRENT``, and move
        the index into place atomically.

        Args:
            build_config: the build configuration (``BuildConfig.to_dict``).
            stats: corpus-wide statistics (``n_docs``, ``n_terms``, ``sum_dl``, ``dense_dim``...).
            build: build information that is not a statistic (timings, truncation counts...).
            extra: more top-level manifest fields (``models``, ``matryoshka``...).

        Returns:
            the manifest dict.
        """
        rows = sum(int(e["rows"]) for e in self.shards)
        if "n_docs" in stats and stats["n_docs"] != rows:  # never publish an inconsistent index
            raise IndexFormatError(f"{self.out}: internal error, shards hold {rows} documents but "
                                   f"{stats['n_docs']} were read; nothing was written")
        for entry in self.shards:
            rel = f"{entry['dir']}/{SHARD_STATS}"
            self._write_json(rel, self.shard_stats[entry["dir"]])
            entry["stats"] = rel
            entry["deletes"] = None
        manifest: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "generation": 1,
            "parent_generation": None,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "build_config": build_config,
            "stats": stats,
            "build": build or {},
            "metadata_schema": combine_schema(st.get("metadata_fields", {}) for st in self.shard_stats.values()),
            "fusion": None,
            "shards": self.shards,
            "files": self.files,
        }
        if extra:
            manifest.update(extra)
        manifest["manifest_sha256"] = manifest_digest(manifest)
        mpath = self.tmp / manifest_name(1)
        mpath.parent.mkdir()

        text = json.dumps(manifest, indent=1, sort_keys=False)
        with open(mpath, "w", encoding="utf-8") as f:
            f.write(text[:len(text) // 2])
            f.flush()
            crash_point("manifest_partial")
            f.write(text[len(text) // 2:])
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(mpath.parent)
        with open(self.tmp / CURRENT, "w", encoding="ascii") as f:
            f.write(manifest_name(1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self.tmp)
        crash_point("manifest")
        if self.out.exists():
            check_target(self.out, self.overwrite)
            if self.out.is_dir() and not any(self.out.iterdir()):
                os.rmdir(self.out)
        if self.out.exists():
            if _exchange(self.tmp, self.out):
                old = self.tmp  # after the swap, tmp names the old index
            else:
                old = self.out.parent / f".{self.out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:12]}"
                os.rename(self.out, old)
                os.rename(self.tmp, self.out)
            _fsync_dir(self.out.parent)
            crash_point("swap")
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(self.tmp, self.out)
            _fsync_dir(self.out.parent)
            crash_point("swap")
        self._committed = True
        return manifest

    def abort(self) -> None:
        """Remove the temporary directory; ``out`` is untouched."""
        shutil.rmtree(self.tmp, ignore_errors=True)
