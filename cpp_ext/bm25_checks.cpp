// Validation of the BM25 kernels' inputs (see postings_topk.hpp): the O(nnz) CSR check
// run once at index open, and the O(m) per-call checks of a query batch and of the
// bounds its terms use.

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "postings_topk.hpp"

namespace retriever {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

}  // namespace

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

}  // namespace retriever
