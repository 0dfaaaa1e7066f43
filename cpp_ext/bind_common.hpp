// Shared boundary helpers of the Python bindings (the bind_*.cpp files, one per leg, and
// module.cpp): exact-dtype C-contiguous array types, length checks and the views and
// output arrays every kernel binding builds.
//
// Every entry point follows the same pattern (STYLE.md 2.2):
//   1. arguments arrive as py::array_t<T, c_style> marked .noconvert(), so an
//      array of the wrong dtype or layout raises TypeError instead of being
//      silently copied;
//   2. with the GIL held: shapes, lengths and scalars are checked
//      (std::invalid_argument -> ValueError naming the argument and value) and
//      the outputs are allocated;
//   3. the GIL is released in a sub-scope around the pure C++ work (including
//      the O(m) per-call checks of query contents);
//   4. the outputs are returned after the scope closes.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "postings_topk.hpp"
#include "topk.hpp"

namespace retriever::bind {

namespace py = pybind11;

template <class T>
using carray = py::array_t<T, py::array::c_style>;

template <class T>
using opt_carray = std::optional<carray<T>>;

[[noreturn]] inline void fail(const std::string& msg) { throw std::invalid_argument(msg); }

template <class T>
inline size_t len1d(const carray<T>& a, const char* name) {
    if (a.ndim() != 1) {
        fail(std::string(name) + " must be 1-dimensional, got ndim = " + std::to_string(a.ndim()));
    }
    return static_cast<size_t>(a.shape(0));
}

inline void require_eq(size_t got, size_t want, const std::string& what, const std::string& against) {
    if (got != want) {
        fail(what + " = " + std::to_string(got) + " must equal " + against + " = " +
             std::to_string(want));
    }
}

/// Checks the CSR arrays' lengths (O(1)); content is checked by check_csr at open.
inline csr_view make_csr(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids) {
    const size_t n_off = len1d(offsets, "offsets");
    if (n_off == 0) fail("offsets must have length n_terms + 1 >= 1, got length 0");
    csr_view csr;
    csr.offsets = offsets.data();
    csr.n_terms = n_off - 1;
    csr.doc_ids = doc_ids.data();
    csr.nnz = len1d(doc_ids, "doc_ids");
    if (csr.offsets[csr.n_terms] != csr.nnz) {
        fail("offsets[-1] = " + std::to_string(csr.offsets[csr.n_terms]) +
             " must equal len(doc_ids) = " + std::to_string(csr.nnz));
    }
    return csr;
}

/// O(n_terms) check that offsets start at 0, never decrease and end at nnz, so that every
/// term's range [offsets[t], offsets[t+1]) lies inside doc_ids (run before any kernel that
/// walks all terms).
inline void check_offsets(const csr_view& csr) {
    const uint64_t* off = csr.offsets;
    if (off[0] != 0) fail("offsets[0] must be 0, got " + std::to_string(off[0]));
    for (size_t t = 0; t < csr.n_terms; ++t) {
        if (off[t + 1] < off[t]) {
            fail("offsets must be non-decreasing: offsets[" + std::to_string(t + 1) + "] = " +
                 std::to_string(off[t + 1]) + " < offsets[" + std::to_string(t) + "] = " +
                 std::to_string(off[t]));
        }
    }
}

/// O(m) check that the posting range of every queried term lies inside doc_ids (call after
/// check_query_batch, which guarantees q_terms < n_terms).
inline void check_query_term_ranges(const csr_view& csr, const query_batch_view& q) {
    for (size_t i = 0; i < q.m; ++i) {
        const uint32_t t = q.q_terms[i];
        const uint64_t b = csr.offsets[t], e = csr.offsets[t + 1];
        if (b > e || e > csr.nnz) {
            fail("offsets[" + std::to_string(t) + ":" + std::to_string(t + 2) + "] = [" +
                 std::to_string(b) + ", " + std::to_string(e) + "] is not a range inside doc_ids (len " +
                 std::to_string(csr.nnz) + "); validate the postings with check_csr");
        }
    }
}

inline query_batch_view make_queries(const carray<uint64_t>& q_offsets, const carray<uint32_t>& q_terms,
                              const carray<float>& q_weights) {
    const size_t n_off = len1d(q_offsets, "q_offsets");
    if (n_off == 0) fail("q_offsets must have length nq + 1 >= 1, got length 0");
    query_batch_view q;
    q.q_offsets = q_offsets.data();
    q.nq = n_off - 1;
    q.q_terms = q_terms.data();
    q.q_weights = q_weights.data();
    q.m = len1d(q_terms, "q_terms");
    require_eq(len1d(q_weights, "q_weights"), q.m, "len(q_weights)", "len(q_terms)");
    return q;
}

inline int64_t check_k(int64_t k) {
    if (k < 1) fail("k must be >= 1, got " + std::to_string(k));
    return k;
}

inline const uint8_t* allow_ptr(const opt_carray<uint8_t>& allow, size_t n_docs, bool check_len) {
    if (!allow) return nullptr;
    const size_t n = len1d(*allow, "allow");
    if (check_len) require_eq(n, n_docs, "len(allow)", "n_docs (len(doc_norm))");
    return allow->data();
}

using topk_result = std::tuple<carray<int64_t>, carray<float>, carray<int32_t>>;

struct topk_arrays {
    carray<int64_t> ids;
    carray<float> scores;
    carray<int32_t> n_found;
    topk_out out;

    topk_arrays(size_t nq, size_t k)
        : ids(std::vector<py::ssize_t>{static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(k)}),
          scores(std::vector<py::ssize_t>{static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(k)}),
          n_found(std::vector<py::ssize_t>{static_cast<py::ssize_t>(nq)}) {
        out.ids = ids.mutable_data();
        out.scores = scores.mutable_data();
        out.n_found = n_found.mutable_data();
        out.k = k;
    }
    topk_result result() { return {ids, scores, n_found}; }
};

// ---- bindings ---------------------------------------------------------------

/// Registration of each leg's kernels on the extension module (bind_bm25.cpp,
/// bind_sparse.cpp, bind_dense.cpp, bind_fusion.cpp).
void register_bm25(py::module_& m);
void register_sparse(py::module_& m);
void register_dense(py::module_& m);
void register_fusion(py::module_& m);
void register_docs(py::module_& m);

}  // namespace retriever::bind
