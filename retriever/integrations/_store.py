"""Framework-free core of the vector-store adapters: one living index that is created on the first
write, changed through :class:`retriever.IndexUpdater` (every write one commit, then a refresh of
the store's reader), searched through :class:`retriever.Retriever`, and the mapping of each
mode's scores onto relevance in [0, 1]."""

from __future__ import annotations

import dataclasses
import math
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retriever.api import Retriever
from retriever.index.config import BuildConfig, DenseConfig
from retriever.index.errors import ConfigError, CorpusError, IndexExistsError, QueryError
from retriever.index.format import CURRENT
from retriever.index.pipeline import build_index
from retriever.index.updates import DeleteReport, IndexUpdater
from retriever.results import BatchResult, Hit

from ._common import SearchOptions

#: record keys a document's metadata may not use (they are the record's own fields)
RESERVED_KEYS = ("_id", "text")


def new_id() -> str:
    """A generated document id (a random UUID4, hex)."""
    return uuid.uuid4().hex


def make_record(doc_id: str, text: str, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """The corpus record of one framework document: ``_id``, ``text``, a ``"title"`` metadata
    value as the record's title (indexed by BM25 with the text), the other metadata as fields.

    Raises:
        CorpusError: metadata that is not a dict or has a key that is not a string, a metadata key
            ``_id`` or ``text``, or a ``title`` that is not a string (names the document and the key).
    """
    if not isinstance(doc_id, str):
        raise CorpusError(f"document ids are strings, got {doc_id!r} ({type(doc_id).__name__})", field="_id")
    rec: dict[str, Any] = {"_id": doc_id, "text": text}
    if metadata is not None and not isinstance(metadata, Mapping):
        raise CorpusError(f"document {doc_id!r}: metadata must be a dict, got {type(metadata).__name__}",
                          field="metadata")
    for key, value in (metadata or {}).items():
        if not isinstance(key, str):
            raise CorpusError(f"document {doc_id!r}: metadata keys are strings, got {key!r} ({type(key).__name__})",
                              field="metadata")
        if key in RESERVED_KEYS:
            raise CorpusError(f"document {doc_id!r}: metadata key {key!r} is reserved (the record's own field)",
                              field=key)
        if key == "title" and not isinstance(value, str):
            raise CorpusError(f"document {doc_id!r}: metadata 'title' must be a string (it is the indexed title), "
                              f"got {type(value).__name__}", field="title")
        rec[key] = value
    return rec


def stored_metadata(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A stored document's framework metadata: its metadata fields plus ``"title"`` when not empty
    (the inverse of :func:`make_record`)."""
    meta = dict(doc["metadata"])
    if doc.get("title"):
        meta["title"] = doc["title"]
    return meta


def unit_rows(vectors: Any, n: int, *, normalize: bool, what: str = "embeddings") -> np.ndarray:
    """``vectors`` as a float32 (n, dim) array, each row L2-normalised when ``normalize``.

    Raises:
        ConfigError: wrong row count, not 2-D, NaN / inf, or a zero row to normalise (names it).
    """
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[0] != n:
        raise ConfigError(f"{what}: expected {n} vectors of one dimension, got an array of shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ConfigError(f"{what}: vector {int(np.flatnonzero(~np.isfinite(arr).all(axis=1))[0])} holds NaN or inf")
    if normalize:
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
        if (norms == 0).any():
            raise ConfigError(f"{what}: vector {int(np.flatnonzero(norms[:, 0] == 0)[0])} is all zeros "
                              f"(cannot be normalised)")
        arr = arr / norms
    return np.ascontiguousarray(arr, dtype=np.float32)


def relevance(score: float, mode: str, result: BatchResult) -> float:
    """A hit's score mapped onto [0, 1] (higher is more relevant; monotone in the score, so the
    order is never inverted). The mapping per mode (``docs/INTEGRATIONS.md``):

    - ``dense``: (1 + cosine) / 2 (the stored and query vectors are unit vectors).
    - ``bm25``, ``sparse``: s / (1 + s) (the scores are >= 0 and unbounded).
    - ``hybrid`` with RRF: the fused score divided by its maximum, sum over the legs that ran of
      max(w, 0) / (k + 1) (1 = first in every leg).
    - ``hybrid`` with linear min-max: the fused score divided by the sum of max(w, 0).
    - ``hybrid`` with linear z-score or no normalisation (unbounded): the logistic 1 / (1 + e^-s).

    Values are clipped to [0, 1] (float rounding, negative weights).
    """
    if mode == "dense":
        rel = (1.0 + score) / 2.0
    elif mode in ("bm25", "sparse"):
        rel = score / (1.0 + score) if score > 0 else 0.0
    else:
        fz = dict(result.fusion or {})
        weights = fz.get("weights") or {}
        positive = sum(max(float(weights.get(leg, 1.0)), 0.0) for leg in result.legs)
        if fz.get("method") == "rrf":
            top = positive / (float(fz.get("k", 60.0)) + 1.0)
            rel = score / top if top > 0 else 0.0
        elif fz.get("method") == "linear" and fz.get("norm") == "minmax":
            rel = score / positive if positive > 0 else 0.0
        else:
            rel = 1.0 / (1.0 + math.exp(-score)) if score > -700 else 0.0
    return min(max(rel, 0.0), 1.0)


class IndexStore:
    """A living index seen as a store of documents (the vector-store adapters' shared core).

    The index is created at ``path`` by the first write (an index cannot be empty); until then
    every search returns nothing. Each write (:meth:`upsert`, :meth:`delete`) is one
    :class:`~retriever.IndexUpdater` commit followed by a refresh of the store's
    :class:`~retriever.Retriever`; the updater (the index's one writer, holding its ``LOCK``) is
    opened on the first write to an existing index and kept until :meth:`close`.

    Args:
        path: the index directory (an existing index, or where to create one).
        external_vectors: True when the dense leg's vectors come from the caller (a framework's
            embedding model; the index records its dense model as ``"precomputed"``), False to
            encode with the index's own models.
        normalize: L2-normalise external vectors (so the dense leg's inner product is cosine).
        config: build configuration of a new index (default: ``legs=("bm25", "dense")``; with
            external vectors stored as float32).
        open_options: keyword arguments of :meth:`retriever.Retriever.open`.
        updater_options: keyword arguments of :meth:`retriever.IndexUpdater.open`.

    Raises:
        ConfigError: an existing index whose dense leg does not match ``external_vectors`` (names
            the index and its dense model).
    """

    def __init__(self, path: str | Path, *, external_vectors: bool, normalize: bool = True,
                 config: BuildConfig | None = None, open_options: Mapping[str, Any] | None = None,
                 updater_options: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.external_vectors = bool(external_vectors)
        self.normalize = bool(normalize)
        if config is None:
            config = BuildConfig(legs=("bm25", "dense"))
            if self.external_vectors:
                config = dataclasses.replace(config, dense=DenseConfig(dtype="float32", normalize=self.normalize))
        if not isinstance(config, BuildConfig):
            raise ConfigError(f"config must be a retriever.BuildConfig, got {type(config).__name__}")
        self.config = config
        self.open_options = dict(open_options or {})
        self.updater_options = dict(updater_options or {})
        self._lock = threading.RLock()
        self._updater: IndexUpdater | None = None
        self.retriever: Retriever | None = None
        self._closed = False
        self._open_existing()

    def _open_existing(self) -> None:
        """Open the index when it exists on disk and this store has not opened it yet (another
        store may have created it since this one was made)."""
        if self.retriever is None and ((self.path / CURRENT).is_file() or (self.path / "manifest.json").is_file()):
            self.retriever = Retriever.open(self.path, **self.open_options)
            self._check_dense()

    def _ready(self) -> None:
        """Refuse a closed store; open the index if another store created it since."""
        if self._closed:
            raise ConfigError(f"this store of {self.path} is closed")
        self._open_existing()

    # ------------------------------------------------------------------ state
    @property
    def legs(self) -> tuple[str, ...]:
        """The index's legs (the configured ones before it exists)."""
        return self.retriever.legs if self.retriever is not None else tuple(self.config.legs)

    @property
    def has_dense(self) -> bool:
        """True when the index has (or will have) a dense leg."""
        return "dense" in self.legs

    def _check_dense(self) -> None:
        assert self.retriever is not None
        if not self.has_dense:
            return
        model = (self.retriever.info().get("models") or {}).get("dense") or {}
        precomputed = bool(model.get("precomputed"))
        if precomputed != self.external_vectors:
            raise ConfigError(
                f"index {self.path}: its dense vectors are "
                f"{'precomputed (pass the embedding model they came from)' if precomputed else 'encoded by its model ' + repr(model.get('name')) + ' (pass no embedding model)'}")

    def close(self) -> None:
        """Close the writer (releasing the index's ``LOCK``) and the reader."""
        with self._lock:
            self._closed = True
            if self._updater is not None:
                self._updater.close()
                self._updater = None
            if self.retriever is not None:
                self.retriever.close()
                self.retriever = None

    # ------------------------------------------------------------------ writes
    def upsert(self, records: Sequence[Mapping[str, Any]], dense_vectors: np.ndarray | None) -> None:
        """Add ``records`` (corpus records with ``_id``), replacing live documents with the same
        ids; one commit. ``dense_vectors``: float32 (n, dim), required with external vectors.

        Raises:
            CorpusError: bad records (an id twice in the batch names both positions), metadata of
                another type than the index's (names the field). Nothing is written then.
        """
        if not records:
            return
        if self.external_vectors and self.has_dense and dense_vectors is None:
            raise ConfigError("this store's dense vectors come from its embedding model: dense_vectors needed")
        vectors = dense_vectors if self.external_vectors and self.has_dense else None
        with self._lock:
            self._ready()
            if self.retriever is None:
                try:
                    build_index(list(records), self.path, self.config, dense_vectors=vectors, show_progress=False)
                except IndexExistsError:  # another store made it meanwhile: add to it
                    self._open_existing()
                    if self.retriever is None:
                        raise
                else:
                    self.retriever = Retriever.open(self.path, **self.open_options)
                    self._writer()  # the store that made the index holds its LOCK from now on, as after any write
                    return
            upd = self._writer()
            upd.upsert(list(records), dense_vectors=vectors)
            upd.commit()
            self.retriever.refresh()

    def delete(self, ids: Sequence[str]) -> DeleteReport:
        """Delete the live documents with these ids (one commit); unknown ids are reported in the
        returned :class:`~retriever.index.updates.DeleteReport`, not an error.

        Raises:
            ConfigError: ``ids`` is one string (a list of ids is meant; a string would be taken
                character by character), or the store is closed.
        """
        if isinstance(ids, (str, bytes)):
            raise ConfigError(f"delete takes a list of ids, not one string: delete([{ids!r}])")
        with self._lock:
            self._ready()
            if self.retriever is None:
                return DeleteReport(0, list(dict.fromkeys(ids)))
            upd = self._writer()
            report = upd.delete(list(ids))
            if report.deleted:
                upd.commit()
                self.retriever.refresh()
            return report

    def _writer(self) -> IndexUpdater:
        if self._updater is None:
            self._updater = IndexUpdater.open(self.path, **self.updater_options)
        return self._updater

    # ------------------------------------------------------------------ reads
    def get(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """Stored live documents by id, in the order asked, unknown ids left out."""
        with self._lock:
            self._ready()
            return [] if self.retriever is None else self.retriever.get(list(ids))

    def live_ids(self) -> list[str]:
        """The ids of the live documents."""
        with self._lock:
            self._ready()
            return [] if self.retriever is None else self.retriever.live_ids()

    def has_field(self, name: str) -> bool:
        """Whether the index's metadata schema lists the field ``name`` (False while the store
        is empty): a filter on a field the index never held is an error, not an empty match."""
        with self._lock:
            self._ready()
            r = self.retriever
            return r is not None and name in r.reader.metadata_schema

    def ids_where(self, filter: Any) -> list[str]:
        """The ids of the live documents that pass ``filter`` (the dict form), in document order.

        Raises:
            QueryError: a bad filter (as :func:`retriever.filters.parse_filter`).
        """
        from retriever.filters import compile_filter

        with self._lock:
            self._ready()
            r = self.retriever
            if r is None:
                return []
            reader = r.reader
            masks = compile_filter(filter, reader, range(len(reader.shards)))
            out: list[str] = []
            for shard, mask in zip(reader.shards, masks):
                keep = np.ones(shard.rows, dtype=bool) if mask is None else mask.astype(bool)
                if shard.deleted is not None and len(shard.deleted):
                    keep[shard.deleted.astype(np.int64)] = False
                rows = np.flatnonzero(keep)
                if len(rows):
                    out.extend(shard.docs.column("id").take(rows).to_pylist())
            return out

    def search(self, query: str, opts: SearchOptions, query_vector: Any = None) -> tuple[list[Hit], BatchResult | None]:
        """The engine's hits for one query, and the :class:`~retriever.BatchResult` they came from
        (``None`` before the index exists).

        Args:
            query: the query text ("" for a search by vector alone).
            opts: search options.
            query_vector: the query's dense vector (external vectors), normalised like the
                documents'; required when the search runs the dense leg of such an index.

        Raises:
            QueryError: a dense search of an external-vector index without a query vector, a
                mode this index has no leg for, or the engine's own errors.
        """
        with self._lock:  # a write's refresh never lands between the search and its hits
            return self._search(query, opts, query_vector)

    def _search(self, query: str, opts: SearchOptions, query_vector: Any) -> tuple[list[Hit], BatchResult | None]:
        self._ready()
        retriever = self.retriever
        if retriever is None:  # nothing stored yet: no hits, after the checks a search would make
            if isinstance(opts.k, bool) or not isinstance(opts.k, (int, np.integer)) or opts.k < 1:
                raise QueryError(f"k must be an integer >= 1, got {opts.k!r}")
            return [], None
        runs_dense = opts.mode == "dense" or (opts.mode == "hybrid" and self.has_dense)
        kwargs: dict[str, Any] = {}
        if self.external_vectors and runs_dense:
            if query_vector is None:
                raise QueryError("this index's dense vectors come from an embedding model: a query vector is needed")
            kwargs["query_vectors"] = unit_rows(np.asarray(query_vector, dtype=np.float32).reshape(1, -1), 1,
                                                normalize=self.normalize, what="query embedding")
        res = retriever.search_arrays([query], opts.k, mode=opts.mode, fusion=opts.fusion, depth=opts.depth,
                                      leg_params=opts.leg_params, filter=opts.filter, **kwargs)
        return retriever.to_hits(res)[0], res
