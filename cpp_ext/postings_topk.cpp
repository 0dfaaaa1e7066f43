// BM25 and impact top-k kernels over CSR postings. See postings_topk.hpp.
//
// Algorithms:
//   exhaustive  term-at-a-time over a dense float accumulator (+ touched list)
//   maxscore    MaxScore (Turtle & Flood 1995): lists sorted by upper bound,
//               candidates only from the essential lists, the non-essential
//               ones probed while a document can still reach the k-th score.
//               Evaluated window-at-a-time (term-at-a-time inside windows of
//               kWindow doc ids, as Lucene's MaxScoreBulkScorer does) when the
//               essential lists are dense, document-at-a-time with galloping
//               seeks when they are sparse or the query is long.
//   bmw         Block-Max WAND (Ding & Suel 2011)
//   bmm         Block-Max MaxScore (DAAT MaxScore whose essential lists skip
//               whole blocks and pre-check candidates with per-block bounds;
//               block maxima after Ding & Suel 2011 / Chakrabarti et al. 2011)
// All pruning algorithms first prime the threshold from the query's short,
// high-bound lists (prime_threshold) and, when the caller passes term_kth, from
// the best single-term k-th score (single_term_threshold), and check
// candidates against per-posting tf bounds before reading doc_norm.
//
// Determinism: every algorithm computes a candidate's score with the same
// float32 expression (bm25_contribution) summed in query-term order starting
// at 0.0f, so all algorithms and thread counts return bit-identical results.
// Term-at-a-time adds only the terms present in a document; the
// document-at-a-time paths add +0.0f for absent terms, which is an exact no-op
// because the running sum starts at +0.0f and can never become -0.0f.
//
// Safe pruning: a document is discarded only if an upper bound on its float
// score is STRICTLY below the current k-th score (a document with an equal
// score and a smaller id still enters). Bounds are summed in double and
// inflated by a relative margin that covers float32 rounding of the products
// and of the query-order sum (see bound_check).

#include "postings_topk.hpp"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define RETRIEVER_AVX512_SCATTER 1
#endif

#include "parallel.hpp"
#include "posting_cursor.hpp"
#include "query_terms.hpp"
#include "topk.hpp"

namespace retriever {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

// ---------------------------------------------------------------------------
// Dense accumulators, pooled across calls so a single-query call does not pay
// an O(n_docs) allocation. Invariant while in the pool: acc all +0.0f, seen all 0.
// ---------------------------------------------------------------------------

struct dense_accumulator {
    std::vector<float> acc;
    std::vector<uint8_t> seen;
    std::vector<uint32_t> touched;
    /// Prefix [0, dense_dirty) of acc / seen that a dense scan may have written
    /// and not yet cleared (non-zero only while one runs, or after it threw).
    size_t dense_dirty = 0;

    void ensure(size_t n) {
        if (acc.size() < n) {
            acc.resize(n, 0.0f);
            seen.resize(n, 0);
        }
    }
    void clear_touched() {
        if (dense_dirty) {  // a dense scan was interrupted (e.g. a bad doc id threw)
            std::memset(acc.data(), 0, dense_dirty * sizeof(float));
            std::memset(seen.data(), 0, dense_dirty);
            dense_dirty = 0;
        }
        float* a = acc.data();  // locals: the uint8 stores would force reloads
        uint8_t* s = seen.data();
        for (uint32_t d : touched) {
            a[d] = 0.0f;
            s[d] = 0;
        }
        touched.clear();
    }
};

class accumulator_pool {
  public:
    static accumulator_pool& instance() {
        static accumulator_pool pool;
        return pool;
    }
    std::unique_ptr<dense_accumulator> acquire() {
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            if (!m_free.empty()) {
                auto a = std::move(m_free.back());
                m_free.pop_back();
                return a;
            }
        }
        return std::make_unique<dense_accumulator>();
    }
    void release(std::unique_ptr<dense_accumulator> a) {
        std::lock_guard<std::mutex> lock(m_mutex);
        if (m_free.size() < m_capacity) m_free.push_back(std::move(a));
    }

  private:
    accumulator_pool() {
        const size_t hw = std::max<size_t>(1, std::thread::hardware_concurrency());
        m_capacity = 2 * hw;
        hold_mutex_across_fork<&accumulator_pool::mutex>();
    }
    static std::mutex& mutex() { return instance().m_mutex; }
    std::mutex m_mutex;
    std::vector<std::unique_ptr<dense_accumulator>> m_free;
    size_t m_capacity = 2;
};

/// A worker's lazily acquired accumulator, returned clean to the pool.
class accumulator_lease {
  public:
    accumulator_lease() = default;
    accumulator_lease(const accumulator_lease&) = delete;
    accumulator_lease& operator=(const accumulator_lease&) = delete;
    ~accumulator_lease() {
        if (m_acc) {
            m_acc->clear_touched();
            accumulator_pool::instance().release(std::move(m_acc));
        }
    }
    dense_accumulator& get() {
        if (!m_acc) m_acc = accumulator_pool::instance().acquire();
        return *m_acc;
    }

  private:
    std::unique_ptr<dense_accumulator> m_acc;
};

// ---------------------------------------------------------------------------
// Safe bound comparison.
// ---------------------------------------------------------------------------

/// may_enter(bound, thr) is false only when every float32 score the bound
/// covers is certainly < thr. `bound` is a double sum of exact products
/// (double)w * (double)ub; the float score of a document covered by it is at
/// most bound * (1 + 2^-24)^(n+1) (product rounding + n-1 additions of
/// non-negative terms) plus underflow slack. We use a larger margin.
struct bound_check {
    double margin;
    double slack;
    explicit bound_check(size_t n_terms)
        : margin(1.0 + static_cast<double>(n_terms + 4) * 0x1p-22),
          slack(static_cast<double>(n_terms + 1) * 0x1p-140) {}
    bool may_enter(double bound, float thr) const {
        const double b = bound * margin + slack;
        if (!(b < static_cast<double>(FLT_MAX))) return true;  // could round to +inf
        return b >= static_cast<double>(thr);
    }
    /// A cut c such that a < c implies !may_enter(a + rest, thr): compare a
    /// partial score with one subtraction-free test in hot loops. Slightly
    /// below the exact cut, so it never discards what may_enter keeps.
    double cut(double rest, float thr) const {
        const double t = std::min(static_cast<double>(thr), static_cast<double>(FLT_MAX));
        double c = (t - slack) / margin - rest;
        c -= std::fabs(c) * 1e-9 + 1e-300;
        return c;
    }
};

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

