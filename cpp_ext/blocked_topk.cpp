// Learned-sparse top-k kernels (see blocked_topk.hpp).
#include "blocked_topk.hpp"

#include <algorithm>
#include <atomic>
#include <functional>
#include <utility>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#endif

#include "parallel.hpp"
#include "topk.hpp"

namespace retriever {

namespace {

[[noreturn]] void bad(const std::string& msg) { throw std::invalid_argument(msg); }

void check_offsets(const uint64_t* off, size_t n, size_t total, const char* name) {
    if (off[0] != 0) bad(std::string(name) + "[0] = " + std::to_string(off[0]) + " must be 0");
    for (size_t i = 0; i < n; ++i) {
        if (off[i + 1] < off[i]) {
            bad(std::string(name) + " must be non-decreasing; " + name + "[" + std::to_string(i + 1) +
                "] = " + std::to_string(off[i + 1]) + " < " + std::to_string(off[i]));
        }
    }
    if (off[n] != total) {
        bad(std::string(name) + "[-1] = " + std::to_string(off[n]) + " must equal " +
            std::to_string(total));
    }
}

constexpr size_t kChunk = 4;
// Exact kernel: a query whose lists hold at least kDenseRatio postings per document of the shard
// is scored term-at-a-time into the dense accumulator (no early termination), but only in shards
// of at most kDenseMaxDocs documents (accumulator <= 128 KiB, resident in L2). Measured with
// benchmarks/bench_sparse.py (1 thread, top-10; exact QPS, dense path vs score-at-a-time):
// SciFact SPLADE (5,183 docs, ~10 postings per document per query): 12.4k vs 4.1k; topical
// synthetic 100k docs: 0.56k vs 1.58k; 1M docs (~8.6 postings per document per query): 31 vs
// 209. In large shards the score-at-a-time early termination skips most postings even when the
// lists cover the shard several times over, and the dense accumulator no longer fits in cache.
#ifndef RETRIEVER_DENSE_RATIO
#define RETRIEVER_DENSE_RATIO 2.0
#endif
#ifndef RETRIEVER_DENSE_MAX_DOCS
#define RETRIEVER_DENSE_MAX_DOCS 32768
#endif
constexpr double kDenseRatio = RETRIEVER_DENSE_RATIO;
constexpr size_t kDenseMaxDocs = RETRIEVER_DENSE_MAX_DOCS;
// Dense path, per call: a term whose list holds at least 1/kColumnInvFraction of the shard's
// documents and that at least kColumnMinQueries dense-path queries of the batch use is expanded
// once into a float32 column (n_docs entries, 0 where absent) and added with a vectorisable loop
// instead of a scatter per posting. Adding w * 0 is an exact no-op on the non-negative
// accumulator, so the accumulated values are bit-identical to the scatter's. SciFact (72 such
// terms): accumulation about 1.5x faster (a prototype: 30 vs 41-62 us per query).
#ifndef RETRIEVER_COLUMN_INV_FRACTION
#define RETRIEVER_COLUMN_INV_FRACTION 3
#endif
constexpr size_t kColumnInvFraction = RETRIEVER_COLUMN_INV_FRACTION;
constexpr size_t kColumnMinQueries = 2;
constexpr size_t kColumnMaxBytes = size_t(64) << 20;
// Exact kernel with an allow mask: the allowed documents are listed (4 bytes each, once per call)
// when at most this fraction of the shard passes; a query then scores them all from the forward
// index instead of walking its postings when their rows hold fewer entries than its lists.
constexpr double kPassListFraction = 0.25;
// Exact kernel with an allow mask, filter_plan "auto", postings walk: the sentinel variant (masked
// accumulator entries preset to -inf, no mask read per posting) when at least this fraction of the
// shard is allowed and each worker has at least kSentinelMinQueries queries of the call to share
// the preset (one pass over n_docs floats per worker and call, and one to zero them); otherwise
// the mask is tested per posting. Measured at 1M documents: see docs/FILTERS.md.
#ifndef RETRIEVER_SENTINEL_FRACTION
#define RETRIEVER_SENTINEL_FRACTION 0.1
#endif
#ifndef RETRIEVER_SENTINEL_MIN_QUERIES
#define RETRIEVER_SENTINEL_MIN_QUERIES 1
#endif
constexpr double kSentinelFraction = RETRIEVER_SENTINEL_FRACTION;
constexpr size_t kSentinelMinQueries = RETRIEVER_SENTINEL_MIN_QUERIES;

// a[d] += w * col[d] for every d (restrict: the loop vectorises with SSE2). Columns hold the
// impacts as float32 (exact: impacts < 2^24), so the loop is load, mul, add, store per 4 docs with
// no integer unpacking.
void add_column(float* __restrict a, const float* __restrict col, float w, size_t n) {
    for (size_t d = 0; d < n; ++d) a[d] += w * col[d];
}

// a[d] += sum_j w[j] * cols[j][d] for every d, the terms added in order j = 0, 1, ...: 16
// documents at a time held in four SSE registers across all the columns, so the accumulator is
// loaded and stored once per tile rather than once per column (the column adds were store-bound).
// Per document the additions happen in the same order as nc calls of add_column.
void add_columns(float* __restrict a, const float* const* cols, const float* w, size_t nc, size_t n) {
    size_t d0 = 0;
#if defined(__SSE2__)
    for (; d0 + 16 <= n; d0 += 16) {
        __m128 s0 = _mm_loadu_ps(a + d0), s1 = _mm_loadu_ps(a + d0 + 4);
        __m128 s2 = _mm_loadu_ps(a + d0 + 8), s3 = _mm_loadu_ps(a + d0 + 12);
        for (size_t j = 0; j < nc; ++j) {
            const __m128 wv = _mm_set1_ps(w[j]);
            const float* c = cols[j] + d0;
            s0 = _mm_add_ps(s0, _mm_mul_ps(wv, _mm_loadu_ps(c)));
            s1 = _mm_add_ps(s1, _mm_mul_ps(wv, _mm_loadu_ps(c + 4)));
            s2 = _mm_add_ps(s2, _mm_mul_ps(wv, _mm_loadu_ps(c + 8)));
            s3 = _mm_add_ps(s3, _mm_mul_ps(wv, _mm_loadu_ps(c + 12)));
        }
        _mm_storeu_ps(a + d0, s0);
        _mm_storeu_ps(a + d0 + 4, s1);
        _mm_storeu_ps(a + d0 + 8, s2);
        _mm_storeu_ps(a + d0 + 12, s3);
    }
#endif
    for (size_t j = 0; j < nc; ++j) add_column(a + d0, cols[j] + d0, w[j], n - d0);
}

// Dense path, term-at-a-time: a[ids[c]] += w * float(imp[c]) for c in [b, e). The products are
// computed four at a time with SSE2 (uint16 -> float conversion and multiply: the same IEEE
// operations as the scalar form, so the accumulated values are identical), then added one by one.
void scatter_list(float* __restrict a, const uint32_t* __restrict ids, const uint16_t* __restrict imp,
                  uint64_t b, uint64_t e, float w) {
    uint64_t c = b;
#if defined(__SSE2__)
    const __m128 wv = _mm_set1_ps(w);
    const __m128i zero = _mm_setzero_si128();
    alignas(16) float v[8];
    for (; c + 8 <= e; c += 8) {
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(imp + c));
        _mm_store_ps(v, _mm_mul_ps(_mm_cvtepi32_ps(_mm_unpacklo_epi16(x, zero)), wv));
        _mm_store_ps(v + 4, _mm_mul_ps(_mm_cvtepi32_ps(_mm_unpackhi_epi16(x, zero)), wv));
        const uint32_t* d = ids + c;
        a[d[0]] += v[0];
        a[d[1]] += v[1];
        a[d[2]] += v[2];
        a[d[3]] += v[3];
        a[d[4]] += v[4];
        a[d[5]] += v[5];
        a[d[6]] += v[6];
        a[d[7]] += v[7];
    }
#endif
    for (; c < e; ++c) a[ids[c]] += w * static_cast<float>(imp[c]);
}

// Dense-path top-k selection over a[0, n): the maxima of 64-document blocks (SSE2 max), the k-th
// largest block maximum (theta0: a lower bound of the k-th largest value, the k blocks hold k
// distinct documents at or above it), then only blocks whose maximum reaches theta0 are read for
// values >= theta0 (every value >= the true k-th largest is among them). Fills `cand` with the
// documents whose value v > 0 satisfies v >= kth * (1 - eps), kth the exact k-th largest positive
// value (0 when fewer than k are positive): the same set as a full scan with a k-heap, at about
// one vector max per 4 documents instead of a compare (and a heap operation) per document.
constexpr size_t kSelBlock = 64;
void select_dense(const float* a, size_t n, size_t k, float eps, std::vector<float>& bmax,
                  std::vector<float>& vals, std::vector<uint32_t>& cand) {
    const size_t nb = (n + kSelBlock - 1) / kSelBlock;
    bmax.resize(nb);
    for (size_t b = 0; b < nb; ++b) {
        const size_t lo = b * kSelBlock, hi = std::min(n, lo + kSelBlock);
        size_t d = lo;
        float m = 0.0f;
#if defined(__SSE2__)
        __m128 mv = _mm_setzero_ps();
        for (; d + 4 <= hi; d += 4) mv = _mm_max_ps(mv, _mm_loadu_ps(a + d));
        alignas(16) float t[4];
        _mm_store_ps(t, mv);
        m = std::max(std::max(t[0], t[1]), std::max(t[2], t[3]));
#endif
        for (; d < hi; ++d) m = std::max(m, a[d]);
        bmax[b] = m;
    }
    float theta0 = 0.0f;
    vals.clear();
    for (size_t b = 0; b < nb; ++b) {
        if (bmax[b] > 0.0f) vals.push_back(bmax[b]);
    }
    if (vals.size() >= k) {
        std::nth_element(vals.begin(), vals.begin() + (k - 1), vals.end(), std::greater<float>());
        theta0 = vals[k - 1];
    }
    cand.clear();
    vals.clear();
    for (size_t b = 0; b < nb; ++b) {
        if (!(bmax[b] > 0.0f) || bmax[b] < theta0) continue;
        const size_t lo = b * kSelBlock, hi = std::min(n, lo + kSelBlock);
        for (size_t d = lo; d < hi; ++d) {
            const float v = a[d];
            if (v > 0.0f && v >= theta0) {
                cand.push_back(static_cast<uint32_t>(d));
                vals.push_back(v);
            }
        }
    }
    float lim = 0.0f;
    if (vals.size() >= k) {
        std::nth_element(vals.begin(), vals.begin() + (k - 1), vals.end(), std::greater<float>());
        lim = vals[k - 1] * (1.0f - eps);
    }
    size_t m = 0;
    for (const uint32_t d : cand) {
        if (a[d] >= lim) cand[m++] = d;
    }
    cand.resize(m);
}

void write_row(topk_heap& heap, const topk_out& out, size_t q) {
    out.n_found[q] = heap.finalize(out.ids + q * out.k, out.scores + q * out.k);
}

}  // namespace

