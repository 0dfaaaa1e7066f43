// Exhaustive BM25 top-k, term-at-a-time over a dense float accumulator: through a
// touched list on large collections, as one linear scan with block-max selection when
// the query's postings cover a good part of the collection. The reference algorithm:
// every pruning algorithm returns exactly its results.
// Internal to the BM25 top-k translation unit (bm25_topk.cpp includes it once); hence
// the anonymous namespace.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "accumulator.hpp"
#include "bm25_query.hpp"
#include "bm25_simd.hpp"

namespace retriever {
namespace {

/// exhaustive() scans a dense accumulator over all documents (instead of a
/// touched list) when n_docs <= kDenseScanRatio times the query's postings, at
/// any collection size: at 1M documents a query whose postings total >= 1M
/// (frequent terms only) runs about 2x faster that way than through the
/// touched list (benchmarks/bench_bm25.py, kernel `exhaustive`).
constexpr uint64_t kDenseScanRatio = 4;
/// "auto" scores every query exhaustively on collections up to this many
/// documents (the accumulator sits in the L2 cache; on SciFact, 5,183 docs,
/// exhaustive runs ~7x faster than MaxScore over the 300 queries).
/// Scores tested together against the threshold in the dense selection pass.
constexpr size_t kScanBlock = 16;
/// kth_largest() keeps a sorted run up to this k, else uses nth_element.
constexpr size_t kSmallK = 64;

class exhaustive_query {
  public:
    explicit exhaustive_query(bm25_query& ctx) : m_ctx(ctx) {}

    /// Scores the query whose terms are q_terms[b .. e) term-at-a-time.
    void exhaustive(uint64_t b, uint64_t e) {
        uint64_t total = 0;
        for (uint64_t i = b; i < e; ++i) {
            const uint32_t t = m_ctx.q.q_terms[i];
            total += m_ctx.data.csr.offsets[t + 1] - m_ctx.data.csr.offsets[t];
        }
        // Small collections (the query's postings cover a good part of it):
        // scatter without a touched list and select in one linear pass.
        if (m_ctx.data.n_docs <= kDenseScanRatio * total) {
            m_ctx.imp != nullptr ? exhaustive_dense<true>(b, e) : exhaustive_dense<false>(b, e);
            return;
        }
        // Prefetching pays only when the accumulator does not sit in cache.
        const bool pf = m_ctx.data.n_docs > kPrefetchMinDocs;
        if (m_ctx.imp != nullptr) {
            pf ? exhaustive_impl<true, true>(b, e) : exhaustive_impl<true, false>(b, e);
        } else {
            pf ? exhaustive_impl<false, true>(b, e) : exhaustive_impl<false, false>(b, e);
        }
    }

