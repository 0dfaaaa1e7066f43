"""Learned-sparse leg at build time: SPLADE encoding per batch, per-shard vectors, global postings.

Files (per shard ``shards/NNNNN/``):
  ``sparse.arrow``        the model's float32 vectors: ``indptr`` u64[n+1], ``terms`` u32[nnz]
                          (ascending per document), ``weights`` f32[nnz] (written at shard flush);
  ``sparse_index.arrow``  query-time arrays (see :func:`retriever.index.sparse_index.build_sparse_index`):
                          forward index (u16 values), postings (u16 impacts), Seismic blocks,
                          summaries inverted per term and the packed forward copy
                          (``retriever.legs.sparse.SPARSE_INDEX_ARRAYS`` lists the arrays). Written once all shards are known, because the impact scale
                          is global (max weight of the corpus / 65535): exact scores therefore do
                          not depend on the shard layout.
The manifest's ``stats`` carries ``sparse_scale``, ``sparse_vocab_size`` and ``sparse_nnz``; its
``build`` section ``sparse_truncated_docs`` (documents longer than ``doc_max_length`` tokens,
truncated), ``sparse_precomputed`` and ``sparse_doc_max_length``. Each shard's ``stats.json`` has a
``sparse`` section: ``n_docs``, ``nnz``, ``max_weight`` (the shard's largest float weight: the
scale is ``max over shards / 65535``), ``vocab_size`` and the ``scale`` its impacts use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .builders import Batch, IndexOutput, ShardHandle, ShardOutput
from .config import BuildConfig
from .errors import ConfigError
from .format import read_arrays, sha256_file
from .sparse_index import build_sparse_index, check_doc_vectors, impact_scale

SPARSE_FWD = {"indptr": np.uint64, "terms": np.uint32, "weights": np.float32}


class SparseBuilder:
    """The learned-sparse leg's builder (:class:`retriever.index.builders.LegBuilder`): SPLADE
    encoding per batch, ``sparse.arrow`` per shard, and ``sparse_index.arrow`` per shard once the
    impact scale is known.

    Args:
        config: the build configuration (``config.sparse``).
        device: encoder device.
        vectors: precomputed document vectors instead of running the model: a CSR triple
            ``(indptr (n+1,), term ids (nnz,), weights (nnz,))`` in corpus order, validated by
            :func:`retriever.index.sparse_index.check_doc_vectors` (same policy as query vectors). They must
            come from ``config.sparse.model``: queries are still encoded with it.
        scale: a fixed impact scale (weight per uint16 unit; weights above ``65535 * scale``
            are clipped). With it each shard is complete when :meth:`finish_shard` returns (what
            adding a shard to an existing index needs); without it (a build) the scale is the
            corpus-wide maximum weight / 65535, so every shard's ``sparse_index.arrow`` is written
            by :meth:`finish`, and exact scores do not depend on the shard layout.

    Raises:
        ConfigError: invalid precomputed vectors (names the row and value).
    """

    name = "sparse"

    def __init__(self, config: BuildConfig, device: str = "cpu", vectors: Any = None,
                 scale: float | None = None) -> None:
        import time

        from .encoders.sparse import SparseEncoder

        sc = config.sparse
        self.config = sc
        t0 = time.perf_counter()
        self.encoder = SparseEncoder(sc.model, doc_max_length=sc.doc_max_length,
                                     query_max_length=sc.query_max_length, batch_size=sc.batch_size,
                                     device=device)
        self.model_load_seconds = time.perf_counter() - t0
        self.encode_seconds = 0.0
        self.vocab_size = self.encoder.vocab_size
        self._vectors: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._pos = 0
        if vectors is not None:
            try:
                ip, t, w = vectors
                self._vectors = check_doc_vectors(ip, t, w, self.vocab_size)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"sparse_vectors: {e}") from None
        if scale is not None and not (isinstance(scale, float) and scale > 0):
            raise ConfigError(f"sparse scale must be a float > 0, got {scale!r}")
        self.fixed_scale = scale
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._deferred: list[str] = []
        self.max_weight = 0.0
        self.nnz = 0
        self.n_docs = 0

    def model_info(self) -> dict[str, Any]:
        """Model path, name, weight-file SHA-256s and vocabulary size (for the manifest)."""
        path = self.encoder.path
        weights = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
        return {"path": str(path), "name": path.name, "sha256": {p.name: sha256_file(p) for p in weights},
                "vocab_size": self.vocab_size, "pooling": "max", "activation": "log1p(relu)"}

    @property
    def precomputed(self) -> bool:
        """True when the document vectors were given (the model was not run on documents)."""
        return self._vectors is not None

    def add(self, batch: Batch) -> None:
        """Encode a batch of documents, or take their precomputed vectors (kept until the shard
        is finished). Raises ConfigError when precomputed vectors run out (names the batch's first id)."""
        if self._vectors is None:
            import time

            t0 = time.perf_counter()
            indptr, terms, weights = self.encoder.encode(batch.texts)
            self.encode_seconds += time.perf_counter() - t0
        else:
            ip, t, w = self._vectors
            a, b = self._pos, self._pos + len(batch.texts)
            if b > len(ip) - 1:
                raise ConfigError(f"sparse_vectors has fewer rows than the corpus (ran out at document {batch.first_id!r})")
            indptr = ip[a:b + 1] - ip[a]
            terms, weights = t[ip[a]:ip[b]], w[ip[a]:ip[b]]
            self._pos = b
        self._parts.append((indptr, terms, weights))
        if len(weights):
            self.max_weight = max(self.max_weight, float(weights.max()))

    def end_shard(self) -> None:
        """Nothing to start: the shard's vectors are written in :meth:`finish_shard`."""

    def finish_shard(self, writer: Any, shard: ShardHandle) -> ShardOutput:
        """Write the shard's ``sparse.arrow`` (and, with a fixed scale, ``sparse_index.arrow``)."""
        ptrs, terms, weights = [np.zeros(1, np.int64)], [], []
        base = 0
        for ip, t, w in self._parts:
            ptrs.append(ip[1:] + base)
            base += int(ip[-1])
            terms.append(t)
            weights.append(w)
        shard_max = max((float(w.max()) for _, _, w in self._parts if len(w)), default=0.0)
        self._parts = []
        indptr = np.concatenate(ptrs).astype(np.uint64)
        arrays = {"indptr": indptr,
                  "terms": np.concatenate(terms).astype(np.uint32) if terms else np.zeros(0, np.uint32),
                  "weights": np.concatenate(weights) if weights else np.zeros(0, np.float32)}
        files = [writer.write_arrays(f"{shard.dir}/sparse.arrow", arrays)]
        nnz = int(len(arrays["terms"]))
        self.nnz += nnz
        self.n_docs += len(indptr) - 1
        stats = {"n_docs": int(len(indptr) - 1), "nnz": nnz, "max_weight": shard_max, "vocab_size": int(self.vocab_size)}
        if self.fixed_scale is not None:
            files.append(self._write_index(writer, shard.dir, arrays, self.fixed_scale))
            stats["scale"] = self.fixed_scale
        else:
            self._deferred.append(shard.dir)
        return ShardOutput(files=files, stats=stats, entry={"sparse_nnz": nnz})

    def _write_index(self, writer: Any, shard_dir: str, fwd: dict[str, np.ndarray], scale: float) -> str:
        sc = self.config
        arrays = build_sparse_index(fwd["indptr"], fwd["terms"], fwd["weights"], n_terms=self.vocab_size,
                                    scale=scale, n_postings=sc.n_postings, block_size=sc.block_size,
                                    summary_energy=sc.summary_energy)
        return writer.write_arrays(f"{shard_dir}/sparse_index.arrow", arrays)

    @property
    def scale(self) -> float:
        """The impact scale: the fixed one, or the corpus-wide one from the largest weight seen so far."""
        return self.fixed_scale if self.fixed_scale is not None else impact_scale(self.max_weight)

    def finish(self, writer: Any, n_docs: int) -> IndexOutput:
        """Check precomputed vectors are used up; write the deferred shards' ``sparse_index.arrow``
        with the corpus-wide scale; ``sparse_scale``, ``sparse_vocab_size``, ``sparse_nnz``."""
        if self._vectors is not None and len(self._vectors[0]) - 1 != self._pos:
            raise ConfigError(f"sparse_vectors has {len(self._vectors[0]) - 1} rows, the corpus {n_docs} documents")
        scale = self.scale
        for d in self._deferred:
            fwd = read_arrays(writer.tmp / d / "sparse.arrow", SPARSE_FWD)
            self._write_index(writer, d, fwd, scale)
            writer.shard_stats[d]["sparse"]["scale"] = scale
        self._deferred = []
        build: dict[str, Any] = {"sparse_precomputed": self.precomputed,
                                 "sparse_truncated_docs": self.encoder.n_truncated,
                                 "sparse_doc_max_length": self.config.doc_max_length,
                                 "model_load_seconds": self.model_load_seconds}
        if not self.precomputed:
            build["encode_seconds"] = self.encode_seconds
        return IndexOutput(stats={"sparse_scale": scale, "sparse_vocab_size": self.vocab_size, "sparse_nnz": self.nnz},
                           build=build, model=self.model_info())

    def close(self, *, raise_errors: bool = True) -> None:
        """Drop the queued vectors."""
        self._parts = []
