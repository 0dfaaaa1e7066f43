"""Typed stubs of ``retriever._kernels``, the C++ query-time kernels (pybind11).

Built from ``cpp_ext/*.cpp`` by ``setup.py``. All functions are stateless: no C++
object outlives a call.

Conventions shared by every function
------------------------------------
* Arrays must already have the exact dtype and be C-contiguous. Anything else
  (another dtype, a strided view, a list) raises ``TypeError``; nothing is ever
  copied or converted. Read-only arrays (memory-mapped Arrow buffers) are fine.
* Bad values raise ``ValueError`` whose message names the argument and the value.
* The GIL is released while the C++ work runs, so calls from several Python
  threads run in parallel.
* ``n_threads``: worker threads for this call; ``<= 0`` means
  ``std::thread::hardware_concurrency()``. A batch is split by queries and every
  worker owns its scratch memory, so results are bit-identical for any
  ``n_threads``. An exception in a worker is re-raised in the calling thread.
* CSR postings of one shard: term ``t`` owns ``doc_ids[offsets[t]:offsets[t+1]]``
  (strictly increasing shard-local doc ids) and the same slice of ``tfs`` /
  ``impacts``. :func:`check_csr` validates this once at index open; the per-call
  kernels only check that the array lengths agree (O(1)) and the query arrays
  (O(nq + m)). A doc id ``>= n_docs`` met while scoring raises ``ValueError``.
* A ragged query batch: query ``i`` is ``q_terms[q_offsets[i]:q_offsets[i+1]]``
  with weights ``q_weights`` (same slice). ``q_offsets[0] == 0``, non-decreasing,
  ``q_offsets[-1] == len(q_terms)``; every ``q_terms`` value ``< n_terms``;
  every weight finite. A term repeated in a query counts once per occurrence.

Top-k results
-------------
``(ids, scores, n_found)``:

* ``ids``: int64 ``(nq, k)``, shard-local doc ids, padded with -1 past ``n_found``;
* ``scores``: float32 ``(nq, k)``, padded with ``-inf``;
* ``n_found``: int32 ``(nq,)``.

Rows are sorted by score descending, ties by smaller doc id. Only documents with
at least one posting among the query's terms are candidates (a document with no
matching term is never returned, even when k exceeds the number of matches); a
query with no terms returns ``n_found == 0``. ``k`` must be >= 1 (``ValueError``)
and may exceed ``n_docs``. With ``allow`` (uint8 ``(n_docs,)``, nonzero =
allowed; pass a bool mask as ``mask.view(np.uint8)``) disallowed documents are
never returned; k is still honoured whenever enough allowed documents match.
NaN scores are never returned.
"""

from typing import Literal, Mapping, Sequence

import numpy as np
import numpy.typing as npt

_U8 = npt.NDArray[np.uint8]
_U32 = npt.NDArray[np.uint32]
_U64 = npt.NDArray[np.uint64]
_I32 = npt.NDArray[np.int32]
_I64 = npt.NDArray[np.int64]
_F32 = npt.NDArray[np.float32]

def check_csr(offsets: _U64, doc_ids: _U32, n_docs: int) -> None:
    """O(nnz) structural check of one shard's CSR postings; run once at index open.

    Checks ``offsets[0] == 0``, ``offsets`` non-decreasing, ``offsets[-1] ==
    len(doc_ids)``, doc ids strictly increasing within every term and ``< n_docs``
    (``n_docs <= 2**32 - 1``).

    Raises:
        ValueError: naming the first violation (term, position and value).
        TypeError: wrong dtype or non-contiguous array.
    """

def bm25_upper_bounds(
    offsets: _U64,
    doc_ids: _U32,
    tfs: _U32,
    doc_norm: _F32,
    block_size: int = 128,
    n_threads: int = 0,
) -> tuple[_F32, _U64, _F32]:
    """Upper bounds of the BM25 tf part for MaxScore and block-max pruning.

    With ``part(p) = float32(tf) / (float32(tf) + doc_norm[doc_ids[p]])`` (float32,
    exactly the expression :func:`bm25_topk` uses):

    * ``term_ub``: float32 ``(n_terms,)``, max of ``part`` over the term's postings
      (0 for an empty list);
    * ``block_offsets``: uint64 ``(n_terms + 1,)``; term ``t``'s blocks are
      ``block_ub[block_offsets[t]:block_offsets[t+1]]``, one per ``block_size``
      consecutive postings (``ceil(len / block_size)`` blocks);
    * ``block_ub``: float32 ``(n_blocks,)``, max of ``part`` within each block.

    ``doc_norm`` depends on the corpus-wide avgdl, so compute the bounds when the
    index is opened, with the same ``doc_norm`` later passed to :func:`bm25_topk`,
    and pass the same ``block_size`` there. Parallel over terms.

    Raises:
        ValueError: ``doc_norm`` entry negative or not finite; a doc id ``>= n_docs``;
            ``block_size < 1``; array lengths disagree.
    """

def bm25_impacts(
    offsets: _U64,
    doc_ids: _U32,
    tfs: _U32,
    doc_norm: _F32,
    n_threads: int = 0,
) -> _F32:
    """Per-posting tf part of BM25 ("impacts" without the query weight):
    float32 ``(nnz,)`` with ``impacts[p] = float32(tfs[p]) / (float32(tfs[p]) +
    doc_norm[doc_ids[p]])``, exactly the float32 expression :func:`bm25_topk` computes,
    so passing them to :func:`bm25_topk` changes no score. 4 bytes per posting.
    Parallel over terms.

    Raises:
        ValueError: a doc id ``>= n_docs``; array lengths disagree; bad offsets.
        TypeError: wrong dtype or non-contiguous array.
    """

