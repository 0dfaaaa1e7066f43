"""Build-time BM25 structures: analysed batches → (doc, term, tf) triples → per-shard CSR postings.

Postings hold raw term frequencies and document lengths only; idf and length normalisation are
computed from corpus-wide N, df and avgdl when an index is opened, so scores do not depend on how
documents were split into shards. Term ids are global (one vocabulary for the index, append-only);
a shard's ``offsets`` cover the terms known when it was written.

A segment written into a living index (:mod:`retriever.index.updates`) lists only the terms it
holds when that is smaller: ``terms`` u32[T'] (ascending) beside ``offsets`` u64[T'+1] over them
(:func:`compact_offsets`; :func:`dense_offsets` gives the dense form where that is the smaller).
Such a segment's manifest entry says so (``bm25_terms``: T'); readers keep the form and search the
segment in its own term ids (:func:`check_bm25_segment` checks it against the entry).
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import compress
from typing import Any, Callable, Mapping, Sequence, TYPE_CHECKING

import numpy as np
import pyarrow as pa

from .analyzer import _IDEO, Analyzer
from .analyzer_kernels import (CountScratch, CsrScratch, TokenTable, arrow_utf8_arrays, count_terms, csr_by_term,
                               csr_by_term_compact, scan_tokens, utf8_arrays)

if TYPE_CHECKING:
    from .builders import Batch, IndexOutput, ShardHandle, ShardOutput


#: ``bm25.arrow``'s arrays; a segment whose manifest entry has ``bm25_terms`` also holds ``terms``
BM25_ARRAYS = {"offsets": np.uint64, "doc_ids": np.uint32, "tfs": np.uint32, "doc_len": np.uint32}
BM25_COMPACT_ARRAYS = {**BM25_ARRAYS, "terms": np.uint32}


def compact_offsets(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The compact form of CSR ``offsets`` (u64[T+1], non-decreasing, from 0): ``terms`` u32[T']
    (ascending: the terms whose list is not empty) and ``offsets`` u64[T'+1] over them (list i
    of the compact form is the list of term ``terms[i]``). O(T)."""
    offsets = np.asarray(offsets, dtype=np.uint64)
    terms = np.flatnonzero(offsets[1:] != offsets[:-1]).astype(np.uint32)
    out = np.empty(len(terms) + 1, dtype=np.uint64)
    out[:-1] = offsets[terms]
    out[-1] = offsets[-1] if len(offsets) else 0
    return terms, out


def compact_is_smaller(n_listed: int, n_terms: int) -> bool:
    """Whether ``terms`` + compact ``offsets`` (12 bytes a listed term) take less space than the
    dense ``offsets`` (8 bytes a term of the vocabulary prefix)."""
    return 12 * n_listed + 8 < 8 * (n_terms + 1)


def check_compact_offsets(terms: np.ndarray, offsets: np.ndarray, n_terms: int, nnz: int) -> None:
    """Check the compact form (:func:`compact_offsets`) of a segment's ``n_terms``-term, ``nnz``-posting CSR.

    Raises:
        ValueError: ``terms`` not strictly ascending or not below ``n_terms``, ``offsets`` of
            another length than ``len(terms) + 1``, decreasing, not from 0 or not ending at
            ``nnz``.
    """
    if len(offsets) != len(terms) + 1:
        raise ValueError(f"{len(offsets)} offsets for {len(terms)} listed terms (expected {len(terms) + 1})")
    if len(terms) and (int(terms[-1]) >= n_terms or bool((terms[1:] <= terms[:-1]).any())):
        raise ValueError(f"listed terms are not strictly ascending below {n_terms}")
    if int(offsets[0]) != 0 or int(offsets[-1]) != nnz or bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"offsets are not non-decreasing from 0 to {nnz}")


