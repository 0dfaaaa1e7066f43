// Python bindings of the BM25 leg's kernels: index-open structures (check_csr, upper
// bounds, impacts, bitmaps, impact rows, single-term k-th values), query analysis and
// top-k (bm25_topk, bm25_topk_text) and the scores of given documents (bm25_score_docs).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <utility>

#include "bm25_shards.hpp"
#include "postings_topk.hpp"
#include "query_terms.hpp"

#include "bind_common.hpp"

namespace retriever::bind {

namespace {

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
                         const opt_carray<float>& impact_rows, const opt_carray<int32_t>& impact_row_slot,
                         const std::string& impl, const std::string& filter_plan) {
    bm25_view data = make_bm25(offsets, doc_ids, tfs, doc_norm);
    attach_impacts(data, impacts, impact_rows, impact_row_slot);
    const query_batch_view queries = make_queries(q_offsets, q_terms, q_weights);
    check_impact_row_slots(data, queries);
    check_k(k);
    bm25_search_params params;
    params.allow = allow_ptr(allow, data.n_docs, true);
    params.algorithm = parse_bm25_algorithm(algorithm);
    params.n_threads = n_threads;
    params.scatter = parse_bm25_scatter(impl);
    params.filter_plan = parse_bm25_filter_plan(filter_plan);
    bm25_bounds_view bounds;
    const bool need_ub = params.algorithm != bm25_algorithm::exhaustive;
    if (need_ub) {
        attach_term_bounds(bounds, data, algorithm, k, term_ub, term_kth, term_kth_depth);
        attach_dense_bitmaps(bounds, data, dense_slot, dense_bits, dense_rank);
    }
    if (params.algorithm == bm25_algorithm::block_max_wand || params.algorithm == bm25_algorithm::block_max_maxscore ||
        (need_ub && params.allow != nullptr && bounds.term_kth != nullptr && block_offsets && block_ub)) {
        // (with allow and term_kth, the filtered single-term threshold reads the block bounds too)
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
    const opt_carray<int32_t>& impact_row_slot, const std::string& impl) {
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
    params.scatter = parse_bm25_scatter(impl);
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


/// The entries of one bm25_topk_shards bundle (a dict), by name; exact dtype and C order
/// (TypeError otherwise, as the noconvert arguments of bm25_topk), None = absent.
class shard_bundle {
  public:
    shard_bundle(const py::handle& obj, size_t i) : m_where("shards[" + std::to_string(i) + "]") {
        if (!py::isinstance<py::dict>(obj)) {
            throw py::type_error(m_where + " must be a dict of the shard's arrays, got " +
                                 std::string(py::str(py::type::of(obj))));
        }
        m_dict = py::reinterpret_borrow<py::dict>(obj);
        for (const auto& item : m_dict) {
            const std::string key = py::str(item.first);
            if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
                fail(m_where + " has an unknown key '" + key + "'");
            }
        }
    }

    template <class T>
    opt_carray<T> opt(const char* key) const {
        if (!m_dict.contains(key)) return std::nullopt;
        const py::object v = m_dict[key];
        if (v.is_none()) return std::nullopt;
        if (!py::isinstance<carray<T>>(v)) {
            throw py::type_error(m_where + "['" + key + "'] must be a C-contiguous numpy array of dtype " +
                                 std::string(py::str(py::dtype::of<T>())) + ", got " +
                                 std::string(py::str(py::repr(v))).substr(0, 80));
        }
        return py::reinterpret_borrow<carray<T>>(v);
    }

    template <class T>
    carray<T> req(const char* key) const {
        opt_carray<T> a = opt<T>(key);
        if (!a) fail(m_where + " lacks the array '" + key + "'");
        return *a;
    }

    int64_t integer(const char* key, int64_t dflt) const {
        if (!m_dict.contains(key)) return dflt;
        const py::object v = m_dict[key];
        if (v.is_none()) return dflt;
        if (!py::isinstance<py::int_>(v)) {
            throw py::type_error(m_where + "['" + key + "'] must be an int, got " +
                                 std::string(py::str(py::type::of(v))));
        }
        return v.cast<int64_t>();
    }

    const std::string& where() const { return m_where; }

  private:
    static constexpr const char* kKeys[] = {
        "offsets", "doc_ids", "tfs", "doc_norm", "impacts", "term_ub", "block_offsets", "block_ub",
        "block_size", "term_kth", "term_kth_depth", "dense_slot", "dense_bits", "dense_rank",
        "impact_rows", "impact_row_slot", "allow", "terms"};
    std::string m_where;
    py::dict m_dict;
};

/// Attaches a bundle's term map (`terms`: u32, one per list, strictly ascending; see
/// bm25_shard_view), checked in O(its length); an absent map leaves the shard's ids the index's.
void attach_term_map(bm25_shard_view& v, const opt_carray<uint32_t>& terms) {
    if (!terms) return;
    const size_t n = len1d(*terms, "terms");
    require_eq(n, v.data.csr.n_terms, "len(terms)", "len(offsets) - 1");
    const uint32_t* t = terms->data();
    for (size_t i = 1; i < n; ++i) {
        if (t[i] <= t[i - 1]) {
            fail("terms[" + std::to_string(i) + "] = " + std::to_string(t[i]) + " is not above terms[" +
                 std::to_string(i - 1) + "] = " + std::to_string(t[i - 1]) + " (the term map must be strictly "
                 "ascending)");
        }
    }
    if (n && t[n - 1] == kNoShardTerm) fail("terms[-1] = 4294967295 is not a term id");
    v.terms = t;
}

/// The index's vocabulary a shard spans: its last mapped term + 1, or its n_terms without a map.
size_t shard_extent(const bm25_shard_view& v) {
    const size_t n = v.data.csr.n_terms;
    return v.terms == nullptr ? n : (n ? static_cast<size_t>(v.terms[n - 1]) + 1 : 0);
}

/// The posting and block ranges of the listed terms in one shard lie inside its arrays (the
/// O(listed terms) check of bm25_term_kth_shards; a term beyond the vocabulary has none).
void check_kth_terms(const bm25_shard_view& v, const uint32_t* tp, size_t n) {
    const csr_view& csr = v.data.csr;
    for (size_t j = 0; j < n; ++j) {
        const uint32_t t = shard_term(v, tp[j]);
        if (t == kNoShardTerm) continue;  // no postings in this shard
        const uint64_t b = csr.offsets[t], e = csr.offsets[t + 1];
        if (b > e || e > csr.nnz) {
            fail("offsets[" + std::to_string(t) + ":" + std::to_string(t + 2) + "] = [" + std::to_string(b) +
                 ", " + std::to_string(e) + "] is not a range inside doc_ids (len " +
                 std::to_string(csr.nnz) + "); validate the postings with check_csr");
        }
        if (v.bounds.block_offsets != nullptr) {
            const uint64_t bb = v.bounds.block_offsets[t], be = v.bounds.block_offsets[t + 1];
            if (bb > be || be > v.bounds.n_blocks || be - bb != (e - b + v.bounds.block_size - 1) /
                                                                     v.bounds.block_size) {
                fail("block_offsets[" + std::to_string(t) + ":" + std::to_string(t + 2) + "] = [" +
                     std::to_string(bb) + ", " + std::to_string(be) + "] does not match the list's " +
                     std::to_string(e - b) + " postings in blocks of " +
                     std::to_string(v.bounds.block_size) + " (compute it with bm25_upper_bounds)");
            }
        }
    }
}

/// One shard of a bm25_topk_shards call or of a BM25ShardSet: its arrays, held (the bundles'
/// dicts may change while the GIL is released), and its view (queries and allow unset).
struct shard_entry {
    std::vector<py::object> keep;
    bm25_shard_view view;
    bool has_ub = false;      // term_ub attached (with the dense bitmaps when given)
    bool has_blocks = false;  // block_offsets / block_ub attached
};

/// Bundle i, checked. With `algorithm` (bm25_topk_shards), what that algorithm needs is
/// attached (an error names what is missing), term_kth and allow included; without
/// (BM25ShardSet), whatever bounds the bundle holds, and term_kth / allow are refused (the
/// set takes one threshold array and the filters per call).
shard_entry parse_shard(const py::handle& obj, size_t i, const std::string* algorithm, int64_t k) {
    const shard_bundle sb(obj, i);
    shard_entry se;
    try {
        const carray<uint64_t> offsets = sb.req<uint64_t>("offsets");
        const carray<uint32_t> doc_ids = sb.req<uint32_t>("doc_ids");
        const carray<uint32_t> tfs = sb.req<uint32_t>("tfs");
        const carray<float> doc_norm = sb.req<float>("doc_norm");
        const opt_carray<float> impacts = sb.opt<float>("impacts"), impact_rows = sb.opt<float>("impact_rows");
        const opt_carray<int32_t> impact_row_slot = sb.opt<int32_t>("impact_row_slot");
        const opt_carray<float> term_ub = sb.opt<float>("term_ub"), term_kth = sb.opt<float>("term_kth");
        const opt_carray<uint64_t> block_offsets = sb.opt<uint64_t>("block_offsets");
        const opt_carray<float> block_ub = sb.opt<float>("block_ub");
        const opt_carray<int32_t> dense_slot = sb.opt<int32_t>("dense_slot");
        const opt_carray<uint64_t> dense_bits = sb.opt<uint64_t>("dense_bits");
        const opt_carray<uint32_t> dense_rank = sb.opt<uint32_t>("dense_rank");
        const opt_carray<uint8_t> allow = sb.opt<uint8_t>("allow");
        const opt_carray<uint32_t> terms = sb.opt<uint32_t>("terms");
        if (algorithm == nullptr && (term_kth || allow)) {
            fail(std::string("'") + (term_kth ? "term_kth" : "allow") +
                 "' is not part of a shard set (pass term_kth and allow to topk)");
        }
        se.keep = {offsets, doc_ids, tfs, doc_norm};
        const auto keep = [&se](const auto& a) {
            if (a) se.keep.push_back(*a);
        };
        keep(impacts), keep(impact_rows), keep(impact_row_slot), keep(term_ub), keep(term_kth);
        keep(block_offsets), keep(block_ub), keep(dense_slot), keep(dense_bits), keep(dense_rank), keep(allow);
        keep(terms);

        bm25_shard_view& v = se.view;
        v.data = make_bm25(offsets, doc_ids, tfs, doc_norm);
        attach_term_map(v, terms);
        attach_impacts(v.data, impacts, impact_rows, impact_row_slot);
        v.allow = allow_ptr(allow, v.data.n_docs, true);
        const bm25_algorithm algo = algorithm ? parse_bm25_algorithm(*algorithm) : bm25_algorithm::exhaustive;
        const std::string name = algorithm ? *algorithm : std::string("?");
        if (algorithm ? algo != bm25_algorithm::exhaustive : term_ub.has_value()) {
            attach_term_bounds(v.bounds, v.data, name, k, term_ub, term_kth, sb.integer("term_kth_depth", 0));
            attach_dense_bitmaps(v.bounds, v.data, dense_slot, dense_bits, dense_rank);
            v.has_bounds = se.has_ub = true;
        }
        if (algorithm ? (algo == bm25_algorithm::block_max_wand || algo == bm25_algorithm::block_max_maxscore)
                      : (block_offsets.has_value() || block_ub.has_value())) {
            attach_blocks(v.bounds, v.data, name, block_offsets, block_ub, sb.integer("block_size", 128));
            se.has_blocks = true;
        }
    } catch (const std::invalid_argument& e) {
        fail(sb.where() + ": " + e.what());
    }
    return se;
}

/// Sets each shard's base from `bases` (ascending, not overlapping, within kMaxDocs); returns
/// the largest shard vocabulary.
size_t set_bases(std::vector<shard_entry>& shards, const carray<int64_t>& bases) {
    require_eq(len1d(bases, "bases"), shards.size(), "len(bases)", "len(shards)");
    size_t max_terms = 0;
    uint64_t next_base = 0;
    for (size_t i = 0; i < shards.size(); ++i) {
        const int64_t base = bases.data()[i];
        if (base < 0 || static_cast<uint64_t>(base) < next_base) {
            fail("bases[" + std::to_string(i) + "] = " + std::to_string(base) + " must be >= " +
                 (i == 0 ? std::string("0") : "bases[" + std::to_string(i - 1) + "] + n_docs of shards[" +
                                                 std::to_string(i - 1) + "] = " + std::to_string(next_base)) +
                 " (shards in ordinal order, not overlapping)");
        }
        next_base = static_cast<uint64_t>(base) + shards[i].view.data.n_docs;
        if (next_base > kMaxDocs) {
            fail("bases[" + std::to_string(i) + "] + n_docs of shards[" + std::to_string(i) + "] = " +
                 std::to_string(next_base) + " exceeds the supported maximum ordinal " + std::to_string(kMaxDocs));
        }
        shards[i].view.base = static_cast<uint64_t>(base);
        max_terms = std::max(max_terms, shard_extent(shards[i].view));
    }
    return max_terms;
}

/// The union threshold array of a call (null for exhaustive scoring, which has no use for it).
const float* union_kth_ptr(const opt_carray<float>& term_kth, int64_t term_kth_depth, size_t n_terms, int64_t k,
                           bool need_ub) {
    if (!term_kth || !need_ub) return nullptr;
    require_eq(len1d(*term_kth, "term_kth"), n_terms, "len(term_kth)", "n_terms");
    if (term_kth_depth != k) {
        fail("term_kth_depth = " + std::to_string(term_kth_depth) + " must equal k = " + std::to_string(k) +
             " (term_kth must come from bm25_term_kth_shards with depth = k)");
    }
    return term_kth->data();
}

/// The checked part of a bm25_topk_shards call that needs no Python: each shard's batch
/// restricted to its vocabulary, the per-query checks, the kernel (GIL released).
topk_result run_shards(std::vector<bm25_shard_view>& views, const query_batch_view& queries, size_t n_terms,
                       bm25_algorithm algo, const float* union_kth, int64_t k, int n_threads) {
    const bool need_ub = algo != bm25_algorithm::exhaustive;
    struct restricted {  // the call's batch in a shard's term ids, without the terms it lacks
        std::vector<uint64_t> q_offsets;
        std::vector<uint32_t> q_terms;
        std::vector<float> q_weights;
        std::vector<uint32_t> q_local;  // per position of the call's batch (with a term map)
    };
    std::vector<restricted> own(views.size());
    topk_arrays res(queries.nq, static_cast<size_t>(k));
    {
        py::gil_scoped_release nogil;
        check_query_batch(queries, n_terms);
        for (size_t i = 0; i < views.size(); ++i) {
            bm25_shard_view& v = views[i];
            const size_t st = v.data.csr.n_terms;
            bool all_in = v.terms == nullptr;
            for (size_t j = 0; j < queries.m && all_in; ++j) all_in = queries.q_terms[j] < st;
            if (all_in) {
                v.queries = queries;
                v.q_local = nullptr;
            } else {  // terms first seen in later shards, or a term map: the shard's own ids
                restricted& r = own[i];
                r.q_offsets.assign(queries.nq + 1, 0);
                if (v.terms != nullptr) r.q_local.resize(queries.m);
                for (size_t q = 0; q < queries.nq; ++q) {
                    for (uint64_t j = queries.q_offsets[q]; j < queries.q_offsets[q + 1]; ++j) {
                        const uint32_t t = shard_term(v, queries.q_terms[j]);
                        if (v.terms != nullptr) r.q_local[j] = t;
                        if (t != kNoShardTerm) {
                            r.q_terms.push_back(t);
                            r.q_weights.push_back(queries.q_weights[j]);
                        }
                    }
                    r.q_offsets[q + 1] = r.q_terms.size();
                }
                v.q_local = v.terms != nullptr ? r.q_local.data() : nullptr;
                query_batch_view& qv = v.queries;
                qv.q_offsets = r.q_offsets.data();
                qv.nq = queries.nq;
                qv.q_terms = r.q_terms.data();
                qv.q_weights = r.q_weights.data();
                qv.m = r.q_terms.size();
            }
            try {
                check_query_term_ranges(v.data.csr, v.queries);
                check_impact_row_slots(v.data, v.queries);
                if (need_ub) check_bounds_for_queries(v.data.csr, v.bounds, v.queries);
            } catch (const std::invalid_argument& e) {
                fail("shards[" + std::to_string(i) + "]: " + e.what());
            }
        }
        bm25_topk_shards(views, queries, union_kth, algo, n_threads, res.out);
    }
    return res.result();
}

/// Python's bm25_topk_shards (retriever/_kernels.pyi).
topk_result py_bm25_topk_shards(const py::list& shards, const carray<int64_t>& bases,
                                const carray<uint64_t>& q_offsets, const carray<uint32_t>& q_terms,
                                const carray<float>& q_weights, int64_t k, int64_t n_terms, int n_threads,
                                const std::string& algorithm, const opt_carray<float>& term_kth,
                                int64_t term_kth_depth) {
    require_eq(len1d(bases, "bases"), shards.size(), "len(bases)", "len(shards)");
    const query_batch_view queries = make_queries(q_offsets, q_terms, q_weights);
    check_k(k);
    const bm25_algorithm algo = parse_bm25_algorithm(algorithm);
    std::vector<shard_entry> entries;
    entries.reserve(shards.size());
    for (size_t i = 0; i < shards.size(); ++i) entries.push_back(parse_shard(shards[i], i, &algorithm, k));
    const size_t max_terms = set_bases(entries, bases);
    if (n_terms < 0) n_terms = static_cast<int64_t>(max_terms);
    if (static_cast<size_t>(n_terms) < max_terms) {
        fail("n_terms = " + std::to_string(n_terms) + " is below a shard's vocabulary (" +
             std::to_string(max_terms) + " terms: len(offsets) - 1)");
    }
    const float* union_kth = union_kth_ptr(term_kth, term_kth_depth, static_cast<size_t>(n_terms), k,
                                           algo != bm25_algorithm::exhaustive);
    std::vector<bm25_shard_view> views;
    views.reserve(entries.size());
    for (const shard_entry& e : entries) views.push_back(e.view);
    return run_shards(views, queries, static_cast<size_t>(n_terms), algo, union_kth, k, n_threads);
}

/// The shards of bm25_topk_shards parsed and checked once (a leg opens one per scoring state),
/// so that a call of one short query does not pay the per-shard argument checks (~5 us each).
class bm25_shard_set {
  public:
    bm25_shard_set(const py::list& shards, const carray<int64_t>& bases, int64_t n_terms) {
        m_entries.reserve(shards.size());
        for (size_t i = 0; i < shards.size(); ++i) m_entries.push_back(parse_shard(shards[i], i, nullptr, 0));
        const size_t max_terms = set_bases(m_entries, bases);
        if (n_terms < 0) n_terms = static_cast<int64_t>(max_terms);
        if (static_cast<size_t>(n_terms) < max_terms) {
            fail("n_terms = " + std::to_string(n_terms) + " is below a shard's vocabulary (" +
                 std::to_string(max_terms) + " terms: len(offsets) - 1)");
        }
        m_n_terms = static_cast<size_t>(n_terms);
    }

    size_t n_shards() const { return m_entries.size(); }
    size_t n_terms() const { return m_n_terms; }

    topk_result topk(const carray<uint64_t>& q_offsets, const carray<uint32_t>& q_terms,
                     const carray<float>& q_weights, int64_t k, int n_threads, const std::string& algorithm,
                     const std::optional<py::list>& allow, const opt_carray<float>& term_kth,
                     int64_t term_kth_depth) const {
        const query_batch_view queries = make_queries(q_offsets, q_terms, q_weights);
        check_k(k);
        const bm25_algorithm algo = parse_bm25_algorithm(algorithm);
        const bool need_ub = algo != bm25_algorithm::exhaustive;
        const bool need_blocks = algo == bm25_algorithm::block_max_wand || algo == bm25_algorithm::block_max_maxscore;
        if (allow) require_eq(allow->size(), m_entries.size(), "len(allow)", "the set's shards");
        std::vector<py::object> masks;  // held for the call
        std::vector<bm25_shard_view> views;
        views.reserve(m_entries.size());
        for (size_t i = 0; i < m_entries.size(); ++i) {
            const shard_entry& e = m_entries[i];
            if (need_ub && !e.has_ub) {
                fail("shards[" + std::to_string(i) + "]: algorithm '" + algorithm +
                     "' requires term_ub (compute it once with bm25_upper_bounds)");
            }
            if (need_blocks && !e.has_blocks) {
                fail("shards[" + std::to_string(i) + "]: algorithm '" + algorithm +
                     "' requires block_offsets and block_ub (compute them once with bm25_upper_bounds)");
            }
            views.push_back(e.view);
            bm25_shard_view& v = views.back();
            v.has_bounds = need_ub;  // as bm25_topk_shards attaches them
            if (allow && !(*allow)[i].is_none()) {
                const py::handle m = (*allow)[i];
                if (!py::isinstance<carray<uint8_t>>(m)) {
                    throw py::type_error("allow[" + std::to_string(i) + "] must be None or a C-contiguous numpy "
                                         "array of dtype uint8");
                }
                const carray<uint8_t> a = py::reinterpret_borrow<carray<uint8_t>>(m);
                try {
                    v.allow = allow_ptr(a, v.data.n_docs, true);
                } catch (const std::invalid_argument& err) {
                    fail("allow[" + std::to_string(i) + "]: " + err.what());
                }
                masks.push_back(a);
            }
        }
        const float* union_kth = union_kth_ptr(term_kth, term_kth_depth, m_n_terms, k, need_ub);
        return run_shards(views, queries, m_n_terms, algo, union_kth, k, n_threads);
    }

    /// bm25_term_kth_shards over the set's shards.
    carray<float> term_kth(const carray<uint32_t>& terms, int64_t depth, int n_threads) const {
        if (depth < 1) fail("depth must be >= 1, got " + std::to_string(depth));
        const size_t n = len1d(terms, "terms");
        const uint32_t* tp = terms.data();
        std::vector<bm25_shard_view> views;
        views.reserve(m_entries.size());
        for (size_t i = 0; i < m_entries.size(); ++i) {
            views.push_back(m_entries[i].view);
            try {
                check_kth_terms(views.back(), tp, n);
            } catch (const std::invalid_argument& e) {
                fail("shards[" + std::to_string(i) + "]: " + e.what());
            }
        }
        carray<float> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)});
        float* o = out.mutable_data();
        {
            py::gil_scoped_release nogil;
            bm25_term_kth_shards(views, tp, n, static_cast<size_t>(depth), n_threads, o);
        }
        return out;
    }

  private:
    std::vector<shard_entry> m_entries;
    size_t m_n_terms = 0;
};

