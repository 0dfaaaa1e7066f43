"""Learned-sparse (SPLADE) leg: query encoding, exact and Seismic-style approximate top-k per shard.

Scoring: ``score(q, d) = scale · Σ_t q_t · impact(t, d)`` with uint16 impacts and the index-wide
``scale`` (manifest ``stats.sparse_scale``), so exact results do not depend on the shard layout.
Only documents with score > 0 are hits.

Modes (leg parameter ``algorithm``):
  * ``"exact"`` (default): score-at-a-time over impact-ordered postings with safe early termination,
    candidates re-scored from the forward index (``_kernels.sparse_exact_topk``); in shards of at
    most 32,768 documents a query whose lists cover the shard twice over is scored term-at-a-time
    into a dense accumulator instead (long lists shared by a batch as float32 columns). Same results
    either way: every returned score is the forward-index score.
  * ``"seismic"``: approximate top-k after Bruch et al., SIGIR 2024 (``_kernels.sparse_seismic_topk``)
    with knobs ``query_cut`` (query terms visited, largest weights first) and ``heap_factor``
    (a block is skipped when its summary score < heap_factor · current k-th score). Postings kept
    per term and block size are build-time knobs (``SparseConfig``).

User-supplied query vectors (``Retriever.search_arrays(..., sparse_vectors=...)``) go through
:meth:`SparseLeg.check_vectors`; policy (same for both modes): indices may be unsorted; duplicate
indices, length mismatch, indices outside ``[0, vocab_size)``, NaN/inf or negative weights raise
:class:`~retriever.index.errors.QueryError`; zero weights are dropped. A ``scipy.sparse`` matrix is taken at
its value, as scipy defines it: repeated (row, column) entries of a non-canonical matrix are summed
first (scipy's own rule), and the checks apply to the sums.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numba as nb
import numpy as np

from retriever.index.errors import IndexFormatError, QueryError
from retriever.index.sparse_build import SPARSE_FWD

from .. import _kernels
from ..params import DEFAULT_HEAP_FACTOR, DEFAULT_QUERY_CUT, SparseSearchParams
from ..segcache import SegmentCache, segment_key
from ..shards import IndexReader
from ..threads import QUERY_ENCODE_THREADS, torch_threads
from .base import SearchContext, TopK, check_candidates, empty_topk, search_each_shard, shard_mask

SPARSE_INDEX_ARRAYS = {
    "fwd_offsets": np.uint64, "fwd_terms": np.uint32, "fwd_values": np.uint16,
    "offsets": np.uint64, "doc_ids": np.uint32, "impacts": np.uint16,
    "term_blocks": np.uint64, "block_docs_offsets": np.uint64, "block_docs": np.uint32,
    "summary_comp_offsets": np.uint64, "summary_dir": np.uint64, "summary_entry_offsets": np.uint64,
    "summary_entries": np.uint32, "summary_scale": np.float32, "fwd_packed": np.uint32, "fwd_term_rank": np.uint32,
}
_BLOCK_ARGS = ("term_blocks", "block_docs_offsets", "block_docs", "summary_comp_offsets", "summary_dir",
               "summary_entry_offsets", "summary_entries", "summary_scale", "fwd_packed", "fwd_term_rank")
__all__ = ["SparseLeg", "SparsePrepared", "csr_batch", "DEFAULT_QUERY_CUT", "DEFAULT_HEAP_FACTOR"]

QueryBatch = tuple[np.ndarray, np.ndarray, np.ndarray]


def _first_bad_item(v: dict) -> Any:
    """The first ``(key, value)`` of a user sparse-vector dict that is not (integer, number)."""
    for key, val in v.items():
        if not isinstance(key, (int, np.integer)) or isinstance(key, bool) \
                or not isinstance(val, (int, float, np.integer, np.floating)):
            return (key, val)
    return next(iter(v.items()), None)


def _csr_batch_fast(vectors: Any, vocab_size: int) -> QueryBatch | None:
    """:func:`csr_batch` for the common case, in a few numpy calls per batch instead of ~20 per
    query: a list or tuple of ``(indices, weights)`` pairs of 1-D numpy arrays (indices of an
    integer dtype, weights float32 or float64, equal lengths) whose rows are valid and already
    strictly ascending (so sorting and the duplicate check are no-ops). Returns the same arrays as
    the general path, or ``None`` (anything else, or any row that the general path would sort or
    reject: it then runs and raises its usual, row-naming error)."""
    if type(vectors) not in (list, tuple) or not vectors:
        return None
    idxs, ws = [], []
    for v in vectors:
        if type(v) is not tuple or len(v) != 2:
            return None
        idx, w = v
        if (type(idx) is not np.ndarray or type(w) is not np.ndarray or idx.ndim != 1 or w.ndim != 1
                or idx.dtype.kind not in "iu" or w.dtype not in _FAST_WEIGHT_DTYPES or len(idx) != len(w)):
            return None
        idxs.append(idx)
        ws.append(w)
    if len(idxs) == 1:
        idx, w = idxs[0].astype(np.int64), ws[0].astype(np.float64)
    else:
        idx = np.concatenate([a.astype(np.int64) for a in idxs])
        w = np.concatenate([a.astype(np.float64) for a in ws])
    offsets = np.zeros(len(idxs) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in idxs], out=offsets[1:])
    kept = np.empty(len(idxs) + 1, dtype=np.uint64)
    if not _rows_valid_sorted(offsets, idx, w, vocab_size, kept):
        return None
    if kept[-1] == len(idx):  # no zero weight to drop
        return kept, idx.astype(np.uint32), w.astype(np.float32)
    keep = w > 0
    return kept, idx[keep].astype(np.uint32), w[keep].astype(np.float32)


_FAST_WEIGHT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@nb.njit(cache=True, nogil=True)
def _rows_valid_sorted(offsets: np.ndarray, idx: np.ndarray, w: np.ndarray, vocab_size: int,
                       kept: np.ndarray) -> bool:
    """True when every row ``offsets[q]:offsets[q+1]`` of ``idx`` (int64) is strictly ascending
    within [0, vocab_size) and its weights ``w`` (float64) are finite and >= 0; fills ``kept``
    (uint64 (nq+1,)) with the prefix sums of the rows' positive-weight counts."""
    kept[0] = 0
    for q in range(offsets.shape[0] - 1):
        n = 0
        for j in range(offsets[q], offsets[q + 1]):
            t = idx[j]
            x = w[j]
            if t < 0 or t >= vocab_size or not np.isfinite(x) or x < 0:
                return False
            if j > offsets[q] and t <= idx[j - 1]:
                return False
            if x > 0:
                n += 1
        kept[q + 1] = kept[q] + n
    return True


