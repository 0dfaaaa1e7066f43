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
"""

from __future__ import annotations

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


@nb.njit(cache=True)
def _lcg(state):
    return (state * 1103515245 + 12345) % 2147483648


@nb.njit(cache=True)
def _blocks_for_term(t, docs, fwd_offsets, fwd_terms, fwd_values, cut_offsets, cut_terms, cut_values,
                     block_size, energy,
                     dense, acc, cstart, ccount, centroid_of, blk_docs_out, sum_terms_out,
                     sum_vals_out, sum_scale_out, blk_sizes_out, sum_sizes_out, seed):
    """Blocks of one term's (pruned) list; returns the number of blocks written."""
    n = docs.shape[0]
    nc = (n + block_size - 1) // block_size
    hist_hi = np.empty(256, dtype=np.int64)
    hist_lo = np.empty(256, dtype=np.int64)
    if nc <= 1:
        assign = np.zeros(n, dtype=np.int64)
        nc = 1
    else:
        # random distinct centroids (partial Fisher-Yates over positions, seeded by term id)
        pos = np.arange(n)
        state = (np.int64(seed) * 7919 + np.int64(t) * 104729 + 1) % 2147483648
        for i in range(nc):
            state = _lcg(_lcg(state))
            j = i + (state >> 4) % (n - i)
            tmp = pos[i]
            pos[i] = pos[j]
            pos[j] = tmp
        # mini inverted index over the centroids: term -> list of (centroid, value)
        touched = []
        for c in range(nc):
            d = docs[pos[c]]
            for p in range(fwd_offsets[d], fwd_offsets[d + 1]):
                tt = fwd_terms[p]
                if ccount[tt] == 0:
                    touched.append(tt)
                ccount[tt] += 1
        total = 0
        for tt in touched:
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
        assign = np.empty(n, dtype=np.int64)
        tc = np.empty(nc, dtype=np.int64)
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
        for tt in touched:
            ccount[tt] = 0
    # group documents by block; empty clusters are dropped
    counts = np.zeros(nc + 1, dtype=np.int64)
    for i in range(n):
        counts[assign[i] + 1] += 1
    for c in range(nc):
        counts[c + 1] += counts[c]
    order = np.empty(n, dtype=np.int64)
    fill = counts[:-1].copy()
    for i in range(n):
        order[fill[assign[i]]] = i
        fill[assign[i]] += 1
    nb_out = 0
    n_docs_w = 0
    n_sum_w = 0
    for c in range(nc):
        lo = counts[c]
        hi = counts[c + 1]
        if hi == lo:
            continue
        # block documents ascending (memory order of the forward index)
        bd = np.sort(docs[order[lo:hi]])
        for i in range(bd.shape[0]):
            blk_docs_out[n_docs_w + i] = bd[i]
        n_docs_w += bd.shape[0]
        blk_sizes_out[nb_out] = bd.shape[0]
        # summary: coordinate-wise max
        tot = 0
        for d in bd:
            tot += fwd_offsets[d + 1] - fwd_offsets[d]
        touched2 = np.empty(tot, dtype=np.int64)
        m = 0
        for d in bd:
            for p in range(fwd_offsets[d], fwd_offsets[d + 1]):
                tt = fwd_terms[p]
                v = np.float32(fwd_values[p])
                if dense[tt] == 0.0:
                    touched2[m] = tt
                    m += 1
                if v > dense[tt]:
                    dense[tt] = v
        terms_arr = touched2[:m]
        # values are uint16 impacts (exact integers in float32 and in every partial sum)
        ivals = np.empty(m, dtype=np.int64)
        l1 = 0.0
        vmax = np.float32(0.0)
        hist_hi[:] = 0
        for i in range(m):
            v = dense[terms_arr[i]]
            iv = np.int64(v)
            ivals[i] = iv
            hist_hi[iv >> 8] += iv
            l1 += v
            vmax = max(vmax, v)
            dense[terms_arr[i]] = 0.0
        # kept entries: the shortest prefix of the values sorted descending (stable: ties in
        # first-touched order) holding energy * l1. As the values are 16-bit integers the prefix is
        # found without sorting: v* = the largest value whose entries >= v* hold the target (a
        # two-pass histogram, high byte then low byte); every entry > v* is kept, then the first
        # entries equal to v* until the mass reaches the target.
        target = energy * l1
        cum = 0
        hb = -1
        for b in range(255, -1, -1):
            if float(cum + hist_hi[b]) >= target:
                hb = b
                break
            cum += hist_hi[b]
        keys = np.empty(m, dtype=np.int64)
        keep = 0
        if hb < 0:  # target above the whole mass (energy > 1): everything is kept
            for i in range(m):
                keys[keep] = (terms_arr[i] << 16) | ivals[i]
                keep += 1
        else:
            hist_lo[:] = 0
            for i in range(m):
                if (ivals[i] >> 8) == hb:
                    hist_lo[ivals[i] & 255] += ivals[i]
            vstar = 0
            for b in range(255, -1, -1):
                if float(cum + hist_lo[b]) >= target:
                    vstar = (hb << 8) | b
                    break
                cum += hist_lo[b]
            mass = float(cum)  # mass of the entries > v*, below the target
            for i in range(m):
                iv = ivals[i]
                if iv > vstar:
                    keys[keep] = (terms_arr[i] << 16) | iv
                    keep += 1
                elif iv == vstar and mass < target:
                    keys[keep] = (terms_arr[i] << 16) | iv
                    keep += 1
                    mass += float(iv)
        # kept entries by term id (unique per block); already so when the block has one document
        ks = keys[:keep]
        for i in range(1, keep):
            if ks[i] < ks[i - 1]:
                ks = np.sort(ks)
                break
        bscale = vmax / 255.0
        sum_scale_out[nb_out] = bscale
        for i in range(keep):
            tt = ks[i] >> 16
            v = np.float32(ks[i] & 0xFFFF)
            qv = np.ceil(v / bscale - 1e-6)
            if qv < 1.0:
                qv = 1.0
            if qv > 255.0:
                qv = 255.0
            sum_terms_out[n_sum_w + i] = tt
            sum_vals_out[n_sum_w + i] = np.uint8(qv)
        n_sum_w += keep
        sum_sizes_out[nb_out] = keep
        nb_out += 1
    return nb_out, n_docs_w, n_sum_w


