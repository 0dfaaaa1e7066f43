"""Index writer: shards into a temporary directory, then one atomic rename (or swap) into place.

A build never exposes a partial index: everything is written under a hidden sibling directory
``.<name>.tmp-<random>``, every file is fsynced, the per-shard statistics files, the generation-1
manifest (with each file's size and SHA-256) and the ``CURRENT`` pointer are written last, and
the directory is renamed onto the target. With ``overwrite=True`` an existing
index is swapped atomically (Linux ``renameat2(RENAME_EXCHANGE)``) and the old one deleted after;
without it, an existing non-empty target is refused before any work starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime as _dt
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from .errors import IndexExistsError, IndexFormatError
from .locking import LOCK, writer_lock
from .builders import ShardHandle, ShardOutput
from .faults import FaultHook, no_faults
from .format import (CURRENT, FORMAT_NAME, SHARD_STATS, format_version_of, is_index, manifest_digest, manifest_name,
                     sha256_file, write_arrays, write_table)
from .metadata import MetadataColumns, combine_schema, normalize_metadata, shard_field_types

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


@contextlib.contextmanager
def _existing_index_locked(out: Path, probe_only: bool = False) -> Iterator[None]:
    """Hold the writer lock of the index at ``out`` for the block (nothing when ``out`` is not an
    index with generations). ``probe_only``: only when its ``LOCK`` file exists (a check that
    creates nothing in the index).

    Raises:
        IndexLockedError: an :class:`~retriever.index.updates.IndexUpdater` (or another lock
            holder) has the index open; names the holder's pid.
    """
    if not (out / CURRENT).is_file():  # not an index with generations (a format-1 index has no writers)
        yield
        return
    if not (out / LOCK).exists() and (probe_only or not os.access(out, os.W_OK)):
        yield  # a probe of a lock nobody took yet, or an index no writer could lock (read-only)
        return

    with writer_lock(out):
        yield


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
        faults: fault-injection hook, called at ``shard_docs``, ``shard_done``, ``manifest`` and
            ``swap`` (see :mod:`retriever.index.faults`).

    Leg builders write a shard's files with :meth:`write_arrays`, :meth:`write_table` and
    :meth:`write_bytes` between :meth:`begin_shard` and :meth:`end_shard`. Use as a context manager: leaving the block with an exception removes the temporary
    directory and leaves ``out`` untouched.
    """

    def __init__(self, out: str | Path, *, overwrite: bool = False, faults: FaultHook = no_faults) -> None:
        self.out = Path(out)
        self._faults = faults
        self.overwrite = overwrite
        check_target(self.out, overwrite)
        with _existing_index_locked(self.out, probe_only=True):  # a writer on the index it would replace: refuse now
            pass
        self.out.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(self.out)
        self.tmp = self.out.parent / f".{self.out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.tmp.mkdir()
        self.files: dict[str, dict[str, Any]] = {}
        self.shards: list[dict[str, Any]] = []
        self.shard_stats: dict[str, dict[str, Any]] = {}
        self._open: dict[str, dict[str, Any]] = {}  # shards begun, not ended: dir -> statistics so far
        self._committed = False

    #: number of the first shard directory this writer makes (a later generation's new segments
    #: continue after the index's highest one)
    first_shard = 0
    #: fsync each shard directory when the shard ends (a writer that writes more files into the
    #: directory afterwards, and fsyncs it then, turns this off)
    sync_shard_dirs = True

    @classmethod
    def for_shards(cls, tmp: str | Path, *, faults: FaultHook = no_faults) -> "IndexWriter":
        """A writer of shards into another writer's temporary directory ``tmp`` (a distributed
        build's workers, on shared storage): :meth:`begin_shard` with an explicit ``index``, the
        leg builders' ``finish_shard``, :meth:`end_shard`; its ``files``, ``shards`` and
        ``shard_stats`` go back to the committing writer (:meth:`adopt_shard`). It never commits
        nor deletes anything."""
        w = cls.__new__(cls)
        w.out, w._faults, w.overwrite = Path(tmp), faults, False
        w.tmp = Path(tmp)
        w.files, w.shards, w.shard_stats, w._open = {}, [], {}, {}
        w._committed = True  # leaving a ``with`` block never removes the shared directory
        return w

    def adopt_shard(self, entry: dict[str, Any], stats: dict[str, Any], files: dict[str, dict[str, Any]]) -> None:
        """Take a shard that a :meth:`for_shards` writer wrote into this writer's directory (its
        manifest entry, statistics and file records); shards must be adopted in shard order.

        Raises:
            IndexFormatError: the shard is not the next one (internal error; nothing is committed).
        """
        want = f"shards/{self.first_shard + len(self.shards):05d}"
        if entry.get("dir") != want:
            raise IndexFormatError(f"{self.out}: internal error, adopting shard {entry.get('dir')} where {want} "
                                   f"is next; nothing was written")
        self.files.update(files)
        self.shards.append(entry)
        self.shard_stats[entry["dir"]] = stats

    def __enter__(self) -> "IndexWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._committed:
            self.abort()

    def _record(self, path: Path) -> None:
        rel = path.relative_to(self.tmp).as_posix()
        self.files[rel] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}

    def _path(self, rel: str) -> Path:
        p = self.tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def write_arrays(self, rel: str, arrays: dict[str, np.ndarray]) -> str:
        """Write an array file (:func:`retriever.index.format.write_arrays`) at ``rel`` (relative to the index root); returns ``rel``."""
        p = self._path(rel)
        write_arrays(p, arrays)
        self._record(p)
        return rel

    def write_table(self, rel: str, table: pa.Table) -> str:
        """Write an Arrow IPC file at ``rel``; returns ``rel``."""
        p = self._path(rel)
        write_table(p, table)
        self._record(p)
        return rel

    def write_bytes(self, rel: str, data: bytes) -> str:
        """Write raw bytes (e.g. a serialised FAISS index) at ``rel``, fsynced; returns ``rel``."""
        p = self._path(rel)
        with open(p, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self._record(p)
        return rel

    def begin_shard(self, *, ids: list[str], titles: list[str], texts: list[str],
                    metadata: tuple[pa.Array, pa.Array] | list[Any] | None = None,
                    index: int | None = None) -> ShardHandle:
        """Start the next shard: write its ``docs.arrow``.

        Args:
            ids, titles, texts: the n documents' columns.
            metadata: the ``metadata`` struct and ``metadata_nulls`` columns
                (:meth:`retriever.index.metadata.MetadataColumns.columns`, types over the whole
                build); or a list of per-document metadata (dicts, or JSON object strings, ``""``
                for none), typed for this shard alone; None: no metadata.
            index: the shard's number (default: the next one; a :meth:`for_shards` writer
                gives it).

        Returns:
            the shard's handle (number, directory relative to the index root, rows).
        """
        if index is None:
            index = self.first_shard + len(self.shards) + len(self._open)
        rel_dir = f"shards/{index:05d}"
        sdir = self.tmp / rel_dir
        sdir.mkdir(parents=True)
        n = len(ids)
        if metadata is None or isinstance(metadata, list):
            metadata = _shard_metadata(ids, metadata)
        struct, nulls = metadata
        if len(struct) != n or len(nulls) != n:
            raise ValueError(f"metadata columns have {len(struct)} / {len(nulls)} rows, expected {n}")
        table = pa.table({"id": pa.array(ids, pa.string()), "title": pa.array(titles, pa.large_string()),
                          "text": pa.array(texts, pa.large_string()), "metadata": struct, "metadata_nulls": nulls})
        self.write_table(f"{rel_dir}/docs.arrow", table)
        self._faults("shard_docs")
        handle = ShardHandle(index, rel_dir, n)
        self._open[rel_dir] = {"rows": n, "metadata_fields": shard_field_types(struct)}
        return handle

    def end_shard(self, shard: ShardHandle, outputs: dict[str, ShardOutput]) -> dict[str, Any]:
        """Finish ``shard``: its manifest entry and statistics from the legs' ``outputs`` (leg name →
        what its builder wrote), fsync of its directory.

        Returns:
            the shard's manifest entry.
        """
        stats = self._open.pop(shard.dir)
        entry: dict[str, Any] = {"dir": shard.dir, "rows": shard.rows}
        for leg, out in outputs.items():
            entry.update(out.entry)
            if out.stats is not None:
                stats[leg] = out.stats
        if self.sync_shard_dirs:
            _fsync_dir(self.tmp / shard.dir)
        self._faults("shard_done")
        self.shards.append(entry)
        self.shard_stats[shard.dir] = stats
        return entry

    def write_shard(self, *, ids: list[str], titles: list[str], texts: list[str],
                    metadata: tuple[pa.Array, pa.Array] | list[Any] | None = None,
                    bm25: dict[str, np.ndarray] | None = None, dense: np.ndarray | None = None,
                    dense_index: bytes | None = None) -> dict[str, Any]:
        """Write one whole shard from ready arrays (tests and tools; builds go through the leg
        builders, :mod:`retriever.index.pipeline`).

        Args:
            ids, titles, texts, metadata: as in :meth:`begin_shard`.
            bm25: ``offsets`` u64[T+1], ``doc_ids`` u32[nnz], ``tfs`` u32[nnz], ``doc_len`` u32[n].
            dense: (n, dim) float16 or float32 stored vectors; dense_index: FAISS index bytes.

        Returns:
            the shard's manifest entry.
        """
        shard = self.begin_shard(ids=ids, titles=titles, texts=texts, metadata=metadata)
        outputs: dict[str, ShardOutput] = {}
        if bm25 is not None:
            self.write_arrays(f"{shard.dir}/bm25.arrow", bm25)
            n_terms, nnz = int(len(bm25["offsets"]) - 1), int(len(bm25["doc_ids"]))
            outputs["bm25"] = ShardOutput(stats={"n_docs": shard.rows, "sum_dl": int(np.asarray(bm25["doc_len"]).sum(dtype=np.int64)),
                                                 "n_terms": n_terms, "nnz": nnz}, entry={"n_terms": n_terms, "nnz": nnz})
        if dense is not None:
            if dense.ndim != 2 or dense.shape[0] != shard.rows:
                raise ValueError(f"dense vectors have shape {dense.shape}, expected ({shard.rows}, dim)")
            flat = pa.array(np.ascontiguousarray(dense).reshape(-1))
            self.write_table(f"{shard.dir}/dense.arrow", pa.table({"vector": pa.FixedSizeListArray.from_arrays(flat, dense.shape[1])}))
            outputs["dense"] = ShardOutput(stats={"count": shard.rows, "dim": int(dense.shape[1]), "dtype": str(dense.dtype)})
        if dense_index is not None:
            self.write_bytes(f"{shard.dir}/dense.faiss", dense_index)
        return self.end_shard(shard, outputs)

    def add_shard_stats(self, shard_dir: str, section: str, values: dict[str, Any]) -> None:
        """Add (or replace) one section of a written shard's statistics (e.g. ``"sparse"``)."""
        self.shard_stats[shard_dir][section] = values

    def write_file_arrays(self, rel: str, arrays: dict[str, np.ndarray]) -> None:
        """Write an array file at ``rel`` (e.g. the Matryoshka rotation); :meth:`write_arrays`."""
        self.write_arrays(rel, arrays)

    def write_vocab(self, terms: list[str]) -> None:
        """Write the global BM25 vocabulary ``vocab.arrow`` (row i = term id i)."""
        self.write_table("vocab.arrow", pa.table({"term": pa.array(terms, pa.large_string())}))

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
            "format_version": format_version_of(self.shards),
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
        for parent in sorted({(self.tmp / e["dir"]).parent for e in self.shards}):
            _fsync_dir(parent)  # the entries naming the shard directories (shards/), durable before the manifest
        mpath.parent.mkdir()

        with open(mpath, "w", encoding="utf-8") as f:
            f.write(json.dumps(manifest, indent=1, sort_keys=False))
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(mpath.parent)
        with open(self.tmp / CURRENT, "w", encoding="ascii") as f:
            f.write(manifest_name(1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self.tmp)
        self._faults("manifest")
        if self.out.exists():
            check_target(self.out, self.overwrite)
            if self.out.is_dir() and not any(self.out.iterdir()):
                os.rmdir(self.out)
        if self.out.exists():
            # the replaced index's writer lock is held across the swap: an IndexUpdater open on it
            # would otherwise commit its pending changes into the new index afterwards
            with _existing_index_locked(self.out):
                if _exchange(self.tmp, self.out):
                    old = self.tmp  # after the swap, tmp names the old index
                else:
                    old = self.out.parent / f".{self.out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:12]}"
                    os.rename(self.out, old)
                    os.rename(self.tmp, self.out)
                _fsync_dir(self.out.parent)
            self._faults("swap")
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(self.tmp, self.out)
            _fsync_dir(self.out.parent)
            self._faults("swap")
        self._committed = True
        return manifest

    def abort(self) -> None:
        """Remove the temporary directory; ``out`` is untouched."""
        shutil.rmtree(self.tmp, ignore_errors=True)
