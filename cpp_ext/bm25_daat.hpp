// What the document-at-a-time BM25 algorithms (MaxScore, block-max MaxScore, block-max
// WAND) share: one posting cursor per query term with its upper bound, tf-bound tables,
// threshold priming from the short high-bound lists, the MaxScore partition by bound and
// the completion of a candidate over the non-essential lists.
// Internal to the BM25 top-k translation unit (bm25_topk.cpp includes it once); hence
// the anonymous namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "bm25_query.hpp"
#include "bound_check.hpp"
#include "posting_cursor.hpp"

namespace retriever {
namespace {

inline void prefetch_norm(const posting_cursor& c, const float* doc_norm) {
    if (c.pos + kPrefetch < c.end) __builtin_prefetch(doc_norm + c.docs[c.pos + kPrefetch]);
}

class daat_query {
  public:
    /// Re-reads the context's per-shard constants after bm25_query::rebind (one worker
    /// serving every shard of bm25_topk_shards in turn); drops the tf pass table.
    void rebind() {
        m_imp = m_ctx.imp, m_tfs = m_ctx.data.tfs, m_doc_norm = m_ctx.data.doc_norm;
        m_n_docs = m_ctx.data.n_docs, m_allow = m_ctx.allow;
        m_pass_thr = std::numeric_limits<float>::quiet_NaN();  // never equal: recomputed on next use
    }

  protected:
    explicit daat_query(bm25_query& ctx)
        : m_ctx(ctx), m_imp(ctx.imp), m_tfs(ctx.data.tfs), m_doc_norm(ctx.data.doc_norm), m_n_docs(ctx.data.n_docs),
          m_allow(ctx.allow) {}

    // The context's per-worker constants, copied: one load instead of two in the DAAT loops.
    bool allowed(uint32_t d) const { return m_allow == nullptr || m_allow[d] != 0; }
    void check_doc(uint32_t d) const {
        if (d >= m_n_docs) m_ctx.check_doc(d);
    }
    /// bm25_query::contribution_at over the copied pointers (the same float32 value).
    float contribution_at(float w, uint64_t p, uint32_t d) const {
        if (m_imp != nullptr) return w * m_imp[p];
        return bm25_contribution(w, m_tfs[p], m_doc_norm[d]);
    }

    // ---- cursor set-up shared by the DAAT algorithms -------------------
    void open_cursors(uint64_t b, uint64_t e, bool with_blocks) {
        const size_t n = static_cast<size_t>(e - b);
        m_cursors.resize(n);
        for (size_t j = 0; j < n; ++j) {
            const uint32_t t = m_ctx.q.q_terms[b + j];
            posting_cursor& c = m_cursors[j];
            c.docs = m_ctx.data.csr.doc_ids;
            c.beg = m_ctx.data.csr.offsets[t];
            c.end = m_ctx.data.csr.offsets[t + 1];
            c.pos = c.beg;
            c.refresh();
            c.qpos = static_cast<uint32_t>(j);
            c.weight = m_ctx.q.q_weights[b + j];
            c.ub = static_cast<double>(c.weight) * static_cast<double>(m_ctx.bounds->term_ub[t]);
            c.bits = nullptr;
            c.rank = nullptr;
            if (m_ctx.bounds->dense_slot != nullptr && m_ctx.bounds->dense_slot[t] >= 0) {
                const size_t row = static_cast<size_t>(m_ctx.bounds->dense_slot[t]) * m_ctx.bounds->dense_words;
                c.bits = m_ctx.bounds->dense_bits + row;
                c.rank = m_ctx.bounds->dense_rank + row;
            }
            if (with_blocks) {
                c.bs = m_ctx.bounds->block_size;
                c.bub = m_ctx.bounds->block_ub + m_ctx.bounds->block_offsets[t];
                c.nb = m_ctx.bounds->block_offsets[t + 1] - m_ctx.bounds->block_offsets[t];
                c.bi = 0;
                c.blk_end = 0;  // forces update_block() to load the first block
            }
        }
        m_contrib.assign(n, 0.0f);
        // Per-term table of bounds by tf: weight * min(term_ub, tf / (tf + norm_min)).
        m_tf_bound.resize(n * kTfTable);
        for (size_t j = 0; j < n; ++j) {
            const posting_cursor& c = m_cursors[j];
            const double term_ub = m_ctx.bounds->term_ub[m_ctx.q.q_terms[b + j]];
            double* row = m_tf_bound.data() + j * kTfTable;
            for (uint32_t tf = 0; tf < kTfTable; ++tf) {
                double r = term_ub;
                if (m_ctx.norm_min >= 0.0f && tf > 0) {
                    r = std::min(r, static_cast<double>(tf) / (tf + static_cast<double>(m_ctx.norm_min)));
                }
                row[tf] = static_cast<double>(c.weight) * r;
            }
        }
        m_sorted.resize(n);
        for (size_t j = 0; j < n; ++j) m_sorted[j] = &m_cursors[j];
    }

