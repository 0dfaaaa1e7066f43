// Exact full-dimension re-scoring of a candidate shortlist (the last stage of Matryoshka funnel
// search: AdANNS, Rege et al., NeurIPS 2023; Kusupati et al., NeurIPS 2022).
//
// For every query: gather its candidate rows from the stored (n, d) float16 or float32 matrix,
// compute inner products at full dimension, keep the top-k by (score desc, id asc).
//
// Accumulation order is fixed and depends only on d: products of float32 values are exact in
// float64 and are summed into 8 float64 lanes (lane j takes coordinates i with i % 8 == j, in
// increasing i), then the lanes are added in the order ((0+1)+(2+3))+((4+5)+(6+7)) and the sum
// is rounded to float32 once. So a query's scores never depend on its batch, the thread that
// ran it or the other candidates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "postings_topk.hpp"  // topk_out

namespace retriever {

/// Stored vectors of one shard: exactly one of f16 (IEEE binary16 bit patterns) / f32 is set.
struct dense_matrix_view {
    const uint16_t* f16 = nullptr;
    const float* f32 = nullptr;
    size_t n = 0;  // rows
    size_t d = 0;  // dimension
};

/// Candidate lists: query i's candidates are cand[i * kk .. i * kk + kk); -1 = no candidate.
struct candidate_view {
    const int64_t* cand = nullptr;
    size_t nq = 0;
    size_t kk = 0;
};

/// Throws std::invalid_argument naming the first candidate id outside [-1, n).
void check_candidates(const candidate_view& c, size_t n);

/// float64-accumulated inner product of a float32 query with stored row `row` (order above);
/// `scratch` holds d floats (the row converted from float16).
float dense_dot(const float* q, const dense_matrix_view& m, size_t row, float* scratch);

/// Code path of rescore_topk: automatic = AVX-512 where available. Every path returns
/// bit-identical scores (same lanes, same order; see rescore.cpp).
enum class rescore_impl { automatic = 0, portable = 1, avx512 = 2 };

/// True when the CPU (and OS) support rescore_topk's AVX-512F (+F16C) code path.
bool rescore_has_avx512();

/// Exact re-scoring + top-k. q: float32 (nq, d) queries; ids written are cand + base
/// (global ordinals); rows padded with -1 / -inf after n_found. Candidates must be checked.
/// Throws std::invalid_argument for impl = avx512 on a CPU without it.
void rescore_topk(const float* q, const dense_matrix_view& m, const candidate_view& c, int64_t base,
                  int n_threads, const topk_out& out, rescore_impl impl = rescore_impl::automatic);

}  // namespace retriever

namespace retriever {

/// Running top-kk of a query block, stored as one binary min-heap per query row (root = the
/// worst kept entry by (score asc, id desc)); initialise scores to -inf and ids to -1.
struct heap_rows_view {
    float* scores = nullptr;  // (nq, kk)
    int64_t* ids = nullptr;   // (nq, kk)
    size_t nq = 0;
    size_t kk = 0;
};

/// Pushes a block of candidate scores into the heaps: row i of `scores` (nq, nd) holds query i's
/// scores of documents first_id .. first_id + nd - 1. A candidate enters when it ranks before
/// the root (higher score, or equal score and smaller id). NaN scores never enter, nor does a
/// column j with allow[j] == 0 (allow: nd entries aligned with the block, or nullptr).
void heap_push_block(const float* scores, size_t nd, int64_t first_id, const heap_rows_view& h,
                     int n_threads, const uint8_t* allow = nullptr);

}  // namespace retriever
