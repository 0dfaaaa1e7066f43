// Filter-driven BM25 top-k: when an allow filter passes few documents, only the passing
// documents are scored. Each query term's list is either walked with the filter tested per
// posting (a short list) or probed once per passing document (a long one: an O(1) test of
// its membership bitmap when it has one, else a galloping / interpolated seek of its
// cursor), whichever the cost model (filter_plan_costs) finds cheaper, the way Lucene
// leads a conjunction with a filter's iterator when the filter is the sparser clause.
// Term-at-a-time in query order into a dense accumulator, as exhaustive scoring adds, so the
// scores are the canonical float32 sums and the top-k is exactly the exhaustive one
// restricted to the passing documents.
// Internal to the BM25 top-k translation unit (bm25_topk.cpp includes it once); hence
// the anonymous namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "accumulator.hpp"
#include "bm25_query.hpp"
#include "bm25_simd.hpp"
#include "posting_cursor.hpp"

namespace retriever {
namespace {

/// Cost-model units (one posting read and filter test = 1): a membership-bitmap probe of one
/// passing document, and the per-step cost of a galloping seek (a dependent load).
constexpr double kProbeBitmapCost = 1.0;
constexpr double kProbeSeekStep = 1.0;
/// The filter-driven plan is taken when its modelled cost times
/// kFilterPlanBase + kFilterPlanSlope * (passing fraction) is below the query's posting total
/// (what the posting-driven algorithms read at most; the more documents pass, the sooner their
/// threshold rises and the less of that total they read). Fitted on the 1M-document synthetic
/// filtered benchmark (benchmarks/bench_filter_legs.py, 200 queries, k = 10, one thread):
/// within noise of the faster plan per query at 0.1 %, 1 %, 10 % and 50 % (docs/FILTERS.md).
constexpr double kFilterPlanBase = 2.0;
constexpr double kFilterPlanSlope = 100.0;

/// Modelled cost of term list [beg, end) in the filter-driven plan: min(walk the list, probe
/// it once per passing document). `probe` tells which wins.
inline double filter_term_cost(uint64_t len, size_t n_pass, bool has_bits, bool& probe) {
    const double l = static_cast<double>(len);
    const double p = static_cast<double>(n_pass);
    const double per = has_bits ? kProbeBitmapCost : kProbeSeekStep * (1.0 + std::log2(1.0 + l / std::max(p, 1.0)));
    const double pc = p * per;
    probe = pc < l;
    return probe ? pc : l;
}

class filtered_query {
  public:
    explicit filtered_query(bm25_query& ctx) : m_ctx(ctx) {}

    /// Modelled cost of the filter-driven plan of query terms [b, e) and their posting total.
    std::pair<double, uint64_t> costs(uint64_t b, uint64_t e) {
        const size_t n_pass = m_ctx.pass_count();
        double cost = 0.0;
        uint64_t total = 0;
        for (uint64_t i = b; i < e; ++i) {
            const uint32_t t = m_ctx.q.q_terms[i];
            const uint64_t len = m_ctx.data.csr.offsets[t + 1] - m_ctx.data.csr.offsets[t];
            total += len;
            bool probe = false;
            cost += filter_term_cost(len, n_pass, bits_of(t) != nullptr, probe);
        }
        return {cost, total};
    }