void check_forward(const forward_view& f, size_t n_terms) {
    check_offsets(f.offsets, f.n_docs, f.nnz, "fwd_offsets");
    for (size_t i = 0; i < f.nnz; ++i) {
        if (f.terms[i] >= n_terms) {
            bad("fwd_terms[" + std::to_string(i) + "] = " + std::to_string(f.terms[i]) +
                " must be < n_terms = " + std::to_string(n_terms));
        }
    }
    if (!(std::isfinite(f.scale) && f.scale > 0)) {
        bad("scale must be finite and > 0, got " + std::to_string(f.scale));
    }
}

void check_blocks(const blocks_view& b, size_t n_docs, size_t vocab) {
    check_offsets(b.term_blocks, b.n_terms, b.n_blocks, "term_blocks");
    check_offsets(b.block_docs_offsets, b.n_blocks, b.n_block_docs, "block_docs_offsets");
    check_offsets(b.summary_comp_offsets, b.n_terms, b.n_comps, "summary_comp_offsets");
    check_offsets(b.summary_entry_offsets, b.n_terms, b.n_summary, "summary_entry_offsets");
    for (size_t i = 0; i < b.n_block_docs; ++i) {
        if (b.block_docs[i] >= n_docs) {
            bad("block_docs[" + std::to_string(i) + "] = " + std::to_string(b.block_docs[i]) +
                " must be < n_docs = " + std::to_string(n_docs));
        }
    }
    for (size_t t = 0; t < b.n_terms; ++t) {
        const uint64_t nb = b.term_blocks[t + 1] - b.term_blocks[t];
        const uint64_t ne = b.summary_entry_offsets[t + 1] - b.summary_entry_offsets[t];
        const uint64_t c0 = b.summary_comp_offsets[t], c1 = b.summary_comp_offsets[t + 1];
        if (c0 == c1 && ne != 0) {
            bad("term " + std::to_string(t) + " has " + std::to_string(ne) + " summary entries but no summary_dir entry");
        }
        for (uint64_t c = c0; c < c1; ++c) {
            const uint64_t comp = b.summary_dir[c] >> 32, r = b.summary_dir[c] & 0xffffffffu;
            const uint64_t r_end = c + 1 < c1 ? (b.summary_dir[c + 1] & 0xffffffffu) : ne;
            if (comp >= vocab) {
                bad("summary_dir[" + std::to_string(c) + "] names component " + std::to_string(comp) +
                    ", must be < n_terms = " + std::to_string(vocab));
            }
            if (c > c0 && comp <= (b.summary_dir[c - 1] >> 32)) {
                bad("summary_dir components of term " + std::to_string(t) + " must be strictly ascending at summary_dir[" +
                    std::to_string(c) + "]");
            }
            if ((c == c0 && r != 0) || r > r_end || r_end > ne) {
                bad("summary_dir[" + std::to_string(c) + "] entry range [" + std::to_string(r) + ", " +
                    std::to_string(r_end) + ") of term " + std::to_string(t) + " is not a partition of its " +
                    std::to_string(ne) + " summary entries");
            }
        }
        for (uint64_t i = b.summary_entry_offsets[t]; i < b.summary_entry_offsets[t + 1]; ++i) {
            if ((b.summary_entries[i] >> 8) >= nb) {
                bad("summary_entries[" + std::to_string(i) + "] names block " + std::to_string(b.summary_entries[i] >> 8) +
                    " of term " + std::to_string(t) + ", which has " + std::to_string(nb) + " blocks");
            }
        }
    }
    for (size_t i = 0; i < b.n_blocks; ++i) {
        if (!(std::isfinite(b.summary_scale[i]) && b.summary_scale[i] >= 0)) {
            bad("summary_scale[" + std::to_string(i) + "] must be finite and >= 0");
        }
    }
}

