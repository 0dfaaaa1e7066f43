"""Build-time FAISS index construction for non-flat factory strings (IVF, HNSW, PQ...)."""

from __future__ import annotations

import logging

import numpy as np

from .errors import ConfigError

log = logging.getLogger(__name__)


def build_faiss_index(vectors: np.ndarray, factory: str) -> bytes:
    """Train (if needed) and fill a FAISS inner-product index; return its serialised bytes.

    See :func:`make_faiss_index` (same arguments, fallback and errors).

    Raises:
        ConfigError: also when the index is of a type (or layout) that the reader does not accept
            from a file (:func:`retriever.index.faiss_file.check_buildable`: e.g. an HNSW coarse
            quantizer, a non-flat refinement, fast-scan PQ), naming the factory string.
    """
    import faiss

    from .faiss_file import check_buildable

    data = faiss.serialize_index(make_faiss_index(vectors, factory)).tobytes()
    check_buildable(data, factory, vectors.shape[1], vectors.shape[0])  # what the reader will accept
    return data


def make_faiss_index(vectors: np.ndarray, factory: str):
    """Train (if needed) and fill a FAISS inner-product index (Johnson et al., "Billion-scale
    similarity search with GPUs", 2017 / the FAISS library).

    Args:
        vectors: float32 (n, d) shard vectors.
        factory: FAISS ``index_factory`` string, e.g. ``"IVF256,Flat"``, ``"HNSW32"``, ``"PQ48"``.

    If the index needs training and the shard has too few vectors for it (FAISS requires at least
    as many points as centroids), a flat index is built instead, with a warning.

    Returns:
        the CPU ``faiss.Index`` (``ntotal == n``).

    Raises:
        ConfigError: an invalid factory string (names it).
    """
    import faiss

    n, d = vectors.shape
    try:
        index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ConfigError(f"invalid FAISS factory string {factory!r}: {str(e).splitlines()[0]}") from None
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexPreTransform):
        inner = faiss.downcast_index(inner.index)
    if hasattr(inner, "do_polysemous_training"):
        # The factory enables polysemous training for PQ / IVF-PQ (a minute-long annealing of
        # code orders used only by Hamming-filtered search, which we never run): switch it off.
        inner.do_polysemous_training = False
    if not index.is_trained:
        nlist = getattr(faiss.extract_index_ivf(index), "nlist", 0) if "IVF" in factory else 0
        need = max(nlist, 256 if "PQ" in factory else 1)
        if n < need:
            log.warning("shard has %d vectors, fewer than the %d that %r needs to train; using a flat index",
                        n, need, factory)
            index = faiss.IndexFlatIP(d)
        else:
            index.train(np.ascontiguousarray(vectors, dtype=np.float32))
    if n:
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


def fill_faiss_template(template: bytes, vectors: np.ndarray) -> bytes:
    """A segment's FAISS index from an existing segment's: the same trained state (IVF coarse
    quantiser, PQ codebooks, HNSW parameters), emptied with ``reset()``, then ``vectors`` added.
    New segments of a living index index their vectors with the quantiser the index was trained
    with (compaction trains anew).

    Args:
        template: serialised FAISS index (``dense.faiss`` of an existing segment).
        vectors: float32 (n, d) vectors of the new segment.

    Returns:
        the serialised new index (``ntotal == n``).
    """
    import faiss

    index = faiss.deserialize_index(np.frombuffer(template, dtype=np.uint8))
    index.reset()
    if len(vectors):
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return faiss.serialize_index(index).tobytes()
