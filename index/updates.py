"""A living index: add, delete, upsert, commit and compact an existing index in place.

Lucene's model (immutable segments, per-segment tombstones, merges), on this project's format:

- A segment is a shard directory. :meth:`IndexUpdater.add` builds new segments with the build's own
  leg builders (:mod:`retriever.index.builders`) and build configuration; the BM25 builder is
  seeded with the index's vocabulary so the new postings use global term ids (terms new to the
  index are appended: ``vocab.GGGGGG.arrow``), the sparse leg quantises with the index's fixed
  impact scale, the dense leg reuses the Matryoshka rotation and, for IVF / PQ / HNSW factories,
  the trained FAISS index of an existing segment (emptied, then filled).
- :meth:`IndexUpdater.delete` marks rows dead; :meth:`IndexUpdater.commit` writes each touched
  segment's tombstones as of the new generation (``shards/NNNNN/deletes.GGGGGG.arrow``: the rows,
  plus the deleted documents' per-term df, so readers compute BM25 statistics over live
  documents without scanning postings) and commits one generation
  (:func:`retriever.index.generations.commit_generation`: new manifest, atomic ``CURRENT`` switch).
- :meth:`IndexUpdater.compact` rewrites runs of adjacent small or delete-heavy segments into new
  segments holding only their live documents, in the same order (document order, and so the
  tie order of every search, is unchanged), without tombstones; FAISS indexes are trained anew.

One writer at a time: the updater holds the index's ``LOCK`` (``flock``) from open to close; a
second one gets :class:`IndexLockedError` naming the holder's pid. Readers never take the lock and
keep the generation they opened. Files the new generation does not list stay until they are
older than :attr:`IndexUpdater.keep_generations` generations. Files of a killed writer (segments,
tombstones, vocabulary or a manifest that ``CURRENT`` never named) are listed by no manifest and are
removed by the next updater when it opens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from .analyzer_kernels import masked_df
from .bm25_build import BM25_ARRAYS, BM25_COMPACT_ARRAYS, check_bm25_segment
from .builders import Batch, ShardHandle, ShardOutput
from .config import BuildConfig
from .errors import ConfigError, CorpusError, IndexFormatError, ModelError
from .faults import FaultHook, no_faults
from .arrow_io import arrays_table, table_bytes
from .format import (CURRENT, manifest_name, read_arrays, read_current, read_manifest, read_shard_stats,
                     read_table)
from .generations import commit_generation, file_entry
from .id_map import IdMap
from .locking import LOCK, writer_lock
from .metadata import MetadataColumns, combine_schema
from .readers import Document, read_corpus
from .writer import SHARD_STATS, IndexWriter, _fsync_dir

__all__ = ["CompactPolicy", "CompactReport", "DeleteReport", "IndexUpdater"]

_SHARD_DIR = re.compile(r"^shards/(\d{5,})$")
_SPARSE_FWD = {"indptr": np.uint64, "terms": np.uint32, "weights": np.float32}
_ROW_BITS = 32  # an id-map code is (segment number << 32) | row (rows are uint32 in every file)
_ROW_MASK = (1 << _ROW_BITS) - 1


@dataclass(frozen=True)
class CompactPolicy:
    """When :meth:`IndexUpdater.compact` rewrites a segment (Lucene's tiered merge policy, reduced
    to two thresholds and adjacent runs so that document order is kept).

    Attributes:
        small_rows: a segment with fewer rows than this (deleted ones included) is small; runs of
            at least two adjacent small segments are merged.
        max_deleted_fraction: a segment whose deleted rows are at least this fraction of its rows
            is rewritten without them (merged with the small or delete-heavy segments next to it).
        segment_rows: rows per merged segment at most (default: the build's ``shard_size``).
    """

    small_rows: int = 10_000
    max_deleted_fraction: float = 0.25
    segment_rows: int | None = None

    def __post_init__(self) -> None:
        if self.small_rows < 0:
            raise ConfigError(f"small_rows must be >= 0, got {self.small_rows}")
        if not 0.0 < self.max_deleted_fraction <= 1.0:
            raise ConfigError(f"max_deleted_fraction must be in (0, 1], got {self.max_deleted_fraction}")
        if self.segment_rows is not None and self.segment_rows < 1:
            raise ConfigError(f"segment_rows must be >= 1, got {self.segment_rows}")


@dataclass
class DeleteReport:
    """What :meth:`IndexUpdater.delete` did.

    Attributes:
        deleted: documents marked deleted (distinct ids).
        unknown: ids that name no live document (never silently ignored: reported here).
    """

    deleted: int
    unknown: list[str] = field(default_factory=list)


@dataclass
class CompactReport:
    """What :meth:`IndexUpdater.compact` did.

    Attributes:
        generation: the generation committed (the current one when nothing was compacted).
        merged: the segment directories rewritten.
        written: the new segment directories.
        dropped_rows: deleted rows that no longer take space.
        seconds: wall time of the compaction and its commit.
    """

    generation: int
    merged: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    dropped_rows: int = 0
    seconds: float = 0.0


class _SegmentWriter(IndexWriter):
    """An :class:`IndexWriter` that writes new segments straight into an existing index directory
    (invisible until a manifest lists them) instead of a temporary one.

    Each file is serialised in memory and created (its directory entry) on the calling thread;
    its bytes are written and fsynced by one job of ``pool`` and hashed (SHA-256 of the same
    bytes, never read back) by another, while the batch goes on. :meth:`finish_segments` waits for
    every job, then the directory fsyncs: when it returns, every file is durable and recorded."""

    sync_shard_dirs = False  # finish_segments fsyncs each segment directory after its stats.json

    def __init__(self, root: Path, first_shard: int, faults: FaultHook, pool: ThreadPoolExecutor) -> None:  # noqa: D107
        self.out = root
        self.tmp = root
        self._faults = faults
        self.overwrite = False
        self.files: dict[str, dict[str, Any]] = {}
        self.shards: list[dict[str, Any]] = []
        self.shard_stats: dict[str, dict[str, Any]] = {}
        self._open: dict[str, dict[str, Any]] = {}
        self._committed = False
        self.first_shard = first_shard
        self._pool = pool  # the updater's: lives as long as it does (no threads started per add)
        self._syncs: list[tuple[str | None, int, list[Future]]] = []
        self._root_files: list[str] = []  # files written under the root itself

    # files: created here, written + fsynced and hashed on the pool (finish_segments waits)
    def _write_later(self, rel: str, data: Any) -> str:
        p = self._path(rel)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            job = self._pool.submit(_write_fsync, fd, data)
        except BaseException:
            os.close(fd)
            raise
        futs = [job]
        self._syncs.append((rel, len(memoryview(data)), futs))
        futs.append(self._pool.submit(_sha256_hex, data))
        return rel

    def write_arrays(self, rel: str, arrays: dict[str, np.ndarray]) -> str:  # noqa: D102
        return self._write_later(rel, table_bytes(arrays_table(arrays)))

    def write_table(self, rel: str, table: pa.Table) -> str:  # noqa: D102
        return self._write_later(rel, table_bytes(table))

    def write_bytes(self, rel: str, data: bytes) -> str:  # noqa: D102
        return self._write_later(rel, bytes(data))

    def _write_json(self, rel: str, obj: Any) -> None:
        self._write_later(rel, json.dumps(obj, indent=1, allow_nan=False).encode("utf-8"))

    def write_root_table(self, rel: str, table: pa.Table) -> str:
        """Write an Arrow IPC file directly under the index root (a vocabulary file); its
        directory entry is fsynced by :meth:`finish_segments`, and :meth:`abort` removes it."""
        if "/" in rel:
            raise ValueError(f"internal error: {rel!r} is not a file name of the index root")
        self._root_files.append(rel)
        return self._write_later(rel, table_bytes(table))

    def _wait_syncs(self, raise_errors: bool = True) -> None:
        syncs, self._syncs = self._syncs, []
        error: BaseException | None = None
        for rel, size, futs in syncs:
            for fut in futs:  # every job ends before this returns, even after an error
                if fut.exception() is not None and error is None:
                    error = fut.exception()
            if rel is not None and error is None and len(futs) == 2:
                self.files[rel] = {"bytes": size, "sha256": futs[1].result()}
        if error is not None and raise_errors:
            raise error

    def finish_segments(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Write every new segment's ``stats.json``; when it returns, every file and directory
        entry of the new segments is durable (fsynced). Returns (manifest entry, statistics)
        pairs."""
        out = []
        for entry in self.shards:
            rel = f"{entry['dir']}/{SHARD_STATS}"
            self._write_json(rel, self.shard_stats[entry["dir"]])
            entry["stats"] = rel
            entry["deletes"] = None
            out.append((entry, self.shard_stats[entry["dir"]]))
        # the directories (their entries: every file above, all created by now; shards/: the new
        # directories), fsynced while the files' jobs run
        dirs = [self.tmp / e["dir"] for e in self.shards] + ([self.tmp / "shards"] if out else [])
        for d in dirs + ([self.tmp] if self._root_files else []):
            self._syncs.append((None, 0, [self._pool.submit(_fsync_dir, d)]))
        self._wait_syncs()
        return out

    def abort(self) -> None:
        """Remove the segments written so far (the index directory itself stays)."""
        self._wait_syncs(raise_errors=False)
        for d in list(self.shard_stats) + list(self._open):
            shutil.rmtree(self.tmp / d, ignore_errors=True)
        for rel in self._root_files:
            with contextlib.suppress(FileNotFoundError):
                (self.tmp / rel).unlink()


@dataclass
class _Segment:
    """A segment of the working state: its manifest entry, statistics and deleted rows."""

    entry: dict[str, Any]
    stats: dict[str, Any]
    deleted: np.ndarray  # ascending int64 rows deleted as of the last commit (or written this session)
    pending: set[int] = field(default_factory=set)  # rows deleted since
    new: bool = False  # written since the last commit

    @property
    def dir(self) -> str:
        return self.entry["dir"]

    @property
    def rows(self) -> int:
        return int(self.entry["rows"])

    def all_deleted(self) -> np.ndarray:
        if not self.pending:
            return self.deleted
        return np.union1d(self.deleted, np.fromiter(self.pending, dtype=np.int64, count=len(self.pending)))

    def n_deleted(self) -> int:
        return len(self.deleted) + len(self.pending)


class IndexUpdater:
    """The one writer of an index: add, delete, upsert, commit, compact (a context manager).

    Open with :meth:`open`. Changes are invisible to every reader until :meth:`commit` (one new
    generation, atomic); a reader sees them after :meth:`retriever.Retriever.refresh` or a reopen.
    Leaving the ``with`` block closes the updater without committing (uncommitted segments are
    removed).

    Args:
        path: an index directory (format 2).
        device: encoder device for the dense and sparse models.
        policy: default :class:`CompactPolicy` of :meth:`compact`.
        keep_generations: generations whose files stay on disk (the current one and the ones
            before it, for readers that opened them; >= 1). Older manifests and the files only
            they list are deleted after each commit.
        dense_model, sparse_model: encode added documents with these model directories instead
            of the ones the manifest records; their weights must hash as the index's (adding with
            other models is a :class:`ModelError` naming both).
        faults: fault-injection hook (tests), called at the build's points and at
            :data:`retriever.index.faults.UPDATE_CRASH_POINTS`.

    Raises:
        IndexLockedError: another writer holds the index (names its pid).
        IndexFormatError: not an index, or an index this version cannot update.
    """

    def __init__(self, path: str | Path, *, device: str = "cpu", policy: CompactPolicy | None = None,
                 keep_generations: int = 2, dense_model: str | Path | None = None,
                 sparse_model: str | Path | None = None, faults: FaultHook | None = None) -> None:
        if keep_generations < 1:
            raise ConfigError(f"keep_generations must be >= 1, got {keep_generations}")
        self.root = Path(path)
        self.device = device
        self.policy = policy or CompactPolicy()
        self.keep_generations = int(keep_generations)
        self._faults = faults or no_faults
        self._stack = contextlib.ExitStack()
        if not (self.root / CURRENT).is_file():
            read_manifest(self.root)  # the reader's error for a missing / format-1 index
        self._stack.enter_context(writer_lock(self.root))
        # segment numbers of the id map's codes (append-only for the updater's life)
        self._seg_dirs: list[str] = []
        self._seg_nums: dict[str, int] = {}
        try:
            self._load()
            if self.config.legs and "dense" in self.config.legs and dense_model is not None:
                self.config = dataclasses.replace(self.config, dense=dataclasses.replace(self.config.dense, model=str(dense_model)))
            if "sparse" in self.config.legs and sparse_model is not None:
                self.config = dataclasses.replace(self.config, sparse=dataclasses.replace(self.config.sparse, model=str(sparse_model)))
            self.cleaned = self._clean()
        except BaseException:
            self._stack.close()
            raise
        self._builders: dict[str, Any] = {}
        # manifest ``files`` entries (size, SHA-256) recorded when this session wrote a file:
        # a commit lists new segments without reading and hashing their files again
        self._recorded: dict[str, dict[str, Any]] = {}
        # writes, fsyncs and hashes of new segment files (threads kept for the updater's life)
        self._sync_pool: ThreadPoolExecutor | None = None
        self._closed = False

    @classmethod
    def open(cls, path: str | Path, **opts: Any) -> "IndexUpdater":
        """Open the writer of the index at ``path`` (keyword options as in the class)."""
        return cls(path, **opts)

    def __enter__(self) -> "IndexUpdater":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ state
    def _load(self, manifest: dict[str, Any] | None = None, known: Mapping[str, _Segment] | None = None) -> None:
        """The current generation (or ``manifest``, just committed) as working state.

        Args:
            known: the segments of the generation before ``manifest`` (by directory): a segment
                listed by both with the same statistics and tombstone files keeps its statistics
                and deleted rows as read then (a commit reads only the files it wrote).
        """
        m = manifest if manifest is not None else read_manifest(self.root)
        self.manifest = m
        self.generation: int = m["generation"]
        self.config = BuildConfig.from_dict(m["build_config"])
        self.segments: list[_Segment] = []
        known = known or {}
        for e in m["shards"]:
            old = known.get(e["dir"])
            if old is not None and not old.new and old.entry.get("stats") == e["stats"]:
                st = old.stats
            else:
                st = read_shard_stats(self.root / e["stats"], e["rows"])
            if old is not None and not old.new and not old.pending and old.entry.get("deletes") == e.get("deletes"):
                deleted = old.deleted
            elif e.get("deletes"):
                deleted = read_arrays(self.root / e["deletes"], {"rows": np.uint32})["rows"].astype(np.int64)
            else:
                deleted = np.zeros(0, dtype=np.int64)
            self.segments.append(_Segment(dict(e), st, deleted))
        self.vocab_files: list[str] = list(m.get("vocab") or (["vocab.arrow"] if "bm25" in self.config.legs else []))
        self._n_vocab: int = int(m["stats"].get("n_terms", 0))  # terms now (the adds' new terms included)
        self._n_committed_terms = int(m["stats"].get("n_terms", 0))
        self._ids: IdMap | None = None
        self._by_dir = {s.dir: s for s in self.segments}
        self._dropped: list[str] = []  # segment directories a pending compaction replaced
        # vocabulary files the adds since the last commit wrote (durable, recorded, listed by no
        # manifest yet): they hold the terms _n_committed_terms .. _vocab_covered - 1, in order
        self._vocab_pending: list[str] = []
        self._vocab_covered = self._n_committed_terms

    @property
    def pending(self) -> bool:
        """True when there are changes :meth:`commit` has not written yet."""
        return bool(self._dropped) or any(s.new or s.pending for s in self.segments)

    def _seg_base(self, rel_dir: str) -> int:
        """The id-map code of row 0 of the segment ``rel_dir`` (its number << 32)."""
        k = self._seg_nums.get(rel_dir)
        if k is None:
            k = self._seg_nums[rel_dir] = len(self._seg_dirs)
            self._seg_dirs.append(rel_dir)
        return k << _ROW_BITS

    def _where(self, code: int) -> tuple[str, int]:
        """(segment directory, row) of an id-map code."""
        return self._seg_dirs[code >> _ROW_BITS], code & _ROW_MASK

    def _id_map(self) -> IdMap:
        """id -> code (segment number << 32 | row) of every live document, built on first use
        from the segments' id columns (:class:`~retriever.index.id_map.IdMap`: a compiled table,
        no Python string per document); :meth:`_where` decodes a code into (segment directory,
        row).

        Raises:
            IndexFormatError: two live rows hold one id (names it and the segment)."""
        if self._ids is None:
            ids = IdMap()
            for s in self.segments:
                col = read_table(self.root / s.dir / "docs.arrow").column("id")
                codes = np.arange(len(col), dtype=np.int64) + self._seg_base(s.dir)
                dead = s.all_deleted()
                if len(dead):
                    live = np.ones(len(col), dtype=bool)
                    live[dead] = False
                    col, codes = col.filter(pa.array(live)), codes[live]
                try:
                    ids.load(col, codes)
                except ValueError as e:
                    raise IndexFormatError(f"{self.root / s.dir}: a document id is live twice in the index, here "
                                           f"and in this or an earlier segment ({e})") from None
            self._ids = ids
        return self._ids

    def _vocab_array(self) -> pa.Array:
        """The vocabulary now as one Arrow string array (term id i at row i), read from the
        committed vocabulary files and those the adds since the last commit wrote (every term an
        add brought is written with its segment, so these hold them all)."""
        if self._n_vocab != self._vocab_covered:
            raise RuntimeError(f"internal error: {self._n_vocab} terms, {self._vocab_covered} of them in files")
        chunks: list[pa.Array] = []
        for rel in self.vocab_files + self._vocab_pending:
            chunks.extend(read_table(self.root / rel, full=True).column("term").cast(pa.large_string()).chunks)
        terms = pa.concat_arrays(chunks) if chunks else pa.array([], pa.large_string())
        if len(terms) != self._vocab_covered or terms.null_count:
            raise IndexFormatError(f"{self.root}: the vocabulary files hold {len(terms)} terms "
                                   f"({terms.null_count} null), the manifest and the adds since say "
                                   f"{self._vocab_covered}")
        return terms

    def _vocab_name(self) -> str:
        """The name of the next vocabulary file of the pending generation G: ``vocab.G.arrow``
        (``vocab.G.K.arrow`` for the K-th after it, when several adds before one commit add
        terms)."""
        gen, k = self.generation + 1, len(self._vocab_pending)
        return f"vocab.{gen:06d}.arrow" if k == 0 else f"vocab.{gen:06d}.{k}.arrow"

    def _next_shard(self) -> int:
        nums = [-1]
        shards = self.root / "shards"
        if shards.is_dir():
            nums += [int(p.name) for p in shards.iterdir() if p.name.isdigit()]
        return max(nums) + 1

    # ------------------------------------------------------------------ leftovers and old files
    def _referenced(self) -> tuple[set[str], list[int]] | None:
        """Files listed by the generations kept on disk, and those generations; None when a kept
        manifest cannot be read (then nothing is removed). The current manifest is the one
        validated at load; older ones only need their file lists (read as JSON)."""
        current = read_current(self.root)
        if current != self.generation:
            return None
        keep = [g for g in range(current, max(0, current - self.keep_generations), -1)]
        files: set[str] = set()
        kept = []
        for g in keep:
            if g == self.generation:
                m = self.manifest
            else:
                try:
                    m = json.loads((self.root / manifest_name(g)).read_bytes())
                    if not isinstance(m.get("files"), dict):
                        return None
                except FileNotFoundError:
                    continue  # removed by an earlier clean
                except (OSError, ValueError, AttributeError):
                    return None
            kept.append(g)
            files.update(m["files"])
            files.update(m.get("vocab") or ())
            files.add(manifest_name(g))
        return files, kept

    def _clean(self) -> list[str]:
        """Remove what no kept generation lists: a killed writer's segments, tombstones,
        vocabulary and manifests, temporary files, and generations older than
        :attr:`keep_generations` (their manifests and the files only they list). Returns the
        removed paths (relative to the root)."""
        ref = self._referenced()
        if ref is None:
            return []
        files, _kept = ref
        removed: list[str] = []
        root = self.root
        mdir = root / "manifests"
        for p in sorted(mdir.iterdir()) if mdir.is_dir() else []:
            rel = f"manifests/{p.name}"
            if rel not in files:
                p.unlink()
                removed.append(rel)
        for p in sorted(root.iterdir()):
            if p.is_file() and p.name not in (CURRENT, LOCK) and p.name not in files and (
                    p.name.startswith("vocab.") or ".tmp-" in p.name):
                p.unlink()
                removed.append(p.name)
        shards = root / "shards"
        dirs_in_use = {f.rsplit("/", 1)[0] for f in files if f.startswith("shards/")}
        # plain strings (not Path objects): this walks every segment after each commit
        sroot = os.fspath(shards)
        for name in sorted(os.listdir(sroot)) if shards.is_dir() else []:
            rel = f"shards/{name}"
            d = os.path.join(sroot, name)
            if rel not in dirs_in_use:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(rel)
                continue
            for fname in sorted(os.listdir(d)):
                frel = f"{rel}/{fname}"
                if frel not in files:
                    os.unlink(os.path.join(d, fname))
                    removed.append(frel)
        # no directory fsync: a removal that a crash undoes leaves a file no kept manifest lists,
        # which the next updater removes again (nothing any generation needs is touched here)
        return removed

    # ------------------------------------------------------------------ builders
    def _make_builders(self, dense_vectors: Any, sparse_vectors: Any, *, compaction: bool = False) -> list[Any]:
        """The leg builders of one add (or compaction) batch, in leg order: BM25 seeded with the
        vocabulary (kept across adds until a commit), dense with the index's rotation, storage
        dtype and trained FAISS index, sparse with the index's fixed scale.

        Raises:
            ConfigError: missing / extra precomputed vectors. ModelError: other models than the
                index's (names both).
        """
        cfg = self.config
        models = self.manifest.get("models", {})
        if dense_vectors is not None and "dense" not in cfg.legs:
            raise ConfigError("dense_vectors given but this index has no dense leg")
        if sparse_vectors is not None and "sparse" not in cfg.legs:
            raise ConfigError("sparse_vectors given but this index has no sparse leg")
        out: list[Any] = []
        for leg in cfg.legs:
            if leg == "bm25":
                out.append(self._bm25_builder())
            elif leg == "dense":
                out.append(self._dense_builder(dense_vectors, models.get("dense") or {}, compaction))
            elif leg == "sparse":
                out.append(self._sparse_builder(sparse_vectors, models.get("sparse") or {}))
        return out

    def _bm25_builder(self) -> Any:
        """The BM25 builder, seeded with the index's vocabulary (kept across adds and commits)."""
        b = self._builders.get("bm25")
        if b is None:
            b = self._builders["bm25"] = self._new_bm25_builder()
        return b

    def _new_bm25_builder(self) -> Any:
        """A BM25 builder seeded with the vocabulary (:meth:`_vocab_array`; its term table is
        built from the files' string buffers: the vocabulary is never a list of Python strings)."""
        from .analyzer import Analyzer
        from .bm25_build import BM25Builder

        return BM25Builder(Analyzer(self.config.analyzer), self._faults, vocab=self._vocab_array())

    def _first_add_tables(self) -> None:
        """The two tables of the whole index that the first add needs, built side by side: the
        BM25 builder (reading the vocabulary, then its term table) on a worker thread while this
        thread builds the id map (both compiled inserts that run without the GIL)."""
        pool = self._pool()
        fut = pool.submit(self._new_bm25_builder)
        try:
            self._id_map()
        except BaseException:  # the id map's error is the one raised; the builder is stopped
            if fut.exception() is None:
                fut.result().close(raise_errors=False)
            raise
        self._builders["bm25"] = fut.result()

    def _pool(self) -> ThreadPoolExecutor:
        """The updater's worker threads (segment files' writes, fsyncs and hashes)."""
        if self._sync_pool is None:
            self._sync_pool = ThreadPoolExecutor(4, thread_name_prefix="segment-sync")
        return self._sync_pool

    def _discard_bm25(self, n_terms_before: int) -> None:
        """Drop the BM25 builder and the terms a failed batch added (the next batch starts anew
        from the vocabulary as it was)."""
        if "bm25" in self._builders:
            self._builders.pop("bm25").close(raise_errors=False)
        self._n_vocab = n_terms_before

    def _dense_builder(self, vectors: Any, model: Mapping[str, Any], compaction: bool) -> Any:
        from .dense_build import DenseBuilder
        from .matryoshka import MatryoshkaBuilder, load_rotation

        cfg = self.config.dense
        st = self.manifest["stats"]
        dim = int(st.get("dense_dim") or 0)
        if vectors is None and not model.get("path"):
            raise ConfigError(f"{self.root}: this index's dense vectors were precomputed (no dense model "
                              f"recorded): pass dense_vectors= ((n_docs, {dim}) float32)")
        if vectors is None:
            b = self._builders.get("dense")
            if b is None:
                b = DenseBuilder(cfg, self._faults, device=self.device)
                _check_model("dense", model, b._model_info or {})
                self._builders["dense"] = b
        else:
            b = DenseBuilder(cfg, self._faults, vectors=vectors)
            if dim:  # rows of another width are refused as they are taken (ConfigError), before any commit
                b.feed.dim = dim
        mat = MatryoshkaBuilder(dim, () if compaction else cfg.matryoshka_dims, mrl_trained=cfg.mrl_trained,
                                dtype=str(st.get("dense_dtype") or cfg.dtype), rotation_sample=cfg.rotation_sample)
        if mat.rotates:
            rot = load_rotation(self.root, self.manifest, dim)
            if rot is not None:
                mat.rotation = rot
            else:  # fitted on no data: the index stores its vectors unrotated
                mat.dims = ()
        b.mat = mat
        b.faiss_template = None
        if cfg.faiss_factory != "Flat" and not compaction:
            for s in self.segments:
                p = self.root / s.dir / "dense.faiss"
                if not s.new and p.is_file() and s.rows:
                    b.faiss_template = p.read_bytes()
                    break
        return b

    def _sparse_builder(self, vectors: Any, model: Mapping[str, Any]) -> Any:
        from .sparse_build import SparseBuilder
        from .sparse_index import check_doc_vectors

        b = self._builders.get("sparse")
        if b is None:
            scale = float(self.manifest["stats"]["sparse_scale"])
            b = SparseBuilder(self.config, device=self.device, scale=scale)
            _check_model("sparse", model, b.model_info())
            self._builders["sparse"] = b
        b._parts = []
        b._pos = 0
        b._vectors = None
        if vectors is not None:
            try:
                ip, t, w = vectors
                b._vectors = check_doc_vectors(ip, t, w, b.vocab_size)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"sparse_vectors: {e}") from None
        return b

    def _drop_builders(self) -> None:
        for b in self._builders.values():
            b.close(raise_errors=False)
        self._builders = {}

    # ------------------------------------------------------------------ add / delete / upsert
    def add(self, records: str | Path | Iterable[Mapping[str, Any]], *, dense_vectors: Any = None,
            sparse_vectors: Any = None) -> int:
        """Add documents as new segments (visible after :meth:`commit`).

        Args:
            records: a corpus path (as :func:`retriever.index.build_index` reads) or an iterable
                of dicts with ``_id`` (or ``id``), ``text``, optional ``title``; other fields are
                metadata (their types must match the index's).
            dense_vectors: float (n, dim) vectors in record order instead of running the dense
                model (required when the index's vectors were precomputed).
            sparse_vectors: a CSR triple ``(indptr, term ids, weights)`` in record order instead of
                running the sparse model.

        Returns:
            the number of documents added.

        Raises:
            CorpusError: a bad record, an id repeated in the batch (names it and both positions),
                an id the index already holds (points to :meth:`upsert`), or metadata of another
                type than the index's (names the field and both types). Nothing is written then.
            ModelError / ConfigError: see :meth:`_make_builders`.
        """
        return self._add(records, dense_vectors, sparse_vectors, replace=False)

    def upsert(self, records: str | Path | Iterable[Mapping[str, Any]], *, dense_vectors: Any = None,
               sparse_vectors: Any = None) -> int:
        """Add documents, replacing the live documents with the same ``_id`` (delete + add, as
        one change: a rejected batch deletes nothing). Arguments, errors and return as
        :meth:`add` (except that an existing id is replaced, not an error)."""
        return self._add(records, dense_vectors, sparse_vectors, replace=True)

    def _add(self, records: Any, dense_vectors: Any, sparse_vectors: Any, *, replace: bool) -> int:
        self._check_open()
        # The records are read (and validated) first, and every check below runs before anything
        # is written. Meanwhile the BM25 analysis of the first segment's batches starts on its
        # worker threads (it writes nothing; a rejected batch drops it with the builder), as in a
        # build, where reading overlaps the analysis.
        docs: list[Document] = []
        prefed = 0
        handed = False  # a batch went to the BM25 builder (set before the call: it may fail inside it)
        bm25 = "bm25" in self.config.legs
        bs, first_seg = self.config.batch_size, self.config.shard_size
        n_terms_before = self._n_vocab if bm25 else 0
        if bm25 and "bm25" not in self._builders and self._ids is None:
            self._first_add_tables()
        try:
            for d in read_corpus(records):
                docs.append(d)
                n = len(docs)
                if bm25 and n - prefed == bs and n <= first_seg:
                    part = docs[prefed:n]
                    handed = True
                    self._bm25_builder().add(Batch(part, [f"{d.title} {d.text}" if d.title else d.text for d in part]))
                    prefed = n
            if not docs:
                return 0
            written, replaced, batch_ids, ids = self._checked_build(docs, dense_vectors, sparse_vectors, replace, prefed)
        except BaseException:
            if handed:  # the builder holds this call's documents (and terms): drop them
                self._discard_bm25(n_terms_before)
            raise
        for entry, st in written:
            seg = _Segment(entry, st, np.zeros(0, dtype=np.int64), new=True)
            self.segments.append(seg)
            self._by_dir[seg.dir] = seg
        for code in replaced:
            d, row = self._where(code)
            self._by_dir[d].pending.add(row)
        k = 0
        for entry, _ in written:
            base, n = self._seg_base(entry["dir"]), int(entry["rows"])
            ids.assign(batch_ids[k:k + n], np.arange(base, base + n, dtype=np.int64))
            k += n
        return len(docs)

    def _checked_build(self, docs: list[Document], dense_vectors: Any, sparse_vectors: Any, replace: bool,
                       prefed: int) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], list[int], list[str],
                                             IdMap]:
        """The input checks of :meth:`add`, then the new segments (``prefed``: leading documents
        already given to the BM25 builder). Returns (segments written, id-map codes replaced,
        the batch's ids, the id map)."""
        batch_ids = [d.id for d in docs]
        if len(set(batch_ids)) != len(batch_ids):  # find the first repeat (positions in the message)
            first: dict[str, int] = {}
            for pos, d in enumerate(docs):
                p = first.setdefault(d.id, pos)
                if p != pos:
                    raise CorpusError(f"document id {d.id!r} appears twice in this batch: positions {p} and {pos} "
                                      f"(counting from 0)", path=d.path, line=d.line, field="_id")
        ids = self._id_map()
        codes = ids.find(batch_ids)
        hit = np.flatnonzero(codes >= 0)
        replaced: list[int] = []
        if len(hit):
            if not replace:
                d = docs[int(hit[0])]
                where, row = self._where(int(codes[hit[0]]))
                raise CorpusError(f"document id {d.id!r} is already in the index ({where}, row {row}); "
                                  f"use upsert to replace it", path=d.path, line=d.line, field="_id")
            replaced = codes[hit].tolist()
        if any(d.metadata for d in docs):  # without metadata there is no type to conflict
            schema = {k: v for k, v in combine_schema(s.stats.get("metadata_fields", {}) for s in self.segments
                                                      if s.dir not in self._dropped).items() if v is not None}
            MetadataColumns(schema=schema).columns(docs)  # a type conflict with the index: nothing written
        written = self._build_segments(docs, dense_vectors, sparse_vectors, prefed=prefed)
        return written, replaced, batch_ids, ids

    def _build_segments(self, docs: list[Document], dense_vectors: Any, sparse_vectors: Any, *,
                        compaction: bool = False, metadata: Sequence[tuple[pa.Array, pa.Array]] | None = None,
                        cuts: Sequence[int] | None = None, prefed: int = 0) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Write ``docs`` as new segments (``shard_size`` rows each, or the given ``cuts``);
        on any error every segment written is removed and the vocabulary is left as it was.
        ``prefed``: the first documents were given to the BM25 builder already, in batches of
        ``batch_size`` (the pipeline's batches of the first segment)."""
        from .pipeline import _ShardDocs, _batches, _write_shard

        writer = _SegmentWriter(self.root, self._next_shard(), self._faults, self._pool())
        n_terms_before = self._n_vocab if "bm25" in self.config.legs else 0
        try:
            builders = self._make_builders(dense_vectors, sparse_vectors, compaction=compaction)
            if cuts is None:
                meta = MetadataColumns()
                shard = _ShardDocs()
                pos = 0
                rest = [b for b in builders if b.name != "bm25"]
                for batch, end in _batches(iter(docs), self.config):
                    if pos < prefed:
                        if pos + len(batch) > prefed:
                            raise RuntimeError(f"internal error: a batch of documents {pos}..{pos + len(batch)} "
                                               f"straddles the {prefed} documents analysed already")
                        if rest:
                            self._feed(rest, batch)
                    else:
                        self._feed(builders, batch)
                    pos += len(batch)
                    shard.docs.extend(batch)
                    if end:
                        _write_shard(writer, shard, meta, builders)
                        shard = _ShardDocs()
            else:
                lo = 0
                for (hi, md) in zip(cuts, metadata or ()):
                    part = docs[lo:hi]
                    for i in range(0, len(part), self.config.batch_size):
                        self._feed(builders, part[i:i + self.config.batch_size])
                    for b in builders:
                        b.end_shard()
                    handle = writer.begin_shard(ids=[d.id for d in part], titles=[d.title for d in part],
                                                texts=[d.text for d in part], metadata=md)
                    outputs = {b.name: b.finish_shard(writer, handle) for b in builders}
                    writer.end_shard(handle, outputs)
                    lo = hi
            for b in builders:
                if b.name == "dense" and b.feed is not None and not b.feed.exhausted():
                    raise ConfigError(f"dense_vectors has more rows than the batch ({len(docs)} documents)")
                if b.name == "sparse" and b._vectors is not None and len(b._vectors[0]) - 1 != b._pos:
                    raise ConfigError(f"sparse_vectors has {len(b._vectors[0]) - 1} rows, the batch {len(docs)} documents")
            vocab_rel, vocab_end = None, 0
            if "bm25" in self._builders:
                # the terms this batch added, written with its segment files (durable when they
                # are): the commit only lists the file
                postings = self._builders["bm25"].postings
                if postings.n_terms > self._vocab_covered:
                    vocab_rel = self._vocab_name()
                    vocab_end = postings.n_terms
                    writer.write_root_table(vocab_rel, pa.table(
                        {"term": pa.array(postings.terms_since(self._vocab_covered), pa.large_string())}))
            out = writer.finish_segments()
            self._faults("update_segments")
            self._recorded.update(writer.files)
            if vocab_rel is not None:
                self._vocab_pending.append(vocab_rel)
                self._vocab_covered = vocab_end
            return out
        except BaseException:
            writer.abort()
            if "bm25" in self._builders:  # its vocabulary may hold terms of the failed batch
                self._builders.pop("bm25").close(raise_errors=False)
                self._n_vocab = n_terms_before
            raise
        finally:
            if "bm25" in self._builders:
                self._n_vocab = self._builders["bm25"].postings.n_terms

    def _feed(self, builders: Sequence[Any], docs: Sequence[Document]) -> None:
        batch = Batch(docs, [f"{d.title} {d.text}" if d.title else d.text for d in docs])
        for b in builders:
            b.add(batch)

    def delete(self, ids: Iterable[str]) -> DeleteReport:
        """Mark documents deleted by id (visible after :meth:`commit`).

        Args:
            ids: document ids (strings; repeats count once).

        Returns:
            :class:`DeleteReport`: how many were deleted and which ids name no live document.

        Raises:
            ConfigError: ``ids`` is a single string, or holds a non-string (names it).
        """
        self._check_open()
        if isinstance(ids, (str, bytes)):
            raise ConfigError("delete() takes an iterable of ids, not one string")
        want = list(dict.fromkeys(ids))
        for i in want:
            if not isinstance(i, str):
                raise ConfigError(f"document ids are strings, got {i!r} ({type(i).__name__})")
        codes = self._id_map().remove(want)
        unknown = [want[j] for j in np.flatnonzero(codes < 0).tolist()]
        for code in codes[codes >= 0].tolist():
            d, row = self._where(code)
            self._by_dir[d].pending.add(row)
        return DeleteReport(len(want) - len(unknown), unknown)

    # ------------------------------------------------------------------ commit
    def commit(self) -> int:
        """Write the pending changes as one new generation (atomic: a crash leaves the previous
        generation current and complete, or the new one). Nothing pending: no new generation.

        Returns:
            the generation now current.

        Raises:
            IndexFormatError: the index was changed behind the lock (never by this library).
        """
        self._check_open()
        if not self.pending:
            return self.generation
        gen = self.generation + 1
        files = dict(self.manifest["files"])
        for d in self._dropped:
            for rel in [f for f in files if f.startswith(d + "/")]:
                del files[rel]
        shards: list[dict[str, Any]] = []
        n_terms = self._n_vocab
        tombstones = self._tombstones(gen, n_terms)
        touched = set()
        for s in self.segments:
            e = dict(s.entry)
            if s.new:
                for rel in _files_of(self.root, s.dir):
                    rec = self._recorded.get(rel)
                    files[rel] = rec if rec is not None else file_entry(self.root, rel)
            if s.pending:
                rel, entry = tombstones[s.dir]
                touched.add(s.dir)
                if e.get("deletes"):
                    files.pop(e["deletes"], None)
                files[rel] = entry
                e["deletes"] = rel
            shards.append(e)
        for d in touched:
            _fsync_dir(self.root / d)
        self._faults("update_deletes")
        vocab_files = list(self.vocab_files)
        if n_terms > self._n_committed_terms:
            # the files the adds wrote, then (only when they do not cover every new term) one more
            for rel in self._vocab_pending:
                files[rel] = self._recorded[rel]
                vocab_files.append(rel)
            if n_terms > self._vocab_covered:
                if "bm25" not in self._builders:
                    raise RuntimeError(f"internal error: terms {self._vocab_covered}..{n_terms - 1} are in no "
                                       f"file and no builder; nothing was committed")
                rel = self._vocab_name()
                files[rel] = _durable_entry(self.root / rel, table_bytes(pa.table({"term": pa.array(
                    self._builders["bm25"].postings.terms_since(self._vocab_covered), pa.large_string())})))
                _fsync_dir(self.root)
                vocab_files.append(rel)
            self._faults("update_vocab")
        stats = dict(self.manifest["stats"])
        live_stats = [s for s in self.segments]
        stats["n_docs"] = int(sum(s.rows for s in live_stats))
        stats["n_deleted"] = int(sum(s.n_deleted() for s in live_stats))
        stats["n_live"] = stats["n_docs"] - stats["n_deleted"]
        if "bm25" in self.config.legs:
            stats["n_terms"] = n_terms
            stats["sum_dl"] = int(sum(s.stats.get("bm25", {}).get("sum_dl", 0) for s in live_stats))
        if "sparse" in self.config.legs:
            stats["sparse_nnz"] = int(sum(s.entry.get("sparse_nnz", 0) for s in live_stats))
        changes: dict[str, Any] = {
            "shards": shards, "files": files, "stats": stats,
            "metadata_schema": combine_schema(s.stats.get("metadata_fields", {}) for s in self.segments)}
        if vocab_files and (vocab_files != ["vocab.arrow"] or "vocab" in self.manifest):
            changes["vocab"] = vocab_files
        m = commit_generation(self.root, parent=self.generation, changes=changes, fault=self._faults, lock_held=True,
                              parent_manifest=self.manifest)
        self._recorded.clear()
        ids = self._ids  # still exact: the commit applied every pending change (None after a compaction)
        self._load(m, self._by_dir)
        # the builders (the BM25 one holds exactly the committed vocabulary now) and the id map
        # stay: the next add does not redo work proportional to the index
        self._ids = ids
        self._clean()
        self._faults("update_clean")
        return m["generation"]

    def _tombstones(self, gen: int, n_terms: int) -> dict[str, tuple[str, dict[str, Any]]]:
        """The tombstone file of generation ``gen`` of each segment with pending deletes (its
        deleted rows and, with BM25, their per-term df from a pass over its postings), written,
        fsynced and hashed on the updater's worker threads, segments side by side (the postings
        passes run without the GIL): segment directory -> (file, its manifest entry).

        Raises:
            the first error of a segment, in segment order, after every segment's job ended."""
        def one(s: _Segment) -> tuple[str, dict[str, Any]]:
            rows = s.all_deleted()
            rel = f"{s.dir}/deletes.{gen:06d}.arrow"
            arrays: dict[str, np.ndarray] = {"rows": rows.astype(np.uint32)}
            if "bm25" in self.config.legs:
                arrays["bm25_terms"], arrays["bm25_df"] = _deleted_df(self.root / s.dir, rows, s.entry, n_terms)
            return rel, _durable_entry(self.root / rel, table_bytes(arrays_table(arrays)))

        jobs = [(s.dir, self._pool().submit(one, s)) for s in self.segments if s.pending]
        wait([f for _, f in jobs])
        return {d: f.result() for d, f in jobs}

    # ------------------------------------------------------------------ compaction
    def compact(self, policy: CompactPolicy | None = None, *, full: bool = False) -> CompactReport:
        """Rewrite runs of adjacent small or delete-heavy segments (see :class:`CompactPolicy`)
        into new segments of their live documents, in order, without tombstones, and commit
        (one generation, which also holds any pending change).

        Args:
            policy: thresholds (default: the updater's).
            full: rewrite every segment (one run: the whole index in ``segment_rows`` segments).

        Returns:
            :class:`CompactReport` (``generation`` is the new current one).
        """
        self._check_open()
        t0 = time.perf_counter()
        p = policy or self.policy
        seg_rows = int(p.segment_rows or self.config.shard_size)
        runs: list[list[_Segment]] = []
        cur: list[_Segment] = []
        for s in self.segments:
            heavy = s.rows > 0 and s.n_deleted() / s.rows >= p.max_deleted_fraction
            small = s.rows < p.small_rows
            if full or heavy or small or s.n_deleted() == s.rows:
                cur.append(s)
            else:
                if cur:
                    runs.append(cur)
                cur = []
        if cur:
            runs.append(cur)
        runs = [r for r in runs if len(r) >= 2 or r[0].n_deleted() > 0]
        report = CompactReport(self.generation)
        if not runs:
            report.generation = self.commit()
            report.seconds = time.perf_counter() - t0
            return report
        new_order: list[_Segment] = []
        run_of = {id(s): i for i, r in enumerate(runs) for s in r}
        done: set[int] = set()
        try:
            for s in self.segments:
                i = run_of.get(id(s))
                if i is None:
                    new_order.append(s)
                    continue
                if i in done:
                    continue
                done.add(i)
                written = self._merge(runs[i], seg_rows)
                for entry, st in written:
                    seg = _Segment(entry, st, np.zeros(0, dtype=np.int64), new=True)
                    new_order.append(seg)
                    report.written.append(seg.dir)
                for old in runs[i]:
                    report.merged.append(old.dir)
                    report.dropped_rows += old.n_deleted()
                self._faults("compact_segment")
        except BaseException:
            for d in report.written:
                shutil.rmtree(self.root / d, ignore_errors=True)
            raise
        self._dropped = [d for d in report.merged if not self._by_dir[d].new]
        for d in report.merged:  # merged segments written in this session are not in any manifest
            if self._by_dir[d].new:
                shutil.rmtree(self.root / d, ignore_errors=True)
        self.segments = new_order
        self._by_dir = {s.dir: s for s in self.segments}
        self._ids = None
        report.generation = self.commit()
        report.seconds = time.perf_counter() - t0
        return report

    def _merge(self, run: list[_Segment], seg_rows: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """New segments holding the live documents of ``run`` (in order), their stored dense and
        sparse vectors reused as precomputed (no model runs; quantised with the same constants)."""
        docs: list[Document] = []
        structs: list[pa.Array] = []
        nulls: list[pa.Array] = []
        dense: list[np.ndarray] = []
        sp: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        fields = combine_schema(s.stats.get("metadata_fields", {}) for s in run)
        types: dict[str, pa.DataType] = {}
        tables = []
        for s in run:
            t = read_table(self.root / s.dir / "docs.arrow")
            tables.append(t)
            for f in t.schema.field("metadata").type:
                if not pa.types.is_null(f.type):
                    types.setdefault(f.name, f.type)
        for s, t in zip(run, tables):
            live = np.setdiff1d(np.arange(s.rows, dtype=np.int64), s.all_deleted())
            idx = pa.array(live, pa.int64())
            ids = t.column("id").take(idx).to_pylist()
            titles = t.column("title").take(idx).to_pylist()
            texts = t.column("text").take(idx).to_pylist()
            docs.extend(Document(i, ti or "", tx or "", {}, None, int(r) + 1)
                        for i, ti, tx, r in zip(ids, titles, texts, live))
            meta = t.column("metadata").combine_chunks().take(idx)
            children, flds = [], []
            for name in fields:
                typ = types.get(name, pa.null())
                if meta.type.get_field_index(name) >= 0 and not pa.types.is_null(meta.type.field(name).type):
                    child = meta.field(name)
                else:
                    child = pa.nulls(len(live), typ)
                children.append(child)
                flds.append(pa.field(name, typ))
            structs.append(pa.StructArray.from_arrays(children, fields=flds) if flds
                           else pa.array([{}] * len(live), pa.struct([])))
            nulls.append(t.column("metadata_nulls").combine_chunks().take(idx))
            if "dense" in self.config.legs:
                dense.append(_stored_vectors(self.root / s.dir / "dense.arrow", s.rows)[live])
            if "sparse" in self.config.legs:
                f = read_arrays(self.root / s.dir / "sparse.arrow", _SPARSE_FWD)
                ip = f["indptr"].astype(np.int64)
                lo, hi = ip[live], ip[live + 1]
                take = np.concatenate([np.arange(a, b) for a, b in zip(lo.tolist(), hi.tolist())]) if len(live) else \
                    np.zeros(0, np.int64)
                sp.append((np.concatenate([[0], np.cumsum(hi - lo)]), f["terms"][take], f["weights"][take]))
        if not docs:
            return []
        struct = pa.concat_arrays(structs) if len(structs) > 1 else structs[0]
        null_col = pa.concat_arrays(nulls) if len(nulls) > 1 else nulls[0]
        cuts = list(range(seg_rows, len(docs), seg_rows)) + [len(docs)]
        metadata = []
        lo = 0
        for hi in cuts:
            metadata.append((struct.slice(lo, hi - lo), null_col.slice(lo, hi - lo)))
            lo = hi
        dv = np.concatenate(dense).astype(np.float32) if dense else None
        sv = None
        if sp:
            base, ips = 0, [np.zeros(1, np.int64)]
            for ip, _, _ in sp:
                ips.append(ip[1:] + base)
                base += int(ip[-1])
            sv = (np.concatenate(ips).astype(np.int64), np.concatenate([t for _, t, _ in sp]),
                  np.concatenate([w for _, _, w in sp]))
        return self._build_segments(docs, dv, sv, compaction=True, metadata=metadata, cuts=cuts)

    # ------------------------------------------------------------------ close
    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError(f"{self.root}: this IndexUpdater is closed")

    def close(self) -> None:
        """Drop uncommitted segments, stop the builders and release the writer lock."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self._drop_builders()
            if self._sync_pool is not None:
                self._sync_pool.shutdown(wait=True)
                self._sync_pool = None
            for s in self.segments:
                if s.new:
                    shutil.rmtree(self.root / s.dir, ignore_errors=True)
            for rel in self._vocab_pending:
                with contextlib.suppress(FileNotFoundError):
                    (self.root / rel).unlink()
        finally:
            self._stack.close()


def _write_fsync(fd: int, data: Any) -> None:
    """Write ``data`` (bytes-like) to the new file ``fd``, fsync it, close it."""
    with open(fd, "wb", closefd=True) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sha256_hex(data: Any) -> str:
    """Hex SHA-256 of ``data`` (bytes-like; hashlib releases the GIL on large inputs)."""
    return hashlib.sha256(memoryview(data)).hexdigest()


def _durable_entry(path: Path, data: Any) -> dict[str, Any]:
    """Write ``data`` to ``path`` and fsync it (the caller fsyncs the directory); its manifest
    ``files`` entry (size, SHA-256 of the bytes written, not read back)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": len(memoryview(data)), "sha256": _sha256_hex(data)}


def _files_of(root: Path, rel_dir: str) -> list[str]:
    """Files of a new segment directory (relative to the root), sorted."""
    return sorted(f"{rel_dir}/{p.name}" for p in (root / rel_dir).iterdir() if p.is_file())


def _stored_vectors(path: Path, rows: int) -> np.ndarray:
    """A segment's stored dense vectors (rows, dim), float16 or float32 as stored."""
    col = read_table(path).column("vector")
    dim = col.type.list_size
    if rows == 0:
        return np.zeros((0, dim), np.float32)
    values = col.combine_chunks().values if col.num_chunks != 1 else col.chunk(0).values
    return values.to_numpy(zero_copy_only=False).reshape(rows, dim)


def _deleted_df(shard_dir: Path, rows: np.ndarray, entry: Mapping[str, Any], n_terms: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per-term df of the deleted ``rows`` of a segment, from its postings: (term ids u32
    ascending, counts u32), terms with a count of 0 left out. One compiled pass over the segment's
    postings (:func:`~retriever.index.analyzer_kernels.masked_df`), done once per commit that deletes
    from the segment; readers then read it. ``entry``: the segment's manifest entry (a segment
    with ``bm25_terms`` lists its terms, see :func:`~retriever.index.bm25_build.compact_offsets`);
    the postings must match it as readers require
    (:func:`~retriever.index.bm25_build.check_bm25_segment`), or a position would be taken for
    a term id.

    Raises:
        IndexFormatError: the segment's postings are not valid CSR or do not match ``entry``
            (names the file)."""
    path = shard_dir / "bm25.arrow"
    compact = "bm25_terms" in entry
    a = read_arrays(path, BM25_COMPACT_ARRAYS if compact else BM25_ARRAYS)
    try:
        check_bm25_segment(a, entry, n_terms, int(entry["rows"]))
        counts = masked_df(a["offsets"], a["doc_ids"], rows, len(a["doc_len"]))
    except ValueError as e:
        raise IndexFormatError(f"{path}: {e}") from None
    at = np.flatnonzero(counts)
    terms = a["terms"][at] if compact else at
    return terms.astype(np.uint32), counts[at]


def _check_model(leg: str, recorded: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    """ModelError when the weights of the model about to encode differ from the index's."""
    if not recorded or recorded.get("precomputed"):
        return
    a, b = recorded.get("sha256"), now.get("sha256")
    if a is not None and b is not None and a != b:
        raise ModelError(f"the {leg} model {now.get('path')} (weights {_short(b)}) is not the index's "
                         f"{recorded.get('path')} (weights {_short(a)}): add documents with the model the "
                         f"index was built with, or rebuild the index")


def _short(sha: Mapping[str, str]) -> str:
    return ", ".join(f"{k}: {v[:12]}" for k, v in sorted(sha.items()))
