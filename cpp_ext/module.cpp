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

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "postings_topk.hpp"
#include "query_terms.hpp"
#include "int8_scan.hpp"
#include "rescore.hpp"
#include "topk.hpp"

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
    const csr_view csr = make_csr(offsets, doc_ids);
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

carray<float> py_bm25_impacts(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids,
                              const carray<uint32_t>& tfs, const carray<float>& doc_norm,
                              int n_threads) {
    const bm25_view data = make_bm25(offsets, doc_ids, tfs, doc_norm);
    check_offsets(data.csr);
    carray<float> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(data.csr.nnz)});
    float* o = out.mutable_data();
    {
        py::gil_scoped_release nogil;
        bm25_impacts(data, n_threads, o);
    }
    return out;
}

/// bm25_topk's optional impacts / impact rows (checked against the postings) into data.
void attach_impacts(bm25_view& data, const opt_carray<float>& impacts, const opt_carray<float>& impact_rows,
                    const opt_carray<int32_t>& impact_row_slot) {
    if (impacts) {
        require_eq(len1d(*impacts, "impacts"), data.csr.nnz, "len(impacts)", "len(doc_ids)");
        data.impacts = impacts->data();
    }
    if (impact_rows || impact_row_slot) {
        if (!impact_rows || !impact_row_slot || !impacts) {
            fail("impact_rows and impact_row_slot go together, with impacts (from bm25_impact_rows)");
        }
        require_eq(len1d(*impact_row_slot, "impact_row_slot"), data.csr.n_terms, "len(impact_row_slot)", "n_terms");
        const size_t nr = len1d(*impact_rows, "impact_rows");
        if (data.n_docs == 0 ? nr != 0 : nr % data.n_docs != 0) {
            fail("len(impact_rows) = " + std::to_string(nr) + " is not a multiple of n_docs = " +
                 std::to_string(data.n_docs));
        }
        data.impact_rows = impact_rows->data();
        data.impact_row_slot = impact_row_slot->data();
        data.n_impact_rows = data.n_docs == 0 ? 0 : nr / data.n_docs;
    }
}

/// Every query term's impact row slot is -1 or a row of data.impact_rows (O(query terms)).
void check_impact_row_slots(const bm25_view& data, const query_batch_view& queries) {
    if (data.impact_row_slot == nullptr) return;
    for (size_t i = 0; i < queries.m; ++i) {
        const uint32_t t = queries.q_terms[i];
        const int32_t r = t < data.csr.n_terms ? data.impact_row_slot[t] : -1;  // t itself is checked elsewhere
        if (r < -1 || (r >= 0 && static_cast<size_t>(r) >= data.n_impact_rows)) {
            fail("impact_row_slot[" + std::to_string(t) + "] = " + std::to_string(r) +
                 " is neither -1 nor one of the " + std::to_string(data.n_impact_rows) +
                 " rows of impact_rows (compute them with bm25_impact_rows)");
        }
    }
}

/// term_ub (and term_kth, which needs term_ub) of a pruning algorithm, checked against the postings.
void attach_term_bounds(bm25_bounds_view& bounds, const bm25_view& data, const std::string& algorithm, int64_t k,
                        const opt_carray<float>& term_ub, const opt_carray<float>& term_kth, int64_t term_kth_depth) {
    if (!term_ub) {
        fail("algorithm '" + algorithm + "' requires term_ub (compute it once with bm25_upper_bounds)");
    }
    require_eq(len1d(*term_ub, "term_ub"), data.csr.n_terms, "len(term_ub)", "n_terms");
    bounds.term_ub = term_ub->data();
    if (term_kth) {
        require_eq(len1d(*term_kth, "term_kth"), data.csr.n_terms, "len(term_kth)", "n_terms");
        if (term_kth_depth != k) {
            fail("term_kth_depth = " + std::to_string(term_kth_depth) + " must equal k = " + std::to_string(k) +
                 " (term_kth must come from bm25_term_kth with depth = k)");
        }
        bounds.term_kth = term_kth->data();
    }
}

/// The membership bitmaps of bm25_dense_bitmaps (all three or none), checked against the postings.
void attach_dense_bitmaps(bm25_bounds_view& bounds, const bm25_view& data, const opt_carray<int32_t>& dense_slot,
                          const opt_carray<uint64_t>& dense_bits, const opt_carray<uint32_t>& dense_rank) {
    if (!dense_slot && !dense_bits && !dense_rank) return;
    if (!dense_slot || !dense_bits || !dense_rank) {
        fail("dense_slot, dense_bits and dense_rank go together (from bm25_dense_bitmaps)");
    }
    require_eq(len1d(*dense_slot, "dense_slot"), data.csr.n_terms, "len(dense_slot)", "n_terms");
    const size_t words = (data.n_docs + 63) / 64;
    const size_t nb = len1d(*dense_bits, "dense_bits");
    require_eq(len1d(*dense_rank, "dense_rank"), nb, "len(dense_rank)", "len(dense_bits)");
    if (words == 0 ? nb != 0 : nb % words != 0) {
        fail("len(dense_bits) = " + std::to_string(nb) + " is not a multiple of ceil(n_docs / 64) = " +
             std::to_string(words));
    }
    bounds.dense_slot = dense_slot->data();
    bounds.dense_bits = dense_bits->data();
    bounds.dense_rank = dense_rank->data();
    bounds.dense_words = words;
    bounds.dense_rows = words == 0 ? 0 : nb / words;
}

/// The block bounds of bm25_upper_bounds that the block-max algorithms need, checked against the postings.
void attach_blocks(bm25_bounds_view& bounds, const bm25_view& data, const std::string& algorithm,
                   const opt_carray<uint64_t>& block_offsets, const opt_carray<float>& block_ub, int64_t block_size) {
    if (!block_offsets || !block_ub) {
        fail("algorithm '" + algorithm +
             "' requires block_offsets and block_ub (compute them once with bm25_upper_bounds)");
    }
    bounds.block_size = check_block_size(block_size);
    require_eq(len1d(*block_offsets, "block_offsets"), data.csr.n_terms + 1, "len(block_offsets)", "n_terms + 1");
    bounds.block_offsets = block_offsets->data();
    bounds.block_ub = block_ub->data();
    bounds.n_blocks = len1d(*block_ub, "block_ub");
    require_eq(static_cast<size_t>(bounds.block_offsets[data.csr.n_terms]), bounds.n_blocks, "block_offsets[-1]",
               "len(block_ub)");
}

