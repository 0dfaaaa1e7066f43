// MaxScore (Turtle & Flood 1995) for BM25: lists sorted by upper bound, candidates only
// from the essential lists. Window-at-a-time (term-at-a-time inside windows of kWindow
// doc ids, as Lucene's MaxScoreBulkScorer) when the essential lists are dense,
// document-at-a-time with galloping seeks when they are sparse or the query is long.
// Internal to the BM25 top-k translation unit (bm25_topk.cpp includes it once); hence
// the anonymous namespace.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "bm25_daat.hpp"
#include "bm25_simd.hpp"

namespace retriever {
namespace {

/// Doc-id window of the window-at-a-time MaxScore, and the most query terms
/// it handles (one bit each in a uint64 mask); longer queries run DAAT.
/// A window's scratch (double sums, term masks, epochs, per-slot
/// contributions, touched list) takes ~22 bytes per doc id plus 4 per list, so
/// 8,192 keeps it within a 512 KiB L2 (AMD Zen 3) for queries of up to ~10
/// terms (the synthetic benchmark's are 2-10); on the 2-core Zen 3 VM
/// the 1M synthetic benchmark's MaxScore ran 5-10% faster than with 16,384
/// (best of 9 passes, three interleaved rounds; 4,096 in between).
constexpr uint32_t kWindow = 8192;
constexpr size_t kMaxWindowLists = 64;
/// Below this many essential postings per window (on average over the
/// query), maxscore() runs document-at-a-time instead. With the safe initial
/// threshold (term_kth) the window path won at every tried value on the 1M
/// synthetic benchmark (1,024 was the round-1 setting: the raised threshold
/// then sent queries with short essential but long non-essential lists to
/// the slower DAAT probing), so only near-empty essential sets go DAAT.
constexpr uint64_t kMinWindowPostings = 1;

/// Up to this many window candidates are sorted; more are put in doc order
/// through a bitmap of the window (O(candidates + kWindow / 64)).
constexpr size_t kSortSmall = 24;
/// Bit marking window candidates in the 16-bit live epochs of maxscore().
constexpr uint16_t kEpochMark = 0x8000;

class maxscore_query : public daat_query {
  public:
    explicit maxscore_query(bm25_query& ctx) : daat_query(ctx) {}

    /// MaxScore (Turtle & Flood 1995), evaluated window-at-a-time (as Lucene's
    /// MaxScoreBulkScorer does). Lists are sorted by upper bound; the prefix
    /// whose bounds sum below the k-th score is non-essential, and candidates
    /// come only from the essential lists. For each window of kWindow doc ids
    /// starting at the smallest essential doc:
    ///   1. the essential lists are scanned term-at-a-time into a window
    ///      accumulator (exact contributions; with a single essential list,
    ///      postings whose tf bound cannot reach the threshold are skipped
    ///      before doc_norm is read);
    ///   2. the non-essential lists are visited highest bound first; before
    ///      each, candidates whose accumulated score plus the bounds of the
    ///      lists not yet visited cannot reach the threshold are dropped; the
    ///      survivors are completed by a merge scan of the list's postings in
    ///      the window, or by galloping seeks when few survive;
    ///   3. survivors get their canonical query-order float32 score and go to
    ///      the heap.
    /// The essential set is fixed within a window and shrinks between windows
    /// as the threshold rises. Independent loads in the scans keep many cache
    /// misses in flight, which is where DAAT loses time on frequent terms.
    /// Queries with more than kMaxWindowLists terms run maxscore_daat().
    void maxscore(uint64_t b, uint64_t e) {
        if (e - b > kMaxWindowLists) {
            maxscore_daat(b, e);
            return;
        }
        open_cursors(b, e, false);
        sort_by_bound();
        const size_t n = m_cursors.size();
        const bound_check bc(n);
        float thr = prime_threshold();
        if (sparse_essential_lists(thr, bc)) {
            maxscore_daat_run(thr);
            return;
        }
        m_win_acc.resize(kWindow, 0.0);
        m_win_mask.resize(kWindow, 0);
        m_win_live.resize(kWindow, 0);  // see m_win_epoch
        m_win_contrib.resize(n * kWindow);
        m_slot_of_qpos.resize(n);
        for (size_t j = 0; j < n; ++j) m_slot_of_qpos[m_sorted[j]->qpos] = static_cast<uint32_t>(j);
        m_win_touched.resize(kWindow + 1);
        size_t fe = 0;
        for (;;) {
            while (fe < n && !bc.may_enter(m_prefix[fe], thr)) ++fe;
            if (fe >= n) break;
            const uint32_t ws = min_doc_from(fe);
            if (ws == kEndDoc) break;
            // A new epoch makes every offset fresh: no clearing between windows.
            if (++m_win_epoch >= kEpochMark) {
                std::fill(m_win_live.begin(), m_win_live.end(), uint16_t{0});
                m_win_epoch = 1;
            }
            window w{ws, static_cast<uint64_t>(ws) + kWindow, fe, m_win_epoch, 0};
            add_essential_lists(w, thr, bc);
            collect_candidates(w, thr, bc);
            add_non_essential_lists(w, thr, bc);
            thr = push_survivors(w, thr, bc);
        }
    }