def csr_batch(vectors: Any, vocab_size: int) -> QueryBatch:
    """Validate user query vectors and return a ragged batch.

    Args:
        vectors: a ``scipy.sparse`` matrix (nq, vocab_size), or a sequence of ``(indices, weights)``
            pairs, or of ``{term_id: weight}`` dicts.
        vocab_size: the index's vocabulary size.

    Returns:
        ``(q_offsets uint64 (nq+1,), q_terms uint32 (m,), q_weights float32 (m,))``, terms ascending.

    Raises:
        QueryError: duplicate indices (pairs, dicts), length mismatch, index outside
            [0, vocab_size), NaN/inf or negative weight (names the query and the value). A scipy
            matrix's repeated entries are summed first (its value as scipy defines it).
    """
    fast = _csr_batch_fast(vectors, vocab_size)
    if fast is not None:
        return fast
    rows: list[tuple[np.ndarray, np.ndarray]] = []
    if hasattr(vectors, "tocsr") and hasattr(vectors, "shape"):
        m = vectors.tocsr(copy=True)  # sum_duplicates below must not change the caller's matrix
        if m.shape[1] > vocab_size:
            raise QueryError(f"sparse_vectors has {m.shape[1]} columns, the vocabulary has {vocab_size}")
        m.sum_duplicates()
        for i in range(m.shape[0]):
            rows.append((m.indices[m.indptr[i]:m.indptr[i + 1]], m.data[m.indptr[i]:m.indptr[i + 1]]))
    else:
        for v in vectors:
            if isinstance(v, dict):
                try:
                    rows.append((np.fromiter(v.keys(), dtype=np.int64, count=len(v)),
                                 np.fromiter(v.values(), dtype=np.float64, count=len(v))))
                except (TypeError, ValueError, OverflowError):
                    raise QueryError(f"sparse_vectors[{len(rows)}]: a dict must map integer term ids to "
                                     f"numeric weights; got {_first_bad_item(v)!r}") from None
            else:
                try:
                    idx, w = v
                except (TypeError, ValueError):
                    raise QueryError("sparse_vectors entries must be (indices, weights) pairs, dicts, "
                                     "or a scipy.sparse matrix") from None
                rows.append((np.asarray(idx), np.asarray(w)))
    offsets = np.zeros(len(rows) + 1, dtype=np.uint64)
    terms_out, weights_out = [], []
    for q, (idx, w) in enumerate(rows):
        idx, w = np.asarray(idx), np.asarray(w)
        if idx.ndim > 1 or w.ndim > 1:
            raise QueryError(f"sparse_vectors[{q}]: indices and weights must be 1-D; got shapes "
                             f"{idx.shape} and {w.shape}")
        idx, w = idx.reshape(-1), w.reshape(-1)
        if len(w) and w.dtype.kind not in "iuf":
            raise QueryError(f"sparse_vectors[{q}]: weights must be numbers, got dtype {w.dtype} "
                             f"(first value {w[0].item()!r})")
        w = w.astype(np.float64)
        if len(idx) != len(w):
            raise QueryError(f"sparse_vectors[{q}]: {len(idx)} indices but {len(w)} weights")
        if len(idx) and not np.issubdtype(idx.dtype, np.integer):
            raise QueryError(f"sparse_vectors[{q}]: indices must be integers, got dtype {idx.dtype}")
        if idx.dtype.kind == "u" and len(idx) and int(idx.max()) >= vocab_size:
            raise QueryError(f"sparse_vectors[{q}]: term id {int(idx.max())} outside the vocabulary "
                             f"[0, {vocab_size})")
        idx = idx.astype(np.int64)
        bad = (idx < 0) | (idx >= vocab_size)
        if bad.any():
            raise QueryError(f"sparse_vectors[{q}]: term id {int(idx[bad][0])} outside the vocabulary "
                             f"[0, {vocab_size})")
        if not np.isfinite(w).all():
            raise QueryError(f"sparse_vectors[{q}]: weight {w[~np.isfinite(w)][0]!r} is not finite")
        if (w < 0).any():
            raise QueryError(f"sparse_vectors[{q}]: negative weight {float(w[w < 0][0])!r} "
                             f"(learned-sparse weights must be >= 0)")
        order = np.argsort(idx, kind="stable")
        idx, w = idx[order], w[order]
        dup = idx[1:] == idx[:-1]
        if dup.any():
            raise QueryError(f"sparse_vectors[{q}]: duplicate term id {int(idx[1:][dup][0])}")
        keep = w > 0
        terms_out.append(idx[keep])
        weights_out.append(w[keep])
        offsets[q + 1] = offsets[q] + int(keep.sum())
    terms = np.concatenate(terms_out).astype(np.uint32) if terms_out else np.zeros(0, np.uint32)
    weights = np.concatenate(weights_out).astype(np.float32) if weights_out else np.zeros(0, np.float32)
    return offsets, terms, weights