/// Python's bm25_topk: one argument per keyword of the public signature (retriever/_kernels.pyi);
/// they are grouped at once into the kernel's views (postings, bounds, queries) and its
/// bm25_search_params.
topk_result py_bm25_topk(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids,
                         const carray<uint32_t>& tfs, const carray<float>& doc_norm,
                         const carray<uint64_t>& q_offsets, const carray<uint32_t>& q_terms,
                         const carray<float>& q_weights, int64_t k, int n_threads,
                         const opt_carray<uint8_t>& allow, const std::string& algorithm,
                         const opt_carray<float>& term_ub, const opt_carray<uint64_t>& block_offsets,
                         const opt_carray<float>& block_ub, int64_t block_size,
                         const opt_carray<float>& impacts, const opt_carray<float>& term_kth,
                         int64_t term_kth_depth, const opt_carray<int32_t>& dense_slot,
                         const opt_carray<uint64_t>& dense_bits, const opt_carray<uint32_t>& dense_rank,
                         const opt_carray<float>& impact_rows, const opt_carray<int32_t>& impact_row_slot) {
    bm25_view data = make_bm25(offsets, doc_ids, tfs, doc_norm);
    attach_impacts(data, impacts, impact_rows, impact_row_slot);
    const query_batch_view queries = make_queries(q_offsets, q_terms, q_weights);
    check_impact_row_slots(data, queries);
    check_k(k);
    bm25_search_params params;
    params.allow = allow_ptr(allow, data.n_docs, true);
    params.algorithm = parse_bm25_algorithm(algorithm);
    params.n_threads = n_threads;
    bm25_bounds_view bounds;
    const bool need_ub = params.algorithm != bm25_algorithm::exhaustive;
    if (need_ub) {
        attach_term_bounds(bounds, data, algorithm, k, term_ub, term_kth, term_kth_depth);
        attach_dense_bitmaps(bounds, data, dense_slot, dense_bits, dense_rank);
    }
    if (params.algorithm == bm25_algorithm::block_max_wand || params.algorithm == bm25_algorithm::block_max_maxscore) {
        attach_blocks(bounds, data, algorithm, block_offsets, block_ub, block_size);
    }
    topk_arrays res(queries.nq, static_cast<size_t>(k));
    {
        py::gil_scoped_release nogil;
        check_query_batch(queries, data.csr.n_terms);
        check_query_term_ranges(data.csr, queries);
        if (need_ub) check_bounds_for_queries(data.csr, bounds, queries);
        bm25_topk(data, need_ub ? &bounds : nullptr, queries, params, res.out);
    }
    return res.result();
}

carray<float> py_bm25_score_docs(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids,
                                 const carray<uint32_t>& tfs, const carray<float>& doc_norm,
                                 const carray<uint64_t>& q_offsets, const carray<uint32_t>& q_terms,
                                 const carray<float>& q_weights, const carray<int64_t>& cand_offsets,
                                 const carray<int64_t>& cand_docs, int n_threads, const opt_carray<float>& impacts) {
    bm25_view data = make_bm25(offsets, doc_ids, tfs, doc_norm);
    attach_impacts(data, impacts, std::nullopt, std::nullopt);
    const query_batch_view queries = make_queries(q_offsets, q_terms, q_weights);
    candidates_view cand;
    cand.offsets = cand_offsets.data();
    cand.n_offsets = len1d(cand_offsets, "cand_offsets");
    cand.docs = cand_docs.data();
    cand.n_docs = len1d(cand_docs, "cand_docs");
    carray<float> scores(std::vector<py::ssize_t>{static_cast<py::ssize_t>(cand.n_docs)});
    float* out = scores.mutable_data();
    {
        py::gil_scoped_release nogil;
        check_query_batch(queries, data.csr.n_terms);
        check_query_term_ranges(data.csr, queries);
        check_candidates(cand, queries.nq, data.n_docs);
        bm25_score_docs(data, queries, cand, n_threads, out);
    }
    return scores;
}

std::tuple<carray<int32_t>, carray<float>> py_bm25_impact_rows(const carray<uint64_t>& offsets,
                                                               const carray<uint32_t>& doc_ids,
                                                               const carray<float>& impacts, int64_t n_docs,
                                                               int64_t min_df, int64_t max_rows, int n_threads) {
    const csr_view csr = make_csr(offsets, doc_ids);
    check_offsets(csr);
    require_eq(len1d(impacts, "impacts"), csr.nnz, "len(impacts)", "len(doc_ids)");
    if (n_docs < 0 || static_cast<uint64_t>(n_docs) > kMaxDocs) {
        fail("n_docs must be in [0, " + std::to_string(kMaxDocs) + "], got " + std::to_string(n_docs));
    }
    if (min_df < 1) fail("min_df must be >= 1, got " + std::to_string(min_df));
    if (max_rows < 0) fail("max_rows must be >= 0, got " + std::to_string(max_rows));
    carray<int32_t> slot(std::vector<py::ssize_t>{static_cast<py::ssize_t>(csr.n_terms)});
    const size_t n_rows = bm25_impact_rows(csr, impacts.data(), static_cast<size_t>(n_docs),
                                           static_cast<uint64_t>(min_df), static_cast<size_t>(max_rows),
                                           slot.mutable_data(), nullptr, 1);
    carray<float> rows(std::vector<py::ssize_t>{static_cast<py::ssize_t>(n_rows * static_cast<size_t>(n_docs))});
    int32_t* sp = slot.mutable_data();
    float* rp = rows.mutable_data();
    {
        py::gil_scoped_release nogil;
        bm25_impact_rows(csr, impacts.data(), static_cast<size_t>(n_docs), static_cast<uint64_t>(min_df),
                         static_cast<size_t>(max_rows), sp, rp, n_threads);
    }
    return {slot, rows};
}

std::tuple<carray<int32_t>, carray<uint64_t>, carray<uint32_t>> py_bm25_dense_bitmaps(
    const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids, int64_t n_docs, int64_t min_df,
    int n_threads) {
    const csr_view csr = make_csr(offsets, doc_ids);
    check_offsets(csr);
    if (n_docs < 0 || static_cast<uint64_t>(n_docs) > kMaxDocs) {
        fail("n_docs must be in [0, " + std::to_string(kMaxDocs) + "], got " + std::to_string(n_docs));
    }
    if (min_df < 1) fail("min_df must be >= 1, got " + std::to_string(min_df));
    carray<int32_t> slot(std::vector<py::ssize_t>{static_cast<py::ssize_t>(csr.n_terms)});
    const size_t rows = bm25_dense_bitmaps(csr, static_cast<size_t>(n_docs), static_cast<uint64_t>(min_df),
                                           slot.mutable_data(), nullptr, nullptr, 1);
    const size_t words = (static_cast<size_t>(n_docs) + 63) / 64;
    carray<uint64_t> bits(std::vector<py::ssize_t>{static_cast<py::ssize_t>(rows * words)});
    carray<uint32_t> rank(std::vector<py::ssize_t>{static_cast<py::ssize_t>(rows * words)});
    int32_t* sp = slot.mutable_data();
    uint64_t* bp = bits.mutable_data();
    uint32_t* rp = rank.mutable_data();
    {
        py::gil_scoped_release nogil;
        bm25_dense_bitmaps(csr, static_cast<size_t>(n_docs), static_cast<uint64_t>(min_df), sp, bp, rp, n_threads);
    }
    return {slot, bits, rank};
}

/// The token table and character tables of bm25_query_terms / bm25_topk_text, checked.
std::pair<token_table_view, char_tables_view> make_text_views(
    const carray<int64_t>& slots, const carray<int64_t>& entry_off, const carray<uint8_t>& blob,
    const carray<int64_t>& value, int64_t n_entries, const carray<uint8_t>& flags, const carray<uint8_t>& fold_n,
    const carray<uint32_t>& fold_cp, const carray<uint8_t>& ascii_fold, bool lowercase) {
    token_table_view table;
    table.slots = slots.data();
    table.n_slots = len1d(slots, "slots");
    table.entry_off = entry_off.data();
    table.n_off = len1d(entry_off, "entry_off");
    table.blob = blob.data();
    table.blob_len = len1d(blob, "blob");
    table.value = value.data();
    if (n_entries < 0 || static_cast<size_t>(n_entries) > len1d(value, "value")) {
        fail("n_entries = " + std::to_string(n_entries) + " must be in [0, len(value) = " +
             std::to_string(len1d(value, "value")) + "]");
    }
    table.n_entries = static_cast<size_t>(n_entries);
    require_eq(len1d(flags, "flags"), 0x10000, "len(flags)", "65536");
    require_eq(len1d(fold_n, "fold_n"), 0x10000, "len(fold_n)", "65536");
    require_eq(len1d(fold_cp, "fold_cp"), 3 * 0x10000, "len(fold_cp)", "196608");
    require_eq(len1d(ascii_fold, "ascii_fold"), 128, "len(ascii_fold)", "128");
    return {table, char_tables_view{flags.data(), fold_n.data(), fold_cp.data(), ascii_fold.data(), lowercase}};
}

