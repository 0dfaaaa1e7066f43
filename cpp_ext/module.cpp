// Python bindings of the query-time kernels: retriever._kernels.
//
// The only file that includes pybind11. Every entry point follows the same
// pattern (STYLE.md 2.2):
//   1. arguments arrive as py::array_t<T, c_style> marked .noconvert(), so an
//      array of the wrong dtype or layout raises TypeError instead of being
//      silently copied;
//   2. with the GIL held: shapes, lengths and scalars are checked
//      (std::invalid_argument -> ValueError naming the argument and value) and
//      the outputs are allocated;
//   3. the GIL is released in a sub-scope around the pure C++ work (including
//      the O(m) per-call checks of query contents);
//   4. the outputs are returned after the scope closes.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "postings_topk.hpp"

namespace py = pybind11;
using namespace retriever;

namespace {

template <class T>
using carray = py::array_t<T, py::array::c_style>;

template <class T>
using opt_carray = std::optional<carray<T>>;

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

template <class T>
size_t len1d(const carray<T>& a, const char* name) {
    if (a.ndim() != 1) {
        fail(std::string(name) + " must be 1-dimensional, got ndim = " + std::to_string(a.ndim()));
    }
    return static_cast<size_t>(a.shape(0));
}

void require_eq(size_t got, size_t want, const std::string& what, const std::string& against) {
    if (got != want) {
        fail(what + " = " + std::to_string(got) + " must equal " + against + " = " +
             std::to_string(want));
    }
}

/// Checks the CSR arrays' lengths (O(1)); content is checked by check_csr at open.
csr_view make_csr(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids) {
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
void check_offsets(const csr_view& csr) {
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
void check_query_term_ranges(const csr_view& csr, const query_batch_view& q) {
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

query_batch_view make_queries(const carray<uint64_t>& q_offsets, const carray<uint32_t>& q_terms,
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

int64_t check_k(int64_t k) {
    if (k < 1) fail("k must be >= 1, got " + std::to_string(k));
    return k;
}

const uint8_t* allow_ptr(const opt_carray<uint8_t>& allow, size_t n_docs, bool check_len) {
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

void py_check_csr(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids, int64_t n_docs) {
    if (n_docs < 0) fail("n_docs must be >= 0, got " + std::to_string(n_docs));
    const size_t n_off = len1d(offsets, "offsets");
    if (n_off == 0) fail("offsets must have length n_terms + 1 >= 1, got length 0");
    csr_view csr;
    csr.offsets = offsets.data();
    csr.n_terms = n_off - 1;
    csr.doc_ids = doc_ids.data();
    csr.nnz = len1d(doc_ids, "doc_ids");
    {
        py::gil_scoped_release nogil;
        check_csr(csr, static_cast<uint64_t>(n_docs));
    }
}

bm25_view make_bm25(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids,
                    const carray<uint32_t>& tfs, const carray<float>& doc_norm) {
    bm25_view v;
    v.csr = make_csr(offsets, doc_ids);
    require_eq(len1d(tfs, "tfs"), v.csr.nnz, "len(tfs)", "len(doc_ids)");
    v.tfs = tfs.data();
    v.doc_norm = doc_norm.data();
    v.n_docs = len1d(doc_norm, "doc_norm");
    if (v.n_docs > kMaxDocs) {
        fail("len(doc_norm) = " + std::to_string(v.n_docs) + " exceeds the supported maximum " +
             std::to_string(kMaxDocs));
    }
    return v;
}

uint32_t check_block_size(int64_t block_size) {
    if (block_size < 1 || block_size > (int64_t{1} << 30)) {
        fail("block_size must be in [1, 2**30], got " + std::to_string(block_size));
    }
    return static_cast<uint32_t>(block_size);
}

std::tuple<carray<float>, carray<uint64_t>, carray<float>> py_bm25_upper_bounds(
    const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids, const carray<uint32_t>& tfs,
    const carray<float>& doc_norm, int64_t block_size, int n_threads) {
    const bm25_view data = make_bm25(offsets, doc_ids, tfs, doc_norm);
    const uint32_t bs = check_block_size(block_size);
    check_offsets(data.csr);
    const size_t T = data.csr.n_terms;
    carray<float> term_ub(std::vector<py::ssize_t>{static_cast<py::ssize_t>(T)});
    carray<uint64_t> block_offsets(std::vector<py::ssize_t>{static_cast<py::ssize_t>(T + 1)});
    const uint64_t n_blocks = bm25_block_offsets(data.csr, bs, block_offsets.mutable_data());
    carray<float> block_ub(std::vector<py::ssize_t>{static_cast<py::ssize_t>(n_blocks)});
    float* tub = term_ub.mutable_data();
    const uint64_t* boff = block_offsets.data();
    float* bub = block_ub.mutable_data();
    {
        py::gil_scoped_release nogil;
        bm25_upper_bounds(data, bs, boff, n_threads, tub, bub);
    }
    return {term_ub, block_offsets, block_ub};
}

topk_result py_bm25_topk(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids,
                         const carray<uint32_t>& tfs, const carray<float>& doc_norm,
                         const carray<uint64_t>& q_offsets, const carray<uint32_t>& q_terms,
                         const carray<float>& q_weights, int64_t k, int n_threads,
                         const opt_carray<uint8_t>& allow, const std::string& algorithm,
                         const opt_carray<float>& term_ub, const opt_carray<uint64_t>& block_offsets,
                         const opt_carray<float>& block_ub, int64_t block_size) {
    const bm25_view data = make_bm25(offsets, doc_ids, tfs, doc_norm);
    const query_batch_view queries = make_queries(q_offsets, q_terms, q_weights);
    check_k(k);
    const uint8_t* allow_p = allow_ptr(allow, data.n_docs, true);
    const bm25_algorithm algo = parse_bm25_algorithm(algorithm);

    bm25_bounds_view bounds;
    const bool need_ub = algo != bm25_algorithm::exhaustive;
    const bool need_blocks =
        algo == bm25_algorithm::block_max_wand || algo == bm25_algorithm::block_max_maxscore;
    if (need_ub) {
        if (!term_ub) {
            fail("algorithm '" + algorithm +
                 "' requires term_ub (compute it once with bm25_upper_bounds)");
        }
        require_eq(len1d(*term_ub, "term_ub"), data.csr.n_terms, "len(term_ub)", "n_terms");
        bounds.term_ub = term_ub->data();
    }
    if (need_blocks) {
        if (!block_offsets || !block_ub) {
            fail("algorithm '" + algorithm +
                 "' requires block_offsets and block_ub (compute them once with bm25_upper_bounds)");
        }
        bounds.block_size = check_block_size(block_size);
        require_eq(len1d(*block_offsets, "block_offsets"), data.csr.n_terms + 1,
                   "len(block_offsets)", "n_terms + 1");
        bounds.block_offsets = block_offsets->data();
        bounds.block_ub = block_ub->data();
        bounds.n_blocks = len1d(*block_ub, "block_ub");
        require_eq(static_cast<size_t>(bounds.block_offsets[data.csr.n_terms]), bounds.n_blocks,
                   "block_offsets[-1]", "len(block_ub)");
    }

    topk_arrays res(queries.nq, static_cast<size_t>(k));
    {
        py::gil_scoped_release nogil;
        check_query_batch(queries, data.csr.n_terms);
        check_query_term_ranges(data.csr, queries);
        if (need_ub) check_bounds_for_queries(data.csr, bounds, queries);
        bm25_topk(data, need_ub ? &bounds : nullptr, queries, allow_p, algo, n_threads, res.out);
    }
    return res.result();
}

topk_result py_impact_topk(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids,
                           const carray<float>& impacts, const carray<uint64_t>& q_offsets,
                           const carray<uint32_t>& q_terms, const carray<float>& q_weights,
                           int64_t k, int n_threads, const opt_carray<uint8_t>& allow) {
    const csr_view csr = make_csr(offsets, doc_ids);
    require_eq(len1d(impacts, "impacts"), csr.nnz, "len(impacts)", "len(doc_ids)");
    const query_batch_view queries = make_queries(q_offsets, q_terms, q_weights);
    check_k(k);
    const uint8_t* allow_p = allow_ptr(allow, 0, false);
    const size_t allow_len = allow ? static_cast<size_t>(allow->shape(0)) : 0;
    const float* imp = impacts.data();

    topk_arrays res(queries.nq, static_cast<size_t>(k));
    {
        py::gil_scoped_release nogil;
        check_query_batch(queries, csr.n_terms);
        check_query_term_ranges(csr, queries);
        impact_topk_f32(csr, imp, queries, allow_p, allow_len, n_threads, res.out);
    }
    return res.result();
}

}  // namespace

PYBIND11_MODULE(_kernels, m) {
    m.doc() =
        "Query-time kernels of retriever (C++, pybind11).\n\n"
        "Stateless functions over numpy arrays; see retriever/_kernels.pyi for the full\n"
        "contracts. Arrays must already have the exact dtype and be C-contiguous\n"
        "(TypeError otherwise; nothing is copied). Bad values raise ValueError naming the\n"
        "argument. The GIL is released while the kernels run.\n\n"
        "Top-k outputs: ids int64 (nq, k) padded with -1, scores float32 (nq, k) padded\n"
        "with -inf, n_found int32 (nq,); rows sorted by score descending, ties by smaller\n"
        "doc id; bit-identical for any n_threads and (bm25) any algorithm.";

    m.def("check_csr", &py_check_csr, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("n_docs"),
          "O(nnz) structural check of CSR postings, run once at index open: offsets[0] == 0,\n"
          "non-decreasing, offsets[-1] == len(doc_ids); doc ids strictly increasing within a\n"
          "term and < n_docs. Raises ValueError naming the first violation.");

    m.def("bm25_upper_bounds", &py_bm25_upper_bounds, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("tfs").noconvert(),
          py::arg("doc_norm").noconvert(), py::arg("block_size") = 128, py::arg("n_threads") = 0,
          "Per-term and per-block maxima of tf / (tf + doc_norm[d]) for MaxScore and\n"
          "block-max pruning. Returns (term_ub f32[n_terms], block_offsets u64[n_terms + 1],\n"
          "block_ub f32[n_blocks]).");

    m.def("bm25_topk", &py_bm25_topk, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("tfs").noconvert(),
          py::arg("doc_norm").noconvert(), py::arg("q_offsets").noconvert(),
          py::arg("q_terms").noconvert(), py::arg("q_weights").noconvert(), py::arg("k"),
          py::arg("n_threads") = 0, py::arg("allow").noconvert() = py::none(),
          py::arg("algorithm") = "maxscore", py::arg("term_ub").noconvert() = py::none(),
          py::arg("block_offsets").noconvert() = py::none(),
          py::arg("block_ub").noconvert() = py::none(), py::arg("block_size") = 128,
          "Exact BM25 top-k over one shard's CSR postings for a ragged batch of queries.\n"
          "score(q, d) = sum over the query's terms, in order, of\n"
          "q_weights[i] * (tf / (tf + doc_norm[d])) in float32. algorithm: 'exhaustive',\n"
          "'maxscore', 'bmw' (block-max WAND) or 'bmm' (block-max MaxScore). Returns\n"
          "(ids, scores, n_found).");

    m.def("impact_topk", &py_impact_topk, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("impacts").noconvert(),
          py::arg("q_offsets").noconvert(), py::arg("q_terms").noconvert(),
          py::arg("q_weights").noconvert(), py::arg("k"), py::arg("n_threads") = 0,
          py::arg("allow").noconvert() = py::none(),
          "Exact learned-sparse top-k: score(q, d) = sum over the query's terms, in order,\n"
          "of q_weights[i] * impacts[p] in float32. Returns (ids, scores, n_found).");
}