def bm25_dense_bitmaps(
    offsets: _U64,
    doc_ids: _U32,
    n_docs: int,
    min_df: int,
    n_threads: int = 0,
) -> tuple[_I32, _U64, _U32]:
    """Membership bitmaps of the lists with at least ``min_df`` postings, for
    :func:`bm25_topk`'s ``dense_slot`` / ``dense_bits`` / ``dense_rank``.

    Returns ``(slot int32 (n_terms,), bits uint64 (rows * words,), rank uint32
    (rows * words,))`` with ``words = ceil(n_docs / 64)``: ``slot[t]`` is term ``t``'s
    row or -1; bit ``d`` of row ``r`` (word ``d // 64``, bit ``d % 64``) is set iff
    ``d`` is in the list; ``rank[r * words + w]`` counts the list's postings with doc id
    ``< 64 * w``, so the posting of ``d`` is ``offsets[t] + rank + popcount`` of the
    lower bits of its word. Memory: 12 bytes per 64 documents per row (1.5x the
    list's doc ids at ``min_df = n_docs / 32``). A succinct rank directory in the
    spirit of Jacobson (1989). Parallel over lists.

    Raises:
        ValueError: a doc id ``>= n_docs`` in a list that gets a row; ``min_df < 1``;
            bad offsets or ``n_docs``.
        TypeError: wrong dtype or non-contiguous array.
    """

def bm25_impact_rows(
    offsets: _U64,
    doc_ids: _U32,
    impacts: _F32,
    n_docs: int,
    min_df: int,
    max_rows: int,
    n_threads: int = 0,
) -> tuple[_I32, _F32]:
    """Dense impact rows of the longest lists, for :func:`bm25_topk`'s
    ``impact_rows`` / ``impact_row_slot``: among the lists with at least ``min_df``
    postings, the ``max_rows`` longest (equal lengths: smaller term id first) get rows
    0, 1, ... in term order.

    Returns ``(slot int32 (n_terms,), rows float32 (n_rows * n_docs,))``: ``slot[t]`` is
    term ``t``'s row or -1; row ``r`` holds ``impacts[p]`` at ``doc_ids[p]`` for each
    posting ``p`` of its term and ``0.0`` elsewhere. Memory: ``4 * n_docs`` bytes per
    row. Parallel over rows.

    Raises:
        ValueError: a doc id ``>= n_docs`` in a list that gets a row; ``min_df < 1``;
            ``max_rows < 0``; ``len(impacts) != len(doc_ids)``; bad offsets or ``n_docs``.
        TypeError: wrong dtype or non-contiguous array.
    """

def tie_ranks(scores: _F32, n_found: _I32) -> _I32:
    """1-based competition ranks of sorted top-k rows: ``scores`` float32 ``(nq, k)``, each
    row descending, ``n_found`` int32 ``(nq,)``. ``ranks[q, j]`` = 1 + the first position of
    row ``q`` holding ``scores[q, j]`` (equal scores share the best position), 0 for
    ``j >= n_found[q]`` (``n_found`` is clamped to ``[0, k]``). Precondition: each row
    sorted descending (as every kernel returns them); the code compares neighbours, so an
    unsorted row gets ranks that are not its competition ranks. Returns int32 ``(nq, k)``.

    Raises:
        ValueError: ``scores`` not 2-D or ``len(n_found) != nq``.
        TypeError: wrong dtype or non-contiguous array.
    """

def decode_strings(offsets: _I32 | _I64, data: object, rows: _I64) -> list[str]:
    """The strings of ``rows`` of an Arrow string column without nulls, decoded straight from
    its buffers (no Arrow ``take``, no copy of the bytes): ``offsets`` int32 or int64
    ``(n_rows + 1,)``, ``data`` its UTF-8 bytes (any 1-d buffer, e.g. a memoryview of the
    memory-mapped Arrow buffer), ``rows`` int64 ``(n,)``. Returns ``n`` str, one object per
    distinct row (a repeated row shares it). Holds the GIL (it makes Python objects).

    Raises:
        ValueError: a row outside ``[0, n_rows)``, or offsets of a row that are not a range
            inside ``data``.
        UnicodeDecodeError: invalid UTF-8.
        TypeError: wrong dtype or non-contiguous array.
    """

def make_hits(hit_type: type, leg_type: type, scores: _F32, n_found: _I32, ids: list[object],
              titles: list[object], texts: list[object], metas: list[object], leg_names: list[str],
              leg_scores: list[_F32], leg_ranks: list[_I32]) -> list[list[object]]:
    """The hits of a batch (:meth:`retriever.Retriever.to_hits`): for query ``q`` a list of
    ``n_found[q]`` ``hit_type`` tuples ``(id, float(scores[q, j]), j + 1, title, text,
    metadata, legs)``, ``j < n_found[q]``, where id / title / text / metadata are the next
    entries of the flat lists (query order, ``sum(n_found)`` entries each; shared, not copied)
    and ``legs`` a new dict ``{leg_names[l]: leg_type(float(leg_scores[l][q, j]),
    int(leg_ranks[l][q, j]))}`` over the legs whose rank there is > 0, in leg order.
    ``hit_type`` / ``leg_type``: NamedTuple classes (tuple subclasses adding no storage);
    ``scores`` and each of ``leg_scores`` float32 ``(nq, k)``, ``leg_ranks`` int32 ``(nq, k)``,
    ``n_found`` int32 ``(nq,)`` in ``[0, k]``. The objects equal what ``tuple.__new__`` makes;
    the per-leg tuples (a float and an int) and the legs dicts are left untracked by the cyclic
    collector (a dict re-tracks itself when a container is stored in it). Holds the GIL.

    Raises:
        TypeError: a type that is not a plain tuple subclass, a wrong array dtype or layout.
        ValueError: shapes or lengths that disagree, ``n_found`` outside ``[0, k]``.
    """

#: collections of at most this many documents are always scored exhaustively by ``algorithm="auto"``
BM25_AUTO_EXHAUSTIVE_DOCS: int

