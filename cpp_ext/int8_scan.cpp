// Exact top-k' scan of int8-quantised Matryoshka prefixes; see int8_scan.hpp.
#include "int8_scan.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "parallel.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define RETRIEVER_HAVE_VNNI_PATH 1
#define RETRIEVER_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,popcnt")))
#else
#define RETRIEVER_HAVE_VNNI_PATH 0
#endif

namespace retriever {

namespace {

constexpr size_t kGroupBytes = 64;          // one group: 16 documents x 4 coordinates
constexpr size_t kQueryBlock = 64;          // queries that share one pass over the codes (at most)
constexpr size_t kReservoirBytes = 32 << 20;  // reservoir memory per worker (fewer queries per block for huge k')
constexpr size_t kChunkBytes = 192 << 10;   // codes scanned by a whole query block before moving on (L2)
constexpr size_t kTile = 8;                 // queries per register tile (VNNI path)

/// Ordering key of (score, id): larger key = ranks first (higher score, then smaller id).
/// Ids are < 2^32 (checked at the boundary).
inline int64_t make_key(int32_t score, int64_t id) {
    return static_cast<int64_t>(score) * 4294967296LL + (4294967295LL - id);
}
inline int32_t key_score(int64_t key) {
    return static_cast<int32_t>((key - (key & 0xFFFFFFFFLL)) / 4294967296LL);
}
inline int64_t key_id(int64_t key) { return 4294967295LL - (key & 0xFFFFFFFFLL); }

/// Running top-kk of one query as a reservoir: candidates at or above `thr` are appended;
/// when more than 2 * kk are held, the best kk are kept (nth_element) and `thr` becomes the
/// kk-th best score. A rejected candidate always ranks after kk held ones, so the final best kk
/// are the exact top-kk (amortised O(1) per candidate, no data-dependent heap walks).
struct reservoir {
    int64_t* keys = nullptr;  // capacity 2 * kk + 16
    size_t cnt = 0;
    int32_t thr = INT32_MIN;
};

void compact(reservoir& r, size_t kk) {
    std::nth_element(r.keys, r.keys + (kk - 1), r.keys + r.cnt, std::greater<int64_t>());
    r.cnt = kk;
    r.thr = key_score(r.keys[kk - 1]);
}

/// Appends the documents first_id + b (bit b of `mask`, b < 16, id < n) with scores s16[b].
inline void offer16(const int32_t* s16, uint32_t mask, int64_t first_id, int64_t n, reservoir& r, size_t kk) {
    if (r.cnt > 2 * kk) compact(r, kk);
    for (; mask != 0; mask &= mask - 1) {
        const int b = __builtin_ctz(mask);  // lowest set bit first
        const int64_t id = first_id + b;
        if (id >= n) return;  // padding documents of the last block
        r.keys[r.cnt++] = make_key(s16[b], id);
    }
}

struct scan_args {
    const int8_t* q = nullptr;
    size_t d4 = 0;
    const uint8_t* codes = nullptr;
    int64_t n = 0;
    size_t block_bytes = 0;
    size_t kk = 0;
    const uint16_t* allow16 = nullptr;  // per block, bit i: document 16b + i allowed (nullptr: all)
};

/// Portable path: queries [q0, q0 + nr) over blocks [b0, b1).
void group_portable(const scan_args& a, size_t q0, size_t nr, size_t b0, size_t b1, reservoir* res) {
    for (size_t r = 0; r < nr; ++r) {
        const int8_t* qv = a.q + (q0 + r) * 4 * a.d4;
        for (size_t b = b0; b < b1; ++b) {
            const uint8_t* blk = a.codes + b * a.block_bytes;
            int32_t s[16] = {0};
            for (size_t g = 0; g < a.d4; ++g) {
                const uint8_t* grp = blk + g * kGroupBytes;
                const int8_t* qg = qv + 4 * g;
                for (size_t i = 0; i < 16; ++i) {
                    int32_t acc = 0;
                    for (size_t j = 0; j < 4; ++j) {
                        acc += static_cast<int32_t>(grp[4 * i + j]) * static_cast<int32_t>(qg[j]);
                    }
                    s[i] += acc;
                }
            }
            uint32_t mask = 0;
            for (uint32_t i = 0; i < 16; ++i) mask |= static_cast<uint32_t>(s[i] >= res[r].thr) << i;
            if (a.allow16 != nullptr) mask &= a.allow16[b];
            if (mask) offer16(s, mask, static_cast<int64_t>(b * kI8BlockDocs), a.n, res[r], a.kk);
        }
    }
}

#if RETRIEVER_HAVE_VNNI_PATH
// Register tile of the VNNI path: 8 queries x C blocks of 16 documents (C = 3: 24 accumulators,
// + 3 document vectors + 1 broadcast query word = 28 of the 32 zmm registers). Accumulators are
// named variables (macros), not an array, so the compiler keeps them in registers.
#define RQ_DECL_ACC(r) __m512i a##r##0 = z, a##r##1 = z, a##r##2 = z;
#define RQ_STEP3(r)                                                                 \
    {                                                                               \
        const __m512i qb = _mm512_set1_epi32(qd[r * d4 + g]);                       \
        a##r##0 = _mm512_dpbusd_epi32(a##r##0, d0, qb);                             \
        a##r##1 = _mm512_dpbusd_epi32(a##r##1, d1, qb);                             \
        a##r##2 = _mm512_dpbusd_epi32(a##r##2, d2, qb);                             \
    }
#define RQ_STEP1(r) a##r##0 = _mm512_dpbusd_epi32(a##r##0, d0, _mm512_set1_epi32(qd[r * d4 + g]));
/// Largest reservoir that rank_select_vnni handles (it is quadratic in the count; larger ones use
/// nth_element).
constexpr size_t kRankSelectMax = 160;

/// The best `keep` of cnt <= kRankSelectMax distinct keys, sorted descending, into out[0, keep)
/// (out holds keep + 1 keys; out[keep] is scratch). A key's rank is the number of larger keys
/// (AVX-512 compares, 8 at a time), so the key of rank r goes to out[r]: no data-dependent
/// branches (nth_element on ~60-80 keys costs ~1 us in mispredictions, this ~0.2 us).
RETRIEVER_VNNI void rank_select_vnni(const int64_t* keys, size_t cnt, size_t keep, int64_t* out) {
    const size_t full = cnt / 8 * 8;
    const __mmask8 tail = static_cast<__mmask8>((1u << (cnt - full)) - 1u);
    const __m512i last = _mm512_maskz_loadu_epi64(tail, keys + full);
    for (size_t i = 0; i < cnt; ++i) {
        const __m512i ki = _mm512_set1_epi64(keys[i]);
        // two partial counts: shorter dependency chains
        uint32_t r0 = static_cast<uint32_t>(__builtin_popcount(_mm512_mask_cmpgt_epi64_mask(tail, last, ki)));
        uint32_t r1 = 0;
        size_t j = 0;
        for (; j + 16 <= full; j += 16) {
            r0 += static_cast<uint32_t>(__builtin_popcount(
                _mm512_cmpgt_epi64_mask(_mm512_loadu_si512(reinterpret_cast<const void*>(keys + j)), ki)));
            r1 += static_cast<uint32_t>(__builtin_popcount(
                _mm512_cmpgt_epi64_mask(_mm512_loadu_si512(reinterpret_cast<const void*>(keys + j + 8)), ki)));
        }
        if (j < full) {
            r0 += static_cast<uint32_t>(__builtin_popcount(
                _mm512_cmpgt_epi64_mask(_mm512_loadu_si512(reinterpret_cast<const void*>(keys + j)), ki)));
        }
        out[std::min<size_t>(r0 + r1, keep)] = keys[i];  // branch-free (cmov)
    }
}

/// compact() for the VNNI path: the same kept set (the best kk keys) and threshold.
RETRIEVER_VNNI void compact_vnni(reservoir& r, size_t kk) {
    if (r.cnt > kRankSelectMax) {
        compact(r, kk);
        return;
    }
    alignas(64) int64_t best[kRankSelectMax + 1];
    rank_select_vnni(r.keys, r.cnt, kk, best);
    std::memcpy(r.keys, best, kk * sizeof(int64_t));
    r.cnt = kk;
    r.thr = key_score(r.keys[kk - 1]);
}

/// offer16 with AVX-512: the passing (score, id) keys are built 8 at a time and compressed into
/// the reservoir (same keys as offer16, appended in the same order). Full 8-lane stores may write
/// up to 8 keys past the new count: the reservoir holds 2 * kk + 16 keys and is compacted before
/// it holds more than 2 * kk, so they stay inside it.
RETRIEVER_VNNI inline void offer16_vnni(const int32_t* s16, uint32_t mask, int64_t first_id, int64_t n,
                                        reservoir& r, size_t kk) {
    if (r.cnt > 2 * kk) compact_vnni(r, kk);
    if (first_id + 16 > n) mask &= (1u << (n - first_id)) - 1u;  // padding documents of the last block
    const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    // low 32 bits of a key: 2^32 - 1 - id
    const __m512i low0 = _mm512_sub_epi64(_mm512_set1_epi64(4294967295LL - first_id), lane);
    const __m512i low1 = _mm512_sub_epi64(low0, _mm512_set1_epi64(8));
    const __m512i s = _mm512_loadu_si512(reinterpret_cast<const void*>(s16));
    const __m512i k0 = _mm512_or_si512(
        _mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(s)), 32), low0);
    const __m512i k1 = _mm512_or_si512(
        _mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(s, 1)), 32), low1);
    const __mmask8 m0 = static_cast<__mmask8>(mask & 0xFFu), m1 = static_cast<__mmask8>(mask >> 8);
    _mm512_storeu_si512(reinterpret_cast<void*>(r.keys + r.cnt), _mm512_maskz_compress_epi64(m0, k0));
    r.cnt += static_cast<size_t>(__builtin_popcount(m0));
    _mm512_storeu_si512(reinterpret_cast<void*>(r.keys + r.cnt), _mm512_maskz_compress_epi64(m1, k1));
    r.cnt += static_cast<size_t>(__builtin_popcount(m1));
}

