"""Build-time array kernels (numba) of the learned-sparse leg: impact quantisation, the inverted
index, and the Seismic-style blocked index.

Everything here is a pure function of arrays, so the index builder and the benchmarks share it.

Quantisation: a weight w > 0 is stored as ``q = clip(round(w / scale), 1, 65535)`` (uint16), with
ONE ``scale`` for the whole index (``max weight / 65535``), so the stored vectors, and therefore
exact scores and rankings, do not depend on how the corpus was split into shards. The exact
scorer computes ``score(q, d) = scale · Σ_t q_t · impact(t, d)``.

Approximate index after Seismic (Bruch, Nardini, Rulli, Venturini, "Efficient Inverted Indexes
for Approximate Retrieval over Learned Sparse Representations", SIGIR 2024):
  1. *static pruning*: each term keeps its ``n_postings`` highest-impact postings;
  2. *blocking*: the kept postings are clustered into ``ceil(len / block_size)`` blocks of
     similar documents by one round of "random k-means" (random documents of the list are the
     centroids; every document joins the centroid with the largest inner product between the
     centroid and the document's ``DOC_CUT`` = 15 largest entries, as Seismic's default);
  3. *summaries*: per block, the coordinate-wise max of its documents' vectors, pruned to the
     largest entries holding ``summary_energy`` of its L1 mass, quantised to uint8 with a
     per-block scale (value = u8 · block_scale, rounded up so kept entries never shrink).
  4. *query-time layout*: the summaries are stored inverted per term (:func:`invert_summaries`:
     a directory of the components of the term's block summaries, each pointing to its
     ``(block, u8)`` entries), so scoring a term's blocks reads only the query's terms; kept
     blocks are scored against a packed copy of the forward index (:func:`pack_forward`: one
     uint32 per posting, the term's rank by document frequency and the uint16 impact).
The forward index (each document's quantised vector) is what kept blocks are scored against;
the packed copy gives the same float32 scores.

Build threads: steps 2-4 run over contiguous term ranges on ``n_threads`` threads (numba kernels
that release the GIL, each range with its own scratch, results concatenated in term order). A
term's blocks depend only on its list, the forward index and the seed, so the arrays are the same
for any thread count.
"""

from __future__ import annotations

import os
from typing import Any

import numba as nb
import numpy as np

IMPACT_MAX = 65535
#: Entries of each document used to assign it to a block centroid (Seismic's ``doc_cut``, its default).
DOC_CUT = 15


def impact_scale(max_weight: float) -> float:
    """Global uint16 quantisation step for weights up to ``max_weight`` (1.0 for an all-zero index)."""
    return float(max_weight) / IMPACT_MAX if max_weight > 0 else 1.0


