"""Public library API: :class:`Retriever` (open / search / search_batch / search_arrays / info)."""

from __future__ import annotations

import gc
import itertools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence, overload

import numpy as np

from retriever.index.config import LEGS
from retriever.index.errors import ConfigError, QueryError
from retriever.index.format import read_current

from . import _kernels
from .engine import Engine
from .filters import compile_filter, filter_key
from .fusion import DEFAULT_FUSION, RRF, Linear, fusion_from_dict, parse_fusion
from .params import LegParams, parse_leg_params
from .results import BatchResult, Hit, LegArrays, LegHit
from .segcache import SegmentCache
from .shards import FETCH_FIELDS, IndexReader

DEFAULT_DEPTH = 100
#: batches with room for at least this many hits (queries x k) are made with the cyclic garbage
#: collector paused (see :func:`_gc_paused`); below it, re-enabling the collector costs more than
#: the pause saves
GC_PAUSE_HITS = 1024
#: n_threads above this are capped (results do not depend on the thread count): the C++ kernels
#: start one thread per query up to n_threads and FAISS's OpenMP team takes the value as is, so
#: n_threads=10**6 on a large batch used to try to start that many threads.
MAX_THREADS = max(64, 4 * (os.cpu_count() or 1))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a batch of result objects is made (thousands of
    tuples and dicts, all reachable: collections triggered by their allocation find nothing to
    free but walk the whole heap, which cost up to a third of ``search_batch``); back on afterwards
    if it was on (the collector's state is process-wide: a concurrent caller that found it off
    leaves it to the one that turned it off)."""
    was = gc.isenabled()
    if was:
        gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _encodes(qs: list[str]) -> bool:
    """True when every string of ``qs`` encodes to UTF-8 (no lone surrogate); one encode call
    over the non-ASCII strings only (an ASCII string always encodes)."""
    try:
        "".join(itertools.filterfalse(str.isascii, qs)).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _take_rows(given: Any, idx: np.ndarray) -> Any:
    """Rows ``idx`` of per-query inputs (a dense ``(nq, dim)`` array, a ``scipy.sparse`` matrix or
    a sequence of sparse query vectors); ``None`` stays ``None``."""
    if given is None:
        return None
    if isinstance(given, np.ndarray) or hasattr(given, "tocsr"):
        return given[idx]
    seq = list(given)
    return [seq[i] for i in idx.tolist()]


def _scatter_results(parts: list[tuple[np.ndarray, BatchResult]], nq: int) -> BatchResult:
    """One :class:`BatchResult` of ``nq`` queries from the results of groups of them (``(rows,
    result)`` pairs; every row in exactly one group, every result of the same mode and width);
    timings are summed."""
    first = parts[0][1]
    width = first.ids.shape[1]
    ids = np.full((nq, width), -1, dtype=first.ids.dtype)
    scores = np.full((nq, width), -np.inf, dtype=first.scores.dtype)
    n_found = np.zeros(nq, dtype=first.n_found.dtype)
    legs = {name: LegArrays(np.full((nq, width), np.nan, dtype=la.scores.dtype),
                            np.zeros((nq, width), dtype=la.ranks.dtype)) for name, la in first.legs.items()}
    timings: dict[str, float] = {}
    for rows, res in parts:
        ids[rows], scores[rows], n_found[rows] = res.ids, res.scores, res.n_found
        for name, la in res.legs.items():
            legs[name].scores[rows], legs[name].ranks[rows] = la.scores, la.ranks
        for t, v in res.timings_ms.items():
            timings[t] = timings.get(t, 0.0) + v
    return BatchResult(ids, scores, n_found, legs, first.mode, first.fusion, timings, first.generation)


class Retriever:
    """A searchable index (thread-safe for concurrent searches: all parameters are per call).

    Open with :meth:`Retriever.open`. Search modes: ``"hybrid"`` (every leg the index has, fused),
    ``"bm25"``, ``"dense"``, ``"sparse"``.

    Example:
        >>> r = Retriever.open("idx/scifact")
        >>> hits = r.search("vitamin D and fracture risk", k=5)
        >>> hits[0].id, hits[0].score, hits[0].legs["bm25"].rank
    """

    def __init__(self, reader: IndexReader, engine: Engine, n_threads: int | None) -> None:
        if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, (int, np.integer))
                                      or n_threads < 1):
            raise QueryError(f"n_threads must be an integer >= 1 or None, got {n_threads!r}")
        #: the generation this Retriever holds: (reader, engine), replaced as one by :meth:`refresh`
        #: (one attribute store, so a thread never sees the reader of one generation with the
        #: engine of another); every call reads it once and works on that snapshot
        self._snap: tuple[IndexReader, Engine | None] = (reader, engine)
        #: (reader, {live id: ordinal}) of the last generation :meth:`get` looked ids up in
        self._live_map: tuple[IndexReader, dict[str, int]] | None = None
        self.n_threads = min(int(n_threads or os.cpu_count() or 1), MAX_THREADS)
        self._refresh_lock = threading.Lock()
        #: compiled filter masks by (canonical filter, generation), least recently used first
        #: (see :meth:`filter_masks`)
        self._filter_cache: OrderedDict[tuple[bytes, int], list[np.ndarray | None]] = OrderedDict()
        self._filter_lock = threading.Lock()

    @classmethod
    def open(cls, path: str | Path, *, verify: bool = False, use_gpu: bool | None = None,
             device: str = "cpu", n_threads: int | None = None, concurrent_legs: bool = True,
             dense_model: str | Path | None = None, sparse_model: str | Path | None = None,
             executor: Any = None) -> "Retriever":
        """Open an index directory (memory-maps the shards, computes corpus-wide statistics).

        Args:
            path: index directory made by :func:`build_index` or ``retriever index build``.
            verify: also check every file's SHA-256 against the manifest (slow on big indexes).
            use_gpu: FAISS on GPU (``None`` = when a GPU is present).
            device: torch device for query encoders.
            n_threads: default threads for compiled kernels, FAISS and BLAS (``None`` = all cores).
            concurrent_legs: run the legs of a hybrid search side by side when a call has 2 or
                more threads (identical results either way).
            dense_model, sparse_model: local model directories of the query encoders (default:
                the bundled models). The index's own record of its models is a fingerprint
                compared with them (a mismatch is a ModelError naming both), never a path that is
                opened, so an index from elsewhere cannot choose what is loaded.
            executor: a :class:`~retriever.index.distributed.RayExecutor` to hold the shards on
                Ray actors (scatter-gather with corpus-wide statistics, identical results; see
                docs/DISTRIBUTED.md); ``None``: this process.

        Raises:
            IndexFormatError: missing, truncated, corrupted or unknown index (names the file).
            ConfigError: bad ``device`` or ``use_gpu``; QueryError: bad ``n_threads``.
        """
        if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, (int, np.integer))
                                      or n_threads < 1):
            raise QueryError(f"n_threads must be an integer >= 1 or None, got {n_threads!r}")
        if not isinstance(device, str) or not (device in ("cpu", "cuda") or device.startswith("cuda:")):
            raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        if use_gpu is not None and not isinstance(use_gpu, bool):
            raise ConfigError(f"use_gpu must be True, False or None, got {use_gpu!r}")
        if not isinstance(concurrent_legs, bool):
            raise ConfigError(f"concurrent_legs must be True or False, got {concurrent_legs!r}")
        reader = IndexReader(path, verify=verify)
        for name, m in (("dense_model", dense_model), ("sparse_model", sparse_model)):
            if m is not None and not isinstance(m, (str, Path)):
                raise ConfigError(f"{name} must be a model directory (str or Path) or None, got {m!r}")
        models = {k: v for k, v in (("dense_model", dense_model), ("sparse_model", sparse_model)) if v is not None}
        cache = SegmentCache()
        options = {"use_gpu": use_gpu, "device": device, "concurrent_legs": concurrent_legs, **models}
        if executor is not None:
            from .distributed.search import DistributedEngine  # the only place Ray is imported from

            engine: Engine = DistributedEngine(reader, executor, **options)
        else:
            engine = Engine(reader, cache=cache, **options)
        r = cls(reader, engine, n_threads)
        r._segments, r._engine_options = cache, options
        return r

    @property
    def reader(self) -> IndexReader:
        """The :class:`IndexReader` of the generation this Retriever holds now."""
        return self._snap[0]

    @property
    def engine(self) -> Engine:
        """The search engine of the generation this Retriever holds now (None once closed)."""
        return self._snap[1]  # type: ignore[return-value]

    def refresh(self) -> bool:
        """Move to the generation that is current now (after an :class:`retriever.IndexUpdater`
        commit), if it is another than the one this Retriever holds (a newer one, or the index
        rebuilt in place with ``overwrite``).

        Per-segment state (checked postings and bitmaps, FAISS indexes, sparse arrays, the
        vocabulary) of segments the two generations share is reused; only new segments are
        loaded; what depends on corpus-wide statistics is updated (N, df, avgdl, idf, length
        norms: O(rows + vocabulary)) or carried (BM25 bounds and thresholds, see
        :mod:`retriever.legs.bm25_carry`), never recomputed from every posting while avgdl stays
        within 5 % of the value a segment's exact bounds were computed at. Safe while other threads search: every search runs on the snapshot (reader and
        engine) it started with, :meth:`search` and :meth:`search_batch` included (their hits are
        made from that snapshot's documents); :meth:`to_hits` of a result from an older
        generation is an error.

        Returns:
            True when another generation was opened.

        Raises:
            IndexFormatError: the current generation cannot be opened (this one stays).
            QueryError: the Retriever is closed.
        """
        with self._refresh_lock:
            if self._snap[1] is None:
                raise QueryError("this Retriever is closed")
            if read_current(self.reader.path) == self.reader.generation and not self.reader.replaced():
                return False
            cache = getattr(self, "_segments", None) or SegmentCache()
            options = getattr(self, "_engine_options", None) or {}
            reader = self.reader.reopen()  # unchanged segments' documents are not checked again
            old = self.engine
            reopen = getattr(old, "reopen", None)
            if reopen is not None:  # a distributed engine: the same actors, new segments assigned
                engine = reopen(reader)
            else:
                cache.mark()
                engine = Engine(reader, cache=cache, **options)
                cache.retain()
            self._segments, self._engine_options = cache, options
            self._snap = (reader, engine)  # one store: readers see the old pair or the new one
            if reopen is not None:
                old.forget()  # the actors drop the older generation once no search is started on it
            return True

    def __enter__(self) -> "Retriever":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Drop references to the memory-mapped shards (and stop a distributed engine's actors)."""
        reader, engine = self._snap
        stop = getattr(engine, "close", None)
        self._snap = (reader, None)
        if stop is not None:
            stop()

    @property
    def legs(self) -> tuple[str, ...]:
        """Names of the legs this index holds (e.g. ``("bm25", "dense", "sparse")``)."""
        return self.reader.legs

    def info(self) -> dict[str, Any]:
        """Index summary (see :meth:`IndexReader.info`)."""
        return self.reader.info()

    def default_fusion(self, reader: IndexReader | None = None) -> "RRF | Linear":
        """The fusion of a search without ``fusion=``: the setting stored in the index generation
        this Retriever holds (``reader.fusion``, written by :func:`retriever.fusion_fit.fit_fusion`),
        else :data:`retriever.fusion.DEFAULT_FUSION`.

        Raises:
            QueryError: a stored setting that does not parse (names the manifest).
        """
        reader = reader if reader is not None else self.reader
        stored = reader.fusion
        if stored is None:
            return DEFAULT_FUSION
        cached = getattr(self, "_stored_fusion", None)
        if cached is not None and cached[0] is stored:
            return cached[1]
        try:
            fz = fusion_from_dict(stored)
        except QueryError as e:
            raise QueryError(f"{reader.manifest_path}: stored fusion setting: {e}") from None
        self._stored_fusion = (stored, fz)
        return fz

    def _check(self, engine: Engine | None, queries: Sequence[str], k: int, depth: int | None,
               n_threads: int | None) -> tuple[list[str], int, int]:
        if isinstance(queries, str):
            raise QueryError("queries must be a list of strings, not one string (use search())")
        if type(queries) is not list and (isinstance(queries, (bytes, Mapping)) or not isinstance(queries, Iterable)):
            raise QueryError(f"queries must be a list of strings, got {type(queries).__name__}")
        qs = list(queries)
        if not all(map(str.__instancecheck__, qs)):
            for i, q in enumerate(qs):
                if not isinstance(q, str):
                    raise QueryError(f"query #{i} is {type(q).__name__}, expected str")
        if not all(map(str.isascii, qs)) and not _encodes(qs):
            for i, q in enumerate(qs):
                try:
                    q.encode("utf-8")
                except UnicodeEncodeError as e:
                    # e.g. a non-UTF-8 command-line argument (Python decodes it with surrogateescape);
                    # the dense / sparse tokenizers used to fail with a raw TypeError on it
                    raise QueryError(f"query #{i} holds an unpaired surrogate {q[e.start]!r} at position "
                                     f"{e.start}: not valid Unicode text (was it decoded from non-UTF-8 "
                                     f"bytes?)") from None
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise QueryError(f"k must be an integer >= 1, got {k!r}")
        if depth is None:
            depth = DEFAULT_DEPTH
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
            raise QueryError(f"depth must be an integer >= 1, got {depth!r}")
        if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, (int, np.integer))
                                      or n_threads < 1):
            raise QueryError(f"n_threads must be an integer >= 1, got {n_threads!r}")
        if engine is None:
            raise QueryError("this Retriever is closed")
        n_docs = engine.reader.n_docs
        k = int(min(k, max(n_docs, 1)))
        # a depth beyond the corpus size means "every document"; clamping it keeps the per-leg
        # (nq, depth) arrays bounded (depth=10**9 used to allocate until the process was killed)
        depth = int(min(depth, max(n_docs, 1)))
        return qs, k, depth

    @staticmethod
    def _check_options(fusion: "RRF | Linear", leg_params: Any, legs: Sequence[str]) -> dict[str, LegParams]:
        """Validate the legs named by the fusion's per-leg settings (``weights``, ``depths``,
        ``leg_k``, :class:`~retriever.fusion.Combined` ``features``) and by ``leg_params`` (``{leg: options}``, options a :mod:`retriever.params`
        object or a dict of its fields) against ``legs``, the legs of the searched index: a setting
        for a leg the index lacks would otherwise be silently ignored.

        Raises:
            QueryError: names the leg or option and the offending value, or the leg the index
                lacks and the legs it has.
        """
        named = [("fusion weights", leg) for leg in fusion.weights]
        named += [("fusion depths", leg) for leg in fusion.depths]
        named += [("fusion leg_k", leg) for leg in getattr(fusion, "leg_k", {})]
        named += [("fusion features", leg) for leg in getattr(fusion, "features", {})]
        for what, leg in named:
            if leg not in LEGS:
                raise QueryError(f"{what}: unknown leg {leg!r}; expected some of {', '.join(LEGS)}")
        params = parse_leg_params(leg_params)
        named += [("leg_params", leg) for leg in params]
        for what, leg in named:
            if leg not in legs:
                raise QueryError(f"{what}: this index has no {leg!r} leg; its legs: {', '.join(legs)}")
        return params

    def search_arrays(self, queries: Sequence[str], k: int = 10, *, mode: str = "hybrid",
                      fusion: "str | RRF | Linear | None" = None, depth: int | None = None,
                      n_threads: int | None = None, query_vectors: np.ndarray | None = None,
                      leg_params: Mapping[str, Any] | None = None,
                      sparse_vectors: Any = None, concurrent_legs: bool | None = None,
                      filter: Any = None) -> BatchResult:
        """Search a batch and return arrays (no per-hit Python objects).

        Args:
            queries: nq query strings. A blank query yields no hits.
            k: hits per query (>= 1; more than the corpus size returns every matching document).
            mode: ``"hybrid"``, ``"bm25"``, ``"dense"`` or ``"sparse"``.
            fusion: ``None`` (the index's stored, fitted setting, else
                :data:`retriever.fusion.DEFAULT_FUSION`; see :meth:`default_fusion`), ``"rrf"`` (k = 60),
                ``"linear"``/``"linear:<norm>"``/``"dbsf"``/``"tmm"``, or an :class:`RRF` /
                :class:`Linear` object (per-leg weights, depths, full-score fusion).
            depth: candidates per leg before fusion (default 100, at least k). Results for
                every k <= depth are prefixes of one another.
            n_threads: kernel threads for this call (default: the Retriever's).
            query_vectors: float32 (nq, dim) dense query vectors to use instead of encoding.
            leg_params: per-leg search options: a :class:`~retriever.params.BM25SearchParams` /
                :class:`~retriever.params.DenseSearchParams` / :class:`~retriever.params.SparseSearchParams`
                or a dict of its fields, e.g. ``{"bm25": {"algorithm": "exhaustive"}}`` or
                ``{"sparse": SparseSearchParams(algorithm="seismic", query_cut=10)}``; an unknown key
                is an error naming it and the valid ones.
            sparse_vectors: nq learned-sparse query vectors to use instead of encoding: a
                ``scipy.sparse`` (nq, vocab) matrix or a sequence of ``(indices, weights)`` pairs or
                ``{term_id: weight}`` dicts (validation policy: ``retriever.legs.sparse.csr_batch``).
            concurrent_legs: run the legs side by side for this call (``None``: the Retriever's
                setting); identical results either way.
            filter: a metadata filter applied inside every leg before top-k (``docs/FILTERS.md``):
                ``None``, a ``pyarrow.compute.Expression``, a dict such as ``{"year": {"$gte":
                2020}}``, or a list with one of those per query (queries with equal filters are
                searched together; the result equals searching them one at a time). Only
                documents that pass are returned; k of them whenever k pass and match.

        Returns:
            :class:`BatchResult` with ids as global ordinals (see :meth:`doc_ids`).

        Raises:
            QueryError: bad k, depth, mode, fusion, leg_params, query vectors or filter (an unknown
                field, a value of another type than its column, an unknown operator).
        """
        return self._search_arrays(self.engine, queries, k, mode=mode, fusion=fusion, depth=depth,
                                   n_threads=n_threads, query_vectors=query_vectors, leg_params=leg_params,
                                   sparse_vectors=sparse_vectors, concurrent_legs=concurrent_legs, filter=filter)

    def _search_arrays(self, engine: Engine | None, queries: Sequence[str], k: int = 10, *, mode: str = "hybrid",
                       fusion: "str | RRF | Linear | None" = None, depth: int | None = None,
                       n_threads: int | None = None, query_vectors: np.ndarray | None = None,
                       leg_params: Mapping[str, Any] | None = None, sparse_vectors: Any = None,
                       concurrent_legs: bool | None = None, filter: Any = None) -> BatchResult:
        """:meth:`search_arrays` on ``engine`` (one generation's snapshot, read once by the caller:
        :meth:`refresh` may switch generations meanwhile)."""
        qs, k, depth = self._check(engine, queries, k, depth, n_threads)
        if concurrent_legs is not None and not isinstance(concurrent_legs, bool):
            raise QueryError(f"concurrent_legs must be True, False or None, got {concurrent_legs!r}")
        fz = self.default_fusion(engine.reader) if fusion is None else parse_fusion(fusion)
        params = self._check_options(fz, leg_params, engine.reader.legs)
        threads = min(int(n_threads or self.n_threads), MAX_THREADS)
        if isinstance(filter, (list, tuple)):
            return self._search_per_filter(engine, qs, list(filter), k, mode, fz, depth, threads, params,
                                           query_vectors, sparse_vectors, concurrent_legs)
        t0 = time.perf_counter()
        allow = None if filter is None else self.filter_masks(filter, engine)
        filter_ms = (time.perf_counter() - t0) * 1e3
        res = self._search(engine, qs, k, mode, fz, depth, threads, params, query_vectors, sparse_vectors,
                           concurrent_legs, allow)
        if filter is not None:
            res.timings_ms["filter"] = filter_ms
        return res

    def _search(self, engine: Engine, qs: list[str], k: int, mode: str, fz: "RRF | Linear", depth: int, threads: int,
                params: dict[str, LegParams], query_vectors: Any, sparse_vectors: Any,
                concurrent_legs: bool | None, allow: list[np.ndarray | None] | None) -> BatchResult:
        """The body of :meth:`search_arrays` for one allow mask list (arguments checked), on
        ``engine`` (the call's snapshot of :attr:`engine`)."""
        prepared: dict[str, Any] = {}
        for leg, given in (("dense", query_vectors), ("sparse", sparse_vectors)):
            if given is None:
                continue
            if leg not in engine.legs:
                raise QueryError(f"{'query' if leg == 'dense' else 'sparse'}_vectors given but this index has no "
                                 f"{leg} leg")
            prep = engine.legs[leg].prepare_vectors(given, params.get(leg), threads)
            rows = prep.n_queries
            if rows != len(qs):
                raise QueryError(f"{'query' if leg == 'dense' else 'sparse'}_vectors has {rows} rows for "
                                 f"{len(qs)} queries")
            prepared[leg] = prep
        return engine.search(qs, k=k, mode=mode, fusion=fz, depth=depth, n_threads=threads,
                             prepared=prepared or None, params=params, concurrent_legs=concurrent_legs,
                             allow=allow)

    def _search_per_filter(self, engine: Engine, qs: list[str], filters: list[Any], k: int, mode: str, fz: "RRF | Linear",
                           depth: int, threads: int, params: dict[str, LegParams], query_vectors: Any,
                           sparse_vectors: Any, concurrent_legs: bool | None) -> BatchResult:
        """One filter per query: the queries grouped by equal filters (:func:`filter_key`), each
        group searched once, the rows scattered back in query order."""
        if len(filters) != len(qs):
            raise QueryError(f"filter has {len(filters)} entries for {len(qs)} queries (one per query, "
                             f"or one filter for the whole batch)")
        for name, given in (("query_vectors", query_vectors), ("sparse_vectors", sparse_vectors)):
            rows = None if given is None else (given.shape[0] if hasattr(given, "shape") else len(given))
            if rows is not None and rows != len(qs):
                raise QueryError(f"{name} has {rows} rows for {len(qs)} queries")
        t0 = time.perf_counter()
        groups: dict[bytes | None, list[int]] = {}
        for i, f in enumerate(filters):
            if isinstance(f, (list, tuple)):
                raise QueryError(f"filter #{i} is a {type(f).__name__}: each query takes one filter")
            groups.setdefault(filter_key(f), []).append(i)
        masks = {key: None if key is None else self.filter_masks(filters[rows[0]], engine)
                 for key, rows in groups.items()}
        filter_ms = (time.perf_counter() - t0) * 1e3
        if len(groups) == 1:
            key = next(iter(groups))
            res = self._search(engine, qs, k, mode, fz, depth, threads, params, query_vectors, sparse_vectors,
                               concurrent_legs, masks[key])
            res.timings_ms["filter"] = filter_ms
            return res
        parts = []
        for key, rows in groups.items():
            idx = np.asarray(rows, dtype=np.int64)
            parts.append((idx, self._search(engine, [qs[i] for i in rows], k, mode, fz, depth, threads, params,
                                            _take_rows(query_vectors, idx), _take_rows(sparse_vectors, idx),
                                            concurrent_legs, masks[key])))
        res = _scatter_results(parts, len(qs))
        res.timings_ms["filter"] = filter_ms
        return res

    #: compiled filters kept per Retriever (LRU, see :meth:`filter_masks`): at most this many ...
    FILTER_CACHE_ENTRIES = 64
    #: ... and at most this many bytes of masks
    FILTER_CACHE_BYTES = 256 << 20

    def filter_masks(self, filter: Any, engine: Engine | None = None) -> list[np.ndarray | None]:
        """The allow masks of ``filter`` for the engine's shards (:func:`retriever.filters.compile_filter`),
        cached per (canonical filter, index generation and manifest) in a bounded LRU
        (:attr:`FILTER_CACHE_ENTRIES` filters, :attr:`FILTER_CACHE_BYTES` of masks): compiling
        costs one Arrow pass over the filtered columns (about 3-70 ms at 1M documents, far more than
        a BM25 query; figures in ``benchmarks/HISTORY.md``), a cache hit one serialisation of the
        filter. The masks are read-only.

        Args:
            filter: an expression or the dict form (:func:`retriever.filters.parse_filter`).
            engine: the engine (and so the generation) to compile for (default: the current one).

        Raises:
            QueryError: as :func:`retriever.filters.parse_filter`.
        """
        engine = engine if engine is not None else self.engine
        if engine is None:
            raise QueryError("this Retriever is closed")
        reader = engine.reader  # the engine's own generation, also while refresh() switches
        # the manifest's digest too: an index rebuilt in place starts again at generation 1
        key = (filter_key(filter), reader.generation, reader.manifest["manifest_sha256"])
        with self._filter_lock:
            hit = self._filter_cache.get(key)
            if hit is not None:
                self._filter_cache.move_to_end(key)
                return hit
        masks = compile_filter(filter, reader, engine.shard_ids)
        for m in masks:
            if m is not None:
                m.flags.writeable = False
        size = sum(0 if m is None else m.nbytes for m in masks)
        if size > self.FILTER_CACHE_BYTES:
            return masks
        with self._filter_lock:
            self._filter_cache[key] = masks
            self._filter_cache.move_to_end(key)
            total = sum(sum(0 if m is None else m.nbytes for m in v) for v in self._filter_cache.values())
            while len(self._filter_cache) > self.FILTER_CACHE_ENTRIES or total > self.FILTER_CACHE_BYTES:
                _, old = self._filter_cache.popitem(last=False)
                total -= sum(0 if m is None else m.nbytes for m in old)
        return masks

    def _live_ordinals(self, reader: IndexReader | None = None) -> dict[str, int]:
        """``{id: global ordinal}`` of the live documents of ``reader``'s generation (default: the
        one this Retriever holds; a replaced document's older, deleted rows are left out); built
        once per generation."""
        reader = reader if reader is not None else self.reader
        cached = self._live_map
        if cached is not None and cached[0] is reader:
            return cached[1]
        ids = reader.doc_ids()
        live = np.ones(len(ids), dtype=bool)
        for shard in reader.shards:
            if shard.deleted is not None and len(shard.deleted):
                live[shard.base + shard.deleted.astype(np.int64)] = False
        ords = np.flatnonzero(live)
        mapping = dict(zip(ids[ords].tolist(), ords.tolist()))
        self._live_map = (reader, mapping)
        return mapping

    def live_ids(self) -> list[str]:
        """The ids of the live documents, in document order."""
        return list(self._live_ordinals())

    #: what :meth:`get` does with ids that name no live document
    GET_MISSING = ("skip", "none", "error")
    #: missing ids an error of ``get(..., missing="error")`` names (then "... and N more")
    GET_MISSING_SHOWN = 5

    @overload
    def get(self, ids: Iterable[str], *, missing: Literal["skip", "error"] = "skip") -> list[dict[str, Any]]: ...

    @overload
    def get(self, ids: Iterable[str], *, missing: Literal["none"]) -> list[dict[str, Any] | None]: ...

    def get(self, ids: Iterable[str], *, missing: str = "skip") -> list[dict[str, Any]] | list[dict[str, Any] | None]:
        """Stored documents by id (the live documents of this Retriever's generation).

        An id names no live document when it was never indexed, was deleted, or was added after
        this Retriever's generation (call :meth:`refresh` first). What happens to such ids is
        ``missing``'s choice:

        - ``"skip"`` (default; as Qdrant's ``retrieve``, Chroma's ``get`` and LangChain's
          ``get_by_ids``): left out, so the result can be shorter than ``ids``; compare the
          returned ``id`` values to find which were missing;
        - ``"none"`` (as Pyserini's ``doc()``): ``None`` in their place, so the result is aligned
          with ``ids``;
        - ``"error"``: :class:`QueryError` naming how many ids were missing and the first five.

        Args:
            ids: document ids (strings); a repeated id comes back once per occurrence.
            missing: ``"skip"``, ``"none"`` or ``"error"``, as above.

        Returns:
            one dict per found id, in the order of ``ids``: ``id``, ``title``, ``text`` and
            ``metadata``, as :meth:`IndexReader.fetch` gives them (and ``None`` per missing id
            with ``missing="none"``).

        Raises:
            QueryError: ``ids`` is one string or holds a non-string (names it); ``missing`` is not
                one of the three; with ``missing="error"``, some ids name no live document.
        """
        if missing not in self.GET_MISSING:
            raise QueryError(f"missing must be one of {', '.join(map(repr, self.GET_MISSING))}, got {missing!r}")
        if isinstance(ids, (str, bytes)):
            raise QueryError("get() takes an iterable of ids, not one string")
        want = list(ids)
        for i in want:
            if not isinstance(i, str):
                raise QueryError(f"document ids are strings, got {i!r} ({type(i).__name__})")
        reader = self.reader  # one generation for the lookup and the fetch
        live = self._live_ordinals(reader)
        ords = [live[i] for i in want if i in live]
        docs = reader.fetch(ords) if ords else []
        if len(ords) == len(want) or missing == "skip":
            return docs
        if missing == "error":
            gone = [i for i in want if i not in live]
            shown = ", ".join(map(repr, gone[:self.GET_MISSING_SHOWN]))
            more = f" and {len(gone) - self.GET_MISSING_SHOWN} more" if len(gone) > self.GET_MISSING_SHOWN else ""
            raise QueryError(f"{len(gone)} of the {len(want)} ids name no live document of generation "
                             f"{reader.generation}: {shown}{more}")
        found = iter(docs)
        return [next(found) if i in live else None for i in want]

    def doc_ids(self, ordinals: np.ndarray, *, generation: int | None = None) -> np.ndarray:
        """Map global ordinals (from :class:`BatchResult`) to document id strings.

        Args:
            ordinals: int array of any shape, e.g. ``BatchResult.ids`` (whole or sliced).
            generation: the generation the ordinals came from (``BatchResult.generation``): after
                a :meth:`refresh` to another one they would name other documents, so that is an
                error (``None``: not checked).

        Returns:
            object array of the same shape; the -1 padding past ``n_found`` maps to ``None`` (it
            used to wrap around to the last document's id).

        Raises:
            QueryError: non-integer ordinals, an ordinal outside [-1, n_docs), or ordinals of
                another generation than the one this Retriever holds.
        """
        ords = np.asarray(ordinals)
        if ords.size and not np.issubdtype(ords.dtype, np.integer):
            raise QueryError(f"ordinals must be integers, got dtype {ords.dtype}")
        ords = ords.astype(np.int64, copy=False)
        reader = self.reader  # one generation for the check and the lookup
        if generation is not None and generation != reader.generation:
            raise QueryError(f"these ordinals are of generation {generation}, this Retriever holds generation "
                             f"{reader.generation} since a refresh(): they would name other documents; search again")
        n = reader.n_docs
        if ords.size and (ords.min() < -1 or ords.max() >= n):
            bad = int(ords.min()) if ords.min() < -1 else int(ords.max())
            raise QueryError(f"ordinal {bad} is outside [0, {n}) (-1 is the padding past n_found)")
        ids = reader.doc_ids()
        if not ords.size or ords.min() >= 0:
            return ids[ords]
        out = ids[np.maximum(ords, 0)]
        out[ords < 0] = None
        return out

    def to_hits(self, result: BatchResult) -> list[list[Hit]]:
        """Turn a :class:`BatchResult` into per-query lists of :class:`Hit` (the only place
        per-hit Python objects are made). The documents of the whole batch are fetched in one
        pass (:meth:`IndexReader.fetch_columns`: per shard, each distinct document's strings
        decoded once from the memory-mapped buffers, typed metadata columns converted once) and
        the hits are made by one compiled loop (:func:`retriever._kernels.make_hits`).

        Raises:
            QueryError: ``result`` comes from another generation than the one this Retriever
                holds now (a :meth:`refresh` in between; :meth:`search_batch` makes its hits from
                its own snapshot).
        """
        reader = self.reader
        gen = result.generation
        if gen is not None and gen != reader.generation:
            raise QueryError(f"this result is of index generation {gen}, the Retriever holds generation "
                             f"{reader.generation} since a refresh(): its ordinals name other documents "
                             f"(use search_batch(), which makes hits from the generation it searched)")
        return self._to_hits(result, reader)

    def _to_hits(self, result: BatchResult, reader: IndexReader) -> list[list[Hit]]:
        """:meth:`to_hits` from ``reader``'s documents (the generation ``result`` was searched on)."""
        if result.ids.size < GC_PAUSE_HITS:  # a few hits: pausing costs more than it saves
            return self._hits(result, reader)
        with _gc_paused():  # every object made here stays reachable: a collection would only cost
            return self._hits(result, reader)

    def _hits(self, result: BatchResult, reader: IndexReader) -> list[list[Hit]]:
        """The body of :meth:`to_hits`: the documents of the batch fetched once (row ``q``'s first
        ``n_found[q]`` ordinals, in query order), then every query's hits made by one C loop
        (:func:`retriever._kernels.make_hits`: the same tuples as ``Hit(...)`` / ``LegHit(...)``,
        no Python frame or per-hit list work)."""
        nq, width = result.ids.shape
        if nq == 1:  # one query (search()): a slice, no mask
            ords = result.ids[0, :int(result.n_found[0])]
        else:
            ords = result.ids[np.arange(width)[None, :] < result.n_found[:, None]]
        ids, titles, texts, metas = reader.fetch_columns(ords, FETCH_FIELDS)
        legs = result.legs
        return _kernels.make_hits(Hit, LegHit, np.ascontiguousarray(result.scores, dtype=np.float32),
                                  np.ascontiguousarray(result.n_found, dtype=np.int32), ids, titles, texts, metas,
                                  list(legs), [np.ascontiguousarray(la.scores, dtype=np.float32) for la in legs.values()],
                                  [np.ascontiguousarray(la.ranks, dtype=np.int32) for la in legs.values()])

    def search_batch(self, queries: Sequence[str], k: int = 10, **kwargs: Any) -> list[list[Hit]]:
        """Search many queries; same arguments as :meth:`search_arrays`.

        Returns:
            one list of :class:`Hit` per query, best first.
        """
        engine = self.engine  # one snapshot for the search and the hits (refresh() may switch)
        res = self._search_arrays(engine, queries, k, **kwargs)
        return self._to_hits(res, engine.reader)

    def search(self, query: str, k: int = 10, **kwargs: Any) -> list[Hit]:
        """Search one query; same arguments as :meth:`search_arrays`.

        Returns:
            list of :class:`Hit`, best first (empty for a blank query).
        """
        if not isinstance(query, str):
            raise QueryError(f"query must be a string, got {type(query).__name__}")
        return self.search_batch([query], k, **kwargs)[0]
