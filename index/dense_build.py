"""The dense leg's builder: one pipeline for encoded and precomputed vectors, Matryoshka an option.

Per batch, the vectors come from the encoder or from precomputed vectors (:class:`VectorFeed`) and
are checked for NaN / inf. Per shard, the vectors are rotated when Matryoshka dims are set and the
model is not MRL-trained (the PCA rotation is fitted on the first shard, see
:mod:`retriever.index.matryoshka`). They are then cast to the storage dtype (float16 falls back
to float32 from the first shard whose values it cannot hold), written as ``dense.arrow`` and,
for factory strings other than ``"Flat"``, indexed by FAISS (``dense.faiss``). After the last
shard the rotation file and the ``matryoshka`` manifest entry are written.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from .builders import Batch, IndexOutput, ShardHandle, ShardOutput
from .config import DenseConfig
from .errors import ConfigError
from .format import sha256_file
from .matryoshka import MatryoshkaBuilder


def model_fingerprint(path: Path) -> dict[str, Any]:
    """Path, name and the SHA-256 of each weight file of a model directory (for the manifest)."""
    weights = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    return {"path": str(path), "name": path.name, "sha256": {p.name: sha256_file(p) for p in weights}}


class VectorFeed:
    """Precomputed dense vectors handed out in corpus order (an array, or an iterable of rows or
    2-D blocks).

    Raises:
        ConfigError: not an array or an iterable, or an array that is not 2-D.
    """

    def __init__(self, src: Any) -> None:
        if isinstance(src, (str, bytes, dict)) or not (isinstance(src, np.ndarray) or hasattr(src, "__iter__")):
            raise ConfigError(f"dense_vectors must be a 2-D array or an iterable of rows/blocks, "
                              f"got {type(src).__name__}")
        self._arr = src if isinstance(src, np.ndarray) else None
        self._it = None if self._arr is not None else iter(src)
        self._buf: list[np.ndarray] = []
        self._pos = 0
        self.taken = 0
        self.dim: int | None = None
        if self._arr is not None and self._arr.ndim != 2:
            raise ConfigError(f"dense_vectors must be 2-D (n_docs, dim), got shape {self._arr.shape}")

    def _pull(self, m: int) -> np.ndarray:
        if self._arr is not None:
            out = self._arr[self._pos:self._pos + m]
            self._pos += len(out)
            return out
        have = sum(len(b) for b in self._buf)
        while have < m:
            nxt = next(self._it, None)  # type: ignore[arg-type]
            if nxt is None:
                break
            nxt = np.asarray(nxt)
            nxt = nxt[None, :] if nxt.ndim == 1 else nxt
            self._buf.append(nxt)
            have += len(nxt)
        if not self._buf:
            return np.zeros((0, self.dim or 0), np.float32)
        cat = np.concatenate(self._buf) if len(self._buf) > 1 else self._buf[0]
        self._buf = [cat[m:]] if len(cat) > m else []
        return cat[:m]

    def take(self, m: int, ids: Sequence[str]) -> np.ndarray:
        """The next ``m`` rows as float32 (m, dim), for the documents ``ids`` (used in errors).

        Raises:
            ConfigError: too few rows (names the first document without a vector), rows that are
                not 1-D of one width ≥ 1, or values that are not numbers.
        """
        rows = self._pull(m)
        if len(rows) < m:
            raise ConfigError(f"dense_vectors has fewer rows than the corpus (ran out at document "
                              f"{ids[len(rows)]!r}, position {self.taken + len(rows)} counting from 0)")
        if rows.ndim != 2 or (self.dim is not None and rows.shape[1] != self.dim) or rows.shape[1] == 0:
            raise ConfigError(f"dense_vectors rows have shape {rows.shape[1:]}, expected "
                              f"({self.dim if self.dim is not None else 'dim >= 1'},)")
        if rows.dtype.kind not in "iuf":
            raise ConfigError(f"dense_vectors must hold numbers, got dtype {rows.dtype}")
        self.dim = int(rows.shape[1])
        self.taken += m
        return np.asarray(rows, dtype=np.float32)

    def exhausted(self) -> bool:
        """True when no record is left to read."""
        return len(self._pull(1)) == 0


class DenseBuilder:
    """The dense leg's builder (:class:`retriever.index.builders.LegBuilder`).

    Args:
        config: the dense settings (model, dtype, FAISS factory, Matryoshka dims...).
        faults: fault-injection hook (``encode_dense``, ``faiss``, ``shard_dense``, ``shard_faiss``).
        device: encoder device.
        vectors: precomputed vectors instead of the model (see :class:`VectorFeed`).
        model_info: the manifest's ``models.dense`` entry for precomputed vectors (default
            ``{"path": None, "name": "precomputed", "precomputed": True}``; ``"dim"`` is added).

    Raises:
        ModelError: the model cannot be loaded. ConfigError: bad precomputed vectors.
    """

    name = "dense"

    def __init__(self, config: DenseConfig, faults: Callable[[str], None], *, device: str = "cpu",
                 vectors: Any = None, model_info: dict[str, Any] | None = None) -> None:
        self.config = config
        self._faults = faults
        self.feed = VectorFeed(vectors) if vectors is not None else None
        self.encoder = None
        self.model_load_seconds = 0.0
        self.encode_seconds = 0.0
        self._model_info = model_info
        if self.feed is None:
            from .encoders.dense import DenseEncoder

            t0 = time.perf_counter()
            self.encoder = DenseEncoder(config.model, max_length=config.max_length, batch_size=config.batch_size,
                                        device=device, normalize=config.normalize, precision=config.precision)
            self._model_info = {**model_fingerprint(self.encoder.path), "dim": self.encoder.dim}
            self.model_load_seconds = time.perf_counter() - t0
        self.mat: MatryoshkaBuilder | None = None
        #: serialised FAISS index whose trained state (coarse quantiser, PQ codebooks) new
        #: segments reuse: emptied, then filled with the segment's vectors (None: train per shard)
        self.faiss_template: bytes | None = None
        self._parts: list[np.ndarray] = []
        if self.encoder is not None:
            self._storage()  # Matryoshka dims wider than the model fail now, before any encoding

    @property
    def dim(self) -> int | None:
        """The vectors' dimension (known once the first batch is in, or from the model)."""
        return self.encoder.dim if self.encoder is not None else self.feed.dim  # type: ignore[union-attr]

    def _storage(self) -> MatryoshkaBuilder:
        if self.mat is None:
            c = self.config
            self.mat = MatryoshkaBuilder(int(self.dim or 0), c.matryoshka_dims, mrl_trained=c.mrl_trained,
                                         dtype=c.dtype, rotation_sample=c.rotation_sample)
        return self.mat

    def add(self, batch: Batch) -> None:
        """Encode one batch (or take its precomputed vectors); raises ConfigError on NaN / inf
        (naming the first such document) or Matryoshka dims wider than the vectors."""
        if self.feed is not None:
            vecs = self.feed.take(len(batch.docs), [d.id for d in batch.docs])
            dims = self.config.matryoshka_dims
            if dims and max(dims) > vecs.shape[1]:
                raise ConfigError(f"matryoshka_dims {tuple(dims)} exceed the dimension {vecs.shape[1]} of dense_vectors")
        else:
            t0 = time.perf_counter()
            vecs = self.encoder.encode([self.config.document_prefix + t for t in batch.texts])  # type: ignore[union-attr]
            self.encode_seconds += time.perf_counter() - t0
        finite = np.isfinite(vecs).all(axis=1)
        if not finite.all():
            bad = np.flatnonzero(~finite)
            src = "dense_vectors has" if self.feed is not None else "the dense encoder produced"
            raise ConfigError(f"{src} NaN or inf in the vector of document {batch.docs[int(bad[0])].id!r}"
                              f"{f' (and {len(bad) - 1} more in its batch)' if len(bad) > 1 else ''}")
        self._parts.append(np.asarray(vecs, dtype=np.float32))
        self._faults("encode_dense")

    def end_shard(self) -> None:
        """Nothing to start: the shard's vectors are stored in :meth:`finish_shard`."""

    def finish_shard(self, writer: Any, shard: ShardHandle) -> ShardOutput:
        """Rotate (Matryoshka), cast to the storage dtype, write ``dense.arrow`` (and ``dense.faiss``)."""
        vectors = np.concatenate(self._parts) if self._parts else np.zeros((0, self.dim or 0), np.float32)
        self._parts = []
        if vectors.shape[0] != shard.rows:
            raise RuntimeError(f"internal error: {vectors.shape[0]} vectors for {shard.rows} rows")
        stored = self._storage().transform(vectors)
        files = []
        index_bytes = None
        if self.config.faiss_factory != "Flat":
            from .faiss_build import build_faiss_index, fill_faiss_template

            if self.faiss_template is not None:  # a living index's add: the trained quantiser, emptied
                index_bytes = fill_faiss_template(self.faiss_template, stored.astype(np.float32))
            else:
                index_bytes = build_faiss_index(stored.astype(np.float32), self.config.faiss_factory)
            self._faults("faiss")
        flat = pa.array(np.ascontiguousarray(stored).reshape(-1))
        files.append(writer.write_table(f"{shard.dir}/dense.arrow",
                                        pa.table({"vector": pa.FixedSizeListArray.from_arrays(flat, stored.shape[1])})))
        self._faults("shard_dense")
        if index_bytes is not None:
            files.append(writer.write_bytes(f"{shard.dir}/dense.faiss", index_bytes))
            self._faults("shard_faiss")
        return ShardOutput(files=files, stats={"count": shard.rows, "dim": int(stored.shape[1]), "dtype": str(stored.dtype)})

    def finish(self, writer: Any, n_docs: int) -> IndexOutput:
        """Write the Matryoshka rotation (when one was fitted); ``dense_dim`` / ``dense_dtype``."""
        if self.feed is not None and not self.feed.exhausted():
            raise ConfigError(f"dense_vectors has more rows than the corpus ({n_docs} documents)")
        mat = self._storage()
        out = IndexOutput(stats={"dense_dim": self.dim, "dense_dtype": mat.dtype},
                          config={"dtype": mat.dtype})
        if self.encoder is not None:
            out.build = {"dense_truncated_docs": self.encoder.n_truncated,
                         "model_load_seconds": self.model_load_seconds, "encode_seconds": self.encode_seconds}
            out.model = self._model_info
        else:
            out.build = {"dense_truncated_docs": 0}
            info = self._model_info if self._model_info is not None else \
                {"path": None, "name": "precomputed", "precomputed": True}
            out.model = {**info, "dim": self.dim}
        if mat.dims:
            out.extra["matryoshka"] = mat.finish(writer)
        return out

    def close(self, *, raise_errors: bool = True) -> None:
        """Drop the queued vectors."""
        self._parts = []