std::tuple<carray<uint64_t>, carray<uint32_t>, carray<float>, carray<uint8_t>> py_bm25_query_terms(
    const carray<uint8_t>& data, const carray<int64_t>& offsets, const carray<int64_t>& slots,
    const carray<int64_t>& entry_off, const carray<uint8_t>& blob, const carray<int64_t>& value,
    int64_t n_entries, const carray<uint8_t>& flags, const carray<uint8_t>& fold_n,
    const carray<uint32_t>& fold_cp, const carray<uint8_t>& ascii_fold, bool lowercase,
    const carray<float>& idf, int n_threads) {
    const size_t n_off = len1d(offsets, "offsets");
    if (n_off == 0) fail("offsets must have length n_texts + 1 >= 1, got length 0");
    const size_t n = n_off - 1;
    const auto [table, chars] = make_text_views(slots, entry_off, blob, value, n_entries, flags, fold_n, fold_cp,
                                                ascii_fold, lowercase);
    const size_t n_terms = len1d(idf, "idf");
    const size_t data_len = len1d(data, "data");
    carray<uint64_t> q_offsets(std::vector<py::ssize_t>{static_cast<py::ssize_t>(n + 1)});
    carray<uint8_t> status(std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)});
    uint64_t* op = q_offsets.mutable_data();
    uint8_t* sp = status.mutable_data();
    std::vector<uint32_t> terms;
    std::vector<float> weights;
    {
        py::gil_scoped_release nogil;
        bm25_query_terms(data.data(), data_len, offsets.data(), n, table, chars, idf.data(), n_terms, n_threads,
                         op, sp, terms, weights);
    }
    carray<uint32_t> q_terms(std::vector<py::ssize_t>{static_cast<py::ssize_t>(terms.size())});
    carray<float> q_weights(std::vector<py::ssize_t>{static_cast<py::ssize_t>(weights.size())});
    if (!terms.empty()) {
        std::memcpy(q_terms.mutable_data(), terms.data(), terms.size() * sizeof(uint32_t));
        std::memcpy(q_weights.mutable_data(), weights.data(), weights.size() * sizeof(float));
    }
    return {q_offsets, q_terms, q_weights, status};
}

std::tuple<carray<int64_t>, carray<float>, carray<int32_t>, carray<uint8_t>> py_bm25_topk_text(
    const carray<uint8_t>& data, const carray<int64_t>& text_offsets, const carray<int64_t>& slots,
    const carray<int64_t>& entry_off, const carray<uint8_t>& blob, const carray<int64_t>& value,
    int64_t n_entries, const carray<uint8_t>& flags, const carray<uint8_t>& fold_n,
    const carray<uint32_t>& fold_cp, const carray<uint8_t>& ascii_fold, bool lowercase,
    const carray<float>& idf, const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids,
    const carray<uint32_t>& tfs, const carray<float>& doc_norm, int64_t k, int n_threads,
    const opt_carray<uint8_t>& allow, const opt_carray<float>& impacts, const opt_carray<float>& impact_rows,
    const opt_carray<int32_t>& impact_row_slot) {
    const size_t n_off = len1d(text_offsets, "text_offsets");
    if (n_off == 0) fail("text_offsets must have length n_texts + 1 >= 1, got length 0");
    const size_t nq = n_off - 1;
    const auto [table, chars] = make_text_views(slots, entry_off, blob, value, n_entries, flags, fold_n, fold_cp,
                                                ascii_fold, lowercase);
    bm25_view postings = make_bm25(offsets, doc_ids, tfs, doc_norm);
    attach_impacts(postings, impacts, impact_rows, impact_row_slot);
    check_k(k);
    bm25_search_params params;
    params.algorithm = bm25_algorithm::exhaustive;
    params.allow = allow_ptr(allow, postings.n_docs, true);
    params.n_threads = n_threads;
    query_texts_view texts;
    texts.text = data.data();
    texts.text_len = len1d(data, "data");
    texts.offsets = text_offsets.data();
    texts.nq = nq;
    texts.table = table;
    texts.chars = chars;
    texts.idf = idf.data();
    texts.n_idf = len1d(idf, "idf");
    topk_arrays res(nq, static_cast<size_t>(k));
    carray<uint8_t> status(std::vector<py::ssize_t>{static_cast<py::ssize_t>(nq)});
    uint8_t* sp = status.mutable_data();
    // each query's terms, as bm25_topk checks a batch, in terms of this call's arguments
    const float* idf_p = idf.data();
    const std::function<void(const query_batch_view&)> check = [&postings, idf_p](const query_batch_view& q) {
        for (size_t i = 0; i < q.m; ++i) {
            const uint32_t t = q.q_terms[i];
            if (t >= postings.csr.n_terms) {
                fail("token table value " + std::to_string(t) + " (a query token's term id) >= n_terms = " +
                     std::to_string(postings.csr.n_terms) + " of the postings (len(offsets) - 1)");
            }
            if (!std::isfinite(q.q_weights[i])) {
                fail("idf[" + std::to_string(t) + "] = " + std::to_string(idf_p[t]) + " gives query weight " +
                     std::to_string(q.q_weights[i]) + ", not finite");
            }
        }
        check_query_term_ranges(postings.csr, q);
        check_impact_row_slots(postings, q);
    };
    {
        py::gil_scoped_release nogil;
        bm25_topk_text(texts, postings, params, res.out, sp, check);
    }
    return {res.ids, res.scores, res.n_found, status};
}