/// Which scatter exhaustive_dense uses for precomputed impacts: 0 = best
/// for this CPU (see scatter_impacts), 1 = scalar, 2 = AVX2 products,
/// 3 = AVX-512 gathers / scatters (tests and benchmarks pick one; 2 and 3
/// only where the CPU has the instructions). All add the same float32
/// products in the same order (bit-identical accumulators).
std::atomic<int> g_scatter_impl{0};

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
/// CPU features, read once after __builtin_cpu_init() (this file's statics may
/// be initialised before libgcc's own detection has run).
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
/// n, or the first position whose doc id is >= n_docs. Default (impl 0):
/// AVX-512 on Intel CPUs that have it, else AVX2 products, else scalar.
inline size_t scatter_impacts(float* acc, const uint32_t* docs, const float* imp, float w, size_t n,
                              size_t n_docs) {
#if defined(RETRIEVER_AVX512_SCATTER)
    if (n >= 16) {
        int impl = g_scatter_impl.load(std::memory_order_relaxed);
        if (impl == 0) impl = (kHaveAvx512 && kIntel) ? 3 : kHaveAvx2 ? 2 : 1;
        // n_docs < 2^31: the gather's signed 32-bit indices (scale 4) cover every id
        if (impl == 3 && n_docs < (size_t{1} << 31)) return scatter_impacts_avx512(acc, docs, imp, w, n, n_docs);
        if (impl >= 2) return scatter_impacts_avx2(acc, docs, imp, w, n, n_docs);
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

inline void prefetch_norm(const posting_cursor& c, const float* doc_norm) {
    if (c.pos + kPrefetch < c.end) __builtin_prefetch(doc_norm + c.docs[c.pos + kPrefetch]);
}

// ---------------------------------------------------------------------------
// BM25 worker: one per thread, owns all scratch memory.
// ---------------------------------------------------------------------------

class bm25_worker {
  public:
    /// norm_min: a lower bound of doc_norm (>= 0) that enables per-posting
    /// tf bounds, or a negative value to disable them.
    bm25_worker(const bm25_view& data, const bm25_bounds_view* bounds, const query_batch_view& q,
                const uint8_t* allow, bm25_algorithm algo, const topk_out& out, float norm_min)
        : m_data(data), m_bounds(bounds), m_q(q), m_allow(allow), m_algo(algo), m_out(out),
          m_imp(data.impacts), m_norm_min(m_imp != nullptr ? -1.0f : norm_min) {}

    void operator()(size_t qi) { run(qi, m_q.q_offsets[qi], m_q.q_offsets[qi + 1]); }

    /// Scores the query whose terms are m_q.q_terms[b .. e) into output row qi.
    void run(size_t qi, uint64_t b, uint64_t e) {
        m_heap.reset(m_out.k);
        if (e > b) {
            bool negative = false;
            for (uint64_t i = b; i < e; ++i) negative |= (m_q.q_weights[i] < 0.0f);
            bm25_algorithm algo = m_algo;
            if (algo == bm25_algorithm::automatic) {
                uint64_t total = 0;
                for (uint64_t i = b; i < e; ++i) {
                    const uint32_t t = m_q.q_terms[i];
                    total += m_data.csr.offsets[t + 1] - m_data.csr.offsets[t];
                }
                algo = (total <= m_auto_limit || m_data.n_docs <= kAutoExhaustiveDocs)
                           ? bm25_algorithm::exhaustive
                           : bm25_algorithm::maxscore;
            }
            m_theta_ext = -std::numeric_limits<float>::infinity();
            if (!negative && m_allow == nullptr && m_bounds != nullptr &&
                m_bounds->term_kth != nullptr) {
                m_theta_ext = single_term_threshold(b, e);
            }
            if (algo == bm25_algorithm::exhaustive || negative || m_bounds == nullptr) {
                exhaustive(b, e);
            } else if (algo == bm25_algorithm::maxscore) {
                maxscore(b, e);
            } else if (m_algo == bm25_algorithm::block_max_maxscore) {
                block_max_maxscore(b, e);
            } else {
                block_max_wand(b, e);
            }
        }
        m_out.n_found[qi] = m_heap.finalize(m_out.ids + qi * m_out.k, m_out.scores + qi * m_out.k);
    }

  private:
    bool allowed(uint32_t d) const { return m_allow == nullptr || m_allow[d] != 0; }

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
        const float* kth = m_bounds->term_kth;
        for (uint64_t i = b; i < e; ++i) {
            const float v = kth[m_q.q_terms[i]];
            const float w = m_q.q_weights[i];
            if (v >= 0.0f && w >= 0.0f) {
                const float s = w * v;
                if (s > theta) theta = s;
            }
        }
        return theta;
    }

    /// A list's doc id below the current window: the list is not sorted.
    [[noreturn]] __attribute__((noinline, cold)) static void bad_order(uint32_t d) {
        fail("a posting list's doc ids are not strictly increasing (doc id " + std::to_string(d) +
             " after a larger one); validate the postings with check_csr");
    }

    [[noreturn]] __attribute__((noinline, cold)) static void bad_bitmap(uint32_t d) {
        fail("dense_bits / dense_rank place doc id " + std::to_string(d) +
             " past the end of its list (compute them with bm25_dense_bitmaps)");
    }

    void check_doc(uint32_t d) const {
        if (d >= m_data.n_docs) {
            fail("doc_ids contains doc id " + std::to_string(d) + " >= n_docs = " +
                 std::to_string(m_data.n_docs) + " (validate the postings with check_csr)");
        }
    }

    // ---- exhaustive: term-at-a-time ------------------------------------
    void exhaustive(uint64_t b, uint64_t e) {
        uint64_t total = 0;
        for (uint64_t i = b; i < e; ++i) {
            const uint32_t t = m_q.q_terms[i];
            total += m_data.csr.offsets[t + 1] - m_data.csr.offsets[t];
        }
        // Small collections (the query's postings cover a good part of it):
        // scatter without a touched list and select in one linear pass.
        if (m_data.n_docs <= kDenseScanRatio * total) {
            m_imp != nullptr ? exhaustive_dense<true>(b, e) : exhaustive_dense<false>(b, e);
            return;
        }
        // Prefetching pays only when the accumulator does not sit in cache.
        const bool pf = m_data.n_docs > kPrefetchMinDocs;
        if (m_imp != nullptr) {
            pf ? exhaustive_impl<true, true>(b, e) : exhaustive_impl<true, false>(b, e);
        } else {
            pf ? exhaustive_impl<false, true>(b, e) : exhaustive_impl<false, false>(b, e);
        }
    }

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
        const size_t n_docs = m_data.n_docs;
        A.ensure(n_docs);
        A.dense_dirty = n_docs;  // cleared below; if anything throws, the lease clears it
        float* acc = A.acc.data();
        const uint64_t* offsets = m_data.csr.offsets;
        const uint32_t* doc_ids = m_data.csr.doc_ids;
        const uint32_t* tfs = m_data.tfs;
        const float* norm = m_data.doc_norm;
        const float* imp = m_imp;
        for (uint64_t i = b; i < e; ++i) {
            const uint32_t t = m_q.q_terms[i];
            const float w = m_q.q_weights[i];
            const uint64_t pb = offsets[t], pe = offsets[t + 1];
            if (kImp) {
                if (m_data.impact_row_slot != nullptr) {  // w finite, r in [-1, rows): checked at the boundary
                    const int32_t r = m_data.impact_row_slot[t];
                    if (r >= 0) {  // the row holds t's impacts at its doc ids, +0.0f elsewhere
                        add_impact_row(acc, m_data.impact_rows + static_cast<size_t>(r) * n_docs, w, n_docs);
                        continue;
                    }
                }
                const size_t n = static_cast<size_t>(pe - pb);
                const size_t done = scatter_impacts(acc, doc_ids + pb, imp + pb, w, n, n_docs);
                if (done < n) check_doc(doc_ids[pb + done]);
                continue;
            }
            for (uint64_t p = pb; p < pe; ++p) {
                const uint32_t d = doc_ids[p];
                if (d >= n_docs) check_doc(d);
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
        float thr = m_heap.threshold();
        const size_t k = m_out.k;
        bool positive = false;  // thr > 0 before any document is examined
        if (m_allow == nullptr && nb >= k) {
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
                const uint32_t t = m_q.q_terms[i];
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
                    } else if (m_allow == nullptr && hi - lo == kScanBlock) {
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
        m_heap.assign_sorted(best, std::min(k, c));
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
            m_heap.push(acc[d], static_cast<uint32_t>(d));
        }
        return m_heap.threshold();
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
            if (acc[d] >= thr && (!kSeen || seen[d]) && allowed(static_cast<uint32_t>(d)) &&
                m_heap.push(acc[d], static_cast<uint32_t>(d))) {
                thr = std::max(thr, m_heap.threshold());
            }
        }
        return m_heap.threshold();
    }

    /// kImp: contributions from the precomputed impacts (no doc_norm reads);
    /// kPf: prefetch the accumulator entries kPrefetch postings ahead.
    template <bool kImp, bool kPf>
    void exhaustive_impl(uint64_t b, uint64_t e) {
        dense_accumulator& A = m_acc.get();
        A.ensure(m_data.n_docs);
        float* acc = A.acc.data();
        uint8_t* seen = A.seen.data();
        // touched holds at most min(n_docs, postings) entries (+1 scratch slot)
        uint64_t total = 0;
        for (uint64_t i = b; i < e; ++i) {
            const uint32_t t = m_q.q_terms[i];
            total += m_data.csr.offsets[t + 1] - m_data.csr.offsets[t];
        }
        A.touched.resize(std::min<uint64_t>(total, m_data.n_docs) + 1);
        uint32_t* touched = A.touched.data();
        size_t n_touched = 0;
        const uint64_t* offsets = m_data.csr.offsets;
        const uint32_t* doc_ids = m_data.csr.doc_ids;
        const uint32_t* tfs = m_data.tfs;
        const float* norm = m_data.doc_norm;
        const float* imp = m_imp;
        const size_t n_docs = m_data.n_docs;
        for (uint64_t i = b; i < e; ++i) {
            const uint32_t t = m_q.q_terms[i];
            const float w = m_q.q_weights[i];
            const uint64_t pe = offsets[t + 1];
            for (uint64_t p = offsets[t]; p < pe; ++p) {
                if (kPf && p + kPrefetch < pe) {
                    const uint32_t ahead = doc_ids[p + kPrefetch];
                    if (!kImp) __builtin_prefetch(norm + ahead);
                    __builtin_prefetch(acc + ahead, 1);
                    __builtin_prefetch(seen + ahead, 1);
                }
                const uint32_t d = doc_ids[p];
                if (d >= n_docs) check_doc(d);
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
        float thr = m_heap.threshold();
        for (size_t i = 0; i < n_touched; ++i) {
            const uint32_t d = touched[i];
            const float sc = acc[d];
            acc[d] = 0.0f;
            seen[d] = 0;
            if (sc < thr) continue;
            if (allowed(d) && m_heap.push(sc, d)) thr = m_heap.threshold();
        }
        A.touched.clear();
    }

    // ---- cursor set-up shared by the DAAT algorithms -------------------
    void open_cursors(uint64_t b, uint64_t e, bool with_blocks) {
        const size_t n = static_cast<size_t>(e - b);
        m_cursors.resize(n);
        for (size_t j = 0; j < n; ++j) {
            const uint32_t t = m_q.q_terms[b + j];
            posting_cursor& c = m_cursors[j];
            c.docs = m_data.csr.doc_ids;
            c.beg = m_data.csr.offsets[t];
            c.end = m_data.csr.offsets[t + 1];
            c.pos = c.beg;
            c.refresh();
            c.qpos = static_cast<uint32_t>(j);
            c.weight = m_q.q_weights[b + j];
            c.ub = static_cast<double>(c.weight) * static_cast<double>(m_bounds->term_ub[t]);
            c.bits = nullptr;
            c.rank = nullptr;
            if (m_bounds->dense_slot != nullptr && m_bounds->dense_slot[t] >= 0) {
                const size_t row = static_cast<size_t>(m_bounds->dense_slot[t]) * m_bounds->dense_words;
                c.bits = m_bounds->dense_bits + row;
                c.rank = m_bounds->dense_rank + row;
            }
            if (with_blocks) {
                c.bs = m_bounds->block_size;
                c.bub = m_bounds->block_ub + m_bounds->block_offsets[t];
                c.nb = m_bounds->block_offsets[t + 1] - m_bounds->block_offsets[t];
                c.bi = 0;
                c.blk_end = 0;  // forces update_block() to load the first block
            }
        }
        m_contrib.assign(n, 0.0f);
        // Per-term table of bounds by tf: weight * min(term_ub, tf / (tf + norm_min)).
        m_tf_bound.resize(n * kTfTable);
        for (size_t j = 0; j < n; ++j) {
            const posting_cursor& c = m_cursors[j];
            const double term_ub = m_bounds->term_ub[m_q.q_terms[b + j]];
            double* row = m_tf_bound.data() + j * kTfTable;
            for (uint32_t tf = 0; tf < kTfTable; ++tf) {
                double r = term_ub;
                if (m_norm_min >= 0.0f && tf > 0) {
                    r = std::min(r, static_cast<double>(tf) / (tf + static_cast<double>(m_norm_min)));
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
        const uint32_t tf = m_data.tfs[c.pos];
        return tf < kTfTable ? m_tf_bound[c.qpos * kTfTable + tf] : c.ub;
    }

    float contribution(const posting_cursor& c, uint32_t d) const {
        return contribution_at(c.weight, c.pos, d);
    }

    /// weight * (tf part of posting p, whose doc is d): from the impacts when
    /// present, else computed; both are the same float32 value.
    float contribution_at(float w, uint64_t p, uint32_t d) const {
        if (m_imp != nullptr) return w * m_imp[p];
        return bm25_contribution(w, m_data.tfs[p], m_data.doc_norm[d]);
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
    /// Pruning threshold: the heap's k-th score, or the primed lower bound
    /// while that is higher.
    float threshold() const { return std::max(m_heap.threshold(), m_theta0); }

    /// Primes the pruning threshold from the query's short, high-bound lists
    /// (taken in decreasing bound order while their postings fit in the
    /// budget): each document they hold gets the float32 query-order sum
    /// of its contributions from those lists only. With non-negative
    /// contributions such a partial sum never exceeds the document's full
    /// canonical score (float rounding is monotone), so at least k allowed
    /// documents score >= m_theta0 = the k-th best partial sum, the final k-th
    /// score is >= m_theta0, and pruning below it is safe even before the heap
    /// is full. Nothing is pushed here. Returns the initial pruning threshold.
    /// Call after open_cursors().
    float prime_threshold() {
        m_theta0 = m_theta_ext;  // safe lower bound too (single_term_threshold)
        const size_t n = m_cursors.size();
        const size_t k = m_out.k;
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
        if (m_prime_docs.size() < k) return threshold();
        std::sort(m_prime_docs.begin(), m_prime_docs.end());
        m_prime_docs.erase(std::unique(m_prime_docs.begin(), m_prime_docs.end()), m_prime_docs.end());
        if (m_prime_docs.size() < k) return threshold();
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
                if (!(v >= 0.0f)) return threshold();  // negative or NaN: no priming
                m_prime_scores[at] += v;
            }
        }
        size_t keep = 0;
        for (size_t i = 0; i < m_prime_docs.size(); ++i) {
            if (allowed(m_prime_docs[i]) && !std::isnan(m_prime_scores[i])) {
                m_prime_scores[keep++] = m_prime_scores[i];
            }
        }
        if (keep < k) return threshold();
        m_prime_scores.resize(keep);
        std::nth_element(m_prime_scores.begin(), m_prime_scores.begin() + (k - 1),
                         m_prime_scores.end(), std::greater<float>());
        m_theta0 = std::max(m_theta0, m_prime_scores[k - 1]);
        return threshold();
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
        if (m_heap.push(s, cur)) {
            const float nt = threshold();
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
        const uint32_t* tfs = m_data.tfs;
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
        {
            // Sparse essential lists (few postings per window): DAAT is cheaper.
            size_t fe0 = 0;
            while (fe0 < n && !bc.may_enter(m_prefix[fe0], thr)) ++fe0;
            uint64_t essential_postings = 0;
            for (size_t j = fe0; j < n; ++j) essential_postings += m_sorted[j]->end - m_sorted[j]->beg;
            if (essential_postings * kWindow < m_data.n_docs * kMinWindowPostings) {
                maxscore_daat_run(thr);
                return;
            }
        }
        m_win_acc.resize(kWindow, 0.0);
        m_win_mask.resize(kWindow, 0);
        m_win_live.resize(kWindow, 0);  // see m_win_epoch
        m_win_contrib.resize(n * kWindow);
        m_slot_of_qpos.resize(n);
        for (size_t j = 0; j < n; ++j) m_slot_of_qpos[m_sorted[j]->qpos] = static_cast<uint32_t>(j);
        const uint32_t* docs = m_data.csr.doc_ids;
        const uint32_t* tfs = m_data.tfs;
        const float* norm = m_data.doc_norm;
        const float* imp = m_imp;
        const size_t n_docs = m_data.n_docs;
        double* acc = m_win_acc.data();
        uint64_t* mask = m_win_mask.data();
        uint16_t* live = m_win_live.data();
        float* contrib = m_win_contrib.data();
        std::vector<uint32_t>& touched = m_win_touched;
        touched.resize(kWindow + 1);
        std::vector<uint32_t>& cand = m_win_cand;
        size_t fe = 0;

        for (;;) {
            while (fe < n && !bc.may_enter(m_prefix[fe], thr)) ++fe;
            if (fe >= n) break;
            const uint32_t ws = min_doc_from(fe);
            if (ws == kEndDoc) break;
            const uint64_t we = static_cast<uint64_t>(ws) + kWindow;
            const size_t n_ess = n - fe;
            // A new epoch makes every offset fresh: no clearing between windows.
            if (++m_win_epoch >= kEpochMark) {
                std::fill(m_win_live.begin(), m_win_live.end(), uint16_t{0});
                m_win_epoch = 1;
            }
            const uint16_t ep = m_win_epoch;
            uint32_t* touched_p = touched.data();  // kWindow + 1 entries
            size_t n_touched = 0;

            // 1. essential lists -> window accumulator
            const uint8_t* pass = nullptr;
            double imp_cut = -std::numeric_limits<double>::infinity();  // impacts: skip below
            if (n_ess == 1 && imp != nullptr) {
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
                const uint64_t bit = uint64_t{1} << j;
                float* cb = contrib + j * kWindow;
                const float w = c.weight;
                uint64_t p = c.pos;
                const uint64_t end = c.end;
                if (imp != nullptr && j == fe) {
                    // The window's first list: every offset is fresh (doc ids
                    // strictly increase within a list), so plain stores. A doc
                    // id not above the previous one (an unsorted list) raises
                    // before it could run past the window's buffers.
                    const double wd = w;
                    int64_t prev = static_cast<int64_t>(ws) - 1;
                    for (; p < end; ++p) {
                        const uint32_t d = docs[p];
                        if (d >= we) break;
                        if (__builtin_expect(static_cast<int64_t>(d) <= prev, 0)) bad_order(d);
                        prev = d;
                        const float ip = imp[p];
                        if (wd * static_cast<double>(ip) < imp_cut) continue;
                        if (d >= n_docs) check_doc(d);
                        const float v = w * ip;
                        const uint32_t off = d - ws;
                        touched_p[n_touched++] = off;
                        live[off] = ep;
                        mask[off] = bit;
                        acc[off] = v;
                        cb[off] = v;
                    }
                    c.pos = p;
                    c.refresh();
                    continue;
                }
                if (imp != nullptr) {
                    const double wd = w;
                    for (; p < end; ++p) {
                        const uint32_t d = docs[p];
                        if (d >= we) break;
                        const float ip = imp[p];
                        if (wd * static_cast<double>(ip) < imp_cut) continue;
                        if (d >= n_docs) check_doc(d);
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
                    c.refresh();
                    continue;
                }
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
                    if (d >= n_docs) check_doc(d);
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
                c.refresh();
            }

            // Candidates: touched docs that can still reach thr with every
            // non-essential list added (thr only rises, so this filter never
            // drops a doc the later checks would keep), with their running
            // sums in ca[] beside them (dense, so the per-list filters below
            // read no window array). Put in doc order only when a
            // non-essential list will be probed by seeking or merging (its
            // cursor only moves forward); bitmap probes take any order, and
            // the heap's result does not depend on the order of pushes. Few
            // survivors are sorted; many are collected from a window bitmap.
            bool ordered_probes = false;
            for (size_t j = 0; j < fe; ++j) ordered_probes |= m_sorted[j]->bits == nullptr;
            std::vector<double>& cav = m_cand_acc;
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
            if (m_allow != nullptr) {
                size_t keep = 0;
                for (size_t i = 0; i < cand.size(); ++i) {
                    const uint32_t off = cand[i];
                    cand[keep] = off;
                    cav[keep] = cav[i];
                    keep += m_allow[ws + off] != 0;
                }
                cand.resize(keep);
                cav.resize(keep);
            }

            // 2. non-essential lists, highest bound first
            for (size_t j = fe; j-- > 0 && !cand.empty();) {
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
                posting_cursor& c = *m_sorted[j];
                const uint64_t bit = uint64_t{1} << j;
                float* cb = contrib + j * kWindow;
                const float w = c.weight;
                double* ca = cav.data();
                const size_t nc = cand.size();
                if (c.bits != nullptr) {
                    // O(1) probes of the list's bitmap: no cursor state, so the
                    // candidates' impact loads do not wait on one another
                    m_probe_pos.resize(nc);
                    uint64_t* pp = m_probe_pos.data();
                    const size_t ok = bitmap_positions(c.bits, c.rank, c.beg, c.end, cand.data(), nc, ws,
                                                       imp != nullptr ? imp : reinterpret_cast<const float*>(tfs), pp);
                    if (ok < nc) bad_bitmap(ws + cand[ok]);
                    for (size_t i = 0; i < nc; ++i) {
                        if (pp[i] == kNoPos) continue;
                        const uint32_t off = cand[i];
                        const float v = contribution_at(w, pp[i], ws + off);
                        mask[off] |= bit;
                        ca[i] += v;
                        cb[off] = v;
                    }
                    continue;
                }
                const uint32_t first = ws + cand.front();
                const uint32_t last = ws + cand.back();
                c.seek(first);
                const double list_density =
                    static_cast<double>(c.end - c.beg) / static_cast<double>(n_docs);
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
                        const float v = contribution_at(w, p, d);
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
                            const float v = contribution_at(w, c.pos, d);
                            mask[off] |= bit;
                            ca[i] += v;
                            cb[off] = v;
                        }
                    }
                }
            }

            // 3. canonical scores of the survivors
            for (size_t i = 0; i < cand.size(); ++i) {
                if (cav[i] < bc.cut(0.0, thr)) continue;
                const uint32_t off = cand[i];
                const uint64_t mk = mask[off];
                float score = 0.0f;
                for (size_t q = 0; q < n; ++q) {
                    const uint32_t slot = m_slot_of_qpos[q];
                    if (mk & (uint64_t{1} << slot)) score += contrib[slot * kWindow + off];
                }
                if (m_heap.push(score, ws + off)) thr = threshold();
            }
        }
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
        const float* norm = m_data.doc_norm;
        size_t fe = 0;  // first essential list in m_sorted
        while (fe < n && !bc.may_enter(m_prefix[fe], thr)) ++fe;
        m_pass_fe = n;  // invalidates the tf pass table
        uint32_t cur = min_doc_from(fe);
        while (fe < n && cur != kEndDoc) {
            if (fe == n - 1) {
                cur = scan_single_essential(fe, thr, bc);
                if (cur == kEndDoc) break;
            }
            check_doc(cur);
            // List-level bound of cur: the essential lists holding it plus all
            // non-essential lists. Checked before doc_norm[cur] is read.
            double cand_bound = fe > 0 ? m_prefix[fe - 1] : 0.0;
            for (size_t j = fe; j < n; ++j) {
                if (m_sorted[j]->doc == cur) cand_bound += tf_bound(*m_sorted[j]);
            }
            if (!allowed(cur) || !bc.may_enter(cand_bound, thr)) {
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
                    if (m_imp == nullptr) prefetch_norm(c, norm);
                }
            }
            const bool keep = complete_non_essential(cur, fe, partial, thr, bc);
            thr = finish_candidate(cur, keep, fe, thr, bc);
            cur = min_doc_from(fe);
        }
    }

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
        const float* norm = m_data.doc_norm;
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

    // ---- Block-Max WAND ---------------------------------------------------
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
                        if (m_heap.push(s, pivot)) thr = threshold();
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

    const bm25_view& m_data;
    const bm25_bounds_view* m_bounds;
    const query_batch_view& m_q;
    const uint8_t* m_allow;
    bm25_algorithm m_algo;
    const topk_out& m_out;

    topk_heap m_heap;
    accumulator_lease m_acc;
    std::vector<posting_cursor> m_cursors;
    std::vector<posting_cursor*> m_sorted;
    std::vector<float> m_contrib;
    std::vector<double> m_prefix;
    std::vector<double> m_tf_bound;  // n * kTfTable
    float m_theta0 = -std::numeric_limits<float>::infinity();  // primed threshold
    float m_theta_ext = -std::numeric_limits<float>::infinity();  // single_term_threshold
    std::vector<uint32_t> m_prime_order;
    std::vector<uint32_t> m_prime_docs;
    std::vector<uint8_t> m_prime_use;
    std::vector<float> m_prime_scores;
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
    uint8_t m_pass[kTfTable] = {};     // tf -> may reach thr (single essential list)
    float m_pass_thr = 0.0f;
    size_t m_pass_fe = 0;
    std::vector<float> m_block_max;  // exhaustive_dense scratch
    std::vector<float> m_block_tmp;
    std::vector<float> m_group_max;  // exhaustive_dense scratch
    // select_ranked scratch (8 floats of padding after the candidates)
    alignas(32) float m_cand_score[kCountMax + 8];
    uint32_t m_cand_doc[kCountMax];
    alignas(32) int32_t m_cand_rank[kCountMax + 8];
    const float* m_imp;  // precomputed impacts or null
    float m_norm_min;
    // "auto": exhaustive up to this many postings per query; with computed
    // (not precomputed) contributions the crossover is lower.
    uint64_t m_auto_limit = m_imp != nullptr ? kAutoExhaustivePostings : kAutoExhaustivePostings / 4;
};

// ---------------------------------------------------------------------------
// Impact worker: exhaustive term-at-a-time, templated over the stored impact
// type and its decoding so a quantised (uint8 + scale) variant is one more
// instantiation.
// ---------------------------------------------------------------------------

struct decode_f32 {
    float operator()(float v) const { return v; }
};

template <class Impact, class Decode>
class impact_worker {
  public:
    impact_worker(const csr_view& csr, const Impact* impacts, Decode decode,
                  const query_batch_view& q, const uint8_t* allow, size_t allow_len,
                  const topk_out& out)
        : m_csr(csr), m_impacts(impacts), m_decode(decode), m_q(q), m_allow(allow),
          m_allow_len(allow_len), m_out(out) {}

    void operator()(size_t qi) {
        const uint64_t b = m_q.q_offsets[qi];
        const uint64_t e = m_q.q_offsets[qi + 1];
        m_heap.reset(m_out.k);
        if (e > b) {
            dense_accumulator& A = m_acc.get();
            for (uint64_t i = b; i < e; ++i) {
                const uint32_t t = m_q.q_terms[i];
                const float w = m_q.q_weights[i];
                const uint64_t pe = m_csr.offsets[t + 1];
                for (uint64_t p = m_csr.offsets[t]; p < pe; ++p) {
                    const uint32_t d = m_csr.doc_ids[p];
                    if (d >= A.acc.size()) grow(A, d);
                    if (!A.seen[d]) {
                        A.seen[d] = 1;
                        A.touched.push_back(d);
                    }
                    A.acc[d] += w * m_decode(m_impacts[p]);
                }
            }
            for (uint32_t d : A.touched) {
                if (m_allow != nullptr) {
                    if (d >= m_allow_len) {
                        fail("doc_ids contains doc id " + std::to_string(d) +
                             " >= len(allow) = " + std::to_string(m_allow_len));
                    }
                    if (!m_allow[d]) continue;
                }
                m_heap.push(A.acc[d], d);
            }
            A.clear_touched();
        }
        m_out.n_found[qi] = m_heap.finalize(m_out.ids + qi * m_out.k, m_out.scores + qi * m_out.k);
    }

  private:
    static void grow(dense_accumulator& A, uint32_t d) {
        if (static_cast<uint64_t>(d) >= kMaxDocs) {
            fail("doc_ids contains doc id " + std::to_string(d) + ", above the supported maximum");
        }
        size_t want = std::max<size_t>(static_cast<size_t>(d) + 1, A.acc.size() + A.acc.size() / 2);
        want = std::min<size_t>(want, static_cast<size_t>(kMaxDocs));
        A.ensure(want);
    }

    const csr_view& m_csr;
    const Impact* m_impacts;
    Decode m_decode;
    const query_batch_view& m_q;
    const uint8_t* m_allow;
    size_t m_allow_len;
    const topk_out& m_out;
    topk_heap m_heap;
    accumulator_lease m_acc;
};

size_t query_chunk(size_t nq, int n_threads) {
    const size_t t = resolve_threads(n_threads, nq);
    return std::max<size_t>(1, std::min<size_t>(16, nq / (32 * t)));
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------

bm25_algorithm parse_bm25_algorithm(const std::string& name) {
    if (name == "exhaustive") return bm25_algorithm::exhaustive;
    if (name == "maxscore") return bm25_algorithm::maxscore;
    if (name == "bmw") return bm25_algorithm::block_max_wand;
    if (name == "bmm") return bm25_algorithm::block_max_maxscore;
    if (name == "auto") return bm25_algorithm::automatic;
    fail("algorithm must be one of 'auto', 'exhaustive', 'maxscore', 'bmw', 'bmm'; got '" + name + "'");
}

void check_csr(const csr_view& csr, uint64_t n_docs) {
    if (n_docs > kMaxDocs) {
        fail("n_docs = " + std::to_string(n_docs) + " exceeds the supported maximum " +
             std::to_string(kMaxDocs));
    }
    const uint64_t* off = csr.offsets;
    if (off[0] != 0) fail("offsets[0] must be 0, got " + std::to_string(off[0]));
    for (size_t t = 0; t < csr.n_terms; ++t) {
        if (off[t + 1] < off[t]) {
            fail("offsets must be non-decreasing: offsets[" + std::to_string(t + 1) + "] = " +
                 std::to_string(off[t + 1]) + " < offsets[" + std::to_string(t) +
                 "] = " + std::to_string(off[t]));
        }
    }
    if (off[csr.n_terms] != csr.nnz) {
        fail("offsets[-1] = " + std::to_string(off[csr.n_terms]) + " != len(doc_ids) = " +
             std::to_string(csr.nnz));
    }
    for (size_t t = 0; t < csr.n_terms; ++t) {
        const uint64_t b = off[t], e = off[t + 1];
        for (uint64_t p = b; p < e; ++p) {
            const uint32_t d = csr.doc_ids[p];
            if (d >= n_docs) {
                fail("doc_ids[" + std::to_string(p) + "] = " + std::to_string(d) + " (term " +
                     std::to_string(t) + ") >= n_docs = " + std::to_string(n_docs));
            }
            if (p > b && d <= csr.doc_ids[p - 1]) {
                fail("doc_ids of term " + std::to_string(t) + " must be strictly increasing: doc_ids[" +
                     std::to_string(p) + "] = " + std::to_string(d) + " <= doc_ids[" +
                     std::to_string(p - 1) + "] = " + std::to_string(csr.doc_ids[p - 1]));
            }
        }
    }
}

void check_query_batch(const query_batch_view& q, size_t n_terms) {
    if (q.q_offsets[0] != 0) fail("q_offsets[0] must be 0, got " + std::to_string(q.q_offsets[0]));
    for (size_t i = 0; i < q.nq; ++i) {
        if (q.q_offsets[i + 1] < q.q_offsets[i]) {
            fail("q_offsets must be non-decreasing: q_offsets[" + std::to_string(i + 1) + "] = " +
                 std::to_string(q.q_offsets[i + 1]) + " < q_offsets[" + std::to_string(i) +
                 "] = " + std::to_string(q.q_offsets[i]));
        }
    }
    if (q.q_offsets[q.nq] != q.m) {
        fail("q_offsets[-1] = " + std::to_string(q.q_offsets[q.nq]) + " != len(q_terms) = " +
             std::to_string(q.m));
    }
    for (size_t i = 0; i < q.m; ++i) {
        if (q.q_terms[i] >= n_terms) {
            fail("q_terms[" + std::to_string(i) + "] = " + std::to_string(q.q_terms[i]) +
                 " is out of range: n_terms = " + std::to_string(n_terms));
        }
        if (!std::isfinite(q.q_weights[i])) {
            fail("q_weights[" + std::to_string(i) + "] = " + std::to_string(q.q_weights[i]) +
                 " is not finite");
        }
    }
}

void check_bounds_for_queries(const csr_view& csr, const bm25_bounds_view& b,
                              const query_batch_view& q) {
    if (b.block_offsets != nullptr && b.block_size == 0) fail("block_size must be >= 1, got 0");
    for (size_t i = 0; i < q.m; ++i) {
        const uint32_t t = q.q_terms[i];
        const float ub = b.term_ub[t];
        if (!(ub >= 0.0f) || !std::isfinite(ub)) {
            fail("term_ub[" + std::to_string(t) + "] = " + std::to_string(ub) +
                 " must be finite and >= 0 (compute it with bm25_upper_bounds)");
        }
        if (b.term_kth != nullptr) {
            const float v = b.term_kth[t];
            if (!(v == -std::numeric_limits<float>::infinity() || (v >= 0.0f && v <= ub))) {
                fail("term_kth[" + std::to_string(t) + "] = " + std::to_string(v) +
                     " must be -inf or in [0, term_ub[t] = " + std::to_string(ub) +
                     "] (compute it with bm25_term_kth)");
            }
        }
        if (b.dense_slot != nullptr) {
            const int32_t r = b.dense_slot[t];
            if (r < -1 || (r >= 0 && static_cast<size_t>(r) >= b.dense_rows)) {
                fail("dense_slot[" + std::to_string(t) + "] = " + std::to_string(r) + " is not -1 or a row of " +
                     "dense_bits (" + std::to_string(b.dense_rows) + " rows; compute them with bm25_dense_bitmaps)");
            }
        }
        if (b.block_offsets == nullptr) continue;
        const uint64_t b0 = b.block_offsets[t], b1 = b.block_offsets[t + 1];
        const uint64_t len = csr.offsets[t + 1] - csr.offsets[t];
        const uint64_t want = (len + b.block_size - 1) / b.block_size;
        if (b1 < b0 || b1 - b0 != want || b1 > b.n_blocks) {
            fail("block_offsets[" + std::to_string(t) + ":" + std::to_string(t + 2) + "] = [" +
                 std::to_string(b0) + ", " + std::to_string(b1) + "] do not match term " +
                 std::to_string(t) + " with " + std::to_string(len) + " postings, block_size " +
                 std::to_string(b.block_size) + " and len(block_ub) = " +
                 std::to_string(b.n_blocks) + " (compute them with bm25_upper_bounds)");
        }
    }
}

size_t bm25_impact_rows(const csr_view& csr, const float* impacts, size_t n_docs, uint64_t min_df,
                        size_t max_rows, int32_t* slot, float* rows, int n_threads) {
    if (min_df == 0) fail("min_df must be >= 1");
    if (max_rows > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
        fail("max_rows must be < 2**31, got " + std::to_string(max_rows));
    }
    // the max_rows longest lists reaching min_df (equal lengths: smaller term id first), rows in term order
    std::vector<uint32_t> terms;
    for (size_t t = 0; t < csr.n_terms; ++t) {
        slot[t] = -1;
        if (csr.offsets[t + 1] - csr.offsets[t] >= min_df) terms.push_back(static_cast<uint32_t>(t));
    }
    if (terms.size() > max_rows) {
        const auto longer = [&](uint32_t a, uint32_t b) {
            const uint64_t la = csr.offsets[a + 1] - csr.offsets[a], lb = csr.offsets[b + 1] - csr.offsets[b];
            return la != lb ? la > lb : a < b;
        };
        std::nth_element(terms.begin(), terms.begin() + static_cast<std::ptrdiff_t>(max_rows), terms.end(), longer);
        terms.resize(max_rows);
        std::sort(terms.begin(), terms.end());
    }
    for (size_t i = 0; i < terms.size(); ++i) slot[terms[i]] = static_cast<int32_t>(i);
    if (rows == nullptr) return terms.size();
    parallel_for_items(terms.size(), n_threads, 1, [&]() {
        return [&](size_t i) {
            const uint32_t t = terms[i];
            float* row = rows + i * n_docs;
            std::fill(row, row + n_docs, 0.0f);
            for (uint64_t p = csr.offsets[t]; p < csr.offsets[t + 1]; ++p) {
                const uint32_t d = csr.doc_ids[p];
                if (d >= n_docs) {
                    fail("doc_ids[" + std::to_string(p) + "] = " + std::to_string(d) + " >= n_docs = " +
                         std::to_string(n_docs));
                }
                row[d] = impacts[p];
            }
        };
    });
    return terms.size();
}

size_t bm25_dense_bitmaps(const csr_view& csr, size_t n_docs, uint64_t min_df, int32_t* slot,
                          uint64_t* bits, uint32_t* rank, int n_threads) {
    if (min_df == 0) fail("min_df must be >= 1");
    size_t rows = 0;
    for (size_t t = 0; t < csr.n_terms; ++t) {
        const bool dense = csr.offsets[t + 1] - csr.offsets[t] >= min_df;
        if (dense && rows >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
            fail("more than 2**31 - 1 lists reach min_df = " + std::to_string(min_df));
        }
        slot[t] = dense ? static_cast<int32_t>(rows++) : -1;
    }
    if (bits == nullptr) return rows;
    const size_t words = (n_docs + 63) / 64;
    std::vector<uint32_t> terms;
    terms.reserve(rows);
    for (size_t t = 0; t < csr.n_terms; ++t) {
        if (slot[t] >= 0) terms.push_back(static_cast<uint32_t>(t));
    }
    parallel_for_items(terms.size(), n_threads, 1, [&]() {
        return [&](size_t i) {
            const uint32_t t = terms[i];
            uint64_t* b = bits + static_cast<size_t>(slot[t]) * words;
            uint32_t* r = rank + static_cast<size_t>(slot[t]) * words;
            std::memset(b, 0, words * sizeof(uint64_t));
            for (uint64_t p = csr.offsets[t]; p < csr.offsets[t + 1]; ++p) {
                const uint32_t d = csr.doc_ids[p];
                if (d >= n_docs) {
                    fail("doc_ids[" + std::to_string(p) + "] = " + std::to_string(d) + " >= n_docs = " +
                         std::to_string(n_docs));
                }
                b[d >> 6] |= uint64_t{1} << (d & 63u);
            }
            uint32_t before = 0;
            for (size_t w = 0; w < words; ++w) {
                r[w] = before;
                before += static_cast<uint32_t>(__builtin_popcountll(b[w]));
            }
        };
    });
    return rows;
}

uint64_t bm25_block_offsets(const csr_view& csr, uint32_t block_size, uint64_t* block_offsets) {
    if (block_size == 0) fail("block_size must be >= 1, got 0");
    uint64_t total = 0;
    for (size_t t = 0; t < csr.n_terms; ++t) {
        block_offsets[t] = total;
        const uint64_t len = csr.offsets[t + 1] - csr.offsets[t];
        total += (len + block_size - 1) / block_size;
    }
    block_offsets[csr.n_terms] = total;
    return total;
}

void bm25_upper_bounds(const bm25_view& data, uint32_t block_size, const uint64_t* block_offsets,
                       int n_threads, float* term_ub, float* block_ub) {
    if (block_size == 0) fail("block_size must be >= 1, got 0");
    for (size_t d = 0; d < data.n_docs; ++d) {
        const float v = data.doc_norm[d];
        if (!(v >= 0.0f) || !std::isfinite(v)) {
            fail("doc_norm[" + std::to_string(d) + "] = " + std::to_string(v) +
                 " must be finite and >= 0");
        }
    }
    const size_t n_docs = data.n_docs;
    auto make_worker = [&]() {
        return [&](size_t t) {
            const uint64_t b = data.csr.offsets[t], e = data.csr.offsets[t + 1];
            float tmax = 0.0f;
            uint64_t blk = block_offsets[t];
            for (uint64_t s = b; s < e; s += block_size, ++blk) {
                const uint64_t se = std::min<uint64_t>(e, s + block_size);
                float bmax = 0.0f;
                for (uint64_t p = s; p < se; ++p) {
                    const uint32_t d = data.csr.doc_ids[p];
                    if (d >= n_docs) {
                        fail("doc_ids[" + std::to_string(p) + "] = " + std::to_string(d) +
                             " >= n_docs = " + std::to_string(n_docs));
                    }
                    bmax = std::max(bmax, bm25_tf_part(data.tfs[p], data.doc_norm[d]));
                }
                block_ub[blk] = bmax;
                tmax = std::max(tmax, bmax);
            }
            term_ub[t] = tmax;
        };
    };
    parallel_for_items(data.csr.n_terms, n_threads, 256, make_worker);
}

void bm25_impacts(const bm25_view& data, int n_threads, float* impacts) {
    const size_t n_docs = data.n_docs;
    auto make_worker = [&]() {
        return [&](size_t t) {
            const uint64_t b = data.csr.offsets[t], e = data.csr.offsets[t + 1];
            for (uint64_t p = b; p < e; ++p) {
                const uint32_t d = data.csr.doc_ids[p];
                if (d >= n_docs) {
                    fail("doc_ids[" + std::to_string(p) + "] = " + std::to_string(d) +
                         " >= n_docs = " + std::to_string(n_docs));
                }
                impacts[p] = bm25_tf_part(data.tfs[p], data.doc_norm[d]);
            }
        };
    };
    parallel_for_items(data.csr.n_terms, n_threads, 256, make_worker);
}

void bm25_term_kth(const bm25_view& data, const bm25_bounds_view* bounds, const uint32_t* terms,
                   size_t n, size_t depth, int n_threads, float* out) {
    if (depth == 0) fail("depth must be >= 1, got 0");
    for (size_t i = 0; i < n; ++i) {
        if (terms[i] >= data.csr.n_terms) {
            fail("terms[" + std::to_string(i) + "] = " + std::to_string(terms[i]) +
                 " >= n_terms = " + std::to_string(data.csr.n_terms));
        }
    }
    const bool blocks = bounds != nullptr && bounds->block_offsets != nullptr &&
                        bounds->block_ub != nullptr && bounds->block_size > 0;
    const size_t n_docs = data.n_docs;
    auto make_worker = [&]() {
        std::vector<float> heap;  // min-heap of the depth largest values so far
        return [&, heap](size_t i) mutable {
            const uint32_t t = terms[i];
            const uint64_t b = data.csr.offsets[t], e = data.csr.offsets[t + 1];
            if (e - b < depth) {
                out[i] = -std::numeric_limits<float>::infinity();
                return;
            }
            heap.clear();
            bool ok = true;  // false after a negative or NaN value: no bound for t
            const uint64_t bs = blocks ? bounds->block_size : (e - b);
            uint64_t blk = blocks ? bounds->block_offsets[t] : 0;
            for (uint64_t s = b; ok && s < e; s += bs, ++blk) {
                // a block whose maximum is not above the current depth-th
                // value cannot change it
                if (blocks && heap.size() == depth && !(bounds->block_ub[blk] > heap.front())) continue;
                const uint64_t se = std::min<uint64_t>(e, s + bs);
                for (uint64_t p = s; p < se; ++p) {
                    float v;
                    if (data.impacts != nullptr) {
                        v = data.impacts[p];
                    } else {
                        const uint32_t d = data.csr.doc_ids[p];
                        if (d >= n_docs) {
                            fail("doc_ids[" + std::to_string(p) + "] = " + std::to_string(d) +
                                 " >= n_docs = " + std::to_string(n_docs));
                        }
                        v = bm25_tf_part(data.tfs[p], data.doc_norm[d]);
                    }
                    if (!(v >= 0.0f)) {
                        ok = false;
                        break;
                    }
                    if (heap.size() < depth) {
                        heap.push_back(v);
                        std::push_heap(heap.begin(), heap.end(), std::greater<float>());
                    } else if (v > heap.front()) {
                        std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
                        heap.back() = v;
                        std::push_heap(heap.begin(), heap.end(), std::greater<float>());
                    }
                }
            }
            out[i] = ok ? heap.front() : -std::numeric_limits<float>::infinity();
        };
    };
    parallel_for_items(n, n_threads, 16, make_worker);
}

int set_bm25_scatter_impl(int impl) {
    if (impl < 0 || impl > 3) {
        fail("impl must be 0 (best for this CPU), 1 (scalar), 2 (AVX2) or 3 (AVX-512), got " + std::to_string(impl));
    }
#if defined(RETRIEVER_AVX512_SCATTER)
    const bool ok = impl < 2 || (impl == 2 ? kHaveAvx2 : kHaveAvx512);
#else
    const bool ok = impl < 2;
#endif
    if (!ok) fail("scatter impl " + std::to_string(impl) + " is not supported on this CPU");
    return g_scatter_impl.exchange(impl);
}

void bm25_topk(const bm25_view& data, const bm25_bounds_view* bounds,
               const query_batch_view& queries, const uint8_t* allow, bm25_algorithm algorithm,
               int n_threads, const topk_out& out) {
    if (algorithm != bm25_algorithm::exhaustive && bounds == nullptr) {
        fail("term_ub, block_offsets and block_ub are required for pruning algorithms");
    }
    // min(doc_norm) gives every posting a bound from its tf alone,
    // tf / (tf + norm_min), checked before doc_norm[d] is read. Worth its
    // O(n_docs) pass only for batches; results never depend on it.
    float norm_min = -1.0f;
    if (algorithm != bm25_algorithm::exhaustive && data.impacts == nullptr && data.n_docs > 0 &&
        queries.nq * 4096 >= data.n_docs) {
        float mn = std::numeric_limits<float>::infinity();
        bool ok = true;
        for (size_t d = 0; d < data.n_docs; ++d) {
            const float v = data.doc_norm[d];
            ok &= (v >= 0.0f);  // false for NaN too
            mn = std::min(mn, v);
        }
        if (ok && std::isfinite(mn)) norm_min = mn;
    }
    parallel_for_items(queries.nq, n_threads, query_chunk(queries.nq, n_threads), [&]() {
        return bm25_worker(data, bounds, queries, allow, algorithm, out, norm_min);
    });
}

void bm25_topk_text(const uint8_t* text, size_t text_len, const int64_t* text_offsets, size_t nq,
                    const token_table_view& table, const char_tables_view& chars, const float* idf, size_t n_idf,
                    const bm25_view& data, const uint8_t* allow, int n_threads, const topk_out& out,
                    uint8_t* status, const std::function<void(const query_batch_view&)>& check) {
    try {
        check_query_texts(text_len, text_offsets, nq, table);
    } catch (const std::invalid_argument& e) {
        fail(std::string("text ") + e.what());  // "text offsets[...]" (the postings have theirs)
    }
    // One per thread: analyses a query into its own buffers, checks them and
    // scores them at once (the query's terms are still in cache).
    struct fused_worker {
        fused_worker(const uint8_t* text, const int64_t* text_offsets, const token_table_view& table,
                     const char_tables_view& chars, const float* idf, size_t n_idf, const bm25_view& data,
                     const uint8_t* allow, const topk_out& out, uint8_t* status,
                     const std::function<void(const query_batch_view&)>& check)
            : analyzer(text, text_offsets, table, chars, idf, n_idf),
              view(std::make_unique<query_batch_view>()),
              scorer(data, nullptr, *view, allow, bm25_algorithm::exhaustive, out, -1.0f),
              status(status), check(check) {}

        void operator()(size_t q) {
            const bool ok = analyzer.analyse(q, terms, weights);
            status[q] = ok ? 0 : 1;
            offsets[1] = terms.size();
            view->q_offsets = offsets;
            view->nq = 1;
            view->q_terms = terms.data();
            view->q_weights = weights.data();
            view->m = terms.size();
            check(*view);
            scorer.run(q, 0, view->m);
        }

        query_analyzer analyzer;
        std::vector<uint32_t> terms;
        std::vector<float> weights;
        uint64_t offsets[2] = {0, 0};
        std::unique_ptr<query_batch_view> view;  // scorer reads it by reference: a stable address
        bm25_worker scorer;
        uint8_t* status;
        const std::function<void(const query_batch_view&)>& check;
    };
    parallel_for_items(nq, n_threads, query_chunk(nq, n_threads), [&]() {
        return fused_worker(text, text_offsets, table, chars, idf, n_idf, data, allow, out, status, check);
    });
}

void impact_topk_f32(const csr_view& csr, const float* impacts, const query_batch_view& queries,
                     const uint8_t* allow, size_t allow_len, int n_threads, const topk_out& out) {
    parallel_for_items(queries.nq, n_threads, query_chunk(queries.nq, n_threads), [&]() {
        return impact_worker<float, decode_f32>(csr, impacts, decode_f32{}, queries, allow,
                                                allow_len, out);
    });
}

}  // namespace retriever