def bm25_query_terms(
    data: _U8,
    offsets: _I64,
    slots: _I64,
    entry_off: _I64,
    blob: _U8,
    value: _I64,
    n_entries: int,
    flags: _U8,
    fold_n: _U8,
    fold_cp: _U32,
    ascii_fold: _U8,
    lowercase: bool,
    idf: _F32,
    n_threads: int = 0,
) -> tuple[_U64, _U32, _F32, _U8]:
    """Query analysis against a read-only token table: the BM25 leg's steady-state path.

    Text ``i`` is ``data[offsets[i]:offsets[i+1]]`` (UTF-8). Each text is case folded
    (``ascii_fold`` u8[128] for ASCII texts, else ``fold_n`` u8[65536] / ``fold_cp``
    u32[196608] when ``lowercase``), the possessive ``'s`` is stripped, the text is
    tokenised with ``flags`` u8[65536] (bit 1 word, 2 digit, 4 single-character token)
    and each token is looked up in the table of :class:`retriever.index.analyzer_kernels.TokenTable`
    (``slots`` / ``entry_off`` / ``blob`` / ``value``, entries ``0 .. n_entries-1``;
    the same keys and probing as the numba scanner). Tables come from
    :func:`retriever.index.analyzer_kernels.char_tables` and ``_ascii_fold``.

    Returns ``(q_offsets uint64 (n+1,), q_terms uint32 (m,), q_weights float32 (m,),
    status uint8 (n,))``: query ``i``'s distinct terms (table values >= 0) in
    first-occurrence order, weight ``float32(float64(count) * float64(idf[t]))``;
    ``status[i] = 1`` (and no terms) when a token is not in the table or the text has a
    code point above U+FFFF: the caller analyses it (and adds its tokens) in Python.
    Identical to the numba scanner followed by ``query_term_weights`` for every text it
    finishes (``tests/test_analyzer_batch.py``). Parallel over queries on a persistent
    thread pool, GIL released; about 0.3 us per SciFact query on one core.

    Raises:
        ValueError: offsets decreasing or past ``data``; a table whose slots are not
            ``2 * cap`` (cap a power of two), whose offsets are shorter than
            ``n_entries + 1``, ``n_entries`` outside ``[0, len(value)]``, an entry or
            blob offset out of range met during a lookup, or a value ``>= len(idf)``;
            table lengths other than 65536 / 196608 / 128.
        TypeError: wrong dtype or non-contiguous array.
    """

def bm25_topk_text(
    data: _U8,
    text_offsets: _I64,
    slots: _I64,
    entry_off: _I64,
    blob: _U8,
    value: _I64,
    n_entries: int,
    flags: _U8,
    fold_n: _U8,
    fold_cp: _U32,
    ascii_fold: _U8,
    lowercase: bool,
    idf: _F32,
    offsets: _U64,
    doc_ids: _U32,
    tfs: _U32,
    doc_norm: _F32,
    k: int,
    n_threads: int = 0,
    allow: _U8 | None = None,
    impacts: _F32 | None = None,
    impact_rows: _F32 | None = None,
    impact_row_slot: _I32 | None = None,
    impl: Literal["auto", "scalar", "avx2", "avx512"] = "auto",
) -> tuple[_I64, _F32, _I32, _U8]:
    """:func:`bm25_query_terms` followed by :func:`bm25_topk` with ``algorithm="exhaustive"``,
    in one parallel pass (GIL released): each thread analyses a query (``data`` /
    ``text_offsets`` and the table arguments as :func:`bm25_query_terms`' ``data`` /
    ``offsets`` ...) and scores it at once against one shard's postings (``offsets`` ...
    ``impact_row_slot``, ``impl`` as :func:`bm25_topk`).

    Returns ``(ids int64 (n, k), scores float32 (n, k), n_found int32 (n,), status uint8
    (n,))``, equal to the two calls' results; ``status[i] == 1`` marks a query holding a
    token the table lacks or a code point above U+FFFF (its row is empty: analyse and score it
    the two-call way).

    Raises:
        ValueError: the checks of both calls; messages name ``text offsets``, the postings'
            ``offsets``, ``idf[t]`` (a non-finite query weight) or the token table value.
    """