carray<float> py_bm25_term_kth(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids,
                               const carray<uint32_t>& tfs, const carray<float>& doc_norm,
                               const carray<uint32_t>& terms, int64_t depth,
                               const opt_carray<float>& impacts,
                               const opt_carray<uint64_t>& block_offsets,
                               const opt_carray<float>& block_ub, int64_t block_size,
                               int n_threads) {
    bm25_view data = make_bm25(offsets, doc_ids, tfs, doc_norm);
    check_offsets(data.csr);
    if (impacts) {
        require_eq(len1d(*impacts, "impacts"), data.csr.nnz, "len(impacts)", "len(doc_ids)");
        data.impacts = impacts->data();
    }
    if (depth < 1) fail("depth must be >= 1, got " + std::to_string(depth));
    bm25_bounds_view bounds;
    const bool with_blocks = block_offsets.has_value() && block_ub.has_value();
    if (block_offsets.has_value() != block_ub.has_value()) {
        fail("block_offsets and block_ub must be given together");
    }
    if (with_blocks) {
        bounds.block_size = check_block_size(block_size);
        require_eq(len1d(*block_offsets, "block_offsets"), data.csr.n_terms + 1,
                   "len(block_offsets)", "n_terms + 1");
        bounds.block_offsets = block_offsets->data();
        bounds.block_ub = block_ub->data();
        bounds.n_blocks = len1d(*block_ub, "block_ub");
        require_eq(static_cast<size_t>(bounds.block_offsets[data.csr.n_terms]), bounds.n_blocks,
                   "block_offsets[-1]", "len(block_ub)");
        uint64_t want = 0;  // the block layout must match the postings (O(n_terms))
        for (size_t t = 0; t < data.csr.n_terms; ++t) {
            if (bounds.block_offsets[t] != want) {
                fail("block_offsets[" + std::to_string(t) + "] = " +
                     std::to_string(bounds.block_offsets[t]) + " does not match block_size " +
                     std::to_string(block_size) + " (compute it with bm25_upper_bounds)");
            }
            const uint64_t len = data.csr.offsets[t + 1] - data.csr.offsets[t];
            want += (len + bounds.block_size - 1) / bounds.block_size;
        }
        if (bounds.block_offsets[data.csr.n_terms] != want) {
            fail("block_offsets[-1] = " + std::to_string(bounds.block_offsets[data.csr.n_terms]) +
                 " does not match block_size " + std::to_string(block_size) +
                 " (compute it with bm25_upper_bounds)");
        }
    }
    const size_t n = len1d(terms, "terms");
    carray<float> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)});
    float* o = out.mutable_data();
    const uint32_t* tp = terms.data();
    {
        py::gil_scoped_release nogil;
        bm25_term_kth(data, with_blocks ? &bounds : nullptr, tp, n, static_cast<size_t>(depth),
                      n_threads, o);
    }
    return out;
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

topk_result py_rescore_topk(const carray<float>& queries, const py::array& vectors,
                            const carray<int64_t>& candidates, int64_t k, int64_t base, int n_threads,
                            const std::string& impl) {
    if (queries.ndim() != 2) fail("queries must be 2-dimensional (nq, d), got ndim = " + std::to_string(queries.ndim()));
    if (vectors.ndim() != 2) fail("vectors must be 2-dimensional (n, d), got ndim = " + std::to_string(vectors.ndim()));
    if (candidates.ndim() != 2) {
        fail("candidates must be 2-dimensional (nq, k'), got ndim = " + std::to_string(candidates.ndim()));
    }
    if (!(vectors.flags() & py::array::c_style)) throw py::type_error("vectors must be C-contiguous");
    const py::dtype dt = vectors.dtype();
    dense_matrix_view m;
    m.n = static_cast<size_t>(vectors.shape(0));
    m.d = static_cast<size_t>(vectors.shape(1));
    if (dt.byteorder() == '>') {  // kind/itemsize alone would let a big-endian array through
        throw py::type_error("vectors must be in native byte order, got " + std::string(py::str(dt)));
    }
    if (dt.kind() == 'f' && dt.itemsize() == 2) {
        m.f16 = static_cast<const uint16_t*>(vectors.data());
    } else if (dt.kind() == 'f' && dt.itemsize() == 4) {
        m.f32 = static_cast<const float*>(vectors.data());
    } else {
        throw py::type_error("vectors must be float16 or float32, got " + std::string(py::str(dt)));
    }
    if (m.n > (size_t{1} << 32)) fail("vectors has " + std::to_string(m.n) + " rows, more than 2**32");
    const size_t nq = static_cast<size_t>(queries.shape(0));
    require_eq(static_cast<size_t>(queries.shape(1)), m.d, "queries.shape[1]", "vectors.shape[1]");
    require_eq(static_cast<size_t>(candidates.shape(0)), nq, "candidates.shape[0]", "queries.shape[0]");
    check_k(k);
    if (base < 0) fail("base must be >= 0, got " + std::to_string(base));
    if (vectors.ndim() >= 1 && vectors.shape(0) > 0 &&
        base > std::numeric_limits<int64_t>::max() - static_cast<int64_t>(vectors.shape(0) - 1)) {
        fail("base = " + std::to_string(base) + " + " + std::to_string(vectors.shape(0)) +
             " rows overflows int64 ids");
    }
    candidate_view c;
    c.cand = candidates.data();
    c.nq = nq;
    c.kk = static_cast<size_t>(candidates.shape(1));
    rescore_impl which;
    if (impl == "auto") {
        which = rescore_impl::automatic;
    } else if (impl == "portable") {
        which = rescore_impl::portable;
    } else if (impl == "avx512") {
        which = rescore_impl::avx512;
        if (!rescore_has_avx512()) fail("impl = 'avx512' but this CPU has no AVX-512F / F16C");
    } else {
        fail("impl must be 'auto', 'portable' or 'avx512', got '" + impl + "'");
    }
    const float* qp = queries.data();
    topk_arrays res(nq, static_cast<size_t>(k));
    {
        py::gil_scoped_release nogil;
        check_candidates(c, m.n);
        rescore_topk(qp, m, c, base, n_threads, res.out, which);
    }
    return res.result();
}

carray<int32_t> py_tie_ranks(const carray<float>& scores, const carray<int32_t>& n_found) {
    if (scores.ndim() != 2) fail("scores must be 2-dimensional (nq, k), got ndim = " + std::to_string(scores.ndim()));
    const size_t nq = static_cast<size_t>(scores.shape(0)), k = static_cast<size_t>(scores.shape(1));
    require_eq(len1d(n_found, "n_found"), nq, "len(n_found)", "scores.shape[0]");
    carray<int32_t> ranks(std::vector<py::ssize_t>{static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(k)});
    tie_ranks_rows(scores.data(), nq, k, n_found.data(), ranks.mutable_data());
    return ranks;
}

void py_heap_push_block(const carray<float>& scores, int64_t first_id, carray<float>& heap_scores,
                        carray<int64_t>& heap_ids, int n_threads) {
    if (scores.ndim() != 2) fail("scores must be 2-dimensional (nq, nd), got ndim = " + std::to_string(scores.ndim()));
    if (heap_scores.ndim() != 2 || heap_ids.ndim() != 2) fail("heap_scores and heap_ids must be 2-dimensional (nq, k')");
    const size_t nq = static_cast<size_t>(scores.shape(0));
    require_eq(static_cast<size_t>(heap_scores.shape(0)), nq, "heap_scores.shape[0]", "scores.shape[0]");
    require_eq(static_cast<size_t>(heap_ids.shape(0)), nq, "heap_ids.shape[0]", "scores.shape[0]");
    require_eq(static_cast<size_t>(heap_ids.shape(1)), static_cast<size_t>(heap_scores.shape(1)),
               "heap_ids.shape[1]", "heap_scores.shape[1]");
    if (heap_scores.shape(1) < 1) fail("heaps must hold k' >= 1 entries");
    if (first_id < 0) fail("first_id must be >= 0, got " + std::to_string(first_id));
    heap_rows_view h;
    h.scores = heap_scores.mutable_data();
    h.ids = heap_ids.mutable_data();
    h.nq = nq;
    h.kk = static_cast<size_t>(heap_scores.shape(1));
    const float* sp = scores.data();
    const size_t nd = static_cast<size_t>(scores.shape(1));
    {
        py::gil_scoped_release nogil;
        heap_push_block(sp, nd, first_id, h, n_threads);
    }
}

