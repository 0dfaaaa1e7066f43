"""Opening an index directory: manifest validation, memory-mapped shards, corpus-wide statistics."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from retriever.index.config import BuildConfig
from retriever.index.errors import IndexFormatError
from retriever.index.format import read_arrays, read_manifest, read_table, safe_join, verify_checksums


@dataclass
class Shard:
    """One opened shard.

    Attributes:
        dir: shard directory.
        base: global ordinal of its first document (corpus order).
        rows: number of documents.
        docs: memory-mapped ``docs.arrow`` table (id, title, text, metadata).
    """

    dir: Path
    base: int
    rows: int
    docs: pa.Table
    entry: dict[str, Any] = field(default_factory=dict)


#: build-config sections that belong to one leg (the analyzer is the BM25 leg's)
_CONFIG_LEG = {"bm25": "bm25", "analyzer": "bm25", "dense": "dense", "sparse": "sparse"}


class IndexReader:
    """A validated, memory-mapped index directory.

    Args:
        path: index directory.
        verify: also recompute every file's SHA-256 (slow; sizes are always checked).

    Raises:
        IndexFormatError: missing/corrupt/unknown index (names the file).
    """

    def __init__(self, path: str | Path, *, verify: bool = False) -> None:
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        if verify:
            verify_checksums(self.path, self.manifest)
        try:
            self.config = BuildConfig.from_dict(self.manifest["build_config"])
        except Exception as e:  # noqa: BLE001 - any config problem is a format problem here
            raise IndexFormatError(f"{self.path / 'manifest.json'}: invalid build_config ({e})") from None
        self.shards: list[Shard] = []
        base = 0
        for entry in self.manifest["shards"]:
            sdir = safe_join(self.path, entry["dir"])
            docs = read_table(sdir / "docs.arrow")
            if docs.num_rows != entry["rows"] or docs.column_names[:4] != ["id", "title", "text", "metadata"]:
                raise IndexFormatError(f"{sdir / 'docs.arrow'}: has {docs.num_rows} rows / columns "
                                       f"{docs.column_names}, manifest says {entry['rows']} rows")
            self.shards.append(Shard(sdir, base, entry["rows"], docs, entry))
            base += entry["rows"]
        self.n_docs = base
        if self.n_docs != self.manifest["stats"].get("n_docs"):
            raise IndexFormatError(f"{self.path / 'manifest.json'}: shard rows add up to {self.n_docs}, "
                                   f"stats.n_docs is {self.manifest['stats'].get('n_docs')}")
        self.bases = np.array([s.base for s in self.shards], dtype=np.int64)
        self._ids: np.ndarray | None = None

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

    def fetch(self, ordinals: list[int]) -> list[dict[str, Any]]:
        """Stored fields (id, title, text, metadata dict) of documents by ordinal."""
        out = []
        if not ordinals:
            return out
        sh, rows = self.locate(np.asarray(ordinals, dtype=np.int64))
        for s, r in zip(sh.tolist(), rows.tolist()):
            t = self.shards[s].docs
            try:
                meta = t.column("metadata")[r].as_py()
                out.append({"id": t.column("id")[r].as_py(), "title": t.column("title")[r].as_py(),
                            "text": t.column("text")[r].as_py(),
                            "metadata": json.loads(meta) if meta else {}})
            except (UnicodeDecodeError, ValueError, pa.ArrowException) as e:
                raise IndexFormatError(f"{self.shards[s].dir / 'docs.arrow'}: row {r} is corrupted ({e}); "
                                       f"run 'retriever index verify'") from None
        return out

    def fetch_batch(self, ordinals: np.ndarray) -> dict[str, list[Any]]:
        """Stored fields of many documents at once (one Arrow ``take`` per shard).

        Args:
            ordinals: int64 global ordinals (flattened), each in ``[0, n_docs)``.

        Returns:
            ``{"id": [str], "title": [str], "text": [str], "metadata": [dict]}`` aligned with
            ``ordinals``.

        Raises:
            IndexFormatError: a corrupted row (names the file).
        """
        ords = np.asarray(ordinals, dtype=np.int64).reshape(-1)
        out: dict[str, list[Any]] = {"id": [None] * len(ords), "title": [None] * len(ords),
                                     "text": [None] * len(ords), "metadata": [None] * len(ords)}
        if not len(ords):
            return out
        sh, rows = self.locate(ords)
        for s in np.unique(sh).tolist():
            pos = np.flatnonzero(sh == s)
            t = self.shards[s].docs.take(rows[pos])
            try:
                cols = {c: t.column(c).to_pylist() for c in ("id", "title", "text")}
                cols["metadata"] = [json.loads(m) if m else {} for m in t.column("metadata").to_pylist()]
            except (UnicodeDecodeError, ValueError, pa.ArrowException) as e:
                raise IndexFormatError(f"{self.shards[s].dir / 'docs.arrow'}: rows are corrupted ({e}); "
                                       f"run 'retriever index verify'") from None
            for key, vals in cols.items():
                dst = out[key]
                for p, v in zip(pos.tolist(), vals):
                    dst[p] = v
        return out

    def shard_arrays(self, shard: Shard, name: str, expected: dict[str, Any]) -> dict[str, np.ndarray]:
        """Arrays of one Arrow file of ``shard`` (zero-copy read-only views, see :func:`retriever.index.format.read_arrays`), checked against ``expected`` (column name -> dtype); raises IndexFormatError naming the file and column."""
        return read_arrays(shard.dir / name, expected)

    def info(self) -> dict[str, Any]:
        """Summary: path, legs, document count, shards, stats, build config, disk bytes.

        ``build_config`` lists only the settings of the legs the index holds (the manifest keeps
        the whole config): a BM25-only index shows no ``dense`` / ``sparse`` section."""
        m = self.manifest
        cfg = {key: val for key, val in m["build_config"].items()
               if key not in _CONFIG_LEG or _CONFIG_LEG[key] in self.legs}
        return {"path": str(self.path), "format_version": m["format_version"], "created": m.get("created"),
                "legs": list(self.legs), "n_docs": self.n_docs, "n_shards": len(self.shards),
                "bytes_on_disk": int(sum(f["bytes"] for f in m["files"].values())),
                "stats": m["stats"], "models": m.get("models", {}), "build_config": cfg}