void check_packed(const blocks_view& b, const forward_view& f) {
    if (b.n_packed == 0 && b.n_rank == 0) return;
    if (b.n_packed != f.nnz) {
        bad("len(fwd_packed) = " + std::to_string(b.n_packed) + " must equal len(fwd_terms) = " + std::to_string(f.nnz));
    }
    if (b.n_rank != b.n_terms || b.n_terms > 65536) {
        bad("len(fwd_term_rank) = " + std::to_string(b.n_rank) + " must equal n_terms = " + std::to_string(b.n_terms) +
            " (at most 65536 with a packed forward index)");
    }
    std::vector<uint8_t> seen(b.n_terms, 0);
    for (size_t t = 0; t < b.n_rank; ++t) {
        const uint32_t r = b.term_rank[t];
        if (r >= b.n_terms || seen[r]) {
            bad("fwd_term_rank must be a permutation of [0, n_terms); fwd_term_rank[" + std::to_string(t) + "] = " +
                std::to_string(r));
        }
        seen[r] = 1;
    }
    for (size_t i = 0; i < f.nnz; ++i) {
        const uint32_t want = (b.term_rank[f.terms[i]] << 16) | f.values[i];
        if (b.packed[i] != want) {
            bad("fwd_packed[" + std::to_string(i) + "] = " + std::to_string(b.packed[i]) +
                " must be (fwd_term_rank[fwd_terms[i]] << 16) | fwd_values[i] = " + std::to_string(want));
        }
    }
}

void check_impact_postings(const u16_postings_view& p) {
    const csr_view& c = p.csr;
    check_offsets(c.offsets, c.n_terms, c.nnz, "offsets");
    for (size_t t = 0; t < c.n_terms; ++t) {
        for (uint64_t i = c.offsets[t]; i < c.offsets[t + 1]; ++i) {
            if (c.doc_ids[i] >= p.n_docs) {
                bad("doc_ids[" + std::to_string(i) + "] = " + std::to_string(c.doc_ids[i]) +
                    " must be < n_docs = " + std::to_string(p.n_docs));
            }
            if (p.impacts[i] == 0) bad("impacts[" + std::to_string(i) + "] must be >= 1, got 0");
            if (i > c.offsets[t] && p.impacts[i] > p.impacts[i - 1]) {
                bad("impacts of term " + std::to_string(t) + " must be non-increasing; impacts[" +
                    std::to_string(i) + "] = " + std::to_string(p.impacts[i]) + " > " +
                    std::to_string(p.impacts[i - 1]));
            }
        }
    }
}

void check_sparse_queries(const query_batch_view& q, size_t n_terms) {
    check_query_batch(q, n_terms);  // offsets, term range, finite weights
    std::vector<uint8_t> seen(n_terms, 0);
    for (size_t i = 0; i < q.nq; ++i) {
        const uint64_t lo = q.q_offsets[i], hi = q.q_offsets[i + 1];
        for (uint64_t j = lo; j < hi; ++j) {
            if (q.q_weights[j] < 0) {
                bad("q_weights[" + std::to_string(j) + "] = " + std::to_string(q.q_weights[j]) +
                    " (query " + std::to_string(i) + ") must be >= 0");
            }
            if (seen[q.q_terms[j]]) {
                bad("q_terms[" + std::to_string(j) + "] = " + std::to_string(q.q_terms[j]) +
                    " repeats a term of query " + std::to_string(i));
            }
            seen[q.q_terms[j]] = 1;
        }
        for (uint64_t j = lo; j < hi; ++j) seen[q.q_terms[j]] = 0;
    }
}

namespace {

struct term_cursor {
    float w;          // query weight
    uint32_t term;
    uint64_t cur, end;  // position in the impact-ordered list, its end
};

// Exact score of document d from the forward index: scale * sum over d's terms of qd[t] * value,
// in one fixed order. The same function serves every path of both kernels, so a document's score
// never depends on how it was reached. The order (what makes the float32 sum reproducible): 16
// partial sums in two groups A and B of 8 lanes; the row's entries go in chunks of 8, chunk c to
// group A when c is even and to B when odd, entry j of a chunk to lane j; the last < 8 entries to
// A's lanes 0, 1, ... in turn; then lane-wise A + B, and the 8 lanes summed as
// ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)). Independent partial sums keep the adds from
// forming one serial dependency chain (the loop was latency-bound with 4 lanes and 2 adds per 8
// entries). Three implementations of that one order: AVX2 (8-entry gathers, chosen at run time:
// the extension is built for plain x86-64), SSE2 and scalar; each per-lane operation (convert the
// uint16 value, multiply, add) is the same IEEE operation in the same order, so all three give
// bit-identical scores (tests/test_sparse.py checks them against each other).
inline float finish_lanes(const float* a, const float* b, float scale) {
    float l[8];
    for (int j = 0; j < 8; ++j) l[j] = a[j] + b[j];
    return (((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))) * scale;
}

inline float forward_score_scalar(const forward_view& f, const float* qd, uint32_t d) {
    uint64_t p = f.offsets[d];
    const uint64_t e = f.offsets[d + 1];
    const uint32_t* t = f.terms;
    const uint16_t* v = f.values;
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; p + 16 <= e; p += 16) {
        for (int j = 0; j < 8; ++j) a[j] += qd[t[p + j]] * static_cast<float>(v[p + j]);
        for (int j = 0; j < 8; ++j) b[j] += qd[t[p + 8 + j]] * static_cast<float>(v[p + 8 + j]);
    }
    if (p + 8 <= e) {
        for (int j = 0; j < 8; ++j) a[j] += qd[t[p + j]] * static_cast<float>(v[p + j]);
        p += 8;
    }
    for (int j = 0; p < e; ++p, ++j) a[j] += qd[t[p]] * static_cast<float>(v[p]);
    return finish_lanes(a, b, f.scale);
}

#if defined(__SSE2__)
inline __m128 sse_prod4(const float* qd, const uint32_t* t, const uint16_t* v, uint64_t p) {
    const __m128i x = _mm_unpacklo_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + p)), _mm_setzero_si128());
    const __m128 q = _mm_setr_ps(qd[t[p]], qd[t[p + 1]], qd[t[p + 2]], qd[t[p + 3]]);
    return _mm_mul_ps(q, _mm_cvtepi32_ps(x));
}