class SparseLeg:
    """The learned-sparse leg of an opened index.

    Args:
        reader: the opened index (built with the ``sparse`` leg).
        shards: positions in ``reader.shards`` this leg holds (default: every shard), in order.
        device: query encoder device.
        model: the query encoder's checkpoint (default: the bundled SPLADE); the manifest's model
            record is compared with it as a fingerprint (ModelError on a mismatch), never opened.

    Raises:
        IndexFormatError: missing or inconsistent sparse files (names the file).
    """

    name = "sparse"
    Params = SparseSearchParams

    def __init__(self, reader: IndexReader, *, shards: Sequence[int] | None = None, device: str = "cpu",
                 cache: SegmentCache | None = None, model: str | None = None) -> None:
        self.reader = reader
        #: the manifest's record of the document model (a fingerprint, never a path to open)
        self.model_info = reader.manifest.get("models", {}).get("sparse")
        #: the query model: the caller's, else the bundled default SPLADE (resolved on first use)
        self._model_given = model
        st = reader.manifest["stats"]
        try:
            self.scale = float(st["sparse_scale"])
            self.vocab_size = int(st["sparse_vocab_size"])
        except (KeyError, TypeError, ValueError):
            raise IndexFormatError(f"{reader.manifest_path}: stats lack sparse_scale / "
                                   f"sparse_vocab_size") from None
        self.config = reader.config.sparse
        self.device = device
        self._encoder = None
        self.shard_ids = tuple(range(len(reader.shards)) if shards is None else shards)
        self.n_shards = len(self.shard_ids)
        self.shards = []
        cache = cache if cache is not None else SegmentCache()
        for s in (reader.shards[i] for i in self.shard_ids):
            key = ("sparse", segment_key(reader, s, "sparse_index.arrow"), self.scale, self.vocab_size)
            self.shards.append((s, cache.get(key, lambda s=s: self._load_segment(reader, s))))

    def _load_segment(self, reader: IndexReader, s: Any) -> dict[str, np.ndarray]:
        """One segment's checked ``sparse_index.arrow`` arrays (reused across refreshes,
        :mod:`retriever.segcache`)."""
        path = s.dir / "sparse_index.arrow"
        try:
            a = reader.shard_arrays(s, "sparse_index.arrow", SPARSE_INDEX_ARRAYS)
        except IndexFormatError as e:
            if "missing array 'summary_" in str(e):
                raise IndexFormatError(f"{e} (an older layout with per-block summary rows? block summaries "
                                       f"are now stored inverted per term: rebuild the index)") from None
            raise
        try:
            if len(a["fwd_offsets"]) != s.rows + 1 or len(a["offsets"]) != self.vocab_size + 1:
                raise ValueError(f"has {len(a['fwd_offsets']) - 1} documents / {len(a['offsets']) - 1} "
                                 f"terms, expected {s.rows} / {self.vocab_size}")
            _kernels.check_impact_postings(a["offsets"], a["doc_ids"], a["impacts"], s.rows)
            _kernels.check_sparse_index(a["fwd_offsets"], a["fwd_terms"], a["fwd_values"], self.scale,
                                        self.vocab_size, *[a[n] for n in _BLOCK_ARGS])
        except ValueError as e:
            raise IndexFormatError(f"{path}: {e}") from None
        return a

    @property
    def encoder(self):
        """The query encoder (:class:`retriever.index.encoders.sparse.SparseEncoder`), loaded on first use."""
        if self._encoder is None:
            from pathlib import Path

            from retriever.index.encoders.checkpoint import check_fingerprint
            from retriever.index.encoders.sparse import SparseEncoder, resolve_sparse_model

            c = self.config
            path = resolve_sparse_model(self._model_given)
            check_fingerprint("sparse", Path(path), self.model_info, str(self.reader.manifest_path))
            self._encoder = SparseEncoder(str(path), doc_max_length=c.doc_max_length,
                                          query_max_length=c.query_max_length, batch_size=c.batch_size,
                                          device=self.device)
        return self._encoder

    def prepare(self, queries: Sequence[str], params: SparseSearchParams | None = None,
                n_threads: int = 1) -> "SparsePrepared":
        """Encode queries with the index's SPLADE model into a ragged batch, on
        :data:`~retriever.threads.QUERY_ENCODE_THREADS` torch threads (identical weights whatever
        thread or thread budget encodes them)."""
        encoder = self.encoder
        with torch_threads(QUERY_ENCODE_THREADS):
            indptr, terms, weights = encoder.encode_queries(list(queries))
        batch = (indptr.astype(np.uint64), terms.astype(np.uint32), weights.astype(np.float32))
        return self._prepared(batch, params)

    def prepare_vectors(self, vectors: Any, params: SparseSearchParams | None = None,
                        n_threads: int = 1) -> "SparsePrepared":
        """A batch from user-supplied query vectors (validated by :func:`csr_batch`)."""
        return self._prepared(self.check_vectors(vectors), params)

    def _prepared(self, batch: QueryBatch, params: SparseSearchParams | None) -> "SparsePrepared":
        p = params or SparseSearchParams()
        if not isinstance(p, SparseSearchParams):
            raise QueryError(f"sparse leg params must be SparseSearchParams, got {type(p).__name__}")
        self._check_score_range(*batch)
        return SparsePrepared(batch, p)

    def check_vectors(self, vectors: Any) -> QueryBatch:
        """Validate user-supplied query vectors (see :func:`csr_batch`)."""
        return csr_batch(vectors, self.vocab_size)

    def _term_max_impact(self) -> np.ndarray:
        """f64[vocab]: each term's largest uint16 impact over all shards (0 where absent), built
        on first use (O(vocab × shards)) and kept."""
        tm = getattr(self, "_term_max", None)
        if tm is None:
            tm = np.zeros(self.vocab_size, dtype=np.float64)
            for _, a in self.shards:
                offsets, impacts = a["offsets"].astype(np.int64), a["impacts"]
                n = min(len(offsets) - 1, self.vocab_size)
                lo, hi = offsets[:n], offsets[1:n + 1]
                has = hi > lo  # impact-ordered lists: the first posting is the largest
                tm[:n][has] = np.maximum(tm[:n][has], impacts[lo[has]].astype(np.float64))
            self._term_max = tm
        return tm

    def _check_score_range(self, q_offsets: np.ndarray, q_terms: np.ndarray, q_weights: np.ndarray) -> None:
        """Raise QueryError when a query's largest possible score (Σ weight × the term's largest
        uint16 impact, and that times the scale, in float64) overflows float32 (with a factor 2
        of slack): the kernels score in float32, and an infinite bound would leave the exact
        kernel's pruning without a stopping point. One O(query terms) pass per batch."""
        if len(q_terms) == 0:
            return
        t = q_terms.astype(np.int64)
        if t.min() < 0 or t.max() >= self.vocab_size:
            return  # out-of-vocabulary ids: the kernel raises the error that names them
        # the kernels sum weight × impact in float32 and apply the scale at the end, so both the
        # unscaled and the scaled sums must stay finite
        contrib = np.abs(q_weights.astype(np.float64)) * self._term_max_impact()[t] * max(1.0, float(self.scale))
        nq = len(q_offsets) - 1
        qidx = np.repeat(np.arange(nq), np.diff(q_offsets.astype(np.int64)))
        bound = np.bincount(qidx, weights=contrib, minlength=nq)
        bad = np.flatnonzero(bound > float(np.finfo(np.float32).max) / 2)
        if bad.size:
            i = int(bad[0])
            raise QueryError(f"sparse query #{i}: weights too large — its best possible score "
                             f"{bound[i]:.3g} overflows float32; rescale the query weights")

    def search_shards(self, prepared: "SparsePrepared", shards: Sequence[int], ctx: SearchContext) -> TopK:
        """:meth:`search_shard` on each of ``shards``, merged (:func:`~retriever.legs.base.search_each_shard`)."""
        return search_each_shard(self, prepared, shards, ctx, len(prepared.batch[0]) - 1)

    def search_shard(self, prepared: "SparsePrepared", shard: int, ctx: SearchContext) -> TopK:
        """Top-``ctx.depth`` of shard position ``shard`` (global ordinals): exact
        (``_kernels.sparse_exact_topk``) or Seismic-style approximate (``_kernels.sparse_seismic_topk``).

        With an allow mask (``ctx.allow``) both kernels take it and apply it before top-k, so no
        masked document is returned. Exact: the exact top-k of the passing documents. Seismic,
        planned per shard: when the passing fraction is below ``params.filter_exact_below`` the
        exact kernel runs instead (a selective filter leaves too few passing documents in the
        visited blocks); otherwise Seismic runs with the mask, and every query for which it found
        fewer than ``depth`` documents is run again exactly, so ``depth`` hits come back whenever
        ``depth`` passing documents match the query.

        Raises:
            QueryError: an out-of-range knob (from the kernel, naming it) or a malformed allow
                mask (names the shard and the sizes).
        """
        s, a = self.shards[shard]
        mask = shard_mask(ctx, shard, s.rows, f"{self.shard_ids[shard]} ({s.dir.name})")
        if mask.n_pass == 0:
            return empty_topk(prepared.n_queries, ctx.depth)
        p = prepared.params
        exact = p.algorithm == "exact" or (mask.allow is not None and mask.fraction < p.filter_exact_below)
        try:
            if exact:
                ids, scores, n_found = self._exact(a, prepared.batch, ctx.depth, ctx.n_threads, mask.allow)
            else:
                ids, scores, n_found = _kernels.sparse_seismic_topk(
                    a["fwd_offsets"], a["fwd_terms"], a["fwd_values"], self.scale,
                    *[a[n] for n in _BLOCK_ARGS], *prepared.batch, ctx.depth,
                    query_cut=int(p.query_cut), heap_factor=float(p.heap_factor), n_threads=ctx.n_threads,
                    allow=mask.allow)
                # a filter (or tombstones) in the call, also on a shard every row of which passes
                # (given as no mask): k hits guaranteed whenever k passing documents match
                if ctx.allow is not None:
                    short = np.flatnonzero(n_found < min(ctx.depth, mask.n_pass))
                    if len(short):  # guaranteed k: these queries again, exactly
                        sub = _sub_batch(prepared.batch, short)
                        ids[short], scores[short], n_found[short] = self._exact(a, sub, ctx.depth, ctx.n_threads,
                                                                                mask.allow)
        except ValueError as e:
            raise QueryError(f"sparse search: {e}") from None
        return np.where(ids >= 0, ids + s.base, -1), scores, n_found

    def _exact(self, a: dict[str, np.ndarray], batch: QueryBatch, depth: int, n_threads: int,
               allow: np.ndarray | None) -> TopK:
        """``_kernels.sparse_exact_topk`` of one shard's arrays (shard-local ids)."""
        return _kernels.sparse_exact_topk(a["offsets"], a["doc_ids"], a["impacts"], a["fwd_offsets"],
                                          a["fwd_terms"], a["fwd_values"], self.scale, *batch, depth,
                                          n_threads=n_threads, allow=allow)

    def score_docs(self, prepared: "SparsePrepared", shard: int, offsets: np.ndarray,
                   ordinals: np.ndarray) -> np.ndarray:
        """Exact scores of given documents of shard position ``shard`` from the forward index
        (:func:`forward_scores`: the kernels' own summation order, so bit-identical to the scores
        :meth:`search_shard` returns); 0 for a document sharing no term with the query.

        Raises:
            QueryError: offsets that do not fit, or an ordinal outside the shard (names it).
        """
        s, a = self.shards[shard]
        return forward_scores(a["fwd_offsets"], a["fwd_terms"], a["fwd_values"], self.scale, self.vocab_size,
                              *prepared.batch, offsets, ordinals, s.rows)


