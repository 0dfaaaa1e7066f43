// CPU-specific helpers of the BM25 kernels: the scatter of precomputed impacts into a
// dense accumulator (scalar / AVX2 / AVX-512), dense impact rows, block maxima, the
// k-th largest by counting, candidate ranking and bitmap probes. Every variant computes
// the same float32 operations in the same order as its scalar twin (no FMA; compiled
// with -ffp-contract=off), so results never depend on the variant.
// Internal to the BM25 top-k translation unit (bm25_topk.cpp includes it once); hence
// the anonymous namespace.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define RETRIEVER_AVX512_SCATTER 1
#endif

#include "postings_topk.hpp"

namespace retriever {
namespace {

/// Scalar scatter of one term's list: acc[docs[p]] += w * imp[p] for p < n.
/// Returns n, or the first position whose doc id is >= n_docs (nothing at or
/// after it is added). Four postings per iteration: a list's doc ids are
/// distinct, so the four loads may run ahead of the four stores.
inline size_t scatter_impacts_scalar(float* acc, const uint32_t* docs, const float* imp, float w,
                                     size_t n, size_t n_docs) {
    size_t p = 0;
    for (; p + 4 <= n; p += 4) {
        const uint32_t d0 = docs[p], d1 = docs[p + 1], d2 = docs[p + 2], d3 = docs[p + 3];
        if (std::max(std::max(d0, d1), std::max(d2, d3)) >= n_docs) break;
        const float v0 = acc[d0] + w * imp[p], v1 = acc[d1] + w * imp[p + 1];
        const float v2 = acc[d2] + w * imp[p + 2], v3 = acc[d3] + w * imp[p + 3];
        acc[d0] = v0;
        acc[d1] = v1;
        acc[d2] = v2;
        acc[d3] = v3;
    }
    for (; p < n; ++p) {
        const uint32_t d = docs[p];
        if (d >= n_docs) return p;
        acc[d] += w * imp[p];
    }
    return n;
}

#if defined(RETRIEVER_AVX512_SCATTER)
/// CPU features, read once per process when the extension is loaded, after
/// __builtin_cpu_init() (this file's statics may be initialised before libgcc's
/// own detection has run); constant afterwards. The helpers below that have one
/// vector variant take it whenever the CPU has it; the scatter, which has
/// three, is chosen per call (bm25_search_params::scatter, "auto" =
/// bm25_scatter_for_cpu()).
struct cpu_features {
    bool avx512, avx2, intel, popcnt;
};
const cpu_features kCpu = [] {
    __builtin_cpu_init();
    return cpu_features{__builtin_cpu_supports("avx512f") != 0, __builtin_cpu_supports("avx2") != 0,
                        __builtin_cpu_is("intel") != 0, __builtin_cpu_supports("popcnt") != 0};
}();
const bool kHaveAvx512 = kCpu.avx512;
const bool kHaveAvx2 = kCpu.avx2;
/// AVX-512 scatters are fast on Intel cores; on AMD Zen 4 they are
/// microcoded and the scatter of 16 postings ran ~15% slower than 16 scalar
/// stores on SciFact (benchmarks/bench_bm25.py, kernel `exhaustive`), so the
/// default takes them on Intel only.
const bool kIntel = kCpu.intel;

/// scatter_impacts_scalar with AVX-512 gathers / scatters, 16 postings at a
/// time. Requires distinct doc ids within docs[0..n) (a CSR list: strictly
/// increasing), so no two lanes of one scatter hit the same entry. Each lane
/// computes fl(acc[d] + fl(w * imp[p])), the scalar expression (no FMA).
__attribute__((target("avx512f"))) size_t scatter_impacts_avx512(float* acc, const uint32_t* docs,
                                                                const float* imp, float w, size_t n,
                                                                size_t n_docs) {
    const __m512 wv = _mm512_set1_ps(w);
    const __m512i lim = _mm512_set1_epi32(static_cast<int>(std::min<size_t>(n_docs, 0xFFFFFFFFu)));
    size_t p = 0;
    for (; p + 16 <= n; p += 16) {
        const __m512i d = _mm512_loadu_si512(docs + p);
        if (_mm512_cmpge_epu32_mask(d, lim)) break;  // the scalar tail finds the bad one
        const __m512 c = _mm512_mul_ps(wv, _mm512_loadu_ps(imp + p));
        _mm512_i32scatter_ps(acc, d, _mm512_add_ps(_mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xFFFF, d, acc, 4), c), 4);
    }
    return p + scatter_impacts_scalar(acc, docs + p, imp + p, w, n - p, n_docs);
}

/// scatter_impacts_scalar with the 16 products fl(w * imp[p]) and the
/// bounds check of 16 doc ids done in AVX2 registers; the 16 read-add-writes
/// of the accumulator stay scalar (no gather / scatter), each computing the
/// scalar expression fl(acc[d] + fl(w * imp[p])).
__attribute__((target("avx2"))) size_t scatter_impacts_avx2(float* acc, const uint32_t* docs,
                                                            const float* imp, float w, size_t n,
                                                            size_t n_docs) {
    const __m256 wv = _mm256_set1_ps(w);
    const __m256i lim = _mm256_set1_epi32(static_cast<int>(std::min<size_t>(n_docs, 0xFFFFFFFFu)));
    alignas(32) float prod[16];
    size_t p = 0;
    for (; p + 16 <= n; p += 16) {
        const __m256i mx = _mm256_max_epu32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(docs + p)),
                                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(docs + p + 8)));
        // lanes with mx >= lim: max(mx, lim) == mx
        const __m256i ge = _mm256_cmpeq_epi32(_mm256_max_epu32(mx, lim), mx);
        if (!_mm256_testz_si256(ge, ge)) break;  // the scalar tail finds the bad one
        _mm256_store_ps(prod, _mm256_mul_ps(wv, _mm256_loadu_ps(imp + p)));
        _mm256_store_ps(prod + 8, _mm256_mul_ps(wv, _mm256_loadu_ps(imp + p + 8)));
        const uint32_t* d = docs + p;
        for (int j = 0; j < 16; j += 4) {
            const uint32_t d0 = d[j], d1 = d[j + 1], d2 = d[j + 2], d3 = d[j + 3];
            const float v0 = acc[d0] + prod[j], v1 = acc[d1] + prod[j + 1];
            const float v2 = acc[d2] + prod[j + 2], v3 = acc[d3] + prod[j + 3];
            acc[d0] = v0;
            acc[d1] = v1;
            acc[d2] = v2;
            acc[d3] = v3;
        }
    }
    return p + scatter_impacts_scalar(acc, docs + p, imp + p, w, n - p, n_docs);
}
#endif