  private:
    /// One window of maxscore(): doc ids [ws, we), essential lists m_sorted[fe ..), the
    /// live epoch ep, and the number of window offsets touched so far.
    struct window {
        uint32_t ws;
        uint64_t we;
        size_t fe;
        uint16_t ep;
        size_t n_touched;
    };

    /// Sparse essential lists (few postings per window): DAAT is cheaper.
    bool sparse_essential_lists(float thr, const bound_check& bc) const {
        const size_t n = m_sorted.size();
        size_t fe0 = 0;
        while (fe0 < n && !bc.may_enter(m_prefix[fe0], thr)) ++fe0;
        uint64_t essential_postings = 0;
        for (size_t j = fe0; j < n; ++j) essential_postings += m_sorted[j]->end - m_sorted[j]->beg;
        return essential_postings * kWindow < m_ctx.data.n_docs * kMinWindowPostings;
    }

    /// Step 1: the essential lists' postings in the window, term-at-a-time, into the
    /// window accumulator (exact contributions; with a single essential list, postings
    /// whose tf bound cannot reach thr are skipped before doc_norm is read).
    void add_essential_lists(window& w, float thr, const bound_check& bc) {
        const size_t n = m_sorted.size();
        const size_t fe = w.fe;
        const size_t n_ess = n - fe;
        const uint8_t* pass = nullptr;
        double imp_cut = -std::numeric_limits<double>::infinity();  // impacts: skip below
        if (n_ess == 1 && m_ctx.imp != nullptr) {
            imp_cut = bc.cut(fe > 0 ? m_prefix[fe - 1] : 0.0, thr);
        } else if (n_ess == 1) {
            const double non_essential = fe > 0 ? m_prefix[fe - 1] : 0.0;
            const double* row = m_tf_bound.data() + m_sorted[fe]->qpos * kTfTable;
            for (uint32_t tf = 0; tf < kTfTable; ++tf) {
                m_pass[tf] = bc.may_enter(non_essential + row[tf], thr) ? 1 : 0;
            }
            pass = m_pass;
        }
        for (size_t j = fe; j < n; ++j) {
            posting_cursor& c = *m_sorted[j];
            if (m_ctx.imp != nullptr && j == fe) {
                scan_first_list(c, j, w, imp_cut);
            } else if (m_ctx.imp != nullptr) {
                scan_list_impacts(c, j, w, imp_cut);
            } else {
                scan_list_computed(c, j, w, pass);
            }
            c.refresh();
        }
    }

    /// The window's first list, with impacts: every offset is fresh (doc ids strictly
    /// increase within a list), so plain stores. A doc id not above the previous one
    /// (an unsorted list) raises before it could run past the window's buffers.
    void scan_first_list(posting_cursor& c, size_t j, window& win, double imp_cut) {
        const uint32_t* docs = m_ctx.data.csr.doc_ids;
        const float* imp = m_ctx.imp;
        const size_t n_docs = m_ctx.data.n_docs;
        double* acc = m_win_acc.data();
        uint64_t* mask = m_win_mask.data();
        uint16_t* live = m_win_live.data();
        uint32_t* touched_p = m_win_touched.data();  // kWindow + 1 entries
        const uint32_t ws = win.ws;
        const uint64_t we = win.we;
        const uint16_t ep = win.ep;
        size_t n_touched = win.n_touched;
        const uint64_t bit = uint64_t{1} << j;
        float* cb = m_win_contrib.data() + j * kWindow;
        const float w = c.weight;
        uint64_t p = c.pos;
        const uint64_t end = c.end;
        const double wd = w;
        int64_t prev = static_cast<int64_t>(ws) - 1;
        for (; p < end; ++p) {
            const uint32_t d = docs[p];
            if (d >= we) break;
            if (__builtin_expect(static_cast<int64_t>(d) <= prev, 0)) bad_order(d);
            prev = d;
            const float ip = imp[p];
            if (wd * static_cast<double>(ip) < imp_cut) continue;
            if (d >= n_docs) m_ctx.check_doc(d);
            const float v = w * ip;
            const uint32_t off = d - ws;
            touched_p[n_touched++] = off;
            live[off] = ep;
            mask[off] = bit;
            acc[off] = v;
            cb[off] = v;
        }
        c.pos = p;
        win.n_touched = n_touched;
    }