def check_doc_vectors(indptr: Any, terms: Any, weights: Any, vocab_size: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate user-supplied document vectors (CSR) and return them in the stored form.

    Same policy as the query-side ``retriever.legs.sparse.csr_batch``: indices may be unsorted
    (each row is sorted here); duplicate indices within a row, length mismatches, indices outside
    ``[0, vocab_size)``, NaN/inf or negative weights are errors; zero weights are dropped.

    Args:
        indptr: integer (n+1,), non-decreasing from 0 to ``len(terms)``.
        terms: integer (nnz,) term ids; weights: float (nnz,).
        vocab_size: the sparse model's vocabulary size.

    Returns:
        ``(indptr int64 (n+1,), terms uint32 (nnz',), weights float32 (nnz',))``, terms ascending
        per row, all weights > 0.

    Raises:
        ValueError: naming the row and the offending value (callers wrap it in their error class).
    """
    indptr, terms, weights = np.asarray(indptr), np.asarray(terms), np.asarray(weights)
    for name, arr in (("indptr", indptr), ("term ids", terms), ("weights", weights)):
        if arr.ndim > 1:
            raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    indptr, terms, weights = indptr.reshape(-1), terms.reshape(-1), weights.reshape(-1)
    if len(weights) and weights.dtype.kind not in "iuf":
        raise ValueError(f"weights must be numbers, got dtype {weights.dtype} (first value {weights[0].item()!r})")
    weights = weights.astype(np.float64)
    if len(indptr) < 1 or not np.issubdtype(indptr.dtype, np.integer):
        raise ValueError("indptr must be a non-empty integer array")
    if len(terms) != len(weights):
        raise ValueError(f"{len(terms)} term ids but {len(weights)} weights")
    if len(terms) and not np.issubdtype(terms.dtype, np.integer):
        raise ValueError(f"term ids must be integers, got dtype {terms.dtype}")
    indptr = indptr.astype(np.int64)
    if indptr[0] != 0 or indptr[-1] != len(terms) or (np.diff(indptr) < 0).any():
        raise ValueError(f"indptr must rise from 0 to {len(terms)} (got {indptr[0]} .. {indptr[-1]})")
    row = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    bad = (terms >= vocab_size) if terms.dtype.kind == "u" else (terms < 0) | (terms >= vocab_size)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"row {row[i]}: term id {int(terms[i])} outside the vocabulary [0, {vocab_size})")
    terms = terms.astype(np.int64)
    bad = ~np.isfinite(weights) | (np.abs(weights) > np.finfo(np.float32).max)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"row {row[i]}: weight {float(weights[i])!r} is not finite in float32")
    bad = weights < 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"row {row[i]}: negative weight {float(weights[i])!r} (learned-sparse weights must be >= 0)")
    order = np.lexsort((terms, row))
    terms, weights, row = terms[order], weights[order], row[order]
    dup = (terms[1:] == terms[:-1]) & (row[1:] == row[:-1])
    if dup.any():
        i = int(np.flatnonzero(dup)[0]) + 1
        raise ValueError(f"row {row[i]}: duplicate term id {terms[i]}")
    keep = weights > 0
    out_ptr = np.zeros(len(indptr), np.int64)
    np.cumsum(np.bincount(row[keep], minlength=len(indptr) - 1), out=out_ptr[1:])
    return out_ptr, terms[keep].astype(np.uint32), weights[keep].astype(np.float32)


@nb.njit(cache=True)
def _quantise(weights, scale, out):
    inv = 1.0 / scale
    for i in range(weights.shape[0]):
        q = np.floor(weights[i] * inv + 0.5)
        if q < 1.0:
            q = 1.0
        elif q > 65535.0:
            q = 65535.0
        out[i] = np.uint16(q)


def quantise(weights: np.ndarray, scale: float) -> np.ndarray:
    """uint16 impacts of float32 weights (> 0): ``clip(round(w / scale), 1, 65535)``."""
    out = np.empty(len(weights), dtype=np.uint16)
    _quantise(np.ascontiguousarray(weights, dtype=np.float32), np.float64(scale), out)
    return out


@nb.njit(cache=True)
def _transpose(indptr, terms, values, n_terms, offsets, doc_ids, impacts):
    n_docs = indptr.shape[0] - 1
    for p in range(terms.shape[0]):
        offsets[terms[p] + 1] += 1
    for t in range(n_terms):
        offsets[t + 1] += offsets[t]
    fill = offsets[:-1].copy()
    for d in range(n_docs):
        for p in range(indptr[d], indptr[d + 1]):
            t = terms[p]
            j = fill[t]
            doc_ids[j] = d
            impacts[j] = values[p]
            fill[t] = j + 1
    # impact-ordered lists: impact descending, ties by doc id ascending
    for t in range(n_terms):
        lo = offsets[t]
        hi = offsets[t + 1]
        if hi - lo < 2:
            continue
        key = np.empty(hi - lo, dtype=np.int64)
        for i in range(lo, hi):
            key[i - lo] = (np.int64(65535 - np.int64(impacts[i])) << 32) | np.int64(doc_ids[i])
        key.sort()
        for i in range(lo, hi):
            kk = key[i - lo]
            doc_ids[i] = np.uint32(kk & 0xFFFFFFFF)
            impacts[i] = np.uint16(65535 - (kk >> 32))


def invert(indptr: np.ndarray, terms: np.ndarray, values: np.ndarray, n_terms: int
           ) -> dict[str, np.ndarray]:
    """Forward CSR (docs × terms) → impact-ordered postings.

    Args:
        indptr: uint64/int64 (n_docs+1,); terms: uint32 (nnz,) < n_terms, unique per row;
        values: uint16 (nnz,) impacts.

    Returns:
        ``offsets`` uint64 (n_terms+1,), ``doc_ids`` uint32 (nnz,), ``impacts`` uint16 (nnz,); each
        term's list is sorted by impact descending, ties by doc id ascending (what the exact
        kernel's early termination and the static pruning below rely on).
    """
    offsets = np.zeros(n_terms + 1, dtype=np.uint64)
    doc_ids = np.empty(len(terms), dtype=np.uint32)
    impacts = np.empty(len(terms), dtype=np.uint16)
    _transpose(indptr.astype(np.int64), terms.astype(np.int64), values, n_terms, offsets, doc_ids, impacts)
    return {"offsets": offsets, "doc_ids": doc_ids, "impacts": impacts}


@nb.njit(cache=True, nogil=True)
def _lcg(state):
    return (state * 1103515245 + 12345) % 2147483648


@nb.njit(cache=True, nogil=True)
def _assign_to_centroids(t, docs, fwd_offsets, fwd_terms, fwd_values, cut_offsets, cut_terms, cut_values, nc,
                         seed, acc, cstart, ccount, touched, pos, assign):
    """One round of "random k-means" over a term's list: ``nc`` >= 2 random distinct documents of
    ``docs`` (int64 (n,)) are the centroids, each document joins the centroid with the largest
    inner product between the centroid's vector and the document's ``doc_cut`` largest entries
    (ties: the smaller centroid). Writes ``assign[:n]`` (centroid per document, int64).

    Scratch (left as found): ``acc`` float32 (>= nc,) zero; ``cstart``/``ccount`` int64
    (n_terms_total,), ``ccount`` zero; ``touched`` int64 (n_terms_total,); ``pos`` int64 (>= n,)."""
    n = docs.shape[0]
    # random distinct centroids (partial Fisher-Yates over positions, seeded by term id)
    for i in range(n):
        pos[i] = i
    state = (np.int64(seed) * 7919 + np.int64(t) * 104729 + 1) % 2147483648
    for i in range(nc):
        state = _lcg(_lcg(state))
        j = i + (state >> 4) % (n - i)
        tmp = pos[i]
        pos[i] = pos[j]
        pos[j] = tmp
    # mini inverted index over the centroids: term -> list of (centroid, value)
    nt = 0
    for c in range(nc):
        d = docs[pos[c]]
        for p in range(fwd_offsets[d], fwd_offsets[d + 1]):
            tt = fwd_terms[p]
            touched[nt] = tt
            nt += ccount[tt] == 0
            ccount[tt] += 1
    total = 0
    for k in range(nt):
        tt = touched[k]
        cstart[tt] = total
        total += ccount[tt]
        ccount[tt] = 0
    c_ids = np.empty(total, dtype=np.int64)
    c_vals = np.empty(total, dtype=np.float32)
    for c in range(nc):
        d = docs[pos[c]]
        for p in range(fwd_offsets[d], fwd_offsets[d + 1]):
            tt = fwd_terms[p]
            j = cstart[tt] + ccount[tt]
            c_ids[j] = c
            c_vals[j] = np.float32(fwd_values[p])
            ccount[tt] += 1
    # assignment by the inner product of the document's doc_cut largest entries (Seismic's
    # "RandomKmeansInvertedIndexApprox") with each centroid; only touched centroids scanned
    # (float32 sums in the order: cut entries by value, centroids by index)
    tc = pos  # positions are no longer needed: reused for the touched centroids
    for i in range(n):
        d = docs[i]
        ntc = 0
        for p in range(cut_offsets[d], cut_offsets[d + 1]):
            tt = cut_terms[p]
            cnt = ccount[tt]
            if cnt == 0:
                continue
            v = cut_values[p]
            s0 = cstart[tt]
            for j in range(s0, s0 + cnt):
                c = c_ids[j]
                if acc[c] == 0.0:
                    tc[ntc] = c
                    ntc += 1
                acc[c] += v * c_vals[j]
        best = 0
        bv = 0.0
        for j in range(ntc):
            c = tc[j]
            a = acc[c]
            if a > bv or (a == bv and c < best):
                bv = a
                best = c
            acc[c] = 0.0
        assign[i] = best
    for k in range(nt):
        ccount[touched[k]] = 0


@nb.njit(cache=True, nogil=True)
def _sort_keys(keys, n, tmp, shift0, key_bits):
    """Sort ``keys[:n]`` (int64 >= 0, below ``2**key_bits``, distinct in their bits from ``shift0``
    up) ascending in place: LSD radix sort on bytes from bit ``shift0`` up (summary keys: the low 16
    bits are a value, the rest a distinct term id); ``tmp`` int64 (>= n,) scratch. Already-sorted
    input (one-document blocks) returns at once, 16 keys or fewer are insertion-sorted."""
    unsorted = False
    for i in range(1, n):
        if keys[i] < keys[i - 1]:
            unsorted = True
            break
    if not unsorted:
        return
    if n <= 16:
        for i in range(1, n):
            k = keys[i]
            j = i - 1
            while j >= 0 and keys[j] > k:
                keys[j + 1] = keys[j]
                j -= 1
            keys[j + 1] = k
        return
    cnt = np.empty(256, dtype=np.int64)
    shift = shift0
    in_tmp = False
    while shift < key_bits:
        src = tmp if in_tmp else keys
        dst = keys if in_tmp else tmp
        cnt[:] = 0
        for i in range(n):
            cnt[(src[i] >> shift) & 255] += 1
        s = 0
        for b in range(256):
            c = cnt[b]
            cnt[b] = s
            s += c
        for i in range(n):
            b = (src[i] >> shift) & 255
            dst[cnt[b]] = src[i]
            cnt[b] += 1
        in_tmp = not in_tmp
        shift += 8
    if in_tmp:
        for i in range(n):
            keys[i] = tmp[i]


@nb.njit(cache=True, nogil=True)
def _block_summary(bd, fwd_offsets, fwd_terms, fwd_values, energy, dense, touched, ivals, keys, tmp, hist_hi,
                   hist_lo, key_bits, sum_terms_out, sum_vals_out, out_at):
    """Summary of one block (documents ``bd`` int64, ascending): coordinate-wise max, the shortest
    prefix of its values sorted descending (stable: ties in first-touched order, i.e. documents
    ascending, then terms ascending) holding ``energy`` of the L1 mass, kept entries by term id,
    values as uint8 with ``ceil(v / block_scale - 1e-6)`` clipped to [1, 255], block_scale =
    max / 255. Writes ``sum_terms_out``/``sum_vals_out`` from ``out_at``; returns (entries, block_scale).

    Scratch: ``dense`` uint16 (n_terms_total,) zero (left zero); ``touched``, ``ivals``, ``keys``,
    ``tmp`` int64 (n_terms_total,); ``hist_hi``, ``hist_lo`` int64 (256,)."""
    # coordinate-wise max; the touched terms in first-touched order (branch-free: values are >= 1,
    # so a zero marks a term not yet seen in this block)
    m = 0
    for d in bd:
        for p in range(fwd_offsets[d], fwd_offsets[d + 1]):
            tt = fwd_terms[p]
            v = fwd_values[p]
            old = dense[tt]
            touched[m] = tt
            m += old == 0
            dense[tt] = max(old, v)
    # values are uint16 impacts: L1 mass and maximum as exact integers
    l1i = 0
    vmax_i = 0
    hist_hi[:] = 0
    for i in range(m):
        tt = touched[i]
        iv = np.int64(dense[tt])
        ivals[i] = iv
        hist_hi[iv >> 8] += iv
        l1i += iv
        vmax_i = max(vmax_i, iv)
        dense[tt] = 0
    l1 = float(l1i)
    # kept entries: the shortest prefix of the values sorted descending (stable) holding
    # energy * l1. As the values are 16-bit integers the prefix is found without sorting: v* = the
    # largest value whose entries >= v* hold the target (a two-pass histogram, high byte then low
    # byte); every entry > v* is kept, then the first entries equal to v* (first-touched order)
    # until the mass reaches the target.
    target = energy * l1
    cum = 0
    hb = -1
    for b in range(255, -1, -1):
        if float(cum + hist_hi[b]) >= target:
            hb = b
            break
        cum += hist_hi[b]
    keep = 0
    if hb < 0:  # target above the whole mass (energy > 1): everything is kept
        for i in range(m):
            keys[i] = (touched[i] << 16) | ivals[i]
        keep = m
    else:
        hist_lo[:] = 0
        for i in range(m):
            iv = ivals[i]
            hist_lo[iv & 255] += iv if (iv >> 8) == hb else 0
        vstar = 0
        for b in range(255, -1, -1):
            if float(cum + hist_lo[b]) >= target:
                vstar = (hb << 8) | b
                break
            cum += hist_lo[b]
        for i in range(m):
            iv = ivals[i]
            keys[keep] = (touched[i] << 16) | iv
            keep += iv > vstar
        mass = float(cum)  # mass of the entries > v*, below the target
        if mass < target:
            for i in range(m):
                if ivals[i] == vstar:
                    keys[keep] = (touched[i] << 16) | vstar
                    keep += 1
                    mass += float(vstar)
                    if mass >= target:
                        break
    # kept entries by term id (unique per block)
    _sort_keys(keys, keep, tmp, 16, key_bits)
    vmax = np.float32(vmax_i)
    bscale = vmax / 255.0
    for i in range(keep):
        v = np.float32(keys[i] & 0xFFFF)
        qv = np.ceil(v / bscale - 1e-6)
        if qv < 1.0:
            qv = 1.0
        if qv > 255.0:
            qv = 255.0
        sum_terms_out[out_at + i] = keys[i] >> 16
        sum_vals_out[out_at + i] = np.uint8(qv)
    return keep, bscale


@nb.njit(cache=True, nogil=True)
def _doc_cut(fwd_offsets, fwd_terms, fwd_values, doc_cut):
    """Each document's ``doc_cut`` largest entries (ties: smaller term first), for clustering:
    ``(offsets int64 (n_docs+1,), terms int64, values float32)``."""
    n = fwd_offsets.shape[0] - 1
    off = np.zeros(n + 1, dtype=np.int64)
    for d in range(n):
        off[d + 1] = off[d] + min(doc_cut, fwd_offsets[d + 1] - fwd_offsets[d])
    terms = np.empty(off[n], dtype=np.int64)
    vals = np.empty(off[n], dtype=np.float32)
    # per document, the smallest keys (65535 - value) << 32 | position by insertion into a sorted
    # buffer of doc_cut keys (most entries fail the first comparison)
    best = np.empty(max(doc_cut, 1), dtype=np.int64)
    for d in range(n):
        lo = fwd_offsets[d]
        hi = fwd_offsets[d + 1]
        k = off[d + 1] - off[d]
        nb_ = 0
        for p in range(lo, hi):
            key = ((65535 - np.int64(fwd_values[p])) << 32) | (p - lo)
            if nb_ == k:
                if key >= best[k - 1]:
                    continue
                j = k - 1
            else:
                j = nb_
                nb_ += 1
            while j > 0 and best[j - 1] > key:
                best[j] = best[j - 1]
                j -= 1
            best[j] = key
        for i in range(k):
            q = lo + (best[i] & 0xFFFFFFFF)
            terms[off[d] + i] = fwd_terms[q]
            vals[off[d] + i] = np.float32(fwd_values[q])
    return off, terms, vals


@nb.njit(cache=True, nogil=True)
def _build_blocks_range(t0, t1, post_offsets, post_docs, fwd_offsets, fwd_terms, fwd_values, cut_offsets,
                        cut_terms, cut_values, n_postings, block_size, energy, seed, n_terms_total):
    """Blocks and summaries of terms ``[t0, t1)`` (see :func:`_build_blocks`): returns
    ``(blocks per term int64 (t1-t0,), block_docs uint32, block_sizes int64, summary_terms uint32,
    summary_values uint8, summary_sizes int64, summary_scale float32)``, blocks in term order."""
    cap_docs = 0
    max_kept = 0
    for t in range(t0, t1):
        ln = post_offsets[t + 1] - post_offsets[t]
        kept = ln if (n_postings <= 0 or ln < n_postings) else n_postings
        cap_docs += kept
        max_kept = max(max_kept, kept)
    n_blocks = np.zeros(t1 - t0, dtype=np.int64)
    blk_docs = np.empty(cap_docs, dtype=np.uint32)
    blk_sizes = np.empty(cap_docs, dtype=np.int64)
    sum_sizes = np.empty(cap_docs, dtype=np.int64)
    sum_scale = np.empty(cap_docs, dtype=np.float32)
    sum_terms = np.empty(max(1024, cap_docs * 8), dtype=np.uint32)
    sum_vals = np.empty(max(1024, cap_docs * 8), dtype=np.uint8)
    # scratch
    nt_all = max(n_terms_total, 1)
    key_bits = 16
    while (np.int64(1) << (key_bits - 16)) < nt_all:
        key_bits += 8
    dense = np.zeros(nt_all, dtype=np.uint16)
    cstart = np.zeros(nt_all, dtype=np.int64)
    ccount = np.zeros(nt_all, dtype=np.int64)
    touched = np.empty(nt_all, dtype=np.int64)
    ivals = np.empty(nt_all, dtype=np.int64)
    keys = np.empty(nt_all, dtype=np.int64)
    tmp = np.empty(nt_all, dtype=np.int64)
    hist_hi = np.empty(256, dtype=np.int64)
    hist_lo = np.empty(256, dtype=np.int64)
    acc = np.zeros((max_kept + block_size - 1) // block_size + 1, dtype=np.float32)
    docs = np.empty(max_kept, dtype=np.int64)
    pos = np.empty(max_kept, dtype=np.int64)
    assign = np.empty(max_kept, dtype=np.int64)
    order = np.empty(max_kept, dtype=np.int64)
    counts = np.empty(max_kept + 2, dtype=np.int64)
    bd = np.empty(max_kept, dtype=np.int64)
    nb_total = 0
    nd_total = 0
    ns_total = 0
    for t in range(t0, t1):
        lo = post_offsets[t]
        hi = post_offsets[t + 1]
        n = hi - lo
        if n == 0:
            continue
        # lists are impact-ordered: the first n_postings are the kept ones
        if n_postings > 0 and n > n_postings:
            n = n_postings
        for i in range(n):
            docs[i] = post_docs[lo + i]
        docs[:n].sort()
        dl = docs[:n]
        # worst-case summary size of the term: the total nnz of its documents
        tot = 0
        for i in range(n):
            tot += fwd_offsets[dl[i] + 1] - fwd_offsets[dl[i]]
        if ns_total + tot > sum_terms.shape[0]:
            new_cap = max(ns_total + tot, sum_terms.shape[0] * 2)
            st = np.empty(new_cap, dtype=np.uint32)
            sv = np.empty(new_cap, dtype=np.uint8)
            st[:ns_total] = sum_terms[:ns_total]
            sv[:ns_total] = sum_vals[:ns_total]
            sum_terms = st
            sum_vals = sv
        nc = (n + block_size - 1) // block_size
        if nc <= 1:
            nc = 1
            assign[:n] = 0
        else:
            _assign_to_centroids(t, dl, fwd_offsets, fwd_terms, fwd_values, cut_offsets, cut_terms, cut_values,
                                 nc, seed, acc, cstart, ccount, touched, pos, assign)
        # group documents by block (a stable counting sort: each block's documents stay
        # ascending); empty clusters are dropped
        counts[:nc + 1] = 0
        for i in range(n):
            counts[assign[i] + 1] += 1
        for c in range(nc):
            counts[c + 1] += counts[c]
        for i in range(n):
            a = assign[i]
            order[counts[a]] = i
            counts[a] += 1
        start = 0
        nbk = 0
        for c in range(nc):
            end = counts[c]
            if end == start:
                continue
            k = end - start
            for i in range(k):
                d = dl[order[start + i]]
                bd[i] = d
                blk_docs[nd_total + i] = d
            nd_total += k
            blk_sizes[nb_total] = k
            keep, bscale = _block_summary(bd[:k], fwd_offsets, fwd_terms, fwd_values, energy, dense, touched,
                                          ivals, keys, tmp, hist_hi, hist_lo, key_bits, sum_terms, sum_vals,
                                          ns_total)
            sum_scale[nb_total] = bscale
            sum_sizes[nb_total] = keep
            ns_total += keep
            nb_total += 1
            nbk += 1
            start = end
        n_blocks[t - t0] = nbk
    return (n_blocks, blk_docs[:nd_total], blk_sizes[:nb_total], sum_terms[:ns_total], sum_vals[:ns_total],
            sum_sizes[:nb_total], sum_scale[:nb_total])


def _build_blocks(post_offsets: np.ndarray, post_docs: np.ndarray, post_imps: np.ndarray, fwd_offsets: np.ndarray,
                  fwd_terms: np.ndarray, fwd_values: np.ndarray, n_postings: int, block_size: int, energy: float,
                  seed: int, n_terms_total: int, doc_cut: int, n_threads: int | None = 1
                  ) -> tuple[np.ndarray, ...]:
    """Seismic blocks and (not yet inverted) summaries of every term.

    Args:
        post_offsets int64 (n_terms+1,), post_docs uint32 (impact-ordered lists; ``post_imps`` is
        unused), fwd_offsets int64 (n_docs+1,), fwd_terms uint32, fwd_values uint16 (>= 1): the
        postings and the forward index; n_postings: kept postings per term (<= 0: all);
        block_size >= 1; energy: the summary's L1 fraction; seed: clustering seed;
        n_terms_total: vocabulary size; doc_cut: entries per document used to assign it;
        n_threads: threads over contiguous term ranges (None: all cores); the result does not
        depend on it.

    Returns:
        ``(term_blocks uint64 (n_terms+1,), block_docs uint32, block_sizes int64 (n_blocks,),
        summary_terms uint32, summary_values uint8, summary_sizes int64 (n_blocks,),
        summary_scale float32 (n_blocks,))`` (scale in impact units).
    """
    n_terms = post_offsets.shape[0] - 1
    cut_offsets, cut_terms, cut_values = _doc_cut(fwd_offsets, fwd_terms, fwd_values, doc_cut)
    lens = np.diff(post_offsets)
    kept = (np.minimum(lens, n_postings) if n_postings > 0 else lens).astype(np.float64)
    # each kept posting costs its document's non-zeros in the summaries; clustering grows with
    # the square of the list's length
    n_threads = _threads(n_threads)
    ranges = _term_ranges(kept * (1.0 + kept / (8.0 * block_size)), n_threads)
    parts = _run_ranges(_build_blocks_range, ranges, n_threads, post_offsets, post_docs, fwd_offsets, fwd_terms,
                        fwd_values, cut_offsets, cut_terms, cut_values, int(n_postings), int(block_size),
                        float(energy), int(seed), int(n_terms_total))
    term_blocks = np.zeros(n_terms + 1, dtype=np.uint64)
    np.cumsum(np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64), out=term_blocks[1:])
    cat = [np.concatenate([p[i] for p in parts]) for i in range(1, 7)]
    return (term_blocks, *cat)


@nb.njit(cache=True, nogil=True)
def _invert_summaries_range(t0, t1, term_blocks, sum_offsets, sum_terms, sum_values, n_comp, entries):
    """Terms ``[t0, t1)`` of :func:`invert_summaries`: writes their ``entries`` (uint32, at the
    global positions ``sum_offsets[term_blocks[t]]`` on) and returns ``(components per term
    int64 (t1-t0,), directory uint64)``. Entries of a component keep block order (ascending j):
    a stable counting sort by component per term (counts in a dense array of ``n_comp``, only the
    term's distinct components sorted)."""
    lo0 = sum_offsets[term_blocks[t0]]
    hi0 = sum_offsets[term_blocks[t1]]
    n_dirs = np.zeros(t1 - t0, dtype=np.int64)
    dir_ = np.empty(hi0 - lo0, dtype=np.uint64)
    cnt = np.zeros(n_comp, dtype=np.int64)
    comps = np.empty(n_comp, dtype=np.int64)
    tmp = np.empty(n_comp, dtype=np.int64)
    key_bits = 0
    while (np.int64(1) << key_bits) < n_comp:
        key_bits += 8
    nc = 0
    for t in range(t0, t1):
        b0 = term_blocks[t]
        b1 = term_blocks[t + 1]
        lo = sum_offsets[b0]
        hi = sum_offsets[b1]
        if hi > lo:
            k = 0
            for i in range(lo, hi):
                c = np.int64(sum_terms[i])
                comps[k] = c
                k += cnt[c] == 0
                cnt[c] += 1
            _sort_keys(comps, k, tmp, 0, key_bits)
            r = 0
            for j in range(k):
                c = comps[j]
                dir_[nc] = np.uint64((c << 32) | r)
                nc += 1
                n_c = cnt[c]
                cnt[c] = r  # now the next free slot of c
                r += n_c
            for b in range(b0, b1):
                for i in range(sum_offsets[b], sum_offsets[b + 1]):
                    c = np.int64(sum_terms[i])
                    r = cnt[c]
                    entries[lo + r] = np.uint32(((b - b0) << 8) | np.int64(sum_values[i]))
                    cnt[c] = r + 1
            for j in range(k):
                cnt[comps[j]] = 0
            n_dirs[t - t0] = k
    return n_dirs, dir_[:nc].copy()


def _threads(n_threads: int | None) -> int:
    """Thread count for the build kernels: ``None`` = all cores; else an integer >= 1.

    Raises:
        ValueError: ``n_threads`` is not None nor an integer >= 1 (names it).
    """
    if n_threads is None:
        return os.cpu_count() or 1
    if isinstance(n_threads, bool) or not isinstance(n_threads, (int, np.integer)) or n_threads < 1:
        raise ValueError(f"n_threads must be an integer >= 1 or None, got {n_threads!r}")
    return int(n_threads)


def _term_ranges(work: np.ndarray, n_threads: int, min_work: float = 16384.0) -> list[tuple[int, int]]:
    """Contiguous ranges ``[t0, t1)`` covering ``len(work)`` terms with about equal summed ``work``
    (float64 (n_terms,), >= 0, about one unit per posting or summary entry): one range for one
    thread or less than ``min_work`` in all (threads and per-range scratch would cost more than
    they save), else 8 per thread so that uneven ranges even out over a pool."""
    n = len(work)
    cum = np.cumsum(work)
    if n_threads <= 1 or n < 2 or cum[-1] < min_work:
        return [(0, n)]
    n_chunks = min(n, 8 * n_threads)
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, n_chunks) / n_chunks, side="right")
    bounds = sorted({0, n, *(int(c) for c in cuts)})
    return list(zip(bounds[:-1], bounds[1:]))