@nb.njit(cache=True)
def _doc_cut(fwd_offsets, fwd_terms, fwd_values, doc_cut):
    """Each document's ``doc_cut`` largest entries (ties: smaller term first), for clustering."""
    n = fwd_offsets.shape[0] - 1
    off = np.zeros(n + 1, dtype=np.int64)
    for d in range(n):
        off[d + 1] = off[d] + min(doc_cut, fwd_offsets[d + 1] - fwd_offsets[d])
    terms = np.empty(off[n], dtype=np.int64)
    vals = np.empty(off[n], dtype=np.float32)
    for d in range(n):
        lo = fwd_offsets[d]
        hi = fwd_offsets[d + 1]
        o = np.argsort(-fwd_values[lo:hi].astype(np.int64), kind="mergesort")
        for i in range(off[d + 1] - off[d]):
            terms[off[d] + i] = fwd_terms[lo + o[i]]
            vals[off[d] + i] = np.float32(fwd_values[lo + o[i]])
    return off, terms, vals


@nb.njit(cache=True)
def _build_blocks(post_offsets, post_docs, post_imps, fwd_offsets, fwd_terms, fwd_values, n_postings,
                  block_size, energy, seed, n_terms_total, doc_cut):
    n_terms = post_offsets.shape[0] - 1
    cut_offsets, cut_terms, cut_values = _doc_cut(fwd_offsets, fwd_terms, fwd_values, doc_cut)
    cap_docs = 0
    for t in range(n_terms):
        ln = post_offsets[t + 1] - post_offsets[t]
        cap_docs += ln if (n_postings <= 0 or ln < n_postings) else n_postings
    term_blocks = np.zeros(n_terms + 1, dtype=np.uint64)
    blk_docs = np.empty(cap_docs, dtype=np.uint32)
    blk_sizes = np.empty(cap_docs, dtype=np.int64)
    sum_sizes = np.empty(cap_docs, dtype=np.int64)
    sum_scale = np.empty(cap_docs, dtype=np.float32)
    # summaries: at most sum of block nnz; grow geometrically
    sum_terms = np.empty(max(1024, cap_docs * 8), dtype=np.uint32)
    sum_vals = np.empty(max(1024, cap_docs * 8), dtype=np.uint8)
    dense = np.zeros(n_terms_total, dtype=np.float32)
    cstart = np.zeros(n_terms_total, dtype=np.int64)
    ccount = np.zeros(n_terms_total, dtype=np.int64)
    acc = np.zeros(max(1, (cap_docs + block_size - 1) // block_size + 1), dtype=np.float32)
    centroid_of = np.zeros(1, dtype=np.int64)
    nb_total = 0
    nd_total = 0
    ns_total = 0
    for t in range(n_terms):
        lo = post_offsets[t]
        hi = post_offsets[t + 1]
        ln = hi - lo
        if ln == 0:
            term_blocks[t + 1] = nb_total
            continue
        # lists are impact-ordered: the first n_postings are the kept ones
        if n_postings > 0 and ln > n_postings:
            docs = np.sort(post_docs[lo:lo + n_postings]).astype(np.int64)
        else:
            docs = np.sort(post_docs[lo:hi]).astype(np.int64)
        need_sum = ns_total + docs.shape[0] * 1 + 4096
        # worst case summary size: union of docs' terms; bound by total nnz of docs
        tot = 0
        for d in docs:
            tot += fwd_offsets[d + 1] - fwd_offsets[d]
        need_sum = ns_total + tot
        if need_sum > sum_terms.shape[0]:
            new_cap = max(need_sum, sum_terms.shape[0] * 2)
            st = np.empty(new_cap, dtype=np.uint32)
            sv = np.empty(new_cap, dtype=np.uint8)
            st[:ns_total] = sum_terms[:ns_total]
            sv[:ns_total] = sum_vals[:ns_total]
            sum_terms = st
            sum_vals = sv
        nbk, ndw, nsw = _blocks_for_term(
            t, docs, fwd_offsets, fwd_terms, fwd_values, cut_offsets, cut_terms, cut_values, block_size, energy, dense, acc, cstart, ccount,
            centroid_of, blk_docs[nd_total:], sum_terms[ns_total:], sum_vals[ns_total:],
            sum_scale[nb_total:], blk_sizes[nb_total:], sum_sizes[nb_total:], seed)
        nb_total += nbk
        nd_total += ndw
        ns_total += nsw
        term_blocks[t + 1] = nb_total
    return (term_blocks, blk_docs[:nd_total], blk_sizes[:nb_total], sum_terms[:ns_total],
            sum_vals[:ns_total], sum_sizes[:nb_total], sum_scale[:nb_total])


@nb.njit(cache=True)
def _invert_summaries(term_blocks, sum_offsets, sum_terms, sum_values):
    """Per term, its blocks' summaries regrouped by component: (comp_offsets, dir, entry_offsets,
    entries) as in :func:`invert_summaries`. Entries of a component keep block order (ascending j)."""
    n_terms = term_blocks.shape[0] - 1
    n = sum_terms.shape[0]
    comp_offsets = np.zeros(n_terms + 1, dtype=np.uint64)
    entry_offsets = np.zeros(n_terms + 1, dtype=np.uint64)
    dir_ = np.empty(n, dtype=np.uint64)
    entries = np.empty(n, dtype=np.uint32)
    # a stable counting sort by component per term (entries keep block order): per-component
    # counts in a dense array, only the term's distinct components sorted
    n_comp = 1
    for i in range(n):
        if np.int64(sum_terms[i]) + 1 > n_comp:
            n_comp = np.int64(sum_terms[i]) + 1
    cnt = np.zeros(n_comp, dtype=np.int64)
    comps = np.empty(n_comp, dtype=np.int64)
    nc = 0
    for t in range(n_terms):
        b0 = term_blocks[t]
        b1 = term_blocks[t + 1]
        lo = sum_offsets[b0]
        hi = sum_offsets[b1]
        if hi > lo:
            k = 0
            for i in range(lo, hi):
                c = np.int64(sum_terms[i])
                if cnt[c] == 0:
                    comps[k] = c
                    k += 1
                cnt[c] += 1
            cs = np.sort(comps[:k])
            r = 0
            for j in range(k):
                c = cs[j]
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
                cnt[cs[j]] = 0
        comp_offsets[t + 1] = nc
        entry_offsets[t + 1] = hi
    return comp_offsets, dir_[:nc].copy(), entry_offsets, entries


def invert_summaries(term_blocks: np.ndarray, summary_offsets: np.ndarray, summary_terms: np.ndarray,
                     summary_values: np.ndarray) -> dict[str, np.ndarray]:
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
    co, dir_, eo, en = _invert_summaries(tb, so, np.asarray(summary_terms, dtype=np.uint32),
                                         np.asarray(summary_values, dtype=np.uint8))
    return {"summary_comp_offsets": co, "summary_dir": dir_, "summary_entry_offsets": eo,
            "summary_entries": en}


def build_blocks(postings: dict[str, np.ndarray], fwd_offsets: np.ndarray, fwd_terms: np.ndarray,
                 fwd_values: np.ndarray, *, n_postings: int, block_size: int, summary_energy: float,
                 scale: float, n_terms: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seismic blocked index of one shard (see the module docstring).

    Args:
        postings: output of :func:`invert` (``offsets``, ``doc_ids``, ``impacts``).
        fwd_offsets uint64 (n_docs+1,), fwd_terms uint32, fwd_values uint16: the forward index.
        n_postings: postings kept per term (0 = all); block_size: mean docs per block (>= 1);
        summary_energy: in (0, 1]; scale: the global impact scale (summary values are in weight
        units: ``u8 · block_scale``); n_terms: vocabulary size.

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
        float(summary_energy), int(seed), int(n_terms), DOC_CUT)
    bo = np.zeros(len(bsizes) + 1, dtype=np.uint64)
    np.cumsum(bsizes, out=bo[1:])
    so = np.zeros(len(ssizes) + 1, dtype=np.uint64)
    np.cumsum(ssizes, out=so[1:])
    return {"term_blocks": tb, "block_docs_offsets": bo, "block_docs": bdocs,
            **invert_summaries(tb, so, sterms, svals),
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
                       blocks: bool = True) -> dict[str, Any]:
    """All query-time arrays of one shard from its float vectors.

    Args:
        indptr int64 (n_docs+1,), terms int/uint32 (nnz,) in [0, n_terms), weights float32 (nnz,)
        > 0, term ids ascending within a row; scale: the global impact scale.

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
                                n_terms=n_terms))
    return out