    /// A later essential list, with impacts: first sight of an offset resets it.
    void scan_list_impacts(posting_cursor& c, size_t j, window& win, double imp_cut) {
        const uint32_t* docs = m_ctx.data.csr.doc_ids;
        const float* imp = m_ctx.imp;
        const size_t n_docs = m_ctx.data.n_docs;
        double* acc = m_win_acc.data();
        uint64_t* mask = m_win_mask.data();
        uint16_t* live = m_win_live.data();
        uint32_t* touched_p = m_win_touched.data();
        const uint32_t ws = win.ws;
        const uint64_t we = win.we;
        const uint16_t ep = win.ep;
        size_t n_touched = win.n_touched;
        const uint64_t bit = uint64_t{1} << j;
        float* cb = m_win_contrib.data() + j * kWindow;
        const float w = c.weight;
        uint64_t p = c.pos;
        const uint64_t end = c.end;
        const double wd = w;
        for (; p < end; ++p) {
            const uint32_t d = docs[p];
            if (d >= we) break;
            const float ip = imp[p];
            if (wd * static_cast<double>(ip) < imp_cut) continue;
            if (d >= n_docs) m_ctx.check_doc(d);
            const float v = w * ip;
            const uint32_t off = d - ws;
            if (__builtin_expect(off >= kWindow, 0)) bad_order(d);
            const bool fresh = live[off] != ep;
            touched_p[n_touched] = off;  // branch-free first-sight append
            n_touched += fresh;
            live[off] = ep;
            mask[off] = (fresh ? uint64_t{0} : mask[off]) | bit;
            acc[off] = (fresh ? 0.0 : acc[off]) + v;
            cb[off] = v;
        }
        c.pos = p;
        win.n_touched = n_touched;
    }

    /// An essential list without impacts: contributions computed from tf and doc_norm
    /// (prefetched ahead); with `pass`, postings whose tf bound cannot reach thr skipped.
    void scan_list_computed(posting_cursor& c, size_t j, window& win, const uint8_t* pass) {
        const uint32_t* docs = m_ctx.data.csr.doc_ids;
        const uint32_t* tfs = m_ctx.data.tfs;
        const float* norm = m_ctx.data.doc_norm;
        const size_t n_docs = m_ctx.data.n_docs;
        double* acc = m_win_acc.data();
        uint64_t* mask = m_win_mask.data();
        uint16_t* live = m_win_live.data();
        uint32_t* touched_p = m_win_touched.data();
        const uint32_t ws = win.ws;
        const uint64_t we = win.we;
        const uint16_t ep = win.ep;
        size_t n_touched = win.n_touched;
        const uint64_t bit = uint64_t{1} << j;
        float* cb = m_win_contrib.data() + j * kWindow;
        const float w = c.weight;
        uint64_t p = c.pos;
        const uint64_t end = c.end;
        for (; p < end; ++p) {
            const uint32_t d = docs[p];
            if (d >= we) break;
            if (p + kPrefetch < end) {
                const uint32_t tf_ahead = tfs[p + kPrefetch];
                if (pass == nullptr || tf_ahead >= kTfTable || pass[tf_ahead]) {
                    __builtin_prefetch(norm + docs[p + kPrefetch]);
                }
            }
            const uint32_t tf = tfs[p];
            if (pass != nullptr && tf < kTfTable && !pass[tf]) continue;
            if (d >= n_docs) m_ctx.check_doc(d);
            const float v = bm25_contribution(w, tf, norm[d]);
            const uint32_t off = d - ws;
            if (__builtin_expect(off >= kWindow, 0)) bad_order(d);
            const bool fresh = live[off] != ep;
            touched_p[n_touched] = off;  // branch-free first-sight append
            n_touched += fresh;
            live[off] = ep;
            mask[off] = (fresh ? uint64_t{0} : mask[off]) | bit;
            acc[off] = (fresh ? 0.0 : acc[off]) + v;
            cb[off] = v;
        }
        c.pos = p;
        win.n_touched = n_touched;
    }