std::tuple<carray<int32_t>, carray<int64_t>> py_int8_scan_topk(const carray<int8_t>& queries,
                                                              const carray<uint8_t>& codes, int64_t n,
                                                              int64_t kk, int n_threads, const std::string& impl) {
    if (queries.ndim() != 2) {
        fail("queries must be 2-dimensional (nq, 4 * d4), got ndim = " + std::to_string(queries.ndim()));
    }
    if (codes.ndim() != 3 || codes.shape(2) != 64) {
        fail("codes must have shape (n_blocks, d4, 64), got ndim = " + std::to_string(codes.ndim()) +
             (codes.ndim() == 3 ? ", shape[2] = " + std::to_string(codes.shape(2)) : std::string()));
    }
    if (n < 1 || n > 4294967295LL) fail("n must be in [1, 2**32 - 1], got " + std::to_string(n));
    const size_t n_blocks = (static_cast<size_t>(n) + kI8BlockDocs - 1) / kI8BlockDocs;
    require_eq(static_cast<size_t>(codes.shape(0)), n_blocks, "codes.shape[0]", "ceil(n / 16)");
    const size_t d4 = static_cast<size_t>(codes.shape(1));
    if (d4 < 1 || d4 > kI8MaxGroups) {
        fail("codes.shape[1] (d4) must be in [1, " + std::to_string(kI8MaxGroups) + "], got " + std::to_string(d4));
    }
    require_eq(static_cast<size_t>(queries.shape(1)), 4 * d4, "queries.shape[1]", "4 * codes.shape[1]");
    if (kk < 1 || kk > n) fail("kk must be in [1, n = " + std::to_string(n) + "], got " + std::to_string(kk));
    i8_impl which;
    if (impl == "auto") {
        which = i8_impl::automatic;
    } else if (impl == "portable") {
        which = i8_impl::portable;
    } else if (impl == "vnni") {
        which = i8_impl::vnni;
        if (!int8_scan_has_vnni()) fail("impl = 'vnni' but this CPU has no AVX-512 VNNI");
    } else {
        fail("impl must be 'auto', 'portable' or 'vnni', got '" + impl + "'");
    }
    const size_t nq = static_cast<size_t>(queries.shape(0));
    const std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(kk)};
    carray<int32_t> scores(shape);
    carray<int64_t> ids(shape);
    u8_packed_view m;
    m.codes = codes.data();
    m.n = static_cast<size_t>(n);
    m.d4 = d4;
    i8_topk_out out;
    out.scores = scores.mutable_data();
    out.ids = ids.mutable_data();
    out.kk = static_cast<size_t>(kk);
    const int8_t* qp = queries.data();
    {
        py::gil_scoped_release nogil;
        int8_scan_topk(qp, nq, m, out, n_threads, which);
    }
    return {scores, ids};
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
          py::arg("impacts").noconvert() = py::none(),
          py::arg("term_kth").noconvert() = py::none(), py::arg("term_kth_depth") = 0,
          py::arg("dense_slot").noconvert() = py::none(), py::arg("dense_bits").noconvert() = py::none(),
          py::arg("dense_rank").noconvert() = py::none(), py::arg("impact_rows").noconvert() = py::none(),
          py::arg("impact_row_slot").noconvert() = py::none(),
          "Exact BM25 top-k over one shard's CSR postings for a ragged batch of queries.\n"
          "score(q, d) = sum over the query's terms, in order, of\n"
          "q_weights[i] * (tf / (tf + doc_norm[d])) in float32. algorithm: 'exhaustive',\n"
          "'maxscore', 'bmw' (block-max WAND) or 'bmm' (block-max MaxScore). impacts:\n"
          "optional f32[nnz] from bm25_impacts (same doc_norm): the same scores without\n"
          "a division or a doc_norm read per posting. term_kth: optional f32[n_terms] from\n"
          "bm25_term_kth with depth = k = term_kth_depth (same doc_norm): the pruning\n"
          "algorithms start from the safe threshold max_t q_weight * term_kth[t] (unused with\n"
          "allow or negative weights); results are identical. dense_slot / dense_bits /\n"
          "dense_rank: optional membership bitmaps of the long lists from bm25_dense_bitmaps\n"
          "(same postings): MaxScore probes those lists without seeking; results are identical.\n"
          "impact_rows / impact_row_slot: optional dense impact rows of the longest lists from\n"
          "bm25_impact_rows (same impacts): exhaustive scoring adds such a list as one vector\n"
          "pass over the accumulator; results are identical.\n"
          "Returns (ids, scores, n_found).");

    m.def("bm25_score_docs", &py_bm25_score_docs, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("tfs").noconvert(), py::arg("doc_norm").noconvert(),
          py::arg("q_offsets").noconvert(), py::arg("q_terms").noconvert(), py::arg("q_weights").noconvert(),
          py::arg("cand_offsets").noconvert(), py::arg("cand_docs").noconvert(), py::arg("n_threads") = 0,
          py::arg("impacts").noconvert() = py::none(),
          "BM25 scores of given documents (full-score fusion): for query i, the score of each\n"
          "shard-local document cand_docs[cand_offsets[i]:cand_offsets[i+1]] (int64, any order,\n"
          "repeats allowed, each in [0, n_docs)), computed with exactly bm25_topk's float32\n"
          "arithmetic and term order (bit-identical to the score bm25_topk reports), 0.0 when no\n"
          "query term matches. Inputs as bm25_topk. Returns f32[len(cand_docs)].");

    m.def("bm25_impact_rows", &py_bm25_impact_rows, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("impacts").noconvert(), py::arg("n_docs"),
          py::arg("min_df"), py::arg("max_rows"), py::arg("n_threads") = 0,
          "Dense impact rows of the longest lists for bm25_topk's exhaustive scoring: among\n"
          "the lists with at least min_df postings, the max_rows longest (equal lengths: smaller\n"
          "term id first) get rows 0, 1, ... in term order. Returns (impact_row_slot\n"
          "i32[n_terms], row or -1; impact_rows f32[n_rows * n_docs], impacts[p] at doc_ids[p]\n"
          "for each posting p of the row's term, 0 elsewhere). Memory: 4 * n_docs bytes per row.\n"
          "Raises ValueError on malformed postings or a doc id >= n_docs.");

    m.def("bm25_dense_bitmaps", &py_bm25_dense_bitmaps, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("n_docs"), py::arg("min_df"), py::arg("n_threads") = 0,
          "Membership bitmaps of the lists with at least min_df postings, for bm25_topk's\n"
          "dense_slot / dense_bits / dense_rank. Returns (slot i32[n_terms]: row or -1,\n"
          "bits u64[rows * words], rank u32[rows * words]) with words = ceil(n_docs / 64):\n"
          "bit d of a row is set iff d is in the list; rank[w] counts its postings below doc\n"
          "64 * w. Memory: 12 bytes per 64 documents per row.");

    m.attr("BM25_AUTO_EXHAUSTIVE_DOCS") = py::int_(kAutoExhaustiveDocs);

    m.def("bm25_topk_text", &py_bm25_topk_text, py::arg("data").noconvert(),
          py::arg("text_offsets").noconvert(), py::arg("slots").noconvert(), py::arg("entry_off").noconvert(),
          py::arg("blob").noconvert(), py::arg("value").noconvert(), py::arg("n_entries"),
          py::arg("flags").noconvert(), py::arg("fold_n").noconvert(), py::arg("fold_cp").noconvert(),
          py::arg("ascii_fold").noconvert(), py::arg("lowercase"), py::arg("idf").noconvert(),
          py::arg("offsets").noconvert(), py::arg("doc_ids").noconvert(), py::arg("tfs").noconvert(),
          py::arg("doc_norm").noconvert(), py::arg("k"), py::arg("n_threads") = 0,
          py::arg("allow").noconvert() = py::none(), py::arg("impacts").noconvert() = py::none(),
          py::arg("impact_rows").noconvert() = py::none(), py::arg("impact_row_slot").noconvert() = py::none(),
          "bm25_query_terms followed by bm25_topk(algorithm='exhaustive') in one parallel pass: each\n"
          "thread analyses a query and scores it at once (its terms still in cache), GIL released.\n"
          "data, text_offsets (bm25_query_terms' offsets) and the table arguments as bm25_query_terms;\n"
          "offsets, doc_ids, tfs, doc_norm, k, allow, impacts, impact_rows, impact_row_slot as\n"
          "bm25_topk. Returns (ids i64[n, k],\n"
          "scores f32[n, k], n_found i32[n], status u8[n]): equal to the two calls' results;\n"
          "status 1 marks a query left to the caller (as bm25_query_terms), whose row is empty.");

    m.def("bm25_query_terms", &py_bm25_query_terms, py::arg("data").noconvert(),
          py::arg("offsets").noconvert(), py::arg("slots").noconvert(), py::arg("entry_off").noconvert(),
          py::arg("blob").noconvert(), py::arg("value").noconvert(), py::arg("n_entries"),
          py::arg("flags").noconvert(), py::arg("fold_n").noconvert(), py::arg("fold_cp").noconvert(),
          py::arg("ascii_fold").noconvert(), py::arg("lowercase"), py::arg("idf").noconvert(),
          py::arg("n_threads") = 0,
          "Query analysis with a read-only token table (index.analyzer_kernels.TokenTable): UTF-8\n"
          "texts data[offsets[i]:offsets[i+1]] -> (q_offsets u64[n+1], q_terms u32[m], q_weights\n"
          "f32[m], status u8[n]): each query's distinct known terms in first-occurrence order,\n"
          "weight float32(count * idf[t]); status 1 = a token the table lacks or a code point above\n"
          "U+FFFF (no terms: analyse that query in Python). Parallel over queries, GIL released.");

    m.def("bm25_term_kth", &py_bm25_term_kth, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("tfs").noconvert(),
          py::arg("doc_norm").noconvert(), py::arg("terms").noconvert(), py::arg("depth"),
          py::arg("impacts").noconvert() = py::none(),
          py::arg("block_offsets").noconvert() = py::none(),
          py::arg("block_ub").noconvert() = py::none(), py::arg("block_size") = 128,
          py::arg("n_threads") = 0,
          "For each term id in terms (u32[n]): the depth-th largest tf / (tf + doc_norm[d])\n"
          "over its postings (from impacts when given), or -inf when the list is shorter than\n"
          "depth or holds a negative/NaN value. Blocks whose block_ub cannot change the\n"
          "result are skipped. Returns f32[n].");

    m.def("bm25_impacts", &py_bm25_impacts, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("tfs").noconvert(),
          py::arg("doc_norm").noconvert(), py::arg("n_threads") = 0,
          "Per-posting tf part of BM25, impacts[p] = tf / (tf + doc_norm[doc_ids[p]]) in\n"
          "float32 (the exact expression bm25_topk uses). Returns f32[nnz].");

    m.def("impact_topk", &py_impact_topk, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("impacts").noconvert(),
          py::arg("q_offsets").noconvert(), py::arg("q_terms").noconvert(),
          py::arg("q_weights").noconvert(), py::arg("k"), py::arg("n_threads") = 0,
          py::arg("allow").noconvert() = py::none(),
          "Exact learned-sparse top-k: score(q, d) = sum over the query's terms, in order,\n"
          "of q_weights[i] * impacts[p] in float32. Returns (ids, scores, n_found).");
    m.def("rescore_topk", &py_rescore_topk, py::arg("queries").noconvert(), py::arg("vectors"),
          py::arg("candidates").noconvert(), py::arg("k"), py::arg("base") = 0, py::arg("n_threads") = 0,
          py::arg("impl") = "auto",
          "Exact full-dimension re-scoring of funnel shortlists: for query i, the inner products\n"
          "of queries[i] (float32) with vectors[candidates[i, j]] (float16 or float32 rows; -1 =\n"
          "no candidate), accumulated in float64 in a fixed order (8 lanes over i % 8, combined\n"
          "pairwise) and rounded to float32, so scores never depend on the batch. Returns the\n"
          "top-k (ids = candidate + base, scores, n_found); ties by smaller id. impl: 'auto',\n"
          "'portable' or 'avx512' (AVX-512F + F16C; bit-identical scores on every path).");
    m.def("rescore_has_avx512", &rescore_has_avx512,
          "True when rescore_topk's AVX-512 path is available on this CPU.");
    m.def("tie_ranks", &py_tie_ranks, py::arg("scores").noconvert(), py::arg("n_found").noconvert(),
          "1-based competition ranks of sorted top-k rows (scores float32 (nq, k), each row\n"
          "descending; n_found int32 (nq,)): rank = 1 + the first position holding the same\n"
          "score (ties share the best position), 0 past n_found (clamped to [0, k]); rows must\n"
          "be sorted (neighbours are compared).\n"
          "Returns int32 (nq, k). Raises ValueError on a shape mismatch.");
    m.def("heap_push_block", &py_heap_push_block, py::arg("scores").noconvert(), py::arg("first_id"),
          py::arg("heap_scores").noconvert(), py::arg("heap_ids").noconvert(), py::arg("n_threads") = 0,
          "Running top-k' of a blocked exact scan (Matryoshka prefix candidate generation): row i\n"
          "of scores (nq, nd) float32 holds query i's scores of ids first_id .. first_id + nd - 1;\n"
          "each enters query i's min-heap (heap_scores f32 / heap_ids i64 (nq, k'), updated in\n"
          "place; initialise to -inf / -1) when it ranks before the root (higher score, or equal\n"
          "score and smaller id). The heaps are left unsorted.");
    m.def("int8_scan_topk", &py_int8_scan_topk, py::arg("queries").noconvert(), py::arg("codes").noconvert(),
          py::arg("n"), py::arg("kk"), py::arg("n_threads") = 0, py::arg("impl") = "auto",
          "Exact top-k' of int8-quantised prefixes (funnel candidate generation; layout in\n"
          "cpp_ext/int8_scan.hpp): score(i, d) = sum_t codes_d[t] * queries[i, t] in int32 over\n"
          "uint8 document codes packed in 16-document blocks (codes (ceil(n/16), d4, 64)) and int8\n"
          "queries (nq, 4 * d4). Returns (scores int32 (nq, kk), ids int64 (nq, kk)) sorted by score\n"
          "descending then id. impl: 'auto' (AVX-512 VNNI where available), 'portable' or 'vnni';\n"
          "every path returns identical results for any n_threads.");
    m.def("int8_scan_has_vnni", &int8_scan_has_vnni,
          "True when int8_scan_topk's AVX-512 VNNI path is available on this CPU.");
    // ---- learned-sparse kernels (blocked_topk.hpp); bindings at the end of this file ----
    void register_sparse_kernels(py::module_ & m);
    register_sparse_kernels(m);
}