def bm25_topk(
    offsets: _U64,
    doc_ids: _U32,
    tfs: _U32,
    doc_norm: _F32,
    q_offsets: _U64,
    q_terms: _U32,
    q_weights: _F32,
    k: int,
    n_threads: int = 0,
    allow: _U8 | None = None,
    algorithm: Literal["auto", "exhaustive", "maxscore", "bmw", "bmm"] = "maxscore",
    term_ub: _F32 | None = None,
    block_offsets: _U64 | None = None,
    block_ub: _F32 | None = None,
    block_size: int = 128,
    impacts: _F32 | None = None,
    term_kth: _F32 | None = None,
    term_kth_depth: int = 0,
    dense_slot: _I32 | None = None,
    dense_bits: _U64 | None = None,
    dense_rank: _U32 | None = None,
    impact_rows: _F32 | None = None,
    impact_row_slot: _I32 | None = None,
    impl: Literal["auto", "scalar", "avx2", "avx512"] = "auto",
    filter_plan: Literal["auto", "postings", "passing"] = "auto",
) -> tuple[_I64, _F32, _I32]:
    """Exact BM25 top-k over one shard's postings for a ragged batch of queries.

    Score of doc ``d`` for query ``q`` (float32, summed from 0.0 in query-term
    order over the query's terms that have a posting for ``d``)::

        score += q_weights[i] * (float32(tf) / (float32(tf) + doc_norm[d]))

    ``tfs``: uint32 ``(nnz,)`` raw term frequencies (>= 1). ``doc_norm``: float32
    ``(n_docs,)``, ``k1 * (1 - b + b * dl / avgdl)`` from the GLOBAL avgdl.
    ``q_weights``: float32 (Lucene idf from the GLOBAL N and df).

    Algorithms (all return bit-identical ids and scores; compiled with
    ``-ffp-contract=off``):

    * ``"exhaustive"``: term-at-a-time over a dense accumulator.
    * ``"maxscore"``: MaxScore (Turtle & Flood 1995): terms sorted by upper bound;
      candidates come only from the essential lists, the non-essential lists are
      probed only while a document can still reach the k-th score. Dense
      essential lists are evaluated window-at-a-time (term-at-a-time inside
      windows of 8,192 doc ids, as Lucene's MaxScoreBulkScorer; no clearing between
      windows: 16-bit window epochs mark the live entries), nearly empty ones and
      queries of more than 64 terms document-at-a-time. Seeks gallop, long ones
      from an interpolated guess; non-essential lists that have a membership
      bitmap (``dense_*``) are probed with a bit test and a popcount instead. Needs
      ``term_ub``. Usually the fastest.
    * ``"auto"``: per query, ``"exhaustive"`` when the query's posting lists total at
      most 16,384 postings (4,096 without ``impacts``), else ``"maxscore"``. Needs
      ``term_ub``.
    * ``"bmw"``: Block-Max WAND (Ding & Suel 2011). Needs all three bounds.
    * ``"bmm"``: block-max MaxScore, document-at-a-time: MaxScore whose essential
      lists skip whole blocks by their block bounds. Needs all three bounds.

    Every pruning algorithm first primes its threshold with the k-th best partial
    score of the documents in the query's shortest high-bound lists, and checks
    candidates against per-posting tf bounds before reading ``doc_norm``. Per-call
    scratch (window buffers, pooled dense accumulators for "exhaustive") is
    reused across the queries of a batch; a batch computes ``min(doc_norm)`` once
    (O(n_docs)) when ``nq * 4096 >= n_docs``.

    ``impacts``: optional float32 ``(nnz,)`` from :func:`bm25_impacts` with the same
    ``doc_norm``; each posting's tf part is then read instead of computed (no
    division, no random ``doc_norm`` read; bit-identical scores). Inconsistent
    impacts give wrong results, never a memory error.

    Precondition: each term's doc ids strictly increasing, as :func:`check_csr`
    verifies (the BM25 leg runs it once when an index is opened; this call does not,
    it costs O(nnz)). A doc id ``>= n_docs`` raises ``ValueError``; a list with a
    repeated doc id gives unspecified scores (the vector scatters read several
    accumulator entries before writing them back) or, where the window-at-a-time
    MaxScore meets it (a repeated or decreasing doc id), a ``ValueError``; never a
    memory error.

    ``dense_slot`` / ``dense_bits`` / ``dense_rank``: optional, all three together, from
    :func:`bm25_dense_bitmaps` over the same postings (``ValueError`` when their lengths
    do not fit ``n_terms`` and ``ceil(n_docs / 64)``, or a query term's slot is not -1
    or a row). Used by ``"maxscore"`` / ``"auto"``; results are identical. Bitmaps that
    do not match the postings give wrong results or a ``ValueError``, never a memory
    error.

    ``impact_rows`` / ``impact_row_slot``: optional, both together and with ``impacts``,
    from :func:`bm25_impact_rows` over the same postings and impacts (``ValueError`` when
    ``len(impact_row_slot) != n_terms``, ``len(impact_rows)`` is not a multiple of
    ``n_docs``, or a query term's slot is not -1 or a row). ``"exhaustive"`` adds a list
    that has a row to its accumulator as one vector pass, ``acc += q_weight * row``
    (the absent documents add ``q_weight * 0 == 0``, weights being finite, which leaves
    the score as it is), instead of one scattered read-add-write per posting; results
    are identical. Rows that do not match the impacts give wrong results, never a memory
    error (e.g. rows built for another ``n_docs`` skip the doc id check of their lists).

    ``impl``: the scatter of the dense exhaustive path with ``impacts``: ``"auto"`` (chosen
    once per process from the CPU: AVX-512 gathers / scatters on Intel CPUs that have them,
    else AVX2 products with scalar stores, else scalar), or an explicit ``"scalar"``,
    ``"avx2"`` or ``"avx512"`` (tests and benchmarks); every one returns bit-identical results.

    ``term_kth``: optional float32 ``(n_terms,)`` with ``term_kth_depth == k``: entry
    ``t`` (for every query term) from :func:`bm25_term_kth` with ``depth = k`` and the
    same ``doc_norm``. The pruning algorithms then start from the safe threshold
    ``max over the query's terms of q_weights[i] * term_kth[t]``: the ``k``
    documents behind that single-term value all score at least as much (scores
    are sums of non-negative float32 contributions), so the k-th score can only
    be higher; documents scoring exactly the threshold are still evaluated, so
    ties resolve as in exhaustive scoring. Not used with a negative weight. With
    ``allow`` it is not a threshold itself (its documents may not pass): the pruning
    algorithms start from the filtered analogue instead, the largest over the query's
    terms of the k-th largest ``q_weights[i] * tf part`` among the term's PASSING
    postings, found per query by one pass over the term's blocks (``block_offsets`` /
    ``block_ub``, then required) that skips blocks whose bound cannot beat it, terms
    taken in decreasing ``q_weights[i] * term_kth[t]`` (an upper bound of the filtered
    value) until none can raise it. Results are identical with or without it;
    inconsistent values give wrong results, never a memory error. The proof also needs
    every tf part to be a number (no NaN; :func:`bm25_impacts` gives NaN only for
    ``tf = 0`` with ``doc_norm = 0``); the BM25 leg skips ``term_kth`` when its impacts
    hold a NaN.

    ``filter_plan`` (with ``allow``): ``"postings"`` runs ``algorithm`` over the posting
    lists, the filter tested per candidate; ``"passing"`` scores only the passing
    documents (filter-driven, like Lucene's conjunction led by a filter iterator): each
    query term's list is walked with the filter tested per posting, or probed once per
    passing document (a membership-bitmap test where ``dense_*`` has a row for it, else a
    galloping seek), whichever the cost model finds cheaper, term-at-a-time in query
    order; ``"auto"`` picks per query: ``"passing"`` when ``C * (2 + 100 * f) < L``, with
    ``L`` the query's posting total, ``f`` the passing fraction and ``C`` the modelled
    cost of the passing plan, the sum over the terms of ``min(len, P * c)`` (``P``
    passing documents; ``c`` = 1 for a bitmap probe, ``1 + log2(1 + len / P)`` for a
    seek). The passing documents are counted (and, for the passing plan, listed) once
    per call and thread, O(n_docs). Every plan returns identical results.

    The bounds come from :func:`bm25_upper_bounds` (same ``doc_norm`` and
    ``block_size``). Pruning is safe: a document is discarded only when an upper
    bound of its float32 score, inflated to cover rounding, is strictly below the
    current k-th score. Queries with a negative weight are run exhaustively.

    Returns:
        ``(ids int64 (nq, k), scores float32 (nq, k), n_found int32 (nq,))``; see the
        module docstring for order and padding.

    Raises:
        ValueError: ``k < 1``; a ``q_terms`` value ``>= n_terms``; non-finite weight;
            ``offsets[-1] != len(doc_ids)``, ``len(tfs) != len(doc_ids)``,
            ``len(allow) != n_docs``, ``len(q_weights) != len(q_terms)``, bad
            ``q_offsets``; unknown ``algorithm``; bounds missing for the algorithm
            or inconsistent with the postings / ``block_size``; non-finite or
            negative ``term_ub`` of a query term; ``term_kth`` of the wrong length,
            ``term_kth_depth != k``, or a query term's ``term_kth`` neither ``-inf``
            nor in ``[0, term_ub[t]]``; an unknown ``impl`` or one this CPU lacks.
        TypeError: wrong dtype or non-contiguous array.
    """