    /// Candidates: touched docs that can still reach thr with every non-essential list
    /// added (thr only rises, so this filter never drops a doc the later checks would
    /// keep), with their running sums in m_cand_acc beside them (dense, so the per-list
    /// filters read no window array). Put in doc order only when a non-essential list
    /// will be probed by seeking or merging (its cursor only moves forward); bitmap
    /// probes take any order, and the heap's result does not depend on the order of
    /// pushes. Few survivors are sorted; many are collected from a window bitmap.
    void collect_candidates(const window& w, float thr, const bound_check& bc) {
        const size_t fe = w.fe;
        const size_t n_ess = m_sorted.size() - fe;
        const uint32_t* touched_p = m_win_touched.data();
        const size_t n_touched = w.n_touched;
        const double* acc = m_win_acc.data();
        std::vector<uint32_t>& cand = m_win_cand;
        std::vector<double>& cav = m_cand_acc;
        bool ordered_probes = false;
        for (size_t j = 0; j < fe; ++j) ordered_probes |= m_sorted[j]->bits == nullptr;
        {
            const double need0 = bc.cut(fe > 0 ? m_prefix[fe - 1] : 0.0, thr);
            cand.resize(n_touched);
            cav.resize(n_touched);
            uint32_t* cp = cand.data();
            double* ca = cav.data();
            size_t nc = 0;
            for (size_t i = 0; i < n_touched; ++i) {  // branch-free filter
                const uint32_t off = touched_p[i];
                const double a = acc[off];
                cp[nc] = off;
                ca[nc] = a;
                nc += a >= need0;
            }
            cand.resize(nc);
            cav.resize(nc);
            if (ordered_probes && n_ess > 1 && nc > 1) {
                if (nc <= kSortSmall) {
                    std::sort(cand.begin(), cand.end());
                } else {
                    // in doc order via a window bitmap: O(nc + kWindow / 64)
                    uint64_t* bits = m_cand_bits;
                    for (size_t i = 0; i < nc; ++i) bits[cp[i] >> 6] |= uint64_t{1} << (cp[i] & 63);
                    size_t o = 0;
                    for (uint32_t wi = 0; wi < kWindow / 64; ++wi) {
                        uint64_t word = bits[wi];
                        bits[wi] = 0;
                        while (word != 0) {
                            cp[o++] = wi * 64 + static_cast<uint32_t>(__builtin_ctzll(word));
                            word &= word - 1;
                        }
                    }
                }
                for (size_t i = 0; i < nc; ++i) ca[i] = acc[cp[i]];
            }
        }
        if (m_ctx.allow != nullptr) {
            size_t keep = 0;
            for (size_t i = 0; i < cand.size(); ++i) {
                const uint32_t off = cand[i];
                cand[keep] = off;
                cav[keep] = cav[i];
                keep += m_ctx.allow[w.ws + off] != 0;
            }
            cand.resize(keep);
            cav.resize(keep);
        }
    }

    /// Step 2: the non-essential lists, highest bound first; before each, candidates
    /// whose running sum plus the bounds of the lists not yet visited cannot reach thr
    /// are dropped, the survivors completed from the list (probe_list).
    void add_non_essential_lists(const window& w, float thr, const bound_check& bc) {
        std::vector<uint32_t>& cand = m_win_cand;
        std::vector<double>& cav = m_cand_acc;
        for (size_t j = w.fe; j-- > 0 && !cand.empty();) {
            const double need = bc.cut(m_prefix[j], thr);  // lists 0..j still to add
            size_t keep = 0;
            {
                uint32_t* cp = cand.data();
                double* ca = cav.data();
                const size_t nc = cand.size();
                for (size_t i = 0; i < nc; ++i) {  // branch-free compaction
                    const double a = ca[i];
                    cp[keep] = cp[i];
                    ca[keep] = a;
                    keep += a >= need;
                }
            }
            cand.resize(keep);
            cav.resize(keep);
            if (cand.empty()) break;
            probe_list(*m_sorted[j], j, w);
        }
    }

