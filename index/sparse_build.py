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

from .config import BuildConfig
from .errors import ConfigError
from .format import read_arrays, sha256_file
from .sparse_index import build_sparse_index, check_doc_vectors, impact_scale
from .writer import IndexWriter

SPARSE_FWD = {"indptr": np.uint64, "terms": np.uint32, "weights": np.float32}


class SparseBuilder:
    """Encodes documents with SPLADE and writes the sparse files of every shard.

    Args:
        config: the build configuration (``config.sparse``).
        device: encoder device.
        vectors: precomputed document vectors instead of running the model: a CSR triple
            ``(indptr (n+1,), term ids (nnz,), weights (nnz,))`` in corpus order, validated by
            :func:`retriever.index.sparse_index.check_doc_vectors` (same policy as query vectors). They must
            come from ``config.sparse.model``: queries are still encoded with it.

    Raises:
        ConfigError: invalid precomputed vectors (names the row and value).
    """

    def __init__(self, config: BuildConfig, device: str = "cpu", vectors: Any = None) -> None:
        from .encoders.sparse import SparseEncoder

        sc = config.sparse
        self.config = sc
        self.encoder = SparseEncoder(sc.model, doc_max_length=sc.doc_max_length,
                                     query_max_length=sc.query_max_length, batch_size=sc.batch_size,
                                     device=device)
        self.vocab_size = self.encoder.vocab_size
        self._vectors: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._pos = 0
        if vectors is not None:
            try:
                ip, t, w = vectors
                self._vectors = check_doc_vectors(ip, t, w, self.vocab_size)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"sparse_vectors: {e}") from None
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._shard_dirs: list[str] = []
        self.max_weight = 0.0
        self.nnz = 0
        self.n_docs = 0

    def model_info(self) -> dict[str, Any]:
        """Model path, name, weight-file SHA-256s and vocabulary size (for the manifest)."""
        path = self.encoder.path
        weights = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
        return {"path": str(path), "name": path.name, "sha256": {p.name: sha256_file(p) for p in weights},
                "vocab_size": self.vocab_size, "pooling": "max", "activation": "log1p(relu)"}

    def add(self, texts: list[str], first_id: str = "?") -> None:
        """Encode a batch of documents, or take their precomputed vectors (kept until the shard
        is flushed). Raises ConfigError when precomputed vectors run out (names ``first_id``)."""
        if self._vectors is None:
            indptr, terms, weights = self.encoder.encode(texts)
        else:
            ip, t, w = self._vectors
            a, b = self._pos, self._pos + len(texts)
            if b > len(ip) - 1:
                raise ConfigError(f"sparse_vectors has fewer rows than the corpus (ran out at document {first_id!r})")
            indptr = ip[a:b + 1] - ip[a]
            terms, weights = t[ip[a]:ip[b]], w[ip[a]:ip[b]]
            self._pos = b
        self._parts.append((indptr, terms, weights))
        if len(weights):
            self.max_weight = max(self.max_weight, float(weights.max()))

    def flush(self, writer: IndexWriter, shard_dir: str) -> dict[str, Any]:
        """Write the just-written shard's ``sparse.arrow`` into ``shard_dir`` (relative to the
        index root) and return fields for its manifest entry (``sparse_nnz``)."""
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
        writer.write_file_arrays(f"{shard_dir}/sparse.arrow", arrays)
        self._shard_dirs.append(shard_dir)
        self.nnz += len(arrays["terms"])
        self.n_docs += len(indptr) - 1
        writer.add_shard_stats(shard_dir, "sparse", {"n_docs": int(len(indptr) - 1), "nnz": int(len(arrays["terms"])),
                                                     "max_weight": shard_max, "vocab_size": int(self.vocab_size)})
        return {"sparse_nnz": int(len(arrays["terms"]))}

    def check_exhausted(self, n_docs: int) -> None:
        """Raise ConfigError when precomputed vectors have more rows than the ``n_docs`` documents."""
        if self._vectors is not None and len(self._vectors[0]) - 1 != self._pos:
            raise ConfigError(f"sparse_vectors has {len(self._vectors[0]) - 1} rows, the corpus {n_docs} documents")

    @property
    def scale(self) -> float:
        """Corpus-wide impact scale (weight per uint16 impact unit) from the largest weight seen so far."""
        return impact_scale(self.max_weight)

    def stats(self) -> dict[str, Any]:
        """Corpus-wide statistics for the manifest's ``stats``."""
        return {"sparse_scale": self.scale, "sparse_vocab_size": self.vocab_size, "sparse_nnz": self.nnz}

    def build_info(self) -> dict[str, Any]:
        """Build information for the manifest's ``build`` section (not statistics)."""
        return {"sparse_precomputed": self._vectors is not None,
                "sparse_truncated_docs": self.encoder.n_truncated,
                "sparse_doc_max_length": self.config.doc_max_length}

    def write_global(self, writer: IndexWriter) -> None:
        """Write every shard's ``sparse_index.arrow`` with the corpus-wide impact scale."""
        sc = self.config
        for d in self._shard_dirs:
            fwd = read_arrays(writer.tmp / d / "sparse.arrow", SPARSE_FWD)
            arrays = build_sparse_index(fwd["indptr"], fwd["terms"], fwd["weights"], n_terms=self.vocab_size,
                                        scale=self.scale, n_postings=sc.n_postings, block_size=sc.block_size,
                                        summary_energy=sc.summary_energy)
            writer.write_file_arrays(f"{d}/sparse_index.arrow", arrays)
            writer.shard_stats[d]["sparse"]["scale"] = self.scale