def _sub_batch(batch: QueryBatch, rows: np.ndarray) -> QueryBatch:
    """The queries ``rows`` (ascending positions) of a ragged batch, as a batch of their own."""
    q_offsets, q_terms, q_weights = batch
    lo, hi = q_offsets[rows].astype(np.int64), q_offsets[rows + 1].astype(np.int64)
    offs = np.zeros(len(rows) + 1, dtype=np.uint64)
    np.cumsum(hi - lo, out=offs[1:])
    pos = np.concatenate([np.arange(b, e) for b, e in zip(lo.tolist(), hi.tolist())]) if len(rows) else \
        np.zeros(0, np.int64)
    return offs, np.ascontiguousarray(q_terms[pos]), np.ascontiguousarray(q_weights[pos])


@dataclass(frozen=True)
class SparsePrepared:
    """A batch prepared by :meth:`SparseLeg.prepare` / :meth:`SparseLeg.prepare_vectors`.

    Attributes:
        batch: ``(q_offsets u64 (nq+1,), q_terms u32, q_weights f32)``.
        params: the call's options.
    """

    batch: QueryBatch
    params: SparseSearchParams

    @property
    def n_queries(self) -> int:
        """Queries in the batch."""
        return len(self.batch[0]) - 1


def forward_scores(fwd_offsets: np.ndarray, fwd_terms: np.ndarray, fwd_values: np.ndarray, scale: float,
                   vocab_size: int, q_offsets: np.ndarray, q_terms: np.ndarray, q_weights: np.ndarray,
                   c_offsets: np.ndarray, c_docs: np.ndarray, n_docs: int) -> np.ndarray:
    """Forward-index scores ``scale · Σ_t q_t · value(t, d)`` of given documents in the kernels'
    fixed float32 order (``cpp_ext/blocked_topk.cpp`` ``forward_score``): a row's entries go in
    chunks of 8, alternately to lane groups A and B (entry j of a chunk to lane j), the last < 8
    entries to A's lanes 0, 1, ...; then lane-wise A + B, the 8 lanes summed as
    ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)), times the scale. ``np.add.at`` adds in
    element order, one float32 addition at a time, so each lane's sum is the kernel's.

    Args:
        fwd_offsets, fwd_terms, fwd_values: the shard's forward index (CSR by document).
        scale: the index's quantisation scale; vocab_size: query term ids are below it.
        q_offsets, q_terms, q_weights: the ragged query batch.
        c_offsets: int64 (nq + 1,) offsets into ``c_docs`` per query; c_docs: shard-local ordinals.
        n_docs: the shard's documents.

    Returns:
        float32 scores aligned with ``c_docs``.

    Raises:
        QueryError: offsets that do not fit, or an ordinal outside ``[0, n_docs)`` (names it).
    """
    nq = len(q_offsets) - 1
    c_offsets, c_docs = check_candidates(c_offsets, c_docs, nq, n_docs)
    out = np.zeros(len(c_docs), dtype=np.float32)
    qd = np.zeros(vocab_size, dtype=np.float32)
    fo = fwd_offsets.astype(np.int64)
    for q in range(nq):
        lo_c, hi_c = int(c_offsets[q]), int(c_offsets[q + 1])
        if lo_c == hi_c:
            continue
        t = q_terms[int(q_offsets[q]):int(q_offsets[q + 1])].astype(np.int64)
        qd[t] = q_weights[int(q_offsets[q]):int(q_offsets[q + 1])]
        docs = c_docs[lo_c:hi_c]
        starts, lens = fo[docs], fo[docs + 1] - fo[docs]
        row = np.repeat(np.arange(len(docs)), lens)
        j = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)  # entry within its row
        pos = np.repeat(starts, lens) + j
        full = (lens // 8) * 8  # entries in whole chunks of 8; the rest goes to A's first lanes
        in_chunk = j < np.repeat(full, lens)
        group = np.where(in_chunk, (j // 8) % 2, 0)
        lane = np.where(in_chunk, j % 8, j - np.repeat(full, lens))
        prod = qd[fwd_terms[pos].astype(np.int64)] * fwd_values[pos].astype(np.float32)
        acc = np.zeros((len(docs), 2, 8), dtype=np.float32)
        np.add.at(acc, (row, group, lane), prod)
        lanes = acc[:, 0, :] + acc[:, 1, :]
        out[lo_c:hi_c] = (((lanes[:, 0] + lanes[:, 4]) + (lanes[:, 1] + lanes[:, 5]))
                          + ((lanes[:, 2] + lanes[:, 6]) + (lanes[:, 3] + lanes[:, 7]))) * np.float32(scale)
        qd[t] = 0.0
    return out