    /// Bound of c's contribution at its current posting from the tf alone.
    double tf_bound(const posting_cursor& c) const {
        if (m_imp != nullptr) return static_cast<double>(c.weight) * static_cast<double>(m_imp[c.pos]);
        const uint32_t tf = m_tfs[c.pos];
        return tf < kTfTable ? m_tf_bound[c.qpos * kTfTable + tf] : c.ub;
    }

    float contribution(const posting_cursor& c, uint32_t d) const {
        return contribution_at(c.weight, c.pos, d);
    }

    /// Canonical score: query-order float32 sum of m_contrib; resets m_contrib.
    float take_score() {
        float s = 0.0f;
        for (float& v : m_contrib) {
            s += v;
            v = 0.0f;
        }
        return s;
    }

    // ---- threshold priming (all pruning algorithms) ----------------------
    /// Primes the pruning threshold from the query's short, high-bound lists
    /// (taken in decreasing bound order while their postings fit in the
    /// budget): each document they hold gets the float32 query-order sum
    /// of its contributions from those lists only. With non-negative
    /// contributions such a partial sum never exceeds the document's full
    /// canonical score (float rounding is monotone), so at least k allowed
    /// documents score >= m_ctx.theta0 = the k-th best partial sum, the final k-th
    /// score is >= m_ctx.theta0, and pruning below it is safe even before the heap
    /// is full. Nothing is pushed here. Returns the initial pruning threshold.
    /// Call after open_cursors().
    float prime_threshold() {
        m_ctx.theta0 = m_ctx.theta_ext;  // safe lower bound too (single_term_threshold)
        if (!m_ctx.prime) return m_ctx.threshold();  // the caller primed theta_ext already
        const size_t n = m_cursors.size();
        const size_t k = m_ctx.out.k;
        m_prime_order.resize(n);
        for (size_t j = 0; j < n; ++j) m_prime_order[j] = static_cast<uint32_t>(j);
        std::sort(m_prime_order.begin(), m_prime_order.end(), [&](uint32_t x, uint32_t y) {
            return m_cursors[x].ub > m_cursors[y].ub ||
                   (m_cursors[x].ub == m_cursors[y].ub && x < y);
        });
        m_prime_docs.clear();
        m_prime_use.assign(n, 0);
        uint64_t budget = std::min<uint64_t>(std::max<uint64_t>(kPrimeBudget, 4 * k), kPrimeBudgetMax);
        for (uint32_t j : m_prime_order) {
            const posting_cursor& c = m_cursors[j];
            const uint64_t len = c.end - c.beg;
            if (len > budget) break;
            budget -= len;
            m_prime_use[j] = 1;
            m_prime_docs.insert(m_prime_docs.end(), c.docs + c.beg, c.docs + c.end);
        }
        if (m_prime_docs.size() < k) return m_ctx.threshold();
        std::sort(m_prime_docs.begin(), m_prime_docs.end());
        m_prime_docs.erase(std::unique(m_prime_docs.begin(), m_prime_docs.end()), m_prime_docs.end());
        if (m_prime_docs.size() < k) return m_ctx.threshold();
        m_prime_scores.assign(m_prime_docs.size(), 0.0f);
        for (size_t j = 0; j < n; ++j) {  // query order: m_cursors[j].qpos == j
            if (!m_prime_use[j]) continue;
            const posting_cursor& c = m_cursors[j];
            size_t at = 0;
            for (uint64_t p = c.beg; p < c.end; ++p) {
                const uint32_t d = c.docs[p];
                while (m_prime_docs[at] < d) ++at;  // d is in m_prime_docs
                check_doc(d);
                const float v = contribution_at(c.weight, p, d);
                if (!(v >= 0.0f)) return m_ctx.threshold();  // negative or NaN: no priming
                m_prime_scores[at] += v;
            }
        }
        size_t keep = 0;
        for (size_t i = 0; i < m_prime_docs.size(); ++i) {
            if (allowed(m_prime_docs[i]) && !std::isnan(m_prime_scores[i])) {
                m_prime_scores[keep++] = m_prime_scores[i];
            }
        }
        if (keep < k) return m_ctx.threshold();
        m_prime_scores.resize(keep);
        std::nth_element(m_prime_scores.begin(), m_prime_scores.begin() + (k - 1),
                         m_prime_scores.end(), std::greater<float>());
        m_ctx.theta0 = std::max(m_ctx.theta0, m_prime_scores[k - 1]);
        return m_ctx.threshold();
    }

