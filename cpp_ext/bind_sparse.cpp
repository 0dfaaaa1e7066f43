// Python bindings of the learned-sparse leg's kernels (blocked_topk.hpp, impact_topk):
// exact top-k over uint16 impacts, Seismic-style approximate top-k, their open-time
// checks, and exact top-k over float32 impacts.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "blocked_topk.hpp"
#include "postings_topk.hpp"

#include "bind_common.hpp"

namespace retriever::bind {

namespace {

/// The allow mask of a sparse shard search: None, or uint8 of exactly n_docs entries (the
/// shard's rows, len(fwd_offsets) - 1); ValueError naming both lengths otherwise.
const uint8_t* sparse_allow(const opt_carray<uint8_t>& allow, size_t n_docs) {
    if (!allow) return nullptr;
    require_eq(len1d(*allow, "allow"), n_docs, "len(allow)", "the shard's documents (len(fwd_offsets) - 1)");
    return allow->data();
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
                                 const carray<float>& q_weights, int64_t k, int n_threads, const std::string& impl,
                                 const opt_carray<uint8_t>& allow, const std::string& filter_plan) {
    const forward_view f = make_forward(fwd_offsets, fwd_terms, fwd_values, scale);
    const u16_postings_view p = make_u16_postings(offsets, doc_ids, impacts, scale, static_cast<int64_t>(f.n_docs));
    const query_batch_view queries = make_queries(q_offsets, q_terms, q_weights);
    check_k(k);
    const uint8_t* allow_p = sparse_allow(allow, f.n_docs);
    const forward_score_impl score_impl = parse_forward_score_impl(impl);
    const sparse_filter_plan plan = parse_sparse_filter_plan(filter_plan);
    topk_arrays res(queries.nq, static_cast<size_t>(k));
    {
        py::gil_scoped_release nogil;
        check_sparse_queries(queries, p.csr.n_terms);
        sparse_exact_topk(p, f, queries, p.csr.n_terms, n_threads, score_impl, res.out, allow_p, plan);
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
                                   int64_t query_cut, double heap_factor, int n_threads,
                                   const std::string& impl, const opt_carray<uint8_t>& allow) {
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
    const forward_score_impl score_impl = parse_forward_score_impl(impl);
    const uint8_t* allow_p = sparse_allow(allow, f.n_docs);
    topk_arrays res(queries.nq, static_cast<size_t>(k));
    {
        py::gil_scoped_release nogil;
        check_sparse_queries(queries, b.n_terms);
        sparse_seismic_topk(f, b, queries, static_cast<size_t>(query_cut), static_cast<float>(heap_factor),
                            n_threads, score_impl, res.out, allow_p);
    }
    return res.result();
}

}  // namespace

void register_sparse(py::module_& m) {

    m.def("impact_topk", &py_impact_topk, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("impacts").noconvert(),
          py::arg("q_offsets").noconvert(), py::arg("q_terms").noconvert(),
          py::arg("q_weights").noconvert(), py::arg("k"), py::arg("n_threads") = 0,
          py::arg("allow").noconvert() = py::none(),
          "Exact learned-sparse top-k: score(q, d) = sum over the query's terms, in order,\n"
          "of q_weights[i] * impacts[p] in float32. Returns (ids, scores, n_found).");
    m.def("check_sparse_index", &py_check_sparse_index, py::arg("fwd_offsets").noconvert(),
          py::arg("fwd_terms").noconvert(), py::arg("fwd_values").noconvert(), py::arg("scale"),
          py::arg("n_terms"), py::arg("term_blocks").noconvert(), py::arg("block_docs_offsets").noconvert(),
          py::arg("block_docs").noconvert(), py::arg("summary_comp_offsets").noconvert(),
          py::arg("summary_dir").noconvert(), py::arg("summary_entry_offsets").noconvert(),
          py::arg("summary_entries").noconvert(),
          py::arg("summary_scale").noconvert(), py::arg("fwd_packed").noconvert(), py::arg("fwd_term_rank").noconvert(),
          "O(size) structural check of a shard's forward index and Seismic blocks, run once at open.\n"
          "Raises ValueError naming the first violation.");
    m.def("check_impact_postings", &py_check_impact_postings, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("impacts").noconvert(), py::arg("n_docs"),
          "O(nnz) check of impact-ordered postings (offsets, doc ids < n_docs, impacts >= 1 and\n"
          "non-increasing per term), run once at open. Raises ValueError naming the violation.");
    m.def("sparse_exact_topk", &py_sparse_exact_topk, py::arg("offsets").noconvert(),
          py::arg("doc_ids").noconvert(), py::arg("impacts").noconvert(), py::arg("fwd_offsets").noconvert(),
          py::arg("fwd_terms").noconvert(), py::arg("fwd_values").noconvert(), py::arg("scale"),
          py::arg("q_offsets").noconvert(), py::arg("q_terms").noconvert(), py::arg("q_weights").noconvert(),
          py::arg("k"), py::arg("n_threads") = 0, py::arg("impl") = "auto", py::arg("allow").noconvert() = py::none(),
          py::arg("filter_plan") = "auto",
          "Exact learned-sparse top-k over uint16 impacts: score = scale * sum_t q_t * impact(t, d)\n"
          "(float32, summed in the document's stored term order). Postings must be impact-ordered\n"
          "(index.sparse_index.invert); safe early termination, candidates re-scored from the forward\n"
          "index. Only documents with score > 0 are returned. Query weights must be finite and >= 0\n"
          "and terms unique per query (ValueError otherwise). impl: forward-index score 'auto' (AVX2\n"
          "where available, else SSE2), 'scalar', 'sse2' or 'avx2' (bit-identical scores).\n"
          "allow: None or uint8 (n_docs,), 0 = never returned (applied before top-k: the exact\n"
          "top-k of the allowed documents). filter_plan (with allow; every plan gives the same ids and\n"
          "scores): 'postings' (the walk tests the mask per posting), 'sentinel' (masked accumulator\n"
          "entries preset to -inf once per call and thread: no mask read in the walk), 'passing' (every\n"
          "query scores the allowed documents from the forward index) or 'auto' (per query 'passing'\n"
          "when at most a quarter of the shard is allowed and the allowed rows hold fewer entries than\n"
          "the query's lists; else 'sentinel' from 10 % allowed up, 'postings' below).\n"
          "Returns (ids int64 (nq, k), scores float32 (nq, k), n_found int32 (nq,)).");
    m.def("sparse_seismic_topk", &py_sparse_seismic_topk, py::arg("fwd_offsets").noconvert(),
          py::arg("fwd_terms").noconvert(), py::arg("fwd_values").noconvert(), py::arg("scale"),
          py::arg("term_blocks").noconvert(), py::arg("block_docs_offsets").noconvert(),
          py::arg("block_docs").noconvert(), py::arg("summary_comp_offsets").noconvert(),
          py::arg("summary_dir").noconvert(), py::arg("summary_entry_offsets").noconvert(),
          py::arg("summary_entries").noconvert(),
          py::arg("summary_scale").noconvert(), py::arg("fwd_packed").noconvert(), py::arg("fwd_term_rank").noconvert(), py::arg("q_offsets").noconvert(), py::arg("q_terms").noconvert(),
          py::arg("q_weights").noconvert(), py::arg("k"), py::arg("query_cut") = 10,
          py::arg("heap_factor") = 0.9, py::arg("n_threads") = 0, py::arg("impl") = "auto",
          py::arg("allow").noconvert() = py::none(),
          "Approximate learned-sparse top-k (Seismic, Bruch et al. SIGIR 2024): the query_cut largest\n"
          "query weights' blocks are visited; a block is skipped when the heap is full and its summary\n"
          "score < heap_factor * k-th score; other documents are scored exactly from the forward index\n"
          "(same score formula as sparse_exact_topk), read from fwd_packed / fwd_term_rank when they are\n"
          "non-empty (index.sparse_index.pack_forward; bit-identical scores); impl as sparse_exact_topk. Block summaries are the\n"
          "per-term inverted arrays of index.sparse_index.invert_summaries. allow: None or uint8 (n_docs,),\n"
          "0 = never scored nor returned. Returns (ids, scores, n_found).");
}

}  // namespace retriever::bind
