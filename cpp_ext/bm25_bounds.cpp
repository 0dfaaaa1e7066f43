// Structures computed once when a BM25 index is opened (see postings_topk.hpp): per-term
// and per-block upper bounds of the tf part, precomputed impacts, single-term k-th
// values, membership bitmaps and dense impact rows of the long lists.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel.hpp"
#include "postings_topk.hpp"

namespace retriever {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

}  // namespace

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

}  // namespace retriever