    // ---- MaxScore / Block-Max MaxScore ----------------------------------
    void sort_by_bound() {
        // Ascending upper bound; ties by query position (deterministic).
        std::sort(m_sorted.begin(), m_sorted.end(),
                  [](const posting_cursor* x, const posting_cursor* y) {
                      return x->ub < y->ub || (x->ub == y->ub && x->qpos < y->qpos);
                  });
        const size_t n = m_sorted.size();
        m_prefix.resize(n);
        double run = 0.0;
        for (size_t j = 0; j < n; ++j) {
            run += m_sorted[j]->ub;
            m_prefix[j] = run;
        }
    }

    uint32_t min_doc_from(size_t fe) const {
        uint32_t d = kEndDoc;
        for (size_t j = fe; j < m_sorted.size(); ++j) d = std::min(d, m_sorted[j]->doc);
        return d;
    }

    /// Evaluates the non-essential lists 0..fe-1 (highest bound first) for
    /// cur, given the exact essential contributions summed in `partial`;
    /// returns false as soon as the document cannot reach thr.
    bool complete_non_essential(uint32_t cur, size_t fe, double partial, float thr,
                                const bound_check& bc) {
        for (size_t j = fe; j-- > 0;) {
            if (!bc.may_enter(partial + m_prefix[j], thr)) return false;
            posting_cursor& c = *m_sorted[j];
            c.seek(cur);
            if (c.doc == cur) {
                const float v = contribution(c, cur);
                m_contrib[c.qpos] = v;
                partial += v;
            }
        }
        return true;
    }

    /// Pushes the canonical score of cur (or discards it when pruned) and
    /// returns the possibly raised threshold; moves fe past lists that became
    /// non-essential.
    float finish_candidate(uint32_t cur, bool keep, size_t& fe, float thr, const bound_check& bc) {
        if (!keep) {
            std::fill(m_contrib.begin(), m_contrib.end(), 0.0f);
            return thr;
        }
        const float s = take_score();
        if (m_ctx.heap.push(s, cur)) {
            const float nt = m_ctx.threshold();
            if (nt != thr) {
                thr = nt;
                const size_t n = m_sorted.size();
                while (fe < n && !bc.may_enter(m_prefix[fe], thr)) ++fe;
            }
        }
        return thr;
    }

    /// Fast path for a single essential list (the usual state once the
    /// threshold has risen): scans its tfs sequentially and stops at the first
    /// posting whose tf bound plus the non-essential bounds may reach thr,
    /// without reading doc ids or doc_norm of the postings skipped. Returns
    /// the new candidate doc (kEndDoc when the list is exhausted).
    uint32_t scan_single_essential(size_t fe, float thr, const bound_check& bc) {
        const size_t n = m_sorted.size();
        posting_cursor& c = *m_sorted[n - 1];
        if (m_imp != nullptr) {
            // skip while weight * impact + non-essential bounds < thr
            const double cut = bc.cut(fe > 0 ? m_prefix[fe - 1] : 0.0, thr);
            const double w = c.weight;
            const float* imp = m_imp;
            uint64_t p = c.pos;
            const uint64_t end = c.end;
            while (p < end && w * static_cast<double>(imp[p]) < cut) ++p;
            if (p != c.pos) {
                c.pos = p;
                c.refresh();
            }
            return c.doc;
        }
        if (m_pass_thr != thr || m_pass_fe != fe) {
            const double non_essential = fe > 0 ? m_prefix[fe - 1] : 0.0;
            const double* row = m_tf_bound.data() + c.qpos * kTfTable;
            for (uint32_t tf = 0; tf < kTfTable; ++tf) {
                m_pass[tf] = bc.may_enter(non_essential + row[tf], thr) ? 1 : 0;
            }
            m_pass_thr = thr;
            m_pass_fe = fe;
        }
        const uint32_t* tfs = m_tfs;
        const uint8_t* pass = m_pass;
        uint64_t p = c.pos;
        const uint64_t end = c.end;
        while (p < end) {
            const uint32_t tf = tfs[p];
            if (tf >= kTfTable || pass[tf]) break;
            ++p;
        }
        if (p != c.pos) {
            c.pos = p;
            c.refresh();
        }
        return c.doc;
    }

    bm25_query& m_ctx;
    const float* m_imp;  // precomputed impacts or null
    const uint32_t* m_tfs;
    const float* m_doc_norm;
    size_t m_n_docs;
    const uint8_t* m_allow;
    std::vector<posting_cursor> m_cursors;
    std::vector<posting_cursor*> m_sorted;
    std::vector<float> m_contrib;
    std::vector<double> m_prefix;
    std::vector<double> m_tf_bound;  // n * kTfTable
    std::vector<uint32_t> m_prime_order;
    std::vector<uint32_t> m_prime_docs;
    std::vector<uint8_t> m_prime_use;
    std::vector<float> m_prime_scores;
    uint8_t m_pass[kTfTable] = {};     // tf -> may reach thr (single essential list)
    float m_pass_thr = 0.0f;
    size_t m_pass_fe = 0;
};

}  // namespace
}  // namespace retriever