// =============================================================================
// Learned-sparse kernels (blocked_topk.hpp): exact top-k over uint16 impacts and
// Seismic-style approximate top-k. Same boundary rules as above.
// =============================================================================
#include <cmath>

#include "blocked_topk.hpp"

namespace {

u16_postings_view make_u16_postings(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids,
                                    const carray<uint16_t>& impacts, double scale, int64_t n_docs) {
    u16_postings_view p;
    p.csr = make_csr(offsets, doc_ids);
    require_eq(len1d(impacts, "impacts"), p.csr.nnz, "len(impacts)", "len(doc_ids)");
    p.impacts = impacts.data();
    if (!(std::isfinite(scale) && scale > 0)) fail("scale must be finite and > 0, got " + std::to_string(scale));
    p.scale = static_cast<float>(scale);
    if (n_docs < 0 || static_cast<uint64_t>(n_docs) > kMaxDocs) {
        fail("n_docs must be in [0, 2**32 - 1], got " + std::to_string(n_docs));
    }
    p.n_docs = static_cast<size_t>(n_docs);
    return p;
}

forward_view make_forward(const carray<uint64_t>& fwd_offsets, const carray<uint32_t>& fwd_terms,
                          const carray<uint16_t>& fwd_values, double scale) {
    forward_view f;
    const size_t n_off = len1d(fwd_offsets, "fwd_offsets");
    if (n_off == 0) fail("fwd_offsets must have length n_docs + 1 >= 1, got length 0");
    f.offsets = fwd_offsets.data();
    f.n_docs = n_off - 1;
    f.terms = fwd_terms.data();
    f.nnz = len1d(fwd_terms, "fwd_terms");
    require_eq(len1d(fwd_values, "fwd_values"), f.nnz, "len(fwd_values)", "len(fwd_terms)");
    f.values = fwd_values.data();
    if (f.offsets[f.n_docs] != f.nnz) {
        fail("fwd_offsets[-1] = " + std::to_string(f.offsets[f.n_docs]) + " must equal len(fwd_terms) = " +
             std::to_string(f.nnz));
    }
    if (!(std::isfinite(scale) && scale > 0)) fail("scale must be finite and > 0, got " + std::to_string(scale));
    f.scale = static_cast<float>(scale);
    return f;
}

blocks_view make_blocks(const carray<uint64_t>& term_blocks, const carray<uint64_t>& block_docs_offsets,
                        const carray<uint32_t>& block_docs, const carray<uint64_t>& summary_comp_offsets,
                        const carray<uint64_t>& summary_dir, const carray<uint64_t>& summary_entry_offsets,
                        const carray<uint32_t>& summary_entries, const carray<float>& summary_scale,
                        const carray<uint32_t>& fwd_packed, const carray<uint32_t>& fwd_term_rank) {
    blocks_view b;
    const size_t n_tb = len1d(term_blocks, "term_blocks");
    if (n_tb == 0) fail("term_blocks must have length n_terms + 1 >= 1, got length 0");
    b.term_blocks = term_blocks.data();
    b.n_terms = n_tb - 1;
    b.n_blocks = len1d(summary_scale, "summary_scale");
    require_eq(len1d(block_docs_offsets, "block_docs_offsets"), b.n_blocks + 1, "len(block_docs_offsets)",
               "len(summary_scale) + 1");
    require_eq(len1d(summary_comp_offsets, "summary_comp_offsets"), b.n_terms + 1, "len(summary_comp_offsets)",
               "len(term_blocks)");
    b.block_docs_offsets = block_docs_offsets.data();
    b.block_docs = block_docs.data();
    b.n_block_docs = len1d(block_docs, "block_docs");
    b.summary_comp_offsets = summary_comp_offsets.data();
    b.summary_dir = summary_dir.data();
    b.n_comps = len1d(summary_dir, "summary_dir");
    require_eq(len1d(summary_entry_offsets, "summary_entry_offsets"), b.n_terms + 1, "len(summary_entry_offsets)",
               "len(term_blocks)");
    b.summary_entry_offsets = summary_entry_offsets.data();
    b.summary_entries = summary_entries.data();
    b.n_summary = len1d(summary_entries, "summary_entries");
    b.summary_scale = summary_scale.data();
    b.packed = fwd_packed.data();
    b.n_packed = len1d(fwd_packed, "fwd_packed");
    b.term_rank = fwd_term_rank.data();
    b.n_rank = len1d(fwd_term_rank, "fwd_term_rank");
    if (b.n_rank != 0) require_eq(b.n_rank, b.n_terms, "len(fwd_term_rank)", "len(term_blocks) - 1");
    require_eq(static_cast<size_t>(b.term_blocks[b.n_terms]), b.n_blocks, "term_blocks[-1]", "n_blocks");
    require_eq(static_cast<size_t>(b.block_docs_offsets[b.n_blocks]), b.n_block_docs, "block_docs_offsets[-1]",
               "len(block_docs)");
    require_eq(static_cast<size_t>(b.summary_comp_offsets[b.n_terms]), b.n_comps, "summary_comp_offsets[-1]",
               "len(summary_dir)");
    require_eq(static_cast<size_t>(b.summary_entry_offsets[b.n_terms]), b.n_summary, "summary_entry_offsets[-1]",
               "len(summary_entries)");
    return b;
}

void py_check_sparse_index(const carray<uint64_t>& fwd_offsets, const carray<uint32_t>& fwd_terms,
                           const carray<uint16_t>& fwd_values, double scale, int64_t n_terms,
                           const carray<uint64_t>& term_blocks, const carray<uint64_t>& block_docs_offsets,
                           const carray<uint32_t>& block_docs, const carray<uint64_t>& summary_comp_offsets,
                           const carray<uint64_t>& summary_dir, const carray<uint64_t>& summary_entry_offsets,
                           const carray<uint32_t>& summary_entries, const carray<float>& summary_scale,
                           const carray<uint32_t>& fwd_packed, const carray<uint32_t>& fwd_term_rank) {
    const forward_view f = make_forward(fwd_offsets, fwd_terms, fwd_values, scale);
    const blocks_view b = make_blocks(term_blocks, block_docs_offsets, block_docs, summary_comp_offsets, summary_dir,
                                      summary_entry_offsets, summary_entries, summary_scale, fwd_packed,
                                      fwd_term_rank);
    if (n_terms < 1) fail("n_terms must be >= 1, got " + std::to_string(n_terms));
    require_eq(b.n_terms, static_cast<size_t>(n_terms), "len(term_blocks) - 1", "n_terms");
    py::gil_scoped_release nogil;
    check_forward(f, static_cast<size_t>(n_terms));
    check_blocks(b, f.n_docs, static_cast<size_t>(n_terms));
    check_packed(b, f);
}

void py_check_impact_postings(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids,
                              const carray<uint16_t>& impacts, int64_t n_docs) {
    const u16_postings_view p = make_u16_postings(offsets, doc_ids, impacts, 1.0, n_docs);
    py::gil_scoped_release nogil;
    check_impact_postings(p);
}

topk_result py_sparse_exact_topk(const carray<uint64_t>& offsets, const carray<uint32_t>& doc_ids,
                                 const carray<uint16_t>& impacts, const carray<uint64_t>& fwd_offsets,
                                 const carray<uint32_t>& fwd_terms, const carray<uint16_t>& fwd_values,
                                 double scale, const carray<uint64_t>& q_offsets, const carray<uint32_t>& q_terms,
                                 const carray<float>& q_weights, int64_t k, int n_threads) {
    const forward_view f = make_forward(fwd_offsets, fwd_terms, fwd_values, scale);
    const u16_postings_view p = make_u16_postings(offsets, doc_ids, impacts, scale, static_cast<int64_t>(f.n_docs));
    const query_batch_view queries = make_queries(q_offsets, q_terms, q_weights);
    check_k(k);
    topk_arrays res(queries.nq, static_cast<size_t>(k));
    {
        py::gil_scoped_release nogil;
        check_sparse_queries(queries, p.csr.n_terms);
        sparse_exact_topk(p, f, queries, p.csr.n_terms, n_threads, res.out);
    }
    return res.result();
}

topk_result py_sparse_seismic_topk(const carray<uint64_t>& fwd_offsets, const carray<uint32_t>& fwd_terms,
                                   const carray<uint16_t>& fwd_values, double scale,
                                   const carray<uint64_t>& term_blocks, const carray<uint64_t>& block_docs_offsets,
                                   const carray<uint32_t>& block_docs, const carray<uint64_t>& summary_comp_offsets,
                                   const carray<uint64_t>& summary_dir,
                                   const carray<uint64_t>& summary_entry_offsets,
                                   const carray<uint32_t>& summary_entries, const carray<float>& summary_scale,
                                   const carray<uint32_t>& fwd_packed, const carray<uint32_t>& fwd_term_rank,
                                   const carray<uint64_t>& q_offsets,
                                   const carray<uint32_t>& q_terms, const carray<float>& q_weights, int64_t k,
                                   int64_t query_cut, double heap_factor, int n_threads) {
    const forward_view f = make_forward(fwd_offsets, fwd_terms, fwd_values, scale);
    const blocks_view b = make_blocks(term_blocks, block_docs_offsets, block_docs, summary_comp_offsets, summary_dir,
                                      summary_entry_offsets, summary_entries, summary_scale, fwd_packed,
                                      fwd_term_rank);
    const query_batch_view queries = make_queries(q_offsets, q_terms, q_weights);
    if (b.n_packed != 0 || b.n_rank != 0) {
        require_eq(b.n_packed, f.nnz, "len(fwd_packed)", "len(fwd_terms)");
        require_eq(b.n_rank, b.n_terms, "len(fwd_term_rank)", "n_terms");
    }
    check_k(k);
    if (query_cut < 1) fail("query_cut must be >= 1, got " + std::to_string(query_cut));
    if (!(std::isfinite(heap_factor) && heap_factor > 0 && heap_factor <= 1)) {
        fail("heap_factor must be in (0, 1], got " + std::to_string(heap_factor));
    }
    topk_arrays res(queries.nq, static_cast<size_t>(k));
    {
        py::gil_scoped_release nogil;
        check_sparse_queries(queries, b.n_terms);
        sparse_seismic_topk(f, b, queries, static_cast<size_t>(query_cut), static_cast<float>(heap_factor),
                            n_threads, res.out);
    }
    return res.result();
}

}  // namespace