def bm25_topk_shards(
    shards: Sequence[Mapping[str, _U64 | _U32 | _F32 | _I32 | _U8 | int | None]],
    bases: _I64,
    q_offsets: _U64,
    q_terms: _U32,
    q_weights: _F32,
    k: int,
    n_terms: int = -1,
    n_threads: int = 0,
    algorithm: Literal["auto", "exhaustive", "maxscore", "bmw", "bmm"] = "maxscore",
    term_kth: _F32 | None = None,
    term_kth_depth: int = 0,
) -> tuple[_I64, _F32, _I32]:
    """Exact BM25 top-k over several shards of one index in one call: equal (ids
    identical, scores bit for bit) to :func:`bm25_topk` on each shard, ids shifted by
    ``bases[i]``, merged by score descending then ordinal ascending
    (``retriever.topk.merge_topk``).

    ``shards``: per shard a dict of :func:`bm25_topk`'s per-shard arguments by name:
    ``offsets``, ``doc_ids``, ``tfs``, ``doc_norm`` (required); ``impacts``,
    ``term_ub``, ``block_offsets``, ``block_ub``, ``block_size`` (int, default 128),
    ``term_kth`` with ``term_kth_depth`` (= ``k``), ``dense_slot`` / ``dense_bits`` /
    ``dense_rank``, ``impact_rows`` / ``impact_row_slot``, ``allow`` (uint8
    ``(n_docs,)``), ``terms`` (a term map: uint32 ``(len(offsets) - 1,)``, the index's
    term id of each of the shard's lists, strictly ascending; the shard's per-term arrays
    then follow its own vocabulary, as a living index's segment stores it; without it list
    ``t`` is term ``t``); checked as :func:`bm25_topk` checks them (``ValueError`` starting
    ``shards[i]:``; a wrong dtype or layout: ``TypeError``; an unknown key:
    ``ValueError``). ``bases``: int64 ``(len(shards),)``, the global ordinal of each
    shard's document 0, ascending with ``bases[i] + n_docs_i <= bases[i + 1]`` and all
    ordinals below 2**32 - 1. ``q_terms`` index the index's vocabulary of ``n_terms``
    terms (-1: the largest a shard spans); a term a shard has no list for is skipped
    for that shard.

    Each query goes through the shards in order on one thread (queries are split over
    ``n_threads`` threads, the GIL released) with one top-k heap of global ordinals;
    each shard's pruning starts from the larger of the k-th score collected so far
    (Lucene's shared minimum competitive score) and one threshold found for the whole
    index before the first shard, as one shard holding every document would find it:
    priming over every shard's short high-bound lists together and, with ``term_kth``
    (float32 ``(n_terms,)`` from :func:`bm25_term_kth_shards` with ``depth`` =
    ``term_kth_depth`` = ``k``; not used with an ``allow`` mask or a negative weight),
    the best single-term k-th score over the union. Exact: a document scoring below
    either cannot enter, one scoring equal is still offered and ranked by (score,
    smaller ordinal), and pruning discards only bounds strictly below it. One worker
    per thread serves every shard in turn (scratch memory allocated once per call).
    ``"auto"`` picks per query over the union of the shards (exhaustive when the
    query's lists in all shards total at most 16,384 postings or the shards hold at
    most 65,536 documents in all, else MaxScore), as one shard holding them would.

    Returns ``(ids int64 (nq, k) global ordinals, scores float32 (nq, k), n_found
    int32 (nq,))``, rows padded with -1 / -inf.
    """

def bm25_term_kth_shards(
    shards: Sequence[Mapping[str, _U64 | _U32 | _F32 | _I32 | _U8 | int | None]],
    terms: _U32,
    depth: int,
    n_threads: int = 0,
) -> _F32:
    """:func:`bm25_term_kth` over several shards together: ``out[i]`` = the
    ``depth``-th largest tf part of term ``terms[i]``'s postings in all ``shards``
    (bundles as :func:`bm25_topk_shards` takes them; ``offsets``, ``doc_ids``, ``tfs``,
    ``doc_norm`` and, when present, ``impacts``, ``block_offsets`` / ``block_ub`` /
    ``block_size`` are read), ``-inf`` when they number fewer than ``depth`` or a value
    read is negative or NaN; a term a shard has no list for (beyond its vocabulary, or
    not in its term map ``terms``) has no postings there.
    Equal to :func:`bm25_term_kth` of one shard holding the same postings. Only the
    listed terms' ranges are checked (no O(n_terms) pass). GIL released, parallel over
    terms.

    Raises:
        ValueError: ``depth < 1``; a listed term's posting or block range outside its
            shard's arrays, ``impacts`` of the wrong length (``shards[i]:``).
        TypeError: wrong dtype or non-contiguous array.
    """


