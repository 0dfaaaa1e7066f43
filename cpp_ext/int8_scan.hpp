// Exact top-k' scan of int8-quantised Matryoshka prefixes (funnel candidate generation).
//
// The scan scores every document of a shard against a block of queries with integer dot
// products and keeps each query's top-k' (score desc, id asc). Integer arithmetic is exact, so
// the result is the same for every code path (AVX-512 VNNI or portable), thread count and batch;
// the candidates are then re-scored at full dimension (rescore.hpp).
//
// Layout of the document codes ("16-doc blocks, 4-byte groups"): codes are uint8 (a signed code
// c in [-127, 127] stored as c + 128, so 128 is zero). Documents are packed in blocks of 16;
// block b holds documents 16b .. 16b + 15 (past n: padding, never returned) and is d4 groups of
// 64 bytes: group g holds coordinates 4g .. 4g + 3 of each of the 16 documents, document i at
// bytes [4i, 4i + 4). So one 64-byte load gives 16 documents x 4 coordinates, the operand shape
// of the VNNI instruction vpdpbusd (u8 x s8 -> s32, 4 products per 32-bit lane).
//
// Query codes are int8 (nq, 4 * d4). score(q, d) = sum_t (code_d[t] + 128) * q[t] in int32
// (|score| <= 255 * 128 * 4 * d4 < 2^31 for d4 <= 16384); the per-query constant
// 128 * sum_t q[t] is not subtracted (it does not change a query's ranking).
//
// Loop order: blocks of up to 64 queries (the unit of threading) pass over the codes in chunks of
// ~192 KiB (kept in L2 while the block passes); within a chunk, 8 queries x 48 documents are one
// register tile (24 accumulators, one vpdpbusd per query, 16 documents and 4 coordinates). A
// tile's scores are compared with each query's current k'-th score in one instruction; the few
// that pass go into a per-query reservoir (append; when it holds 2k' entries the best k' are kept
// with nth_element), which costs O(1) per candidate instead of a heap walk.
#pragma once

#include <cstddef>
#include <cstdint>

namespace retriever {

constexpr size_t kI8BlockDocs = 16;
constexpr size_t kI8MaxGroups = 16384;

struct u8_packed_view {
    const uint8_t* codes = nullptr;  // n_blocks * d4 * 64 bytes
    size_t n = 0;                    // documents (n_blocks = ceil(n / 16))
    size_t d4 = 0;                   // groups of 4 coordinates
    // Optional allow mask, one 16-bit word per block (bit i: document 16b + i may be returned);
    // nullptr: every document. Masked documents never enter a query's top-kk.
    const uint16_t* allow16 = nullptr;
};

/// Output: rows sorted by (score desc, id asc); ids are shard-local ordinals.
struct i8_topk_out {
    int32_t* scores = nullptr;  // (nq, kk)
    int64_t* ids = nullptr;     // (nq, kk)
    size_t kk = 0;              // 1 <= kk <= n
};

enum class i8_impl { automatic = 0, portable = 1, vnni = 2 };

/// True when the CPU (and OS) support the AVX-512 VNNI code path.
bool int8_scan_has_vnni();

/// Exact top-kk of every query (q: int8 (nq, 4 * m.d4)) over the packed codes. `impl`
/// chooses the code path (automatic: VNNI where available); every path returns identical
/// results. Throws std::invalid_argument for impl = vnni on a CPU without it. With m.allow16,
/// a row holds the allowed documents only; when fewer than kk are allowed its tail has id -1 and
/// score INT32_MIN.
void int8_scan_topk(const int8_t* q, size_t nq, const u8_packed_view& m, const i8_topk_out& out, int n_threads,
                    i8_impl impl);

}  // namespace retriever
