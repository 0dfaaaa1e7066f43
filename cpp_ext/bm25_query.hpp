// Per-query context of the BM25 top-k algorithms (PISA's split: the cursor walks a
// list, posting_cursor.hpp; this scorer turns a posting into its float32
// contribution; the algorithms, one file each, only move cursors and offer documents
// to the top-k collector, topk.hpp).
//
// Determinism: every algorithm computes a candidate's score with the same float32
// expression (bm25_contribution) summed in query-term order from +0.0f, so all
// algorithms and thread counts return bit-identical results.
// Internal to the BM25 top-k translation unit (bm25_topk.cpp includes it once); hence
// the anonymous namespace.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "postings_topk.hpp"
#include "topk.hpp"

namespace retriever {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

/// Threshold priming reads at most max(kPrimeBudget, 4 k) postings per query
/// (never more than kPrimeBudgetMax).
constexpr uint64_t kPrimeBudget = 256;
constexpr uint64_t kPrimeBudgetMax = 4096;

/// Per-query tf-bound tables cover tf < kTfTable.
constexpr uint32_t kTfTable = 32;

/// Postings ahead of the current one whose doc_norm is prefetched.
constexpr uint64_t kPrefetch = 16;
/// Exhaustive scoring prefetches accumulator entries only above this many
/// documents (below, acc + seen fit in the L2 cache).
constexpr size_t kPrefetchMinDocs = size_t{1} << 16;

/// A list's doc id below the current window: the list is not sorted.
[[noreturn]] __attribute__((noinline, cold)) void bad_order(uint32_t d) {
    fail("a posting list's doc ids are not strictly increasing (doc id " + std::to_string(d) +
         " after a larger one); validate the postings with check_csr");
}

[[noreturn]] __attribute__((noinline, cold)) void bad_bitmap(uint32_t d) {
    fail("dense_bits / dense_rank place doc id " + std::to_string(d) +
         " past the end of its list (compute them with bm25_dense_bitmaps)");
}

/// What every algorithm of one worker shares while it scores a query: the postings
/// and bounds, the query batch, the filter, the output, the top-k collector and the
/// pruning threshold's lower bounds.
struct bm25_query {
    /// norm_min: a lower bound of doc_norm (>= 0) that enables per-posting
    /// tf bounds, or a negative value to disable them.
    bm25_query(const bm25_view& data_, const bm25_bounds_view* bounds_, const query_batch_view& q_,
               const uint8_t* allow_, bm25_algorithm algo_, const topk_out& out_, float norm_min_,
               bm25_scatter scatter_)
        : data(data_), bounds(bounds_), q(q_), allow(allow_), algo(algo_), out(out_), imp(data_.impacts),
          norm_min(imp != nullptr ? -1.0f : norm_min_), scatter(scatter_) {}

    bool allowed(uint32_t d) const { return allow == nullptr || allow[d] != 0; }

    /// Points the context at another shard: `data` and `q` refer to objects the caller has
    /// just reassigned (bm25_topk_shards: one worker per thread serves every shard in turn,
    /// so its scratch memory is allocated once per call, not once per shard); the values
    /// the constructor derived from them are set again here.
    void rebind(const bm25_bounds_view* bounds_, const uint8_t* allow_, bm25_algorithm algo_, float norm_min_,
                bool prime_) {
        bounds = bounds_, allow = allow_, algo = algo_, imp = data.impacts, prime = prime_;
        norm_min = imp != nullptr ? -1.0f : norm_min_;
        m_pass_count = kUnknown;  // the filter's passing set is the new shard's
        m_pass_ready = false;
    }

    /// Number of documents the allow filter passes (n_docs without one); counted once per
    /// worker, on first use.
    size_t pass_count() {
        if (m_pass_count == kUnknown) {
            if (allow == nullptr) {
                m_pass_count = data.n_docs;
            } else {
                const size_t n = data.n_docs;
                size_t c = 0, d = 0;
#if defined(__SSE2__)
                // 16 bytes at a time: nonzero bytes -> 1, summed by psadbw (a 1M-document mask
                // in tens of microseconds)
                const __m128i zero = _mm_setzero_si128();
                const __m128i one = _mm_set1_epi8(1);
                __m128i sum = zero;
                for (; d + 16 <= n; d += 16) {
                    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(allow + d));
                    const __m128i nz = _mm_andnot_si128(_mm_cmpeq_epi8(v, zero), one);
                    sum = _mm_add_epi64(sum, _mm_sad_epu8(nz, zero));
                }
                alignas(16) uint64_t lanes[2];
                _mm_store_si128(reinterpret_cast<__m128i*>(lanes), sum);
                c = static_cast<size_t>(lanes[0] + lanes[1]);
#endif
                for (; d < n; ++d) c += allow[d] != 0;
                m_pass_count = c;
            }
        }
        return m_pass_count;
    }