class BM25ShardSet:
    """The shards of :func:`bm25_topk_shards` parsed and checked once (a BM25 leg keeps
    one per scoring state), so that a call pays no per-shard argument checks.
    ``BM25ShardSet(shards, bases, n_terms=-1)``: bundles and bases as
    :func:`bm25_topk_shards` takes them, without ``term_kth`` / ``term_kth_depth`` /
    ``allow`` (given per call). Holds references to the arrays.

    Raises:
        ValueError: as :func:`bm25_topk_shards` (``shards[i]:``), or a bundle with
            ``term_kth`` or ``allow``.
    """

    def __init__(self, shards: Sequence[Mapping[str, _U64 | _U32 | _F32 | _I32 | int | None]], bases: _I64,
                 n_terms: int = -1) -> None: ...
    @property
    def n_shards(self) -> int: ...
    @property
    def n_terms(self) -> int: ...
    def topk(self, q_offsets: _U64, q_terms: _U32, q_weights: _F32, k: int, n_threads: int = 0,
             algorithm: Literal["auto", "exhaustive", "maxscore", "bmw", "bmm"] = "maxscore",
             allow: Sequence[_U8 | None] | None = None, term_kth: _F32 | None = None,
             term_kth_depth: int = 0) -> tuple[_I64, _F32, _I32]:
        """:func:`bm25_topk_shards` over the set's shards (identical results); ``allow``:
        None or, per shard, None or a uint8 mask of its documents. A pruning algorithm
        needs ``term_ub`` (and ``bmw`` / ``bmm`` the blocks) in every bundle of the set
        (``ValueError`` naming the shard otherwise)."""
    def term_kth(self, terms: _U32, depth: int, n_threads: int = 0) -> _F32:
        """:func:`bm25_term_kth_shards` over the set's shards (identical results)."""


def bm25_term_kth(
    offsets: _U64,
    doc_ids: _U32,
    tfs: _U32,
    doc_norm: _F32,
    terms: _U32,
    depth: int,
    impacts: _F32 | None = None,
    block_offsets: _U64 | None = None,
    block_ub: _F32 | None = None,
    block_size: int = 128,
    n_threads: int = 0,
) -> _F32:
    """Single-term thresholds for :func:`bm25_topk`'s ``term_kth``.

    ``out[i]`` = the ``depth``-th largest ``tf / (tf + doc_norm[d])`` (float32, the
    kernel's expression; read from ``impacts`` when given) over the postings of term
    ``terms[i]``, or ``-inf`` when the list has fewer than ``depth`` postings or holds
    a negative or NaN value. With ``block_offsets``/``block_ub`` from
    :func:`bm25_upper_bounds` (same ``doc_norm`` and ``block_size``), blocks whose
    maximum cannot beat the running ``depth``-th value are skipped. One pass over
    each listed term's postings at most, O(depth) memory per thread, GIL released,
    parallel over terms.

    Returns:
        float32 ``(len(terms),)``.

    Raises:
        ValueError: ``depth < 1``; a term id ``>= n_terms``; array lengths disagree;
            bad offsets; block arrays given alone or not matching ``block_size``.
        TypeError: wrong dtype or non-contiguous array.
    """

def impact_topk(
    offsets: _U64,
    doc_ids: _U32,
    impacts: _F32,
    q_offsets: _U64,
    q_terms: _U32,
    q_weights: _F32,
    k: int,
    n_threads: int = 0,
    allow: _U8 | None = None,
) -> tuple[_I64, _F32, _I32]:
    """Exact learned-sparse (impact) top-k, term-at-a-time.

    Score of doc ``d`` (float32, summed from 0.0 in query-term order over the
    query's terms with a posting ``p`` for ``d``)::

        score += q_weights[i] * impacts[p]

    ``impacts``: float32 ``(nnz,)``. Weights and impacts may be negative. The
    number of documents is not needed (the accumulator grows to the largest doc
    id met); ``allow`` must cover every doc id that occurs.

    Returns:
        ``(ids int64 (nq, k), scores float32 (nq, k), n_found int32 (nq,))``.

    Raises:
        ValueError: ``k < 1``; a ``q_terms`` value ``>= n_terms``; non-finite
            weight; mismatched lengths; a matched doc id ``>= len(allow)``.
        TypeError: wrong dtype or non-contiguous array.
    """

def rescore_topk(
    queries: _F32,
    vectors: npt.NDArray[np.float16] | _F32,
    candidates: _I64,
    k: int,
    base: int = 0,
    n_threads: int = 0,
    impl: Literal["auto", "portable", "avx512"] = "auto",
) -> tuple[_I64, _F32, _I32]:
    """Exact full-dimension re-scoring of Matryoshka funnel shortlists (AdANNS,
    Rege et al., NeurIPS 2023), cpp_ext/rescore.hpp.

    For query ``i`` (float32 ``queries`` ``(nq, d)``), every candidate
    ``j = candidates[i, c] >= 0`` (int64 ``(nq, k')``; ``-1`` = no candidate) is
    scored ``<queries[i], vectors[j]>`` over all ``d`` coordinates of the stored
    float16 or float32 ``(n, d)`` matrix: exact float32 products summed in
    float64 into 8 lanes (coordinate ``t`` goes to lane ``t % 8``, increasing
    ``t``), lanes combined ``((0+1)+(2+3))+((4+5)+(6+7))``, rounded to float32
    once, so scores never depend on the batch or thread count. Duplicated
    candidates are scored twice; a candidate whose score is NaN (NaN in the query
    or its row) is dropped (not counted in ``n_found``). ``impl``: ``"auto"`` (AVX-512 where available),
    ``"portable"`` or ``"avx512"`` (AVX-512F + F16C, four candidates at a time
    with fused multiply-adds, exact because float32 products are exact in
    float64): every path returns bit-identical scores.

    Returns:
        ``(ids int64 (nq, k) = candidate + base, scores float32 (nq, k),
        n_found int32 (nq,))``, sorted by score descending then id.

    Raises:
        ValueError: a candidate outside ``[-1, n)``; ``k < 1``; ``base < 0`` or
            ``base + n - 1`` past int64;
            mismatched shapes; more than 2**32 rows; an unknown ``impl`` or
            ``"avx512"`` on a CPU without it.
        TypeError: wrong dtype or non-contiguous array.
    """

