"""``retriever index upgrade DIR``: convert an index of format version 1 to version 2, atomically.

Format 1 had one ``manifest.json`` (no generations), metadata as one JSON string per document and
no per-shard statistics files. The upgrade

1. validates the format-1 manifest and recomputes every file's SHA-256 (a damaged index is not
   converted);
2. builds the version-2 index in a temporary sibling directory: postings, vectors, FAISS and
   sparse files are hard-linked (copied where the file system cannot link: files are never
   modified, so sharing them is safe), each shard's ``docs.arrow`` is rewritten with typed
   metadata columns (types inferred over the whole index; a field whose values have two types
   becomes a JSON column, listed in the result, since the records cannot be fixed any more), and
   each shard's ``stats.json`` is computed from its files;
3. writes the generation-1 manifest and ``CURRENT`` and swaps the directory into place
   atomically (the format-1 index stays intact until that rename, and is deleted after it).

Search results are unchanged: scoring files are the same bytes, and metadata reads back as the
format-1 JSON round trip gave it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from .errors import IndexFormatError
from .faults import FaultHook, no_faults
from .format import (FORMAT_NAME, MANIFEST_V1, MAX_MANIFEST_BYTES, SHARD_STATS, is_index, manifest_digest,
                     read_arrays, read_current, read_table, safe_join, sha256_file)
from .metadata import MetadataColumns, normalize_metadata, type_name
from .writer import IndexWriter

#: keys of a format-1 ``stats`` that are build information, not statistics (format 2: ``build``)
BUILD_KEYS = ("build_seconds", "model_load_seconds", "encode_seconds", "dense_truncated_docs",
              "sparse_truncated_docs", "sparse_precomputed", "sparse_doc_max_length")
_BM25 = {"offsets": np.uint64, "doc_ids": np.uint32, "tfs": np.uint32, "doc_len": np.uint32}
_SPARSE_FWD = {"indptr": np.uint64, "terms": np.uint32, "weights": np.float32}


class _Rec(NamedTuple):
    id: str
    path: str | None
    line: int
    metadata: dict[str, Any]


def read_manifest_v1(root: Path) -> dict[str, Any]:
    """Read and check a format-1 ``manifest.json`` (format name, version, self-checksum, file sizes).

    Raises:
        IndexFormatError: not a format-1 index, or a damaged one (names the file).
    """
    mpath = root / MANIFEST_V1
    try:
        if mpath.stat().st_size > MAX_MANIFEST_BYTES:
            raise IndexFormatError(f"{mpath}: manifest is implausibly large")
        m = json.loads(mpath.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise IndexFormatError(f"{root}: not a format-1 index (no {MANIFEST_V1})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IndexFormatError(f"{mpath}: manifest is not valid JSON ({e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME or m.get("format_version") != 1:
        raise IndexFormatError(f"{mpath}: not a {FORMAT_NAME} manifest of format version 1")
    if "manifest_sha256" in m and m["manifest_sha256"] != manifest_digest(m):
        raise IndexFormatError(f"{mpath}: manifest checksum mismatch (manifest.json corrupted or edited)")
    for key, typ in (("files", dict), ("shards", list), ("build_config", dict), ("stats", dict)):
        if not isinstance(m.get(key), typ):
            raise IndexFormatError(f"{mpath}: field {key!r} missing or not a {typ.__name__}")
    for rel, info in m["files"].items():
        p = safe_join(root, rel, str(mpath))
        if not isinstance(info, dict) or not isinstance(info.get("sha256"), str):
            raise IndexFormatError(f"{mpath}: bad entry for file {rel!r}")
        if p.is_symlink() or not p.is_file():
            raise IndexFormatError(f"{p}: index file is missing (or a symlink)")
    for i, s in enumerate(m["shards"]):
        if not isinstance(s, dict) or not isinstance(s.get("dir"), str) or not isinstance(s.get("rows"), int):
            raise IndexFormatError(f"{mpath}: bad shard entry #{i}")
        if f"{s['dir']}/docs.arrow" not in m["files"]:
            raise IndexFormatError(f"{mpath}: shard #{i} has no docs.arrow in the file list")
    return m


def _shard_records(path: Path, position: int) -> tuple[pa.Table, list[_Rec]]:
    t = read_table(path, full=True)
    if t.column_names[:4] != ["id", "title", "text", "metadata"]:
        raise IndexFormatError(f"{path}: columns {t.column_names}, expected id, title, text, metadata")
    recs = []
    for i, (doc_id, meta) in enumerate(zip(t.column("id").to_pylist(), t.column("metadata").to_pylist())):
        try:
            md = json.loads(meta) if meta else {}
            md = normalize_metadata(md) if md else {}
        except (ValueError, TypeError) as e:
            raise IndexFormatError(f"{path}: row {i} (document {doc_id!r}) has bad metadata ({e})") from None
        if not isinstance(md, dict):
            raise IndexFormatError(f"{path}: row {i} (document {doc_id!r}): metadata is not a JSON object")
        recs.append(_Rec(doc_id, None, position + i + 1, md))
    return t, recs


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _shard_stats(root: Path, entry: dict[str, Any], files: dict[str, Any], v1_stats: dict[str, Any]) -> dict[str, Any]:
    d, n = entry["dir"], int(entry["rows"])
    st: dict[str, Any] = {"rows": n}
    if f"{d}/bm25.arrow" in files:
        a = read_arrays(root / d / "bm25.arrow", _BM25)
        st["bm25"] = {"n_docs": n, "sum_dl": int(a["doc_len"].sum(dtype=np.int64)),
                      "n_terms": int(len(a["offsets"]) - 1), "nnz": int(len(a["doc_ids"]))}
    if f"{d}/dense.arrow" in files:
        col = read_table(root / d / "dense.arrow").column("vector")
        typ = col.type
        st["dense"] = {"count": int(len(col)), "dim": int(typ.list_size),
                       "dtype": typ.value_type.to_pandas_dtype().__name__}
    if f"{d}/sparse.arrow" in files:
        a = read_arrays(root / d / "sparse.arrow", _SPARSE_FWD)
        st["sparse"] = {"n_docs": int(len(a["indptr"]) - 1), "nnz": int(len(a["terms"])),
                        "max_weight": float(a["weights"].max()) if len(a["weights"]) else 0.0,
                        "vocab_size": int(v1_stats.get("sparse_vocab_size", 0)),
                        "scale": float(v1_stats.get("sparse_scale", 1.0))}
    return st


def upgrade_index(path: str | Path, *, faults: FaultHook = no_faults) -> dict[str, Any]:
    """Convert the format-1 index at ``path`` to format 2 in place (atomically).

    Args:
        path: the index directory.
        faults: fault-injection hook (the writer's points: ``shard_docs`` ... ``swap``; tests).

    Returns:
        ``{"path", "from_version": 1, "to_version": 2, "n_docs", "n_shards", "metadata_schema",
        "json_fallbacks"}`` (fields stored as JSON because their values had two types).

    Raises:
        IndexFormatError: not a format-1 index (an index already of format 2 says so), a damaged
            one (a file whose SHA-256 does not match names it), or a docs table that cannot be read.
    """
    root = Path(path)
    if (root / "CURRENT").is_file():
        read_current(root)
        raise IndexFormatError(f"{root}: already an index of format version 2; nothing to upgrade")
    if not is_index(root):
        raise IndexFormatError(f"{root}: not an index (no manifest.json or CURRENT)")
    m = read_manifest_v1(root)
    for rel, info in m["files"].items():  # never convert a damaged index
        p = safe_join(root, rel)
        if sha256_file(p) != info["sha256"]:
            raise IndexFormatError(f"{p}: SHA-256 mismatch (file corrupted or modified); not upgraded")
    # pass 1: the column types over the whole index (mixed fields fall back to JSON)
    infer = MetadataColumns(on_conflict="json")
    pos = 0
    for s in m["shards"]:
        _, recs = _shard_records(root / s["dir"] / "docs.arrow", pos)
        infer.columns(recs)
        pos += len(recs)
    cols = MetadataColumns(on_conflict="json", schema=infer.schema)
    v1_stats = dict(m["stats"])
    with IndexWriter(root, overwrite=True, faults=faults) as w:
        pos = 0
        for s in m["shards"]:
            rel = f"{s['dir']}/docs.arrow"
            t, recs = _shard_records(root / rel, pos)
            pos += len(recs)
            struct, nulls = cols.columns(recs)
            docs = pa.table({"id": t.column("id"), "title": t.column("title"), "text": t.column("text"),
                             "metadata": struct, "metadata_nulls": nulls})
            w.write_table(rel, docs)
        for rel, info in m["files"].items():
            if rel.endswith("/docs.arrow") or rel.endswith(f"/{SHARD_STATS}"):
                continue
            _link(root / rel, w.tmp / rel)  # same bytes: the recorded SHA-256 holds
            w.files[rel] = {"bytes": (w.tmp / rel).stat().st_size, "sha256": info["sha256"]}
        for s in m["shards"]:
            entry = {k: v for k, v in s.items() if k not in ("stats", "deletes")}
            w.shards.append(entry)
            st = _shard_stats(root, entry, m["files"], v1_stats)
            docs_schema = read_table(w.tmp / entry["dir"] / "docs.arrow").schema.field("metadata").type
            st["metadata_fields"] = {f.name: type_name(f.type) for f in docs_schema}
            w.shard_stats[entry["dir"]] = st
        stats = {k: v for k, v in v1_stats.items() if k not in BUILD_KEYS}
        build = {k: v for k, v in v1_stats.items() if k in BUILD_KEYS}
        extra = {k: v for k, v in m.items() if k not in ("format", "format_version", "created", "build_config",
                                                         "stats", "shards", "files", "manifest_sha256")}
        extra["upgraded_from"] = {"format_version": 1, "created": m.get("created")}
        w.commit(build_config=m["build_config"], stats=stats, build=build, extra=extra)
    return {"path": str(root), "from_version": 1, "to_version": 2, "n_docs": pos, "n_shards": len(m["shards"]),
            "metadata_schema": cols.schema, "json_fallbacks": list(infer.json_fallbacks)}