    /// The passing doc ids in increasing order (pass_count() of them; allow must be set),
    /// collected once per worker, on first use (16 mask bytes per vector compare).
    const uint32_t* pass_ids() {
        if (!m_pass_ready) {
            m_pass.clear();
            m_pass.reserve(pass_count());
            const size_t n = data.n_docs;
            size_t d = 0;
#if defined(__SSE2__)
            const __m128i zero = _mm_setzero_si128();
            for (; d + 16 <= n; d += 16) {
                const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(allow + d));
                unsigned m = ~static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero))) & 0xFFFFu;
                while (m != 0) {
                    m_pass.push_back(static_cast<uint32_t>(d + static_cast<size_t>(__builtin_ctz(m))));
                    m &= m - 1;
                }
            }
#endif
            for (; d < n; ++d) {
                if (allow[d] != 0) m_pass.push_back(static_cast<uint32_t>(d));
            }
            m_pass_ready = true;
        }
        return m_pass.data();
    }

    void check_doc(uint32_t d) const {
        if (d >= data.n_docs) {
            fail("doc_ids contains doc id " + std::to_string(d) + " >= n_docs = " +
                 std::to_string(data.n_docs) + " (validate the postings with check_csr)");
        }
    }

    /// weight * (tf part of posting p, whose doc is d): from the impacts when
    /// present, else computed; both are the same float32 value.
    float contribution_at(float w, uint64_t p, uint32_t d) const {
        if (imp != nullptr) return w * imp[p];
        return bm25_contribution(w, data.tfs[p], data.doc_norm[d]);
    }


    /// Pruning threshold: the heap's k-th score, or the primed lower bound
    /// while that is higher.
    float threshold() const { return std::max(heap.threshold(), theta0); }

    /// Safe initial threshold from single-term scores: max over the query's
    /// terms of fl(w * term_kth[t]), where term_kth[t] is the k-th largest
    /// tf part in t's list (-inf if the list is shorter than k).
    /// Proof of safety (weights >= 0, no allow filter; the caller checks
    /// both): the k postings of t with tf part >= term_kth[t] belong to k
    /// distinct documents. For each, its contribution fl(w * tfpart) >=
    /// fl(w * term_kth[t]) (float multiplication by w >= 0 and rounding are
    /// monotone), and its canonical score, a query-order float32 sum of
    /// non-negative contributions starting at +0.0f, is >= every single
    /// contribution (fl(a + c) >= fl(c) = c for a >= 0). So k documents score
    /// >= theta and the final k-th score is >= theta. Pruning discards only
    /// documents whose bound is STRICTLY below the threshold, so a document
    /// scoring exactly theta is still evaluated and the tie rule (smaller id
    /// first) decides among equal scores exactly as in exhaustive scoring.
    /// A NaN entry or weight is ignored (comparison false).
    float single_term_threshold(uint64_t b, uint64_t e) const {
        float theta = -std::numeric_limits<float>::infinity();
        const float* kth = bounds->term_kth;
        for (uint64_t i = b; i < e; ++i) {
            const float v = kth[q.q_terms[i]];
            const float w = q.q_weights[i];
            if (v >= 0.0f && w >= 0.0f) {
                const float s = w * v;
                if (s > theta) theta = s;
            }
        }
        return theta;
    }


    const bm25_view& data;
    const bm25_bounds_view* bounds;
    const query_batch_view& q;
    const uint8_t* allow;
    bm25_algorithm algo;
    const topk_out& out;
    const float* imp;  // precomputed impacts or null
    float norm_min;
    bm25_scatter scatter;  // resolved: never automatic
    topk_heap heap;
    float theta0 = -std::numeric_limits<float>::infinity();     // primed threshold
    float theta_ext = -std::numeric_limits<float>::infinity();  // single_term_threshold
    /// false: the pruning algorithms start from theta_ext without priming from the query's
    /// short lists (bm25_topk_shards primes once over all shards instead).
    bool prime = true;
    bm25_filter_plan filter_plan = bm25_filter_plan::automatic;

  private:
    static constexpr size_t kUnknown = ~size_t{0};
    size_t m_pass_count = kUnknown;
    bool m_pass_ready = false;
    std::vector<uint32_t> m_pass;
};

}  // namespace
}  // namespace retriever