  private:
    /// Exhaustive scoring for collections small enough to scan: the
    /// accumulator is a dense array over all n_docs documents; postings are
    /// scattered into it with one store each (no touched list, no dependency
    /// between postings). Selection then works on blocks of kScanBlock
    /// documents:
    ///   1. block_max() gives each block's largest score (NaN ignored), and
    ///      each group of 8 blocks (128 documents) its maximum;
    ///   2. without an allow filter, theta, the k-th largest group maximum
    ///      (the k-th largest block maximum when there are fewer than 4k
    ///      groups), is a lower bound of the k-th best score when theta > 0:
    ///      k different groups each hold a document scoring >= theta, and a
    ///      score > 0 means the document matched (unmatched ones stay +0.0f);
    ///   3. only blocks whose maximum reaches max(theta, heap threshold) are
    ///      examined document by document. With theta > 0 every score
    ///      examined is > 0, so it belongs to a matching document: when at
    ///      most kCountMax documents reach theta (AVX2 CPUs), they are ranked
    ///      by counting and the best k kept (select_ranked), else offered to
    ///      the heap one by one. Otherwise (allow filter, negative or zero
    ///      scores, fewer than k positive blocks) a second pass over the
    ///      postings marks the matching documents in `seen` first.
    /// Finally the accumulator is cleared (the pool invariant). Scores are the
    /// same float32 query-order sums as exhaustive_impl's, and the kept set
    /// (best score, then smallest id) does not depend on the order candidates
    /// are offered, so results are bit-identical.
    template <bool kImp>
    void exhaustive_dense(uint64_t b, uint64_t e) {
        dense_accumulator& A = m_acc.get();
        const size_t n_docs = m_ctx.data.n_docs;
        A.ensure(n_docs);
        A.dense_dirty = n_docs;  // cleared below; if anything throws, the lease clears it
        float* acc = A.acc.data();
        const uint64_t* offsets = m_ctx.data.csr.offsets;
        const uint32_t* doc_ids = m_ctx.data.csr.doc_ids;
        const uint32_t* tfs = m_ctx.data.tfs;
        const float* norm = m_ctx.data.doc_norm;
        const float* imp = m_ctx.imp;
        for (uint64_t i = b; i < e; ++i) {
            const uint32_t t = m_ctx.q.q_terms[i];
            const float w = m_ctx.q.q_weights[i];
            const uint64_t pb = offsets[t], pe = offsets[t + 1];
            if (kImp) {
                if (m_ctx.data.impact_row_slot != nullptr) {  // w finite, r in [-1, rows): checked at the boundary
                    const int32_t r = m_ctx.data.impact_row_slot[t];
                    if (r >= 0) {  // the row holds t's impacts at its doc ids, +0.0f elsewhere
                        add_impact_row(acc, m_ctx.data.impact_rows + static_cast<size_t>(r) * n_docs, w, n_docs);
                        continue;
                    }
                }
                const size_t n = static_cast<size_t>(pe - pb);
                const size_t done = scatter_impacts(acc, doc_ids + pb, imp + pb, w, n, n_docs, m_ctx.scatter);
                if (done < n) m_ctx.check_doc(doc_ids[pb + done]);
                continue;
            }
            for (uint64_t p = pb; p < pe; ++p) {
                const uint32_t d = doc_ids[p];
                if (d >= n_docs) m_ctx.check_doc(d);
                acc[d] += bm25_contribution(w, tfs[p], norm[d]);
            }
        }
        const size_t nb = (n_docs + kScanBlock - 1) / kScanBlock;
        m_block_max.resize(nb);
        float* bmax = m_block_max.data();
        // gmax[g]: the largest of bmax[8g .. 8g + 8), the maximum of 128 documents
        const size_t ng = (nb + 7) / 8;
        m_group_max.resize(ng);
        float* gmax = m_group_max.data();
        size_t j = 0;
#if defined(RETRIEVER_AVX512_SCATTER)
        static_assert(kScanBlock == 16, "block_maxima8_avx2 handles blocks of 16 scores");
        if (kHaveAvx2) {
            for (; (j + 8) * kScanBlock <= n_docs; j += 8) gmax[j / 8] = block_maxima8_avx2(acc + j * kScanBlock, bmax + j);
        }
#endif
        for (size_t j0 = j; j0 < nb; j0 += 8) {
            float g = -std::numeric_limits<float>::infinity();
            for (j = j0; j < std::min(nb, j0 + 8); ++j) {
                bmax[j] = block_max(acc + j * kScanBlock, std::min(kScanBlock, n_docs - j * kScanBlock));
                g = bmax[j] > g ? bmax[j] : g;
            }
            gmax[j0 / 8] = g;
        }
        float thr = m_ctx.heap.threshold();
        const size_t k = m_ctx.out.k;
        bool positive = false;  // thr > 0 before any document is examined
        if (m_ctx.allow == nullptr && nb >= k) {
            // Block maxima are never NaN. With enough of them, theta is the k-th
            // largest of the maxima of groups of 8 blocks (128 documents):
            // also a score reached by k different documents, found in one
            // short pass (on SciFact it lets ~11 blocks through per query
            // against ~10 for the k-th largest block maximum).
            float theta;
            if (k <= kSmallK && ng >= 4 * k) {
                theta = kth_largest(gmax, ng, k);
            } else {
                theta = kth_largest(bmax, nb, k);
            }
            if (theta > 0.0f) {
                thr = std::max(thr, theta);
                positive = true;
            }
        }
#if defined(RETRIEVER_AVX512_SCATTER)
        if (positive && kHaveAvx2 && k <= kCountMax && select_ranked(acc, bmax, nb, n_docs, thr, k)) {
            std::memset(acc, 0, n_docs * sizeof(float));
            A.dense_dirty = 0;
            return;
        }
#endif
        uint8_t* seen = nullptr;
        if (!positive) {
            seen = A.seen.data();
            for (uint64_t i = b; i < e; ++i) {
                const uint32_t t = m_ctx.q.q_terms[i];
                for (uint64_t p = offsets[t], pe = offsets[t + 1]; p < pe; ++p) seen[doc_ids[p]] = 1;
            }
        }
        // Blocks whose maximum reaches thr, found 8 at a time with vector compares (thr is
        // refreshed between groups; a stale, lower thr only offers more documents, which the
        // heap re-checks). bmax is never NaN, and a compare with NaN thr is false, like `>=`.
        for (size_t j0 = 0; j0 < nb; j0 += 8) {
            unsigned mask = 0;
#if defined(__SSE2__)
            if (j0 + 8 <= nb) {
                const __m128 tv = _mm_set1_ps(thr);
                mask = static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(bmax + j0), tv))) |
                       static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(bmax + j0 + 4), tv))) << 4;
            } else