    /// Scores the passing documents of query terms [b, e) (any weights) and offers those that
    /// match a term to the heap: the exhaustive top-k restricted to the allow filter, bit for
    /// bit. Documents below m_ctx.theta_ext (the caller's floor) are not offered.
    void run(uint64_t b, uint64_t e) {
        const size_t n_docs = m_ctx.data.n_docs;
        dense_accumulator& A = m_acc.get();
        A.ensure(n_docs);
        float* acc = A.acc.data();
        uint8_t* seen = A.seen.data();
        const size_t n_pass = m_ctx.pass_count();
        const uint32_t* pass = n_pass ? m_ctx.pass_ids() : nullptr;
        A.touched.resize(n_pass + 1);
        uint32_t* touched = A.touched.data();
        size_t n_touched = 0;
        const uint8_t* allow = m_ctx.allow;
        const uint64_t* offsets = m_ctx.data.csr.offsets;
        const uint32_t* docs = m_ctx.data.csr.doc_ids;
        for (uint64_t i = b; i < e && n_pass; ++i) {
            const uint32_t t = m_ctx.q.q_terms[i];
            const float w = m_ctx.q.q_weights[i];
            const uint64_t pb = offsets[t], pe = offsets[t + 1];
            if (pe == pb) continue;
            const uint64_t* bits = bits_of(t);
            bool probe = false;
            filter_term_cost(pe - pb, n_pass, bits != nullptr, probe);
            if (!probe) {
                for (uint64_t p = pb; p < pe; ++p) {
                    const uint32_t d = docs[p];
                    if (d >= n_docs) m_ctx.check_doc(d);
                    if (allow[d] == 0) continue;
                    touched[n_touched] = d;
                    n_touched += seen[d] ^ 1;
                    seen[d] = 1;
                    acc[d] += m_ctx.contribution_at(w, p, d);
                }
            } else if (bits != nullptr) {
                const uint32_t* rank = rank_of(t);
                // passing documents in [first doc, last doc] of the list
                const uint32_t lo_doc = docs[pb], hi_doc = docs[pe - 1];
                if (hi_doc >= n_docs) m_ctx.check_doc(hi_doc);
                const uint32_t* s = std::lower_bound(pass, pass + n_pass, lo_doc);
                const uint32_t* f = std::upper_bound(s, pass + n_pass, hi_doc);
                const size_t n = static_cast<size_t>(f - s);
                m_pos.resize(n);
                const float* ahead = m_ctx.imp != nullptr ? m_ctx.imp : reinterpret_cast<const float*>(m_ctx.data.tfs);
                const size_t ok = bitmap_positions(bits, rank, pb, pe, s, n, 0, ahead, m_pos.data());
                if (ok < n) bad_bitmap(s[ok]);
                for (size_t j = 0; j < n; ++j) {
                    const uint64_t p = m_pos[j];
                    if (p == kNoPos) continue;
                    const uint32_t d = s[j];
                    touched[n_touched] = d;
                    n_touched += seen[d] ^ 1;
                    seen[d] = 1;
                    acc[d] += m_ctx.contribution_at(w, p, d);
                }
            } else {
                posting_cursor c;
                c.docs = docs;
                c.beg = pb;
                c.end = pe;
                c.pos = pb;
                c.refresh();
                if (docs[pe - 1] >= n_docs) m_ctx.check_doc(docs[pe - 1]);  // a sorted list's largest
                const uint32_t* s = std::lower_bound(pass, pass + n_pass, c.doc);
                const uint32_t* f = pass + n_pass;
                for (; s < f; ++s) {
                    const uint32_t d = *s;
                    c.seek(d);
                    if (c.doc == kEndDoc) break;
                    if (c.doc != d) continue;
                    touched[n_touched] = d;
                    n_touched += seen[d] ^ 1;
                    seen[d] = 1;
                    acc[d] += m_ctx.contribution_at(w, c.pos, d);
                }
            }
        }
        A.touched.resize(n_touched);
        // Selection and clearing in one pass over the touched (passing) documents, as
        // exhaustive scoring selects: only scores >= the k-th (equal ones by doc id) enter.
        float thr = std::max(m_ctx.heap.threshold(), m_ctx.theta_ext);
        for (size_t j = 0; j < n_touched; ++j) {
            const uint32_t d = touched[j];
            const float sc = acc[d];
            acc[d] = 0.0f;
            seen[d] = 0;
            if (sc < thr) continue;
            if (m_ctx.heap.push(sc, d)) thr = std::max(m_ctx.heap.threshold(), m_ctx.theta_ext);
        }
        A.touched.clear();
    }