/// Offers the scores of a finished tile (tile[r][c]: query r, block c of the tile; 16 documents
/// each) to the reservoirs of the nr live queries. The accumulators are stored to memory before
/// any reservoir call, so no vector register is live across a call (keeps the tile loop free of
/// spills).
RETRIEVER_VNNI inline void filter_tile(const scan_args& a, size_t nr, size_t nc, int64_t first_id,
                                       const int32_t (*tile)[3][16], reservoir* res) {
    for (size_t r = 0; r < nr; ++r) {
        const __m512i thr = _mm512_set1_epi32(res[r].thr);
        for (size_t c = 0; c < nc; ++c) {
            __mmask16 m = _mm512_cmpge_epi32_mask(_mm512_load_si512(tile[r][c]), thr);
            if (a.allow16 != nullptr) m &= a.allow16[first_id / static_cast<int64_t>(kI8BlockDocs) + c];
            if (m) offer16_vnni(tile[r][c], m, first_id + static_cast<int64_t>(c * kI8BlockDocs), a.n, res[r], a.kk);
        }
    }
}

#define RQ_STORE3(r)                                                            \
    _mm512_store_si512(reinterpret_cast<void*>(tile[r][0]), a##r##0);           \
    _mm512_store_si512(reinterpret_cast<void*>(tile[r][1]), a##r##1);           \
    _mm512_store_si512(reinterpret_cast<void*>(tile[r][2]), a##r##2);
#define RQ_STORE1(r) _mm512_store_si512(reinterpret_cast<void*>(tile[r][0]), a##r##0);

/// nr <= 8 queries (qd holds 8 rows of d4 query words, rows >= nr zero; res[r] their
/// reservoirs) over blocks [b0, b1).
RETRIEVER_VNNI void group_vnni(const scan_args& a, size_t nr, size_t b0, size_t b1, const int32_t* qd,
                               reservoir* res) {
    const size_t d4 = a.d4, bb = a.block_bytes;
    const __m512i z = _mm512_setzero_si512();
    alignas(64) int32_t tile[kTile][3][16];
    size_t b = b0;
    for (; b + 3 <= b1; b += 3) {
        const uint8_t* p = a.codes + b * bb;
        RQ_DECL_ACC(0) RQ_DECL_ACC(1) RQ_DECL_ACC(2) RQ_DECL_ACC(3)
        RQ_DECL_ACC(4) RQ_DECL_ACC(5) RQ_DECL_ACC(6) RQ_DECL_ACC(7)
        for (size_t g = 0; g < d4; ++g) {
            const uint8_t* pg = p + g * kGroupBytes;
            const __m512i d0 = _mm512_loadu_si512(reinterpret_cast<const void*>(pg));
            const __m512i d1 = _mm512_loadu_si512(reinterpret_cast<const void*>(pg + bb));
            const __m512i d2 = _mm512_loadu_si512(reinterpret_cast<const void*>(pg + 2 * bb));
            RQ_STEP3(0) RQ_STEP3(1) RQ_STEP3(2) RQ_STEP3(3) RQ_STEP3(4) RQ_STEP3(5) RQ_STEP3(6) RQ_STEP3(7)
        }
        RQ_STORE3(0) RQ_STORE3(1) RQ_STORE3(2) RQ_STORE3(3) RQ_STORE3(4) RQ_STORE3(5) RQ_STORE3(6) RQ_STORE3(7)
        filter_tile(a, nr, 3, static_cast<int64_t>(b * kI8BlockDocs), tile, res);
    }
    for (; b < b1; ++b) {
        const uint8_t* p = a.codes + b * bb;
        __m512i a00 = z, a10 = z, a20 = z, a30 = z, a40 = z, a50 = z, a60 = z, a70 = z;
        for (size_t g = 0; g < d4; ++g) {
            const __m512i d0 = _mm512_loadu_si512(reinterpret_cast<const void*>(p + g * kGroupBytes));
            RQ_STEP1(0) RQ_STEP1(1) RQ_STEP1(2) RQ_STEP1(3) RQ_STEP1(4) RQ_STEP1(5) RQ_STEP1(6) RQ_STEP1(7)
        }
        RQ_STORE1(0) RQ_STORE1(1) RQ_STORE1(2) RQ_STORE1(3) RQ_STORE1(4) RQ_STORE1(5) RQ_STORE1(6) RQ_STORE1(7)
        filter_tile(a, nr, 1, static_cast<int64_t>(b * kI8BlockDocs), tile, res);
    }
}
#undef RQ_STORE3
#undef RQ_STORE1
#undef RQ_DECL_ACC
#undef RQ_STEP3
#undef RQ_STEP1
#endif

}  // namespace

bool int8_scan_has_vnni() {
#if RETRIEVER_HAVE_VNNI_PATH
    static const bool ok = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("popcnt");
    }();
    return ok;
#else
    return false;
#endif
}

void int8_scan_topk(const int8_t* q, size_t nq, const u8_packed_view& m, const i8_topk_out& out, int n_threads,
                    i8_impl impl) {
    const bool vnni = impl == i8_impl::vnni || (impl == i8_impl::automatic && int8_scan_has_vnni());
    if (impl == i8_impl::vnni && !int8_scan_has_vnni()) {
        throw std::invalid_argument("impl = 'vnni' but this CPU has no AVX-512 VNNI");
    }
    const size_t kk = out.kk;
    scan_args a;
    a.q = q;
    a.d4 = m.d4;
    a.codes = m.codes;
    a.n = static_cast<int64_t>(m.n);
    a.block_bytes = m.d4 * kGroupBytes;
    a.kk = kk;
    a.allow16 = m.allow16;
    const size_t n_blocks = (m.n + kI8BlockDocs - 1) / kI8BlockDocs;
    const size_t chunk_blocks = std::max<size_t>(3, kChunkBytes / std::max<size_t>(a.block_bytes, 1) / 3 * 3);
    const size_t cap = 2 * kk + 16;
    const size_t qblock = std::max<size_t>(1, std::min(kQueryBlock, kReservoirBytes / (cap * sizeof(int64_t))));
    const size_t n_qblocks = (nq + qblock - 1) / qblock;
    parallel_for_items(n_qblocks, n_threads, 1, [&]() {
        return [&, qd = std::vector<int32_t>(kTile * m.d4), keys = std::vector<int64_t>(),
                res = std::vector<reservoir>(qblock)](size_t qb) mutable {
            const size_t q0 = qb * qblock, q1 = std::min(nq, q0 + qblock);
            if (keys.size() < (q1 - q0) * cap) keys.resize((q1 - q0) * cap);
            for (size_t i = 0; i < q1 - q0; ++i) res[i] = reservoir{keys.data() + i * cap, 0, INT32_MIN};
            for (size_t b0 = 0; b0 < n_blocks; b0 += chunk_blocks) {
                const size_t b1 = std::min(n_blocks, b0 + chunk_blocks);
                for (size_t g0 = q0; g0 < q1; g0 += kTile) {
                    const size_t nr = std::min(kTile, q1 - g0);
#if RETRIEVER_HAVE_VNNI_PATH
                    if (vnni) {
                        // 4 int8 query codes per int32 (the broadcast operand of vpdpbusd)
                        std::fill(qd.begin(), qd.end(), 0);
                        for (size_t r = 0; r < nr; ++r) {
                            std::memcpy(qd.data() + r * m.d4, q + (g0 + r) * 4 * m.d4, 4 * m.d4);
                        }
                        group_vnni(a, nr, b0, b1, qd.data(), res.data() + (g0 - q0));
                        continue;
                    }
#endif
                    (void)vnni;
                    group_portable(a, g0, nr, b0, b1, res.data() + (g0 - q0));
                }
            }
            // best kk of each reservoir, sorted: score desc, id asc
            for (size_t qi = q0; qi < q1; ++qi) {
                reservoir& r = res[qi - q0];
#if RETRIEVER_HAVE_VNNI_PATH
                if (vnni && r.cnt >= kk && r.cnt <= kRankSelectMax) {
                    compact_vnni(r, kk);  // leaves the best kk sorted
                } else
#endif
                {
                    if (r.cnt > kk) compact(r, kk);
                    std::sort(r.keys, r.keys + r.cnt, std::greater<int64_t>());
                }
                const size_t held = std::min(kk, r.cnt);  // < kk only when documents are masked
                for (size_t j = 0; j < held; ++j) {
                    out.scores[qi * kk + j] = key_score(r.keys[j]);
                    out.ids[qi * kk + j] = key_id(r.keys[j]);
                }
                for (size_t j = held; j < kk; ++j) {
                    out.scores[qi * kk + j] = INT32_MIN;
                    out.ids[qi * kk + j] = -1;
                }
            }
        };
    });
}

}  // namespace retriever