/// Maxima of 8 consecutive blocks of 16 floats (a[0..128)) into out[0..8),
/// NaN skipped as in block_max (a block of NaN only gives -inf): 2 maxes per
/// block, then a shuffle tree instead of one horizontal reduction per block.
__attribute__((target("avx2"))) float block_maxima8_avx2(const float* a, float* out) {
    const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    __m256 v[8];
    for (int b = 0; b < 8; ++b) {
        // _mm256_max_ps(x, y) is y when either is NaN: y cleaned first, so NaNs drop out
        const __m256 hi = _mm256_max_ps(_mm256_loadu_ps(a + 16 * b + 8), ninf);
        v[b] = _mm256_max_ps(_mm256_loadu_ps(a + 16 * b), hi);
    }
    __m256 p[4];
    for (int b = 0; b < 4; ++b) {  // per 128-bit lane: pairwise maxima of v[2b], v[2b+1]
        p[b] = _mm256_max_ps(_mm256_shuffle_ps(v[2 * b], v[2 * b + 1], 0x88),
                             _mm256_shuffle_ps(v[2 * b], v[2 * b + 1], 0xDD));
    }
    // per lane: the lane maxima of v[0..3] (q0) and v[4..7] (q1)
    const __m256 q0 = _mm256_max_ps(_mm256_shuffle_ps(p[0], p[1], 0x88), _mm256_shuffle_ps(p[0], p[1], 0xDD));
    const __m256 q1 = _mm256_max_ps(_mm256_shuffle_ps(p[2], p[3], 0x88), _mm256_shuffle_ps(p[2], p[3], 0xDD));
    const __m256 m = _mm256_max_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
    _mm256_storeu_ps(out, m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 0x55)));
}

#if defined(RETRIEVER_AVX512_SCATTER)
/// acc[d] = fl(acc[d] + fl(w * row[d])) for d < n, eight at a time (the
/// scalar expression per lane: separate multiply and add, no FMA).
__attribute__((target("avx2"))) void add_impact_row_avx2(float* acc, const float* row, float w, size_t n) {
    const __m256 wv = _mm256_set1_ps(w);
    size_t d = 0;
    for (; d + 16 <= n; d += 16) {
        const __m256 a0 = _mm256_add_ps(_mm256_loadu_ps(acc + d), _mm256_mul_ps(wv, _mm256_loadu_ps(row + d)));
        const __m256 a1 =
            _mm256_add_ps(_mm256_loadu_ps(acc + d + 8), _mm256_mul_ps(wv, _mm256_loadu_ps(row + d + 8)));
        _mm256_storeu_ps(acc + d, a0);
        _mm256_storeu_ps(acc + d + 8, a1);
    }
    for (; d < n; ++d) acc[d] += w * row[d];
}
#endif

