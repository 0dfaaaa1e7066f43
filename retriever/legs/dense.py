"""Dense leg: query encoding and FAISS inner-product search per shard (GPU when available).

Vectors are stored once in each shard's ``dense.arrow`` (float16 or float32). The default
``"Flat"`` factory builds an exact ``IndexFlatIP`` from them at open time; other factory strings
(IVF, HNSW, PQ...) were trained at build time and are read from ``dense.faiss``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from index.encoders.dense import DenseEncoder
from index.errors import IndexFormatError, QueryError
from index.format import read_table

from ..shards import IndexReader

log = logging.getLogger(__name__)


def load_vectors(path, rows: int, dim: int) -> np.ndarray:
    """Read a shard's ``dense.arrow`` as a (rows, dim) float16/float32 view (zero-copy).

    Raises:
        IndexFormatError: wrong shape or dtype (names the file).
    """
    import pyarrow as pa

    t = read_table(path)
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


class DenseLeg:
    """Dense leg of an opened index.

    Args:
        reader: the opened index.
        use_gpu: move FAISS indexes to GPU (``None`` = when ``faiss.get_num_gpus() > 0``).
        device: torch device for the query encoder.
    """

    name = "dense"

    def __init__(self, reader: IndexReader, *, use_gpu: bool | None = None, device: str = "cpu") -> None:
        import faiss

        self.reader = reader
        self.config = reader.config.dense
        self.dim = int(reader.manifest["stats"].get("dense_dim", 0))
        self.model_path = reader.manifest.get("models", {}).get("dense", {}).get("path")
        self.device = device
        self._encoder: DenseEncoder | None = None
        self._lock = threading.Lock()
        if use_gpu is None:
            use_gpu = faiss.get_num_gpus() > 0
        self.use_gpu = bool(use_gpu) and faiss.get_num_gpus() > 0
        self.vectors: list[np.ndarray] = []
        self.indexes: list[Any] = []
        for s in reader.shards:
            vec = load_vectors(s.dir / "dense.arrow", s.rows, self.dim)
            self.vectors.append(vec)
            if (s.dir / "dense.faiss").is_file():
                try:
                    index = faiss.read_index(str(s.dir / "dense.faiss"))
                except RuntimeError as e:
                    raise IndexFormatError(f"{s.dir / 'dense.faiss'}: unreadable FAISS index ({e})") from None
                if index.d != self.dim or index.ntotal != s.rows:
                    raise IndexFormatError(f"{s.dir / 'dense.faiss'}: d={index.d} ntotal={index.ntotal}, "
                                           f"expected d={self.dim} ntotal={s.rows}")
            else:
                index = faiss.IndexFlatIP(self.dim)
                if s.rows:
                    index.add(np.ascontiguousarray(vec, dtype=np.float32))
            if self.use_gpu:
                index = faiss.index_cpu_to_all_gpus(index)
            self.indexes.append(index)

    @property
    def encoder(self) -> DenseEncoder:
        """The query encoder, loaded on first use from the model recorded in the manifest."""
        with self._lock:
            if self._encoder is None:
                cfg = self.config
                self._encoder = DenseEncoder(self.model_path, max_length=cfg.max_length,
                                             batch_size=cfg.batch_size, device=self.device,
                                             normalize=cfg.normalize)
                if self._encoder.dim != self.dim:
                    raise IndexFormatError(f"dense model {self.model_path} has dim {self._encoder.dim}, "
                                           f"index has {self.dim}")
            return self._encoder

    def prepare(self, queries: list[str]) -> np.ndarray:
        """Leg interface: encode the batch."""
        return self.encode(queries)

    def encode(self, queries: list[str]) -> np.ndarray:
        """float32 (nq, dim) query vectors."""
        return self.encoder.encode([self.config.query_prefix + q for q in queries])

    def check_vectors(self, qv: np.ndarray) -> np.ndarray:
        """Validate user-supplied query vectors.

        Raises:
            QueryError: wrong shape or non-finite values.
        """
        qv = np.asarray(qv, dtype=np.float32)
        if qv.ndim == 1:
            qv = qv[None, :]
        if qv.ndim != 2 or qv.shape[1] != self.dim:
            raise QueryError(f"query vectors must have shape (nq, {self.dim}), got {qv.shape}")
        if not np.isfinite(qv).all():
            raise QueryError("query vectors contain NaN or inf")
        return np.ascontiguousarray(qv)

    def search(self, qv: np.ndarray, depth: int, n_threads: int = 0, params: Any = None):
        """Top-``depth`` per shard as ``(ids global int64, scores float32, n_found int32)``."""
        parts = []
        nq = qv.shape[0]
        for s, index in zip(self.reader.shards, self.indexes):
            kk = min(depth, s.rows)
            if kk == 0 or nq == 0:
                parts.append((np.full((nq, depth), -1, np.int64), np.full((nq, depth), -np.inf, np.float32),
                              np.zeros(nq, np.int32)))
                continue
            D, I = index.search(qv, kk, params=params) if params is not None else index.search(qv, kk)
            valid = I >= 0
            ids = np.full((nq, depth), -1, np.int64)
            scores = np.full((nq, depth), -np.inf, np.float32)
            ids[:, :kk] = np.where(valid, I + s.base, -1)
            scores[:, :kk] = np.where(valid, D, -np.inf)
            # Canonical tie order inside the shard list: score desc, then ordinal asc.
            key_id = np.where(ids >= 0, ids, np.iinfo(np.int64).max)
            order = np.lexsort((key_id, -scores.astype(np.float64)), axis=1)
            ids = np.take_along_axis(ids, order, axis=1)
            scores = np.take_along_axis(scores, order, axis=1)
            parts.append((ids, scores, (ids >= 0).sum(axis=1).astype(np.int32)))
        return parts