def dense_offsets(terms: np.ndarray, offsets: np.ndarray, n_terms: int, nnz: int) -> np.ndarray:
    """Expand compact CSR offsets (:func:`compact_offsets`) to the dense u64[n_terms+1] form
    (terms not listed get empty lists), after :func:`check_compact_offsets`. O(n_terms) time
    and memory.

    Raises:
        ValueError: as :func:`check_compact_offsets`.
    """
    check_compact_offsets(terms, offsets, n_terms, nnz)
    counts = np.zeros(n_terms, dtype=np.uint64)
    counts[terms] = offsets[1:] - offsets[:-1]
    dense = np.empty(n_terms + 1, dtype=np.uint64)
    dense[0] = 0
    np.cumsum(counts, out=dense[1:])
    return dense


def check_bm25_segment(a: Mapping[str, np.ndarray], entry: Mapping[str, Any], n_terms: int, rows: int) -> int:
    """Check a segment's ``bm25.arrow`` arrays against its manifest entry and the vocabulary, as
    everything that reads them must before a list position is taken for a term: the listed
    terms (:data:`BM25_COMPACT_ARRAYS` when ``entry`` has ``bm25_terms``: their count, strictly
    ascending below the vocabulary prefix ``entry["n_terms"]`` the segment spans, which such an
    entry must give; :func:`check_compact_offsets`), the prefix at most ``n_terms`` (the
    vocabulary's size), ``nnz`` and ``rows`` as the entry says, ``tfs`` as long as ``doc_ids``.
    The CSR structure itself (ascending documents below ``rows``) is the caller's check
    (``_kernels.check_csr`` or the compiled pass that reads it).

    Returns:
        the vocabulary prefix the segment spans (its term ids are below it).

    Raises:
        ValueError: what does not match, with both values (no path: the caller names the file).
    """
    compact = "bm25_terms" in entry
    nnz = len(a["doc_ids"])
    if compact:
        t_s = entry.get("n_terms")
        if t_s is None or len(a["terms"]) != entry["bm25_terms"]:
            raise ValueError(f"lists {len(a['terms'])} terms, manifest says {entry['bm25_terms']} of {t_s}")
        check_compact_offsets(a["terms"], a["offsets"], int(t_s), nnz)
        t_s = int(t_s)
    else:
        t_s = len(a["offsets"]) - 1
    if t_s != entry.get("n_terms", t_s) or nnz != entry.get("nnz", nnz):
        raise ValueError(f"has {t_s} terms / {nnz} postings, manifest says {entry.get('n_terms')} / "
                         f"{entry.get('nnz')}")
    if t_s > n_terms or len(a["doc_len"]) != rows:
        raise ValueError(f"spans {t_s} terms / {len(a['doc_len'])} rows: does not match the vocabulary "
                         f"({n_terms} terms) or the shard's rows ({rows})")
    if len(a["tfs"]) != nnz:
        raise ValueError(f"tfs and doc_ids differ in length ({len(a['tfs'])} / {nnz})")
    return t_s


