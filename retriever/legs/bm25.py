"""BM25 leg: query analysis, corpus-wide idf and length norms, compiled top-k per shard.

Scoring is Lucene's BM25 (``BM25Similarity``, Lucene ≥ 8):
score(q, d) = Σ_{t ∈ q} n_q(t) · idf(t) · tf / (tf + k1·(1 − b + b·dl/avgdl)),
idf(t) = ln(1 + (N − df + 0.5)/(df + 0.5)), where N, df and avgdl are corpus-wide (summed over
shards when the index is opened) and n_q(t) is how often t occurs in the analysed query.
With ``BM25Params.lucene_norms`` (the default, as in Anserini/Pyserini) dl is the document length
after Lucene's one-byte norm encoding (``SmallFloat.intToByte4``; exact below 24 terms);
otherwise the exact length. avgdl is always the exact mean length.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa

from retriever.index.analyzer import Analyzer
from retriever.index.bm25_build import BM25_ARRAYS, BM25_COMPACT_ARRAYS, check_bm25_segment
from retriever.index.errors import IndexFormatError, QueryError

from .. import _kernels
from ..params import BM25_ALGORITHMS, BM25SearchParams
from ..segcache import SegmentCache, segment_key
from . import bm25_carry
from .bm25_carry import SegmentState
from ..shards import IndexReader, Shard
from ..stats import BM25Stats
from .base import SearchContext, TopK, check_candidates, empty_topk

__all__ = ["BM25Leg", "BM25Prepared", "BM25_ALGORITHMS", "lucene_norm_length", "score_postings"]


def _long_to_int4(i: np.ndarray) -> np.ndarray:
    nbits = np.zeros_like(i)
    nz = i > 0
    nbits[nz] = np.floor(np.log2(i[nz])).astype(np.int64) + 1
    shift = nbits - 4
    enc = ((i >> np.maximum(shift, 0)) & 0x07) | ((shift + 1) << 3)
    return np.where(nbits < 4, i, enc)


def _int4_to_long(i: np.ndarray) -> np.ndarray:
    bits = i & 0x07
    shift = (i >> 3) - 1
    return np.where(shift == -1, bits, (bits | 0x08) << np.maximum(shift, 0))


_NUM_FREE = 255 - int(_long_to_int4(np.array([2**31 - 1], dtype=np.int64))[0])


def lucene_norm_length(dl: np.ndarray) -> np.ndarray:
    """Document lengths as Lucene decodes them from its one-byte norms
    (``SmallFloat.byte4ToInt(SmallFloat.intToByte4(dl))``); int64 array, same shape."""
    dl = dl.astype(np.int64)
    out = dl.copy()
    big = dl >= _NUM_FREE
    out[big] = _NUM_FREE + _int4_to_long(_long_to_int4(dl[big] - _NUM_FREE))
    return out


class BM25Leg:
    """The BM25 leg of an opened index (the leg protocol of :mod:`retriever.legs.base`).

    Args:
        reader: the opened index.
        shards: positions in ``reader.shards`` this leg holds (default: every shard), in order.
        stats: corpus-wide statistics (N, df, sum of lengths) to score with; default: combined
            from the held shards (:meth:`BM25Stats.combine`), which equals the whole index's when
            every shard is held. A process holding a subset of the shards passes the whole
            index's statistics here, so its scores equal a one-process search's.

    Raises:
        IndexFormatError: inconsistent vocabulary, postings or statistics (names the file).
    """

    name = "bm25"
    Params = BM25SearchParams

    def __init__(self, reader: IndexReader, *, shards: Sequence[int] | None = None,
                 stats: BM25Stats | None = None, cache: SegmentCache | None = None) -> None:
        cfg = reader.config
        self.params = cfg.bm25
        self.analyzer = Analyzer(cfg.analyzer)
        cache = cache if cache is not None else SegmentCache()
        self.vocab = read_vocab(reader, cache)
        n_terms = len(self.vocab)
        if reader.manifest["stats"].get("n_terms", n_terms) != n_terms:
            raise _fmt_error(reader.path / "vocab.arrow", f"has {n_terms} terms, manifest says "
                             f"{reader.manifest['stats'].get('n_terms')}")
        self.shard_ids = tuple(range(len(reader.shards)) if shards is None else shards)
        self.n_shards = len(self.shard_ids)
        self.shards = []
        self._segs: list[SegmentState] = []
        parts, part_keys = [], []
        for sid in self.shard_ids:
            s = reader.shards[sid]
            # per segment, reused across refreshes: the checked arrays, the membership bitmaps,
            # the scored lengths, the segment's statistics and its newest scoring state
            skey = segment_key(reader, s, "bm25.arrow")
            seg = cache.get(("bm25", skey), lambda s=s: self._load_segment(reader, s, n_terms))
            # its live statistics, per tombstone file
            dels = s.entry.get("deletes")
            pkey = ("bm25-live", skey, dels, (reader.manifest["files"].get(dels) or {}).get("sha256") if dels else None)
            parts.append(cache.get(pkey, lambda s=s, seg=seg: live_shard_stats(reader, s, seg.arrays, n_terms,
                                                                                seg.stats)))
            part_keys.append(pkey)
            self.shards.append((s, seg.arrays))
            self._segs.append(seg)
        self._dense = [seg.dense for seg in self._segs]
        self._dl = [seg.dl for seg in self._segs]
        if stats is None:
            # one running sum per index (or per held subset), updated by the segments that changed
            whole = self.shard_ids == tuple(range(len(reader.shards)))
            skey = ("bm25-stats", str(reader.path), None if whole else self.shard_ids)
            stats = combine_stats(cache, skey, part_keys, parts, n_terms)
        elif len(stats.df) != n_terms:
            raise QueryError(f"bm25 statistics cover {len(stats.df)} terms, the index has {n_terms}")
        self.stats = stats
        self.N = stats.n_docs
        self.avgdl = stats.avgdl
        self.df = stats.df
        self.idf = stats.idf()
        self._token_ids: dict[str, int] = {}
        self._table = None  # compiled query path: token -> term id table, made on first use
        self._char_args: tuple | None = None  # its character tables (flags, fold_n, fold_cp, ascii fold, lowercase)
        self._slot: np.ndarray | None = None
        self._table_lock = _ReadWriteLock()  # the table grows in place: readers share, a writer is alone
        # the LRU caches below (scoring states per (k1, b), single-term thresholds per depth) are
        # shared by concurrent searches: every get / move_to_end / insert / evict holds this lock
        self._cache_lock = threading.Lock()
        prev = self._carry_tokens(cache, reader)
        self._scoring_cache: OrderedDict[tuple[float, float], list[dict]] = OrderedDict()
        self.kernel_shards = self._scoring(self.params.k1, self.params.b)
        self._carry_union(prev)

    def _carry_union(self, prev: "BM25Leg | None") -> None:
        """Keep the union thresholds of ``prev`` (the leg of the generation a refresh replaces)
        for :meth:`_union_kth`: each ``(shard positions, depth)`` entry of its index-(k1, b) state
        as (its avgdl, its segments, depth, array); a later union over a superset of those
        segments takes them times :func:`bm25_carry.kth_factor` (see :meth:`_carried_union_kth`),
        so the first searches after a refresh do not pass over their terms' postings again. The
        arrays are referenced, not copied (4 bytes per term and entry, at most
        :attr:`KTH_CACHE` entries); nothing older than ``prev`` is kept, nor an entry over a
        segment this generation no longer lists."""
        if prev is None or not self.kernel_shards or not prev.kernel_shards:
            return
        if (float(prev.params.k1), float(prev.params.b)) != (float(self.params.k1), float(self.params.b)):
            return
        old = prev.kernel_shards[0]["shared"]["union_kth"]
        with prev._cache_lock:
            items = list(old.items())
        avg_then = prev.avgdl if prev.avgdl > 0 else 1.0
        mine = {id(seg) for seg in self._segs}
        prior = [(avg_then, tuple(prev._segs[s] for s in order), depth, arr) for (order, depth), arr in items]
        # only entries whose segments are all still listed can ever be used (not after a compaction)
        prior = [p for p in prior if all(id(g) in mine for g in p[1])]
        if prior:
            self.kernel_shards[0]["shared"]["union_prior"] = prior

    def _carry_tokens(self, cache: SegmentCache, reader: IndexReader) -> "BM25Leg | None":
        """Start from the query token caches of the newest BM25 leg of the same index in ``cache``
        (the generation a refresh replaces), so the first searches after a refresh do not analyse
        every token again: the vocabulary is append-only (a generation's vocabulary files extend
        the previous one's), so a token's term id stays valid; tokens that had none (-1) are
        looked up again, since a new term may now match them. Nothing is carried when the
        vocabulary files are not an extension or the analyzer differs.

        Returns:
            that leg (None when there is none or it does not qualify), for :meth:`_carry_union`.
        """
        key = ("bm25-tokens", str(reader.path))
        ref = cache.peek(key)
        cache.put(key, weakref.ref(self))
        files = tuple(reader.manifest.get("vocab") or ("vocab.arrow",))
        self._vocab_files = tuple((f, (reader.manifest["files"].get(f) or {}).get("sha256")) for f in files)
        prev = ref() if ref is not None else None
        if (prev is None or prev is self or prev.analyzer.config != self.analyzer.config
                or prev._vocab_files != self._vocab_files[:len(prev._vocab_files)]):
            return None
        self._token_ids = {t: i for t, i in prev._token_ids.copy().items() if i >= 0}
        with prev._table_lock.read():
            table = prev._table.copy() if prev._table is not None and prev._table.n < self.TOKEN_TABLE_MAX else None
            char_args = prev._char_args
        if table is None:
            return prev
        absent = np.flatnonzero(table.value[:table.n] < 0)
        if len(absent):
            toks = [table.tokens(int(e), int(e) + 1)[0] for e in absent]
            vocab = self.vocab
            table.value[absent] = [-1 if t is None else vocab.get(t, -1) for t in self.analyzer.terms(toks)]
        self._table, self._char_args = table, char_args
        self._slot = np.full(len(self.idf), -1, dtype=np.int64)
        return prev

    def _load_segment(self, reader: IndexReader, s: Shard, n_terms: int) -> SegmentState:
        """One segment's checked ``bm25.arrow`` arrays, membership bitmaps of its long lists and
        scored lengths (independent of k1 / b and of the corpus statistics, so a refresh reuses
        them)."""
        a = load_bm25_arrays(reader, s, n_terms)
        dl = a["doc_len"].astype(np.int64)
        return SegmentState(a, self._dense_bitmaps(s.rows, a), lucene_norm_length(dl) if self.params.lucene_norms else dl)

    #: lists holding at least 1/DENSE_BITMAP_RATIO of a shard's documents get a membership bitmap
    #: (see :meth:`_dense_bitmaps`).
    DENSE_BITMAP_RATIO = 32

    def _dense_bitmaps(self, rows: int, a: dict) -> dict:
        """Membership bitmaps of a shard's lists with at least rows / :attr:`DENSE_BITMAP_RATIO`
        postings (``_kernels.bm25_dense_bitmaps``): MaxScore probes such a non-essential list for
        a candidate with a bit test and a popcount instead of a galloping seek (identical results).
        Memory: 12 bytes per 64 documents per such list, i.e. at most 1.5x those lists' doc ids
        on shards of 64 or more documents (on smaller shards every list qualifies: at most 12
        bytes per posting). E.g. 1M documents: ~188 KB per list; the 1M synthetic benchmark
        corpus has 165 such lists, 35 MB, built in 0.09 s. Built at open, O(their postings)."""
        slot, bits, rank = _kernels.bm25_dense_bitmaps(a["offsets"], a["doc_ids"], rows,
                                                       max(1, rows // self.DENSE_BITMAP_RATIO), n_threads=0)
        return {"dense_slot": slot, "dense_bits": bits, "dense_rank": rank}

    #: on shards of at most ``_kernels.BM25_AUTO_EXHAUSTIVE_DOCS`` documents, lists holding at least
    #: 1/IMPACT_ROW_RATIO of the documents get a dense impact row (see :meth:`_impact_rows`).
    IMPACT_ROW_RATIO = 4

    def _impact_rows(self, rows: int, a: dict, impacts: np.ndarray) -> dict:
        """Dense impact rows (``_kernels.bm25_impact_rows``) of a small shard's longest lists, those
        holding at least rows / :attr:`IMPACT_ROW_RATIO` documents: exhaustive scoring adds such a
        list to its accumulator as one vector pass (f32[rows], 0 where the term is absent)
        instead of one scattered read-add-write per posting; identical results. On SciFact
        (5,183 documents: 24 rows, 0.5 MB) the kernel runs ~5% faster that way; with lists of
        1/8 of the documents (124 rows) it ran ~10% slower (reading the rows costs more than
        the scatter saves), hence the ratio. Memory: 4 bytes per document per row, at most the
        impacts' own size (the longest lists first). Empty (no rows) on larger shards, where
        "auto" prunes instead of scoring exhaustively."""
        if rows == 0 or rows > _kernels.BM25_AUTO_EXHAUSTIVE_DOCS:
            return {}
        slot, impact_rows = _kernels.bm25_impact_rows(
            a["offsets"], a["doc_ids"], impacts, rows, min_df=max(1, -(-rows // self.IMPACT_ROW_RATIO)),
            max_rows=len(impacts) // rows, n_threads=0)
        if len(impact_rows) == 0:
            return {}
        return {"impact_rows": impact_rows, "impact_row_slot": slot}

    #: scoring states kept for per-call ``k1``/``b`` other than the index's (LRU).
    SCORING_CACHE = 2

    def _scoring(self, k1: float, b: float) -> list[dict]:
        """Per-shard arrays the kernel needs for (k1, b): doc_norm f32[n_docs] and the MaxScore /
        block-max upper bounds, and where they are computed exactly impacts f32[nnz]
        (``tf/(tf + doc_norm[d])`` per posting, 4 bytes per posting). The index's own (k1, b) is
        built at open and kept; other pairs are built on first use and cached (at most
        :attr:`SCORING_CACHE`). Per shard (:meth:`_shard_scoring`): exact at the first scoring
        of a segment, carried from the previous generation's state after a refresh."""
        key = (float(k1), float(b))
        if getattr(self, "kernel_shards", None) is not None and key == (float(self.params.k1), float(self.params.b)):
            return self.kernel_shards
        with self._cache_lock:
            hit = self._scoring_cache.get(key)
            if hit is not None:
                self._scoring_cache.move_to_end(key)
                return hit
        avg = self.avgdl if self.avgdl > 0 else 1.0
        out = [self._shard_scoring(s, seg, key, avg) for (s, _), seg in zip(self.shards, self._segs)]
        # shared by this state's shards only (never carried to another generation's state: shard
        # positions and thresholds differ there): union thresholds (_union_kth), shard sets (_shard_set)
        shared: dict = {"union_kth": OrderedDict(), "sets": {}}
        for ks in out:
            ks["shared"] = shared
        if getattr(self, "kernel_shards", None) is not None:
            with self._cache_lock:  # another thread may have built the same state meanwhile: keep one
                out = self._scoring_cache.setdefault(key, out)
                self._scoring_cache.move_to_end(key)
                while len(self._scoring_cache) > self.SCORING_CACHE:
                    self._scoring_cache.popitem(last=False)
        return out

    def _shard_scoring(self, s: Shard, seg: SegmentState, key: tuple[float, float], avg: float) -> dict:
        """One shard's scoring state for ``key`` = (k1, b) at mean length ``avg``.

        - The segment's newest state (an earlier generation's) has the same avgdl: reused.
        - It has another avgdl within :data:`bm25_carry.MAX_DRIFT` of the one its exact bounds
          were computed at: *carried* (O(rows + blocks), no pass over the postings): the new
          length norms, the exact bounds scaled up by :func:`bm25_carry.ub_factor`, no impacts
          (the kernels score from tf and the norms: the same float32 values), and single-term
          thresholds carried lazily from the earlier states (:meth:`_term_kth`).
        - Otherwise (a segment scored the first time, e.g. at open, or past the drift): *exact*:
          ``_kernels.bm25_upper_bounds`` and ``_kernels.bm25_impacts``, one pass over its postings.
        """
        k1, b = key
        a, dense = seg.arrays, seg.dense
        prev = seg.latest(key)
        if prev is not None and prev["avgdl"] == avg:
            return {**prev, "base": s.base}  # the same norms, bounds, impacts and thresholds
        norm = (k1 * (1.0 - b + b * seg.dl.astype(np.float64) / avg)).astype(np.float32)
        carried = (prev is not None and bm25_carry.drift(prev["exact"][0], avg) <= bm25_carry.MAX_DRIFT
                   and (not len(norm) or (np.isfinite(norm).all() and norm.min() >= 0)))
        if carried:
            avg0, term_ub0, block_offsets, block_ub0 = prev["exact"]
            g = bm25_carry.ub_factor(avg0, avg)
            if prev.get("ub_g") == g:  # the same grid factor of the same exact bounds: shared
                term_ub, block_ub = prev["term_ub"], prev["block_ub"]
            else:
                term_ub, block_ub = bm25_carry.scaled_up(term_ub0, g), bm25_carry.scaled_up(block_ub0, g)
            impacts, rows = None, {}
            exact = prev["exact"]
            # the previous state's thresholds, converted on first use (see _term_kth)
            prior = [(prev["avgdl"], prev["kth"], prev["kth_lock"])]
            # a NaN tf part (which voids the thresholds' proof) needs tf = 0 with a zero norm
            kth_ok = not (len(norm) and (norm == 0).any() and seg.tf_min == 0)
        else:
            term_ub, block_offsets, block_ub = _kernels.bm25_upper_bounds(
                a["offsets"], a["doc_ids"], a["tfs"], norm, block_size=128, n_threads=0)
            impacts = _kernels.bm25_impacts(a["offsets"], a["doc_ids"], a["tfs"], norm, n_threads=0)
            rows = self._impact_rows(s.rows, a, impacts)
            exact = (avg, term_ub, block_offsets, block_ub)
            g = 1.0
            prior = []
            kth_ok = None  # checked on first use (see _term_kth)
        # the per-shard arguments of _kernels.bm25_topk_shards (search_shards adds term_kth, allow)
        bundle = {"offsets": a["offsets"], "doc_ids": a["doc_ids"], "tfs": a["tfs"], "doc_norm": norm,
                  "impacts": impacts, "term_ub": term_ub, "block_offsets": block_offsets,
                  "block_ub": block_ub, "block_size": 128, "terms": a.get("terms"), **dense, **rows}
        kth: OrderedDict = OrderedDict()
        if carried:
            with prev["kth_lock"]:
                depths = list(prev["kth"])
            for depth in depths:  # the depths in use, made now rather than by a search
                kth[depth] = np.full(len(a["offsets"]) - 1, np.nan, dtype=np.float32)
        ks = {"base": s.base, "n_terms": len(a["offsets"]) - 1, "terms": a.get("terms"), "offsets": a["offsets"],
              "dense": dense, "rows": rows,
              "doc_ids": a["doc_ids"], "tfs": a["tfs"], "doc_norm": norm, "impacts": impacts,
              "term_ub": term_ub, "block_offsets": block_offsets, "block_ub": block_ub,
              "kth": kth, "kth_lock": threading.Lock(), "kth_ok": kth_ok, "bundle": bundle,
              "avgdl": avg, "exact": exact, "ub_g": g, "kth_prior": prior}
        seg.record(key, ks)
        return ks

    # ------------------------------------------------------------------ the leg protocol
    def prepare(self, queries: Sequence[str], params: BM25SearchParams | None = None,
                n_threads: int = 1) -> "BM25Prepared":
        """Analyse a batch once for every shard (:meth:`query_terms`), or plan the fused pass.

        Where one compiled pass can analyse and score together (an index of one shard scored
        exhaustively: ``algorithm`` ``"exhaustive"``, or ``"auto"`` on at most
        ``_kernels.BM25_AUTO_EXHAUSTIVE_DOCS`` documents; the index's ``k1``/``b``; at least
        :attr:`VECTORISE_MIN` queries; a token table that already holds tokens), the analysis is
        left to :meth:`search_shard` (``_kernels.bm25_topk_text``: each query analysed and scored
        on the same thread); otherwise the batch is analysed here. Identical results either way.

        Raises:
            QueryError: ``params`` of another leg.
        """
        p = params or BM25SearchParams()
        if not isinstance(p, BM25SearchParams):
            raise QueryError(f"bm25 leg params must be BM25SearchParams, got {type(p).__name__}")
        texts = queries if isinstance(queries, list) else list(queries)
        default = p.k1 is None and p.b is None
        scoring = self.kernel_shards if default else self._scoring(*p.resolve(self.params))
        utf8 = self._fused_input(texts, p) if default else None
        batch = None if utf8 is not None else self.query_terms(texts, n_threads)
        return BM25Prepared(texts, p.algorithm, scoring, batch, utf8)

    def prepare_vectors(self, vectors: Any, params: Any = None, n_threads: int = 1) -> "BM25Prepared":
        """The BM25 leg takes query text only.

        Raises:
            QueryError: always.
        """
        raise QueryError("the bm25 leg takes query text, not query vectors")

    def search_shard(self, prepared: "BM25Prepared", shard: int, ctx: SearchContext) -> TopK:
        """Top-``ctx.depth`` of shard position ``shard`` (global ordinals; see the protocol).

        Raises:
            QueryError: from the kernel's argument checks (names the array and value).
        """
        allow = ctx.allow_for(shard)
        if prepared.utf8 is not None:
            got = self._fused_topk(prepared, allow, ctx.depth, ctx.n_threads)
            if got is not None:
                return got
        batch = self.batch_of(prepared, ctx.n_threads)
        return self._kernel_topk(batch, prepared.scoring[shard], ctx.depth, ctx.n_threads, allow, prepared.algorithm)

    def search_shards(self, prepared: "BM25Prepared", shards: Sequence[int], ctx: SearchContext) -> TopK:
        """Top-``ctx.depth`` of the union of shard positions ``shards``, merged (global ordinals):
        equal, ids and scores bit for bit, to :meth:`search_shard` on each merged by
        :func:`retriever.topk.merge_topk`, in one compiled call (``_kernels.BM25ShardSet.topk``,
        i.e. ``bm25_topk_shards`` over shards parsed once) where each query goes through the
        shards in ordinal order with one top-k heap, so a later shard prunes from the k-th score
        the earlier ones reached (Lucene's shared minimum competitive score), and every shard
        from one threshold found for the whole index first (the union's best single-term k-th
        score, :meth:`_union_kth`, and priming over every shard's short lists): the first shards
        prune as well as a one-shard index does. One shard: :meth:`search_shard` (the fused pass
        where it applies).

        Raises:
            QueryError: from the kernel's argument checks (names the shard, array and value).
        """
        order = sorted(shards, key=lambda s: prepared.scoring[s]["base"])  # ordinal order
        if len(order) <= 1:
            return self.search_shard(prepared, order[0], ctx) if order else empty_topk(len(prepared.texts),
                                                                                       ctx.depth)
        q_offsets, q_terms, q_weights = self.batch_of(prepared, ctx.n_threads)
        algo, depth = prepared.algorithm, ctx.depth
        # "auto" decides per query over the union of the shards (exhaustive on few documents)
        small_auto = algo == "auto" and sum(len(prepared.scoring[s]["doc_norm"]) for s in order
                                            ) <= _kernels.BM25_AUTO_EXHAUSTIVE_DOCS
        allow = [ctx.allow_for(s) for s in order]
        masked = any(a is not None for a in allow)
        kth = None  # single-term thresholds over the union of the shards (see _union_kth)
        if algo != "exhaustive" and not small_auto and not masked and len(q_terms):
            kth = self._union_kth(prepared.scoring, order, q_terms, depth, ctx.n_threads)
        return self._shard_set(prepared.scoring, order).topk(
            q_offsets, q_terms, q_weights, depth, n_threads=ctx.n_threads, algorithm=algo,
            allow=allow if masked else None, term_kth=kth, term_kth_depth=depth if kth is not None else 0)

    def _shard_set(self, scoring: list[dict], order: Sequence[int]) -> Any:
        """The ``_kernels.BM25ShardSet`` of the shard positions ``order`` (ordinal order) for a
        scoring state: their kernel arrays parsed and checked once, cached on the state (a call
        then pays no per-shard argument checks: ~5 us a shard, as much as a short query costs)."""
        sets: dict = scoring[order[0]]["shared"]["sets"]
        key = tuple(order)
        got = sets.get(key)
        if got is None:
            bases = np.fromiter((scoring[s]["base"] for s in order), np.int64, len(order))
            got = sets.setdefault(key, _kernels.BM25ShardSet([scoring[s]["bundle"] for s in order], bases,
                                                             n_terms=len(self.idf)))
        return got

    def score_docs(self, prepared: "BM25Prepared", shard: int, offsets: np.ndarray,
                   ordinals: np.ndarray) -> np.ndarray:
        """Exact BM25 scores of given documents of shard position ``shard``: for query i the
        shard-local ordinals ``ordinals[offsets[i]:offsets[i+1]]``; float32, aligned with
        ``ordinals``, bit-identical to what the top-k kernels report (the same float32 sum, term
        by term in the query's order, of ``weight · impact``); 0 where no query term occurs.

        Each query term's posting list is searched for the documents (binary search: postings are
        sorted by document within a list), O(terms · candidates · log(list length)).

        Raises:
            QueryError: an ordinal outside the shard, or offsets that do not fit ``ordinals``.
        """
        ks = prepared.scoring[shard]
        batch = shard_batch(ks["terms"], ks["n_terms"], *self.batch_of(prepared, 1))
        q_off, q_terms, q_weights = (x.astype(np.int64) if i == 0 else x for i, x in enumerate(batch))
        return score_postings(ks["offsets"], ks["doc_ids"], ks["impacts"], ks["n_terms"],
                              q_off, q_terms, q_weights, offsets, ordinals, len(ks["doc_norm"]),
                              tfs=ks["tfs"], doc_norm=ks["doc_norm"])

    def batch_of(self, prepared: "BM25Prepared", n_threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The analysed batch ``(q_offsets u64, q_terms u32, q_weights f32)`` of ``prepared``
        (analysed now, once, if the fused pass had left it for later)."""
        if prepared.batch is None:
            prepared.batch = self.query_terms(prepared.texts, n_threads)
        return prepared.batch

    def query_terms(self, queries: Sequence[str], n_threads: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Analyse queries into a ragged batch.

        Tokens map to term ids through a cache (token → id, filled on first sight by the
        analyzer's stop-word / stemming / vocabulary lookup). Batches of :attr:`VECTORISE_MIN`
        or more queries go through a token table kept across calls: once the table holds tokens,
        ``_kernels.bm25_query_terms`` analyses the batch against it (C++, ``n_threads`` threads,
        GIL released) and only the queries it cannot finish (a token never seen, a code point above
        U+FFFF) go through the compiled numba scanner, which adds their tokens
        (:meth:`_query_terms_compiled`). Smaller batches go through a plain loop. All paths give
        the same output.

        Returns:
            ``(q_offsets u64[nq+1], q_terms u32[m], q_weights f32[m])``: unique known terms per
            query in first-occurrence order, weight = float32(occurrences · idf) (product in
            float64).
        """
        if len(queries) < self.VECTORISE_MIN:
            tokenize = self.analyzer.tokenize
            return self._query_terms_loop([tokenize(q) for q in queries])
        got = self._query_terms_compiled(queries, n_threads)
        if got is not None:
            return got
        nq = len(queries)
        # each distinct token of the batch is looked up once (compiled scanner for large batches)
        batch = self.analyzer.tokenize_batch(list(queries))
        ids_l = list(map(self._token_ids.get, batch.tokens))
        if None in ids_l:
            ids_l = [self._token_id(t) if i is None else i for t, i in zip(batch.tokens, ids_l)]
        ids = np.array(ids_l, dtype=np.int64)[batch.token_ids]
        lens = np.diff(batch.offsets)
        qidx = np.repeat(np.arange(nq, dtype=np.int64), lens)
        keep = ids >= 0
        ids, qidx = ids[keep], qidx[keep]
        # one key per (query, term); np.unique's first index restores first-occurrence order
        _, first, counts = np.unique(qidx * (len(self.idf) + 1) + ids, return_index=True, return_counts=True)
        order = np.argsort(first, kind="stable")
        at = first[order]
        terms = ids[at]
        weights = (counts[order].astype(np.float64) * self.idf[terms].astype(np.float64)).astype(np.float32)
        offsets = np.zeros(nq + 1, dtype=np.uint64)
        np.cumsum(np.bincount(qidx[at], minlength=nq), out=offsets[1:])
        return offsets, terms.astype(np.uint32), weights

    def _query_terms_compiled(self, queries: Sequence[str],
                              n_threads: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`query_terms` against the token table kept across calls: the read-only C++ pass
        first, then :meth:`_query_terms_scan` for the queries it leaves (all of them while the
        table is empty); the two parts are spliced back in query order. ``None``: the batch cannot
        be encoded as UTF-8 (lone surrogates)."""
        self._load_char_args()
        from retriever.index.analyzer_kernels import utf8_arrays

        texts = queries if isinstance(queries, list) else list(queries)
        n = len(texts)
        try:
            data, offsets = utf8_arrays(texts)
        except UnicodeError:  # lone surrogates
            return None
        fast = None
        with self._table_lock.read():
            table = self._table
            if table is not None and 0 < table.n < self.TOKEN_TABLE_MAX:
                fast = _kernels.bm25_query_terms(
                    data, offsets, table.slots, table.off, table.blob, table.value, table.n, *self._char_args,
                    self.idf, n_threads=n_threads)
                if not fast[3].any():
                    return fast[:3]
        with self._table_lock.write():
            self._reset_table()
            if fast is None:
                return self._query_terms_scan(texts, data, offsets)
            todo = np.flatnonzero(fast[3])
            if 2 * len(todo) >= n:
                return self._query_terms_scan(texts, data, offsets)
            sub = [texts[i] for i in todo.tolist()]
            return _splice(fast[:3], todo, self._query_terms_scan(sub, *utf8_arrays(sub)))

    def _load_char_args(self) -> None:
        """The compiled analyzer's character tables (flags, fold_n, fold_cp, ASCII fold, lowercase),
        looked up once."""
        if self._char_args is None:
            from retriever.index.analyzer import _IDEO
            from retriever.index.analyzer_kernels import _ascii_fold, char_tables
            lowercase = bool(self.analyzer.config.lowercase)
            self._char_args = (*char_tables(_IDEO), _ascii_fold(_IDEO, lowercase), lowercase)

    def _reset_table(self) -> None:
        """A new, empty token table when there is none or it is full (caller holds the write lock)."""
        if self._table is None or self._table.n >= self.TOKEN_TABLE_MAX:
            from retriever.index.analyzer_kernels import TokenTable
            self._table = TokenTable()
            self._slot = np.full(len(self.idf), -1, dtype=np.int64)

    def _query_terms_scan(self, texts: list[str], data: np.ndarray,
                          offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`query_terms` through the compiled numba scanner, which adds new tokens to the table
        (caller holds the table lock; ``data`` / ``offsets``: the texts' UTF-8 bytes).

        The table maps each token seen so far to its term id (-1: stop word, over-long or not
        in the vocabulary), so a batch is scanned, looked up and deduplicated with no Python
        work per token; only tokens never seen before go through the analyzer (stop words,
        stemming) and the vocabulary. A text with a code point above U+FFFF is tokenised in
        Python and its tokens looked up in the same table. The texts must encode as UTF-8 (the
        caller has checked).
        """
        try:
            return self._scan_into_table(texts, data, offsets)
        except BaseException:
            # entries added before the failure have no term ids yet: drop the table (a cache;
            # the next batch starts a new one) rather than leave them for later searches
            self._table = None
            raise

    def _scan_into_table(self, texts: list[str], data: np.ndarray,
                         offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The body of :meth:`_query_terms_scan` (caller holds the table's write lock)."""
        from retriever.index.analyzer import _IDEO
        from retriever.index.analyzer_kernels import query_term_weights, scan_tokens, utf8_arrays

        n = len(texts)
        lowercase = self.analyzer.config.lowercase
        table = self._table
        vals: list[np.ndarray] = []
        counts = np.zeros(n, dtype=np.int64)
        start = 0
        while start < n:
            done, v, cnt, first_new = scan_tokens(data, offsets[start:], table, lowercase=lowercase,
                                                  ideo_class=_IDEO, stop_on_astral=True)
            vals.append(self._resolve(v, first_new))
            counts[start:start + done] = cnt
            start += done
            if start == n:
                break
            toks = self.analyzer.tokenize(texts[start])  # a text the scanner leaves to Python
            if toks:
                _, v, _, first_new = scan_tokens(*utf8_arrays(toks), table, lowercase=False, ideo_class=_IDEO,
                                                 verbatim=True)
                vals.append(self._resolve(v, first_new))
            counts[start] = len(toks)
            start += 1
        ids = vals[0] if len(vals) == 1 else np.concatenate(vals)
        return query_term_weights(ids, counts, self.idf, self._slot)

    def _resolve(self, entries: np.ndarray, first_new: int) -> np.ndarray:
        """Term ids (i64, -1 = no term) of token-table ``entries`` (i32, from ``scan_tokens``),
        after giving the entries added since ``first_new`` their term ids (caller holds the
        table lock)."""
        table = self._table
        if table.n > first_new:
            new_tokens = table.tokens(first_new, table.n)
            vocab = self.vocab
            terms = self.analyzer.terms(new_tokens)
            new_ids = np.asarray([-1 if t is None else vocab.get(t, -1) for t in terms], dtype=np.int64)
            table.set_values(first_new, new_ids)
        return table.value[entries]

    #: the query token table is emptied when it holds this many distinct tokens.
    TOKEN_TABLE_MAX = 2_000_000

    #: query batches at least this large are counted with numpy in :meth:`query_terms`.
    VECTORISE_MIN = 16

    def _query_terms_loop(self, toks: list[list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`query_terms` for tokenised queries, one query at a time."""
        offsets = [0]
        terms: list[int] = []
        weights: list[float] = []
        idf = self.idf.item  # a Python float: the product is float64, then rounded to float32
        get = self._token_ids.get
        for qt in toks:
            ids = list(map(get, qt))
            if None in ids:
                ids = [self._token_id(t) if i is None else i for t, i in zip(qt, ids)]
            counts: dict[int, int] = {}  # first-occurrence order (a Counter costs ~3 us more per query)
            for i in ids:
                counts[i] = counts.get(i, 0) + 1
            for i, c in counts.items():
                if i >= 0:
                    terms.append(i)
                    weights.append(c * idf(i))
            offsets.append(len(terms))
        return (np.asarray(offsets, dtype=np.uint64), np.asarray(terms, dtype=np.uint32),
                np.asarray(weights, dtype=np.float32))

    def _token_id(self, token: str) -> int:
        """Term id of a query token (-1: stop word, over-long or not in the vocabulary); cached."""
        if len(self._token_ids) >= 2_000_000:
            self._token_ids.clear()
        term = self.analyzer.term(token)
        i = -1 if term is None else self.vocab.get(term, -1)
        self._token_ids[token] = i
        return i

    def _fused_input(self, texts: list[str], p: BM25SearchParams) -> tuple[np.ndarray, np.ndarray] | None:
        """The UTF-8 bytes and offsets of ``texts`` when the fused pass applies (see
        :meth:`prepare`), else ``None``."""
        if len(texts) < self.VECTORISE_MIN or self.n_shards != 1 or p.algorithm not in ("auto", "exhaustive"):
            return None
        ks = self.kernel_shards[0]
        if p.algorithm == "auto" and len(ks["doc_norm"]) > _kernels.BM25_AUTO_EXHAUSTIVE_DOCS:
            return None
        if ks["n_terms"] < len(self.idf) or ks["terms"] is not None or self._char_args is None:
            return None
        from retriever.index.analyzer_kernels import utf8_arrays

        try:
            return utf8_arrays(texts)
        except UnicodeError:  # lone surrogates
            return None

    def _fused_topk(self, prepared: "BM25Prepared", allow: np.ndarray | None, depth: int,
                    n_threads: int) -> TopK | None:
        """The one-shard top-k through ``_kernels.bm25_topk_text`` (analysis and scoring in one
        compiled pass); queries holding a token the table lacks are analysed (and added) in Python,
        then scored. ``None`` when the token table is empty or full (the caller analyses)."""
        data, offsets = prepared.utf8
        ks = prepared.scoring[0]
        with self._table_lock.read():
            table = self._table
            if table is None or not 0 < table.n < self.TOKEN_TABLE_MAX:
                return None
            ids, scores, n_found, status = _kernels.bm25_topk_text(
                data, offsets, table.slots, table.off, table.blob, table.value, table.n, *self._char_args,
                self.idf, ks["offsets"], ks["doc_ids"], ks["tfs"], ks["doc_norm"], depth, n_threads=n_threads,
                allow=allow, impacts=ks["impacts"], **ks["rows"])
        if ks["base"]:  # shard ordinals to global ones
            ids = np.where(ids >= 0, ids + ks["base"], -1)
        if status.any():  # tokens the table lacks: analysed (and added) in Python, then scored
            todo = np.flatnonzero(status)
            batch = self.query_terms([prepared.texts[i] for i in todo.tolist()], n_threads)
            ids[todo], scores[todo], n_found[todo] = self._kernel_topk(batch, ks, depth, n_threads, allow,
                                                                       "exhaustive")
        return ids, scores, n_found

    def _kernel_topk(self, batch: tuple[np.ndarray, np.ndarray, np.ndarray], ks: dict, depth: int,
                     n_threads: int, allow: np.ndarray | None, algorithm: str) -> TopK:
        """``_kernels.bm25_topk`` over one shard's scoring state ``ks`` for an analysed batch."""
        # in the shard's term ids: its vocabulary may end before the index's (terms first seen
        # in later shards), or it lists only its own terms
        offs, terms, weights = shard_batch(ks["terms"], ks["n_terms"], *batch)
        algo = algorithm
        if algo == "auto" and len(ks["doc_norm"]) <= _kernels.BM25_AUTO_EXHAUSTIVE_DOCS:
            algo = "exhaustive"  # what "auto" picks for every query there; skips the bounds' checks
        kth = None
        if algo != "exhaustive" and len(terms):  # with allow: the bound of the filtered one (see the kernel)
            kth = self._term_kth(ks, terms, depth, n_threads)
        ids, scores, n_found = _kernels.bm25_topk(
            ks["offsets"], ks["doc_ids"], ks["tfs"], ks["doc_norm"], offs, terms, weights, depth,
            n_threads=n_threads, allow=allow, algorithm=algo,
            term_ub=ks["term_ub"], block_offsets=ks["block_offsets"], block_ub=ks["block_ub"],
            impacts=ks["impacts"], term_kth=kth, term_kth_depth=depth if kth is not None else 0,
            **(ks["dense"] if algo != "exhaustive" else ks["rows"]))
        if ks["base"]:  # the kernel pads with -1; shard ordinals to global ones
            ids = np.where(ids >= 0, ids + ks["base"], -1)
        return ids, scores, n_found

    #: depths whose single-term thresholds are kept per shard and (k1, b) (LRU).
    KTH_CACHE = 4

    def _term_kth(self, ks: dict, terms: np.ndarray, depth: int, n_threads: int) -> np.ndarray | None:
        """Single-term thresholds for the safe initial MaxScore/BMW threshold: f32[n_terms] whose
        entry for each of ``terms`` is the ``depth``-th largest impact of the term's list (-inf for
        a list shorter than ``depth``; NaN = not computed yet). Filled lazily, only for the terms a
        batch uses, by ``_kernels.bm25_term_kth`` (one pass over each new term's postings, skipping
        blocks whose bound cannot matter; GIL released) and cached on the shard's scoring state
        keyed by ``depth`` (that state is already keyed by ``(k1, b)``): 4 bytes per term and
        cached depth (4 MB for 1M terms), at most :attr:`KTH_CACHE` depths, plus one O(nnz) NaN
        check of the impacts per (k1, b). The fill time of a benchmark's query terms is reported
        by ``benchmarks/bench_bm25.py`` (``term_kth_fill_seconds``; timed passes run after it).
        Returns None (no initial threshold) when the impacts hold a NaN, which would
        void the bound's proof (see ``bm25_worker::single_term_threshold``)."""
        if ks["kth_ok"] is None:
            ks["kth_ok"] = not bool(np.isnan(ks["impacts"]).any())
        if not ks["kth_ok"]:
            return None
        cache: OrderedDict = ks["kth"]
        with ks["kth_lock"]:  # shared by concurrent searches (an unlocked get + move_to_end raced)
            arr = cache.get(depth)
            if arr is None:
                arr = np.full(ks["n_terms"], np.nan, dtype=np.float32)
                cache[depth] = arr
                while len(cache) > self.KTH_CACHE:
                    cache.popitem(last=False)
            else:
                cache.move_to_end(depth)
        # concurrent fills of one array write the same values (a term's threshold is deterministic)
        need = terms[np.isnan(arr[terms])]
        if len(need):
            need = np.unique(need)
            need = self._carried_kth(ks, depth, arr, need)
        if len(need):
            arr[need] = _kernels.bm25_term_kth(
                ks["offsets"], ks["doc_ids"], ks["tfs"], ks["doc_norm"], need, depth,
                impacts=ks["impacts"], block_offsets=ks["block_offsets"], block_ub=ks["block_ub"],
                block_size=128, n_threads=n_threads)
        return arr

    def _union_kth(self, scoring: list[dict], order: Sequence[int], terms: np.ndarray, depth: int,
                   n_threads: int) -> np.ndarray | None:
        """:meth:`_term_kth` over the union of the shard positions ``order``: f32[n_terms] whose
        entry for each of ``terms`` is the ``depth``-th largest impact of the term's postings in
        those shards together (what one shard holding them would give; -inf for fewer than
        ``depth``; NaN = not computed yet), filled lazily: first from the previous generation's
        union thresholds over a subset of these segments (:meth:`_carried_union_kth`, after a
        refresh), else by ``BM25ShardSet.term_kth`` (``_kernels.bm25_term_kth_shards``; segments
        carried across a refresh are read from tf and their length norms), and cached on the
        scoring state (one dict shared by its shards, keyed by the shards and the depth; at most
        :attr:`KTH_CACHE` entries): 4 bytes per term and entry. ``bm25_topk_shards`` starts each
        query from the best single-term value over the union, so the first shards prune from the
        threshold a one-shard index would start from. None when a shard's tf parts may hold a
        NaN (see :meth:`_term_kth`)."""
        for s in order:
            ks = scoring[s]
            if ks["kth_ok"] is None:  # set at carry for a segment without impacts
                ks["kth_ok"] = not bool(np.isnan(ks["impacts"]).any())
            if not ks["kth_ok"]:
                return None
        cache: OrderedDict = scoring[order[0]]["shared"]["union_kth"]
        key = (tuple(order), depth)
        with self._cache_lock:
            arr = cache.get(key)
            if arr is None:
                arr = np.full(len(self.idf), np.nan, dtype=np.float32)
                cache[key] = arr
                while len(cache) > self.KTH_CACHE:
                    cache.popitem(last=False)
            else:
                cache.move_to_end(key)
        # concurrent fills of one array write the same values (a term's threshold is deterministic)
        need = terms[np.isnan(arr[terms])]
        if len(need):
            need = self._carried_union_kth(scoring, order, depth, arr, np.unique(need))
        if len(need):
            arr[need] = self._shard_set(scoring, order).term_kth(need, depth, n_threads=n_threads)
        return arr

    def _carried_union_kth(self, scoring: list[dict], order: Sequence[int], depth: int, arr: np.ndarray,
                           need: np.ndarray) -> np.ndarray:
        """Fill ``arr[need]`` from the previous generation's union thresholds at ``depth`` over a
        subset of the segments of ``order`` (``shared["union_prior"]``, set by
        :meth:`_carry_union`), times :func:`bm25_carry.kth_factor`: every posting's tf part now is
        at least that factor times its tf part then, so the k-th largest over the old segments,
        scaled, is at most the k-th largest over them now, and the k-th largest over a superset
        is at least that (tombstones do not matter: union thresholds are only used by searches
        without an allow mask). Returns the terms still to compute."""
        prior = scoring[order[0]]["shared"].get("union_prior")
        if not prior:
            return need
        mine = {id(self._segs[s]) for s in order} if scoring is self.kernel_shards else set()
        avg_now = scoring[order[0]]["avgdl"]
        for avg_then, segs, d, old in prior:
            if d != depth or not all(id(g) in mine for g in segs):
                continue
            inside = need < len(old)  # terms the older vocabulary did not have: none there
            idx = need[inside]
            vals = old[idx]
            got = ~np.isnan(vals)
            if got.any():
                arr[idx[got]] = bm25_carry.scaled_down(vals[got], bm25_carry.kth_factor(avg_then, avg_now))
                done = np.zeros(len(need), dtype=bool)
                done[np.flatnonzero(inside)[got]] = True
                need = need[~done]
            if not len(need):
                break
        return need


    @staticmethod
    def _carried_kth(ks: dict, depth: int, arr: np.ndarray, need: np.ndarray) -> np.ndarray:
        """Fill ``arr[need]`` from the previous generation's thresholds of the same segment where
        it has them (``ks["kth_prior"]``), times :func:`bm25_carry.kth_factor`: a k-th largest tf
        part at the earlier avgdl, so scaled, is at most the k-th largest now (a safe initial
        threshold; see :mod:`retriever.legs.bm25_carry`). Returns the terms still to compute."""
        for avg_then, kdict, lock in ks["kth_prior"]:
            with lock:
                old = kdict.get(depth)
            if old is None:
                continue
            vals = old[need]
            got = ~np.isnan(vals)
            if got.any():
                arr[need[got]] = bm25_carry.scaled_down(vals[got], bm25_carry.kth_factor(avg_then, ks["avgdl"]))
                need = need[~got]
        return need


class _ReadWriteLock:
    """Many readers or one writer (the query token table: searches read it side by side, adding
    tokens writes it). Writers go first: a reader waits while a writer waits, so steady searches
    cannot keep a batch with new tokens out."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


def _splice(fast: tuple[np.ndarray, np.ndarray, np.ndarray], todo: np.ndarray,
            rest: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One ragged batch from two: ``fast`` covers every query (those in ``todo`` empty), ``rest``
    covers the queries ``todo`` (ascending) in order."""
    f_off, f_terms, f_weights = fast
    r_off, r_terms, r_weights = rest
    counts = np.diff(f_off.astype(np.int64))
    counts[todo] = np.diff(r_off.astype(np.int64))
    offsets = np.zeros(len(f_off), dtype=np.uint64)
    np.cumsum(counts, out=offsets[1:])
    from_rest = np.zeros(len(counts), dtype=bool)
    from_rest[todo] = True
    where = np.repeat(from_rest, counts)
    terms = np.empty(len(where), dtype=np.uint32)
    weights = np.empty(len(where), dtype=np.float32)
    terms[~where], weights[~where] = f_terms, f_weights
    terms[where], weights[where] = r_terms, r_weights
    return offsets, terms, weights


@dataclass
class BM25Prepared:
    """A batch prepared by :meth:`BM25Leg.prepare`.

    Attributes:
        texts: the query strings.
        algorithm: the top-k algorithm of this call.
        scoring: per held shard, the kernel's scoring state for this call's (k1, b).
        batch: the analysed batch ``(q_offsets u64[nq+1], q_terms u32, q_weights f32)``, or
            ``None`` while the fused pass is to analyse (filled on first need).
        utf8: ``(data u8, offsets i64)`` of the texts for the fused pass, or ``None``.
    """

    texts: list[str]
    algorithm: str
    scoring: list[dict]
    batch: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    utf8: tuple[np.ndarray, np.ndarray] | None

    @property
    def n_queries(self) -> int:
        """Queries in the batch."""
        return len(self.texts)


def load_bm25_arrays(reader: IndexReader, s: Shard, n_terms: int) -> dict[str, np.ndarray]:
    """A shard's ``bm25.arrow`` (postings CSR, term frequencies, document lengths), checked
    (:func:`retriever.index.bm25_build.check_bm25_segment`, ``_kernels.check_csr``). A living
    index's segment that lists only its own terms keeps that form: ``terms`` (u32, the index's
    term id of each list, ascending) beside ``offsets`` over them, so everything derived from it
    at open (bounds, bitmaps, thresholds, df) is O(its own terms), not O(the vocabulary); its
    lists are addressed through :func:`shard_batch`.

    Raises:
        IndexFormatError: arrays that do not match the manifest, the vocabulary or the shard's
            rows, or corrupted postings (names the file).
    """
    compact = "bm25_terms" in s.entry
    a = reader.shard_arrays(s, "bm25.arrow", BM25_COMPACT_ARRAYS if compact else BM25_ARRAYS)
    try:
        check_bm25_segment(a, s.entry, n_terms, s.rows)
    except ValueError as e:
        raise _fmt_error(s.dir / "bm25.arrow", str(e)) from None
    try:
        _kernels.check_csr(a["offsets"], a["doc_ids"], s.rows)
    except ValueError as e:
        raise _fmt_error(s.dir / "bm25.arrow", f"corrupted postings ({e})") from None
    return a


def shard_batch(terms: np.ndarray | None, n_terms: int, q_offsets: np.ndarray, q_terms: np.ndarray,
                q_weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A query batch (index term ids) in a shard's own term ids: without a term map
    (``terms`` None) the terms at or past the shard's ``n_terms`` dropped; with one (u32
    ascending, the index's id of each of the shard's lists) each term replaced by its position
    there, those it lacks dropped. Every query keeps its row. O(batch · log(len(terms)))."""
    if terms is None:
        if len(q_terms) and q_terms.max() >= n_terms:
            return drop_terms(q_offsets, q_terms, q_weights, q_terms < n_terms)
        return q_offsets, q_terms, q_weights
    pos = np.searchsorted(terms, q_terms)
    hit = pos < len(terms)
    hit[hit] = terms[pos[hit]] == q_terms[hit]
    offs, _, weights = drop_terms(q_offsets, q_terms, q_weights, hit)
    return offs, pos[hit].astype(np.uint32), weights


def read_vocab(reader: IndexReader, cache: SegmentCache) -> dict[str, int]:
    """term -> term id of the generation's BM25 vocabulary: the files of the manifest's ``vocab``
    list (default ``["vocab.arrow"]``) concatenated; a living index appends a file per generation
    that added terms. The dict of a prefix of the list is reused from ``cache`` (a refresh reads
    only the new files; the cached dict itself is never modified).

    Raises:
        IndexFormatError: a missing vocabulary file or a term listed twice (names the file).
    """
    files = tuple(reader.manifest.get("vocab") or ("vocab.arrow",))
    # the files' digests are in the key too: an index rebuilt in place lists a vocab.arrow of other terms
    digests = tuple((reader.manifest["files"].get(rel) or {}).get("sha256") for rel in files)
    for cut in range(len(files), 0, -1):
        hit = cache.peek(("vocab", str(reader.path), files[:cut], digests[:cut]))
        if hit is not None:
            break
    else:
        cut, hit = 0, {}

    def make() -> dict[str, int]:
        vocab = dict(hit) if cut < len(files) else hit
        for rel in files[cut:]:
            path = reader.path / rel
            vt = reader.files.table(rel, full=True)  # listed, confined, no symlink, a regular file
            if "term" not in vt.column_names or not (pa.types.is_string(vt.schema.field("term").type)
                                                     or pa.types.is_large_string(vt.schema.field("term").type)):
                raise _fmt_error(path, f"has columns {vt.schema}, expected a string column 'term'")
            terms = vt.column("term").to_pylist()
            before = len(vocab)
            vocab.update(zip(terms, range(before, before + len(terms))))
            if len(vocab) != before + len(terms):
                raise _fmt_error(path, "a term is listed twice in the vocabulary")
        return vocab

    return cache.get(("vocab", str(reader.path), files, digests), make)


def live_shard_stats(reader: IndexReader, s: Shard, a: dict[str, np.ndarray], n_terms: int,
                     own: BM25Stats | None = None) -> BM25Stats:
    """BM25 statistics of a shard's live documents: N, the sum of lengths and df of its rows
    less its tombstones (``s.deleted``); df covers the shard's own terms (the first
    ``len(a["offsets"]) - 1`` of the vocabulary, or those of its term map ``a["terms"]``;
    :meth:`BM25Stats.combine` places them). The deleted
    documents' df is read from the tombstone file (arrays ``bm25_terms`` / ``bm25_df``, written
    by :class:`retriever.index.updates.IndexUpdater`), or counted from the postings where the
    file lacks them (O(the shard's postings)). ``own``: the statistics of all the shard's rows
    when already known (:attr:`SegmentState.stats`).

    Raises:
        IndexFormatError: deleted df that exceeds the shard's df, names a term the shard lacks,
            or whose terms (u32, strictly ascending) and counts differ in length (names the file).
    """
    st = own if own is not None else BM25Stats(int(len(a["doc_len"])), int(a["doc_len"].sum(dtype=np.int64)),
                                               np.diff(a["offsets"]).astype(np.int64), a.get("terms"))
    if s.deleted is None or not len(s.deleted):
        return st
    rows = np.asarray(s.deleted, dtype=np.int64)
    dpath = reader.path / s.entry["deletes"] if s.entry.get("deletes") else None
    t_s = len(st.df)  # the shard's lists
    df_del = np.zeros(t_s, dtype=np.int64)
    got = None
    if dpath is not None:
        names = reader.files.table(s.entry["deletes"]).column_names
        if "bm25_terms" in names and "bm25_df" in names:
            got = reader.files.arrays(s.entry["deletes"], {"bm25_terms": np.uint32, "bm25_df": np.uint32})
    if got is not None:
        terms = got["bm25_terms"].astype(np.int64)
        if len(got["bm25_df"]) != len(terms):
            raise _fmt_error(dpath, f"deleted df has {len(got['bm25_df'])} counts for {len(terms)} terms")
        if len(terms) > 1 and (terms[1:] <= terms[:-1]).any():  # a repeated term would drop a count
            raise _fmt_error(dpath, "deleted df terms are not strictly ascending")
        if len(terms) and terms.max() >= n_terms:
            raise _fmt_error(dpath, f"deleted df names term {int(terms.max())} of {n_terms}")
        if st.terms is not None:  # the index's term ids to the shard's lists
            at = np.searchsorted(st.terms, terms)
            if len(terms) and (at.max() >= t_s or (st.terms[np.minimum(at, t_s - 1)] != terms).any()):
                raise _fmt_error(dpath, "deleted df names a term the shard does not list")
            terms = at
        if len(terms) and terms.max() >= t_s:
            raise _fmt_error(dpath, "deleted df exceeds the shard's df")
        df_del[terms] = got["bm25_df"]
    else:
        mask = np.zeros(s.rows, dtype=bool)
        mask[rows] = True
        hit = np.flatnonzero(mask[a["doc_ids"]])
        term_of = np.searchsorted(a["offsets"].astype(np.int64), hit, side="right") - 1
        df_del[:t_s] = np.bincount(term_of, minlength=t_s)[:t_s]
    df = st.df - df_del
    if (df < 0).any():
        raise _fmt_error(dpath, "deleted df exceeds the shard's df")
    dl_del = int(a["doc_len"][rows].sum(dtype=np.int64))
    return BM25Stats(st.n_docs - len(rows), st.sum_dl - dl_del, df, st.terms)


def combine_stats(cache: SegmentCache, key: tuple, part_keys: Sequence[tuple], parts: Sequence[BM25Stats],
                  n_terms: int) -> BM25Stats:
    """:meth:`BM25Stats.combine` of ``parts`` (cached under ``part_keys``), from the previous
    generation's sum where ``cache`` holds one under ``key``: that sum less the parts it had and
    this one lacks, plus the new parts (exact integer sums, equal to a full combine), so a
    refresh after a small commit adds O(the vocabulary + the changed segments' terms), not
    O(segments × vocabulary)."""
    prev = cache.peek(key)
    out = None
    if prev is not None and prev[1].span <= n_terms:
        old_keys, old = prev
        now = set(part_keys)
        removed = [k for k in old_keys if k not in now]
        kept = set(old_keys)
        added = [(k, p) for k, p in zip(part_keys, parts) if k not in kept]
        gone = [cache.peek(k) for k in removed]
        if len(removed) + len(added) < len(parts) and all(g is not None for g in gone):
            df = np.zeros(n_terms, dtype=np.int64)
            df[:len(old.df)] = old.df
            n_docs, sum_dl = old.n_docs, old.sum_dl
            for g in gone:
                g.add_into(df, -1)
                n_docs, sum_dl = n_docs - g.n_docs, sum_dl - g.sum_dl
            for _, p in added:
                p.add_into(df)
                n_docs, sum_dl = n_docs + p.n_docs, sum_dl + p.sum_dl
            out = BM25Stats(n_docs, sum_dl, df)
    if out is None:
        out = BM25Stats.combine(parts, n_terms)
    cache.put(key, (tuple(part_keys), out))
    return out


def drop_terms(q_offsets: np.ndarray, q_terms: np.ndarray, q_weights: np.ndarray,
               keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ragged batch with only the entries where ``keep`` (bool, one per entry) is true; every
    query keeps its row (possibly empty). Counts come from each entry's query index, so empty
    queries anywhere (the last ones included) are fine (a per-query ``np.add.reduceat`` over the
    offsets failed when the last queries were empty)."""
    nq = len(q_offsets) - 1
    qidx = np.repeat(np.arange(nq, dtype=np.int64), np.diff(q_offsets.astype(np.int64)))
    counts = np.bincount(qidx[keep], minlength=nq)
    offs = np.zeros(nq + 1, dtype=np.uint64)
    np.cumsum(counts, out=offs[1:])
    return offs, q_terms[keep], q_weights[keep]


def score_postings(offsets: np.ndarray, doc_ids: np.ndarray, impacts: np.ndarray | None, n_terms: int,
                   q_offsets: np.ndarray, q_terms: np.ndarray, q_weights: np.ndarray,
                   c_offsets: np.ndarray, c_docs: np.ndarray, n_docs: int, *,
                   tfs: np.ndarray | None = None, doc_norm: np.ndarray | None = None) -> np.ndarray:
    """Scores ``Σ_t float32(w_t · impact(t, d))`` of given documents, term by term in query order
    in float32 (the exhaustive kernel's arithmetic, so equal bit for bit to its scores).

    Args:
        offsets, doc_ids, impacts: a shard's postings (CSR by term, documents ascending within a
            list) and per-posting impacts (float32); ``impacts`` None: computed from ``tfs``
            (u32 per posting) and ``doc_norm`` (f32 per document) as the kernels do,
            ``float32(tf) / (float32(tf) + doc_norm[d])`` in float32.
        n_terms: terms the shard's postings cover (larger query term ids score 0 there).
        q_offsets, q_terms, q_weights: the ragged query batch (int64 offsets).
        c_offsets: int64 (nq + 1,) offsets into ``c_docs`` per query.
        c_docs: int64 shard-local documents to score.
        n_docs: the shard's documents.

    Returns:
        float32 scores aligned with ``c_docs``.

    Raises:
        QueryError: offsets that do not fit, or a document outside ``[0, n_docs)`` (names it).
    """
    nq = len(q_offsets) - 1
    c_offsets, c_docs = check_candidates(c_offsets, c_docs, nq, n_docs)
    out = np.zeros(len(c_docs), dtype=np.float32)
    for q in range(nq):
        lo_c, hi_c = int(c_offsets[q]), int(c_offsets[q + 1])
        if lo_c == hi_c:
            continue
        docs = c_docs[lo_c:hi_c]
        acc = np.zeros(hi_c - lo_c, dtype=np.float32)
        for j in range(int(q_offsets[q]), int(q_offsets[q + 1])):
            t = int(q_terms[j])
            if t >= n_terms:
                continue
            lo, hi = int(offsets[t]), int(offsets[t + 1])
            lst = doc_ids[lo:hi]
            pos = np.searchsorted(lst, docs)
            hit = pos < len(lst)
            hit[hit] = lst[pos[hit]] == docs[hit]
            contrib = np.zeros(len(docs), dtype=np.float32)
            at = lo + pos[hit]
            if impacts is not None:
                imp = impacts[at]
            else:
                tf = tfs[at].astype(np.float32)
                imp = tf / (tf + doc_norm[docs[hit]])
            contrib[hit] = np.float32(q_weights[j]) * imp
            acc[hit] = acc[hit] + contrib[hit]  # float32 add, only where the term occurs
        out[lo_c:hi_c] = acc
    return out


def _fmt_error(path: Any, msg: str) -> IndexFormatError:
    return IndexFormatError(f"{path}: {msg}")