#if defined(RETRIEVER_AVX512_SCATTER)
/// Most values kth_largest_count_avx2 ranks by counting (its buffer size).
constexpr size_t kCountMax = 64;

/// The k-th largest of the c values cand[0..c) (1 <= k <= c <= kCountMax,
/// no NaN; cand has room for 8 more floats), branch-free: it is the smallest
/// value x with fewer than k values strictly above it, so each value's count
/// of larger values is taken, 8 candidates against one broadcast value per
/// step (O(c^2 / 8) vector compares; with c ~ 20 far cheaper than a sorted
/// run, whose insertions mispredict).
__attribute__((target("avx2"))) float kth_largest_count_avx2(float* cand, size_t c, size_t k) {
    const __m256 pinf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
    _mm256_storeu_ps(cand + c, _mm256_set1_ps(-std::numeric_limits<float>::infinity()));
    const __m256i kv = _mm256_set1_epi32(static_cast<int>(k));
    __m256 best = pinf;
    for (size_t j = 0; j < c; j += 8) {
        const __m256 x = _mm256_loadu_ps(cand + j);  // padding lanes (-inf) have >= k values above
        __m256i above = _mm256_setzero_si256();
        for (size_t i = 0; i < c; ++i) {  // all-ones (-1) where cand[i] > x
            above = _mm256_sub_epi32(above, _mm256_castps_si256(_mm256_cmp_ps(_mm256_broadcast_ss(cand + i), x,
                                                                               _CMP_GT_OQ)));
        }
        const __m256 fewer = _mm256_castsi256_ps(_mm256_cmpgt_epi32(kv, above));
        best = _mm256_min_ps(best, _mm256_blendv_ps(pinf, x, fewer));
    }
    __m128 h = _mm_min_ps(_mm256_castps256_ps128(best), _mm256_extractf128_ps(best, 1));
    h = _mm_min_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_min_ss(h, _mm_shuffle_ps(h, h, 0x55)));
}

/// Ranks of c candidates (c <= kCountMax; s has room for 8 more floats,
/// rank for 8 more ints) listed in increasing doc id order: rank[i] = the
/// number of candidates ranking before i (a higher score, or an equal score
/// and a smaller id, i.e. an earlier position), 0 for the best. Scores must
/// not be NaN. 8 candidates against one broadcast score per step.
__attribute__((target("avx2"))) void rank_candidates_avx2(float* s, size_t c, int32_t* rank) {
    _mm256_storeu_ps(s + c, _mm256_set1_ps(-std::numeric_limits<float>::infinity()));
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (size_t i = 0; i < c; i += 8) {
        const __m256 x = _mm256_loadu_ps(s + i);
        const __m256i pos = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int>(i)));
        __m256i before = _mm256_setzero_si256();
        for (size_t j = 0; j < c; ++j) {
            const __m256 y = _mm256_broadcast_ss(s + j);
            // j ranks before lane p: s[j] > s[p], or s[j] == s[p] and j < p
            const __m256i earlier = _mm256_cmpgt_epi32(pos, _mm256_set1_epi32(static_cast<int>(j)));
            const __m256 b = _mm256_or_ps(_mm256_cmp_ps(y, x, _CMP_GT_OQ),
                                          _mm256_and_ps(_mm256_cmp_ps(y, x, _CMP_EQ_OQ), _mm256_castsi256_ps(earlier)));
            before = _mm256_sub_epi32(before, _mm256_castps_si256(b));
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(rank + i), before);
    }
}
#endif

/// acc[d] += w * row[d] for d < n (a dense impact row, see
/// bm25_view::impact_rows): AVX2 where the CPU has it, else SSE2 / scalar;
/// every path computes fl(acc[d] + fl(w * row[d])).
inline void add_impact_row(float* acc, const float* row, float w, size_t n) {
#if defined(RETRIEVER_AVX512_SCATTER)
    if (kHaveAvx2) {
        add_impact_row_avx2(acc, row, w, n);
        return;
    }
#endif
    size_t d = 0;
#if defined(__SSE2__)
    const __m128 wv = _mm_set1_ps(w);
    for (; d + 4 <= n; d += 4) {
        _mm_storeu_ps(acc + d, _mm_add_ps(_mm_loadu_ps(acc + d), _mm_mul_ps(wv, _mm_loadu_ps(row + d))));
    }
#endif
    for (; d < n; ++d) acc[d] += w * row[d];
}