def _run_ranges(kernel: Any, ranges: list[tuple[int, int]], n_threads: int, *args: Any) -> list[Any]:
    """``kernel(t0, t1, *args)`` per range, in order; on a pool of ``n_threads`` threads when there
    are several ranges (the kernels release the GIL)."""
    if len(ranges) == 1 or n_threads <= 1:
        return [kernel(t0, t1, *args) for t0, t1 in ranges]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(n_threads, len(ranges)), thread_name_prefix="sparse-blocks") as pool:
        return list(pool.map(lambda r: kernel(r[0], r[1], *args), ranges))


def invert_summaries(term_blocks: np.ndarray, summary_offsets: np.ndarray, summary_terms: np.ndarray,
                     summary_values: np.ndarray, n_threads: int | None = 1) -> dict[str, np.ndarray]:
    """Block summaries (per block: ascending ``summary_terms`` uint32 with ``summary_values`` uint8,
    rows ``summary_offsets`` uint64 (n_blocks+1,); a term's blocks contiguous, as ``term_blocks``
    says) regrouped per term by component: the layout the query kernel reads, where only the
    components that are query terms are touched.

    Returns:
        ``summary_comp_offsets`` uint64 (n_terms+1,): term t's directory is
        ``summary_dir[summary_comp_offsets[t]:summary_comp_offsets[t+1]]``;
        ``summary_dir`` uint64: per component c of the term (ascending) ``(c << 32) | r``, r the
        start of c's entries relative to ``summary_entry_offsets[t]`` (they end where the next
        component's start, the last at the term's end);
        ``summary_entry_offsets`` uint64 (n_terms+1,): term t's entries are
        ``summary_entries[summary_entry_offsets[t]:summary_entry_offsets[t+1]]``;
        ``summary_entries`` uint32: ``(j << 8) | v``, j the block's index among the term's blocks
        (ascending within a component), v the uint8 value.

    ``n_threads`` (None: all cores) work on contiguous term ranges; the result does not depend on it.

    Raises:
        ValueError: a term with 2**24 blocks or 2**32 summary entries or more.
    """
    tb = np.asarray(term_blocks, dtype=np.int64)
    so = np.asarray(summary_offsets, dtype=np.int64)
    if len(tb) > 1:
        if int(np.diff(tb).max()) >= 1 << 24:
            raise ValueError(f"a term has {int(np.diff(tb).max())} blocks; at most {(1 << 24) - 1} are supported")
        per_term = so[tb[1:]] - so[tb[:-1]]
        if int(per_term.max()) >= 1 << 32:
            raise ValueError(f"a term has {int(per_term.max())} summary entries; at most 2**32 - 1 are supported")
    st = np.ascontiguousarray(summary_terms, dtype=np.uint32)
    sv = np.ascontiguousarray(summary_values, dtype=np.uint8)
    n_terms = len(tb) - 1
    n_comp = int(st.max()) + 1 if len(st) else 1
    entries = np.empty(len(st), dtype=np.uint32)
    eo = so[tb].astype(np.uint64) if len(tb) else np.zeros(1, np.uint64)
    work = np.diff(eo).astype(np.float64) + 1.0
    parts = _run_ranges(_invert_summaries_range, _term_ranges(work, _threads(n_threads)), _threads(n_threads),
                        tb, so, st, sv, n_comp, entries)
    co = np.zeros(n_terms + 1, dtype=np.uint64)
    if n_terms:
        np.cumsum(np.concatenate([p[0] for p in parts]), out=co[1:])
    dir_ = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.uint64)
    return {"summary_comp_offsets": co, "summary_dir": dir_, "summary_entry_offsets": eo,
            "summary_entries": entries}