#endif
            {
                for (size_t j = j0; j < std::min(nb, j0 + 8); ++j) mask |= unsigned(bmax[j] >= thr) << (j - j0);
            }
            while (mask != 0) {
                const size_t j = j0 + static_cast<size_t>(__builtin_ctz(mask));
                mask &= mask - 1;
                {
                    const size_t lo = j * kScanBlock, hi = std::min(n_docs, lo + kScanBlock);
                    float ht;
                    if (seen) {
                        ht = select_range<true>(acc, seen, lo, hi, thr);
                    } else if (m_ctx.allow == nullptr && hi - lo == kScanBlock) {
                        ht = select_block(acc, lo, thr);
                    } else {
                        ht = select_range<false>(acc, seen, lo, hi, thr);
                    }
                    thr = std::max(thr, ht);
                }
            }
        }
        std::memset(acc, 0, n_docs * sizeof(float));
        if (seen) std::memset(seen, 0, n_docs);
        A.dense_dirty = 0;
    }

#if defined(RETRIEVER_AVX512_SCATTER)
    /// exhaustive_dense's selection when theta > 0 bounds the k-th best score
    /// from below (k documents reach it): the documents scoring >= theta
    /// (blocks with bmax >= theta only) are collected in increasing id order,
    /// ranked by counting (rank_candidates_avx2) and the best k handed to the heap
    /// in order. Returns false, with the heap untouched, when more than
    /// kCountMax documents reach theta (the caller then offers them one by
    /// one).
    bool select_ranked(const float* acc, const float* bmax, size_t nb, size_t n_docs, float theta, size_t k) {
        float* cs = m_cand_score;
        uint32_t* cd = m_cand_doc;
        size_t c = 0;
        const __m128 tv = _mm_set1_ps(theta);
        for (size_t j0 = 0; j0 < nb; j0 += 8) {
            unsigned mask = 0;
            if (j0 + 8 <= nb) {
                mask = static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(bmax + j0), tv))) |
                       static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(bmax + j0 + 4), tv))) << 4;
            } else {
                for (size_t j = j0; j < nb; ++j) mask |= unsigned(bmax[j] >= theta) << (j - j0);
            }
            while (mask != 0) {
                const size_t lo = (j0 + static_cast<size_t>(__builtin_ctz(mask))) * kScanBlock;
                mask &= mask - 1;
                unsigned dm = 0;
                if (lo + kScanBlock <= n_docs) {
                    const float* a = acc + lo;
                    dm = static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(a), tv))) |
                         static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(a + 4), tv))) << 4 |
                         static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(a + 8), tv))) << 8 |
                         static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(a + 12), tv))) << 12;
                } else {
                    for (size_t d = lo; d < n_docs; ++d) dm |= unsigned(acc[d] >= theta) << (d - lo);
                }
                if (c + static_cast<size_t>(__builtin_popcount(dm)) > kCountMax) return false;
                while (dm != 0) {
                    const size_t d = lo + static_cast<size_t>(__builtin_ctz(dm));
                    dm &= dm - 1;
                    cs[c] = acc[d];
                    cd[c] = static_cast<uint32_t>(d);
                    ++c;
                }
            }
        }
        // c >= k: k documents score >= theta
        scored_doc best[kCountMax + 1];
        rank_candidates_avx2(cs, c, m_cand_rank);
        for (size_t i = 0; i < c; ++i) {  // ranks are distinct; rank >= k goes to the spare slot
            best[std::min<size_t>(static_cast<size_t>(m_cand_rank[i]), k)] = scored_doc{cs[i], cd[i]};
        }
        m_ctx.heap.assign_sorted(best, std::min(k, c));
        return true;
    }
