"""``build_index``: corpus reader → leg builders → writer → one atomic commit.

The leg builders (:mod:`retriever.index.builders` protocol: :class:`retriever.index.bm25_build.BM25Builder`,
:class:`retriever.index.dense_build.DenseBuilder`, :class:`retriever.index.sparse_build.SparseBuilder`)
each build their files for one shard at a time; the writer (:class:`retriever.index.writer.IndexWriter`)
writes the documents, collects files and statistics, and commits generation 1 atomically.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .builders import Batch, LegBuilder, ShardOutput, manifest_parts
from .config import BuildConfig, DenseConfig
from .errors import ConfigError, CorpusError
from .faults import FaultHook, no_faults
from .metadata import MetadataColumns
from .readers import Document, read_corpus
from .writer import IndexWriter, check_target

log = logging.getLogger(__name__)


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


def _resolve_config(config: BuildConfig | None, overrides: Mapping[str, Any]) -> BuildConfig:
    config = config or BuildConfig()
    if overrides:
        try:
            config = dataclasses.replace(config, **overrides)
        except TypeError as e:
            raise ConfigError(str(e)) from None
    return config


def make_builders(config: BuildConfig, *, faults: FaultHook = no_faults, dense_vectors: Any = None,
                  sparse_vectors: Any = None, dense_model_info: dict[str, Any] | None = None,
                  sparse_scale: float | None = None) -> list[LegBuilder]:
    """The leg builders of ``config.legs`` (models are loaded here), in leg order.

    Raises:
        ConfigError: precomputed vectors for a leg that is not built, or bad vectors.
        ModelError: a model that cannot be loaded.
    """
    if dense_vectors is not None and "dense" not in config.legs:
        raise ConfigError("dense_vectors given but 'dense' is not in legs")
    if sparse_vectors is not None and "sparse" not in config.legs:
        raise ConfigError("sparse_vectors given but 'sparse' is not in legs")
    builders: list[LegBuilder] = []
    try:
        for leg in config.legs:
            if leg == "bm25":
                from .analyzer import Analyzer
                from .bm25_build import BM25Builder

                builders.append(BM25Builder(Analyzer(config.analyzer), faults))
            elif leg == "dense":
                from .dense_build import DenseBuilder

                builders.append(DenseBuilder(config.dense, faults, device=config.device, vectors=dense_vectors,
                                             model_info=dense_model_info))
            elif leg == "sparse":
                from .sparse_build import SparseBuilder

                builders.append(SparseBuilder(config, device=config.device, vectors=sparse_vectors, scale=sparse_scale))
    except BaseException:
        for b in builders:
            b.close(raise_errors=False)
        raise
    return builders


class _ShardDocs:
    """The documents of the shard being filled."""

    def __init__(self) -> None:
        self.docs: list[Document] = []

    def columns(self) -> tuple[list[str], list[str], list[str]]:
        return [d.id for d in self.docs], [d.title for d in self.docs], [d.text for d in self.docs]


def _write_shards(documents: Iterator[Document], config: BuildConfig, builders: Sequence[LegBuilder],
                  writer: IndexWriter, faults: FaultHook, progress: Any) -> int:
    """Feed every batch to every builder and write each shard; returns the document count.

    Raises:
        CorpusError: a duplicate id or mixed metadata types (names the records).
    """
    seen: set[str] = set()
    meta = MetadataColumns()
    shard = _ShardDocs()
    n_docs = 0
    for docs, end_of_shard in _batches(documents, config):
        for d in docs:
            if d.id in seen:
                raise CorpusError(f"duplicate document id {d.id!r}", path=d.path, line=d.line, field="_id")
            seen.add(d.id)
        faults("read")
        batch = Batch(docs, [f"{d.title} {d.text}" if d.title else d.text for d in docs])
        shard.docs.extend(docs)
        for b in builders:
            b.add(batch)
        n_docs += len(docs)
        if progress is not None:
            progress.update(len(docs))
        if end_of_shard:
            _write_shard(writer, shard, meta, builders)
            shard = _ShardDocs()
    return n_docs


def _write_shard(writer: IndexWriter, shard: _ShardDocs, meta: MetadataColumns, builders: Sequence[LegBuilder]) -> None:
    """One shard: builders told the shard is complete, docs written, each builder's files written."""
    for b in builders:
        b.end_shard()  # e.g. the postings' counting sort runs on its thread while docs are written
    ids, titles, texts = shard.columns()
    handle = writer.begin_shard(ids=ids, titles=titles, texts=texts, metadata=meta.columns(shard.docs))
    outputs: dict[str, ShardOutput] = {b.name: b.finish_shard(writer, handle) for b in builders}
    writer.end_shard(handle, outputs)


def _run_build(documents: Iterator[Document], out: Path, config: BuildConfig, builders: Sequence[LegBuilder], *,
               overwrite: bool, faults: FaultHook, show_progress: bool, t0: float,
               corpus_path: Any = None) -> dict[str, Any]:
    """Write every shard, finish every builder, commit; on any error nothing is left at ``out``."""
    progress = None
    if show_progress:
        from tqdm import tqdm
        progress = tqdm(desc="indexing", unit="doc")
    try:
        with IndexWriter(out, overwrite=overwrite, faults=faults) as writer:
            n_docs = _write_shards(documents, config, builders, writer, faults, progress)
            if n_docs == 0:
                raise CorpusError("corpus is empty (no documents)", path=corpus_path)
            outputs = {b.name: b.finish(writer, n_docs) for b in builders}
            cfg, stats, build, extra = manifest_parts(config, n_docs, outputs, time.perf_counter() - t0)
            return writer.commit(build_config=cfg, stats=stats, build=build, extra=extra)
    except BaseException:
        for b in builders:  # stop worker threads; the error being raised wins
            b.close(raise_errors=False)
        raise
    finally:
        if progress is not None:
            progress.close()


