"""Dense leg: query encoding, FAISS inner-product search per shard (GPU when available), and
Matryoshka funnel search.

Vectors are stored once in each shard's ``dense.arrow`` (float16 or float32), rotated by the
index's PCA rotation when it has one (``index/matryoshka.py``). The default ``"Flat"`` factory
builds an exact ``IndexFlatIP`` from them at open time; other factory strings (IVF, HNSW, PQ...)
were trained at build time and are read from ``dense.faiss``.

Funnel search (after AdANNS, Rege et al., "AdANNS: A Framework for Adaptive Semantic Search",
NeurIPS 2023, over Matryoshka embeddings, Kusupati et al., NeurIPS 2022): a candidate generator
searches the first ``dim`` coordinates (re-normalised) with any FAISS index family, keeps the
top-``shortlist`` (k') candidates per shard, and these are re-scored exactly at full dimension
from the stored vectors. On CPU the exact prefix scan can run over int8-quantised prefixes
(``scan_dtype="int8"``, :mod:`retriever.int8scan`: integer dot products in C++, AVX-512 VNNI
where available), several times faster than the float32 BLAS scan at the same ``dim``; only the
shortlist changes, the final scores are the same exact re-scores. All knobs are per-call fields of
:class:`~retriever.params.DenseSearchParams` (``Retriever.search_arrays(..., leg_params={"dense":
{...}})``); prefix indexes built for a ``(dim, index)`` pair are cached, but no search parameter
is stored on them.

Defined edge cases: ``nprobe`` above ``nlist`` is capped at ``nlist``; an IVF/PQ index that
cannot be trained on the available vectors falls back to a flat index with a warning; ``k``
above the number of vectors returns every vector; an empty shard contributes nothing; a query for
which an approximate index returns fewer than ``min(k, rows)`` candidates is completed by an exact
prefix scan, so a query always gets ``min(k, n_docs)`` hits and no ``-1`` id or sentinel score is
returned inside ``n_found``. Final scores are recomputed per query by the C++ kernel
``retriever._kernels.rescore_topk`` (float64 accumulation in a fixed order, rounded to float32),
so a query's scores do not depend on the batch it was sent in.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from retriever.index.encoders.dense import DenseEncoder
from retriever.index.errors import IndexFormatError, QueryError
from retriever.index.faiss_file import read_faiss_index
from retriever.index.format import read_table
from retriever.index.matryoshka import load_rotation, prefix_normalize

from .. import _kernels
from ..int8scan import Int8Prefix, int8_scan, quantize_prefix
from ..params import DenseSearchParams
from ..segcache import SegmentCache, segment_key
from ..shards import IndexReader
from ..threads import QUERY_ENCODE_THREADS, thread_limits, torch_threads
from .base import SearchContext, ShardMask, TopK, check_candidates, empty_topk, search_each_shard, shard_mask

log = logging.getLogger(__name__)

#: default ``nprobe`` for IVF candidate generators (capped at nlist).
DEFAULT_NPROBE = 16
#: default shortlist (k') of a prefix search: ``max(SHORTLIST_FACTOR * k, SHORTLIST_MIN)``.
SHORTLIST_FACTOR = 10
SHORTLIST_MIN = 100
#: memory budget of one query chunk (candidate ids + scores + gathered vectors), bytes.
CHUNK_BYTES = 256 << 20
#: largest k FAISS GPU indexes accept; larger shortlists use the CPU copy.
GPU_MAX_K = 2048
#: filter planner: on an IVF index a mask passing at least this fraction of the shard is
#: searched by post-filtering (the unfiltered search, ``nprobe`` as given, of
#: ``ceil(2 · k' / fraction)`` candidates, the first k' passing kept, short rows completed by an
#: exact scan) instead of an ``IDSelectorBitmap`` with ``nprobe / fraction``: FAISS's selector
#: path tests each visited vector one at a time, and with most documents passing the filter
#: removes too little work to pay for it (``benchmarks/bench_filter_legs.py``: docs/FILTERS.md).
IVF_POSTFILTER_ABOVE = 0.3


def load_vectors(path, rows: int, dim: int, table: Any = None) -> np.ndarray:
    """Read a shard's ``dense.arrow`` as a (rows, dim) float16/float32 view (zero-copy).

    Args:
        table: the file's table when the caller opened it already (through the reader's
            :class:`~retriever.index.safe_open.IndexFiles`); else ``path`` is read.

    Raises:
        IndexFormatError: wrong shape or dtype (names the file).
    """
    import pyarrow as pa

    t = read_table(path) if table is None else table
    if t.column_names != ["vector"] or t.num_rows != rows:
        raise IndexFormatError(f"{path}: expected {rows} rows of column 'vector'")
    col = t.column("vector")
    typ = col.type
    if not pa.types.is_fixed_size_list(typ) or typ.list_size != dim:
        raise IndexFormatError(f"{path}: vectors are {typ}, expected fixed_size_list[{dim}]")
    if rows == 0:
        return np.zeros((0, dim), dtype=np.float32)
    values = col.combine_chunks().values if col.num_chunks != 1 else col.chunk(0).values
    arr = values.to_numpy(zero_copy_only=True)
    if arr.dtype not in (np.float16, np.float32) or arr.size != rows * dim:
        raise IndexFormatError(f"{path}: vector values are {arr.dtype} of size {arr.size}")
    if not np.isfinite(arr).all():
        raise IndexFormatError(f"{path}: vectors contain NaN or inf (file corrupted)")
    return arr.reshape(rows, dim)


@dataclass(frozen=True)
class FunnelParams:
    """Per-call dense search options resolved for one depth (see :meth:`DenseLeg.funnel_params`)."""

    dim: int
    shortlist: int
    index: str | None
    nprobe: int | None
    ef_search: int | None
    rescore: bool
    batch_size: int | None
    scan_dtype: str = "float32"


@dataclass(frozen=True)
class DensePrepared:
    """A batch prepared by :meth:`DenseLeg.prepare` / :meth:`DenseLeg.prepare_vectors`.

    Attributes:
        q: float32 (nq, d) queries in the stored basis (rotated).
        qp: float32 (nq, dim) their re-normalised ``dim``-prefixes (``q`` itself at full dimension
            with the index's own structure).
        params: the call's options.
        dim: the prefix length searched.
        use_own: the shard's own FAISS structure generates the candidates (full dimension).
    """

    q: np.ndarray
    qp: np.ndarray
    params: DenseSearchParams
    dim: int
    use_own: bool

    @property
    def n_queries(self) -> int:
        """Queries in the batch."""
        return int(self.q.shape[0])


class _PrefixIndex:
    """A candidate generator over re-normalised prefixes of one shard (CPU, optional GPU copy)."""

    def __init__(self, cpu: Any, gpu: Any, prefix: np.ndarray | None, int8: Int8Prefix | None = None) -> None:
        self.cpu = cpu
        self.gpu = gpu
        self.prefix = prefix
        self.int8 = int8


class DenseLeg:
    """Dense leg of an opened index.

    Args:
        reader: the opened index.
        shards: positions in ``reader.shards`` this leg holds (default: every shard), in order.
        use_gpu: move FAISS flat/IVF indexes to GPU (``None`` = when ``faiss.get_num_gpus() > 0``).
        device: torch device for the query encoder.
        model: the query encoder's model directory (default: the bundled all-MiniLM-L6-v2); the
            manifest's model record is a fingerprint compared with it on first use (a mismatch is
            a ModelError naming both), never a path that is opened.

    Raises:
        IndexFormatError: malformed vectors, FAISS index or rotation file (names the file).
    """

    name = "dense"
    Params = DenseSearchParams

    def __init__(self, reader: IndexReader, *, shards: Sequence[int] | None = None, use_gpu: bool | None = None,
                 device: str = "cpu", cache: SegmentCache | None = None, model: str | None = None) -> None:
        import faiss

        from retriever.index.encoders.checkpoint import query_model
        from retriever.index.encoders.dense import default_dense_model

        self.reader = reader
        self.config = reader.config.dense
        self.dim = int(reader.manifest["stats"].get("dense_dim", 0))
        #: the manifest's record of the model the documents were encoded with (a fingerprint)
        self.model_info = reader.manifest.get("models", {}).get("dense")
        #: the query model: the caller's, else the bundled default (never a path the index names);
        #: None for precomputed vectors without a caller's model
        self.model_path = None if model is None else str(model)
        #: the bundled model is used (resolved on first use) when the caller named none and the
        #: index's documents were encoded by a model (not given as precomputed vectors)
        self._default_model = (lambda: query_model(None, self.model_info, default_dense_model)) if model is None else None
        self.device = device
        self._encoder: DenseEncoder | None = None
        self._lock = threading.Lock()
        if use_gpu is None:
            use_gpu = faiss.get_num_gpus() > 0
        self.use_gpu = bool(use_gpu) and faiss.get_num_gpus() > 0
        #: float32 (dim, dim) rotation applied to queries (documents were rotated at build), or None.
        self.rotation = load_rotation(reader.path, reader.manifest, self.dim, files=reader.files)
        #: the rotation widened to float64 once (the product in :meth:`rotate`), or None.
        self._rotation64 = None if self.rotation is None else self.rotation.astype(np.float64)
        #: Matryoshka dims recorded at build time (informational; any prefix 1..dim is accepted).
        self.matryoshka_dims = tuple((reader.manifest.get("matryoshka") or {}).get("dims", ()))
        self.vectors: list[np.ndarray] = []
        self.indexes: list[Any] = []
        self.cpu_indexes: list[Any] = []
        self._prefix: dict[tuple[int, int, str], _PrefixIndex] = {}
        self._norms: dict[int, float] = {}  # shard position -> the largest stored vector norm (tie bound)
        self._gpu_lock = threading.Lock()
        self.shard_ids = tuple(range(len(reader.shards)) if shards is None else shards)
        self.n_shards = len(self.shard_ids)
        self.shards = [reader.shards[i] for i in self.shard_ids]
        cache = cache if cache is not None else SegmentCache()
        for s in self.shards:
            key = ("dense", segment_key(reader, s, "dense.arrow"), segment_key(reader, s, "dense.faiss"), self.dim)
            vec, index = cache.get(key, lambda s=s: self._load_segment(reader, s))
            self.vectors.append(vec)
            self.cpu_indexes.append(index)
            self.indexes.append(self._to_gpu(index))

    def _load_segment(self, reader: IndexReader, s: Any) -> tuple[np.ndarray, Any]:
        """One segment's stored vectors and CPU FAISS index (read from ``dense.faiss``, or a flat
        index of the vectors), checked; reused across refreshes (:mod:`retriever.segcache`)."""
        import faiss

        vec = load_vectors(s.dir / "dense.arrow", s.rows, self.dim,
                           table=reader.files.table(f"{s.entry['dir']}/dense.arrow"))
        faiss_rel = f"{s.entry['dir']}/dense.faiss"
        if faiss_rel in reader.manifest["files"]:
            # every size in the file is checked against the file's length, its ntotal and d
            # before FAISS parses it (FAISS allocates what a header claims before reading)
            index = read_faiss_index(reader.files, faiss_rel, self.dim, s.rows)
        else:
            index = faiss.IndexFlatIP(self.dim)
            if s.rows:
                index.add(np.ascontiguousarray(vec, dtype=np.float32))
        return vec, index

    # ------------------------------------------------------------------ encoding
    @property
    def encoder(self) -> DenseEncoder:
        """The query encoder, loaded on first use from the model recorded in the manifest."""
        from pathlib import Path

        from retriever.index.encoders.checkpoint import check_fingerprint

        with self._lock:
            if self._encoder is None:
                if not self.model_path and self._default_model is not None:
                    self.model_path = self._default_model()
                if not self.model_path:
                    raise QueryError("this index has no dense query encoder (its dense vectors were given "
                                     "precomputed at build time): pass query_vectors= (float32 (nq, "
                                     f"{self.dim})) to search its dense leg, e.g. in mode 'dense' or 'hybrid', "
                                     "or open it with dense_model=")
                cfg = self.config
                check_fingerprint("dense", Path(self.model_path), self.model_info, str(self.reader.manifest_path))
                enc = DenseEncoder(self.model_path, max_length=cfg.max_length, batch_size=cfg.batch_size,
                                   device=self.device, normalize=cfg.normalize)
                if enc.dim != self.dim:  # kept only once it passed: every later search raises this too
                    raise IndexFormatError(f"{self.reader.manifest_path}: dense model {self.model_path} has dim "
                                           f"{enc.dim}, index has {self.dim}")
                self._encoder = enc
            return self._encoder

    def prepare(self, queries: Sequence[str], params: DenseSearchParams | None = None,
                n_threads: int = 1) -> "DensePrepared":
        """Encode the batch with the index's query encoder (torch's own threads) and bring it into
        the stored basis (see :meth:`prepare_vectors`).

        Raises:
            QueryError: the index has no query encoder (precomputed vectors), or bad ``params``.
        """
        return self.prepare_vectors(self.encode(list(queries)), params, n_threads, checked=True)

    def prepare_vectors(self, vectors: Any, params: DenseSearchParams | None = None, n_threads: int = 1,
                        *, checked: bool = False) -> "DensePrepared":
        """Prepare model-space query vectors (float32 (nq, dim), as the encoder gives them): rotated
        into the stored basis, and re-normalised to the ``params.dim`` prefix for a funnel search.

        Raises:
            QueryError: bad vectors (:meth:`check_vectors`), ``dim`` above the index's, or
                ``params`` of another leg.
        """
        p = params or DenseSearchParams()
        if not isinstance(p, DenseSearchParams):
            raise QueryError(f"dense leg params must be DenseSearchParams, got {type(p).__name__}")
        if p.dim is not None and p.dim > self.dim:
            raise QueryError(f"dense leg_params 'dim' must be <= {self.dim}, got {p.dim!r}")
        qv = vectors if checked else self.check_vectors(vectors)
        q = self.rotate(qv)
        dim = self.dim if p.dim is None else p.dim
        int8 = p.scan_dtype == "int8"
        use_own = dim == self.dim and p.index is None and not int8
        with thread_limits(n_threads):
            qp = q if use_own else prefix_normalize(q, dim)
        return DensePrepared(q, qp, p, dim, use_own)

    def encode(self, queries: list[str]) -> np.ndarray:
        """float32 (nq, dim) query vectors in the model's space, encoded on
        :data:`~retriever.threads.QUERY_ENCODE_THREADS` torch threads (so a query's vector does not
        depend on the thread or the call's thread budget it is encoded under)."""
        encoder = self.encoder
        with torch_threads(QUERY_ENCODE_THREADS):
            return encoder.encode([self.config.query_prefix + q for q in queries])

    def check_vectors(self, qv: np.ndarray) -> np.ndarray:
        """Validate user-supplied query vectors (model space, as the encoder produces them).

        Returns:
            float32 C-contiguous (nq, dim).

        Raises:
            QueryError: an array that is not of real numbers (complex, bool, objects), wrong
                shape, non-finite values, or a vector so large that its squared norm (and so an
                inner product with it) overflows float32 (> 1e36; rescale it).
        """
        if isinstance(qv, (str, bytes)):
            raise QueryError(f"query vectors must be a float array of shape (nq, {self.dim}), got {type(qv).__name__}")
        kind = getattr(getattr(qv, "dtype", None), "kind", None)
        if kind is not None and kind not in "fiu":  # complex (its imaginary part dropped), bool, objects...
            raise QueryError(f"query vectors must be real numbers, got dtype {qv.dtype}")
        try:
            qv = np.asarray(qv, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise QueryError(f"query vectors must be a float array of shape (nq, {self.dim}) ({e})") from None
        if qv.ndim == 1:
            qv = qv[None, :]
        if qv.ndim != 2 or qv.shape[1] != self.dim:
            raise QueryError(f"query vectors must have shape (nq, {self.dim}), got {qv.shape}")
        if not np.isfinite(qv).all():
            raise QueryError("query vectors contain NaN or inf")
        if qv.size:
            sq = np.einsum("ij,ij->i", qv.astype(np.float64), qv.astype(np.float64))
            big = np.flatnonzero(sq > self.MAX_SQUARED_NORM)
            if big.size:
                i = int(big[0])
                raise QueryError(f"query vector #{i} has norm {np.sqrt(sq[i]):.3g}: inner products with it "
                                 f"overflow float32 (the limit is a squared norm of {self.MAX_SQUARED_NORM:g}); "
                                 "rescale it")
        return np.ascontiguousarray(qv)

    #: largest accepted squared L2 norm of a query vector: well inside float32 (max ~3.4e38), so
    #: rotations, prefix norms and inner products with unit or bounded document vectors stay finite.
    MAX_SQUARED_NORM = 1e36

    def rotate(self, qv: np.ndarray) -> np.ndarray:
        """Model-space float32 (nq, dim) queries → the stored basis (``qv @ R``; identity without rotation)."""
        qv = np.ascontiguousarray(qv, dtype=np.float32)
        if self.rotation is None:
            return qv
        # float64 product rounded to float32: a query's rotated vector does not depend on its batch.
        return np.ascontiguousarray((qv.astype(np.float64) @ self._rotation64).astype(np.float32))

    # ------------------------------------------------------------------ FAISS helpers
    def _to_gpu(self, index: Any) -> Any:
        """GPU copy of a flat/IVF index when GPUs are used, else ``None`` / the index itself."""
        if not self.use_gpu:
            return index
        import faiss

        kind = type(faiss.downcast_index(index)).__name__
        if kind.startswith(("IndexFlat", "IndexIVFFlat", "IndexIVFPQ", "IndexIVFScalarQuantizer")):
            try:
                return faiss.index_cpu_to_all_gpus(index)
            except RuntimeError as e:  # pragma: no cover - depends on the GPU build
                log.warning("cannot move %s to GPU (%s); searching on CPU", kind, e)
        return index

    def _prefix_index(self, si: int, dim: int, factory: str) -> _PrefixIndex:
        """Cached candidate generator over shard ``si``'s re-normalised ``dim``-prefixes
        (``factory`` a FAISS factory string, or ``"int8"`` for the quantised exact scan)."""
        from retriever.index.faiss_build import make_faiss_index

        key = (si, dim, factory)
        with self._lock:
            pi = self._prefix.get(key)
        if pi is not None:
            return pi
        prefix = prefix_normalize(self.vectors[si], dim)
        if factory == "int8":
            # exact scan of int8-quantised prefixes (retriever/int8scan.py), CPU only
            pi = _PrefixIndex(None, None, None, quantize_prefix(prefix))
            del prefix
        elif factory.replace(" ", "") == "Flat" and not self.use_gpu:
            # exact prefix scan: BLAS blocks + the C++ running top-k' (see _prefix_scan)
            pi = _PrefixIndex(None, None, prefix)
        else:
            cpu = make_faiss_index(prefix, factory)
            gpu = self._to_gpu(cpu) if self.use_gpu else None
            keep = None if type(cpu).__name__ == "IndexFlatIP" else prefix  # exact completion for ANN indexes
            pi = _PrefixIndex(cpu, gpu if gpu is not cpu else None, keep)
        with self._lock:
            self._prefix.setdefault(key, pi)
            return self._prefix[key]

    @staticmethod
    def _search_params(index: Any, nprobe: int | None, ef_search: int | None, k: int, sel: Any = None) -> Any:
        """FAISS per-call ``SearchParameters`` for IVF / HNSW (possibly under a pre-transform),
        with the ``IDSelector`` ``sel`` when given (plain ``SearchParameters`` for other types)."""
        import faiss

        inner = faiss.downcast_index(index)
        refine = None
        if isinstance(inner, faiss.IndexRefine):  # "...,RFlat": the base index's parameters, wrapped
            refine = inner
            inner = faiss.downcast_index(inner.base_index)
        wrap = None
        if isinstance(inner, faiss.IndexPreTransform):
            wrap = inner
            inner = faiss.downcast_index(inner.index)
        params = None
        ivf = faiss.try_extract_index_ivf(inner) if hasattr(faiss, "try_extract_index_ivf") else None
        if ivf is not None:
            nlist = int(ivf.nlist)
            n = DEFAULT_NPROBE if nprobe is None else nprobe
            params = faiss.SearchParametersIVF(nprobe=int(min(max(n, 1), nlist)))
        elif isinstance(inner, faiss.IndexHNSW):
            ef = int(inner.hnsw.efSearch) if ef_search is None else ef_search
            params = faiss.SearchParametersHNSW(efSearch=int(max(ef, k)))
        if sel is not None:
            if params is None:
                params = faiss.SearchParameters()
            params.sel = sel
        if params is not None and wrap is not None:
            params = faiss.SearchParametersPreTransform(index_params=params)
        if refine is not None:
            params = faiss.IndexRefineSearchParameters(k_factor=float(refine.k_factor), base_index_params=params)
        return params

    def _faiss_search(self, cpu: Any, gpu: Any, q: np.ndarray, k: int, fp: FunnelParams) -> tuple[np.ndarray, np.ndarray]:
        """Search ``q`` in chunks sized to :data:`CHUNK_BYTES`; returns ``(D float32, I int64)`` (nq, k)."""
        use = gpu if gpu is not None and k <= GPU_MAX_K else cpu
        params = self._search_params(cpu, fp.nprobe, fp.ef_search, k)
        nq = q.shape[0]
        D = np.empty((nq, k), np.float32)
        I = np.empty((nq, k), np.int64)
        step = fp.batch_size or max(1, min(nq, CHUNK_BYTES // max(1, k * 12 + q.shape[1] * 4)))
        for a in range(0, nq, step):
            b = min(nq, a + step)
            if use is not cpu:
                # GPU indexes take nprobe as index state, not per-call parameters: set it and
                # search under one lock so concurrent calls cannot see each other's value.
                with self._gpu_lock:
                    if params is not None and hasattr(params, "nprobe"):
                        import faiss
                        faiss.GpuParameterSpace().set_index_parameter(use, "nprobe", int(params.nprobe))
                    D[a:b], I[a:b] = use.search(q[a:b], k)
            elif params is not None:
                D[a:b], I[a:b] = use.search(q[a:b], k, params=params)
            else:
                D[a:b], I[a:b] = use.search(q[a:b], k)
        return D, I

    # ------------------------------------------------------------------ search
    def funnel_params(self, p: DenseSearchParams, depth: int) -> FunnelParams:
        """The call's options resolved for ``depth`` hits (default shortlist, dim)."""
        dim = self.dim if p.dim is None else p.dim
        shortlist = p.shortlist
        if shortlist is None:
            funnel = dim < self.dim or p.index is not None or p.scan_dtype == "int8"
            shortlist = max(SHORTLIST_FACTOR * depth, SHORTLIST_MIN) if funnel else depth
        return FunnelParams(dim=dim, shortlist=max(shortlist, depth), index=p.index, nprobe=p.nprobe,
                            ef_search=p.ef_search, rescore=p.rescore, batch_size=p.batch_size,
                            scan_dtype=p.scan_dtype)

    def search_shards(self, prepared: "DensePrepared", shards: Sequence[int], ctx: SearchContext) -> TopK:
        """:meth:`search_shard` on each of ``shards``, merged (:func:`~retriever.legs.base.search_each_shard`)."""
        return search_each_shard(self, prepared, shards, ctx, prepared.q.shape[0])

    def search_shard(self, prepared: "DensePrepared", shard: int, ctx: SearchContext) -> TopK:
        """Top-``ctx.depth`` of shard position ``shard``, exact or by funnel search (the options are
        those of :class:`~retriever.params.DenseSearchParams`): a candidate generator (the shard's
        own FAISS structure at full dimension, else a cached generator over the ``dim``-prefix:
        the exact blocked scan, its int8 form, or a FAISS index built from the factory string)
        keeps the top-``shortlist`` candidates, which are re-scored exactly at full dimension from
        the stored vectors (``_kernels.rescore_topk``). FAISS's OpenMP team and BLAS run on
        ``ctx.n_threads`` threads.

        Returns:
            ``(ids int64 (nq, depth) global ordinals, scores float32 (nq, depth), n_found int32
            (nq,))``, rows sorted by score descending then ordinal, padded with -1 / -inf.

        With an allow mask (``ctx.allow``: filters and deletes) only passing documents are
        returned, see :meth:`_search_filtered`.

        Raises:
            QueryError: a malformed allow mask (names the shard and the sizes); ConfigError: an
                invalid FAISS factory string.
        """
        depth, threads = ctx.depth, max(1, ctx.n_threads)
        fp = self.funnel_params(prepared.params, depth)
        q, qp = prepared.q, prepared.qp
        nq = q.shape[0]
        s = self.shards[shard]
        mask = shard_mask(ctx, shard, s.rows, f"{self.shard_ids[shard]} ({s.dir.name})")
        kk = min(fp.shortlist, mask.n_pass)
        if kk == 0 or nq == 0:
            return empty_topk(nq, depth)
        if mask.allow is not None:
            return self._search_filtered(prepared, shard, depth, threads, fp, mask)
        vec = self.vectors[shard]
        pi = None
        if prepared.params.exhaustive:  # the exact reference: raw inner products, nothing kept
            vec32 = np.ascontiguousarray(vec, dtype=np.float32)
            with thread_limits(threads):
                D, I = self._with_boundary_ties(lambda kq: _prefix_scan(vec32, q, kq, threads, fp.batch_size),
                                                min(depth, s.rows), s.rows, q, shard)
            return _kernels.rescore_topk(q, vec, np.ascontiguousarray(I, dtype=np.int64), depth, int(s.base), threads)
        if prepared.use_own:
            cpu, gpu, exact = self.cpu_indexes[shard], self.indexes[shard], vec
            if gpu is cpu:
                gpu = None
        else:
            pi = self._prefix_index(shard, fp.dim, "int8" if fp.scan_dtype == "int8" else fp.index or "Flat")
            cpu, gpu, exact = pi.cpu, pi.gpu, pi.prefix
        with thread_limits(threads):
            if pi is not None and pi.int8 is not None:
                D, I = int8_scan(pi.int8, qp, kk, threads)
            elif cpu is None:
                D, I = _prefix_scan(exact, qp, kk, threads, fp.batch_size)
            else:
                def candidates(kq: int) -> tuple[np.ndarray, np.ndarray]:
                    D, I = self._faiss_search(cpu, gpu, qp, kq, fp)
                    self._check_faiss_ids(I, s)
                    return self._complete(D, I, qp, exact, min(depth, s.rows))

                if prepared.use_own and fp.rescore and kk == min(depth, s.rows) and _is_flat(cpu):
                    # exact search at full dimension: the cut must not split a group of tied scores
                    # (an approximate index's candidates are approximate anyway: left as they are)
                    D, I = self._with_boundary_ties(candidates, kk, s.rows, q, shard)
                else:
                    D, I = candidates(kk)
        if fp.rescore:
            return _kernels.rescore_topk(q, vec, np.ascontiguousarray(I, dtype=np.int64), depth, int(s.base), threads)
        valid = I >= 0
        scores = np.where(valid, D, -np.inf).astype(np.float32)
        return _top(np.where(valid, I + s.base, -1), scores, depth)

    def _search_filtered(self, prepared: "DensePrepared", shard: int, depth: int, threads: int, fp: FunnelParams,
                         mask: ShardMask) -> TopK:
        """:meth:`search_shard` with an allow mask that some but not all rows pass.

        The planner: when the passing fraction is below ``params.filter_exact_below``, when the
        generator scans every row anyway and a scan of the passing vectors costs less
        (:meth:`_passing_scan_cheaper`), or for an IVF generator whose ``nprobe`` (raised to
        ``nprobe / fraction``, so that as many passing vectors are visited as without a filter)
        would visit more vectors than pass, the passing documents are scanned exactly
        (:meth:`_scan_passing`): the exact filtered top-k, whatever the algorithm. Otherwise every generator takes the mask before its top-k': the exact
        scans (float32 blocks, int8) through their kernels' ``allow``; FAISS through an
        ``IDSelectorBitmap`` in the search parameters (IVF ``nprobe`` and HNSW ``efSearch``
        divided by the fraction, capped), or, for an IVF index with at least
        :data:`IVF_POSTFILTER_ABOVE` of the rows passing and for index types without selector
        support (flat ``IndexPQ``), by searching ``2 · k' / fraction`` candidates without the
        mask (IVF: ``nprobe`` as given) and filtering them. Every id
        FAISS returns is checked against the shard's rows and the mask; a query left with fewer
        than ``min(depth, passing)`` candidates is completed by an exact scan of the passing
        documents, so exactly that many hits come back. Then re-scoring as without a mask.
        """
        p = prepared.params
        s = self.shards[shard]
        q, qp = prepared.q, prepared.qp
        vec = self.vectors[shard]
        allow = mask.allow
        kk = min(fp.shortlist, mask.n_pass)
        need = min(depth, mask.n_pass)
        pi = None
        if not p.exhaustive and not prepared.use_own:
            pi = self._prefix_index(shard, fp.dim, "int8" if fp.scan_dtype == "int8" else fp.index or "Flat")
        cpu = self.cpu_indexes[shard] if prepared.use_own else (pi.cpu if pi is not None else None)
        if (mask.fraction < p.filter_exact_below or self._passing_scan_cheaper(prepared, cpu, pi, fp, mask)
                or (cpu is not None and self._ivf_scans_more(cpu, fp, mask))):
            return self._scan_passing(prepared, shard, depth, threads, fp, mask)
        with thread_limits(threads):
            if p.exhaustive:
                vec32 = np.ascontiguousarray(vec, dtype=np.float32)
                D, I = self._with_boundary_ties(
                    lambda kq: _prefix_scan(vec32, q, kq, threads, fp.batch_size, allow=allow), need, mask.n_pass,
                    q, shard)
                return _kernels.rescore_topk(q, vec, np.ascontiguousarray(I, dtype=np.int64), depth, int(s.base),
                                             threads)
            exact = vec if prepared.use_own else pi.prefix
            if pi is not None and pi.int8 is not None:
                D, I = int8_scan(pi.int8, qp, kk, threads, allow=allow)
            elif cpu is None:
                D, I = _prefix_scan(exact, qp, kk, threads, fp.batch_size, allow=allow)
            else:
                def candidates(kq: int) -> tuple[np.ndarray, np.ndarray]:
                    D, I = self._faiss_search_filtered(cpu, qp, kq, fp, mask)
                    self._check_faiss_ids(I, s)
                    ok = (I >= 0) & (allow[np.maximum(I, 0)] != 0)  # never a masked id, whatever FAISS did
                    I = np.where(ok, I, -1)
                    D = np.where(ok, D, -np.inf).astype(np.float32)
                    return self._complete(D, I, qp, exact, need, mask)

                if prepared.use_own and fp.rescore and kk == need and _is_flat(cpu):  # exact: see search_shard
                    D, I = self._with_boundary_ties(candidates, kk, mask.n_pass, q, shard)
                else:
                    D, I = candidates(kk)
        if fp.rescore:
            return _kernels.rescore_topk(q, vec, np.ascontiguousarray(I, dtype=np.int64), depth, int(s.base), threads)
        valid = I >= 0
        scores = np.where(valid, D, -np.inf).astype(np.float32)
        return _top(np.where(valid, I + s.base, -1), scores, depth)

    def _scan_passing(self, prepared: "DensePrepared", shard: int, depth: int, threads: int, fp: FunnelParams,
                      mask: ShardMask) -> TopK:
        """Exact top-``depth`` of the passing documents of shard ``shard``: their stored vectors
        gathered (one copy per call, ``passing × d`` floats), scanned in BLAS blocks, the best
        re-scored at full dimension (``rescore_topk``: the scores an unfiltered exact search
        reports). With ``rescore=False``: exact inner products of the re-normalised
        ``dim``-prefixes (raw vectors at full dimension with the index's own structure)."""
        s = self.shards[shard]
        rows = mask.passing()
        vec = self.vectors[shard]
        sub = np.ascontiguousarray(vec[rows], dtype=np.float32)
        need = min(depth, len(rows))
        with thread_limits(threads):
            if fp.rescore or prepared.params.exhaustive:
                _, I = self._with_boundary_ties(lambda kq: _prefix_scan(sub, prepared.q, kq, threads, fp.batch_size),
                                                need, len(rows), prepared.q, shard)
                cand = np.where(I >= 0, rows[np.maximum(I, 0)], -1)
                return _kernels.rescore_topk(prepared.q, vec, np.ascontiguousarray(cand, dtype=np.int64), depth,
                                             int(s.base), threads)
            subp = sub if prepared.use_own else np.ascontiguousarray(prefix_normalize(sub, fp.dim), dtype=np.float32)
            D, I = _prefix_scan(subp, prepared.qp, need, threads, fp.batch_size)
        ids = np.where(I >= 0, rows[np.maximum(I, 0)] + s.base, -1)
        return _top(ids, np.where(I >= 0, D, -np.inf).astype(np.float32), depth)

    def _passing_scan_cheaper(self, prepared: "DensePrepared", cpu: Any, pi: "_PrefixIndex | None",
                              fp: FunnelParams, mask: ShardMask) -> bool:
        """True when the generator is itself a scan of every row (exhaustive, the flat float32 or
        int8 prefix scans, a flat FAISS index) and gathering and scanning the passing vectors at
        full dimension costs less: ``passing · d · (1 + 1/nq)`` multiply-adds and copies against
        ``rows · dim`` (a quarter of that for int8 codes)."""
        if prepared.params.exhaustive:
            gen = float(self.dim)
        elif pi is not None and pi.int8 is not None:
            gen = fp.dim / 4.0
        elif cpu is None or _is_flat(cpu):
            gen = float(self.dim if prepared.use_own else fp.dim)
        else:
            return False
        nq = max(1, prepared.q.shape[0])
        return mask.n_pass * self.dim * (1.0 + 1.0 / nq) <= mask.rows * gen

    @staticmethod
    def _ivf_scans_more(cpu: Any, fp: FunnelParams, mask: ShardMask) -> bool:
        """True when ``cpu`` is an IVF index whose filtered search (``nprobe / fraction`` lists,
        capped at nlist) would visit more vectors than pass the mask (the exact scan of the
        passing documents is then both cheaper and exact)."""
        import faiss

        inner = faiss.downcast_index(cpu)
        if isinstance(inner, faiss.IndexPreTransform):
            inner = faiss.downcast_index(inner.index)
        ivf = faiss.try_extract_index_ivf(inner) if hasattr(faiss, "try_extract_index_ivf") else None
        if ivf is None:
            return False
        nlist = int(ivf.nlist)
        base = DEFAULT_NPROBE if fp.nprobe is None else fp.nprobe
        # the post-filtered search (see IVF_POSTFILTER_ABOVE) visits nprobe lists as given
        nprobe = min(nlist, base if mask.fraction >= IVF_POSTFILTER_ABOVE else math.ceil(base / mask.fraction))
        return nprobe / nlist * mask.rows >= mask.n_pass

    def _faiss_search_filtered(self, cpu: Any, q: np.ndarray, k: int, fp: FunnelParams, mask: ShardMask
                               ) -> tuple[np.ndarray, np.ndarray]:
        """FAISS search of the CPU index ``cpu`` restricted to the mask's rows (see
        :meth:`_search_filtered`); ``(D float32, I int64)`` (nq, k), -1 where nothing was found."""
        import faiss

        frac = mask.fraction
        base_nprobe = DEFAULT_NPROBE if fp.nprobe is None else fp.nprobe
        inner = faiss.downcast_index(cpu)
        if isinstance(inner, faiss.IndexPreTransform):
            inner = faiss.downcast_index(inner.index)
        ivf = faiss.try_extract_index_ivf(inner) if hasattr(faiss, "try_extract_index_ivf") else None
        postfilter = ivf is not None and frac >= IVF_POSTFILTER_ABOVE
        nprobe = base_nprobe if postfilter else math.ceil(base_nprobe / frac)
        ef = int(inner.hnsw.efSearch) if fp.ef_search is None and isinstance(inner, faiss.IndexHNSW) else fp.ef_search
        # efSearch scaled by the passing fraction, at most the shard's rows: the traversal's
        # candidate list holds non-passing nodes too, so the passing count is no bound on it
        ef = None if ef is None else min(max(mask.rows, k), math.ceil(max(ef, k) / frac))
        nq = q.shape[0]
        step = fp.batch_size or max(1, min(nq, CHUNK_BYTES // max(1, k * 12 + q.shape[1] * 4)))
        D = np.empty((nq, k), np.float32)
        I = np.empty((nq, k), np.int64)
        if not postfilter:
            bits = np.packbits(mask.allow, bitorder="little")  # FAISS's bitmap: bit i of byte i // 8
            sel = faiss.IDSelectorBitmap(mask.rows, faiss.swig_ptr(bits))
            params = self._search_params(cpu, nprobe, ef, k, sel=sel)
            try:
                for a in range(0, nq, step):
                    b = min(nq, a + step)
                    D[a:b], I[a:b] = cpu.search(q[a:b], k, params=params)
                return D, I
            except RuntimeError:  # an index type without selector support (IndexPQ): post-filter
                pass
        k2 = int(min(mask.rows, math.ceil(2 * k / frac)))
        plain = self._search_params(cpu, nprobe, ef, k2)
        for a in range(0, nq, step):
            b = min(nq, a + step)
            D2, I2 = cpu.search(q[a:b], k2, params=plain) if plain is not None else cpu.search(q[a:b], k2)
            ok = (I2 >= 0) & (I2 < mask.rows)
            ok &= mask.allow[np.where(ok, I2, 0)] != 0
            # FAISS rows are best first: keep the first k passing candidates of each row
            rank = np.cumsum(ok, axis=1) - 1
            take = ok & (rank < k)
            D[a:b], I[a:b] = -np.inf, -1
            r, c = np.nonzero(take)
            D[a + r, rank[r, c]] = D2[r, c]
            I[a + r, rank[r, c]] = I2[r, c]
        return D, I

    def score_docs(self, prepared: "DensePrepared", shard: int, offsets: np.ndarray,
                   ordinals: np.ndarray) -> np.ndarray:
        """Exact full-dimension inner products of given documents of shard position ``shard``
        (query i: shard-local ``ordinals[offsets[i]:offsets[i+1]]``), float32 aligned with
        ``ordinals``: ``_kernels.rescore_topk``'s float64 sum in a fixed order rounded to float32,
        so equal to the re-scored values :meth:`search_shard` returns.

        Raises:
            QueryError: offsets that do not fit, or an ordinal outside the shard (names it).
        """
        nq = prepared.q.shape[0]
        offs, ords = check_candidates(offsets, ordinals, nq, self.shards[shard].rows)
        counts = np.diff(offs)
        width = int(counts.max()) if nq and len(ords) else 0
        out = np.zeros(len(ords), dtype=np.float32)
        if width == 0:
            return out
        cand = np.full((nq, width), -1, dtype=np.int64)
        col = np.arange(len(ords)) - np.repeat(offs[:-1], counts)
        row = np.repeat(np.arange(nq), counts)
        cand[row, col] = ords
        ids, scores, _ = _kernels.rescore_topk(prepared.q, self.vectors[shard], cand, width, 0, 1)
        # rescore_topk returns each row sorted; map the scores back to the candidates' positions
        # (one sort of (row, ordinal) keys and a binary search; a candidate may repeat in a row)
        big = self.shards[shard].rows + 2
        keys = np.arange(nq, dtype=np.int64)[:, None] * big + cand + 1
        flat = keys.ravel()
        order = np.argsort(flat, kind="stable")
        sorted_keys = flat[order]
        valid = ids >= 0
        found = (np.arange(nq, dtype=np.int64)[:, None] * big + ids + 1)[valid]
        left = np.searchsorted(sorted_keys, found, side="left")
        right = np.searchsorted(sorted_keys, found, side="right")
        vals = scores[valid]
        # every occurrence of a (row, ordinal) in the candidates gets its score
        reps = right - left
        src = np.repeat(np.arange(len(found)), reps)
        at = order[np.repeat(left, reps) + (np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps))]
        r_, c_ = np.divmod(at, width)
        out[offs[r_] + c_] = vals[src]
        return out

    def _with_boundary_ties(self, run: Callable[[int], tuple[np.ndarray, np.ndarray]], k: int, rows: int,
                            q: np.ndarray, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """Candidates ``run(kq)`` (scores and shard-local ids, any order) for an exact top-``k``
        that the exact re-scoring then orders: ``kq`` grows past ``k`` until no query's last
        candidate is within the float32 rounding bound of its ``k``-th score, so a group of
        documents with equal exact scores (duplicate passages) is never cut by the candidate
        generator's rounding (BLAS sums in another order than the re-scoring: identical vectors
        can score a few ulps apart) and the tie goes to the earlier document, as documented.

        The bound: two float32 evaluations of q·v in different orders differ by at most
        2·d·2⁻²⁴·‖q‖·‖v‖ (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1).
        """
        if k >= rows:
            return run(k)
        eps = (2.0 ** -22) * q.shape[1] * np.linalg.norm(q.astype(np.float64), axis=1) * self.max_norm(shard)
        kq = min(rows, k + TIE_MARGIN)
        while True:
            D, I = run(kq)
            if kq >= rows:
                return D, I
            Ds = np.where(I >= 0, D, -np.inf)
            kth = -np.partition(-Ds, k - 1, axis=1)[:, k - 1]
            if not np.any(Ds.min(axis=1) >= kth - eps):
                return D, I
            kq = min(rows, 2 * kq)

    def max_norm(self, shard: int) -> float:
        """The largest L2 norm of shard position ``shard``'s stored vectors (0.0 for none), computed
        once per shard (one pass, in chunks): the exact search's tie bound and the theoretical
        score range of fusion (:meth:`retriever.fusion_bounds.LegBounds.dense_norm_max`)."""
        got = self._norms.get(shard)
        if got is None:
            vec = self.vectors[shard]
            got = 0.0
            for lo in range(0, vec.shape[0], 65536):
                b = np.asarray(vec[lo:lo + 65536], dtype=np.float64)
                got = max(got, float(np.sqrt(np.einsum("ij,ij->i", b, b).max(initial=0.0))))
            self._norms[shard] = got
        return got

    @staticmethod
    def _check_faiss_ids(I: np.ndarray, s: Any) -> None:
        """Refuse ids a FAISS file returned outside shard ``s``'s rows (a corrupted index file).

        Raises:
            IndexFormatError: names the file, the id and the rows.
        """
        if I.size and (I.min() < -1 or I.max() >= s.rows):
            bad = int(I.min()) if I.min() < -1 else int(I.max())
            raise IndexFormatError(f"{s.dir / 'dense.faiss'}: returned id {bad}, outside the shard's "
                                   f"{s.rows} rows (corrupted index file)")

    @staticmethod
    def _complete(D: np.ndarray, I: np.ndarray, qp: np.ndarray, exact: np.ndarray | None, need: int,
                  mask: ShardMask | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Replace rows with fewer than ``need`` valid candidates by an exact scan of ``exact``
        (of its rows that pass ``mask`` when one is given)."""
        short = np.flatnonzero((I >= 0).sum(axis=1) < need)
        if len(short) == 0 or exact is None:
            return D, I
        kk = I.shape[1]
        rows = None if mask is None or mask.allow is None else mask.passing()
        src = np.asarray(exact if rows is None else exact[rows], dtype=np.float32)
        for r in short.tolist():
            s = src @ qp[r]
            top = np.argpartition(-s, kk - 1)[:kk] if kk < len(s) else np.arange(len(s))
            I[r, :] = -1
            D[r, :] = -np.inf
            I[r, :len(top)] = top if rows is None else rows[top]
            D[r, :len(top)] = s[top]
        return D, I


def _is_flat(index: Any) -> bool:
    """Whether a CPU FAISS index is an exact flat scan (``IndexFlatIP`` / ``IndexFlat``)."""
    return type(index).__name__ in ("IndexFlatIP", "IndexFlat")


#: extra candidates an exact search takes beyond its depth, so that a group of tied scores at the
#: cut is usually complete at the first try (:meth:`DenseLeg._with_boundary_ties`)
TIE_MARGIN = 8

#: query and document block sizes of :func:`_prefix_scan` (a 2 MiB float32 score block).
SCAN_QUERY_BLOCK = 256
SCAN_DOC_BLOCK = 2048


def _prefix_scan(prefix: np.ndarray, qp: np.ndarray, kk: int, n_threads: int, batch_size: int | None = None,
                 allow: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``kk`` inner products of prefix queries against a shard's prefix matrix.

    Blocks of queries x documents are scored by one BLAS matrix product each (numpy ``matmul``,
    float32) and pushed into per-query running top-``kk`` heaps by the C++ kernel
    ``retriever._kernels.heap_push_block`` (ties: smaller ordinal), so the score matrix is never
    materialised beyond one 2 MiB block. This replaces FAISS ``IndexFlatIP`` for prefix
    candidate generation on CPU (same result up to float32 rounding of the scores).

    Args:
        prefix: float32 C-contiguous (n, d) re-normalised document prefixes.
        qp: float32 C-contiguous (nq, d) re-normalised query prefixes.
        kk: candidates per query, ``1 <= kk <= n``.
        n_threads: threads of the heap kernel.
        batch_size: queries per block (default :data:`SCAN_QUERY_BLOCK`).
        allow: uint8 (n,) mask (0 = never a candidate; the kernel skips those columns), or None;
            with a mask, ``kk`` should not exceed the passing rows (else rows end in -1 / -inf).

    Returns:
        ``(D float32 (nq, kk), I int64 (nq, kk))`` shard-local ordinals, unsorted.
    """
    nq, n = qp.shape[0], prefix.shape[0]
    qb = batch_size or SCAN_QUERY_BLOCK
    D = np.empty((nq, kk), np.float32)
    I = np.empty((nq, kk), np.int64)
    block = np.empty((min(qb, nq), SCAN_DOC_BLOCK), np.float32)
    for b in range(0, nq, qb):
        e = min(nq, b + qb)
        hs = np.full((e - b, kk), -np.inf, np.float32)
        hi = np.full((e - b, kk), -1, np.int64)
        for a in range(0, n, SCAN_DOC_BLOCK):
            z = min(n, a + SCAN_DOC_BLOCK)
            out = block[: e - b] if z - a == SCAN_DOC_BLOCK else np.empty((e - b, z - a), np.float32)
            np.matmul(qp[b:e], prefix[a:z].T, out=out)
            _kernels.heap_push_block(out, a, hs, hi, n_threads, None if allow is None else allow[a:z])
        D[b:e] = hs
        I[b:e] = hi
    return D, I


def _top(ids: np.ndarray, scores: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort rows by (score desc, ordinal asc), padding last, and cut/pad to ``depth`` columns."""
    nq = ids.shape[0]
    valid = ids >= 0
    key_id = np.where(valid, ids, np.iinfo(np.int64).max)
    key_score = np.where(valid, -scores.astype(np.float64), np.inf)
    order = np.lexsort((key_id, key_score), axis=1)[:, :depth]
    out_ids = np.full((nq, depth), -1, np.int64)
    out_scores = np.full((nq, depth), -np.inf, np.float32)
    m = order.shape[1]
    out_ids[:, :m] = np.take_along_axis(ids, order, axis=1)
    out_scores[:, :m] = np.take_along_axis(scores, order, axis=1)
    n_found = np.minimum(valid.sum(axis=1), depth).astype(np.int32)
    pad = np.arange(depth)[None, :] >= n_found[:, None]
    out_ids[pad] = -1
    out_scores[pad] = -np.inf
    return out_ids, out_scores, n_found
