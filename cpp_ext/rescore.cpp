// Exact full-dimension re-scoring of funnel-search shortlists; see rescore.hpp.
#include "rescore.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel.hpp"
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif
#include "topk.hpp"

// AVX2 clones (target_clones) are chosen at load time where the CPU has them.
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define RETRIEVER_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define RETRIEVER_CLONES
#endif

namespace retriever {

namespace {

constexpr size_t kLanes = 8;
constexpr size_t kPrefetchAhead = 4;

/// IEEE binary16 -> binary32, exact for finite values (stored vectors are checked finite at
/// open); branch-free so the compiler can vectorise it.
inline float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    // normal numbers: rebias the exponent (15 -> 127) and widen the mantissa.
    uint32_t bits = (em << 13) + 0x38000000u;
    float normal;
    std::memcpy(&normal, &bits, sizeof normal);
    // zero and subnormals: em * 2^-24 (exact: em < 1024).
    const float sub = static_cast<float>(em) * 5.9604644775390625e-8f;
    float mag = em < 0x400u ? sub : normal;
    uint32_t out;
    std::memcpy(&out, &mag, sizeof out);
    out |= sign;
    float f;
    std::memcpy(&f, &out, sizeof f);
    return f;
}

/// Fixed-order float64 dot product of two float32 vectors (order: see rescore.hpp).
inline float dot_fixed(const float* q, const float* v, size_t d) {
    double acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + kLanes <= d; i += kLanes) {
        for (size_t j = 0; j < kLanes; ++j) {
            acc[j] += static_cast<double>(q[i + j]) * static_cast<double>(v[i + j]);
        }
    }
    for (size_t j = 0; i + j < d; ++j) {
        acc[j] += static_cast<double>(q[i + j]) * static_cast<double>(v[i + j]);
    }
    return static_cast<float>(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
}

}  // namespace

void check_candidates(const candidate_view& c, size_t n) {
    const size_t total = c.nq * c.kk;
    for (size_t p = 0; p < total; ++p) {
        const int64_t id = c.cand[p];
        if (id < -1 || (id >= 0 && static_cast<uint64_t>(id) >= n)) {
            throw std::invalid_argument("candidates[" + std::to_string(p / c.kk) + ", " +
                                        std::to_string(p % c.kk) + "] = " + std::to_string(id) +
                                        " is outside [-1, n_rows = " + std::to_string(n) + ")");
        }
    }
}

// The AVX2 clones are chosen at load time where the CPU has them (same operations in the same
// order: the lanes are explicit and -ffp-contract=off forbids fused multiply-adds, so every
// clone returns bit-identical scores).

static void half_row_to_float_portable(const uint16_t* v, size_t d, float* out) {
    for (size_t i = 0; i < d; ++i) out[i] = half_to_float(v[i]);
}

#if defined(__GNUC__) && defined(__x86_64__)
// F16C conversion (vcvtph2ps) where the CPU has it: exact, so equal to the portable version.
__attribute__((target("avx,f16c"))) static void half_row_to_float_f16c(const uint16_t* v, size_t d,
                                                                        float* out) {
    size_t i = 0;
    for (; i + 8 <= d; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i));
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    for (; i < d; ++i) out[i] = half_to_float(v[i]);
}

static bool cpu_has_f16c() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}

static void half_row_to_float(const uint16_t* v, size_t d, float* out) {
    static const bool f16c = cpu_has_f16c();
    if (f16c) {
        half_row_to_float_f16c(v, d, out);
    } else {
        half_row_to_float_portable(v, d, out);
    }
}
#else
static void half_row_to_float(const uint16_t* v, size_t d, float* out) {
    half_row_to_float_portable(v, d, out);
}
#endif

RETRIEVER_CLONES
static float dot_clone(const float* q, const float* v, size_t d) { return dot_fixed(q, v, d); }

float dense_dot(const float* q, const dense_matrix_view& m, size_t row, float* scratch) {
    const size_t d = m.d;
    if (m.f16 != nullptr) {
        half_row_to_float(m.f16 + row * d, d, scratch);
        return dot_clone(q, scratch, d);
    }
    return dot_clone(q, m.f32 + row * d, d);
}