inline float forward_score_sse2(const forward_view& f, const float* qd, uint32_t d) {
    uint64_t p = f.offsets[d];
    const uint64_t e = f.offsets[d + 1];
    const uint32_t* t = f.terms;
    const uint16_t* v = f.values;
    __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps(), b0 = _mm_setzero_ps(), b1 = _mm_setzero_ps();
    for (; p + 16 <= e; p += 16) {
        a0 = _mm_add_ps(a0, sse_prod4(qd, t, v, p));
        a1 = _mm_add_ps(a1, sse_prod4(qd, t, v, p + 4));
        b0 = _mm_add_ps(b0, sse_prod4(qd, t, v, p + 8));
        b1 = _mm_add_ps(b1, sse_prod4(qd, t, v, p + 12));
    }
    if (p + 8 <= e) {
        a0 = _mm_add_ps(a0, sse_prod4(qd, t, v, p));
        a1 = _mm_add_ps(a1, sse_prod4(qd, t, v, p + 4));
        p += 8;
    }
    alignas(16) float a[8], b[8];
    _mm_store_ps(a, a0);
    _mm_store_ps(a + 4, a1);
    _mm_store_ps(b, b0);
    _mm_store_ps(b + 4, b1);
    for (int j = 0; p < e; ++p, ++j) a[j] += qd[t[p]] * static_cast<float>(v[p]);
    return finish_lanes(a, b, f.scale);
}
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define RETRIEVER_AVX2_SCORE 1
__attribute__((target("avx2"))) float forward_score_avx2(const forward_view& f, const float* qd, uint32_t d) {
    uint64_t p = f.offsets[d];
    const uint64_t e = f.offsets[d + 1];
    const uint32_t* t = f.terms;
    const uint16_t* v = f.values;
    __m256 a8 = _mm256_setzero_ps(), b8 = _mm256_setzero_ps();
    auto prod8 = [&](uint64_t i) __attribute__((target("avx2"))) {
        const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + i));
        const __m256 q = _mm256_i32gather_ps(qd, idx, 4);
        const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i))));
        return _mm256_mul_ps(q, x);
    };
    for (; p + 16 <= e; p += 16) {
        a8 = _mm256_add_ps(a8, prod8(p));
        b8 = _mm256_add_ps(b8, prod8(p + 8));
    }
    if (p + 8 <= e) {
        a8 = _mm256_add_ps(a8, prod8(p));
        p += 8;
    }
    alignas(32) float a[8], b[8];
    _mm256_store_ps(a, a8);
    _mm256_store_ps(b, b8);
    for (int j = 0; p < e; ++p, ++j) a[j] += qd[t[p]] * static_cast<float>(v[p]);
    return finish_lanes(a, b, f.scale);
}

#endif

/// Whether this CPU has AVX2, read once per process (a function-local static).
bool cpu_has_avx2() {
#if defined(RETRIEVER_AVX2_SCORE)
    static const bool avx2 = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") != 0;
    }();
    return avx2;
#else
    return false;
#endif
}

/// forward_score with a resolved (never automatic) implementation supported by this CPU.
inline float forward_score(const forward_view& f, const float* qd, uint32_t d, forward_score_impl impl) {
#if defined(RETRIEVER_AVX2_SCORE)
    if (impl == forward_score_impl::avx2) return forward_score_avx2(f, qd, d);
#endif
#if defined(__SSE2__)
    if (impl != forward_score_impl::scalar) return forward_score_sse2(f, qd, d);
#endif
    return forward_score_scalar(f, qd, d);
}

// forward_score over the packed copy (blocks_view::packed): entry i is (rank << 16) | value and
// the query weights are indexed by rank (qr[rank[t]] = qd[t]), so every product and every addition
// is the one forward_score performs, in the same order: bit-identical scores.
inline float packed_score_scalar(const uint64_t* off, const uint32_t* pk, float scale, const float* qr, uint32_t d) {
    uint64_t p = off[d];
    const uint64_t e = off[d + 1];
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; p + 16 <= e; p += 16) {
        for (int j = 0; j < 8; ++j) a[j] += qr[pk[p + j] >> 16] * static_cast<float>(pk[p + j] & 0xffffu);
        for (int j = 0; j < 8; ++j) b[j] += qr[pk[p + 8 + j] >> 16] * static_cast<float>(pk[p + 8 + j] & 0xffffu);
    }
    if (p + 8 <= e) {
        for (int j = 0; j < 8; ++j) a[j] += qr[pk[p + j] >> 16] * static_cast<float>(pk[p + j] & 0xffffu);
        p += 8;
    }
    for (int j = 0; p < e; ++p, ++j) a[j] += qr[pk[p] >> 16] * static_cast<float>(pk[p] & 0xffffu);
    return finish_lanes(a, b, scale);
}

#if defined(__SSE2__)
inline __m128 sse_packed_prod4(const float* qr, const uint32_t* pk, uint64_t p) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pk + p));
    const __m128 v = _mm_cvtepi32_ps(_mm_and_si128(x, _mm_set1_epi32(0xffff)));
    const __m128 q = _mm_setr_ps(qr[pk[p] >> 16], qr[pk[p + 1] >> 16], qr[pk[p + 2] >> 16], qr[pk[p + 3] >> 16]);
    return _mm_mul_ps(q, v);
}

inline float packed_score_sse2(const uint64_t* off, const uint32_t* pk, float scale, const float* qr, uint32_t d) {
    uint64_t p = off[d];
    const uint64_t e = off[d + 1];
    __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps(), b0 = _mm_setzero_ps(), b1 = _mm_setzero_ps();
    for (; p + 16 <= e; p += 16) {
        a0 = _mm_add_ps(a0, sse_packed_prod4(qr, pk, p));
        a1 = _mm_add_ps(a1, sse_packed_prod4(qr, pk, p + 4));
        b0 = _mm_add_ps(b0, sse_packed_prod4(qr, pk, p + 8));
        b1 = _mm_add_ps(b1, sse_packed_prod4(qr, pk, p + 12));
    }
    if (p + 8 <= e) {
        a0 = _mm_add_ps(a0, sse_packed_prod4(qr, pk, p));
        a1 = _mm_add_ps(a1, sse_packed_prod4(qr, pk, p + 4));
        p += 8;
    }
    alignas(16) float a[8], b[8];
    _mm_store_ps(a, a0);
    _mm_store_ps(a + 4, a1);
    _mm_store_ps(b, b0);
    _mm_store_ps(b + 4, b1);
    for (int j = 0; p < e; ++p, ++j) a[j] += qr[pk[p] >> 16] * static_cast<float>(pk[p] & 0xffffu);
    return finish_lanes(a, b, scale);
}
#endif

#if defined(RETRIEVER_AVX2_SCORE)
__attribute__((target("avx2"))) float packed_score_avx2(const uint64_t* off, const uint32_t* pk, float scale,
                                                        const float* qr, uint32_t d) {
    uint64_t p = off[d];
    const uint64_t e = off[d + 1];
    __m256 a8 = _mm256_setzero_ps(), b8 = _mm256_setzero_ps();
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    auto prod8 = [&](uint64_t i) __attribute__((target("avx2"))) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pk + i));
        const __m256 q = _mm256_i32gather_ps(qr, _mm256_srli_epi32(x, 16), 4);
        return _mm256_mul_ps(q, _mm256_cvtepi32_ps(_mm256_and_si256(x, lo16)));
    };
    for (; p + 16 <= e; p += 16) {
        a8 = _mm256_add_ps(a8, prod8(p));
        b8 = _mm256_add_ps(b8, prod8(p + 8));
    }
    if (p + 8 <= e) {
        a8 = _mm256_add_ps(a8, prod8(p));
        p += 8;
    }
    alignas(32) float a[8], b[8];
    _mm256_store_ps(a, a8);
    _mm256_store_ps(b, b8);
    for (int j = 0; p < e; ++p, ++j) a[j] += qr[pk[p] >> 16] * static_cast<float>(pk[p] & 0xffffu);
    return finish_lanes(a, b, scale);
}
#endif

inline float packed_score(const uint64_t* off, const uint32_t* pk, float scale, const float* qr, uint32_t d,
                          forward_score_impl impl) {
#if defined(RETRIEVER_AVX2_SCORE)
    if (impl == forward_score_impl::avx2) return packed_score_avx2(off, pk, scale, qr, d);
#endif
#if defined(__SSE2__)
    if (impl != forward_score_impl::scalar) return packed_score_sse2(off, pk, scale, qr, d);
#endif
    return packed_score_scalar(off, pk, scale, qr, d);
}

inline void prefetch_packed_row(const uint64_t* off, const uint32_t* pk, uint32_t d) {
#if defined(__GNUC__)
    const char* t = reinterpret_cast<const char*>(pk + off[d]);
    const char* te = reinterpret_cast<const char*>(pk + off[d + 1]);
    for (; t < te; t += 64) __builtin_prefetch(t);
#else
    (void)off;
    (void)pk;
    (void)d;
#endif
}