def build_blocks(postings: dict[str, np.ndarray], fwd_offsets: np.ndarray, fwd_terms: np.ndarray,
                 fwd_values: np.ndarray, *, n_postings: int, block_size: int, summary_energy: float,
                 scale: float, n_terms: int, seed: int = 0, n_threads: int | None = None) -> dict[str, np.ndarray]:
    """Seismic blocked index of one shard (see the module docstring).

    Args:
        postings: output of :func:`invert` (``offsets``, ``doc_ids``, ``impacts``).
        fwd_offsets uint64 (n_docs+1,), fwd_terms uint32, fwd_values uint16: the forward index.
        n_postings: postings kept per term (0 = all); block_size: mean docs per block (>= 1);
        summary_energy: in (0, 1]; scale: the global impact scale (summary values are in weight
        units: ``u8 · block_scale``); n_terms: vocabulary size; n_threads: threads over contiguous
        term ranges (None: all cores; the arrays do not depend on it).

    Returns:
        ``term_blocks`` uint64 (n_terms+1,) (term t owns blocks [term_blocks[t], term_blocks[t+1])),
        ``block_docs_offsets`` uint64 (n_blocks+1,), ``block_docs`` uint32 (ascending per block),
        the summaries inverted per term (:func:`invert_summaries`: ``summary_comp_offsets``,
        ``summary_dir``, ``summary_entry_offsets``, ``summary_entries``) and ``summary_scale``
        float32 (n_blocks,) in weight units (entry value ``v`` of block b weighs
        ``v · summary_scale[b]``), and the packed forward copy of :func:`pack_forward`
        (``fwd_packed``, ``fwd_term_rank``).
    """
    tb, bdocs, bsizes, sterms, svals, ssizes, sscale = _build_blocks(
        postings["offsets"].astype(np.int64), postings["doc_ids"], postings["impacts"],
        fwd_offsets.astype(np.int64), fwd_terms, fwd_values, int(n_postings), int(block_size),
        float(summary_energy), int(seed), int(n_terms), DOC_CUT, n_threads)
    bo = np.zeros(len(bsizes) + 1, dtype=np.uint64)
    np.cumsum(bsizes, out=bo[1:])
    so = np.zeros(len(ssizes) + 1, dtype=np.uint64)
    np.cumsum(ssizes, out=so[1:])
    return {"term_blocks": tb, "block_docs_offsets": bo, "block_docs": bdocs,
            **invert_summaries(tb, so, sterms, svals, n_threads),
            "summary_scale": (sscale.astype(np.float64) * scale).astype(np.float32),
            **pack_forward(fwd_terms, fwd_values, n_terms)}