/// Python's bm25_term_kth_shards (retriever/_kernels.pyi): the bundles' postings, impacts and
/// blocks; only the listed terms' ranges are checked (O(terms * shards), no O(n_terms) pass).
carray<float> py_bm25_term_kth_shards(const py::list& shards, const carray<uint32_t>& terms, int64_t depth,
                                      int n_threads) {
    if (depth < 1) fail("depth must be >= 1, got " + std::to_string(depth));
    const size_t n = len1d(terms, "terms");
    const uint32_t* tp = terms.data();
    std::vector<py::object> keep;
    std::vector<bm25_shard_view> views(shards.size());
    for (size_t i = 0; i < shards.size(); ++i) {
        const shard_bundle sb(shards[i], i);
        try {
            const carray<uint64_t> offsets = sb.req<uint64_t>("offsets");
            const carray<uint32_t> doc_ids = sb.req<uint32_t>("doc_ids");
            const carray<uint32_t> tfs = sb.req<uint32_t>("tfs");
            const carray<float> doc_norm = sb.req<float>("doc_norm");
            const opt_carray<float> impacts = sb.opt<float>("impacts");
            const opt_carray<uint64_t> block_offsets = sb.opt<uint64_t>("block_offsets");
            const opt_carray<float> block_ub = sb.opt<float>("block_ub");
            const opt_carray<uint32_t> terms = sb.opt<uint32_t>("terms");
            keep.insert(keep.end(), {offsets, doc_ids, tfs, doc_norm});
            bm25_shard_view& v = views[i];
            v.data = make_bm25(offsets, doc_ids, tfs, doc_norm);
            if (terms) keep.push_back(*terms);
            attach_term_map(v, terms);
            if (impacts) {
                require_eq(len1d(*impacts, "impacts"), v.data.csr.nnz, "len(impacts)", "len(doc_ids)");
                v.data.impacts = impacts->data();
                keep.push_back(*impacts);
            }
            if (block_offsets.has_value() != block_ub.has_value()) {
                fail("block_offsets and block_ub must be given together");
            }
            if (block_offsets) {
                v.bounds.block_size = check_block_size(sb.integer("block_size", 128));
                require_eq(len1d(*block_offsets, "block_offsets"), v.data.csr.n_terms + 1, "len(block_offsets)",
                           "n_terms + 1");
                v.bounds.block_offsets = block_offsets->data();
                v.bounds.block_ub = block_ub->data();
                v.bounds.n_blocks = len1d(*block_ub, "block_ub");
                keep.push_back(*block_offsets), keep.push_back(*block_ub);
            }
            check_kth_terms(v, tp, n);
        } catch (const std::invalid_argument& e) {
            fail(sb.where() + ": " + e.what());
        }
    }
    carray<float> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)});
    float* o = out.mutable_data();
    {
        py::gil_scoped_release nogil;
        bm25_term_kth_shards(views, tp, n, static_cast<size_t>(depth), n_threads, o);
    }
    return out;
}

}  // namespace