class PostingsBuilder:
    """Accumulates analysed documents of the current shard and emits its CSR postings.

    Two hash tables of :mod:`retriever.index.analyzer_kernels` hold the state: ``_tokens`` maps every token
    seen so far to an entry whose value is its term id (-1: not indexed: a stop word, entered
    up front, or an over-long token), and ``_terms`` maps every term to its term id (its entry
    number: terms are entered in order of first occurrence).

    With ``background=True`` (the default) each batch is analysed on two worker threads, in
    order, while the caller prepares the next one: one scans batch k+1 (tokens → token-table
    entries, a kernel that runs without the GIL) while the other resolves batch k's new tokens to
    terms (stemming) and counts its term frequencies. Reading and validating records overlaps
    with both. Results are the same as with ``background=False`` (term ids are assigned in entry
    order by the second stage alone); an error raised by a batch is raised again by the next
    :meth:`add`, :meth:`flush` or :meth:`close`.

    Args:
        analyzer: the index's analyzer.
        background: analyse on a worker thread.
        vocab: terms that already have ids (an existing index's vocabulary, term id i =
            ``vocab[i]``; a list or an Arrow string array without nulls): new terms get ids from
            ``len(vocab)`` on, so a segment added to a living index uses the index's global term
            ids.
    """

    def __init__(self, analyzer: Analyzer, *, background: bool = True, vocab: Sequence[str] | pa.Array = ()) -> None:
        self.analyzer = analyzer
        self._tokens = TokenTable()  # token -> entry; value: term id (-1: not indexed)
        self._terms = TokenTable()  # term -> term id (entry number)
        if len(vocab):
            if isinstance(vocab, pa.Array):
                data, offsets = arrow_utf8_arrays(vocab)
            else:
                data, offsets = utf8_arrays(list(vocab))
            try:
                self._terms.add_distinct(data, offsets)
            except ValueError as e:
                raise ValueError(f"vocabulary of {len(vocab)} terms: term {e}") from None
        stop = sorted(analyzer.stop_words)
        if stop:
            data, offsets = utf8_arrays(stop)
            scan_tokens(data, offsets, self._tokens, lowercase=False, ideo_class=_IDEO, verbatim=True)
            self._tokens.set_values(0, np.full(self._tokens.n, -1, dtype=np.int64))
        self._n_resolved = self._tokens.n  # entries 0.._n_resolved-1 have their term ids
        self._terms_cache: list[str] = []  # decoded from the table when :attr:`terms` is asked for
        self._shard = _Shard()
        self._n = 0  # documents of the current shard handed to add()
        self._sum_dl = 0
        self._error: BaseException | None = None  # the first error of a batch (second stage, in order)
        self._scan_error: BaseException | None = None  # the first error of a scan (first stage)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="postings") if background else None
        self._scan_pool = ThreadPoolExecutor(1, thread_name_prefix="postings-scan") if background else None
        self._pending: deque[Future] = deque()
        self._csr_scratch = CsrScratch()  # compact flushes' work arrays (flush jobs run one at a time)
        self._count_scratch = CountScratch()  # the counting's work arrays (batches counted one at a time)

    # ---------------------------------------------------------------- results (wait for the worker)

    @property
    def terms(self) -> list[str]:
        """The vocabulary so far: term id i is ``terms[i]``."""
        self._wait(0)
        t = self._terms
        if len(self._terms_cache) < t.n:
            self._terms_cache.extend(t.tokens(len(self._terms_cache), t.n))
        return self._terms_cache

    @property
    def n_terms(self) -> int:
        """The vocabulary's size so far (``len(terms)``, without making its list)."""
        self._wait(0)
        return self._terms.n

    def terms_since(self, lo: int) -> list[str]:
        """Term ids ``lo ..`` of the vocabulary so far (``terms[lo:]``, decoded from the term
        table: a living index's seed vocabulary is never made a list)."""
        self._wait(0)
        return self._terms.tokens(lo, self._terms.n)

    @property
    def vocab(self) -> dict[str, int]:
        """term → term id (built on each access)."""
        return {t: i for i, t in enumerate(self.terms)}

    @property
    def sum_dl(self) -> int:
        """Total document length (terms after analysis) of every document added so far."""
        self._wait(0)
        return self._sum_dl

    def _wait(self, keep: int) -> None:
        """Wait until at most ``keep`` batches are in flight; re-raise a batch's error."""
        while len(self._pending) > keep:
            self._pending.popleft().result()

    def close(self, *, raise_errors: bool = True) -> None:
        """Wait for the batches in flight and stop the worker thread (a no-op when closed already).

        Args:
            raise_errors: re-raise a batch's error (False: drop it, e.g. while another error
                is being raised).
        """
        try:
            while self._pending:
                fut = self._pending.popleft()
                if raise_errors:
                    fut.result()
                else:
                    fut.exception()
        finally:
            self._pending.clear()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            if self._scan_pool is not None:
                self._scan_pool.shutdown(wait=True)
                self._scan_pool = None

    # ------------------------------------------------------------------------------------- input

    def add(self, texts: Sequence[str]) -> None:
        """Analyse and add a batch of documents (in shard order).

        Tokens are scanned and looked up in the token table by :func:`retriever.index.analyzer_kernels.scan_tokens`
        (the same token streams as :meth:`Analyzer.tokenize`); tokens never seen before are
        resolved to terms (stop words, length limit, stemming) in first-occurrence order, so term
        ids are those of analysing the documents one by one. A text the scanner does not handle
        (a code point above U+FFFF) is tokenised in Python, in its place in the order.

        Raises:
            whatever an earlier batch raised on the worker thread.
        """
        texts = texts if isinstance(texts, list) else list(texts)
        if not texts:  # nothing to count (an earlier batch's error still surfaces at the next one or finish)
            return
        first_doc = self._n
        self._n += len(texts)
        if self._pool is None:
            try:
                scanned = self._scan(texts)
            except BaseException as e:
                if self._error is None:
                    self._error = e
                raise
            self._add(scanned, first_doc, self._shard)
            return
        self._wait(1)  # at most two batches in flight
        scanned = self._scan_pool.submit(self._scan, texts)  # type: ignore[union-attr]
        self._pending.append(self._pool.submit(self._add, scanned, first_doc, self._shard))

    def _scan(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
        """First stage (scan thread, in batch order): see :meth:`_scan_batch`."""
        # a failed scan may have left entries without values: later scans refuse to run; the
        # batches scanned before it are complete and are still counted (``_error`` is set by the
        # second stage, in batch order, when it meets this batch)
        earlier = self._scan_error or self._error
        if earlier is not None:
            raise RuntimeError("an earlier batch failed") from earlier
        try:
            return self._scan_batch(texts)
        except BaseException as e:
            self._scan_error = e
            raise

    def _add(self, scanned: "Future | tuple[np.ndarray, np.ndarray, int]", first_doc: int, shard: "_Shard") -> None:
        """Second stage (in batch order): resolve the batch's new tokens, count, append to ``shard``."""
        try:
            ent, counts, hi = scanned.result() if isinstance(scanned, Future) else scanned  # its own error first
        except BaseException as e:
            if self._error is None:
                self._error = e
            raise
        if self._error is not None:  # an earlier batch failed: the state is incomplete
            raise RuntimeError("an earlier batch failed") from self._error
        try:
            self._count_batch(ent, counts, hi, first_doc, shard)
        except BaseException as e:
            if self._error is None:
                self._error = e
            raise

    def _scan_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
        """Token-table entries of every token occurrence of ``texts`` (i32[m]), tokens per text
        (i64[n]) and the table's entry count after the batch (entries below it are all the batch
        needs resolved). Touches only the token table's keys and bytes (not its values), so it may
        run while the previous batch is being resolved and counted."""
        n = len(texts)
        cfg = self.analyzer.config
        try:
            data, offsets = utf8_arrays(texts)
            encoded = True
        except UnicodeError:  # lone surrogates: whole batch in Python
            encoded = False
        entries: list[np.ndarray] = []
        counts = np.zeros(n, dtype=np.int64)
        start = 0
        table = self._tokens
        while start < n:
            if encoded:
                done, e, cnt, first_new = scan_tokens(data, offsets[start:], table, lowercase=cfg.lowercase,
                                                      ideo_class=_IDEO, stop_on_astral=True)
                entries.append(e)
                counts[start:start + done] = cnt
                start += done
                if start == n:
                    break
            # text `start` in Python, its tokens looked up as whole tokens
            toks = self.analyzer.tokenize(texts[start])
            if toks:
                tdata, toffsets = utf8_arrays(toks)
                _, e, _, _ = scan_tokens(tdata, toffsets, table, lowercase=False, ideo_class=_IDEO, verbatim=True)
                entries.append(e)
            counts[start] = len(toks)
            start += 1
        ent = np.concatenate(entries) if len(entries) != 1 else entries[0]
        return ent, counts, table.n

    def _count_batch(self, ent: np.ndarray, counts: np.ndarray, hi: int, first_doc: int, shard: "_Shard") -> None:
        self._resolve(hi)
        n_terms = self._terms.n
        doc, tid, tf, lens = count_terms(ent, counts, self._tokens.value[:hi], n_terms, first_doc,
                                           self._count_scratch)
        shard.docs.append(doc)
        shard.term_ids.append(tid)
        shard.tfs.append(tf)
        shard.lens.append(lens)
        self._sum_dl += int(lens.sum(dtype=np.int64))

    def _resolve(self, hi: int) -> None:
        """Give the token entries ``_n_resolved .. hi-1`` their term ids, in entry order: a new
        term gets the next term id. (Entries at or above ``hi`` may be being added by the scan
        of the next batch meanwhile: the arrays read here are only appended to or replaced by
        copies.)"""
        table = self._tokens
        lo = self._n_resolved
        if hi <= lo:
            return
        toks = table.tokens(lo, hi)
        keep = table.char_lengths(lo, hi) <= self.analyzer.config.max_token_length
        kept = toks if keep.all() else list(compress(toks, keep.tolist()))
        stems = self.analyzer.stem_many(kept)
        ids = np.full(hi - lo, -1, dtype=np.int64)
        if stems:
            data, offsets = utf8_arrays(stems)
            _, tids, _, _ = scan_tokens(data, offsets, self._terms, lowercase=False, ideo_class=_IDEO, verbatim=True)
            ids[keep] = tids
        table.set_values(lo, ids)
        self._n_resolved = hi

    # ------------------------------------------------------------------------------------ output

    def flush_async(self, *, compact: bool = False) -> Future:
        """:meth:`flush` computed on the worker thread (the counting sort runs without the GIL);
        the returned future's ``result()`` is the shard's arrays. The builder is ready for the next
        shard at once.

        Args:
            compact: list only the terms that occur (a living index's segment): ``terms``
                u32[T'] and ``offsets`` u64[T'+1] over them (:func:`csr_by_term_compact`, in
                time independent of the vocabulary's size) instead of ``offsets`` u64[T+1].
        """
        shard = self._shard
        self._shard = _Shard()
        self._n = 0

        def job() -> dict[str, np.ndarray]:
            if self._error is not None:
                raise RuntimeError("a batch of this shard failed") from self._error
            n_terms = self._terms.n
            doc = np.concatenate(shard.docs) if shard.docs else np.zeros(0, np.uint32)
            tid = np.concatenate(shard.term_ids) if shard.term_ids else np.zeros(0, np.uint32)
            tf = np.concatenate(shard.tfs) if shard.tfs else np.zeros(0, np.uint32)
            dl = np.concatenate(shard.lens) if shard.lens else np.zeros(0, np.uint32)
            if compact:  # the jobs run one at a time (one worker, or inline): one scratch
                terms, offsets, doc_ids, tf_sorted = csr_by_term_compact(doc, tid, tf, n_terms, self._csr_scratch)
                return {"terms": terms, "offsets": offsets, "doc_ids": doc_ids, "tfs": tf_sorted, "doc_len": dl}
            offsets, doc_ids, tf_sorted = csr_by_term(doc, tid, tf, n_terms)
            return {"offsets": offsets, "doc_ids": doc_ids, "tfs": tf_sorted, "doc_len": dl}

        if self._pool is None:
            fut: Future = Future()
            fut.set_result(job())
            return fut
        # ``shard`` is still being filled by the batches in flight, which run before this job
        fut = self._pool.submit(job)
        self._pending.append(fut)
        return fut

    def flush(self) -> dict[str, np.ndarray]:
        """Return the current shard's arrays and reset for the next shard.

        Returns:
            ``offsets`` u64[T+1] (T = vocabulary size now), ``doc_ids`` u32[nnz] (ascending per
            term), ``tfs`` u32[nnz], ``doc_len`` u32[n_docs] (terms after analysis).
        """
        fut = self.flush_async()
        self._wait(0)  # a batch's own error first
        return fut.result()


class _Shard:
    """Per-batch outputs of one shard: (doc, term, tf) triples and document lengths."""

    def __init__(self) -> None:
        self.docs: list[np.ndarray] = []
        self.term_ids: list[np.ndarray] = []
        self.tfs: list[np.ndarray] = []
        self.lens: list[np.ndarray] = []



class BM25Builder:
    """The BM25 leg's builder (:class:`retriever.index.builders.LegBuilder`): analysed postings
    per shard (``bm25.arrow``) and the index's vocabulary (``vocab.arrow``).

    Args:
        analyzer: the index's analyzer.
        faults: fault-injection hook (``encode_bm25``, ``shard_bm25``, ``vocab``).
        background: analyse on worker threads (see :class:`PostingsBuilder`).
        vocab: an existing index's vocabulary (see :class:`PostingsBuilder`).
    """

    name = "bm25"

    def __init__(self, analyzer: Analyzer, faults: Callable[[str], None], *, background: bool = True,
                 vocab: Sequence[str] | pa.Array = ()) -> None:
        self.postings = PostingsBuilder(analyzer, background=background, vocab=vocab)
        self._trim = len(vocab) > 0  # a segment of a living index: no empty lists past its last term
        self._faults = faults
        self._pending: Future | None = None

    def add(self, batch: "Batch") -> None:
        """Analyse one batch (on the worker threads)."""
        self.postings.add(batch.texts)
        self._faults("encode_bm25")

    def end_shard(self) -> None:
        """Start the shard's counting sort on the worker thread (it runs while docs are written)."""
        self._pending = self.postings.flush_async(compact=self._trim)

    def finish_shard(self, writer: Any, shard: "ShardHandle") -> "ShardOutput":
        """Write ``bm25.arrow``: ``offsets`` u64[T_s+1], ``doc_ids`` u32, ``tfs`` u32, ``doc_len`` u32."""
        from .builders import ShardOutput

        fut = self._pending if self._pending is not None else self.postings.flush_async(compact=self._trim)
        self._pending = None
        arrays = fut.result()
        if len(arrays["doc_len"]) != shard.rows:
            raise RuntimeError(f"internal error: {len(arrays['doc_len'])} document lengths for {shard.rows} rows")
        nnz = int(len(arrays["doc_ids"]))
        if self._trim:  # the lists end at the shard's last term; listed alone when that is smaller
            terms = arrays.pop("terms")
            n_terms = int(terms[-1]) + 1 if len(terms) else 0
            if not compact_is_smaller(len(terms), n_terms):
                arrays["offsets"] = dense_offsets(terms, arrays["offsets"], n_terms, nnz)
                entry = {"n_terms": n_terms, "nnz": nnz}
            else:
                arrays["terms"] = terms
                entry = {"n_terms": n_terms, "nnz": nnz, "bm25_terms": int(len(terms))}
        else:
            n_terms = int(len(arrays["offsets"]) - 1)
            entry = {"n_terms": n_terms, "nnz": nnz}
        rel = writer.write_arrays(f"{shard.dir}/bm25.arrow", arrays)
        self._faults("shard_bm25")
        stats = {"n_docs": shard.rows, "sum_dl": int(arrays["doc_len"].sum(dtype=np.int64)), "n_terms": n_terms,
                 "nnz": nnz}
        return ShardOutput(files=[rel], stats=stats, entry=entry)

    def finish(self, writer: Any, n_docs: int) -> "IndexOutput":
        """Write ``vocab.arrow`` (row i = term id i); corpus ``n_terms`` and ``sum_dl``."""
        from .builders import IndexOutput

        terms = self.postings.terms
        writer.write_vocab(terms)
        self._faults("vocab")
        out = IndexOutput(stats={"n_terms": len(terms), "sum_dl": self.postings.sum_dl})
        self.postings.close()
        return out

    def close(self, *, raise_errors: bool = True) -> None:
        """Stop the analysis threads."""
        self.postings.close(raise_errors=raise_errors)