#: Largest vocabulary with a packed forward index (16-bit term ranks).
PACKED_MAX_TERMS = 1 << 16


def pack_forward(fwd_terms: np.ndarray, fwd_values: np.ndarray, n_terms: int) -> dict[str, np.ndarray]:
    """Packed copy of the forward index read by the approximate kernel.

    Args:
        fwd_terms uint32 (nnz,) < n_terms, fwd_values uint16 (nnz,): the forward index.

    Returns:
        ``fwd_term_rank`` uint32 (n_terms,): each term's rank by descending document frequency in
        this shard (ties by term id), and ``fwd_packed`` uint32 (nnz,): ``(fwd_term_rank[term] << 16)
        | value`` in forward-index order. Both empty when ``n_terms`` > 65,536 (the kernel then reads
        ``fwd_terms``/``fwd_values``). Same scores either way (the kernel's query weights are
        indexed by rank); one 4-byte stream per row instead of two of 6 bytes, and the query weights
        of frequent terms packed at the front.
    """
    if n_terms > PACKED_MAX_TERMS:
        return {"fwd_packed": np.zeros(0, np.uint32), "fwd_term_rank": np.zeros(0, np.uint32)}
    df = np.bincount(np.asarray(fwd_terms, dtype=np.int64), minlength=n_terms)
    by_df = np.lexsort((np.arange(n_terms), -df))
    rank = np.empty(n_terms, dtype=np.uint32)
    rank[by_df] = np.arange(n_terms, dtype=np.uint32)
    packed = (rank[fwd_terms] << np.uint32(16)) | np.asarray(fwd_values, dtype=np.uint32)
    return {"fwd_packed": packed.astype(np.uint32), "fwd_term_rank": rank}