inline void prefetch_doc(const forward_view& f, uint32_t d) {
#if defined(__GNUC__)
    const uint64_t p = f.offsets[d];
    __builtin_prefetch(f.terms + p);
    __builtin_prefetch(f.values + p);
#else
    (void)f;
    (void)d;
#endif
}

// Prefetch document d's whole forward row (terms and values), one request per cache line.
inline void prefetch_row(const forward_view& f, uint32_t d) {
#if defined(__GNUC__)
    const uint64_t p = f.offsets[d], e = f.offsets[d + 1];
    const char* t = reinterpret_cast<const char*>(f.terms + p);
    const char* te = reinterpret_cast<const char*>(f.terms + e);
    for (; t < te; t += 64) __builtin_prefetch(t);
    const char* v = reinterpret_cast<const char*>(f.values + p);
    const char* ve = reinterpret_cast<const char*>(f.values + e);
    for (; v < ve; v += 64) __builtin_prefetch(v);
#else
    (void)f;
    (void)d;
#endif
}

// Per-worker scratch (query weights by term, a stamp or accumulator per document), pooled across
// calls: a single-query call would otherwise allocate and zero O(n_docs + vocab) memory (4 MB and
// about 1,000 fresh pages at 1M documents) on every call. Invariants while in the pool: qd, qr and
// acc all +0.0f; stamp[d] < gen for every d. A worker whose query throws drops its scratch instead of
// returning it (the invariants may not hold).
struct sparse_scratch {
    std::vector<float> qd;
    std::vector<float> qr;  // query weights by term rank (packed forward index), 65,536 entries
    std::vector<float> acc;
    std::vector<uint32_t> stamp;
    uint32_t gen = 0;

    void ensure(size_t vocab, size_t n_docs, bool need_acc, bool need_stamp) {
        if (qd.size() < vocab) qd.resize(vocab, 0.0f);
        if (need_stamp && qr.size() < 65536) qr.resize(65536, 0.0f);
        if (need_acc && acc.size() < n_docs) acc.resize(n_docs, 0.0f);
        if (need_stamp && stamp.size() < n_docs) stamp.resize(n_docs, 0);  // 0 < gen: unseen
    }
    /// A fresh stamp value: every document reads as unseen afterwards.
    uint32_t next_gen() {
        if (++gen == 0) {  // wrapped: reset stamps
            std::fill(stamp.begin(), stamp.end(), 0);
            gen = 1;
        }
        return gen;
    }
};

class sparse_scratch_pool {
  public:
    static sparse_scratch_pool& instance() {
        static sparse_scratch_pool pool;
        return pool;
    }
    std::unique_ptr<sparse_scratch> acquire() {
        std::lock_guard<std::mutex> lock(m_mutex);
        if (m_free.empty()) return std::make_unique<sparse_scratch>();
        auto s = std::move(m_free.back());
        m_free.pop_back();
        return s;
    }
    void release(std::unique_ptr<sparse_scratch> s) {
        std::lock_guard<std::mutex> lock(m_mutex);
        if (m_free.size() < m_capacity) m_free.push_back(std::move(s));
    }

  private:
    sparse_scratch_pool() : m_capacity(2 * std::max<size_t>(1, std::thread::hardware_concurrency())) {
        hold_mutex_across_fork<&sparse_scratch_pool::mutex>();
    }
    static std::mutex& mutex() { return instance().m_mutex; }
    std::mutex m_mutex;
    std::vector<std::unique_ptr<sparse_scratch>> m_free;
    size_t m_capacity;
};

/// A worker's scratch from the pool; returned when the worker ends, unless a query failed.
struct scratch_lease {
    std::unique_ptr<sparse_scratch> s = sparse_scratch_pool::instance().acquire();
    bool ok = true;
    scratch_lease() = default;
    scratch_lease(const scratch_lease&) = delete;
    scratch_lease& operator=(const scratch_lease&) = delete;
    ~scratch_lease() {
        if (ok && s) sparse_scratch_pool::instance().release(std::move(s));
    }
};

/// Dense float32 columns (impacts at their doc ids, 0 elsewhere) of the long lists that at least
/// kColumnMinQueries of the batch's dense-path queries use (sparse_exact_topk), at most
/// kColumnMaxBytes in all: col_of[t] is term t's column or -1 (empty when there are none).
void dense_columns(const u16_postings_view& p, const query_batch_view& queries, size_t vocab,
                   std::vector<int32_t>& col_of, std::vector<float>& columns) {
    const size_t n_docs = p.n_docs;
    if (n_docs > 0 && n_docs <= kDenseMaxDocs && queries.nq >= kColumnMinQueries) {
        std::vector<uint32_t> uses(vocab, 0);
        const uint64_t min_len = (n_docs + kColumnInvFraction - 1) / kColumnInvFraction;
        for (size_t q = 0; q < queries.nq; ++q) {
            size_t total = 0;
            for (uint64_t j = queries.q_offsets[q]; j < queries.q_offsets[q + 1]; ++j) {
                const uint32_t t = queries.q_terms[j];
                if (queries.q_weights[j] > 0.0f) total += p.csr.offsets[t + 1] - p.csr.offsets[t];
            }
            if (static_cast<double>(total) < kDenseRatio * static_cast<double>(n_docs)) continue;
            for (uint64_t j = queries.q_offsets[q]; j < queries.q_offsets[q + 1]; ++j) {
                const uint32_t t = queries.q_terms[j];
                if (queries.q_weights[j] > 0.0f && p.csr.offsets[t + 1] - p.csr.offsets[t] >= min_len) ++uses[t];
            }
        }
        size_t n_cols = 0;
        for (size_t t = 0; t < vocab; ++t) n_cols += uses[t] >= kColumnMinQueries;
        n_cols = std::min(n_cols, kColumnMaxBytes / (n_docs * sizeof(float)));
        if (n_cols > 0) {
            col_of.assign(vocab, -1);
            columns.assign(n_cols * n_docs, 0);
            int32_t c = 0;
            for (size_t t = 0; t < vocab && static_cast<size_t>(c) < n_cols; ++t) {
                if (uses[t] < kColumnMinQueries) continue;
                float* col = columns.data() + static_cast<size_t>(c) * n_docs;
                for (uint64_t i = p.csr.offsets[t]; i < p.csr.offsets[t + 1]; ++i) {
                    col[p.csr.doc_ids[i]] = static_cast<float>(p.impacts[i]);
                }
                col_of[t] = c++;
            }
        }
    }
}

/// Slack for float rounding between accumulation orders (sparse_exact_topk).
constexpr float kExactEps = 1e-4f;

/// A sparse_exact_topk worker's scratch, reused across its queries.
struct exact_state {
    scratch_lease lease;  // acc (n_docs) and qd (vocab), zero between queries
    std::vector<float> buf, bmax, col_w;
    std::vector<const float*> col_ptr;
    std::vector<uint32_t> touched, cand;
    std::vector<term_cursor> terms;
    topk_heap heap;
    /// Sentinel plan: acc[0, preset_n) holds -inf (or NaN) at the masked documents between this
    /// worker's queries; zeroed again before the scratch goes back to the pool.
    size_t preset_n = 0;
    exact_state() = default;
    exact_state(const exact_state&) = delete;
    exact_state& operator=(const exact_state&) = delete;
    ~exact_state() {
        if (preset_n != 0 && lease.ok && lease.s) std::fill(lease.s->acc.begin(), lease.s->acc.begin() + preset_n, 0.0f);
    }
};