#endif

    /// The k-th largest of v[0..n) (1 <= k <= n, no NaN).
    float kth_largest(const float* v, size_t n, size_t k) {
        if (k <= kSmallK && n >= 4 * k) {
            // Cut the input first: the smallest of the maxima of k disjoint
            // groups is <= the k-th largest (k distinct values reach it), so
            // the k-th largest of the values >= lb is the answer. Few survive.
            float lb = std::numeric_limits<float>::infinity();
            for (size_t g = 0; g < k; ++g) {
                const float m = group_max(v + g * n / k, (g + 1) * n / k - g * n / k);
                lb = m < lb ? m : lb;
            }
#if defined(RETRIEVER_AVX512_SCATTER)
            if (kHaveAvx2) {
                alignas(32) float cand[kCountMax + 8];
                size_t c = 0;
                for (size_t i = 0; i < n; ++i) {  // branch-free compaction; cand[kCountMax] takes
                    cand[std::min(c, kCountMax)] = v[i];  // what does not fit (c > kCountMax: not used)
                    c += (v[i] >= lb);
                }
                if (c <= kCountMax) return kth_largest_count_avx2(cand, c, k);
            }
#endif
            m_block_tmp.resize(n);
            float* buf = m_block_tmp.data();
            size_t c = 0;
            for (size_t i = 0; i < n; ++i) {  // branch-free compaction
                buf[c] = v[i];
                c += (v[i] >= lb);
            }
            return kth_largest_run(buf, c, k);
        }
        if (k <= kSmallK) return kth_largest_run(v, n, k);
        m_block_tmp.assign(v, v + n);
        std::nth_element(m_block_tmp.begin(), m_block_tmp.begin() + (k - 1), m_block_tmp.end(),
                         std::greater<float>());
        return m_block_tmp[k - 1];
    }

    /// Largest of a[0..n) (n >= 1, no NaN).
    static float group_max(const float* a, size_t n) {
        size_t i = 0;
        float m = -std::numeric_limits<float>::infinity();
#if defined(__SSE2__)
        if (n >= 4) {
            __m128 mv = _mm_loadu_ps(a);
            for (i = 4; i + 4 <= n; i += 4) mv = _mm_max_ps(_mm_loadu_ps(a + i), mv);
            mv = _mm_max_ps(mv, _mm_movehl_ps(mv, mv));
            mv = _mm_max_ps(mv, _mm_shuffle_ps(mv, mv, 0x55));
            m = _mm_cvtss_f32(mv);
        }
#endif
        for (; i < n; ++i) m = a[i] > m ? a[i] : m;
        return m;
    }

    /// A descending run of the k largest values offered so far (k <= kSmallK).
    struct sorted_run {
        explicit sorted_run(size_t k_) : k(k_) {}
        void offer(float x) {
            if (m == k && !(x > top[k - 1])) return;  // most values fail this first test
            size_t j = m < k ? m++ : k - 1;
            while (j > 0 && top[j - 1] < x) {
                top[j] = top[j - 1];
                --j;
            }
            top[j] = x;
        }
        /// The k-th largest offered (at least k values offered).
        float kth() const { return top[k - 1]; }
        float top[kSmallK];
        size_t k;
        size_t m = 0;
    };

    /// The k-th largest of v[0..n) (1 <= k <= min(n, kSmallK), no NaN), by a
    /// sorted run of the k largest so far.
    static float kth_largest_run(const float* v, size_t n, size_t k) {
        sorted_run run(k);
        for (size_t i = 0; i < n; ++i) run.offer(v[i]);
        return run.kth();
    }

    /// select_range<false> over the full block [lo, lo + kScanBlock) without
    /// an allow filter: one vector compare against thr finds the documents
    /// to offer (in increasing id order; the heap re-checks each against its
    /// current threshold, so offering one that no longer qualifies is a no-op).
    float select_block(const float* acc, size_t lo, float thr) {
#if defined(__SSE2__)
        static_assert(kScanBlock == 16, "select_block handles 16 scores");
        const __m128 t = _mm_set1_ps(thr);
        const float* a = acc + lo;
        // _mm_cmpge_ps is false for NaN, like `acc[d] >= thr`
        unsigned mask = static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(a), t))) |
                        static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(a + 4), t))) << 4 |
                        static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(a + 8), t))) << 8 |
                        static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(a + 12), t))) << 12;
        while (mask != 0) {
            const size_t d = lo + static_cast<size_t>(__builtin_ctz(mask));
            mask &= mask - 1;
            m_ctx.heap.push(acc[d], static_cast<uint32_t>(d));
        }
        return m_ctx.heap.threshold();
#else
        return select_range<false>(acc, nullptr, lo, lo + kScanBlock, thr);