void register_bm25(py::module_& m) {

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
          py::arg("impact_row_slot").noconvert() = py::none(), py::arg("impl") = "auto",
          py::arg("filter_plan") = "auto",
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
          "pass over the accumulator; results are identical. impl: scatter of the dense exhaustive\n"
          "path with impacts, 'auto' (chosen once per process from the CPU), 'scalar', 'avx2' or\n"
          "'avx512' (bit-identical results). filter_plan (with allow): 'auto' (per query by\n"
          "a cost model), 'postings' (the algorithm's walk, the filter tested per candidate)\n"
          "or 'passing' (only the passing documents scored); results are identical.\n"
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

    m.def("bm25_topk_shards", &py_bm25_topk_shards, py::arg("shards"), py::arg("bases").noconvert(),
          py::arg("q_offsets").noconvert(), py::arg("q_terms").noconvert(), py::arg("q_weights").noconvert(),
          py::arg("k"), py::arg("n_terms") = -1, py::arg("n_threads") = 0, py::arg("algorithm") = "maxscore",
          py::arg("term_kth") = py::none(), py::arg("term_kth_depth") = 0,
          "Exact BM25 top-k over several shards of one index for a ragged batch of queries, in one\n"
          "call: equal (ids and scores bit for bit) to bm25_topk on each shard with its ordinals\n"
          "shifted by bases[i], merged by score descending then ordinal ascending. shards: per\n"
          "shard a dict of bm25_topk's per-shard arguments by name (offsets, doc_ids, tfs,\n"
          "doc_norm required; impacts, term_ub, block_offsets, block_ub, block_size, term_kth,\n"
          "term_kth_depth, dense_slot, dense_bits, dense_rank, impact_rows, impact_row_slot,\n"
          "allow, terms optional), checked as bm25_topk checks them. terms: u32[len(offsets) - 1],\n"
          "a term map: the index's term id of each of the shard's lists, strictly ascending (the\n"
          "shard's per-term arrays then follow its own vocabulary; without it list t is term t).\n"
          "bases: i64[len(shards)], the global ordinal of each shard's document 0, ascending,\n"
          "shards not overlapping. q_terms index the index's vocabulary of n_terms terms (-1: the\n"
          "largest a shard spans); a term a shard has no list for is skipped there. Each query runs through\n"
          "the shards in order on one thread with one top-k collector, each shard's pruning\n"
          "starting from the larger of the k-th score collected so far and one threshold found\n"
          "for the whole index before the first shard (priming over every shard's short lists;\n"
          "with term_kth f32[n_terms] from bm25_term_kth_shards with depth term_kth_depth = k,\n"
          "no allow filter and no negative weight, also the best single-term k-th score).\n"
          "Returns (ids i64[nq, k] global ordinals, scores f32[nq, k], n_found i32[nq]).");

    py::class_<bm25_shard_set>(m, "BM25ShardSet",
                               "The shards of bm25_topk_shards parsed and checked once: BM25ShardSet(shards,\n"
                               "bases, n_terms=-1) with bundles as bm25_topk_shards takes them, less term_kth /\n"
                               "term_kth_depth / allow (given per call to topk). The set holds its arrays.")
        .def(py::init<const py::list&, const carray<int64_t>&, int64_t>(), py::arg("shards"),
             py::arg("bases").noconvert(), py::arg("n_terms") = -1)
        .def_property_readonly("n_shards", &bm25_shard_set::n_shards)
        .def_property_readonly("n_terms", &bm25_shard_set::n_terms)
        .def("topk", &bm25_shard_set::topk, py::arg("q_offsets").noconvert(), py::arg("q_terms").noconvert(),
             py::arg("q_weights").noconvert(), py::arg("k"), py::arg("n_threads") = 0,
             py::arg("algorithm") = "maxscore", py::arg("allow") = py::none(), py::arg("term_kth") = py::none(),
             py::arg("term_kth_depth") = 0,
             "bm25_topk_shards over the set's shards (identical results): allow None or a list with,\n"
             "per shard, None or a uint8 mask of its documents; term_kth / term_kth_depth as there.")
        .def("term_kth", &bm25_shard_set::term_kth, py::arg("terms").noconvert(), py::arg("depth"),
             py::arg("n_threads") = 0, "bm25_term_kth_shards over the set's shards (identical results).");

    m.def("bm25_term_kth_shards", &py_bm25_term_kth_shards, py::arg("shards"), py::arg("terms").noconvert(),
          py::arg("depth"), py::arg("n_threads") = 0,
          "Per term of terms (u32), the depth-th largest tf part over its postings in all shards\n"
          "together (-inf when fewer than depth, or a value read is negative or NaN): the\n"
          "term_kth of bm25_topk_shards, equal to bm25_term_kth on one shard holding the same\n"
          "postings. shards: bm25_topk_shards bundles (offsets, doc_ids, tfs, doc_norm; impacts,\n"
          "block_offsets, block_ub, block_size and the term map terms used when present; other\n"
          "keys ignored). A term a shard has no list for has no postings there. Returns\n"
          "f32[len(terms)].");

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
          py::arg("impl") = "auto",
          "bm25_query_terms followed by bm25_topk(algorithm='exhaustive') in one parallel pass: each\n"
          "thread analyses a query and scores it at once (its terms still in cache), GIL released.\n"
          "data, text_offsets (bm25_query_terms' offsets) and the table arguments as bm25_query_terms;\n"
          "offsets, doc_ids, tfs, doc_norm, k, allow, impacts, impact_rows, impact_row_slot, impl as\n"
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
}

}  // namespace retriever::bind