/// acc[d] = -inf where allow[d] == 0, else 0 (acc is all zero before): the sentinel plan's preset.
void preset_masked(float* __restrict a, const uint8_t* __restrict allow, size_t n_docs) {
    const float ninf = -std::numeric_limits<float>::infinity();
    for (size_t d = 0; d < n_docs; ++d) a[d] = allow[d] != 0 ? 0.0f : ninf;
}

/// Phase 1 of sparse_exact_topk: score-at-a-time over impact-ordered lists, in rounds of
/// decreasing contribution level lambda. After a round, no unseen
/// posting contributes more than w * imp[cur] per term, so a doc
/// never touched scores at most L = sum of those, and a touched one
/// at most acc + L. theta (the k-th largest partial score) is a
/// lower bound of the final k-th score; we stop once L < theta.
/// Returns L (0 when every list is exhausted) and raises theta; the touched documents and
/// their partial scores stay in s.touched / a. With kAllow, postings of documents whose allow
/// entry is 0 are skipped: they are never touched, so theta is the k-th largest partial score of
/// allowed documents and the stopping rule holds for the allowed set. (The sentinel plan runs the
/// kAllow = false walk over an accumulator whose masked entries are -inf: they never read as 0,
/// so they are never touched either, with the same effect and no mask read.)
template <bool kAllow>
float score_at_a_time(exact_state& s, float* a, const uint32_t* ids, const uint16_t* imp, const uint8_t* allow,
                      size_t k, float ub_max, float avg_nnz, float& theta) {
    float lambda = ub_max * 0.5f;
    // A weight so large that w * impact overflows float32 (finite weights up to 3.4e38 are
    // valid): halving inf stays inf and no posting reaches an infinite cut, so the rounds would
    // never end. One final round over every posting instead (the scores are the forward-index
    // ones either way).
    if (!std::isfinite(lambda)) lambda = 0.0f;
    float L = 0.0f;
    for (;;) {
        for (term_cursor& tc : s.terms) {
            const float cut = lambda / tc.w;
            uint64_t c = tc.cur;
            const uint64_t e = tc.end;
            const float w = tc.w;
            while (c < e && static_cast<float>(imp[c]) >= cut) {
                const uint32_t d = ids[c];
                if (kAllow && allow[d] == 0) {  // a masked document is never touched
                    ++c;
                    continue;
                }
                const float v = a[d];
                if (v == 0.0f) s.touched.push_back(d);
                a[d] = v + w * static_cast<float>(imp[c]);
                ++c;
            }
            tc.cur = c;
        }
        L = 0.0f;
        for (const term_cursor& tc : s.terms) {
            if (tc.cur < tc.end) L += tc.w * static_cast<float>(imp[tc.cur]);
        }
        if (L == 0.0f) break;  // every list exhausted: partial scores are complete
        if (s.touched.size() >= k) {
            // theta = k-th largest partial score (only values above the old theta matter)
            s.buf.clear();
            for (uint32_t d : s.touched) {
                if (a[d] >= theta) s.buf.push_back(a[d]);
            }
            if (s.buf.size() >= k) {
                std::nth_element(s.buf.begin(), s.buf.begin() + (k - 1), s.buf.end(), std::greater<float>());
                theta = std::max(theta, s.buf[k - 1]);
            }
        }
        if (L * (1.0f + kExactEps) < theta * (1.0f - kExactEps)) {
            // Candidates now vs postings of one more round.
            const float lim = theta * (1.0f - kExactEps) - L * (1.0f + kExactEps);
            size_t n_cand = 0;
            for (uint32_t d : s.touched) n_cand += a[d] >= lim;
            double next = 0.0;
            const float next_lambda = lambda * 0.5f;
            for (const term_cursor& tc : s.terms) {
                const float cut = next_lambda / tc.w;
                // postings in [cur, first index with imp < cut): impacts are non-increasing
                uint64_t l = tc.cur, r = tc.end;
                while (l < r) {
                    const uint64_t mid = l + (r - l) / 2;
                    if (static_cast<float>(imp[mid]) >= cut) l = mid + 1; else r = mid;
                }
                next += static_cast<double>(l - tc.cur);
            }
            if (static_cast<double>(n_cand) * avg_nnz <= next * 2.0) break;
        }
        lambda *= 0.5f;
        if (lambda < 1e-30f) lambda = 0.0f;  // final round takes the rest
    }
    return L;
}

/// A sparse_seismic_topk worker's scratch, reused across its queries.
struct seismic_state {
    struct hit {  // the entry range of a query term among one term's summary components
        uint64_t b, e;
        float w;
    };
    scratch_lease lease;  // qd (vocab, zero between queries) and stamp (n_docs)
    std::vector<uint64_t> order;
    std::vector<std::pair<uint32_t, float>> qs;       // (term, weight > 0), ascending term
    std::vector<float> ub;                            // summary scores of one term's blocks
    std::vector<hit> hits;
    std::vector<uint32_t> todo;                       // documents of one block to score
    std::vector<std::pair<float, uint64_t>> blocks;  // (summary score, block)
    topk_heap heap;
};

/// Summary scores (in units of summary_scale) of all of term t's blocks into s.ub, for the query
/// terms s.qs (sparse_seismic_topk).
void summary_scores(const blocks_view& bl, uint32_t t, seismic_state& s) {
    const uint64_t b0 = bl.term_blocks[t], nb = bl.term_blocks[t + 1] - b0;
    s.ub.assign(nb, 0.0f);
    float* ub = s.ub.data();
    const uint64_t* dir = bl.summary_dir;
    const uint64_t ce = bl.summary_comp_offsets[t + 1];
    const uint64_t e0 = bl.summary_entry_offsets[t], ne = bl.summary_entry_offsets[t + 1] - e0;
    const uint32_t* en = bl.summary_entries + e0;
    // Pass 1: the query terms among the components (galloping search from the last
    // match: both lists ascend), their entry ranges collected and prefetched.
    s.hits.clear();
    uint64_t c = bl.summary_comp_offsets[t];
    for (const auto& [qt, w] : s.qs) {
        if (c == ce) break;
        const uint64_t key = static_cast<uint64_t>(qt) << 32;
        if (dir[c] < key) {
            uint64_t step = 1, lo_c = c;
            while (lo_c + step < ce && dir[lo_c + step] < key) {
                lo_c += step;
                step <<= 1;
            }
            const uint64_t hi_c = std::min<uint64_t>(ce, lo_c + step + 1);
            c = static_cast<uint64_t>(std::lower_bound(dir + lo_c + 1, dir + hi_c, key) - dir);
            if (c == ce) break;
        }
        if ((dir[c] >> 32) != qt) continue;
        const uint64_t r = dir[c] & 0xffffffffu;
        const uint64_t r_end = c + 1 < ce ? (dir[c + 1] & 0xffffffffu) : ne;
#if defined(__GNUC__)
        __builtin_prefetch(en + r);
#endif
        s.hits.push_back(seismic_state::hit{r, r_end, w});
        ++c;
    }
    // Pass 2: each hit's entries add w * v to their block.
    for (const auto& h : s.hits) {
        const float w = h.w;
        for (uint64_t i = h.b; i < h.e; ++i) {
            const uint32_t x = en[i];
            ub[x >> 8] += w * static_cast<float>(x & 0xffu);
        }
    }
}

}  // namespace

