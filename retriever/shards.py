"""Opening an index directory: one generation's manifest, memory-mapped shards, their statistics,
and document fetches (one by one or a whole batch)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from retriever.index.config import BuildConfig
from retriever.index.errors import IndexFormatError
from retriever.index.format import (DOCS_COLUMNS, MAX_STATS_BYTES, manifest_name, read_current, read_manifest,
                                    read_shard_stats, safe_join, verify_checksums)
from retriever.index.safe_open import IndexFiles
from retriever.index.metadata import metadata_dicts

from . import _kernels

#: what :meth:`IndexReader.fetch_batch` can return
FETCH_FIELDS = ("id", "title", "text", "metadata")
#: tombstone files (``deletes``): one array ``rows`` u32, ascending rows of the shard that are deleted
DELETES_ARRAYS = {"rows": np.uint32}


#: fetches of at most this many rows check their ordinals with Python's ``min`` / ``max`` (no
#: numpy reductions, whose fixed cost shows on a single query's ten hits)
SMALL_FETCH = 256

@dataclass
class Shard:
    """One opened shard.

    Attributes:
        dir: shard directory.
        base: global ordinal of its first document (corpus order).
        rows: number of documents (deleted ones included).
        docs: memory-mapped ``docs.arrow`` table (id, title, text, metadata struct, metadata_nulls).
        entry: the shard's manifest entry.
        stats: the shard's ``stats.json`` (see ``docs/FORMAT.md``): ``rows``; ``bm25``:
            ``{n_docs, sum_dl, n_terms, nnz}`` (df is ``np.diff(offsets)`` of ``bm25.arrow``, not
            stored); ``dense``: ``{count, dim, dtype}``; ``sparse``: ``{n_docs, nnz, max_weight,
            vocab_size, scale}``; ``metadata_fields``: field -> type name. A section is present
            when the shard has that leg.
        deleted: ascending u32 rows of this shard deleted as of the reader's generation (tombstones),
            or ``None`` when none are (every row is live).
    """

    dir: Path
    base: int
    rows: int
    docs: pa.Table
    entry: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    deleted: np.ndarray | None = None
    #: per string column, the :meth:`string_view` of its Arrow buffers (or None when the column
    #: has nulls or several chunks), made on first fetch
    string_views: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: ``(metadata column, metadata_nulls column or None when every row's is null, number of
    #: metadata fields)``, made on first fetch
    meta_columns: tuple[Any, Any, int] | None = field(default=None, repr=False, compare=False)

    def string_view(self, name: str) -> tuple[np.ndarray, memoryview] | None:
        """``(offsets int32 or int64 (rows + 1,), UTF-8 data)``
        of string column ``name``, zero-copy over the memory-mapped file; ``None`` where the
        column has nulls or several chunks (the caller then takes the Arrow path)."""
        if name not in self.string_views:
            col = self.docs.column(name)
            view = None
            if col.num_chunks == 1 and col.null_count == 0:
                arr = col.chunk(0)
                off_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
                bufs = arr.buffers()
                if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
                    offsets = np.frombuffer(bufs[1], dtype=off_type, count=len(arr) + 1, offset=arr.offset *
                                            np.dtype(off_type).itemsize)
                    data = memoryview(bufs[2]) if bufs[2] is not None else memoryview(b"")
                    view = (offsets, data)
            self.string_views[name] = view
        return self.string_views[name]

    def strings(self, name: str, rows: np.ndarray) -> list[str | None]:
        """Values of string column ``name`` at ``rows`` (int64 shard rows), one str object per
        distinct row (a repeated row shares it: str is immutable). A column without nulls in one
        chunk (what the writer makes): decoded straight from its memory-mapped buffers by
        :func:`retriever._kernels.decode_strings` (no Arrow ``take``, no copy of the bytes;
        the cost is the UTF-8 decoding); otherwise one ``take`` of the distinct rows and one
        conversion.

        Raises:
            UnicodeDecodeError, ValueError, pyarrow.ArrowException: a corrupted column (the caller
                names the file).
        """
        view = self.string_view(name)
        if view is not None:
            offsets, data = view
            return _kernels.decode_strings(offsets, data, rows)
        uniq, inv = np.unique(rows, return_inverse=True)
        vals = self.docs.column(name).take(pa.array(uniq, pa.int64())).to_pylist()
        return vals if len(uniq) == len(rows) else list(map(vals.__getitem__, inv.tolist()))

    def metadata_rows(self, rows: np.ndarray) -> list[dict[str, Any]]:
        """The metadata dicts of ``rows`` (int64 shard rows), one new dict per position
        (:func:`retriever.index.metadata.metadata_dicts`: one ``take`` per column, JSON decoded
        only for the JSON column type)."""
        if self.meta_columns is None:
            meta = self.docs.column("metadata")
            nulls = self.docs.column("metadata_nulls")
            self.meta_columns = (meta, nulls if nulls.null_count != len(nulls) else None, meta.type.num_fields)
        meta, nulls, n_fields = self.meta_columns
        if n_fields == 0:  # no record has metadata (a field given only as None still has a column)
            return [{} for _ in range(len(rows))]
        idx = pa.array(rows, pa.int64())
        return metadata_dicts(meta.take(idx), None if nulls is None else nulls.take(idx))


def check_docs(path: Path, docs: pa.Table, rows: int) -> None:
    """A shard's ``docs.arrow`` against the format: ``rows`` rows, the columns of
    :data:`DOCS_COLUMNS` with their types (``id`` a string column of valid UTF-8 without nulls,
    ``title`` / ``text`` strings, ``metadata`` a struct, ``metadata_nulls`` a list of strings).

    Raises:
        IndexFormatError: names the file, the column and what is wrong.
    """
    if docs.num_rows != rows or tuple(docs.column_names[:5]) != DOCS_COLUMNS:
        raise IndexFormatError(f"{path}: has {docs.num_rows} rows / columns {docs.column_names}, manifest says "
                               f"{rows} rows / {list(DOCS_COLUMNS)}")
    sch = docs.schema
    for name in ("id", "title", "text"):
        t = sch.field(name).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise IndexFormatError(f"{path}: column {name!r} is {t}, expected a string column")
    if not pa.types.is_struct(sch.field("metadata").type):
        raise IndexFormatError(f"{path}: column 'metadata' is {sch.field('metadata').type}, expected a struct")
    t = sch.field("metadata_nulls").type
    if not ((pa.types.is_list(t) or pa.types.is_large_list(t))
            and (pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type))):
        raise IndexFormatError(f"{path}: column 'metadata_nulls' is {t}, expected a list of strings")
    ids = docs.column("id")
    if ids.null_count:
        raise IndexFormatError(f"{path}: column 'id' has {ids.null_count} null ids")
    try:
        for chunk in ids.chunks:
            chunk.validate(full=True)  # UTF-8 of every id: O(bytes of the ids)
    except (pa.ArrowException, ValueError) as e:
        raise IndexFormatError(f"{path}: column 'id' is corrupted ({e})") from None


#: build-config sections that belong to one leg (the analyzer is the BM25 leg's)
_CONFIG_LEG = {"bm25": "bm25", "analyzer": "bm25", "dense": "dense", "sparse": "sparse"}


def _file_identity(path: Path) -> tuple[int, int, int, int] | None:
    """(device, inode, size, mtime in ns) of ``path``, None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class IndexReader:
    """One generation of a validated, memory-mapped index directory (a snapshot).

    The reader holds the manifest of one generation (default: the one ``CURRENT`` points to when
    it is opened) and memory maps of the files it lists. Files are never modified once listed, so
    a generation committed later (a new manifest, ``CURRENT`` switched) does not change what an
    open reader sees; open a new reader (or :meth:`reopen`) to see it.

    Args:
        path: index directory.
        verify: also recompute every file's SHA-256 (slow; sizes are always checked).
        generation: open this generation instead of the current one.

    Raises:
        IndexFormatError: missing/corrupt/unknown index, unknown generation, or an index of format
            version 1 (the message names ``retriever index upgrade DIR``).
    """

    def __init__(self, path: str | Path, *, verify: bool = False, generation: int | None = None,
                 previous: "IndexReader | None" = None) -> None:
        self.path = Path(path)
        # the manifest file's identity, taken before it is read: an index rebuilt in place
        # (``overwrite``) restarts at generation 1 with other files (see :meth:`replaced`); a
        # commit in between only makes a later refresh() reopen once more
        try:
            gen = generation if generation is not None else read_current(self.path)
            self._manifest_identity = _file_identity(self.path / manifest_name(gen))
        except (IndexFormatError, ValueError):
            self._manifest_identity = None  # read_manifest says what is wrong
        self.manifest = read_manifest(self.path, generation)
        self.generation: int = self.manifest["generation"]
        mname = self.path / manifest_name(self.generation)
        #: the file of this generation's manifest (named in errors)
        self.manifest_path = mname
        if verify:
            verify_checksums(self.path, self.manifest)
        try:
            self.config = BuildConfig.from_dict(self.manifest["build_config"])
        except Exception as e:  # noqa: BLE001 - any config problem is a format problem here
            raise IndexFormatError(f"{mname}: invalid build_config ({e})") from None
        self.shards: list[Shard] = []
        base = 0
        #: opens every file this reader reads: confined to the index, no symlinks, regular files
        #: listed in the manifest with their listed sizes (:mod:`retriever.index.safe_open`)
        self.files = IndexFiles(self.path, self.manifest["files"], str(mname))
        # a segment the previous reader (of an earlier generation) opened with the same files:
        # its checked document table and statistics are reused (segments are immutable)
        known = {} if previous is None or previous.path != self.path else {s.entry["dir"]: s for s in previous.shards}
        for entry in self.manifest["shards"]:
            sdir = safe_join(self.path, entry["dir"], str(mname))
            docs_rel = f"{entry['dir']}/docs.arrow"
            old = known.get(entry["dir"])
            if old is not None and not verify and self._same_files(previous, old.entry, entry, docs_rel):
                docs, stats = old.docs, old.stats
            else:
                docs = self.files.table(docs_rel)
                check_docs(sdir / "docs.arrow", docs, entry["rows"])
                stats = read_shard_stats(self.files.path(entry["stats"]), entry["rows"],
                                         self.files.read_bytes(entry["stats"], max_bytes=MAX_STATS_BYTES))
            deleted = None
            if entry.get("deletes") is not None:
                dpath = self.files.path(entry["deletes"])
                deleted = self.files.arrays(entry["deletes"], DELETES_ARRAYS)["rows"]
                if len(deleted) and (int(deleted[-1]) >= entry["rows"] or (np.diff(deleted.astype(np.int64)) <= 0).any()):
                    raise IndexFormatError(f"{dpath}: rows are not ascending below {entry['rows']}")
            self.shards.append(Shard(sdir, base, entry["rows"], docs, entry, stats, deleted))
            base += entry["rows"]
        self.n_docs = base
        if self.n_docs != self.manifest["stats"].get("n_docs"):
            raise IndexFormatError(f"{mname}: shard rows add up to {self.n_docs}, "
                                   f"stats.n_docs is {self.manifest['stats'].get('n_docs')}")
        self.bases = np.array([s.base for s in self.shards], dtype=np.int64)
        self._ids: np.ndarray | None = None

    def replaced(self) -> bool:
        """Whether this generation's manifest file is no longer the one this reader opened: the
        index was rebuilt in place (``build_index(..., overwrite=True)`` swaps in a new index,
        whose generations start again at 1), or that manifest is gone."""
        return _file_identity(self.manifest_path) != self._manifest_identity

    def reopen(self) -> "IndexReader":
        """A new reader of the generation that is current now (this one is unchanged); the
        segments both generations list with the same files are not opened and checked again."""
        return IndexReader(self.path, previous=self)

    def _same_files(self, previous: "IndexReader", old: dict[str, Any], new: dict[str, Any], docs_rel: str) -> bool:
        """Whether a shard entry of ``previous`` and one of this generation name the same
        document table and statistics (same rows, files and SHA-256)."""
        if old.get("rows") != new.get("rows") or old.get("stats") != new.get("stats"):
            return False
        mine, theirs = self.manifest["files"], previous.manifest["files"]
        return all(mine.get(f) is not None and mine.get(f) == theirs.get(f) for f in (docs_rel, new.get("stats")))

    @property
    def fusion(self) -> dict[str, Any] | None:
        """The generation's stored fusion setting (``manifest["fusion"]``), or None."""
        return self.manifest.get("fusion")

    @property
    def metadata_schema(self) -> dict[str, str | None]:
        """Metadata field -> column type name (``"int64"``, ``"string"``, ``"json"``, ...; None
        when every value is null), over all shards."""
        return dict(self.manifest["metadata_schema"])

    @property
    def legs(self) -> tuple[str, ...]:
        """Names of the legs the manifest lists."""
        return self.config.legs

    def doc_ids(self) -> np.ndarray:
        """All document ids in ordinal order (object array; built once, then cached)."""
        if self._ids is None:
            parts = [s.docs.column("id").to_numpy(zero_copy_only=False) for s in self.shards]
            self._ids = np.concatenate(parts) if parts else np.zeros(0, dtype=object)
        return self._ids

    def locate(self, ordinals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global ordinals → (shard index, row within shard)."""
        sh = np.searchsorted(self.bases, ordinals, side="right") - 1
        return sh, ordinals - self.bases[sh]

    def _check_ordinals(self, ords: np.ndarray) -> None:
        if ords.size and (ords.min() < 0 or ords.max() >= self.n_docs):
            bad = ords[(ords < 0) | (ords >= self.n_docs)][0]
            raise IndexError(f"document ordinal {int(bad)} outside [0, {self.n_docs})")

    def fetch(self, ordinals: list[int]) -> list[dict[str, Any]]:
        """Stored fields (id, title, text, metadata dict) of documents by ordinal.

        Returns:
            one dict per ordinal: ``id``, ``title``, ``text`` (str) and ``metadata`` (a new dict:
            the record's metadata fields as :mod:`retriever.index.metadata` describes).

        Raises:
            IndexError: an ordinal outside ``[0, n_docs)``.
            IndexFormatError: a corrupted row (names the file).
        """
        b = self.fetch_batch(np.asarray(ordinals, dtype=np.int64))
        return [{"id": i, "title": t, "text": x, "metadata": m}
                for i, t, x, m in zip(b["id"], b["title"], b["text"], b["metadata"])]

    def fetch_batch(self, ordinals: np.ndarray, fields: Sequence[str] = FETCH_FIELDS) -> dict[str, list[Any]]:
        """Stored fields of many documents at once: per shard, each distinct row's strings made
        once (:meth:`Shard.strings`: slices of the memory-mapped buffers for a few rows, one Arrow
        ``take`` and conversion per column for many), the metadata by one ``take`` and one
        conversion per column (no JSON decoding except for JSON-typed metadata columns, no
        per-row Arrow scalars).

        Args:
            ordinals: global document ordinals, any shape (flattened, C order); repeats allowed.
            fields: the fields to fetch, a subset of ``("id", "title", "text", "metadata")``
                (texts are most of the cost: about 2/3 on SciFact).

        Returns:
            ``{"id": [str], "title": [str], "text": [str], "metadata": [dict]}`` (the keys of
            ``fields``), each list aligned with the flattened ordinals; every metadata dict is a
            new object (a repeated ordinal shares its strings, not its dict).

        Raises:
            IndexError: an ordinal outside ``[0, n_docs)``.
            IndexFormatError: a corrupted row (names the file).
        """
        keys = tuple(fields)
        return dict(zip(keys, self.fetch_columns(ordinals, keys)))

    def fetch_columns(self, ordinals: np.ndarray, fields: Sequence[str] = FETCH_FIELDS) -> list[list[Any]]:
        """:meth:`fetch_batch` as a list of the ``fields`` lists, in the order of ``fields``.

        Raises:
            IndexError, IndexFormatError: as :meth:`fetch_batch`.
        """
        ords = np.asarray(ordinals).reshape(-1)
        if ords.dtype.kind not in "iu":
            raise TypeError(f"ordinals must be integers, got dtype {ords.dtype}")
        ords = ords.astype(np.int64, copy=False)
        n = len(ords)
        if n > SMALL_FETCH:
            self._check_ordinals(ords)
        elif n and (min(rl := ords.tolist()) < 0 or max(rl) >= self.n_docs):  # no numpy reductions
            self._check_ordinals(ords)
        keys = tuple(fields)
        bad = [k for k in keys if k not in FETCH_FIELDS]
        if bad:
            raise ValueError(f"unknown fetch field(s) {bad}; valid: {list(FETCH_FIELDS)}")
        if n == 0:
            return [[] for _ in keys]
        if len(self.shards) == 1:
            return self._fetch_rows(self.shards[0], ords, keys)
        sh, rows = self.locate(ords)
        order = np.argsort(sh, kind="stable")
        cuts = np.searchsorted(sh[order], np.arange(len(self.shards) + 1))
        outs = [np.empty(n, dtype=object) for _ in keys]
        for s in range(len(self.shards)):
            if cuts[s + 1] == cuts[s]:
                continue
            pos = order[cuts[s]:cuts[s + 1]]
            for out, vals in zip(outs, self._fetch_rows(self.shards[s], rows[pos], keys)):
                tmp = np.empty(len(vals), dtype=object)
                tmp[:] = vals  # element-wise (a list of lists or dicts must not become a 2-d array)
                out[pos] = tmp
        return [out.tolist() for out in outs]

    @staticmethod
    def _fetch_rows(shard: Shard, rows: np.ndarray, fields: Sequence[str]) -> list[list[Any]]:
        """The ``fields`` lists of ``rows`` of one shard. Each distinct row's strings are made
        once (a row asked for several times shares them: :meth:`Shard.strings`); the metadata
        dicts are made once per position (new objects: :meth:`Shard.metadata_rows`)."""
        out: list[list[Any]] = []
        try:
            for f in fields:
                out.append(shard.metadata_rows(rows) if f == "metadata" else shard.strings(f, rows))
        except (UnicodeDecodeError, ValueError, pa.ArrowException) as e:
            raise IndexFormatError(f"{shard.dir / 'docs.arrow'}: rows are corrupted ({e}); "
                                   f"run 'retriever index verify'") from None
        return out

    def shard_arrays(self, shard: Shard, name: str, expected: dict[str, Any]) -> dict[str, np.ndarray]:
        """Arrays of one Arrow file of ``shard`` (zero-copy read-only views, see :func:`retriever.index.format.read_arrays`), checked against ``expected`` (column name -> dtype); raises IndexFormatError naming the file and column."""
        return self.files.arrays(f"{shard.entry['dir']}/{name}", expected)

    def info(self) -> dict[str, Any]:
        """Summary: path, format version, generation, legs, document count, shards (directory,
        rows, deleted rows), statistics, build information, metadata schema, fusion, build
        config, disk bytes.

        ``build_config`` lists only the settings of the legs the index holds (the manifest keeps
        the whole config): a BM25-only index shows no ``dense`` / ``sparse`` section."""
        m = self.manifest
        cfg = {key: val for key, val in m["build_config"].items()
               if key not in _CONFIG_LEG or _CONFIG_LEG[key] in self.legs}
        return {"path": str(self.path), "format_version": m["format_version"], "generation": self.generation,
                "created": m.get("created"), "legs": list(self.legs), "n_docs": self.n_docs,
                "n_shards": len(self.shards),
                "n_deleted": int(sum(0 if s.deleted is None else len(s.deleted) for s in self.shards)),
                "n_live": self.n_docs - int(sum(0 if s.deleted is None else len(s.deleted) for s in self.shards)),
                "shards": [{"dir": s.entry["dir"], "rows": s.rows,
                            "deleted": 0 if s.deleted is None else int(len(s.deleted))} for s in self.shards],
                "bytes_on_disk": int(sum(f["bytes"] for f in m["files"].values())),
                "stats": m["stats"], "build": m["build"], "metadata_schema": m["metadata_schema"],
                "fusion": m.get("fusion"), "models": m.get("models", {}), "build_config": cfg}