def heap_push_block(
    scores: _F32,
    first_id: int,
    heap_scores: _F32,
    heap_ids: _I64,
    n_threads: int = 0,
    allow: npt.NDArray[np.uint8] | None = None,
) -> None:
    """Running top-k' of a blocked exact scan (Matryoshka prefix candidates),
    cpp_ext/rescore.hpp.

    Row ``i`` of ``scores`` ``(nq, nd)`` holds query ``i``'s scores of ids
    ``first_id .. first_id + nd - 1``; each enters query ``i``'s binary min-heap
    (``heap_scores`` / ``heap_ids`` ``(nq, k')``, updated in place, initialised
    to ``-inf`` / ``-1``) when it ranks before the root: higher score, or equal
    score and smaller id. NaN never enters, nor does column ``j`` with
    ``allow[j] == 0`` (``allow``: uint8 ``(nd,)`` aligned with the block).
    The heaps are left unsorted.

    Raises:
        ValueError: ``first_id < 0``; mismatched shapes; ``k' < 1``.
        TypeError: wrong dtype or non-contiguous array.
    """

def int8_scan_topk(
    queries: npt.NDArray[np.int8],
    codes: npt.NDArray[np.uint8],
    n: int,
    kk: int,
    n_threads: int = 0,
    impl: Literal["auto", "portable", "vnni"] = "auto",
    allow: npt.NDArray[np.uint8] | None = None,
) -> tuple[_I32, _I64]:
    """Exact top-k' of int8-quantised Matryoshka prefixes (funnel candidate
    generation), cpp_ext/int8_scan.hpp; Python wrapper: retriever/int8scan.py.

    ``codes`` uint8 ``(ceil(n / 16), d4, 64)``: documents in blocks of 16, each
    block ``d4`` groups of 64 bytes (group ``g``: coordinates ``4g .. 4g + 3`` of
    the 16 documents, document ``i`` at bytes ``4i .. 4i + 3``; code ``c + 128``
    for a signed code ``c``). ``queries`` int8 ``(nq, 4 * d4)``. Score of
    document ``d`` for query ``i``: ``sum_t codes_d[t] * queries[i, t]`` in
    int32 (exact). Each row holds the best ``kk`` documents ``< n`` by score
    descending, then smaller id; identical for every ``impl`` ('auto': AVX-512
    VNNI where available, 'portable', 'vnni') and any ``n_threads``. With
    ``allow`` (uint8 ``(n,)``, 0 = never returned) only allowed documents enter;
    a row with fewer than ``kk`` of them ends in id -1, score INT32_MIN.

    Returns:
        ``(scores int32 (nq, kk), ids int64 (nq, kk))``.

    Raises:
        ValueError: ``n`` outside ``[1, 2**32 - 1]``; ``kk`` outside ``[1, n]``;
            ``codes.shape`` not ``(ceil(n / 16), d4, 64)`` with ``1 <= d4 <= 16384``;
            ``queries.shape[1] != 4 * d4``; unknown ``impl``; ``impl='vnni'`` on a
            CPU without AVX-512 VNNI.
        TypeError: wrong dtype or non-contiguous array.
    """

def rescore_has_avx512() -> bool:
    """True when :func:`rescore_topk` can use its AVX-512 path here."""

def int8_scan_has_vnni() -> bool:
    """True when :func:`int8_scan_topk` can use its AVX-512 VNNI path here."""

_U16 = npt.NDArray[np.uint16]

def bm25_score_docs(
    offsets: _U64,
    doc_ids: _U32,
    tfs: _U32,
    doc_norm: _F32,
    q_offsets: _U64,
    q_terms: _U32,
    q_weights: _F32,
    cand_offsets: _I64,
    cand_docs: _I64,
    n_threads: int = 0,
    impacts: _F32 | None = None,
) -> _F32:
    """BM25 scores of given documents of one shard (full-score fusion), cpp_ext/bm25_score_docs.cpp.

    Postings, ``doc_norm``, the query batch and ``impacts`` as :func:`bm25_topk`. Query ``i``'s
    candidates are ``cand_docs[cand_offsets[i]:cand_offsets[i+1]]`` (int64 shard-local doc ids,
    any order, repeats allowed; ``cand_offsets`` int64 ``(nq + 1,)``). ``out[j]`` is the score of
    ``cand_docs[j]`` for its query: the float32 sum from 0.0, in query-term order, of
    ``q_weights[i] * (float32(tf) / (float32(tf) + doc_norm[d]))`` (or ``* impacts[p]``) over the
    terms whose list holds the document, exactly the arithmetic of :func:`bm25_topk` (bit-identical
    to the score it reports for that document, any algorithm); 0.0 for a document no query term
    matches. Each term's posting cursor gallops through the query's candidates in doc-id order
    (lists are sorted by doc id): about ``m * c * log(len / c)`` steps per query. Parallel over
    queries, GIL released.

    Returns:
        float32 ``(len(cand_docs),)``, aligned with ``cand_docs``.

    Raises:
        ValueError: a candidate outside ``[0, n_docs)`` (message names its position and value);
            ``len(cand_offsets) != len(q_offsets)``, ``cand_offsets[0] != 0``, decreasing, or
            ``cand_offsets[-1] != len(cand_docs)``; the query and length checks of :func:`bm25_topk`.
        TypeError: wrong dtype or non-contiguous array.
    """

def check_sparse_index(
    fwd_offsets: _U64,
    fwd_terms: _U32,
    fwd_values: _U16,
    scale: float,
    n_terms: int,
    term_blocks: _U64,
    block_docs_offsets: _U64,
    block_docs: _U32,
    summary_comp_offsets: _U64,
    summary_dir: _U64,
    summary_entry_offsets: _U64,
    summary_entries: _U32,
    summary_scale: _F32,
    fwd_packed: _U32,
    fwd_term_rank: _U32,
) -> None:
    """O(size) structural check of one shard's learned-sparse forward index and Seismic blocks
    (cpp_ext/blocked_topk.hpp), run once when an index is opened.

    Forward index: document ``d`` is ``fwd_terms/fwd_values[fwd_offsets[d]:fwd_offsets[d+1]]``
    (uint16 impacts, weight = impact * ``scale``), terms ``< n_terms``. Blocks: term ``t`` owns
    blocks ``term_blocks[t]:term_blocks[t+1]``, block ``b`` the doc ids
    ``block_docs[block_docs_offsets[b]:block_docs_offsets[b+1]]``; the per-term inverted summaries
    (``summary_comp_offsets`` / ``summary_dir`` / ``summary_entry_offsets`` / ``summary_entries`` /
    ``summary_scale``) as ``retriever.index.sparse_index.invert_summaries`` writes them;
    ``fwd_packed`` / ``fwd_term_rank`` both empty or the packed forward copy of
    ``retriever.index.sparse_index.pack_forward``.

    Raises:
        ValueError: naming the first violation (array, position and value); ``scale`` not finite
            and > 0; ``n_terms < 1``.
        TypeError: wrong dtype or non-contiguous array.
    """