forward_score_impl forward_score_impl_for_cpu() {
    static const forward_score_impl best = [] {
        if (cpu_has_avx2()) return forward_score_impl::avx2;
#if defined(__SSE2__)
        return forward_score_impl::sse2;
#else
        return forward_score_impl::scalar;
#endif
    }();
    return best;
}

forward_score_impl parse_forward_score_impl(const std::string& name) {
    forward_score_impl impl;
    bool supported = true;
    if (name == "auto") {
        impl = forward_score_impl::automatic;
    } else if (name == "scalar") {
        impl = forward_score_impl::scalar;
    } else if (name == "sse2") {
        impl = forward_score_impl::sse2;
#if !defined(__SSE2__)
        supported = false;
#endif
    } else if (name == "avx2") {
        impl = forward_score_impl::avx2;
        supported = cpu_has_avx2();
    } else {
        bad("impl must be one of 'auto', 'scalar', 'sse2', 'avx2'; got '" + name + "'");
    }
    if (!supported) bad("impl '" + name + "' is not supported on this CPU");
    return impl;
}

sparse_filter_plan parse_sparse_filter_plan(const std::string& name) {
    if (name == "auto") return sparse_filter_plan::automatic;
    if (name == "postings") return sparse_filter_plan::postings;
    if (name == "sentinel") return sparse_filter_plan::sentinel;
    if (name == "passing") return sparse_filter_plan::passing;
    bad("filter_plan must be one of 'auto', 'postings', 'sentinel', 'passing'; got '" + name + "'");
}

void sparse_exact_topk(const u16_postings_view& p, const forward_view& f, const query_batch_view& queries,
                       size_t vocab, int n_threads, forward_score_impl score_impl, const topk_out& out,
                       const uint8_t* allow, sparse_filter_plan filter_plan) {
    const forward_score_impl impl =
        score_impl == forward_score_impl::automatic ? forward_score_impl_for_cpu() : score_impl;
    const size_t n_docs = p.n_docs;
    const float avg_nnz = n_docs ? static_cast<float>(f.nnz) / static_cast<float>(n_docs) + 1.0f : 1.0f;
    // With an allow mask: the allowed documents, listed when few enough that scoring them all from
    // the forward index can beat walking the query's postings (decided per query below).
    std::vector<uint32_t> pass;
    bool listed = false, sentinel = false;
    if (allow != nullptr) {
        size_t n_pass = 0;
        for (size_t d = 0; d < n_docs; ++d) n_pass += allow[d] != 0;
        const double frac = n_docs ? static_cast<double>(n_pass) / static_cast<double>(n_docs) : 1.0;
        if (filter_plan == sparse_filter_plan::passing ||
            (filter_plan == sparse_filter_plan::automatic && frac <= kPassListFraction)) {
            pass.reserve(n_pass);
            for (size_t d = 0; d < n_docs; ++d) {
                if (allow[d] != 0) pass.push_back(static_cast<uint32_t>(d));
            }
            listed = true;
        }
        const size_t per_worker = queries.nq / std::max<size_t>(1, resolve_threads(n_threads, queries.nq));
        sentinel = filter_plan == sparse_filter_plan::sentinel ||
                   (filter_plan == sparse_filter_plan::automatic && frac >= kSentinelFraction &&
                    per_worker >= kSentinelMinQueries);
    }
    const bool force_pass = filter_plan == sparse_filter_plan::passing && allow != nullptr;
    const double pass_cost = static_cast<double>(pass.size()) * static_cast<double>(avg_nnz);
    // Dense columns shared by the batch's dense-path queries (read-only once built).
    std::vector<int32_t> col_of;
    std::vector<float> columns;
    dense_columns(p, queries, vocab, col_of, columns);
    parallel_for_items(queries.nq, n_threads, kChunk, [&]() {
        auto st = std::make_shared<exact_state>();
        st->lease.s->ensure(vocab, n_docs, true, false);
        return [&, st](size_t q) {
            exact_state& s = *st;
            sparse_scratch& sc = *s.lease.s;
            s.lease.ok = false;  // set again when the query completes
            const size_t k = out.k;
            s.heap.reset(k);
            s.touched.clear();
            s.terms.clear();
            const uint64_t lo = queries.q_offsets[q], hi = queries.q_offsets[q + 1];
            float ub_max = 0.0f;
            for (uint64_t j = lo; j < hi; ++j) {
                const uint32_t t = queries.q_terms[j];
                const float w = queries.q_weights[j];
                const uint64_t b = p.csr.offsets[t], e = p.csr.offsets[t + 1];
                if (!(w > 0.0f) || b == e) continue;
                s.terms.push_back(term_cursor{w, t, b, e});
                ub_max = std::max(ub_max, w * static_cast<float>(p.impacts[b]));
            }
            float* a = sc.acc.data();
            const uint32_t* ids = p.csr.doc_ids;
            const uint16_t* imp = p.impacts;
            size_t total = 0;
            for (const term_cursor& tc : s.terms) total += static_cast<size_t>(tc.end - tc.cur);
            float* qd = sc.qd.data();
            if (force_pass || (listed && pass_cost <= static_cast<double>(total))) {
                // Filter path: the allowed documents' rows hold fewer entries than the query's
                // lists; score each allowed document exactly (the same forward score as every
                // other path, so the same hits).
                for (uint64_t j = lo; j < hi; ++j) qd[queries.q_terms[j]] = queries.q_weights[j];
                const size_t np_ = pass.size();
                for (size_t i = 0; i < np_; ++i) {
                    if (i + 4 < np_) prefetch_doc(f, pass[i + 4]);
                    const uint32_t d = pass[i];
                    const float score = forward_score(f, qd, d, impl);
                    if (score > 0.0f) s.heap.push(score, d);
                }
                for (uint64_t j = lo; j < hi; ++j) qd[queries.q_terms[j]] = 0.0f;
                write_row(s.heap, out, q);
                s.lease.ok = true;
                return;
            }
            if (sentinel && s.preset_n == 0) {  // once per worker, at its first query that walks
                preset_masked(a, allow, n_docs);
                s.preset_n = n_docs;
            }
            if (n_docs <= kDenseMaxDocs &&
                static_cast<double>(total) >= kDenseRatio * static_cast<double>(n_docs)) {
                // Dense path: the query's lists cover the collection several times over, so plain
                // term-at-a-time into the dense accumulator beats any bookkeeping. theta = k-th
                // largest accumulated score; documents within the float slack of it are re-scored
                // exactly from the forward index (same final scores as every other path).
                // (The accumulator fits in L2 here, so no prefetching; four independent loads per
                // step of the scatter.)
                s.col_ptr.clear();
                s.col_w.clear();
                for (const term_cursor& tc : s.terms) {
                    if (!col_of.empty() && col_of[tc.term] >= 0) {
                        s.col_ptr.push_back(columns.data() + static_cast<size_t>(col_of[tc.term]) * n_docs);
                        s.col_w.push_back(tc.w);
                    } else {
                        scatter_list(a, ids, imp, tc.cur, tc.end, tc.w);
                    }
                }
                if (!s.col_ptr.empty()) add_columns(a, s.col_ptr.data(), s.col_w.data(), s.col_ptr.size(), n_docs);
                if (allow != nullptr) {  // masked documents can never be selected
                    for (size_t d = 0; d < n_docs; ++d) a[d] = allow[d] != 0 ? a[d] : 0.0f;
                }
                select_dense(a, n_docs, k, kExactEps, s.bmax, s.buf, s.cand);
                for (uint64_t j = lo; j < hi; ++j) qd[queries.q_terms[j]] = queries.q_weights[j];
                if (s.preset_n != 0) preset_masked(a, allow, n_docs); else std::fill(a, a + n_docs, 0.0f);
                for (uint32_t d : s.cand) {
                    const float score = forward_score(f, qd, d, impl);
                    if (score > 0.0f) s.heap.push(score, d);
                }
                for (uint64_t j = lo; j < hi; ++j) qd[queries.q_terms[j]] = 0.0f;
                write_row(s.heap, out, q);
                s.lease.ok = true;
                return;
            }
            // Phase 1: score-at-a-time rounds until no untouched document can enter.
            float theta = 0.0f;
            const float L = allow != nullptr && !sentinel
                                ? score_at_a_time<true>(s, a, ids, imp, allow, k, ub_max, avg_nnz, theta)
                                : score_at_a_time<false>(s, a, ids, imp, allow, k, ub_max, avg_nnz, theta);
            // Phase 2: exact scores of the candidates from the forward index.
            const float lim = L == 0.0f ? theta * (1.0f - kExactEps) : theta * (1.0f - kExactEps) - L * (1.0f + kExactEps);
            for (uint64_t j = lo; j < hi; ++j) qd[queries.q_terms[j]] = queries.q_weights[j];
            s.cand.clear();
            for (uint32_t d : s.touched) {
                if (a[d] >= lim) s.cand.push_back(d);
                a[d] = 0.0f;
            }
            const size_t nc = s.cand.size();
            for (size_t i = 0; i < nc; ++i) {
                if (i + 4 < nc) prefetch_doc(f, s.cand[i + 4]);
                const uint32_t d = s.cand[i];
                const float score = forward_score(f, qd, d, impl);
                if (score > 0.0f) s.heap.push(score, d);
            }
            for (uint64_t j = lo; j < hi; ++j) qd[queries.q_terms[j]] = 0.0f;
            write_row(s.heap, out, q);
            s.lease.ok = true;
        };
    });
}

