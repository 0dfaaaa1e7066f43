// Block-max algorithms for BM25 (block maxima after Ding & Suel 2011 / Chakrabarti et
// al. 2011): block-max MaxScore (DAAT MaxScore whose essential lists skip whole blocks
// and pre-check candidates with per-block bounds) and Block-Max WAND (Ding & Suel 2011).
// Internal to the BM25 top-k translation unit (bm25_topk.cpp includes it once); hence
// the anonymous namespace.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bm25_daat.hpp"

namespace retriever {
namespace {

class block_max_query : public daat_query {
  public:
    explicit block_max_query(bm25_query& ctx) : daat_query(ctx) {}

    /// Block-max MaxScore: MaxScore whose essential lists also carry the bound
    /// of their current block. (1) If the essential lists' current-block
    /// bounds plus the non-essential list bounds cannot reach the threshold,
    /// every doc before the nearest block end is skipped at once. (2) Before
    /// reading doc_norm, a candidate is checked with the block bounds of the
    /// essential lists holding it.
    void block_max_maxscore(uint64_t b, uint64_t e) {
        open_cursors(b, e, true);
        sort_by_bound();
        const size_t n = m_cursors.size();
        for (auto& c : m_cursors) c.update_block();
        const bound_check bc(n);
        const float* norm = m_doc_norm;
        float thr = prime_threshold();
        size_t fe = 0;
        while (fe < n && !bc.may_enter(m_prefix[fe], thr)) ++fe;
        uint32_t cur = min_doc_from(fe);
        while (fe < n && cur != kEndDoc) {
            const double non_essential = fe > 0 ? m_prefix[fe - 1] : 0.0;
            // (1) range skip over the essential lists' current blocks
            double range_bound = non_essential;
            uint32_t range_end = kEndDoc;
            for (size_t j = fe; j < n; ++j) {
                const posting_cursor& c = *m_sorted[j];
                if (c.doc == kEndDoc) continue;
                range_bound += c.blk_bound;
                range_end = std::min(range_end, c.blk_last + 1);  // blk_last < kEndDoc
            }
            if (!bc.may_enter(range_bound, thr)) {
                for (size_t j = fe; j < n; ++j) m_sorted[j]->seek_b(range_end);
                cur = min_doc_from(fe);
                continue;
            }
            // (2) candidate bound from the blocks holding cur
            check_doc(cur);
            double cand_bound = non_essential;
            for (size_t j = fe; j < n; ++j) {
                const posting_cursor& c = *m_sorted[j];
                if (c.doc == cur) cand_bound += std::min(c.blk_bound, tf_bound(c));
            }
            if (!allowed(cur) || !bc.may_enter(cand_bound, thr)) {
                for (size_t j = fe; j < n; ++j) {
                    if (m_sorted[j]->doc == cur) m_sorted[j]->next_b();
                }
                cur = min_doc_from(fe);
                continue;
            }
            // (3) exact essential contributions, then the non-essential lists
            double partial = 0.0;
            for (size_t j = fe; j < n; ++j) {
                posting_cursor& c = *m_sorted[j];
                if (c.doc == cur) {
                    const float v = contribution(c, cur);
                    m_contrib[c.qpos] = v;
                    partial += v;
                    c.next_b();
                    if (m_imp == nullptr) prefetch_norm(c, norm);
                }
            }
            const bool keep = complete_non_essential(cur, fe, partial, thr, bc);
            thr = finish_candidate(cur, keep, fe, thr, bc);
            cur = min_doc_from(fe);
        }
    }

    /// Block-Max WAND (Ding & Suel 2011): lists kept in doc order; the pivot is the first
    /// list where the list bounds up to it may reach the threshold, then the block bounds
    /// of the lists up to the pivot decide between scoring the pivot and skipping past
    /// the nearest block end.
    void block_max_wand(uint64_t b, uint64_t e) {
        open_cursors(b, e, true);
        const size_t n = m_cursors.size();
        const bound_check bc(n);
        float thr = prime_threshold();
        for (;;) {
            sort_by_doc();
            // Pivot: first position where the list bounds of all lists up to it may reach thr.
            double acc = 0.0;
            size_t p = n;
            for (size_t i = 0; i < n; ++i) {
                if (m_sorted[i]->doc == kEndDoc) break;
                acc += m_sorted[i]->ub;
                if (bc.may_enter(acc, thr)) {
                    p = i;
                    break;
                }
            }
            if (p == n) break;
            const uint32_t pivot = m_sorted[p]->doc;
            while (p + 1 < n && m_sorted[p + 1]->doc == pivot) ++p;
            double bb = 0.0;
            for (size_t i = 0; i <= p; ++i) bb += m_sorted[i]->block_bound(pivot);
            if (bc.may_enter(bb, thr)) {
                if (m_sorted[0]->doc == pivot) {
                    // Lists 0..p hold exactly the terms of pivot.
                    check_doc(pivot);
                    if (allowed(pivot)) {
                        for (size_t i = 0; i <= p; ++i) {
                            const posting_cursor& c = *m_sorted[i];
                            m_contrib[c.qpos] = contribution(c, pivot);
                        }
                        const float s = take_score();
                        if (m_ctx.heap.push(s, pivot)) thr = m_ctx.threshold();
                    }
                    for (size_t i = 0; i <= p; ++i) m_sorted[i]->next();
                } else {
                    // Docs before pivot are covered only by lists before the
                    // pivot position, whose bounds cannot reach thr.
                    for (size_t i = 0; i < p && m_sorted[i]->doc < pivot; ++i) m_sorted[i]->seek(pivot);
                }
            } else {
                // No doc in [pivot, next) can reach thr: it would lie in the
                // current blocks of lists 0..p only.
                uint32_t next = p + 1 < n ? m_sorted[p + 1]->doc : kEndDoc;
                for (size_t i = 0; i <= p; ++i) next = std::min(next, m_sorted[i]->block_boundary());
                // Advance the list with the largest bound (ties: first).
                size_t best = 0;
                for (size_t i = 1; i <= p; ++i) {
                    if (m_sorted[i]->ub > m_sorted[best]->ub) best = i;
                }
                m_sorted[best]->seek(next);
            }
        }
        std::fill(m_contrib.begin(), m_contrib.end(), 0.0f);
    }

  private:
    void sort_by_doc() {
        // Insertion sort: few cursors move per step, so the order is nearly sorted.
        for (size_t i = 1; i < m_sorted.size(); ++i) {
            posting_cursor* x = m_sorted[i];
            size_t j = i;
            while (j > 0 && (m_sorted[j - 1]->doc > x->doc ||
                             (m_sorted[j - 1]->doc == x->doc && m_sorted[j - 1]->qpos > x->qpos))) {
                m_sorted[j] = m_sorted[j - 1];
                --j;
            }
            m_sorted[j] = x;
        }
    }

};

}  // namespace
}  // namespace retriever