void register_sparse_kernels(py::module_& m) {
    m.def("check_sparse_index", &py_check_sparse_index, py::arg("fwd_offsets").noconvert(),
          py::arg("fwd_terms").noconvert(), py::arg("fwd_values").noconvert(), py::arg("scale"),
          py::arg("n_terms"), py::arg("term_blocks").noconvert(), py::arg("block_docs_offsets").noconvert(),
          py::arg("block_docs").noconvert(), py::arg("summary_comp_offsets").noconvert(),
          py::arg("summary_dir").noconvert(), py::arg("summary_entry_offsets").noconvert(),
          py::arg("summary_entries").noconvert(),
          py::arg("summary_scale").noconvert(), py::arg("fwd_packed").noconvert(), py::arg("fwd_term_rank").noconvert(),
          "O(size) structural check of a shard's forward index and Seismic blocks, run once at open.\n"
          "Raises ValueError naming the first violation.");
    m.def("_set_bm25_scatter_impl", &set_bm25_scatter_impl, py::arg("impl"),
          "Test / benchmark hook: scatter of bm25_topk's dense exhaustive path with impacts (0 = best for\n"
          "this CPU: AVX-512 on Intel, else AVX2, else scalar; 1 = scalar; 2 = AVX2; 3 = AVX-512;\n"
          "bit-identical). Returns the previous value. Raises ValueError for an impl outside 0-3 or\n"
          "one this CPU lacks.");
    m.def("_set_forward_score_impl", &set_forward_score_impl, py::arg("impl"),
          "Test hook: forward-index score implementation of the sparse kernels (0 = best available,\n"
          "1 = scalar, 2 = SSE2; all bit-identical). Returns the previous value.");
    m.def("check_impact_postings", &py_check_impact_postings, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("impacts").noconvert(), py::arg("n_docs"),
          "O(nnz) check of impact-ordered postings (offsets, doc ids < n_docs, impacts >= 1 and\n"
          "non-increasing per term), run once at open. Raises ValueError naming the violation.");
    m.def("sparse_exact_topk", &py_sparse_exact_topk, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("impacts").noconvert(), py::arg("fwd_offsets").noconvert(),
          py::arg("fwd_terms").noconvert(), py::arg("fwd_values").noconvert(), py::arg("scale"),
          py::arg("q_offsets").noconvert(), py::arg("q_terms").noconvert(), py::arg("q_weights").noconvert(),
          py::arg("k"), py::arg("n_threads") = 0,
          "Exact learned-sparse top-k over uint16 impacts: score = scale * sum_t q_t * impact(t, d)\n"
          "(float32, summed in the document's stored term order). Postings must be impact-ordered\n"
          "(index.sparse_index.invert); safe early termination, candidates re-scored from the forward\n"
          "index. Only documents with score > 0 are returned. Query weights must be finite and >= 0\n"
          "and terms unique per query (ValueError otherwise).\n"
          "Returns (ids int64 (nq, k), scores float32 (nq, k), n_found int32 (nq,)).");
    m.def("sparse_seismic_topk", &py_sparse_seismic_topk, py::arg("fwd_offsets").noconvert(),
          py::arg("fwd_terms").noconvert(), py::arg("fwd_values").noconvert(), py::arg("scale"),
          py::arg("term_blocks").noconvert(), py::arg("block_docs_offsets").noconvert(),
          py::arg("block_docs").noconvert(), py::arg("summary_comp_offsets").noconvert(),
          py::arg("summary_dir").noconvert(), py::arg("summary_entry_offsets").noconvert(),
          py::arg("summary_entries").noconvert(),
          py::arg("summary_scale").noconvert(), py::arg("fwd_packed").noconvert(), py::arg("fwd_term_rank").noconvert(), py::arg("q_offsets").noconvert(), py::arg("q_terms").noconvert(),
          py::arg("q_weights").noconvert(), py::arg("k"), py::arg("query_cut") = 10,
          py::arg("heap_factor") = 0.9, py::arg("n_threads") = 0,
          "Approximate learned-sparse top-k (Seismic, Bruch et al. SIGIR 2024): the query_cut largest\n"
          "query weights' blocks are visited; a block is skipped when the heap is full and its summary\n"
          "score < heap_factor * k-th score; other documents are scored exactly from the forward index\n"
          "(same score formula as sparse_exact_topk), read from fwd_packed / fwd_term_rank when they are\n"
          "non-empty (index.sparse_index.pack_forward; bit-identical scores). Block summaries are the\n"
          "per-term inverted arrays of index.sparse_index.invert_summaries. Returns (ids, scores, n_found).");
}