def build_index(corpus: str | Path | Iterable[Mapping[str, Any]], out: str | Path,
                config: BuildConfig | None = None, *, overwrite: bool = False,
                show_progress: bool = True, dense_vectors: Any = None, sparse_vectors: Any = None,
                faults: FaultHook | None = None, sparse_scale: float | None = None, executor: Any = None,
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

        sparse_scale: a fixed impact scale for the sparse leg (weight per uint16 unit; larger
            weights are clipped) instead of the corpus maximum / 65535: a living index keeps the
            scale it was created with, and a fresh build given the same scale scores the same.
        faults: fault-injection hook called at each point of
            :data:`retriever.index.faults.CRASH_POINTS` (tests; default: none).
        executor: a :class:`retriever.index.distributed.RayExecutor` to build on a Ray cluster
            (:mod:`retriever.index.distributed_build`: the same index, written by Ray workers into
            ``out``'s temporary sibling, which must be on storage every node reaches); ``None``:
            this process.

    Returns:
        the manifest (dict) of generation 1 of the new index.

    Raises:
        CorpusError: bad record (names file, line, field), duplicate id, or empty corpus.
        ModelError: dense model path missing or unloadable.
        IndexExistsError: ``out`` exists and ``overwrite`` is False.
        ConfigError: invalid configuration.
    On any error nothing is left at ``out`` (an existing index there is untouched).
    """
    config = _resolve_config(config, overrides)
    out = Path(out)
    check_target(out, overwrite)
    t0 = time.perf_counter()
    if executor is not None:
        if dense_vectors is not None or sparse_vectors is not None:
            raise ConfigError("dense_vectors / sparse_vectors cannot be given to a Ray build (executor=...)")
        from .distributed_build import build_distributed

        return build_distributed(corpus, out, config, executor, overwrite=overwrite, faults=faults, t0=t0,
                                 sparse_scale=sparse_scale)
    documents = read_corpus(corpus)  # a missing or unknown corpus fails here, before models load
    faults = faults or no_faults
    builders = make_builders(config, faults=faults, dense_vectors=dense_vectors, sparse_vectors=sparse_vectors,
                             sparse_scale=sparse_scale)
    return _run_build(documents, out, config, builders, overwrite=overwrite, faults=faults,
                      show_progress=show_progress, t0=t0,
                      corpus_path=corpus if isinstance(corpus, (str, Path)) else None)


def build_vector_index(ids: Sequence[str], vectors: np.ndarray, out: str | Path, *,
                       dims: Sequence[int] = (), mrl_trained: bool = False, dtype: str = "float16",
                       shard_size: int = 1_000_000, faiss_factory: str = "Flat", rotation_sample: int = 100_000,
                       model_info: dict[str, Any] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Write a dense-only index from precomputed embeddings (benchmarks, cached vectors): the
    dense pipeline of :func:`build_index` with ``legs=("dense",)``, titles and texts empty.

    Args:
        ids: n document ids (unique strings).
        vectors: (n, d) float32 model-space vectors (typically unit-norm).
        out: index directory to create (atomically).
        dims, mrl_trained, dtype, rotation_sample: as in :class:`retriever.index.config.DenseConfig`.
        shard_size: rows per shard.
        faiss_factory: build-time FAISS factory string for the full-dimension index.
        model_info: manifest ``models.dense`` entry (``path`` lets the leg encode text queries).
        overwrite: replace an existing index at ``out``.

    Returns:
        the manifest.

    Raises:
        ConfigError: shape mismatch, NaN/inf, bad dims or dtype, duplicate ids.
        IndexExistsError: ``out`` exists and ``overwrite`` is False.
    """
    vectors = np.asarray(vectors)
    if vectors.ndim != 2 or vectors.shape[0] != len(ids) or vectors.shape[0] == 0:
        raise ConfigError(f"vectors must have shape ({len(ids)}, d) with at least one row, got {vectors.shape}")
    if len(set(ids)) != len(ids):
        raise ConfigError("ids must be unique")
    dims = tuple(dims)
    if dims and max(dims) > vectors.shape[1]:
        raise ConfigError(f"matryoshka_dims {dims} exceed the model dimension {vectors.shape[1]}")
    dense = DenseConfig(model=(model_info or {}).get("path"), dtype=dtype, faiss_factory=faiss_factory,
                        matryoshka_dims=dims, mrl_trained=mrl_trained, rotation_sample=rotation_sample)
    config = BuildConfig(legs=("dense",), shard_size=shard_size, dense=dense)
    out = Path(out)
    check_target(out, overwrite)
    t0 = time.perf_counter()
    info = {**(model_info or {})}
    builders = make_builders(config, dense_vectors=vectors, dense_model_info=info)
    documents = (Document(str(i), "", "", {}, None, k + 1) for k, i in enumerate(ids))
    return _run_build(documents, out, config, builders, overwrite=overwrite, faults=no_faults, show_progress=False,
                      t0=t0)