#endif
    }

    /// Largest non-NaN value of a[0..n) (-inf when there is none).
    static float block_max(const float* a, size_t n) {
#if defined(__SSE2__)
        if (n == kScanBlock) {
            // _mm_max_ps(x, m) returns m when x is NaN, so NaNs are skipped.
            __m128 m = _mm_set1_ps(-std::numeric_limits<float>::infinity());
            for (size_t j = 0; j < kScanBlock; j += 4) m = _mm_max_ps(_mm_loadu_ps(a + j), m);
            m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            m = _mm_max_ps(m, _mm_shuffle_ps(m, m, 0x55));
            return _mm_cvtss_f32(m);
        }
#endif
        float m = -std::numeric_limits<float>::infinity();
        for (size_t j = 0; j < n; ++j) m = a[j] > m ? a[j] : m;
        return m;
    }

    /// Offers the documents of [lo, hi) whose score reaches thr (and, with
    /// kSeen, that are marked in seen) to the heap; returns the heap's
    /// threshold afterwards.
    template <bool kSeen>
    float select_range(const float* acc, const uint8_t* seen, size_t lo, size_t hi, float thr) {
        for (size_t d = lo; d < hi; ++d) {
            if (acc[d] >= thr && (!kSeen || seen[d]) && m_ctx.allowed(static_cast<uint32_t>(d)) &&
                m_ctx.heap.push(acc[d], static_cast<uint32_t>(d))) {
                thr = std::max(thr, m_ctx.heap.threshold());
            }
        }
        return m_ctx.heap.threshold();
    }

    /// kImp: contributions from the precomputed impacts (no doc_norm reads);
    /// kPf: prefetch the accumulator entries kPrefetch postings ahead.
    template <bool kImp, bool kPf>
    void exhaustive_impl(uint64_t b, uint64_t e) {
        dense_accumulator& A = m_acc.get();
        A.ensure(m_ctx.data.n_docs);
        float* acc = A.acc.data();
        uint8_t* seen = A.seen.data();
        // touched holds at most min(n_docs, postings) entries (+1 scratch slot)
        uint64_t total = 0;
        for (uint64_t i = b; i < e; ++i) {
            const uint32_t t = m_ctx.q.q_terms[i];
            total += m_ctx.data.csr.offsets[t + 1] - m_ctx.data.csr.offsets[t];
        }
        A.touched.resize(std::min<uint64_t>(total, m_ctx.data.n_docs) + 1);
        uint32_t* touched = A.touched.data();
        size_t n_touched = 0;
        const uint64_t* offsets = m_ctx.data.csr.offsets;
        const uint32_t* doc_ids = m_ctx.data.csr.doc_ids;
        const uint32_t* tfs = m_ctx.data.tfs;
        const float* norm = m_ctx.data.doc_norm;
        const float* imp = m_ctx.imp;
        const size_t n_docs = m_ctx.data.n_docs;
        for (uint64_t i = b; i < e; ++i) {
            const uint32_t t = m_ctx.q.q_terms[i];
            const float w = m_ctx.q.q_weights[i];
            const uint64_t pe = offsets[t + 1];
            for (uint64_t p = offsets[t]; p < pe; ++p) {
                if (kPf && p + kPrefetch < pe) {
                    const uint32_t ahead = doc_ids[p + kPrefetch];
                    if (!kImp) __builtin_prefetch(norm + ahead);
                    __builtin_prefetch(acc + ahead, 1);
                    __builtin_prefetch(seen + ahead, 1);
                }
                const uint32_t d = doc_ids[p];
                if (d >= n_docs) m_ctx.check_doc(d);
                // branch-free "append d to touched on first sight"
                touched[n_touched] = d;
                n_touched += seen[d] ^ 1;
                seen[d] = 1;
                acc[d] += kImp ? w * imp[p] : bm25_contribution(w, tfs[p], norm[d]);
            }
        }
        A.touched.resize(n_touched);
        // Only scores >= the heap's k-th score can enter (equal ones by doc id).
        // Selection and clearing in one pass over touched.
        float thr = m_ctx.heap.threshold();
        for (size_t i = 0; i < n_touched; ++i) {
            const uint32_t d = touched[i];
            const float sc = acc[d];
            acc[d] = 0.0f;
            seen[d] = 0;
            if (sc < thr) continue;
            if (m_ctx.allowed(d) && m_ctx.heap.push(sc, d)) thr = m_ctx.heap.threshold();
        }
        A.touched.clear();
    }

    bm25_query& m_ctx;
    accumulator_lease m_acc;
    std::vector<float> m_block_max;  // exhaustive_dense scratch
    std::vector<float> m_block_tmp;
    std::vector<float> m_group_max;  // exhaustive_dense scratch
    // select_ranked scratch (8 floats of padding after the candidates)
    alignas(32) float m_cand_score[kCountMax + 8];
    uint32_t m_cand_doc[kCountMax];
    alignas(32) int32_t m_cand_rank[kCountMax + 8];
};

}  // namespace
}  // namespace retriever