    /// Adds list j's contributions to the candidates it holds: O(1) bitmap probes when
    /// the list has a membership bitmap, else a merge scan of its postings over the
    /// candidates' span when they are dense in it, else galloping seeks.
    void probe_list(posting_cursor& c, size_t j, const window& win) {
        std::vector<uint32_t>& cand = m_win_cand;
        const uint32_t* docs = m_ctx.data.csr.doc_ids;
        const size_t n_docs = m_ctx.data.n_docs;
        const float* imp = m_ctx.imp;
        double* acc = m_win_acc.data();
        uint64_t* mask = m_win_mask.data();
        uint16_t* live = m_win_live.data();
        const uint32_t ws = win.ws;
        const uint16_t ep = win.ep;
        const uint64_t bit = uint64_t{1} << j;
        float* cb = m_win_contrib.data() + j * kWindow;
        const float w = c.weight;
        double* ca = m_cand_acc.data();
        const size_t nc = cand.size();
        if (c.bits != nullptr) {
            // O(1) probes of the list's bitmap: no cursor state, so the
            // candidates' impact loads do not wait on one another
            m_probe_pos.resize(nc);
            uint64_t* pp = m_probe_pos.data();
            const float* ahead = imp != nullptr ? imp : reinterpret_cast<const float*>(m_ctx.data.tfs);
            const size_t ok = bitmap_positions(c.bits, c.rank, c.beg, c.end, cand.data(), nc, ws, ahead, pp);
            if (ok < nc) bad_bitmap(ws + cand[ok]);
            for (size_t i = 0; i < nc; ++i) {
                if (pp[i] == kNoPos) continue;
                const uint32_t off = cand[i];
                const float v = m_ctx.contribution_at(w, pp[i], ws + off);
                mask[off] |= bit;
                ca[i] += v;
                cb[off] = v;
            }
            return;
        }
        const uint32_t first = ws + cand.front();
        const uint32_t last = ws + cand.back();
        c.seek(first);
        const double list_density = static_cast<double>(c.end - c.beg) / static_cast<double>(n_docs);
        const double in_span = list_density * static_cast<double>(last - first + 1);
        if (in_span <= 8.0 * static_cast<double>(nc)) {
            // merge scan of the list's postings over the candidates' span;
            // candidates dropped above are skipped via live[]; sums
            // go through acc[] and back
            const uint16_t mark = static_cast<uint16_t>(ep | kEpochMark);
            for (size_t i = 0; i < nc; ++i) {
                live[cand[i]] = mark;
                acc[cand[i]] = ca[i];
            }
            uint64_t p = c.pos;
            const uint64_t end = c.end;
            for (; p < end; ++p) {
                const uint32_t d = docs[p];
                if (d > last) break;
                const uint32_t off = d - ws;
                if (__builtin_expect(off >= kWindow, 0)) bad_order(d);
                if (live[off] != mark) continue;
                const float v = m_ctx.contribution_at(w, p, d);
                mask[off] |= bit;
                acc[off] += v;
                cb[off] = v;
            }
            for (size_t i = 0; i < nc; ++i) {
                live[cand[i]] = ep;
                ca[i] = acc[cand[i]];
            }
            c.pos = p;
            c.refresh();
        } else {
            for (size_t i = 0; i < nc; ++i) {
                const uint32_t off = cand[i];
                const uint32_t d = ws + off;
                c.seek(d);
                if (c.doc == d) {
                    const float v = m_ctx.contribution_at(w, c.pos, d);
                    mask[off] |= bit;
                    ca[i] += v;
                    cb[off] = v;
                }
            }
        }
    }

