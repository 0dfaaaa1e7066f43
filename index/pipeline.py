"""``build_index``: corpus reader → analyzer and encoders → shard writer → atomic commit."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .analyzer import Analyzer
from .bm25_build import PostingsBuilder
from .config import BuildConfig, DenseConfig
from .errors import ConfigError, CorpusError
from .metadata import MetadataColumns
from .readers import Document, read_corpus
from .testhooks import crash_point
from .writer import IndexWriter, check_target

log = logging.getLogger(__name__)

FLOAT16_MAX = 65504.0


def _model_fingerprint(path: Path) -> dict[str, Any]:
    from .format import sha256_file

    weights = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    return {"path": str(path), "name": path.name,
            "sha256": {p.name: sha256_file(p) for p in weights}}


def _dense_store(vectors: np.ndarray, dtype: str, first_id: str) -> np.ndarray:
    if not np.isfinite(vectors).all():
        raise ConfigError(f"dense encoder produced NaN/inf (batch starting at document {first_id!r})")
    if dtype == "float16":
        return vectors.astype(np.float16)
    return vectors.astype(np.float32)


def _batches(docs: Iterable[Document], config: BuildConfig):
    """Yield ``(batch, end_of_shard)``: lists of documents that never cross a shard boundary; the
    last batch of the corpus always ends its shard (one batch of lookahead makes that true even
    when the corpus size is a multiple of ``batch_size``)."""
    def raw():
        batch: list[Document] = []
        in_shard = 0
        for d in docs:
            batch.append(d)
            in_shard += 1
            if len(batch) >= config.batch_size or in_shard >= config.shard_size:
                yield batch, in_shard >= config.shard_size
                batch = []
                if in_shard >= config.shard_size:
                    in_shard = 0
        if batch:
            yield batch, True

    pending = None
    for item in raw():
        if pending is not None:
            yield pending
        pending = item
    if pending is not None:
        yield pending[0], True


class _VectorFeed:
    """Precomputed dense vectors handed out in corpus order (an array, or an iterable of rows or
    2-D blocks)."""

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


def build_index(corpus: str | Path | Iterable[Mapping[str, Any]], out: str | Path,
                config: BuildConfig | None = None, *, overwrite: bool = False,
                show_progress: bool = True, dense_vectors: Any = None, sparse_vectors: Any = None,
                **overrides: Any) -> dict[str, Any]:
    """Build an index directory from a corpus.

    Args:
        corpus: BEIR folder, JSONL(.gz) / Parquet / CSV file, or an iterable of dicts with
            ``_id`` (or ``id``), ``text`` and optional ``title`` (other fields become metadata).
        out: index directory to create (atomically).
        config: build configuration; keyword ``overrides`` replace its top-level fields
            (e.g. ``legs=("bm25",)``, ``shard_size=1000``, ``device="cuda"``).
        overwrite: replace an existing index at ``out`` (atomic swap).
        show_progress: tqdm progress bar on stderr.
        dense_vectors: precomputed document vectors for the dense leg instead of running the
            model: a float array (n_docs, dim) or an iterable of rows / 2-D blocks, in corpus
            order. Stored exactly like encoded vectors (``config.dense.dtype``; not re-normalised).
            The manifest records the dense model as ``"precomputed"``; search such an index's dense
            leg with ``query_vectors=``. Needs ``"dense"`` in ``legs``.
        sparse_vectors: precomputed SPLADE document vectors for the sparse leg instead of running
            the model: a CSR triple ``(indptr (n+1,), term ids (nnz,), weights (nnz,))`` in corpus
            order (e.g. from ``SparseEncoder.encode``), validated like query vectors (unsorted
            indices fine; duplicates, ids outside the vocabulary, NaN/inf, negative weights are
            errors; zeros dropped). They must come from ``config.sparse.model`` (queries are
            encoded with it); the manifest's ``stats.sparse_precomputed`` says they were supplied.
            Needs ``"sparse"`` in ``legs``.

    Returns:
        the manifest (dict) of the new index.

    Raises:
        CorpusError: bad record (names file, line, field), duplicate id, or empty corpus.
        ModelError: dense model path missing or unloadable.
        IndexExistsError: ``out`` exists and ``overwrite`` is False.
        ConfigError: invalid configuration.
    On any error nothing is left at ``out`` (an existing index there is untouched).
    """
    import dataclasses

    config = config or BuildConfig()
    if overrides:
        try:
            config = dataclasses.replace(config, **overrides)
        except TypeError as e:
            raise ConfigError(str(e)) from None
    out = Path(out)
    check_target(out, overwrite)
    t0 = time.perf_counter()
    documents = read_corpus(corpus)  # a missing or unknown corpus fails here, before models load

    analyzer = Analyzer(config.analyzer) if "bm25" in config.legs else None
    postings = PostingsBuilder(analyzer) if analyzer is not None else None
    t_load = time.perf_counter()
    dense_enc = None
    model_info: dict[str, Any] = {}
    feed = None
    if dense_vectors is not None:
        if "dense" not in config.legs:
            raise ConfigError("dense_vectors given but 'dense' is not in legs")
        feed = _VectorFeed(dense_vectors)
    elif "dense" in config.legs:
        from .encoders.dense import DenseEncoder

        dc: DenseConfig = config.dense
        dense_enc = DenseEncoder(dc.model, max_length=dc.max_length, batch_size=dc.batch_size,
                                 device=config.device, normalize=dc.normalize, precision=dc.precision)
        model_info["dense"] = {**_model_fingerprint(dense_enc.path), "dim": dense_enc.dim}
    mat = None
    if dense_enc is not None and config.dense.matryoshka_dims:
        from .matryoshka import MatryoshkaBuilder  # rotation fitted on the first shard, applied to all

        mat = MatryoshkaBuilder(dense_enc.dim, config.dense.matryoshka_dims, mrl_trained=config.dense.mrl_trained,
                                dtype=config.dense.dtype, rotation_sample=config.dense.rotation_sample)
    sparse_builder = None
    if sparse_vectors is not None and "sparse" not in config.legs:
        raise ConfigError("sparse_vectors given but 'sparse' is not in legs")
    if "sparse" in config.legs:
        from .sparse_build import SparseBuilder  # provided by the learned-sparse leg

        sparse_builder = SparseBuilder(config, device=config.device, vectors=sparse_vectors)
        model_info["sparse"] = sparse_builder.model_info()
    model_load_s = time.perf_counter() - t_load
    encode_s = {"dense": 0.0, "sparse": 0.0}

    seen: set[str] = set()
    n_docs = 0
    dense_dtype = config.dense.dtype
    meta_cols = MetadataColumns()
    shard_docs: dict[str, list] = {"ids": [], "titles": [], "texts": [], "records": []}
    shard_dense: list[np.ndarray] = []
    progress = None
    if show_progress:
        from tqdm import tqdm
        progress = tqdm(desc="indexing", unit="doc")

    with IndexWriter(out, overwrite=overwrite) as writer:
        try:
            for batch, end_of_shard in _batches(documents, config):
                for d in batch:
                    if d.id in seen:
                        raise CorpusError(f"duplicate document id {d.id!r}", path=d.path, line=d.line, field="_id")
                    seen.add(d.id)
                crash_point("read")
                full = [f"{d.title} {d.text}" if d.title else d.text for d in batch]
                shard_docs["ids"].extend(d.id for d in batch)
                shard_docs["titles"].extend(d.title for d in batch)
                shard_docs["texts"].extend(d.text for d in batch)
                shard_docs["records"].extend(batch)
                if postings is not None:
                    postings.add(full)
                    crash_point("encode_bm25")
                if dense_enc is not None or feed is not None:
                    if feed is not None:
                        vecs = feed.take(len(batch), [d.id for d in batch])
                        dims = config.dense.matryoshka_dims
                        if dims and max(dims) > vecs.shape[1]:
                            raise ConfigError(f"matryoshka_dims {tuple(dims)} exceed the dimension "
                                              f"{vecs.shape[1]} of dense_vectors")
                    else:
                        t_enc = time.perf_counter()
                        vecs = dense_enc.encode([config.dense.document_prefix + t for t in full])
                        encode_s["dense"] += time.perf_counter() - t_enc
                    if mat is not None:  # stored dtype chosen after the rotation, in _flush
                        shard_dense.append(_dense_store(vecs, "float32", batch[0].id))
                    elif dense_dtype == "float16" and np.abs(vecs).max(initial=0.0) > FLOAT16_MAX:
                        log.warning("dense values exceed float16 range; storing float32")
                        dense_dtype = "float32"
                        shard_dense = [v.astype(np.float32) for v in shard_dense]
                    if mat is None:
                        shard_dense.append(_dense_store(vecs, dense_dtype, batch[0].id))
                    crash_point("encode_dense")
                if sparse_builder is not None:
                    t_enc = time.perf_counter()
                    sparse_builder.add(full, batch[0].id)
                    encode_s["sparse"] += time.perf_counter() - t_enc
                n_docs += len(batch)
                if progress is not None:
                    progress.update(len(batch))
                if end_of_shard:
                    _flush(writer, shard_docs, meta_cols, postings, shard_dense, sparse_builder, config, mat)
                    shard_docs = {"ids": [], "titles": [], "texts": [], "records": []}
                    shard_dense = []
            if n_docs == 0:
                raise CorpusError("corpus is empty (no documents)",
                                  path=None if not isinstance(corpus, (str, Path)) else corpus)
            stats: dict[str, Any] = {"n_docs": n_docs}
            build: dict[str, Any] = {"build_seconds": None}
            if postings is not None:
                writer.write_vocab(postings.terms)
                stats.update(n_terms=len(postings.terms), sum_dl=postings.sum_dl)
            if dense_enc is not None:
                stats.update(dense_dim=dense_enc.dim, dense_dtype=dense_dtype)
                build.update(dense_truncated_docs=dense_enc.n_truncated)
            if feed is not None:
                if not feed.exhausted():
                    raise ConfigError(f"dense_vectors has more rows than the corpus ({n_docs} documents)")
                stats.update(dense_dim=feed.dim, dense_dtype=dense_dtype)
                build.update(dense_truncated_docs=0)
                model_info["dense"] = {"path": None, "name": "precomputed", "precomputed": True, "dim": feed.dim}
            if sparse_builder is not None:
                sparse_builder.check_exhausted(n_docs)
                stats.update(sparse_builder.stats())
                build.update(sparse_builder.build_info())
                sparse_builder.write_global(writer)
            extra: dict[str, Any] = {"models": model_info}
            if mat is not None:
                extra["matryoshka"] = mat.finish(writer)
                dense_dtype = mat.dtype
                stats["dense_dtype"] = dense_dtype
            if postings is not None:
                postings.close()
            build["build_seconds"] = round(time.perf_counter() - t0, 3)
            if dense_enc is not None or (sparse_builder is not None and sparse_vectors is None):
                # model loading (checkpoint + tokenizer + weight hashes) and time inside the
                # encoders' encode calls, so a reader can split build_seconds
                build["model_load_seconds"] = round(model_load_s, 3)
                build["encode_seconds"] = {k: round(v, 3) for k, v in encode_s.items()
                                           if (k == "dense" and dense_enc is not None)
                                           or (k == "sparse" and sparse_builder is not None and sparse_vectors is None)}
            cfg = config.to_dict()
            cfg["dense"]["dtype"] = dense_dtype
            return writer.commit(build_config=cfg, stats=stats, build=build, extra=extra)
        except BaseException:
            if postings is not None:  # stop the analysis thread; the error being raised wins
                postings.close(raise_errors=False)
            raise
        finally:
            if progress is not None:
                progress.close()


def _flush(writer: IndexWriter, docs: dict[str, list], meta_cols: MetadataColumns, postings: PostingsBuilder | None,
           dense: list[np.ndarray], sparse_builder: Any, config: BuildConfig, mat: Any = None) -> None:
    vectors = np.concatenate(dense) if dense else None
    if vectors is not None and mat is not None:
        vectors = mat.transform(vectors)
    faiss_bytes = None
    if vectors is not None and config.dense.faiss_factory != "Flat":
        from .faiss_build import build_faiss_index

        faiss_bytes = build_faiss_index(vectors.astype(np.float32), config.dense.faiss_factory)
        crash_point("faiss")
    # the postings' counting sort runs on the analysis thread while the docs table is written
    entry = writer.write_shard(ids=docs["ids"], titles=docs["titles"], texts=docs["texts"],
                               metadata=meta_cols.columns(docs["records"]),
                               bm25=postings.flush_async().result if postings is not None else None,
                               dense=vectors, dense_index=faiss_bytes)
    if sparse_builder is not None:  # writes into the shard's directory, adds manifest fields
        entry.update(sparse_builder.flush(writer, entry["dir"]) or {})