def build_sparse_index(indptr: np.ndarray, terms: np.ndarray, weights: np.ndarray, *, n_terms: int,
                       scale: float, n_postings: int, block_size: int, summary_energy: float,
                       blocks: bool = True, n_threads: int | None = None) -> dict[str, Any]:
    """All query-time arrays of one shard from its float vectors.

    Args:
        indptr int64 (n_docs+1,), terms int/uint32 (nnz,) in [0, n_terms), weights float32 (nnz,)
        > 0, term ids ascending within a row; scale: the global impact scale; n_threads: threads
        of the block build (None: all cores; the arrays do not depend on it).

    Returns:
        ``fwd_offsets`` uint64, ``fwd_terms`` uint32, ``fwd_values`` uint16 (the forward index),
        ``offsets``/``doc_ids``/``impacts`` (postings), plus the arrays of :func:`build_blocks`
        when ``blocks``.
    """
    fwd_offsets = indptr.astype(np.uint64)
    fwd_terms = terms.astype(np.uint32)
    fwd_values = quantise(weights, scale)
    post = invert(fwd_offsets, fwd_terms, fwd_values, n_terms)
    out: dict[str, Any] = {"fwd_offsets": fwd_offsets, "fwd_terms": fwd_terms, "fwd_values": fwd_values, **post}
    if blocks:
        out.update(build_blocks(post, fwd_offsets, fwd_terms, fwd_values, n_postings=n_postings,
                                block_size=block_size, summary_energy=summary_energy, scale=scale,
                                n_terms=n_terms, n_threads=n_threads))
    return out