    /// Step 3: the survivors' canonical query-order float32 scores go to the heap;
    /// returns the possibly raised threshold.
    float push_survivors(const window& w, float thr, const bound_check& bc) {
        const std::vector<uint32_t>& cand = m_win_cand;
        const std::vector<double>& cav = m_cand_acc;
        const uint64_t* mask = m_win_mask.data();
        const float* contrib = m_win_contrib.data();
        const size_t n = m_sorted.size();
        for (size_t i = 0; i < cand.size(); ++i) {
            if (cav[i] < bc.cut(0.0, thr)) continue;
            const uint32_t off = cand[i];
            const uint64_t mk = mask[off];
            float score = 0.0f;
            for (size_t q = 0; q < n; ++q) {
                const uint32_t slot = m_slot_of_qpos[q];
                if (mk & (uint64_t{1} << slot)) score += contrib[slot * kWindow + off];
            }
            if (m_ctx.heap.push(score, w.ws + off)) thr = m_ctx.threshold();
        }
        return thr;
    }


    /// MaxScore (Turtle & Flood 1995), document-at-a-time: lists sorted by
    /// upper bound; the prefix whose bounds sum below the k-th score is
    /// non-essential. Candidates come only from the essential lists, merged
    /// DAAT; non-essential lists are probed with galloping seeks, highest bound
    /// first, while the document can still reach the threshold. Used by
    /// maxscore() for queries with more than kMaxWindowLists essential lists.
    void maxscore_daat(uint64_t b, uint64_t e) {
        open_cursors(b, e, false);
        sort_by_bound();
        maxscore_daat_run(prime_threshold());
    }

    /// maxscore_daat() on cursors already opened and sorted by bound, from
    /// the (primed) threshold thr.
    void maxscore_daat_run(float thr) {
        const size_t n = m_cursors.size();
        const bound_check bc(n);
        const float* norm = m_ctx.data.doc_norm;
        size_t fe = 0;  // first essential list in m_sorted
        while (fe < n && !bc.may_enter(m_prefix[fe], thr)) ++fe;
        m_pass_fe = n;  // invalidates the tf pass table
        uint32_t cur = min_doc_from(fe);
        while (fe < n && cur != kEndDoc) {
            if (fe == n - 1) {
                cur = scan_single_essential(fe, thr, bc);
                if (cur == kEndDoc) break;
            }
            m_ctx.check_doc(cur);
            // List-level bound of cur: the essential lists holding it plus all
            // non-essential lists. Checked before doc_norm[cur] is read.
            double cand_bound = fe > 0 ? m_prefix[fe - 1] : 0.0;
            for (size_t j = fe; j < n; ++j) {
                if (m_sorted[j]->doc == cur) cand_bound += tf_bound(*m_sorted[j]);
            }
            if (!m_ctx.allowed(cur) || !bc.may_enter(cand_bound, thr)) {
                for (size_t j = fe; j < n; ++j) {
                    if (m_sorted[j]->doc == cur) m_sorted[j]->next();
                }
                cur = min_doc_from(fe);
                continue;
            }
            double partial = 0.0;
            for (size_t j = fe; j < n; ++j) {
                posting_cursor& c = *m_sorted[j];
                if (c.doc == cur) {
                    const float v = contribution(c, cur);
                    m_contrib[c.qpos] = v;
                    partial += v;
                    c.next();
                    if (m_ctx.imp == nullptr) prefetch_norm(c, norm);
                }
            }
            const bool keep = complete_non_essential(cur, fe, partial, thr, bc);
            thr = finish_candidate(cur, keep, fe, thr, bc);
            cur = min_doc_from(fe);
        }
    }

  private:
    // window scratch of maxscore(); acc/mask/contrib are valid only where live == epoch
    std::vector<double> m_win_acc;
    std::vector<uint64_t> m_win_mask;
    // live[off] == m_win_epoch: offset off was touched in the current window
    // (acc/mask/contrib valid); any other value: stale. ep | kEpochMark marks
    // candidates during a merge scan. Epochs run 1 .. kEpochMark - 1.
    std::vector<uint16_t> m_win_live;
    uint16_t m_win_epoch = 0;
    std::vector<float> m_win_contrib;  // slot (position in m_sorted) * kWindow + offset
    std::vector<uint32_t> m_win_touched;
    std::vector<uint32_t> m_win_cand;
    std::vector<uint64_t> m_probe_pos;  // bitmap probe positions of one window's candidates
    std::vector<double> m_cand_acc;     // running sums beside m_win_cand (maxscore)
    uint64_t m_cand_bits[kWindow / 64] = {};  // all zero between uses
    std::vector<uint32_t> m_slot_of_qpos;
};

}  // namespace
}  // namespace retriever