    /// Safe initial threshold of a filtered query, the filtered analogue of
    /// bm25_query::single_term_threshold: max over the query's terms of the k-th largest
    /// contribution fl(w * tf part) among the term's PASSING postings (-inf when fewer than k
    /// pass). The k passing postings of a term belong to k distinct passing documents whose
    /// canonical scores are each >= that contribution (the same proof as the unfiltered bound:
    /// weights >= 0, contributions non-negative and not NaN), so the final k-th score is >= the
    /// bound and pruning strictly below it is exact. Computed per query by one pass over each
    /// term's blocks that skips a block whose bound fl(w * block_ub) cannot beat the k-th value
    /// found so far; terms are taken in decreasing order of w * term_kth[t] (the unfiltered
    /// k-th value, an upper bound of the filtered one) and the pass stops when no later term can
    /// raise the bound. Needs bounds->term_kth (its presence also vouches that the
    /// contributions hold no NaN: the caller checks the impacts before computing it) and the
    /// block bounds; -inf without them.
    float passing_single_term_threshold(uint64_t b, uint64_t e) {
        float theta = -std::numeric_limits<float>::infinity();
        const bm25_bounds_view* bv = m_ctx.bounds;
        if (bv == nullptr || bv->term_kth == nullptr || bv->block_ub == nullptr || bv->block_offsets == nullptr) {
            return theta;
        }
        const size_t k = m_ctx.out.k;
        m_order.clear();
        for (uint64_t i = b; i < e; ++i) {
            const float w = m_ctx.q.q_weights[i];
            const float v = bv->term_kth[m_ctx.q.q_terms[i]];
            if (!(w >= 0.0f) || !(v >= 0.0f)) continue;  // shorter than k unfiltered, or a NaN
            m_order.push_back({w * v, i});
        }
        std::sort(m_order.begin(), m_order.end(), [](const auto& x, const auto& y) {
            return x.first > y.first || (x.first == y.first && x.second < y.second);
        });
        const uint64_t* offsets = m_ctx.data.csr.offsets;
        const uint32_t* docs = m_ctx.data.csr.doc_ids;
        const size_t n_docs = m_ctx.data.n_docs;
        const uint8_t* allow = m_ctx.allow;
        const uint64_t bs = bv->block_size;
        for (const auto& [ub, i] : m_order) {
            if (ub <= theta) break;  // sorted: no later term can raise theta
            const uint32_t t = m_ctx.q.q_terms[i];
            const float w = m_ctx.q.q_weights[i];
            const uint64_t pb = offsets[t], pe = offsets[t + 1];
            const float* bub = bv->block_ub + bv->block_offsets[t];
            const uint64_t nb = bv->block_offsets[t + 1] - bv->block_offsets[t];
            // min-heap of the k largest passing contributions so far; its top is the k-th
            m_kth.clear();
            for (uint64_t j = 0; j < nb; ++j) {
                if (m_kth.size() == k && !(w * bub[j] > m_kth.front())) continue;
                const uint64_t lo = pb + j * bs, hi = std::min(pe, lo + bs);
                for (uint64_t p = lo; p < hi; ++p) {
                    const uint32_t d = docs[p];
                    if (d >= n_docs) m_ctx.check_doc(d);
                    if (allow[d] == 0) continue;
                    const float v = m_ctx.contribution_at(w, p, d);
                    if (m_kth.size() < k) {
                        m_kth.push_back(v);
                        std::push_heap(m_kth.begin(), m_kth.end(), std::greater<float>());
                    } else if (v > m_kth.front()) {
                        std::pop_heap(m_kth.begin(), m_kth.end(), std::greater<float>());
                        m_kth.back() = v;
                        std::push_heap(m_kth.begin(), m_kth.end(), std::greater<float>());
                    }
                }
            }
            if (m_kth.size() == k && m_kth.front() > theta) theta = m_kth.front();
        }
        return theta;
    }

  private:
    const uint64_t* bits_of(uint32_t t) const {
        const bm25_bounds_view* bv = m_ctx.bounds;
        if (bv == nullptr || bv->dense_slot == nullptr || bv->dense_slot[t] < 0) return nullptr;
        return bv->dense_bits + static_cast<size_t>(bv->dense_slot[t]) * bv->dense_words;
    }
    const uint32_t* rank_of(uint32_t t) const {
        const bm25_bounds_view* bv = m_ctx.bounds;
        return bv->dense_rank + static_cast<size_t>(bv->dense_slot[t]) * bv->dense_words;
    }

    bm25_query& m_ctx;
    accumulator_lease m_acc;
    std::vector<uint64_t> m_pos;  // bitmap probe positions
    std::vector<std::pair<float, uint64_t>> m_order;  // passing_single_term_threshold scratch
    std::vector<float> m_kth;
};

}  // namespace
}  // namespace retriever