def check_impact_postings(offsets: _U64, doc_ids: _U32, impacts: _U16, n_docs: int) -> None:
    """O(nnz) check of impact-ordered learned-sparse postings, run once at open: offsets valid,
    doc ids ``< n_docs``, impacts ``>= 1`` and non-increasing within each term.

    Raises:
        ValueError: naming the violation; ``n_docs`` outside ``[0, 2**32 - 1]``.
        TypeError: wrong dtype or non-contiguous array.
    """

def sparse_exact_topk(
    offsets: _U64,
    doc_ids: _U32,
    impacts: _U16,
    fwd_offsets: _U64,
    fwd_terms: _U32,
    fwd_values: _U16,
    scale: float,
    q_offsets: _U64,
    q_terms: _U32,
    q_weights: _F32,
    k: int,
    n_threads: int = 0,
    impl: Literal["auto", "scalar", "sse2", "avx2"] = "auto",
    allow: npt.NDArray[np.uint8] | None = None,
    filter_plan: Literal["auto", "postings", "sentinel", "passing"] = "auto",
) -> tuple[_I64, _F32, _I32]:
    """Exact learned-sparse top-k over uint16 impacts (cpp_ext/blocked_topk.hpp).

    ``score(q, d) = scale * sum_t q_t * impact(t, d)``, float32, summed in the document's stored
    term order from the forward index (``fwd_*``, one row per document). Postings
    (``offsets`` / ``doc_ids`` / ``impacts``) must be impact-ordered, as
    ``retriever.index.sparse_index.invert`` writes them (checked once by
    :func:`check_impact_postings`): score-at-a-time with safe early termination, candidates
    re-scored from the forward index, so results never depend on where the scan stopped. Only
    documents with a score > 0 are returned. Query weights must be finite and >= 0, terms unique
    within a query. ``impl``: the forward-index score, ``"auto"`` (chosen once per process from
    the CPU: AVX2 8-entry gathers where available, else SSE2) or an explicit ``"scalar"``,
    ``"sse2"`` or ``"avx2"``; all compute the same float32 operations in the same order
    (bit-identical scores). ``allow``: ``None`` or uint8 ``(n_docs,)`` (0 = never returned),
    applied before top-k on every path: the exact top-k of the allowed documents (when at most a
    quarter of the shard is allowed, a query whose lists are longer than the allowed documents'
    rows scores those documents directly). ``filter_plan`` (with ``allow``; every plan returns the
    same ids and bit-identical scores): ``"postings"`` walks the postings testing the mask per
    posting; ``"sentinel"`` presets the masked documents' accumulator entries to -inf once per call
    and thread, so the walk reads no mask (masked entries never read as 0, so are never touched);
    ``"passing"`` scores every allowed document from the forward index; ``"auto"``: per query
    ``"passing"`` as above, else ``"sentinel"`` when at least 10 % of the shard is allowed,
    ``"postings"`` below (docs/FILTERS.md).

    Returns:
        ``(ids int64 (nq, k), scores float32 (nq, k), n_found int32 (nq,))``; see the module
        docstring for order and padding.

    Raises:
        ValueError: ``k < 1``; ``scale`` not finite and > 0; mismatched lengths; a query term
            ``>= n_terms``, repeated, or a weight negative or not finite; an unknown ``impl`` or one
            this CPU lacks; ``len(allow)`` != n_docs; an unknown ``filter_plan``.
        TypeError: wrong dtype or non-contiguous array.
    """

def sparse_seismic_topk(
    fwd_offsets: _U64,
    fwd_terms: _U32,
    fwd_values: _U16,
    scale: float,
    term_blocks: _U64,
    block_docs_offsets: _U64,
    block_docs: _U32,
    summary_comp_offsets: _U64,
    summary_dir: _U64,
    summary_entry_offsets: _U64,
    summary_entries: _U32,
    summary_scale: _F32,
    fwd_packed: _U32,
    fwd_term_rank: _U32,
    q_offsets: _U64,
    q_terms: _U32,
    q_weights: _F32,
    k: int,
    query_cut: int = 10,
    heap_factor: float = 0.9,
    n_threads: int = 0,
    impl: Literal["auto", "scalar", "sse2", "avx2"] = "auto",
    allow: npt.NDArray[np.uint8] | None = None,
) -> tuple[_I64, _F32, _I32]:
    """Approximate learned-sparse top-k in the manner of Seismic (Bruch, Nardini, Rulli, Venturini,
    SIGIR 2024), cpp_ext/blocked_topk.hpp. Arrays as :func:`check_sparse_index`.

    Per query, the ``query_cut`` largest query weights are visited in decreasing order; each
    term's blocks are visited in decreasing summary score until one scores below ``heap_factor``
    times the k-th score (heap full). Documents of visited blocks are scored exactly (each at most
    once per query) with :func:`sparse_exact_topk`'s formula and order, from the packed copy when
    ``fwd_packed`` is non-empty (bit-identical scores); ``impl`` as :func:`sparse_exact_topk`.
    ``allow``: ``None`` or uint8 ``(n_docs,)``; documents with 0 are never scored or returned.

    Returns:
        ``(ids int64 (nq, k), scores float32 (nq, k), n_found int32 (nq,))``.

    Raises:
        ValueError: ``k < 1``; ``query_cut < 1``; ``heap_factor`` outside ``(0, 1]``; mismatched
            lengths (``len(allow)`` != n_docs included); the query checks of
            :func:`sparse_exact_topk`.
        TypeError: wrong dtype or non-contiguous array.
    """