/// acc[docs[p]] += w * imp[p] for p < n in order (distinct doc ids); returns
/// n, or the first position whose doc id is >= n_docs. `impl` is resolved
/// (never automatic: bm25_topk resolves "auto" with bm25_scatter_for_cpu) and
/// supported by this CPU (parse_bm25_scatter checks); every one adds the same
/// float32 products in the same order (bit-identical accumulators).
inline size_t scatter_impacts(float* acc, const uint32_t* docs, const float* imp, float w, size_t n,
                              size_t n_docs, bm25_scatter impl) {
#if defined(RETRIEVER_AVX512_SCATTER)
    if (n >= 16) {
        // n_docs < 2^31: the gather's signed 32-bit indices (scale 4) cover every id
        if (impl == bm25_scatter::avx512 && n_docs < (size_t{1} << 31)) {
            return scatter_impacts_avx512(acc, docs, imp, w, n, n_docs);
        }
        if (impl == bm25_scatter::avx2 || impl == bm25_scatter::avx512) {
            return scatter_impacts_avx2(acc, docs, imp, w, n, n_docs);
        }
    }
#endif
    return scatter_impacts_scalar(acc, docs, imp, w, n, n_docs);
}

/// "No posting" marker of a bitmap probe.
constexpr uint64_t kNoPos = ~uint64_t{0};

/// For each window offset cand[i] (doc ws + cand[i]), the posting of that doc
/// in a list with a membership bitmap (bm25_bounds_view::dense_bits /
/// dense_rank rows `bits` / `rank`, list starting at posting `beg`), or kNoPos
/// when the list does not hold it; prefetches each found posting's 4-byte
/// element `prefetch[p]` (its impact, or its tf). Positions first, so the impact loads that follow do not wait
/// on one another. Returns n, or the index of the first position at or past
/// `end` (inconsistent bitmaps).
__attribute__((always_inline)) inline size_t bitmap_positions_impl(const uint64_t* bits, const uint32_t* rank,
                                                                   uint64_t beg, uint64_t end, const uint32_t* cand,
                                                                   size_t n, uint32_t ws, const float* prefetch,
                                                                   uint64_t* pos) {
    for (size_t i = 0; i < n; ++i) {
        const uint32_t d = ws + cand[i];
        const uint64_t word = bits[d >> 6];
        const uint32_t at = d & 63u;
        if (((word >> at) & 1u) == 0) {
            pos[i] = kNoPos;
            continue;
        }
        const uint64_t p = beg + rank[d >> 6] +
                           static_cast<uint64_t>(__builtin_popcountll(word & ((uint64_t{1} << at) - 1)));
        if (p >= end) return i;
        pos[i] = p;
        __builtin_prefetch(prefetch + p);
    }
    return n;
}

size_t bitmap_positions_generic(const uint64_t* bits, const uint32_t* rank, uint64_t beg, uint64_t end,
                                const uint32_t* cand, size_t n, uint32_t ws, const float* prefetch,
                                uint64_t* pos) {
    return bitmap_positions_impl(bits, rank, beg, end, cand, n, ws, prefetch, pos);
}

#if defined(RETRIEVER_AVX512_SCATTER)
/// bitmap_positions_generic with the popcnt instruction (a library call
/// per probe without it).
__attribute__((target("popcnt"))) size_t bitmap_positions_popcnt(const uint64_t* bits, const uint32_t* rank,
                                                                  uint64_t beg, uint64_t end, const uint32_t* cand,
                                                                  size_t n, uint32_t ws, const float* prefetch,
                                                                  uint64_t* pos) {
    return bitmap_positions_impl(bits, rank, beg, end, cand, n, ws, prefetch, pos);
}
const bool kHavePopcnt = kCpu.popcnt;
#endif

inline size_t bitmap_positions(const uint64_t* bits, const uint32_t* rank, uint64_t beg, uint64_t end,
                               const uint32_t* cand, size_t n, uint32_t ws, const float* prefetch, uint64_t* pos) {
#if defined(RETRIEVER_AVX512_SCATTER)
    if (kHavePopcnt) return bitmap_positions_popcnt(bits, rank, beg, end, cand, n, ws, prefetch, pos);
#endif
    return bitmap_positions_generic(bits, rank, beg, end, cand, n, ws, prefetch, pos);
}

}  // namespace
}  // namespace retriever