#if defined(__GNUC__) && defined(__x86_64__)
#define RETRIEVER_HAVE_AVX512_RESCORE 1
namespace {

constexpr size_t kRows = 4;  // candidate rows scored together (independent accumulators)

/// 8 stored coordinates [i, i + 8) of a row as float64 (exact).
__attribute__((target("avx512f,f16c"))) inline __m512d load8_pd(const dense_matrix_view& m, size_t row,
                                                                size_t i) {
    if (m.f16 != nullptr) {
        return _mm512_cvtps_pd(
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m.f16 + row * m.d + i))));
    }
    return _mm512_cvtps_pd(_mm256_loadu_ps(m.f32 + row * m.d + i));
}

/// Lane sums ((0+1)+(2+3))+((4+5)+(6+7)) rounded to float32 (the order of dot_fixed).
__attribute__((target("avx512f"))) inline float combine_lanes(__m512d acc) {
    alignas(64) double l[8];
    _mm512_store_pd(l, acc);
    return static_cast<float>(((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])));
}

/// Scores of nr <= kRows candidate rows against one query, bit-identical to dot_fixed: lane j of
/// one zmm register accumulates coordinates i with i % 8 == j in increasing i, as dot_fixed's
/// acc[j]. A fused multiply-add equals dot_fixed's separate multiply and add because the product
/// of two float32 values is exact in float64. The last d % 8 coordinates are scored from
/// zero-padded copies: the padding lanes add +0.0, which leaves a lane unchanged (a lane is never
/// -0.0: it starts at +0.0 and a round-to-nearest sum is -0.0 only when both terms are).
/// qd: the query as float64 (d values).
__attribute__((target("avx512f,f16c"))) void dots_avx512(const double* qd, const dense_matrix_view& m,
                                                        const size_t* rows, size_t nr, float* out) {
    const size_t d = m.d, full = d / 8 * 8;
    __m512d acc[kRows];
    for (size_t r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_pd();
    if (nr == kRows) {
        const size_t r0 = rows[0], r1 = rows[1], r2 = rows[2], r3 = rows[3];
        __m512d a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
        for (size_t i = 0; i < full; i += 8) {
            const __m512d qv = _mm512_loadu_pd(qd + i);
            a0 = _mm512_fmadd_pd(qv, load8_pd(m, r0, i), a0);
            a1 = _mm512_fmadd_pd(qv, load8_pd(m, r1, i), a1);
            a2 = _mm512_fmadd_pd(qv, load8_pd(m, r2, i), a2);
            a3 = _mm512_fmadd_pd(qv, load8_pd(m, r3, i), a3);
        }
        acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
    } else {
        for (size_t r = 0; r < nr; ++r) {
            __m512d a = acc[r];
            for (size_t i = 0; i < full; i += 8) a = _mm512_fmadd_pd(_mm512_loadu_pd(qd + i), load8_pd(m, rows[r], i), a);
            acc[r] = a;
        }
    }
    if (full < d) {
        alignas(64) double qt[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (size_t i = full; i < d; ++i) qt[i - full] = qd[i];
        const __m512d qv = _mm512_load_pd(qt);
        for (size_t r = 0; r < nr; ++r) {
            alignas(64) double vt[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (size_t i = full; i < d; ++i) {
                vt[i - full] = m.f16 != nullptr ? static_cast<double>(half_to_float(m.f16[rows[r] * d + i]))
                                                : static_cast<double>(m.f32[rows[r] * d + i]);
            }
            acc[r] = _mm512_fmadd_pd(qv, _mm512_load_pd(vt), acc[r]);
        }
    }
    for (size_t r = 0; r < nr; ++r) out[r] = combine_lanes(acc[r]);
}

bool cpu_has_avx512_rescore() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c");
}

}  // namespace
#else
#define RETRIEVER_HAVE_AVX512_RESCORE 0
#endif

bool rescore_has_avx512() {
#if RETRIEVER_HAVE_AVX512_RESCORE
    static const bool ok = cpu_has_avx512_rescore();
    return ok;
#else
    return false;
#endif
}

void rescore_topk(const float* q, const dense_matrix_view& m, const candidate_view& c, int64_t base,
                  int n_threads, const topk_out& out, rescore_impl impl) {
    const size_t k = out.k;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    if (impl == rescore_impl::avx512 && !rescore_has_avx512()) {
        throw std::invalid_argument("impl = 'avx512' but this CPU has no AVX-512F / F16C");
    }
    // best k of a query's scored candidates, sorted (score desc, id asc), padded with -1 / -inf
    auto finish = [&](size_t qi, std::vector<scored_doc>& buf) {
        // a NaN score (NaN in the query or the stored row) has no rank: dropped, so the
        // ordering below (ranks_before needs no NaN) and n_found stay meaningful
        buf.erase(std::remove_if(buf.begin(), buf.end(), [](const scored_doc& x) { return std::isnan(x.score); }),
                  buf.end());
        const size_t keep = std::min(k, buf.size());
        std::partial_sort(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(keep), buf.end(),
                          ranks_before);
        int64_t* ids = out.ids + qi * k;
        float* sc = out.scores + qi * k;
        for (size_t j = 0; j < keep; ++j) {
            ids[j] = static_cast<int64_t>(buf[j].doc) + base;
            sc[j] = buf[j].score;
        }
        for (size_t j = keep; j < k; ++j) {
            ids[j] = -1;
            sc[j] = neg_inf;
        }
        out.n_found[qi] = static_cast<int32_t>(keep);
    };
    const bool wide = impl == rescore_impl::avx512 || (impl == rescore_impl::automatic && rescore_has_avx512());
    parallel_for_items(c.nq, n_threads, 4, [&]() {
        return [&, buf = std::vector<scored_doc>(), row_buf = std::vector<float>(m.d),
                qd = std::vector<double>(wide ? m.d : 0)](size_t qi) mutable {
            buf.clear();
#if RETRIEVER_HAVE_AVX512_RESCORE
            if (wide) {
                const int64_t* cand = c.cand + qi * c.kk;
                const float* qv = q + qi * m.d;
                for (size_t t = 0; t < m.d; ++t) qd[t] = static_cast<double>(qv[t]);
                size_t rows[kRows];
                float sc[kRows];
                size_t nr = 0;
                const size_t row_bytes = m.d * (m.f16 != nullptr ? 2 : 4);
                const char* base_ptr = m.f16 != nullptr ? reinterpret_cast<const char*>(m.f16)
                                                        : reinterpret_cast<const char*>(m.f32);
                for (size_t j = 0; j <= c.kk; ++j) {
                    // candidates are scattered rows: fetch later ones while these are scored.
                    if (j + 2 * kRows < c.kk && cand[j + 2 * kRows] >= 0) {
                        const char* p = base_ptr + static_cast<size_t>(cand[j + 2 * kRows]) * row_bytes;
                        for (size_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(p + off);
                    }
                    if (j < c.kk && cand[j] >= 0) rows[nr++] = static_cast<size_t>(cand[j]);
                    if (nr == kRows || (j == c.kk && nr > 0)) {
                        dots_avx512(qd.data(), m, rows, nr, sc);
                        for (size_t r = 0; r < nr; ++r) buf.push_back({sc[r], static_cast<uint32_t>(rows[r])});
                        nr = 0;
                    }
                }
                finish(qi, buf);
                return;
            }
#endif
            const int64_t* cand = c.cand + qi * c.kk;
            const float* qv = q + qi * m.d;
            const size_t row_bytes = m.d * (m.f16 != nullptr ? 2 : 4);
            const char* base_ptr = m.f16 != nullptr ? reinterpret_cast<const char*>(m.f16)
                                                    : reinterpret_cast<const char*>(m.f32);
            for (size_t j = 0; j < c.kk; ++j) {
                // candidates are scattered rows: fetch a later one while this one is scored.
                if (j + kPrefetchAhead < c.kk && cand[j + kPrefetchAhead] >= 0) {
                    const char* p = base_ptr + static_cast<size_t>(cand[j + kPrefetchAhead]) * row_bytes;
                    for (size_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(p + off);
                }
                if (cand[j] < 0) continue;
                const size_t row = static_cast<size_t>(cand[j]);
                // the id travels as uint32 inside scored_doc only for ordering; rows < 2^32
                // is checked at the boundary.
                buf.push_back({dense_dot(qv, m, row, row_buf.data()), static_cast<uint32_t>(row)});
            }
            finish(qi, buf);
        };
    });
}

}  // namespace retriever

namespace retriever {

namespace {

/// (s, id) ranks strictly before (t, jd): higher score, or equal score and smaller id.
inline bool before(float s, int64_t id, float t, int64_t jd) { return s > t || (s == t && id < jd); }

/// Replaces the root of a min-heap (worst entry at 0) by (s, id) and restores the heap.
void heap_replace_root(float* hs, int64_t* hi, size_t kk, float s, int64_t id) {
    size_t i = 0;
    for (;;) {
        const size_t l = 2 * i + 1;
        if (l >= kk) break;
        size_t w = l;  // the worse child
        const size_t r = l + 1;
        if (r < kk && before(hs[l], hi[l], hs[r], hi[r])) w = r;
        if (before(s, id, hs[w], hi[w])) {
            // (s, id) ranks before the worse child: the child moves up, (s, id) sinks.
            hs[i] = hs[w];
            hi[i] = hi[w];
            i = w;
        } else {
            break;
        }
    }
    hs[i] = s;
    hi[i] = id;
}

}  // namespace

/// True when some of row[j .. j + 16) is >= thr (SSE2: part of the x86-64 baseline).
inline bool any_at_least16(const float* row, float thr) {
#if defined(__SSE2__)
    const __m128 t = _mm_set1_ps(thr);
    const __m128 a = _mm_cmpge_ps(_mm_loadu_ps(row), t);
    const __m128 b = _mm_cmpge_ps(_mm_loadu_ps(row + 4), t);
    const __m128 c = _mm_cmpge_ps(_mm_loadu_ps(row + 8), t);
    const __m128 d = _mm_cmpge_ps(_mm_loadu_ps(row + 12), t);
    return _mm_movemask_ps(_mm_or_ps(_mm_or_ps(a, b), _mm_or_ps(c, d))) != 0;
#else
    bool any = false;
    for (size_t t = 0; t < 16; ++t) any |= row[t] >= thr;
    return any;
#endif
}

/// Heap updates of one query row: groups of 16 scores below the root are rejected by one SIMD
/// comparison (the common case once the heap holds good candidates).
static void heap_push_row(const float* row, size_t nd, int64_t first_id, float* hs, int64_t* hi, size_t kk,
                          const uint8_t* allow) {
    constexpr size_t kGroup = 16;
    size_t j = 0;
    for (; j + kGroup <= nd; j += kGroup) {
        if (!any_at_least16(row + j, hs[0])) continue;
        for (size_t t = j; t < j + kGroup; ++t) {
            if (allow != nullptr && allow[t] == 0) continue;
            const float s = row[t];
            const int64_t id = first_id + static_cast<int64_t>(t);
            if (before(s, id, hs[0], hi[0])) heap_replace_root(hs, hi, kk, s, id);
        }
    }
    for (; j < nd; ++j) {
        if (allow != nullptr && allow[j] == 0) continue;
        const int64_t id = first_id + static_cast<int64_t>(j);
        if (before(row[j], id, hs[0], hi[0])) heap_replace_root(hs, hi, kk, row[j], id);
    }
}

void heap_push_block(const float* scores, size_t nd, int64_t first_id, const heap_rows_view& h,
                     int n_threads, const uint8_t* allow) {
    parallel_for_items(h.nq, n_threads, 8, [&]() {
        return [&](size_t qi) {
            heap_push_row(scores + qi * nd, nd, first_id, h.scores + qi * h.kk, h.ids + qi * h.kk, h.kk, allow);
        };
    });
}

}  // namespace retriever
