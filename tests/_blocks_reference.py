"""Frozen reference of the Seismic block build as first written (main at b8f0ee7, before the
term-range/thread rewrite of ``retriever.index.sparse_index``): one serial pass over the terms with
per-block allocations and sorts. Kept verbatim (compiled without a cache) so the tests can check
that the faster kernels produce byte-identical arrays; not used by the package."""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit
def _lcg(state):
    return (state * 1103515245 + 12345) % 2147483648


@nb.njit
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


@nb.njit
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


@nb.njit
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


@nb.njit
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

