// Learned-sparse top-k over uint16 impacts: exact (term-at-a-time over the
// inverted index) and approximate in the manner of Seismic (Bruch, Nardini,
// Rulli, Venturini, SIGIR 2024): blocked, pruned posting lists with quantised
// block summaries, kept blocks scored exactly from a forward index.
//
// Plain C++ over raw pointers; pybind11 lives only in the bind_*.cpp files. Functions
// throw std::invalid_argument naming the argument and the value.
//
// Scores: score(q, d) = scale * sum_t q_t * impact(t, d), accumulated in
// float32; `scale` is the index-wide impact step (weights = impact * scale).
// Ties go to the smaller doc id (topk.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "postings_topk.hpp"

namespace retriever {

/// uint16-impact inverted index of one shard.
struct u16_postings_view {
    csr_view csr;                      // offsets (n_terms + 1), doc_ids (nnz) ascending per term
    const uint16_t* impacts = nullptr;  // nnz
    size_t n_docs = 0;
    float scale = 1.0f;
};

/// Forward index: document d's vector is terms/values[offsets[d] : offsets[d+1]].
struct forward_view {
    const uint64_t* offsets = nullptr;  // n_docs + 1
    size_t n_docs = 0;
    const uint32_t* terms = nullptr;
    const uint16_t* values = nullptr;
    size_t nnz = 0;
    float scale = 1.0f;
};

/// Seismic blocks: term t owns blocks [term_blocks[t], term_blocks[t+1]); block
/// b holds docs block_docs[block_docs_offsets[b] : ...+1]. The block summaries
/// are stored inverted per term, so that only the query's terms are read at
/// query time. Term t's directory is summary_dir[summary_comp_offsets[t] :
/// ...+1], one uint64 per component c (c ascending): (c << 32) | r, where r is
/// the start of c's entries relative to e0 = summary_entry_offsets[t] (they end
/// at the next directory entry's r, the last at summary_entry_offsets[t+1] -
/// e0). An entry of summary_entries is (j << 8) | v: j the block's index within
/// term t's blocks (ascending within a component), v a uint8 value weighing
/// v * summary_scale[term_blocks[t] + j] in weight units.
struct blocks_view {
    const uint64_t* term_blocks = nullptr;  // n_terms + 1
    size_t n_terms = 0;
    const uint64_t* block_docs_offsets = nullptr;  // n_blocks + 1
    const uint32_t* block_docs = nullptr;
    size_t n_block_docs = 0;
    const uint64_t* summary_comp_offsets = nullptr;  // n_terms + 1
    const uint64_t* summary_dir = nullptr;           // n_comps
    size_t n_comps = 0;
    const uint64_t* summary_entry_offsets = nullptr;  // n_terms + 1
    const uint32_t* summary_entries = nullptr;        // n_summary
    size_t n_summary = 0;
    const float* summary_scale = nullptr;  // n_blocks
    size_t n_blocks = 0;
    // Packed copy of the forward index for the approximate kernel (vocabularies of at most 65,536
    // terms; both empty otherwise): term_rank[t] is term t's rank by descending document frequency
    // in the shard (a permutation of [0, n_terms)), packed[i] = (term_rank[terms[i]] << 16) |
    // values[i]. One 4-byte stream per row instead of 6 bytes in two, and the query weights it
    // gathers, indexed by rank, concentrated at the front of the array (frequent terms).
    const uint32_t* packed = nullptr;  // nnz or 0
    size_t n_packed = 0;
    const uint32_t* term_rank = nullptr;  // n_terms or 0
    size_t n_rank = 0;
};

/// Implementation of the forward-index score (AVX2 8-entry gathers, SSE2 or scalar). All three
/// compute the same float32 operations in the same order (bit-identical scores); `automatic` is
/// forward_score_impl_for_cpu().
enum class forward_score_impl : uint8_t { automatic, scalar, sse2, avx2 };

/// What "auto" means on this CPU, read once per process from CPUID (a function-local static):
/// AVX2 where the CPU has it, else SSE2.
forward_score_impl forward_score_impl_for_cpu();

/// Parses "auto" | "scalar" | "sse2" | "avx2"; throws std::invalid_argument naming the value for
/// another name or an instruction set this CPU lacks.
forward_score_impl parse_forward_score_impl(const std::string& name);

/// O(size) structural checks, run once at open: offsets monotone and in range,
/// ids below their bounds. Throw std::invalid_argument naming the array.
void check_forward(const forward_view& f, size_t n_terms);
void check_blocks(const blocks_view& b, size_t n_docs, size_t vocab);
/// O(nnz + n_terms) check of the packed forward copy against the forward index (both present or
/// both absent; term_rank a permutation; packed[i] as documented).
void check_packed(const blocks_view& b, const forward_view& f);

/// Per-call O(m) check for sparse queries: q_offsets valid, terms < n_terms,
/// weights finite and >= 0, no term repeated within a query.
void check_sparse_queries(const query_batch_view& q, size_t n_terms);

/// Exact top-k over impact-ordered postings (each term's list sorted by
/// impact descending, ties by doc id). Score-at-a-time with safe early
/// termination: lists are consumed in rounds of decreasing contribution
/// q_t * impact into a float32 accumulator (only touched entries are read and
/// reset); once the largest contribution still unseen, summed over the query's
/// terms (L), is below the k-th largest partial score (theta), no untouched
/// document can enter the top-k, and the touched ones whose partial score plus
/// L reaches theta are scored exactly from the forward index. Every returned
/// score is the forward-index score (same formula and order as the Seismic
/// kernel), so results do not depend on where the loop stopped. In shards of at
/// most 32,768 documents, a query whose lists hold >= 2 postings per document is
/// instead scored term-at-a-time into the dense accumulator (long lists used by
/// several queries of the batch expanded once into float32 columns, added 16
/// documents at a time), top-k selected from 64-document block maxima, then the
/// documents within float slack of the k-th accumulated score are re-scored.
///
/// allow (nullptr: every document): a uint8 mask of n_docs entries (0 = never returned), applied
/// before top-k on every path, so the result is the exact top-k of the allowed documents. When
/// at most a quarter of the shard is allowed, a query whose lists hold more postings than the
/// allowed documents' forward rows hold entries scores those documents directly instead.
///
/// filter_plan (with allow; every plan gives the same ids and bit-identical scores):
/// - postings: the score-at-a-time walk reads allow[d] per posting and skips masked documents;
/// - sentinel: each worker presets the accumulator entries of masked documents to -inf once per
///   call (and zeroes them when it ends), so the walk reads no mask: a masked entry stays
///   negative (-inf, or NaN once an infinite contribution meets it), is never 0 and so never
///   touched, never enters theta nor the candidates; the touched documents, their partial sums,
///   theta, the rounds and the candidates are those of `postings`;
/// - passing: every query scores the allowed documents from the forward index (listed once per
///   call), whatever their number;
/// - automatic: per query, `passing` when at most kPassListFraction of the shard is allowed and
///   the allowed rows hold fewer entries than the query's lists; otherwise `sentinel` when at
///   least kSentinelFraction of the shard is allowed and the call has at least
///   kSentinelMinQueries queries per worker, else `postings`.
enum class sparse_filter_plan : uint8_t { automatic, postings, sentinel, passing };

/// Parses "auto" | "postings" | "sentinel" | "passing"; throws std::invalid_argument naming the
/// value otherwise.
sparse_filter_plan parse_sparse_filter_plan(const std::string& name);

void sparse_exact_topk(const u16_postings_view& p, const forward_view& f, const query_batch_view& queries,
                       size_t vocab, int n_threads, forward_score_impl impl, const topk_out& out,
                       const uint8_t* allow = nullptr,
                       sparse_filter_plan filter_plan = sparse_filter_plan::automatic);

/// O(nnz) check of impact-ordered postings: offsets valid, doc ids < n_docs,
/// impacts >= 1 and non-increasing within each term.
void check_impact_postings(const u16_postings_view& p);

/// Approximate top-k (Seismic). Per query: the `query_cut` largest query
/// weights are visited in decreasing order; for each, the summary scores of
/// all its blocks are computed (term-at-a-time over the inverted summaries:
/// only components that are query terms are read) and the blocks visited in
/// decreasing summary score; the first block whose summary score <
/// heap_factor * k-th score (heap full) ends that term; blocks already below it
/// when the term starts are dropped before sorting. Documents of visited blocks
/// not yet scored (each at most once per query) are scored exactly from the
/// packed forward copy when b has one (query weights indexed by term rank), else
/// from f: the same float32 operations in the same order either way.
/// allow (nullptr: every document): a uint8 mask of n_docs entries; documents with 0 are never
/// scored or returned (the heap's threshold is that of the allowed documents).
void sparse_seismic_topk(const forward_view& f, const blocks_view& b, const query_batch_view& queries,
                         size_t query_cut, float heap_factor, int n_threads, forward_score_impl impl,
                         const topk_out& out, const uint8_t* allow = nullptr);

}  // namespace retriever