void sparse_seismic_topk(const forward_view& f, const blocks_view& bl, const query_batch_view& queries,
                         size_t query_cut, float heap_factor, int n_threads, forward_score_impl score_impl,
                         const topk_out& out, const uint8_t* allow) {
    const forward_score_impl impl =
        score_impl == forward_score_impl::automatic ? forward_score_impl_for_cpu() : score_impl;
    const size_t vocab = bl.n_terms;
    parallel_for_items(queries.nq, n_threads, kChunk, [&]() {
        auto st = std::make_shared<seismic_state>();
        st->lease.s->ensure(vocab, f.n_docs, false, true);
        return [&, st](size_t q) {
            seismic_state& s = *st;
            sparse_scratch& sc = *s.lease.s;
            s.lease.ok = false;  // set again when the query completes
            const uint32_t gen = sc.next_gen();
            uint32_t* stamp = sc.stamp.data();
            s.heap.reset(out.k);
            const uint64_t lo = queries.q_offsets[q], hi = queries.q_offsets[q + 1];
            float* qd = sc.qd.data();
            s.order.resize(hi - lo);
            s.qs.clear();
            for (uint64_t j = lo; j < hi; ++j) {
                qd[queries.q_terms[j]] = queries.q_weights[j];
                s.order[j - lo] = j;
                if (queries.q_weights[j] > 0.0f) s.qs.emplace_back(queries.q_terms[j], queries.q_weights[j]);
            }
            std::sort(s.qs.begin(), s.qs.end());
            // Largest weights first; ties by term id (deterministic).
            std::sort(s.order.begin(), s.order.end(), [&](uint64_t x, uint64_t y) {
                const float wx = queries.q_weights[x], wy = queries.q_weights[y];
                return wx > wy || (wx == wy && queries.q_terms[x] < queries.q_terms[y]);
            });
            const bool packed = bl.n_packed != 0;
            float* qr = sc.qr.data();
            if (packed) {
                for (uint64_t j = lo; j < hi; ++j) qr[bl.term_rank[queries.q_terms[j]]] = queries.q_weights[j];
            }
            const size_t n_cut = std::min<size_t>(query_cut, s.order.size());
            for (size_t oi = 0; oi < n_cut; ++oi) {
                const uint32_t t = queries.q_terms[s.order[oi]];
                if (queries.q_weights[s.order[oi]] <= 0.0f) break;
                // Summary scores of all the term's blocks, term-at-a-time over its inverted
                // summaries: for each query term (ascending) found among the term's summary
                // components (ascending; the search resumes where the last one ended), its
                // entries add w * v to their block. Then the blocks in decreasing summary score:
                // the heap fills with good documents first, and the first block below
                // heap_factor * threshold ends the list (every later one scores lower still).
                const uint64_t b0 = bl.term_blocks[t], nb = bl.term_blocks[t + 1] - b0;
                if (nb == 0) continue;
                summary_scores(bl, t, s);
                const float* ub = s.ub.data();
                // Blocks already below the cut (heap full) can never be visited (the threshold
                // only rises): left out before sorting.
                s.blocks.clear();
                const float cut0 = s.heap.full() ? heap_factor * s.heap.threshold() : -1.0f;
                for (uint64_t j = 0; j < nb; ++j) {
                    const float u = ub[j] * bl.summary_scale[b0 + j];
                    if (!(u < cut0)) s.blocks.emplace_back(u, b0 + j);
                }
                std::sort(s.blocks.begin(), s.blocks.end(), [](const auto& x, const auto& y) {
                    return x.first > y.first || (x.first == y.first && x.second < y.second);
                });
                for (const auto& [bound, b] : s.blocks) {
                    if (s.heap.full() && bound < heap_factor * s.heap.threshold()) break;
                    // The block's documents not yet scored (each scored once per query), then
                    // their exact scores, the next document's whole row prefetched meanwhile.
                    s.todo.clear();
                    const uint64_t e = bl.block_docs_offsets[b + 1];
                    for (uint64_t i = bl.block_docs_offsets[b]; i < e; ++i) {
                        const uint32_t d = bl.block_docs[i];
                        if (stamp[d] == gen || (allow != nullptr && allow[d] == 0)) continue;
                        stamp[d] = gen;
                        if (s.todo.empty()) {
                            if (packed) prefetch_packed_row(f.offsets, bl.packed, d); else prefetch_row(f, d);
                        }
                        s.todo.push_back(d);
                    }
                    const size_t nt = s.todo.size();
                    if (packed) {
                        for (size_t i = 0; i < nt; ++i) {
                            if (i + 1 < nt) prefetch_packed_row(f.offsets, bl.packed, s.todo[i + 1]);
                            const uint32_t d = s.todo[i];
                            const float sc = packed_score(f.offsets, bl.packed, f.scale, qr, d, impl);
                            if (sc > 0.0f) s.heap.push(sc, d);
                        }
                    } else {
                        for (size_t i = 0; i < nt; ++i) {
                            if (i + 1 < nt) prefetch_row(f, s.todo[i + 1]);
                            const uint32_t d = s.todo[i];
                            const float sc = forward_score(f, qd, d, impl);
                            if (sc > 0.0f) s.heap.push(sc, d);
                        }
                    }
                }
            }
            for (uint64_t j = lo; j < hi; ++j) qd[queries.q_terms[j]] = 0.0f;
            if (packed) {
                for (uint64_t j = lo; j < hi; ++j) qr[bl.term_rank[queries.q_terms[j]]] = 0.0f;
            }
            write_row(s.heap, out, q);
            s.lease.ok = true;
        };
    });
}

}  // namespace retriever
